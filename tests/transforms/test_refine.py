"""Refinement of reuse masks inside the network (Config(refine=...))."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from skimage import data, transform

from dcjax import deepcache
from dcjax.config import RefineConfig
from dcjax.transforms import refine as refine_lib
from dcjax.transforms.records import DenseLayer

SIZE = 32
DN = ("NHWC", "HWIO", "NHWC")


def _conv(x, w, groups=1):
    return lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=DN, feature_group_count=groups
    )


def two_layers(params, x):
    """Returns every conv output, so tests can check each layer on its own input."""
    y1 = _conv(x, params["w1"])
    y2 = _conv(jax.nn.relu(y1), params["w2"])
    return y1, y2


PARAMS = {
    "w1": jax.random.normal(jax.random.key(0), (3, 3, 3, 8)) * 0.3,
    "w2": jax.random.normal(jax.random.key(1), (3, 3, 8, 8)) * 0.2,
}


@functools.cache
def _photo_stream(n: int, drift: float, noise: float, seed: int = 0) -> np.ndarray:
    """A real photo under slow brightness drift and sensor noise, float32 [0, 1]."""
    img = transform.resize(data.coffee(), (SIZE, SIZE), anti_aliasing=True).astype(np.float32)
    rng = np.random.default_rng(seed)
    frames = [
        np.clip(img * (1.0 + drift * t) + rng.normal(0, noise, img.shape), 0, 1) for t in range(n)
    ]
    return np.stack(frames).astype(np.float32)


# Non-negative weights make the L1 bound tight against a uniform brightness drift,
# so a drift that accumulated past 2 delta would break it.
POSITIVE = jax.tree_util.tree_map(jnp.abs, PARAMS)


def _transform(refine, params=PARAMS, model=two_layers, **kw):
    # these layers are small enough for kernel="auto" to run them dense (no cache,
    # nothing to refine) on CPU: a sparse kernel keeps their caches
    kw.setdefault("kernel", "xla")
    cfg = deepcache.Config(refine=refine, **kw)
    return deepcache.transform(model, params, frame_shape=(SIZE, SIZE, 3), config=cfg)


def with_epilogues(params, x):
    """Each conv followed by a per-channel affine map and an activation (fused epilogues)."""
    y1 = jax.nn.relu(_conv(x, params["w1"]) * 1.5 - 0.1)
    return (jnp.tanh(_conv(y1, params["w2"]) + 0.2),)


@pytest.mark.parametrize("model", [two_layers, with_epilogues])
def test_delta_zero_reproduces_plain_deepcache(model):
    """With ``delta=0`` the refined step reuses exactly what plain DeepCache
    does (the same reuse on every layer and frame) and computes the same
    outputs up to float rounding: the two steps are different programs, and
    XLA may compile a recomputed tile's products and epilogue differently in
    each (found 2026-12-07: 4.9e-7 on a few hundred elements of a frame with
    a change, under the suite's XLA flags)."""
    frames = _photo_stream(6, 0.0, 0.0).copy()
    frames[3:, 5:12, 8:20] = 1.0 - frames[3:, 5:12, 8:20]  # an object appears
    plain = _transform(None, model=model)
    zero = _transform(RefineConfig(delta=0.0, layers="all"), model=model)
    assert any(zero.epilogues) == (model is with_epilogues)
    sp, sz = plain.init(), zero.init()
    for f in frames:
        op, sp, ip = plain.step(sp, f)
        oz, sz, iz = zero.step(sz, f)
        np.testing.assert_array_equal(np.asarray(ip["reuse_fraction"]), iz["reuse_fraction"])
        for a, b in zip(op, oz):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("metric", ["max_abs", "rms"])
def test_error_bound_per_layer_and_no_accumulation(metric):
    """40 frames of drift and noise, no refresh: every layer stays within its bound."""
    delta = 0.1
    cached = _transform(
        RefineConfig(delta=delta, metric=metric, layers="all"),
        POSITIVE,
        matcher="none",
        refresh_every=None,
    )
    frames = _photo_stream(40, 0.012, 0.002)  # per frame under delta, in total well over
    state = cached.init()
    assert state.prev_frame.shape == (0,)  # no matcher reads a key: the state keeps none
    reused_late = []
    for t, f in enumerate(frames):
        (y1, y2), state, info = cached.step(state, f)
        scale = np.asarray(state.ref_scale)
        inputs = [jnp.asarray(f)[None], jax.nn.relu(y1)]
        for layer, (x, y, w) in enumerate(zip(inputs, (y1, y2), (POSITIVE["w1"], POSITIVE["w2"]))):
            err = np.abs(np.asarray(y) - np.asarray(_conv(x, w))).max(axis=(0, 1, 2))
            bound = refine_lib.error_bound(w, delta * scale[layer], metric, w.shape[2])
            assert (err <= np.asarray(bound) + 1e-5).all(), (t, layer, err, bound)
        if t >= 20:
            reused_late.append(np.asarray(info["reuse_fraction"]))
    assert scale.min() > 0
    # refinement actually reuses on this stream, to the end
    assert np.mean(reused_late) > 0.3


@functools.cache
def _scene_with_object(n: int, drift: float, noise: float, seed: int = 1) -> np.ndarray:
    """`_photo_stream` with a real object (a patch of another photo) crossing
    the scene one pixel per frame: blocks around it fail the matcher, blocks
    it left behind pass it again."""
    frames = _photo_stream(n, drift, noise, seed).copy()
    patch = transform.resize(data.astronaut(), (8, 8), anti_aliasing=True).astype(np.float32)
    for t in range(n):
        top, left = 4 + (t // 2) % 16, 2 + t % 20
        frames[t, top : top + 8, left : left + 8] = patch
    return frames


def test_error_bound_holds_behind_a_block_matcher():
    """The refined stem reads the frame behind the diamond matcher: 40 frames of
    drift, noise and a moving object, no refresh. A block the matcher passes
    but the change test rejects is recomputed and its reference moves with it;
    every layer stays within its bound on every frame."""
    delta = 0.1
    cached = _transform(
        RefineConfig(delta=delta, layers="all"),
        POSITIVE,
        matcher="diamond",
        block_size=4,
        psnr_threshold=16.0,  # passes blocks whose pixels moved by more than the test allows
        refresh_every=None,
    )
    assert [lp.tested_alone for lp in cached.plan.layers] == [True, False]
    assert not cached.plan.skips_still  # the matcher alone does not decide a still frame
    frames = _scene_with_object(40, 0.008, 0.01)
    state = cached.init()
    matched, reused = [], []
    for t, f in enumerate(frames):
        (y1, y2), state, info = cached.step(state, f)
        assert not (t and bool(info["refreshed"])), t
        scale = np.asarray(state.ref_scale)
        inputs = [jnp.asarray(f)[None], jax.nn.relu(y1)]
        for layer, (x, y, w) in enumerate(zip(inputs, (y1, y2), (POSITIVE["w1"], POSITIVE["w2"]))):
            err = np.abs(np.asarray(y) - np.asarray(_conv(x, w))).max(axis=(0, 1, 2))
            bound = refine_lib.error_bound(w, delta * scale[layer], "max_abs", w.shape[2])
            assert (err <= np.asarray(bound) + 1e-5).all(), (t, layer, err, bound)
        matched.append(float(info["match_ratio"]))
        reused.append(np.asarray(info["reuse_fraction"]))
    # the matcher passes most blocks, the moving object fails some, and both
    # layers reuse to the end of the stream
    assert 0.3 < np.mean(matched[1:]) < 1.0, matched
    assert np.mean(reused[20:], axis=0).min() > 0.3, reused[20:]


def test_refinement_increases_reuse_on_real_noise():
    frames = _photo_stream(5, 0.0, 0.04)  # noise under ~28 dB PSNR: blocks do not match
    plain = _transform(None, matcher="static", psnr_threshold=30.0)
    refined = _transform(
        RefineConfig(delta=0.6, layers="all"), matcher="static", psnr_threshold=30.0
    )
    for cached, name in ((plain, "plain"), (refined, "refined")):
        state = cached.init()
        for f in frames:
            _, state, info = cached.step(state, f)
        if name == "plain":
            plain_reuse = np.asarray(info["reuse_fraction"])
    refined_reuse = np.asarray(info["reuse_fraction"])
    assert plain_reuse.max() < 0.2
    assert (refined_reuse > plain_reuse + 0.2).all(), (plain_reuse, refined_reuse)


def _branches(copy_input: bool):
    """A stem and two branches reading its output; with ``copy_input`` the second
    branch reads a copy (``x * 1.0``: another variable with the same values)."""

    def fn(p, x):
        h = jax.nn.relu(_conv(x, p["w1"]))
        a = _conv(h, p["w2"])
        b = _conv(h * 1.0 if copy_input else h, p["w3"])
        return a, b

    return fn


def test_layers_reading_one_map_share_its_test_and_reference():
    params = {**PARAMS, "w3": jax.random.normal(jax.random.key(2), (1, 1, 8, 8)) * 0.3}
    cfg = RefineConfig(delta=0.3, layers="all")
    shared = _transform(cfg, params, model=_branches(False), matcher="none")
    separate = _transform(cfg, params, model=_branches(True), matcher="none")
    assert [r is None for r in shared.init().refs] == [False, False, True]
    assert all(r is not None for r in separate.init().refs)
    frames = _photo_stream(8, 0.004, 0.02)
    ss, sp = shared.init(), separate.init()
    for f in frames:
        out_s, ss, info_s = shared.step(ss, f)
        out_p, sp, info_p = separate.step(sp, f)
        # the same decisions; the values to float32 rounding (the two graphs
        # differ, so XLA may fuse and contract them differently)
        for a, b in zip(out_s, out_p):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(info_s["reuse_fraction"], info_p["reuse_fraction"])
        np.testing.assert_array_equal(np.asarray(ss.ref_scale), np.asarray(sp.ref_scale))
    # the stream is one where refinement reuses in both branches
    assert (np.asarray(info_s["reuse_fraction"])[1:] > 0.2).all(), info_s["reuse_fraction"]


def test_a_refined_layer_reading_the_frame_reuses_where_its_test_passes_only():
    """Behind a block matcher, a refined layer that reads the frame reuses where
    its change test passes, not where the matcher passed a block: a frame whose
    blocks all match but whose pixels moved past ``delta`` is recomputed there,
    and the reference takes the frame; the same frame again is reused in full
    and keeps the references. Without refinement the matcher's verdict stands."""
    refine = RefineConfig(delta=1e-4, layers="all")
    cached = _transform(refine, matcher="static", psnr_threshold=20.0, refresh_every=None)
    plain = _transform(None, matcher="static", psnr_threshold=20.0, refresh_every=None)
    f0 = _photo_stream(1, 0.0, 0.0)[0]
    f1 = np.clip(f0 + 0.01, 0, 1).astype(np.float32)  # ~40 dB: every block matches
    state, sp = cached.init(), plain.init()
    (y0, _), state, _ = cached.step(state, f0)
    (p0, _), sp, _ = plain.step(sp, f0)
    (y1, _), state, info = cached.step(state, f1)
    (p1, _), sp, info_p = plain.step(sp, f1)
    for i in (info, info_p):
        assert float(i["input_reuse"]) == 1.0 and not bool(i["refreshed"])
    # plain DeepCache keeps the first frame's features (the matcher's approximation)
    assert bool(info_p["skipped"])
    np.testing.assert_array_equal(np.asarray(p1), np.asarray(p0))
    # the refined stem recomputed every pixel that moved past its threshold
    assert not bool(info["skipped"])
    assert float(info["reuse_fraction"][0]) < 0.05
    np.testing.assert_allclose(
        np.asarray(y1), np.asarray(_conv(jnp.asarray(f1)[None], PARAMS["w1"])), atol=1e-5
    )
    moved = np.abs(f1 - f0).max(axis=-1) > 0
    ref = np.asarray(state.refs[0][0])
    np.testing.assert_array_equal(ref[moved], f1[moved])
    before = [np.asarray(r) for r in state.refs]
    # the same frame again: every test passes, nothing recomputed, references kept
    (y2, _), state, info = cached.step(state, f1)
    np.testing.assert_array_equal(np.asarray(info["reuse_fraction"]), [1.0, 1.0])
    np.testing.assert_array_equal(np.asarray(y2), np.asarray(y1))
    for old, new in zip(before, state.refs):
        np.testing.assert_array_equal(old, np.asarray(new))


def test_refresh_resets_references():
    cached = _transform(RefineConfig(delta=0.5, layers="all"), refresh_every=3)
    frames = _photo_stream(4, 0.01, 0.01)
    state = cached.init()
    flags = []
    for f in frames:
        (y1, _), state, info = cached.step(state, f)
        flags.append(bool(info["refreshed"]))
        if flags[-1]:
            np.testing.assert_array_equal(np.asarray(state.refs[0][0]), f)
            np.testing.assert_allclose(
                np.asarray(state.refs[1]), np.asarray(jax.nn.relu(y1)), rtol=1e-6
            )
    assert flags == [True, False, False, True]


def test_scene_cut_resets_references():
    cached = _transform(RefineConfig(delta=0.5, layers="all"), matcher="static", min_match=0.5)
    f = _photo_stream(1, 0.0, 0.0)[0]
    state = cached.init()
    for frame in (f, f, 1.0 - f):
        _, state, info = cached.step(state, frame)
    assert bool(info["refreshed"])
    np.testing.assert_array_equal(np.asarray(state.refs[0][0]), 1.0 - f)


def test_auto_layers_skip_cheap_depthwise_and_narrow_pointwise_convolutions():
    def fn(p, x):
        x = _conv(x, p["stem"])  # 3x3 -> 16: 144 MACs per input element
        x = _conv(x, p["dw"], groups=16)  # depthwise 3x3: 9 MACs per input element
        x = _conv(x, p["pw"])  # pointwise 1x1 -> 144: 144 MACs per input element
        x = _conv(x, p["wide"])  # pointwise 1x1 -> 160: 160 MACs per input element
        return _conv(x, p["c3"])  # 3x3 -> 32: 288 MACs per input element

    params = {
        "stem": jnp.ones((3, 3, 3, 16)),
        "dw": jnp.ones((3, 3, 1, 16)),
        "pw": jnp.ones((1, 1, 16, 144)),
        "wide": jnp.ones((1, 1, 144, 160)),
        "c3": jnp.ones((3, 3, 160, 32)),
    }
    layers = deepcache.transform(fn, params, frame_shape=(8, 8, 3)).layers
    assert refine_lib.refined_layers(layers, RefineConfig()) == (False, False, False, True, True)
    names = (layers[1].name,)
    assert refine_lib.refined_layers(layers, RefineConfig(layers=names)) == (
        False, True, False, False, False,
    )  # fmt: skip
    # a layer on the frame is left to the matcher, or refined whatever it costs without one
    on_frame = (True, False, False, False, False)
    for matcher in (True, False):
        assert refine_lib.refined_layers(
            layers, RefineConfig(), reads_frame=on_frame, matcher=matcher
        ) == (not matcher, False, False, True, True)
    with pytest.raises(ValueError, match="unknown layers"):
        refine_lib.refined_layers(layers, RefineConfig(layers=("nope",)))


def _frame_then_behind(p, x):
    """Two convolutions on the (pooled) frame, one inside a jitted call, then one behind them."""
    a = _conv(x, p["a"])
    pooled = lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 1, 1), (1, 1, 1, 1), "SAME")
    b = jax.jit(_conv)(pooled, p["b"])
    return (_conv(jax.nn.relu(a + b), p["c"]),)


