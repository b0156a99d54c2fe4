"""Content anchored to image positions, and ops that move content: reuse stays exact.

Each regression test builds a model of a few lines, runs a frame and then the
same frame translated by a whole-pixel motion with the exact reuse mask
(`dcjax.Match`), and compares the cached output with the model run in full
on the second frame. Every layer keeps a cache (``kernel="reference"``), so a
wrong reuse rule shows as a difference; a control model without the anchored
operand shows that the test reuses at all.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import dcjax
from dcjax.transforms import variation
from dcjax.transforms.analysis import analyze
from dcjax.transforms.spatial import Spatial
from dcjax.transforms.trace import trace_model
from tests.translated import nothing_reusable, translated_pair

H, W, C = 24, 24, 3
DN = ("NHWC", "HWIO", "NHWC")
MOTION = (2, 1)


def _conv(x, w, padding="SAME"):
    return lax.conv_general_dilated(x, w, (1, 1), padding, dimension_numbers=DN)


def _weights(seed, shape, scale=0.3):
    return jax.random.normal(jax.random.key(seed), shape) * scale


def _reuse_error(fn, params, motion=MOTION):
    """(max |cached - full| on the translated frame, the step's info)."""
    return _reuse_errors(fn, params, [motion])[0]


def _reuse_errors(fn, params, motions):
    """`_reuse_error` for each of ``motions``, through one transform (the
    motion is an argument of the compiled step)."""
    config = dcjax.Config(kernel="reference", refresh_every=None, skip_unchanged=False)
    cached = dcjax.transform(fn, params, frame_shape=(H, W, C), config=config)
    results = []
    for motion in motions:
        prev, cur, mask = translated_pair((H, W, C), motion, seed=0)
        state = cached.init()
        _, state, _ = cached.step(state, jnp.asarray(prev), match=nothing_reusable((H, W)))
        match = dcjax.Match(motion=jnp.asarray(motion), mask=jnp.asarray(mask))
        out, state, info = cached.step(state, jnp.asarray(cur), match=match)
        full = cached.apply(jnp.asarray(cur))
        results.append((float(jnp.max(jnp.abs(out - full))), info))
    return results


def _reused(info) -> float:
    return float(np.max(np.asarray(info["reuse_fraction"])))


W1, W2 = _weights(1, (3, 3, C, 4)), _weights(2, (3, 3, 4, 4))
PE = _weights(3, (1, H, W, 4), scale=3.0)


def _stem(x):
    return jax.nn.relu(_conv(x, W1))


def test_a_model_that_only_moves_with_the_frame_is_reused_exactly():
    """The control: the oracle sees reuse, and no error."""
    err, info = _reuse_error(lambda p, x: _conv(_stem(x), p), W2)
    assert _reused(info) > 0.5
    assert err < 1e-5


def test_a_learned_positional_embedding_is_not_reused_under_motion():
    err, info = _reuse_error(lambda p, x: _conv(_stem(x) + p, W2), PE)
    assert err < 1e-5
    # the layer after the embedding recomputes; the stem before it still reuses
    reuse = np.asarray(info["reuse_fraction"])
    assert reuse[0] > 0.5 and reuse[1] == 0.0


def test_a_positional_embedding_is_reused_without_motion():
    err, info = _reuse_error(lambda p, x: _conv(_stem(x) + p, W2), PE, motion=(0, 0))
    assert err < 1e-5
    assert float(np.asarray(info["reuse_fraction"])[1]) > 0.9


def test_coordconv_iota_channels_are_not_reused_under_motion():
    def coordconv(p, x):
        y = _stem(x)
        rows = lax.broadcasted_iota(jnp.float32, (1, H, W, 1), 1) / H
        cols = lax.broadcasted_iota(jnp.float32, (1, H, W, 1), 2) / W
        return _conv(jnp.concatenate([y, rows, cols], axis=-1), p)

    err, _ = _reuse_error(coordconv, _weights(4, (3, 3, 6, 4)))
    assert err < 1e-5


def test_a_locally_connected_layer_is_not_reused_under_motion():
    def local(p, x):
        return _conv(jnp.sum(_stem(x) * p, axis=-1, keepdims=True), W2[:, :, :1])

    err, _ = _reuse_error(local, PE)
    assert err < 1e-5


def test_motion_along_one_axis_keeps_reuse_of_content_anchored_along_the_other():
    """An embedding that varies along W only is reusable under a vertical motion."""
    pe_w = _weights(5, (1, 1, W, 4), scale=3.0)
    fn = lambda p, x: _conv(_stem(x) + p, W2)  # noqa: E731
    err, info = _reuse_error(fn, pe_w, motion=(2, 0))
    assert err < 1e-5
    assert float(np.asarray(info["reuse_fraction"])[1]) > 0.5
    err, info = _reuse_error(fn, pe_w, motion=(0, 2))
    assert err < 1e-5
    assert float(np.asarray(info["reuse_fraction"])[1]) == 0.0


def test_a_per_pixel_mean_image_in_preprocess_is_a_clear_error():
    mean = np.random.default_rng(0).uniform(size=(H, W, C)).astype(np.float32)
    with pytest.raises(ValueError, match="preprocess must act on each pixel alone"):
        dcjax.transform(lambda p, x: _conv(x, p), W1, frame_shape=(H, W, C),
                        preprocess=lambda f: f / 255.0 - mean)  # fmt: skip
    # a per-channel normalisation is accepted
    norm = jnp.array([0.4, 0.5, 0.6])
    dcjax.transform(lambda p, x: _conv(x, p), W1, frame_shape=(H, W, C),
                    preprocess=lambda f: (f / 255.0 - norm) * 2.0)  # fmt: skip


def _pad(x, h=(0, 0), w=(0, 0), value=0.0):
    return lax.pad(x, value, ((0, 0, 0), (*h, 0), (*w, 0), (0, 0, 0)))


@pytest.mark.parametrize(
    "name, fn",
    [
        ("up along H", lambda p, x: _conv(_pad(x, h=(-1, 1)), p)),
        ("left along W", lambda p, x: _conv(_pad(x, w=(-1, 1)), p)),
        (
            "down after an activation",
            lambda p, x: _conv(jax.nn.relu(_pad(x, h=(1, -1), value=0.5)), p),
        ),
    ],
)
def test_a_size_preserving_pad_that_moves_content_is_range_checked(name, fn):
    motions = [(-2, 0), (2, 0), (-1, 1), (1, -2), (0, -1)]
    for motion, (err, _) in zip(motions, _reuse_errors(fn, W1, motions), strict=True):
        assert err < 1e-5, (name, motion)


def test_a_convolution_whose_padding_excludes_the_output_pixel_is_range_checked():
    """Padding (-1, 3) along H keeps the size but moves the map up by a row."""
    fn = lambda p, x: _conv(_conv(x, p[0], ((-1, 3), (1, 1))), p[1])  # noqa: E731
    motions = [(-2, 0), (-1, 0), (-1, 1), (2, 0)]
    for motion, (err, _) in zip(motions, _reuse_errors(fn, (W1, W2), motions), strict=True):
        assert err < 1e-5, motion


def test_adding_a_map_to_its_transpose_is_not_reused():
    with pytest.warns(UserWarning, match="no reuse rule"):
        err, _ = _reuse_error(
            lambda p, x: _conv(_stem(x) + jnp.transpose(_stem(x), (0, 2, 1, 3)), p), W2, (2, 0)
        )
    assert err < 1e-5


# -- the analysis ------------------------------------------------------------------


def _anchored(fn, params):
    traced = trace_model(fn, params, (H, W, C))
    n = len(traced.leaves)
    sig = Spatial(axes=(1, 2), size=(H, W), stride=(1, 1))
    analysis = analyze(traced.jaxpr, [None] * n + [sig], [False] * n + [True])
    return [(e.primitive.name, i.anchored) for e, i in zip(analysis.jaxpr.jaxpr.eqns, analysis.eqns)
            if any(i.anchored)]  # fmt: skip


@pytest.mark.parametrize(
    "name, fn, params, expected",
    [
        ("bias", lambda p, x: x + p, jnp.arange(3.0), []),
        ("per-channel scale", lambda p, x: x * p[None, None, None], jnp.arange(3.0), []),
        ("embedding", lambda p, x: x + p, jnp.ones((1, H, W, C)), [("add", (True, True))]),
        ("rows only", lambda p, x: x * p, jnp.ones((H, 1, 1)), [("mul", (True, False))]),
        ("a constant image is constant", lambda p, x: x + jnp.full((H, W, C), 2.0), None, []),
        (
            "iota columns",
            lambda p, x: x - lax.broadcasted_iota(jnp.float32, (1, H, W, C), 2),
            None,
            [("sub", (False, True))],
        ),
    ],
)
def test_anchored_axes_come_from_where_a_value_varies(name, fn, params, expected):
    assert _anchored(fn, params) == expected, name


def test_constant_axes_are_read_from_the_value():
    v = np.zeros((1, 4, 5, 3))
    assert variation.constant_axes(v) == frozenset()
    v[0, 2, :, :] = 1.0
    assert variation.constant_axes(v) == frozenset({1})
    assert variation.input_axes((1, 4, 1, 3)) == frozenset({1, 3})
