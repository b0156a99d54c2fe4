"""Per-block motion searches (DeepCache Section 4, Step 2), vectorised over blocks.

Every search takes the blocks of the current frame and the padded previous
plane, and returns for each block the motion vector ``(dy, dx)`` with the
smallest sum of squared differences (SSD) it found, that SSD, and the SSD at the
block's start vector:

    ``cur[y0 + i, x0 + j] ~ prev[y0 + i + dy, x0 + j + dx]``.

A candidate vector is admissible only when its previous-frame block lies inside
the frame and ``|dy|, |dx| <= search_range``; each block's admissible box is
given as ``lo`` and ``hi`` (inclusive). Inadmissible candidates cost ``+inf``.
On ties the earlier candidate wins: the current centre before its neighbours
(diamond, three-step), the shorter vector before the longer one (exhaustive).

All blocks move together through one fixed set of XLA operations, with blocks on
the last axis so that every operation is a vector operation across blocks: a
gather of one small window per block around its current centre, SSDs of the
pattern points from static slices of that window, materialised once, and the
choice of the best point by a chain of compare-and-selects. Nothing loops over
blocks in Python and no shape depends on data, so the searches are jittable and
vmappable over streams. The diamond search runs a ``lax.while_loop`` that ends
when every block has converged or after ``max_steps`` large-diamond moves; its
last few moving blocks are compacted into a small static number of slots so
that they do not make every block pay for their steps.

A steady camera, where most blocks stay at the zero vector, is served by
`dcjax.matching.steady`, which reuses these steps for the blocks that move.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dcjax._compact import compact
from dcjax._loops import skipping_pays

# Large diamond search pattern (Zhu & Ma 1997) around the centre (0, 0).
LARGE_DIAMOND = ((-2, 0), (2, 0), (0, -2), (0, 2), (-1, -1), (-1, 1), (1, -1), (1, 1))
# Small diamond search pattern around the centre.
SMALL_DIAMOND = ((-1, 0), (1, 0), (0, -1), (0, 1))
# The 8 neighbours of the three-step search, in units of the step.
_EIGHT = tuple((dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0))


class SearchResult(NamedTuple):
    """Output of a per-block search (blocks last).

    Attributes:
        vectors: int32 ``(2, n)`` best ``(dy, dx)`` found per block.
        ssd: float32 ``(n,)`` SSD at ``vectors`` (``+inf`` if none admissible).
        start: int32 ``(2, n)`` the vector each block's search started from.
        start_ssd: float32 ``(n,)`` SSD at ``start``.
    """

    vectors: jax.Array
    ssd: jax.Array
    start: jax.Array
    start_ssd: jax.Array


class Blocks(NamedTuple):
    """The blocks a search works on, blocks on the last axis.

    Attributes:
        cur: float32 ``(C, bs, bs, n)`` current-frame blocks (zero outside the
            frame).
        weights: float32 ``(1, bs, bs, n)``: 1 inside the frame, 0 outside;
            ``None`` when every block is whole.
        corners: int32 ``(2, n)`` top-left of each block in padded-plane
            coordinates (frame origin plus the pad).
        lo: int32 ``(2, n)`` smallest admissible vector per block.
        hi: int32 ``(2, n)`` largest admissible vector per block.
    """

    cur: jax.Array | None
    weights: jax.Array | None
    corners: jax.Array
    lo: jax.Array
    hi: jax.Array


def windows(prev_p: jax.Array, corners: jax.Array, size: int) -> jax.Array:
    """Gather one ``size`` x ``size`` window of ``prev_p`` (C, Hp, Wp) per block.

    The gather uses flat indices into the flattened plane, which XLA:CPU runs
    faster than a two-index gather or a batched dynamic slice plus transpose.

    Args:
        prev_p: (C, Hp, Wp) padded plane.
        corners: int32 (2, n) top-left corners in ``prev_p``; windows must lie
            inside it.
        size: window side.

    Returns:
        (C, size, size, n).
    """
    c, _, wp = prev_p.shape
    a = jnp.arange(size, dtype=jnp.int32)
    offsets = a[:, None, None] * wp + a[None, :, None]
    idx = offsets + (corners[0] * wp + corners[1])[None, None, :]
    return prev_p.reshape(c, -1).at[:, idx].get(mode="clip")


def _sum_leading(x: jax.Array, chain: bool = False) -> jax.Array:
    """Sum over every axis but the last -> (n,).

    With ``chain``, as adds of whole slices, one leading axis at a time, which
    XLA:CPU vectorises along the blocks: faster than a reduction for the ~100
    compacted blocks `dcjax.matching.steady` steps, slower for thousands (see
    docs/performance-notes.md, "Compacted blocks are summed as chained adds").
    """
    if not chain:
        return x.sum(axis=tuple(range(x.ndim - 1)))
    while x.ndim > 1:
        total = x[0]
        for i in range(1, x.shape[0]):
            total = total + x[i]
        x = total
    return x


def block_ssd(
    cur: jax.Array, ref: jax.Array, weights: jax.Array | None, chain: bool = False
) -> jax.Array:
    """SSD of (C, bs, bs, n) blocks against (C, bs, bs, n) references -> (n,)."""
    diff = cur - ref
    if weights is not None:
        diff = diff * weights  # 0/1 weights: the same as weighting the squares
    return _sum_leading(jnp.square(diff), chain)


def admissible(blocks: Blocks, dy: jax.Array, dx: jax.Array) -> jax.Array:
    """(n,) bool: the vector ``(dy, dx)`` lies in each block's admissible box."""
    return (dy >= blocks.lo[0]) & (dy <= blocks.hi[0]) & (dx >= blocks.lo[1]) & (dx <= blocks.hi[1])


