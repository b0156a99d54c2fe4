"""Signature rules: how each primitive maps its operands' spatial signatures.

One rule per primitive in `SIGNATURE_RULES`, keyed by the primitive object,
like jax's own interpreters (`register` files one). A rule is called only when
at least one operand is spatial, as ``rule(eqn, sigs, **eqn.params,
operands=consts)``: ``sigs`` are the operands' signatures (`Spatial` or None)
and ``consts`` the operands' values where the analysis folded them to
constants (else None). It returns the outputs' signatures, one per output, or
raises `NoRule` when it does not cover this instance of its primitive. A
primitive without a rule (or whose rule raised `NoRule`) keeps the signature
of a same-shaped spatial operand (its outputs are then never reusable, see
`dcjax.transforms.regions`) and is reported in `Analysis.unsupported`.

The rules for gathers, windowed ops and dot_general read the operation's
geometry through `dcjax.transforms.recognisers`, which the mask rules
(`dcjax.transforms.regions`) share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
from jax import lax
from jax.extend.core import primitives as P

from dcjax.transforms._registry import registrar
from dcjax.transforms.recognisers import (
    Window,
    conv_out_axes,
    conv_window,
    gather_pick,
    linear_map,
    reduce_window_window,
)
from dcjax.transforms.spatial import Spatial, first_spatial, var_shape

__all__ = [
    "ELEMENTWISE",
    "SIGNATURE_RULES",
    "NoRule",
    "SignatureRule",
    "register",
]

SignatureRule = Callable[..., list]
SIGNATURE_RULES: dict[Any, SignatureRule] = {}


register = registrar(SIGNATURE_RULES, "signature rule")


# Elementwise primitives: every operand has the output's shape (lax broadcasts
# explicitly), so the output keeps the spatial operand's signature.
ELEMENTWISE = [
    P.abs_p, P.acos_p, P.acosh_p, P.add_p, P.and_p, P.asin_p, P.asinh_p, P.atan2_p, P.atan_p,
    P.atanh_p, P.cbrt_p, P.ceil_p, P.clamp_p, P.convert_element_type_p, P.copy_p, P.cos_p,
    P.cosh_p, P.digamma_p, P.div_p, P.eq_p, P.erf_inv_p, P.erf_p, P.erfc_p, P.exp2_p, P.exp_p,
    P.expm1_p, P.floor_p, P.ge_p, P.gt_p, P.imag_p, P.integer_pow_p, P.is_finite_p, P.le_p,
    P.lgamma_p, P.log1p_p, P.log_p, P.logistic_p, P.lt_p, P.max_p, P.min_p, P.mul_p, P.ne_p,
    P.neg_p, P.nextafter_p, P.not_p, P.or_p, P.pow_p, P.real_p, P.reduce_precision_p, P.rem_p,
    P.round_p, P.rsqrt_p, P.select_n_p, P.sign_p, P.sin_p, P.sinh_p, P.sqrt_p, P.square_p,
    P.stop_gradient_p, P.sub_p, P.tan_p, P.tanh_p, P.xor_p, P.shift_left_p,
    P.shift_right_arithmetic_p, P.shift_right_logical_p, P.population_count_p, P.clz_p,
    P.conj_p, P.complex_p, P.bitcast_convert_type_p, P.sharding_constraint_p,
]  # fmt: skip


def _aligned(sigs: Sequence[Spatial | None]) -> Spatial:
    """The one signature of same-shaped operands that meet position by position;
    `NoRule` where two spatial operands disagree on where H and W are (e.g. a map
    plus its H-W transpose), their sizes or their strides."""
    spatial = {s for s in sigs if s is not None}
    if len(spatial) > 1:
        raise NoRule
    return first_spatial(sigs)


@register(*ELEMENTWISE)
def _elementwise(eqn, sigs, **_):
    sig = _aligned(sigs)
    return [sig for _ in eqn.outvars]


@register(P.broadcast_in_dim_p)
def _broadcast_in_dim(eqn, sigs, *, broadcast_dimensions, shape, **_):
    sig = sigs[0]
    if sig is None:
        return [None]
    axes = (broadcast_dimensions[sig.axes[0]], broadcast_dimensions[sig.axes[1]])
    if (shape[axes[0]], shape[axes[1]]) != sig.size:
        return [None]
    return [sig.with_axes(axes)]


def _reshape_groups(
    in_shape: tuple[int, ...], out_shape: tuple[int, ...]
) -> list[tuple[list[int], list[int]]] | None:
    """Pair minimal runs of input and output axes whose sizes multiply to the same number."""
    groups, i, j = [], 0, 0
    while i < len(in_shape) or j < len(out_shape):
        gi, gj, pi, pj = [], [], 1, 1
        if i < len(in_shape):
            gi, pi, i = [i], in_shape[i], i + 1
        if j < len(out_shape):
            gj, pj, j = [j], out_shape[j], j + 1
        while pi != pj:
            if pi < pj and i < len(in_shape):
                gi.append(i)
                pi, i = pi * in_shape[i], i + 1
            elif pj < pi and j < len(out_shape):
                gj.append(j)
                pj, j = pj * out_shape[j], j + 1
            else:
                return None
        groups.append((gi, gj))
    return groups


@register(P.reshape_p)
def _reshape(eqn, sigs, *, new_sizes, dimensions=None, **_):
    sig = sigs[0]
    if sig is None or dimensions is not None:
        return [None]
    in_shape, out_shape = var_shape(eqn.invars[0]), tuple(new_sizes)
    groups = _reshape_groups(in_shape, out_shape)
    if groups is None:
        return [None]
    new_axes, stride = [0, 0], list(sig.stride)
    for k in range(2):
        axis = sig.axes[k]
        gi, gj = next(g for g in groups if axis in g[0])
        real_in = [a for a in gi if in_shape[a] != 1]
        real_out = [a for a in gj if out_shape[a] != 1]
        if sig.axes[1 - k] in gi or len(real_out) != 1:
            return [None]
        # H alone, or H followed by non-spatial axes merged into it (nearest upsampling).
        if real_in[0] != axis:
            return [None]
        factor = int(np.prod([in_shape[a] for a in real_in[1:]], dtype=np.int64))
        new_axes[k] = real_out[0]
        stride[k] = sig.stride[k] / factor
    return [
        Spatial(
            axes=(new_axes[0], new_axes[1]),
            size=(out_shape[new_axes[0]], out_shape[new_axes[1]]),
            stride=(stride[0], stride[1]),
        )
    ]


@register(P.transpose_p)
def _transpose(eqn, sigs, *, permutation, **_):
    sig = sigs[0]
    if sig is None:
        return [None]
    perm = list(permutation)
    return [sig.with_axes((perm.index(sig.axes[0]), perm.index(sig.axes[1])))]


@register(P.squeeze_p)
def _squeeze(eqn, sigs, *, dimensions, **_):
    sig = sigs[0]
    if sig is None or set(sig.axes) & set(dimensions):
        return [None]
    shift = lambda a: a - sum(d < a for d in dimensions)
    return [sig.with_axes((shift(sig.axes[0]), shift(sig.axes[1])))]


@register(P.concatenate_p)
def _concatenate(eqn, sigs, *, dimension, **_):
    sig = _aligned(sigs)
    if dimension in sig.axes:
        return [None]
    return [sig]


@register(lax.split_p)
def _split(eqn, sigs, *, axis, **_):
    sig = sigs[0]
    if sig is None or axis in sig.axes:
        return [None for _ in eqn.outvars]
    return [sig for _ in eqn.outvars]


def _keep_unless(eqn, sig, axes: Sequence[int]):
    """Keep `sig` when no spatial axis is in `axes`, renumbering removed axes."""
    if sig is None or set(sig.axes) & set(axes):
        return [None for _ in eqn.outvars]
    shift = lambda a: a - sum(d < a for d in axes)
    return [sig.with_axes((shift(sig.axes[0]), shift(sig.axes[1]))) for _ in eqn.outvars]


@register(
    P.reduce_sum_p, P.reduce_max_p, P.reduce_min_p, P.reduce_prod_p, P.reduce_and_p,
    P.reduce_or_p, P.reduce_xor_p, P.argmax_p, P.argmin_p,
)  # fmt: skip
def _reduce(eqn, sigs, *, axes, **_):
    return _keep_unless(eqn, sigs[0], axes)


@register(P.reduce_p)
def _reduce_generic(eqn, sigs, *, dimensions, **_):
    return _keep_unless(eqn, first_spatial(sigs), dimensions)


@register(P.cumsum_p, P.cumprod_p, P.cummax_p, P.cummin_p, P.cumlogsumexp_p)
def _cumulative(eqn, sigs, *, axis, **_):
    sig = sigs[0]
    return [None if sig is None or axis in sig.axes else sig]


@register(P.rev_p)
def _rev(eqn, sigs, *, dimensions, **_):
    sig = sigs[0]
    return [None if sig is None or set(dimensions) & set(sig.axes) else sig]


@register(P.sort_p)
def _sort(eqn, sigs, *, dimension, **_):
    sig = first_spatial(sigs)
    return [None if sig is None or dimension in sig.axes else sig for _ in eqn.outvars]


@register(P.top_k_p)
def _top_k(eqn, sigs, **_):
    sig = sigs[0]
    last = len(var_shape(eqn.invars[0])) - 1
    return [None if sig is None or last in sig.axes else sig for _ in eqn.outvars]


@register(P.pad_p)
def _pad(eqn, sigs, *, padding_config, **_):
    sig = sigs[0]
    if sig is None:
        return [None]
    out_shape = var_shape(eqn.outvars[0])
    stride = tuple(s / (padding_config[a][2] + 1) for s, a in zip(sig.stride, sig.axes))
    return [Spatial(axes=sig.axes, size=(out_shape[sig.axes[0]], out_shape[sig.axes[1]]),
                    stride=stride)]  # fmt: skip


@register(P.slice_p)
def _slice(eqn, sigs, *, start_indices, limit_indices, strides=None, **_):
    sig = sigs[0]
    if sig is None:
        return [None]
    out_shape = var_shape(eqn.outvars[0])
    st = strides or (1,) * len(out_shape)
    stride = tuple(s * st[a] for s, a in zip(sig.stride, sig.axes))
    return [Spatial(axes=sig.axes, size=(out_shape[sig.axes[0]], out_shape[sig.axes[1]]),
                    stride=stride)]  # fmt: skip


class NoRule(Exception):
    """Raised by a rule that does not cover this instance of its primitive."""


@register(P.gather_p)
def _gather(eqn, sigs, *, operands, **_):
    sig = sigs[0]
    if sig is None or sigs[1] is not None:
        return [None]
    found = gather_pick(eqn, sig, operands[1])
    if found is None:
        raise NoRule
    pick, axes = found
    stride = list(sig.stride)
    stride[pick.axis] = stride[pick.axis] * pick.step / pick.repeat
    out_shape = var_shape(eqn.outvars[0])
    return [Spatial(axes=axes, size=(out_shape[axes[0]], out_shape[axes[1]]), stride=stride)]


def _windowed_out(sig: Spatial, win: Window, out_shape, axes) -> Spatial:
    stride = tuple(s * st / d for s, st, d in zip(sig.stride, win.strides, win.lhs_dilation))
    return Spatial(axes=axes, size=(out_shape[axes[0]], out_shape[axes[1]]), stride=stride)


@register(P.conv_general_dilated_p)
def _conv(eqn, sigs, **_):
    sig = sigs[0]
    if sig is None or sigs[1] is not None:
        return [None]
    win = conv_window(eqn, sig)
    if win is None:
        return [None]
    return [_windowed_out(sig, win, var_shape(eqn.outvars[0]), conv_out_axes(eqn, sig))]


@register(P.reduce_window_sum_p, P.reduce_window_max_p, P.reduce_window_min_p)
def _reduce_window(eqn, sigs, **_):
    sig = sigs[0]
    if sig is None:
        return [None]
    win = reduce_window_window(eqn, sig)
    return [_windowed_out(sig, win, var_shape(eqn.outvars[0]), sig.axes)]


@register(P.reduce_window_p)
def _reduce_window_generic(eqn, sigs, **_):
    sig = first_spatial(sigs)
    if sig is None or any(s is not None and s != sig for s in sigs):
        return [None for _ in eqn.outvars]
    win = reduce_window_window(eqn, sig)
    return [_windowed_out(sig, win, var_shape(o), sig.axes) for o in eqn.outvars]


@register(P.dot_general_p)
def _dot_general(eqn, sigs, *, dimension_numbers, operands=None, **_):
    (lc, rc), (lb, rb) = dimension_numbers
    ls, rs = sigs
    if ls is not None and rs is not None:
        return [None]
    nl, nr = len(var_shape(eqn.invars[0])), len(var_shape(eqn.invars[1]))
    sig, contracted = (ls, set(lc) | set(lb)) if ls is not None else (rs, set(rc) | set(rb))
    if set(sig.axes) & contracted:
        found = linear_map(eqn, sigs, operands or [None, None])
        if found is None:
            return [None]
        lm, axes = found
        n_in, n_out = lm.weights.shape
        stride = list(sig.stride)
        stride[lm.axis] = stride[lm.axis] * Fraction(n_in, n_out)
        out_shape = var_shape(eqn.outvars[0])
        return [Spatial(axes=axes, size=(out_shape[axes[0]], out_shape[axes[1]]), stride=stride)]
    if ls is not None:
        free = [a for a in range(nl) if a not in lc and a not in lb]
        return [ls.with_axes(tuple(len(lb) + free.index(a) for a in ls.axes))]
    lfree = [a for a in range(nl) if a not in lc and a not in lb]
    rfree = [a for a in range(nr) if a not in rc and a not in rb]
    return [rs.with_axes(tuple(len(lb) + len(lfree) + rfree.index(a) for a in rs.axes))]
