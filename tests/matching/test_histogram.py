"""DeepMon's histogram matcher against a NumPy chi-square reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcjax.matching import histogram_distances, histogram_match
from tests.matching.frames import degrade, photo


def _reference(prev, cur, grid, bins, peak=255.0):
    """Chi-square distances per cell with np.histogram, float64."""
    h, w = prev.shape[:2]
    gy, gx = grid
    ybounds = [int(np.ceil(i * h / gy)) for i in range(gy + 1)]
    xbounds = [int(np.ceil(j * w / gx)) for j in range(gx + 1)]
    integer = np.issubdtype(prev.dtype, np.integer)
    top = peak + 1 if integer else peak
    out = np.zeros((gy, gx))
    for i in range(gy):
        for j in range(gx):
            d = []
            for c in range(prev.shape[2]):
                a = prev[ybounds[i] : ybounds[i + 1], xbounds[j] : xbounds[j + 1], c].ravel()
                b = cur[ybounds[i] : ybounds[i + 1], xbounds[j] : xbounds[j + 1], c].ravel()
                if not integer:  # the top value falls in the last bin
                    a, b = np.minimum(a, np.nextafter(top, 0)), np.minimum(b, np.nextafter(top, 0))
                p = np.histogram(a, bins=bins, range=(0, top))[0] / a.size
                q = np.histogram(b, bins=bins, range=(0, top))[0] / b.size
                s = p + q
                d.append(0.5 * np.sum(np.where(s > 0, (p - q) ** 2 / np.where(s > 0, s, 1), 0)))
            out[i, j] = np.mean(d)
    return out


@pytest.mark.parametrize("name", ["astronaut", "coffee"])
def test_distances_equal_numpy_chi_square(name):
    prev = photo(name)[100:227, 50:277]
    cur = degrade(photo(name)[103:230, 48:275], noise=3.0, brightness=5.0)
    got = np.asarray(histogram_distances(prev, cur))
    np.testing.assert_allclose(got, _reference(prev, cur, (8, 8), 16), atol=1e-6)
    threshold = float(np.median(got))
    m = histogram_match(prev, cur, distance_threshold=threshold)
    cells = got < threshold
    assert 0 < cells.sum() < cells.size  # the threshold splits the cells
    assert float(m.match_ratio) == pytest.approx(cells.mean())
    # Cell (i, j) covers rows ceil(i H / 8) .. ceil((i + 1) H / 8).
    mask = np.asarray(m.mask)
    h, w = mask.shape
    for i in range(8):
        for j in range(8):
            y0, y1 = int(np.ceil(i * h / 8)), int(np.ceil((i + 1) * h / 8))
            x0, x1 = int(np.ceil(j * w / 8)), int(np.ceil((j + 1) * w / 8))
            assert (mask[y0:y1, x0:x1] == cells[i, j]).all()
    assert tuple(np.asarray(m.motion)) == (0, 0)
    assert m.block_vectors.shape == (8, 8, 2) and not np.asarray(m.block_vectors).any()


@settings(max_examples=6, deadline=None)
@given(
    gy=st.integers(1, 6),
    gx=st.integers(1, 6),
    bins=st.sampled_from([4, 16, 32]),
    floating=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_distances_on_random_frames(gy, gx, bins, floating, seed):
    rng = np.random.default_rng(seed)
    prev = rng.integers(0, 256, (30, 37, 3), dtype=np.uint8)
    cur = prev.copy()
    cur[rng.random(cur.shape) < 0.2] = rng.integers(0, 256, dtype=np.uint8)
    if floating:
        prev, cur = prev / 255.0, cur / 255.0
        got = histogram_distances(prev, cur, grid=(gy, gx), bins=bins)
        ref = _reference(prev, cur, (gy, gx), bins, peak=1.0)
    else:
        got = histogram_distances(prev, cur, grid=(gy, gx), bins=bins)
        ref = _reference(prev, cur, (gy, gx), bins)
    np.testing.assert_allclose(np.asarray(got), ref, atol=1e-6)


def test_identical_frames_match_and_a_cut_does_not():
    a = photo("chelsea")[:120, :160]
    same = histogram_match(a, a)
    assert np.asarray(same.mask).all() and float(same.match_ratio) == 1.0
    cut = histogram_match(a, photo("camera")[:120, :160])
    assert float(cut.match_ratio) < 0.2


def test_histogram_match_misses_a_pan_that_diamond_recovers():
    """Same-position cells cannot follow camera motion; the block matcher does."""
    from dcjax.matching import match

    img = photo("coffee")
    prev, cur = img[100:227, 100:327], img[106:233, 93:320]
    hist = histogram_match(prev, cur)
    diamond = match(prev, cur)
    assert float(diamond.match_ratio) > float(hist.match_ratio) + 0.3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"grid": (0, 8)}, "grid"), ({"grid": (8,)}, "grid"), ({"bins": 0}, "bins")],
)
def test_bad_arguments(kwargs, message):
    a = photo("camera")[:40, :40]
    with pytest.raises(ValueError, match=message):
        histogram_match(a, a, **kwargs)
