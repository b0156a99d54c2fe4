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

A steady camera starts every block at the zero vector, and most blocks never
leave it. `steady_diamond_search` serves that case: `plane_ssd` scores every
block at the 13 vectors the diamond search can score around a block that
stays (the centre and both diamonds) by 13 passes over the whole plane, and
only the blocks that move are compacted and searched by gathered windows.
Measured on vtest (`dcjax.matching.match`, 10x10 blocks, on the
2-core development machine): 4.6 to 2.1 ms a frame at 448x448 and 1.33 to
0.72 ms at 224x224; from any other start the window search runs as before.
The price is compile time: the matcher for 64x84 frames compiles in 2.6
instead of 1.3 s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dcjax._compact import compact
from dcjax._loops import run_if, skipping_pays

# Large diamond search pattern (Zhu & Ma 1997) around the centre (0, 0).
LARGE_DIAMOND = ((-2, 0), (2, 0), (0, -2), (0, 2), (-1, -1), (-1, 1), (1, -1), (1, 1))
# Small diamond search pattern around the centre.
SMALL_DIAMOND = ((-1, 0), (1, 0), (0, -1), (0, 1))
# Every offset the diamond search scores around a block that does not move:
# the centre, the large diamond and the small diamond (the L1 ball of radius 2).
PLANE_OFFSETS = ((0, 0), *LARGE_DIAMOND, *SMALL_DIAMOND)
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
    XLA:CPU vectorises along the blocks: faster than a reduction for the
    ~100 compacted blocks `steady_diamond_search` steps (the matcher on vtest
    at 448x448: 2.0 against 2.5 ms a frame), slower for thousands of blocks,
    and more operations to compile, so the window search reduces.
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


def _admissible(blocks: Blocks, dy: jax.Array, dx: jax.Array) -> jax.Array:
    """(n,) bool: the vector ``(dy, dx)`` lies in each block's admissible box."""
    return (dy >= blocks.lo[0]) & (dy <= blocks.hi[0]) & (dx >= blocks.lo[1]) & (dx <= blocks.hi[1])


class _Best(NamedTuple):
    """Running best candidate per block."""

    dy: jax.Array
    dx: jax.Array
    cost: jax.Array


def _step(
    prev_p: jax.Array,
    blocks: Blocks,
    best: _Best,
    offsets: tuple[tuple[int, int], ...],
    margin: int,
    chain: bool = False,
) -> tuple[jax.Array, _Best, jax.Array]:
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
        ok = _admissible(blocks, best.dy + oy, best.dx + ox)
        costs.append(jnp.where(ok, block_ssd(blocks.cur, sub, blocks.weights, chain), jnp.inf))
    # Materialise the costs once: otherwise XLA fuses the SSDs into each of the
    # selects below and computes them three times.
    costs = lax.optimization_barrier(jnp.stack(costs))
    moved, new = _choose(best, offsets, costs)
    return moved, new, costs


def _choose(
    best: _Best, offsets: tuple[tuple[int, int], ...], costs: jax.Array
) -> tuple[jax.Array, _Best]:
    """The best of the incumbent and ``offsets`` around it, given their (K, n) ``costs``.

    The incumbent wins ties, then earlier offsets. Returns ``(moved, new)``.
    """
    new = best
    for i, (oy, ox) in enumerate(offsets):
        better = costs[i] < new.cost
        new = _Best(
            jnp.where(better, best.dy + oy, new.dy),
            jnp.where(better, best.dx + ox, new.dx),
            jnp.minimum(costs[i], new.cost),
        )
    return (new.dy != best.dy) | (new.dx != best.dx), new


