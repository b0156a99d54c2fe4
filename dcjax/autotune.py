"""The measured plan of a model: each layer's kernel, and whether caching pays at all.

With ``Config(kernel="auto", tuning="measure")`` (`dcjax.Config.tuning`), the
transform calls `tune_model` between the analysis and `dcjax.plan.make_plan`:

1. Every plain convolution's candidate kernels (`dcjax.kernels.tuning`:
   dense, tile kernel, row kernel, Pallas on GPU) are timed on the layer's
   shapes at several dirty fractions, on this machine, or read from the
   measurements' file (a kind that lost on the largest layer of a class of
   layers is not timed on the rest of the class: `dcjax.kernels.probes`).
   Each layer gets the candidate of least expected cost at the dirty
   fraction the stream shows (``fractions``, measured by `stream_fractions`
   on a few frames; without them every fraction from 0 to 1 counts alike), a
   refresh every ``Config.refresh_every`` frames included.
2. The cached plan's expected saving (dense cost minus chosen cost, summed
   over the layers) is set against what caching adds per frame: the block
   matcher's cost over the cheapest still-frame test's (both timed here, on
   the frame's shape: on the calibration frames where there are some, since
   the search's cost depends on the motion it meets, on a still camera a
   quarter of what a moving one costs; without them on a synthetic pair of
   frames moved by a few pixels, the costlier case). When the saving does
   not pay for it, the plan is ``"dense"``: the step computes every layer
   in full and keeps only the still-frame skip, found by the same-position
   matcher (`dense_config`).
   Only where that changes nothing but the speed (`may_fall_back`: the
   still-frame skip on, a PSNR block matcher); elsewhere (DeepMon's
   histograms, no matcher) the plan stays ``"cached"`` with the measured
   kernels, dense ones included.

The decision is made once per transform; `Tuning` records it, with every
measurement, for ``CachedModel.tuning`` and the benchmarks.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dcjax import lowerings as _lowerings
from dcjax.config import Config
from dcjax.kernels import tuning as kt
from dcjax.lowerings import Lowerings
from dcjax.matching import StreamMatcher
from dcjax.transforms import queries
from dcjax.transforms.records import Analysis

__all__ = [
    "CUTS",
    "MATCH_PAIRS",
    "PLANS",
    "PREFERENCE",
    "Calibration",
    "Lowerings",
    "Tuning",
    "cut_tuning",
    "dense_config",
    "matcher_of",
    "may_fall_back",
    "measure_lowerings",
    "nocache_config",
    "stream_fractions",
    "tune_model",
]

#: What the tuning may decide: reuse with the measured kernels, the dense step
#: with the still-frame skip (`dense_config`), or, after a race on calibration
#: frames, the dense step with no matcher at all (`nocache_config`), reuse
#: with the fixed rules' kernels (``tuning="prior"``), or reuse with the
#: measured kernels but in the layers the stream dirties most, computed in
#: full (`cut_tuning`).
PLANS = ("cached", "dense", "nocache", "prior", "cut")

#: Which plan a race keeps on a tie (`dcjax.race.race_winner`), most preferred first: the
#: dense step with the still-frame skip, then without it (both give the model's
#: own outputs; the skip pays where frames are still), then the fixed rules'
#: kernels (a tie keeps the fixed rules, as in the lowerings' race), then a cut
#: of the measured ones before all of them: where a cut ties, it reuses with the
#: same kernels, computes its cut layers exactly and keeps fewer caches (the
#: cuts in `CUTS` order, the one with the most layers in full first).
PREFERENCE = ("dense", "nocache", "prior", "cut", "cached")

#: The dirty fractions from which a cut plan computes a layer in full
#: (`cut_tuning`): the fractions the kernels are timed at (`FRACTIONS`) from a
#: quarter up, short of all.
CUTS: tuple[float, ...] = tuple(f for f in kt.FRACTIONS if 0.25 <= f < 1.0)

#: Consecutive pairs of calibration frames the matchers are timed on (`tune_model`).
MATCH_PAIRS = 8


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tuning:
    """What `tune_model` measured and decided.

    Attributes:
        plan: ``"cached"`` or ``"dense"`` (see the module docstring).
        layers: per layer, its `dcjax.kernels.tuning.LayerTuning`, or None for a
            layer the sparse kernels do not compute.
        saving: expected seconds a frame the chosen kernels save against
            computing every tuned layer in full.
        overhead: expected seconds a frame caching adds: the block matcher's
            cost over the still-frame test's.
        measured: measurements made now (0 when all came from the file).
        passed_over: candidates left unmeasured now, their kind having lost
            on their class's probe (`dcjax.kernels.probes`).
        seconds: wall time of the tuning.
        raced: seconds a frame of each of `PLANS` over calibration frames
            (`dcjax.race.race`), NaN for a plan that did not race (the cached plan where
            the measurements had chosen the dense plan; the fixed rules' where
            the measurements had chosen the dense plan or the same kernels);
            else None.
        lowerings: the dense lowerings' measurements and choices
            (`measure_lowerings`; the transform measures them after the
            plan is made); None where not measured.
        cut: for a cut plan (`cut_tuning`), the dirty fraction from which
            its layers are computed in full; else None.
    """

    plan: str
    layers: tuple[kt.LayerTuning | None, ...]
    saving: float
    overhead: float
    measured: int
    seconds: float
    raced: tuple[float, ...] | None = None
    lowerings: Lowerings | None = None
    cut: float | None = None
    passed_over: int = 0

    @property
    def choices(self) -> tuple[kt.KernelChoice | None, ...]:
        """Per layer, the chosen kernel (None where not tuned), as `make_plan` takes them."""
        return tuple(None if t is None else t.choice for t in self.layers)

    @property
    def label(self) -> str:
        """The plan in words: ``"plan cached"``, or for a cut
        ``"plan cut (layers dirty 25% or more in full)"``."""
        cut = "" if self.cut is None else f" (layers dirty {self.cut:.0%} or more in full)"
        return f"plan {self.plan}{cut}"

    def summary(self) -> str:
        """One line: the plan, the kernels chosen and the expected saving."""
        names = [t.choice.impl for t in self.layers if t is not None]
        counts = ", ".join(f"{n} {names.count(n)}" for n in sorted(set(names)))
        measured = "measured kernels" if self.plan == "prior" else "kernels"
        return (
            f"{self.label}: {measured} {counts or 'none'}; "
            + ("" if self.lowerings is None else self.lowerings.summary() + "; ")
            + "expected saving "
            f"{self.saving * 1e3:.2f} ms a frame against {self.overhead * 1e3:.2f} ms of "
            f"matching ({self.measured} measurements, "
            + (f"{self.passed_over} passed over, " if self.passed_over else "")
            + f"{self.seconds:.1f} s)"
            + (
                ""
                if self.raced is None
                else "; raced on the calibration frames: "
                + ", ".join(f"{p} {t * 1e3:.2f} ms" for p, t in zip(PLANS, self.raced) if t == t)
                + " a frame"
            )
        )


def cut_tuning(tuning: Tuning, cut: float) -> Tuning | None:
    """``tuning``'s cached plan with every tuned layer whose dirty fraction is at
    least ``cut`` computed in full (the ``"cut"`` plan), or None where that
    changes no layer's kernel (or the fractions are unknown) or leaves none
    reused (the dense plan's matter, `dense_config`).

    The layers' measurements leave out what the step adds around a reused
    layer (its mask, its refinement test, the merge with its cache); where the
    stream dirties most of a layer, that can outweigh the little it saves, and
    only a race of whole steps tells (`dcjax.deepcache.transform`)."""
    dense = kt.KernelChoice(impl="dense")
    layers = tuple(
        dataclasses.replace(t, choice=dense)
        if t is not None and t.fraction is not None and t.fraction >= cut
        else t
        for t in tuning.layers
    )
    out = dataclasses.replace(tuning, plan="cut", layers=layers, saving=_saving(layers), cut=cut)
    if out.choices == tuning.choices or all(c in (None, dense) for c in out.choices):
        return None
    return out


def _saving(layers: Sequence[kt.LayerTuning | None]) -> float:
    """Expected seconds a frame the chosen kernels save against computing every
    tuned layer of ``layers`` in full."""
    return float(sum(t.dense_cost - t.cost for t in layers if t is not None))


def dense_config(config: Config) -> Config:
    """``config`` for the dense plan: every layer in full, no refinement, exact
    updates or guard, the same-position matcher for the still-frame skip."""
    return dataclasses.replace(
        config,
        kernel="dense",
        guard=None,
        matcher="static",
        matcher_options=None,
        refine=None,
        fuse_blocks=False,
        dense_updates=False,
        tuning="prior",
    )


def nocache_config(config: Config) -> Config:
    """`dense_config` without a matcher or the still-frame skip: the dense step
    and the state's bookkeeping alone."""
    return dataclasses.replace(dense_config(config), matcher="none", skip_unchanged=False)


def may_fall_back(config: Config) -> bool:
    """Whether the dense plan is open to ``config``: it keeps the still-frame
    skip and matches blocks by PSNR (not DeepMon's histograms, nor no matcher),
    so that only the speed of the step changes."""
    return config.skip_unchanged and config.matcher not in ("histogram", "none")


def matcher_of(config: Config) -> StreamMatcher:
    """The stream matcher ``config`` describes."""
    return StreamMatcher(
        name=config.matcher, options=config.matcher_options, block_size=config.block_size,
        psnr_threshold=config.psnr_threshold, color=config.color,
        data_range=config.data_range, key=config.key, max_change=config.max_pixel_change,
        change_size=config.pixel_change_size,
    )  # fmt: skip


_MATCH_FNS: dict[str, Any] = {}


def _match_fn(matcher: StreamMatcher) -> Any:
    """``(key_of, match)``, jitted once per matcher (so that a match compiled
    beside the kernels' candidates is not compiled again): the key of a frame,
    and the match of a frame against a key from a motion, as the step runs it
    (the frame's key computed in the match's program, the key and the motion
    arguments)."""
    key = repr(matcher)
    if key not in _MATCH_FNS:

        def match(k: jax.Array, frame: jax.Array, motion: jax.Array) -> jax.Array:
            return matcher.match(k, frame, matcher.key_of(frame), motion).mask

        _MATCH_FNS[key] = (jax.jit(matcher.key_of), jax.jit(match))
    return _MATCH_FNS[key]


def _match_pair(matcher: StreamMatcher, prev: Any, cur: Any) -> Any:
    """The mask of ``cur`` matched against ``prev`` (one call of `_match_fn`'s)."""
    key_of, match = _match_fn(matcher)
    return match(key_of(prev), cur, jnp.zeros((2,), jnp.int32))


def _matcher_cost_on(matcher: StreamMatcher, frames: Any, repeats: int) -> float:
    """Mean seconds a match of each of ``frames`` (T >= 2) against the key of the
    one before takes in the step, each pair's the least of ``repeats`` calls
    after one warm-up call (the keys are made before, untimed)."""
    frames = jnp.asarray(frames)
    key_of, fn = _match_fn(matcher)
    keys = [key_of(f) for f in frames[:-1]]
    zero = jnp.zeros((2,), jnp.int32)  # the motion the step passes: an argument
    fn(keys[0], frames[1], zero).block_until_ready()
    costs = []
    for k, b in zip(keys, frames[1:]):
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(k, b, zero).block_until_ready()
            best = min(best, time.perf_counter() - t0)
        costs.append(best)
    return float(np.mean(costs))


def _moved_pair(frame_shape, dtype) -> jax.Array:
    """Two frames of ``frame_shape``, the second the first moved by a few pixels."""
    rng = np.random.default_rng(0)
    h, w, c = frame_shape
    base = rng.integers(0, 256, (h + 8, w + 8, c)).astype(np.float32)
    if not jnp.issubdtype(dtype, jnp.integer):
        base = base / 255.0
    pair = np.stack([base[4 : 4 + h, 4 : 4 + w], base[2 : 2 + h, 5 : 5 + w]])
    return jnp.asarray(pair, dtype)


def _matcher_cost(matcher: StreamMatcher, frame_shape, dtype, repeats: int) -> float:
    """Seconds a match of `_moved_pair` (the least of ``repeats`` calls after a
    warm-up)."""
    return _matcher_cost_on(matcher, _moved_pair(frame_shape, dtype), repeats)


def _matcher_key(matcher: StreamMatcher, frame_shape, frame_dtype) -> str:
    return f"matcher {matcher!r} {tuple(frame_shape)} {jnp.dtype(frame_dtype).name}"


def _matchers(config: Config) -> list[StreamMatcher]:
    """The plan's matcher and the still test's (the dense plan's)."""
    return [matcher_of(cfg) for cfg in (config, dense_config(config))]


def _matcher_warmups(
    config: Config, frame_shape, frame_dtype, cache: kt.TuningCache, frames=None
) -> list[Any]:
    """Calls that compile the matches `_overhead` will time (each runs one
    match), to run beside the kernels' compiles."""
    machine = kt.machine_key()
    jobs = []
    for m in _matchers(config):
        if frames is not None:
            pair = jnp.asarray(frames[:2])
        elif cache.get(machine, _matcher_key(m, frame_shape, frame_dtype), "match") is None:
            pair = _moved_pair(frame_shape, frame_dtype)
        else:
            continue
        jobs.append(lambda m=m, pair=pair: _match_pair(m, pair[0], pair[1]).block_until_ready())
    return jobs


def measure_lowerings(
    analysis: Analysis,
    leaves: Sequence[Any],
    *,
    cache: kt.TuningCache | None = None,
    progress: bool = True,
) -> Lowerings:
    """`dcjax.lowerings.measure_lowerings` with a progress bar where ``progress``
    (unless within `progress_bars(False)`)."""
    bar = _bar if progress and _PROGRESS.get() else None
    return _lowerings.measure_lowerings(analysis, leaves, cache=cache, progress=bar)


def tune_model(
    analysis: Analysis,
    config: Config,
    *,
    frame_shape: tuple[int, int, int],
    frame_dtype=jnp.uint8,
    backend: str | None = None,
    fractions: Sequence[float] | float | None = None,
    cache: kt.TuningCache | None = None,
    repeats: int = 5,
    progress: bool = True,
    frames: Any = None,
) -> Tuning:
    """Measure and decide the plan of ``analysis`` (see the module docstring).

    Args:
        analysis: the analysed model.
        config: its `Config` (``refresh_every``, the matcher).
        frame_shape: ``(H, W, C)`` of the frames (the matchers are timed on it).
        frame_dtype: the frames' dtype.
        backend: default: jax's default backend.
        fractions: per layer, the dirty fraction the stream shows
            (`stream_fractions`), or one for every layer; None: every
            fraction alike.
        cache: where measurements are read and kept; default: the file at
            `dcjax.kernels.tuning.default_path`.
        repeats: timed calls per measurement.
        progress: show a progress bar while measuring (unless within
            `progress_bars(False)`).
        frames: calibration frames ``(T >= 2, H, W, C)`` of the stream: the
            matchers are timed on them (see the module docstring); None: on
            a synthetic moved pair, measured once per machine.
    """
    start = time.perf_counter()
    backend = backend or jax.default_backend()
    cache = kt.TuningCache(kt.default_path()) if cache is None else cache
    plans = queries.layer_tile_plans(analysis)
    tuned = [i for i, p in enumerate(plans) if p is not None]
    if isinstance(fractions, (int, float)):
        fractions = [float(fractions)] * len(plans)
    if fractions is not None and len(fractions) != len(plans):
        raise ValueError(
            f"dcjax: tune_model got {len(fractions)} fractions for {len(plans)} layers"
        )
    before, passed = cache.puts, cache.passed
    results = kt.tune(
        [plans[i] for i in tuned],
        backend,
        cache=cache,
        fractions=None if fractions is None else [float(fractions[i]) for i in tuned],
        refresh_every=config.refresh_every,
        repeats=repeats,
        progress=_bar if progress and _PROGRESS.get() else None,
        precompile=_matcher_warmups(config, frame_shape, frame_dtype, cache, frames),
        dtypes=[analysis.layers[i].dtype for i in tuned],
    )
    layers: list[kt.LayerTuning | None] = [None] * len(plans)
    for i, r in zip(tuned, results, strict=True):
        layers[i] = r
    saving = _saving(results)
    overhead = _overhead(config, frame_shape, frame_dtype, cache, repeats, frames)
    plan = "cached" if saving > overhead or not may_fall_back(config) else "dense"
    return Tuning(
        plan=plan,
        layers=tuple(layers),
        saving=saving,
        overhead=overhead,
        measured=cache.puts - before,
        passed_over=cache.passed - passed,
        seconds=time.perf_counter() - start,
    )


def _overhead(
    config: Config, frame_shape, frame_dtype, cache: kt.TuningCache, repeats, frames=None
) -> float:
    """The block matcher's cost over the still test's: on ``frames`` where given
    (up to `MATCH_PAIRS` pairs of them), else on a synthetic moved pair,
    measured once per machine and setting (kept in ``cache``)."""
    matchers = _matchers(config)
    if frames is not None:
        frames = jnp.asarray(frames)[: MATCH_PAIRS + 1]
        costs = [_matcher_cost_on(m, frames, max(1, repeats // 2)) for m in matchers]
        return max(costs[0] - costs[1], 0.0)
    machine = kt.machine_key()
    costs = []
    for matcher in matchers:
        key = _matcher_key(matcher, frame_shape, frame_dtype)
        got = cache.get(machine, key, "match")
        if got is None:
            got = (_matcher_cost(matcher, frame_shape, frame_dtype, repeats),)
            cache.put(machine, key, "match", got)
        costs.append(got[0])
    cache.save()
    return max(costs[0] - costs[1], 0.0)


_PROGRESS = contextvars.ContextVar("dcjax_tuning_progress", default=True)


@contextlib.contextmanager
def progress_bars(enabled: bool) -> Iterator[None]:
    """Within the block, `tune_model` shows its progress bars only if ``enabled``
    (and its own ``progress`` argument asks for them): how a caller that builds
    models through layers that do not pass ``progress`` down (the evaluation
    harness, the CLI's ``--no-progress``) silences them."""
    token = _PROGRESS.set(bool(enabled))
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def _bar(items, total: int, what: str):
    from tqdm.auto import tqdm

    return tqdm(items, total=total, desc=f"dcjax: {what} kernels", unit="kernel", leave=False)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Calibration:
    """Dirty fractions a stream shows (`stream_fractions`).

    Attributes:
        layers: per layer, the mean fraction of its output that was computed.
        input: the mean fraction of input pixels the matcher could not reuse.
        frames: how many frames counted (neither refreshes nor still frames).
    """

    layers: tuple[float, ...]
    input: float
    frames: int


def stream_fractions(infos: dict, n_layers: int) -> Calibration:
    """The mean dirty fractions over the frames of ``infos`` (stacked step infos
    of a model whose layers all keep caches) that were neither refreshes nor
    still frames skipped; all 1.0 when no frame qualifies."""
    reuse = np.asarray(infos["reuse_fraction"], float)
    keep = ~np.asarray(infos["refreshed"], bool) & ~np.asarray(infos["skipped"], bool)
    if not keep.any():
        return Calibration(layers=(1.0,) * n_layers, input=1.0, frames=0)
    dirty = 1.0 - reuse[keep][:, :n_layers].mean(axis=0)
    level = 1.0 - float(np.asarray(infos["input_reuse"], float)[keep].mean())
    return Calibration(layers=tuple(float(d) for d in dirty), input=level, frames=int(keep.sum()))
