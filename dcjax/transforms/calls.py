"""Call-like primitives: equations that hold a sub-jaxpr.

The analysis (`dcjax.transforms.analysis.analyze`) recurses into the sub-jaxpr
of each equation whose primitive is in `CALL_PRIMITIVES`, and the interpreter
evaluates it in place, so a model's ``jax.jit``, ``jax.checkpoint`` and custom
derivative calls are analysed like inline code.
"""

from __future__ import annotations

from typing import Any

from jax.extend import core as jcore
from jax.extend.core import primitives as P

__all__ = ["CALL_PRIMITIVES", "sub_jaxpr"]

#: primitive -> the name of the param that holds its sub-jaxpr.
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
