"""Frozen, keyword-only configuration dataclasses for every dcjax knob.

Every field is validated on construction so that a bad value fails where it is
written, with a message that names the field and the fix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

ALIGNMENTS = ("exact", "round")
KERNELS = ("reference", "xla", "pallas", "auto")
MATCHERS = ("static", "diamond", "three_step", "exhaustive", "histogram")


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"dcjax: {message}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """How `deepcache.transform` matches frames and reuses work.

    Attributes:
        block_size: side in pixels of the square blocks the matcher compares.
        psnr_threshold: a block is reusable when its PSNR (dB) against the
            previous frame at the global motion is above this. ``inf`` never
            reuses.
        refresh_every: recompute everything every this many frames (the first
            frame always is); ``None`` refreshes only on scene cuts.
        min_match: when fewer than this fraction of blocks match (scene cut,
            bad frame), the frame is recomputed in full.
        alignment: ``"exact"`` reuses a layer only when the motion divided by
            the layer's cumulative stride is an integer (results equal a full
            recompute); ``"round"`` rounds the shift, as the paper does.
        kernel: sparse-update implementation of reused convolutions:
            ``"reference"`` (dense then select), ``"xla"``, ``"pallas"`` or
            ``"auto"``.
        matcher: ``"static"`` (same-position blocks), ``"diamond"``,
            ``"three_step"``, ``"exhaustive"`` or ``"histogram"`` (DeepMon).
        matcher_options: extra keyword arguments for the matcher.
        color: ``"luma"`` or ``"rgb"``: which planes the matcher's PSNR uses.
        data_range: peak value for PSNR; default 255 for integer frames and
            1.0 for float frames.
        reuse_ops: names of the primitives whose outputs are cached and reused.
    """

    block_size: int = 10
    psnr_threshold: float = 20.0
    refresh_every: int | None = 10
    min_match: float = 0.1
    alignment: str = "exact"
    kernel: str = "reference"
    matcher: str = "static"
    matcher_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    color: str = "luma"
    data_range: float | None = None
    reuse_ops: tuple[str, ...] = ("conv_general_dilated",)

    def __post_init__(self) -> None:
        _check(
            isinstance(self.block_size, int) and self.block_size >= 1,
            f"Config.block_size must be a positive int, got {self.block_size!r}",
        )
        _check(
            isinstance(self.psnr_threshold, (int, float)) and not math.isnan(self.psnr_threshold),
            f"Config.psnr_threshold must be a number (dB), got {self.psnr_threshold!r}",
        )
        _check(
            self.refresh_every is None
            or (isinstance(self.refresh_every, int) and self.refresh_every >= 1),
            f"Config.refresh_every must be a positive int or None, got {self.refresh_every!r}",
        )
        _check(
            0.0 <= self.min_match <= 1.0,
            f"Config.min_match must be in [0, 1], got {self.min_match!r}",
        )
        _check(
            self.alignment in ALIGNMENTS,
            f"Config.alignment must be one of {ALIGNMENTS}, got {self.alignment!r}",
        )
        _check(
            self.kernel in KERNELS,
            f"Config.kernel must be one of {KERNELS}, got {self.kernel!r}",
        )
        _check(
            self.matcher in MATCHERS,
            f"Config.matcher must be one of {MATCHERS}, got {self.matcher!r}",
        )
        _check(
            self.color in ("luma", "rgb"),
            f"Config.color must be 'luma' or 'rgb', got {self.color!r}",
        )
        _check(
            self.data_range is None or self.data_range > 0,
            f"Config.data_range must be positive or None, got {self.data_range!r}",
        )
        _check(
            isinstance(self.reuse_ops, tuple) and all(isinstance(n, str) for n in self.reuse_ops),
            f"Config.reuse_ops must be a tuple of primitive names, got {self.reuse_ops!r}",
        )
