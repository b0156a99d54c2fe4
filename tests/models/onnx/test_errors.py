"""Bad input to the importer: one clear error naming the file, the node or the argument."""

from __future__ import annotations

import numpy as np
import pytest

from dcjax.models.onnx import OnnxImportError, from_onnx
from tests.models.onnx.graphs import X_SHAPE, rand, save

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

N = helper.make_node
W3 = {"w": rand(4, 3, 3, 3, seed=1)}


def test_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no ONNX file"):
        from_onnx(tmp_path / "nope.onnx")


def test_a_file_that_is_not_onnx(tmp_path):
    path = tmp_path / "photo.onnx"
    path.write_bytes(b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4)  # a JPEG's start
    with pytest.raises(OnnxImportError, match=r"photo\.onnx is not an ONNX model"):
        from_onnx(path)


def test_a_truncated_file(tmp_path):
    good = save(tmp_path / "good.onnx", [N("Conv", ["x", "w"], ["y"])], W3)
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(OnnxImportError, match=r"cut\.onnx is not an ONNX model.*again"):
        from_onnx(cut)


def test_missing_external_data_names_the_data_file(tmp_path):
    graph = helper.make_graph(
        [N("Conv", ["x", "w"], ["y"])], "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X_SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(W3["w"], "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "ext.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="ext.bin",
              size_threshold=0)  # fmt: skip
    fn, params = from_onnx(path)  # with its data beside it, it loads
    assert fn(params, np.zeros((2, 8, 10, 3), np.float32)).shape == (2, 4, 6, 8)
    (tmp_path / "ext.bin").unlink()
    with pytest.raises(OnnxImportError, match=r"ext\.bin, not found.*together"):
        from_onnx(path)


def test_an_unsupported_op_names_the_node_and_the_op(tmp_path):
    path = save(tmp_path / "lrn.onnx", [N("LRN", ["x"], ["y"], size=3, name="norm1")])
    with pytest.raises(OnnxImportError, match=r"node 'norm1' \(LRN\): op LRN is not supported"):
        from_onnx(path)


def test_an_unknown_attribute_names_it(tmp_path):
    path = save(tmp_path / "a.onnx", [N("Relu", ["x"], ["y"], name="r", foo=1)])
    with pytest.raises(OnnxImportError, match=r"node 'r' \(Relu\): attribute 'foo'"):
        from_onnx(path)


def test_an_unsupported_attribute_value_names_it(tmp_path):
    nodes = [N("Resize", ["x", "", "sc"], ["y"], mode="cubic", name="up")]
    path = save(tmp_path / "cubic.onnx", nodes, {"sc": np.array([1, 1, 2, 2], np.float32)})
    fn, params = from_onnx(path)
    with pytest.raises(OnnxImportError, match=r"node 'up' \(Resize\): attribute mode='cubic'"):
        fn(params, np.zeros((2, 8, 10, 3), np.float32))


def test_an_input_shape_that_does_not_fit_the_file(tmp_path):
    path = save(tmp_path / "c.onnx", [N("Conv", ["x", "w"], ["y"])], W3)
    with pytest.raises(OnnxImportError, match=r"input_shape=\(1, 4, 8, 10\) does not fit"):
        from_onnx(path, input_shape=(1, 4, 8, 10))
    fn, params = from_onnx(path, input_shape=(1, 3, 16, 16))
    with pytest.raises(OnnxImportError, match=r"takes x of shape \(1, 16, 16, 3\).*input_shape"):
        fn(params, np.zeros((1, 8, 10, 3), np.float32))


def test_a_size_the_model_cannot_take_names_the_node(tmp_path):
    nodes = [N("Conv", ["x", "w"], ["c"]), N("Flatten", ["c"], ["f"]),
             N("MatMul", ["f", "m"], ["y"], name="fc")]  # fmt: skip
    path = save(tmp_path / "fc.onnx", nodes, {**W3, "m": rand(4 * 6 * 8, 5)})
    fn, params = from_onnx(path, input_shape=(2, 3, 8, 10))  # the size the weights fit
    assert fn(params, np.zeros((2, 8, 10, 3), np.float32)).shape == (2, 5)
    # another size fails at import, naming the node, not at the first frame
    with pytest.raises(
        OnnxImportError, match=r"fc\.onnx: node 'fc' \(MatMul\) fails .*check input_shape"
    ):
        from_onnx(path, input_shape=(2, 3, 12, 12))
    fn, params = from_onnx(path)  # no size given: nothing to check until it runs
    with pytest.raises(OnnxImportError, match=r"node 'fc' \(MatMul\) fails .*check input_shape"):
        fn(params, np.zeros((2, 12, 12, 3), np.float32))


def test_several_inputs_are_refused(tmp_path):
    graph = helper.make_graph(
        [N("Add", ["x", "z"], ["y"])], "t",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 3, 4, 4]) for n in "xz"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(OnnxImportError, match=r"2 inputs \(x, z\)"):
        from_onnx(path)