def plane_ssd(
    cur_p: jax.Array, prev_p: jax.Array, pad: int, block_size: int, inside: np.ndarray | None
) -> jax.Array:
    """SSD of every block at every vector of `PLANE_OFFSETS`, by whole-plane passes.

    For each vector the squared differences of the whole plane against the
    shifted previous plane are summed over the rows of each block row, then
    over the columns of each block: 13 passes over the frame in place of a
    gathered window per block. Inadmissible vectors are not masked here.

    Args:
        cur_p: (C, nby * bs, nbx * bs) current plane, zero past the frame.
        prev_p: (C, Hp, Wp) previous plane with at least ``pad >= 2`` pixels of
            padding before its first row and column and enough after.
        pad: the padding before the frame in ``prev_p``.
        block_size: ``bs``.
        inside: 0/1 (nby * bs, nbx * bs) mask of the frame pixels, or ``None``
            when every block is whole.

    Returns:
        (13, nby * nbx) float32, blocks in row-major order.
    """
    c, hp, wp = cur_p.shape
    bs = block_size
    nby, nbx = hp // bs, wp // bs
    sums = []
    for oy, ox in PLANE_OFFSETS:
        ref = prev_p[:, pad + oy : pad + oy + hp, pad + ox : pad + ox + wp]
        err = jnp.square(cur_p[0] - ref[0])
        for i in range(1, c):
            err = err + jnp.square(cur_p[i] - ref[i])
        if inside is not None:
            err = err * inside
        # Rows first, as adds of whole rows, which XLA:CPU vectorises along
        # the row; a reduction over both block axes ran twice as long.
        err = err.reshape(nby, bs, wp)
        rows = err[:, 0]
        for i in range(1, bs):
            rows = rows + err[:, i]
        sums.append(rows)
    rows = lax.optimization_barrier(jnp.stack(sums)).reshape(len(PLANE_OFFSETS), nby, nbx, bs)
    total = rows[..., 0]
    for j in range(1, bs):
        total = total + rows[..., j]
    return total.reshape(len(PLANE_OFFSETS), nby * nbx)


def _known_costs(
    blocks: Blocks,
    start: jax.Array,
    start_costs: jax.Array,
    offsets: tuple[tuple[int, int], ...],
) -> jax.Array:
    """(K, n) costs of ``offsets`` around ``start`` from ``start_costs``; inadmissible: inf."""
    rows = []
    for oy, ox in offsets:
        ok = _admissible(blocks, start[0] + oy, start[1] + ox)
        rows.append(jnp.where(ok, start_costs[PLANE_OFFSETS.index((oy, ox))], jnp.inf))
    return jnp.stack(rows)


def _first(
    prev_p: jax.Array,
    blocks: Blocks,
    start: jax.Array,
    offsets: tuple[tuple[int, int], ...],
    margin: int,
) -> tuple[jax.Array, _Best, jax.Array]:
    """First step: score the start vector and ``offsets`` around it from one window.

    Returns:
        ``(moved, best, start_ssd)``.
    """
    n = start.shape[1]
    incumbent = _Best(start[0], start[1], jnp.full((n,), jnp.inf, jnp.float32))
    _, best, costs = _step(prev_p, blocks, incumbent, ((0, 0), *offsets), margin)
    return (best.dy != start[0]) | (best.dx != start[1]), best, costs[0]


def _first_known(
    blocks: Blocks,
    start: jax.Array,
    start_costs: jax.Array,
    offsets: tuple[tuple[int, int], ...],
) -> tuple[jax.Array, _Best, jax.Array]:
    """`_first` from precomputed costs at ``start + PLANE_OFFSETS``."""
    n = start.shape[1]
    incumbent = _Best(start[0], start[1], jnp.full((n,), jnp.inf, jnp.float32))
    costs = _known_costs(blocks, start, start_costs, ((0, 0), *offsets))
    moved, best = _choose(incumbent, ((0, 0), *offsets), costs)
    return moved, best, costs[0]


def _take(blocks: Blocks, idx: jax.Array, cur: tuple | None = None) -> Blocks:
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


def _slots(flags: jax.Array, cap: int) -> tuple[jax.Array, jax.Array]:
    """``(idx, valid)``, each (cap,): the flagged blocks' indices (0 in unused slots)."""
    valid = jnp.arange(cap) < flags.sum()
    return jnp.where(valid, compact(flags, cap), 0), valid


