"""``semantic`` and ``deepcache+semantic`` methods for the evaluation harness.

Registered when `dcjax.eval` imports this module. Options: the
`SemanticConfig` fields (``tau``, ``window``, ``confidence``, ``max_fast``,
``exit_points``), the `Config` fields, and the calibration:

- ``calibration``: a bundled clip name or a video path whose frames calibrate
  the memory (default ``"box"``; pass ``calibration=vtest`` when evaluating on
  ``box``: calibration and evaluation clips must differ); ``"none"`` starts
  from an empty memory (or calibrate ``runner.cached`` yourself);
- ``calib_frames``: how many of its frames (default all).

``semantic`` runs the exits alone (``psnr_threshold=inf``: nothing is reused,
the step keeps no caches and computes convolutions as ``nocache`` does);
``deepcache+semantic`` adds DeepCache reuse in the layers that run.
``info`` carries ``exit``, ``exit_class`` and ``ac``. On the command line,
several exit points are separated by ``|``: ``exit_points=block3|block7``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from dcjax.config import Config, SemanticConfig
from dcjax.eval.methods import config_dict, deepcache_config, transform
from dcjax.eval.registry import (
    ModelSpec,
    Runner,
    cached_layers,
    checked_option,
    optional_positive_int,
    register_method,
)

__all__: list[str] = []

_SEMANTIC_FIELDS = {f.name for f in dataclasses.fields(SemanticConfig)}


def _calibration_frames(spec: ModelSpec, source: str, count: int | None) -> np.ndarray:
    from dcjax import video

    path = video.resolve(source)
    h, w = spec.frame_shape[:2]
    frames = []
    for f in video.read(path, size=(h, w)):
        frames.append(np.asarray(f))
        if count is not None and len(frames) >= count:
            break
    return np.stack(frames)


def _config(options: Mapping[str, Any], **defaults) -> tuple[Config, str, int | None]:
    """(config, calibration source, calibration frames) of a method's options."""
    options = dict(options)
    source = options.pop("calibration", "box")
    if not isinstance(source, str):
        raise ValueError(f"option calibration={source!r} must be a clip name, a path or 'none'")
    if source.lower() != "none":
        from dcjax import video

        try:
            video.resolve(source)
        except FileNotFoundError as e:
            raise ValueError(f"option calibration: {e}") from None
    count = checked_option("calib_frames", options.pop("calib_frames", None), optional_positive_int)
    sem = {k: options.pop(k) for k in list(options) if k in _SEMANTIC_FIELDS}
    if isinstance(sem.get("exit_points"), (list, str)):
        ep = sem["exit_points"]
        sem["exit_points"] = tuple(ep.split("|")) if isinstance(ep, str) else tuple(ep)
    if isinstance(sem.get("tau"), int) and not isinstance(sem["tau"], bool):
        sem["tau"] = float(sem["tau"])
    cfg = deepcache_config(options, semantic=SemanticConfig(**sem), **defaults)
    return cfg, source, count


def _semantic_config(options: Mapping[str, Any]) -> tuple[Config, str, int | None]:
    # never reusing: the step keeps no caches and computes convolutions as nocache does
    return _config(options, psnr_threshold=float("inf"))


def _runner(method: str, spec: ModelSpec, config: tuple[Config, str, int | None]) -> Runner:
    cfg, source, count = config
    cached = transform(spec, cfg)
    if source.lower() != "none":
        cached.calibrate(_calibration_frames(spec, source, count))
    config = config_dict(dataclasses.replace(cfg, semantic=None))
    check = cached.semantic_check
    config.update(
        semantic={k: getattr(cfg.semantic, k) for k in sorted(_SEMANTIC_FIELDS)},
        calibration=source,
        calib_frames=count,
        calibration_check=None if check is None else dataclasses.asdict(check),
    )
    return Runner(
        method=method,
        init=cached.init,
        step=cached.step,
        layers=cached_layers(cached),
        config=config,
        total_flops=int(cached.total_flops),
        cached=cached,
    )


@register_method(
    "semantic", "SMTM semantic-memory early exits alone (no reuse)", check=_semantic_config
)
def _semantic(spec: ModelSpec, options: Mapping[str, Any]) -> Runner:
    return _runner("semantic", spec, _semantic_config(options))


@register_method(
    "deepcache+semantic", "DeepCache reuse plus SMTM early exits in one step", check=_config
)
def _deepcache_semantic(spec: ModelSpec, options: Mapping[str, Any]) -> Runner:
    return _runner("deepcache+semantic", spec, _config(options))
