"""Reference masked convolution: the dense convolution, then a select.

This is the oracle every sparse implementation is tested against; it is never
the fast path.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["DIMENSION_NUMBERS", "conv", "reference_masked_conv"]

DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")


def conv(
    x: jax.Array,
    w: jax.Array,
    *,
    strides: Sequence[int],
    padding: Sequence[tuple[int, int]] | str,
    dilation: Sequence[int] = (1, 1),
    groups: int = 1,
) -> jax.Array:
    """Dense NHWC/HWIO convolution, as `lax.conv_general_dilated` computes it."""
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=tuple(strides),
        padding=padding if isinstance(padding, str) else tuple(map(tuple, padding)),
        rhs_dilation=tuple(dilation),
        dimension_numbers=DIMENSION_NUMBERS,
        feature_group_count=groups,
    )


def reference_masked_conv(
    x: jax.Array,
    w: jax.Array,
    reuse_mask: jax.Array,
    cached: jax.Array,
    *,
    strides: Sequence[int],
    padding: Sequence[tuple[int, int]] | str,
    dilation: Sequence[int] = (1, 1),
    groups: int = 1,
) -> jax.Array:
    """Dense convolution, then ``where(reuse_mask, cached, dense)``."""
    dense = conv(x, w, strides=strides, padding=padding, dilation=dilation, groups=groups)
    return jnp.where(reuse_mask[..., None], cached.astype(dense.dtype), dense)
