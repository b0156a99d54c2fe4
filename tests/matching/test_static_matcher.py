"""The same-position block matcher against a NumPy reference."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from skimage import data

from dcjax.matching import static_match
from dcjax.matching.matcher import StreamMatcher, matcher_options
from dcjax.matching.static import expand_flags, static_match_planes


def _reference(prev, cur, block, threshold, peak):
    h, w, _ = cur.shape
    y = lambda f: f.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    err = (y(cur) - y(prev)) ** 2
    nby, nbx = -(-h // block), -(-w // block)
    psnr = np.empty((nby, nbx))
    for i in range(nby):
        for j in range(nbx):
            mse = err[i * block : (i + 1) * block, j * block : (j + 1) * block].mean()
            psnr[i, j] = np.inf if mse == 0 else 10 * np.log10(peak**2 / mse)
    matched = psnr > threshold
    mask = np.kron(matched, np.ones((block, block), bool))[:h, :w]
    return psnr, mask


@pytest.mark.parametrize("block", [7, 10, 16])
def test_matches_numpy_reference_with_partial_edge_blocks(block):
    prev = data.astronaut()[:67, :53]
    rng = np.random.default_rng(0)
    cur = prev.copy()
    cur[20:40, 10:30] = rng.integers(0, 256, (20, 20, 3))  # a changed region
    noise = rng.normal(0, 3, cur.shape)
    cur = np.clip(cur + noise, 0, 255).astype(np.uint8)
    m = static_match(prev, cur, block_size=block, psnr_threshold=30.0)
    psnr, mask = _reference(prev, cur, block, 30.0, 255.0)
    np.testing.assert_allclose(np.asarray(m.block_psnr), psnr, rtol=1e-4)
    np.testing.assert_array_equal(np.asarray(m.mask), mask)
    assert 0.0 < float(m.match_ratio) < 1.0
    assert float(m.match_ratio) == pytest.approx((psnr > 30.0).mean())
    np.testing.assert_array_equal(np.asarray(m.motion), [0, 0])


def test_float_frames_use_unit_peak_and_identical_frames_match():
    f = data.chelsea()[:40, :40].astype(np.float32) / 255.0
    m = static_match(f, f, block_size=10, psnr_threshold=40.0)
    assert bool(np.asarray(m.mask).all()) and np.isinf(np.asarray(m.block_psnr)).all()
    g = np.clip(f + 0.01, 0, 1)
    m = static_match(f, g, block_size=10, psnr_threshold=35.0)
    psnr, _ = _reference(f, g, 10, 35.0, 1.0)
    np.testing.assert_allclose(np.asarray(m.block_psnr), psnr, rtol=1e-4)
    assert bool(np.asarray(m.mask).all())  # ~40 dB for a 0.01 offset


def test_infinite_threshold_never_matches():
    f = data.camera()[:30, :30, None].repeat(3, -1)
    m = static_match(f, f, block_size=10, psnr_threshold=float("inf"))
    assert not np.asarray(m.mask).any()


def test_rgb_mode_sees_chroma_changes_luma_does_not():
    prev = np.full((20, 20, 3), 100, np.uint8)
    cur = prev.copy()
    # a change that keeps luma: +30 red, -15.28 green (0.299*30 == 0.587*15.28)
    cur[..., 0] += 30
    cur[..., 1] -= 15
    luma = static_match(prev, cur, block_size=10, psnr_threshold=35.0, color="luma")
    rgb = static_match(prev, cur, block_size=10, psnr_threshold=35.0, color="rgb")
    assert np.asarray(luma.mask).all() and not np.asarray(rgb.mask).any()


def test_bad_arguments():
    f = np.zeros((10, 10, 3), np.uint8)
    with pytest.raises(ValueError, match="one shape"):
        static_match(f, np.zeros((10, 12, 3), np.uint8))
    with pytest.raises(ValueError, match="block_size"):
        static_match(f, f, block_size=0)
    with pytest.raises(ValueError, match="color"):
        static_match(f, f, color="hsv")


@settings(max_examples=25, deadline=None)
@given(
    nby=st.integers(1, 6),
    nbx=st.integers(1, 6),
    block=st.integers(1, 9),
    cut=st.tuples(st.integers(0, 8), st.integers(0, 8)),
    seed=st.integers(0, 2**16),
)
@example(nby=3, nbx=4, block=1, cut=(0, 0), seed=0)  # one-pixel blocks: no product
def test_the_flags_expansion_equals_the_kronecker_expansion(nby, nbx, block, cut, seed):
    """Flags through a 0/1 product and a repeat of rows (`expand_flags`) are
    the block grid blown up to pixels, cut to frames whose last blocks are
    partial."""
    rng = np.random.default_rng(seed)
    h, w = (
        max(1, nby * block - min(cut[0], block - 1)),
        max(1, nbx * block - min(cut[1], block - 1)),
    )
    flags = rng.random((nby, nbx)) < 0.5
    want = np.kron(flags, np.ones((block, block), bool))[:h, :w]
    got = np.asarray(jax.jit(expand_flags, static_argnums=(1, 2))(flags, (h, w), block))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("color", ["luma", "rgb"])
def test_a_stream_keeps_the_same_position_key_as_planes(color):
    """The stream matcher keeps the static matcher's key as its planes (one
    luma plane, or the three colours) and matches a frame against it as the
    NumPy reference matches the frames themselves."""
    prev = data.astronaut()[:67, :53]
    rng = np.random.default_rng(1)
    cur = prev.copy()
    cur[20:40, 10:30] = rng.integers(0, 256, (20, 20, 3))
    cur = np.clip(cur + rng.normal(0, 3, cur.shape), 0, 255).astype(np.uint8)
    m = StreamMatcher(name="static", options=matcher_options("static"), color=color)
    m = dataclasses.replace(m, block_size=10, psnr_threshold=30.0)
    key = m.key_of(prev)
    assert key.shape == m.key_shape(prev.shape) == ((1,) if color == "luma" else (3,)) + (67, 53)
    got = m.match(key, cur, m.key_of(cur), np.zeros((2,), np.int32))
    if color == "luma":
        psnr, mask = _reference(prev, cur, 10, 30.0, 255.0)
    else:  # the mean squared error over the three colours
        err = ((cur.astype(np.float64) - prev) ** 2).mean(-1)
        sums = np.add.reduceat(np.add.reduceat(err, range(0, 67, 10), 0), range(0, 53, 10), 1)
        counts = np.add.reduceat(
            np.add.reduceat(np.ones_like(err), range(0, 67, 10), 0), range(0, 53, 10), 1
        )
        psnr = 10 * np.log10(255.0**2 / (sums / counts))
        mask = np.kron(psnr > 30.0, np.ones((10, 10), bool))[:67, :53]
    np.testing.assert_allclose(np.asarray(got.block_psnr), psnr, rtol=1e-4)
    np.testing.assert_array_equal(np.asarray(got.mask), mask)
    assert 0.0 < float(got.match_ratio) < 1.0
    with pytest.raises(ValueError, match="one shape"):
        static_match_planes(key, key[:, :60], peak=255.0)
