"""The analysis records: what `dcjax.transforms.analysis.analyze` finds.

`Analysis` holds a traced model's signatures and one `EqnInfo` per equation
(recursively, for call-like equations); `Layer` (a reused convolution) and
`DenseLayer` (a fully connected layer) are the static facts the cached step,
its planning and the evaluation harness read. `EqnInfo` is filled in place
while the analysis walks the jaxpr; `Layer`, `DenseLayer` and `Analysis` are
not changed once built.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jax.extend import core as jcore

from dcjax.transforms.spatial import Spatial

__all__ = ["Analysis", "DenseLayer", "EqnInfo", "Layer"]


@dataclasses.dataclass(kw_only=True)
class EqnInfo:
    """What the analysis knows about one equation (filled in while it walks).

    Attributes:
        in_sigs, out_sigs: the operands' and outputs' signatures (None where
            not spatial).
        dynamic: whether the equation depends on the frame.
        layer: the index of the reused layer it computes (`Analysis.layers`).
        sub: the analysis of its sub-jaxpr (a frame-dependent call-like
            equation, `dcjax.transforms.calls`).
        supported: False where spatial operands met no signature rule.
        in_consts: the operands' values where folded to constants, else None.
        epilogue: a layer's fused epilogue, equation indices in order (the
            last gives the value; `dcjax.transforms.patterns.find_epilogues`).
        fused_into: for an epilogue's equation, the index of its layer's.
        dense: the index of the fully connected layer it computes
            (`Analysis.dense_layers`).
        anchored: whether the output's H and W carry content of a parameter
            or constant fixed to image positions (`dcjax.transforms.variation`):
            reusable only where the shift along that axis is zero.
    """

    in_sigs: list
    out_sigs: list
    dynamic: bool
    layer: int | None = None
    sub: Analysis | None = None
    supported: bool = True
    in_consts: list | None = None
    epilogue: tuple[int, ...] = ()
    fused_into: int | None = None
    dense: int | None = None
    anchored: tuple[bool, bool] = (False, False)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Layer:
    """A reused operation (a convolution by default) and its static facts.

    Attributes:
        index: position in `CachedModel.layers` and in the state's caches.
        name: module path from the trace (Flax name stack) or ``conv{index}``.
        primitive: the primitive's name.
        in_shape, out_shape: operand and output shapes.
        in_signature, signature: spatial signatures of input and output.
        kernel: window size along (H, W); strides, padding, dilation, groups.
        flops: multiply-adds x 2 of a full recompute.
        in_channels, out_channels: feature sizes of input and output.
    """

    index: int
    name: str
    primitive: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    in_signature: Spatial
    signature: Spatial
    kernel: tuple[int, int]
    strides: tuple[int, int]
    padding: tuple[tuple[int, int], tuple[int, int]]
    dilation: tuple[int, int]
    groups: int
    flops: int
    in_channels: int = 0
    out_channels: int = 0
    dtype: Any = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class DenseLayer:
    """A fully connected layer: ``x @ W`` on one frame-dependent vector.

    A ``dot_general`` whose left operand depends on the frame and has no
    spatial signature (a flattened or pooled feature map), of shape ``(1, ...,
    K)`` with every leading axis of size 1, contracting its last axis with
    the first axis of a constant ``(K, N)`` matrix (Flax's ``nn.Dense``).
    Under refinement (`dcjax.transforms.refine`) its product is updated by
    the rows of ``W`` whose input changed; otherwise it is computed in full
    like every other matrix product.

    Attributes:
        index: position in `CachedModel.dense_layers`.
        name: module path from the trace (Flax name stack) or ``dense{index}``.
        in_features, out_features: ``K`` and ``N``.
        flops: multiply-adds x 2 of the product.
        dtype: the product's dtype.
    """

    index: int
    name: str
    in_features: int
    out_features: int
    flops: int
    dtype: Any = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Analysis:
    """Signatures of a jaxpr's variables and per-equation facts.

    Attributes:
        jaxpr: the analysed closed jaxpr.
        in_sigs, out_sigs: the signatures of its inputs and outputs.
        eqns: one `EqnInfo` per equation of ``jaxpr``, in order.
        layers: the reused layers (`Layer`) of the whole model, sub-jaxprs
            included, in execution order (shared by nested analyses).
        unsupported: names of primitives with spatial operands and no rule.
    """

    jaxpr: jcore.ClosedJaxpr
    in_sigs: list
    out_sigs: list
    eqns: list[EqnInfo]
    layers: list[Layer]
    unsupported: set[str]
    #: FLOPs of the convolutions that are not reused layers and of every
    #: matrix product (fully connected layers), computed on every frame.
    other_flops: int
    #: the fully connected layers among those matrix products (`DenseLayer`).
    dense_layers: list[DenseLayer] = dataclasses.field(default_factory=list)
