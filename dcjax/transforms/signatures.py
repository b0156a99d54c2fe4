"""Static spatial signatures of jaxpr variables, and the analysis pass.

A variable's spatial signature says which of its axes are the frame's H and W,
their sizes, and the cumulative stride ``(sy, sx)`` relative to the input frame
(a `fractions.Fraction`, so upsampling is exact). Variables without spatial axes
(parameters, constants, pooled vectors, logits) have none (``None``).

Signatures are derived once, when the model is traced, from shapes and
primitive params: one rule per primitive in `SIGNATURE_RULES`, keyed by the
primitive object, like jax's own interpreters. A rule is called only when at
least one operand is spatial; it receives the equation and the operands'
signatures and returns the outputs' signatures. A primitive without a rule
keeps the signature of a same-shaped spatial operand (its outputs are then
never reusable, see `regions`) and is reported in `Analysis.unsupported`.

`analyze` walks a closed jaxpr once, recursing into call-like primitives, and
records for every equation the operands' and outputs' signatures, whether the
equation depends on the frame, and which equations are reused layers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
from jax import lax
from jax.extend import core as jcore
from jax.extend.core import primitives as P

from dcjax.kernels.masked import plain_conv
from dcjax.transforms._registry import registrar


@dataclasses.dataclass(frozen=True)
class Spatial:
    """Where H and W live in a variable, and its stride relative to the frame.

    Attributes:
        axes: positions of the H and W axes in the variable's shape.
        size: the variable's sizes along those axes.
        stride: input pixels per step along H and W (``Fraction``).
    """

    axes: tuple[int, int]
    size: tuple[int, int]
    stride: tuple[Fraction, Fraction]

    def __post_init__(self) -> None:
        object.__setattr__(self, "stride", tuple(Fraction(s) for s in self.stride))
        object.__setattr__(self, "axes", tuple(int(a) for a in self.axes))
        object.__setattr__(self, "size", tuple(int(n) for n in self.size))

    def with_axes(self, axes: tuple[int, int]) -> Spatial:
        return dataclasses.replace(self, axes=axes)


# ---------------------------------------------------------------------------
# Call-like primitives: their sub-jaxpr is analysed and interpreted in place.

CALL_PRIMITIVES: dict[Any, str] = {
    P.jit_p: "jaxpr",
    P.remat_p: "jaxpr",
    P.custom_jvp_call_p: "call_jaxpr",
    P.custom_vjp_call_p: "call_jaxpr",
    P.closed_call_p: "call_jaxpr",
    P.call_p: "call_jaxpr",
}


def sub_jaxpr(eqn: jcore.JaxprEqn) -> jcore.ClosedJaxpr | None:
    """The sub-jaxpr of a call-like equation, closed, or None."""
    key = CALL_PRIMITIVES.get(eqn.primitive)
    if key is None:
        return None
    sub = eqn.params[key]
    if isinstance(sub, jcore.ClosedJaxpr):
        return sub
    return jcore.ClosedJaxpr(sub, ())


# ---------------------------------------------------------------------------
# The registry.

SignatureRule = Callable[..., list]
SIGNATURE_RULES: dict[Any, SignatureRule] = {}


register = registrar(SIGNATURE_RULES, "signature rule")


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(v.aval.shape)


def _first(sigs: Sequence[Spatial | None]) -> Spatial | None:
    return next((s for s in sigs if s is not None), None)


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


_ELEMENTWISE_SET = frozenset(ELEMENTWISE)


@register(*ELEMENTWISE)
def _elementwise(eqn, sigs, **_):
    return [_first(sigs) for _ in eqn.outvars]


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
    sig = _first(sigs)
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
    return _keep_unless(eqn, _first(sigs), dimensions)


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
    sig = _first(sigs)
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


class _NoRule(Exception):
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
        raise _NoRule
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
    sig = _first(sigs)
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


# ---------------------------------------------------------------------------
# The analysis pass.


@dataclasses.dataclass
class EqnInfo:
    """What the analysis knows about one equation."""

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


@dataclasses.dataclass
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


@dataclasses.dataclass
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


@dataclasses.dataclass
class Analysis:
    """Signatures of a jaxpr's variables and per-equation facts."""

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


_FOLD_LIMIT = 1 << 20


