"""The one place dcjax reads JAX's private modules (``jax._src``).

Contract: `backends_made()` says whether JAX has made its backends already
(settings JAX reads when it makes its CPU client, such as
``jax_cpu_enable_async_dispatch``, take no effect after that). Where the
private function is missing (another JAX version), it answers False: not
known to be made.
"""

from __future__ import annotations

__all__ = ["backends_made"]


def backends_made() -> bool:
    """Whether JAX has made its backends (module docstring)."""
    try:
        from jax._src import xla_bridge
    except ImportError:
        return False
    made = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(made()) if callable(made) else False