FRAME_PARAMS = {  # 3x3 convolutions to 32 channels: 288 MACs per input element
    "a": jax.random.normal(jax.random.key(2), (3, 3, 3, 32)) * 0.3,
    "b": jax.random.normal(jax.random.key(3), (3, 3, 3, 32)) * 0.3,
    "c": jax.random.normal(jax.random.key(4), (3, 3, 32, 32)) * 0.07,
}


def test_auto_leaves_the_layers_on_the_frame_to_the_matcher():
    """Under "auto" a convolution reading the frame (directly, through pooling or a
    jitted call) gets no change test when a block matcher runs; the layer behind it
    does. Without a matcher (the `delta` baseline) the frame's layers are tested, and
    naming a layer refines it whatever it reads."""
    from dcjax.transforms.queries import reads_frame

    cached = _transform(RefineConfig(), FRAME_PARAMS, model=_frame_then_behind)
    assert reads_frame(cached._analysis) == (True, True, False)
    assert cached.plan.refined == (False, False, True)
    state = cached.init()
    assert state.refs[0] is None and state.refs[1] is None and state.refs[2] is not None
    frames = _photo_stream(4, 0.002, 0.005)
    for f in frames:
        _, state, _ = cached.step(state, f)
    assert float(state.ref_scale[2]) > 0.0

    none = _transform(RefineConfig(), FRAME_PARAMS, model=_frame_then_behind, matcher="none")
    assert none.plan.refined == (True, True, True)
    named = _transform(
        RefineConfig(layers=(cached.layers[0].name,)), FRAME_PARAMS, model=_frame_then_behind
    )
    assert named.plan.refined == (True, False, False)


