"""The block grid (Step 1 of `dcjax.matching.block`): where the blocks are.

Contract. A frame of H x W pixels is cut into ``bs x bs`` blocks, ``nby =
ceil(H / bs)`` rows and ``nbx = ceil(W / bs)`` columns; edge blocks are
smaller when ``bs`` does not divide the frame. A vector ``(dy, dx)`` is
admissible for a block when the block shifted by it lies inside the frame.

- `searched_blocks`: the static geometry of the blocks a search visits
  (every ``k``-th row and column) within a search range.
- `admissible_vectors`: every block's admissible vectors without a range;
  `admits`, which blocks admit a given vector.
- `scatter_grid`: the searched blocks' values written back into the full grid.

All geometry is NumPy, computed once when the matcher is traced.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["admissible_vectors", "admits", "scatter_grid", "searched_blocks"]


def searched_blocks(h: int, w: int, bs: int, k: int, r: int, pad: int):
    """The searched blocks of an ``h x w`` frame, blocks of ``bs``, every
    ``k``-th row and column, vectors within ``r``, planes padded by ``pad``.

    Returns ``((nby, nbx), (iy, ix), corners, lo, hi)``: the full grid's
    size; the searched block rows and columns; each searched block's top-left
    corner in the padded planes, (2, n); and its admissible vectors within the
    range, lo and hi, each (2, n), blocks in row-major order."""
    nby, nbx = math.ceil(h / bs), math.ceil(w / bs)
    iy = np.arange(0, nby, k)
    ix = np.arange(0, nbx, k)
    gy, gx = np.meshgrid(iy, ix, indexing="ij")
    y0, x0 = (gy * bs).ravel(), (gx * bs).ravel()
    hb = np.minimum(bs, h - y0)
    wb = np.minimum(bs, w - x0)
    lo = np.stack([np.maximum(-r, -y0), np.maximum(-r, -x0)])
    hi = np.stack([np.minimum(r, h - y0 - hb), np.minimum(r, w - x0 - wb)])
    corners = np.stack([y0 + pad, x0 + pad])
    return (nby, nbx), (iy, ix), corners.astype(np.int32), lo.astype(np.int32), hi.astype(np.int32)


def admissible_vectors(h: int, w: int, bs: int) -> tuple[np.ndarray, np.ndarray]:
    """Admissible vectors of every block without a range limit: (lo, hi), (nby, nbx, 2)."""
    nby, nbx = math.ceil(h / bs), math.ceil(w / bs)
    y0 = np.arange(nby) * bs
    x0 = np.arange(nbx) * bs
    hb = np.minimum(bs, h - y0)
    wb = np.minimum(bs, w - x0)
    lo = np.stack(np.broadcast_arrays(-y0[:, None], -x0[None, :]), -1)
    hi = np.stack(np.broadcast_arrays((h - y0 - hb)[:, None], (w - x0 - wb)[None, :]), -1)
    return lo.astype(np.int32), hi.astype(np.int32)


def admits(bounds: tuple[np.ndarray, np.ndarray], vector) -> jax.Array:
    """(nby, nbx) bool: the blocks whose block shifted by ``vector`` (dy, dx)
    lies inside the frame, for ``bounds`` = `admissible_vectors`."""
    lo, hi = bounds
    return ((vector >= lo) & (vector <= hi)).all(-1)


def scatter_grid(full: jax.Array, part: jax.Array, k: int) -> jax.Array:
    """Write the searched blocks' values ``part`` into every ``k``-th row and column.

    A select against the upsampled values rather than a scatter: XLA:CPU runs
    it as one fused loop.
    """
    if k == 1:
        return part.astype(full.dtype)
    nby, nbx = full.shape[:2]
    up = jnp.repeat(jnp.repeat(part, k, 0), k, 1)[:nby, :nbx]
    searched = np.zeros((nby, nbx), bool)
    searched[::k, ::k] = True
    searched = searched.reshape(nby, nbx, *([1] * (full.ndim - 2)))
    return jnp.where(searched, up.astype(full.dtype), full)
