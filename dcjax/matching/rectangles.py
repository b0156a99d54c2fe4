"""Step 5 of DeepCache Section 4: merge matched blocks into larger rectangles.

A host-side helper for users and plots (the transform uses the mask itself,
which is the union of the rectangles). Rows of the mask are cut into maximal
runs of reusable pixels; a run extends the rectangle above it when it spans
exactly the same columns. The rectangles are disjoint, their union is the mask,
and adjacent matched blocks sharing the global motion merge into one.
"""

from __future__ import annotations

import numpy as np

from dcjax.matching.types import Match


def _runs(row: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of True in a 1-D bool array as (start, stop) pairs."""
    padded = np.concatenate([[False], row, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def rectangles(match: Match | np.ndarray) -> list[tuple[int, int, int, int]]:
    """Merged reusable rectangles ``(y, x, h, w)`` of a match, in frame pixels.

    ``cur[y:y+h, x:x+w]`` matches ``prev[y+dy:y+dy+h, x+dx:x+dx+w]`` with
    ``(dy, dx) = match.motion``.

    Args:
        match: a `Match` (its ``mask`` is used) or an (H, W) bool mask.

    Returns:
        Disjoint rectangles, sorted by ``(y, x)``, whose union is the mask.

    Raises:
        ValueError: if the mask is not two-dimensional (one stream at a time).
    """
    mask = np.asarray(match.mask if isinstance(match, Match) else match, bool)
    if mask.ndim != 2:
        raise ValueError(
            f"dcjax: rectangles needs one (H, W) mask, got shape {mask.shape}; "
            "index a batched Match first"
        )
    done: list[tuple[int, int, int, int]] = []
    open_: dict[tuple[int, int], int] = {}  # (x0, x1) -> first row
    for y in range(mask.shape[0] + 1):
        runs = set(_runs(mask[y])) if y < mask.shape[0] else set()
        for run in list(open_):
            if run not in runs:
                y0 = open_.pop(run)
                done.append((y0, run[0], y - y0, run[1] - run[0]))
        for run in runs:
            open_.setdefault(run, y)
    return sorted(done)
