"""Row-sparse masked convolution: gather dirty output pixels, one matmul per chunk, scatter rows.

Contract (the `masked_conv` contract at pixel granularity): the output equals
``lax.conv_general_dilated`` on every pixel whose reuse flag is false. The
number of such *dirty* pixels, pooled over the batch, decides (`row_schedule`):

- more than `RowPlan.dense_fraction` of the pixels dirty: the dense
  convolution, every pixel fresh (a loop of zero or one step, not a
  `lax.cond`: see `dcjax.kernels.xla.sparse_or_dense`);
- otherwise every reusable pixel is ``cached`` bit for bit and only the dirty
  pixels are computed: their flat indices are listed (`dcjax._compact.compact`, of a
  static size) and a `lax.fori_loop` with a dynamic trip count runs
  ``ceil(n_dirty / chunk)`` steps. Each step gathers the receptive fields of
  ``chunk`` output pixels from the padded input as rows of a
  ``(chunk, kh * kw * Cin)`` matrix (im2col restricted to those pixels),
  multiplies it by the ``(kh * kw * Cin, Cout)`` weight matrix and scatters the
  rows into the output, which starts as ``cached`` (in place when the caller
  donates the cache, as the transform's jitted step and `lax.scan` do).

Why a second sparse kernel next to the tile kernel (`dcjax.kernels.xla`): a
pointwise convolution has no halo, so nothing forces the work into tiles; at
pixel granularity no reusable pixel of a partly dirty tile is recomputed, and
XLA:CPU runs the row matmul near its dense-matmul speed. Measured on the
development CPU with blob masks (``python -m dcjax.kernels.bench --impls
xla,rows``), ResNet-50's 1x1 layers (56x56 to 14x14) ran 1.6-1.9x faster than
dense at 30 % dirty pixels, where the tile kernel was 0.7-1.2x, and 2.7-3.6x
at 10 % (tiles: 1.1-3.2x); the row kernel fell behind dense at 60-70 %. For
k > 1 the row gather copies each input pixel up to ``kh * kw`` times: 3x3
layers ran 1.85-1.97x at 10 % (tiles 0.7-1.7x), even at 30 %, and slower
than dense above, hence the lower dense cut-off for spatial kernels.

Groups: ``groups == 1`` only (grouped and depthwise convolutions go through the
tile kernel). Batched streams are pooled into one list like the tile kernel
(`dcjax.kernels.xla.pooled_over_streams`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from jax import lax

from dcjax._compact import compact
from dcjax.kernels import tiles as _tiles
from dcjax.kernels.xla import (
    apply_epilogue,
    dense_conv,
    epilogue_parts,
    pooled_over_streams,
    sparse_or_dense,
)

if TYPE_CHECKING:
    from dcjax.kernels.masked import Epilogue

__all__ = ["DENSE_FRACTION", "RowPlan", "row_plan", "row_schedule", "rows_masked_conv"]

#: Dirty-pixel fraction above which the dense convolution runs, for pointwise
#: (1x1) and spatial kernels: where the row kernel stopped beating dense in the
#: sweep quoted in the module docstring.
DENSE_FRACTION: dict[str, float] = {"pointwise": 0.6, "spatial": 0.3}


@dataclasses.dataclass(frozen=True)
class RowPlan:
    """Static sizes of the row kernel for one convolution.

    Attributes:
        tiles: the convolution's `tiles.TilePlan` (geometry, padding).
        rows: output pixels over the batch, N * Ho * Wo.
        chunk: output pixels computed per step of the sparse loop.
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
    def max_chunks(self) -> int:
        return math.ceil(self.dense_threshold / self.chunk)


def _dense_threshold(dense_fraction: float, rows: int) -> int:
    return max(1, math.floor(dense_fraction * rows))


def row_plan(
    p: _tiles.TilePlan,
    *,
    chunk: int | None = None,
    dense_fraction: float | None = None,
) -> RowPlan:
    """The row plan of a convolution.

    The default ``chunk`` is 1/32 of the output pixels rounded up to a multiple
    of 8 and clipped to [32, 512]: at most ~3 % of the work is padding slots,
    and the matmul keeps enough rows to run near full speed. It never exceeds
    the dense threshold rounded up to a multiple of 8: on small maps (7x7,
    14x14 with a 30 % threshold) a 32-row chunk holds more rows than the sparse
    path can ever have dirty, and the padding rows cost as much as real ones
    (ResNet-50's 3x3 layers on 7x7x512 maps at 10-30 % scattered dirty pixels:
    0.37-0.38 ms a call with 16-row chunks against 0.54-0.55 ms with 32, dense
    0.69 ms; the kernel bench's ``resnet50_3x3_7`` layer). The default
    ``dense_fraction`` is `DENSE_FRACTION` of the kernel's class.
    """
    rows = p.n * p.ho * p.wo
    if dense_fraction is None:
        dense_fraction = DENSE_FRACTION["pointwise" if p.kh * p.kw == 1 else "spatial"]
    if not 0.0 <= dense_fraction <= 1.0:
        raise ValueError(f"dcjax: dense_fraction must be in [0, 1], got {dense_fraction}")
    if chunk is None:
        threshold = _dense_threshold(dense_fraction, rows)
        chunk = min(512, max(32, 8 * math.ceil(rows / 32 / 8)), 8 * math.ceil(threshold / 8))
    if chunk < 1:
        raise ValueError(f"dcjax: row chunk must be positive, got {chunk}")
    return RowPlan(p, rows, min(chunk, rows), dense_fraction)


