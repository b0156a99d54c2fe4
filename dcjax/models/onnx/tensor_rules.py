"""Rules for ONNX's elementwise, activation and shape ops (see `context`).

Elementwise ops keep NHWC values NHWC (other operands are brought to NHWC,
`context.to_nhwc`); ops along an axis (Concat, Split, Slice, Softmax,
reductions) map the axis; ops that reorder elements (Reshape, Flatten,
Transpose, Squeeze, MatMul, Gather) take the file's layout. Shape arithmetic
(Shape, Gather, Cast, Concat, ... on static operands) is computed by NumPy
at import and leaves no trace in the imported function.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from onnx import helper

from dcjax.models.onnx.context import (
    NHWC,
    NodeContext,
    OnnxImportError,
    Value,
    held_axis,
    register,
    to_nhwc,
)

__all__: list[str] = []


def _broadcast(ctx: NodeContext) -> tuple[list, tuple[int, ...] | None]:
    """The operands as arrays of one layout: NHWC if any is NHWC (and all have rank <= 4)."""
    vals = [v for v in ctx.inputs if v is not None]
    if any(v.perm == NHWC for v in vals) and all(v.ndim <= 4 for v in vals):
        return [to_nhwc(v) for v in vals], NHWC
    return [v.file() for v in vals], None


def _elementwise(fn):
    def rule(ctx: NodeContext) -> Value:
        arrays, perm = _broadcast(ctx)
        return Value(fn(ctx.xp, *arrays), perm)

    return rule


def _divide(xp, a, b):
    if np.issubdtype(np.result_type(a.dtype, b.dtype), np.integer):
        return xp.trunc(a / b).astype(np.result_type(a.dtype, b.dtype))  # ONNX truncates
    return a / b


def _erf(xp, a):
    return np.asarray(jax.scipy.special.erf(a)) if xp is np else jax.scipy.special.erf(a)


for _op, _fn in {
    "Add": lambda xp, a, b: a + b,
    "Sub": lambda xp, a, b: a - b,
    "Mul": lambda xp, a, b: a * b,
    "Div": _divide,
    "Pow": lambda xp, a, b: xp.power(a, b).astype(a.dtype),
    "Equal": lambda xp, a, b: a == b,
    "Less": lambda xp, a, b: a < b,
    "Greater": lambda xp, a, b: a > b,
    "Where": lambda xp, c, a, b: xp.where(c, a, b),
    "PRelu": lambda xp, x, s: xp.where(x < 0, x * s, x),
    "Relu": lambda xp, a: xp.maximum(a, 0).astype(a.dtype),
    "Sigmoid": lambda xp, a: 1 / (1 + xp.exp(-a)) if xp is np else jax.nn.sigmoid(a),
    "Tanh": lambda xp, a: xp.tanh(a),
    "Erf": _erf,
    "Sqrt": lambda xp, a: xp.sqrt(a),
    "Exp": lambda xp, a: xp.exp(a),
    "Log": lambda xp, a: xp.log(a),
    "Neg": lambda xp, a: -a,
    "Abs": lambda xp, a: xp.abs(a),
    "Reciprocal": lambda xp, a: 1 / a,
    "Floor": lambda xp, a: xp.floor(a),
    "Ceil": lambda xp, a: xp.ceil(a),
    "Not": lambda xp, a: ~a,
}.items():
    register(_op)(_elementwise(_fn))


@register("Max", "Min", "Sum", "Mean")
def _variadic(ctx: NodeContext) -> Value:
    arrays, perm = _broadcast(ctx)
    xp = ctx.xp
    out = arrays[0]
    for a in arrays[1:]:
        out = {"Max": xp.maximum, "Min": xp.minimum}.get(ctx.op_type, lambda p, q: p + q)(out, a)
    if ctx.op_type == "Mean":
        out = out / len(arrays)
    return Value(out, perm)


@register("LeakyRelu", attrs=("alpha",))
def _leaky_relu(ctx: NodeContext) -> Value:
    v = ctx.inputs[0]
    alpha = ctx.attr("alpha", 0.01)
    return Value(ctx.xp.where(v.array < 0, v.array * alpha, v.array), v.perm)


@register("HardSigmoid", attrs=("alpha", "beta"))
def _hard_sigmoid(ctx: NodeContext) -> Value:
    v = ctx.inputs[0]
    a, b = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    return Value(ctx.xp.clip(v.array * a + b, 0.0, 1.0), v.perm)


@register("HardSwish")
def _hard_swish(ctx: NodeContext) -> Value:
    v = ctx.inputs[0]
    return Value(v.array * ctx.xp.clip(v.array / 6.0 + 0.5, 0.0, 1.0), v.perm)


@register("Clip", attrs=("min", "max"))
def _clip(ctx: NodeContext) -> Value:
    v = ctx.inputs[0]
    if ctx.opset < 11:
        lo, hi = ctx.attr("min"), ctx.attr("max")
    else:
        lo = None if ctx.input(1) is None else ctx.input(1).file()
        hi = None if ctx.input(2) is None else ctx.input(2).file()
    out = v.array
    if lo is not None:
        out = ctx.xp.maximum(out, lo)
    if hi is not None:
        out = ctx.xp.minimum(out, hi)
    return Value(out.astype(v.array.dtype), v.perm)


@register("Softmax", attrs=("axis",))
def _softmax(ctx: NodeContext) -> Value:
    v = ctx.inputs[0]
    axis = ctx.attr("axis", -1 if ctx.opset >= 13 else 1)
    if ctx.opset < 13 and axis % v.ndim != v.ndim - 1:
        # Before opset 13 Softmax normalises over all axes from `axis` on.
        x = v.file()
        shape = x.shape
        flat = jnp.reshape(x, (int(np.prod(shape[:axis])), -1))
        return Value(jnp.reshape(jax.nn.softmax(flat, axis=-1), shape))
    return Value(jax.nn.softmax(v.array, axis=held_axis(axis, v)), v.perm)


@register("Identity", "Dropout", attrs=("seed", "ratio", "is_test", "training_mode"))
def _identity(ctx: NodeContext) -> list[Value]:
    if ctx.op_type == "Dropout" and ctx.n_outputs > 1:
        raise OnnxImportError("its mask output is not supported (inference only)")
    return [ctx.inputs[0]]


@register(
    "Constant",
    attrs=("value", "value_float", "value_floats", "value_int", "value_ints", "sparse_value"),
)
def _constant(ctx: NodeContext) -> Value:
    for name, dtype in (
        ("value", None),
        ("value_float", np.float32),
        ("value_floats", np.float32),
        ("value_int", np.int64),
        ("value_ints", np.int64),
    ):
        if name in ctx.attrs:
            return Value(np.asarray(ctx.attrs[name], dtype))
    raise OnnxImportError("a Constant needs value, value_float(s) or value_int(s)")


@register("ConstantOfShape", attrs=("value",))
def _constant_of_shape(ctx: NodeContext) -> Value:
    shape = ctx.static(0, "shape")
    value = ctx.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    return Value(np.full(tuple(int(s) for s in shape), value.reshape(-1)[0], value.dtype))


@register("Shape", attrs=("start", "end"))
def _shape(ctx: NodeContext) -> Value:
    shape = np.asarray(ctx.inputs[0].file_shape, np.int64)
    return Value(shape[slice(ctx.attr("start", 0), ctx.attr("end"))])


@register("Size")
def _size(ctx: NodeContext) -> Value:
    return Value(np.asarray(int(np.prod(ctx.inputs[0].file_shape)), np.int64))


@register("Cast", attrs=("to", "saturate"))
def _cast(ctx: NodeContext) -> Value:
    v = ctx.inputs[0]
    dtype = helper.tensor_dtype_to_np_dtype(ctx.attr("to"))
    if v.static:
        return Value(v.array.astype(dtype), v.perm)
    return Value(v.array.astype(jnp.dtype(dtype) if dtype != np.int64 else jnp.int32), v.perm)


@register("Range")
def _range(ctx: NodeContext) -> Value:
    start, limit, delta = (ctx.static(i, n) for i, n in enumerate(("start", "limit", "delta")))
    return Value(np.arange(start, limit, delta).astype(start.dtype))


@register("Expand")
def _expand(ctx: NodeContext) -> Value:
    shape = tuple(int(s) for s in ctx.static(1, "shape"))
    x = ctx.file(0)
    out_shape = np.broadcast_shapes(tuple(x.shape), shape)
    return Value(ctx.xp.broadcast_to(x, out_shape))


@register("Concat", attrs=("axis",))
def _concat(ctx: NodeContext) -> Value:
    arrays, perm = _broadcast(ctx)
    vals = [v for v in ctx.inputs if v is not None]
    axis = ctx.attr("axis")
    held = held_axis(axis, Value(arrays[0], perm)) if perm else axis % vals[0].ndim
    return Value(ctx.xp.concatenate(arrays, axis=held), perm)


@register("Split", attrs=("axis", "split", "num_outputs"))
def _split(ctx: NodeContext) -> list[Value]:
    v = ctx.inputs[0]
    axis = held_axis(ctx.attr("axis", 0), v)
    size = v.array.shape[axis]
    split = ctx.attr("split") if ctx.opset < 13 else ctx.static(1, "split")
    if split is None:
        n = ctx.attr("num_outputs", ctx.n_outputs)
        step = -(-size // n)
        split = [min(step, size - i * step) for i in range(n)]
    bounds = np.cumsum([0, *[int(s) for s in split]])
    if bounds[-1] != size:
        raise OnnxImportError(f"split {list(split)} does not add up to the axis' size {size}")
    index = [slice(None)] * v.ndim
    out = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        index[axis] = slice(int(a), int(b))
        out.append(Value(v.array[tuple(index)], v.perm))
    return out


@register("Slice", attrs=("starts", "ends", "axes"))
def _slice(ctx: NodeContext) -> Value:
    v = ctx.inputs[0]
    if ctx.opset < 10:
        starts, ends, axes, steps = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes"), None
    else:
        starts, ends = ctx.static(1, "starts"), ctx.static(2, "ends")
        axes, steps = ctx.static(3, "axes"), ctx.static(4, "steps")
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    index = [slice(None)] * v.ndim
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        index[held_axis(a, v)] = slice(int(s), int(e), st)
    return Value(v.array[tuple(index)], v.perm)


def _axes(ctx: NodeContext, input_index: int, attr_until: int) -> list[int] | None:
    """Axes from the attribute (opsets before ``attr_until``) or the input."""
    if ctx.opset < attr_until:
        axes = ctx.attr("axes")
    else:
        axes = ctx.static(input_index, "axes")
    return None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]


@register(
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
    attrs=("axes", "keepdims", "noop_with_empty_axes"),
)  # fmt: skip
def _reduce(ctx: NodeContext) -> Value:
    v = ctx.inputs[0]
    axes = _axes(ctx, 1, 13 if ctx.op_type == "ReduceSum" else 18)
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return v
        axes = list(range(v.ndim))
    keep = bool(ctx.attr("keepdims", 1))
    reduce = getattr(ctx.xp, _REDUCE[ctx.op_type])
    if keep or v.perm is None:  # the rank stays, or nothing to map
        held = tuple(sorted(held_axis(a, v) for a in axes))
        return Value(reduce(v.array, axis=held, keepdims=keep), v.perm if keep else None)
    return Value(reduce(v.file(), axis=tuple(sorted(a % v.ndim for a in axes))))


_REDUCE = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min"}


@register("Flatten", attrs=("axis",))
def _flatten(ctx: NodeContext) -> Value:
    x = ctx.file(0)
    axis = ctx.attr("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    lead = int(np.prod(x.shape[:axis]))
    return Value(ctx.xp.reshape(x, (lead, -1)))


@register("Reshape", attrs=("allowzero",))
def _reshape(ctx: NodeContext) -> Value:
    x = ctx.file(0)
    shape = [int(s) for s in ctx.static(1, "shape")]
    if not ctx.attr("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    try:
        return Value(ctx.xp.reshape(x, shape))
    except (TypeError, ValueError) as e:
        raise OnnxImportError(f"cannot reshape {tuple(x.shape)} to {shape}: {e}") from None


@register("Transpose", attrs=("perm",))
def _transpose(ctx: NodeContext) -> Value:
    v = ctx.inputs[0]
    perm = tuple(ctx.attr("perm") or range(v.ndim)[::-1])
    if v.perm is not None:
        held = tuple(v.perm.index(p) for p in perm)  # the held axis of each file axis
    else:
        held = perm
    if v.ndim == 4 and not v.static and held == (0, 3, 1, 2):
        return Value(v.array, NHWC)  # NHWC held, NCHW in the file: nothing to move
    return Value(ctx.xp.transpose(v.array, held))


@register("Squeeze", attrs=("axes",))
def _squeeze(ctx: NodeContext) -> Value:
    x = ctx.file(0)
    axes = _axes(ctx, 1, 13)
    if axes is None:
        axes = [i for i, s in enumerate(x.shape) if s == 1]
    return Value(ctx.xp.squeeze(x, axis=tuple(a % x.ndim for a in axes)))


@register("Unsqueeze", attrs=("axes",))
def _unsqueeze(ctx: NodeContext) -> Value:
    x = ctx.file(0)
    axes = _axes(ctx, 1, 13)
    rank = x.ndim + len(axes)
    return Value(ctx.xp.expand_dims(x, tuple(sorted(a % rank for a in axes))))


@register("Gather", attrs=("axis",))
def _gather(ctx: NodeContext) -> Value:
    x, idx = ctx.file(0), ctx.file(1)
    axis = ctx.attr("axis", 0) % x.ndim
    if ctx.input(1).static:
        idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return Value(ctx.xp.take(x, idx, axis=axis))


@register("MatMul")
def _matmul(ctx: NodeContext) -> Value:
    return Value(ctx.xp.matmul(ctx.file(0), ctx.file(1)))


@register("Gemm", attrs=("alpha", "beta", "transA", "transB"))
def _gemm(ctx: NodeContext) -> Value:
    a, b = ctx.file(0), ctx.file(1)
    if ctx.attr("transA", 0):
        a = a.T
    if ctx.attr("transB", 0):
        b = b.T
    out = ctx.attr("alpha", 1.0) * (a @ b)
    if ctx.input(2) is not None:
        out = out + ctx.attr("beta", 1.0) * ctx.file(2)
    return Value(out)
