"""Block matching with a motion search: DeepCache Section 4, Steps 1-4.

Contract (DESIGN.md, "The contract" 1). Given the previous and the current
frame, both (H, W, C):

1. **Grid.** The current frame is cut into ``block_size`` blocks; edge blocks
   are smaller when the size does not divide the frame.
2. **Search.** Every ``k_skip``-th block row and column (``k_skip=1``: all
   blocks) searches the previous frame for its best vector ``(dy, dx)``
   (``cur[y, x] ~ prev[y + dy, x + dx]``), ``|dy|, |dx| <= search_range``, by
   ``"diamond"``, ``"three_step"`` or ``"exhaustive"`` search on the SSD of the
   luma (or RGB) planes, starting from ``init_motion``. With ``k_skip=1``
   and a zero start the diamond search scores the blocks that stay by
   whole-plane passes (`dcjax.matching.steady.steady_diamond_search`); the
   result is the same up to the float rounding of the SSDs.
3. **Global motion.** Among the searched blocks whose best PSNR is larger than
   ``psnr_threshold`` (as in the paper), the most frequent vector is found; the
   vectors within one pixel of it (per axis) are the inliers and the others
   outliers; the global motion is the inliers' mean, rounded. With no such
   block it is ``(0, 0)``.
4. **Re-check.** Every block is compared with the previous frame at the global
   motion; it is matched when its PSNR there is larger than ``psnr_threshold``
   and its shifted block lies inside the previous frame (otherwise its PSNR is
   ``-inf``). With ``reuse_scores`` the SSDs Step 2 already computed at the
   global motion (a searched block whose best or start vector equals it) are
   taken from Step 2; when that covers every block, Step 4 does no pixel work
   (a ``lax.cond``; under ``vmap`` both branches run).
5. **Merge.** The mask is the union of the matched blocks;
   `dcjax.matching.rectangles` gives the paper's merged rectangles.

**Early settling** (``all_vectors=False``, what `dcjax.deepcache` asks for:
its step uses the motion and the mask only). On the steady path, when more
than half of all blocks end their search at the zero vector without moving and
pass the threshold there, zero is the most frequent vector whatever the other
blocks find, and the rounded mean of its inliers is zero too (the other
inliers, within one pixel, are fewer than half of them, so each component of
the mean is under 1/2 in magnitude); Step 4 then reads every block's cost at
zero from the whole-plane passes. So the blocks that moved are not searched
any further: the Match is the same except for their ``block_vectors``, which
are their first step's. On a fixed camera that is most frames, and it skips
the loop over the moving blocks (and, on frames where more blocks move than
the compacted search has slots for, the window search of every block).

**Zero-motion prejudgement** (``prejudge=True``, what `dcjax.deepcache` asks
for by default; `dcjax.matching.prejudge`): from a zero start every block is
first scored at the zero vector and its four one-pixel neighbours; when more
than half of all blocks pass the threshold at zero and cost no more there
than at any neighbour, the global motion is zero, every block's vector is
zero, their PSNRs there are Step 4's, and nothing is searched. Otherwise
Steps 2-4 run as above.

``psnr_threshold=inf`` matches nothing. Blocks that were not searched
(``k_skip > 1``) report the global motion as their vector.

Everything is vectorised over blocks, has static shapes and compiles once per
frame shape and option set; ``init_motion`` is a traced int32 ``(2,)`` array,
so the caller can feed the previous frame's motion without recompiling.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dcjax._loops import run_if, skipping_pays
from dcjax.matching import prejudge as _prejudge
from dcjax.matching import search as _search
from dcjax.matching import steady as _steady
from dcjax.matching.grid import admissible_vectors, admits, scatter_grid, searched_blocks
from dcjax.matching.static import (
    block_counts_np,
    block_sums_unrolled,
    expand_flags,
    planes,
    psnr_from_mse,
    psnr_peak,
)
from dcjax.matching.types import Match

SEARCHES = ("diamond", "three_step", "exhaustive")
DEFAULT_SEARCH_RANGE = 7
DEFAULT_MAX_STEPS = 8
# Step 3: vectors farther than this (per axis) from the most frequent one are outliers.
INLIER_RADIUS = 1


def _global_motion(vectors: jax.Array, ok: jax.Array, r: int) -> jax.Array:
    """Step 3: rounded mean of the inlier vectors around the mode -> int32 (2,)."""
    size = 2 * r + 1
    idx = (vectors[:, 0] + r) * size + (vectors[:, 1] + r)
    mode_idx = jnp.argmax(jnp.bincount(idx, weights=ok.astype(jnp.int32), length=size * size))
    mode = jnp.stack([mode_idx // size - r, mode_idx % size - r]).astype(jnp.int32)
    inlier = ok & (jnp.abs(vectors - mode).max(-1) <= INLIER_RADIUS)
    n = inlier.sum()
    mean = (vectors * inlier[:, None]).sum(0) / jnp.maximum(n, 1)
    return jnp.where(n > 0, jnp.round(mean), 0).astype(jnp.int32)


def _shift_ssd(
    cur_p: jax.Array, inside: np.ndarray | None, prev_p: jax.Array, motion: jax.Array, pad: int
) -> jax.Array:
    """SSD of every block against ``prev`` shifted by ``motion`` -> (nby, nbx).

    ``cur_p`` is the (C, nby * bs, nbx * bs) zero-padded current plane and
    ``inside`` the 0/1 mask of its frame pixels (``None`` if all are).
    """
    c, hp, wp = cur_p.shape
    shifted = lax.dynamic_slice(prev_p, (0, pad + motion[0], pad + motion[1]), (c, hp, wp))
    # A plain copy, rather than dynamic indexing inside the fused arithmetic.
    shifted = lax.optimization_barrier(shifted)
    err = jnp.square(cur_p - shifted)
    total = err[0]
    for i in range(1, c):
        total = total + err[i]
    if inside is not None:
        total = total * inside
    return total


@functools.partial(
    jax.jit,
    static_argnames=(
        "block_size",
        "search",
        "max_steps",
        "k_skip",
        "reuse_scores",
        "color",
        "search_range",
        "all_vectors",
        "given_planes",
        "prejudge",
        "skipping",
    ),
)
def _block_match(
    prev: jax.Array,
    cur: jax.Array,
    init_motion: jax.Array,
    psnr_threshold: jax.Array,
    peak: jax.Array,
    *,
    block_size: int,
    search: str,
    max_steps: int,
    k_skip: int,
    reuse_scores: bool,
    color: str,
    search_range: int,
    all_vectors: bool = True,
    given_planes: bool = False,
    prejudge: bool = False,
    skipping: bool = True,
) -> Match:
    # ``skipping``: `skipping_pays()` where the match is traced, a static argument so
    # that the jitted function's cache tells the programs apart (`dcjax._loops.skipping`)
    h, w = cur.shape[1:] if given_planes else cur.shape[:2]
    bs, k, r = block_size, k_skip, search_range
    if search == "three_step":
        margin = _search.three_step_steps(r)[0]
    elif search == "diamond":
        margin = 2
    else:
        margin = 0
    pad = r + margin
    (nby, nbx), (iy, ix), corners, lo, hi = searched_blocks(h, w, bs, k, r, pad)

    # Materialise the planes and the padded previous plane once, so that XLA
    # does not recompute the colour conversion inside every gather.
    if given_planes:
        cur_pl, prev_pl = cur, prev
    else:
        cur_pl, prev_pl = lax.optimization_barrier((planes(cur, color), planes(prev, color)))
    ch = cur_pl.shape[0]
    eh, ew = nby * bs - h, nbx * bs - w
    inside = np.zeros((nby * bs, nbx * bs), np.float32)
    inside[:h, :w] = 1.0

    # Step 1: the searched blocks, blocks last: (C, bs, bs, n).
    weights = None
    if eh or ew:
        wgrid = inside.reshape(nby, bs, nbx, bs)[::k, :, ::k].transpose(1, 3, 0, 2)
        weights = jnp.asarray(wgrid.reshape(1, bs, bs, -1))

    geometry = _search.Blocks(None, weights, *map(jnp.asarray, (corners, lo, hi)))
    counts = block_counts_np((h, w), bs)
    counts_s = counts[::k, ::k].reshape(-1)

    def voting(ssd):
        """Searched blocks whose vector counts in Step 3: finite SSD, PSNR past the threshold."""
        return (psnr_from_mse(ssd / (counts_s * ch), peak) > psnr_threshold) & jnp.isfinite(ssd)

    def cut(cur_p):
        grid = cur_p.reshape(ch, nby, bs, nbx, bs)[:, ::k, :, ::k]
        cur_b = lax.optimization_barrier(grid.transpose(0, 2, 4, 1, 3).reshape(ch, bs, bs, -1))
        return geometry._replace(cur=cur_b)

    bounds = admissible_vectors(h, w, bs)

    def passing(ssd, motion):
        """Block PSNRs at ``motion`` from their SSDs, and which pass the threshold."""
        psnr = psnr_from_mse(ssd / (counts * ch), peak)
        psnr = jnp.where(admits(bounds, motion), psnr, -jnp.inf).astype(jnp.float32)
        return psnr, psnr > psnr_threshold  # never with an infinite threshold

    def steps(prev_pl, cur_pl):
        """Steps 2-4: the global motion, every block's SSD there and the block vectors."""
        # Zero padding: only inadmissible candidates ever read it.
        pads = ((0, 0), (pad, pad + eh), (pad, pad + ew))
        prev_p = lax.optimization_barrier(jnp.pad(prev_pl, pads))
        cur_p = lax.optimization_barrier(jnp.pad(cur_pl, ((0, 0), (0, eh), (0, ew))))
        # Step 2: per-block search from the (clipped) initial motion.
        start = jnp.clip(jnp.asarray(init_motion, jnp.int32)[:, None], geometry.lo, geometry.hi)
        if search == "diamond" and k == 1 and skipping:
            # From a zero start (a steady camera) most blocks never move: their
            # costs come from whole-plane passes and only the blocks that move
            # gather windows (`steady_diamond_search`). Any other start, or more
            # moving blocks than it has slots for, searches every block by windows.
            def steady(prev_p, cur_p):
                costs = _steady.plane_ssd(cur_p, prev_p, pad, bs, inside if (eh or ew) else None)
                decided = None
                if not all_vectors:
                    # Blocks that end at zero and pass there: more than half of all
                    # blocks make zero the most frequent vector and the rounded
                    # mean of its inliers (Step 3), and Step 4 then reads every
                    # block's cost at zero from `costs`, whatever the others find.
                    def decided(at_zero):
                        return 2 * jnp.sum(at_zero & voting(costs[0])) > at_zero.shape[0]

                return _steady.steady_diamond_search(
                    prev_p, cur_p, geometry, costs,
                    pad=pad, block_size=bs, max_steps=max_steps, decided=decided,
                )  # fmt: skip

            def by_windows(prev_p, cur_p, start):
                return _search.diamond_search(prev_p, cut(cur_p), start, max_steps=max_steps)

            n = start.shape[1]
            none = _search.SearchResult(start, jnp.zeros((n,)), start, jnp.zeros((n,)))
            res, overflow = run_if(
                jnp.all(start == 0), steady, (prev_p, cur_p), (none, jnp.bool_(True))
            )
            res = run_if(overflow, by_windows, (prev_p, cur_p, start), res)
        elif search == "diamond":
            res = _search.diamond_search(prev_p, cut(cur_p), start, max_steps=max_steps)
        elif search == "three_step":
            res = _search.three_step_search(prev_p, cut(cur_p), start, search_range=r)
        else:
            res = _search.exhaustive_search(prev_p, cut(cur_p), start, search_range=r)

        # Step 3: global motion.
        motion = _global_motion(res.vectors.T, voting(res.ssd), r)

        # Step 4: every block at the global motion.
        inside_prev = admits(bounds, motion)

        def recompute():
            err = _shift_ssd(cur_p, inside if (eh or ew) else None, prev_p, motion, pad)
            return block_sums_unrolled(err, bs)

        if reuse_scores:
            at_best = (res.vectors == motion[:, None]).all(0)
            at_start = (res.start == motion[:, None]).all(0)
            known_s = (at_best | at_start).reshape(len(iy), len(ix))
            stored_s = jnp.where(at_best, res.ssd, res.start_ssd).reshape(len(iy), len(ix))
            # Blocks whose shifted block leaves the frame need no score either.
            known = scatter_grid(jnp.zeros((nby, nbx), bool), known_s, k) | ~inside_prev
            stored = scatter_grid(jnp.zeros((nby, nbx), jnp.float32), stored_s, k)
            # Skipped when Step 2 covered every block (only possible with k_skip=1).
            # The conditional also keeps XLA from recomputing the global motion
            # inside the per-pixel loop of the recomputation.
            if skipping:
                ssd = lax.cond(
                    known.all(), lambda: stored, lambda: jnp.where(known, stored, recompute())
                )
            else:  # no predicate read on the host
                ssd = jnp.where(known, stored, recompute())
        else:
            ssd = recompute()
        vectors = jnp.broadcast_to(motion, (nby, nbx, 2))
        vectors = scatter_grid(vectors, res.vectors.T.reshape(len(iy), len(ix), 2), k)
        return motion, ssd, vectors

    zero = jnp.zeros((2,), jnp.int32)
    if prejudge:
        # Zero-motion prejudgement (`dcjax.matching.prejudge`): five passes, at the
        # zero vector and its four neighbours, and the search only where at
        # most half of the blocks pass at zero and cost least there.
        def judge(prev_pl, cur_pl):
            """(settled, every block's SSD at zero)."""
            at_zero, lowest = _prejudge.small_diamond_ssds(
                prev_pl, cur_pl, block_size=bs, bounds=bounds
            )
            stays = passing(at_zero, zero)[1] & (at_zero <= lowest)
            return 2 * jnp.sum(stays) > nby * nbx, at_zero

        start_zero = jnp.all(jnp.asarray(init_motion) == 0)
        no_search = jnp.zeros((nby, nbx, 2), jnp.int32)
        if skipping:
            # From a zero start only. The loop also materialises the planes,
            # which a caller may compute in its program (the frame's luma from
            # interleaved colours): otherwise XLA fuses their computation
            # into each of the five passes.
            none = (jnp.bool_(False), jnp.zeros((nby, nbx), jnp.float32))
            settled, at_zero = run_if(start_zero, judge, (prev_pl, cur_pl), none)
            judged = (zero, at_zero, no_search)
            motion, ssd, vectors = run_if(~settled, steps, (prev_pl, cur_pl), judged)
        else:  # no data-dependent skipping: judge and search, then select
            settled, at_zero = judge(prev_pl, cur_pl)
            found = steps(prev_pl, cur_pl)
            motion, ssd, vectors = (
                jnp.where(settled & start_zero, a, b)
                for a, b in zip((zero, at_zero, no_search), found, strict=True)
            )
    else:
        motion, ssd, vectors = steps(prev_pl, cur_pl)
    psnr, matched = passing(ssd, motion)
    return Match(
        motion=motion,
        mask=expand_flags(matched, (h, w), bs),
        block_vectors=vectors.astype(jnp.int32),
        block_psnr=psnr,
        match_ratio=matched.mean(dtype=jnp.float32),
    )


