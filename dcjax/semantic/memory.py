"""SMTM semantic memory: fixed-shape tables and Equations 1 to 7 as pure functions.

Li et al., "Boosting Mobile CNN Inference through Semantic Memory" (MM '21),
Sections 4 to 6. Every function here is pure and jittable; every table has a
fixed shape, so a step that uses them compiles once.

Notation: ``K`` classes in the global memory, ``E`` exit points, ``D_e``
channels at exit point ``e``, ``F = max_fast`` slots of the fast memory.

- Eq. 1: ``s_j = cos(SV, SC_j)`` (`cosine_similarity`).
- Eq. 3: ``SA_j^l = sum_{l0<=l} 2**(l0-1) s_j^l0`` (`cumulative_similarity`,
  one exit at a time, ``l`` counted from 1).
- Eq. 4: ``AC = (SA_H - SA_SH) / SA_SH`` (`accumulated_confidence`); the
  denominator is ``max(|SA_SH|, eps)`` here, because features after a linear
  projection can make similarities negative, where the paper's ratio flips.
- Eq. 5: ``Score_i = FT_i * 0.25 ** floor(TS_i / W)`` (`replacement_scores`).
- Eq. 6: the fast memory holds the ``k`` top-scoring classes, ``k`` the
  smallest with ``P(A) = sum_{i<=k} Score_i / sum_i Score_i >= confidence``
  (`fast_memory`), clipped to ``[2, max_fast]`` (AC needs a second-highest).
- Eq. 7: ``SC' = (SC * m + SV) / (m + 1)`` for the predicted class at the exit
  points up to the one taken (`update_centres`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from dcjax.semantic import guard as guard_lib

__all__ = [
    "SemanticState",
    "accumulated_confidence",
    "cosine_similarity",
    "cumulative_similarity",
    "empty_state",
    "fast_memory",
    "memory_bytes",
    "replacement_scores",
    "update_centres",
    "update_outputs",
    "update_tables",
]

_EPS = 1e-6


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class SemanticState:
    """The semantic memory of one stream (a pytree, part of `CacheState`).

    Attributes:
        centres: per exit point, ``(K, D_e)`` semantic centres (global memory).
        counts: ``(E, K)`` update counts ``m`` of the centres (calibration
            samples plus runtime updates); 0 means the class has no centre.
        frequency: ``(K,)`` frequency table FT (times each class was the
            prediction at run time).
        since_seen: ``(K,)`` time-stamp table TS (consecutive frames each class
            was not predicted).
        prior: ``(K,)`` calibration frequency of each class, used only to break
            ties between equal scores when the fast memory is filled.
        out_means: per model output, ``(K, *shape)`` mean output of each class
            (what an exit returns).
        out_counts: ``(K,)`` how many outputs each mean averages.
        tau: the exit threshold (a scalar, initially ``SemanticConfig.tau``);
            a state field, so a stream's threshold can change without
            recompiling.
        guard: the exits' guard (`dcjax.semantic.guard.ExitGuard`): bounded
            staleness, checks, and whether the stream may exit at all.
    """

    centres: tuple
    counts: jax.Array
    frequency: jax.Array
    since_seen: jax.Array
    prior: jax.Array
    out_means: tuple
    out_counts: jax.Array
    tau: jax.Array
    guard: guard_lib.ExitGuard = dataclasses.field(default_factory=guard_lib.fresh)


def empty_state(
    num_classes: int,
    dims: tuple[int, ...],
    out_shapes: tuple[tuple[int, ...], ...],
    tau: float = float("inf"),
) -> SemanticState:
    """A memory with no centres (nothing can exit until it learns or is calibrated)."""
    k = num_classes
    return SemanticState(
        centres=tuple(jnp.zeros((k, d), jnp.float32) for d in dims),
        counts=jnp.zeros((len(dims), k), jnp.float32),
        frequency=jnp.zeros((k,), jnp.float32),
        since_seen=jnp.zeros((k,), jnp.int32),
        prior=jnp.zeros((k,), jnp.float32),
        out_means=tuple(jnp.zeros((k, *s), jnp.float32) for s in out_shapes),
        out_counts=jnp.zeros((k,), jnp.float32),
        tau=jnp.float32(tau),
    )


def memory_bytes(state: SemanticState) -> int:
    """Bytes the memory's tables occupy."""
    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state))


def cosine_similarity(v: jax.Array, centres: jax.Array) -> jax.Array:
    """Eq. 1: cosine similarity of ``v`` (D,) with each row of ``centres`` (N, D)."""
    v = v.astype(jnp.float32)
    centres = centres.astype(jnp.float32)
    num = centres @ v
    den = jnp.linalg.norm(centres, axis=-1) * jnp.linalg.norm(v)
    return num / jnp.maximum(den, _EPS)


