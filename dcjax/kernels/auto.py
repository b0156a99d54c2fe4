"""The measured choice behind ``masked_conv(impl="auto")``.

Contract: `choose(plan, backend, scattered=False)` returns ``(impl, tile)``: a
concrete implementation (never "auto" or "pallas") and a tile size or None for
the `tiles.default_tile` rule. The choice depends only on static shapes, so it
is made once at trace time. `row_chunk` gives the row kernel's smallest step
under ``impl="auto"``.

The rules, in the order `choose` applies them (each measured; the numbers and
commands are in docs/performance-notes.md, under the headings named):

- CPU, a layer under `SMALL_LAYER_FLOPS` dense FLOPs: ``"dense"`` (its sparse
  path's fixed cost per call exceeds what it could save: "Small layers run
  dense on CPU (SMALL_LAYER_FLOPS)"), unless it is a `large_map` layer ("Large
  maps are cached whatever their FLOPs, if intense enough (LARGE_MAP_PIXELS,
  LARGE_MAP_MIN_INTENSITY)").
- GPU, a layer under `GPU_SMALL_LAYER_FLOPS`: ``"dense"`` ("GPU: small layers
  run dense (GPU_SMALL_LAYER_FLOPS)"); and one the Pallas kernel does not
  compute (a channel multiplier): the tile kernel's loops would read their
  predicates on the host (`dcjax.transforms.host_syncs`).
- CPU, a spatial layer (k > 1, ungrouped) with `rows_pays` (at least
  `rows.TAP_ROWS_MIN_CIN` input channels) or with scattered masks: ``"rows"``
  ("Spatial layers with 16 or more input channels go to the row kernel on
  CPU", "Scattered masks send spatial layers to the row kernel"), except where
  `dcjax.kernels.lowering.taps_pays` ("Scattered masks: layers computed as a sum of
  taps stay on the tile kernel").
- CPU, a grouped layer the row kernel computes (`rows.computes_groups`):
  ``"rows"`` ("Grouped layers go to the tile kernel on CPU, a few wide groups
  to the row kernel").
- Otherwise `TABLE` by backend and `layer_class` ("How the auto table was
  measured", "RGB stems stay on the tile kernel on CPU", "Pointwise layers go
  to the row kernel on CPU", "GPU: the Pallas kernel for every layer class");
  a missing row falls back to ``"xla"``. TPU has no row: no TPU was lent, so
  nothing was measured there, and it gets the portable tile kernel.

The CPU rules were measured on 2-core machines with XLA:CPU's default
convolution library ("Sparse kernels' loop bodies run on one core (AMD EPYC)",
"A matrix product inside a loop uses both cores (Intel Xeon)", "One table for
YNNPACK and Eigen").
"""

from __future__ import annotations

import math

from dcjax.kernels import lowering as _lowering
from dcjax.kernels import rows as _rows
from dcjax.kernels.tiles import TilePlan

__all__ = [
    "BLOB_ROW_CHUNK",
    "GPU_SMALL_LAYER_FLOPS",
    "LARGE_MAP_PIXELS",
    "LARGE_MAP_MIN_INTENSITY",
    "SMALL_LAYER_FLOPS",
    "TABLE",
    "choose",
    "intensity",
    "large_map",
    "layer_class",
    "pallas_gpu_computes",
    "row_chunk",
    "rows_pays",
]

#: Layers with fewer dense FLOPs than this run dense on CPU (docs/performance-notes.md,
#: "Small layers run dense on CPU (SMALL_LAYER_FLOPS)")...
SMALL_LAYER_FLOPS = 45e6

#: ...unless ungrouped with at least this many output pixels per image...
LARGE_MAP_PIXELS = 56 * 56

#: ...and at least this `intensity` (multiply-adds per value moved); see
#: docs/performance-notes.md, "Large maps are cached whatever their FLOPs, if
#: intense enough (LARGE_MAP_PIXELS, LARGE_MAP_MIN_INTENSITY)".
LARGE_MAP_MIN_INTENSITY = 24.0

#: Layers with fewer dense FLOPs than this run dense on GPU (docs/performance-notes.md,
#: "GPU: small layers run dense (GPU_SMALL_LAYER_FLOPS)").
GPU_SMALL_LAYER_FLOPS = 4e9

#: (backend, layer class) -> (impl, tile or None). Missing rows fall back to "xla".
#: See docs/performance-notes.md, "How the auto table was measured" and the
#: entries after it.
TABLE: dict[tuple[str, str], tuple[str, tuple[int, int] | None]] = {
    ("cpu", "spatial"): ("xla", None),
    ("cpu", "pointwise"): ("rows", None),
    ("cpu", "grouped"): ("xla", None),
    ("gpu", "spatial"): ("pallas_gpu", None),
    ("gpu", "pointwise"): ("pallas_gpu", None),
    ("gpu", "grouped"): ("pallas_gpu", None),
}


