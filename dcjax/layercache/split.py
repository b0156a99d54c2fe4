"""A model's computation split at its layers: segments that each need one layer's
parameters (or none), run one after another.

Contract: `split(fn, params_like, x_like)` traces ``fn(params, x)`` to a jaxpr,
inlines call-like equations (``jit``, ``remat``, custom derivatives: the
primitives `dcjax.transforms.calls` lists) and cuts the equation list wherever
an equation reads a parameter of a layer (`dcjax.layercache.store.layer_of`)
other than the current segment's. Equations that read no parameter stay in the
current segment. An equation that reads several layers (a loop over stacked
weights, say) keeps them together in one segment. Each `Segment` is compiled on
its own (`Segment.fn`): it takes the values it reads from earlier segments and
its layers' parameters, and returns the values later segments or the model's
outputs read. Operations are computed as dcjax's dense step computes them
(convolutions by `dcjax.kernels.masked.dense_conv_eqn`, the rest through
`dcjax.transforms.lowering.bind`), so a layer-wise run costs what the dense step
costs plus the cuts. Running the segments in order on the same inputs gives the
model's outputs (checked against ``fn`` by the tests).

A model whose parameters all end up in one segment cannot be split; `Split.whole`
says so and why, and the executor then runs it whole.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from dcjax.kernels.masked import dense_conv_eqn
from dcjax.layercache.store import layer_of
from dcjax.transforms import lowering
from dcjax.transforms.calls import sub_jaxpr

__all__ = ["Op", "Segment", "Split", "split"]

_CONV = "conv_general_dilated"
_DOT = "dot_general"


@dataclasses.dataclass(frozen=True)
class Op:
    """One primitive application with its operands as value ids (or literals)."""

    eqn: jcore.JaxprEqn
    inputs: tuple[Any, ...]  # int ids, or ("lit", value)
    outputs: tuple[int, ...]

    @property
    def primitive(self) -> Any:
        return self.eqn.primitive

    @property
    def params(self) -> dict[str, Any]:
        return self.eqn.params


@dataclasses.dataclass(frozen=True, kw_only=True)
class Segment:
    """A run of operations that needs at most one layer's parameters.

    Attributes:
        layers: the layer names whose parameters it reads (one, none, or several
            that one operation reads together).
        reads: ids of values computed before it (or the model's input) it reads.
        params: ids of the parameter leaves it reads.
        writes: ids of values it computes that later segments or the outputs read.
        frees: ids of the values it reads that nothing after it reads (neither a
            later segment nor the outputs; never the model's inputs): the
            executor drops them once the segment is dispatched, so that their
            buffers are reused rather than fresh pages allocated for every
            segment's outputs.
        kinds: primitive names of its heavy operations (``conv_general_dilated``,
            ``dot_general``): DeepEye's split into convolutional and fully
            connected parts.
        fn: the compiled ``fn(reads, params) -> writes`` (lists of arrays).
    """

    layers: tuple[str, ...]
    reads: tuple[int, ...]
    params: tuple[int, ...]
    writes: tuple[int, ...]
    frees: tuple[int, ...]
    kinds: frozenset[str]
    ops: tuple[Op, ...]
    fn: Callable[[Sequence[Any], Sequence[Any]], list[Any]]

    @property
    def is_dense(self) -> bool:
        """A fully connected segment: matrix products and no convolution."""
        return _DOT in self.kinds and _CONV not in self.kinds


@dataclasses.dataclass(frozen=True, kw_only=True)
class Split:
    """A model split at its layers.

    Attributes:
        segments: in execution order.
        param_ids: the id of each parameter leaf, in flattening order.
        leaf_layers: per parameter leaf, ``(layer, tensor)``.
        input_ids: ids of the model's non-parameter inputs.
        output_ids: ids (or literals) of the model's outputs.
        out_tree: the outputs' tree structure.
        consts: ids of the jaxpr's constants and their values.
        whole: why the model cannot be split, or None.
    """

    segments: tuple[Segment, ...]
    param_ids: tuple[int, ...]
    leaf_layers: tuple[tuple[str, str], ...]
    input_ids: tuple[int, ...]
    output_ids: tuple[Any, ...]
    out_tree: Any
    consts: dict[int, Any]
    whole: str | None


def _flatten(closed: jcore.ClosedJaxpr, args: Sequence[Any], counter, ops: list[Op], consts):
    """Appends ``closed``'s operations to ``ops`` with ``args`` (ids or literals)
    as its inputs, inlining call-like equations; returns its outputs."""
    env: dict[Any, Any] = {}
    for v, c in zip(closed.jaxpr.constvars, closed.consts, strict=True):
        i = next(counter)
        consts[i] = c
        env[v] = i
    for v, a in zip(closed.jaxpr.invars, args, strict=True):
        env[v] = a

    def read(v):
        if isinstance(v, jcore.Literal):
            return ("lit", v.val)
        return env[v]

    for eqn in closed.jaxpr.eqns:
        inputs = [read(v) for v in eqn.invars]
        sub = sub_jaxpr(eqn)
        if sub is not None:
            outs = _flatten(sub, inputs, counter, ops, consts)
            for v, o in zip(eqn.outvars, outs, strict=True):
                env[v] = o
            continue
        outs = tuple(next(counter) for _ in eqn.outvars)
        for v, o in zip(eqn.outvars, outs, strict=True):
            env[v] = o
        ops.append(Op(eqn, tuple(inputs), outs))
    return [read(v) for v in closed.jaxpr.outvars]


def _run(ops: Sequence[Op], reads, params, writes, read_vals, param_vals, consts, *,
         lowered: bool = True):  # fmt: skip
    """Evaluates ``ops``: with ``lowered`` as dcjax's dense step computes them,
    else by binding each primitive as it is (what a later trace should see)."""
    env = dict(consts)
    env.update(zip(reads, read_vals, strict=True))
    env.update(zip(params, param_vals, strict=True))
    for op in ops:
        args = [a[1] if isinstance(a, tuple) else env[a] for a in op.inputs]
        if not lowered:
            out = op.primitive.bind(*args, **op.params)
            out = list(out) if op.primitive.multiple_results else [out]
        elif op.primitive.name == _CONV:
            out = [dense_conv_eqn(op.eqn, args)]
        else:
            out = lowering.bind(op.eqn, args)
        env.update(zip(op.outputs, out, strict=True))
    return [env[w] for w in writes]


#: Compiled segment functions by their canonical form: models of the same
#: architecture (a family fine-tuned from one network) share them.
_SEGMENT_FNS: dict[Any, Callable] = {}


def const_name(value: Any) -> tuple:
    """A constant's canonical name: its dtype, shape and the hash of its bytes."""
    a = np.ascontiguousarray(value)
    return ("c", a.dtype.str, a.shape, hashlib.sha256(a.reshape(-1).view(np.uint8)).hexdigest())


def op_signature(op: Op, names: dict[int, Any], name_output: Callable[[int], Any]) -> tuple:
    """``op`` with canonical operands (``names``, literals by value), naming each
    value it defines with ``name_output(id)`` as it goes: two ops with equal
    signatures compute the same thing on equally named inputs."""
    inputs = tuple(("lit", repr(a[1])) if isinstance(a, tuple) else names[a] for a in op.inputs)
    for o in op.outputs:
        names[o] = name_output(o)
    return op.primitive.name, repr(sorted(op.params.items())), inputs


def _canonical(ops, reads, params, writes, consts) -> Any:
    names: dict[int, Any] = {r: ("r", i) for i, r in enumerate(reads)}
    names.update({p: ("p", i) for i, p in enumerate(params)})
    names.update({c: const_name(value) for c, value in consts.items()})
    body = tuple(op_signature(op, names, lambda _: ("v", len(names))) for op in ops)
    return body, tuple(names[w] for w in writes)


def _segment_fn(ops, reads, params, writes, consts) -> Callable:
    """The jitted ``fn(reads, params) -> writes`` of a segment, shared with every
    segment of the same canonical form."""
    key = _canonical(ops, reads, params, writes, consts)
    fn = _SEGMENT_FNS.get(key)
    if fn is None:
        fn = _SEGMENT_FNS[key] = jax.jit(
            lambda r, p: _run(ops, reads, params, writes, r, p, consts)
        )
    return fn


def split(fn: Callable[[Any, Any], Any], params_like: Any, x_like: Any) -> Split:
    """Splits ``fn(params, x)`` at its layers (module docstring).

    Args:
        fn: the model, ``fn(params, x)``.
        params_like: its parameters, or their ``jax.ShapeDtypeStruct``s.
        x_like: an input, or its ``jax.ShapeDtypeStruct``.
    """
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(params_like)
    leaf_layers = tuple(layer_of(path) for path, _ in leaves_with_path)
    n_params = len(leaves_with_path)

    def flat_fn(flat_params, x):
        return fn(jax.tree_util.tree_unflatten(treedef, flat_params), x)

    abstract = [jax.ShapeDtypeStruct(jax.numpy.shape(p), jax.numpy.result_type(p))
                for _, p in leaves_with_path]  # fmt: skip
    closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(abstract, x_like)
    out_tree = jax.tree_util.tree_structure(out_shape)
    counter = itertools.count()
    n_in = len(closed.jaxpr.invars)
    in_ids = [next(counter) for _ in range(n_in)]
    consts: dict[int, Any] = {}
    ops: list[Op] = []
    outputs = _flatten(closed, in_ids, counter, ops, consts)
    param_ids = tuple(in_ids[:n_params])
    layer_by_id = {pid: leaf_layers[i][0] for i, pid in enumerate(param_ids)}

    # cut the op list where the layer read changes
    groups: list[tuple[list[Op], set[str]]] = []
    for op in ops:
        layers = {
            layer_by_id[a] for a in op.inputs if not isinstance(a, tuple) and a in layer_by_id
        }
        if not groups or (layers and groups[-1][1] and not layers <= groups[-1][1]):
            groups.append(([op], set(layers)))
        else:
            groups[-1][0].append(op)
            groups[-1][1].update(layers)

    # what each group reads from outside itself and writes for later
    later_reads: list[set[int]] = [set() for _ in groups]
    needed = {o for o in outputs if not isinstance(o, tuple)}
    for gi in range(len(groups) - 1, -1, -1):
        later_reads[gi] = set(needed)
        for op in groups[gi][0]:
            needed.update(a for a in op.inputs if not isinstance(a, tuple))
    input_ids = tuple(in_ids[n_params:])  # the model's own inputs, never freed
    segments = []
    for gi, (group_ops, layers) in enumerate(groups):
        defined = {o for op in group_ops for o in op.outputs}
        used = {a for op in group_ops for a in op.inputs if not isinstance(a, tuple)}
        params = tuple(sorted(u for u in used if u in layer_by_id))
        reads = tuple(sorted(u for u in used - defined if u not in layer_by_id and u not in consts))
        writes = tuple(sorted(defined & later_reads[gi]))
        frees = tuple(r for r in reads if r not in later_reads[gi] and r not in input_ids)
        seg_consts = {c: consts[c] for c in used if c in consts}
        run = _segment_fn(tuple(group_ops), reads, params, writes, seg_consts)
        segments.append(
            Segment(
                layers=tuple(sorted(layers)),
                reads=reads,
                params=params,
                writes=writes,
                frees=frees,
                kinds=frozenset(op.primitive.name for op in group_ops) & {_CONV, _DOT},
                ops=tuple(group_ops),
                fn=run,
            )
        )
    whole = None
    n_layers = len({layer for layer, _ in leaf_layers})
    if n_layers > 1 and sum(1 for s in segments if s.layers) <= 1:
        whole = (
            f"all {n_layers} layers are read by one group of operations (a loop or call "
            "over stacked layers that the split does not enter)"
        )
    return Split(
        segments=tuple(segments),
        param_ids=param_ids,
        leaf_layers=leaf_layers,
        input_ids=input_ids,
        output_ids=tuple(outputs),
        out_tree=out_tree,
        consts=consts,
        whole=whole,
    )