def row_schedule(n_dirty: jax.Array, rp: RowPlan) -> tuple[jax.Array, jax.Array]:
    """(dense, chunks): whether the dense path runs, else how many sparse steps."""
    dense = n_dirty > rp.dense_threshold
    chunks = jnp.where(dense, 0, (n_dirty + rp.chunk - 1) // rp.chunk)
    return dense, chunks.astype(jnp.int32)


def _patches(xp: jax.Array, b: jax.Array, oy: jax.Array, ox: jax.Array, p: _tiles.TilePlan):
    """(chunk, kh * kw * Cin): the receptive fields of output pixels (b, oy, ox), HWI order."""
    sy, sx = p.strides
    if p.kh * p.kw == 1:
        return xp[b, oy * sy, ox * sx]
    dy, dx = p.dilation
    eh, ew = (p.kh - 1) * dy + 1, (p.kw - 1) * dx + 1
    starts = jnp.stack([b, oy * sy, ox * sx, jnp.zeros_like(b)], axis=1)
    dnums = lax.GatherDimensionNumbers(
        offset_dims=(1, 2, 3), collapsed_slice_dims=(0,), start_index_map=(0, 1, 2, 3)
    )
    win = lax.gather(
        xp,
        starts,
        dnums,
        slice_sizes=(1, eh, ew, p.cin),
        mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS,
    )
    if (dy, dx) != (1, 1):
        win = win[:, ::dy, ::dx]
    return win.reshape(win.shape[0], p.kh * p.kw * p.cin)


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


def _rows_unbatched(x, w, reuse_mask, cached, epi_ops, rp: RowPlan, fn=None) -> jax.Array:
    p = rp.tiles
    out_dtype = jnp.result_type(x.dtype, w.dtype)
    dirty = ~reuse_mask.reshape(-1)
    use_dense, chunks = row_schedule(dirty.sum(), rp)
    idx = compact(dirty, rp.max_chunks * rp.chunk)
    hw = p.ho * p.wo

    def step(i, out, x, w, idx, epi_ops):
        r = lax.dynamic_slice_in_dim(idx, i * rp.chunk, rp.chunk)
        b, rem = r // hw, r % hw  # padding slots: b >= N, dropped by the scatter
        oy, ox = rem // p.wo, rem % p.wo
        rows = _patches(_tiles.pad_input(x, p), jnp.minimum(b, p.n - 1), oy, ox, p)
        vals = rows.astype(out_dtype) @ w.reshape(-1, p.cout).astype(out_dtype)
        ops, pix = epi_ops
        bc = jnp.minimum(b, p.n - 1)
        vals = apply_epilogue(fn, vals, ops, tuple(q[bc, oy, ox] for q in pix))
        return _scatter_rows(out, jnp.stack([b, oy, ox], axis=1), vals)

    def dense(x, w, idx, epi_ops):
        return apply_epilogue(fn, dense_conv(x, w, p), *epi_ops)

    return sparse_or_dense(
        cached.astype(out_dtype), chunks, step, use_dense, dense, (x, w, idx, epi_ops)
    )


def rows_masked_conv(
    x: jax.Array,
    w: jax.Array,
    reuse_mask: jax.Array,
    cached: jax.Array,
    *,
    strides: Sequence[int],
    padding: Sequence[tuple[int, int]] | str,
    dilation: Sequence[int] = (1, 1),
    groups: int = 1,
    chunk: int | None = None,
    dense_fraction: float | None = None,
    epilogue: Epilogue | None = None,
) -> jax.Array:
    """Sparse masked convolution at pixel granularity (see the module docstring).

    Args:
        x, w, reuse_mask, cached, strides, padding, dilation, epilogue: as in
            `dcjax.kernels.masked_conv`.
        groups: must be 1.
        chunk: output pixels per loop step (default: `row_plan`'s rule).
        dense_fraction: dirty-pixel fraction above which the dense path runs
            (default: `DENSE_FRACTION` of the kernel's class).

    Returns:
        (N, Ho, Wo, Cout) output.

    Raises:
        ValueError: ``groups != 1``.
    """
    if groups != 1:
        raise ValueError(
            f"dcjax: the rows kernel computes ungrouped convolutions only (groups={groups}); "
            "use impl='xla' for grouped and depthwise convolutions"
        )
    strides, dilation = tuple(strides), tuple(dilation)
    pad_arg = padding if isinstance(padding, str) else tuple(map(tuple, padding))

    fn, epi_ops = epilogue_parts(epilogue)

    def unbatched(x, w, reuse_mask, cached, epi_ops):
        p = _tiles.plan(x.shape, w.shape, strides=strides, padding=pad_arg, dilation=dilation)
        rp = row_plan(p, chunk=chunk, dense_fraction=dense_fraction)
        return _rows_unbatched(x, w, reuse_mask, cached, epi_ops, rp, fn)

    return pooled_over_streams(unbatched, strides, pad_arg, dilation, groups, fn)(
        x, w, reuse_mask, cached, epi_ops
    )
