"""The ``adaptive`` method: DeepCache with measured plans switched at run time
(`dcjax.switching`).

Registered when `dcjax.eval` imports this module. Options: the `Config` fields
(``kernel`` must stay ``"auto"``; ``tuning`` is ``"measure"`` whatever the
environment says), and the controller's: ``levels`` (input dirty fractions a
plan is tuned for, separated by ``|`` on the command line: ``levels=0.1|0.5|1``;
default `dcjax.switching.LEVELS`), ``smoothing``, ``margin``, ``patience``.
``info`` carries ``plan`` (the index of the plan that ran) and ``level``; the
record's config lists the distinct plans and every switch is counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dcjax import switching
from dcjax.eval.methods import config_dict, deepcache_config, tuning_dict, with_timed_twin
from dcjax.eval.registry import (
    ModelSpec,
    Runner,
    cached_layers,
    checked_option,
    number,
    positive_int,
    register_method,
)

__all__ = ["adaptive_options", "build_adaptive"]

_CONTROLLER = {
    "smoothing": number(0.0, 1.0),
    "margin": number(0.0, 1.0),
    "patience": positive_int,
}


def _levels(value: Any) -> tuple[float, ...]:
    parts = value.split("|") if isinstance(value, str) else value
    if isinstance(parts, (int, float)):
        parts = [parts]
    try:
        levels = tuple(float(v) for v in parts)
    except (TypeError, ValueError):
        raise ValueError("must be numbers separated by |") from None
    if not levels or any(not 0 < v <= 1 for v in levels) or list(levels) != sorted(set(levels)):
        raise ValueError("must increase within (0, 1]")
    return levels


def adaptive_options(
    options: Mapping[str, Any], spec: ModelSpec | None = None
) -> tuple[Any, tuple[float, ...], dict]:
    """(config, levels, controller options) of the method's options (for
    ``spec``, `dcjax.eval.methods.deepcache_config`); a ValueError names a bad one."""
    options = dict(options)
    levels = checked_option("levels", options.pop("levels", switching.LEVELS), _levels)
    controller = {
        k: checked_option(k, options.pop(k), rule)
        for k, rule in _CONTROLLER.items()
        if k in options
    }
    cfg = deepcache_config(options, spec, kernel="auto", tuning="measure")
    if cfg.kernel != "auto" or cfg.tuning != "measure":
        raise ValueError("dcjax: the adaptive method needs kernel=auto and tuning=measure")
    return cfg, levels, controller


def build_adaptive(
    spec: ModelSpec, cfg: Any, levels: tuple[float, ...], controller: Mapping[str, Any],
    *, progress: bool = True,
) -> switching.Adaptive:  # fmt: skip
    """`dcjax.switching.adaptive` of ``spec`` (calibrated on its calibration frames)."""
    return switching.adaptive(
        spec.module, spec.variables, frame_shape=spec.frame_shape, config=cfg, levels=levels,
        preprocess=spec.preprocess, calibration=spec.calibration, progress=progress,
        **controller,
    )  # fmt: skip


@register_method(
    "adaptive",
    "DeepCache with measured plans switched by the stream's dirty fraction",
    check=adaptive_options,
)
def _adaptive(spec: ModelSpec, options: Mapping[str, Any]) -> Runner:
    cfg, levels, controller = adaptive_options(options, spec)

    def runner(a: switching.Adaptive, cfg) -> Runner:
        first = a.models[0]
        return Runner(
            method="adaptive",
            init=a.init,
            step=a.step,
            layers=cached_layers(first),
            config={
                **config_dict(cfg),
                "levels": list(a.levels),
                "plans": [tuning_dict(m) for m in a.models],
            },
            total_flops=int(first.total_flops),
        )

    return with_timed_twin(lambda cfg: build_adaptive(spec, cfg, levels, controller), runner, cfg)
