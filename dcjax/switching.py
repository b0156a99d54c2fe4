"""Plans switched at run time: several measured plans of one model, the one that fits
the stream's current dirty fraction running.

`adaptive(model, variables, frame_shape=..., levels=...)` transforms the model
once per level ``g`` of the input's dirty fraction (the share of input pixels
the matcher cannot reuse, ``1 - info["input_reuse"]``), each with the measured
tuning (`dcjax.autotune`) for per-layer fractions ``min(1, g * r_l)``, where
``r_l`` is how much layer ``l``'s dirty fraction exceeds the input's on the
calibration frames (1 without them: a layer as dirty as the input). Levels
whose plans choose the same kernels share one model.

`Adaptive.step` is a host-side loop over those jitted steps. It keeps an
exponential moving average of the input's dirty fraction over the frames that
ran the network without a refresh (still frames and refreshes cost the same
in every plan). The plan whose band holds the average runs: bands are split
at the midpoints between levels, and a switch needs the average past the
border by ``margin`` for ``patience`` frames in a row (hysteresis). The new
plan starts from a fresh state, so the frame after a switch is recomputed in
full. Every switch is reported (`Adaptive.switches`, and ``info["plan"]``).

Streams (`dcjax.streams.Streams`) are not switched: a batch runs one plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from dcjax.config import Config
from dcjax.deepcache import CachedModel, calibrate
from dcjax.kernels.tuning import FRACTIONS

__all__ = ["LEVELS", "Adaptive", "AdaptiveState", "Switch", "adaptive"]

#: Default levels of the input's dirty fraction: the tuning's own grid.
LEVELS: tuple[float, ...] = tuple(f for f in FRACTIONS if f > 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Switch:
    """A change of plan: before ``frame`` (its index in the stream), from plan
    ``old`` to ``new`` (indices in `Adaptive.models`), the average dirty
    fraction being ``level``."""

    frame: int
    old: int
    new: int
    level: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdaptiveState:
    """The running plan, its model's state, and the controller's memory."""

    plan: int
    state: Any
    average: float | None
    pending: int | None
    streak: int
    frame: int


class Adaptive:
    """Several plans of one model, switched by the stream's dirty fraction
    (see the module docstring).

    Attributes:
        models: the distinct `CachedModel` plans, by increasing level.
        levels: per model, the lowest level it was tuned for.
        switches: every switch made so far, in order.
    """

    def __init__(
        self,
        models: Sequence[CachedModel],
        levels: Sequence[float],
        *,
        smoothing: float = 0.3,
        margin: float = 0.05,
        patience: int = 3,
        start: int | None = None,
    ) -> None:
        if not models or len(models) != len(levels):
            raise ValueError("dcjax: Adaptive needs one level per model, at least one")
        if list(levels) != sorted(levels):
            raise ValueError(f"dcjax: Adaptive levels must increase, got {tuple(levels)}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"dcjax: smoothing must be in (0, 1], got {smoothing!r}")
        if margin < 0 or patience < 1:
            raise ValueError(
                f"dcjax: margin must be >= 0 and patience >= 1, got {margin!r}, {patience!r}"
            )
        self.models = tuple(models)
        self.levels = tuple(float(v) for v in levels)
        self.borders = tuple((a + b) / 2 for a, b in zip(self.levels, self.levels[1:]))
        self.smoothing, self.margin, self.patience = smoothing, margin, patience
        self.start = len(models) // 2 if start is None else start
        self.switches: list[Switch] = []

    def init(self) -> AdaptiveState:
        """A fresh stream, on the middle plan (or ``start``)."""
        return AdaptiveState(
            plan=self.start, state=self.models[self.start].init(), average=None,
            pending=None, streak=0, frame=0,
        )  # fmt: skip

    def band(self, level: float, current: int) -> int:
        """The plan for an average ``level``, ``current`` running: the band holding
        it, unless it lies within ``margin`` of ``current``'s band."""
        target = int(np.searchsorted(self.borders, level, side="right"))
        if target == current:
            return current
        lo = self.borders[current - 1] if current > 0 else -np.inf
        hi = self.borders[current] if current < len(self.borders) else np.inf
        return current if lo - self.margin <= level <= hi + self.margin else target

    def step(self, state: AdaptiveState, frame: Any) -> tuple[Any, AdaptiveState, dict]:
        """One frame with the running plan: ``(output, state, info)``; ``info`` is
        the plan's with ``plan`` (its index) and ``level`` (the average) added."""
        model = self.models[state.plan]
        out, inner, info = model.step(state.state, frame)
        average, pending, streak = state.average, state.pending, state.streak
        plan = state.plan
        if not bool(info["refreshed"]) and not bool(info["skipped"]):
            dirty = 1.0 - float(info["input_reuse"])
            average = dirty if average is None else average + self.smoothing * (dirty - average)
            target = self.band(average, plan)
            if target == plan:
                pending, streak = None, 0
            else:
                streak = streak + 1 if target == pending else 1
                pending = target
                if streak >= self.patience:
                    self.switches.append(
                        Switch(frame=state.frame + 1, old=plan, new=target, level=average)
                    )
                    plan, pending, streak = target, None, 0
                    inner = self.models[plan].init()
        info = {
            **info,
            "plan": state.plan,
            "level": np.float32(np.nan if average is None else average),
        }
        new = AdaptiveState(
            plan=plan, state=inner, average=average, pending=pending, streak=streak,
            frame=state.frame + 1,
        )  # fmt: skip
        return out, new, info


def adaptive(
    model: Any,
    variables: Any,
    *,
    frame_shape: tuple[int, int, int],
    config: Config | None = None,
    levels: Sequence[float] = LEVELS,
    calibration: Any = None,
    preprocess: Any = None,
    progress: bool = True,
    **controller: Any,
) -> Adaptive:
    """An `Adaptive` model (see the module docstring): one measured plan per level
    of ``levels`` (dirty fractions of the input, increasing, in (0, 1]), plans
    with the same kernels merged. ``controller``: `Adaptive`'s ``smoothing``,
    ``margin``, ``patience``, ``start``."""
    from dcjax.kernels.tuning import resolve_tuning

    config = Config() if config is None else config
    if config.kernel != "auto" or resolve_tuning(config.tuning) != "measure":
        raise ValueError(
            "dcjax: adaptive plans need kernel='auto' with the measured tuning, got "
            f"kernel={config.kernel!r}, tuning={config.tuning!r}"
        )
    levels = tuple(float(v) for v in levels)
    if not levels or any(not 0 < v <= 1 for v in levels) or list(levels) != sorted(set(levels)):
        raise ValueError(f"dcjax: levels must increase within (0, 1], got {levels}")
    ratios = None
    if calibration is not None:
        cal = calibrate(
            model, variables, frame_shape=frame_shape, frames=calibration, config=config,
            preprocess=preprocess,
        )  # fmt: skip
        ratios = [f / max(cal.input, 1e-6) for f in cal.layers]
    models, kept = [], []
    seen: dict[tuple, int] = {}
    for level in levels:
        cached = CachedModel(
            model, variables, frame_shape=frame_shape, config=config, preprocess=preprocess,
            input_dtype=jnp.float32, progress=progress,
            tuning_fractions=level if ratios is None else [min(1.0, r * level) for r in ratios],
        )  # fmt: skip
        key = (cached.tuning.plan, cached.tuning.choices)
        if key in seen:
            continue
        seen[key] = len(models)
        models.append(cached)
        kept.append(level)
    return Adaptive(models, kept, **controller)
