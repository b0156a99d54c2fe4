"""Signature rules: each primitive's output signature, from shapes and params."""

from __future__ import annotations

from fractions import Fraction

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from dcjax.transforms.analysis import analyze
from dcjax.transforms.signature_rules import _reshape_groups
from dcjax.transforms.spatial import Spatial
from dcjax.transforms.trace import trace_model


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
