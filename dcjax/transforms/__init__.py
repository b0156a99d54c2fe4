"""Jaxpr transforms: trace a model, analyse it, and evaluate it with reuse.

What the subpackage offers, lowest first:

- `trace`: `trace_model` traces a Flax module or ``fn(variables, x)`` into a
  closed jaxpr with the frame as its last input (`TracedModel`).
- `spatial`: `Spatial`, a variable's spatial signature (where the frame's H
  and W are, their sizes, the stride relative to the frame).
- `recognisers`: an operation's geometry along H and W (a windowed op's
  `Window`, a constant gather's `Pick`, a resampling matrix's `LinearMap`).
- `signature_rules`: one rule per primitive deriving the outputs' signatures
  (`SIGNATURE_RULES`).
- `calls`: the call-like primitives whose sub-jaxpr is analysed in place.
- `records`: the analysis records `Analysis`, `EqnInfo`, `Layer` (a reused
  convolution) and `DenseLayer` (a fully connected layer).
- `patterns`: each layer's fusable elementwise epilogue, and fully
  connected layers.
- `variation`: where frame-independent values (parameters, constants) vary,
  and which outputs hold content anchored to image positions.
- `analysis`: `analyze`, the pass that fills the records once per model.
- `regions`: the reuse-mask rules, one per primitive (`MASK_RULES`).
- `lowering`: faster XLA:CPU forms of a few primitives, the same results.
- `motion`: `FrameContext`, a frame's motion as the mask rules see it (the
  shift at each stride, `ALIGNMENTS`), and mask layout helpers.
- `interpreter`: the caching interpreter (`evaluate` a jaxpr, reusing cached
  layer outputs where their masks allow), driven by one `Policy` object and
  returning per-layer results.
- `queries`: per-layer questions asked of an analysis (which layers read a
  cache, read the frame, share an input; epilogues; inverted-residual chains).
- `refine`: the bounded-error change test inside the network (rules, error
  bounds); `refiners`: the tests of one frame, as the step runs them.
- `exits`: semantic exit points (`exit_point`, `marked`) and the evaluation
  that skips the layers after a taken exit.
- `host_syncs`: a program's data-dependent control flow, what XLA:GPU reads
  on the host (`host_syncs`, `HostSync`).

The names below are re-exported here; the rest is imported from its module.
"""

from dcjax.transforms.analysis import analyze
from dcjax.transforms.exits import exit_point, marked
from dcjax.transforms.records import Analysis, DenseLayer, EqnInfo, Layer
from dcjax.transforms.spatial import Spatial
from dcjax.transforms.trace import TracedModel, trace_model

__all__ = [
    "Analysis",
    "DenseLayer",
    "EqnInfo",
    "Layer",
    "Spatial",
    "TracedModel",
    "analyze",
    "exit_point",
    "marked",
    "trace_model",
]
