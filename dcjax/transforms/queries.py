"""Per-layer questions asked of an analysed jaxpr (`dcjax.transforms.analysis.analyze`).

Each query returns one answer per reused layer (`Analysis.layers`), in layer
order, from the layer's equation and the data flow around it:

- `layers_reading_cache`: whether the layer's kernel reads a cache
  (`dcjax.kernels.reads_cache`);
- `reads_frame`: whether its input comes from the frame with no reused layer
  in between (the stem);
- `shared_inputs`: per refined layer, the first refined layer reading the same
  variable (which owns their shared test and reference);
- `layer_epilogues`: the primitive names of its epilogue (`EqnInfo.epilogue`);
- `conv_chains`: the inverted-residual chains (expansion, depthwise,
  projection) that `dcjax.kernels.chain` computes as one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from jax.extend import core as jcore

from dcjax import kernels
from dcjax.kernels import chain as chain_lib
from dcjax.kernels.geometry import plain_conv

__all__ = [
    "conv_chains",
    "layer_epilogues",
    "layer_tile_plans",
    "layers_reading_cache",
    "per_layer",
    "reads_frame",
    "shared_inputs",
]


def per_layer(analysis, value: Callable[[Any, Any, Any], Any]) -> tuple:
    """``value(analysis, eqn, info)`` for each layer's equation, in layer order
    (layers inside nested calls included, with their own analysis)."""
    out: list = [None] * len(analysis.layers)

    def walk(an):
        for eqn, info in zip(an.jaxpr.jaxpr.eqns, an.eqns):
            if info.sub is not None:
                walk(info.sub)
            elif info.layer is not None:
                out[info.layer] = value(an, eqn, info)

    walk(analysis)
    return tuple(out)


def layers_reading_cache(analysis, impl: str) -> tuple[bool, ...]:
    """Per layer, whether its kernel under ``impl`` reads a cache (`kernels.reads_cache`)."""
    return per_layer(analysis, lambda an, eqn, info: kernels.reads_cache(eqn, impl))


def layer_tile_plans(analysis) -> tuple:
    """Per layer, the `dcjax.kernels.TilePlan` of its convolution where the
    sparse kernels compute it (`plain_conv`), else None."""

    def tile_plan(an, eqn, info):
        if not plain_conv(eqn.params):
            return None
        x, w = (v.aval for v in eqn.invars)
        return kernels.plan(x.shape, w.shape, kernels.ConvGeometry.from_params(eqn.params))

    return per_layer(analysis, tile_plan)


def reads_frame(analysis) -> tuple[bool, ...]:
    """Per layer, whether its input is computed from the frame with no reused
    layer in between (the stem, or the first layers of parallel stems).

    Data flow through the jaxpr: a variable is "behind a layer" when a layer's
    output reaches it; sub-jaxprs (``pjit``, custom derivatives) pass it from
    their operands to their parameters and back from their results.
    """
    out = [False] * len(analysis.layers)

    def walk(an, behind_in: Sequence[bool]) -> list[bool]:
        jaxpr = an.jaxpr.jaxpr
        behind = {v for v, b in zip(jaxpr.invars, behind_in, strict=True) if b}

        def is_behind(v) -> bool:
            return isinstance(v, jcore.Var) and v in behind

        for eqn, info in zip(jaxpr.eqns, an.eqns):
            ins = [is_behind(v) for v in eqn.invars]
            if info.sub is not None:
                sub_in = info.sub.jaxpr.jaxpr.invars
                if len(sub_in) == len(ins):
                    outs = walk(info.sub, ins)
                else:  # operands we cannot pair up: everything inside counts as behind
                    outs = walk(info.sub, [True] * len(sub_in))
                    outs = [o or any(ins) for o in outs]
            elif info.layer is not None:
                out[info.layer] = not ins[0]
                outs = [True] * len(eqn.outvars)
            else:
                outs = [any(ins)] * len(eqn.outvars)
            behind.update(v for v, b in zip(eqn.outvars, outs, strict=False) if b)
        return [is_behind(v) for v in jaxpr.outvars]

    walk(analysis, [False] * len(analysis.jaxpr.jaxpr.invars))
    return tuple(out)


def shared_inputs(analysis, refined: Sequence[bool]) -> tuple[int, ...]:
    """Per layer, the first refined layer that reads the same input variable
    (itself when none does, and for layers that are not refined).

    Equal inputs give equal tests (same values, reference, scale and validity),
    so only the first layer of each group keeps a reference (ResNet's first
    block of a stage feeds ``conv1`` and ``downsample`` from one map; an
    inception module feeds three branches).
    """
    inputs = per_layer(analysis, lambda an, eqn, info: eqn.invars[0])
    owner: list[int] = list(range(len(inputs)))
    first: dict[int, int] = {}
    for i, var in enumerate(inputs):
        if not refined[i] or not isinstance(var, jcore.Var):
            continue
        owner[i] = first.setdefault(id(var), i)
    return tuple(owner)


def layer_epilogues(analysis) -> tuple[tuple[str, ...], ...]:
    """Per layer, the primitive names of its epilogue chain (`EqnInfo.epilogue`)."""
    return per_layer(
        analysis,
        lambda an, eqn, info: tuple(an.jaxpr.jaxpr.eqns[j].primitive.name for j in info.epilogue),
    )


def conv_chains(analysis) -> dict[int, tuple[int, int, int]]:
    """Per layer in an inverted-residual chain (`dcjax.kernels.chain`), the
    chain's layers (expansion, depthwise, projection).

    A chain is three layers of the top-level jaxpr: a 1x1 expansion (stride 1,
    no padding, ungrouped), a depthwise layer (one group per channel) and a
    1x1 projection, where the variable each of the first two layers' epilogues
    ends in (the layer's output without one) is read by the next layer alone
    and is not an output of the model, and those two epilogues read no other
    pixel values. `kernels.chain.chain_pays` decides on the projection's output
    size. Layers inside calls (``pjit`` and the like) are left alone.
    """
    jaxpr = analysis.jaxpr.jaxpr
    eqns, infos = jaxpr.eqns, analysis.eqns
    users: dict[Any, list[int]] = {}
    for j, e in enumerate(eqns):
        for v in e.invars:
            if isinstance(v, jcore.Var):
                users.setdefault(v, []).append(j)
    model_outs = {v for v in jaxpr.outvars if isinstance(v, jcore.Var)}

    def end(i: int):
        info = infos[i]
        return eqns[info.epilogue[-1]].outvars[0] if info.epilogue else eqns[i].outvars[0]

    def next_layer(i: int) -> int | None:
        v = end(i)
        readers = users.get(v, [])
        if v in model_outs or len(readers) != 1:
            return None
        j = readers[0]
        return j if infos[j].layer is not None and eqns[j].invars[0] is v else None

    def reads_no_pixels(i: int) -> bool:
        inside = {eqns[i].outvars[0]}
        for j in infos[i].epilogue:
            for u, sig in zip(eqns[j].invars, infos[j].in_sigs, strict=True):
                if isinstance(u, jcore.Var) and u not in inside and sig is not None:
                    return False
            inside.add(eqns[j].outvars[0])
        return True

    def conv(e, depthwise: bool) -> bool:
        p = e.params
        if not plain_conv(p) or p["precision"] is not None:
            return False
        kh, kw, cig, cout = e.invars[1].aval.shape
        cin = e.invars[0].aval.shape[-1]
        if depthwise:
            return cig == 1 and p["feature_group_count"] == cin == cout
        return (
            (kh, kw) == (1, 1)
            and p["feature_group_count"] == 1
            and tuple(p["window_strides"]) == (1, 1)
            and tuple(map(tuple, p["padding"])) == ((0, 0), (0, 0))
        )

    chains: dict[int, tuple[int, int, int]] = {}
    for i, info in enumerate(infos):
        if info.layer is None or info.layer in chains or not conv(eqns[i], False):
            continue
        j = next_layer(i)
        k = next_layer(j) if j is not None else None
        if k is None or not (conv(eqns[j], True) and conv(eqns[k], False)):
            continue
        if not (reads_no_pixels(i) and reads_no_pixels(j)):
            continue
        if not chain_lib.chain_pays(tuple(eqns[k].outvars[0].aval.shape[1:3])):
            continue
        members = (info.layer, infos[j].layer, infos[k].layer)
        chains.update(dict.fromkeys(members, members))
    return chains
