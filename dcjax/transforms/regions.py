"""Reuse-mask rules: how reusable regions flow through each primitive.

For every spatial variable ``v`` with stride ``s``, the mask ``R_v`` (bool,
``(H_v, W_v)``) means ``v_t[.., i, j, ..] ~ v_{t-1}[.., i + My/sy, j + Mx/sx, ..]``
(DESIGN.md, "The contract" 3). Variables without spatial axes carry a scalar:
reusable as a whole or not. Parameters and constants carry the Python value
``True`` (always reusable) so that no work is spent on them.

One rule per primitive, in `MASK_RULES`, keyed by the primitive object. A rule
is called with a context (the frame's motion, see `MaskContext`), the equation,
the operands' and outputs' signatures and the operands' masks, and the
equation's params as keyword arguments; it returns one mask per output.

- windowed ops (convolution, reduce_window): an output pixel is reusable iff
  every input pixel of its window is (an AND-pool with the op's window, stride,
  padding and dilation). Padding is reusable only along an axis with zero shift.
- elementwise ops: AND of the operands' masks (non-spatial operands broadcast).
- structural ops (transpose, reshape keeping H and W, squeeze, concatenate or
  split along a non-spatial axis, reductions over non-spatial axes): AND,
  re-indexed. A reshape that merges axes into H or W (nearest upsampling by
  broadcast + reshape) repeats the mask. pad and slice pad or slice the mask.
- ops that mix spatial positions (reductions over H or W, dot_general over a
  spatial axis, flattening): the output is reusable as a whole only if the
  whole input mask is true and the motion is zero.
- any other primitive with spatial inputs: not reusable (never wrong). The
  interpreter reports its name once.

The caching interpreter additionally ANDs every new spatial mask with the
variable's alignment and in-range test (`MaskContext.valid`), so rules need not
handle pixels whose shifted position leaves the feature map.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import primitives as P

from dcjax.transforms import recognisers as R
from dcjax.transforms._registry import registrar
from dcjax.transforms.signature_rules import ELEMENTWISE
from dcjax.transforms.spatial import Spatial, first_spatial

Mask = Any  # True (static), a bool scalar array, or a bool (H_v, W_v) array


class MaskContext(Protocol):
    """What rules need to know about the current frame."""

    def zero_shift(self, sig: Spatial) -> tuple[jax.Array, jax.Array]:
        """Whether the shift at ``sig`` is zero along H and along W."""

    def collapse(self, mask: Mask) -> Mask:
        """Whole-variable reusability: all of ``mask`` and zero motion."""


MaskRule = Callable[..., list]
MASK_RULES: dict[Any, MaskRule] = {}


register = registrar(MASK_RULES, "mask rule")


# ---------------------------------------------------------------------------
# Mask algebra.


def and_all(masks: Sequence[Mask]) -> Mask:
    """AND of masks; static ``True`` masks cost nothing."""
    dyn = [m for m in masks if m is not True]
    if not dyn:
        return True
    out = dyn[0]
    for m in dyn[1:]:
        out = jnp.logical_and(out, m)
    return out


def all_false(sig: Spatial | None) -> jax.Array:
    return jnp.zeros(sig.size if sig is not None else (), bool)


def as_2d(mask: Mask, sig: Spatial) -> jax.Array:
    """A mask broadcast to the (H_v, W_v) of ``sig``."""
    return jnp.broadcast_to(jnp.asarray(mask, bool), sig.size)


def _combine(ctx, in_sigs, out_sig, masks) -> Mask:
    """AND of the operand masks for an output that keeps spatial structure.

    Spatial operands must agree with the output's signature (same stride and
    size) to be ANDed pixel by pixel; otherwise nothing is reusable.
    """
    m = and_all(masks)
    if out_sig is None:
        if any(s is not None for s in in_sigs):
            return ctx.collapse(m)
        return m
    for s in in_sigs:
        if s is not None and (s.size != out_sig.size or s.stride != out_sig.stride):
            return all_false(out_sig)
    return as_2d(m, out_sig)


#: Primitives that keep every H and W position where it is (their outputs keep
#: the operands' pixels in place, or lose H and W): their masks are ANDs,
#: re-indexed, and they need no in-range test of their own.
PASSTHROUGH = frozenset([
    *ELEMENTWISE, P.broadcast_in_dim_p, P.transpose_p, P.squeeze_p, P.concatenate_p,
    lax.split_p, P.reduce_sum_p, P.reduce_max_p, P.reduce_min_p, P.reduce_prod_p,
    P.reduce_and_p, P.reduce_or_p, P.reduce_xor_p, P.argmax_p, P.argmin_p, P.reduce_p,
    P.cumsum_p, P.cumprod_p, P.cummax_p, P.cummin_p, P.cumlogsumexp_p, P.rev_p, P.sort_p,
    P.top_k_p,
])  # fmt: skip


@register(*PASSTHROUGH)
def _passthrough(ctx, eqn, in_sigs, out_sigs, masks, **_):
    """AND of the operands, kept per pixel where the output keeps H and W."""
    return [_combine(ctx, in_sigs, o, masks) for o in out_sigs]


@register(P.reshape_p)
def _reshape(ctx, eqn, in_sigs, out_sigs, masks, **_):
    sig, out = in_sigs[0], out_sigs[0]
    if out is None:
        return [_combine(ctx, in_sigs, None, masks)]
    m = masks[0]
    ry, rx = out.size[0] // sig.size[0], out.size[1] // sig.size[1]
    if ry > 1:
        m = jnp.repeat(m, ry, axis=0)
    if rx > 1:
        m = jnp.repeat(m, rx, axis=1)
    return [m]


@register(P.pad_p)
def _pad(ctx, eqn, in_sigs, out_sigs, masks, *, padding_config, **_):
    sig = in_sigs[0]
    if sig is None:
        return [and_all(masks)]
    (lh, hh, ih), (lw, hw, iw) = (padding_config[a] for a in sig.axes)
    zy, zx = ctx.zero_shift(sig)
    m = lax.pad(masks[0], True, ((0, 0, ih), (0, 0, iw)))
    m = lax.pad(m, zy, ((lh, hh, 0), (0, 0, 0)))
    m = lax.pad(m, zx, ((0, 0, 0), (lw, hw, 0)))
    return [and_all([m, masks[1]])]


@register(P.slice_p)
def _slice(ctx, eqn, in_sigs, out_sigs, masks, *, start_indices, limit_indices, strides, **_):
    sig = in_sigs[0]
    if sig is None:
        return [masks[0]]
    st = strides or (1,) * len(start_indices)
    ay, ax = sig.axes
    m = masks[0][
        start_indices[ay] : limit_indices[ay] : st[ay],
        start_indices[ax] : limit_indices[ax] : st[ax],
    ]
    return [m]


def and_pool(ctx, mask: jax.Array, win: R.Window, sig: Spatial, out: Spatial) -> jax.Array:
    """Output pixels whose whole input window is reusable.

    Padding counts as reusable only along an axis whose shift is zero (padding
    moves relative to content when the frame shifts); the holes of an input
    dilation are constants and always reusable.
    """
    m = mask
    # one axis at a time, padding only the axis being pooled: XLA fuses each
    # pad into the slices of `_window_and` (padding both axes first was slower)
    for axis, zero in enumerate(ctx.zero_shift(sig)):
        none = (0, 0, 0)
        holes = [none, none]
        holes[axis] = (0, 0, win.lhs_dilation[axis] - 1)
        m = lax.pad(m, True, holes)
        edges = [none, none]
        edges[axis] = (*win.padding[axis], 0)
        m = lax.pad(m, zero, edges)
        m = _window_and(m, axis, win.size[axis], win.strides[axis], win.rhs_dilation[axis])
        m = lax.slice_in_dim(m, 0, out.size[axis], axis=axis)
    return m


#: Windows up to this many taps are ANDed as strided slices (`_window_and`).
_MAX_SLICED_TAPS = 16


def _window_and(m: jax.Array, axis: int, size: int, stride: int, dilation: int) -> jax.Array:
    """AND over VALID windows along one axis of a bool map.

    A rectangular window's AND is separable, and each axis's is the AND of
    ``size`` strided slices: one elementwise fusion, where XLA:CPU runs a
    ``reduce_window`` as a generic loop over every window element (see
    docs/performance-notes.md, "Reuse masks are AND-pooled as strided slices,
    one axis at a time"). Very wide windows (global pooling) keep
    ``reduce_window``.
    """
    n = m.shape[axis]
    span = (size - 1) * dilation + 1
    n_out = max((n - span) // stride + 1, 0)
    if size == 1 and stride == 1:
        return m
    if size > _MAX_SLICED_TAPS or n_out == 0:
        dims, strides, dil = [1, 1], [1, 1], [1, 1]
        dims[axis], strides[axis], dil[axis] = size, stride, dilation
        pooled = lax.reduce_window(
            m.astype(jnp.float32), jnp.float32(1.0), lax.min, window_dimensions=dims,
            window_strides=strides, padding="VALID", window_dilation=dil,
        )  # fmt: skip
        return pooled > 0.5
    out = None
    for j in range(size):
        start = j * dilation
        tap = lax.slice_in_dim(m, start, start + (n_out - 1) * stride + 1, stride, axis)
        out = tap if out is None else out & tap
    return out


@register(P.conv_general_dilated_p)
def _conv(ctx, eqn, in_sigs, out_sigs, masks, **_):
    sig, out = in_sigs[0], out_sigs[0]
    if out is None:
        return [_combine(ctx, in_sigs, None, masks)]
    m = and_pool(ctx, as_2d(masks[0], sig), R.conv_window(eqn, sig), sig, out)
    return [and_all([m, masks[1]])]


@register(P.reduce_window_sum_p, P.reduce_window_max_p, P.reduce_window_min_p, P.reduce_window_p)
def _reduce_window(ctx, eqn, in_sigs, out_sigs, masks, **_):
    sig = first_spatial(in_sigs)
    out = out_sigs[0]
    if out is None:
        return [_combine(ctx, in_sigs, None, masks) for _ in out_sigs]
    win = R.reduce_window_window(eqn, sig)
    m = and_pool(ctx, as_2d(and_all(masks), sig), win, sig, out)
    return [m for _ in out_sigs]


@register(P.dot_general_p)
def _dot_general(ctx, eqn, in_sigs, out_sigs, masks, *, dimension_numbers, operands=None, **_):
    """Per pixel where space is kept; resampling matrices AND over their support."""
    (lc, rc), (lb, rb) = dimension_numbers
    out = out_sigs[0]
    side = 0 if in_sigs[0] is not None else 1
    contracted = set(lc) | set(lb) if side == 0 else set(rc) | set(rb)
    if out is None or not set(in_sigs[side].axes) & contracted:
        return [_combine(ctx, in_sigs, out, masks)]
    lm, _ = R.linear_map(eqn, in_sigs, operands)
    support = jnp.asarray(lm.weights != 0, jnp.float32)  # (n_in, n_out)
    bad = jnp.tensordot((~masks[side]).astype(jnp.float32), support, ((lm.axis,), (0,)))
    m = jnp.moveaxis(bad, -1, lm.axis) < 0.5
    shift = ctx.shift(out)[lm.axis]
    interior = jnp.asarray(lm.interior)
    ok = (shift == 0) | (jnp.roll(interior, -shift) & interior)
    ok = ok[:, None] if lm.axis == 0 else ok[None, :]
    return [and_all([m & ok, masks[1 - side]])]


@register(P.gather_p)
def _gather(ctx, eqn, in_sigs, out_sigs, masks, *, operands, **_):
    """Nearest resampling along one axis: repeat or pick the mask's rows."""
    sig = in_sigs[0]
    pick, _ = R.gather_pick(eqn, sig, operands[1])
    m = masks[0]
    if pick.repeat > 1:
        m = jnp.repeat(m, pick.repeat, axis=pick.axis)
    else:
        n = out_sigs[0].size[pick.axis]
        idx = pick.offset + pick.step * jnp.arange(n)
        m = jnp.take(m, idx, axis=pick.axis)
    return [and_all([m, masks[1]])]


def unsupported(ctx, eqn, in_sigs, out_sigs, masks) -> list:
    """Conservative masks for a primitive without a rule: nothing reusable."""
    return [all_false(o) if o is not None else jnp.zeros((), bool) for o in out_sigs]
