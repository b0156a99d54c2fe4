"""The cached step's policy for the caching interpreter: how each layer reuses.

`CachePolicy` is the `dcjax.transforms.interpreter.Policy` of one frame of
`dcjax.step.Step`: at a reused layer it takes the layer's mask (its cache's
validity and the frame's guard applied), shifts the layer's cache with the
frame's motion and computes the rest with the plan's kernel (the layer in
full where it keeps no cache; an inverted-residual chain's expansion and
depthwise layers deferred to its projection), returning the output and a
`LayerResult`; at refined layers it widens masks by the change test
(`dcjax.transforms.refiners.InputRefiner`) and updates fully connected layers
by rows (`dcjax.transforms.refiners.DenseUpdater`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from dcjax import kernels
from dcjax._loops import shifted, skipping_pays
from dcjax.config import Config
from dcjax.kernels import chain as chain_lib
from dcjax.plan import Plan
from dcjax.state import CacheState
from dcjax.transforms.interpreter import Policy
from dcjax.transforms.motion import FrameContext
from dcjax.transforms.refiners import DenseUpdater, InputRefiner

__all__ = ["CachePolicy", "LayerResult"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerResult:
    """What the step's policy computed at one reused layer.

    Attributes:
        mask: the layer's output reuse mask (after its cache's validity).
        cache: its new cache (the old one where it keeps none or is deferred).
    """

    mask: Any
    cache: Any


@dataclasses.dataclass(frozen=True)
class _Deferred:
    """A chain's layer (`LayerPlan.deferred`) whose output is computed with the
    chain's last layer: what the interpreter holds in place of that output
    (not an array, nor a pytree, so that any other use of it fails loudly)."""

    eqn: Any
    invals: list
    epilogue: Any


class CachePolicy(Policy):
    """The interpreter's policy for one frame of the step (see the module docstring)."""

    def __init__(
        self,
        plan: Plan,
        config: Config,
        state: CacheState,
        ctx: FrameContext,
        refresh: jax.Array,
        kept: tuple,
    ) -> None:
        self._plan, self._kernel = plan, config.kernel
        self._state, self._ctx, self._kept = state, ctx, kept
        # the outputs the sparse kernels wrote this frame: buffers, not values
        # XLA may fuse into their readers (`kernels.dense_conv_eqn`'s ``materialized``)
        self._written: list = []
        self.refines = plan.refines
        if plan.refines:
            self._refiner = InputRefiner(
                refined=plan.refined,
                owners=tuple(lp.ref_owner for lp in plan.layers),
                tested_alone=tuple(lp.tested_alone for lp in plan.layers),
                signatures=tuple(lp.layer.in_signature for lp in plan.layers),
                delta=config.refine.delta,
                metric=config.refine.metric,
                refs=state.refs,
                ref_scale=state.ref_scale,
                layer_valid=state.layer_valid,
                ctx=ctx,
                refresh=refresh,
            )
        self._dense = DenseUpdater(
            updated=plan.updated_dense,
            deltas=tuple(d.delta for d in plan.dense),
            exact=tuple(d.exact for d in plan.dense),
            states=state.dense,
            refresh=refresh,
            frame_index=state.frame_index,
        )

    def fuses(self, layer: int) -> bool:
        return bool(self._plan.layers[layer].epilogue)

    def refine(self, layer, x, in_mask):
        return self._refiner(layer, x, in_mask)

    def dense(self, index, eqn, invals):
        return self._dense(index, eqn, invals)

    def reuse(self, layer, eqn, invals, mask, epilogue):
        lp, state = self._plan.layers[layer], self._state
        valid = state.layer_valid[layer]
        mask = mask & self._ctx.unforced(lp.layer.signature)
        if lp.keeps_cache and skipping_pays():
            # A conditional materialises the layer's mask once (the guard's
            # region and a refresh band included), where XLA:CPU would otherwise fuse the mask
            # propagation behind it into each of the kernel's consumers of the
            # mask (docs/performance-notes.md).
            mask = lax.cond(valid, lambda m: m, jnp.zeros_like, mask)
        else:
            mask = mask & valid
        old = state.caches[layer]
        if lp.deferred:  # the chain's expansion or depthwise layer: computed with its last
            return _Deferred(eqn, invals, epilogue), LayerResult(mask=mask, cache=old)
        if not lp.keeps_cache:
            written = any(invals[0] is o for o in self._written)
            out = kernels.dense_conv_eqn(eqn, invals, materialized=written)
            return out, LayerResult(mask=mask, cache=old)
        sig = lp.layer.signature
        dy, dx, _ = self._ctx.shift(sig)
        # Shifted in the state's shape (`cache_shape`): a loop carrying the
        # layer's (1, H, W, C) shape would, under `jax.vmap`, be laid out apart
        # from the state's buffer and copy it in (docs/performance-notes.md).
        kept = self._kept[layer]
        drop = kept.ndim - old.ndim
        cached = shifted(kept, dy, dx, tuple(a + drop for a in sig.axes))
        cached = cached.reshape(old.shape)
        if lp.chain is not None:
            out = _chain_output(eqn, invals, epilogue, mask, cached)
        else:
            k = lp.kernel
            out = kernels.masked_conv_eqn(
                eqn, invals, mask, cached, self._kernel if k is None else k.impl,
                scattered=lp.refined, epilogue=epilogue,
                tile=None if k is None else k.tile, chunk=None if k is None else k.chunk,
            )  # fmt: skip
        self._written.append(out)
        return out, LayerResult(mask=mask, cache=out)


def _chain_output(eqn, invals, epilogue, mask, cached):
    """The projection of an inverted-residual chain, computed with the chain's
    deferred expansion and depthwise layers (`dcjax.kernels.chain`)."""
    mid = invals[0]
    head = mid.invals[0]
    links = tuple(
        chain_lib.Link(e, ins[1], epi)
        for e, ins, epi in (
            (head.eqn, head.invals, head.epilogue),
            (mid.eqn, mid.invals, mid.epilogue),
            (eqn, invals, epilogue),
        )
    )
    x_in = head.invals[0]
    return chain_lib.chain_masked_conv(
        x_in, links, jnp.broadcast_to(mask, (x_in.shape[0], *mask.shape)), cached
    )
