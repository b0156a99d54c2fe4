"""Block matchers on frames: what of the previous frame the current one can reuse.

Every matcher returns a `Match` (DESIGN.md, "The contract" 1): the global motion
``(dy, dx)`` with ``cur[y, x] ~ prev[y + dy, x + dx]``, a boolean (H, W) reuse
mask that is true only where that holds and ``(y + dy, x + dx)`` lies inside the
frame, and per-block diagnostics. All matchers are jittable with static shapes,
vectorised over blocks and vmappable over streams.

- `match`: DeepCache Section 4 with ``search`` in ``"none"`` (same-position
  blocks, `static_match`), ``"diamond"``, ``"three_step"`` or ``"exhaustive"``.
- `block_match_planes` and `static_match_planes`: the motion searches and the
  same-position matcher on frames given as their `planes` (luma or colour
  planes), for a caller that keeps its key frame as planes.
- `histogram_match`: DeepMon Section 6.3 (same-position colour histograms).
- `rectangles`: the merged rectangles of Step 5, on the host.
- `MATCHERS`, `matcher_options`, `StreamMatcher`: the matchers a stream can
  use by name, with typed options (`SearchOptions`, `HistogramOptions`), and
  the per-frame matching of a stream against its key (`dcjax.matching.matcher`).
"""

from __future__ import annotations

import jax

from dcjax.matching.block import (
    DEFAULT_MAX_STEPS,
    DEFAULT_SEARCH_RANGE,
    SEARCHES,
    block_match,
    block_match_planes,
)
from dcjax.matching.histogram import histogram_distances, histogram_match
from dcjax.matching.matcher import (
    COLORS,
    KEYS,
    MATCHERS,
    HistogramOptions,
    NoOptions,
    SearchOptions,
    StreamMatcher,
    matcher_options,
)
from dcjax.matching.rectangles import rectangles
from dcjax.matching.static import planes, psnr_peak, static_match, static_match_planes
from dcjax.matching.types import Match

__all__ = [
    "COLORS",
    "DEFAULT_MAX_STEPS",
    "DEFAULT_SEARCH_RANGE",
    "KEYS",
    "MATCHERS",
    "MATCH_SEARCHES",
    "SEARCHES",
    "HistogramOptions",
    "Match",
    "NoOptions",
    "SearchOptions",
    "StreamMatcher",
    "block_match",
    "block_match_planes",
    "histogram_distances",
    "histogram_match",
    "match",
    "matcher_options",
    "planes",
    "psnr_peak",
    "rectangles",
    "static_match",
    "static_match_planes",
]

MATCH_SEARCHES = ("none", *SEARCHES)


def match(
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
    """Match ``cur`` against ``prev`` (DeepCache Section 4).

    Args:
        prev: (H, W, C) previous frame, uint8 or float.
        cur: (H, W, C) current frame, same shape and dtype.
        block_size: side of the square blocks in pixels.
        psnr_threshold: a block is reusable when its PSNR (dB) at the global
            motion is larger than this; ``inf`` reuses nothing.
        search: ``"none"`` (same-position blocks, motion (0, 0)),
            ``"diamond"``, ``"three_step"`` or ``"exhaustive"``.
        max_steps: most large-diamond moves of the diamond search.
        k_skip: Step 2 searches only every ``k_skip``-th block row and column.
        reuse_scores: Step 4 reuses the SSDs Step 2 computed at the global
            motion.
        init_motion: ``(dy, dx)`` the searches start from (the previous
            frame's motion); a tuple or a traced int32 (2,) array.
        color: ``"luma"`` or ``"rgb"``: the planes PSNR is computed on.
        data_range: peak value for PSNR; default 255 (integer) or 1.0 (float).
        search_range: largest ``|dy|`` and ``|dx|`` searched.
        all_vectors: ``False`` lets a steady diamond search stop once the
            motion and the mask are settled (`block_match`); only the
            ``block_vectors`` of blocks that moved may then differ.
        prejudge: from a zero start, take the zero vector without searching
            when more than half of the blocks pass the threshold there
            (`dcjax.matching.prejudge`).

    Returns:
        The `Match`.

    Raises:
        ValueError: for an unknown ``search`` or a bad argument, naming it.
    """
    if search not in MATCH_SEARCHES:
        raise ValueError(f"dcjax: unknown search {search!r}; expected one of {MATCH_SEARCHES}")
    if search == "none":
        name, options = "static", NoOptions()
    else:
        name = search
        options = SearchOptions(
            max_steps=max_steps, k_skip=k_skip, reuse_scores=reuse_scores,
            search_range=search_range, all_vectors=all_vectors, prejudge=prejudge,
        )  # fmt: skip
    matcher = StreamMatcher(
        name=name, options=options, block_size=block_size, psnr_threshold=psnr_threshold,
        color=color, data_range=data_range,
    )  # fmt: skip
    return matcher.match_frames(prev, cur, init_motion)
