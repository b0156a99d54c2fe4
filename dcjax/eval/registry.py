"""The method registry: every way of running a model over a stream, behind one interface.

A *method* turns a model (a `ModelSpec`) and a dict of options into a `Runner`:
``init()`` gives a fresh per-stream state and ``step(state, frame)`` processes
one ``(H, W, 3)`` uint8 frame, returning ``(output, state, info)``, jitted. The
harness (`dcjax.eval.harness`) times ``step`` frame by frame and compares every
method's output with ``nocache`` on the same frames.

``info`` must hold, as arrays:

- ``flops_ratio``: convolution and matrix-product FLOPs computed on this frame / a full recompute
  (1 for ``nocache``); ``1 / mean(flops_ratio)`` is the ideal speedup;
- ``match_ratio``: fraction of input blocks the method's matcher matched
  (NaN when the method matches nothing);
- ``refreshed``: whether the frame was recomputed in full;
- ``reuse_fraction``: ``(len(runner.layers),)`` fraction of each reused
  layer's output taken from the cache.

This module is the registry alone and imports no other module of `dcjax.eval`.
The methods register themselves when their modules are imported, which
`dcjax.eval` (its ``__init__``) does for all of them: ``nocache`` and
``deepcache`` (`dcjax.eval.methods`), ``deepcache+refine`` and ``delta``
(`dcjax.eval.refine_methods`), ``semantic`` and ``deepcache+semantic``
(`dcjax.eval.semantic_methods`), and the baselines ``deepmon``
(`dcjax.eval.deepmon`), ``mil`` (`dcjax.eval.mil`) and ``frame``
(`dcjax.eval.frame`).

Adding a method is one decorated factory in a module that `dcjax.eval` imports
(or that you import before using the method)::

    @register_method("mymethod", "one line saying what it does")
    def _mymethod(spec: ModelSpec, options: Mapping[str, Any]) -> Runner:
        cfg = deepcache_config(options)            # or read options yourself
        ...
        return Runner(method="mymethod", init=init, step=step, layers=spec.layers,
                      config={...})

``register_method(..., check=fn)`` lets ``fn(options)`` refuse bad options
without a model (`check_method`; the command line calls it before loading
anything): `dcjax.eval.methods.deepcache_config`, or `checked_options` with
per-option rules (`positive_int`, `number`, `one_of`). `make_runner` runs the
check, then the factory, and raises `MethodOptionError` for what either refuses.

A method spec on the command line is ``name`` or ``name:key=value,key=value``;
values are parsed as Python literals where possible (``psnr_threshold=25``,
``matcher=diamond``, ``refresh_every=None``), see `parse_method`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from dcjax import deepcache
from dcjax.config import Config
from dcjax.step import frame_input
from dcjax.transforms.guard import GuardConfig
from dcjax.transforms.trace import as_function

__all__ = [
    "METHODS",
    "LayerFlops",
    "MethodInfo",
    "MethodOptionError",
    "ModelSpec",
    "Runner",
    "cached_layers",
    "check_method",
    "check_options",
    "checked_option",
    "checked_options",
    "make_runner",
    "method_names",
    "number",
    "one_of",
    "optional_positive_int",
    "parse_method",
    "positive_int",
    "register_method",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerFlops:
    """One reused convolution: its name (Flax module path) and full-recompute FLOPs.

    ``sparse``: whether the method skips work in this layer (a convolution that
    reuses its cache, a fully connected layer updated by its changed inputs),
    False where it computes the layer in full on every frame, None where the
    method does not say.
    """

    name: str
    flops: int
    sparse: bool | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class ModelSpec:
    """A model as the methods see it.

    Attributes:
        name: zoo name or any label.
        module: a Flax module or ``fn(variables, x)``.
        variables: the model's variables.
        frame_shape: ``(H, W, 3)`` of the frames fed to ``step``.
        preprocess: per-pixel map from a uint8 frame to the model input, or None
            (divide by 255).
        fps: frame rate of the stream (for time-based policies such as DeepMon's
            cache expiry).
        calibration: frames ``(T, H, W, 3)`` of the stream for the measured
            tuning (`dcjax.deepcache.transform`'s ``calibration``), or None.
        boxes: for a detector, ``boxes(output, (H, W)) -> (K, 4)``, one frame's
            boxes; the records then carry `dcjax.eval.metrics.DETECTION_KEYS`.
        heatmap: for a detector, ``heatmap(output)``: the score map whose
            largest error the records report (``heatmap_max_err``).
        guard: for a detector, its score map as a `dcjax.transforms.guard.GuardConfig`
            with the threshold and margin it is guarded at by default (the
            methods' ``guard`` option), else None.
    """

    name: str
    module: Any
    variables: Any
    frame_shape: tuple[int, int, int]
    preprocess: Callable[[jax.Array], jax.Array] | None = None
    fps: float = 10.0
    calibration: Any = None
    boxes: Callable[[Any, tuple[int, int]], Any] | None = None
    heatmap: Callable[[Any], Any] | None = None
    guard: GuardConfig | None = None

    @functools.cached_property
    def analysis(self) -> deepcache.CachedModel:
        """The model traced once (no compilation): its conv layers and FLOPs."""
        return deepcache.transform(
            self.module,
            self.variables,
            frame_shape=self.frame_shape,
            config=Config(tuning="prior"),  # the layers and FLOPs: nothing to measure
            preprocess=self.preprocess,
        )

    @property
    def layers(self) -> tuple[LayerFlops, ...]:
        """The model's reused convolutions, then its fully connected layers (`cached_layers`),
        with no kernel choice (``sparse`` None)."""
        return tuple(dataclasses.replace(lay, sparse=None) for lay in cached_layers(self.analysis))

    def model_input(self, frame: jax.Array) -> jax.Array:
        """``frame`` as the model's (1, H, W, 3) float input (`dcjax.step.frame_input`)."""
        return frame_input(frame, self.preprocess, jnp.float32)[None]

    def apply(self, frame: jax.Array, variables: Any = None) -> Any:
        """The plain model on one frame (not jitted here), with ``variables`` if given."""
        variables = self.variables if variables is None else variables
        return as_function(self.module)(variables, self.model_input(frame))


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Runner:
    """A method instantiated for one model.

    Attributes:
        method: registry name.
        init: ``() -> state``.
        step: ``(state, frame) -> (output, state, info)``, jitted.
        layers: the layers ``info["reuse_fraction"]`` refers to.
        config: JSON-serialisable settings (recorded in the metrics).
        total_flops: FLOPs (convolutions and matrix products) of a full recompute.
        cached: the `CachedModel` behind the method, when there is one.
        timed: builds the same method without per-layer statistics
            (`dcjax.deepcache.Config.statistics`), whose steps compute the same
            outputs and skip the work done only for the report; the harness
            times that runner and takes ``reuse_fraction`` and ``flops_ratio``
            from this one, in an untimed pass over the same frames. ``None``:
            this runner is timed.
    """

    method: str
    init: Callable[[], Any]
    step: Callable[[Any, jax.Array], tuple[Any, Any, dict]]
    layers: tuple[LayerFlops, ...]
    config: dict[str, Any]
    total_flops: int = 0
    cached: deepcache.CachedModel | None = None
    timed: Callable[[], Runner] | None = None


@dataclasses.dataclass(frozen=True)
class MethodInfo:
    """A registered method: its factory, a one-line description, and ``check``:
    ``check(options)`` raises ValueError for options the method refuses, without
    a model (None: only the factory checks them)."""

    name: str
    factory: Callable[[ModelSpec, Mapping[str, Any]], Runner]
    description: str
    check: Callable[[Mapping[str, Any]], Any] | None = None


class MethodOptionError(ValueError):
    """A method spec the method refuses: an unknown option, a bad value, or
    options the model cannot take. `check_method` and `make_runner` raise it;
    the command line reports it as a bad argument."""


#: name -> `MethodInfo`; fill it with `register_method`.
METHODS: dict[str, MethodInfo] = {}


def register_method(
    name: str,
    description: str = "",
    *,
    check: Callable[[Mapping[str, Any]], Any] | None = None,
) -> Callable[[Callable[[ModelSpec, Mapping[str, Any]], Runner]], Callable]:
    """Register ``factory(spec, options) -> Runner`` under ``name``.

    ``check(options)``, where given, validates the options without a model (so
    that a command line refuses a bad method spec before loading anything) by
    raising ValueError; the factory should validate through the same function.

    Raises:
        ValueError: ``name`` is already registered or contains ``:`` or ``,``.
    """
    if not name or any(c in name for c in ":,= "):
        raise ValueError(f"dcjax: method name {name!r} must be non-empty without ':,= '")

    def deco(factory):
        if name in METHODS:
            raise ValueError(f"dcjax: method {name!r} is already registered")
        METHODS[name] = MethodInfo(name, factory, description, check)
        return factory

    return deco


def method_names() -> tuple[str, ...]:
    """Names of the registered methods, in registration order."""
    return tuple(METHODS)


def _literal(text: str) -> Any:
    if text.strip().lower() in ("inf", "+inf", "-inf"):
        return float(text)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_method(spec: str) -> tuple[str, dict[str, Any]]:
    """``"deepcache:psnr_threshold=25,block_size=20"`` -> ``("deepcache", {...})``.

    Values are Python literals where they parse as one, else strings; commas
    inside brackets or quotes belong to the value (``grid=(4,4)``).

    Raises:
        ValueError: unknown method name or a malformed option, naming it.
    """
    name, _, rest = spec.partition(":")
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(method_names())}")
    options: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in _split_options(rest, spec))):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"method option {item!r} in {spec!r} must be key=value")
        options[key.strip()] = _literal(value.strip())
    return name, options


