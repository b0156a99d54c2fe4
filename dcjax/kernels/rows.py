"""Row-sparse masked convolution: gather dirty output pixels, one matmul per step, scatter rows.

Contract (the `masked_conv` contract at pixel granularity): the output equals
``lax.conv_general_dilated`` on every pixel whose reuse flag is false. The
number of such *dirty* pixels, pooled over the batch, decides (`row_schedule`):

- more than `RowPlan.dense_fraction` of the pixels dirty: the dense
  convolution, every pixel fresh (a loop of zero or one step, not a
  `lax.cond`: see `dcjax.kernels.xla.sparse_or_dense`, which runs the steps
  below as well);
- otherwise every reusable pixel is ``cached`` bit for bit and only the dirty
  pixels are computed: their flags are packed once a frame
  (`dcjax._compact.listing`, which also counts them) and each step lists the
  flat indices of its own pixels (`dcjax._compact.listed`); they are computed
  in steps of static sizes ``chunk * 2**j`` (`RowPlan.sizes`), largest first,
  each a loop of zero or one trip that runs when bit j of
  ``ceil(n_dirty / chunk)`` is set: any count is covered with
  less than one ``chunk`` of padding rows, in at most ``log2`` steps. Each
  step gathers the receptive fields of its output pixels from the padded input
  as rows of a ``(size, kh * kw * Cin)`` matrix (im2col restricted to those
  pixels), multiplies it by the ``(kh * kw * Cin, Cout)`` weight matrix and
  scatters the rows into the output, which starts as ``cached`` (in place when
  the caller donates the cache, as the transform's jitted step and `lax.scan`
  do).

Why a second sparse kernel next to the tile kernel (`dcjax.kernels.xla`): at
pixel granularity no reusable pixel of a partly dirty tile is recomputed (a
pointwise convolution has no halo that would force tiles), and XLA:CPU runs
the row matmul at its dense-matmul speed once the matrix has enough rows.
Halving steps rather than a loop of fixed chunks, because XLA:CPU runs small
row counts at a fraction of that speed while fixed long chunks pad small counts
(docs/performance-notes.md, "A row kernel beside the tile kernel, in halving
steps, dense above 60 %").

Groups: ungrouped convolutions, up to `MAX_GROUPS` feature groups of at least
`TAP_ROWS_MIN_CIN` input channels each (`computes_groups`): each group gathers
its patches from its own channels of the padded input and multiplies them by
its own weights, and the groups' rows are written side by side
(docs/performance-notes.md, "The row kernel computes a few wide groups
(MAX_GROUPS, TAP_ROWS_MIN_CIN)"); and depthwise convolutions of at least
`TAP_ROWS_MIN_CIN` channels (`computes_depthwise`): each tap gathers whole
pixels from the unpadded input and the taps are weighted and summed, with no
matrix product (docs/performance-notes.md, "Depthwise layers on the row
kernel"). Narrower depthwise and other many-group convolutions have rows too
short to gather and go through the tile kernel. Batched streams are pooled
into one list like the tile kernel (`dcjax.kernels.xla.pooled_over_streams`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax

from dcjax._compact import listed, listing
from dcjax._loops import halving_schedule, halving_sizes
from dcjax.kernels import tiles as _tiles
from dcjax.kernels.geometry import ConvGeometry, Epilogue
from dcjax.kernels.lowering import dense_conv
from dcjax.kernels.xla import (
    apply_epilogue,
    epilogue_parts,
    pooled_over_streams,
    sparse_or_dense,
)

__all__ = [
    "DEFAULT_CHUNK",
    "DENSE_FRACTION",
    "TAP_ROWS_MIN_CIN",
    "RowPlan",
    "computes",
    "computes_depthwise",
    "computes_groups",
    "row_plan",
    "row_schedule",
    "rows_masked_conv",
]

#: Dirty-pixel fraction above which the dense convolution runs, for pointwise
#: (1x1) and spatial kernels: where the row kernel stops beating dense
#: (docs/performance-notes.md, "A row kernel beside the tile kernel, in halving
#: steps, dense above 60 %").
DENSE_FRACTION: dict[str, float] = {"pointwise": 0.6, "spatial": 0.6}


@dataclasses.dataclass(frozen=True)
class RowPlan:
    """Static sizes of the row kernel for one convolution.

    Attributes:
        tiles: the convolution's `tiles.TilePlan` (geometry, padding).
        rows: output pixels over the batch, N * Ho * Wo.
        chunk: the smallest step: dirty pixels are computed in steps of
            ``chunk * 2**j`` rows (`sizes`).
        dense_fraction: fraction of dirty pixels above which the dense path runs.
    """

    tiles: _tiles.TilePlan
    rows: int
    chunk: int
    dense_fraction: float

    @property
    def dense_threshold(self) -> int:
        """Dirty-pixel count above which the dense convolution runs (at least 1)."""
        return _dense_threshold(self.dense_fraction, self.rows)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Step sizes in rows, largest first: `dcjax._loops.halving_sizes` of
        ``chunk`` covering ``dense_threshold``."""
        return halving_sizes(self.chunk, self.dense_threshold)

    @property
    def capacity(self) -> int:
        """Dirty-pixel slots of the sparse path: the sum of `sizes`."""
        return sum(self.sizes)


