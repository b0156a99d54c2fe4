"""The ONNX models that ship with dcjax, and the importer's entry point.

Contract: `onnx_file(name)` is the path of a bundled model (one of
`ONNX_FILES`, under ``dcjax/models/data/onnx`` beside its licence);
`from_onnx(path, input_shape)` is `dcjax.models.onnx.graph.from_onnx`, with a
one-line error naming the extra to install where the ``onnx`` package is
missing.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

__all__ = ["ONNX_FILES", "from_onnx", "onnx_file"]


#: The real ONNX models that ship with dcjax (``dcjax/models/data/onnx``, each
#: with its licence): CenterFace and MTCNN's three networks.
ONNX_FILES: tuple[str, ...] = ("centerface", "pnet", "rnet", "onet")


def onnx_file(name: str) -> Path:
    """The path of a bundled ONNX model (one of `ONNX_FILES`)."""
    if name not in ONNX_FILES:
        raise ValueError(f"dcjax: no bundled ONNX model {name!r}; choose one of {ONNX_FILES}")
    return Path(str(importlib.resources.files("dcjax.models").joinpath(f"data/onnx/{name}.onnx")))


def from_onnx(path, input_shape=None):
    """``(fn, params)``: the ONNX model in ``path`` as ``fn(params, x)``, ``x`` NHWC
    (see `dcjax.models.onnx.graph.from_onnx`). Needs ``pip install 'dcjax[onnx]'``."""
    try:
        from dcjax.models.onnx import from_onnx as _from_onnx
    except ModuleNotFoundError as e:
        if e.name != "onnx":
            raise
        raise ModuleNotFoundError(
            "dcjax: importing ONNX models needs the onnx package: pip install 'dcjax[onnx]'"
        ) from None
    return _from_onnx(path, input_shape)
