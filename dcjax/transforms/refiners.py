"""Refinement inside the step: the change tests of one frame (`dcjax.transforms.refine`).

`InputRefiner` tests the input of every refined convolution against its
(shifted) reference: a pixel whose change is under ``delta * scale`` counts as
reusable too. The reference stays what the layer's cache was computed from:
it keeps its value wherever the layer reuses and takes the frame's value
wherever the layer recomputes. At a layer that reads the frame
(`dcjax.plan.LayerPlan.tested_alone`) the input's mask is the matcher's, which
passes blocks by PSNR: there the test alone decides reuse, so that the error
bound holds at every output the layer reuses, behind a block matcher too.
Positions the frame recomputes whatever reuse says (a guard's region, the
band of a banded refresh: `FrameContext.unforced`) count as changed, so their
reference restarts, as everywhere on a refresh.
Layers that read the same feature map (`queries.shared_inputs`) share the
first one's test, reference and scale: one pass over the map, one copy in the
state.

`DenseUpdater` computes the fully connected layers that are updated by rows
(`refined_product`): an input element whose change against the reference is
under ``delta * scale`` (refinement) or exactly zero (`Config.dense_updates`)
keeps its reference; the product moves by the weight rows of the others
(`dcjax.kernels.matvec`). A refresh, more than `refine.DENSE_FRACTION` of
the inputs changed, or the layer's re-anchoring frame (`refine.reanchors`)
computes the product in full and resets the reference.

Both are used through the interpreter's `Policy` (`dcjax.step`) and return
what they computed as results (`RefineResult`, `DenseResult`); the contract
and the error bound are in `dcjax.transforms.refine` and docs/design.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from dcjax._loops import pinned, run_if, shifted, skipping_pays
from dcjax.kernels.matvec import delta_matvec
from dcjax.transforms import lowering
from dcjax.transforms import refine as refine_lib
from dcjax.transforms.motion import FrameContext, expand_mask

__all__ = ["DenseResult", "DenseUpdater", "InputRefiner", "RefineResult", "refined_product"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RefineResult:
    """What the test at a refined layer's input computed.

    Attributes:
        ref: the new reference of the layer's input, for the layer that owns
            the test (None for a layer that shares its owner's).
        scale: the activation scale the threshold is relative to.
    """

    ref: jax.Array | None
    scale: jax.Array


class InputRefiner:
    """The change tests of one frame at the inputs of refined layers.

    Args:
        refined: per layer, whether its input is tested.
        owners: per layer, the layer whose test it shares (itself when none).
        tested_alone: per layer, whether the test replaces its input's mask
            (the matcher's: `LayerPlan.tested_alone`).
        signatures: per layer, the spatial signature of its input.
        delta, metric: `RefineConfig.delta` and `RefineConfig.metric`.
        refs: per layer, the reference of its input (None where it keeps none).
        ref_scale: (L,) the scales measured so far (0 until measured).
        layer_valid: (L,) whether each layer's cache holds the last frame's output.
        ctx: the frame's motion.
        refresh: whether the frame is recomputed in full.
    """

    def __init__(
        self,
        *,
        refined: Sequence[bool],
        owners: Sequence[int],
        tested_alone: Sequence[bool],
        signatures: Sequence[Any],
        delta: float,
        metric: str,
        refs: Sequence[jax.Array | None],
        ref_scale: jax.Array,
        layer_valid: jax.Array,
        ctx: FrameContext,
        refresh: jax.Array,
    ) -> None:
        self._refined, self._owners, self._signatures = refined, owners, signatures
        self._tested_alone = tested_alone
        self._delta, self._metric = delta, metric
        self._refs, self._ref_scale, self._layer_valid = refs, ref_scale, layer_valid
        self._ctx, self._refresh = ctx, refresh
        # the owners' tests already made this frame: owner -> (small, scale)
        self._tested: dict[int, tuple[jax.Array, jax.Array]] = {}

    def __call__(self, index: int, x: jax.Array, in_mask: Any) -> tuple[Any, RefineResult | None]:
        """``(mask, result)``: layer ``index``'s input mask widened by the test."""
        if not self._refined[index]:
            return in_mask, None
        owner = self._owners[index]
        new_ref = None
        if owner not in self._tested:
            new_ref, small, scale = self._test(owner, x, in_mask)
            self._tested[owner] = (small, scale)
        small, scale = self._tested[owner]
        mask = small if self._tested_alone[owner] else in_mask | small
        return mask, RefineResult(ref=new_ref, scale=scale)

    def _test(self, owner: int, x: jax.Array, in_mask: Any):
        """``(new reference, reusable, scale)`` of the input ``x`` of layer ``owner``.

        Reusable: the change test passes, or (not tested alone) the input's
        mask says so. The new reference is the old one wherever the layer
        reuses, ``x`` elsewhere: what the layer's cache was computed from.
        """
        sig = self._signatures[owner]
        alone = self._tested_alone[owner]
        metric, delta = self._metric, self._delta
        old = self._ref_scale[owner]
        kept = (old > 0) & jnp.isfinite(old)
        if skipping_pays():  # the scale is measured once, on the first frame
            scale = lax.cond(kept, lambda: old, lambda: refine_lib.scale(x, sig, metric))
        else:  # no predicate read on the host: measured on every frame, kept once known
            scale = jnp.where(kept, old, refine_lib.scale(x, sig, metric))
        dy, dx, _ = self._ctx.shift(sig)
        ref = shifted(self._refs[owner], dy, dx, sig.axes)
        valid = (
            self._ctx.valid(sig) & self._ctx.unforced(sig) & self._layer_valid[owner]
            & ~self._refresh
        )  # fmt: skip

        shape = (x.shape[sig.axes[0]], x.shape[sig.axes[1]])  # `change`'s
        kept_by_mask = jnp.zeros(shape, bool) if alone else jnp.broadcast_to(in_mask, shape)

        def test(small, ref, x, scale, valid, kept_by_mask):
            small = refine_lib.change(x, ref, sig, metric) < delta * scale
            small = small & valid
            # where the layer reuses: the reference stays what its cache came from
            reused = expand_mask(small | (kept_by_mask & valid), x.ndim, sig.axes)
            return small, jnp.where(reused, ref, x.astype(ref.dtype))

        carry = (jnp.ones(shape, bool), ref)
        if alone:
            # the matcher's mask may say "reusable" where the input moved: the
            # test runs on every frame
            small, new_ref = test(*carry, x, scale, valid, kept_by_mask)
        elif skipping_pays():
            # Nothing of the map left to recompute (a still scene): no test,
            # and the reference keeps what the caches came from. The reference
            # is the loop's carry, not an operand too, so it is updated in
            # place rather than copied.
            small, new_ref = lax.fori_loop(
                0,
                (~jnp.all(in_mask)).astype(jnp.int32),
                lambda i, c: test(*c, *pinned((x, scale, valid, kept_by_mask), i)),
                carry,
            )
        else:
            small, new_ref = test(*carry, x, scale, valid, kept_by_mask)
        return new_ref, small, scale


@dataclasses.dataclass(frozen=True, kw_only=True)
class DenseResult:
    """What a fully connected layer updated by rows computed.

    Attributes:
        state: ``(x_ref, y_ref, scale)``: the reference input, the product
            ``x_ref @ W`` kept up to date, and the activation scale.
        reuse: the fraction of its inputs whose weight rows were not read.
    """

    state: tuple[jax.Array, jax.Array, jax.Array]
    reuse: jax.Array


class DenseUpdater:
    """The fully connected layers of one frame, updated by rows where planned.

    Args:
        updated: per fully connected layer, whether it is updated by rows.
        deltas: per layer, its refinement threshold (0 without refinement).
        exact: per layer, whether exactly unchanged inputs count as unchanged
            (`Config.dense_updates`).
        states: per layer, its ``(x_ref, y_ref, scale)`` (None where not updated).
        refresh: whether the frame is recomputed in full.
        frame_index: the frame's index in the stream (`refine.reanchors`).
    """

    def __init__(
        self,
        *,
        updated: Sequence[bool],
        deltas: Sequence[float],
        exact: Sequence[bool],
        states: Sequence[Any],
        refresh: jax.Array,
        frame_index: jax.Array,
    ) -> None:
        self._updated, self._deltas, self._exact = updated, deltas, exact
        self._states, self._refresh, self._frame_index = states, refresh, frame_index

    def __call__(self, index: int, eqn: Any, invals: list) -> tuple[jax.Array, DenseResult | None]:
        """``(product, result)`` of fully connected layer ``index``."""
        if not self._updated[index]:
            return lowering.bind(eqn, invals)[0], None
        (x_ref, y_ref, old), (lhs, w) = self._states[index], invals
        state, reuse, y = refined_product(
            eqn, lhs, w, x_ref, y_ref, old, self._deltas[index],
            self._refresh | refine_lib.reanchors(self._frame_index, index), self._exact[index],
        )  # fmt: skip
        return y, DenseResult(state=state, reuse=reuse)


def refined_product(eqn, lhs, w, x_ref, y_ref, old_scale, delta, refresh, exact_updates):
    """One fully connected layer updated by rows: ``(new state, reuse fraction, product)``.

    ``refresh``: compute the product in full and reset the reference.

    An input element counts as unchanged when its change against the reference
    is under ``delta * scale`` (refinement) or, with ``exact_updates``
    (`Config.dense_updates`), exactly zero.
    """
    k = x_ref.shape[0]
    x = lhs.reshape(-1).astype(jnp.float32)
    d = x - x_ref
    if delta == 0:  # no threshold: no scale to measure
        scale, small = old_scale, d == 0 if exact_updates else jnp.zeros_like(d, bool)
    else:
        measured = (old_scale > 0) & jnp.isfinite(old_scale)
        scale = jnp.where(measured, old_scale, refine_lib.dense_scale(x))
        small = jnp.abs(d) < delta * scale
        if exact_updates:
            small = small | (d == 0)
    small = small & ~refresh
    changed = ~small
    count = jnp.sum(changed, dtype=jnp.int32)
    full = refresh | (count > int(refine_lib.DENSE_FRACTION * k))
    # exact updates are on only where skipping pays (CPU: `dcjax.plan`)
    exact_only = delta == 0 and not exact_updates
    full = full | exact_only

    def exact(lhs):
        return lowering.bind(eqn, [lhs, w])[0].reshape(-1).astype(jnp.float32)

    if exact_only:
        # every input counts as changed: the full product, on any backend
        y = exact(lhs)
    elif skipping_pays():
        y = run_if(full, exact, (lhs,), jnp.zeros_like(y_ref))
        y = run_if(
            ~full, lambda y_ref, d, changed: delta_matvec(y_ref, w, d, changed),
            (y_ref, d, changed), y,
        )  # fmt: skip
    else:  # one dense product: the input itself, or the changed differences
        e = jnp.where(full, x, jnp.where(changed, d, 0.0))
        y = jnp.where(full, 0.0, y_ref) + exact(e.reshape(lhs.shape).astype(lhs.dtype))
    state = (jnp.where(changed | full, x, x_ref), y, scale)
    fraction = jnp.where(full, 0.0, 1.0 - count / k).astype(jnp.float32)
    out = y.reshape(eqn.outvars[0].aval.shape).astype(eqn.outvars[0].aval.dtype)
    return state, fraction, out
