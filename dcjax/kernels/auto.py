"""The measured choice behind ``masked_conv(impl="auto")``.

Contract: `choose(plan, backend, scattered=False)` returns ``(impl, tile)``: a concrete
implementation (never "auto" or "pallas") and a tile size or None for the
`tiles.default_tile` rule. The choice depends only on static shapes, so it is
made once at trace time.

The table below was measured with::

    python -m dcjax.kernels.bench                # cache donated (in-place update)
    python -m dcjax.kernels.bench --no-donate    # every call also copies the cache
    python -m dcjax.kernels.bench --tiles 2,3,4,5,7,8,11,14 --fractions 0.1,0.25

on the 2-core CPU of the development machine (jax 0.10.2, XLA:CPU, shared with
other jobs, so minima of interleaved runs were compared), keyed by layer class:

- ``spatial`` (k > 1, groups = 1; AlexNet conv1, ResNet-50 3x3): with at
  least `rows.TAP_ROWS_MIN_CIN` input channels (`rows_pays`), ``rows``: since
  its halving steps and per-tap row gathers it beats the tile kernel on
  ResNet-50's 3x3 layers on 28x28 to 7x7 maps (blob masks at 25 % dirty:
  2.0-3.0x against 0.8-2.1x faster than dense) and matches it on 56x56; end to
  end (``dcjax bench --models resnet50 alexnet googlenet yolo_tiny --methods
  nocache deepcache deepcache+refine --frames 40`` on vtest, two runs each of
  the former and the new choice, alternating): ResNet-50 1.28/1.33x ->
  1.46/1.41x, with refinement 1.47/1.54x -> 1.74/1.77x, YOLO-tiny 1.52/1.45x
  -> 1.65/1.64x, AlexNet 1.04/1.05x -> 1.07/1.08x, GoogLeNet level. With
  fewer channels (AlexNet's conv1 on RGB) ``xla``, the tile kernel: 2.7-4.3x
  faster than dense at 10 % dirty pixels, 1.65-2.3x at 25 %. The row kernel,
  gathering each kernel row's contiguous values at once (`rows._segments`),
  is faster still on these RGB stems (``python -m dcjax.kernels.bench
  --layers resnet50_stem,alexnet_conv1,enet_stem --fractions
  0.05,0.1,0.2,0.3,0.5 --impls xla,rows``: ResNet-50's 7x7/2 stem 0.46-1.39
  against 0.59-2.02 ms, AlexNet's conv1 0.36-1.50 against 0.50-1.62,
  EfficientNet-Lite0's stem 0.25-0.43 against 0.30-0.50), but it reuses every
  reusable pixel where the tile kernel recomputes whole dirty tiles, and
  matched stem pixels are approximate (the matcher's PSNR test). End to end
  over vtest, stems on ``rows`` against ``xla`` (interleaved in one process,
  40-80 frames): the cached steps 1-2 % faster (AlexNet 16.63 -> 16.49 ms,
  GoogLeNet 17.92 -> 17.59, EfficientNet-Lite0 9.52 -> 9.44, ResNet-50 within
  noise) for more error: relative output MSE 1.8e-4 -> 2.9e-4 on AlexNet,
  3.7e-6 -> 4.8e-6 on ResNet-50, and the pretrained EfficientNet-Lite0's top-1
  agreement over the demo's 80 frames 93.8 -> 86.2 %. So the stems stay on
  the tile kernel; with refinement's scattered masks they go to ``rows``.
- ``pointwise`` (1x1; ResNet-50 1x1, MobileNetV2 expansion): memory-bound.
  With one contiguous blob (``--impls xla,rows``) `rows` and `xla` are within
  noise of each other (ResNet-50 1x1: 2.3-2.8x at 10 %, 1.5-1.7x at 25 %); with
  several small blobs, as real frames give, `rows` is ahead because it
  recomputes no reusable pixel of a partly dirty tile (ResNet-50's 1x1 layers
  at 30 % dirty pixels in 5-15-pixel blobs: 1.6-1.9x against 0.7-1.2x). End to
  end, ResNet-50 on vtest: 57-59 ms a frame with `rows` here against 60-62 ms
  with `xla` everywhere. Choice: ``rows``. Both update the cache in place when
  it is donated (the transform carries its caches through a jitted step or a
  `lax.scan`); without donation a copy of the cache (~0.25 ms per 3 MB) is
  added to every call, and a caller that cannot donate may prefer ``"dense"``
  for 1x1 layers.
- ``grouped`` (groups > 1, depthwise included): XLA:CPU's grouped convolution is
  slow (MobileNetV2 depthwise 3x3/2 on 112x112x96: ~9 ms dense; AlexNet conv2,
  groups 2: ~9.5 ms); `xla` computes groups as separate convolutions and
  depthwise as a sum of strided taps: 2.1x (conv2) and 15x (depthwise) faster
  than dense even at 100 %, more below. Choice: ``xla``, except for a few
  groups of at least `rows.TAP_ROWS_MIN_CIN` channels (`rows.computes_groups`:
  AlexNet's conv2), which go to ``rows``: 2.77x against 1.74x faster than
  dense at 25 % dirty pixels in one blob (see `dcjax.kernels.rows`); end to
  end on AlexNet over vtest (40 frames, both choices interleaved in one
  process) DeepCache's step went from 19.09 to 18.12 ms (no cache 20.32 ms) and
  the refined one from 14.69 to 14.00 ms.

(Speedups are ratios of minima over 40 interleaved runs, cache donated unless
said; the machine was shared with other jobs, so medians were noisy.)

Tile: the `tiles.default_tile` rule (4x4 at these sizes) was fastest or within
noise in the tile sweep, so the table leaves it to the rule.

Small layers: the sparse path has a fixed cost per call (the mask reduction,
the dirty list, the loops; about 0.03-0.1 ms on this CPU) while XLA:CPU runs
dense convolutions at roughly 100-150 GFLOP/s, so a layer whose whole dense
convolution is under `SMALL_LAYER_FLOPS` (about 0.3 ms) cannot save more than
it spends: ``"dense"`` (the fast grouped path included). Measured end to end on
pretrained EfficientNet-Lite0 over vtest (most of its 49 convolutions are small)
with ``dcjax bench --models efficientnet_lite0``. The cut was 40 MFLOPs until
the 1x1 heads of EfficientNet-Lite0 and MobileNetV2 (320 -> 1280 channels on
7x7, 40.1 MFLOPs, the only layer either cached) and GoogLeNet's 5x5 of
inception_4e (40.1) were measured on both sides of it (interleaved frame by
frame, medians of the paired differences over 120-200 frames): caching them
cost EfficientNet-Lite0 0.37 ms a frame over vtest (the head's reuse there is
nil: the changed blocks have eroded every 7x7 pixel; 0.22 and, over box, 0.17
ms against ``kernel="dense"``), MobileNetV2 0.13 ms and GoogLeNet 0.27 ms. A cut of
50 MFLOPs would also compute SqueezeNet's 3x3 expansions of fire8 and fire9
(49.8) densely, which cost it 0.46 ms, so the cut is 45 MFLOPs.

Large maps: FLOPs undercount layers on a large map, which are memory-bound on
XLA:CPU, and these early layers are where the matcher's reuse survives
erosion. So an ungrouped layer whose output map has at least
`LARGE_MAP_PIXELS` pixels (56x56) is cached whatever its FLOPs, provided it
does enough arithmetic per value the sparse kernel moves (`intensity`: the
multiply-adds of an output pixel over the values gathered and scattered for
it, ``kh * kw * Cin`` in and ``Cout`` out, at least `LARGE_MAP_MIN_INTENSITY`).
When the rule was set, EfficientNet-Lite0's stem (3x3/2 from 3 channels to
112x112x32, 22 MFLOPs) took 1.2-1.4 ms and its first expansion (1x1 from 16 to
96 channels at 112x112, 39 MFLOPs) 1.4-1.8 ms of a 14-16 ms frame, and caching
every such layer took the pretrained model over vtest from 0.88-0.92x to
1.02-1.11x (``dcjax bench --models efficientnet_lite0 --methods nocache
deepcache --frames 40``). Since the dense path computes narrow 1x1 layers as
matrix products, those layers take 0.1-0.5 ms and the sparse kernels no
longer beat them at the dirty fractions vtest gives them (``python -m
dcjax.kernels.bench --layers
resnet50_1x1_64,mbv2_pw_expand,enet_b0_project,enet_b1_expand,enet_stem
--fractions 0.1,0.2,0.4``, medians of 30 interleaved calls, speedup over dense
of the faster of ``xla`` and ``rows`` at about 10 / 20 / 40 % dirty pixels):
EfficientNet-Lite0's first projection (32 -> 16, intensity 10.7) 0.79 / 0.66 /
0.53x, first expansion (16 -> 96, 13.7) 0.92 / 0.78 / 0.44x, its stem on the
tile kernel (14.6) 1.07 / 0.89 / 0.84x, MobileNetV2's 24 -> 144 expansion at
56x56 (20.6) 1.03 / 0.78 / 0.58x, against 1.16 / 1.22 / 0.57x for the
64 -> 64 1x1 layer at 56x56 of ResNet-50 and GoogLeNet (intensity 32). End
to end, with EfficientNet-Lite0's thin large-map layers computed densely
(both rules interleaved frame by frame in one process, 80 frames), its
cached step's median changed by -0.26, -0.20, -0.05 and +0.44 ms (the last
in a slow process) against caching them in four runs over vtest and by
-0.11 ms over box, and its top-1 agreement with the uncached model (over the
79 frames after the first) went from 93.7 to 100 % over vtest and from 50.6
to 79.7 % over box (features reused from nearly equal pixels flip its
near-tied top-1: see docs/benchmarks.md). For the 64 -> 64 layer, which keeps the
exception, dropping it left ResNet-50 level (-1.4, +0.2, +1.0 ms) and slowed
GoogLeNet by 0.1-1.1 ms in three pairs of runs each.

Scattered masks: refinement (`dcjax.transforms.refine`) makes reuse masks
scattered at pixel level inside the network, where a tile-granular kernel
finds almost every tile dirty. With ``scattered=True`` every spatial layer
goes to ``rows``, whatever its channels. Measured end to end on ResNet-50 over vtest with
``RefineConfig(delta=0.05)`` and ``0.1`` (20 frames, medians of one run):
54.8 and 50.8 ms a frame with ``rows`` on every layer against 59.4 and 57.7
ms with the tile kernel on spatial layers.
The exception is a layer `dcjax.kernels.xla.taps_pays` picks (YOLO-tiny's
stem, 3x3 from RGB to 16 channels at 448x448), whose dense path and tile
steps are a fused sum of 27 elementwise terms: on the 2-core Intel Xeon of a
later session (``python -m dcjax.kernels.bench --layers yolo_stem --impls
xla,rows``, blob masks, medians of 20) the row kernel took 2.3-5.0 ms at 5-40 %
dirty pixels against 2.1-2.7 ms dense and 1.0-2.4 ms for the tile kernel, so
it stays on ``xla``; the ``delta`` method (every stem refined) on YOLO-tiny
over vtest, interleaved over 30 frames, was 1.6 ms a frame faster with this
rule and the sum of taps than with neither.

Cores: XLA:CPU spreads a dense convolution over every core, but runs the body
of a sparse kernel's loop on one (larger chunks did not change that, and two
independent loops do not run concurrently). The measurements above were taken
on 2 cores; on one core (``dcjax bench --cpus 1``) ResNet-50's cached step over
vtest reached its FLOP ideal (1.60x), against 1.35x on two. On the 2-core Intel Xeon
(AVX-512) of a later session a matrix product inside a loop did use both
cores (1024 x 2304 by 2304 x 256, medians of 40 calls: 5.3 ms at the top
level, 5.8 in a loop of one trip or a conditional, 8.7-9.0 ms on one core),
so there the loop bodies' single thread is not what limits the sparse
kernels; their gathers and scatters are.

XLA:CPU's convolution library: jaxlib 0.10.2 runs convolutions and dots
through YNNPACK by default; with ``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=``
they go to Eigen, which on the development CPU runs ResNet-50's dense
convolutions about twice as fast (1x1 on 56x56x256: 1.0 to 0.47 ms) and leaves
the sparse kernels' loop bodies where they were (`rows` at 10 %: 0.37 ms
either way). The table above was measured with the default. Under Eigen
(``python -m dcjax.kernels.bench --fractions 0.1,0.3,0.5``) the sparse path
still wins at 10 % (ResNet-50 3x3 `xla` 2.95x, 1x1 `xla` 1.6x, `rows` 1.27x)
but 1x1 layers break even near 30 % with a single blob. End to end (ResNet-50
on vtest under Eigen, 25 frames) raising the dense cut-offs to 0.8 gained 1 %
and lowering them to 0.2 lost 6 % (43.1 and 46.2 against 43.6 ms a frame), so
one table serves both.

GPU: measured on one H100 (jax 0.11.2, the device image's; ``python -m
dcjax.kernels.bench --impls xla,pallas --precision default``, 20 calls queued
per sample). The Pallas (Triton) kernel ran every layer class at 0.04-0.11 ms a
call from 0 to 100 % dirty pixels, 1.3-2.0x faster than XLA's dense convolution
call and 2-13x faster than the ``xla`` tile kernel, whose gathers, scatters and
loops cost 0.1-1.0 ms there. At these sizes every variant's arithmetic takes
microseconds on an H100, so these times are launch and dispatch: what a
per-frame step pays. End to end (``dcjax bench`` on vtest) the cached ResNet-50
step went from 21.5 ms with ``xla`` to 9.2 ms with ``pallas`` before the other
GPU changes of the same session. Choice on GPU: ``pallas_gpu`` for every class
(depthwise layers with a channel multiplier fall back to ``xla`` inside it)...

...except small layers. End to end the cached step with Pallas kernels on every
reused layer stayed 0.33-0.55x of no cache on every zoo model over vtest (one
H200, ``dcjax bench``; README), because around each kernel the step adds its
mask propagation, tile lists and launches, while the whole dense network at
224x224 runs in 0.6-3 ms, bound by launches, not arithmetic. Computing the
layers densely instead (``dcjax bench --models resnet50 efficientnet_lite0
--videos vtest box --methods nocache deepcache deepcache:kernel=dense --frames
20``, one H200): ResNet-50 over vtest 0.45x -> 0.76x, EfficientNet-Lite0 0.65x
-> 0.75x (top-1 agreement 95 -> 100 %), and over box, where still frames are
skipped whole (`dcjax.deepcache.Config.skip_unchanged`), 1.47x -> 1.48x and
1.45x -> 1.58x, with 0.2 MiB of state instead of 43 and 26 MiB. So on GPU a
layer under `GPU_SMALL_LAYER_FLOPS` dense FLOPs runs dense: at the H100/H200's
convolution speed such a layer takes about as long dense as the sparse path's
fixed cost per call above (0.04-0.11 ms); every layer of the zoo at its
published input size is under it. Larger layers (high-resolution frames) keep
the Pallas kernel; where the crossover lies was not measured.

TPU: no TPU was lent, so nothing was measured; it gets the portable ``xla``
kernel.
"""

