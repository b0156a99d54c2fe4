"""Pallas GPU (Triton) masked convolution: a grid over dirty-tile slots and channel blocks.

Contract: as `dcjax.kernels.masked_conv`; every dirty tile (see
`dcjax.kernels.tiles`) is computed over its nominal rectangle, cropped at the
border, and every other pixel is ``cached`` bit for bit. The output aliases
``cached``, so clean tiles cost neither compute nor memory traffic.

Plan: the grid is (tile slots, output-channel blocks). The dirty tiles come
first in the slot list and ``pl.when(i < n_dirty)`` makes every other program
return at once. A dirty program accumulates an implicit GEMM in float32 over
one loop of (kernel tap, input-channel block) steps: per step it loads the
tap's strided, dilated ``(th, tw, bk)`` input slab straight from global memory
and a ``(bk, bn)`` weight block, and multiplies them (``jnp.dot``, on the
tensor cores). Depthwise convolutions (one input and one output channel per
group) multiply and add per channel instead. The tile is then stored with a
mask that keeps rows and columns inside the output and channels inside the
layer.

Triton wants every block extent a power of two and every dot extent at least
16, so the kernel never relies on the layer's shapes for either: tiles are
rounded up to powers of two (at least 16 pixels), channel blocks are powers of
two from 16 to 64 (128 channels on the depthwise path), the input and weights
are padded with zero channels to whole blocks per group (AlexNet's 3 input
channels, EfficientNet's 24 or 40 outputs), and the store is masked to the
output's rows, columns and channels. An epilogue (`dcjax.kernels.Epilogue`:
bias, batch norm, residual add, activation) runs on the tile before the store,
with its per-channel operands and pixel operands loaded as blocks of the same
extent. Depthwise layers with a channel
multiplier (one input, several output channels per group) go to the `xla`
kernel.

Precision: float32 products use TF32 tensor cores, as XLA's own GPU
convolution does by default; inside ``jax.default_matmul_precision("highest")``
(or ``"float32"``) they are exact float32.

Pallas lowers GPU kernels to Mosaic GPU unless told otherwise: the call passes
`jax.experimental.pallas.triton.CompilerParams` to choose Triton. Lowering to
Triton IR needs no GPU, so the tests lower every layer geometry of the zoo on
CPU; the compiled kernel was checked against the dense convolution on an H100
(the kernel tests and the transform's invariants with every kernel, compiled
there) and timed against the other kernels (docs/performance-notes.md, "GPU: the
Pallas kernel for every layer class").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from dcjax.kernels import tiles as _tiles
from dcjax.kernels.geometry import ConvGeometry, Epilogue

#: Tile used when none is given: 8 x 8 output pixels (see the module docstring).
DEFAULT_TILE = (8, 8)
#: Triton's smallest extent of a matrix product (M, N and K).
_MIN_DOT = 16
#: Largest input- and output-channel blocks of one program.
_MAX_BK = 64
_MAX_BN = 64
#: Channels per program of the depthwise path.
_MAX_BC = 128

__all__ = ["DEFAULT_TILE", "pallas_gpu_masked_conv", "supports", "tile_plan"]


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _round_tile(tile: tuple[int, int]) -> tuple[int, int]:
    """Each side up to a power of two, then grown until the tile has 16 pixels."""
    th, tw = _pow2(tile[0]), _pow2(tile[1])
    while th * tw < _MIN_DOT:
        th, tw = (th * 2, tw) if th <= tw else (th, tw * 2)
    return th, tw


def tile_plan(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    geometry: ConvGeometry,
    *,
    tile: tuple[int, int] | None = None,
) -> _tiles.TilePlan:
    """The `TilePlan` this kernel computes with: ``tile`` (default 8 x 8) rounded
    up to powers of two with at least 16 pixels, then clipped to the output."""
    return _tiles.plan(
        x_shape, w_shape, geometry, tile=_round_tile(DEFAULT_TILE if tile is None else tile)
    )


def supports(w_shape: Sequence[int], groups: int) -> bool:
    """False for depthwise layers with a channel multiplier (they go to `xla`)."""
    cig, cout = int(w_shape[2]), int(w_shape[3])
    return not (cig == 1 and groups > 1 and cout // groups > 1)


@dataclasses.dataclass(frozen=True)
class _Blocks:
    """Static block shapes of one layer."""

    th: int  # tile extents the kernel computes (powers of two, >= the plan's)
    tw: int
    depthwise: bool
    bk: int  # input channels per step (dot path)
    nkb: int  # input-channel blocks per group
    bn: int  # output channels per program
    nbn: int  # output-channel blocks of the layer (all groups)


def _blocks(p: _tiles.TilePlan) -> _Blocks:
    th, tw = _pow2(p.th), _pow2(p.tw)
    while th * tw < _MIN_DOT:  # the plan clipped the tile to a small output:
        if p.nty == 1 and (th <= tw or p.ntx > 1):  # grow an axis with one tile
            th *= 2
        else:
            tw *= 2
    cig, cog = p.cin // p.groups, p.cout // p.groups
    if cig == 1 and cog == 1 and p.groups > 1:
        bc = min(_MAX_BC, _pow2(p.cout))
        return _Blocks(th, tw, True, 1, 1, bc, -(-p.cout // bc))
    bk = min(_MAX_BK, max(_MIN_DOT, _pow2(cig)))
    bn = min(_MAX_BN, max(_MIN_DOT, _pow2(cog)))
    return _Blocks(th, tw, False, bk, -(-cig // bk), bn, p.groups * -(-cog // bn))


def _pad_channels(x: jax.Array, w: jax.Array, p: _tiles.TilePlan, b: _Blocks):
    """Input and weight channels padded with zeros to whole blocks, per group.

    Every load of the kernel then reads whole blocks inside the arrays; the
    zero channels add nothing to the products.
    """
    if b.depthwise:
        c = b.nbn * b.bn - p.cout
        return (
            jnp.pad(x, ((0, 0),) * 3 + ((0, c),)),
            jnp.pad(w, ((0, 0),) * 3 + ((0, c),)),
        )
    g, cig, cog = p.groups, p.cin // p.groups, p.cout // p.groups
    cig_p, cog_p = b.nkb * b.bk, (b.nbn // g) * b.bn
    n, h, wd, _ = x.shape
    x = jnp.pad(x.reshape(n, h, wd, g, cig), ((0, 0),) * 4 + ((0, cig_p - cig),))
    w = w.reshape(p.kh, p.kw, cig, g, cog)
    w = jnp.pad(w, ((0, 0), (0, 0), (0, cig_p - cig), (0, 0), (0, cog_p - cog)))
    return x.reshape(n, h, wd, g * cig_p), w.reshape(p.kh, p.kw, cig_p, g * cog_p)


def _precision() -> lax.Precision:
    value = jax.config.jax_default_matmul_precision
    if value in ("highest", "float32"):
        return lax.Precision.HIGHEST
    return lax.Precision.DEFAULT


def _div(a: jax.Array, d: int) -> jax.Array:
    """``a // d`` for non-negative int32 ``a`` (``jnp``'s floor division does not lower)."""
    return lax.div(a, jnp.int32(d))


