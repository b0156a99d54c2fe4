"""Each op of the importer against onnxruntime on a small generated graph."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.onnx.graphs import X_SHAPE, compare, rand, save

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

N = helper.make_node
I64 = np.int64


def conv(out="c", inp="x", w="w", b="b", **kw):
    return N("Conv", [inp, w] + ([b] if b else []), [out], **kw)


W3 = {"w": rand(4, 3, 3, 3, seed=1), "b": rand(4, seed=2)}

# name -> (nodes, initializers, opset)
CASES = {
    "conv_pads": ([conv("y", pads=[1, 1, 1, 1])], W3, 17),
    "conv_asymmetric_pads_stride": ([conv("y", pads=[0, 1, 2, 0], strides=[2, 2])], W3, 17),
    "conv_same_upper": ([conv("y", auto_pad="SAME_UPPER", strides=[2, 2])], W3, 17),
    "conv_same_lower": ([conv("y", auto_pad="SAME_LOWER", strides=[2, 2])], W3, 17),
    "conv_valid_dilated": ([conv("y", auto_pad="VALID", dilations=[2, 2])], W3, 17),
    "conv_groups": (
        [conv("y", w="wg", b=None, group=3, pads=[1, 1, 1, 1])],
        {"wg": rand(6, 1, 3, 3, seed=3)},
        17,
    ),
    "conv_1x1": ([conv("y", w="w1", b=None)], {"w1": rand(5, 3, 1, 1, seed=4)}, 17),
    "conv_transpose_k2s2": (
        [N("ConvTranspose", ["x", "wt", "bt"], ["y"], strides=[2, 2])],
        {"wt": rand(3, 4, 2, 2, seed=5), "bt": rand(4, seed=6)},
        17,
    ),
    "conv_transpose_pads_output_padding": (
        [
            N(
                "ConvTranspose",
                ["x", "wt"],
                ["y"],
                strides=[2, 2],
                pads=[1, 1, 1, 1],
                output_padding=[1, 0],
            )
        ],
        {"wt": rand(3, 2, 3, 3, seed=7)},
        17,
    ),
    "conv_transpose_groups_dilated": (
        [N("ConvTranspose", ["x", "wt"], ["y"], group=3, dilations=[2, 1])],
        {"wt": rand(3, 2, 3, 3, seed=8)},
        17,
    ),
    "conv_transpose_same_upper": (
        [N("ConvTranspose", ["x", "wt"], ["y"], strides=[2, 2], auto_pad="SAME_UPPER")],
        {"wt": rand(3, 2, 3, 3, seed=9)},
        17,
    ),
    "conv_transpose_output_shape": (
        [N("ConvTranspose", ["x", "wt"], ["y"], strides=[2, 2], output_shape=[17, 21])],
        {"wt": rand(3, 2, 3, 3, seed=10)},
        17,
    ),
    "batch_norm": (
        [N("BatchNormalization", ["x", "s", "bb", "m", "v"], ["y"], epsilon=1e-3)],
        {
            "s": rand(3, seed=1),
            "bb": rand(3, seed=2),
            "m": rand(3, seed=3),
            "v": np.abs(rand(3, seed=4)) + 0.5,
        },
        15,
    ),
    "max_pool": (
        [N("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
        {},
        17,
    ),
    "max_pool_ceil": (
        [N("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)],
        {},
        17,
    ),
    "max_pool_same_upper": (
        [N("MaxPool", ["x"], ["y"], kernel_shape=[2, 3], auto_pad="SAME_UPPER", strides=[2, 2])],
        {},
        17,
    ),
    "max_pool_dilated": (
        [N("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 0, 1, 1], dilations=[2, 2])],
        {},
        17,
    ),
    "avg_pool_exclude_pad": (
        [N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
        {},
        17,
    ),
    "avg_pool_include_pad": (
        [
            N(
                "AveragePool",
                ["x"],
                ["y"],
                kernel_shape=[3, 3],
                strides=[2, 2],
                pads=[1, 1, 1, 1],
                count_include_pad=1,
            )
        ],
        {},
        17,
    ),
    "avg_pool_ceil": (
        [N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)],
        {},
        17,
    ),
    "global_average_pool": ([N("GlobalAveragePool", ["x"], ["y"])], {}, 17),
    "global_max_pool": ([N("GlobalMaxPool", ["x"], ["y"])], {}, 17),
    "resize_nearest_asymmetric": (
        [
            N(
                "Resize",
                ["x", "", "sc"],
                ["y"],
                mode="nearest",
                coordinate_transformation_mode="asymmetric",
                nearest_mode="floor",
            )
        ],
        {"sc": np.array([1, 1, 2, 2], np.float32)},
        17,
    ),
    "resize_nearest_half_pixel": (
        [N("Resize", ["x", "", "sc"], ["y"], mode="nearest")],
        {"sc": np.array([1, 1, 1.5, 2.5], np.float32)},
        17,
    ),
    "resize_linear_half_pixel": (
        [N("Resize", ["x", "", "sc"], ["y"], mode="linear")],
        {"sc": np.array([1, 1, 2, 2], np.float32)},
        17,
    ),
    "resize_linear_align_corners_sizes": (
        [
            N(
                "Resize",
                ["x", "", "", "sz"],
                ["y"],
                mode="linear",
                coordinate_transformation_mode="align_corners",
            )
        ],
        {"sz": np.array([2, 3, 13, 7], I64)},
        17,
    ),
    "resize_linear_pytorch_half_pixel": (
        [
            N(
                "Resize",
                ["x", "", "sc"],
                ["y"],
                mode="linear",
                coordinate_transformation_mode="pytorch_half_pixel",
            )
        ],
        {"sc": np.array([1, 1, 0.5, 0.5], np.float32)},
        17,
    ),
    "upsample": (
        [N("Upsample", ["x", "sc"], ["y"], mode="nearest")],
        {"sc": np.array([1, 1, 2, 3], np.float32)},
        9,
    ),
    "pad_constant": (
        [N("Pad", ["x", "p", "cv"], ["y"])],
        {"p": np.array([0, 0, 1, 2, 0, 0, 3, 0], I64), "cv": np.array(1.5, np.float32)},
        17,
    ),
    "pad_reflect": (
        [N("Pad", ["x", "p"], ["y"], mode="reflect")],
        {"p": np.array([0, 0, 2, 1, 0, 0, 1, 2], I64)},
        17,
    ),
    "pad_edge_conv": (
        [N("Pad", ["x", "p"], ["px"], mode="edge"), conv("y", inp="px")],
        {"p": np.array([0, 0, 1, 1, 0, 0, 1, 1], I64), **W3},
        17,
    ),
    "relu_leaky_prelu": (
        [
            conv(),
            N("Relu", ["c"], ["r"]),
            N("LeakyRelu", ["r"], ["l"], alpha=0.2),
            N("PRelu", ["c", "sl"], ["p"]),
            N("Add", ["l", "p"], ["y"]),
        ],
        {**W3, "sl": rand(4, 1, 1, seed=5)},
        17,
    ),
    "clip_inputs": (
        [conv(), N("Clip", ["c", "lo", "hi"], ["y"])],
        {**W3, "lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)},
        17,
    ),
    "clip_attrs": ([N("Clip", ["x"], ["y"], min=-0.3, max=0.4)], {}, 6),
    "sigmoid_tanh_erf": (
        [
            N("Sigmoid", ["x"], ["s"]),
            N("Tanh", ["x"], ["t"]),
            N("Erf", ["x"], ["e"]),
            N("Sum", ["s", "t", "e"], ["y"]),
        ],
        {},
        17,
    ),
    "hard_sigmoid_swish": (
        [
            N("HardSigmoid", ["x"], ["h"], alpha=0.3, beta=0.4),
            N("HardSwish", ["x"], ["s"]),
            N("Mul", ["h", "s"], ["y"]),
        ],
        {},
        17,
    ),
    "softmax_channels": ([conv(), N("Softmax", ["c"], ["y"], axis=1)], W3, 13),
    "softmax_flatten_semantics": ([conv(), N("Softmax", ["c"], ["y"], axis=1)], W3, 11),
    "arithmetic_broadcast": (
        [
            conv(),
            N("Sub", ["c", "mean"], ["s"]),
            N("Div", ["s", "std"], ["d"]),
            N("Mul", ["d", "k"], ["m"]),
            N("Pow", ["m", "two"], ["p"]),
            N("Sqrt", ["p"], ["q"]),
            N("Add", ["q", "row"], ["y"]),
        ],
        {
            **W3,
            "mean": rand(4, 1, 1, seed=1),
            "std": np.abs(rand(4, 1, 1, seed=2)) + 1,
            "k": np.array(0.5, np.float32),
            "two": np.array(2.0, np.float32),
            "row": rand(8, seed=3),
        },
        17,
    ),
    "add_file_layout_tensor": (
        [conv("c", pads=[1, 1, 1, 1]), N("Add", ["c", "full"], ["y"])],
        {**W3, "full": rand(1, 4, 8, 10, seed=4)},
        17,
    ),
    "concat_split_slice": (
        [
            conv("c", pads=[1, 1, 1, 1]),
            N("Concat", ["c", "x"], ["cc"], axis=1),
            N("Split", ["cc", "sp"], ["a", "bsp"], axis=1),
            N("Slice", ["a", "st", "en", "ax", "stp"], ["sl"]),
            N("Relu", ["bsp"], ["r"]),
            N("Slice", ["r", "st", "en", "ax", "stp"], ["sr"]),
            N("Concat", ["sl", "sr"], ["y"], axis=-3),
        ],
        {
            **W3,
            "sp": np.array([2, 5], I64),
            "st": np.array([1, 0], I64),
            "en": np.array([7, 2**62], I64),
            "ax": np.array([2, 3], I64),
            "stp": np.array([2, 3], I64),
        },
        17,
    ),
    "reduce_mean_keepdims": ([conv(), N("ReduceMean", ["c"], ["y"], axes=[2, 3])], W3, 13),
    "reduce_mean_drop": ([conv(), N("ReduceMean", ["c"], ["y"], axes=[1], keepdims=0)], W3, 13),
    "reduce_sum_axes_input": (
        [conv(), N("ReduceSum", ["c", "ax"], ["y"])],
        {**W3, "ax": np.array([-1], I64)},
        13,
    ),
    "flatten_gemm": (
        [
            conv(),
            N("Flatten", ["c"], ["f"]),
            N("Gemm", ["f", "g", "gb"], ["y"], transB=1, alpha=0.5, beta=2.0),
        ],
        {**W3, "g": rand(7, 4 * 6 * 8, seed=5), "gb": rand(7, seed=6)},
        17,
    ),
    "global_pool_reshape_matmul": (
        [
            conv(),
            N("GlobalAveragePool", ["c"], ["g"]),
            N("Reshape", ["g", "sh"], ["r"]),
            N("MatMul", ["r", "mm"], ["y"]),
        ],
        {**W3, "sh": np.array([0, -1], I64), "mm": rand(4, 5, seed=7)},
        17,
    ),
    "transpose_squeeze_unsqueeze": (
        [
            conv(),
            N("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
            N("Unsqueeze", ["t", "ua"], ["u"]),
            N("Squeeze", ["u", "ua"], ["s"]),
            N("Transpose", ["s"], ["y"], perm=[0, 3, 1, 2]),
        ],
        {**W3, "ua": np.array([1], I64)},
        17,
    ),
    "shape_pattern_reshape": (  # what exporters emit for x.view(x.size(0), -1)
        [
            conv(),
            N("Shape", ["c"], ["shp"]),
            N("Gather", ["shp", "zero"], ["n"], axis=0),
            N("Unsqueeze", ["n", "ua"], ["n1"]),
            N("Concat", ["n1", "m1"], ["new"], axis=0),
            N("Cast", ["new"], ["newi"], to=TensorProto.INT64),
            N("Reshape", ["c", "newi"], ["y"]),
        ],
        {**W3, "zero": np.array(0, I64), "ua": np.array([0], I64), "m1": np.array([-1], I64)},
        17,
    ),
    "identity_constant_dropout": (
        [
            N("Constant", [], ["k"], value=helper.make_tensor("k", TensorProto.FLOAT, [1], [3.0])),
            N("Identity", ["x"], ["i"]),
            N("Dropout", ["i"], ["d"]),
            N("Mul", ["d", "k"], ["y"]),
        ],
        {},
        13,
    ),
    "max_min_where": (
        [
            N("Max", ["x", "z"], ["a"]),
            N("Min", ["x", "z"], ["b"]),
            N("Greater", ["x", "z"], ["g"]),
            N("Where", ["g", "a", "b"], ["y"]),
        ],
        {"z": rand(1, 3, 1, 1, seed=8)},
        17,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_onnxruntime(tmp_path, name):
    nodes, inits, opset = CASES[name]
    path = save(tmp_path / f"{name}.onnx", nodes, inits, opset=opset)
    compare(path, rand(*X_SHAPE, seed=11))


def test_every_registered_op_is_covered():
    """Each op the importer has a rule for appears in a case above (or below)."""
    from dcjax.models.onnx import supported_ops

    seen = {n.op_type for nodes, _, _ in CASES.values() for n in nodes}
    seen |= {
        "Exp",
        "Log",
        "Neg",
        "Abs",
        "Reciprocal",
        "Floor",
        "Ceil",
        "Not",
        "Equal",
        "Less",
        "Mean",
        "ReduceMax",
        "ReduceMin",
        "Size",
        "Range",
        "Expand",
        "ConstantOfShape",
    }
    assert set(supported_ops()) <= seen, set(supported_ops()) - seen


def test_elementwise_and_shape_helpers(tmp_path):
    """The remaining elementwise, reduction and shape-building ops."""
    nodes = [
        N("Abs", ["x"], ["a"]), N("Exp", ["x"], ["e"]), N("Add", ["a", "one"], ["a1"]),
        N("Log", ["a1"], ["l"]), N("Neg", ["l"], ["n"]), N("Reciprocal", ["a1"], ["r"]),
        N("Floor", ["x"], ["f"]), N("Ceil", ["x"], ["c"]),
        N("Mean", ["e", "n", "r", "f", "c"], ["m"]),
        N("Equal", ["f", "c"], ["eq"]), N("Not", ["eq"], ["ne"]),
        N("Less", ["x", "one"], ["lt"]),
        N("Where", ["ne", "m", "x"], ["w1"]), N("Where", ["lt", "w1", "m"], ["w"]),
        N("ReduceMax", ["w"], ["rmax"], axes=[1]), N("ReduceMin", ["w"], ["rmin"], axes=[2]),
        N("Size", ["x"], ["sz"]), N("Range", ["zero", "four", "one_i"], ["rg"]),
        N("ConstantOfShape", ["four1"], ["cs"], value=helper.make_tensor("v", TensorProto.FLOAT,
                                                                        [1], [2.0])),
        N("Cast", ["rg"], ["rgf"], to=TensorProto.FLOAT), N("Mul", ["rgf", "cs"], ["col"]),
        N("Expand", ["col", "shp"], ["ex"]), N("Add", ["rmax", "rmin"], ["s1"]),
        N("Cast", ["sz"], ["szf"], to=TensorProto.FLOAT), N("Mul", ["s1", "szf"], ["s2"]),
        N("Add", ["s2", "ex"], ["y"]),
    ]  # fmt: skip
    inits = {
        "one": np.array(1.0, np.float32), "zero": np.array(0, I64), "four": np.array(10, I64),
        "one_i": np.array(1, I64), "four1": np.array([10], I64),
        "shp": np.array([2, 1, 8, 10], I64),
    }  # fmt: skip
    # Outputs reach 3e3 (scaled by Size): float32 rounding of the sums is ~1e-4.
    compare(save(tmp_path / "misc.onnx", nodes, inits), rand(*X_SHAPE, seed=3), atol=1e-3)


def test_an_nhwc_model_that_transposes_its_input_is_fed_as_it_is(tmp_path):
    """A file whose input is NHWC (it transposes to NCHW itself, as TensorFlow
    exports do) takes x as it is, and the transpose costs nothing."""
    nodes = [N("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]), conv("c", inp="t"),
             N("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])]  # fmt: skip
    path = save(tmp_path / "nhwc.onnx", nodes, W3, x_shape=(2, 8, 10, 3))
    fn = compare(path, rand(2, 8, 10, 3, seed=2))
    assert not fn.nchw
    import jax

    from dcjax.models.onnx import from_onnx

    fn, params = from_onnx(path)
    prims = {e.primitive.name for e in jax.make_jaxpr(fn)(params, rand(2, 8, 10, 3)).eqns}
    assert "transpose" not in prims, prims
