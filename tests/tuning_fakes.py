"""Measured tuning without timing anything, for the tests of what it decides."""

import numpy as np

from dcjax import autotune
from dcjax.kernels import tuning as kt


def fake_measurements(monkeypatch, path, costs, matcher=None):
    """Candidates cost ``costs[impl](fraction)`` seconds a call and a matcher
    ``matcher.get(name, 1e-6)`` seconds on a synthetic pair or on calibration
    frames (both looked up when measured, so a test may change them);
    measurements are kept in the file ``path``. Returns ``matcher``."""
    monkeypatch.setenv(kt.CACHE_ENV, str(path))
    monkeypatch.setattr(kt, "_compiled", lambda p, c, *inputs: c)
    monkeypatch.setattr(
        kt,
        "_timed",
        lambda p, group, fractions, repeats: {
            name: tuple(costs[c.impl](f) for f in fractions) for name, c in group.items()
        },
    )
    matcher = {} if matcher is None else matcher
    monkeypatch.setattr(autotune, "_matcher_cost", lambda m, *a: matcher.get(m.name, 1e-6))
    monkeypatch.setattr(autotune, "_matcher_cost_on", lambda m, *a: matcher.get(m.name, 1e-6))
    monkeypatch.setattr(autotune, "_matcher_warmups", lambda *a: [])
    # the dense candidate keeps its faked cost: no lowering is measured
    monkeypatch.setattr(
        autotune, "measure_lowerings", lambda *a, **k: autotune.Lowerings(layers=())
    )
    return matcher


def race_samples_of(times, models=None, rest=None):
    """A race's per-frame times (`dcjax.race.race_samples`): each model the same
    on every frame of three rounds, so any difference is beyond noise. With
    ``models`` (the models raced), ``times`` cut or padded with ``rest`` to one
    a model (the plans raced where they differ: the fixed rules', the cuts)."""
    times = tuple(times)
    if models is not None:
        times = (times + (rest,) * len(models))[: len(models)]
    return np.broadcast_to(np.asarray(times, float), (3, 4, len(times))).copy()