from __future__ import annotations

import math

from dcjax.kernels import rows as _rows
from dcjax.kernels import xla as _xla
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
    "row_chunk",
    "rows_pays",
]

#: Layers with fewer dense FLOPs than this run dense on CPU (see above)...
SMALL_LAYER_FLOPS = 45e6

#: ...unless ungrouped with at least this many output pixels per image...
LARGE_MAP_PIXELS = 56 * 56

#: ...and at least this `intensity` (multiply-adds per value moved).
LARGE_MAP_MIN_INTENSITY = 24.0

#: Layers with fewer dense FLOPs than this run dense on GPU (see above).
GPU_SMALL_LAYER_FLOPS = 4e9

#: (backend, layer class) -> (impl, tile or None). Missing rows fall back to "xla".
TABLE: dict[tuple[str, str], tuple[str, tuple[int, int] | None]] = {
    ("cpu", "spatial"): ("xla", None),
    ("cpu", "pointwise"): ("rows", None),
    ("cpu", "grouped"): ("xla", None),
    ("gpu", "spatial"): ("pallas_gpu", None),
    ("gpu", "pointwise"): ("pallas_gpu", None),
    ("gpu", "grouped"): ("pallas_gpu", None),
}


def layer_class(p: TilePlan) -> str:
    """ "pointwise", "grouped" or "spatial" (see the module docstring)."""
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
    if backend == "gpu" and dense_flops(p) < GPU_SMALL_LAYER_FLOPS:
        return "dense", None
    if (
        backend == "cpu"
        and layer_class(p) == "spatial"
        and (scattered or rows_pays(p))
        and not _xla.taps_pays(p)
    ):
        return "rows", None
    if backend == "cpu" and layer_class(p) == "grouped" and _rows.computes_groups(p.cin, p.groups):
        return "rows", None
    return TABLE.get((backend, layer_class(p)), ("xla", None))


