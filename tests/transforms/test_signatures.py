"""Static spatial signatures: derived once from shapes and params."""

from __future__ import annotations

from fractions import Fraction

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from dcjax.transforms.signatures import Spatial, _reshape_groups, analyze
from dcjax.transforms.trace import trace_model

DN = ("NHWC", "HWIO", "NHWC")


def _out_sigs(fn, params, shape=(24, 20, 3)):
    traced = trace_model(fn, params, shape)
    n = len(traced.leaves)
    sig = Spatial(axes=(1, 2), size=shape[:2], stride=(1, 1))
    return analyze(traced.jaxpr, [None] * n + [sig], [False] * n + [True])


@pytest.mark.parametrize(
    "fn, axes, size, stride",
    [
        (lambda p, x: x, (1, 2), (24, 20), (1, 1)),
        (lambda p, x: jnp.transpose(x, (0, 3, 2, 1)), (3, 2), (24, 20), (1, 1)),
        (lambda p, x: x[0], (0, 1), (24, 20), (1, 1)),
        (lambda p, x: x[:, ::2, 1::4], (1, 2), (12, 5), (2, 4)),
        (
            lambda p, x: lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 3, 1), "SAME"),
            (1, 2),
            (12, 7),
            (2, 3),
        ),
        (lambda p, x: jnp.repeat(x, 3, axis=1), (1, 2), (72, 20), (Fraction(1, 3), 1)),
        (
            lambda p, x: jax.image.resize(x, (1, 12, 40, 3), "linear"),
            (1, 2),
            (12, 40),
            (2, Fraction(1, 2)),
        ),
        (
            lambda p, x: lax.pad(x, 0.0, ((0, 0, 0), (1, 1, 1), (0, 0, 0), (0, 0, 0))),
            (1, 2),
            (49, 20),
            (Fraction(1, 2), 1),
        ),
        (lambda p, x: x.mean(axis=-1), (1, 2), (24, 20), (1, 1)),
        (lambda p, x: x @ jnp.ones((3, 5)), (1, 2), (24, 20), (1, 1)),
    ],
)
def test_signature_of_output(fn, axes, size, stride):
    (sig,) = _out_sigs(fn, None).out_sigs
    assert sig == Spatial(axes=axes, size=size, stride=stride)


@pytest.mark.parametrize(
    "fn",
    [
        lambda p, x: x.mean(axis=(1, 2)),
        lambda p, x: x.reshape(1, -1),
        lambda p, x: jnp.flip(x, axis=1),
        lambda p, x: jnp.cumsum(x, axis=2),
        lambda p, x: jnp.concatenate([x, x], axis=1),
    ],
)
def test_ops_that_mix_space_have_no_signature(fn):
    assert _out_sigs(fn, None).out_sigs == [None]


def test_conv_chain_strides_and_layers():
    w1 = jnp.ones((3, 3, 3, 4))
    w2 = jnp.ones((5, 5, 4, 4))

    def fn(p, x):
        x = lax.conv_general_dilated(x, p[0], (2, 2), "SAME", dimension_numbers=DN)
        x = lax.conv_general_dilated(x, p[1], (3, 1), "VALID", dimension_numbers=DN)
        return x

    a = _out_sigs(fn, (w1, w2))
    assert [layer.signature.stride for layer in a.layers] == [(2, 2), (6, 2)]
    assert a.layers[1].in_shape == (1, 12, 10, 4) and a.layers[1].out_shape == (1, 3, 6, 4)
    assert a.layers[1].kernel == (5, 5) and a.layers[1].strides == (3, 1)


def test_conv_on_parameters_only_is_not_a_layer():
    def fn(p, x):
        k = lax.conv_general_dilated(p, p, (1, 1), "SAME", dimension_numbers=DN)
        return x * k.sum()

    a = _out_sigs(fn, jnp.ones((3, 3, 3, 3)))
    assert a.layers == [] and a.other_flops > 0


@pytest.mark.parametrize(
    "src, dst, groups",
    [
        ((1, 4, 5, 3), (4, 5, 3), [([0, 1], [0]), ([2], [1]), ([3], [2])]),
        ((1, 4, 2, 5), (1, 8, 5), [([0], [0]), ([1, 2], [1]), ([3], [2])]),
        ((6,), (2, 3), [([0], [0, 1])]),
    ],
)
def test_reshape_groups(src, dst, groups):
    assert _reshape_groups(src, dst) == groups


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
