"""The planning pass: what the cached step does at each layer, decided once.

`make_plan(analysis, config, backend)` reads the analysed model
(`dcjax.transforms.analyze`) and the `Config` and returns a `Plan` of frozen
per-layer records. It is pure: the same inputs give the same plan, and nothing
is traced or compiled. Every per-layer decision of the step is made here:

- `LayerPlan.keeps_cache`: whether the layer's kernel reads a cache
  (`dcjax.kernels.reads_cache`). A layer computed in full without a select
  keeps none: every plain layer under ``kernel="dense"``, small layers on CPU
  under ``"auto"`` (`dcjax.kernels.auto`), transposed and other non-NHWC
  convolutions under every kernel but ``"reference"``, every layer when
  semantic exits never reuse, and the expansion and depthwise layers of an
  inverted-residual chain (`Config.fuse_blocks`), computed on dirty tiles with
  the chain's projection, which alone keeps a cache.
- `LayerPlan.refined` and `LayerPlan.ref_owner`: whether the change test of
  `Config.refine` runs at the layer's input (only where the layer keeps a
  cache: a layer computed in full has nothing to reuse), and which layer owns
  the test of a feature map several refined layers read.
- `LayerPlan.epilogue`: the primitives of the elementwise chain cached with the
  layer (`Config.fuse_epilogues`; not with the Pallas TPU kernel or semantic
  exits).
- `LayerPlan.chain`: the inverted-residual chain the layer belongs to.
- `DensePlan`: whether a fully connected layer is updated by the rows of its
  changed inputs (refinement, or exactly with `Config.dense_updates` on CPU).
- `Plan.skips_still`: whether a still frame skips the network
  (`Config.skip_unchanged`; not with semantic exits, nor where a primitive has
  no mask rule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from dcjax.config import Config
from dcjax.kernels.tuning import KernelChoice
from dcjax.transforms import queries
from dcjax.transforms import refine as refine_lib
from dcjax.transforms.records import Analysis, DenseLayer, Layer

__all__ = ["DensePlan", "LayerPlan", "Plan", "make_plan"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerPlan:
    """What the step does at one reused layer (a convolution).

    Attributes:
        layer: the layer's static facts.
        keeps_cache: whether its kernel reads a cache (else: computed in full,
            no state).
        refined: whether its input gets refinement's change test.
        ref_owner: the layer whose test and reference it shares (itself when
            none, and for layers that are not refined).
        epilogue: primitive names of the elementwise chain cached with it;
            empty where none is.
        chain: ``(expansion, depthwise, projection)`` of the inverted-residual
            chain it belongs to, or None.
        reads_frame: whether its input comes from the frame with no reused
            layer in between.
        kernel: the measured kernel choice (`dcjax.kernels.tuning`), or None
            where ``Config.kernel`` applies as it is.
        tested_alone: a refined layer that reads the frame (``reads_frame``),
            with ``delta > 0``: its input's mask is the matcher's, which
            passes blocks by PSNR; it reuses where its own change test passes
            only (`transforms.refiners`), so that refinement's error bound
            holds at every output it reuses. (``delta == 0`` tests nothing:
            plain DeepCache.)
    """

    layer: Layer
    keeps_cache: bool
    refined: bool = False
    ref_owner: int
    epilogue: tuple[str, ...] = ()
    chain: tuple[int, int, int] | None = None
    reads_frame: bool = False
    tested_alone: bool = False
    kernel: KernelChoice | None = None

    @property
    def owns_reference(self) -> bool:
        """Whether the state keeps a reference of this layer's input."""
        return self.refined and self.ref_owner == self.layer.index

    @property
    def deferred(self) -> bool:
        """A chain's expansion or depthwise layer: computed with the chain's projection."""
        return self.chain is not None and self.layer.index != self.chain[2]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DensePlan:
    """What the step does at one fully connected layer (`DenseLayer`).

    Attributes:
        layer: the layer's static facts.
        updated: whether its product is updated by the rows of the changed
            inputs (else computed in full).
        exact: whether exactly unchanged inputs count as unchanged
            (`Config.dense_updates`).
        delta: its refinement threshold (0 where it is not refined).
    """

    layer: DenseLayer
    updated: bool = False
    exact: bool = False
    delta: float = 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """The per-layer decisions of a cached step (see the module docstring).

    Attributes:
        layers: one `LayerPlan` per reused layer, in execution order.
        dense: one `DensePlan` per fully connected layer, in execution order.
        refines: whether refinement is on (`Config.refine`).
        keeps_dense_state: whether the state carries the fully connected
            layers' references (refinement, or any exact update).
        semantic_dense: semantic exits that never reuse: no layer keeps a cache.
        skips_still: whether a still frame skips the network.
        unsupported: primitives without a mask rule.
        total_flops: FLOPs of a full recompute (convolutions and matrix products).
        other_flops: FLOPs computed on every frame outside the reused layers.
    """

    layers: tuple[LayerPlan, ...]
    dense: tuple[DensePlan, ...]
    refines: bool
    keeps_dense_state: bool
    semantic_dense: bool
    skips_still: bool
    unsupported: tuple[str, ...]
    total_flops: int
    other_flops: int

    @property
    def keeps_cache(self) -> tuple[bool, ...]:
        return tuple(lp.keeps_cache for lp in self.layers)

    @property
    def refined(self) -> tuple[bool, ...]:
        return tuple(lp.refined for lp in self.layers)

    @property
    def epilogues(self) -> tuple[tuple[str, ...], ...]:
        return tuple(lp.epilogue for lp in self.layers)

    @property
    def chains(self) -> Mapping[int, tuple[int, int, int]]:
        """Layer -> its chain, for the layers in an inverted-residual chain."""
        return {lp.layer.index: lp.chain for lp in self.layers if lp.chain is not None}

    @property
    def updated_dense(self) -> tuple[bool, ...]:
        return tuple(d.updated for d in self.dense)


