"""The prejudgement's passes against a per-block NumPy loop."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.matching.grid import admissible_vectors
from dcjax.matching.prejudge import shifted_ssds, small_diamond_ssds


def _naive(prev, cur, dy, dx, bs):
    c, h, w = cur.shape
    nby, nbx = -(-h // bs), -(-w // bs)
    out = np.full((nby, nbx), np.inf)
    for by in range(nby):
        for bx in range(nbx):
            y0, x0 = by * bs, bx * bs
            y1, x1 = min(y0 + bs, h), min(x0 + bs, w)
            if y0 + dy < 0 or x0 + dx < 0 or y1 + dy > h or x1 + dx > w:
                continue
            d = cur[:, y0:y1, x0:x1] - prev[:, y0 + dy : y1 + dy, x0 + dx : x1 + dx]
            out[by, bx] = np.square(d.astype(np.float64)).sum()
    return out


@pytest.mark.parametrize("channels, h, w, bs", [(1, 20, 30, 10), (3, 23, 17, 8)])
def test_shifted_and_small_diamond_ssds_match_a_block_loop(channels, h, w, bs):
    rng = np.random.default_rng(h * w)
    prev = rng.uniform(0, 255, (channels, h, w)).astype(np.float32)
    # The current frame: prev moved one pixel down, plus noise.
    cur = np.roll(prev, 1, axis=1) + rng.normal(0, 2, prev.shape).astype(np.float32)
    bounds = admissible_vectors(h, w, bs)  # checked against a loop in test_grid
    args = (jnp.asarray(prev), jnp.asarray(cur))
    for dy, dx in [(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1), (2, -1)]:
        got = np.asarray(shifted_ssds(*args, dy, dx, block_size=bs, bounds=bounds))
        want = _naive(prev, cur, dy, dx, bs)
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-5)
    at_zero, lowest = small_diamond_ssds(*args, block_size=bs, bounds=bounds)
    neighbours = np.min([_naive(prev, cur, dy, dx, bs) for dy, dx in
                         [(-1, 0), (1, 0), (0, -1), (0, 1)]], axis=0)  # fmt: skip
    np.testing.assert_allclose(np.asarray(at_zero), _naive(prev, cur, 0, 0, bs), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(lowest), neighbours, rtol=1e-5)
    # The content moved down by one: inside the frame, the block is cheaper one pixel up.
    assert (np.asarray(lowest)[1:] < np.asarray(at_zero)[1:]).all()
