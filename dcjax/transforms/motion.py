"""The frame's motion as the mask rules and the reuse step see it.

`FrameContext` holds the global motion ``M = (My, Mx)`` of a frame and the
alignment policy (`ALIGNMENTS`). For a variable of stride ``s = p/q`` the shift
is ``M * q / p``. Under ``alignment="exact"`` a variable whose shift is not an
integer is not reusable at all; under ``"round"`` the shift is rounded half up.
`expand_mask` lays an ``(H, W)`` mask out against a value's spatial axes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
    from dcjax.transforms import regions
    from dcjax.transforms.spatial import Spatial

__all__ = ["ALIGNMENTS", "FrameContext", "expand_mask"]

#: How a shift that is not a whole number of pixels at a layer's stride is treated.
ALIGNMENTS = ("exact", "round")


class FrameContext:
    """The frame's motion, as the mask rules and the reuse step see it.

    Args:
        motion: int32 ``(2,)``, the global motion ``(My, Mx)`` in input pixels.
        alignment: ``"exact"`` or ``"round"``.
    """

    def __init__(self, motion: jax.Array, alignment: str) -> None:
        self.motion = jnp.asarray(motion, jnp.int32)
        self.alignment = alignment
        self._shifts: dict[Any, tuple] = {}
        self._valid: dict[Any, jax.Array] = {}
        self.zero_motion = jnp.all(self.motion == 0)

    def shift(self, sig: Spatial) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(dy, dx, aligned)``: the shift at a variable of signature ``sig``."""
        key = sig.stride
        if key not in self._shifts:
            out = []
            aligned = jnp.bool_(True)
            for k in range(2):
                p, q = sig.stride[k].numerator, sig.stride[k].denominator
                num = self.motion[k] * q
                if self.alignment == "exact":
                    aligned = aligned & (num % p == 0)
                    out.append(num // p)
                else:
                    out.append((2 * num + p) // (2 * p))
            self._shifts[key] = (out[0], out[1], aligned)
        return self._shifts[key]

    def zero_shift(self, sig: Spatial) -> tuple[jax.Array, jax.Array]:
        dy, dx, _ = self.shift(sig)
        return dy == 0, dx == 0

    def valid(self, sig: Spatial) -> jax.Array:
        """(H_v, W_v): aligned, and the shifted position lies inside the map."""
        key = (sig.size, sig.stride)
        if key not in self._valid:
            dy, dx, aligned = self.shift(sig)
            iy = jnp.arange(sig.size[0])[:, None] + dy
            ix = jnp.arange(sig.size[1])[None, :] + dx
            inside = (iy >= 0) & (iy < sig.size[0]) & (ix >= 0) & (ix < sig.size[1])
            self._valid[key] = inside & aligned
        return self._valid[key]

    def collapse(self, mask: regions.Mask) -> regions.Mask:
        if mask is True:
            return True
        return jnp.all(mask) & self.zero_motion


def expand_mask(mask: jax.Array, ndim: int, axes: tuple[int, int]) -> jax.Array:
    """Insert unit axes so an (H, W) mask broadcasts against a rank-``ndim`` value
    whose H and W are ``axes``."""
    shape = [1] * ndim
    shape[axes[0]], shape[axes[1]] = mask.shape
    if axes[0] > axes[1]:
        mask = mask.T
    return mask.reshape(shape)
