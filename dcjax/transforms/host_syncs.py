"""The host synchronisation points of a program: its data-dependent control flow.

Contract:

- `host_syncs(jaxpr)` lists, in program order, every ``while`` and ``cond``
  equation of ``jaxpr`` and of the jaxprs nested in it (calls, loop bodies,
  branches), as `HostSync` records. On XLA:GPU each of them reads a predicate
  on the host: a ``cond`` once per execution, a ``while`` once per trip (a
  ``lax.fori_loop`` with static bounds is a ``scan`` and is not listed). The
  device stalls until the host has the value, which at batch 1 costs more
  than the small pieces of work such control flow usually skips.
- The bodies of Pallas kernels (``pallas_call``) are not entered: their loops
  and conditions run on the device, inside the kernel.
- `sub_jaxprs(params)` returns the jaxprs held in an equation's parameters,
  the walk both this module and the FLOP counter of `dcjax.bench.zoo` take.
- A `HostSync` names the primitive and where it was made: the innermost frame
  of dcjax (or of the user's code) in the equation's traceback, as
  ``"file.py:line (function)"``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jax.extend import core

__all__ = ["HostSync", "host_syncs", "sub_jaxprs"]

#: the primitives whose predicate XLA:GPU reads on the host
CONTROL_PRIMITIVES = ("while", "cond")
#: primitives whose nested jaxprs run on the device (not walked)
DEVICE_KERNELS = ("pallas_call",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostSync:
    """One data-dependent control-flow equation (see the module docstring).

    Attributes:
        primitive: ``"while"`` or ``"cond"``.
        where: the source line that made it, ``"file.py:line (function)"``, or
            ``"?"`` when the equation carries no traceback.
    """

    primitive: str
    where: str


def sub_jaxprs(params: Mapping[str, Any]) -> list[core.Jaxpr]:
    """The jaxprs in an equation's ``params`` (closed ones opened), in order."""
    subs = []
    for value in params.values():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, core.ClosedJaxpr):
                subs.append(item.jaxpr)
            elif isinstance(item, core.Jaxpr):
                subs.append(item)
    return subs


def _where(eqn: Any) -> str:
    """``"file.py:line (function)"`` of the innermost frame of the equation's
    traceback outside JAX itself."""
    traceback = getattr(getattr(eqn, "source_info", None), "traceback", None)
    frames = getattr(traceback, "frames", None) or ()
    for frame in frames:  # innermost first
        name = frame.file_name.replace("\\", "/")
        if "/jax/" in name or "/jaxlib/" in name:
            continue
        return f"{name.rsplit('/', 1)[-1]}:{frame.line_num} ({frame.function_name})"
    return "?"


def host_syncs(jaxpr: core.Jaxpr | core.ClosedJaxpr) -> tuple[HostSync, ...]:
    """Every ``while`` and ``cond`` of ``jaxpr``, nested ones included, outside
    Pallas kernels (see the module docstring)."""
    if isinstance(jaxpr, core.ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    found: list[HostSync] = []

    def walk(j: core.Jaxpr) -> None:
        for eqn in j.eqns:
            name = eqn.primitive.name
            if name in CONTROL_PRIMITIVES:
                found.append(HostSync(primitive=name, where=_where(eqn)))
            if name in DEVICE_KERNELS:
                continue
            for sub in sub_jaxprs(eqn.params):
                walk(sub)

    walk(jaxpr)
    return tuple(found)
