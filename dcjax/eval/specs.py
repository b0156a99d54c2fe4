"""Zoo models as `ModelSpec`s: at their published input size or another.

`model_spec` builds a `dcjax.eval.registry.ModelSpec` for a zoo model (a Flax
model of `dcjax.models`, or a bundled ONNX model of `dcjax.models.onnx_zoo`)
with its per-pixel preprocessing, at its published input or at another
``input_size``: every zoo model takes any frame size its layers leave a pixel
of, and `input_size_error` says why a size is refused and which size nearest
to it is taken. `zoo_table` lists the zoo's models with their parameters and
convolution FLOPs, computed from traced shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dcjax import models
from dcjax.config import GuardConfig
from dcjax.eval.registry import ModelSpec

__all__ = ["input_size_error", "model_spec", "zoo_table"]


def model_spec(
    name: str,
    *,
    pretrained: bool = False,
    width: float = 1.0,
    input_size: tuple[int, int] | None = None,
    fps: float = 10.0,
    seed: int = 0,
) -> ModelSpec:
    """A `ModelSpec` for zoo model ``name`` with its own per-pixel preprocessing.

    ``input_size`` (H, W) builds it for frames of that size instead of its
    published input (`input_size_error` says which sizes it takes); a model
    with a dense head on flattened features gets random weights of that size's
    shapes, pretrained ``efficientnet_lite0`` the same weights at every size.
    """
    if name in models.onnx_zoo.names():
        return _onnx_spec(name, width=width, input_size=input_size, fps=fps)
    kwargs: dict[str, Any] = {"pretrained": pretrained, "seed": seed}
    if width != 1.0:
        kwargs["width"] = width
    if input_size is not None:
        kwargs["input_size"] = tuple(input_size)
    module, variables = models.create(name, **kwargs)
    h, w = input_size if input_size is not None else models.input_shape(name)[:2]
    return ModelSpec(
        name=name,
        module=module,
        variables=variables,
        frame_shape=(int(h), int(w), 3),
        preprocess=lambda f, _n=name: models.preprocess(_n, f),
        fps=fps,
    )


def _onnx_spec(
    name: str, *, width: float, input_size: tuple[int, int] | None, fps: float
) -> ModelSpec:
    """A `ModelSpec` for a bundled ONNX model (`dcjax.models.onnx_zoo`): its
    file's weights, frames fed as float32 pixel values (0 to 255)."""
    if width != 1.0:
        raise ValueError(f"dcjax: {name} is a real model of one width; width=1.0 only")
    onnx_info = models.onnx_zoo.info(name)
    model, params = models.onnx_zoo.create(name, input_size)
    h, w = input_size if input_size is not None else onnx_info.input_shape[:2]
    return ModelSpec(
        name=name,
        module=model,
        variables=params,
        frame_shape=(int(h), int(w), 3),
        preprocess=lambda f: jnp.asarray(f).astype(jnp.float32),
        fps=fps,
        boxes=onnx_info.boxes,
        heatmap=onnx_info.heatmap,
        guard=None if onnx_info.guard is None else GuardConfig(**onnx_info.guard),
    )


def _has_empty_value(jaxpr) -> bool:
    """Whether an operation of ``jaxpr`` (nested jaxprs included) makes an empty array."""
    from dcjax.transforms.calls import sub_jaxpr

    for eqn in jaxpr.eqns:
        sub = sub_jaxpr(eqn)
        if sub is not None and _has_empty_value(sub.jaxpr):
            return True
        if any(0 in getattr(v.aval, "shape", ()) for v in eqn.outvars):
            return True
    return False


def _takes_size(name: str, size: Sequence[int], width: float) -> bool:
    """Whether zoo model ``name`` builds and runs on (H, W) ``size`` frames with a
    pixel left in every layer (traced, nothing computed)."""
    spec = models.info(name)
    module = spec.factory(num_classes=spec.num_classes, width=width)
    x = jax.ShapeDtypeStruct((1, int(size[0]), int(size[1]), 3), jnp.float32)
    try:  # a layer left with no pixel: a dense head's initialiser divides by 0
        closed = jax.make_jaxpr(lambda x: module.init_with_output(jax.random.PRNGKey(0), x))(x)
    except (ArithmeticError, ValueError, TypeError):
        return False
    return not _has_empty_value(closed.jaxpr)


