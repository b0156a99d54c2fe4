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

The geometry recognisers that the rules share with the mask rules
(`dcjax.transforms.regions`) live here too: `gather_pick` (nearest resampling
by a constant gather, `Pick`), `conv_window` / `reduce_window_window` /
`conv_out_axes` (a windowed op's `Window` along H and W) and `linear_map`
(linear resampling by a constant matrix, `LinearMap`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
from jax import lax
from jax.extend.core import primitives as P

from dcjax.transforms._registry import registrar
from dcjax.transforms.spatial import Spatial, first_spatial

__all__ = [
    "ELEMENTWISE",
    "SIGNATURE_RULES",
    "LinearMap",
    "NoRule",
    "Pick",
    "SignatureRule",
    "Window",
    "conv_out_axes",
    "conv_window",
    "gather_pick",
    "linear_map",
    "reduce_window_window",
    "register",
]

SignatureRule = Callable[..., list]
SIGNATURE_RULES: dict[Any, SignatureRule] = {}


register = registrar(SIGNATURE_RULES, "signature rule")


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(v.aval.shape)


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
    in_shape, out_shape = _shape(eqn.invars[0]), tuple(new_sizes)
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
    last = len(_shape(eqn.invars[0])) - 1
    return [None if sig is None or last in sig.axes else sig for _ in eqn.outvars]


@register(P.pad_p)
def _pad(eqn, sigs, *, padding_config, **_):
    sig = sigs[0]
    if sig is None:
        return [None]
    out_shape = _shape(eqn.outvars[0])
    stride = tuple(s / (padding_config[a][2] + 1) for s, a in zip(sig.stride, sig.axes))
    return [Spatial(axes=sig.axes, size=(out_shape[sig.axes[0]], out_shape[sig.axes[1]]),
                    stride=stride)]  # fmt: skip


@register(P.slice_p)
def _slice(eqn, sigs, *, start_indices, limit_indices, strides=None, **_):
    sig = sigs[0]
    if sig is None:
        return [None]
    out_shape = _shape(eqn.outvars[0])
    st = strides or (1,) * len(out_shape)
    stride = tuple(s * st[a] for s, a in zip(sig.stride, sig.axes))
    return [Spatial(axes=sig.axes, size=(out_shape[sig.axes[0]], out_shape[sig.axes[1]]),
                    stride=stride)]  # fmt: skip


class NoRule(Exception):
    """Raised by a rule that does not cover this instance of its primitive."""


# --- gather with constant indices (jax.image.resize "nearest") ---------------


@dataclasses.dataclass(frozen=True)
class Pick:
    """A gather that picks rows along one spatial axis by a constant index map.

    ``out[i] = in[offset + i * step]`` (subsampling, ``repeat == 1``) or
    ``out[i] = in[i // repeat]`` (nearest upsampling, ``step == 1``).
    """

    axis: int  # 0 for H, 1 for W
    repeat: int
    step: int
    offset: int


def gather_pick(eqn, sig: Spatial, indices) -> tuple[Pick, tuple[int, int]] | None:
    """Recognise a translation-consistent gather along one spatial axis."""
    p = eqn.params
    dn = p["dimension_numbers"]
    shape = _shape(eqn.invars[0])
    if indices is None or dn.operand_batching_dims or len(dn.start_index_map) != 1:
        return None
    a = dn.start_index_map[0]
    if a not in sig.axes or tuple(dn.collapsed_slice_dims) != (a,):
        return None
    idx = np.asarray(indices)
    if idx.ndim != 2 or idx.shape[1] != 1:
        return None
    sizes = tuple(p["slice_sizes"])
    if any(sizes[d] != (1 if d == a else shape[d]) for d in range(len(shape))):
        return None
    idx = idx[:, 0].astype(np.int64)
    n_out, n_in = len(idx), shape[a]
    ar = np.arange(n_out)
    k = sig.axes.index(a)
    if n_out % n_in == 0 and np.array_equal(idx, ar // (n_out // n_in)):
        pick = Pick(axis=k, repeat=n_out // n_in, step=1, offset=0)
    elif n_out > 1 and np.array_equal(idx, idx[0] + ar * (idx[1] - idx[0])) and idx[1] > idx[0]:
        pick = Pick(axis=k, repeat=1, step=int(idx[1] - idx[0]), offset=int(idx[0]))
    elif n_out == 1:
        return None
    else:
        return None
    rest = [d for d in range(len(shape)) if d != a]
    batch_pos = next(i for i in range(len(shape)) if i not in dn.offset_dims)
    pos = {d: dn.offset_dims[rest.index(d)] for d in rest}
    pos[a] = batch_pos
    return pick, (pos[sig.axes[0]], pos[sig.axes[1]])


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
    out_shape = _shape(eqn.outvars[0])
    return [Spatial(axes=axes, size=(out_shape[axes[0]], out_shape[axes[1]]), stride=stride)]


# --- windowed ops -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Window:
    """A windowed op's geometry along the frame's H and W axes."""

    size: tuple[int, int]
    strides: tuple[int, int]
    padding: tuple[tuple[int, int], tuple[int, int]]
    lhs_dilation: tuple[int, int]
    rhs_dilation: tuple[int, int]


def conv_window(eqn, sig: Spatial) -> Window | None:
    """Window of a conv_general_dilated along the input's (H, W), or None."""
    p = eqn.params
    dn = p["dimension_numbers"]
    lhs_sp, rhs_sp = dn.lhs_spec[2:], dn.rhs_spec[2:]
    if sig.axes[0] not in lhs_sp or sig.axes[1] not in lhs_sp or p["batch_group_count"] != 1:
        return None
    k = (lhs_sp.index(sig.axes[0]), lhs_sp.index(sig.axes[1]))
    rhs_shape = _shape(eqn.invars[1])
    return Window(
        size=tuple(rhs_shape[rhs_sp[i]] for i in k),
        strides=tuple(p["window_strides"][i] for i in k),
        padding=tuple(tuple(p["padding"][i]) for i in k),
        lhs_dilation=tuple(p["lhs_dilation"][i] for i in k),
        rhs_dilation=tuple(p["rhs_dilation"][i] for i in k),
    )


def conv_out_axes(eqn, sig: Spatial) -> tuple[int, int]:
    dn = eqn.params["dimension_numbers"]
    lhs_sp, out_sp = dn.lhs_spec[2:], dn.out_spec[2:]
    return (out_sp[lhs_sp.index(sig.axes[0])], out_sp[lhs_sp.index(sig.axes[1])])


def reduce_window_window(eqn, sig: Spatial) -> Window:
    p = eqn.params
    a = sig.axes
    return Window(
        size=(p["window_dimensions"][a[0]], p["window_dimensions"][a[1]]),
        strides=(p["window_strides"][a[0]], p["window_strides"][a[1]]),
        padding=(tuple(p["padding"][a[0]]), tuple(p["padding"][a[1]])),
        lhs_dilation=(p["base_dilation"][a[0]], p["base_dilation"][a[1]]),
        rhs_dilation=(p["window_dilation"][a[0]], p["window_dilation"][a[1]]),
    )


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
    return [_windowed_out(sig, win, _shape(eqn.outvars[0]), conv_out_axes(eqn, sig))]


@register(P.reduce_window_sum_p, P.reduce_window_max_p, P.reduce_window_min_p)
def _reduce_window(eqn, sigs, **_):
    sig = sigs[0]
    if sig is None:
        return [None]
    win = reduce_window_window(eqn, sig)
    return [_windowed_out(sig, win, _shape(eqn.outvars[0]), sig.axes)]


@register(P.reduce_window_p)
def _reduce_window_generic(eqn, sigs, **_):
    sig = first_spatial(sigs)
    if sig is None or any(s is not None and s != sig for s in sigs):
        return [None for _ in eqn.outvars]
    win = reduce_window_window(eqn, sig)
    return [_windowed_out(sig, win, _shape(o), sig.axes) for o in eqn.outvars]


@dataclasses.dataclass(frozen=True)
class LinearMap:
    """A dot_general contracting one spatial axis with a constant matrix.

    ``out[o] = sum_i weights[i, o] * in[i]`` along that axis (the weights of
    `jax.image.resize` with a linear-family method). ``interior[o]`` is true
    where column ``o`` is a translated copy of the interior pattern of its
    phase, so a shifted frame gives the same weights; border columns
    (renormalised by the resize) are reusable only with zero shift.
    """

    axis: int  # 0 for H, 1 for W
    weights: np.ndarray  # (n_in, n_out)
    interior: np.ndarray  # (n_out,) bool


def _interior_columns(weights: np.ndarray) -> np.ndarray:
    n_in, n_out = weights.shape
    ratio = Fraction(n_out, n_in)
    p, q = ratio.numerator, ratio.denominator  # p outputs per q inputs
    interior = np.zeros(n_out, bool)
    for phase in range(p):
        cols = np.arange(phase, n_out, p)
        if len(cols) == 0:
            continue
        t = cols[len(cols) // 2]
        template = weights[:, t]
        for o in cols:
            d = (o - t) // p * q
            shifted = np.zeros_like(template)
            if d >= 0:
                shifted[d:] = template[: n_in - d] if d < n_in else 0
                lost = template[n_in - d :] if d < n_in else template
            else:
                shifted[:d] = template[-d:]
                lost = template[:-d]
            interior[o] = not np.any(lost) and np.allclose(weights[:, o], shifted)
    return interior


def linear_map(eqn, sigs, operands) -> tuple[LinearMap, tuple[int, int]] | None:
    """Recognise a dot_general that resamples one spatial axis by a constant matrix."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    if lb or rb or len(lc) != 1 or sum(s is not None for s in sigs) != 1:
        return None
    side = 0 if sigs[0] is not None else 1
    sig, const = sigs[side], operands[1 - side]
    if const is None or np.ndim(const) != 2:
        return None
    sc, cc = (lc[0], rc[0]) if side == 0 else (rc[0], lc[0])
    if sc not in sig.axes:
        return None
    weights = np.asarray(const, np.float64)
    if cc == 1:
        weights = weights.T
    n = len(_shape(eqn.invars[side]))
    free = [a for a in range(n) if a != sc]
    # output axes: lhs free dims, then rhs free dims
    if side == 0:
        pos = {a: free.index(a) for a in free}
        new_pos = len(free)
    else:
        pos = {a: 1 + free.index(a) for a in free}
        new_pos = 0
    k = sig.axes.index(sc)
    axes = [0, 0]
    axes[k] = new_pos
    axes[1 - k] = pos[sig.axes[1 - k]]
    lm = LinearMap(axis=k, weights=weights, interior=_interior_columns(weights))
    return lm, (axes[0], axes[1])


@register(P.dot_general_p)
def _dot_general(eqn, sigs, *, dimension_numbers, operands=None, **_):
    (lc, rc), (lb, rb) = dimension_numbers
    ls, rs = sigs
    if ls is not None and rs is not None:
        return [None]
    nl, nr = len(_shape(eqn.invars[0])), len(_shape(eqn.invars[1]))
    sig, contracted = (ls, set(lc) | set(lb)) if ls is not None else (rs, set(rc) | set(rb))
    if set(sig.axes) & contracted:
        found = linear_map(eqn, sigs, operands or [None, None])
        if found is None:
            return [None]
        lm, axes = found
        n_in, n_out = lm.weights.shape
        stride = list(sig.stride)
        stride[lm.axis] = stride[lm.axis] * Fraction(n_in, n_out)
        out_shape = _shape(eqn.outvars[0])
        return [Spatial(axes=axes, size=(out_shape[axes[0]], out_shape[axes[1]]), stride=stride)]
    if ls is not None:
        free = [a for a in range(nl) if a not in lc and a not in lb]
        return [ls.with_axes(tuple(len(lb) + free.index(a) for a in ls.axes))]
    lfree = [a for a in range(nl) if a not in lc and a not in lb]
    rfree = [a for a in range(nr) if a not in rc and a not in rb]
    return [rs.with_axes(tuple(len(lb) + len(lfree) + rfree.index(a) for a in rs.axes))]