def _rem(a: jax.Array, d: int) -> jax.Array:
    """``a % d`` for non-negative int32 ``a``."""
    return lax.rem(a, jnp.int32(d))


def _window(start: jax.Array, size: int, stride: int) -> pl.Slice:
    return pl.ds(start, size, stride=stride) if stride > 1 else pl.ds(start, size)


def _kernel(p: _tiles.TilePlan, b: _Blocks, precision: lax.Precision, fn, n_vec: int, n_pix: int):
    sy, sx = p.strides
    dy, dx = p.dilation
    cog = p.cout // p.groups
    taps = p.kh * p.kw
    per_group = b.nbn if b.depthwise else b.nbn // p.groups
    pix = (b.th, b.tw)

    def kernel(nd_ref, tn_ref, ty_ref, tx_ref, x_ref, w_ref, *refs):
        vec_refs, pix_refs = refs[:n_vec], refs[n_vec : n_vec + n_pix]
        o_ref = refs[-1]  # refs[-2], the cache, is aliased to it: unstored pixels keep it
        i = pl.program_id(0)
        j = pl.program_id(1)

        @pl.when(i < nd_ref[0])
        def _():
            n = tn_ref[i]
            oy, ox = ty_ref[i] * p.th, tx_ref[i] * p.tw
            grp, c0 = _div(j, per_group), _rem(j, per_group) * b.bn

            def slab(tap, ch0, size):
                ky, kx = _div(tap, p.kw), _rem(tap, p.kw)
                return x_ref[
                    n,
                    _window(oy * sy + ky * dy, b.th, sy),
                    _window(ox * sx + kx * dx, b.tw, sx),
                    pl.ds(ch0, size),
                ].astype(jnp.float32)

            if b.depthwise:  # channel c reads input channel c

                def step(tap, acc):
                    wv = w_ref[_div(tap, p.kw), _rem(tap, p.kw), 0, pl.ds(c0, b.bn)]
                    return acc + slab(tap, c0, b.bn) * wv.astype(jnp.float32)[None, None]

                acc = lax.fori_loop(0, taps, step, jnp.zeros((*pix, b.bn), jnp.float32))
                lim, out0 = p.cout, c0
            else:
                cig_p = b.nkb * b.bk

                def step(s, acc):
                    tap, k0 = _div(s, b.nkb), _rem(s, b.nkb) * b.bk
                    a = slab(tap, grp * cig_p + k0, b.bk).reshape(b.th * b.tw, b.bk)
                    wb = w_ref[
                        _div(tap, p.kw),
                        _rem(tap, p.kw),
                        pl.ds(k0, b.bk),
                        pl.ds(grp * per_group * b.bn + c0, b.bn),
                    ].astype(jnp.float32)
                    return acc + jnp.dot(
                        a, wb, precision=precision, preferred_element_type=jnp.float32
                    )

                acc = lax.fori_loop(
                    0, taps * b.nkb, step, jnp.zeros((b.th * b.tw, b.bn), jnp.float32)
                ).reshape(*pix, b.bn)
                lim, out0 = cog, grp * cog + c0
            rows = oy + lax.broadcasted_iota(jnp.int32, (*pix, b.bn), 0)
            cols = ox + lax.broadcasted_iota(jnp.int32, (*pix, b.bn), 1)
            chan = c0 + lax.broadcasted_iota(jnp.int32, (*pix, b.bn), 2)
            inside = (rows < p.ho) & (cols < p.wo) & (chan < lim)
            out = acc.astype(o_ref.dtype)
            if fn is not None:
                chan_ok = (c0 + lax.broadcasted_iota(jnp.int32, (b.bn,), 0)) < lim
                vecs = [plt.load(r.at[pl.ds(out0, b.bn)], mask=chan_ok, other=0) for r in vec_refs]
                pixs = [
                    plt.load(
                        r.at[n, pl.ds(oy, b.th), pl.ds(ox, b.tw), pl.ds(out0, b.bn)],
                        mask=inside,
                        other=0,
                    )
                    for r in pix_refs
                ]
                out = fn(out, *vecs, *pixs).astype(o_ref.dtype)
            plt.store(
                o_ref.at[n, pl.ds(oy, b.th), pl.ds(ox, b.tw), pl.ds(out0, b.bn)],
                out,
                mask=inside,
            )

    return kernel


