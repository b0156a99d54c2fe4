"""Recognisers: the geometry of a spatial operation along the frame's axes.

The signature rules (`dcjax.transforms.signature_rules`) and the mask rules
(`dcjax.transforms.regions`) both ask what an equation does to the frame's H
and W axes. These functions answer from the equation alone (and, for
resampling, its constant operand):

- `gather_pick`: a gather with a constant index map that picks rows along one
  spatial axis (nearest resampling, strided subsampling), as a `Pick`;
- `conv_window`, `reduce_window_window`: a windowed op's `Window` along H and
  W, and `conv_out_axes`, where a convolution puts them in its output;
- `linear_map`: a dot_general that resamples one spatial axis by a constant
  matrix (`jax.image.resize` with a linear-family method), as a `LinearMap`
  that says which output columns are translated copies of the interior
  pattern.

`gather_pick`, `conv_window` and `linear_map` return None when the equation
is not of their kind;
the callers then treat the equation as unsupported.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np

from dcjax.transforms.spatial import Spatial, var_shape

__all__ = [
    "LinearMap",
    "Pick",
    "Window",
    "conv_out_axes",
    "conv_window",
    "gather_pick",
    "linear_map",
    "reduce_window_window",
]


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
    shape = var_shape(eqn.invars[0])
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
    rhs_shape = var_shape(eqn.invars[1])
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
    n = len(var_shape(eqn.invars[side]))
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