def block_match(
    prev: jax.Array,
    cur: jax.Array,
    *,
    block_size: int = 10,
    psnr_threshold: float = 20.0,
    search: str = "diamond",
    max_steps: int = DEFAULT_MAX_STEPS,
    k_skip: int = 1,
    reuse_scores: bool = True,
    init_motion=(0, 0),
    color: str = "luma",
    data_range: float | None = None,
    search_range: int = DEFAULT_SEARCH_RANGE,
    all_vectors: bool = True,
    prejudge: bool = False,
) -> Match:
    """Match ``cur`` against ``prev`` with a motion search (DeepCache Section 4).

    Args:
        prev: (H, W, C) previous frame, uint8 or float.
        cur: (H, W, C) current frame, same shape and dtype.
        block_size: side of the square blocks in pixels.
        psnr_threshold: a block is matched when its PSNR (dB) is larger than
            this; ``inf`` matches nothing.
        search: ``"diamond"``, ``"three_step"`` or ``"exhaustive"``.
        max_steps: most large-diamond moves of the diamond search.
        k_skip: search only every ``k_skip``-th block row and column (Step 2).
        reuse_scores: reuse Step 2's SSDs at the global motion in Step 4.
        init_motion: ``(dy, dx)`` the searches start from, e.g. the previous
            frame's motion; may be a traced int32 (2,) array. Clipped into the
            search range.
        color: ``"luma"`` (BT.601) or ``"rgb"``: the planes compared.
        data_range: peak value for PSNR; default 255 (integer) or 1.0 (float).
        search_range: largest ``|dy|`` and ``|dx|`` searched.
        all_vectors: search every block to the end. ``False`` lets the
            diamond search from a zero start stop where its outcome is settled
            (the module docstring, "Early settling"): ``motion``, ``mask``,
            ``block_psnr`` and ``match_ratio`` are unchanged, only the
            ``block_vectors`` of blocks that moved may be their first step's.
        prejudge: from a zero start, score every block at the zero vector
            and its four neighbours first, and search only when at most half
            of the blocks pass the threshold at zero and cost least there
            (`dcjax.matching.prejudge`); otherwise zero
            is the global motion and every block's vector.

    Returns:
        The `Match`.

    Raises:
        ValueError: for a bad frame or option, naming it.
    """
    _check_frames(prev, cur)
    return _block_match(
        prev, cur, *_dynamic(init_motion, psnr_threshold),
        jnp.asarray(psnr_peak(cur.dtype, data_range), jnp.float32),
        **_static(block_size, search, max_steps, k_skip, reuse_scores, color, search_range),
        all_vectors=bool(all_vectors), prejudge=_flag("prejudge", prejudge),
    )  # fmt: skip


