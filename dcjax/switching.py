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
The plans are precompiled: the first `Adaptive.step` also runs every other
plan once on its frame, from a fresh state whose result is dropped, so that a
switch later costs no compilation.

`Adaptive.streams(n, schedule=...)` switches ``n`` streams (`AdaptiveStreams`):
pooled, the batch runs one plan, chosen by the input's dirty fraction averaged
over the streams; sequential, each stream has a controller and a plan of its
own (`dcjax.streams.SCHEDULES`; ``"auto"`` races the two on the start plan).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dcjax.config import Config
from dcjax.deepcache import CachedModel, calibrate
from dcjax.kernels.tuning import FRACTIONS
from dcjax.streams import stacked

__all__ = ["LEVELS", "Adaptive", "AdaptiveState", "AdaptiveStreams", "Switch", "adaptive"]

#: Default levels of the input's dirty fraction: the tuning's own grid.
LEVELS: tuple[float, ...] = tuple(f for f in FRACTIONS if f > 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Switch:
    """A change of plan: before ``frame`` (its index in the stream), from plan
    ``old`` to ``new`` (indices in `Adaptive.models`), the average dirty
    fraction being ``level``; ``stream``: the stream that switched (sequential
    `AdaptiveStreams`), None for a single stream or a whole pooled batch."""

    frame: int
    old: int
    new: int
    level: float
    stream: int | None = None


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
        self._warm = False

    def with_statistics(self, statistics: bool) -> Adaptive:
        """The same plans with ``Config.statistics`` set
        (`dcjax.cached_model.CachedModel.with_statistics`), switched by the same
        controller; no switch made yet."""
        return Adaptive(
            [m.with_statistics(statistics) for m in self.models], self.levels,
            smoothing=self.smoothing, margin=self.margin, patience=self.patience,
            start=self.start,
        )  # fmt: skip

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

    def control(
        self, state: AdaptiveState, dirty: float | None
    ) -> tuple[int, float | None, int | None, int]:
        """The controller after a frame: ``(plan, average, pending, streak)``.
        ``dirty``: the frame's input dirty fraction, None for a refresh or a
        still frame (which say nothing about the plans)."""
        plan, average, pending, streak = state.plan, state.average, state.pending, state.streak
        if dirty is None:
            return plan, average, pending, streak
        average = dirty if average is None else average + self.smoothing * (dirty - average)
        target = self.band(average, plan)
        if target == plan:
            return plan, average, None, 0
        streak = streak + 1 if target == pending else 1
        if streak >= self.patience:
            return target, average, None, 0
        return plan, average, target, streak

    def advance(
        self, state: AdaptiveState, inner: Any, dirty: float | None, fresh: Any,
        stream: int | None = None,
    ) -> tuple[AdaptiveState, Switch | None]:  # fmt: skip
        """The state after a frame that left the plan's state ``inner`` and
        showed ``dirty`` (see `control`), and the switch it made, if any (then
        the new plan starts from ``fresh(plan)``)."""
        plan, average, pending, streak = self.control(state, dirty)
        switch = None
        if plan != state.plan:
            switch = Switch(frame=state.frame + 1, old=state.plan, new=plan, level=average,
                            stream=stream)  # fmt: skip
            inner = fresh(plan)
        new = AdaptiveState(
            plan=plan, state=inner, average=average, pending=pending, streak=streak,
            frame=state.frame + 1,
        )  # fmt: skip
        return new, switch

    def step(self, state: AdaptiveState, frame: Any) -> tuple[Any, AdaptiveState, dict]:
        """One frame with the running plan: ``(output, state, info)``; ``info`` is
        the plan's with ``plan`` (its index) and ``level`` (the average) added."""
        if not isinstance(state, AdaptiveState):
            raise TypeError("dcjax: state must be the AdaptiveState that init() or step() made")
        out, inner, info = self.models[state.plan].step(state.state, frame)
        if not self._warm:
            self._warm = True
            _step_others(len(self.models), state.plan, lambda p: self.models[p].step,
                         lambda p: self.models[p].init(), frame)  # fmt: skip
        new, switch = self.advance(state, inner, input_dirt(info), lambda p: self.models[p].init())
        if switch is not None:
            self.switches.append(switch)
        return out, new, _with_plan(info, state.plan, new.average)

    def streams(self, n: int, *, stagger: bool = True, schedule: str = "auto") -> AdaptiveStreams:
        """``n`` streams of these plans (`AdaptiveStreams`)."""
        return AdaptiveStreams(self, n, stagger=stagger, schedule=schedule)


def _step_others(count: int, ran: int, step_of: Any, fresh: Any, frames: Any) -> None:
    """Every plan of ``count`` but ``ran`` steps ``frames`` once from
    ``fresh(plan)`` with ``step_of(plan)``, its result dropped: the plans are
    compiled before a switch needs them."""
    for p in range(count):
        if p != ran:
            jax.block_until_ready(step_of(p)(fresh(p), frames)[0])


def input_dirt(info: dict) -> float | None:
    """The input's dirty fraction of one stream's frame from its ``info``; None
    for a refresh or a still frame."""
    if bool(info["refreshed"]) or bool(info["skipped"]):
        return None
    return 1.0 - float(info["input_reuse"])


def _with_plan(info: dict, plan: Any, average: Any) -> dict:
    level = np.float32(np.nan if average is None else average)
    return {**info, "plan": plan, "level": level}


class AdaptiveStreams:
    """``n`` streams of an `Adaptive` model's plans, switched by their dirty
    fractions.

    ``schedule`` (`dcjax.streams.SCHEDULES`) says how the streams share the
    machine, as for `dcjax.streams.Streams`:

    - ``"pooled"``: the batch runs one plan, whose step pools every stream's
      dirty tiles. One controller follows the input's dirty fraction averaged
      over the streams whose network ran without a refresh; a switch starts
      every stream afresh on the new plan (their refreshes staggered again),
      reported as a `Switch` with ``stream=None``.
    - ``"sequential"``: every stream has its own controller and plan, as
      `Adaptive.step` for one stream, and steps alone; a switch starts that
      stream afresh (on its own refresh phase) and names it.
    - ``"auto"``: the two are raced on the start plan's model (see
      `dcjax.streams.Streams`), and the winner serves every plan.

    ``step(states, frames)`` returns ``(outputs, states, infos)`` with a leading
    axis of ``n``; ``infos`` carries each stream's ``plan`` and ``level``.
    Every switch is appended to `switches`. The first step precompiles every
    plan's step, as `Adaptive.step` does.

    Attributes:
        schedule: the schedule that runs (``"auto"`` resolved).
        raced: with ``"auto"``, the seconds a step of each schedule; else None.
        switches: every switch made so far, in order.
    """

    def __init__(
        self, adaptive: Adaptive, n: int, *, stagger: bool = True, schedule: str = "auto"
    ) -> None:
        first = adaptive.models[adaptive.start].streams(n, stagger=stagger, schedule=schedule)
        self.adaptive, self.n, self.stagger = adaptive, first.n, stagger
        self.schedule, self.raced = first.schedule, first.raced
        self.phases = first.phases  # every plan's: they share the refresh settings
        self._streams = {adaptive.start: first}
        self.switches: list[Switch] = []
        self._warm = False

    def plan_streams(self, plan: int) -> Any:
        """The `dcjax.streams.Streams` of plan ``plan`` (built on first use)."""
        if plan not in self._streams:
            self._streams[plan] = self.adaptive.models[plan].streams(
                self.n, stagger=self.stagger, schedule=self.schedule
            )
        return self._streams[plan]

    def _fresh_batch(self, plan: int) -> Any:
        """Fresh stacked states of every stream on ``plan`` (pooled)."""
        return self.plan_streams(plan).init()

    def _precompile(self, ran: int, fresh: Any, frames: Any) -> None:
        """On the first step, `_step_others`: a switch later compiles nothing."""
        if self._warm:
            return
        self._warm = True
        sequential = self.schedule == "sequential"
        _step_others(
            len(self.adaptive.models), ran,
            lambda p: self.adaptive.models[p].step if sequential else self.plan_streams(p).step,
            fresh, frames,
        )  # fmt: skip

    def init(self) -> AdaptiveState | tuple[AdaptiveState, ...]:
        """Fresh streams on the start plan: one `AdaptiveState` holding the
        stacked states (pooled), or a tuple of ``n`` (sequential)."""
        plan = self.adaptive.start
        states = self.plan_streams(plan).init()

        def fresh(inner):
            return AdaptiveState(plan=plan, state=inner, average=None, pending=None, streak=0,
                                 frame=0)  # fmt: skip

        if self.schedule == "sequential":
            return tuple(fresh(st) for st in states)
        return fresh(states)

    def step(self, states: Any, frames: Any) -> tuple[Any, Any, dict]:
        """One frame of every stream (see the class docstring). ``states`` is
        consumed; keep using the returned one. ``frames``: ``(n, H, W, C)`` or a
        sequence of ``n`` frames."""
        a = self.adaptive
        if self.schedule != "sequential":
            if not isinstance(states, AdaptiveState):
                raise TypeError(
                    "dcjax: states must be the AdaptiveState this AdaptiveStreams' init() or "
                    "step() made (pooled schedule)"
                )
            fresh = self._fresh_batch
            outs, inner, infos = self.plan_streams(states.plan).step(states.state, frames)
            self._precompile(states.plan, fresh, frames)
            ran = ~(np.asarray(infos["refreshed"]) | np.asarray(infos["skipped"]))
            dirt = 1.0 - np.asarray(infos["input_reuse"], np.float64)[ran]
            new, switch = a.advance(states, inner, float(dirt.mean()) if ran.any() else None, fresh)
            if switch is not None:
                self.switches.append(switch)
            plans = np.full(self.n, states.plan, np.int32)
            levels = np.full(self.n, np.nan if new.average is None else new.average, np.float32)
            return outs, new, {**infos, "plan": plans, "level": levels}
        if (
            not isinstance(states, tuple)
            or len(states) != self.n
            or not all(isinstance(st, AdaptiveState) for st in states)
        ):
            raise TypeError(
                f"dcjax: states must be the tuple of {self.n} AdaptiveStates this "
                "AdaptiveStreams' init() or step() made (sequential schedule)"
            )
        frames = self.plan_streams(a.start).checked_frames(frames)
        outs, news, infos = [], [], []
        for i, st in enumerate(states):
            out, inner, info = a.models[st.plan].step(st.state, frames[i])
            new, switch = a.advance(
                st, inner, input_dirt(info),
                lambda p, i=i: a.models[p].init(refresh_phase=self.phases[i]),
                stream=i,
            )  # fmt: skip
            if switch is not None:
                self.switches.append(switch)
            if i == 0:
                self._precompile(st.plan, lambda p: a.models[p].init(), frames[0])
            outs.append(out)
            news.append(new)
            infos.append(_with_plan(info, np.int32(st.plan), new.average))
        return stacked(outs, 0), tuple(news), stacked(infos, 0)


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
    with the same kernels merged. With ``calibration`` frames, their own input
    dirty fraction is a level too (its plan is the one `transform` tunes for
    them), and the run starts on it. ``controller``: `Adaptive`'s
    ``smoothing``, ``margin``, ``patience``, ``start``."""
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
    ratios, own, start = None, None, None
    if calibration is not None:
        cal = calibrate(
            model, variables, frame_shape=frame_shape, frames=calibration, config=config,
            preprocess=preprocess,
        )  # fmt: skip
        ratios = [f / max(cal.input, 1e-6) for f in cal.layers]
        if 0 < cal.input <= 1 and float(cal.input) not in levels:
            own = float(cal.input)  # the plan `transform` tunes for these frames
            levels = tuple(sorted((*levels, own)))
    models, kept = [], []
    seen: dict[tuple, int] = {}
    for level in levels:
        cached = CachedModel(
            model, variables, frame_shape=frame_shape, config=config, preprocess=preprocess,
            input_dtype=jnp.float32, progress=progress,
            tuning_fractions=level if ratios is None else [min(1.0, r * level) for r in ratios],
        )  # fmt: skip
        key = (cached.tuning.plan, cached.tuning.choices)
        if key not in seen:
            seen[key] = len(models)
            cached.calibration = calibration  # what the streams' schedules race on
            models.append(cached)
            kept.append(level)
        if level == own:
            start = seen[key]
    return Adaptive(models, kept, **{"start": start, **controller})