def _dense_threshold(dense_fraction: float, rows: int) -> int:
    return max(1, math.floor(dense_fraction * rows))


#: The smallest step of the sparse path (rows), where the dense threshold allows
#: (``impl="auto"`` takes longer steps for blob masks: `dcjax.kernels.auto.row_chunk`).
DEFAULT_CHUNK = 16

#: Input channels from which `_patches` gathers rows per kernel tap.
TAP_ROWS_MIN_CIN = 16

#: Most feature groups the row kernel computes (one patch matrix and product each).
MAX_GROUPS = 4


def computes_depthwise(cin: int, groups: int) -> bool:
    """Whether the row kernel computes a depthwise convolution (one group per
    input channel, any channel multiplier) over ``cin`` input channels: with at
    least `TAP_ROWS_MIN_CIN` channels, each kernel tap gathers whole pixels of
    the unpadded input, and the taps' rows are multiplied by their weights and
    summed (`_depthwise_products`): no padded copy of the map, no matrix product."""
    return groups == cin > 1 and cin >= TAP_ROWS_MIN_CIN


def computes(cin: int, groups: int) -> bool:
    """Whether the row kernel computes a convolution of ``groups`` feature groups
    over ``cin`` channels: `computes_groups` or `computes_depthwise`."""
    return computes_groups(cin, groups) or computes_depthwise(cin, groups)


