"""The ``mil`` method: matching internal layers (DeepCache's Figure 9 alternative).

Instead of matching the input frame once and propagating the reusable region
through the network, MIL tests reusability again at every convolution: the
layer's current input feature map is compared, block by block, with the input
it saw on the previous frame (the cached one), and an output pixel is taken
from the cached output when every input pixel of its window lies in a matched
block (the same AND-pool as DeepCache's propagation, `regions.and_pool`). The
reused outputs are computed sparsely with the same kernels as ``deepcache``.

Per layer, a block spans ``max(1, round(block_size / stride))`` feature-map
pixels (``stride``: the layer input's cumulative stride), so the blocks cover
the same image area at every depth. A block matches when its PSNR, over all
channels, against the cached input is at least ``psnr_threshold``, with the
peak taken as the largest absolute value of the cached map. This tests
feature maps directly, so it recovers regions DeepCache's erosion loses, at
the price of reading and comparing every cached feature map on every frame
and of storing every layer's input as well as its output.

Only the first ``fraction`` of the convolutions are matched (MIL-N% of the
paper); later ones are recomputed. Motion is zero (same-position blocks);
everything is recomputed on the first frame and every ``refresh_every``
frames.

Options: ``block_size``, ``psnr_threshold``, ``refresh_every``, ``fraction``,
``kernel``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from dcjax import kernels
from dcjax.eval.methods import DEFAULT_KERNEL
from dcjax.eval.registry import (
    LayerFlops,
    ModelSpec,
    Runner,
    checked_options,
    number,
    one_of,
    optional_positive_int,
    positive_int,
    register_method,
)
from dcjax.transforms.analysis import analyze
from dcjax.transforms.interpreter import Policy, evaluate
from dcjax.transforms.motion import FrameContext
from dcjax.transforms.recognisers import conv_window
from dcjax.transforms.regions import and_pool
from dcjax.transforms.spatial import Spatial
from dcjax.transforms.trace import trace_model

__all__ = ["DEFAULTS", "block_match_map"]

DEFAULTS: dict[str, Any] = {
    "block_size": 10,
    "psnr_threshold": 20.0,
    "refresh_every": 10,
    "fraction": 1.0,
    "kernel": DEFAULT_KERNEL,
}


def block_match_map(
    cur: jax.Array, prev: jax.Array, axes: tuple[int, int], block: int, psnr_threshold: float
) -> jax.Array:
    """Per-pixel (H, W) mask of the blocks of ``cur`` that match ``prev``.

    Args:
        cur: feature map with spatial axes ``axes`` (batch of 1).
        prev: the cached map, same shape.
        axes: positions of H and W.
        block: block side in map pixels.
        psnr_threshold: dB; the peak is ``max |prev|``.

    Returns:
        bool (H, W): true inside blocks whose PSNR is at least the threshold.
    """
    c = jnp.moveaxis(cur, axes, (0, 1)).astype(jnp.float32)
    p = jnp.moveaxis(prev, axes, (0, 1)).astype(jnp.float32)
    h, w = c.shape[:2]
    err = jnp.square(c - p).reshape(h, w, -1)
    channels = err.shape[-1]
    err = err.sum(-1)
    nby, nbx = math.ceil(h / block), math.ceil(w / block)
    padded = jnp.pad(err, ((0, nby * block - h), (0, nbx * block - w)))
    sse = padded.reshape(nby, block, nbx, block).sum((1, 3))
    ones = jnp.pad(jnp.ones((h, w), jnp.float32), ((0, nby * block - h), (0, nbx * block - w)))
    count = ones.reshape(nby, block, nbx, block).sum((1, 3)) * channels
    mse = sse / count
    peak = jnp.max(jnp.abs(p))
    # PSNR >= T  <=>  mse <= peak^2 / 10^(T/10); an exact match always passes.
    ok = (mse <= jnp.square(peak) * 10.0 ** (-psnr_threshold / 10.0)) | (mse == 0)
    full = jnp.repeat(jnp.repeat(ok, block, axis=0), block, axis=1)
    return full[:h, :w]


_RULES = {
    "block_size": positive_int,
    "psnr_threshold": number(),
    "refresh_every": optional_positive_int,
    "fraction": number(0.0, 1.0),
    "kernel": one_of(kernels.IMPLS),
}


def _options(options: Mapping[str, Any]) -> dict[str, Any]:
    return checked_options("mil", options, DEFAULTS, _RULES)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _MilLayer:
    """What MIL computed at one matched layer."""

    input: jax.Array
    output: jax.Array
    fraction: jax.Array
    match_ratio: jax.Array


class _MilPolicy(Policy):
    """MIL's matching at the input of each of the first ``matched`` layers; the
    other layers computed in full."""

    def __init__(self, *, layers, matched, blocks, threshold, kernel, state, refresh, ctx):
        self._layers, self._matched, self._blocks = layers, matched, blocks
        self._threshold, self._kernel = threshold, kernel
        self._state, self._refresh, self._ctx = state, refresh, ctx

    def reuse(self, index, eqn, invals, mask, epilogue):
        if index >= self._matched:
            return eqn.primitive.bind(*invals, **eqn.params), None
        lay = self._layers[index]
        sig = lay.in_signature
        hit = block_match_map(
            invals[0], self._state["inputs"][index], sig.axes, self._blocks[index], self._threshold
        )
        hit = hit & ~self._refresh
        out_mask = and_pool(self._ctx, hit, conv_window(eqn, sig), sig, lay.signature)
        out = kernels.masked_conv_eqn(
            eqn, invals, out_mask, self._state["outputs"][index], self._kernel
        )
        return out, _MilLayer(
            input=invals[0], output=out, fraction=out_mask.mean(dtype=jnp.float32),
            match_ratio=hit.mean(dtype=jnp.float32),
        )  # fmt: skip


@register_method(
    "mil", "matching internal layers: per-layer block tests on feature maps", check=_options
)
def _mil(spec: ModelSpec, options: Mapping[str, Any]) -> Runner:
    opts = _options(options)
    block, thr = opts["block_size"], float(opts["psnr_threshold"])
    refresh_every = opts["refresh_every"]
    kernel = opts["kernel"]
    traced = trace_model(spec.module, spec.variables, spec.frame_shape)
    n = len(traced.leaves)
    frame_sig = Spatial(axes=(1, 2), size=spec.frame_shape[:2], stride=(1, 1))
    analysis = analyze(traced.jaxpr, [None] * n + [frame_sig], [False] * n + [True])
    layers = tuple(analysis.layers)
    matched = min(len(layers), math.ceil(float(opts["fraction"]) * len(layers)))
    flops = jnp.asarray([lay.flops for lay in layers], jnp.float32)
    total = float(sum(lay.flops for lay in layers) + analysis.other_flops)
    other = float(analysis.other_flops)  # Python floats: FLOPs overflow int32
    blocks = [max(1, round(block / float(max(lay.in_signature.stride)))) for lay in layers]

    def init():
        return {
            "inputs": tuple(jnp.zeros(lay.in_shape, lay.dtype) for lay in layers[:matched]),
            "outputs": tuple(jnp.zeros(lay.out_shape, lay.dtype) for lay in layers[:matched]),
            "has_prev": jnp.bool_(False),
            "since": jnp.int32(0),
        }

    @jax.jit
    def _step(leaves, state, frame):
        x = spec.model_input(jnp.asarray(frame))
        refresh = ~state["has_prev"]
        if refresh_every is not None:
            refresh = refresh | (state["since"] >= int(refresh_every))
        ctx = FrameContext(jnp.zeros((2,), jnp.int32), "exact")
        policy = _MilPolicy(
            layers=layers, matched=matched, blocks=blocks, threshold=thr, kernel=kernel,
            state=state, refresh=refresh, ctx=ctx,
        )  # fmt: skip
        ev = evaluate(analysis, [*leaves, x], [True] * n + [True], ctx, policy)
        outs = ev.outputs
        done = [ev.layers[i] for i in range(matched)]  # the matched layers' `_MilLayer`s
        fractions = [d.fraction for d in done] + [jnp.float32(0.0)] * (len(layers) - matched)
        match_ratio = done[0].match_ratio if done else jnp.float32(jnp.nan)
        output = jax.tree_util.tree_unflatten(traced.out_tree, outs)
        frac = jnp.stack(fractions) if fractions else jnp.zeros((0,), jnp.float32)
        computed = jnp.sum((1.0 - frac) * flops) + other
        new_state = {
            "inputs": tuple(d.input for d in done),
            "outputs": tuple(d.output for d in done),
            "has_prev": jnp.bool_(True),
            "since": jnp.where(refresh, 1, state["since"] + 1).astype(jnp.int32),
        }
        info = {
            "flops_ratio": (computed / max(total, 1.0)).astype(jnp.float32),
            "match_ratio": match_ratio,
            "refreshed": refresh,
            "reuse_fraction": frac,
        }
        return output, new_state, info

    config = {k: opts[k] for k in DEFAULTS}
    config.update(matched_layers=matched, layer_blocks=blocks)
    return Runner(
        method="mil",
        init=init,
        step=functools.partial(_step, traced.leaves),
        layers=tuple(LayerFlops(name=lay.name, flops=int(lay.flops)) for lay in layers),
        config=config,
        total_flops=int(total),
    )
