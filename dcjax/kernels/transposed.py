"""Transposed convolutions whose kernel tiles the output: a matrix product.

A transposed convolution of stride ``s`` is traced as a convolution of the
input dilated by ``s`` (``lhs_dilation``), which XLA:CPU computes on its
slow generic path. Where the kernel is ``s`` wide along each axis and the
padding is ``s - 1`` on both sides (ONNX's ConvTranspose with ``pads`` 0 and
kernel = stride, a feature pyramid's upsampling), the kernel's taps never
overlap: output pixel ``(s * i + ry, s * j + rx)`` is input pixel ``(i, j)``
times tap ``(s - 1 - ry, s - 1 - rx)`` of the kernel. The whole layer is
then one matrix product, ``(N*H*W, Cin) @ (Cin, s*s*Cout)``, and a
depth-to-space reshape.

Contract: `tiles_output(params, w_shape)` says whether a
``conv_general_dilated`` equation with these params and an HWIO kernel of
``w_shape`` is such a convolution (NHWC/HWIO, unit window strides and
kernel dilation, one group, no batch groups or preferred element type);
`subpixel_conv(x, w, params)` then equals ``lax.conv_general_dilated(x, w,
**params)`` up to fp rounding, at the operands' result dtype, with the
equation's precision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from dcjax.kernels.geometry import nhwc_layout

__all__ = ["subpixel_conv", "tiles_output"]


def tiles_output(params: Mapping[str, Any], w_shape: Sequence[int]) -> bool:
    """Whether the convolution is a transposed one whose kernel tiles its
    output (module docstring)."""
    s = tuple(params["lhs_dilation"])
    return (
        nhwc_layout(params)
        and len(s) == 2
        and s != (1, 1)
        and tuple(w_shape[:2]) == s
        and tuple(params["window_strides"]) == (1, 1)
        and tuple(params["rhs_dilation"]) == (1, 1)
        and tuple(tuple(p) for p in params["padding"]) == tuple((k - 1, k - 1) for k in s)
        and params["feature_group_count"] == 1
        and params["batch_group_count"] == 1
        and params["preferred_element_type"] is None
    )


def subpixel_conv(x: jax.Array, w: jax.Array, params: Mapping[str, Any]) -> jax.Array:
    """The convolution of `tiles_output` as a matrix product and a
    depth-to-space reshape (module docstring)."""
    n, h, wd, cin = x.shape
    sy, sx, _, cout = w.shape
    # taps in output order: row ry of a block takes kernel row sy - 1 - ry
    taps = jnp.flip(w, (0, 1)).transpose(2, 0, 1, 3).reshape(cin, sy * sx * cout)
    y = jnp.matmul(
        x.reshape(n * h * wd, cin),
        taps,
        precision=params["precision"],
        preferred_element_type=jnp.result_type(x.dtype, w.dtype),
    )
    y = y.reshape(n, h, wd, sy, sx, cout).transpose(0, 1, 3, 2, 4, 5)
    return y.reshape(n, h * sy, wd * sx, cout)