def computes_groups(cin: int, groups: int) -> bool:
    """Whether the row kernel computes a convolution of ``groups`` feature groups
    over ``cin`` input channels: ungrouped, or at most `MAX_GROUPS` groups of at
    least `TAP_ROWS_MIN_CIN` channels each (AlexNet's conv2: 2 of 48). The fixed
    rules (`dcjax.kernels.auto.choose`) give such layers to the row kernel; the
    depthwise ones (`computes_depthwise`) it takes only where measured faster."""
    return groups == 1 or (groups <= MAX_GROUPS and cin // groups >= TAP_ROWS_MIN_CIN)


def row_plan(
    p: _tiles.TilePlan,
    *,
    chunk: int | None = None,
    dense_fraction: float | None = None,
) -> RowPlan:
    """The row plan of a convolution.

    The default ``chunk`` (the smallest step) is `DEFAULT_CHUNK` rows, or the
    dense threshold rounded up to a multiple of 8 where that is smaller (a 7x7
    map); the default ``dense_fraction`` is `DENSE_FRACTION` of the kernel's
    class.
    """
    rows = p.n * p.ho * p.wo
    if dense_fraction is None:
        dense_fraction = DENSE_FRACTION["pointwise" if p.kh * p.kw == 1 else "spatial"]
    if not 0.0 <= dense_fraction <= 1.0:
        raise ValueError(f"dcjax: dense_fraction must be in [0, 1], got {dense_fraction}")
    if chunk is None:
        threshold = _dense_threshold(dense_fraction, rows)
        chunk = min(DEFAULT_CHUNK, 8 * math.ceil(threshold / 8))
    if chunk < 1:
        raise ValueError(f"dcjax: row chunk must be positive, got {chunk}")
    return RowPlan(p, rows, min(chunk, rows), dense_fraction)


def row_schedule(n_dirty: jax.Array, rp: RowPlan) -> tuple[jax.Array, jax.Array]:
    """(dense, units): whether the dense path runs, else the dirty pixels in
    ``chunk``-row units, ``ceil(n_dirty / chunk)``, whose binary digits say
    which `RowPlan.sizes` run (bit j: the step of ``chunk * 2**j`` rows)."""
    return halving_schedule(n_dirty, rp.dense_threshold, rp.chunk)


def _tap_rows(p: _tiles.TilePlan) -> bool:
    """Whether `_patches` gathers one row per kernel tap (from the unpadded input)."""
    return (
        p.kh * p.kw == 1
        or p.cin // p.groups >= TAP_ROWS_MIN_CIN
        or computes_depthwise(p.cin, p.groups)
    )


def _patches(x: jax.Array, b: jax.Array, oy: jax.Array, ox: jax.Array, p: _tiles.TilePlan):
    """(rows, kh * kw * Cin): the receptive fields of output pixels (b, oy, ox), HWI order.

    Where `_tap_rows`, ``x`` is the input itself, seen as (N * H * W, Cin)
    pixels, and each kernel tap is one row gather, the taps concatenated
    (faster on XLA:CPU than one gather of (kh, kw, Cin) windows). A tap that
    can fall in the padding clamps its index and zeroes the rows outside the
    map, so the input is not padded (padding would copy the whole map once a
    frame). See docs/performance-notes.md, "Per-tap row gathers for 16 or more
    channels (_patches)" and "Tap gathers read the unpadded input, clamped
    (_patches)". Otherwise ``x`` is the input padded by `tiles.pad_input`:
    with fewer channels a tap's row is too short, so each kernel row's ``kw *
    Cin`` contiguous values are gathered at once from the padded input seen as
    (N * Hp, Wp * Cin) rows (`_segments`); only a horizontally dilated kernel,
    whose kernel rows are not contiguous, gathers (kh, kw, Cin) windows.
    """
    sy, sx = p.strides
    dy, dx = p.dilation
    cin = x.shape[-1]
    if _tap_rows(p):
        taps = _taps(x, b, oy, ox, p)
        return taps[0] if len(taps) == 1 else jnp.concatenate(taps, axis=1)
    if dx == 1:
        return _segments(x, b, oy, ox, p)
    eh, ew = (p.kh - 1) * dy + 1, (p.kw - 1) * dx + 1
    starts = jnp.stack([b, oy * sy, ox * sx, jnp.zeros_like(b)], axis=1)
    dnums = lax.GatherDimensionNumbers(
        offset_dims=(1, 2, 3), collapsed_slice_dims=(0,), start_index_map=(0, 1, 2, 3)
    )
    win = lax.gather(
        x,
        starts,
        dnums,
        slice_sizes=(1, eh, ew, cin),
        mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS,
    )
    if (dy, dx) != (1, 1):
        win = win[:, ::dy, ::dx]
    return win.reshape(win.shape[0], p.kh * p.kw * cin)


def _taps(x: jax.Array, b: jax.Array, oy: jax.Array, ox: jax.Array, p: _tiles.TilePlan):
    """Per kernel tap in HW order, the (rows, Cin) input pixels that output pixels
    (b, oy, ox) read there: one row gather each from the unpadded input seen as
    (N * H * W, Cin), the index clamped and the rows outside the map zeroed."""
    sy, sx = p.strides
    dy, dx = p.dilation
    (pt, _), (pl, _) = p.pads
    n, h, w, cin = x.shape
    flat = x.reshape(-1, cin)
    cols = [_tap_index(ox, sx, j * dx - pl, p.wo, w) for j in range(p.kw)]
    taps = []
    for i in range(p.kh):
        y, y_ok = _tap_index(oy, sy, i * dy - pt, p.ho, h)
        for xx, x_ok in cols:
            rows = flat.at[(b * h + y) * w + xx].get(mode="promise_in_bounds")
            checks = [c for c in (y_ok, x_ok) if c is not None]
            if checks:
                ok = checks[0] if len(checks) == 1 else checks[0] & checks[1]
                rows = jnp.where(ok[:, None], rows, jnp.zeros((), rows.dtype))
            taps.append(rows)
    return taps


def _depthwise_products(x, wm, b, oy, ox, p: _tiles.TilePlan, dtype) -> jax.Array:
    """(rows, Cout) of a depthwise convolution: each tap's pixels (`_taps`), each
    channel repeated by the channel multiplier, times the tap's weights ``wm``
    (kh * kw, Cout), summed over the taps."""
    mult = p.cout // p.cin
    acc = None
    for t, rows in enumerate(_taps(x, b, oy, ox, p)):
        rows = rows.astype(dtype)
        if mult > 1:
            rows = jnp.repeat(rows, mult, axis=1)
        term = rows * wm[t]
        acc = term if acc is None else acc + term
    return acc


def _tap_index(o: jax.Array, stride: int, offset: int, n_out: int, size: int):
    """``(index, valid)`` along one axis of the input read by outputs ``o`` at a tap
    ``offset`` from ``o * stride``: the index clamped into ``[0, size)`` and
    whether it was inside, or the index alone and ``None`` where no output
    ``o < n_out`` reaches into the padding (a static check)."""
    i = o * stride + offset
    if offset >= 0 and (n_out - 1) * stride + offset < size:
        return i, None
    return jnp.clip(i, 0, size - 1), (i >= 0) & (i < size)


def _segments(xp: jax.Array, b: jax.Array, oy: jax.Array, ox: jax.Array, p: _tiles.TilePlan):
    """`_patches` for few channels and no horizontal dilation: per kernel row, one
    gather of a ``kw * Cin`` slice of a (N * Hp, Wp * Cin) row of the padded input
    (faster than a (kh, kw, Cin) window gather on RGB stems:
    docs/performance-notes.md, "Kernel-row segment gathers for few channels
    (_segments)").
    """
    sy, sx = p.strides
    dy = p.dilation[0]
    n, hp, wp, cin = xp.shape
    rows = xp.reshape(n * hp, wp * cin)
    col = ox * (sx * cin)
    dnums = lax.GatherDimensionNumbers(
        offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0, 1)
    )
    segments = [
        lax.gather(
            rows,
            jnp.stack([b * hp + oy * sy + i * dy, col], axis=1),
            dnums,
            slice_sizes=(1, p.kw * cin),
            mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS,
        )
        for i in range(p.kh)
    ]
    return segments[0] if p.kh == 1 else jnp.concatenate(segments, axis=1)


