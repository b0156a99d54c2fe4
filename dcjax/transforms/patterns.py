"""Patterns in an analysed jaxpr: layer epilogues and fully connected layers.

- `find_epilogues` marks, for each reused convolution, the elementwise
  equations after it that may be fused into it (a bias, an inference batch
  norm, a residual add, an activation): its epilogue (`EqnInfo.epilogue`,
  `EqnInfo.fused_into`). `elementwise_call` recognises the call-like
  equations (``jax.nn.relu``, ``jnp.where``...) an epilogue may hold.
- `is_dense` says whether a matrix product is a fully connected layer
  (`dcjax.transforms.records.DenseLayer`).
"""

from __future__ import annotations

import numpy as np
from jax.extend import core as jcore
from jax.extend.core import primitives as P

from dcjax.kernels.geometry import plain_conv
from dcjax.transforms.calls import sub_jaxpr
from dcjax.transforms.records import EqnInfo
from dcjax.transforms.signature_rules import ELEMENTWISE
from dcjax.transforms.spatial import var_shape

__all__ = ["EPILOGUE_PRIMITIVES", "elementwise_call", "find_epilogues", "is_dense"]

_ELEMENTWISE_SET = frozenset(ELEMENTWISE)

#: Primitives an epilogue may hold (`find_epilogues`): elementwise, one output.
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
    return sub if _elementwise_body(sub, var_shape(eqn.outvars[0])) else None


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
    return _channel_shape(var_shape(v), shape)


def _elementwise_body(closed: jcore.ClosedJaxpr, shape: tuple[int, ...]) -> bool:
    """Every equation elementwise (or a call of such) on inputs that broadcast to ``shape``."""
    jaxpr = closed.jaxpr
    if len(jaxpr.outvars) != 1 or jaxpr.constvars:
        return False
    if not all(_broadcasts_to(var_shape(u), shape) for u in jaxpr.invars):
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
        if not all(_broadcasts_to(var_shape(o), shape) for o in e.outvars):
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
    if info.fused_into is not None or len(e.outvars) != 1 or any(info.anchored):
        return False
    if var_shape(e.outvars[0]) != shape:
        return False
    if e.primitive not in EPILOGUE_PRIMITIVES and elementwise_call(e) is None:
        return False
    for u, s in zip(e.invars, info.in_sigs):
        if not isinstance(u, jcore.Literal) and u in inside:
            continue
        if isinstance(u, jcore.Literal) or not read_dyn(u):
            if not _per_channel(u, shape):
                return False
        elif s != sig or var_shape(u) != shape:
            return False
    return True


def find_epilogues(jaxpr: jcore.Jaxpr, infos: list[EqnInfo], read_dyn) -> None:
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
        shape, dtype, sig = var_shape(v0), v0.aval.dtype, info.out_sigs[0]
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


def is_dense(eqn, isigs, idyn) -> bool:
    """Whether a dynamic dot_general is a `DenseLayer` (see its docstring).

    ``isigs`` and ``idyn`` are its operands' signatures and whether each
    depends on the frame.
    """
    lhs, rhs = var_shape(eqn.invars[0]), var_shape(eqn.invars[1])
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