def block_match_planes(
    prev: jax.Array,
    cur: jax.Array,
    *,
    peak: float | jax.Array,
    block_size: int = 10,
    psnr_threshold: float = 20.0,
    search: str = "diamond",
    max_steps: int = DEFAULT_MAX_STEPS,
    k_skip: int = 1,
    reuse_scores: bool = True,
    init_motion=(0, 0),
    color: str = "luma",
    search_range: int = DEFAULT_SEARCH_RANGE,
    all_vectors: bool = True,
    prejudge: bool = False,
) -> Match:
    """`block_match` of frames given as their `planes` (C', H, W).

    The same Match as ``block_match(prev_frame, cur_frame, ...)`` for
    ``prev = planes(prev_frame, color)`` and ``cur = planes(cur_frame,
    color)``, with ``peak`` the PSNR peak `block_match` derives from the
    frames' dtype and ``data_range`` (255 for integer frames, 1.0 for float);
    ``color`` says what the planes are (one luma plane, or the channels).
    """
    static = _static(block_size, search, max_steps, k_skip, reuse_scores, color, search_range)
    if prev.shape != cur.shape or prev.ndim != 3 or (color == "luma" and cur.shape[0] != 1):
        raise ValueError(
            f"dcjax: prev and cur must be (C', H, W) planes of one shape (one plane "
            f"for color='luma'), got {prev.shape} and {cur.shape}"
        )
    return _block_match(
        prev.astype(jnp.float32), cur.astype(jnp.float32),
        *_dynamic(init_motion, psnr_threshold), jnp.asarray(peak, jnp.float32), **static,
        all_vectors=bool(all_vectors), given_planes=True,
        prejudge=_flag("prejudge", prejudge),
    )  # fmt: skip


