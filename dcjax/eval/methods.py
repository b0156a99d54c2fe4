"""The core methods, ``plain``, ``nocache`` and ``deepcache``, and what method modules build on.

``plain`` is the model as users write it, ``jax.jit(model.apply)``, with the
variables as arguments (``form="args"``) or closed over as constants
(``form="const"``): the baseline of ``speedup_vs_plain``. ``nocache`` is
dcjax's own dense lowering, every convolution computed in full the way the
cached step computes what it does not reuse (grouped and depthwise ones the way
the sparse kernels' dense path computes them on CPU, where XLA's own are
several times slower; ``impl="const"`` bakes the weights in as constants): the
baseline of ``speedup_vs_dense`` and the reference of every fidelity metric.
``deepcache`` is `dcjax.deepcache.transform` with the method's options as
`Config` fields.

The helpers other method modules use: `deepcache_config` (a `Config` from
method options, also a registry ``check``), `config_dict`, `transform`,
`cached_runner` and `with_timed_twin` (a `CachedModel` as a `Runner`, with the
twin the harness times), `fast_apply` (the model with the kernels' dense
convolutions) and `state_bytes`. The registry itself (`register_method`,
`make_runner`, `ModelSpec`, `Runner`, ...) is `dcjax.eval.registry`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dcjax import autotune, deepcache
from dcjax import kernels as _kernels
from dcjax.config import Config
from dcjax.eval.metrics import PLAIN_FORMS
from dcjax.eval.registry import (
    ModelSpec,
    Runner,
    cached_layers,
    checked_options,
    one_of,
    register_method,
)
from dcjax.kernels.tuning import resolve_tuning
from dcjax.transforms.analysis import analyze
from dcjax.transforms.guard import GuardConfig
from dcjax.transforms.interpreter import dense_forward
from dcjax.transforms.spatial import Spatial
from dcjax.transforms.trace import trace_model

__all__ = [
    "DEFAULT_KERNEL",
    "cached_runner",
    "config_dict",
    "deepcache_config",
    "tuning_dict",
    "dense_conv",
    "fast_apply",
    "state_bytes",
    "transform",
    "with_timed_twin",
]

#: Kernel the harness uses for reused convolutions unless a method spec says
#: otherwise (``Config``'s own default, ``"reference"``, is dense + select and
#: saves nothing).
DEFAULT_KERNEL = "auto"


_CONFIG_FIELDS = {f.name for f in dataclasses.fields(Config)}
#: The method options that set `Config.guard` from `ModelSpec.guard`.
_GUARD_OPTIONS = ("guard", "guard_margin")


def deepcache_config(
    options: Mapping[str, Any], spec: ModelSpec | None = None, **defaults: Any
) -> Config:
    """A `Config` from method options (unknown keys are an error naming them).

    ``kernel`` defaults to `DEFAULT_KERNEL`; ``defaults`` override `Config`'s
    own defaults and are overridden by ``options``. Two options are not
    `Config` fields: ``guard`` guards the model's score map
    (`ModelSpec.guard`, a `dcjax.transforms.guard.GuardConfig`) with its own threshold
    (``guard=True``) or another (``guard=0.1``), and ``guard_margin`` sets its
    margin in input pixels; without ``spec`` they are checked, not resolved.
    """
    merged = {"kernel": DEFAULT_KERNEL, **defaults}
    options = dict(options)
    guarding = {k: options.pop(k) for k in _GUARD_OPTIONS if k in options}
    for key, value in options.items():
        if key not in _CONFIG_FIELDS:
            raise ValueError(
                f"dcjax: unknown option {key!r}; Config fields are "
                f"{', '.join(sorted(_CONFIG_FIELDS))}, and {', '.join(_GUARD_OPTIONS)}"
            )
        merged[key] = value
    if guarding:
        merged["guard"] = _guard(guarding, spec)
    if isinstance(merged.get("psnr_threshold"), int):
        merged["psnr_threshold"] = float(merged["psnr_threshold"])
    return Config(**merged)


def _guard(options: Mapping[str, Any], spec: ModelSpec | None) -> GuardConfig | None:
    """The `GuardConfig` the ``guard`` and ``guard_margin`` options give ``spec``."""
    value = options.get("guard", True)
    if value is False or value is None:
        if len(options) > 1:
            raise ValueError("dcjax: guard_margin needs guard (True or a threshold)")
        return None
    if not (value is True or isinstance(value, (int, float))):
        raise ValueError(f"dcjax: guard must be True, False or a threshold, got {value!r}")
    base = GuardConfig(threshold=0.0) if spec is None else spec.guard
    if base is None:
        raise ValueError(
            f"dcjax: {spec.name} has no score map to guard (the guard option is for "
            "detectors that name one: ModelSpec.guard)"
        )
    changes = {} if value is True else {"threshold": value}
    if "guard_margin" in options:
        changes["margin"] = options["guard_margin"]
    return dataclasses.replace(base, **changes)


def config_dict(config: Config) -> dict[str, Any]:
    """A `Config` as a JSON-serialisable dict."""
    return _jsonable(config)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return value


def state_bytes(state: Any) -> int:
    """Bytes held by a per-stream state pytree (the cache's memory)."""
    return int(
        sum(
            np.dtype(x.dtype).itemsize * int(np.prod(x.shape))
            for x in jax.tree_util.tree_leaves(state)
            if hasattr(x, "shape")
        )
    )


# --- the two core methods ---------------------------------------------------------------


def dense_conv(eqn: Any, invals: Sequence[Any]) -> jax.Array:
    """A convolution equation computed in full, as the sparse kernels' dense branch does.

    On CPU, XLA's grouped (and depthwise) convolutions are slow; the kernels'
    dense path rewrites them, and so does this baseline, so that ``nocache`` is
    not handicapped against the cached methods (`dcjax.kernels.dense_conv_eqn`).
    """
    return _kernels.dense_conv_eqn(eqn, invals)


def fast_apply(spec: ModelSpec) -> tuple[Callable[[Any, jax.Array], Any], list]:
    """The model as ``apply(leaves, frame)`` with convolutions computed by `dense_conv`.

    Returns:
        ``(apply, leaves)``: a traceable function of the flattened variables and
        one uint8 frame, and the variables' leaves to pass it.
    """
    traced = trace_model(spec.module, spec.variables, spec.frame_shape)
    k = len(traced.leaves)
    frame_sig = Spatial(axes=(1, 2), size=spec.frame_shape[:2], stride=(1, 1))
    analysis = analyze(traced.jaxpr, [None] * k + [frame_sig], [False] * k + [True])
    lowerings = {}  # the fixed rules, unless measuring: the transform's own choice
    if resolve_tuning(None) == "measure":
        lowerings = autotune.measure_lowerings(analysis, traced.leaves).choices

    def apply(leaves, frame):
        x = spec.model_input(jnp.asarray(frame))
        outs = dense_forward(analysis, leaves, x, lowerings)
        return jax.tree_util.tree_unflatten(traced.out_tree, outs)

    return apply, traced.leaves


def _nocache_options(options: Mapping[str, Any]) -> dict[str, Any]:
    return checked_options(
        "nocache", options, {"impl": "fast"}, {"impl": one_of(("fast", "const"))}
    )


@register_method(
    "nocache",
    "dcjax's dense lowering: every frame computed in full, the way the cached step "
    "computes what it does not reuse (the baseline of speedup_vs_dense)",
    check=_nocache_options,
)
def _nocache(spec: ModelSpec, options: Mapping[str, Any]) -> Runner:
    """``impl="fast"`` (default): the model through the interpreter, with grouped
    convolutions as the kernels' dense path computes them (`fast_apply`) and the
    weights as arguments, as the cached step takes them; ``impl="const"``: the
    same with the weights baked into the executable as constants."""
    impl = _nocache_options(options)["impl"]
    apply, leaves = fast_apply(spec)
    return _baseline("nocache", spec, apply, leaves, const=impl == "const", config={"impl": impl})


def _plain_options(options: Mapping[str, Any]) -> dict[str, Any]:
    return checked_options("plain", options, {"form": "args"}, {"form": one_of(PLAIN_FORMS)})


@register_method(
    "plain",
    "the model as users write it, jax.jit(model.apply), XLA's own lowering (the "
    "baseline of speedup_vs_plain)",
    check=_plain_options,
)
def _plain(spec: ModelSpec, options: Mapping[str, Any]) -> Runner:
    """``form="args"`` (default): ``jax.jit`` of the model with the variables
    passed as arguments; ``form="const"``: with the variables closed over, so
    that XLA sees them as constants (and may fold batch norms into the
    convolutions)."""
    form = _plain_options(options)["form"]
    return _baseline(
        "plain", spec, lambda variables, frame: spec.apply(frame, variables), spec.variables,
        const=form == "const", config={"form": form},
    )  # fmt: skip


def _baseline(
    method: str,
    spec: ModelSpec,
    apply: Callable[[Any, jax.Array], Any],
    variables: Any,
    *,
    const: bool,
    config: dict[str, Any],
) -> Runner:
    """A method that computes every frame in full, ``apply(variables, frame)``
    jitted with ``variables`` passed as arguments, or closed over (``const``:
    constants of the executable)."""
    info = {
        "flops_ratio": jnp.float32(1.0),
        "match_ratio": jnp.float32(jnp.nan),
        "refreshed": jnp.bool_(True),
        "reuse_fraction": jnp.zeros((len(spec.layers),), jnp.float32),
    }

    def _step(variables, state, frame):
        return apply(variables, frame), state, dict(info)

    if const:
        step = jax.jit(functools.partial(_step, variables))
    else:
        step = functools.partial(jax.jit(_step), variables)
    return Runner(
        method=method,
        init=lambda: (),
        step=step,
        layers=spec.layers,
        config=config,
        total_flops=int(spec.analysis.total_flops),
    )


def transform(spec: ModelSpec, config: Config) -> deepcache.CachedModel:
    """`deepcache.transform` of ``spec`` with ``config``."""
    return deepcache.transform(
        spec.module,
        spec.variables,
        frame_shape=spec.frame_shape,
        config=config,
        preprocess=spec.preprocess,
        calibration=spec.calibration,
    )


def tuning_dict(cached: deepcache.CachedModel) -> dict[str, Any]:
    """What the measured tuning decided (`dcjax.autotune.Tuning`), for the
    metrics: ``plan`` (one of `dcjax.autotune.PLANS`, "prior" also where it
    did not run), the number of layers given each kernel, for a cut plan
    ``cut`` (the dirty fraction from which it computes layers in full), and
    where the plans raced, ``raced_ms``: each raced plan's milliseconds a
    frame."""
    tuning = cached.tuning
    if tuning is None:
        return {"plan": "prior"}
    out: dict[str, Any] = {"plan": tuning.plan}
    if tuning.plan != "prior":  # the fixed rules' kernels run: none measured
        names = [c.impl for c in tuning.choices if c is not None]
        out["kernels"] = {n: names.count(n) for n in sorted(set(names))}
    if tuning.cut is not None:
        out["cut"] = tuning.cut
    if tuning.raced is not None:
        out["raced_ms"] = {p: t * 1e3 for p, t in zip(autotune.PLANS, tuning.raced) if t == t}
    return out


def with_timed_twin(
    build: Callable[[Config], Any], runner: Callable[[Any, Config], Runner], cfg: Config
) -> Runner:
    """The `Runner` (``runner(model, cfg)``) of ``build(cfg)`` with statistics,
    whose `Runner.timed` runs the same model without them, whatever
    ``cfg.statistics`` says (the harness reports them and times the step
    without them). The twin is ``model.with_statistics(False)``
    (`dcjax.cached_model.CachedModel.with_statistics`,
    `dcjax.switching.Adaptive.with_statistics`): the same plan, not a second
    `transform`, whose race on the calibration frames could choose another
    plan and mix one plan's times and outputs with another's statistics. With
    semantic exits, which always report them, ``runner(build(cfg), cfg)``
    alone."""
    if cfg.semantic is not None:
        return runner(build(cfg), cfg)
    with_stats = dataclasses.replace(cfg, statistics=True)
    model = build(with_stats)
    without = dataclasses.replace(cfg, statistics=False)
    return dataclasses.replace(
        runner(model, with_stats), timed=lambda: runner(model.with_statistics(False), without)
    )


def cached_runner(method: str, spec: ModelSpec, cfg: Config) -> Runner:
    """The runner of `transform` of ``spec`` with ``cfg``, with its timed twin."""

    def runner(cached: deepcache.CachedModel, cfg: Config) -> Runner:
        return Runner(
            method=method,
            init=cached.init,
            step=cached.step,
            layers=cached_layers(cached),
            config={**config_dict(cfg), **tuning_dict(cached)},
            total_flops=int(cached.total_flops),
            cached=cached,
        )

    return with_timed_twin(lambda cfg: transform(spec, cfg), runner, cfg)


@register_method(
    "deepcache",
    "DeepCache: block matching, region propagation, sparse reuse",
    check=deepcache_config,
)
def _deepcache(spec: ModelSpec, options: Mapping[str, Any]) -> Runner:
    return cached_runner("deepcache", spec, deepcache_config(options, spec))