def cumulative_similarity(sa: jax.Array, s: jax.Array, level: int | jax.Array) -> jax.Array:
    """Eq. 3, one exit point at a time: ``SA^l = SA^{l-1} + 2**(l-1) * s^l``.

    Args:
        sa: ``SA^{l-1}`` (zeros before the first exit point).
        s: this exit point's similarities ``s^l``.
        level: ``l``, counted from 1.
    """
    return sa + jnp.exp2(jnp.asarray(level, jnp.float32) - 1.0) * s


def accumulated_confidence(sa: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Eq. 4: ``AC = (SA_H - SA_SH) / max(|SA_SH|, eps)`` and the index of SA_H.

    Entries of ``sa`` that are ``-inf`` are not candidates; with fewer than two
    candidates AC is ``-inf`` (no exit).
    """
    top, index = lax.top_k(sa, 2)
    high, second = top[0], top[1]
    ac = (high - second) / jnp.maximum(jnp.abs(second), _EPS)
    ac = jnp.where(jnp.isfinite(second) & jnp.isfinite(high), ac, -jnp.inf)
    return ac, index[0]


def replacement_scores(frequency: jax.Array, since_seen: jax.Array, window: int) -> jax.Array:
    """Eq. 5: ``Score_i = FT_i * 0.25 ** floor(TS_i / W)``."""
    decay = jnp.floor_divide(since_seen, window).astype(jnp.float32)
    return frequency.astype(jnp.float32) * jnp.power(jnp.float32(0.25), decay)


def fast_memory(
    frequency: jax.Array,
    since_seen: jax.Array,
    prior: jax.Array,
    *,
    window: int,
    confidence: float,
    max_fast: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Eqs. 5 and 6: the classes in the fast memory.

    Classes are ranked by Score (ties broken by the calibration ``prior``,
    then by class id); the fast memory is the top ``k`` of them, ``k`` the
    smallest with ``P(A) >= confidence`` (``max_fast`` when every score is 0),
    clipped to ``[2, max_fast]``.

    Returns:
        ``(classes, active, k)``: ``(F,)`` class ids of the top ``F =
        min(max_fast, K)`` ranks, ``(F,)`` whether each slot is in the fast
        memory, and ``k``.
    """
    num = frequency.shape[0]
    f = min(max_fast, num)
    score = replacement_scores(frequency, since_seen, window)
    ids = jnp.arange(num, dtype=jnp.int32)
    neg_score, _, order = lax.sort((-score, -prior.astype(jnp.float32), ids), num_keys=2)
    classes, top = order[:f], -neg_score[:f]
    total = jnp.sum(score)
    share = jnp.cumsum(top) / jnp.where(total > 0, total, 1.0)
    # smallest k with P(A) >= confidence; the tolerance absorbs float rounding
    reached = share >= confidence - 1e-6
    k = jnp.where(jnp.any(reached), jnp.argmax(reached) + 1, f)
    k = jnp.where(total > 0, k, f)
    k = jnp.clip(k, min(2, f), f).astype(jnp.int32)
    active = jnp.arange(f) < k
    return classes, active, k


def update_tables(
    frequency: jax.Array, since_seen: jax.Array, predicted: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """After a frame predicted as class ``predicted``: FT += 1 there, TS = 0 there, +1 elsewhere."""
    hit = jnp.arange(frequency.shape[0]) == predicted
    frequency = frequency + hit.astype(frequency.dtype)
    since_seen = jnp.where(hit, 0, since_seen + 1).astype(since_seen.dtype)
    return frequency, since_seen


def update_centres(
    centres: tuple,
    counts: jax.Array,
    vectors: tuple,
    predicted: jax.Array,
    reached: jax.Array,
) -> tuple[tuple, jax.Array]:
    """Eq. 7: move the predicted class's centres towards this frame's vectors.

    Args:
        centres: per exit point ``(K, D_e)``.
        counts: ``(E, K)`` update counts ``m``.
        vectors: per exit point ``(D_e,)`` this frame's semantic vectors.
        predicted: the class (int scalar).
        reached: ``(E,)`` bool, the exit points to update (those up to the one
            taken).
    """
    new_centres = []
    for e, (c, v) in enumerate(zip(centres, vectors, strict=True)):
        m = counts[e, predicted]
        updated = (c[predicted] * m + v.astype(c.dtype)) / (m + 1.0)
        new_centres.append(c.at[predicted].set(jnp.where(reached[e], updated, c[predicted])))
    counts = counts.at[:, predicted].add(reached.astype(counts.dtype))
    return tuple(new_centres), counts


def update_outputs(
    out_means: tuple, out_counts: jax.Array, outputs: list, predicted: jax.Array, when: jax.Array
) -> tuple[tuple, jax.Array]:
    """Running mean of the model's outputs for class ``predicted`` (if ``when``)."""
    m = out_counts[predicted]
    means = tuple(
        o.at[predicted].set(
            jnp.where(when, (o[predicted] * m + jnp.asarray(x, o.dtype)) / (m + 1.0), o[predicted])
        )
        for o, x in zip(out_means, outputs, strict=True)
    )
    return means, out_counts.at[predicted].add(when.astype(out_counts.dtype))