def check_method(spec: str) -> tuple[str, dict[str, Any]]:
    """`parse_method`, then the method's own check of the options (`MethodInfo.check`).

    Raises:
        ValueError: an unknown method or a malformed spec (`parse_method`);
            `MethodOptionError`: options the method refuses.
    """
    name, options = parse_method(spec)
    _check(name, options)
    return name, options


def _check(method: str, options: Mapping[str, Any]) -> None:
    check = METHODS[method].check
    if check is None:
        return
    try:
        check(options)
    except (TypeError, ValueError) as e:
        raise MethodOptionError(_message(method, e)) from e


def _message(method: str, e: Exception) -> str:
    text = str(e).removeprefix("dcjax: ")
    return f"dcjax: {text}" if repr(method) in text else f"dcjax: method {method!r}: {text}"


def _split_options(text: str, spec: str) -> list[str]:
    """``text`` split at the commas outside brackets and quotes, so that a value
    may be a tuple or list literal: ``grid=(4,4)``, ``layers=['a','b']``."""
    items, depth, quote, start = [], 0, "", 0
    for i, c in enumerate(text):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth or quote:
        raise ValueError(f"unbalanced brackets or quotes in method spec {spec!r}")
    return [*items, text[start:]]


def make_runner(spec: ModelSpec, method: str, options: Mapping[str, Any] | None = None) -> Runner:
    """Instantiate registered ``method`` for ``spec``.

    Raises:
        ValueError: an unknown method; `MethodOptionError`: options the method
            refuses (`MethodInfo.check`), or that it cannot apply to this model
            (any ValueError of its factory).
    """
    if method not in METHODS:
        raise ValueError(
            f"dcjax: unknown method {method!r}; choose from {', '.join(method_names())}"
        )
    options = dict(options or {})
    _check(method, options)
    try:
        return METHODS[method].factory(spec, options)
    except MethodOptionError:
        raise
    except ValueError as e:
        raise MethodOptionError(_message(method, e)) from e


