"""The per-frame step of a cached model: match, decide, run the network with reuse.

`Step` is what `dcjax.cached_model.CachedModel` jits. One call,
``step(leaves, state, frame, match) -> (output, state, info)``:

1. matches the frame against the state's key (`dcjax.matching.StreamMatcher`,
   or a `Match` given by the caller) and decides whether to recompute it in
   full (the first frame, every ``Config.refresh_every`` frames, too few
   matched blocks, a frame holding NaN or Inf); a frame refreshed whatever
   the match says (the first, a scheduled refresh, NaN or Inf) reports no
   match and, on CPU, is not matched; with ``Config.guard`` the
   region around the last frame's cells over the guard's threshold is
   recomputed whatever the matcher and the refinement say
   (`dcjax.transforms.guard`);
2. runs the network through the caching interpreter
   (`dcjax.transforms.interpreter.evaluate`) with a `Policy` (`dcjax.policy`) that reuses each
   layer's shifted cache where its mask allows, computing the rest with the
   sparse kernels as the `dcjax.plan.Plan` says, refines masks
   (`dcjax.transforms.refiners`) and updates fully connected layers by rows;
   with semantic exits, through `dcjax.semantic.SemanticExits`;
3. on a still frame (every input pixel reusable, no motion) returns the last
   output without running the network (`Config.skip_unchanged`): the network
   then sits in a loop of zero trips, whose carry keeps the caches' buffers;
4. returns the new state and the frame's ``info`` (motion, refresh, match
   ratio, input reuse, guarded fraction, per-layer reuse fractions, FLOP ratio,
   still-frame skip).

A frame that holds NaN or Inf is not used as the key for the next frame, which
is then recomputed in full too.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dcjax._loops import pinned, skipping_pays
from dcjax.config import Config
from dcjax.kernels import lowering as conv_lowering
from dcjax.matching import Match, StreamMatcher
from dcjax.plan import Plan
from dcjax.policy import CachePolicy, LayerResult
from dcjax.state import CacheState
from dcjax.transforms import guard as guard_lib
from dcjax.transforms.interpreter import evaluate
from dcjax.transforms.motion import FrameContext
from dcjax.transforms.records import Analysis
from dcjax.transforms.spatial import Spatial
from dcjax.transforms.trace import TracedModel

__all__ = [
    "Pass", "Step", "frame_finite", "frame_input", "mean_of_masks", "refresh_band",
]  # fmt: skip


def refresh_band(since_refresh: jax.Array, every: int, bands: int) -> jax.Array:
    """The band of a banded periodic refresh (`Config.refresh_bands`) a frame
    computes afresh, ``0 .. bands - 1`` over the last ``bands`` frames of the
    ``every``-frame period (``since_refresh`` from ``every - bands + 1`` to
    ``every``), else -1."""
    k = since_refresh - (every - bands) - 1
    return jnp.where((k >= 0) & (k < bands), k, -1).astype(jnp.int32)


class Pass(NamedTuple):
    """What one pass of the network returns (`Step.forward`).

    Attributes:
        outs: the model's flat outputs.
        caches: per layer, its new cache.
        reuse_fraction: (L,) per layer, the fraction of its output reused.
        layer_valid: (L,) per layer, whether it ran (false where an exit skipped it).
        semantic: the new semantic memory (or the old one, or None).
        semantic_info: the exits' part of the step's ``info``.
        refs: per layer, its new reference (refinement).
        ref_scale: (L,) the scales (the state's without refinement).
        dense: per fully connected layer, its new state.
        dense_reuse: (D,) per fully connected layer, the fraction of its
            inputs whose weight rows were not read.
    """

    outs: tuple
    caches: tuple
    reuse_fraction: jax.Array
    layer_valid: jax.Array
    semantic: Any
    semantic_info: dict
    refs: tuple
    ref_scale: Any
    dense: tuple
    dense_reuse: jax.Array


class _StillCarry(NamedTuple):
    """The carry of the still-frame loop: what a skipped frame keeps."""

    caches: tuple
    refs: tuple
    ref_scale: Any
    dense: tuple
    outs: tuple
    reuse_fraction: jax.Array
    dense_reuse: jax.Array


class Step:
    """The cached step of one traced model (see the module docstring).

    Args:
        plan: the per-layer decisions (`dcjax.plan.make_plan`).
        analysis: the analysed traced model.
        traced: the traced model (jaxpr, output tree, input dtype).
        config: the transform's configuration.
        matcher: how frames are matched against the key.
        semantic: the semantic exits (`dcjax.semantic.SemanticExits`), or None.
        frame_shape: ``(H, W, C)`` of the frames.
        preprocess: per-pixel function from a raw frame to the model input, or
            None (uint8 frames are divided by 255, float frames kept).
        lowerings: the model's dense lowerings (a mapping for
            `dcjax.kernels.lowering.use`; None: the fixed rules).
    """

    def __init__(
        self,
        *,
        plan: Plan,
        analysis: Analysis,
        traced: TracedModel,
        config: Config,
        matcher: StreamMatcher,
        semantic: Any,
        frame_shape: tuple[int, int, int],
        preprocess: Callable[[jax.Array], jax.Array] | None,
        lowerings: Mapping[str, str] | None = None,
    ) -> None:
        self.plan, self.analysis, self.traced = plan, analysis, traced
        self.lowerings = {} if lowerings is None else lowerings
        self.config, self.matcher, self.semantic = config, matcher, semantic
        self.frame_shape = frame_shape
        self._preprocess = preprocess
        self._flops = np.asarray([lp.layer.flops for lp in plan.layers], np.float32)
        self._dense_flops = np.asarray([d.layer.flops for d in plan.dense], np.float32)
        #: input pixels per cell of the guarded score map (`dcjax.transforms.guard`), or None
        self.guard_stride = None
        if config.guard is not None:
            self.guard_stride = guard_lib.map_stride(
                config.guard, [a.shape for a in analysis.jaxpr.out_avals], frame_shape[:2]
            )
        #: how many times the step has been traced
        self.traces = 0

    @property
    def guard_cells(self) -> tuple[int, int] | None:
        """The ``(h, w)`` grid of the guarded score map, or None without a guard."""
        if self.guard_stride is None:
            return None
        return self.frame_shape[0] // self.guard_stride, self.frame_shape[1] // self.guard_stride

    def prepare(self, frame: jax.Array) -> jax.Array:
        """The model input of one ``(H, W, C)`` frame (`frame_input`)."""
        x = frame_input(frame, self._preprocess, self.traced.input_dtype)
        if x.shape != self.frame_shape:
            raise ValueError(
                f"dcjax: preprocess returned shape {x.shape}; it must keep the frame's shape "
                f"{self.frame_shape}"
            )
        return x

    def __call__(
        self,
        leaves: Sequence[Any],
        state: CacheState,
        frame: jax.Array,
        match: Match | None,
        skip_still: bool = True,
    ) -> tuple[Any, CacheState, dict]:
        """One frame: ``(output, new state, info)`` (see `CachedModel.step`).

        With ``skip_still=False`` a still frame runs the network too, at the
        top level (for profiling: every layer's operations then show).
        """
        self.traces += 1
        cfg, plan = self.config, self.plan
        x = self.prepare(frame)
        finite = frame_finite(frame)
        # Refreshed whatever the match says: no match reported (motion (0, 0),
        # match ratio 0), none computed on CPU; the state keeps the last motion.
        known_refresh = ~state.has_prev | ~finite
        if cfg.refresh_every is not None and cfg.refresh_bands == 1:
            known_refresh = known_refresh | (state.since_refresh >= cfg.refresh_every)
        with jax.named_scope("dcjax.match"):
            key = self.matcher.key_of(frame)

            def matched():
                return self.matcher.match(state.prev_frame, frame, key, state.motion)

            if match is None and skipping_pays():  # CPU: such a frame is not matched
                m = lax.cond(known_refresh, functools.partial(_unmatched, matched), matched)
                unmatched = None  # `_unmatched` reports no match already
            else:  # a given match, or no predicate read on the host (`skipping_pays`)
                m = matched() if match is None else match
                unmatched = known_refresh
        ratio = m.match_ratio if m.match_ratio is not None else m.mask.mean(dtype=jnp.float32)
        motion = jnp.asarray(m.motion, jnp.int32)
        if unmatched is not None:  # the mask needs no zeroing: `r0` is all false on a refresh
            ratio = jnp.where(unmatched, 0.0, ratio)
            motion = jnp.where(unmatched, 0, motion)
        refresh = known_refresh | (ratio < cfg.min_match)
        band = jnp.int32(-1)
        if cfg.refresh_every is not None and cfg.refresh_bands > 1:
            band = refresh_band(state.since_refresh, cfg.refresh_every, cfg.refresh_bands)
        h, w = self.frame_shape[:2]
        iy = jnp.arange(h)[:, None] + motion[0]
        ix = jnp.arange(w)[None, :] + motion[1]
        inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
        if cfg.psnr_threshold == float("inf"):
            r0 = jnp.zeros((h, w), bool)  # never reuse, whatever the matcher says
        elif skipping_pays():
            # A conditional materialises the mask: otherwise XLA fuses its whole
            # derivation (block PSNRs, expansion to pixels, the frame border)
            # into every consumer of every layer's mask, once per pixel.
            r0 = lax.cond(refresh, lambda: jnp.zeros((h, w), bool), lambda: m.mask & inside)
        else:  # no predicate read on the host (`dcjax._loops.skipping_pays`)
            r0 = m.mask & inside & ~refresh
        rows = None
        if cfg.refresh_bands > 1:  # no band (-1): rows [-h / B, 0), none of the frame's
            rows = (band * h // cfg.refresh_bands, (band + 1) * h // cfg.refresh_bands)
        ctx = FrameContext(
            motion, cfg.alignment, cfg.guard, state.guard, self.guard_stride or 1, band=rows
        )
        frame_sig = Spatial(axes=(0, 1), size=(h, w), stride=(1, 1))
        if rows is not None:
            r0 = r0 & ~ctx.banded(frame_sig)
        still = jnp.all(r0) & jnp.all(motion == 0)  # before the guard: it makes no frame run
        unguarded = ctx.unguarded(frame_sig)
        r0 = r0 & unguarded
        if plan.skips_still and skip_still:
            p, skip = self._still_or_forward(leaves, state, x, r0, ctx, refresh, finite, still)
        else:
            p, skip = self.forward(leaves, state, x, r0, ctx, refresh, finite), jnp.bool_(False)
        output = jax.tree_util.tree_unflatten(self.traced.out_tree, list(p.outs))
        new_state = CacheState(
            prev_frame=jnp.where(
                finite, self.matcher.next_key(state.prev_frame, key, r0, motion), state.prev_frame
            ),
            has_prev=finite,
            # the first frame's full recompute keeps a fresh state's refresh phase
            since_refresh=jnp.where(
                refresh,
                jnp.where(state.frame_index == 0, state.since_refresh + 1, 1),
                # the last band ends a banded refresh's period
                jnp.where(band == cfg.refresh_bands - 1, 1, state.since_refresh + 1),
            ).astype(jnp.int32),
            frame_index=state.frame_index + 1,
            # the search of the next frame starts where the last one matched
            motion=jnp.where(finite & ~known_refresh, motion, state.motion),
            caches=tuple(p.caches),
            layer_valid=p.layer_valid,
            semantic=p.semantic,
            refs=tuple(p.refs),
            ref_scale=p.ref_scale,
            output=tuple(p.outs) if plan.skips_still else (),
            dense=tuple(p.dense),
            guard=(
                None if cfg.guard is None
                else guard_lib.cells(p.outs, cfg.guard)
            ),
        )  # fmt: skip
        info = {
            "motion": motion,
            "refreshed": refresh,
            "refresh_band": jnp.where(refresh, -1, band).astype(jnp.int32),
            "nonfinite": ~finite,
            "match_ratio": jnp.asarray(ratio, jnp.float32),
            "input_reuse": r0.mean(dtype=jnp.float32),
            "guarded": 1.0 - jnp.mean(jnp.asarray(unguarded, jnp.float32)),
            "reuse_fraction": p.reuse_fraction,
            "dense_reuse": p.dense_reuse,
            "flops_ratio": self._flops_ratio(p, skip),
            "skipped": skip,
            **p.semantic_info,
        }
        return output, new_state, info

    def _flops_ratio(self, p: Pass, skip: jax.Array) -> jax.Array:
        """FLOPs of convolutions and matrix products the frame computed / a full recompute."""
        work = (1.0 - p.reuse_fraction) * self._flops
        # FLOP counts exceed int32: keep them float
        other = jnp.float32(self.plan.other_flops)
        if self.semantic is not None:  # what an exit skips costs nothing
            work = jnp.where(p.layer_valid, work, 0.0)
            exit_index = p.semantic_info["exit"]
            after = jnp.asarray(self.semantic.plan.other_after, jnp.float32)
            other = other - jnp.where(exit_index >= 0, after[jnp.maximum(exit_index, 0)], 0.0)
        # a fully connected layer updated by rows reads the rows of the changed inputs only
        computed = jnp.sum(work) + other - jnp.sum(p.dense_reuse * self._dense_flops)
        ratio = jnp.where(skip, 0.0, computed / float(max(self.plan.total_flops, 1)))
        return jnp.asarray(ratio, jnp.float32)

    def _still_or_forward(self, leaves, state, x, r0, ctx, refresh, finite, still):
        """`forward` inside a loop of one trip, or zero for a ``still`` frame.

        A still scene: every layer's mask would be all reusable, so the
        network would return its last output and keep every cache. The loop
        carry keeps the caches' buffers, where a `lax.cond` would copy them.
        """
        skip = still

        def body(i, carry: _StillCarry) -> _StillCarry:
            # The frame's values are pinned to the trip, so that nothing of the
            # network is hoisted out of a loop of zero trips; the weights are
            # not (docs/performance-notes.md).
            x_i, r0_i = pinned((x, r0), i)
            st = dataclasses.replace(
                state, caches=carry.caches, refs=carry.refs, ref_scale=carry.ref_scale,
                dense=carry.dense,
            )  # fmt: skip
            p = self.forward(leaves, st, x_i, r0_i, ctx, refresh, finite)
            return _StillCarry(
                caches=tuple(p.caches), refs=tuple(p.refs), ref_scale=p.ref_scale,
                dense=tuple(p.dense), outs=tuple(p.outs), reuse_fraction=p.reuse_fraction,
                dense_reuse=p.dense_reuse,
            )  # fmt: skip

        init = _StillCarry(
            caches=state.caches, refs=state.refs, ref_scale=state.ref_scale, dense=state.dense,
            outs=state.output, reuse_fraction=jnp.ones((len(self.plan.layers),), jnp.float32),
            dense_reuse=jnp.ones((len(self.plan.dense),), jnp.float32),
        )  # fmt: skip
        c = lax.fori_loop(0, _trips(skip), body, init)
        p = Pass(
            outs=c.outs, caches=c.caches, reuse_fraction=c.reuse_fraction,
            layer_valid=jnp.ones((len(self.plan.layers),), bool), semantic=state.semantic,
            semantic_info={}, refs=c.refs, ref_scale=c.ref_scale, dense=c.dense,
            dense_reuse=c.dense_reuse,
        )  # fmt: skip
        return p, skip

    def forward(self, leaves, state: CacheState, x, r0, ctx: FrameContext, refresh, finite) -> Pass:
        """The network on one frame with reuse: outputs, caches and what the step
        reports; convolutions computed in full take the model's ``lowerings``."""
        with conv_lowering.use(self.lowerings):
            return self._forward(leaves, state, x, r0, ctx, refresh, finite)

    def _forward(self, leaves, state: CacheState, x, r0, ctx: FrameContext, refresh, finite):
        plan = self.plan
        n_layers = len(plan.layers)
        kept = state.caches  # in the state's shapes (`cache_shape`)
        state = dataclasses.replace(
            state,
            caches=tuple(
                c if c is None else c.reshape(lp.layer.out_shape)
                for c, lp in zip(kept, plan.layers, strict=True)
            ),
        )
        policy = CachePolicy(plan, self.config, state, ctx, refresh, kept)
        args, masks = [*leaves, x[None]], [True] * len(leaves) + [r0]
        refs, ref_scale = tuple(state.refs), state.ref_scale
        dense, dense_reuse = tuple(state.dense), jnp.zeros((len(plan.dense),), jnp.float32)
        if self.semantic is None:
            ev = evaluate(self.analysis, args, masks, ctx, policy)
            results = [
                ev.layers.get(i, LayerResult(mask=False, cache=state.caches[i]))
                for i in range(n_layers)
            ]
            caches = tuple(r.cache for r in results)
            if self.config.statistics:
                reuse_fraction = mean_of_masks([r.mask for r in results])
            else:  # the masks of layers computed in full are left to dead-code elimination
                reuse_fraction = jnp.full((n_layers,), jnp.nan, jnp.float32)
            outs, layer_valid = tuple(ev.outputs), jnp.ones((n_layers,), bool)
            semantic, semantic_info = state.semantic, {}
            if plan.refines:
                refs, ref_scale = self._refined(state, ev.refined)
            if ev.dense:
                dense, dense_reuse = self._updated(state, ev.dense)
        else:  # early exits: the rest of the network inside nested lax.cond
            outs, caches, fractions, layer_valid, semantic, semantic_info = self.semantic.step(
                state.semantic, args, masks, ctx, policy, state.caches, finite
            )
            reuse_fraction = jnp.stack(fractions) if fractions else jnp.zeros((0,), jnp.float32)
            outs, caches = tuple(outs), tuple(caches)
        caches = tuple(
            c if c is None else c.reshape(k.shape) for c, k in zip(caches, kept, strict=True)
        )
        return Pass(
            outs=outs, caches=caches, reuse_fraction=reuse_fraction, layer_valid=layer_valid,
            semantic=semantic, semantic_info=semantic_info, refs=refs, ref_scale=ref_scale,
            dense=dense, dense_reuse=dense_reuse,
        )  # fmt: skip

    def _refined(self, state: CacheState, results: dict) -> tuple[tuple, jax.Array]:
        """The new references and (L,) scales from the refiner's results."""
        refs = list(state.refs)
        scales = [state.ref_scale[i] for i in range(len(self.plan.layers))]
        for i, r in results.items():
            if r is None:
                continue
            scales[i] = r.scale
            if r.ref is not None:
                refs[self.plan.layers[i].ref_owner] = r.ref
        return tuple(refs), (jnp.stack(scales) if scales else state.ref_scale)

    def _updated(self, state: CacheState, results: dict) -> tuple[tuple, jax.Array]:
        """The fully connected layers' new states and (D,) reuse fractions."""
        dense = list(state.dense)
        fractions = [jnp.float32(0.0)] * len(self.plan.dense)
        for i, r in results.items():
            if r is not None:
                dense[i], fractions[i] = r.state, r.reuse
        return tuple(dense), jnp.stack(fractions)

    def run(self, leaves, state: CacheState, frames, matches):
        """`lax.scan` of the step over ``frames`` (T, H, W, C): outputs and infos stacked."""

        def body(st, xs):
            frame, match = xs
            out, st, info = self(leaves, st, frame, match)
            return st, (out, info)

        state, (outs, infos) = lax.scan(body, state, (frames, matches))
        return outs, state, infos


def frame_finite(frame: jax.Array) -> jax.Array:
    """Whether every value of ``frame`` is finite (always, for integer frames)."""
    if jnp.issubdtype(frame.dtype, jnp.floating):
        return jnp.all(jnp.isfinite(frame))
    return jnp.bool_(True)


def frame_input(
    frame: jax.Array, preprocess: Callable[[jax.Array], jax.Array] | None, dtype: Any
) -> jax.Array:
    """A raw ``(H, W, C)`` frame as the model's input (no batch axis), in ``dtype``:
    ``preprocess(frame)`` when given, else uint8 frames divided by 255 and float
    frames as they are."""
    if preprocess is not None:
        x = preprocess(frame)
    elif frame.dtype == jnp.uint8:
        x = frame.astype(jnp.float32) / 255.0
    else:
        x = frame
    return jnp.asarray(x).astype(dtype)


def mean_of_masks(masks: Sequence[Any]) -> jax.Array:
    """The fraction of ``True`` in each mask, as an (L,) float32 array.

    Masks of one shape are stacked and reduced together: one reduction per map
    size rather than one per layer, each a fixed cost on CPU.
    """
    out = [jnp.float32(0.0)] * len(masks)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, m in enumerate(masks):
        groups.setdefault(jnp.shape(m), []).append(i)
    for shape, members in groups.items():
        if not shape:
            for i in members:
                out[i] = jnp.asarray(masks[i], jnp.float32)
            continue
        means = jnp.stack([masks[i] for i in members]).mean(
            axis=tuple(range(1, len(shape) + 1)), dtype=jnp.float32
        )
        for j, i in enumerate(members):
            out[i] = means[j]
    return jnp.stack(out) if out else jnp.zeros((0,), jnp.float32)


@jax.custom_batching.custom_vmap
def _trips(skip: jax.Array) -> jax.Array:
    """Trips of the step's loop: 0 for a skipped (still) frame, else 1.

    Under `jax.vmap` over streams the count is 1 when any stream's frame is
    not still, for all streams: the full step computes what skipping would
    for the still ones, so no per-stream select (a copy of every cache) is
    needed.
    """
    return (~skip).astype(jnp.int32)


@_trips.def_vmap
def _trips_vmap(axis_size, in_batched, skip):
    del axis_size
    trips = jnp.any(~skip) if in_batched[0] else ~skip
    return trips.astype(jnp.int32), False


def _unmatched(matched: Callable[[], Match]) -> Match:
    """A frame not matched: no pixel reusable, no motion, nothing matched; the
    structure of ``matched()``'s result (which is not computed)."""
    shapes = jax.eval_shape(matched)
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
