"""The dense lowerings a model takes: measured per layer, checked on the whole model.

`measure_lowerings(analysis, leaves)` times each layer's lowerings
(`dcjax.kernels.lowering_tuning`) and, where a measured choice differs from
the fixed rules' (`dcjax.kernels.lowering.prior`), races the model's whole
dense step with each set; the measured set is kept only when it wins beyond
the race's noise. The result's ``choices`` are what the model's
convolutions over whole maps are traced with (`dcjax.kernels.lowering.use`):
a `dcjax.cached_model.CachedModel` measured under ``tuning="measure"`` steps
with them whatever its plan (the dense step; a cached step's dense paths and
the layers it computes in full), and so does
`dcjax.eval.methods.fast_apply` (the ``nocache`` baseline); the sparse
kernels' tile windows and the kernel tuning's candidates keep the fixed
rules.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dcjax.kernels import lowering
from dcjax.kernels import tuning as kt
from dcjax.kernels.lowering_tuning import LoweringTuning, tune_lowerings
from dcjax.transforms import queries
from dcjax.transforms.interpreter import dense_forward
from dcjax.transforms.records import Analysis

__all__ = ["LOWERING_RACE_CALLS", "Lowerings", "measure_lowerings"]

#: Fewest calls of each dense step in the lowerings' race (`measure_lowerings`).
LOWERING_RACE_CALLS = 5


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lowerings:
    """What `measure_lowerings` measured and decided.

    Attributes:
        layers: per layer, its lowerings' measurements and the choice that
            runs (`dcjax.kernels.lowering_tuning.LoweringTuning`; the prior's
            where the race kept the fixed rules), or None for a layer the
            sparse kernels do not compute.
        raced: seconds a call of the dense step with the fixed rules' lowerings
            and with the measured ones (medians), where they differ; else None.
        kept: whether the measured lowerings run: they won the race beyond
            its noise, or none differs from the fixed rules'.
        choices: what the model is traced with (a mapping for
            `dcjax.kernels.lowering.use`; empty where the fixed rules run).
    """

    layers: tuple[LoweringTuning | None, ...]
    raced: tuple[float, float] | None = None
    kept: bool = True
    choices: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        """A few words: how many layers take each lowering, how many unlike the prior."""
        ways = [t.choice for t in self.layers if t is not None]
        unlike = sum(t.choice != t.prior for t in self.layers if t is not None)
        counts = ", ".join(f"{n} {ways.count(n)}" for n in sorted(set(ways)))
        raced = (
            ""
            if self.raced is None
            else f"; dense step {self.raced[1] * 1e3:.2f} ms measured against "
            f"{self.raced[0] * 1e3:.2f} ms by the fixed rules, "
            + ("measured kept" if self.kept else "fixed rules kept")
        )
        return f"dense lowerings {counts or 'none'} ({unlike} unlike the fixed rules{raced})"


def measure_lowerings(
    analysis: Analysis,
    leaves: Sequence[Any],
    *,
    cache: kt.TuningCache | None = None,
    progress: Callable[..., Iterable] | None = None,
) -> Lowerings:
    """Each layer's dense lowering measured on this machine
    (`dcjax.kernels.lowering_tuning.tune_lowerings`) and checked on the whole
    model: where a measured choice differs from the fixed rules', the dense
    step (`dense_forward` of ``analysis`` with the parameters ``leaves``) with
    the measured lowerings races the one with the prior's, and the measured
    set runs only where it wins beyond the race's noise (`_race_lowerings`; a
    layer's fastest lowering alone need not be the fastest within the
    network, where XLA:CPU runs other operations beside it:
    docs/performance-notes.md). The race is kept in ``cache`` (default: the
    file at `dcjax.kernels.tuning.default_path`) like the measurements.
    Nothing is recorded outside the result: the caller traces the model
    within ``lowering.use(result.choices)``. ``progress(iterable, total=n,
    what=...)`` wraps the measurements still to make (a tqdm bar).
    """
    cache = kt.TuningCache(kt.default_path()) if cache is None else cache
    plans = queries.layer_tile_plans(analysis)
    # float32 layers only: the others take the fixed rules (`lowering.chosen`)
    tuned = [
        i
        for i, p in enumerate(plans)
        if p is not None and jnp.dtype(analysis.layers[i].dtype) == jnp.float32
    ]
    layer_plans = [plans[i] for i in tuned]
    found = tune_lowerings(layer_plans, cache=cache, progress=progress)
    measured = lowering.choices((p, t.choice) for p, t in zip(layer_plans, found, strict=True))
    raced, kept = None, True
    if any(t.choice != t.prior for t in found):
        raced, kept = _race_lowerings(analysis, leaves, layer_plans, measured, cache)
        if not kept:
            found = tuple(dataclasses.replace(t, choice=t.prior) for t in found)
    out: list[LoweringTuning | None] = [None] * len(plans)
    for i, t in zip(tuned, found, strict=True):
        out[i] = t
    choices = measured if kept and raced is not None else {}
    return Lowerings(layers=tuple(out), raced=raced, kept=kept, choices=choices)


def _race_key(analysis: Analysis, measured: Mapping[str, str]) -> str:
    """The lowerings' race's key in the measurements' file: the model (its jaxpr,
    which holds its input's and layers' shapes) and the measured set raced."""
    text = "|".join([str(analysis.jaxpr.jaxpr), *(f"{k}={v}" for k, v in sorted(measured.items()))])
    return "dense step " + hashlib.sha1(text.encode()).hexdigest()


def _race_lowerings(
    analysis: Analysis, leaves, plans, measured: Mapping[str, str], cache: kt.TuningCache
) -> tuple[tuple[float, float], bool]:
    """``((prior, measured), kept)``: seconds a call of the dense step with the
    prior's lowerings and with the ``measured`` ones (medians of calls in turns,
    the order alternating, after a warm-up call each; at least
    `LOWERING_RACE_CALLS` each and until each has run for half a second, at
    most four times as many), and whether the measured set is faster beyond
    the race's noise: the mean of the rounds' paired differences exceeds twice
    its standard error (one-sided, about 94 % with 5 rounds and 97 % with 20),
    so a tie keeps the fixed rules. Read from ``cache`` where this model and
    set were raced on this machine."""
    key = _race_key(analysis, measured)
    machine = kt.machine_key()
    got = [cache.get(machine, key, f"lowerings:{s}") for s in ("prior", "measured", "kept")]
    if all(g is not None for g in got):
        return (got[0][0], got[1][0]), bool(got[2][0])
    x_aval = analysis.jaxpr.jaxpr.invars[-1].aval
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.random(x_aval.shape, np.float32).astype(x_aval.dtype))
    fns = {}
    for label, mapping in (("prior", {}), ("measured", measured)):
        fn = jax.jit(lambda leaves, x, m=mapping: dense_forward(analysis, leaves, x, m))
        fns[label] = fn.lower(leaves, x).compile()
    times: dict[str, list[float]] = {label: [] for label in fns}
    for fn in fns.values():  # a warm-up call each
        jax.block_until_ready(fn(leaves, x))
    while True:
        order = list(fns) if len(times["prior"]) % 2 == 0 else list(fns)[::-1]
        for label in order:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[label](leaves, x))
            times[label].append(time.perf_counter() - t0)
        n = len(times["prior"])
        spent = min(sum(v) for v in times.values())
        if n >= 4 * LOWERING_RACE_CALLS or (n >= LOWERING_RACE_CALLS and spent >= 0.5):
            break
    diff = np.asarray(times["prior"]) - np.asarray(times["measured"])
    kept = bool(diff.mean() > 2 * diff.std(ddof=1) / np.sqrt(len(diff)))
    medians = (float(np.median(times["prior"])), float(np.median(times["measured"])))
    cache.put(machine, key, "lowerings:prior", (medians[0],))
    cache.put(machine, key, "lowerings:measured", (medians[1],))
    cache.put(machine, key, "lowerings:kept", (float(kept),))
    cache.save()
    return medians, kept
