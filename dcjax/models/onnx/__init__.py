"""ONNX models as plain JAX functions that `dcjax.deepcache.transform` accepts.

``fn, params = from_onnx("model.onnx", input_shape=(1, 3, 576, 768))`` gives
``fn(params, x)`` with ``x`` NHWC (see `dcjax.models.onnx.graph`). The rules,
one per ONNX op, are in `tensor_rules` and `nn_rules`; `supported_ops` lists
them. Needs the ``onnx`` package (``pip install dcjax[onnx]``).
"""

from __future__ import annotations

from dcjax.models.onnx.context import RULES, OnnxImportError
from dcjax.models.onnx.graph import from_onnx, read

__all__ = ["OnnxImportError", "from_onnx", "read", "supported_ops"]


def supported_ops() -> tuple[str, ...]:
    """The ONNX op types the importer computes."""
    return tuple(sorted(RULES))
