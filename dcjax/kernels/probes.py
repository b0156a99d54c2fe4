"""Which candidate kernels a layer's tuning measures: each class of layers is
probed on its largest layer, and the kinds that lose there everywhere are not
compiled for the rest of the class.

Contract:

- `layer_class(p, dtype)` is what layers share whose kernels rank alike: the
  window (``kh x kw``), strides, dilation, whether the convolution is full,
  grouped or depthwise, and the dtype. Sizes and channel counts are left out.
- `probes(layers)` picks, among ``{key: (TilePlan, dtype)}``, one layer per
  class: the one of most dense FLOPs (the first of them on a tie). Its
  candidates are all measured.
- `winners(costs, fractions)` takes one layer's measured costs
  (``{candidate name: seconds at each of fractions}``) and returns the names
  of the candidates that cost the least, ties included, at some fraction
  below 1 (where a layer is all dirty every candidate computes it in full).
  The other layers of the class measure the dense candidate and the kinds of
  these winners only (``"rows"`` for ``"rows:64"``: `dcjax.kernels.tuning.tune`).

Why: compiling the candidates is most of a first tuning, and on the zoo's
layers a kind that loses every fraction on a class's largest layer almost
never wins on the others (docs/performance-notes.md, "Candidates probed per
class of layers").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp

from dcjax.kernels.auto import dense_flops
from dcjax.kernels.tiles import TilePlan

__all__ = ["layer_class", "probes", "winners"]


def layer_class(p: TilePlan, dtype: Any) -> tuple:
    """The class of the layer ``p`` computed in ``dtype`` (see the module docstring)."""
    if p.groups == 1:
        grouping = "full"
    elif p.groups == p.cin:
        grouping = "depthwise"
    else:
        grouping = "grouped"
    return (p.kh, p.kw, tuple(p.strides), tuple(p.dilation), grouping, jnp.dtype(dtype).name)


def probes(layers: Mapping[str, tuple[TilePlan, Any]]) -> set[str]:
    """The key of each class's layer of most dense FLOPs among ``layers``."""
    best: dict[tuple, tuple[float, str]] = {}
    for key, (p, dtype) in layers.items():
        c, flops = layer_class(p, dtype), dense_flops(p)
        if c not in best or flops > best[c][0]:
            best[c] = (flops, key)
    return {key for _, key in best.values()}


def winners(costs: Mapping[str, Sequence[float]], fractions: Sequence[float]) -> set[str]:
    """The candidates of least cost at some fraction below 1 (see the module docstring)."""
    out: set[str] = set()
    for i, f in enumerate(fractions):
        if f >= 1.0:
            continue
        least = min(v[i] for v in costs.values())
        out.update(name for name, v in costs.items() if v[i] <= least)
    return out
