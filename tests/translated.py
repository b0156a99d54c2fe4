"""A frame and the same frame translated by a whole-pixel motion, with the exact reuse mask."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import dcjax


def translated_pair(shape, motion, seed):
    """``(prev, cur, mask)``: random float32 frames of ``shape`` (H, W, C) with
    ``cur[y, x] = prev[y + dy, x + dx]`` wherever that lies inside (``mask``)
    and fresh values elsewhere."""
    h, w, _ = shape
    rng = np.random.default_rng(seed)
    prev = rng.uniform(size=shape).astype(np.float32)
    cur = rng.uniform(size=shape).astype(np.float32)
    dy, dx = motion
    yy, xx = np.mgrid[:h, :w]
    mask = (yy + dy >= 0) & (yy + dy < h) & (xx + dx >= 0) & (xx + dx < w)
    cur[mask] = prev[(yy + dy)[mask], (xx + dx)[mask]]
    return prev, cur, mask


def panning_frames(shape, t: int, seed: int = 0) -> np.ndarray:
    """``t`` uint8 frames of ``shape`` (H, W, C): one random scene seen through a
    window that moves down a pixel a frame."""
    h, w, c = shape
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (h + t, w + t, c)).astype(np.uint8)
    return np.stack([base[i : i + h, :w] for i in range(t)])


def nothing_reusable(shape) -> dcjax.Match:
    """A match that lets nothing be reused: given to a stream's first step, whose
    later steps are given matches, both steps run one compiled program (a step
    without a match runs the matcher, a second program)."""
    h, w = shape[:2]
    return dcjax.Match(motion=jnp.zeros(2, jnp.int32), mask=jnp.zeros((h, w), bool))
