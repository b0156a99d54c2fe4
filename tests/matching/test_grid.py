"""The block grid against block-by-block loops."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.matching.grid import admissible_vectors, admits, scatter_grid, searched_blocks


@pytest.mark.parametrize("h, w, bs, k, r", [(20, 30, 10, 1, 7), (23, 17, 8, 2, 3), (9, 9, 4, 3, 5)])
def test_block_geometry_matches_a_loop(h, w, bs, k, r):
    pad = r + 2
    (nby, nbx), (iy, ix), corners, lo, hi = searched_blocks(h, w, bs, k, r, pad)
    all_lo, all_hi = admissible_vectors(h, w, bs)
    assert (nby, nbx) == (-(-h // bs), -(-w // bs))
    assert all_lo.shape == all_hi.shape == (nby, nbx, 2)
    n = 0
    for by in range(nby):
        for bx in range(nbx):
            y0, x0 = by * bs, bx * bs
            y1, x1 = min(y0 + bs, h), min(x0 + bs, w)
            # Every vector that keeps the block inside the frame, and no other.
            assert tuple(all_lo[by, bx]) == (-y0, -x0)
            assert tuple(all_hi[by, bx]) == (h - y1, w - x1)
            if by % k or bx % k:
                continue
            assert (iy[by // k], ix[bx // k]) == (by, bx)
            assert tuple(corners[:, n]) == (y0 + pad, x0 + pad)
            assert tuple(lo[:, n]) == (max(-r, -y0), max(-r, -x0))
            assert tuple(hi[:, n]) == (min(r, h - y1), min(r, w - x1))
            n += 1
    assert corners.shape[1] == n


def test_scatter_grid_writes_every_kth_block():
    full = jnp.full((7, 5, 2), -1, jnp.int32)
    part = jnp.arange(3 * 2 * 2, dtype=jnp.int32).reshape(3, 2, 2)
    got = np.asarray(scatter_grid(full, part, 3))
    want = np.full((7, 5, 2), -1)
    for i in range(3):
        for j in range(2):
            want[3 * i, 3 * j] = part[i, j]
    np.testing.assert_array_equal(got, want)
    # With every block searched the values are the searched ones.
    np.testing.assert_array_equal(scatter_grid(full, part, 1), part)


@pytest.mark.parametrize("vector", [(0, 0), (-3, 2), (5, -7), (-20, 0)])
def test_admits_the_blocks_a_vector_keeps_inside_the_frame(vector):
    h, w, bs = 23, 17, 8
    got = np.asarray(admits(admissible_vectors(h, w, bs), np.array(vector)))
    dy, dx = vector
    for by in range(got.shape[0]):
        for bx in range(got.shape[1]):
            y0, x0 = by * bs, bx * bs
            y1, x1 = min(y0 + bs, h), min(x0 + bs, w)
            inside = 0 <= y0 + dy and y1 + dy <= h and 0 <= x0 + dx and x1 + dx <= w
            assert got[by, bx] == inside
