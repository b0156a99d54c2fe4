"""Pallas GPU (Triton backend) masked convolution: a grid over the dirty-tile capacity.

Contract: as `dcjax.kernels.masked_conv`; pixels of dirty tiles are freshly
computed, every other pixel is ``cached`` bit for bit.

Plan: one program per tile slot (N * nty * ntx slots); the dirty tiles come
first in the list (``jnp.nonzero``), and ``pl.when(i < n_dirty)`` makes every
other program return at once, so clean tiles cost one no-op program each.
A dirty program reads its tile's clamped origin, loads for each kernel tap the
strided, dilated input slab straight from global memory and accumulates an
implicit GEMM (``(th*tw, Cin) x (Cin, Cout)`` per tap, per group) in float32,
then stores the tile into the output, which aliases ``cached``.

Triton needs power-of-two block extents: the default tile is 8 x 8, and on a
real GPU the channel counts should be powers of two (pad them otherwise). The
kernel is tested in interpret mode on CPU only: no GPU was available to this
task, so the compiled Triton path is unverified.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from dcjax.kernels import tiles as _tiles
from dcjax.kernels._pallas_common import tile_conv

#: Tile used when none is given: 8 x 8 output pixels (see the module docstring).
DEFAULT_TILE = (8, 8)

__all__ = ["DEFAULT_TILE", "pallas_gpu_masked_conv"]


def _kernel(p: _tiles.TilePlan):
    sy, sx = p.strides
    dy, dx = p.dilation

    def kernel(nd_ref, tn_ref, oy_ref, ox_ref, x_ref, w_ref, cached_ref, o_ref):
        del cached_ref  # aliased to the output
        i = pl.program_id(0)

        @pl.when(i < nd_ref[0])
        def _():
            n, oy, ox = tn_ref[i], oy_ref[i], ox_ref[i]

            def load(ky, kx):
                rows = (
                    pl.ds(oy * sy + ky * dy, p.th, stride=sy)
                    if sy > 1
                    else pl.ds(oy * sy + ky * dy, p.th)
                )
                cols = (
                    pl.ds(ox * sx + kx * dx, p.tw, stride=sx)
                    if sx > 1
                    else pl.ds(ox * sx + kx * dx, p.tw)
                )
                return x_ref[n, rows, cols, :]

            acc = tile_conv(load, w_ref[...], p)
            o_ref[n, pl.ds(oy, p.th), pl.ds(ox, p.tw), :] = acc.reshape(p.th, p.tw, p.cout).astype(
                o_ref.dtype
            )

    return kernel


def pallas_gpu_masked_conv(
    x: jax.Array,
    w: jax.Array,
    reuse_mask: jax.Array,
    cached: jax.Array,
    *,
    strides: Sequence[int],
    padding: Sequence[tuple[int, int]] | str,
    dilation: Sequence[int] = (1, 1),
    groups: int = 1,
    tile: tuple[int, int] | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Masked convolution as a Pallas GPU kernel (see the module docstring).

    Args:
        x, w, reuse_mask, cached, strides, padding, dilation, groups, tile: as in
            `dcjax.kernels.masked_conv`.
        interpret: run the kernel with the Pallas interpreter (any backend).

    Returns:
        (N, Ho, Wo, Cout) output.
    """
    p = _tiles.plan(
        x.shape,
        w.shape,
        strides=strides,
        padding=padding,
        dilation=dilation,
        groups=groups,
        tile=DEFAULT_TILE if tile is None else tile,
    )
    out_dtype = jnp.result_type(x.dtype, w.dtype)
    xp = _tiles.pad_input(x, p)
    dirty = _tiles.tile_dirty(reuse_mask, p)
    n_dirty = dirty.sum().astype(jnp.int32)
    t = p.num_tiles
    origins = _tiles.dirty_tile_list(dirty, p, t)
    call = pl.pallas_call(
        _kernel(p),
        out_shape=jax.ShapeDtypeStruct(cached.shape, out_dtype),
        grid=(t,),
        input_output_aliases={6: 0},
        interpret=interpret,
    )
    return call(
        n_dirty[None],
        origins[:, 0],
        origins[:, 1],
        origins[:, 2],
        xp,
        w,
        cached.astype(out_dtype),
    )