class Best(NamedTuple):
    """Running best candidate per block."""

    dy: jax.Array
    dx: jax.Array
    cost: jax.Array


def search_step(
    prev_p: jax.Array,
    blocks: Blocks,
    best: Best,
    offsets: tuple[tuple[int, int], ...],
    margin: int,
    chain: bool = False,
) -> tuple[jax.Array, Best, jax.Array]:
    """Score ``offsets`` around each block's current vector ``best``
    (``chain``: see `_sum_leading`).

    The incumbent ``best`` wins ties; then earlier offsets win. An offset
    ``(0, 0)`` rescores the centre itself (use an incumbent cost of ``inf``).

    Returns:
        ``(moved, best, costs)``: whether the best moved away from the centre,
        the new best, and the (K, n) costs of the offsets.
    """
    bs = blocks.cur.shape[1]
    corners = blocks.corners + jnp.stack([best.dy, best.dx]) - margin
    win = windows(prev_p, corners, bs + 2 * margin)
    costs = []
    for oy, ox in offsets:
        sub = win[:, margin + oy : margin + oy + bs, margin + ox : margin + ox + bs]
        ok = admissible(blocks, best.dy + oy, best.dx + ox)
        costs.append(jnp.where(ok, block_ssd(blocks.cur, sub, blocks.weights, chain), jnp.inf))
    # Materialise the costs once: otherwise XLA fuses the SSDs into each of the
    # selects below and computes them three times.
    costs = lax.optimization_barrier(jnp.stack(costs))
    moved, new = choose(best, offsets, costs)
    return moved, new, costs


def choose(
    best: Best, offsets: tuple[tuple[int, int], ...], costs: jax.Array
) -> tuple[jax.Array, Best]:
    """The best of the incumbent and ``offsets`` around it, given their (K, n) ``costs``.

    The incumbent wins ties, then earlier offsets. Returns ``(moved, new)``.
    """
    new = best
    for i, (oy, ox) in enumerate(offsets):
        better = costs[i] < new.cost
        new = Best(
            jnp.where(better, best.dy + oy, new.dy),
            jnp.where(better, best.dx + ox, new.dx),
            jnp.minimum(costs[i], new.cost),
        )
    return (new.dy != best.dy) | (new.dx != best.dx), new


def first_step(
    prev_p: jax.Array,
    blocks: Blocks,
    start: jax.Array,
    offsets: tuple[tuple[int, int], ...],
    margin: int,
) -> tuple[jax.Array, Best, jax.Array]:
    """First step: score the start vector and ``offsets`` around it from one window.

    Returns:
        ``(moved, best, start_ssd)``.
    """
    n = start.shape[1]
    incumbent = Best(start[0], start[1], jnp.full((n,), jnp.inf, jnp.float32))
    _, best, costs = search_step(prev_p, blocks, incumbent, ((0, 0), *offsets), margin)
    return (best.dy != start[0]) | (best.dx != start[1]), best, costs[0]


def take_blocks(blocks: Blocks, idx: jax.Array, cur: tuple | None = None) -> Blocks:
    """The blocks at indices ``idx`` (m,).

    ``cur``: ``(cur_p, pad, block_size)`` to gather their current blocks from
    the unpadded current plane ``cur_p`` (at ``blocks.corners - pad``) rather
    than take them from ``blocks.cur``.
    """
    if cur is None:
        cur = blocks.cur[..., idx]
    else:
        cur_p, pad, bs = cur
        cur = windows(cur_p, blocks.corners[:, idx] - pad, bs)
    return Blocks(
        cur,
        None if blocks.weights is None else blocks.weights[..., idx],
        blocks.corners[:, idx],
        blocks.lo[:, idx],
        blocks.hi[:, idx],
    )