def steady_capacity(n: int) -> int:
    """Slots for the blocks that move in `steady_diamond_search`: an eighth of them.

    More moving blocks than slots overflow to the window search of every block,
    which costs several times the plane path, so the slots must cover what real
    frames give. With the transform's default key (`Config(key="reference")`,
    reused blocks compared with the pixels their features came from) the count
    grows with the key's age between refreshes. Measured on vtest (25 frames
    through ``deepcache``, refresh every 10): at 448x448 (2025 blocks) 71-215
    blocks moved at the first step, so a sixteenth (128 slots) overflowed on
    most frames and matching took 3.7 ms a frame (median) against 1.6 ms with an
    eighth (256; a quarter, 2.1 ms); at 224x224 (529 blocks) 17-49 moved, and an
    eighth (72 slots) took the worst frame from 1.6 to 0.65 ms at the same
    median (0.46-0.48 ms). A multiple of 8, at least 16, at most ``n``.
    """
    return min(n, max(16, -(-n // 8 // 8) * 8))


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
        _, best, start_ssd = _first(prev_p, blocks, start, SMALL_DIAMOND, 1)
        return SearchResult(jnp.stack([best.dy, best.dx]), best.cost, start, start_ssd)
    moved, best, start_ssd = _first(prev_p, blocks, start, LARGE_DIAMOND, 2)
    if fixed_steps is None:
        fixed_steps = not skipping_pays()
    if fixed_steps:
        best = lax.fori_loop(
            1, max_steps, lambda _, b: _step(prev_p, blocks, b, LARGE_DIAMOND, 2)[1], best
        )
        _, best, _ = _step(prev_p, blocks, best, SMALL_DIAMOND, 1)
        return SearchResult(jnp.stack([best.dy, best.dx]), best.cost, start, start_ssd)
    cap = tail_capacity(n)

    def body(state):
        it, best, _ = state
        moved, best, _ = _step(prev_p, blocks, best, LARGE_DIAMOND, 2)
        return it + 1, best, moved

    def crowded(state):
        it, _, active = state
        return (it < max_steps) & (active.sum() > cap)

    it, best, active = lax.while_loop(crowded, body, (jnp.int32(1), best, moved))

    if cap < n:
        # The stragglers: at most `cap` blocks, in static slots.
        idx, valid = _slots(active, cap)
        sub_best = _stragglers(
            prev_p, _take(blocks, idx), best, idx, active[idx] & valid, it, max_steps
        )
        best = _put(best, sub_best, jnp.where(valid, idx, n))
    _, best, _ = _step(prev_p, blocks, best, SMALL_DIAMOND, 1)
    return SearchResult(jnp.stack([best.dy, best.dx]), best.cost, start, start_ssd)


def _stragglers(
    prev_p: jax.Array,
    sub: Blocks,
    best: _Best,
    idx: jax.Array,
    active: jax.Array,
    it: jax.Array,
    max_steps: int,
    chain: bool = False,
) -> _Best:
    """Large-diamond steps of the compacted blocks ``sub`` (``best`` at ``idx``)
    while any of the ``active`` ones moves and fewer than ``max_steps`` moves
    (``it`` so far) were made."""

    def body(state):
        it, sb, active = state
        moved, sb, _ = _step(prev_p, sub, sb, LARGE_DIAMOND, 2, chain)
        return it + 1, sb, moved & active

    def busy(state):
        it, _, active = state
        return (it < max_steps) & active.any()

    sub_best = _Best(best.dy[idx], best.dx[idx], best.cost[idx])
    return lax.while_loop(busy, body, (it, sub_best, active))[1]


def _put(best: _Best, part: _Best, dest: jax.Array) -> _Best:
    """``best`` with ``part`` written at ``dest`` (indices out of range are dropped)."""
    return _Best(*(full.at[dest].set(p, mode="drop") for full, p in zip(best, part, strict=True)))


def steady_diamond_search(
    prev_p: jax.Array,
    cur_p: jax.Array,
    blocks: Blocks,
    start_costs: jax.Array,
    *,
    pad: int,
    block_size: int,
    max_steps: int,
    decided: Callable[[jax.Array], jax.Array] | None = None,
) -> tuple[SearchResult, jax.Array]:
    """`diamond_search` from a zero start, for a steady scene where most blocks stay.

    The first step and, for the blocks whose centre stays at zero, the final
    small diamond take their costs from ``start_costs`` (`plane_ssd`); the
    blocks that move are compacted into `steady_capacity` slots, their current
    blocks gathered from ``cur_p``, and stepped alone. The result is
    `diamond_search`'s with a zero start (up to float rounding of the SSDs),
    unless more blocks move at the first step than there are slots: then
    ``overflow`` is true and the result is not valid.

    Args:
        prev_p: (C, Hp, Wp) padded previous plane, as for `diamond_search`.
        cur_p: (C, nby * bs, nbx * bs) current plane, zero past the frame.
        blocks: the blocks, every block of the grid in row-major order;
            ``blocks.cur`` is not used (it may be ``None``).
        start_costs: (13, n) `plane_ssd` of ``cur_p`` against ``prev_p``.
        pad: the padding before the frame in ``prev_p``.
        block_size: the side of the blocks.
        max_steps: most large-diamond moves per block.
        decided: given the (n,) flags of the blocks whose search ends at the
            zero vector without moving (their centre won both diamonds),
            whether the caller needs nothing from the blocks that move. Where
            it holds, those are not searched further (nor does the result
            overflow) and report their first step's best vector and cost: a
            caller that needs only the global motion and the costs at it
            (`dcjax.matching.block`, whose motion is zero once more than half
            the blocks pass there) skips the stragglers' loop and the
            overflow's window search of every block.

    Returns:
        ``(result, overflow)``.
    """
    n = blocks.corners.shape[1]
    start = jnp.zeros((2, n), jnp.int32)
    if max_steps == 0:
        _, best, start_ssd = _first_known(blocks, start, start_costs, SMALL_DIAMOND)
        result = SearchResult(jnp.stack([best.dy, best.dx]), best.cost, start, start_ssd)
        return result, jnp.bool_(False)
    moved, best, start_ssd = _first_known(blocks, start, start_costs, LARGE_DIAMOND)
    _, stay = _choose(best, SMALL_DIAMOND, _known_costs(blocks, start, start_costs, SMALL_DIAMOND))
    cap = steady_capacity(n)
    overflow = moved.sum() > cap

    def search_moving(prev_p, cur_p, best, stay, moved):
        idx, valid = _slots(moved, cap)
        sub = _take(blocks, idx, (cur_p, pad, block_size))
        active = moved[idx] & valid
        sub_best = _stragglers(prev_p, sub, best, idx, active, jnp.int32(1), max_steps, chain=True)
        _, sub_best, _ = _step(prev_p, sub, sub_best, SMALL_DIAMOND, 1, chain=True)
        return _put(stay, sub_best, jnp.where(valid, idx, n))

    if decided is None:
        best = search_moving(prev_p, cur_p, best, stay, moved)
    else:
        skip = decided(~moved & (stay.dy == 0) & (stay.dx == 0))
        first = _Best(*(jnp.where(moved, b, s) for b, s in zip(best, stay, strict=True)))
        best = run_if(~skip, search_moving, (prev_p, cur_p, best, stay, moved), first)
        overflow = overflow & ~skip
    return SearchResult(jnp.stack([best.dy, best.dx]), best.cost, start, start_ssd), overflow


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
    _, best, start_ssd = _first(
        prev_p, blocks, start, tuple((dy * s0, dx * s0) for dy, dx in _EIGHT), s0
    )
    for s in steps[1:]:
        offsets = tuple((dy * s, dx * s) for dy, dx in _EIGHT)
        _, best, _ = _step(prev_p, blocks, best, offsets, s)
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
            ok = _admissible(blocks, jnp.full((n,), dy), jnp.full((n,), j - r))
            costs.append(jnp.where(ok, cost, jnp.inf))
        costs = lax.optimization_barrier(jnp.stack(costs))  # computed once, see `_step`
        for j in range(size):
            dx = j - r
            cost = costs[j]
            k = (jnp.abs(dy) + abs(dx)) * size**2 + i * size + j
            better = (cost < best.cost) | ((cost == best.cost) & (k < key))
            best = _Best(
                jnp.where(better, dy, best.dy),
                jnp.where(better, dx, best.dx),
                jnp.where(better, cost, best.cost),
            )
            key = jnp.where(better, k, key)
            at_start = (start[0] == dy) & (start[1] == dx)
            start_ssd = jnp.where(at_start, cost, start_ssd)
        return best, key, start_ssd

    init = _Best(jnp.zeros((n,), jnp.int32), jnp.zeros((n,), jnp.int32), jnp.full((n,), jnp.inf))
    init_key = jnp.full((n,), size**3, jnp.int32)
    init_start = jnp.full((n,), jnp.inf, jnp.float32)
    best, _, start_ssd = lax.fori_loop(0, size, body, (init, init_key, init_start))
    return SearchResult(jnp.stack([best.dy, best.dx]), best.cost, start, start_ssd)
