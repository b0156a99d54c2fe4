"""The XLA options dcjax compiles its own programs with.

Contract. `compile_options()` is the mapping of XLA debug options that every
program dcjax builds and times is compiled with: the per-frame steps of
`dcjax.cached_model.CachedModel` (cached and dense), the streams' steps, and
the kernel and lowering timings the measured tuning makes, so that a choice is
timed the way it then runs. `jit(fn, **kwargs)` is ``jax.jit(fn,
compiler_options=compile_options(), **kwargs)``. The mapping is empty off CPU,
where the installed XLA does not know an option, and when the environment
variable `DEFAULTS_ENV` is ``1`` (XLA's defaults everywhere). The plain
baseline (``jax.jit(model.apply)``, the model as users write it) keeps XLA's
defaults.

On CPU the option is `CPU_LIBRARY_FUSIONS`: XLA hands convolutions to
YNNPACK, as by default, and computes dots with its own emitter instead of
handing each one to YNNPACK. A cached step's products are many small dots on
the dirty rows of a layer (and its 1x1 convolutions are dots too): measured on
CenterFace at 576x768, the cached step ran 3 ms a frame faster (of about 40)
and the dense step as fast as before (docs/performance-notes.md, "Dots on
XLA's emitter, convolutions on YNNPACK").
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["CPU_LIBRARY_FUSIONS", "DEFAULTS_ENV", "compile_options", "jit"]

#: XLA:CPU's ``xla_cpu_experimental_ynn_fusion_type`` as dcjax sets it: the
#: operations XLA hands to YNNPACK (convolutions only; XLA's default also hands
#: it every dot).
CPU_LIBRARY_FUSIONS = "LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"

#: Environment variable: ``1`` compiles dcjax's programs with XLA's defaults.
DEFAULTS_ENV = "DCJAX_XLA_DEFAULTS"

_OPTION = "xla_cpu_experimental_ynn_fusion_type"


def compile_options() -> Mapping[str, Any]:
    """The XLA options of dcjax's programs on the default backend (module docstring)."""
    if os.environ.get(DEFAULTS_ENV, "") == "1" or jax.default_backend() != "cpu":
        return {}
    return _cpu_options()


@functools.cache
def _cpu_options() -> Mapping[str, Any]:
    options = {_OPTION: CPU_LIBRARY_FUSIONS}
    try:  # an XLA that does not know the option rejects it at compile time
        jax.jit(jnp.negative).lower(jnp.zeros((1,), jnp.float32)).compile(dict(options))
    except Exception:  # noqa: BLE001 - any rejection means: XLA's defaults
        return {}
    return options


def jit(fn: Callable, **kwargs: Any) -> Any:
    """``jax.jit(fn, **kwargs)`` compiled with `compile_options` where it is
    called at the top level. Called inside another transformation (a user's
    ``jax.jit``, ``vmap`` or ``scan`` over the step), it is ``jax.jit(fn,
    **kwargs)`` and the outer program's options apply: JAX takes options only
    from the outermost ``jit``."""
    options = dict(compile_options())
    if not options:
        return jax.jit(fn, **kwargs)
    return _Jitted(jax.jit(fn, compiler_options=options, **kwargs), jax.jit(fn, **kwargs))


class _Jitted:
    """A jitted function with options at the top level and without them inside
    a trace; everything else (``lower``, ``trace``, ...) is the top-level one's."""

    def __init__(self, top: Any, nested: Any) -> None:
        self._top, self._nested = top, nested
        functools.update_wrapper(self, top)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves = jax.tree_util.tree_leaves((args, kwargs))
        if any(isinstance(x, jax.core.Tracer) for x in leaves):
            return self._nested(*args, **kwargs)
        try:
            return self._top(*args, **kwargs)
        except ValueError as e:  # inside a trace whose arguments are all constants
            if "compiler_options" not in str(e):
                raise
            return self._nested(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._top, name)
