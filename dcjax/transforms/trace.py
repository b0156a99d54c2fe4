"""Tracing a model into a closed jaxpr with the frame as its last input.

`trace_model` accepts a `flax.linen.Module` (called as
``module.apply(variables, x)``) or any callable ``fn(variables, x)``; ``x`` has
a leading batch axis of 1: ``(1, H, W, C)``. The variables are traced as
inputs, not baked in as constants, so the compiled step takes them as
arguments. The jaxpr's invars are the flattened variable leaves followed by
``x``; its outvars are the flattened outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jcore


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
) -> TracedModel:
    """Trace ``model`` on a ``(1, *frame_shape)`` input.

    Raises:
        TypeError: ``model`` is neither a Flax module nor callable.
        ValueError: ``frame_shape`` is malformed, or the model cannot be traced
            at that shape (the message carries the model's own error).
    """
    fn = as_function(model)
    frame_shape = check_frame_shape(frame_shape)
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
