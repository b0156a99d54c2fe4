"""The analysis pass: reused layers, their static facts, and the other FLOPs."""

from __future__ import annotations

import jax.numpy as jnp
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