def make_plan(
    analysis: Analysis,
    config: Config,
    backend: str,
    kernels: Sequence[KernelChoice | None] | None = None,
) -> Plan:
    """The `Plan` of ``analysis`` under ``config`` on ``backend`` ("cpu", "gpu", "tpu").

    ``kernels``: per layer, a measured choice (`dcjax.autotune`) that replaces
    ``config.kernel`` there (None: ``config.kernel`` applies).
    """
    layers, dense_layers = tuple(analysis.layers), tuple(analysis.dense_layers)
    n = len(layers)
    kernels = (None,) * n if kernels is None else tuple(kernels)
    if len(kernels) != n:
        raise ValueError(f"dcjax: make_plan got {len(kernels)} kernel choices for {n} layers")
    semantic = config.semantic is not None
    semantic_dense = semantic and config.psnr_threshold == float("inf")
    prior = queries.layers_reading_cache(analysis, config.kernel)
    keeps = tuple(
        keep if k is None else k.keeps_cache for keep, k in zip(prior, kernels, strict=True)
    )
    if semantic_dense:
        keeps = (False,) * n
    reads_frame = queries.reads_frame(analysis)
    refined = (False,) * n
    if config.refine is not None:
        wanted = refine_lib.refined_layers(
            layers,
            config.refine,
            dense_layers,
            reads_frame=reads_frame,
            matcher=config.matcher != "none",
        )
        refined = tuple(on and keep for on, keep in zip(wanted, keeps, strict=True))
    owners = queries.shared_inputs(analysis, refined)
    # the Pallas TPU kernel takes no epilogue (`dcjax.kernels.masked_conv`)
    tpu_pallas = config.kernel == "pallas_tpu" or (config.kernel == "pallas" and backend == "tpu")
    fused = config.fuse_epilogues and not semantic and not tpu_pallas
    chains = queries.conv_chains(analysis) if config.fuse_blocks and fused else {}
    keeps = tuple(keep if i not in chains else i == chains[i][2] for i, keep in enumerate(keeps))
    epilogues = queries.layer_epilogues(analysis)
    exact = _exact_updates(dense_layers, config, backend)
    layer_plans = tuple(
        LayerPlan(
            layer=layer,
            keeps_cache=keeps[i],
            refined=refined[i],
            ref_owner=owners[i],
            epilogue=epilogues[i] if fused and (keeps[i] or i in chains) else (),
            chain=chains.get(i),
            reads_frame=reads_frame[i],
            tested_alone=refined[i] and reads_frame[i] and config.refine.delta > 0,
            kernel=kernels[i],
        )
        for i, layer in enumerate(layers)
    )
    return Plan(
        layers=layer_plans,
        dense=_dense_plans(dense_layers, config, exact),
        refines=config.refine is not None,
        keeps_dense_state=config.refine is not None or any(exact),
        semantic_dense=semantic_dense,
        # A still frame skips the network only where the analysis covers every
        # primitive: an unsupported one is recomputed in full whatever the masks;
        # nor where a refined layer reads the frame: its change test, not the
        # matcher, decides whether its input is still.
        skips_still=config.skip_unchanged
        and not semantic
        and not analysis.unsupported
        and not any(lp.tested_alone for lp in layer_plans),
        unsupported=tuple(sorted(analysis.unsupported)),
        total_flops=sum(layer.flops for layer in layers) + analysis.other_flops,
        other_flops=analysis.other_flops,
    )


def _exact_updates(dense_layers, config: Config, backend: str) -> tuple[bool, ...]:
    """Per fully connected layer, whether `Config.dense_updates` updates it
    exactly: the large layers (`refine.auto_dense`), on CPU, without exits."""
    if config.dense_updates and config.semantic is None and backend == "cpu":
        return refine_lib.auto_dense(dense_layers)
    return (False,) * len(dense_layers)


def _dense_plans(dense_layers, config: Config, exact: tuple[bool, ...]) -> tuple[DensePlan, ...]:
    refined = (
        refine_lib.refined_dense(dense_layers, config.refine)
        if config.refine is not None
        else (False,) * len(dense_layers)
    )
    return tuple(
        DensePlan(
            layer=d,
            updated=on or ex,
            exact=ex,
            delta=config.refine.delta if on else 0.0,
        )
        for d, on, ex in zip(dense_layers, refined, exact, strict=True)
    )
