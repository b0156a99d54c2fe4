"""Tracing a model into a closed jaxpr with the frame as its last input.

`trace_model` accepts a `flax.linen.Module` (called as
``module.apply(variables, x)``) or any callable ``fn(variables, x)``; ``x`` has
a leading batch axis of 1: ``(1, H, W, C)``. The variables are traced as
inputs, not baked in as constants, so the compiled step takes them as
arguments. The jaxpr's invars are the flattened variable leaves followed by
``x``; its outvars are the flattened outputs.

With a ``compute_dtype`` (one of `COMPUTE_DTYPES`), the model runs in that
floating-point type: its floating variables and a floating input are cast to
it before tracing (so every layer, and every cache the step keeps, has it),
and its floating outputs are cast to float32 at the end of the traced
function, so a caller reads float32 outputs whatever the model computed in.
Integer variables and inputs keep their types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jcore

__all__ = [
    "COMPUTE_DTYPES",
    "TracedModel",
    "as_function",
    "cast_floating",
    "check_frame_shape",
    "trace_model",
]

#: The floating-point types a model can be run in (`dcjax.Config.compute_dtype`).
COMPUTE_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class TracedModel:
    """A model traced once at a fixed input shape.

    Attributes:
        jaxpr: closed jaxpr; invars = variable leaves + the input.
        fn: the model as ``fn(variables, x)``.
        leaves: the flattened variables.
        out_tree: the treedef of the model's output.
        input_shape: ``(1, H, W, C)``.
        input_dtype: dtype of the traced input.
    """

    jaxpr: jcore.ClosedJaxpr
    fn: Callable[[Any, jax.Array], Any]
    leaves: list
    out_tree: Any
    input_shape: tuple[int, ...]
    input_dtype: Any


def as_function(model: Any) -> Callable[[Any, jax.Array], Any]:
    """A Flax module or a callable, as ``fn(variables, x)``."""
    try:
        import flax.linen as nn
    except ImportError:  # pragma: no cover - flax is a dependency
        nn = None
    if nn is not None and isinstance(model, nn.Module):
        return lambda variables, x: model.apply(variables, x)
    if callable(model):
        return model
    raise TypeError(
        "dcjax: model must be a flax.linen.Module or a callable fn(variables, x), "
        f"got {type(model).__name__}"
    )


def cast_floating(tree: Any, dtype: Any) -> Any:
    """``tree`` with its floating-point array leaves cast to ``dtype`` (others as they are)."""

    def cast(a):
        if hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating):
            return jnp.asarray(a, dtype)
        return a

    return jax.tree_util.tree_map(cast, tree)


def _float32_outputs(fn: Callable[[Any, jax.Array], Any]) -> Callable[[Any, jax.Array], Any]:
    """``fn`` with its floating outputs cast to float32."""
    return lambda variables, x: cast_floating(fn(variables, x), jnp.float32)


def check_frame_shape(frame_shape: Any) -> tuple[int, int, int]:
    """Validate ``frame_shape`` as (H, W, C) positive ints."""
    try:
        shape = tuple(int(d) for d in frame_shape)
    except TypeError:
        shape = ()
    if len(shape) != 3 or any(d < 1 for d in shape):
        raise ValueError(
            f"dcjax: frame_shape must be (H, W, C) with positive sizes, got {frame_shape!r}"
        )
    return shape  # type: ignore[return-value]


def trace_model(
    model: Any,
    variables: Any,
    frame_shape: tuple[int, int, int],
    input_dtype: Any = jnp.float32,
    compute_dtype: str | None = None,
) -> TracedModel:
    """Trace ``model`` on a ``(1, *frame_shape)`` input (in ``compute_dtype``
    where given: see the module docstring).

    Raises:
        TypeError: ``model`` is neither a Flax module nor callable.
        ValueError: ``frame_shape`` or ``compute_dtype`` is malformed, or the model cannot be traced
            at that shape (the message carries the model's own error).
    """
    fn = as_function(model)
    frame_shape = check_frame_shape(frame_shape)
    if compute_dtype is not None:
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"dcjax: compute_dtype must be None or one of {COMPUTE_DTYPES}, "
                f"got {compute_dtype!r}"
            )
        variables = cast_floating(variables, compute_dtype)
        if jnp.issubdtype(input_dtype, jnp.floating):
            input_dtype = jnp.dtype(compute_dtype)
        fn = _float32_outputs(fn)
    leaves, treedef = jax.tree_util.tree_flatten(variables)
    input_shape = (1, *frame_shape)
    out_tree: list = []

    def flat(leaves_, x):
        out = fn(jax.tree_util.tree_unflatten(treedef, leaves_), x)
        flat_out, tree = jax.tree_util.tree_flatten(out)
        out_tree.append(tree)
        return flat_out

    try:
        closed = jax.make_jaxpr(flat)(leaves, jax.ShapeDtypeStruct(input_shape, input_dtype))
    except Exception as e:  # the model's own failure, with its message
        raise ValueError(
            f"dcjax: the model could not be traced on a {input_shape} "
            f"{jnp.dtype(input_dtype).name} input: {type(e).__name__}: {e}"
        ) from e
    if not closed.jaxpr.outvars:
        raise ValueError("dcjax: the model returned no arrays; it must return array outputs")
    return TracedModel(
        jaxpr=closed,
        fn=fn,
        leaves=leaves,
        out_tree=out_tree[-1],
        input_shape=input_shape,
        input_dtype=jnp.dtype(input_dtype),
    )
