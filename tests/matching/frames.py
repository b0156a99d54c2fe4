"""Test frames: crops of scikit-image photos, shifted, noised, with pasted objects.

``shifted_pair(img, (dy, dx))`` returns ``(prev, cur)`` with
``cur[y, x] = prev[y + dy, x + dx]`` wherever both exist (the camera panned by
``-(dy, dx)``), so the matcher should report motion ``(dy, dx)``.
"""

from __future__ import annotations

import functools

import numpy as np
from skimage import data, filters

H, W = 64, 84  # 7 x 9 blocks of 10, the last row and column partial
LUMA = np.array([0.299, 0.587, 0.114])


@functools.cache
def photo(name: str) -> np.ndarray:
    """A scikit-image photo as (H, W, 3) uint8."""
    img = getattr(data, name)()
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, -1)
    return np.ascontiguousarray(img[..., :3])


def smooth(img: np.ndarray, sigma: float = 2.0) -> np.ndarray:
    """Gaussian-blurred copy, uint8."""
    out = filters.gaussian(
        img.astype(np.float64), sigma=sigma, channel_axis=-1, preserve_range=True
    )
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def shifted_pair(
    img: np.ndarray,
    motion: tuple[int, int],
    *,
    origin: tuple[int, int] = (120, 140),
    shape: tuple[int, int] = (H, W),
) -> tuple[np.ndarray, np.ndarray]:
    """(prev, cur) crops with ``cur[y, x] = prev[y + dy, x + dx]``."""
    (y0, x0), (dy, dx), (h, w) = origin, motion, shape
    prev = img[y0 : y0 + h, x0 : x0 + w]
    cur = img[y0 + dy : y0 + dy + h, x0 + dx : x0 + dx + w]
    return prev.copy(), cur.copy()


def degrade(frame: np.ndarray, *, noise: float = 2.0, brightness: float = 4.0, seed: int = 0):
    """Sensor-like Gaussian noise and a global brightness change, uint8."""
    rng = np.random.default_rng(seed)
    out = frame.astype(np.float64) + brightness + rng.normal(0.0, noise, frame.shape)
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def luma(frame: np.ndarray) -> np.ndarray:
    """BT.601 luma in float64, (H, W)."""
    return frame.astype(np.float64) @ LUMA


def block_ssd_np(prev_l, cur_l, y0, x0, bh, bw, dy, dx) -> float:
    """SSD of one block of ``cur_l`` against ``prev_l`` displaced by (dy, dx)."""
    a = cur_l[y0 : y0 + bh, x0 : x0 + bw]
    b = prev_l[y0 + dy : y0 + dy + bh, x0 + dx : x0 + dx + bw]
    return float(np.square(a - b).sum())


def blocks(shape: tuple[int, int], bs: int):
    """Yield (by, bx, y0, x0, bh, bw) for every block of a frame."""
    h, w = shape
    for by, y0 in enumerate(range(0, h, bs)):
        for bx, x0 in enumerate(range(0, w, bs)):
            yield by, bx, y0, x0, min(bs, h - y0), min(bs, w - x0)


def brute_force(prev: np.ndarray, cur: np.ndarray, bs: int, r: int):
    """Exhaustive search in NumPy float64: per block, the SSD of every admissible vector.

    Returns:
        dict (by, bx) -> dict (dy, dx) -> SSD.
    """
    pl, cl = luma(prev), luma(cur)
    h, w = pl.shape
    out = {}
    for by, bx, y0, x0, bh, bw in blocks((h, w), bs):
        costs = {}
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                if 0 <= y0 + dy and y0 + dy + bh <= h and 0 <= x0 + dx and x0 + dx + bw <= w:
                    costs[(dy, dx)] = block_ssd_np(pl, cl, y0, x0, bh, bw, dy, dx)
        out[(by, bx)] = costs
    return out


def psnr_np(ssd: float, n: int, peak: float = 255.0) -> float:
    """PSNR in dB of an SSD over ``n`` values."""
    mse = ssd / n
    return float("inf") if mse == 0 else 10.0 * np.log10(peak**2 / mse)