def layer_class(p: TilePlan) -> str:
    """ "grouped" (groups > 1, depthwise included), "pointwise" (1x1) or
    "spatial" (a larger ungrouped kernel)."""
    if p.groups > 1:
        return "grouped"
    if p.kh * p.kw == 1:
        return "pointwise"
    return "spatial"


def choose(
    p: TilePlan, backend: str, scattered: bool = False
) -> tuple[str, tuple[int, int] | None]:
    """(impl, tile or None) for a layer on a backend ("cpu", "gpu", "tpu").

    ``scattered``: the layer's masks are scattered at pixel level (refinement).
    """
    if backend == "cpu" and dense_flops(p) < SMALL_LAYER_FLOPS and not large_map(p):
        return "dense", None
    if backend == "gpu" and (dense_flops(p) < GPU_SMALL_LAYER_FLOPS or not pallas_gpu_computes(p)):
        return "dense", None
    if (
        backend == "cpu"
        and layer_class(p) == "spatial"
        and (scattered or rows_pays(p))
        and not _lowering.taps_pays(p)
    ):
        return "rows", None
    if backend == "cpu" and layer_class(p) == "grouped" and _rows.computes_groups(p.cin, p.groups):
        return "rows", None
    return TABLE.get((backend, layer_class(p)), ("xla", None))


def pallas_gpu_computes(p: TilePlan) -> bool:
    """Whether the Pallas GPU kernel computes the layer (imported here only: it
    loads Triton's Pallas backend)."""
    from dcjax.kernels import pallas_gpu

    return pallas_gpu.supports((p.kh, p.kw, p.cin // p.groups, p.cout), p.groups)


#: Smallest step of the row kernel (rows) where the masks are blobs (see `row_chunk`;
#: docs/performance-notes.md, "Row-kernel steps of 64 rows under blob masks
#: (BLOB_ROW_CHUNK)").
BLOB_ROW_CHUNK = 64


def row_chunk(p: TilePlan, scattered: bool = False) -> int | None:
    """The row kernel's smallest step under ``impl="auto"``, or None for its own
    rule (`dcjax.kernels.rows.row_plan`: `rows.DEFAULT_CHUNK` rows, 16).

    With DeepCache's masks (blobs of dirty pixels, hundreds of them on a
    56x56 or 28x28 map) steps of 16 and 32 rows are matrix products too short
    for XLA:CPU's full speed, and each step size is one more loop body to
    compile; `BLOB_ROW_CHUNK` rows (capped, like the default, near the dense
    threshold of a small map) cut both. With refinement's scattered masks
    (``scattered``) longer steps lost, so they keep the default. See
    docs/performance-notes.md, "Row-kernel steps of 64 rows under blob masks
    (BLOB_ROW_CHUNK)".
    """
    if scattered:
        return None
    threshold = _rows.row_plan(p).dense_threshold
    return min(BLOB_ROW_CHUNK, 8 * math.ceil(threshold / 8))


def rows_pays(p: TilePlan) -> bool:
    """A spatial layer whose input pixels are long enough rows for the row kernel's
    per-tap gathers (`dcjax.kernels.rows`)."""
    return p.cin >= _rows.TAP_ROWS_MIN_CIN


def large_map(p: TilePlan) -> bool:
    """An ungrouped layer with at least `LARGE_MAP_PIXELS` output pixels per image
    and at least `LARGE_MAP_MIN_INTENSITY` multiply-adds per value moved."""
    return (
        p.groups == 1
        and p.ho * p.wo >= LARGE_MAP_PIXELS
        and intensity(p) >= LARGE_MAP_MIN_INTENSITY
    )


def intensity(p: TilePlan) -> float:
    """Multiply-adds of one output pixel over the values a sparse kernel moves for
    it: its receptive field gathered (``kh * kw * Cin``) and its ``Cout`` values
    scattered. Thin layers (EfficientNet-Lite0's 1x1 projections, RGB stems with
    few filters) are memory-bound: skipping a pixel saves little more than moving it.
    """
    k = p.kh * p.kw * p.cin
    return k * p.cout / p.groups / (k + p.cout)


def dense_flops(p: TilePlan) -> float:
    """2 x multiply-adds of the whole convolution."""
    return 2.0 * p.n * p.ho * p.wo * p.cout * p.kh * p.kw * (p.cin // p.groups)