def _fold(eqn, values) -> list:
    """Evaluate an equation on constant operands (None where too large or failing)."""
    out_size = sum(int(np.prod(_shape(o))) for o in eqn.outvars)
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
    rhs = _shape(eqn.invars[1])
    per_out = int(np.prod([rhs[d] for d in dn.rhs_spec[2:]])) * rhs[dn.rhs_spec[1]]
    return 2 * int(np.prod(_shape(eqn.outvars[0]))) * per_out


def dot_flops(eqn) -> int:
    """2 x multiply-adds of a dot_general."""
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = _shape(eqn.invars[0])
    contracted = int(np.prod([lhs[d] for d in lhs_contract]))
    return 2 * int(np.prod(_shape(eqn.outvars[0]))) * contracted


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

    def walk(cj: jcore.ClosedJaxpr, sigs, dyn, consts=None) -> Analysis:
        env_sig: dict[Any, Any] = {}
        env_dyn: dict[Any, bool] = {}
        env_const: dict[Any, Any] = {}
        for v, s, d, c in zip(cj.jaxpr.invars, sigs, dyn, consts or [None] * len(sigs)):
            env_sig[v], env_dyn[v] = s, d
            if c is not None:
                env_const[v] = c
        for v, c in zip(cj.jaxpr.constvars, cj.consts):
            env_sig[v], env_dyn[v] = None, False
            env_const[v] = np.asarray(c) if np.size(c) <= _FOLD_LIMIT else None
        read_sig = lambda v: None if isinstance(v, jcore.Literal) else env_sig[v]
        read_dyn = lambda v: False if isinstance(v, jcore.Literal) else env_dyn[v]
        read_const = lambda v: v.val if isinstance(v, jcore.Literal) else env_const.get(v)
        infos = []
        for eqn in cj.jaxpr.eqns:
            isigs = [read_sig(v) for v in eqn.invars]
            idyn = [read_dyn(v) for v in eqn.invars]
            iconsts = [read_const(v) for v in eqn.invars]
            dynamic = any(idyn)
            info = EqnInfo(
                in_sigs=isigs,
                out_sigs=[None] * len(eqn.outvars),
                dynamic=dynamic,
                in_consts=iconsts,
            )
            if not dynamic and all(c is not None for c in iconsts):
                for v, c in zip(eqn.outvars, _fold(eqn, iconsts)):
                    env_const[v] = c
            if dynamic:
                sub = sub_jaxpr(eqn)
                if sub is not None:
                    info.sub = walk(sub, isigs, idyn, iconsts)
                    info.out_sigs = list(info.sub.out_sigs)
                elif any(s is not None for s in isigs):
                    rule = SIGNATURE_RULES.get(eqn.primitive)
                    if rule is not None:
                        try:
                            info.out_sigs = list(rule(eqn, isigs, **eqn.params, operands=iconsts))
                        except _NoRule:
                            rule = None
                    if rule is None:
                        info.supported = False
                        unsupported.add(eqn.primitive.name)
                        first = _first(isigs)
                        info.out_sigs = [
                            first if _shape(o) == _shape(eqn.invars[isigs.index(first)]) else None
                            for o in eqn.outvars
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
                if _is_dense(eqn, isigs, idyn):
                    info.dense = len(dense_layers)
                    dense_layers.append(_dense_layer(info.dense, eqn))
            for v, s in zip(eqn.outvars, info.out_sigs):
                env_sig[v], env_dyn[v] = s, dynamic
            infos.append(info)
        _find_epilogues(cj.jaxpr, infos, read_dyn)
        out_sigs = [read_sig(v) for v in cj.jaxpr.outvars]
        return Analysis(cj, list(sigs), out_sigs, infos, layers, unsupported, 0, dense_layers)

    result = walk(closed, list(in_sigs), list(in_dynamic))
    result.other_flops = other[0]
    return result


#: Primitives an epilogue may hold (`_find_epilogues`): elementwise, one output.
EPILOGUE_PRIMITIVES = frozenset(
    [
        P.add_p, P.sub_p, P.mul_p, P.div_p, P.max_p, P.min_p, P.neg_p, P.abs_p, P.sign_p,
        P.integer_pow_p, P.pow_p, P.square_p, P.sqrt_p, P.rsqrt_p, P.exp_p, P.exp2_p,
        P.expm1_p, P.log_p, P.log1p_p, P.logistic_p, P.tanh_p, P.erf_p, P.clamp_p,
        P.eq_p, P.ne_p, P.ge_p, P.gt_p, P.le_p, P.lt_p, P.select_n_p, P.and_p, P.or_p,
        P.not_p,
    ]
)  # fmt: skip


def elementwise_call(eqn) -> jcore.ClosedJaxpr | None:
    """The sub-jaxpr of a call-like equation that is elementwise in its inputs, or None.

    Such a call (``jax.nn.relu`` is a ``custom_jvp_call`` of ``max(x, 0)``;
    ``jax.nn.silu``, ``jax.nn.leaky_relu``, ``jnp.where`` and ``jnp.clip`` are
    ``jit`` calls) has one output, and every equation inside is elementwise on
    the call's inputs, its own results and scalar literals, or a call of such
    equations. Inputs and intermediate values have the output's shape or
    broadcast to it (scalars, ``(1, ..., 1, C)``); it may read an input more
    than once.
    """
    sub = sub_jaxpr(eqn)
    if sub is None or len(eqn.outvars) != 1:
        return None
    return sub if _elementwise_body(sub, tuple(eqn.outvars[0].aval.shape)) else None


def _broadcasts_to(s: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """A scalar, ``shape`` itself, or a per-channel shape ``(1, ..., 1, C)``."""
    return s == shape or _channel_shape(s, shape)


def _channel_shape(s: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    return s == () or (
        len(s) == len(shape) and all(d == 1 for d in s[:-1]) and s[-1] in (1, shape[-1])
    )


def _per_channel(v, shape: tuple[int, ...]) -> bool:
    """A literal scalar, or a variable broadcast along every axis but the last."""
    if isinstance(v, jcore.Literal):
        return np.ndim(v.val) == 0
    return _channel_shape(tuple(v.aval.shape), shape)


def _elementwise_body(closed: jcore.ClosedJaxpr, shape: tuple[int, ...]) -> bool:
    """Every equation elementwise (or a call of such) on inputs that broadcast to ``shape``."""
    jaxpr = closed.jaxpr
    if len(jaxpr.outvars) != 1 or jaxpr.constvars:
        return False
    if not all(_broadcasts_to(tuple(u.aval.shape), shape) for u in jaxpr.invars):
        return False
    known = set(jaxpr.invars)
    for e in jaxpr.eqns:
        for u in e.invars:
            if isinstance(u, jcore.Literal):
                if np.ndim(u.val) != 0:
                    return False
            elif u not in known:
                return False
        sub = sub_jaxpr(e)
        if sub is not None:
            if len(e.outvars) != 1 or not _elementwise_body(sub, shape):
                return False
        elif e.primitive not in _ELEMENTWISE_SET:
            return False
        if not all(_broadcasts_to(tuple(o.aval.shape), shape) for o in e.outvars):
            return False
        known.update(e.outvars)
    return jaxpr.outvars[0] in known


def _epilogue_eqn_ok(e, info: EqnInfo, inside: set, read_dyn, sig, shape) -> bool:
    """Whether equation ``e`` can join an epilogue whose values so far are ``inside``.

    ``e`` is an `EPILOGUE_PRIMITIVES` equation or an `elementwise_call`, and
    its operands are values of the epilogue, scalars or per-channel values that
    do not depend on the frame, or *pixel operands*: frame-dependent values
    with the layer output's spatial signature and shape (a residual branch).
    Its output has the layer output's shape.
    """
    if info.fused_into is not None or len(e.outvars) != 1:
        return False
    if tuple(e.outvars[0].aval.shape) != shape:
        return False
    if e.primitive not in EPILOGUE_PRIMITIVES and elementwise_call(e) is None:
        return False
    for u, s in zip(e.invars, info.in_sigs):
        if not isinstance(u, jcore.Literal) and u in inside:
            continue
        if isinstance(u, jcore.Literal) or not read_dyn(u):
            if not _per_channel(u, shape):
                return False
        elif s != sig or tuple(u.aval.shape) != shape:
            return False
    return True


def _find_epilogues(jaxpr: jcore.Jaxpr, infos: list[EqnInfo], read_dyn) -> None:
    """Mark each layer's epilogue: the elementwise equations it may fuse.

    An epilogue is grown from the layer's output, one consumer at a time (the
    earliest equation reading one of its values), while that consumer is
    elementwise (`EPILOGUE_PRIMITIVES`, or a call of elementwise equations
    such as ``jax.nn.relu`` or ``jnp.where``: `elementwise_call`) with the
    operands `_epilogue_eqn_ok` allows; the layer must be a convolution that
    `dcjax.kernels.masked_conv` computes (`dcjax.kernels.masked.plain_conv`).
    It is kept at the longest point where exactly one of its values is used
    outside it, with the layer output's shape and dtype: a bias,
    a batch norm in inference mode, a residual add and an activation (leaky
    ReLU and SiLU read their input twice) form one. Layers claim equations in
    order, so an equation is in at most one epilogue. The layer's
    `EqnInfo.epilogue` lists the equations (the last one gives the value) and
    each of them gets `EqnInfo.fused_into`.
    """
    outside: dict = {}  # uses of each variable: equations reading it, and outputs
    readers: dict = {}
    for j, e in enumerate(jaxpr.eqns):
        for u in e.invars:
            if not isinstance(u, jcore.Literal):
                outside[u] = outside.get(u, 0) + 1
                readers.setdefault(u, []).append(j)
    for u in jaxpr.outvars:
        if not isinstance(u, jcore.Literal):
            outside[u] = outside.get(u, 0) + 1
    for i, info in enumerate(infos):
        eqn = jaxpr.eqns[i]
        if info.layer is None or not plain_conv(eqn.params):
            continue
        v0 = eqn.outvars[0]
        shape, dtype, sig = tuple(v0.aval.shape), v0.aval.dtype, info.out_sigs[0]
        inside, left = {v0}, {v0: outside.get(v0, 0)}  # uses not yet in the epilogue
        region: list[int] = []
        best: list[int] = []
        while True:
            pending = [j for u, n in left.items() if n for j in readers.get(u, []) if j > i]
            pending = [j for j in pending if j not in region]
            if not pending:
                break
            j = min(pending)
            e = jaxpr.eqns[j]
            if not _epilogue_eqn_ok(e, infos[j], inside, read_dyn, sig, shape):
                break
            region.append(j)
            for u in e.invars:
                if not isinstance(u, jcore.Literal) and u in inside:
                    left[u] -= 1
            out = e.outvars[0]
            inside.add(out)
            left[out] = outside.get(out, 0)
            live = [u for u, n in left.items() if n]
            if live == [out] and out.aval.dtype == dtype:
                best = list(region)
        if best:
            info.epilogue = tuple(best)
            for j in best:
                infos[j].fused_into = i


def _layer(index: int, eqn, in_sig: Spatial, out_sig: Spatial) -> Layer:
    win = conv_window(eqn, in_sig)
    name = str(eqn.source_info.name_stack) or f"conv{index}"
    return Layer(
        index=index,
        name=name,
        primitive=eqn.primitive.name,
        in_shape=_shape(eqn.invars[0]),
        out_shape=_shape(eqn.outvars[0]),
        in_signature=in_sig,
        signature=out_sig,
        kernel=win.size,
        strides=win.strides,
        padding=win.padding,
        dilation=win.rhs_dilation,
        groups=eqn.params["feature_group_count"],
        flops=conv_flops(eqn),
        in_channels=_shape(eqn.invars[0])[eqn.params["dimension_numbers"].lhs_spec[1]],
        out_channels=_shape(eqn.invars[1])[eqn.params["dimension_numbers"].rhs_spec[0]],
        dtype=eqn.outvars[0].aval.dtype,
    )


def _is_dense(eqn, isigs, idyn) -> bool:
    """Whether a dynamic dot_general is a `DenseLayer` (see its docstring)."""
    lhs, rhs = _shape(eqn.invars[0]), _shape(eqn.invars[1])
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    return (
        idyn[0]
        and not idyn[1]
        and isigs[0] is None
        and len(lhs) >= 1
        and len(rhs) == 2
        and int(np.prod(lhs[:-1], dtype=np.int64)) == 1
        and tuple(lc) == (len(lhs) - 1,)
        and tuple(rc) == (0,)
        and not lb
        and not rb
    )


def _dense_layer(index: int, eqn) -> DenseLayer:
    k, n = _shape(eqn.invars[1])
    return DenseLayer(
        index=index,
        name=str(eqn.source_info.name_stack) or f"dense{index}",
        in_features=k,
        out_features=n,
        flops=dot_flops(eqn),
        dtype=eqn.outvars[0].aval.dtype,
    )
