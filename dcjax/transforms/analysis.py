"""The analysis pass: signatures, layers and per-equation facts of a traced model.

`analyze` walks a closed jaxpr once, recursing into call-like primitives
(`dcjax.transforms.calls`), and records for every equation the operands' and
outputs' signatures (by the rules of `dcjax.transforms.signature_rules`),
whether the equation depends on the frame, which equations are reused layers
(`Layer`) and fully connected layers (`DenseLayer`), and each layer's fusable
epilogue (`dcjax.transforms.patterns`). Equations on constants only are folded
where their outputs are small, so that rules may read constant operands (a
resize's index map or weight matrix). The records are those of
`dcjax.transforms.records`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from jax.extend import core as jcore
from jax.extend.core import primitives as P

from dcjax.transforms import variation
from dcjax.transforms.calls import sub_jaxpr
from dcjax.transforms.patterns import find_epilogues, is_dense
from dcjax.transforms.recognisers import conv_window
from dcjax.transforms.records import Analysis, DenseLayer, EqnInfo, Layer
from dcjax.transforms.signature_rules import SIGNATURE_RULES, NoRule
from dcjax.transforms.spatial import Spatial, first_spatial, var_shape

__all__ = ["analyze", "conv_flops", "dot_flops"]


_FOLD_LIMIT = 1 << 20


def _fold(eqn, values) -> list:
    """Evaluate an equation on constant operands (None where too large or failing)."""
    out_size = sum(int(np.prod(var_shape(o))) for o in eqn.outvars)
    if out_size > _FOLD_LIMIT:
        return [None] * len(eqn.outvars)
    try:
        out = eqn.primitive.bind(*values, **eqn.params)
    except Exception:  # folding is an optimisation; give up quietly
        return [None] * len(eqn.outvars)
    out = out if eqn.primitive.multiple_results else [out]
    return [np.asarray(o) for o in out]


def conv_flops(eqn) -> int:
    """2 x multiply-adds of a conv_general_dilated."""
    dn = eqn.params["dimension_numbers"]
    rhs = var_shape(eqn.invars[1])
    per_out = int(np.prod([rhs[d] for d in dn.rhs_spec[2:]])) * rhs[dn.rhs_spec[1]]
    return 2 * int(np.prod(var_shape(eqn.outvars[0]))) * per_out


def dot_flops(eqn) -> int:
    """2 x multiply-adds of a dot_general."""
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = var_shape(eqn.invars[0])
    contracted = int(np.prod([lhs[d] for d in lhs_contract]))
    return 2 * int(np.prod(var_shape(eqn.outvars[0]))) * contracted


def analyze(
    closed: jcore.ClosedJaxpr,
    in_sigs: Sequence[Spatial | None],
    in_dynamic: Sequence[bool],
    *,
    reuse_ops: Sequence[str] = ("conv_general_dilated",),
) -> Analysis:
    """Derive signatures for every variable of ``closed`` and find reused layers.

    Args:
        closed: the traced model.
        in_sigs: signature of each invar (None for parameters).
        in_dynamic: whether each invar depends on the frame.
        reuse_ops: names of primitives whose outputs are cached.
    """
    layers: list[Layer] = []
    dense_layers: list[DenseLayer] = []
    unsupported: set[str] = set()
    other = [0]

    def walk(cj: jcore.ClosedJaxpr, sigs, dyn, consts=None, varies=None) -> Analysis:
        env_sig: dict[Any, Any] = {}
        env_dyn: dict[Any, bool] = {}
        env_const: dict[Any, Any] = {}
        env_var: dict[Any, Any] = {}  # frame-independent values: their varying axes
        consts, varies = consts or [None] * len(sigs), varies or [None] * len(sigs)
        for v, s, d, c, a in zip(cj.jaxpr.invars, sigs, dyn, consts, varies):
            env_sig[v], env_dyn[v] = s, d
            if c is not None:
                env_const[v] = c
            if not d:
                env_var[v] = a if a is not None else variation.input_axes(var_shape(v))
        for v, c in zip(cj.jaxpr.constvars, cj.consts):
            env_sig[v], env_dyn[v] = None, False
            env_const[v] = np.asarray(c) if np.size(c) <= _FOLD_LIMIT else None
            env_var[v] = variation.input_axes(np.shape(c)) if env_const[v] is None else (
                variation.constant_axes(env_const[v]))  # fmt: skip
        read_sig = lambda v: None if isinstance(v, jcore.Literal) else env_sig[v]
        read_dyn = lambda v: False if isinstance(v, jcore.Literal) else env_dyn[v]
        read_const = lambda v: v.val if isinstance(v, jcore.Literal) else env_const.get(v)
        read_var = lambda v: (
            variation.constant_axes(v.val) if isinstance(v, jcore.Literal) else env_var.get(v)
        )
        infos = []
        for eqn in cj.jaxpr.eqns:
            isigs = [read_sig(v) for v in eqn.invars]
            idyn = [read_dyn(v) for v in eqn.invars]
            iconsts = [read_const(v) for v in eqn.invars]
            ivar = [read_var(v) for v in eqn.invars]
            dynamic = any(idyn)
            info = EqnInfo(
                in_sigs=isigs,
                out_sigs=[None] * len(eqn.outvars),
                dynamic=dynamic,
                in_consts=iconsts,
            )
            if not dynamic:
                folded = [None] * len(eqn.outvars)
                if all(c is not None for c in iconsts):
                    folded = _fold(eqn, iconsts)
                    for v, c in zip(eqn.outvars, folded):
                        env_const[v] = c
                ruled = variation.varying_axes(eqn, ivar)
                for v, c, a in zip(eqn.outvars, folded, ruled):
                    env_var[v] = a if c is None else variation.constant_axes(c)
            if dynamic:
                sub = sub_jaxpr(eqn)
                if sub is not None:
                    info.sub = walk(sub, isigs, idyn, iconsts, ivar)
                    info.out_sigs = list(info.sub.out_sigs)
                elif any(s is not None for s in isigs):
                    rule = SIGNATURE_RULES.get(eqn.primitive)
                    if rule is not None:
                        try:
                            info.out_sigs = list(rule(eqn, isigs, **eqn.params, operands=iconsts))
                        except NoRule:
                            rule = None
                    if rule is None:
                        info.supported = False
                        unsupported.add(eqn.primitive.name)
                        first = first_spatial(isigs)
                        first_shape = var_shape(eqn.invars[isigs.index(first)])
                        info.out_sigs = [
                            first if var_shape(o) == first_shape else None for o in eqn.outvars
                        ]
                if eqn.primitive is P.conv_general_dilated_p:
                    reusable = (
                        eqn.primitive.name in reuse_ops
                        and isigs[0] is not None
                        and not idyn[1]
                        and info.out_sigs[0] is not None
                    )
                    if reusable:
                        info.layer = len(layers)
                        layers.append(_layer(info.layer, eqn, isigs[0], info.out_sigs[0]))
                    else:
                        other[0] += conv_flops(eqn)
            elif eqn.primitive is P.conv_general_dilated_p:
                other[0] += conv_flops(eqn)
            if dynamic and eqn.primitive is P.dot_general_p:
                other[0] += dot_flops(eqn)
                if is_dense(eqn, isigs, idyn):
                    info.dense = len(dense_layers)
                    dense_layers.append(_dense_layer(info.dense, eqn))
            if dynamic and len(eqn.outvars) == 1:
                info.anchored = variation.anchored(eqn, isigs, idyn, ivar, info.out_sigs[0])
            for v, s in zip(eqn.outvars, info.out_sigs):
                env_sig[v], env_dyn[v] = s, dynamic
            infos.append(info)
        find_epilogues(cj.jaxpr, infos, read_dyn)
        out_sigs = [read_sig(v) for v in cj.jaxpr.outvars]
        return Analysis(
            jaxpr=cj,
            in_sigs=list(sigs),
            out_sigs=out_sigs,
            eqns=infos,
            layers=layers,
            unsupported=unsupported,
            other_flops=0,
            dense_layers=dense_layers,
        )

    result = walk(closed, list(in_sigs), list(in_dynamic))
    return dataclasses.replace(result, other_flops=other[0])


def _layer(index: int, eqn, in_sig: Spatial, out_sig: Spatial) -> Layer:
    win = conv_window(eqn, in_sig)
    name = str(eqn.source_info.name_stack) or f"conv{index}"
    return Layer(
        index=index,
        name=name,
        primitive=eqn.primitive.name,
        in_shape=var_shape(eqn.invars[0]),
        out_shape=var_shape(eqn.outvars[0]),
        in_signature=in_sig,
        signature=out_sig,
        kernel=win.size,
        strides=win.strides,
        padding=win.padding,
        dilation=win.rhs_dilation,
        groups=eqn.params["feature_group_count"],
        flops=conv_flops(eqn),
        in_channels=var_shape(eqn.invars[0])[eqn.params["dimension_numbers"].lhs_spec[1]],
        out_channels=var_shape(eqn.invars[1])[eqn.params["dimension_numbers"].rhs_spec[0]],
        dtype=eqn.outvars[0].aval.dtype,
    )


def _dense_layer(index: int, eqn) -> DenseLayer:
    k, n = var_shape(eqn.invars[1])
    return DenseLayer(
        index=index,
        name=str(eqn.source_info.name_stack) or f"dense{index}",
        in_features=k,
        out_features=n,
        flops=dot_flops(eqn),
        dtype=eqn.outvars[0].aval.dtype,
    )