def input_size_error(name: str, input_size: Sequence[int], *, width: float = 1.0) -> str | None:
    """Why zoo model ``name`` cannot be built for (H, W) ``input_size`` frames, or None.

    Every zoo model takes any frame size at which each of its layers keeps at
    least one pixel, whether or not its strides divide the size: the models
    that pool globally run the same weights, those with a dense head on
    flattened features are built with a head of that size's shape; DeepCache's
    exactness invariants (tests/models/test_zoo_transform.py's stream) hold
    for every zoo model at sizes no stride divides as well (checked at
    70x90, 70x101, 110x125 and 140x150). A smaller size gets a message naming
    the nearest size the model takes, found by tracing the model (nothing is
    computed).
    """
    if name in models.onnx_zoo.names():
        return models.onnx_zoo.input_size_error(name, input_size)
    h, w = int(input_size[0]), int(input_size[1])
    if _takes_size(name, (h, w), width):
        return None
    published = models.input_shape(name)[:2]
    nearest = [h, w]
    for axis in (0, 1):
        probe = list(published)
        probe[axis] = nearest[axis]
        if _takes_size(name, probe, width):
            continue
        lo, top = nearest[axis], max(nearest[axis], published[axis])
        hi = min(max(2 * lo, lo + 1), top)  # the smallest size taken is near: gallop
        while hi < top and not _takes_size(name, _at(probe, axis, hi), width):
            lo, hi = hi, min(2 * hi, top)
        if hi == top and not _takes_size(name, _at(probe, axis, hi), width):
            continue
        while hi - lo > 1:  # lo fails, hi works
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _takes_size(name, _at(probe, axis, mid), width) else (mid, hi)
        nearest[axis] = hi
    if not _takes_size(name, nearest, width):  # the axes are not independent after all
        nearest = list(published)
    return (
        f"{h}x{w} frames are too small for {name} (a layer would have no pixel left); "
        f"the nearest size it takes is {nearest[0]}x{nearest[1]}"
    )


def _at(size: Sequence[int], axis: int, value: int) -> list[int]:
    out = list(size)
    out[axis] = value
    return out


def _conv_stats(jaxpr) -> tuple[int, int]:
    """(FLOPs, count) of the convolutions in a jaxpr, through nested jaxprs."""
    from jax.extend.core import primitives as P

    from dcjax.transforms.analysis import conv_flops
    from dcjax.transforms.calls import sub_jaxpr

    flops = count = 0
    for eqn in jaxpr.eqns:
        sub = sub_jaxpr(eqn)
        if sub is not None:
            f, c = _conv_stats(sub.jaxpr)
            flops, count = flops + f, count + c
        elif eqn.primitive is P.conv_general_dilated_p:
            flops, count = flops + conv_flops(eqn), count + 1
    return flops, count


def zoo_table() -> list[dict[str, Any]]:
    """Per zoo model: name, input shape, task, parameters, conv FLOPs and count,
    whether it has real weights and its source (``flax``, or ``onnx`` for the
    bundled ONNX models, listed when the ``onnx`` extra is installed).

    Computed from abstract variables or traced shapes (nothing is run).
    """
    rows = []
    for name in models.names():
        spec = models.info(name)
        variables = models.abstract_variables(name)
        module = spec.factory(num_classes=spec.num_classes)
        x = jax.ShapeDtypeStruct((1, *spec.input_shape), jnp.float32)
        closed = jax.make_jaxpr(module.apply)(variables, x)
        flops, count = _conv_stats(closed.jaxpr)
        params = sum(int(np.prod(v.shape)) for v in jax.tree_util.tree_leaves(
            variables.get("params", variables)))  # fmt: skip
        rows.append({
            "name": name,
            "input_shape": list(spec.input_shape),
            "task": spec.task,
            "params": params,
            "conv_flops": int(flops),
            "convs": count,
            "pretrained": spec.pretrained,
            "source": "flax",
        })  # fmt: skip
    for name in models.onnx_zoo.names():
        spec = models.onnx_zoo.info(name)
        try:
            model, params = models.onnx_zoo.create(name)
        except ModuleNotFoundError:  # the onnx extra is not installed
            continue
        x = jax.ShapeDtypeStruct((1, *spec.input_shape), jnp.float32)
        flops, count = _conv_stats(jax.make_jaxpr(model)(params, x).jaxpr)
        rows.append({
            "name": name,
            "input_shape": list(spec.input_shape),
            "task": spec.task,
            "params": sum(int(np.prod(np.shape(v))) for v in jax.tree_util.tree_leaves(params)),
            "conv_flops": int(flops),
            "convs": count,
            "pretrained": models.has_weights(name),
            "source": "onnx",
        })  # fmt: skip
    return rows
