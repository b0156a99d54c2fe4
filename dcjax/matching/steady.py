"""The diamond search from a zero start, for a steady camera (DeepCache Section 4, Step 2).

A steady camera starts every block at the zero vector, and most blocks never
leave it. `plane_ssd` scores every block at the 13 vectors the diamond search
can score around a block that stays (the centre and both diamonds,
`PLANE_OFFSETS`) by 13 passes over the whole plane, and
`steady_diamond_search` compacts only the blocks that move into a static number
of slots and searches them by gathered windows (`dcjax.matching.search`). The
result is `dcjax.matching.search.diamond_search`'s from a zero start, up to
float rounding of the SSDs.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dcjax._loops import run_if
from dcjax.matching.search import (
    LARGE_DIAMOND,
    SMALL_DIAMOND,
    Best,
    Blocks,
    SearchResult,
    admissible,
    choose,
    put_best,
    search_step,
    slots,
    stragglers,
    take_blocks,
)

__all__ = ["PLANE_OFFSETS", "plane_ssd", "steady_capacity", "steady_diamond_search"]


# Every offset the diamond search scores around a block that does not move:
# the centre, the large diamond and the small diamond (the L1 ball of radius 2).
PLANE_OFFSETS = ((0, 0), *LARGE_DIAMOND, *SMALL_DIAMOND)


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
        ok = admissible(blocks, start[0] + oy, start[1] + ox)
        rows.append(jnp.where(ok, start_costs[PLANE_OFFSETS.index((oy, ox))], jnp.inf))
    return jnp.stack(rows)


def _first_known(
    blocks: Blocks,
    start: jax.Array,
    start_costs: jax.Array,
    offsets: tuple[tuple[int, int], ...],
) -> tuple[jax.Array, Best, jax.Array]:
    """`first_step` from precomputed costs at ``start + PLANE_OFFSETS``."""
    n = start.shape[1]
    incumbent = Best(start[0], start[1], jnp.full((n,), jnp.inf, jnp.float32))
    costs = _known_costs(blocks, start, start_costs, ((0, 0), *offsets))
    moved, best = choose(incumbent, ((0, 0), *offsets), costs)
    return moved, best, costs[0]


def steady_capacity(n: int) -> int:
    """Slots for the blocks that move in `steady_diamond_search`: an eighth of them,
    a multiple of 8, at least 16, at most ``n``.

    More moving blocks than slots overflow to the window search of every block,
    which costs several times the plane path, so the slots must cover what real
    frames give (docs/performance-notes.md, "Slots for moving blocks").
    """
    return min(n, max(16, -(-n // 8 // 8) * 8))


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
    _, stay = choose(best, SMALL_DIAMOND, _known_costs(blocks, start, start_costs, SMALL_DIAMOND))
    cap = steady_capacity(n)
    overflow = moved.sum() > cap

    def search_moving(prev_p, cur_p, best, stay, moved):
        idx, valid = slots(moved, cap)
        sub = take_blocks(blocks, idx, (cur_p, pad, block_size))
        active = moved[idx] & valid
        sub_best = stragglers(prev_p, sub, best, idx, active, jnp.int32(1), max_steps, chain=True)
        _, sub_best, _ = search_step(prev_p, sub, sub_best, SMALL_DIAMOND, 1, chain=True)
        return put_best(stay, sub_best, jnp.where(valid, idx, n))

    if decided is None:
        best = search_moving(prev_p, cur_p, best, stay, moved)
    else:
        skip = decided(~moved & (stay.dy == 0) & (stay.dx == 0))
        first = Best(*(jnp.where(moved, b, s) for b, s in zip(best, stay, strict=True)))
        best = run_if(~skip, search_moving, (prev_p, cur_p, best, stay, moved), first)
        overflow = overflow & ~skip
    return SearchResult(jnp.stack([best.dy, best.dx]), best.cost, start, start_ssd), overflow
