"""Argument checks: the one form of dcjax's errors for a bad argument or setting.

Contract: `check(cond, message)` returns when ``cond`` holds and otherwise
raises ``ValueError("dcjax: " + message)``; the message names the argument,
what it got and what it takes.
"""

from __future__ import annotations

__all__ = ["check"]


def check(cond: bool, message: str) -> None:
    """Raise ``ValueError("dcjax: <message>")`` unless ``cond``."""
    if not cond:
        raise ValueError(f"dcjax: {message}")
