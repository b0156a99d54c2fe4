"""Faster XLA:CPU formulations of primitives that are not convolutions.

Contract: ``bind(eqn, invals)`` returns what ``eqn.primitive.bind(*invals,
**eqn.params)`` returns, computed another way where `LOWERINGS` has a rule for
the primitive, the default backend is CPU and the rule accepts the equation's
parameters; otherwise it binds the primitive as it is. Every evaluation of a
traced model in dcjax goes through it (`dcjax.transforms.interpreter`): the
cached step, the no-cache baseline (``nocache``, whose default ``impl="fast"``
evaluates the same jaxpr), the other cached methods and the semantic exits, so
the baseline and the cached step compute these operations the same way. The
``plain`` baseline is ``module.apply`` under `jax.jit`, XLA's own lowering.

Why: the cached step recomputes pooling and normalisation on every frame (it
caches convolutions and their epilogues), so their cost is paid by both sides
of a speedup. XLA:CPU runs them slowly:

- ``reduce_window_max`` / ``reduce_window_min`` (max pooling) are a generic loop
  over every window element. A rectangular window's max is separable, and
  each axis's is the max of ``size`` strided slices: elementwise fusions.
  The result is identical bit for bit (max is exact). Windows along the
  channel (minor) axis keep ``reduce_window``: strided slices of the minor
  axis are slower. See docs/performance-notes.md, "Max pooling on CPU:
  strided-slice maxima instead of `reduce_window`".
- ``pow`` with a constant exponent (local response normalisation's
  ``scale ** -0.75``) is a scalar library call per element. For a non-integer
  multiple of 1/4, ``c = q / 4``, ``sqrt(sqrt(x)) ** q`` vectorises (two square
  roots and an integer power): within about ``|q|`` ulp of ``pow`` for every
  finite positive ``x``, and the same special values (NaN for ``x < 0``, as
  ``pow`` gives for a non-integer exponent; 0 or inf at ``x = 0`` by the sign
  of ``c``; ``x = -0`` as ``+0``). ``exp(c * log(x))`` would take any ``c``
  but loses ``|c ln x|`` ulp (4e-6 relative at ``x = 1e-30``), so other
  exponents keep ``pow``, as do integer ones (defined for negative ``x``).
  See docs/performance-notes.md, "Quarter powers on CPU: `sqrt(sqrt(x)) ** q`
  instead of `pow`".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

from dcjax.transforms._registry import registrar

__all__ = ["LOWERINGS", "bind", "register"]

#: A rule returns the equation's outputs, or None to bind the primitive as it is.
Rule = Callable[[jcore.JaxprEqn, Sequence[Any]], list | None]

#: primitive -> rule.
LOWERINGS: dict[Any, Rule] = {}

#: Windows wider than this along an axis keep ``reduce_window`` (global pooling).
_MAX_TAPS = 16

#: Exponents ``q / 4`` with ``|q|`` above this keep ``pow`` (the error grows with ``|q|``).
_MAX_QUARTERS = 16


register = registrar(LOWERINGS, "lowering")


def bind(eqn: jcore.JaxprEqn, invals: Sequence[Any]) -> list:
    """The outputs of ``eqn`` on ``invals`` (see the module docstring)."""
    rule = LOWERINGS.get(eqn.primitive)
    if rule is not None and jax.default_backend() == "cpu":
        outs = rule(eqn, invals)
        if outs is not None:
            return outs
    out = eqn.primitive.bind(*invals, **eqn.params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _extreme(dtype: Any, lowest: bool) -> Any:
    """The identity of max (``lowest``) or min for ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return not lowest
    if jnp.issubdtype(dtype, jnp.floating):
        return -np.inf if lowest else np.inf
    info = jnp.iinfo(dtype)
    return info.min if lowest else info.max


@register(lax.reduce_window_max_p, lax.reduce_window_min_p)
def _pool(eqn: jcore.JaxprEqn, invals: Sequence[Any]) -> list | None:
    """Max or min pooling as a max (min) of strided slices, one axis at a time."""
    (x,) = invals
    p = eqn.params
    dims, strides = p["window_dimensions"], p["window_strides"]
    if any(d != 1 for d in p["base_dilation"]) or not dims or dims[-1] != 1:
        return None
    if all(d == 1 for d in dims) or any(d > _MAX_TAPS for d in dims):
        return None
    is_max = eqn.primitive is lax.reduce_window_max_p
    combine = jnp.maximum if is_max else jnp.minimum
    fill = jnp.asarray(_extreme(x.dtype, is_max), x.dtype)
    y = x
    for axis, (size, stride, dil, pad) in enumerate(
        zip(dims, strides, p["window_dilation"], p["padding"])
    ):
        if size == 1 and stride == 1 and pad == (0, 0):
            continue
        edges = [(0, 0, 0)] * y.ndim
        edges[axis] = (*pad, 0)
        y = lax.pad(y, fill, edges)
        span = (size - 1) * dil + 1
        n_out = (y.shape[axis] - span) // stride + 1
        if n_out <= 0:
            return None
        out = None
        for j in range(size):
            start = j * dil
            tap = lax.slice_in_dim(y, start, start + (n_out - 1) * stride + 1, stride, axis)
            out = tap if out is None else combine(out, tap)
        y = out
    return [y]


@register(lax.pow_p)
def _pow(eqn: jcore.JaxprEqn, invals: Sequence[Any]) -> list | None:
    """``x ** (q / 4)`` for a constant non-integer exponent as ``sqrt(sqrt(x)) ** q``."""
    x, _ = invals
    lit = eqn.invars[1]
    if not isinstance(lit, jcore.Literal) or np.ndim(lit.val) != 0:
        return None
    q = 4.0 * float(lit.val)
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating) or q != round(q) or q % 4 == 0:
        return None
    if abs(q) > _MAX_QUARTERS:
        return None
    x = jnp.asarray(x)
    x = jnp.where(x == 0, jnp.zeros_like(x), x)  # -0 -> +0: pow(-0, c) is pow(+0, c) here
    return [lax.integer_pow(jnp.sqrt(jnp.sqrt(x)), int(q))]
