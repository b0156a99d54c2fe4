"""Guarded regions: where a score map is near its decision, recompute exactly.

A detector decides by a threshold on a score map (a face-centre heat map, an
objectness map). Where a score sits near the threshold, the small errors that
reuse brings (a block the matcher takes as unchanged, a refined layer's input
that moved by less than its delta) move it across, and a box appears or goes.
A guard recomputes those places from the frame.

Contract: `GuardConfig` names one score map among the model's outputs (the
flat output leaf ``output``, its ``channel``, its ``layout``) and a
``threshold``, set below the detector's own. After each frame, the cells of
that map whose score exceeds the threshold (`cells`) are kept in the state
(``CacheState.guard``; a fresh state guards nothing, and its first frame is
recomputed in full). On the next frame, every variable is guarded within
``margin`` input pixels of those cells (`region`): the step marks those
positions dirty at the input (whatever the matcher says), at the input of
every refined layer (whatever the change test says) and at the output of
every cached layer, so that each layer recomputes them from the frame.
Outside the guard, values may still be reused, and the guarded values read
them. A still frame
(``Config.skip_unchanged``) still returns the last output without running the
network: a guard widens what a frame that runs recomputes, it does not make a
frame run.

The map is a rank-4 leaf ``(1, h, w, C)`` (``"NHWC"``) or ``(1, C, h, w)``
(``"NCHW"``), or rank 3 without the batch axis, whose grid divides the frame:
``H = s * h`` and ``W = s * w`` for one integer stride ``s``
(`map_stride` says so, or why not).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dcjax._checks import check as _check
from dcjax.transforms.spatial import covered

__all__ = ["LAYOUTS", "GuardConfig", "cells", "map_stride", "region"]

#: How a guarded score map lays out its axes.
LAYOUTS = ("NHWC", "NCHW")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GuardConfig:
    """A score map whose cells near a decision are recomputed exactly (see the module docstring).

    Attributes:
        threshold: cells scoring above it are guarded (set it below the
            detector's decision threshold, by about the error reuse brings).
        output: the index of the map among the model's flat output leaves.
        channel: the map's channel.
        layout: one of `LAYOUTS`.
        margin: input pixels guarded around each cell over the threshold,
            at every variable (the change a frame may bring, plus as much of
            the cell's receptive field as should be computed from the frame).
    """

    threshold: float
    output: int = 0
    channel: int = 0
    layout: str = "NHWC"
    margin: int = 32

    def __post_init__(self) -> None:
        _check(
            isinstance(self.threshold, (int, float)) and not isinstance(self.threshold, bool)
            and math.isfinite(self.threshold),
            f"GuardConfig.threshold must be a finite number, got {self.threshold!r}",
        )  # fmt: skip
        for name in ("output", "channel", "margin"):
            value = getattr(self, name)
            _check(
                isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                f"GuardConfig.{name} must be an int >= 0, got {value!r}",
            )
        _check(
            self.layout in LAYOUTS,
            f"GuardConfig.layout must be one of {LAYOUTS}, got {self.layout!r}",
        )


def _grid_axes(ndim: int, layout: str) -> tuple[int, int, int]:
    """(h axis, w axis, channel axis) of a map of rank ``ndim``."""
    lead = ndim - 3
    return (lead + 1, lead + 2, lead) if layout == "NCHW" else (lead, lead + 1, lead + 2)


def map_stride(guard: GuardConfig, out_shapes: Sequence[Sequence[int]], frame_hw) -> int:
    """The input pixels per cell of ``guard``'s map, or a ValueError naming what
    does not fit (the leaf, its rank, its batch, its channel, its grid)."""
    _check(
        guard.output < len(out_shapes),
        f"GuardConfig.output={guard.output}, but the model has {len(out_shapes)} output leaves",
    )
    shape = tuple(out_shapes[guard.output])
    _check(
        len(shape) in (3, 4) and (len(shape) == 3 or shape[0] == 1),
        f"GuardConfig.output={guard.output} is of shape {shape}; a guarded map is "
        "(1, h, w, C) or (1, C, h, w) (one image), or the same without the batch axis",
    )
    ay, ax, ac = _grid_axes(len(shape), guard.layout)
    _check(
        guard.channel < shape[ac],
        f"GuardConfig.channel={guard.channel}, but output {guard.output} ({shape}, "
        f"{guard.layout}) has {shape[ac]} channels",
    )
    (height, width), (h, w) = frame_hw, (shape[ay], shape[ax])
    stride = height // h
    _check(
        height % h == 0 and stride * w == width,
        f"GuardConfig.output={guard.output}'s grid {h}x{w} ({guard.layout}) does not divide "
        f"the frame {height}x{width} by one integer stride; check GuardConfig.layout",
    )
    return stride


def cells(outs: Sequence[Any], guard: GuardConfig) -> jax.Array:
    """(h, w) bool: the map's cells over the threshold, from one frame's flat outputs."""
    score = outs[guard.output]
    _, _, ac = _grid_axes(score.ndim, guard.layout)
    score = jnp.take(score, guard.channel, axis=ac)
    return (score.reshape(score.shape[-2:]) if score.ndim == 3 else score) > guard.threshold


def region(
    hot: jax.Array,
    cell_stride: int,
    size: tuple[int, int],
    stride: tuple[Fraction, Fraction],
    guard: GuardConfig,
) -> jax.Array:
    """(H_v, W_v) bool: the guarded positions of a variable of grid ``size`` and
    ``stride`` (input pixels per position), from the ``hot`` cells of a map of
    ``cell_stride`` (see the module docstring).

    Position ``i`` covers the input rows ``[i s, (i + 1) s)``, so the cells
    ``[i s / g, (i + 1) s / g)`` of stride ``g`` (at least one), clipped to the
    grid; likewise the columns. The positions holding a hot cell are then
    widened by ``ceil(margin / s)`` positions along each axis.
    """
    g = hot.astype(jnp.int32)
    for axis in range(2):
        n = g.shape[axis]
        lo, hi = covered(size[axis], Fraction(stride[axis]) / cell_stride)
        lo, hi = np.minimum(lo, n - 1), np.minimum(hi, n)
        hi = np.maximum(hi, lo + 1)
        first = jnp.zeros_like(jnp.take(g, np.arange(1), axis=axis))
        total = jnp.concatenate([first, jnp.cumsum(g, axis)], axis=axis)
        g = jnp.take(total, hi, axis=axis) - jnp.take(total, lo, axis=axis)
    out = (g > 0).astype(jnp.int8)
    for axis in range(2):  # separably: a square window costs its area a position on XLA:CPU
        r = math.ceil(guard.margin / Fraction(stride[axis]))
        if r:
            window = (2 * r + 1, 1) if axis == 0 else (1, 2 * r + 1)
            pad = ((r, r), (0, 0)) if axis == 0 else ((0, 0), (r, r))
            out = lax.reduce_window(out, jnp.int8(0), lax.max, window, (1, 1), pad)
    return out > 0
