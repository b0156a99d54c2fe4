"""Same-position block matcher: the simplest real matcher.

The frame is cut into a grid of ``block_size`` blocks (edge blocks are smaller
when the size does not divide the frame); each block is compared with the block
at the same position in the previous frame by PSNR, and reused when the PSNR is
larger than ``psnr_threshold`` (so ``inf`` reuses nothing). The motion is always
``(0, 0)``.

PSNR is computed on luma (ITU-R BT.601 weights) for 3-channel frames and on the
mean over channels otherwise, or on all channels with ``color="rgb"``. The peak
value is 255 for integer frames and 1.0 for float frames unless ``data_range``
is given.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from dcjax.matching.types import Match

_LUMA = (0.299, 0.587, 0.114)


def psnr_peak(dtype, data_range: float | None = None) -> float:
    """The peak value of the PSNR: ``data_range``, else 255 for integer frames
    and 1.0 for float frames."""
    if data_range is not None:
        return float(data_range)
    return 255.0 if jnp.issubdtype(dtype, jnp.integer) else 1.0


def _plane(frame: jax.Array, color: str) -> jax.Array:
    """(H, W, C) -> (H, W, C') float32 planes PSNR is computed on."""
    x = frame.astype(jnp.float32)
    if color == "rgb":
        return x
    if color != "luma":
        raise ValueError(f"dcjax: color must be 'luma' or 'rgb', got {color!r}")
    if x.shape[-1] == 3:
        return (x[..., 0:1] * _LUMA[0] + x[..., 1:2] * _LUMA[1]) + x[..., 2:3] * _LUMA[2]
    return x.mean(-1, keepdims=True)


def planes(frame: jax.Array, color: str = "luma") -> jax.Array:
    """(H, W, C) frame -> (C', H, W) float32 planes the SSD is computed on:
    the luma plane (``color="luma"``) or the colour channels (``"rgb"``).

    `block_match_planes` and `static_match_planes` take these: a caller that
    matches each frame against a key it keeps (`dcjax.deepcache`) keeps the
    key's planes and converts each frame once instead of converting the key
    again on every frame."""
    return jnp.moveaxis(_plane(frame, color), -1, 0)


def block_sums(values: jax.Array, block_size: int) -> jax.Array:
    """Sum an (H, W, ...) array over ``block_size`` blocks -> (nby, nbx, ...).

    Edge blocks are partial when ``block_size`` does not divide H or W.
    """
    h, w = values.shape[:2]
    nby, nbx = math.ceil(h / block_size), math.ceil(w / block_size)
    pad = [(0, nby * block_size - h), (0, nbx * block_size - w)]
    pad += [(0, 0)] * (values.ndim - 2)
    v = jnp.pad(values, pad)
    v = v.reshape(nby, block_size, nbx, block_size, *values.shape[2:])
    return v.sum((1, 3))


def block_counts(shape: tuple[int, int], block_size: int) -> jax.Array:
    """Number of frame pixels in each block, (nby, nbx) float32."""
    return block_sums(jnp.ones(shape, jnp.float32), block_size)


def block_counts_np(shape: tuple[int, int], block_size: int) -> np.ndarray:
    """Number of frame pixels in each block, (nby, nbx) float32, as a static array."""
    h, w = shape
    ry = np.minimum(block_size, h - np.arange(0, h, block_size))
    rx = np.minimum(block_size, w - np.arange(0, w, block_size))
    return (ry[:, None] * rx[None, :]).astype(np.float32)


def block_sums_unrolled(values: jax.Array, block_size: int) -> jax.Array:
    """`block_sums` of an (H, W) array with unrolled adds -> (nby, nbx).

    XLA:CPU fuses this into plain loops, several times faster than the
    reduction `block_sums` lowers to at frame sizes.
    """
    h, w = values.shape
    nby, nbx = math.ceil(h / block_size), math.ceil(w / block_size)
    if (nby * block_size, nbx * block_size) != (h, w):
        values = jnp.pad(values, ((0, nby * block_size - h), (0, nbx * block_size - w)))
    rows3 = values.reshape(nby, block_size, nbx * block_size)
    rows = rows3[:, 0]
    for i in range(1, block_size):
        rows = rows + rows3[:, i]
    cols3 = rows.reshape(nby, nbx, block_size)
    out = cols3[..., 0]
    for j in range(1, block_size):
        out = out + cols3[..., j]
    return out


def psnr_from_mse(mse: jax.Array, peak: float) -> jax.Array:
    """PSNR in dB; +inf where the MSE is zero."""
    return jnp.where(mse > 0, 10.0 * jnp.log10(peak**2 / jnp.maximum(mse, 1e-30)), jnp.inf)


def expand_flags(flags: jax.Array, shape: tuple[int, int], block_size: int) -> jax.Array:
    """A boolean (nby, nbx) grid of blocks -> (H, W) per-pixel flags, each
    block's flag over its ``block_size`` x ``block_size`` pixels (cut to
    ``shape`` where the last blocks are partial): a product with a 0/1 column
    expansion matrix, ``flags @ E_cols`` (exact for 0/1 entries), then each
    row repeated ``block_size`` times.

    Where the flags are computed in the same program, XLA:CPU fuses their whole
    derivation (block sums of squared differences, the PSNR's logarithm) into
    a per-pixel expansion by repeats (``jnp.repeat`` along both axes), and
    into what reads the mask (the pixel-change cap), and recomputes it for
    every pixel; a product reads its operand once, and the rows' repeat copies
    whole rows (docs/performance-notes.md, "The same-position matcher keeps
    its key as planes", "The motion search's mask is expanded by a product").
    """
    h, w = shape
    if block_size == 1:  # a product would cost (H * W) * W for nothing
        return jnp.asarray(flags, bool)[:h, :w]
    nby, nbx = flags.shape
    cols = (np.arange(nbx)[:, None] == np.arange(w)[None] // block_size).astype(np.float32)
    wide = flags.astype(jnp.float32) @ cols  # (nby, w)
    rows = jnp.broadcast_to(wide[:, None, :], (nby, block_size, w))
    return rows.reshape(nby * block_size, w)[:h] > 0.5


def static_match(
    prev: jax.Array,
    cur: jax.Array,
    *,
    block_size: int = 10,
    psnr_threshold: float = 20.0,
    color: str = "luma",
    data_range: float | None = None,
) -> Match:
    """Match each block of ``cur`` with the same block of ``prev``.

    Args:
        prev: (H, W, C) previous frame, uint8 or float.
        cur: (H, W, C) current frame, same shape and dtype.
        block_size: side of the square blocks in pixels.
        psnr_threshold: blocks with PSNR above this (dB) are reusable; +inf never
            matches.
        color: ``"luma"`` or ``"rgb"``.
        data_range: peak value for PSNR; default 255 (integer) or 1.0 (float).

    Returns:
        A `Match` with motion (0, 0).
    """
    if prev.shape != cur.shape or prev.ndim != 3:
        raise ValueError(
            f"dcjax: prev and cur must be (H, W, C) frames of one shape, got "
            f"{prev.shape} and {cur.shape}"
        )
    return static_match_planes(
        planes(prev, color),
        planes(cur, color),
        peak=psnr_peak(cur.dtype, data_range),
        block_size=block_size,
        psnr_threshold=psnr_threshold,
    )


def static_match_planes(
    prev: jax.Array,
    cur: jax.Array,
    *,
    peak: float,
    block_size: int = 10,
    psnr_threshold: float = 20.0,
) -> Match:
    """`static_match` of frames given as their planes (C', H, W) float32.

    The same Match as ``static_match(prev_frame, cur_frame, ...)`` for planes
    made as `planes` makes them (the luma plane, or the
    colour channels), ``peak`` the PSNR peak `static_match` derives from the
    frames' dtype and ``data_range``: a stream that keeps its key as planes
    converts each frame once, and reads the key's planes instead of the
    frame's colours (one luma plane with ``color="luma"``).
    """
    if prev.shape != cur.shape or prev.ndim != 3:
        raise ValueError(
            f"dcjax: prev and cur must be (C', H, W) planes of one shape, got "
            f"{prev.shape} and {cur.shape}"
        )
    if block_size < 1:
        raise ValueError(f"dcjax: block_size must be >= 1, got {block_size}")
    c, h, w = cur.shape
    err = jnp.square(cur[0] - prev[0])
    for i in range(1, c):
        err = err + jnp.square(cur[i] - prev[i])
    if c > 1:
        err = err / c  # the mean over the planes
    mse = block_sums_unrolled(err, block_size) / block_counts_np((h, w), block_size)
    psnr = psnr_from_mse(mse, peak)
    matched = psnr > psnr_threshold
    nby, nbx = matched.shape
    return Match(
        motion=jnp.zeros((2,), jnp.int32),
        mask=expand_flags(matched, (h, w), block_size),
        block_vectors=jnp.zeros((nby, nbx, 2), jnp.int32),
        block_psnr=psnr.astype(jnp.float32),
        match_ratio=matched.mean(dtype=jnp.float32),
    )
