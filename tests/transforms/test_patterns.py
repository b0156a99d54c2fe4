"""Patterns: the elementwise epilogue each reused layer may fuse."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from dcjax.transforms.analysis import analyze
from dcjax.transforms.spatial import Spatial
from dcjax.transforms.trace import trace_model

DN = ("NHWC", "HWIO", "NHWC")


def _out_sigs(fn, params, shape=(24, 20, 3)):
    traced = trace_model(fn, params, shape)
    n = len(traced.leaves)
    sig = Spatial(axes=(1, 2), size=shape[:2], stride=(1, 1))
    return analyze(traced.jaxpr, [None] * n + [sig], [False] * n + [True])


def _conv(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN)


EPI_PARAMS = {
    "w": jnp.ones((3, 3, 3, 4)),
    "mean": jnp.ones((4,)),
    "scale": jnp.ones((4,)),
    "pos": jnp.ones((1, 24, 20, 4)),
}


def _chains(fn):
    an = _out_sigs(fn, EPI_PARAMS)
    eqns = an.jaxpr.jaxpr.eqns
    out = {}
    for i, info in enumerate(an.eqns):
        if info.layer is not None:
            out[info.layer] = [eqns[j].primitive.name for j in info.epilogue]
            assert all(an.eqns[j].fused_into == i for j in info.epilogue)
    return out


@pytest.mark.parametrize(
    "fn, chain",
    [
        # inference batch norm and ReLU: the whole chain
        (
            lambda p, x: jax.nn.relu((_conv(x, p["w"]) - p["mean"]) * p["scale"] + 1.0),
            {0: ["sub", "mul", "add", "custom_jvp_call"]},
        ),
        # SiLU (a jit of x * logistic(x)) and a minimum
        (lambda p, x: jnp.minimum(jax.nn.silu(_conv(x, p["w"])), 1.0), {0: ["jit", "min"]}),
        # a conv output that is also a model output has nothing to fuse
        (
            lambda p, x: (_conv(x, p["w"]), jax.nn.relu(_conv(x, p["w"]))),
            {0: [], 1: ["custom_jvp_call"]},
        ),
        # a residual branch of the output's shape is a pixel operand; its own layer,
        # whose only use the first chain claimed, keeps no epilogue
        (
            lambda p, x: jax.nn.relu(_conv(x, p["w"]) * p["scale"] + _conv(x, p["w"])),
            {0: ["mul", "add", "custom_jvp_call"], 1: []},
        ),
        # a frame-dependent operand of another shape stops the chain
        (lambda p, x: jax.nn.relu(_conv(x, p["w"]) * p["scale"] + x[..., :1]), {0: ["mul"]}),
        # a position-dependent operand is not per-channel
        (lambda p, x: jnp.tanh(_conv(x, p["w"]) + p["pos"]), {0: []}),
        # leaky ReLU reads its input twice: a jit of compare and select, or inline
        (lambda p, x: jax.nn.leaky_relu(_conv(x, p["w"]) + p["mean"]), {0: ["add", "jit"]}),
        (
            lambda p, x: (lambda y: jnp.maximum(y, 0.1 * y))(_conv(x, p["w"]) + p["mean"]),
            {0: ["add", "mul", "max"]},
        ),
        # an intermediate value used after the epilogue ends cuts it before
        (
            lambda p, x: (lambda y: (jax.nn.relu(y) * 2.0, y))(_conv(x, p["w"]) * p["scale"]),
            {0: ["mul"]},
        ),
        # jnp.where and jnp.clip are jit calls with several inputs
        (
            lambda p, x: (lambda y: jnp.where(y > 0, y, 0.2 * y))(_conv(x, p["w"])),
            {0: ["gt", "mul", "jit"]},
        ),
        (lambda p, x: jnp.clip(_conv(x, p["w"]) * p["scale"], -1.0, 1.0), {0: ["mul", "jit"]}),
        # a transposed convolution is not computed by the sparse kernels: no epilogue
        (
            lambda p, x: jax.nn.relu(
                lax.conv_transpose(x, p["w"], (2, 2), "SAME", dimension_numbers=DN)
            ),
            {0: []},
        ),
        # a dtype change stops the chain
        (lambda p, x: (_conv(x, p["w"]) * 2.0).astype(jnp.bfloat16) + 1, {0: ["mul"]}),
    ],
)
def test_layer_epilogues(fn, chain):
    assert _chains(fn) == chain
