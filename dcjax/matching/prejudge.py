"""Zero-motion prejudgement: settle a still frame before any search.

Contract. The early termination at the zero vector of video encoders' fast
searches, which `dcjax.matching.block.block_match` applies with
``prejudge=True`` (what `dcjax.deepcache` asks for by default). From a zero
start (``init_motion`` (0, 0)) every block is first scored at the zero vector
and at its four one-pixel neighbours (the small diamond) by five passes over
the planes (`small_diamond_ssds`). When more than half of all blocks pass the
threshold at zero and cost no more there than at any neighbour, the global
motion is zero, every block's vector is zero, their PSNRs there are the
re-check's (Step 4), and nothing is searched. Otherwise the search runs, and
a frame the prejudgement does not settle pays its five passes on top of the
search's (which scores the same vectors again). Every matched block still
passes the threshold at the motion it is reused with.

The diamond search would also end at zero for most of those blocks (its
early settling needs them to beat the large diamond as well); where a block
beats its four neighbours but not a vector two pixels away (periodic
texture), the prejudgement keeps zero. The neighbours are what keeps a pan
from being taken for a still scene: with the zero pass alone, a 3-pixel pan
over a photo's smooth areas passed the default 20 dB threshold in more than
half of its blocks.

The caller runs the passes inside a loop of one trip (zero trips from a
nonzero start): besides skipping them after a moving frame, that
materialises the planes, whose computation in the caller's program (the
frame's luma, from interleaved colours) XLA would otherwise fuse into each of
the five passes. What they cost and save: docs/performance-notes.md, "The
zero-motion prejudgement".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dcjax.matching.grid import admits
from dcjax.matching.search import SMALL_DIAMOND
from dcjax.matching.static import block_sums_unrolled

__all__ = ["shifted_ssds", "small_diamond_ssds"]


def shifted_ssds(
    prev_pl: jax.Array,
    cur_pl: jax.Array,
    dy: int,
    dx: int,
    *,
    block_size: int,
    bounds: tuple[np.ndarray, np.ndarray],
) -> jax.Array:
    """Every block's SSD between ``cur`` and ``prev`` shifted by ``(dy, dx)`` -> (nby, nbx).

    ``cur_pl`` and ``prev_pl`` are (C, H, W) planes; the sum runs over the
    channels and the block's pixels (``cur[y, x] ~ prev[y + dy, x + dx]``).
    ``bounds`` are every block's admissible vectors (lo, hi), each (nby, nbx,
    2): where the shifted block leaves the frame the SSD is ``+inf``.
    The shift is static and small; each call is one fused pass over slices.
    """
    _, h, w = cur_pl.shape
    y0, y1, x0, x1 = max(0, -dy), h - max(0, dy), max(0, -dx), w - max(0, dx)
    err = None
    for i in range(cur_pl.shape[0]):
        d = cur_pl[i, y0:y1, x0:x1] - prev_pl[i, y0 + dy : y1 + dy, x0 + dx : x1 + dx]
        err = jnp.square(d) if err is None else err + jnp.square(d)
    err = jnp.pad(err, ((y0, h - y1), (x0, w - x1)))
    ssd = block_sums_unrolled(err, block_size)
    return jnp.where(admits(bounds, np.array([dy, dx])), ssd, jnp.inf)


def small_diamond_ssds(
    prev_pl: jax.Array,
    cur_pl: jax.Array,
    *,
    block_size: int,
    bounds: tuple[np.ndarray, np.ndarray],
) -> tuple[jax.Array, jax.Array]:
    """(every block's SSD at the zero vector, its lowest SSD at the four
    one-pixel neighbours), each (nby, nbx); arguments as in `shifted_ssds`."""
    kw = dict(block_size=block_size, bounds=bounds)
    at_zero = shifted_ssds(prev_pl, cur_pl, 0, 0, **kw)
    lowest = shifted_ssds(prev_pl, cur_pl, *SMALL_DIAMOND[0], **kw)
    for dy, dx in SMALL_DIAMOND[1:]:
        lowest = jnp.minimum(lowest, shifted_ssds(prev_pl, cur_pl, dy, dx, **kw))
    return at_zero, lowest
