"""The tile plan shared by every sparse implementation of `masked_conv`.

Contract. The output (N, Ho, Wo, Cout) of a convolution is cut into a grid of
``nty x ntx`` tiles of ``th x tw`` output pixels per image. Tile ``(ty, tx)``
nominally covers rows ``[ty*th, (ty+1)*th)`` and columns ``[tx*tw, (tx+1)*tw)``
(cropped at the border). A tile is *dirty* when any pixel it nominally covers
has ``reuse_mask == False``; every other tile is *clean*. A dirty tile is
computed over the rectangle starting at its *clamped origin*
``(min(ty*th, Ho - th), min(tx*tw, Wo - tw))`` so that every computed tile has
the full ``th x tw`` size and lies inside the output (the last row and column
of tiles may overlap their neighbours when ``th`` does not divide ``Ho``).
Pixels outside every computed rectangle are copied from ``cached`` untouched.

Input windows: the computed rectangle at origin ``(oy, ox)`` needs the window
of the padded input starting at ``(oy*sy, ox*sx)`` of size
``((th-1)*sy + (kh-1)*dy + 1, (tw-1)*sx + (kw-1)*dx + 1)``; a VALID
convolution of that window gives exactly the output rectangle. `pad_input`
pads (or crops) ``x`` so that every window lies inside it; the tile kernels
instead read the windows from ``x`` itself, zeros where a window covers the
padding (`reads_padding`, `dcjax.kernels.xla.gather_windows`).

Capacities. The number of dirty tiles is dynamic; the compute is sized
statically in *chunks* of `TilePlan.chunk` tiles (pooled over the batch): the
sparse path computes ``ceil(n_dirty / chunk)`` chunks, in steps of
``chunk * 2**j`` tiles picked by the binary digits of that count
(`TilePlan.sizes`, `dcjax.kernels.xla.sparse_or_dense`); by default ``chunk =
ceil(num_tiles / 16)``, at most 1/16 of the work wasted on padding slots.
When more than ``dense_fraction`` (5/8) of the tiles are dirty the dense
convolution runs instead.
`schedule` gives (dense?, chunks) for a dirty count; `work_fraction` the
fraction of the dense work that is done.

Tile-size rule (`default_tile`): per axis, side ``clip(round(side / 14), 4,
16)``, then evened out so the last tile is nearly full: 4 x 4 output pixels
for maps up to ~63 pixels, growing to 8 at 112 and 16 at 224 so the tile list
stays short. Small tiles keep the dirty-tile fraction of blob-shaped masks
close to the dirty-pixel fraction, and the batched convolution's per-pixel
cost hardly depends on the tile side (docs/performance-notes.md, "Tile size:
4x4 output pixels up to ~63-pixel maps (default_tile)"). Pass ``tile=`` to
override.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from dcjax._compact import compact
from dcjax._loops import halving_schedule, halving_sizes
from dcjax.kernels.geometry import ConvGeometry

__all__ = [
    "TilePlan",
    "default_tile",
    "dirty_fraction",
    "dirty_tile_indices",
    "dirty_tile_list",
    "layer_key",
    "normalize_padding",
    "pad_input",
    "plan",
    "reads_padding",
    "schedule",
    "tile_dirty",
    "work_fraction",
]

#: Tiles per chunk of the sparse loop, as a fraction of all tiles (pooled over the batch).
DEFAULT_CHUNK_FRACTION: float = 1 / 16
#: Above this fraction of dirty tiles the dense convolution is used.
DEFAULT_DENSE_FRACTION: float = 5 / 8


@dataclasses.dataclass(frozen=True)
class TilePlan:
    """Static description of how one convolution is tiled.

    Attributes:
        n: batch size N.
        h, w: input spatial size.
        cin, cout: input and output channels.
        kh, kw: kernel size.
        geometry: the convolution's `ConvGeometry` (its ``strides``,
            ``dilation`` and ``groups`` are properties of the plan too).
        pads: explicit ((lo, hi), (lo, hi)) padding of the convolution.
        ho, wo: output spatial size.
        th, tw: tile size in output pixels.
        nty, ntx: number of tiles along H and W per image.
        win_h, win_w: input window size of one tile (tile plus halo).
        chunk: tiles computed per step of the sparse loop.
        dense_fraction: fraction of dirty tiles above which the dense path runs.
    """

    n: int
    h: int
    w: int
    cin: int
    cout: int
    kh: int
    kw: int
    geometry: ConvGeometry
    pads: tuple[tuple[int, int], tuple[int, int]]
    ho: int
    wo: int
    th: int
    tw: int
    nty: int
    ntx: int
    win_h: int
    win_w: int
    chunk: int
    dense_fraction: float

    @property
    def strides(self) -> tuple[int, int]:
        """(sy, sx) window strides."""
        return self.geometry.strides  # type: ignore[return-value]

    @property
    def dilation(self) -> tuple[int, int]:
        """(dy, dx) kernel dilation."""
        return self.geometry.dilation  # type: ignore[return-value]

    @property
    def groups(self) -> int:
        """Feature groups."""
        return self.geometry.groups

    @property
    def num_tiles(self) -> int:
        """Tiles over the whole batch, N * nty * ntx."""
        return self.n * self.nty * self.ntx

    @property
    def dense_threshold(self) -> int:
        """Dirty-tile count above which the dense convolution runs (at least 1)."""
        return max(1, math.floor(self.dense_fraction * self.num_tiles))

    @property
    def sizes(self) -> tuple[int, ...]:
        """Step sizes of the sparse path in tiles, largest first:
        `dcjax._loops.halving_sizes` of ``chunk`` covering ``dense_threshold``."""
        return halving_sizes(self.chunk, self.dense_threshold)

    @property
    def capacity(self) -> int:
        """Dirty-tile slots of the sparse path: the sum of `sizes`."""
        return sum(self.sizes)


def normalize_padding(
    padding: Sequence[tuple[int, int]] | str,
    in_hw: tuple[int, int],
    kernel_hw: tuple[int, int],
    strides: Sequence[int],
    dilation: Sequence[int],
) -> tuple[tuple[int, int], tuple[int, int]]:
    """Explicit ((lo, hi), (lo, hi)) padding for "SAME", "VALID" or explicit pairs."""
    if isinstance(padding, str):
        eff = tuple((k - 1) * d + 1 for k, d in zip(kernel_hw, dilation, strict=True))
        pads = lax.padtype_to_pads(in_hw, eff, tuple(strides), padding.upper())
    else:
        pads = tuple(padding)
    if len(pads) != 2:
        raise ValueError(f"dcjax: masked_conv padding needs 2 (lo, hi) pairs, got {padding!r}")
    return tuple((int(lo), int(hi)) for lo, hi in pads)  # type: ignore[return-value]


def default_tile(ho: int, wo: int, kh: int = 1, kw: int = 1) -> tuple[int, int]:
    """The per-layer tile size rule (see the module docstring).

    Side ``t = clip(round(side / 14), 4, 16)``, then shrunk so that the number of
    tiles ``ceil(side / t)`` stays the same while the last tile is as full as
    possible (``t = ceil(side / ceil(side / t))``); never larger than the side.
    Kernel size is accepted for future rules and currently unused.
    """
    del kh, kw

    def side(s: int) -> int:
        t = min(max(round(s / 14), 4), 16)
        t = min(t, s)
        return math.ceil(s / math.ceil(s / t))

    return side(ho), side(wo)


def layer_key(p: TilePlan, dtype=jnp.float32) -> str:
    """The layer's geometry and dtype as a string: what a measurement of a way to
    compute it depends on (`dcjax.kernels.tuning`, `dcjax.kernels.lowering`)."""
    return (
        f"n{p.n} {p.h}x{p.w}x{p.cin} -> {p.ho}x{p.wo}x{p.cout} k{p.kh}x{p.kw} "
        f"s{p.strides} pad{p.pads} d{p.dilation} g{p.groups} {jnp.dtype(dtype).name}"
    )


def plan(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    geometry: ConvGeometry,
    *,
    tile: tuple[int, int] | None = None,
    chunk_fraction: float = DEFAULT_CHUNK_FRACTION,
    dense_fraction: float = DEFAULT_DENSE_FRACTION,
) -> TilePlan:
    """Build the static `TilePlan` of a convolution from shapes and its geometry.

    Args:
        x_shape: (N, H, W, Cin).
        w_shape: (kh, kw, Cin / groups, Cout).
        geometry: the convolution's strides, padding, dilation and groups.
        tile: (th, tw) output tile; `default_tile` when None. Clipped to the output.
        chunk_fraction: tiles per chunk as a fraction of all tiles (at least 1).
        dense_fraction: dirty fraction above which the dense branch runs.

    Returns:
        The plan.
    """
    n, h, w, cin = map(int, x_shape)
    kh, kw, cig, cout = map(int, w_shape)
    sy, sx = geometry.strides
    dy, dx = geometry.dilation
    groups = geometry.groups
    if cig * groups != cin:
        raise ValueError(
            f"dcjax: masked_conv weights have {cig} input channels per group and groups={groups}, "
            f"but x has {cin} channels; pass w of shape (kh, kw, Cin / groups, Cout)"
        )
    pads = normalize_padding(geometry.padding, (h, w), (kh, kw), (sy, sx), (dy, dx))
    eky, ekx = (kh - 1) * dy + 1, (kw - 1) * dx + 1
    ho = (h + pads[0][0] + pads[0][1] - eky) // sy + 1
    wo = (w + pads[1][0] + pads[1][1] - ekx) // sx + 1
    if ho <= 0 or wo <= 0:
        raise ValueError(f"dcjax: masked_conv output would be empty ({ho}, {wo})")
    th, tw = tile if tile is not None else default_tile(ho, wo, kh, kw)
    th, tw = max(1, min(int(th), ho)), max(1, min(int(tw), wo))
    nty, ntx = math.ceil(ho / th), math.ceil(wo / tw)
    chunk = max(1, math.ceil(chunk_fraction * n * nty * ntx))
    return TilePlan(
        n=n,
        h=h,
        w=w,
        cin=cin,
        cout=cout,
        kh=kh,
        kw=kw,
        geometry=geometry,
        pads=pads,
        ho=ho,
        wo=wo,
        th=th,
        tw=tw,
        nty=nty,
        ntx=ntx,
        win_h=(th - 1) * sy + eky,
        win_w=(tw - 1) * sx + ekx,
        chunk=chunk,
        dense_fraction=float(dense_fraction),
    )


def tile_dirty(reuse_mask: jax.Array, p: TilePlan) -> jax.Array:
    """Bool (N, nty, ntx): true where a tile nominally covers a non-reusable pixel."""
    fresh = ~reuse_mask.astype(bool)
    fresh = jnp.pad(fresh, ((0, 0), (0, p.nty * p.th - p.ho), (0, p.ntx * p.tw - p.wo)))
    fresh = fresh.reshape(p.n, p.nty, p.th, p.ntx, p.tw)
    return fresh.any(axis=(2, 4))


def schedule(n_dirty: jax.Array, p: TilePlan) -> tuple[jax.Array, jax.Array]:
    """(dense, chunks): whether the dense path runs, else how many ``chunk``-tile
    units the sparse path computes (their binary digits pick `TilePlan.sizes`)."""
    return halving_schedule(n_dirty, p.dense_threshold, p.chunk)


def dirty_tile_indices(dirty: jax.Array, p: TilePlan, capacity: int) -> tuple[jax.Array, ...]:
    """Int32 ``(n, ty, tx)``, each (capacity,): the indices of the dirty tiles, in order.

    Slots past the number of dirty tiles repeat the last listed dirty tile, so
    that computing them again is harmless (tile 0 when none is dirty).
    """
    idx = compact(dirty, capacity)
    count = jnp.minimum(dirty.sum(), capacity)
    last = jnp.where(count > 0, idx[jnp.maximum(count - 1, 0)], 0)
    idx = jnp.where(jnp.arange(capacity) < count, idx, last)
    rem = idx % (p.nty * p.ntx)
    return idx // (p.nty * p.ntx), rem // p.ntx, rem % p.ntx


def dirty_tile_list(dirty: jax.Array, p: TilePlan, capacity: int) -> jax.Array:
    """Int32 (capacity, 3) rows ``(n, oy, ox)``: clamped output origins of dirty tiles.

    Slots past the number of dirty tiles repeat the last listed dirty tile (see
    `dirty_tile_indices`).
    """
    n, ty, tx = dirty_tile_indices(dirty, p, capacity)
    oy = jnp.minimum(ty * p.th, p.ho - p.th)
    ox = jnp.minimum(tx * p.tw, p.wo - p.tw)
    return jnp.stack([n, oy, ox], axis=1).astype(jnp.int32)


def pad_input(
    x: jax.Array,
    p: TilePlan,
    whole_tiles: bool = False,
    extent: tuple[int, int] | None = None,
) -> jax.Array:
    """Pad (or crop) x so that the window of every output tile lies inside it.

    The result has spatial size ``((Ho-1)*sy + eky, (Wo-1)*sx + ekx)``: the
    convolution's padded input, minus rows and columns no output reads. With
    ``whole_tiles`` the output extent is rounded up to whole tiles
    (``nty*th``, ``ntx*tw``) so that unclamped tile windows fit too; ``extent``
    gives that output extent ``(rows, cols)`` explicitly. The extra rows and
    columns are zeros.
    """
    (ply, _), (plx, _) = p.pads
    if extent is not None:
        ho, wo = extent
    else:
        ho = p.nty * p.th if whole_tiles else p.ho
        wo = p.ntx * p.tw if whole_tiles else p.wo
    need_h = (ho - 1) * p.strides[0] + (p.kh - 1) * p.dilation[0] + 1
    need_w = (wo - 1) * p.strides[1] + (p.kw - 1) * p.dilation[1] + 1
    zero = jnp.zeros((), x.dtype)
    cfg = ((0, 0, 0), (ply, need_h - p.h - ply, 0), (plx, need_w - p.w - plx, 0), (0, 0, 0))
    return lax.pad(x, zero, cfg)


def reads_padding(p: TilePlan) -> bool:
    """Whether the window of some tile reaches into the convolution's padding
    (it starts before the map or ends after it; the origins are static)."""
    for size, win, pad, stride, t, n_out, n_tiles in (
        (p.h, p.win_h, p.pads[0][0], p.strides[0], p.th, p.ho, p.nty),
        (p.w, p.win_w, p.pads[1][0], p.strides[1], p.tw, p.wo, p.ntx),
    ):
        for i in range(n_tiles):
            start = min(i * t, n_out - t) * stride - pad
            if start < 0 or start + win > size:
                return True
    return False


def dirty_fraction(
    reuse_mask: jax.Array,
    out_shape: Sequence[int] | None = None,
    tile: tuple[int, int] | None = None,
    *,
    p: TilePlan | None = None,
) -> jax.Array:
    """Fraction of output tiles that are dirty (the work a perfect sparse kernel does).

    Args:
        reuse_mask: bool (N, Ho, Wo).
        out_shape: unused beyond validation; (N, Ho, Wo[, C]) of the output.
        tile: tile size; `default_tile` of the mask's shape when None.
        p: a `TilePlan` to take the tile size from (overrides ``tile``).

    Returns:
        Float32 scalar in [0, 1], dirty tiles / tiles, pooled over the batch.
    """
    n, ho, wo = reuse_mask.shape
    if out_shape is not None and tuple(out_shape[:3]) != (n, ho, wo):
        raise ValueError(f"dcjax: reuse_mask shape {reuse_mask.shape} does not match {out_shape}")
    if p is None:
        th, tw = tile if tile is not None else default_tile(ho, wo)
        th, tw = min(th, ho), min(tw, wo)
        valid = ConvGeometry(strides=(1, 1), padding="VALID")
        p = plan((n, ho, wo, 1), (1, 1, 1, 1), valid, tile=(th, tw))
    d = tile_dirty(reuse_mask, p)
    return d.sum().astype(jnp.float32) / d.size


def work_fraction(reuse_mask: jax.Array, p: TilePlan) -> jax.Array:
    """Fraction of the dense convolution's work the `xla` kernel actually does.

    0 when every tile is clean, ``chunks * chunk / num_tiles`` on the sparse
    path (the capacity used, repeated slots included), 1 when the dense path
    runs. Float32 scalar.
    """
    dense, chunks = schedule(tile_dirty(reuse_mask, p).sum(), p)
    sparse = (chunks * p.chunk).astype(jnp.float32) / p.num_tiles
    return jnp.where(dense, 1.0, sparse).astype(jnp.float32)
