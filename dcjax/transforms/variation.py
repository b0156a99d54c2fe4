"""Where a value that does not come from the frame varies: content anchored to positions.

A parameter or constant laid out over the frame's H and W (a learned
positional embedding, a CoordConv channel made by ``iota``, a per-pixel mean
image, the weights of a locally connected layer) holds content fixed to image
positions: it does not move with the frame. Added to, multiplied with or
concatenated to a map that does, it makes the result position-dependent, so a
pixel of the result may reuse the previous frame's value only where the shift
along that axis is zero.

Contract: `varying_axes` returns, for each output of a frame-independent
equation, a superset of the axes along which its value can differ (exact for
values folded to constants, from the value itself; conservative otherwise:
every axis longer than one, unless a rule in `VARIATION_RULES` knows better).
`anchored` returns, for a pointwise equation (`POINTWISE`: operands of the
output's shape, position for position) with a spatial output, whether the
output's H and W carry such content from a frame-independent operand. The
interpreter ANDs the output's mask with a zero shift along each anchored axis
(`dcjax.transforms.interpreter`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax.extend.core import primitives as P

from dcjax.transforms._registry import registrar
from dcjax.transforms.signature_rules import ELEMENTWISE
from dcjax.transforms.spatial import Spatial, var_shape

__all__ = [
    "POINTWISE",
    "VARIATION_RULES",
    "anchored",
    "constant_axes",
    "input_axes",
    "varying_axes",
]

Axes = frozenset
VariationRule = Callable[..., list]
VARIATION_RULES: dict[Any, VariationRule] = {}
register = registrar(VARIATION_RULES, "variation rule")

#: Primitives whose operands all have the output's shape and meet position by
#: position (lax broadcasts explicitly); concatenate and split along other axes.
POINTWISE = frozenset([*ELEMENTWISE, P.concatenate_p])


def input_axes(shape: Sequence[int]) -> Axes:
    """What is known of an unknown value (a parameter): every axis longer than one."""
    return Axes(a for a, n in enumerate(shape) if n > 1)


def constant_axes(value: Any) -> Axes:
    """The axes along which a known value differs."""
    v = np.asarray(value)
    return Axes(a for a in range(v.ndim) if v.shape[a] > 1 and np.any(np.diff(v, axis=a) != 0))


def varying_axes(eqn: Any, operands: Sequence[Axes]) -> list[Axes]:
    """Each output's varying axes, from the operands' (`VARIATION_RULES`, else conservative)."""
    rule = VARIATION_RULES.get(eqn.primitive)
    if rule is not None:
        return rule(eqn, operands, **eqn.params)
    return [input_axes(var_shape(o)) for o in eqn.outvars]


@register(*ELEMENTWISE)
def _elementwise(eqn, operands, **_):
    union = Axes().union(*operands)
    return [union for _ in eqn.outvars]


@register(P.broadcast_in_dim_p)
def _broadcast_in_dim(eqn, operands, *, broadcast_dimensions, **_):
    shape = var_shape(eqn.invars[0])
    return [Axes(broadcast_dimensions[a] for a in operands[0] if shape[a] > 1)]


@register(P.transpose_p)
def _transpose(eqn, operands, *, permutation, **_):
    perm = list(permutation)
    return [Axes(perm.index(a) for a in operands[0])]


@register(P.squeeze_p)
def _squeeze(eqn, operands, *, dimensions, **_):
    return [Axes(a - sum(d < a for d in dimensions) for a in operands[0])]


@register(P.iota_p)
def _iota(eqn, operands, *, dimension, shape, **_):
    return [Axes([dimension]) if shape[dimension] > 1 else Axes()]


@register(P.concatenate_p)
def _concatenate(eqn, operands, *, dimension, **_):
    return [Axes().union(*operands) | Axes([dimension])]


def anchored(eqn: Any, in_sigs: Sequence, dynamic: Sequence[bool], operands: Sequence,
             out_sig: Spatial | None) -> tuple[bool, bool]:  # fmt: skip
    """Whether a pointwise equation's output H and W hold frame-independent content
    that varies along them (``operands``: each operand's varying axes, None for
    frame-dependent ones)."""
    if out_sig is None or eqn.primitive not in POINTWISE:
        return (False, False)
    h, w = out_sig.axes
    varies = Axes().union(
        *(a for a, s, d in zip(operands, in_sigs, dynamic) if a is not None and s is None and not d)
    )
    return (h in varies, w in varies)