def pallas_gpu_masked_conv(
    x: jax.Array,
    w: jax.Array,
    reuse_mask: jax.Array,
    cached: jax.Array,
    geometry: ConvGeometry,
    *,
    tile: tuple[int, int] | None = None,
    interpret: bool = False,
    epilogue: Epilogue | None = None,
) -> jax.Array:
    """Masked convolution as a Pallas GPU (Triton) kernel (see the module docstring).

    Args:
        x, w, reuse_mask, cached, geometry, epilogue: as in
            `dcjax.kernels.masked_conv`; the epilogue runs inside the kernel on
            the tiles it computes.
        tile: (th, tw) output tile, rounded up to powers of two (`tile_plan`).
        interpret: run the kernel with the Pallas interpreter (any backend).

    Returns:
        (N, Ho, Wo, Cout) output.

    Raises:
        ValueError: a depthwise layer with a channel multiplier (see `supports`).
    """
    if not supports(w.shape, geometry.groups):
        raise ValueError(
            "dcjax: the Pallas GPU kernel does not compute depthwise convolutions with a "
            "channel multiplier; use impl='xla'"
        )
    p = tile_plan(x.shape, w.shape, geometry, tile=tile)
    b = _blocks(p)
    out_dtype = jnp.result_type(x.dtype, w.dtype)
    # Rows and columns past the output are computed (and masked at the store):
    # the input covers the whole last tile of the kernel's extent.
    extent = ((p.nty - 1) * p.th + b.th, (p.ntx - 1) * p.tw + b.tw)
    xp, wp = _pad_channels(_tiles.pad_input(x, p, extent=extent), w, p, b)
    dirty = _tiles.tile_dirty(reuse_mask, p)
    n_dirty = dirty.sum().astype(jnp.int32)
    t = p.num_tiles
    tn, ty, tx = _tiles.dirty_tile_indices(dirty, p, t)
    fn, vecs, pixs = None, [], []
    if epilogue is not None:
        fn = epilogue.fn
        vecs = [jnp.broadcast_to(jnp.asarray(v), (p.cout,)) for v in epilogue.operands]
        pixs = list(epilogue.pixel_operands)
    call = pl.pallas_call(
        _kernel(p, b, _precision(), fn, len(vecs), len(pixs)),
        out_shape=jax.ShapeDtypeStruct(cached.shape, out_dtype),
        grid=(t, b.nbn),
        input_output_aliases={6 + len(vecs) + len(pixs): 0},
        interpret=interpret,
        compiler_params=plt.CompilerParams(num_warps=4, num_stages=2),
    )
    return call(n_dirty[None], tn, ty, tx, xp, wp, *vecs, *pixs, cached.astype(out_dtype))
