"""Soundness of the mask rules, the oracle for region propagation.

For each rule, a small program that uses it. Frame t is frame t-1 translated by
a random motion M, with new content wherever the random blocky input mask R0
is false. Then for every spatial variable v of the program and every pixel its
propagated mask marks reusable, ``v_t[i, j] == v_{t-1}[i + My/sy, j + Mx/sx]``.
Zero motion is among the draws (the plain "perturb only where R0 is false"
case).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

from dcjax.transforms import regions
from dcjax.transforms.analysis import analyze
from dcjax.transforms.interpreter import propagate_masks
from dcjax.transforms.motion import FrameContext
from dcjax.transforms.spatial import Spatial
from dcjax.transforms.trace import trace_model

H, W, C = 24, 20, 3
DN = ("NHWC", "HWIO", "NHWC")


def _conv(x, w, strides=(1, 1), padding="SAME", dilation=(1, 1), groups=1):
    return lax.conv_general_dilated(
        x, w, strides, padding, rhs_dilation=dilation, dimension_numbers=DN,
        feature_group_count=groups,
    )  # fmt: skip


def _w(k, cin, cout, seed=0):
    return jax.random.normal(jax.random.key(seed), (*k, cin, cout)) * 0.3


PROGRAMS = {
    "conv_same": (lambda p, x: _conv(x, p), _w((3, 3), C, 4)),
    "conv_valid_stride2": (lambda p, x: _conv(x, p, (2, 2), "VALID"), _w((3, 3), C, 4)),
    "conv_explicit_stride3_dilated": (
        lambda p, x: _conv(x, p, (3, 3), ((2, 1), (0, 3)), (2, 2)),
        _w((3, 3), C, 4),
    ),
    "conv_rect_kernel_stride_2_1": (
        lambda p, x: _conv(x, p, (2, 1), ((1, 2), (2, 2))),
        _w((4, 5), C, 2),
    ),
    "conv_grouped_then_depthwise": (
        lambda p, x: _conv(_conv(x, p[0]), p[1], groups=4),
        (_w((1, 1), C, 4), _w((3, 3), 1, 4, 1)),
    ),
    "conv_transposed_lhs_dilation": (
        lambda p, x: lax.conv_general_dilated(
            x, p, (1, 1), ((1, 1), (1, 1)), lhs_dilation=(2, 2), dimension_numbers=DN
        ),
        _w((3, 3), C, 2),
    ),
    "max_pool_same_stride2": (
        lambda p, x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"),
        None,
    ),
    "avg_pool_valid": (
        lambda p, x: lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0,
        None,
    ),
    "lrn_channel_window": (
        lambda p, x: (
            x
            / (1.0 + lax.reduce_window(x * x, 0.0, lax.add, (1, 1, 1, 3), (1, 1, 1, 1), "SAME"))
            ** 0.75
        ),
        None,
    ),
    "pad_interior_negative": (
        lambda p, x: lax.pad(x, 0.5, ((0, 0, 0), (2, -3, 1), (-1, 2, 0), (0, 0, 0))),
        None,
    ),
    "slice_strided": (lambda p, x: x[:, 1:21:2, 3:17:3, :], None),
    "transpose_and_back": (
        lambda p, x: jnp.transpose(_conv(jnp.transpose(x, (0, 2, 1, 3)), p), (0, 2, 1, 3)),
        _w((3, 3), C, 2),
    ),
    "reshape_squeeze_batch": (lambda p, x: _conv(x.reshape(H, W, C)[None], p), _w((3, 3), C, 2)),
    "repeat_upsampling": (
        lambda p, x: _conv(jnp.repeat(jnp.repeat(x, 2, axis=1), 3, axis=2), p),
        _w((3, 3), C, 2),
    ),
    "resize_nearest_up_and_down": (
        lambda p, x: jax.image.resize(
            jax.image.resize(x, (1, 2 * H, 2 * W, C), "nearest"),
            (1, H // 2, W // 2, C),
            "nearest",
        ),
        None,
    ),
    "resize_linear_and_cubic": (
        lambda p, x: jax.image.resize(
            jax.image.resize(x, (1, 2 * H, 2 * W, C), "linear"), (1, H, W // 2, C), "cubic"
        ),
        None,
    ),
    "elementwise_broadcast_bias_and_residual": (
        lambda p, x: jax.nn.relu(_conv(x, p[0]) + p[1]) * jnp.tanh(x[..., :2]) + x[..., 1:],
        (_w((3, 3), C, 2), jnp.arange(2.0)),
    ),
    "concatenate_and_split_channels": (
        lambda p, x: jnp.split(jnp.concatenate([_conv(x, p), x], axis=-1), [3], axis=-1)[1],
        _w((3, 3), C, 2),
    ),
    "channel_reductions_and_dense": (
        lambda p, x: (x.max(-1, keepdims=True) + x.sum(-1, keepdims=True)) @ p,
        jnp.ones((1, 4)),
    ),
    "spatial_mean_gates_map": (
        lambda p, x: x * jax.nn.sigmoid(x.mean(axis=(1, 2), keepdims=True)),
        None,
    ),
    "cumsum_and_rev_over_channels": (lambda p, x: jnp.cumsum(x[..., ::-1], axis=-1), None),
    "select_and_clamp": (
        lambda p, x: jnp.where(x > 0.5, jnp.clip(x, 0.2, 0.7), -x),
        None,
    ),
}


def _analysis(name):
    fn, params = PROGRAMS[name]
    traced = trace_model(fn, params, (H, W, C))
    n = len(traced.leaves)
    sig = Spatial(axes=(1, 2), size=(H, W), stride=(1, 1))
    return traced, analyze(traced.jaxpr, [None] * n + [sig], [False] * n + [True])


@functools.cache
def _cached_analysis(name):
    return _analysis(name)


def _frames(motion, block_mask, seed):
    """prev, cur (cur[y, x] = prev[y + dy, x + dx] where R0) and R0."""
    rng = np.random.default_rng(seed)
    prev = rng.uniform(size=(H, W, C)).astype(np.float32)
    cur = rng.uniform(size=(H, W, C)).astype(np.float32)
    dy, dx = motion
    r0 = np.kron(block_mask, np.ones((4, 4), bool))[:H, :W]
    yy, xx = np.mgrid[:H, :W]
    inside = (yy + dy >= 0) & (yy + dy < H) & (xx + dx >= 0) & (xx + dx < W)
    r0 &= inside
    cur[r0] = prev[(yy + dy)[r0], (xx + dx)[r0]]
    return prev, cur, r0


def _check(name, motion, block_mask, seed):
    traced, analysis = _cached_analysis(name)
    prev, cur, r0 = _frames(motion, block_mask, seed)
    leaves = traced.leaves
    n = len(leaves)
    ctx = FrameContext(jnp.asarray(motion), "exact")
    _, before = propagate_masks(analysis, [*leaves, prev[None]], [True] * n + [r0], ctx)
    _, after = propagate_masks(analysis, [*leaves, cur[None]], [True] * n + [r0], ctx)
    assert before.keys() == after.keys() and after
    checked = 0
    for key, (sig, value, mask) in after.items():
        mask = np.asarray(jnp.broadcast_to(mask, sig.size))
        if not mask.any():
            continue
        dy, dx, aligned = (int(v) for v in ctx.shift(sig))
        assert aligned, f"{name}: reusable pixels at a misaligned variable {key}"
        now = np.moveaxis(np.asarray(value), sig.axes, (0, 1))
        old = np.moveaxis(np.asarray(before[key][1]), sig.axes, (0, 1))
        ii, jj = np.nonzero(mask)
        assert (ii + dy >= 0).all() and (ii + dy < sig.size[0]).all()
        assert (jj + dx >= 0).all() and (jj + dx < sig.size[1]).all()
        a, b = now[ii, jj], old[ii + dy, jj + dx]
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale, err_msg=f"{name} {key}")
        checked += 1
    return checked


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    motion=st.tuples(st.integers(-6, 6), st.integers(-6, 6))
    | st.just((0, 0))
    | st.tuples(st.sampled_from([-4, 0, 4]), st.sampled_from([-6, 0, 6])),
    block_mask=st.lists(st.booleans(), min_size=30, max_size=30).map(
        lambda b: np.array(b, bool).reshape(6, 5)
    ),
    seed=st.integers(0, 2**16),
)
def test_reusable_pixels_equal_shifted_previous_values(name, motion, block_mask, seed):
    _check(name, motion, block_mask, seed)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_full_match_zero_motion_reuses_something(name):
    """The oracle is not vacuous: with everything matched, masks are true."""
    checked = _check(name, (0, 0), np.ones((6, 5), bool), 0)
    assert checked > 0


def test_every_rule_function_is_exercised():
    used = set()
    for name in PROGRAMS:
        _, analysis = _cached_analysis(name)

        def walk(a):
            for eqn, info in zip(a.jaxpr.jaxpr.eqns, a.eqns):
                if info.sub is not None:
                    walk(info.sub)
                elif info.dynamic and any(s is not None for s in info.in_sigs):
                    used.add(regions.MASK_RULES.get(eqn.primitive))

        walk(analysis)
    rule_functions = set(regions.MASK_RULES.values())
    assert rule_functions <= used, {f.__name__ for f in rule_functions - used}


@settings(max_examples=60, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 30), st.integers(1, 30)),
    size=st.tuples(st.integers(1, 8), st.integers(1, 8)),
    strides=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    dilation=st.tuples(st.integers(1, 3), st.integers(1, 2)),
    seed=st.integers(0, 2**16),
)
def test_sliced_window_and_equals_reduce_window(shape, size, strides, dilation, seed):
    """`and_pool`'s strided-slice AND against XLA's reduce_window (the former rule)."""
    rng = np.random.default_rng(seed)
    m = rng.random(shape) < 0.8

    @jax.jit
    def both(m):  # one program per example, not one per slice
        ref = lax.reduce_window(
            m.astype(jnp.float32), jnp.float32(1.0), lax.min, window_dimensions=size,
            window_strides=strides, padding="VALID", window_dilation=dilation,
        ) > 0.5  # fmt: skip
        got = m
        for axis in (0, 1):
            got = regions._window_and(got, axis, size[axis], strides[axis], dilation[axis])
        return ref, got

    ref, got = both(m)
    assert got.shape == ref.shape
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
    # very wide windows keep reduce_window: same answer
    wide = regions._window_and(jnp.ones((40, 3), bool), 0, 20, 1, 1)
    assert wide.shape == (21, 3) and bool(wide.all())