def tail_capacity(n: int) -> int:
    """How many still-moving blocks the diamond search's compacted phase holds."""
    return min(n, max(16, -(-n // 16 // 8) * 8))


def slots(flags: jax.Array, cap: int) -> tuple[jax.Array, jax.Array]:
    """``(idx, valid)``, each (cap,): the flagged blocks' indices (0 in unused slots)."""
    valid = jnp.arange(cap) < flags.sum()
    return jnp.where(valid, compact(flags, cap), 0), valid


def diamond_search(
    prev_p: jax.Array,
    blocks: Blocks,
    start: jax.Array,
    *,
    max_steps: int,
    fixed_steps: bool | None = None,
) -> SearchResult:
    """Diamond search (Zhu & Ma 1997): large diamond until the centre wins, then small.

    The first step scores the start and its large diamond; every later step
    scores the 8 points of the large diamond around each block's new centre. A
    block stops moving when its centre wins or after ``max_steps`` moves; a
    block whose centre won scores the same diamond again and stays, so all
    blocks can step together. A last step scores the small diamond around
    every centre.

    Blocks converge at different speeds, and a few stragglers would make every
    block pay for their steps. So the large-diamond loop runs on all blocks
    only while more than `tail_capacity` of them are moving; then the moving
    ones are compacted into that many slots (`dcjax._compact.compact`, of a
    static size) and a second loop steps only those. The result is the same as
    stepping every block until all stop.

    With ``fixed_steps`` (the default off CPU, see `dcjax._loops.skipping_pays`)
    every block takes all ``max_steps`` steps in a loop of static length
    instead: a block that stopped re-scores its diamond and stays, so the
    result is the same, and no step count goes to the host.

    Args:
        prev_p: (C, Hp, Wp) padded previous plane; the pad must be at least
            ``search_range + 2``.
        blocks: the blocks to search.
        start: int32 (2, n) admissible start vectors.
        max_steps: most large-diamond moves per block.

    Returns:
        The `SearchResult`.
    """
    n = start.shape[1]
    if max_steps == 0:
        _, best, start_ssd = first_step(prev_p, blocks, start, SMALL_DIAMOND, 1)
        return SearchResult(jnp.stack([best.dy, best.dx]), best.cost, start, start_ssd)
    moved, best, start_ssd = first_step(prev_p, blocks, start, LARGE_DIAMOND, 2)
    if fixed_steps is None:
        fixed_steps = not skipping_pays()
    if fixed_steps:
        best = lax.fori_loop(
            1, max_steps, lambda _, b: search_step(prev_p, blocks, b, LARGE_DIAMOND, 2)[1], best
        )
        _, best, _ = search_step(prev_p, blocks, best, SMALL_DIAMOND, 1)
        return SearchResult(jnp.stack([best.dy, best.dx]), best.cost, start, start_ssd)
    cap = tail_capacity(n)

    def body(state):
        it, best, _ = state
        moved, best, _ = search_step(prev_p, blocks, best, LARGE_DIAMOND, 2)
        return it + 1, best, moved

    def crowded(state):
        it, _, active = state
        return (it < max_steps) & (active.sum() > cap)

    it, best, active = lax.while_loop(crowded, body, (jnp.int32(1), best, moved))

    if cap < n:
        # The stragglers: at most `cap` blocks, in static slots.
        idx, valid = slots(active, cap)
        sub_best = stragglers(
            prev_p, take_blocks(blocks, idx), best, idx, active[idx] & valid, it, max_steps
        )
        best = put_best(best, sub_best, jnp.where(valid, idx, n))
    _, best, _ = search_step(prev_p, blocks, best, SMALL_DIAMOND, 1)
    return SearchResult(jnp.stack([best.dy, best.dx]), best.cost, start, start_ssd)


def stragglers(
    prev_p: jax.Array,
    sub: Blocks,
    best: Best,
    idx: jax.Array,
    active: jax.Array,
    it: jax.Array,
    max_steps: int,
    chain: bool = False,
) -> Best:
    """Large-diamond steps of the compacted blocks ``sub`` (``best`` at ``idx``)
    while any of the ``active`` ones moves and fewer than ``max_steps`` moves
    (``it`` so far) were made."""

    def body(state):
        it, sb, active = state
        moved, sb, _ = search_step(prev_p, sub, sb, LARGE_DIAMOND, 2, chain)
        return it + 1, sb, moved & active

    def busy(state):
        it, _, active = state
        return (it < max_steps) & active.any()

    sub_best = Best(best.dy[idx], best.dx[idx], best.cost[idx])
    return lax.while_loop(busy, body, (it, sub_best, active))[1]


def put_best(best: Best, part: Best, dest: jax.Array) -> Best:
    """``best`` with ``part`` written at ``dest`` (indices out of range are dropped)."""
    return Best(*(full.at[dest].set(p, mode="drop") for full, p in zip(best, part, strict=True)))


def three_step_steps(search_range: int) -> tuple[int, ...]:
    """Step sizes of the three-step search for a range: (4, 2, 1) for 7."""
    first = 2 ** max(0, math.floor(math.log2(max(search_range + 1, 2))) - 1)
    return tuple(2**k for k in range(int(math.log2(first)), -1, -1))


def three_step_search(
    prev_p: jax.Array, blocks: Blocks, start: jax.Array, *, search_range: int
) -> SearchResult:
    """Three-step search: the 8 points at step S around the centre, S halving to 1.

    Args:
        prev_p: (C, Hp, Wp) padded previous plane; the pad must be at least
            ``search_range`` plus the first step.
        blocks: the blocks to search.
        start: int32 (2, n) admissible start vectors.
        search_range: the search range; fixes the step sizes
            (`three_step_steps`).

    Returns:
        The `SearchResult`.
    """
    steps = three_step_steps(search_range)
    s0 = steps[0]
    _, best, start_ssd = first_step(
        prev_p, blocks, start, tuple((dy * s0, dx * s0) for dy, dx in _EIGHT), s0
    )
    for s in steps[1:]:
        offsets = tuple((dy * s, dx * s) for dy, dx in _EIGHT)
        _, best, _ = search_step(prev_p, blocks, best, offsets, s)
    return SearchResult(jnp.stack([best.dy, best.dx]), best.cost, start, start_ssd)


def exhaustive_order(search_range: int) -> np.ndarray:
    """All vectors of the range, shorter (L1) first, then by dy, then dx: (K, 2) int32."""
    r = np.arange(-search_range, search_range + 1)
    vy, vx = np.meshgrid(r, r, indexing="ij")
    v = np.stack([vy.ravel(), vx.ravel()], -1)
    key = np.lexsort((v[:, 1], v[:, 0], np.abs(v).sum(-1)))
    return v[key].astype(np.int32)


def exhaustive_search(
    prev_p: jax.Array, blocks: Blocks, start: jax.Array, *, search_range: int
) -> SearchResult:
    """Exhaustive search over every vector with ``|dy|, |dx| <= search_range``.

    One window with a ``search_range`` margin is gathered per block; a
    ``lax.fori_loop`` walks the rows ``dy`` of the range and scores every ``dx``
    of the row from static slices. Ties go to the shorter vector (L1), then to
    the smaller ``dy``, then to the smaller ``dx`` (`exhaustive_order`).

    Args:
        prev_p: (C, Hp, Wp) padded previous plane; the pad must be at least
            ``search_range``.
        blocks: the blocks to search.
        start: int32 (2, n) admissible start vectors (only its SSD is reported).
        search_range: the search range.

    Returns:
        The `SearchResult`.
    """
    r = search_range
    size = 2 * r + 1
    bs = blocks.cur.shape[1]
    n = start.shape[1]
    win = windows(prev_p, blocks.corners - r, bs + 2 * r)

    def body(i, state):
        best, key, start_ssd = state
        dy = i - r
        rows = lax.dynamic_slice_in_dim(win, i, bs, axis=1)  # (C, bs, bs + 2r, n)
        costs = []
        for j in range(size):
            cost = block_ssd(blocks.cur, rows[:, :, j : j + bs], blocks.weights)
            ok = admissible(blocks, jnp.full((n,), dy), jnp.full((n,), j - r))
            costs.append(jnp.where(ok, cost, jnp.inf))
        costs = lax.optimization_barrier(jnp.stack(costs))  # computed once, see `search_step`
        for j in range(size):
            dx = j - r
            cost = costs[j]
            k = (jnp.abs(dy) + abs(dx)) * size**2 + i * size + j
            better = (cost < best.cost) | ((cost == best.cost) & (k < key))
            best = Best(
                jnp.where(better, dy, best.dy),
                jnp.where(better, dx, best.dx),
                jnp.where(better, cost, best.cost),
            )
            key = jnp.where(better, k, key)
            at_start = (start[0] == dy) & (start[1] == dx)
            start_ssd = jnp.where(at_start, cost, start_ssd)
        return best, key, start_ssd

    init = Best(jnp.zeros((n,), jnp.int32), jnp.zeros((n,), jnp.int32), jnp.full((n,), jnp.inf))
    init_key = jnp.full((n,), size**3, jnp.int32)
    init_start = jnp.full((n,), jnp.inf, jnp.float32)
    best, _, start_ssd = lax.fori_loop(0, size, body, (init, init_key, init_start))
    return SearchResult(jnp.stack([best.dy, best.dx]), best.cost, start, start_ssd)
