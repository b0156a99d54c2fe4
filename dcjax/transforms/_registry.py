"""Per-primitive rule tables: the shared ``@register(*primitives)`` decorator.

Each analysis in `dcjax.transforms` (signatures, mask rules, lowerings) keeps a
``dict`` from primitive to rule, like jax's own interpreters; `registrar`
builds the decorator that fills one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R", bound=Callable[..., Any])


def registrar(table: dict[Any, Any], what: str) -> Callable[..., Callable[[R], R]]:
    """``register(*primitives)``: a decorator that files its function in ``table``."""

    def register(*primitives: Any) -> Callable[[R], R]:
        def deco(fn: R) -> R:
            for p in primitives:
                table[p] = fn
            return fn

        return deco

    register.__doc__ = f"Register a {what} for one or more primitives."
    return register
