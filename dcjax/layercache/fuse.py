"""Shared stems (Mainstream): models that see the same frame compute their common
first layers once.

Contract: `fuse(models, x_like)` takes ``(fn, params)`` pairs, splits each at its
layers (`dcjax.layercache.split`) and finds the longest common prefix of
segments that are the same computation on layers with the same content keys
(`dcjax.layercache.store.layer_key`). `Fused.fn(params, x)` (``params`` the
tuple `Fused.params`) returns the tuple of every model's outputs, equal to
calling each model on ``x``: the prefix is computed once, with the first
model's parameters, then each model's own rest from the prefix's values. It is
a plain JAX function that binds the models' own primitives, so ``jax.jit`` and
``dcjax.transform`` take it, and the transformed step caches the stem once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from dcjax.layercache.split import Op, Split, _run, const_name, op_signature, split
from dcjax.layercache.store import layer_key

__all__ = ["Fused", "fuse"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fused:
    """Models fused at their common stem.

    Attributes:
        fn: ``fn(params, x) -> tuple`` of the models' outputs.
        params: the models' parameters, as a tuple (what ``fn`` takes).
        stem_segments: how many leading segments are computed once.
        stem_layers: the layers of the stem (names in the first model).
        splits: each model's `Split`.
    """

    fn: Callable[[Any, Any], tuple[Any, ...]]
    params: tuple[Any, ...]
    stem_segments: int
    stem_layers: tuple[str, ...]
    splits: tuple[Split, ...]


def _keys(sp: Split, params: Any) -> dict[str, str]:
    """Layer name -> content key, from the parameter values."""
    layers: dict[str, dict[str, np.ndarray]] = {}
    for (layer, tensor), leaf in zip(
        sp.leaf_layers, jax.tree_util.tree_leaves(params), strict=True
    ):
        layers.setdefault(layer, {})[tensor] = np.asarray(leaf)
    return {layer: layer_key(t) for layer, t in layers.items()}


class _Canon:
    """Canonical names of one model's value ids, for comparing segments across
    models whose ids are numbered differently."""

    def __init__(self, sp: Split, keys: dict[str, str]) -> None:
        self.names: dict[int, Any] = {}
        self.ids: dict[Any, int] = {}
        for pid, (layer, tensor) in zip(sp.param_ids, sp.leaf_layers, strict=True):
            self.names[pid] = ("param", keys[layer], tensor)
        for i, xid in enumerate(sp.input_ids):
            self.names[xid] = ("input", i)
        for cid, value in sp.consts.items():
            self.names[cid] = const_name(value)
        self.count = 0

    def signature(self, ops: Sequence[Op]) -> list[Any]:
        """The segment's operations with canonical operands; names the values they
        define (in order) as it goes."""
        return [op_signature(op, self.names, self._name) for op in ops]

    def _name(self, value_id: int) -> Any:
        name = ("value", self.count)
        self.count += 1
        self.ids[name] = value_id
        return name


def fuse(models: Sequence[tuple[Callable[[Any, Any], Any], Any]], x_like: Any) -> Fused:
    """Fuses ``models`` (``(fn, params)`` pairs on the same input) at their common
    stem (module docstring)."""
    if len(models) < 1:
        raise ValueError("dcjax: fuse needs at least one model")
    splits = [split(fn, params, x_like) for fn, params in models]
    canons = [_Canon(sp, _keys(sp, params)) for sp, (_, params) in zip(splits, models, strict=True)]
    stem = 0
    for k in range(min(len(sp.segments) for sp in splits)):
        sigs = [c.signature(sp.segments[k].ops) for c, sp in zip(canons, splits, strict=True)]
        if any(s != sigs[0] for s in sigs[1:]):
            break
        stem = k + 1
    stem_ops = [op for seg in splits[0].segments[:stem] for op in seg.ops]
    stem_defined = [o for op in stem_ops for o in op.outputs]
    # model i's id of each value the stem defines, through the canonical names
    first = canons[0]
    maps = [
        {c.ids[first.names[o]]: o for o in stem_defined if first.names[o] in c.ids} for c in canons
    ]
    rests = [[op for seg in sp.segments[stem:] for op in seg.ops] for sp in splits]

    def fused(params: Sequence[Any], x: Any) -> tuple[Any, ...]:
        xs = jax.tree_util.tree_leaves(x)
        sp0 = splits[0]
        flat0 = jax.tree_util.tree_leaves(params[0])
        stem_vals = _run(stem_ops, sp0.input_ids, sp0.param_ids, stem_defined, xs, flat0,
                         sp0.consts, lowered=False) if stem_ops else []  # fmt: skip
        by_id0 = dict(zip(stem_defined, stem_vals, strict=True))
        outs = []
        for sp, mapping, rest, p in zip(splits, maps, rests, params, strict=True):
            env_ids = list(mapping) + list(sp.input_ids)
            env_vals = [by_id0[mapping[i]] for i in mapping] + xs
            wanted = [o for o in sp.output_ids if not isinstance(o, tuple)]
            vals = _run(rest, env_ids, sp.param_ids, wanted, env_vals,
                        jax.tree_util.tree_leaves(p), sp.consts, lowered=False)  # fmt: skip
            got = dict(zip(wanted, vals, strict=True))
            flat = [o[1] if isinstance(o, tuple) else got[o] for o in sp.output_ids]
            outs.append(jax.tree_util.tree_unflatten(sp.out_tree, flat))
        return tuple(outs)

    stem_layers = tuple(lay for seg in splits[0].segments[:stem] for lay in seg.layers)
    return Fused(fn=fused, params=tuple(p for _, p in models), stem_segments=stem,
                 stem_layers=stem_layers, splits=tuple(splits))  # fmt: skip
