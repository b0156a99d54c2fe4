"""Small ONNX graphs built with the onnx package's helpers, run by onnxruntime
(the reference) and by the importer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from dcjax.models.onnx import from_onnx  # noqa: E402

X_SHAPE = (2, 3, 8, 10)


def save(path: Path, nodes, inits=None, opset=17, x_shape=X_SHAPE, outputs=("y",), dims=None):
    """Write a one-input graph (input ``x``, NCHW unless told) to ``path``."""
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims or list(x_shape))],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def compare(path: Path, x: np.ndarray, input_shape=None, rtol=1e-4, atol=1e-5):
    """Run ``path`` by onnxruntime on ``x`` (file layout) and by the importer;
    assert the outputs agree; return the importer's ``fn``."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: x})
    fn, params = from_onnx(path, input_shape)
    got = fn(params, np.transpose(x, (0, 2, 3, 1)) if fn.nchw else x)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g = np.asarray(g)
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w.astype(g.dtype), rtol=rtol, atol=atol)
    return fn


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
