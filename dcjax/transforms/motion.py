"""The frame's motion as the mask rules and the reuse step see it.

`FrameContext` holds the global motion ``M = (My, Mx)`` of a frame and the
alignment policy (`ALIGNMENTS`). For a variable of stride ``s = p/q`` the shift
is ``M * q / p``. Under ``alignment="exact"`` a variable whose shift is not an
integer is not reusable at all; under ``"round"`` the shift is rounded half up.
A frame recomputes two regions whatever reuse says: the guard's (outside it:
`unguarded`) and the band of a banded periodic refresh (`banded`); `unforced`
is what neither forces.
`expand_mask` lays an ``(H, W)`` mask out against a value's spatial axes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from dcjax.transforms import guard as guard_lib
from dcjax.transforms.spatial import covered

if TYPE_CHECKING:
    from dcjax.transforms import regions
    from dcjax.transforms.guard import GuardConfig
    from dcjax.transforms.spatial import Spatial

__all__ = ["ALIGNMENTS", "FrameContext", "expand_mask"]

#: How a shift that is not a whole number of pixels at a layer's stride is treated.
ALIGNMENTS = ("exact", "round")


class FrameContext:
    """The frame's motion, as the mask rules and the reuse step see it.

    Args:
        motion: int32 ``(2,)``, the global motion ``(My, Mx)`` in input pixels.
        alignment: ``"exact"`` or ``"round"``.
        guard: the guard (`dcjax.transforms.guard.GuardConfig`), or None.
        hot: with ``guard``, the (h, w) cells of its map the last frame
            scored over its threshold (`dcjax.transforms.guard.cells`).
        cell_stride: input pixels per cell of ``hot``.
        band: ``(start, stop)``, int32 scalars: the input rows a banded
            periodic refresh recomputes on this frame (`dcjax.Config.refresh_bands`;
            a range that holds no row on a frame without a band), or None
            without banded refreshes.
    """

    def __init__(
        self,
        motion: jax.Array,
        alignment: str,
        guard: GuardConfig | None = None,
        hot: jax.Array | None = None,
        cell_stride: int = 1,
        band: tuple[jax.Array, jax.Array] | None = None,
    ) -> None:
        self.motion = jnp.asarray(motion, jnp.int32)
        self.alignment = alignment
        self.guard, self.hot, self.cell_stride = guard, hot, cell_stride
        self._shifts: dict[Any, tuple] = {}
        self._valid: dict[Any, jax.Array] = {}
        self.band = band
        self._unguarded: dict[Any, jax.Array] = {}
        self._banded: dict[Any, jax.Array] = {}
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

    def unguarded(self, sig: Spatial) -> Any:
        """(H_v, W_v): the positions of a variable of signature ``sig`` outside
        the frame's guard (`dcjax.transforms.guard.region`); True without one."""
        if self.guard is None:
            return True
        key = (sig.size, sig.stride)
        if key not in self._unguarded:
            self._unguarded[key] = ~guard_lib.region(
                self.hot, self.cell_stride, sig.size, sig.stride, self.guard
            )
        return self._unguarded[key]

    def banded(self, sig: Spatial) -> Any:
        """(H_v, W_v): the positions of a variable of signature ``sig`` in this
        frame's refresh band; False without banded refreshes. Position ``i`` is
        in the band when the input rows it covers, ``[i s, (i + 1) s)`` at the
        stride ``s``, meet the band's."""
        if self.band is None:
            return False
        key = (sig.size, sig.stride)
        if key not in self._banded:
            start, stop = self.band
            lo, hi = covered(sig.size[0], sig.stride[0])
            rows = (lo < stop) & (hi > start)
            self._banded[key] = jnp.broadcast_to(rows[:, None], sig.size)
        return self._banded[key]

    def unforced(self, sig: Spatial) -> Any:
        """(H_v, W_v): the positions of a variable of signature ``sig`` that this
        frame may reuse: outside the guard's region (`unguarded`) and outside its
        refresh band (`banded`), so that a band is recomputed at every layer and
        its references restart (`dcjax.transforms.refiners`); True with neither."""
        if self.band is None:
            return self.unguarded(sig)
        return self.unguarded(sig) & ~self.banded(sig)

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
