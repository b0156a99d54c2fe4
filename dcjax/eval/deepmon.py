"""The ``deepmon`` method: DeepMon's convolutional-layer cache (Huynh et al., MobiSys'17, 6.3).

DeepMon's policy, on top of dcjax's reuse machinery:

- matching: same-position colour-histogram cells (``Config(matcher="histogram")``,
  an 8x8 grid, 16 bins, chi-square distance below 0.005), so the motion is
  always zero;
- each frame is compared with the previous one (``Config(key="previous")``),
  as in the paper, not with the pixels the caches were computed from;
- only the first ``first_convs`` convolutions are cached; every later one is
  recomputed in full, on still frames too (``skip_unchanged=False``). The
  paper picks N empirically per model; the default here is the leading
  convolutions whose output stride is at most ``max_stride`` (4), the
  high-resolution layers where a grid cell still spans several output pixels;
- reuse inside a cached layer follows the cells' receptive fields (DeepMon's
  Figure 7: a cell's border is reused only where the neighbouring cell is
  cacheable too), which is exactly dcjax's AND-pool propagation;
- cached values expire after ``expiry_s`` seconds (the paper: 650 ms for VGG-16,
  1000 ms for YOLO; default 1 s), i.e. a full recompute every
  ``round(expiry_s * fps)`` frames (``inf``: never).

The restriction to the first convolutions uses the public state of
`dcjax.deepcache`: each step ANDs ``state.layer_valid`` with a static
per-layer mask, and a layer whose cache is not valid is recomputed.

Options: ``first_convs`` (int), ``max_stride`` (int), ``expiry_s`` (float),
``grid`` ((gy, gx)), ``bins``, ``distance_threshold``, and ``kernel``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from dcjax.eval.methods import config_dict, deepcache_config, transform, with_timed_twin
from dcjax.eval.registry import (
    ModelSpec,
    Runner,
    cached_layers,
    checked_options,
    number,
    one_of,
    positive_int,
    register_method,
)
from dcjax.kernels import IMPLS

__all__ = ["DEFAULTS", "default_first_convs"]

#: DeepMon's published settings.
DEFAULTS: dict[str, Any] = {
    "grid": (8, 8),
    "bins": 16,
    "distance_threshold": 0.005,
    "expiry_s": 1.0,
    "max_stride": 4,
}


def default_first_convs(layers, max_stride: int = 4) -> int:
    """Number of leading layers whose output stride is at most ``max_stride``.

    Args:
        layers: `dcjax.transforms.records.Layer` objects in execution order.
        max_stride: largest cumulative output stride of a cached layer.

    Returns:
        At least 1 (when there is a layer at all).
    """
    n = 0
    for lay in layers:
        if max(lay.signature.stride) > max_stride:
            break
        n += 1
    return max(n, 1) if layers else 0


def _grid(value: Any) -> tuple[int, int]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError("must be a pair of positive ints, (rows, columns)")
    return positive_int(value[0]), positive_int(value[1])


def _first_convs(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("must be None or an int >= 0")
    return value


def _expiry(value: Any) -> float:
    seconds = number()(value)
    if seconds <= 0:
        raise ValueError("must be a number of seconds > 0 (inf: never)")
    return seconds


_RULES = {
    "first_convs": _first_convs,
    "max_stride": positive_int,
    "expiry_s": _expiry,
    "grid": _grid,
    "bins": positive_int,
    "distance_threshold": number(lo=0.0),
    "kernel": one_of(IMPLS),
}


def _options(options: Mapping[str, Any]) -> dict[str, Any]:
    return checked_options("deepmon", options, DEFAULTS, _RULES)


@register_method(
    "deepmon",
    "DeepMon: histogram cells, same position, first convolutions only",
    check=_options,
)
def _deepmon(spec: ModelSpec, options: Mapping[str, Any]) -> Runner:
    opts = _options(options)
    expiry = opts["expiry_s"]
    refresh_every = None if math.isinf(expiry) else max(1, round(expiry * spec.fps))
    matcher_options = {
        "grid": tuple(opts["grid"]),
        "bins": int(opts["bins"]),
        "distance_threshold": float(opts["distance_threshold"]),
    }
    cfg = deepcache_config(
        {k: opts[k] for k in ("kernel",) if k in opts},
        matcher="histogram",
        matcher_options=matcher_options,
        key="previous",
        refresh_every=refresh_every,
        alignment="exact",
        min_match=0.0,
        # DeepMon recomputes every layer after the first N on every frame,
        # still or not; skipping the network on a still frame is dcjax's own
        # addition, not DeepMon's
        skip_unchanged=False,
        # nor is updating fully connected layers by their changed inputs
        dense_updates=False,
    )

    def runner(cached, cfg):
        first = opts.get("first_convs")
        if first is None:
            first = default_first_convs(cached.layers, opts["max_stride"])
        allowed_layers = jnp.arange(len(cached.layers)) < first

        @jax.jit
        def step(state, frame):
            state = dataclasses.replace(state, layer_valid=state.layer_valid & allowed_layers)
            return cached.step(state, frame)

        config = config_dict(cfg)
        config.update(
            first_convs=first,
            cached_layers=[lay.name for lay in cached.layers[:first]],
            expiry_s=expiry if math.isfinite(expiry) else str(expiry),  # JSON has no inf
            fps=float(spec.fps),
        )
        return Runner(
            method="deepmon",
            init=cached.init,
            step=step,
            # layers after the first ``first`` never reuse (their masks are all dirty)
            layers=tuple(
                dataclasses.replace(lay, sparse=bool(lay.sparse) and i < first)
                for i, lay in enumerate(cached_layers(cached))
            ),
            config=config,
            total_flops=int(cached.total_flops),
            cached=cached,
        )

    return with_timed_twin(lambda cfg: transform(spec, cfg), runner, cfg)
