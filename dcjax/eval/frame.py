"""The ``frame`` method: reuse the whole output when the whole frame matches.

The coarse cache of DeepEye and Potluck: the current frame is compared with the
frame the cached output was computed on, block by block at the same position
(`dcjax.matching.static_match`, ``block_size`` and ``psnr_threshold`` as in
DeepCache). When at least ``min_match`` of the blocks match (default: all of
them), the previous output is returned and the model does not run (a
`lax.cond`, so nothing is computed); otherwise the model runs in full (as
``nocache`` runs it, `dcjax.eval.methods.fast_apply`) and its
output and frame become the cache. A full run is also forced every
``refresh_every`` frames.

The key is the frame of the last full run, not the previous frame, so a slow
drift cannot accumulate behind a chain of hits.

Options: ``block_size``, ``psnr_threshold``, ``min_match``, ``refresh_every``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from dcjax import matching
from dcjax.eval.methods import fast_apply
from dcjax.eval.registry import (
    ModelSpec,
    Runner,
    checked_options,
    number,
    optional_positive_int,
    positive_int,
    register_method,
)

__all__ = ["DEFAULTS"]

DEFAULTS: dict[str, Any] = {
    "block_size": 10,
    "psnr_threshold": 20.0,
    "min_match": 1.0,
    "refresh_every": 10,
}


_RULES = {
    "block_size": positive_int,
    "psnr_threshold": number(),
    "min_match": number(0.0, 1.0),
    "refresh_every": optional_positive_int,
}


def _options(options: Mapping[str, Any]) -> dict[str, Any]:
    return checked_options("frame", options, DEFAULTS, _RULES)


@register_method(
    "frame", "whole-output reuse when every block of the frame matches", check=_options
)
def _frame(spec: ModelSpec, options: Mapping[str, Any]) -> Runner:
    opts = _options(options)
    block, thr = opts["block_size"], float(opts["psnr_threshold"])
    min_match, refresh_every = float(opts["min_match"]), opts["refresh_every"]
    layers = spec.layers
    n = len(layers)
    apply, leaves = fast_apply(spec)
    out_shape = jax.eval_shape(spec.apply, jax.ShapeDtypeStruct(spec.frame_shape, jnp.uint8))

    def init():
        return {
            "key": jnp.zeros(spec.frame_shape, jnp.uint8),
            "output": jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), out_shape),
            "valid": jnp.bool_(False),
            "since": jnp.int32(0),
        }

    @jax.jit
    def _step(variables, state, frame):
        frame = jnp.asarray(frame)
        key = state["key"].astype(frame.dtype)
        m = matching.static_match(key, frame, block_size=block, psnr_threshold=thr)
        ratio = jnp.asarray(m.match_ratio, jnp.float32)
        hit = state["valid"] & (ratio >= min_match)
        if refresh_every is not None:
            hit = hit & (state["since"] < int(refresh_every))
        out = lax.cond(hit, lambda: state["output"], lambda: apply(variables, frame))
        new_state = {
            "key": jnp.where(hit, state["key"], frame.astype(jnp.uint8)),
            "output": out,
            "valid": jnp.bool_(True),
            "since": jnp.where(hit, state["since"] + 1, 1).astype(jnp.int32),
        }
        info = {
            "flops_ratio": jnp.where(hit, 0.0, 1.0).astype(jnp.float32),
            "match_ratio": ratio,
            "refreshed": ~hit,
            "reuse_fraction": jnp.full((n,), hit, jnp.float32),
        }
        return out, new_state, info

    return Runner(
        method="frame",
        init=init,
        step=functools.partial(_step, leaves),
        layers=layers,
        config={k: (v if v is None else type(DEFAULTS[k])(v)) for k, v in opts.items()},
        total_flops=int(spec.analysis.total_flops),
    )
