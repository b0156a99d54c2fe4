"""Pallas TPU masked convolution: dirty-tile list as scalar prefetch.

Contract: as `dcjax.kernels.masked_conv`; every dirty tile is computed over its
nominal rectangle (the output is padded to whole tiles and cropped after), and
every clean tile keeps ``cached`` bit for bit without any compute or DMA.

Plan: the grid is one step per tile slot (N * nty * ntx). The number of dirty
tiles and their (n, ty, tx) indices are scalar-prefetched into SMEM. The
output block index map reads the tile list, so the pipeline only moves the
blocks of dirty tiles; slots past the dirty count repeat the last dirty tile,
whose block index does not change, so they cost neither DMA nor compute
(`pl.when` skips the body). The output aliases the (padded) ``cached`` array,
so blocks never visited keep their cached values. The input stays in HBM
(``pl.ANY``); a dirty step copies its window (tile plus halo) to VMEM with one
DMA and runs an implicit-GEMM convolution over the kernel taps.

Mosaic needs the last two block dimensions (tw, Cout) to be multiples of
(8, 128) or the full extent: the default tile is 8 x 8 (the output is padded
to whole tiles), and Cout should be a multiple of 128 for full lanes.
Tested in interpret mode (`pltpu.InterpretParams`) only: no TPU was available.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from dcjax.kernels import tiles as _tiles
from dcjax.kernels.geometry import ConvGeometry

#: Tile used when none is given: 8 x 8 output pixels (see the module docstring).
DEFAULT_TILE = (8, 8)

__all__ = ["DEFAULT_TILE", "pallas_tpu_masked_conv"]


def _tile_conv(
    load: Callable[[int, int], jax.Array], w: jax.Array, p: _tiles.TilePlan
) -> jax.Array:
    """Implicit-GEMM convolution of one tile; (th * tw, Cout) float32.

    ``load(ky, kx)`` (``ky`` may be traced: the kernel rows are a
    `lax.fori_loop`, the columns unrolled) returns the (th, tw, Cin) input
    pixels that kernel tap (ky, kx) multiplies (the window already strided and
    dilated). Each tap is one (th*tw, Cin/g) x (Cin/g, Cout/g) matrix product
    per group; depthwise convolutions (one input channel per group) are a
    per-channel multiply-add instead.
    """
    m = p.th * p.tw
    g = p.groups
    cig = p.cin // g
    cog = p.cout // g

    def row(ky, acc):
        for kx in range(p.kw):
            a = load(ky, kx).reshape(m, p.cin).astype(jnp.float32)
            wt = w[ky, kx].astype(jnp.float32)  # (cig, cout)
            if g == 1:
                acc = acc + jnp.dot(a, wt, preferred_element_type=jnp.float32)
            elif cig == 1:
                # Depthwise: output channel o reads input channel o // cog.
                a_rep = jnp.repeat(a, cog, axis=1) if cog > 1 else a
                acc = acc + a_rep * wt[0][None, :]
            else:
                parts = [
                    jnp.dot(
                        a[:, i * cig : (i + 1) * cig],
                        wt[:, i * cog : (i + 1) * cog],
                        preferred_element_type=jnp.float32,
                    )
                    for i in range(g)
                ]
                acc = acc + jnp.concatenate(parts, axis=1)
        return acc

    acc = jnp.zeros((m, p.cout), jnp.float32)
    if p.kh == 1:
        return row(0, acc)
    return lax.fori_loop(0, p.kh, row, acc)


def _kernel(p: _tiles.TilePlan):
    sy, sx = p.strides
    dy, dx = p.dilation

    def kernel(nd_ref, tn_ref, ty_ref, tx_ref, x_hbm, w_ref, cached_hbm, o_ref, win, sem):
        del cached_hbm  # aliased to the output; untouched blocks keep it
        i = pl.program_id(0)

        @pl.when(i < nd_ref[0])
        def _():
            n, ty, tx = tn_ref[i], ty_ref[i], tx_ref[i]
            src = x_hbm.at[n, pl.ds(ty * (p.th * sy), p.win_h), pl.ds(tx * (p.tw * sx), p.win_w), :]
            copy = pltpu.make_async_copy(src, win, sem)
            copy.start()
            copy.wait()

            def load(ky, kx):
                return win[
                    pl.ds(ky * dy, p.th, stride=sy) if sy > 1 else pl.ds(ky * dy, p.th),
                    pl.ds(kx * dx, p.tw, stride=sx) if sx > 1 else pl.ds(kx * dx, p.tw),
                    :,
                ]

            acc = _tile_conv(load, w_ref[...], p)
            o_ref[0] = acc.reshape(p.th, p.tw, p.cout).astype(o_ref.dtype)

    return kernel


def pallas_tpu_masked_conv(
    x: jax.Array,
    w: jax.Array,
    reuse_mask: jax.Array,
    cached: jax.Array,
    geometry: ConvGeometry,
    *,
    tile: tuple[int, int] | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Masked convolution as a Pallas TPU kernel (see the module docstring).

    Args:
        x, w, reuse_mask, cached, geometry, tile: as in `dcjax.kernels.masked_conv`.
        interpret: run with the TPU interpreter (`pltpu.InterpretParams`) on any backend.

    Returns:
        (N, Ho, Wo, Cout) output.
    """
    p = _tiles.plan(x.shape, w.shape, geometry, tile=DEFAULT_TILE if tile is None else tile)
    out_dtype = jnp.result_type(x.dtype, w.dtype)
    hp, wp = p.nty * p.th, p.ntx * p.tw
    xp = _tiles.pad_input(x, p, whole_tiles=True)
    cp = jnp.pad(cached.astype(out_dtype), ((0, 0), (0, hp - p.ho), (0, wp - p.wo), (0, 0)))
    dirty = _tiles.tile_dirty(reuse_mask, p).reshape(-1)
    n_dirty = dirty.sum().astype(jnp.int32)
    t = p.num_tiles
    (idx,) = jnp.nonzero(dirty, size=t, fill_value=0)
    last = idx[jnp.maximum(n_dirty - 1, 0)]
    idx = jnp.where(jnp.arange(t) < n_dirty, idx, last).astype(jnp.int32)
    tn = idx // (p.nty * p.ntx)
    ty = (idx % (p.nty * p.ntx)) // p.ntx
    tx = idx % p.ntx

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=4,
        grid=(t,),
        in_specs=[
            pl.BlockSpec(memory_space=pl.ANY),
            pl.BlockSpec(w.shape, lambda i, nd, tn, ty, tx: (0, 0, 0, 0)),
            pl.BlockSpec(memory_space=pl.ANY),
        ],
        out_specs=pl.BlockSpec(
            (1, p.th, p.tw, p.cout), lambda i, nd, tn, ty, tx: (tn[i], ty[i], tx[i], 0)
        ),
        scratch_shapes=[
            pltpu.VMEM((p.win_h, p.win_w, p.cin), x.dtype),
            pltpu.SemaphoreType.DMA(()),
        ],
    )
    call = pl.pallas_call(
        _kernel(p),
        out_shape=jax.ShapeDtypeStruct(cp.shape, out_dtype),
        grid_spec=grid_spec,
        input_output_aliases={6: 0},
        interpret=pltpu.InterpretParams() if interpret else False,
    )

    def compute(args):
        return call(*args)

    out = lax.cond(
        n_dirty > 0, compute, lambda args: args[-1], (n_dirty[None], tn, ty, tx, xp, w, cp)
    )
    return out[:, : p.ho, : p.wo, :]
