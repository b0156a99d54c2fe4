"""Masked sparse-update convolution: recompute only what is not reusable.

Public API:

- `masked_conv`: the single entry point (``impl`` = one of `IMPLS`: "auto",
  "reference", "dense", "xla" (tiles), "rows" (pixel rows,
  `dcjax.kernels.rows`), "pallas", "pallas_gpu", "pallas_tpu").
- `ConvGeometry`: strides, padding, dilation and groups of a convolution, the
  record every kernel takes after its arrays
  (``masked_conv(x, w, reuse_mask, cached, geometry, ...)``).
- `masked_conv_eqn`, `dense_conv_eqn`, `reads_cache`: the same for a traced
  ``conv_general_dilated`` equation; `plain_conv` says which equations the
  kernels compute.
- `plan` / `TilePlan`: the static tile plan of a layer (tile size, grid, bucket
  capacities); `default_tile` is the tile-size rule.
- `dirty_fraction`: fraction of output tiles that are dirty (work a perfect
  sparse kernel does); `work_fraction`: fraction of the dense work the `xla`
  kernel actually runs (its bucket capacity / tiles, 0 or 1).
- `choose_impl`: what ``impl="auto"`` picks for a layer on a backend.
- `dcjax.kernels.chain`: an inverted-residual block (1x1 expansion, depthwise,
  1x1 projection) computed on dirty tiles as one, which the transform uses
  with ``Config(fuse_blocks=True)`` on CPU.
- `Epilogue`: an elementwise per-channel map (batch norm, bias, activation)
  that the kernels apply to the outputs they compute, so that reused pixels
  skip it too (``masked_conv(..., epilogue=...)``).

Contract: ``out = masked_conv(x, w, reuse_mask, cached, geometry)`` equals
``lax.conv_general_dilated`` (NHWC input, HWIO weights) wherever ``reuse_mask``
is false; where it is true, ``out`` is ``cached`` or the freshly computed value.
Sparse implementations leave every clean output tile (every reusable pixel, for
"rows") equal to ``cached`` bit for bit and spend no convolution work on it.
"""

from dcjax.kernels.auto import choose as choose_impl
from dcjax.kernels.geometry import ConvGeometry, Epilogue, plain_conv
from dcjax.kernels.masked import (
    IMPLS,
    dense_conv_eqn,
    masked_conv,
    masked_conv_eqn,
    reads_cache,
)
from dcjax.kernels.reference import conv, reference_masked_conv
from dcjax.kernels.tiles import (
    TilePlan,
    default_tile,
    dirty_fraction,
    plan,
    work_fraction,
)

__all__ = [
    "IMPLS",
    "ConvGeometry",
    "Epilogue",
    "TilePlan",
    "choose_impl",
    "conv",
    "default_tile",
    "dense_conv_eqn",
    "dirty_fraction",
    "masked_conv",
    "masked_conv_eqn",
    "plain_conv",
    "plan",
    "reads_cache",
    "reference_masked_conv",
    "work_fraction",
]
