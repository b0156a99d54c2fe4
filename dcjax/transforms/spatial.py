"""The spatial type: where a variable holds the frame's H and W.

A variable's spatial signature (`Spatial`) says which of its axes are the
frame's H and W, their sizes, and the cumulative stride ``(sy, sx)`` relative
to the input frame (a `fractions.Fraction`, so upsampling is exact). Variables
without spatial axes (parameters, constants, pooled vectors, logits) have none
(``None``). Signatures are derived once, when the model is traced
(`dcjax.transforms.signature_rules`, `dcjax.transforms.analysis.analyze`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

__all__ = ["Spatial", "covered", "first_spatial", "var_shape"]


def covered(n: int, stride: Fraction) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)``, int (n,): position ``i`` of an axis of ``n`` positions at
    ``stride`` input pixels a step covers the input pixels ``[lo[i], hi[i])`` =
    ``[floor(i s), ceil((i + 1) s))``."""
    s = Fraction(stride)
    lo = np.asarray([math.floor(i * s) for i in range(n)], np.int64)
    hi = np.asarray([math.ceil((i + 1) * s) for i in range(n)], np.int64)
    return lo, hi


@dataclasses.dataclass(frozen=True)
class Spatial:
    """Where H and W live in a variable, and its stride relative to the frame.

    Attributes:
        axes: positions of the H and W axes in the variable's shape.
        size: the variable's sizes along those axes.
        stride: input pixels per step along H and W (``Fraction``).
    """

    axes: tuple[int, int]
    size: tuple[int, int]
    stride: tuple[Fraction, Fraction]

    def __post_init__(self) -> None:
        object.__setattr__(self, "stride", tuple(Fraction(s) for s in self.stride))
        object.__setattr__(self, "axes", tuple(int(a) for a in self.axes))
        object.__setattr__(self, "size", tuple(int(n) for n in self.size))

    def with_axes(self, axes: tuple[int, int]) -> Spatial:
        return dataclasses.replace(self, axes=axes)


def first_spatial(sigs: Sequence[Spatial | None]) -> Spatial | None:
    """The first signature of ``sigs`` that is not None, or None."""
    return next((s for s in sigs if s is not None), None)


def var_shape(v: Any) -> tuple[int, ...]:
    """The shape of a jaxpr variable or literal (its abstract value's)."""
    return tuple(v.aval.shape)
