"""DeepMon's histogram matcher (Huynh et al., MobiSys'17, Section 6.3).

The frame is cut into a ``grid`` of ``(gy, gx)`` cells (row ``y`` belongs to cell
row ``y * gy // H``, so cells differ in size by at most one pixel); each cell of
the current frame is compared with the same cell of the previous frame by the
chi-square distance of their colour histograms, and reused when the distance is
below ``distance_threshold``. There is no motion search: the motion is always
``(0, 0)``.

Histograms have ``bins`` equal-width bins per channel over ``[0, peak]`` (peak
255 for integer frames, 1.0 for float frames unless ``data_range`` is given):
integer value ``v`` falls in bin ``floor(v * bins / (peak + 1))``, float value
``v`` in ``min(floor(v * bins / peak), bins - 1)``. Each channel's histogram is
normalised to sum to one, and the distance is the symmetric chi-square averaged
over channels:

    ``d = mean_c 1/2 sum_b (p_cb - q_cb)^2 / (p_cb + q_cb)``  (empty bins add 0),

which lies in ``[0, 1]``. ``block_psnr`` holds each cell's same-position luma
PSNR, for diagnostics.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from dcjax.matching.static import _plane, psnr_from_mse, psnr_peak
from dcjax.matching.types import Match


def _cells(n: int, g: int) -> np.ndarray:
    """Cell index of each of ``n`` rows (or columns) for ``g`` cells."""
    return (np.arange(n) * g // n).astype(np.int32)


def _bin(frame: jax.Array, bins: int, peak: float) -> jax.Array:
    """Bin index of every value, int32, same shape."""
    if jnp.issubdtype(frame.dtype, jnp.integer):
        return (frame.astype(jnp.int32) * bins // int(peak + 1)).clip(0, bins - 1)
    idx = jnp.floor(frame.astype(jnp.float32) * (bins / peak)).astype(jnp.int32)
    return idx.clip(0, bins - 1)


def _histograms(frame, cell_id, ncells, bins, peak):
    """Normalised per-cell, per-channel histograms -> (ncells, C, bins) float32."""
    c = frame.shape[-1]
    ids = (cell_id[:, :, None] * c + jnp.arange(c)) * bins + _bin(frame, bins, peak)
    counts = jnp.bincount(ids.ravel(), length=ncells * c * bins).reshape(ncells, c, bins)
    counts = counts.astype(jnp.float32)
    return counts / counts.sum(-1, keepdims=True)


def _distances(prev, cur, grid, bins, peak) -> tuple[jax.Array, np.ndarray]:
    """Per-cell chi-square distances (gy, gx) and the static (H, W) cell ids."""
    h, w = cur.shape[:2]
    gy, gx = grid
    cell_np = _cells(h, gy)[:, None] * gx + _cells(w, gx)[None, :]
    cell_id = jnp.asarray(cell_np)
    p = _histograms(prev, cell_id, gy * gx, bins, peak)
    q = _histograms(cur, cell_id, gy * gx, bins, peak)
    tot = p + q
    terms = jnp.where(tot > 0, jnp.square(p - q) / jnp.where(tot > 0, tot, 1.0), 0.0)
    return (0.5 * terms.sum(-1)).mean(-1).reshape(gy, gx), cell_np


@functools.partial(jax.jit, static_argnames=("grid", "bins", "distance_threshold", "data_range"))
def _histogram_match(prev, cur, *, grid, bins, distance_threshold, data_range) -> Match:
    h, w = cur.shape[:2]
    gy, gx = grid
    peak = psnr_peak(cur.dtype, data_range)
    dist, cell_np = _distances(prev, cur, grid, bins, peak)
    matched = dist < distance_threshold

    err = jnp.square(_plane(cur, "luma") - _plane(prev, "luma"))[..., 0]
    sse = jnp.bincount(jnp.asarray(cell_np).ravel(), weights=err.ravel(), length=gy * gx)
    npix = np.bincount(cell_np.ravel(), minlength=gy * gx).astype(np.float32)
    psnr = psnr_from_mse(sse / npix, peak).reshape(gy, gx).astype(jnp.float32)

    cy, cx = _cells(h, gy), _cells(w, gx)
    return Match(
        motion=jnp.zeros((2,), jnp.int32),
        mask=matched[cy[:, None], cx[None, :]],
        block_vectors=jnp.zeros((gy, gx, 2), jnp.int32),
        block_psnr=psnr,
        match_ratio=matched.mean(dtype=jnp.float32),
    )


def histogram_distances(prev, cur, *, grid=(8, 8), bins=16, data_range=None) -> jax.Array:
    """Chi-square distance of every cell's histograms -> float32 (gy, gx).

    Args:
        prev: (H, W, C) previous frame.
        cur: (H, W, C) current frame.
        grid: ``(gy, gx)`` cells.
        bins: bins per channel.
        data_range: peak value; default 255 (integer) or 1.0 (float).

    Returns:
        The per-cell distances `histogram_match` thresholds.
    """
    _check(prev, cur, grid, bins)
    peak = psnr_peak(cur.dtype, data_range)
    return _distances_jit(prev, cur, (int(grid[0]), int(grid[1])), int(bins), peak)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _distances_jit(prev, cur, grid, bins, peak):
    return _distances(prev, cur, grid, bins, peak)[0]


def _check(prev, cur, grid, bins) -> None:
    if prev.shape != cur.shape or len(prev.shape) != 3:
        raise ValueError(
            f"dcjax: prev and cur must be (H, W, C) frames of one shape, got "
            f"{prev.shape} and {cur.shape}"
        )
    if len(grid) != 2 or not all(isinstance(g, (int, np.integer)) and g >= 1 for g in grid):
        raise ValueError(f"dcjax: grid must be two positive ints (gy, gx), got {grid!r}")
    if grid[0] > prev.shape[0] or grid[1] > prev.shape[1]:
        raise ValueError(f"dcjax: grid {tuple(grid)} has more cells than the frame {prev.shape}")
    if not isinstance(bins, (int, np.integer)) or bins < 1:
        raise ValueError(f"dcjax: bins must be a positive int, got {bins!r}")


def histogram_match(
    prev: jax.Array,
    cur: jax.Array,
    *,
    grid: tuple[int, int] = (8, 8),
    bins: int = 16,
    distance_threshold: float = 0.005,
    data_range: float | None = None,
) -> Match:
    """DeepMon's matcher: same-position cells whose colour histograms agree.

    Args:
        prev: (H, W, C) previous frame, uint8 or float.
        cur: (H, W, C) current frame, same shape and dtype.
        grid: ``(gy, gx)`` number of cells down and across.
        bins: histogram bins per channel.
        distance_threshold: a cell is reused when its chi-square distance is
            below this.
        data_range: peak value; default 255 (integer) or 1.0 (float).

    Returns:
        A `Match` with motion (0, 0) and one "block" per cell.

    Raises:
        ValueError: for a bad frame, grid or bin count.
    """
    _check(prev, cur, grid, bins)
    return _histogram_match(
        prev,
        cur,
        grid=(int(grid[0]), int(grid[1])),
        bins=int(bins),
        distance_threshold=float(distance_threshold),
        data_range=None if data_range is None else float(data_range),
    )
