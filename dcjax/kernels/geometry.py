"""What every kernel takes besides its arrays: a convolution's geometry and its epilogue.

A leaf module (it imports nothing of `dcjax.kernels`), so that every kernel
and the eqn-level entry points can share these records without import cycles.

- `ConvGeometry`: strides, padding, dilation and feature groups of an NHWC/HWIO
  convolution, the record each kernel takes after ``(x, w, reuse_mask, cached)``.
- `Epilogue`: an elementwise per-channel map the kernels apply to the outputs
  they compute.
- `plain_conv` / `nhwc_conv` / `nhwc_layout`: which ``conv_general_dilated`` equations the
  kernels compute.
- `precision_name`: the `jax.default_matmul_precision` name of an equation's
  ``precision`` param.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
from jax import lax

__all__ = ["ConvGeometry", "Epilogue", "nhwc_conv", "nhwc_layout", "plain_conv", "precision_name"]

Padding = str | tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConvGeometry:
    """The geometry of a convolution (NHWC input, HWIO weights).

    Attributes:
        strides: (sy, sx) window strides.
        padding: as given to `lax.conv_general_dilated`: "SAME", "VALID" or
            ((lo, hi), (lo, hi)). Strings are kept as they are; pairs become
            tuples of ints (the record is hashable).
        dilation: (dy, dx) kernel (rhs) dilation.
        groups: feature groups (``Cin`` for depthwise).
    """

    strides: tuple[int, ...]
    padding: Padding
    dilation: tuple[int, ...] = (1, 1)
    groups: int = 1

    def __post_init__(self) -> None:
        padding = self.padding
        if not isinstance(padding, str):
            padding = tuple(tuple(int(v) for v in pair) for pair in padding)
        object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))
        object.__setattr__(self, "padding", padding)
        object.__setattr__(self, "dilation", tuple(int(d) for d in self.dilation))
        object.__setattr__(self, "groups", int(self.groups))

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ConvGeometry:
        """The geometry of a ``conv_general_dilated`` equation's ``params``
        (window strides, padding, rhs dilation, feature groups; the layout and
        the input dilation are `nhwc_conv`'s to check)."""
        return cls(
            strides=params["window_strides"],
            padding=params["padding"],
            dilation=params["rhs_dilation"],
            groups=params["feature_group_count"],
        )


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """An elementwise map applied to freshly computed convolution outputs.

    Attributes:
        fn: ``fn(y, *operands, *pixel_operands)``; acts on each element of ``y``
            (any leading shape, channels last) on its own, keeping shape and
            dtype; the pixel operands arrive cut to ``y``'s pixels.
        operands: scalars or ``(Cout,)`` vectors, broadcast along the last axis.
        pixel_operands: arrays shaped like the output (N, Ho, Wo, Cout), such
            as a residual branch: a kernel reads them at the pixels it computes.
    """

    fn: Callable[..., jax.Array]
    operands: tuple = ()
    pixel_operands: tuple = ()

    def __call__(self, y: jax.Array) -> jax.Array:
        """The epilogue on a whole output ``y``."""
        return self.fn(y, *self.operands, *self.pixel_operands)


_NHWC = ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))


def nhwc_layout(params: Mapping[str, Any]) -> bool:
    """Whether a ``conv_general_dilated`` with these params takes NHWC inputs
    and HWIO kernels to NHWC outputs."""
    dn = params["dimension_numbers"]
    return (tuple(dn.lhs_spec), tuple(dn.rhs_spec), tuple(dn.out_spec)) == _NHWC


def nhwc_conv(params: Mapping[str, Any]) -> bool:
    """Whether a ``conv_general_dilated`` with these params is an NHWC/HWIO
    convolution without input dilation or batch groups."""
    return (
        nhwc_layout(params)
        and tuple(params["lhs_dilation"]) == (1, 1)
        and params["batch_group_count"] == 1
    )


def plain_conv(params: Mapping[str, Any]) -> bool:
    """Whether a ``conv_general_dilated`` with these params goes through `masked_conv`:
    NHWC/HWIO, no input dilation or batch groups (`nhwc_conv`), no preferred
    element type, and a precision that is None or `lax.Precision` values
    (`precision_name`)."""
    return (
        nhwc_conv(params)
        and params["preferred_element_type"] is None
        and precision_name(params["precision"]) is not False
    )


_PRECISION_NAMES = {
    lax.Precision.DEFAULT: "default",
    lax.Precision.HIGH: "high",
    lax.Precision.HIGHEST: "highest",
}


def precision_name(precision) -> str | None | bool:
    """The `jax.default_matmul_precision` name of a convolution's ``precision``
    param (the higher of a pair), None for none, False for a dot algorithm."""
    if precision is None:
        return None
    pair = precision if isinstance(precision, tuple) else (precision, precision)
    if not all(p is None or p in _PRECISION_NAMES for p in pair):
        return False
    order = list(_PRECISION_NAMES)
    return _PRECISION_NAMES[max((p or lax.Precision.DEFAULT for p in pair), key=order.index)]