def _scatter_rows(out: jax.Array, pixels: jax.Array, vals: jax.Array) -> jax.Array:
    """Write rows ``vals`` (chunk, Cout) at pixels (chunk, 3) = (n, oy, ox); drops n >= N."""
    dnums = lax.ScatterDimensionNumbers(
        update_window_dims=(1,),
        inserted_window_dims=(0, 1, 2),
        scatter_dims_to_operand_dims=(0, 1, 2),
    )
    return lax.scatter(
        out, pixels, vals, dnums, indices_are_sorted=True, unique_indices=True,
        mode=lax.GatherScatterMode.FILL_OR_DROP,
    )  # fmt: skip


def _operands(xp: jax.Array, w: jax.Array, p: _tiles.TilePlan, dtype):
    """``(inputs, weights)`` of `_products`: per feature group the (padded or
    unpadded) input's channels and the ``(kh * kw * Cin / groups, Cout /
    groups)`` weight matrix (all channels, one matrix, when ungrouped); for a
    depthwise convolution (`computes_depthwise`) the whole input and one
    ``(kh * kw, Cout)`` matrix of per-tap weights."""
    if computes_depthwise(p.cin, p.groups):
        return (xp,), (w.reshape(p.kh * p.kw, p.cout).astype(dtype),)
    cg, og = p.cin // p.groups, p.cout // p.groups
    inputs = tuple(xp[..., g * cg : (g + 1) * cg] for g in range(p.groups))
    weights = tuple(
        w[..., g * og : (g + 1) * og].reshape(-1, og).astype(dtype) for g in range(p.groups)
    )
    return inputs, weights