def _static(block_size, search, max_steps, k_skip, reuse_scores, color, search_range) -> dict:
    """The validated static options of `_block_match`."""
    if search not in SEARCHES:
        raise ValueError(f"dcjax: search must be one of {SEARCHES}, got {search!r}")
    for name, value, least in (
        ("block_size", block_size, 1),
        ("k_skip", k_skip, 1),
        ("max_steps", max_steps, 0),
        ("search_range", search_range, 0),
    ):
        if not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError(f"dcjax: {name} must be an int >= {least}, got {value!r}")
    if color not in ("luma", "rgb"):
        raise ValueError(f"dcjax: color must be 'luma' or 'rgb', got {color!r}")
    return dict(
        block_size=int(block_size),
        search=search,
        max_steps=int(max_steps),
        k_skip=int(k_skip),
        reuse_scores=bool(reuse_scores),
        color=color,
        search_range=int(search_range),
        skipping=skipping_pays(),
    )


def _flag(name: str, value) -> bool:
    """A validated bool option."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"dcjax: {name} must be a bool, got {value!r}")
    return bool(value)


def _dynamic(init_motion, psnr_threshold) -> tuple[jax.Array, jax.Array]:
    """The validated traced arguments of `_block_match`: start motion, threshold."""
    if isinstance(psnr_threshold, (int, float)) and math.isnan(psnr_threshold):
        raise ValueError("dcjax: psnr_threshold must be a number (dB), got nan")
    init = jnp.asarray(init_motion)
    if init.shape != (2,):
        raise ValueError(f"dcjax: init_motion must be (dy, dx), got shape {init.shape}")
    return init.astype(jnp.int32), jnp.asarray(psnr_threshold, jnp.float32)


def _check_frames(prev, cur) -> None:
    if prev.shape != cur.shape or len(prev.shape) != 3:
        raise ValueError(
            f"dcjax: prev and cur must be (H, W, C) frames of one shape, got "
            f"{prev.shape} and {cur.shape}"
        )
