"""`CacheState`: everything a stream carries from one frame to the next.

The state is one pytree (a registered dataclass), so a step is a pure function
``step(state, frame) -> (output, state, info)``, `lax.scan` runs it over
frames, and `jax.vmap` over a stack of states runs many streams. `init_state`
makes the state of a fresh stream from a `dcjax.plan.Plan`: the first step
recomputes everything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from dcjax.plan import Plan

__all__ = ["CacheState", "cache_shape", "init_state"]


def cache_shape(out_shape: Sequence[int]) -> tuple[int, ...]:
    """The shape a layer's cache is kept in: its output's, without a leading
    batch axis of 1."""
    out_shape = tuple(out_shape)
    return out_shape[1:] if out_shape[:1] == (1,) else out_shape


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheState:
    """Everything a stream carries from one frame to the next (a pytree).

    Attributes:
        prev_frame: the key the next frame is matched against
            (`Config.key`): the last finite frame, or the pixels the caches
            were computed from. With a motion search (``matcher`` "diamond",
            "three_step" or "exhaustive") or the same-position matcher
            ("static") it is kept as the matcher's planes
            (`dcjax.matching.planes`: (1, H, W) luma, or (C, H, W) with
            ``color="rgb"``), so each frame is converted once; with DeepMon's
            histograms it is the (H, W, C) frame in float32; with no matcher
            ("none") it is empty, (0,).
        has_prev: whether ``prev_frame`` and the caches can be reused.
        since_refresh: frames since the last full recompute; a fresh state
            may start it at a phase (`init_state`'s ``refresh_phase``), which
            the first frame's full recompute keeps, so that streams started
            together refresh on different frames.
        frame_index: frames stepped so far.
        motion: the last frame's global motion (the next search starts there).
        caches: one cached output per reused layer, in ``CachedModel.layers``
            order, without the layer's batch axis of 1 (`cache_shape`: under
            `jax.vmap` over streams a size-1 axis behind the streams axis
            leads XLA:CPU to lay the caches out apart from the state's
            buffers and to copy every cache in and out on every step); None
            for a layer that keeps no cache (`LayerPlan.keeps_cache`:
            a leaf of the state is an output of the step, which XLA gives a
            buffer of its own, so a layer computed in full carries nothing).
        layer_valid: per layer, whether its cache holds the previous frame's
            output (false after a layer was skipped).
        semantic: the semantic memory (`dcjax.semantic.SemanticState`) when
            ``Config.semantic`` is set, else None.
        refs: with ``Config.refine``, per layer the reference copy of its
            input (None for layers that are not refined, and for a layer that
            reads the same variable as an earlier refined one, whose reference
            it shares); else empty.
        ref_scale: with ``Config.refine``, per layer the activation scale its
            threshold is relative to (0 until measured on the first frame).
        output: with ``Config.skip_unchanged``, the last output's leaves (a
            still frame returns them); else empty.
        dense: per fully connected layer (``CachedModel.dense_layers``)
            updated by rows, ``(x_ref, y_ref, scale)``: the reference input,
            the product ``x_ref @ W`` kept up to date by the changed rows, and
            the activation scale (0 until measured); None for a layer that is
            not. Empty when the plan keeps no such state
            (`Plan.keeps_dense_state`).
        guard: with ``Config.guard``, the (h, w) cells of the guarded score
            map over its threshold on the last frame, around which the next
            frame recomputes (`dcjax.transforms.guard.cells`); else None.
    """

    prev_frame: jax.Array
    has_prev: jax.Array
    since_refresh: jax.Array
    frame_index: jax.Array
    motion: jax.Array
    caches: tuple
    layer_valid: jax.Array
    semantic: Any = None
    refs: tuple = ()
    ref_scale: Any = None
    output: tuple = ()
    dense: tuple = ()
    guard: Any = None


def init_state(
    plan: Plan,
    *,
    key_shape: Sequence[int],
    out_avals: Sequence[Any],
    semantic: Any = None,
    refresh_phase: int = 0,
    guard_cells: tuple[int, int] | None = None,
) -> CacheState:
    """A fresh state for ``plan``: the first step recomputes everything.

    Args:
        plan: the step's plan.
        key_shape: the shape of the matcher's key (`StreamMatcher.key_shape`).
        out_avals: the model's flat outputs (kept for still frames).
        semantic: the initial semantic memory, with semantic exits.
        refresh_phase: how many frames early the stream's first periodic
            refresh comes (``Config.refresh_every``): the first frame is
            recomputed in full as always, the next full recompute comes
            ``refresh_every - refresh_phase`` frames later instead of
            ``refresh_every``, and every ``refresh_every`` frames after that.
        guard_cells: with ``Config.guard``, the ``(h, w)`` grid of the guarded
            score map (nothing guarded at first); else None.

    Returns:
        A state of fresh buffers (a state is consumed, donated, by the step it
        is passed to).
    """
    n = len(plan.layers)
    state = CacheState(
        prev_frame=jnp.zeros(tuple(key_shape), jnp.float32),
        has_prev=jnp.bool_(False),
        since_refresh=jnp.int32(refresh_phase),
        frame_index=jnp.int32(0),
        motion=jnp.zeros((2,), jnp.int32),
        caches=tuple(
            jnp.zeros(cache_shape(lp.layer.out_shape), lp.layer.dtype) if lp.keeps_cache else None
            for lp in plan.layers
        ),
        layer_valid=jnp.zeros((n,), bool),
        semantic=semantic,
        guard=None if guard_cells is None else jnp.zeros(tuple(guard_cells), bool),
    )
    if plan.keeps_dense_state:
        dense = tuple(
            (
                jnp.zeros((d.layer.in_features,), jnp.float32),
                jnp.zeros((d.layer.out_features,), jnp.float32),
                jnp.float32(0.0),
            )
            if d.updated
            else None
            for d in plan.dense
        )
        state = dataclasses.replace(state, dense=dense)
    if plan.refines:
        refs = tuple(
            jnp.zeros(lp.layer.in_shape, jnp.float32) if lp.owns_reference else None
            for lp in plan.layers
        )
        state = dataclasses.replace(state, refs=refs, ref_scale=jnp.zeros((n,), jnp.float32))
    if plan.skips_still:
        state = dataclasses.replace(
            state, output=tuple(jnp.zeros(a.shape, a.dtype) for a in out_avals)
        )
    return jax.tree_util.tree_map(lambda a: jnp.array(a, copy=True), state)