#: Smallest step of the row kernel (rows) where the masks are blobs (see `row_chunk`).
BLOB_ROW_CHUNK = 64


def row_chunk(p: TilePlan, scattered: bool = False) -> int | None:
    """The row kernel's smallest step under ``impl="auto"``, or None for its own
    rule (`dcjax.kernels.rows.row_plan`: `rows.DEFAULT_CHUNK` rows, 16).

    With DeepCache's masks (blobs of dirty pixels, hundreds of them on a
    56x56 or 28x28 map) steps of 16 and 32 rows are matrix products too short
    for XLA:CPU's full speed, and each step size is one more loop body to
    compile; `BLOB_ROW_CHUNK` rows (capped, like the default, near the dense
    threshold of a small map) cut both. Measured on the 2-core Intel Xeon,
    the default step against 64 rows on every row-kernel layer, interleaved
    frame by frame over vtest (`dcjax.deepcache` at default settings, medians
    of the paired differences over 55-75 frames): ResNet-50 -1.27 and -1.47
    ms a frame (of about 60-70), with 128 rows -1.74; AlexNet -0.62;
    GoogLeNet -0.32; YOLO-tiny +0.08 (level). ResNet-50's step compiled in
    33 s instead of 52. With refinement's scattered masks 64 rows lost (+1.1
    and +2.2 ms on ResNet-50, 32 rows +1.4), so they keep the default.
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