def _products(xps, wms, b, oy, ox, p: _tiles.TilePlan, dtype) -> jax.Array:
    """(rows, Cout) from `_operands`: each group's patches times its weights,
    groups side by side, or the depthwise taps' weighted sum."""
    if computes_depthwise(p.cin, p.groups):
        return _depthwise_products(xps[0], wms[0], b, oy, ox, p, dtype)
    vals = [_patches(xp, b, oy, ox, p).astype(dtype) @ wm for xp, wm in zip(xps, wms, strict=True)]
    return vals[0] if len(vals) == 1 else jnp.concatenate(vals, axis=1)


def _rows_unbatched(x, w, reuse_mask, cached, epi_ops, rp: RowPlan, fn=None) -> jax.Array:
    p = rp.tiles
    out_dtype = jnp.result_type(x.dtype, w.dtype)
    # the dirty pixels, packed (`listing`): each step lists its own slots
    dirty = listing(jnp.logical_not(reuse_mask))
    use_dense, units = row_schedule(dirty.count, rp)
    hw = p.ho * p.wo

    def step(out, start, size, xp, wm, dirty, epi_ops):
        r = listed(dirty, start, size)
        b, rem = r // hw, r % hw  # padding slots: b >= N, dropped by the scatter
        oy, ox = rem // p.wo, rem % p.wo
        bc = jnp.minimum(b, p.n - 1)
        vals = _products(xp, wm, bc, oy, ox, p, out_dtype)
        ops, pix = epi_ops
        vals = apply_epilogue(fn, vals, ops, tuple(q[bc, oy, ox] for q in pix))
        return _scatter_rows(out, jnp.stack([b, oy, ox], axis=1), vals)

    def prepare(x, w, dirty, epi_ops):  # once a frame: padding, weights
        xps, wms = _operands(x if _tap_rows(p) else _tiles.pad_input(x, p), w, p, out_dtype)
        return xps, wms, dirty, epi_ops

    def dense(x, w, dirty, epi_ops):
        return apply_epilogue(fn, dense_conv(x, w, p), *epi_ops)

    return sparse_or_dense(
        cached.astype(out_dtype), units, rp.sizes, step, use_dense, dense,
        (x, w, dirty, epi_ops), prepare,
    )  # fmt: skip


def rows_masked_conv(
    x: jax.Array,
    w: jax.Array,
    reuse_mask: jax.Array,
    cached: jax.Array,
    geometry: ConvGeometry,
    *,
    chunk: int | None = None,
    dense_fraction: float | None = None,
    epilogue: Epilogue | None = None,
) -> jax.Array:
    """Sparse masked convolution at pixel granularity (see the module docstring).

    Args:
        x, w, reuse_mask, cached, epilogue: as in `dcjax.kernels.masked_conv`.
        geometry: as in `dcjax.kernels.masked_conv`; its ``groups`` 1, or a few
            groups of enough channels (`computes_groups`).
        chunk: output pixels per loop step (default: `row_plan`'s rule).
        dense_fraction: dirty-pixel fraction above which the dense path runs
            (default: `DENSE_FRACTION` of the kernel's class).

    Returns:
        (N, Ho, Wo, Cout) output.

    Raises:
        ValueError: groups the kernel does not compute (`computes`).
    """
    groups = geometry.groups
    if not computes(x.shape[-1], groups):
        raise ValueError(
            f"dcjax: the rows kernel computes ungrouped convolutions, up to {MAX_GROUPS} "
            f"groups of at least {TAP_ROWS_MIN_CIN} input channels, and depthwise ones of at "
            f"least {TAP_ROWS_MIN_CIN} channels (groups={groups}, {x.shape[-1]} channels); "
            "use impl='xla' for the others"
        )
    fn, epi_ops = epilogue_parts(epilogue)

    def unbatched(x, w, reuse_mask, cached, epi_ops):
        p = _tiles.plan(x.shape, w.shape, geometry)
        rp = row_plan(p, chunk=chunk, dense_fraction=dense_fraction)
        return _rows_unbatched(x, w, reuse_mask, cached, epi_ops, rp, fn)

    return pooled_over_streams(unbatched, geometry, fn)(x, w, reuse_mask, cached, epi_ops)
