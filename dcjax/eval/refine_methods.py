"""``deepcache+refine`` and ``delta`` methods for the evaluation harness.

Registered when `dcjax.eval` imports this module. Options: the
`RefineConfig` fields (``delta``, ``metric``, ``layers``) and the `Config`
fields.

- ``deepcache+refine``: DeepCache's matcher and motion compensation, plus the
  per-pixel change test inside the network (`dcjax.transforms.refine`).
- ``delta``: the change test alone, with no input matcher and zero motion
  (``matcher="none"``): a DeltaCNN-like baseline, so that the contribution of
  each part shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dcjax.config import Config, RefineConfig
from dcjax.eval.methods import cached_runner, deepcache_config
from dcjax.eval.registry import ModelSpec, Runner, register_method

__all__: list[str] = []

_REFINE_FIELDS = ("delta", "metric", "layers")


def _config(options: Mapping[str, Any], spec: ModelSpec | None = None, **defaults) -> Config:
    refine = {k: options[k] for k in _REFINE_FIELDS if k in options}
    if isinstance(refine.get("layers"), list):
        refine["layers"] = tuple(refine["layers"])
    rest = {k: v for k, v in options.items() if k not in _REFINE_FIELDS}
    return deepcache_config(rest, spec, refine=RefineConfig(**refine), **defaults)


def _delta_config(options: Mapping[str, Any], spec: ModelSpec | None = None) -> Config:
    return _config(options, spec, matcher="none")


@register_method(
    "deepcache+refine",
    "DeepCache plus the bounded-error change test inside the network",
    check=_config,
)
def _deepcache_refine(spec: ModelSpec, options: Mapping[str, Any]) -> Runner:
    return cached_runner("deepcache+refine", spec, _config(options, spec))


@register_method(
    "delta",
    "the change test alone: no matcher, zero motion (DeltaCNN-like)",
    check=_delta_config,
)
def _delta(spec: ModelSpec, options: Mapping[str, Any]) -> Runner:
    return cached_runner("delta", spec, _delta_config(options, spec))
