"""Rules for ONNX's convolution, normalisation, pooling, padding and resizing ops.

Every 4-D operand is taken as NHWC (`context.to_nhwc`) and every 4-D result is
NHWC: convolutions are `lax.conv_general_dilated` with ``("NHWC", "HWIO",
"NHWC")`` like Flax's, pooling is `lax.reduce_window` over (1, kh, kw, 1),
so `dcjax.deepcache.transform` sees the same primitives as in the zoo's Flax
models. Weights stored OIHW in the file are held HWIO (`graph` converts
initializers once, at import).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from dcjax.models.onnx.context import NHWC, NodeContext, OnnxImportError, Value, register, to_nhwc

__all__: list[str] = []

#: How an OIHW weight is held: ``held = transpose(file, HWIO)``.
HWIO: tuple[int, ...] = (2, 3, 1, 0)

_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _spatial(ctx: NodeContext, i: int = 0) -> jnp.ndarray:
    v = ctx.input(i)
    if v is None or v.ndim != 4:
        raise OnnxImportError(
            f"only 2-D {ctx.op_type} (a 4-D input) is supported, got rank "
            f"{None if v is None else v.ndim}"
        )
    return to_nhwc(v)


def _pads(ctx: NodeContext, size, kernel, strides, dilations) -> list[tuple[int, int]]:
    """(begin, end) padding per spatial axis from ``pads`` or ``auto_pad``."""
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = ctx.attr("pads") or [0] * 4
        return [(int(pads[0]), int(pads[2])), (int(pads[1]), int(pads[3]))]
    if auto == "VALID":
        return [(0, 0), (0, 0)]
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.unsupported("auto_pad", auto, "NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    out = []
    for n, k, s, d in zip(size, kernel, strides, dilations, strict=True):
        total = max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
        small, big = total // 2, total - total // 2
        out.append((small, big) if auto == "SAME_UPPER" else (big, small))
    return out


def _weight_hwio(ctx: NodeContext, i: int) -> jnp.ndarray:
    v = ctx.input(i)
    if v.perm == HWIO:
        return v.array
    return (np if v.static else jnp).transpose(v.file(), HWIO)


def _with_bias(ctx: NodeContext, y, i: int):
    return y if ctx.input(i) is None else y + jnp.reshape(ctx.file(i), (1, 1, 1, -1))


@register("Conv", attrs=_CONV_ATTRS)
def _conv(ctx: NodeContext) -> Value:
    x = _spatial(ctx)
    w = _weight_hwio(ctx, 1)
    kernel = tuple(w.shape[:2])
    strides = tuple(ctx.attr("strides") or (1, 1))
    dilations = tuple(ctx.attr("dilations") or (1, 1))
    pads = _pads(ctx, x.shape[1:3], kernel, strides, dilations)
    y = lax.conv_general_dilated(
        x, w, strides, pads, rhs_dilation=dilations,
        dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=ctx.attr("group", 1),
    )  # fmt: skip
    return Value(_with_bias(ctx, y, 2), NHWC)


@register("ConvTranspose", attrs=(*_CONV_ATTRS, "output_padding", "output_shape"))
def _conv_transpose(ctx: NodeContext) -> Value:
    x = _spatial(ctx)
    w = ctx.file(1)  # (Cin, Cout / group, kh, kw)
    group = ctx.attr("group", 1)
    cin, cout_g, kh, kw = w.shape
    strides = tuple(ctx.attr("strides") or (1, 1))
    dil = tuple(ctx.attr("dilations") or (1, 1))
    out_pad = tuple(ctx.attr("output_padding") or (0, 0))
    size = x.shape[1:3]
    span = [(k - 1) * d + 1 for k, d in zip((kh, kw), dil, strict=True)]
    auto = ctx.attr("auto_pad", "NOTSET")
    out_shape = ctx.attr("output_shape")
    if out_shape is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = [n * s for n, s in zip(size, strides, strict=True)]
    if out_shape is not None:
        out_shape = list(out_shape)[-2:]
        pads = []
        for n, s, k, op, o in zip(size, strides, span, out_pad, out_shape, strict=True):
            total = s * (n - 1) + op + k - o
            half = total // 2
            pads.append((half, total - half) if auto == "SAME_UPPER" else (total - half, half))
    elif auto in ("NOTSET", "", "VALID"):
        p = [0] * 4 if auto == "VALID" else (ctx.attr("pads") or [0] * 4)
        pads = [(int(p[0]), int(p[2])), (int(p[1]), int(p[3]))]
    else:
        raise ctx.unsupported("auto_pad", auto, "NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    # A transposed convolution is a convolution of the input dilated by the
    # strides with the kernel flipped and its in/out roles swapped.
    xp = np if ctx.input(1).static else jnp
    w = xp.reshape(w, (group, cin // group, cout_g, kh, kw))
    w = xp.transpose(w, (3, 4, 1, 0, 2)).reshape(kh, kw, cin // group, group * cout_g)
    w = w[::-1, ::-1]
    padding = [
        (k - 1 - b, k - 1 - e + op) for k, (b, e), op in zip(span, pads, out_pad, strict=True)
    ]
    y = lax.conv_general_dilated(
        x, w, (1, 1), padding, lhs_dilation=strides, rhs_dilation=dil,
        dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=group,
    )  # fmt: skip
    return Value(_with_bias(ctx, y, 2), NHWC)


@register("BatchNormalization", attrs=("epsilon", "momentum", "training_mode", "spatial"))
def _batch_norm(ctx: NodeContext) -> Value:
    if ctx.attr("training_mode", 0) or ctx.n_outputs > 1:
        raise OnnxImportError("training mode (running statistics as outputs) is not supported")
    if not ctx.attr("spatial", 1):
        raise ctx.unsupported("spatial", 0, "spatial=1 only")
    v = ctx.inputs[0]
    scale, bias, mean, var = (ctx.file(i) for i in range(1, 5))
    inv = scale / jnp.sqrt(var + ctx.attr("epsilon", 1e-5))
    shift = bias - mean * inv
    if v.ndim == 4:
        x = to_nhwc(v)
        return Value(x * inv.reshape(1, 1, 1, -1) + shift.reshape(1, 1, 1, -1), NHWC)
    x = v.file()
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return Value(x * inv.reshape(shape) + shift.reshape(shape))


def _pool_window(ctx: NodeContext, x) -> tuple[tuple, tuple, tuple, list, list, list]:
    """Kernel, strides, dilations, explicit pads, the extra end padding of
    ceil_mode, and both as `lax.reduce_window` padding of an NHWC value."""
    kernel = tuple(ctx.attr("kernel_shape"))
    strides = tuple(ctx.attr("strides") or (1, 1))
    dil = tuple(ctx.attr("dilations") or (1, 1))
    pads = _pads(ctx, x.shape[1:3], kernel, strides, dil)
    extra = []
    for n, k, s, d, (b, e) in zip(x.shape[1:3], kernel, strides, dil, pads, strict=True):
        span = (k - 1) * d + 1
        if ctx.attr("ceil_mode", 0):
            out = -(-(n + b + e - span) // s) + 1
            if (out - 1) * s >= n + b:  # the last window must start inside the input
                out -= 1
        else:
            out = (n + b + e - span) // s + 1
        extra.append(max((out - 1) * s + span - (n + b + e), 0))
    padding = [(0, 0), *((b, e + x_) for (b, e), x_ in zip(pads, extra, strict=True)), (0, 0)]
    return kernel, strides, dil, pads, extra, padding


_POOL_ATTRS = ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides")


@register("MaxPool", attrs=(*_POOL_ATTRS, "storage_order"))
def _max_pool(ctx: NodeContext) -> Value:
    if ctx.n_outputs > 1:
        raise OnnxImportError("its Indices output is not supported")
    x = _spatial(ctx)
    kernel, strides, dil, _, _, padding = _pool_window(ctx, x)
    y = lax.reduce_window(
        x, -jnp.inf, lax.max, (1, *kernel, 1), (1, *strides, 1), padding,
        window_dilation=(1, *dil, 1),
    )  # fmt: skip
    return Value(y, NHWC)


@register("AveragePool", attrs=(*_POOL_ATTRS, "count_include_pad"))
def _avg_pool(ctx: NodeContext) -> Value:
    x = _spatial(ctx)
    kernel, strides, dil, pads, extra, padding = _pool_window(ctx, x)
    dims, steps = (1, *kernel, 1), (1, *strides, 1)
    total = lax.reduce_window(x, 0.0, lax.add, dims, steps, padding, window_dilation=(1, *dil, 1))
    # The divisor: the window's pixels inside the input, or inside the input and
    # its explicit padding (count_include_pad); ceil_mode's extra never counts.
    n, h, w, _ = x.shape
    inside = np.ones((1, h, w, 1), np.float32)
    if ctx.attr("count_include_pad", 0):
        inside = np.pad(inside, [(0, 0), *pads, (0, 0)], constant_values=1.0)
        padding = [(0, 0)] + [(0, x_) for x_ in extra] + [(0, 0)]
    count = lax.reduce_window(
        jnp.asarray(inside), 0.0, lax.add, dims, steps, padding, window_dilation=(1, *dil, 1)
    )
    return Value(total / count, NHWC)


@register("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx: NodeContext) -> Value:
    x = _spatial(ctx)
    fn = jnp.mean if ctx.op_type == "GlobalAveragePool" else jnp.max
    return Value(fn(x, axis=(1, 2), keepdims=True), NHWC)


@register("Pad", attrs=("mode", "pads", "value"))
def _pad(ctx: NodeContext) -> Value:
    v = ctx.inputs[0]
    mode = ctx.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        raise ctx.unsupported("mode", mode, "constant, reflect, edge")
    if ctx.opset < 11:
        pads, value, axes = ctx.attr("pads"), ctx.attr("value", 0.0), None
    else:
        pads = ctx.static(1, "pads")
        cv = ctx.static(2, "constant_value")
        value = 0.0 if cv is None else float(cv.reshape(-1)[0]) if cv.size else 0.0
        axes = ctx.static(3, "axes")
    rank = v.ndim
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    k = len(axes)
    width = [(0, 0)] * rank
    for j, a in enumerate(axes):
        held = a if v.perm is None else v.perm.index(a)
        width[held] = (int(pads[j]), int(pads[j + k]))
    xp = ctx.xp
    if mode == "constant":
        return Value(xp.pad(v.array, width, constant_values=value), v.perm)
    return Value(xp.pad(v.array, width, mode=mode), v.perm)


def _source(out_n: int, in_n: int, scale: float, mode: str) -> np.ndarray:
    """Each output index's coordinate in the input (ONNX Resize's coordinate modes)."""
    o = np.arange(out_n, dtype=np.float64)
    if mode == "asymmetric":
        return o / scale
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if out_n > 1 else np.zeros_like(o)
    if mode == "align_corners":
        return o * (in_n - 1) / (out_n - 1) if out_n > 1 else np.zeros_like(o)
    if mode == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    raise OnnxImportError(
        f"attribute coordinate_transformation_mode={mode!r} is not supported (asymmetric, "
        "half_pixel, pytorch_half_pixel, align_corners, tf_half_pixel_for_nn)"
    )


def _nearest(src: np.ndarray, in_n: int, mode: str) -> np.ndarray:
    rounding = {
        "round_prefer_floor": lambda s: np.ceil(s - 0.5),
        "round_prefer_ceil": lambda s: np.floor(s + 0.5),
        "floor": np.floor,
        "ceil": np.ceil,
    }
    if mode not in rounding:
        raise OnnxImportError(f"attribute nearest_mode={mode!r} is not supported")
    return np.clip(rounding[mode](src), 0, in_n - 1).astype(np.int32)


def _resize_axis(x, axis: int, out_n: int, scale: float, mode: str, coord: str, nearest: str):
    in_n = x.shape[axis]
    src = _source(out_n, in_n, scale, coord)
    if mode == "nearest":
        return jnp.take(x, _nearest(src, in_n, nearest), axis=axis)
    src = np.clip(src, 0, in_n - 1)
    lo = np.floor(src).astype(np.int32)
    hi = np.minimum(lo + 1, in_n - 1)
    frac = (src - lo).astype(np.float32)
    shape = [1] * x.ndim
    shape[axis] = out_n
    frac = jnp.asarray(frac.reshape(shape))
    return jnp.take(x, lo, axis=axis) * (1 - frac) + jnp.take(x, hi, axis=axis) * frac


@register(
    "Resize", "Upsample",
    attrs=(
        "mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
        "exclude_outside", "extrapolation_value", "antialias", "scales", "height_scale",
        "width_scale",
    ),
)  # fmt: skip
def _resize(ctx: NodeContext) -> Value:
    x = _spatial(ctx)
    n, h, w, c = x.shape
    mode = ctx.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise ctx.unsupported("mode", mode, "nearest, linear")
    if ctx.attr("antialias", 0):
        raise ctx.unsupported("antialias", 1, "antialias=0 only")
    if ctx.attr("exclude_outside", 0):
        raise ctx.unsupported("exclude_outside", 1, "exclude_outside=0 only")
    sizes = None
    if ctx.op_type == "Upsample":
        coord = "asymmetric"
        scales = ctx.attr("scales") if ctx.opset < 9 else ctx.static(1, "scales")
    else:
        coord = ctx.attr("coordinate_transformation_mode", "half_pixel")
        if ctx.opset < 11:
            coord, scales = "asymmetric", ctx.static(1, "scales")
        else:
            scales, sizes = ctx.static(2, "scales"), ctx.static(3, "sizes")
            scales = None if scales is not None and scales.size == 0 else scales
    file_nchw = (n, c, h, w)
    if sizes is not None and sizes.size:
        out = [int(s) for s in sizes]
        scales = [o / i for o, i in zip(out, file_nchw, strict=True)]
    elif scales is not None:
        scales = [float(s) for s in scales]
        out = [int(math.floor(i * s)) for i, s in zip(file_nchw, scales, strict=True)]
    else:
        raise OnnxImportError("Resize needs scales or sizes")
    if out[0] != n or out[1] != c:
        raise OnnxImportError("only the spatial axes (H and W) can be resized")
    nearest = ctx.attr("nearest_mode", "round_prefer_floor")
    if ctx.op_type == "Upsample" or ctx.opset < 11:
        nearest = "floor"  # before Resize-11, nearest meant the asymmetric floor
    mode = "linear" if mode == "bilinear" else mode
    y = _resize_axis(x, 1, out[2], scales[2], mode, coord, nearest)
    y = _resize_axis(y, 2, out[3], scales[3], mode, coord, nearest)
    return Value(y, NHWC)
