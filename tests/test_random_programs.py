"""Never wrong, on programs nobody wrote by hand.

Hypothesis builds small random programs over one frame: convolutions with
random kernels, strides, dilations, groups and paddings (negative ones
included), pads, slices, transposes, resizes, pooling, reductions and
cumulative ops, elementwise ops with pixel-varying parameters and ``iota``
constants. Each runs through `dcjax.transform` with every convolution cached
(``kernel="reference"``), on a frame and then the same frame translated by a
whole multiple of the program's stride with the exact reuse mask; a cached
convolution ends every program, so that a wrongly reused value reaches the
output. The cached
output must equal the program run in full on the second frame (primitives
without a reuse rule are reported and recomputed, which keeps it equal).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

import dcjax
from tests.translated import nothing_reusable, translated_pair

H = W = 16
C = 3
DN = ("NHWC", "HWIO", "NHWC")
KINDS = (
    "conv", "depthwise", "pad", "slice", "embedding", "embedding_w", "bias", "iota_concat",
    "local", "transpose_add", "transpose_back", "maxpool", "resize_nearest", "resize_linear",
    "channel_sum", "cumsum_h", "rev_w", "tanh",
)  # fmt: skip


def _out_size(n, k, s, d, lo, hi):
    return (n + lo + hi - d * (k - 1) - 1) // s + 1


@st.composite
def programs(draw):
    """(ops, stride): a list of (kind, args) and the integer stride of the output."""
    h, w, c = H, W, C
    stride = [1, 1]
    ops = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(KINDS))
        if kind in ("conv", "depthwise"):
            k = draw(st.integers(1, 3))
            s, d = draw(st.integers(1, 2)), draw(st.integers(1, 2))
            pads = [(draw(st.integers(-1, 2)), draw(st.integers(-1, 2))) for _ in range(2)]
            oh = _out_size(h, k, s, d, *pads[0])
            ow = _out_size(w, k, s, d, *pads[1])
            if oh < 3 or ow < 3:
                continue
            cout = c if kind == "depthwise" else draw(st.integers(2, 4))
            ops.append((kind, (k, s, d, pads, c, cout)))
            h, w, c = oh, ow, cout
            stride = [stride[0] * s, stride[1] * s]
        elif kind == "pad":
            cfg = [(draw(st.integers(-2, 2)), draw(st.integers(-2, 2)), 0) for _ in range(2)]
            nh, nw = h + cfg[0][0] + cfg[0][1], w + cfg[1][0] + cfg[1][1]
            if nh < 3 or nw < 3:
                continue
            ops.append((kind, cfg))
            h, w = nh, nw
        elif kind == "slice":
            y0, x0 = draw(st.integers(0, 2)), draw(st.integers(0, 2))
            sy = draw(st.integers(1, 2))
            nh, nw = len(range(y0, h, sy)), w - x0
            if nh < 3 or nw < 3:
                continue
            ops.append((kind, (y0, x0, sy)))
            h, w = nh, nw
            stride[0] *= sy
        elif kind == "transpose_add" and h != w:
            continue
        elif kind == "maxpool":
            s = draw(st.integers(1, 2))
            if h < 4 or w < 4:
                continue
            ops.append((kind, s))
            h, w = -(-h // s), -(-w // s)
            stride = [stride[0] * s, stride[1] * s]
        elif kind == "resize_nearest":
            if 2 * h > 48 or 2 * w > 48:
                continue
            ops.append((kind, None))
            h, w = 2 * h, 2 * w
        elif kind == "resize_linear":
            if h < 6 or w < 6:
                continue
            ops.append((kind, None))
            h, w = h // 2, w // 2
            stride = [stride[0] * 2, stride[1] * 2]
        else:
            ops.append((kind, (h, w, c)))
    # a cached convolution last: what reaches it wrongly reused shows in the output
    ops.append(("conv", (3, 1, 1, [(1, 1), (1, 1)], c, 2)))
    return ops, tuple(stride)


def _params(ops, seed):
    rng = np.random.default_rng(seed)
    params = []
    for kind, args in ops:
        if kind in ("conv", "depthwise"):
            k, _, _, _, cin, cout = args
            shape = (k, k, 1, cout) if kind == "depthwise" else (k, k, cin, cout)
            params.append(rng.normal(0, 0.5, shape).astype(np.float32))
        elif kind in ("embedding", "local"):
            h, w, c = args
            params.append(rng.normal(0, 1.0, (1, h, w, c)).astype(np.float32))
        elif kind == "embedding_w":
            h, w, c = args
            params.append(rng.normal(0, 1.0, (1, 1, w, c)).astype(np.float32))
        elif kind == "bias":
            params.append(rng.normal(0, 1.0, (args[2],)).astype(np.float32))
        else:
            params.append(None)
    return params


def _run(ops, params, x):
    for (kind, args), p in zip(ops, params):
        if kind in ("conv", "depthwise"):
            _, s, d, pads, cin, _ = args
            x = lax.conv_general_dilated(
                x, p, (s, s), pads, rhs_dilation=(d, d), dimension_numbers=DN,
                feature_group_count=cin if kind == "depthwise" else 1,
            )  # fmt: skip
        elif kind == "pad":
            x = lax.pad(x, jnp.float32(0.5), ((0, 0, 0), *args, (0, 0, 0)))
        elif kind == "slice":
            y0, x0, sy = args
            x = x[:, y0::sy, x0:, :]
        elif kind in ("embedding", "embedding_w", "bias"):
            x = x + p
        elif kind == "local":
            x = x * p
        elif kind == "iota_concat":
            n, h, w, _ = x.shape
            rows = lax.broadcasted_iota(jnp.float32, (n, h, w, 1), 1) / h
            x = jnp.concatenate([x, rows], axis=-1)[..., 1:]
        elif kind == "transpose_add":
            x = x + jnp.transpose(x, (0, 2, 1, 3))
        elif kind == "transpose_back":
            x = jnp.transpose(jax.nn.relu(jnp.transpose(x, (0, 2, 1, 3))), (0, 2, 1, 3))
        elif kind == "maxpool":
            x = lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, args, args, 1), "SAME")
        elif kind == "resize_nearest":
            n, h, w, c = x.shape
            x = jax.image.resize(x, (n, 2 * h, 2 * w, c), "nearest")
        elif kind == "resize_linear":
            n, h, w, c = x.shape
            x = jax.image.resize(x, (n, h // 2, w // 2, c), "linear")
        elif kind == "channel_sum":
            x = x + x.sum(-1, keepdims=True)
        elif kind == "cumsum_h":
            x = jnp.cumsum(x, axis=1)
        elif kind == "rev_w":
            x = x[:, :, ::-1]
        else:
            x = jnp.tanh(x)
    return x


@settings(
    max_examples=20, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)  # fmt: skip
@given(program=programs(), k=st.tuples(st.integers(-2, 2), st.integers(-2, 2)),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_a_random_program_reuses_only_what_a_full_recompute_gives(program, k, seed):
    ops, stride = program
    motion = (k[0] * stride[0], k[1] * stride[1])
    params = _params(ops, seed)
    config = dcjax.Config(kernel="reference", refresh_every=None, skip_unchanged=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # primitives without a rule are reported
        cached = dcjax.transform(_run_fn(ops), params, frame_shape=(H, W, C), config=config)
    prev, cur, mask = translated_pair((H, W, C), motion, seed)
    state = cached.init()
    _, state, _ = cached.step(state, jnp.asarray(prev), match=nothing_reusable((H, W)))
    match = dcjax.Match(motion=jnp.asarray(motion), mask=jnp.asarray(mask))
    out, _, _ = cached.step(state, jnp.asarray(cur), match=match)
    assert cached.trace_count == 1
    full = np.asarray(_run(ops, params, jnp.asarray(cur)[None]))
    scale = max(1.0, float(np.abs(full).max()))
    np.testing.assert_allclose(np.asarray(out), full, rtol=1e-4, atol=1e-4 * scale,
                               err_msg=f"{ops} motion {motion}")  # fmt: skip


def _run_fn(ops):
    return lambda params, x: _run(ops, params, x)


def test_the_random_programs_reuse_something():
    """The property is not vacuous: a program of the generator's ops reuses under motion."""
    ops = [("conv", (3, 1, 1, [(1, 1), (1, 1)], C, 4)), ("bias", (H, W, 4)), ("tanh", None)]
    params = _params(ops, 0)
    config = dcjax.Config(kernel="reference", refresh_every=None, skip_unchanged=False)
    cached = dcjax.transform(_run_fn(ops), params, frame_shape=(H, W, C), config=config)
    prev, cur, mask = translated_pair((H, W, C), (2, -1), 0)
    state = cached.init()
    _, state, _ = cached.step(state, jnp.asarray(prev))
    match = dcjax.Match(motion=jnp.asarray((2, -1)), mask=jnp.asarray(mask))
    out, _, info = cached.step(state, jnp.asarray(cur), match=match)
    assert float(np.asarray(info["reuse_fraction"])[0]) > 0.5
    np.testing.assert_allclose(out, _run(ops, params, jnp.asarray(cur)[None]), atol=1e-5)
