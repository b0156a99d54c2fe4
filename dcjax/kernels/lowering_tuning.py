"""The dense lowering of each convolution, chosen by measurement on this machine.

Contract:

- `tune_lowerings(plans, cache=...)` times, for every distinct geometry among
  ``plans``, `dcjax.kernels.lowering.dense_conv` by each of its lowerings
  (`dcjax.kernels.lowering.lowerings`, at least two): jitted, on random input
  and weights of the layer's shapes, the least of ``repeats`` calls after a
  warm-up, the lowerings taking turns call by call so that a change of the
  machine's load meets them all alike. Every lowering is compiled before any
  is timed. The seconds are kept in the `dcjax.kernels.tuning.TuningCache`
  under the layer's key as candidates ``"lowering:<name>"`` (one value each),
  so a geometry is measured once per machine and software.
- It returns a `LoweringTuning` per plan: the costs, the fastest and the
  fixed rules' choice (`dcjax.kernels.lowering.prior`); the caller decides
  what runs (`dcjax.lowerings.measure_lowerings` checks the fastest on the
  whole model) and traces it inside `dcjax.kernels.lowering.use`.

The transform calls it (through `dcjax.lowerings.measure_lowerings`) when the
tuning is ``"measure"`` (`dcjax.kernels.tuning.resolve_tuning`), and so does
the dense baseline of the benchmarks (`dcjax.eval.methods.fast_apply`, by
``$DCJAX_TUNING``); under ``"prior"`` nothing is measured and every layer
takes the fixed rules. Measured in float32: other dtypes take the prior.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dcjax.kernels import lowering as _lowering
from dcjax.kernels import tuning as kt
from dcjax.kernels.tiles import TilePlan, layer_key

__all__ = ["LoweringTuning", "tune_lowerings"]

PREFIX = kt.LOWERING_PREFIX


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoweringTuning:
    """The measurements and the choice of one layer's dense lowering.

    Attributes:
        costs: lowering -> seconds a call of the whole convolution.
        choice: the lowering of least cost (`dcjax.lowerings.measure_lowerings`
            replaces it by ``prior`` where the whole model's race keeps the
            fixed rules).
        prior: the lowering the fixed rules pick (`dcjax.kernels.lowering.prior`).
    """

    costs: Mapping[str, float]
    choice: str
    prior: str


def _compiled(p: TilePlan, how: str, x: jax.Array, w: jax.Array):
    """`dense_conv` of the layer ``p`` by ``how``, compiled for ``x`` and ``w``."""
    return jax.jit(lambda x, w: _lowering.dense_conv(x, w, p, how)).lower(x, w).compile()


def _timed(group: Mapping[str, Callable], x: jax.Array, w: jax.Array, repeats: int) -> dict:
    """Seconds a call of each compiled lowering: the least of ``repeats`` calls,
    the lowerings taking turns, after a round that warms up."""
    best = {name: float("inf") for name in group}
    for rep in range(repeats + 1):
        for name, fn in group.items():
            t0 = time.perf_counter()
            fn(x, w).block_until_ready()
            if rep:
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


def tune_lowerings(
    plans: Sequence[TilePlan],
    *,
    cache: kt.TuningCache,
    repeats: int = 5,
    progress: Callable[..., Iterable] | None = None,
) -> tuple[LoweringTuning, ...]:
    """A `LoweringTuning` per plan (see the module docstring).

    ``progress(iterable, total=n, what=...)`` wraps the compiles and the
    timings still to make (a tqdm bar); measurements go to ``cache``, saved
    at the end.
    """
    machine = kt.machine_key()
    todo: dict[str, TilePlan] = {}
    for p in plans:
        key = layer_key(p)
        ways = _lowering.lowerings(p)
        if any(cache.get(machine, key, PREFIX + h) is None for h in ways):
            todo.setdefault(key, p)
    if todo:
        rng = np.random.default_rng(0)
        inputs = {
            key: (
                jnp.asarray(rng.standard_normal((p.n, p.h, p.w, p.cin), np.float32)),
                jnp.asarray(
                    rng.standard_normal((p.kh, p.kw, p.cin // p.groups, p.cout), np.float32)
                ),
            )
            for key, p in todo.items()
        }
        jobs = [(key, h) for key, p in todo.items() for h in _lowering.lowerings(p)]
        with concurrent.futures.ThreadPoolExecutor(max(1, kt.cores())) as pool:
            futures = {
                pool.submit(_compiled, todo[key], h, *inputs[key]): (key, h) for key, h in jobs
            }
            done = concurrent.futures.as_completed(futures)
            for f in progress(done, total=len(jobs), what="compiling") if progress else done:
                f.result()
        compiled: dict[str, dict[str, Callable]] = {}
        for f, (key, h) in futures.items():
            compiled.setdefault(key, {})[h] = f.result()
        items = list(compiled.items())
        for key, group in progress(items, total=len(items), what="timing") if progress else items:
            for h, seconds in _timed(group, *inputs[key], repeats).items():
                cache.put(machine, key, PREFIX + h, (seconds,))
        cache.save()
    out = []
    for p in plans:
        ways = _lowering.lowerings(p)
        costs = {h: cache.get(machine, layer_key(p), PREFIX + h)[0] for h in ways}
        best = min(ways, key=costs.__getitem__)
        out.append(LoweringTuning(costs=costs, choice=best, prior=_lowering.prior(p)))
    return tuple(out)
