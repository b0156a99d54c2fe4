"""Kernel choice by measurement: time each candidate kernel of a layer on this machine.

Contract:

- `candidates(p, backend)` lists the `KernelChoice`s that can compute a layer
  (its `TilePlan`) on a backend: always ``"dense"`` (the whole convolution,
  no cache); off GPU the tile kernel ``"xla"`` and the row kernel ``"rows"``
  where it computes the layer itself; on GPU ``"pallas_gpu"`` where it
  supports the layer, and not the tile and row kernels, whose loops of zero
  or one trip read their predicates on the host (`dcjax.transforms.host_syncs`):
  a step on GPU reads one predicate a frame, the still-frame skip's.
- `measure(p, choice, fractions)` times one candidate on the layer's real
  shapes at each dirty fraction of the output (seconds a call, the least of
  ``repeats`` calls after a warm-up): random input and weights, the cache
  donated and fed back as it is in the step, a reuse mask whose dirty pixels
  form one centred rectangle covering the fraction (DeepCache's masks are
  blobs). Each candidate is compiled once; the mask is an argument.
- The measurements' file (`TuningCache`, `machine_key`, `default_path`, the
  grid `FRACTIONS`) is `dcjax.kernels.measurements`; its names are re-exported
  here.
- `expected_cost(costs, fraction, refresh_every)` is the mean cost a frame of
  a stream pays: the cost at the layer's dirty fraction (linear between the
  measured fractions; without a fraction, the mean over all fractions from 0
  to 1), with one frame in ``refresh_every`` fully dirty.
- `tune(plans, backend, ...)` measures (or reads) the candidates of every
  layer (all of them on each class's probe, on the class's other layers the
  dense one and the kinds that won on the probe: `dcjax.kernels.probes`) and
  returns a `LayerTuning` per layer: its candidates' costs and the
  choice of least expected cost. The dense candidate reads no mask, so its
  timings at the fractions are samples of one cost: it costs the least of
  them at every fraction. The candidates, the dense one included,
  are compiled with the fixed lowering rules (`dcjax.kernels.lowering.prior`):
  the model's measured dense lowerings (`dcjax.lowerings`) are measured
  after the plan is made, so the dense candidate may be timed slower than
  the step computes it (the tuning may then keep reusing a layer that
  computed in full would be no slower).

Nothing here knows about models or streams: `dcjax.autotune` decides per
model (which fractions, whether the cached plan beats the dense one).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dcjax.kernels import auto as _auto
from dcjax.kernels import lowering as _lowering
from dcjax.kernels import probes as _probes
from dcjax.kernels import rows as _rows
from dcjax.kernels.masked import masked_conv
from dcjax.kernels.measurements import (
    CACHE_ENV,
    FRACTIONS,
    TuningCache,
    cores,
    cpu_model,
    default_path,
    machine_key,
)
from dcjax.kernels.tiles import TilePlan, layer_key

__all__ = [
    "CACHE_ENV",
    "FRACTIONS",
    "TUNINGS",
    "TUNING_ENV",
    "LOWERING_PREFIX",
    "KernelChoice",
    "LayerTuning",
    "TuningCache",
    "blob_mask",
    "candidates",
    "cores",
    "default_path",
    "expected_cost",
    "layer_key",
    "cpu_model",
    "machine_key",
    "measure",
    "resolve_tuning",
    "tune",
]

#: Candidate names, in the measurements' file, of a layer's dense lowerings
#: (`dcjax.kernels.lowering_tuning`): ``"lowering:dot"``.
LOWERING_PREFIX = "lowering:"

#: How ``kernel="auto"`` picks each layer's kernel (`dcjax.Config.tuning`):
#: ``"measure"`` times the candidates on this machine (`tune`); ``"prior"``
#: takes the rules of `dcjax.kernels.auto`, measured once on a 2-core machine.
TUNINGS: tuple[str, ...] = ("measure", "prior")

#: Environment variable giving the tuning when `dcjax.Config.tuning` is None.
TUNING_ENV = "DCJAX_TUNING"


def resolve_tuning(tuning: str | None) -> str:
    """``tuning``, else ``$DCJAX_TUNING``, else ``"measure"``; an unknown value is an error."""
    got = tuning if tuning is not None else os.environ.get(TUNING_ENV) or "measure"
    if got not in TUNINGS:
        where = "Config.tuning" if tuning is not None else f"${TUNING_ENV}"
        raise ValueError(f"dcjax: {where} must be one of {TUNINGS}, got {got!r}")
    return got


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelChoice:
    """A concrete way to compute a reused convolution (see `dcjax.kernels.masked_conv`).

    Attributes:
        impl: ``"dense"``, ``"xla"``, ``"rows"``, ``"pallas_gpu"`` or
            ``"pallas_tpu"`` (never ``"auto"``).
        tile: the tile kernels' output tile, or None for `tiles.default_tile`.
        chunk: the row kernel's smallest step, or None for its own rule.
    """

    impl: str
    tile: tuple[int, int] | None = None
    chunk: int | None = None

    @property
    def name(self) -> str:
        """A short stable name: ``"xla"``, ``"xla:8x8"``, ``"rows:64"``."""
        if self.tile is not None:
            return f"{self.impl}:{self.tile[0]}x{self.tile[1]}"
        if self.chunk is not None:
            return f"{self.impl}:{self.chunk}"
        return self.impl

    @property
    def keeps_cache(self) -> bool:
        """Whether the layer reads a cache under this choice (all but ``"dense"``)."""
        return self.impl != "dense"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerTuning:
    """The measurements and the choice for one layer.

    Attributes:
        costs: candidate name -> seconds a call at each of `FRACTIONS`.
        expected: candidate name -> `expected_cost` at the layer's fraction.
        choice: the candidate of least expected cost.
        fraction: the dirty fraction it was chosen for (None: all fractions).
    """

    costs: Mapping[str, tuple[float, ...]]
    expected: Mapping[str, float]
    choice: KernelChoice
    fraction: float | None

    @property
    def dense_cost(self) -> float:
        """Expected seconds a frame of the layer computed in full."""
        return self.expected["dense"]

    @property
    def cost(self) -> float:
        """Expected seconds a frame of the chosen candidate."""
        return self.expected[self.choice.name]


def candidates(p: TilePlan, backend: str, scattered: bool = False) -> tuple[KernelChoice, ...]:
    """The kernels that can compute the layer ``p`` on ``backend`` (see the module docstring)."""
    out = [KernelChoice(impl="dense")]
    if backend == "gpu":
        if _auto.pallas_gpu_computes(p):
            out.append(KernelChoice(impl="pallas_gpu"))
        return tuple(out)
    out.append(KernelChoice(impl="xla"))
    if _rows.computes(p.cin, p.groups):
        out.append(KernelChoice(impl="rows", chunk=_auto.row_chunk(p, scattered)))
    return tuple(out)


def blob_mask(n: int, ho: int, wo: int, fraction: float) -> np.ndarray:
    """A bool (n, ho, wo) reuse mask, false on one centred rectangle holding about
    ``fraction`` of the pixels (all true at 0, all false at 1)."""
    mask = np.ones((n, ho, wo), bool)
    if fraction <= 0:
        return mask
    side = float(np.sqrt(fraction))
    dh = min(ho, max(1, round(ho * side)))
    dw = min(wo, max(1, round(fraction * ho * wo / dh)))
    y0, x0 = (ho - dh) // 2, (wo - dw) // 2
    mask[:, y0 : y0 + dh, x0 : x0 + dw] = False
    return mask


def _inputs(p: TilePlan, dtype=jnp.float32) -> tuple[jax.Array, jax.Array]:
    """Random input and weights of the layer ``p``, shared by its candidates."""
    # Drawn by NumPy and put on the device: `jax.random` would compile a program
    # for each new shape, more than the dense candidate's own compile. Uniform in
    # [-1, 1): a fifth of the normal draw's cost, and no kernel's speed depends
    # on the values' distribution.
    rng = np.random.default_rng(0)

    def draw(shape):
        return jnp.asarray((rng.random(shape, np.float32) * 2 - 1).astype(dtype))

    return draw((p.n, p.h, p.w, p.cin)), draw((p.kh, p.kw, p.cin // p.groups, p.cout))


def _compiled(p: TilePlan, choice: KernelChoice, x: jax.Array, w: jax.Array):
    """``choice`` on the layer ``p``, compiled, and its arguments but the mask
    (``x`` and ``w`` from `_inputs`; a cache of its own, donated call by call)."""
    geometry = p.geometry
    cached = jnp.asarray(np.zeros((p.n, p.ho, p.wo, p.cout), x.dtype))

    def call(x, w, mask, cached):
        return masked_conv(
            x, w, mask, cached, geometry, impl=choice.impl, tile=choice.tile, chunk=choice.chunk,
            interpret=choice.impl.startswith("pallas") and jax.default_backend() == "cpu",
        )  # fmt: skip

    mask = jax.ShapeDtypeStruct((p.n, p.ho, p.wo), jnp.bool_)
    fn = jax.jit(call, donate_argnums=(3,)).lower(x, w, mask, cached).compile()
    return fn, x, w, cached


def _compiled_by_fixed_rules(p: TilePlan, choice: KernelChoice, x, w):
    """`_compiled`, traced with the fixed lowering rules whatever `use` block the
    caller is in: the rules a step that reuses computes its tile windows with
    (module docstring: the dense candidate's too)."""
    with _lowering.use({}):
        return _compiled(p, choice, x, w)


def _timed(
    p: TilePlan, compiled: Mapping[str, tuple], fractions: Sequence[float], repeats: int
) -> dict[str, tuple[float, ...]]:
    """Seconds a call of each compiled candidate of the layer ``p`` at each of
    ``fractions``: the least of ``repeats`` calls, the candidates taking turns
    call by call, so that a change of the machine's load meets them all alike."""
    masks = [jnp.asarray(blob_mask(p.n, p.ho, p.wo, f)) for f in fractions]
    state = {name: list(c) for name, c in compiled.items()}
    best = {name: [float("inf")] * len(fractions) for name in compiled}
    for rep in range(repeats + 1):  # the first round warms up
        for k, mask in enumerate(masks):
            for name, (fn, x, w, cached) in state.items():
                t0 = time.perf_counter()
                cached = fn(x, w, mask, cached).block_until_ready()
                if rep:
                    best[name][k] = min(best[name][k], time.perf_counter() - t0)
                state[name][3] = cached
    return {name: tuple(v) for name, v in best.items()}


def measure(
    p: TilePlan,
    choice: KernelChoice,
    fractions: Sequence[float] = FRACTIONS,
    *,
    repeats: int = 5,
    dtype=jnp.float32,
) -> tuple[float, ...]:
    """Seconds a call of ``choice`` on the layer ``p`` at each of ``fractions``
    (see the module docstring)."""
    compiled = _compiled(p, choice, *_inputs(p, dtype))
    return _timed(p, {choice.name: compiled}, fractions, repeats)[choice.name]


def expected_cost(
    costs: Sequence[float],
    fraction: float | None,
    refresh_every: int | None,
    fractions: Sequence[float] = FRACTIONS,
) -> float:
    """Mean seconds a frame (see the module docstring)."""
    costs = np.asarray(costs, float)
    if fraction is not None and not np.isfinite(fraction):
        raise ValueError(f"dcjax: a dirty fraction must be a number in [0, 1], got {fraction!r}")
    if fraction is None:
        xs = np.asarray(fractions, float)
        steady = float(np.sum((costs[1:] + costs[:-1]) / 2 * np.diff(xs)) / (xs[-1] - xs[0]))
    else:
        steady = float(np.interp(min(max(fraction, 0.0), 1.0), fractions, costs))
    if not refresh_every:
        return steady
    full = float(np.interp(1.0, fractions, costs))
    return steady + (full - steady) / refresh_every


def tune(
    plans: Sequence[TilePlan],
    backend: str,
    *,
    cache: TuningCache,
    fractions: Sequence[float | None] | None = None,
    refresh_every: int | None = None,
    scattered: Sequence[bool] | None = None,
    repeats: int = 5,
    progress: Callable[..., Iterable] | None = None,
    precompile: Sequence[Callable[[], Any]] = (),
    dtypes: Sequence[Any] | None = None,
    prune: bool = True,
) -> tuple[LayerTuning, ...]:
    """A `LayerTuning` per layer of ``plans`` (see the module docstring).

    ``dtypes``: per layer, the type its convolution computes in (None: all
    float32); the candidates are timed in it, and its measurements are kept
    under it (`layer_key`).
    ``fractions``: per layer, the dirty fraction the stream shows (None: all
    fractions alike). ``progress(iterable, total=n, what=...)`` wraps the
    compiles and the measurements still to make (a tqdm bar). Each distinct
    geometry is measured once; measurements go to ``cache``, saved at the end.
    ``precompile``: the caller's compiles of programs it will time later (run
    beside the candidates' compiles, all finished before any timing).
    ``prune``: measure every candidate of each class's probe first, and of the
    class's other layers only the dense candidate and the kinds that won on
    the probe (`dcjax.kernels.probes`); the others are recorded in ``cache``
    as passed over (`TuningCache.pass_over`), so a later tuning does not
    measure them either. False: every candidate of every layer.
    """
    n = len(plans)
    fractions = [None] * n if fractions is None else list(fractions)
    scattered = [False] * n if scattered is None else list(scattered)
    dtypes = [jnp.float32] * n if dtypes is None else list(dtypes)
    machine = machine_key()
    per_layer = []
    layers: dict[str, tuple[TilePlan, Any, list[KernelChoice]]] = {}
    for p, sc, dtype in zip(plans, scattered, dtypes, strict=True):
        key = layer_key(p, dtype)
        cands = candidates(p, backend, sc)
        per_layer.append((key, cands))
        # one geometry, several layers: every candidate any of them has (a
        # scattered layer's row kernel takes another smallest step)
        known = layers.setdefault(key, (p, dtype, []))[2]
        known.extend(c for c in cands if c not in known)
    first = _probes.probes({k: (p, d) for k, (p, d, _) in layers.items()}) if prune else set(layers)
    _measure({k: layers[k] for k in first}, cache, machine, repeats, progress, precompile)
    if prune:
        kept: dict[tuple, set[str]] = {}
        for key in first:
            p, dtype, cands = layers[key]
            won = _probes.winners(_costs(cache, machine, key, cands), FRACTIONS)
            kept[_probes.layer_class(p, dtype)] = {c.impl for c in cands if c.name in won}
        rest = {}
        for key, (p, dtype, cands) in layers.items():
            if key in first:
                continue
            wins = kept[_probes.layer_class(p, dtype)]
            for c in cands:
                lost = c.impl != "dense" and c.impl not in wins
                if lost and cache.get(machine, key, c.name) is None:
                    cache.pass_over(machine, key, c.name)
            rest[key] = (p, dtype, cands)
        _measure(rest, cache, machine, repeats, progress, ())
    cache.save()
    out = []
    for (key, cands), fraction in zip(per_layer, fractions, strict=True):
        costs = _costs(cache, machine, key, cands)
        expected = {name: expected_cost(v, fraction, refresh_every) for name, v in costs.items()}
        best = min((c for c in cands if c.name in costs), key=lambda c: expected[c.name])
        out.append(
            LayerTuning(
                costs=costs,
                expected=expected,
                choice=best,
                fraction=fraction,
            )
        )
    return tuple(out)


def _costs(
    cache: TuningCache, machine: str, key: str, cands: Sequence[KernelChoice]
) -> dict[str, tuple[float, ...]]:
    """The measured candidates' costs of the layer ``key``, the ones passed over
    left out. The dense candidate reads no mask, so its timings are samples of
    one cost: it costs the least of them at every fraction."""
    costs = {c.name: cache.get(machine, key, c.name) for c in cands}
    costs = {name: v for name, v in costs.items() if v}
    if "dense" in costs:
        costs["dense"] = (min(costs["dense"]),) * len(costs["dense"])
    return costs


def _measure(
    layers: Mapping[str, tuple[TilePlan, Any, Sequence[KernelChoice]]],
    cache: TuningCache,
    machine: str,
    repeats: int,
    progress: Callable[..., Iterable] | None,
    precompile: Sequence[Callable[[], Any]],
) -> None:
    """Compile, then time, every candidate of ``layers`` not yet in ``cache``
    (nor passed over), and put their costs there; ``precompile`` runs beside
    the compiles."""
    todo = {
        (key, c.name): (p, dtype, c)
        for key, (p, dtype, cands) in layers.items()
        for c in cands
        if cache.get(machine, key, c.name) is None
    }
    items = list(todo.items())
    progress = progress if items else None
    # Every candidate is compiled before any is timed, so that no compile runs
    # beside a timed call: on a pool of one thread per core, where one
    # candidate traces while XLA compiles another outside the GIL, beside the
    # caller's own compiles (``precompile``). The candidates of a layer share
    # one input.
    inputs: dict[str, tuple] = {}
    for (key, _), (p, dtype, _) in items:
        if key not in inputs:
            inputs[key] = _inputs(p, dtype)
    by_layer: dict[str, dict[str, tuple]] = {}
    with concurrent.futures.ThreadPoolExecutor(max(1, cores())) as pool:
        extra = [pool.submit(job) for job in precompile]
        futures = {
            pool.submit(_compiled_by_fixed_rules, p, c, *inputs[key]): (key, name)
            for (key, name), (p, _, c) in items
        }
        done = concurrent.futures.as_completed(futures)
        for f in progress(done, total=len(items), what="compiling") if progress else done:
            f.result()
        for f in extra:
            f.result()
    for f, (key, name) in futures.items():
        by_layer.setdefault(key, {})[name] = (todo[(key, name)][0], f.result())
    timing = list(by_layer.items())
    for key, group in progress(timing, total=len(timing), what="timing") if progress else timing:
        p = next(iter(group.values()))[0]
        timed = _timed(p, {name: c for name, (_, c) in group.items()}, FRACTIONS, repeats)
        for name, costs in timed.items():
            cache.put(machine, key, name, costs)
