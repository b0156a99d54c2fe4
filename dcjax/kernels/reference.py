"""Reference masked convolution: the dense convolution, then a select.

This is the oracle every sparse implementation is tested against; it is never
the fast path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from dcjax.kernels.geometry import ConvGeometry

__all__ = ["DIMENSION_NUMBERS", "conv", "reference_masked_conv"]

DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")


def conv(x: jax.Array, w: jax.Array, geometry: ConvGeometry) -> jax.Array:
    """Dense NHWC/HWIO convolution, as `lax.conv_general_dilated` computes it."""
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=geometry.strides,
        padding=geometry.padding,
        rhs_dilation=geometry.dilation,
        dimension_numbers=DIMENSION_NUMBERS,
        feature_group_count=geometry.groups,
    )


def reference_masked_conv(
    x: jax.Array,
    w: jax.Array,
    reuse_mask: jax.Array,
    cached: jax.Array,
    geometry: ConvGeometry,
) -> jax.Array:
    """Dense convolution, then ``where(reuse_mask, cached, dense)``."""
    dense = conv(x, w, geometry)
    return jnp.where(reuse_mask[..., None], cached.astype(dense.dtype), dense)