def check_options(method: str, options: Mapping[str, Any], allowed: set[str]) -> None:
    """Raise ValueError naming any option of ``method`` not in ``allowed``."""
    bad = sorted(set(options) - allowed)
    if bad:
        raise ValueError(
            f"dcjax: unknown option(s) {', '.join(map(repr, bad))} for method {method!r}; "
            f"allowed: {', '.join(sorted(allowed)) or 'none'}"
        )


def checked_options(
    method: str,
    options: Mapping[str, Any],
    defaults: Mapping[str, Any],
    rules: Mapping[str, Callable[[Any], Any]],
) -> dict[str, Any]:
    """``defaults`` updated by ``options``, each given value passed through its rule.

    ``rules[key](value)`` returns the value to use, or raises ValueError saying
    what it must be (`positive_int`, `optional_positive_int`, `number`,
    `one_of`). Options without a rule are an error naming them (`check_options`).
    """
    check_options(method, options, set(rules))
    return {**defaults, **{k: checked_option(k, v, rules[k]) for k, v in options.items()}}


def checked_option(key: str, value: Any, rule: Callable[[Any], Any]) -> Any:
    """``rule(value)``, whose ValueError names the option: ``option key=value must be ...``."""
    try:
        return rule(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"dcjax: option {key}={value!r} {e}") from None


def positive_int(value: Any) -> int:
    """An option rule (`checked_options`): an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("must be a positive int")
    return value


def optional_positive_int(value: Any) -> int | None:
    """An option rule: None or an int >= 1."""
    if value is None:
        return None
    try:
        return positive_int(value)
    except ValueError:
        raise ValueError("must be None or a positive int") from None


def number(lo: float = -math.inf, hi: float = math.inf) -> Callable[[Any], float]:
    """An option rule: a number (not NaN) in ``[lo, hi]``, as a float."""

    def rule(value: Any) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not lo <= float(value) <= hi
        ):
            if lo > -math.inf and hi < math.inf:
                raise ValueError(f"must be a number in [{lo:g}, {hi:g}]")
            if lo > -math.inf:
                raise ValueError(f"must be a number >= {lo:g}")
            if hi < math.inf:
                raise ValueError(f"must be a number <= {hi:g}")
            raise ValueError("must be a number")
        return float(value)

    return rule


def one_of(choices: Sequence[str]) -> Callable[[Any], str]:
    """An option rule: one of ``choices``."""

    def rule(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return rule


def cached_layers(cached: deepcache.CachedModel) -> tuple[LayerFlops, ...]:
    """The layers a `CachedModel`'s infos report on: its reused convolutions
    (``reuse_fraction``), then its fully connected layers (``dense_reuse``),
    each marked with whether the model computes it sparsely (`CachedModel.sparse`)."""
    return tuple(
        LayerFlops(name=lay.name, flops=int(lay.flops), sparse=bool(sparse))
        for lay, sparse in zip((*cached.layers, *cached.dense_layers), cached.sparse, strict=True)
    )
