"""Races between compiled steps: which of several steps is fastest on given frames.

Contract: `race_samples` times each step on each frame, the steps taking turns
frame by frame (each keeping its own stream state) after a first pass that
compiles, over rounds until the slowest has been timed long enough;
`race_figures` reduces the samples to one figure a step (the median of the
rounds' means); `race_winner` keeps the fastest only where it beats the most
preferred step beyond the race's noise (paired differences on the same frames),
else the most preferred of those that tie with it. A step is anything with
``init()`` and ``step(state, frame) -> (outputs, state, info)``: a
`dcjax.CachedModel`, a `dcjax.Streams`.

The transform races its plans on calibration frames (`dcjax.deepcache`,
`dcjax.autotune.PREFERENCE`); `dcjax.Streams` races its schedules.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["race", "race_figures", "race_samples", "race_winner"]


def race(models: Sequence[Any], frames: Any, **options: Any) -> tuple[float, ...]:
    """Seconds a frame of each model's step over ``frames``: the median of the
    rounds' means of `race_samples` (``options`` are its own), so a burst of
    load during one round does not decide."""
    return race_figures(race_samples(models, frames, **options))


def race_figures(samples: np.ndarray) -> tuple[float, ...]:
    """`race`'s figure of each model from its `race_samples`."""
    return tuple(float(t) for t in np.median(samples.mean(axis=1), axis=0))


def race_samples(
    models: Sequence[Any],
    frames: Any,
    rounds: int = 2,
    *,
    min_seconds: float = 1.0,
    max_rounds: int = 16,
) -> np.ndarray:
    """Seconds of each model's step on each frame, ``(rounds, frames, models)``:
    the models take turns frame by frame, after a first pass that compiles
    (each model keeps its own stream state); a round is one pass over the
    frames. At least ``rounds`` rounds run, and more, up to ``max_rounds``,
    until the slowest model has been timed for ``min_seconds`` (a small network
    gets the rounds its noise needs)."""
    frames = [jnp.asarray(f) for f in frames]
    states = [m.init() for m in models]
    per_round: list[list[list[float]]] = []
    r = 0
    while (
        r <= rounds
        or not per_round
        or (r <= max_rounds and np.asarray(per_round).sum(axis=(0, 1)).max() < min_seconds)
    ):
        times = []
        for f in frames:
            row = []
            for i, m in enumerate(models):
                t0 = time.perf_counter()
                out, states[i], _ = m.step(states[i], f)
                jax.block_until_ready(out)
                row.append(time.perf_counter() - t0)
            times.append(row)
        if r:  # the first pass compiles
            per_round.append(times)
        r += 1
    return np.asarray(per_round, float)


def race_winner(samples: np.ndarray, preference: Sequence[int]) -> int:
    """The model a race (`race_samples`) keeps: the fastest by `race`'s figure
    where it beats the first of ``preference`` (model indices, most preferred
    first; those not listed come after) beyond the race's noise; else the most
    preferred of the models that tie with the fastest.

    Beyond noise: over the pairs of the two models' times on the same frame of
    the same round, the mean difference exceeds twice its standard error (the
    lowerings' race's rule, `dcjax.lowerings`), and the fastest's figure is
    lower. Two models tie when neither beats the other so."""
    n = samples.shape[-1]
    figures = race_figures(samples)
    order = list(preference) + [i for i in range(n) if i not in preference]
    fastest = int(np.argmin(figures))

    def beats(a: int, b: int) -> bool:
        d = (samples[..., b] - samples[..., a]).reshape(-1)
        if figures[a] >= figures[b] or d.size < 2:
            return False
        return bool(d.mean() > 2 * d.std(ddof=1) / np.sqrt(d.size))

    for i in order:
        if i == fastest or not beats(fastest, i):
            return i
    return fastest