@pytest.mark.parametrize("kernel", ["dense", "auto"])
def test_layers_computed_densely_are_not_refined(kernel):
    """No cache, nothing to reuse: such layers keep no reference and pay no test."""
    # the network runs on every frame: the dense layers compute each one afresh
    cached = _transform(RefineConfig(delta=0.5, layers="all"), kernel=kernel, skip_unchanged=False)
    assert jax.default_backend() != "cpu" or kernel == "dense" or not any(cached.keeps_cache)
    state = cached.init()
    assert all(r is None for r in state.refs)
    frames = _photo_stream(3, 0.0, 0.01)
    for f in frames:
        (y1, y2), state, _ = cached.step(state, f)
    np.testing.assert_allclose(
        np.asarray(y1), np.asarray(_conv(jnp.asarray(f)[None], PARAMS["w1"])), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_array_equal(np.asarray(state.ref_scale), 0.0)


def test_refined_spatial_layers_use_pixel_rows_under_auto():
    from dcjax.kernels import ConvGeometry, auto, tiles

    p = tiles.plan((1, 227, 227, 3), (11, 11, 3, 96), ConvGeometry(strides=(4, 4), padding="VALID"))
    assert auto.choose(p, "cpu") == ("xla", None)  # too few channels for rows unless scattered
    assert auto.choose(p, "cpu", scattered=True) == ("rows", None)
    grouped = tiles.plan(
        (1, 56, 56, 64), (3, 3, 1, 64), ConvGeometry(strides=(1, 1), padding="SAME", groups=64)
    )
    assert auto.choose(grouped, "cpu", scattered=True)[0] in ("xla", "dense")


def test_refine_config_validation():
    with pytest.raises(ValueError, match="RefineConfig.delta"):
        RefineConfig(delta=-1.0)
    with pytest.raises(ValueError, match="RefineConfig.metric"):
        RefineConfig(metric="l1")
    with pytest.raises(ValueError, match="Config.refine"):
        deepcache.Config(refine=0.1)


# -- fully connected layers ---------------------------------------------------

FC_OUT = 24
FC_PARAMS = {
    "w1": PARAMS["w1"],
    "fc": jax.random.normal(jax.random.key(3), (SIZE * SIZE * 3, FC_OUT)) * 0.02,
    "fc2": jax.random.normal(jax.random.key(4), (SIZE * SIZE * 8, FC_OUT)) * 0.02,
}


def dense_on_frame(params, x):
    """A fully connected layer on the frame itself: its input is known exactly."""
    return (x.reshape(1, -1) @ params["fc"],)


def conv_then_dense(params, x):
    y1 = _conv(x, params["w1"])
    return y1, jax.nn.relu(y1).reshape(1, -1) @ params["fc2"] + 0.1


def test_fully_connected_layers_are_found():
    cached = _transform(None, FC_PARAMS, model=conv_then_dense)
    (fc,) = cached.dense_layers
    assert (fc.in_features, fc.out_features) == (SIZE * SIZE * 8, FC_OUT)
    assert fc.flops == 2 * SIZE * SIZE * 8 * FC_OUT
    assert cached.total_flops == cached.layers[0].flops + fc.flops
    # a matrix computed from the weights is one; a product whose frame operand is
    # on the right, or has several rows, is not
    for model, count in (
        (lambda p, x: (x.reshape(1, -1) @ (p["fc"].T * 2.0).T,), 1),
        (lambda p, x: (p["fc"].T @ x.reshape(-1, 1),), 0),
        (lambda p, x: (x.reshape(SIZE, -1) @ p["fc"].reshape(SIZE * 3, -1),), 0),
    ):
        assert len(_transform(None, FC_PARAMS, model=model).dense_layers) == count


def _simulate(frames, w, delta, scale):
    """DeltaCNN's update for one linear layer, in float64 numpy: the oracle."""
    w = np.asarray(w, np.float64)
    x_ref, y_ref, outs, reuse = None, None, [], []
    for f in frames:
        x = f.reshape(-1).astype(np.float64)
        if x_ref is None:
            x_ref, y_ref = x, x @ w
            reuse.append(0.0)
        else:
            changed = ~(np.abs(x - x_ref) < delta * scale)
            y_ref = y_ref + np.where(changed, x - x_ref, 0.0) @ w
            x_ref = np.where(changed, x, x_ref)
            reuse.append(1.0 - changed.mean())
        outs.append(y_ref)
    return outs, reuse


def test_dense_refinement_matches_an_independent_update_and_its_bound():
    """30 frames of drift and noise, no refresh: the refined product follows the
    numpy oracle of the same rule, stays within ``delta_l * sum |W|`` of the exact
    product (no accumulation), and reads fewer rows than a dense product."""
    delta = 0.1
    cached = _transform(
        RefineConfig(delta=delta, layers="all"), FC_PARAMS, model=dense_on_frame, matcher="none",
        refresh_every=None,
    )  # fmt: skip
    frames = _photo_stream(30, 0.004, 0.01)
    state = cached.init()
    outs, reuse = [], []
    for f in frames:
        (y,), state, info = cached.step(state, f)
        outs.append(np.asarray(y)[0])
        reuse.append(float(info["dense_reuse"][0]))
        # no convolution: the work is the rows read (in float32, as one minus
        # the rows skipped: an absolute error of a few float32 epsilons)
        np.testing.assert_allclose(
            float(info["flops_ratio"]), 1.0 - reuse[-1], rtol=1e-6, atol=2e-7
        )
    scale = float(state.dense[0][2])
    assert scale == pytest.approx(np.abs(frames[0]).mean(), rel=1e-6)
    want, want_reuse = _simulate(frames, FC_PARAMS["fc"], delta, scale)
    bound = np.asarray(refine_lib.dense_error_bound(FC_PARAMS["fc"], delta * scale))
    w = np.asarray(FC_PARAMS["fc"], np.float64)
    for t, f in enumerate(frames):
        np.testing.assert_allclose(outs[t], want[t], rtol=1e-4, atol=1e-4)
        err = np.abs(outs[t] - f.reshape(-1).astype(np.float64) @ w)
        assert (err <= bound + 1e-4).all(), (t, err.max(), bound.min())
    np.testing.assert_allclose(reuse, want_reuse, atol=1e-6)
    assert min(reuse[1:]) > 0.3  # the stream is one where rows are skipped


def test_dense_refinement_falls_back_to_the_full_product_when_most_inputs_change():
    cached = _transform(
        RefineConfig(delta=0.1, layers="all"), FC_PARAMS, model=dense_on_frame, matcher="none"
    )
    f = _photo_stream(1, 0.0, 0.0)[0]
    state = cached.init()
    _, state, _ = cached.step(state, f)
    (y,), state, info = cached.step(state, 1.0 - f)  # every input changes
    assert float(info["dense_reuse"][0]) == 0.0
    exact = jnp.asarray(1.0 - f).reshape(1, -1) @ FC_PARAMS["fc"]
    np.testing.assert_array_equal(np.asarray(y), np.asarray(exact))
    np.testing.assert_array_equal(np.asarray(state.dense[0][0]), (1.0 - f).reshape(-1))


def two_dense(params, x):
    """Two fully connected layers, the second on the first's output."""
    h = jax.nn.relu(x.reshape(1, -1) @ params["fc"])
    return h, h @ params["fc3"]


def test_dense_products_re_anchor_on_a_schedule_of_their_own(monkeypatch):
    """With ``refresh_every=None`` each fully connected layer computes its product
    in full every `DENSE_REANCHOR_EVERY` frames, layer ``i`` on the frames with
    ``(t + i) % K == 0``: there it reads every row, equals the full product to
    float32 rounding and takes the frame's input as its reference; between
    them it skips rows and stays within its bound."""
    every = 8
    monkeypatch.setattr(refine_lib, "DENSE_REANCHOR_EVERY", every)
    params = {**FC_PARAMS, "fc3": jax.random.normal(jax.random.key(5), (FC_OUT, FC_OUT)) * 0.3}
    delta = 0.1
    cached = _transform(
        RefineConfig(delta=delta, layers="all"), params, model=two_dense, matcher="none",
        refresh_every=None,
    )  # fmt: skip
    assert [d.updated for d in cached.plan.dense] == [True, True]
    frames = _photo_stream(3 * every + 2, 0.004, 0.01)
    state = cached.init()
    for t, f in enumerate(frames):
        (h, y), state, info = cached.step(state, f)
        reuse = np.asarray(info["dense_reuse"])
        inputs = (jnp.asarray(f).reshape(1, -1), h)
        for i, (x, out, w) in enumerate(zip(inputs, (h, y), (params["fc"], params["fc3"]))):
            exact = np.asarray(x @ w)
            if i == 0:
                exact = np.maximum(exact, 0.0)
            anchored = t == 0 or (t + i) % every == 0  # frame 0: the first, in full
            assert (reuse[i] == 0.0) == anchored, (t, i, reuse)
            if anchored:
                np.testing.assert_allclose(np.asarray(out), exact, rtol=1e-5, atol=1e-6)
                np.testing.assert_array_equal(
                    np.asarray(state.dense[i][0]), np.asarray(x, np.float32).reshape(-1)
                )
            if i == 0:
                bound = np.asarray(refine_lib.dense_error_bound(w, delta * state.dense[i][2]))
                pre = np.asarray(x @ w)[0]
                # relu is 1-Lipschitz: the bound on the product holds after it
                assert (np.abs(np.asarray(out)[0] - np.maximum(pre, 0)) <= bound + 1e-4).all()


def _product_operands(fn, *args) -> list:
    """The primitive (or jnp function) behind each matrix product's left operand in
    ``fn``'s jaxpr, looking through reshapes and casts; ``None`` for an input of its jaxpr."""
    found = []

    def walk(jaxpr):
        producer = {}
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                e = producer.get(eqn.invars[0])
                while e is not None and e.primitive.name in ("reshape", "convert_element_type"):
                    e = producer.get(e.invars[0])
                # a jnp function traces to a call named after it
                found.append(None if e is None else e.params.get("name", e.primitive.name))
            producer.update((v, eqn) for v in eqn.outvars)
            for p in eqn.params.values():
                for sub in p if isinstance(p, (tuple, list)) else [p]:
                    if hasattr(sub, "jaxpr") or hasattr(sub, "eqns"):
                        walk(getattr(sub, "jaxpr", sub))

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_dense_refinement_with_delta_zero_and_refresh_is_exact(backend, monkeypatch):
    """Off CPU too (the step without data-dependent loops): ``delta=0`` computes the
    product as plain DeepCache does, not as a zero plus a product of the input."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    frames = _photo_stream(5, 0.01, 0.01)
    plain = _transform(None, FC_PARAMS, model=conv_then_dense, refresh_every=3)
    zero = _transform(
        RefineConfig(delta=0.0, layers="all"), FC_PARAMS, model=conv_then_dense, refresh_every=3
    )
    refined = _transform(
        RefineConfig(delta=0.5, layers="all"), FC_PARAMS, model=conv_then_dense, refresh_every=3
    )
    sp, sz, sr = plain.init(), zero.init(), refined.init()
    # the fully connected layer multiplies its input, not a selection between it and a
    # difference (which a GPU's product rounds differently from the plain one)
    operands = _product_operands(zero.step, sz, frames[0])
    assert operands and "_where" not in operands
    assert "_where" in _product_operands(refined.step, sr, frames[0]) or backend == "cpu"
    for f in frames:
        op, sp, _ = plain.step(sp, f)
        oz, sz, iz = zero.step(sz, f)
        (y1, y), sr, ir = refined.step(sr, f)
        for a, b in zip(op, oz):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        # every input counts as changed: all rows are read, unless the frame is still
        assert float(iz["dense_reuse"][0]) == float(iz["skipped"])
        if bool(ir["refreshed"]):  # the reference is reset to the input
            x = np.asarray(jax.nn.relu(y1)).reshape(-1)
            np.testing.assert_array_equal(np.asarray(sr.dense[0][0]), x)
            np.testing.assert_allclose(
                np.asarray(y), x[None] @ np.asarray(FC_PARAMS["fc2"]) + 0.1, rtol=1e-5, atol=1e-5
            )
            assert float(ir["dense_reuse"][0]) == 0.0


def test_dense_layers_follow_refine_config_layers():
    def fc(k, n):
        return DenseLayer(index=0, name="fc", in_features=k, out_features=n, flops=2 * k * n)

    # "auto": big weight matrices with enough outputs (AlexNet's fc6 and fc7, not
    # the classifier heads of ResNet-50 or GoogLeNet, not PilotNet's layers)
    layers = [fc(9216, 4096), fc(4096, 4096), fc(4096, 1000), fc(2048, 1000), fc(1164, 100)]
    auto = refine_lib.refined_dense(layers, RefineConfig())
    assert auto == (True, True, False, False, False)
    assert refine_lib.refined_dense([fc(1 << 20, 8)], RefineConfig()) == (False,)
    assert all(refine_lib.refined_dense(layers, RefineConfig(layers="all")))
    assert _transform(RefineConfig(), FC_PARAMS, model=dense_on_frame).init().dense == (None,)
    (fc,) = _transform(None, FC_PARAMS, model=conv_then_dense).dense_layers
    only_fc = _transform(RefineConfig(layers=(fc.name,)), FC_PARAMS, model=conv_then_dense)
    assert fc.name == "dense0"  # a plain function has no module names
    state = only_fc.init()
    assert state.refs == (None,) and state.dense[0] is not None
    with pytest.raises(ValueError, match=fc.name):
        _transform(RefineConfig(layers=("nope",)), FC_PARAMS, model=conv_then_dense)
    assert _transform(None, FC_PARAMS, model=conv_then_dense).init().dense == ()


def test_dense_refinement_under_vmap_and_on_still_frames():
    cached = _transform(RefineConfig(delta=0.2, layers="all"), FC_PARAMS, model=dense_on_frame)
    frames = _photo_stream(3, 0.003, 0.02)
    pairs = np.stack([frames[:2], frames[1:]], axis=1)  # (T=2, streams=2, ...)
    states = jax.vmap(lambda _: cached.init())(jnp.arange(2))
    step = jax.vmap(cached.step)
    for t in range(2):
        outs, states, _ = step(states, jnp.asarray(pairs[t]))
    for i in range(2):
        s = cached.init()
        for t in range(2):
            single, s, _ = cached.step(s, pairs[t, i])
        np.testing.assert_allclose(np.asarray(outs[0][i]), np.asarray(single[0]), atol=1e-5)
    # a still frame skips the network and keeps the reference and the product
    state = cached.init()
    _, state, _ = cached.step(state, frames[0])
    before = [np.asarray(a) for a in state.dense[0]]
    (y,), state, info = cached.step(state, frames[0])
    assert bool(info["skipped"])
    for a, b in zip(before, state.dense[0]):
        np.testing.assert_array_equal(a, np.asarray(b))
    np.testing.assert_array_equal(np.asarray(y)[0], before[1])


def test_dense_refinement_off_cpu_is_one_product_with_the_same_results(monkeypatch):
    """On GPU and TPU (no data-dependent loops) the update is one dense product of
    the masked differences: the same outputs, references and reuse as on CPU."""
    frames = _photo_stream(4, 0.003, 0.02)
    cfg = RefineConfig(delta=0.2, layers="all")
    runs = []
    for backend in ("cpu", "gpu"):
        monkeypatch.setattr(jax, "default_backend", lambda b=backend: b)
        cached = _transform(cfg, FC_PARAMS, model=dense_on_frame, matcher="none")
        # off CPU the one loop is the still-frame skip's (`Config.skip_unchanged`)
        text = jax.jit(cached.step).lower(cached.init(), frames[0]).as_text()
        loops = text.count("stablehlo.while")
        assert loops > 1 if backend == "cpu" else loops == 1
        still = _transform(
            cfg, FC_PARAMS, model=dense_on_frame, matcher="none", skip_unchanged=False
        )
        text = jax.jit(still.step).lower(still.init(), frames[0]).as_text()
        assert (text.count("stablehlo.while") > 0) == (backend == "cpu")
        state, outs = cached.init(), []
        for f in frames:
            (y,), state, info = cached.step(state, f)
            outs.append((np.asarray(y), float(info["dense_reuse"][0])))
        runs.append((outs, [np.asarray(a) for a in state.dense[0]]))
    (cpu, cpu_state), (gpu, gpu_state) = runs
    for (a, ra), (b, rb) in zip(cpu, gpu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        assert ra == rb
    assert max(r for _, r in cpu) > 0.3
    for a, b in zip(cpu_state, gpu_state):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _local_change_stream(n: int) -> np.ndarray:
    """A still photo with one 8x8 patch redrawn on every frame: most blocks reused."""
    base = _photo_stream(1, 0.0, 0.0)[0]
    rng = np.random.default_rng(5)
    frames = []
    for t in range(n):
        f = base.copy()
        y = (3 * t) % (SIZE - 8)
        f[y : y + 8, 20:28] = rng.random((8, 8, 3))
        frames.append(f)
    return np.stack(frames).astype(np.float32)


def test_plain_deepcache_updates_large_fully_connected_layers_by_unchanged_inputs(
    monkeypatch,
):
    """`Config.dense_updates`: the product moves by the rows of the inputs that changed
    since the last frame, exactly: the outputs equal the full product's up to float32
    rounding over a long stream without refresh, the reuse is the fraction of inputs
    equal to the previous frame's, and the FLOP ratio counts the rows skipped."""
    monkeypatch.setattr(refine_lib, "AUTO_MIN_DENSE_WEIGHTS", 1)  # this layer counts as large
    kw = dict(params=FC_PARAMS, model=conv_then_dense, refresh_every=None)
    on = _transform(None, **kw)
    off = _transform(None, dense_updates=False, **kw)
    zero = _transform(RefineConfig(delta=0.0), **kw)  # refinement at delta=0: plain DeepCache
    assert on.sparse[-1] and not off.sparse[-1]
    assert off.init().dense == () and on.init().dense[0] is not None
    (fc,) = on.dense_layers
    frames = _local_change_stream(16)
    s_on, s_off, s_zero = on.init(), off.init(), zero.init()
    w = np.asarray(FC_PARAMS["fc2"], np.float64)
    prev, reuse = None, []
    for f in frames:
        (y1, y), s_on, i_on = on.step(s_on, f)
        (y1_off, y_off), s_off, i_off = off.step(s_off, f)
        (y1_zero, y_zero), s_zero, i_zero = zero.step(s_zero, f)
        np.testing.assert_array_equal(np.asarray(y1), np.asarray(y1_off))  # same convolutions
        np.testing.assert_array_equal(np.asarray(y), np.asarray(y_zero))
        assert float(i_zero["dense_reuse"][0]) == float(i_on["dense_reuse"][0])
        x = np.maximum(np.asarray(y1, np.float64), 0.0).reshape(-1)
        np.testing.assert_allclose(np.asarray(y)[0], x @ w + 0.1, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(y), np.asarray(y_off), rtol=1e-5, atol=1e-5)
        got = float(i_on["dense_reuse"][0])
        if prev is None:
            want = 0.0  # the first frame's full product
        else:
            same = float(np.mean(x == prev))
            want = same if 1.0 - same <= refine_lib.DENSE_FRACTION else 0.0
        assert got == pytest.approx(want, abs=1e-6)
        # the rows skipped are work not done
        np.testing.assert_allclose(
            float(i_off["flops_ratio"]) - float(i_on["flops_ratio"]),
            got * fc.flops / on.total_flops,
            rtol=1e-4, atol=1e-6,
        )  # fmt: skip
        prev, reuse = x, [*reuse, got]
    assert max(reuse) > 0.5 and min(reuse[1:]) > 0.0  # rows were skipped on every frame


def test_dense_updates_only_on_cpu_for_large_layers_and_not_with_exits(monkeypatch):
    kw = dict(params=FC_PARAMS, model=conv_then_dense)
    assert _transform(None, **kw).init().dense == ()  # a small layer: computed in full
    monkeypatch.setattr(refine_lib, "AUTO_MIN_DENSE_WEIGHTS", 1)
    assert _transform(None, **kw).init().dense[0] is not None
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    # off CPU the update would cost the full product: none
    cached = _transform(None, **kw)
    assert cached.init().dense == () and not cached.sparse[-1]
