"""deepcache.transform: the DESIGN.md invariants, refresh, retracing, errors."""

from __future__ import annotations

import functools
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from skimage import data, transform

from dcjax import deepcache
from dcjax.kernels import ConvGeometry, plan
from dcjax.step import mean_of_masks
from tests.kernels._strategies import all_eqns
from tests.transforms import small_models
from tests.translated import nothing_reusable

SIZE = 32


@pytest.fixture(autouse=True, scope="module")
def _chains_on_small_maps():
    """The small models' 32x32 inverted residual block runs as a chain
    (`dcjax.kernels.chain` forms chains on maps of 56 pixels and more)."""
    from dcjax.kernels import chain

    patch = pytest.MonkeyPatch()
    patch.setattr(chain, "CHAIN_MIN_SIDE", 16)
    yield
    patch.undo()


def _photo(size: int, seed: int = 0) -> np.ndarray:
    """A real photo (scikit-image's astronaut), resized, float32 in [0, 1]."""
    img = transform.resize(data.astronaut(), (2 * size, 2 * size), anti_aliasing=True)
    rng = np.random.default_rng(seed)
    y, x = rng.integers(0, size, 2)
    return img[y : y + size, x : x + size].astype(np.float32)


def _translate(frame: np.ndarray, dy: int, dx: int, seed: int = 1):
    """``cur[y, x] = prev[y + dy, x + dx]``, new random content where that leaves the frame."""
    h, w, _ = frame.shape
    rng = np.random.default_rng(seed)
    cur = rng.uniform(size=frame.shape).astype(np.float32)
    mask = np.zeros((h, w), bool)
    ys, xs = slice(max(0, -dy), min(h, h - dy)), slice(max(0, -dx), min(w, w - dx))
    cur[ys, xs] = frame[ys.start + dy : ys.stop + dy, xs.start + dx : xs.stop + dx]
    mask[ys, xs] = True
    return cur, mask


@functools.cache
def _model(name):
    module, variables = small_models.create(name, SIZE)
    ref = jax.jit(lambda f: module.apply(variables, f[None]))
    return module, variables, lambda f: ref(jnp.asarray(f, jnp.float32))


@functools.cache
def _cached(name, config):
    """One compiled transform per (model, config), shared by the tests."""
    module, variables, _ = _model(name)
    return deepcache.transform(module, variables, frame_shape=(SIZE, SIZE, 3), config=config)


def _close(a, b, tol=1e-5):
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max())))


@pytest.mark.parametrize("name", sorted(small_models.MODELS))
def test_never_reuse_equals_model(name):
    module, variables, ref = _model(name)
    frames = [_photo(SIZE, s) for s in range(3)]
    frames.append(frames[-1])  # identical frame: with threshold +inf still no reuse
    for cfg in (
        deepcache.Config(psnr_threshold=float("inf")),
        deepcache.Config(refresh_every=1),
    ):
        cached = _cached(name, cfg)
        state = cached.init()
        for f in frames:
            out, state, info = cached.step(state, f)
            np.testing.assert_array_equal(np.asarray(info["reuse_fraction"]), 0.0)
            assert float(info["flops_ratio"]) == pytest.approx(1.0)
            _close(out, ref(f))


@pytest.mark.parametrize("name", sorted(small_models.MODELS))
def test_identical_frame_equals_model_with_full_reuse(name):
    module, variables, ref = _model(name)
    # the network runs on the still frame (skipping it is tested on its own)
    cached = _cached(name, deepcache.Config(skip_unchanged=False))
    f = _photo(SIZE)
    state = cached.init()
    _, state, info0 = cached.step(state, f)
    assert bool(info0["refreshed"])
    out, state, info = cached.step(state, f)
    assert not bool(info["refreshed"])
    assert float(info["input_reuse"]) == 1.0
    np.testing.assert_array_equal(np.asarray(info["reuse_fraction"]), 1.0)
    # every reused layer skipped; what is left runs on every frame (dense heads)
    other = cached.total_flops - sum(layer.flops for layer in cached.layers)
    assert float(info["flops_ratio"]) == pytest.approx(other / cached.total_flops, abs=1e-7)
    _close(out, ref(f))


@pytest.mark.parametrize("name", sorted(small_models.MODELS))
@pytest.mark.parametrize("direction", [(1, 0), (0, -1), (-1, 1)])
def test_translation_by_total_stride_is_exact(name, direction):
    module, variables, ref = _model(name)
    s = module.total_stride
    dy, dx = direction[0] * s, direction[1] * s
    cached = _cached(name, deepcache.Config(alignment="exact", refresh_every=100))
    prev = _photo(SIZE, 3)
    cur, mask = _translate(prev, dy, dx)
    state = cached.init()
    _, state, _ = cached.step(state, prev, match=nothing_reusable(prev.shape))
    match = deepcache.Match(motion=jnp.array([dy, dx]), mask=jnp.asarray(mask))
    out, state, info = cached.step(state, cur, match=match)
    _close(out, ref(cur))
    fractions = np.asarray(info["reuse_fraction"])
    assert fractions[0] > 0.3, fractions
    assert float(info["flops_ratio"]) < 1.0


def test_translation_not_multiple_of_stride_exact_vs_round():
    module, variables, ref = _model("plain")  # strides 2, 4, 8
    prev = _photo(SIZE, 4)
    cur, mask = _translate(prev, 2, 0)
    match = deepcache.Match(motion=jnp.array([2, 0]), mask=jnp.asarray(mask))
    fractions = {}
    for alignment in ("exact", "round"):
        cached = _cached("plain", deepcache.Config(alignment=alignment, refresh_every=100))
        state = cached.init()
        _, state, _ = cached.step(state, prev, match=nothing_reusable(prev.shape))
        out, state, info = cached.step(state, cur, match=match)
        fractions[alignment] = np.asarray(info["reuse_fraction"])
        if alignment == "exact":
            _close(out, ref(cur))
    # conv1 (stride 2) sees an integer shift of 1 under both policies; the layer at
    # stride 4 sees 1/2: not reusable under "exact", rounded under "round".
    assert fractions["exact"][0] > 0 and fractions["round"][0] > 0
    assert fractions["exact"][1] == 0.0
    assert fractions["round"][1] > 0.0


def test_translation_of_real_photo_with_builtin_matcher_zero_motion():
    """A static scene with a changed patch: the static matcher finds the rest."""
    module, variables, ref = _model("inception")
    cached = _cached("inception", deepcache.Config())
    prev = _photo(SIZE, 5)
    cur = prev.copy()
    cur[8:14, 20:28] = 1.0 - cur[8:14, 20:28]
    state = cached.init()
    _, state, _ = cached.step(state, prev)
    out, state, info = cached.step(state, cur)
    _close(out, ref(cur))
    assert 0.5 < float(info["input_reuse"]) < 1.0
    assert 0.0 < float(info["flops_ratio"]) < 1.0


@pytest.mark.parametrize("matcher", ["static", "diamond"])
def test_reference_key_keeps_reused_pixels_within_the_threshold_of_their_features(matcher):
    """A slow brightness drift: each frame passes the PSNR test against the
    previous one, not against the frame its cached features came from. The
    static matcher keeps the key as a frame, the diamond search as its luma
    plane."""
    w = jax.random.normal(jax.random.key(0), (3, 3, 3, 4)) * 0.3

    def conv(variables, x):
        return jax.lax.conv_general_dilated(
            x, variables, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    step_c = 0.008  # 41.9 dB against the previous frame; two steps: 35.9 dB
    base = 0.5 * _photo(SIZE, 6) + 0.2
    frames = [base + t * step_c for t in range(8)]
    # a reused pixel's input is off by at most what the key lets through
    bound = float(jnp.abs(w).sum(axis=(0, 1, 2)).max()) * step_c * 1.001
    errors, reuse = {}, {}
    for key in ("reference", "previous"):
        cfg = deepcache.Config(
            key=key,
            matcher=matcher,
            psnr_threshold=40.0,
            refresh_every=None,
            data_range=1.0,
            kernel="xla",
        )
        cached = deepcache.transform(conv, w, frame_shape=(SIZE, SIZE, 3), config=cfg)
        state = cached.init()
        errors[key], reuse[key] = [], []
        for f in frames:
            out, state, info = cached.step(state, f)
            errors[key].append(float(jnp.abs(out - conv(w, jnp.asarray(f)[None])).max()))
            reuse[key].append(float(info["input_reuse"]))
    # "reference": reused and recomputed frames alternate, the error stays bounded
    assert reuse["reference"][1:] == [1.0, 0.0] * 3 + [1.0]
    assert 0 < max(errors["reference"]) <= bound
    # "previous": everything reused from frame 0 on, the error grows with the drift
    assert reuse["previous"][1:] == [1.0] * 7
    assert errors["previous"][-1] > 5 * max(errors["reference"])


@pytest.mark.parametrize(("matcher", "color"), [("diamond", "luma"), ("static", "rgb")])
def test_max_pixel_change_recomputes_a_small_change_inside_a_passing_block(matcher, color):
    """A 2x2 patch brightened by 0.3 inside a 10x10 block: the block's PSNR
    (24 dB) passes the 20 dB test, so plain DeepCache reuses the stale
    features there; with ``max_pixel_change`` below the change the patch is
    not reused and the output equals the model's on the new frame. A single
    pixel brightened alike in another block is dropped too, unless
    ``pixel_change_size`` is 2: then only squares of 2x2 changed pixels count;
    at 3 neither change does."""
    w = jax.random.normal(jax.random.key(3), (3, 3, 3, 4)) * 0.3

    def conv(variables, x):
        return jax.lax.conv_general_dilated(
            x, variables, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    first = 0.6 * _photo(SIZE, 4) + 0.1
    second = first.copy()
    second[13:15, 22:24] += 0.3  # the patch
    second[4, 4] += 0.3  # the single pixel
    want = conv(w, jnp.asarray(second)[None])
    errors, near_pixel, reuse = {}, {}, {}
    for cap, size in ((None, 1), (0.2, 1), (0.4, 1), (0.2, 2), (0.2, 3)):
        cfg = deepcache.Config(
            matcher=matcher, color=color, max_pixel_change=cap, pixel_change_size=size,
            refresh_every=None, data_range=1.0, kernel="xla",
        )  # fmt: skip
        cached = deepcache.transform(conv, w, frame_shape=(SIZE, SIZE, 3), config=cfg)
        state = cached.init()
        _, state, _ = cached.step(state, first)
        out, state, info = cached.step(state, second)
        err = jnp.abs(out - want)[0].max(-1)
        errors[cap, size] = float(err.max())
        near_pixel[cap, size] = float(err[3:6, 3:6].max())
        reuse[cap, size] = float(info["input_reuse"])
    assert reuse[None, 1] == 1.0 and errors[None, 1] > 0.05  # the stale changes
    assert near_pixel[None, 1] > 0.01
    assert reuse[0.4, 1] == 1.0 and errors[0.4, 1] == errors[None, 1]  # a cap above the change
    assert reuse[0.2, 1] == 1.0 - 5 / SIZE**2  # the five pixels, not their blocks
    assert errors[0.2, 1] <= 1e-5
    # squares of 2: the patch is recomputed, the single pixel reused (stale)
    assert reuse[0.2, 2] == 1.0 - 4 / SIZE**2
    assert near_pixel[0.2, 2] == near_pixel[None, 1] and errors[0.2, 2] == near_pixel[None, 1]
    # squares of 3: neither change is one
    assert reuse[0.2, 3] == 1.0 and errors[0.2, 3] == errors[None, 1]


@pytest.mark.parametrize(
    ("matcher", "color", "shape"),
    [
        ("diamond", "luma", (1, SIZE, SIZE)),
        ("exhaustive", "rgb", (3, SIZE, SIZE)),
        ("static", "luma", (1, SIZE, SIZE)),
        ("static", "rgb", (3, SIZE, SIZE)),
        ("histogram", "luma", (SIZE, SIZE, 3)),
        ("none", "luma", (0,)),
    ],
)
def test_the_key_is_kept_as_the_matchers_planes_or_as_the_frame(matcher, color, shape):
    """With a motion search or the same-position matcher the state keeps the key
    as `matching.planes` of the frames (converted once a frame); DeepMon's
    histograms keep the frame, and no matcher keeps nothing."""
    from dcjax import matching

    module, variables, ref = _model("plain")
    cfg = deepcache.Config(matcher=matcher, color=color, refresh_every=None)
    cached = _cached("plain", cfg)
    state = cached.init()
    assert state.prev_frame.shape == shape
    frames = [_photo(SIZE, 3), _photo(SIZE, 3)]
    frames[1][: SIZE // 2] = (frames[1][: SIZE // 2] + 0.5) % 1.0  # every top pixel by 0.5
    out, state, _ = cached.step(state, frames[0])  # the first frame: the key is that frame
    if matcher == "none":
        out, state, info = cached.step(state, frames[1])
        _close(out, ref(frames[1]))
        assert state.prev_frame.shape == (0,) and float(info["input_reuse"]) == 0.0
        return
    want = matching.planes(frames[0], color) if shape[0] != SIZE else frames[0]
    np.testing.assert_allclose(np.asarray(state.prev_frame), np.asarray(want), rtol=1e-6)
    out, state, info = cached.step(state, frames[1])
    _close(out, ref(frames[1]))
    if matcher != "histogram":  # blocks that changed take the new frame's values
        assert 0.0 < float(info["input_reuse"]) < 1.0
        key = np.asarray(state.prev_frame)
        new = np.asarray(matching.planes(frames[1], color) if shape[0] != SIZE else frames[1])
        top = (slice(None), slice(0, SIZE // 2)) if shape[0] != SIZE else (slice(0, SIZE // 2),)
        np.testing.assert_allclose(key[top], new[top], rtol=1e-6)


def test_layers_list_signatures_and_flops():
    module, variables, _ = _model("plain")
    cached = deepcache.transform(module, variables, frame_shape=(SIZE, SIZE, 3))
    assert [layer.name for layer in cached.layers] == ["PlainNet/Conv_0", "PlainNet/Conv_1"]
    l0, l1 = cached.layers
    assert l0.out_shape == (1, 16, 16, 8) and l0.signature.stride == (2, 2)
    assert l1.in_signature.stride == (4, 4) and l1.signature.stride == (4, 4)
    assert l0.flops == 2 * 16 * 16 * 8 * 5 * 5 * 3
    assert l1.flops == 2 * 8 * 8 * 8 * 3 * 3 * 8
    dense = 2 * 5 * (4 * 4 * 8)  # the Dense(5) head on the flattened 4x4x8 map
    assert cached.total_flops == l0.flops + l1.flops + dense
    assert cached.unsupported_primitives == ()


def test_uint8_frames_are_scaled_and_preprocess_is_applied():
    module, variables, ref = _model("resnet")
    f8 = (np.asarray(_photo(SIZE)) * 255).astype(np.uint8)
    cached = deepcache.transform(module, variables, frame_shape=(SIZE, SIZE, 3))
    out, _, _ = cached.step(cached.init(), f8)
    _close(out, ref(f8.astype(np.float32) / 255.0))
    pre = lambda f: (f.astype(jnp.float32) - 127.0) / 128.0
    cached = deepcache.transform(module, variables, frame_shape=(SIZE, SIZE, 3), preprocess=pre)
    out, _, _ = cached.step(cached.init(), f8)
    _close(out, ref((f8.astype(np.float32) - 127.0) / 128.0))


def test_refresh_every_and_min_match():
    module, variables, _ = _model("resnet")
    cfg = deepcache.Config(refresh_every=3, min_match=0.5)
    cached = deepcache.transform(module, variables, frame_shape=(SIZE, SIZE, 3), config=cfg)
    f = _photo(SIZE)
    state = cached.init()
    flags = []
    for _ in range(7):
        _, state, info = cached.step(state, f)
        flags.append(bool(info["refreshed"]))
    assert flags == [True, False, False, True, False, False, True]
    # a scene cut: nothing matches -> full recompute, counter restarts
    _, state, info = cached.step(state, 1.0 - f)
    assert bool(info["refreshed"]) and float(info["match_ratio"]) < 0.5
    _, state, info = cached.step(state, 1.0 - f)
    assert not bool(info["refreshed"])


def test_nonfinite_frame_is_computed_in_full_and_not_a_cache_key():
    module, variables, ref = _model("resnet")
    cached = deepcache.transform(
        module, variables, frame_shape=(SIZE, SIZE, 3), config=deepcache.Config(refresh_every=50)
    )
    f = _photo(SIZE)
    bad = f.copy()
    bad[3, 4, 1] = np.nan
    state = cached.init()
    _, state, _ = cached.step(state, f)
    out, state, info = cached.step(state, bad)
    assert bool(info["nonfinite"]) and bool(info["refreshed"])
    assert float(info["input_reuse"]) == 0.0
    assert np.isnan(np.asarray(out)).any() == np.isnan(np.asarray(ref(bad))).any()
    out, state, info = cached.step(state, f)
    assert bool(info["refreshed"]) and not bool(info["nonfinite"])
    _close(out, ref(f))
    _, state, info = cached.step(state, f)
    assert not bool(info["refreshed"]) and float(info["input_reuse"]) == 1.0


def test_step_compiles_once_for_a_stream_and_run_matches_step():
    module, variables, _ = _model("plain")
    cached = deepcache.transform(module, variables, frame_shape=(SIZE, SIZE, 3))
    base = _photo(SIZE)
    rng = np.random.default_rng(0)
    frames = np.stack(
        [np.clip(base + rng.normal(0, 0.02, base.shape), 0, 1) for _ in range(20)]
    ).astype(np.float32)
    state = cached.init()
    outs = []
    for f in frames:
        out, state, _ = cached.step(state, f)
        outs.append(out)
    assert cached.trace_count == 1
    run_outs, _, infos = cached.run(jnp.asarray(frames))
    assert infos["reuse_fraction"].shape == (20, len(cached.layers))
    np.testing.assert_allclose(np.asarray(run_outs), np.stack(outs), rtol=1e-5, atol=1e-5)


def test_vmap_over_streams_matches_single_streams():
    module, variables, _ = _model("resnet")
    cached = deepcache.transform(module, variables, frame_shape=(SIZE, SIZE, 3))
    frames = np.stack([_photo(SIZE, s) for s in range(2)])
    states = jax.vmap(lambda _: cached.init())(jnp.arange(2))
    step = jax.vmap(cached.step)
    outs, states, _ = step(states, jnp.asarray(frames))
    outs, states, info = step(states, jnp.asarray(frames))
    for i in range(2):
        single, _, _ = cached.step(cached.init(), frames[i])
        _close(outs[i], single)
    np.testing.assert_array_equal(np.asarray(info["input_reuse"]), 1.0)


def test_chains_under_vmap_match_single_streams():
    """Streams pooled into one dirty-tile list give each stream's own outputs."""
    cached = _cached("mobilenet", deepcache.Config(fuse_blocks=True))
    first = [_photo(SIZE, s) for s in range(2)]
    second = [f.copy() for f in first]
    second[0][4:12, 6:14] = 0.5  # a changed patch in each stream, at different places
    second[1][20:30, 2:9] = 0.9
    states = jax.vmap(lambda _: cached.init())(jnp.arange(2))
    step = jax.vmap(cached.step)
    for frames in (first, second):
        outs, states, info = step(states, jnp.asarray(np.stack(frames)))
    for i in range(2):
        state = cached.init()
        for frame in (first[i], second[i]):
            single, state, single_info = cached.step(state, frame)
        _close(outs[i], single)
        np.testing.assert_array_equal(info["reuse_fraction"][i], single_info["reuse_fraction"])
    if jax.default_backend() != "cpu":
        return
    assert cached.plan.chains
    tail = max(cached.plan.chains.values())[2]
    assert np.all((0 < info["reuse_fraction"][:, tail]) & (info["reuse_fraction"][:, tail] < 1))


def test_plain_function_models_and_nested_calls():
    """A hand-written JAX function with jit, remat and custom_vjp inside."""

    @jax.custom_vjp
    def act(x):
        return jnp.maximum(x, 0.0) * 1.5

    act.defvjp(lambda x: (act(x), x), lambda x, g: (g * (x > 0) * 1.5,))

    @jax.jit
    def block(w, x):
        y = jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return act(y)

    def fn(params, x):
        x = jax.checkpoint(block)(params["w1"], x)
        x = block(params["w2"], x)
        return x.sum(axis=-1)

    keys = jax.random.split(jax.random.key(0), 2)
    params = {
        "w1": jax.random.normal(keys[0], (3, 3, 3, 4)),
        "w2": jax.random.normal(keys[1], (3, 3, 4, 4)),
    }
    cached = deepcache.transform(fn, params, frame_shape=(SIZE, SIZE, 3))
    assert len(cached.layers) == 2
    prev = _photo(SIZE)
    cur, mask = _translate(prev, 3, -2)
    state = cached.init()
    _, state, _ = cached.step(state, prev)
    out, _, info = cached.step(
        state, cur, match=deepcache.Match(motion=jnp.array([3, -2]), mask=jnp.asarray(mask))
    )
    _close(out, fn(params, jnp.asarray(cur)[None]))
    assert float(info["reuse_fraction"][1]) > 0.5


def test_unknown_primitive_is_reported_once_and_not_reused():
    perm = jnp.asarray(np.random.default_rng(0).permutation(SIZE))
    conv = lambda x, w: jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )

    def fn(w, x):
        y = conv(x, w)
        y = jnp.take(y, perm, axis=2)  # an arbitrary permutation: no rule covers it
        y = jnp.take(y, perm, axis=1)  # the same primitive again: reported once
        return conv(y, w)

    w = jax.random.normal(jax.random.key(0), (3, 3, 4, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cached = deepcache.transform(fn, w, frame_shape=(SIZE, SIZE, 4))
    messages = [str(c.message) for c in caught if "no reuse rule" in str(c.message)]
    assert len(messages) == 1 and "gather" in messages[0]
    assert cached.unsupported_primitives == ("gather",)
    f = np.random.default_rng(0).uniform(size=(SIZE, SIZE, 4)).astype(np.float32)
    state = cached.init()
    _, state, _ = cached.step(state, f)
    out, _, info = cached.step(state, f)
    _close(out, fn(w, jnp.asarray(f)[None]))
    np.testing.assert_array_equal(np.asarray(info["reuse_fraction"]), [1.0, 0.0])


def test_cumulative_op_over_space_reuses_only_whole_unchanged_maps():
    conv = lambda x, w: jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )

    def fn(w, x):
        y = jax.lax.cumsum(conv(x, w), axis=1)  # mixes H: no longer spatial
        return conv(y, w)

    w = jax.random.normal(jax.random.key(0), (3, 3, 4, 4))
    cfg = deepcache.Config(skip_unchanged=False)  # the network runs on the repeated frame
    cached = deepcache.transform(fn, w, frame_shape=(SIZE, SIZE, 4), config=cfg)
    assert len(cached.layers) == 1  # the second conv has no spatial signature
    f = np.random.default_rng(0).uniform(size=(SIZE, SIZE, 4)).astype(np.float32)
    state = cached.init()
    _, state, _ = cached.step(state, f)
    out, _, info = cached.step(state, f)
    _close(out, fn(w, jnp.asarray(f)[None]))
    assert 0.0 < float(info["flops_ratio"]) < 1.0  # the second conv is always computed


# -- errors ------------------------------------------------------------------


def test_untraceable_model():
    def broken(params, x):
        return x.reshape(7, -1)  # not a valid reshape of (1, 32, 32, 3)

    with pytest.raises(ValueError, match="could not be traced"):
        deepcache.transform(broken, {}, frame_shape=(SIZE, SIZE, 3))

    def returns_text(params, x):
        return "logits"

    with pytest.raises(ValueError, match="could not be traced|no arrays"):
        deepcache.transform(returns_text, {}, frame_shape=(SIZE, SIZE, 3))


def test_bad_model_and_frame_shape():
    with pytest.raises(TypeError, match="model must be a flax.linen.Module or a callable"):
        deepcache.transform(42, {}, frame_shape=(SIZE, SIZE, 3))
    with pytest.raises(ValueError, match="frame_shape must be"):
        deepcache.transform(lambda p, x: x, {}, frame_shape=(SIZE, SIZE))


def test_flax_module_with_batchnorm_conv_bias_is_reused():
    class Tiny(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.BatchNorm(use_running_average=True)(nn.Conv(2, (3, 3))(x))

    module = Tiny()
    variables = module.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)))
    cached = deepcache.transform(module, variables, frame_shape=(8, 8, 3))
    assert len(cached.layers) == 1 and cached.layers[0].out_shape == (1, 8, 8, 2)


@pytest.mark.parametrize("kernel", ["reference", "dense", "xla", "rows", "pallas", "auto"])
@pytest.mark.parametrize("name", ["resnet", "inception"])
def test_invariants_hold_with_every_kernel(name, kernel):
    """Refresh, identical frame and exact translation, through each sparse kernel."""
    module, variables, ref = _model(name)
    cached = _cached(name, deepcache.Config(kernel=kernel, refresh_every=100))
    s = module.total_stride
    prev = _photo(SIZE, 7)
    cur, mask = _translate(prev, 2 * s, -s)
    # Every step is given its match: one program per kernel (the matcher's own
    # verdicts are tested with it, and end to end in the tests above).
    still = deepcache.Match(motion=jnp.zeros((2,), jnp.int32), mask=jnp.ones((SIZE, SIZE), bool))
    state = cached.init()
    out, state, _ = cached.step(state, prev, match=still)  # the first frame: a refresh
    _close(out, ref(prev))
    out, state, info = cached.step(state, prev, match=still)
    _close(out, ref(prev))
    np.testing.assert_array_equal(np.asarray(info["reuse_fraction"]), 1.0)
    match = deepcache.Match(motion=jnp.array([2 * s, -s]), mask=jnp.asarray(mask))
    out, state, info = cached.step(state, cur, match=match)
    _close(out, ref(cur))
    assert float(np.asarray(info["reuse_fraction"]).max()) > 0.3


def test_inverted_residual_chains_are_computed_as_one():
    """With fuse_blocks on CPU the block's three layers run on dirty tiles
    together (`dcjax.kernels.chain`), caching the projection only; a refresh, an
    identical frame and an exact translation give the model's output."""
    module, variables, ref = _model("mobilenet")
    cached = _cached("mobilenet", deepcache.Config(fuse_blocks=True, refresh_every=100))
    per_layer = _cached("mobilenet", deepcache.Config(kernel="xla", refresh_every=100))
    assert not _cached("mobilenet", deepcache.Config()).plan.chains  # off by default
    for bad in (dict(kernel="xla"), dict(fuse_epilogues=False),
                dict(refine=deepcache.RefineConfig())):  # fmt: skip
        with pytest.raises(ValueError, match="fuse_blocks"):
            deepcache.Config(fuse_blocks=True, **bad)
    names = [layer.name for layer in cached.layers]
    if jax.default_backend() != "cpu":
        assert not cached.plan.chains
        return
    chain = tuple(i for i, n in enumerate(names) if "InvertedResidual" in n)
    assert len(chain) == 3 and {cached.plan.chains[i] for i in chain} == {chain}
    assert [cached.keeps_cache[i] for i in chain] == [False, False, True]
    assert [cached.sparse[i] for i in chain] == [True, True, True]
    assert all(cached.epilogues[i] for i in chain)  # each layer with its epilogue
    assert not per_layer.plan.chains and all(per_layer.keeps_cache)
    state = cached.init()
    assert [c is None for c in state.caches] == [not k for k in cached.keeps_cache]
    s = module.total_stride
    prev = _photo(SIZE, 5)
    cur, mask = _translate(prev, -s, 2 * s)
    still = deepcache.Match(motion=jnp.zeros((2,), jnp.int32), mask=jnp.ones((SIZE, SIZE), bool))
    moved = deepcache.Match(motion=jnp.array([-s, 2 * s]), mask=jnp.asarray(mask))
    states = [cached.init(), per_layer.init()]
    for frame, match in ((prev, still), (prev, still), (cur, moved)):
        outs, infos = [], []
        for k, c in enumerate((cached, per_layer)):
            out, states[k], info = c.step(states[k], frame, match=match)
            _close(out, ref(frame))
            outs.append(out)
            infos.append(info)
        _close(outs[0], outs[1])
        # the chain's layers report their own masks, as computed layer by layer
        np.testing.assert_array_equal(infos[0]["reuse_fraction"], infos[1]["reuse_fraction"])
    fractions = np.asarray(infos[0]["reuse_fraction"])
    assert 0.3 < fractions[chain[2]] < 1.0, fractions


def test_layers_computed_densely_keep_no_cache():
    """kernel="dense" (and small layers under "auto" on CPU) carry no cache, same outputs."""
    from dcjax.kernels import auto

    module, variables, ref = _model("resnet")
    dense = _cached("resnet", deepcache.Config(kernel="dense"))
    sparse = _cached("resnet", deepcache.Config(kernel="xla"))
    state_d, state_s = dense.init(), sparse.init()
    assert all(c is None for c in state_d.caches)
    assert [c.shape for c in state_s.caches] == [lay.out_shape[1:] for lay in sparse.layers]
    frames = [_photo(SIZE, 7), _photo(SIZE, 7), _photo(SIZE, 8)]
    for f in frames:
        out_d, state_d, info_d = dense.step(state_d, f)
        out_s, state_s, info_s = sparse.step(state_s, f)
        _close(out_d, ref(f))
        _close(out_s, ref(f))
        # the reuse masks (and so the reported savings) do not depend on the kernel
        np.testing.assert_array_equal(info_d["reuse_fraction"], info_s["reuse_fraction"])
    assert all(c is None for c in state_d.caches)
    # which layers skip work, as the harness reports it (then the fully connected ones)
    assert dense.keeps_cache == (False,) * len(dense.layers)
    assert sparse.keeps_cache == (True,) * len(sparse.layers)
    assert sparse.sparse == (True,) * len(sparse.layers) + (False,) * len(sparse.dense_layers)
    if jax.default_backend() == "cpu":  # the test models' layers are all under the threshold
        small = _cached("resnet", deepcache.Config(kernel="auto"))
        assert all(lay.flops < auto.SMALL_LAYER_FLOPS for lay in small.layers)
        assert all(c is None for c in small.init().caches)
        assert not any(small.sparse)


def test_a_transposed_conv_is_computed_in_full_and_keeps_no_cache():
    """No sparse kernel computes a transposed convolution: the step computes it
    from the current input, as the model does, and keeps no cache for it
    (selecting one would put back values of earlier frames). Only the oracle,
    ``kernel="reference"``, selects its cache."""
    dn = ("NHWC", "HWIO", "NHWC")

    def model(p, x):
        y = jax.lax.conv_general_dilated(x, p["w1"], (2, 2), "SAME", dimension_numbers=dn)
        return jax.lax.conv_transpose(jax.nn.relu(y), p["w2"], (2, 2), "SAME", dimension_numbers=dn)

    k1, k2 = jax.random.split(jax.random.key(5))
    params = {
        "w1": jax.random.normal(k1, (3, 3, 3, 8)) * 0.5,
        "w2": jax.random.normal(k2, (3, 3, 8, 4)) * 0.5,
    }

    def make(kernel):
        cfg = deepcache.Config(
            kernel=kernel, psnr_threshold=20.0, matcher="static", skip_unchanged=False
        )
        return deepcache.transform(model, params, frame_shape=(SIZE, SIZE, 3), config=cfg)

    ref = jax.jit(lambda f: model(params, f[None]))
    # the second frame differs from the first by a little everywhere: every
    # block passes the PSNR test, so both layers' masks say reusable (and the
    # network runs: not skipped as a still frame)
    first = _photo(SIZE, 9)
    noise = np.random.default_rng(0).uniform(-0.02, 0.02, first.shape).astype(np.float32)
    second = np.clip(first + noise, 0.0, 1.0)
    dense, oracle = make("dense"), make("reference")
    assert dense.keeps_cache == (False, False) and oracle.keeps_cache == (True, True)
    sd, so = dense.init(), oracle.init()
    assert all(c is None for c in sd.caches)
    for f in (first, second):
        out_d, sd, info = dense.step(sd, f)
        out_o, so, _ = oracle.step(so, f)
    # the step computed every layer from the second frame
    assert float(np.asarray(info["reuse_fraction"]).min()) == 1.0
    _close(out_d, ref(second))
    # the oracle's select put back the first frame's outputs
    _close(out_o, ref(first))
    assert np.abs(np.asarray(out_o) - np.asarray(ref(second))).max() > 1e-3
    for kernel in ("xla", "auto"):
        assert make(kernel).keeps_cache[1] is False


def test_epilogues_are_cached_with_their_layers():
    """Batch norm and ReLU are cached with the conv: same outputs, fewer passes."""

    class ConvBNReLU(nn.Module):
        @nn.compact
        def __call__(self, x):
            y = nn.relu(nn.BatchNorm(use_running_average=True)(nn.Conv(4, (3, 3))(x)))
            z = nn.leaky_relu(nn.Conv(4, (3, 3))(y) + y)  # a residual, a two-read activation
            return nn.Conv(3, (3, 3))(z)

    module = ConvBNReLU()
    variables = module.init(jax.random.key(0), jnp.zeros((1, SIZE, SIZE, 3)))
    stats = variables["batch_stats"]["BatchNorm_0"]
    variables = {  # statistics that make the batch norm do something
        **variables,
        "batch_stats": {"BatchNorm_0": {"mean": stats["mean"] + 0.3, "var": stats["var"] * 2.0}},
    }
    ref = jax.jit(lambda f: module.apply(variables, f[None]))

    def make(fuse):
        cfg = deepcache.Config(kernel="xla", fuse_epilogues=fuse, psnr_threshold=25.0)
        return deepcache.transform(module, variables, frame_shape=(SIZE, SIZE, 3), config=cfg)

    fused, plain = make(True), make(False)
    assert fused.epilogues[0][-1] == "custom_jvp_call" and "mul" in fused.epilogues[0]
    assert fused.epilogues[1:] == (("add", "add", "jit"), ("add",))  # biases, residual
    assert plain.epilogues == ((), (), ())
    frames = [_photo(SIZE, 3)] * 2
    moved = frames[-1].copy()
    moved[10:18, 4:14] = 1.0 - moved[10:18, 4:14]  # an object appears
    frames.append(moved)
    sf, sp = fused.init(), plain.init()
    for t, f in enumerate(frames):
        of, sf, inf = fused.step(sf, f)
        op, sp, inp = plain.step(sp, f)
        _close(of, ref(f))
        _close(of, op)
        np.testing.assert_array_equal(inf["reuse_fraction"], inp["reuse_fraction"])
        if t == 0:  # the refresh computed every pixel: the caches hold each layer's value
            conv = np.asarray(sp.caches[0])
            _close(sf.caches[0], ref_hidden := np.asarray(jax.nn.relu(_bn(variables, conv))))
            assert not np.allclose(ref_hidden, conv, atol=1e-3)
    assert 0.0 < float(inf["reuse_fraction"][0]) < 1.0


def _bn(variables, y):
    bn = variables["batch_stats"]["BatchNorm_0"]
    p = variables["params"]["BatchNorm_0"]
    return (y - bn["mean"]) / jnp.sqrt(bn["var"] + 1e-5) * p["scale"] + p["bias"]


def test_epilogues_inside_calls_and_around_transposed_convs():
    """Layers inside jit calls are fused there; a transposed conv keeps its chain."""
    dn = ("NHWC", "HWIO", "NHWC")

    @jax.jit
    def block(w, b, x):
        return jax.nn.relu(
            jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn) + b
        )

    def model(p, x):
        y = block(p["w2"], p["b"], block(p["w1"], p["b"], x))
        up = jax.lax.conv_transpose(y, p["w3"], (2, 2), "SAME", dimension_numbers=dn)
        return jax.nn.relu(up + 0.1)

    keys = jax.random.split(jax.random.key(3), 4)
    params = {
        "w1": jax.random.normal(keys[0], (3, 3, 3, 4)) * 0.5,
        "w2": jax.random.normal(keys[1], (3, 3, 4, 4)) * 0.5,
        "w3": jax.random.normal(keys[2], (3, 3, 4, 2)) * 0.5,
        "b": jax.random.normal(keys[3], (4,)) * 0.1,
    }

    def make(fuse):
        cfg = deepcache.Config(kernel="xla", fuse_epilogues=fuse, psnr_threshold=25.0)
        return deepcache.transform(model, params, frame_shape=(SIZE, SIZE, 3), config=cfg)

    fused, plain = make(True), make(False)
    assert fused.epilogues == (("add", "custom_jvp_call"),) * 2 + ((),)
    ref = jax.jit(lambda f: model(params, f[None]))
    moved = _photo(SIZE, 5).copy()
    moved[4:12, 20:30] = 0.0
    sf, sp = fused.init(), plain.init()
    for f in [_photo(SIZE, 5), _photo(SIZE, 5), moved]:
        of, sf, _ = fused.step(sf, f)
        op, sp, _ = plain.step(sp, f)
        _close(of, ref(f))
        _close(of, op)
    # the fused caches hold ReLU outputs, the plain ones the convolutions'
    assert float(np.asarray(sf.caches[0]).min()) >= 0.0 > float(np.asarray(sp.caches[0]).min())


@pytest.mark.parametrize("kernel", ["xla", "auto"])
def test_skip_unchanged_returns_what_the_full_step_computes(kernel):
    """A still frame skips the network: the output and caches of the full step, bit for bit
    where every layer keeps a cache (``xla``); the last output under ``auto``."""
    module, variables, _ = _model("resnet")
    full = deepcache.transform(
        module, variables, frame_shape=(SIZE, SIZE, 3),
        config=deepcache.Config(kernel=kernel, skip_unchanged=False),
    )  # fmt: skip
    skipping = deepcache.transform(
        module, variables, frame_shape=(SIZE, SIZE, 3), config=deepcache.Config(kernel=kernel)
    )  # skip_unchanged is the default
    a = _photo(SIZE, 0)
    b, _ = _translate(a, 0, 0)  # the same scene
    b[4:12, 4:12] = _photo(SIZE, 3)[4:12, 4:12]  # a moving object
    frames = [a, a, a, b, b, a]
    sf, ss = full.init(), skipping.init()
    skipped, prev = [], None
    for f in frames:
        of, sf, inf = full.step(sf, f)
        os_, ss, ins = skipping.step(ss, f)
        skipped.append(bool(ins["skipped"]))
        assert not bool(inf["skipped"])
        if kernel == "xla" or not skipped[-1]:
            np.testing.assert_array_equal(np.asarray(os_), np.asarray(of))
        else:
            np.testing.assert_array_equal(np.asarray(os_), np.asarray(prev))
            _close(os_, of)
        prev = os_
        if skipped[-1]:
            assert float(ins["flops_ratio"]) == 0.0
            np.testing.assert_array_equal(np.asarray(ins["reuse_fraction"]), 1.0)
        if kernel == "xla":
            for cf, cs in zip(sf.caches, ss.caches, strict=True):
                np.testing.assert_array_equal(np.asarray(cs), np.asarray(cf))
    # first frame refreshes; a repeat is still; the object's arrival is not
    assert skipped == [False, True, True, False, True, False]


def test_skip_unchanged_under_vmap_matches_single_streams():
    """One still stream and one changing stream: the batched step runs the network for both
    and gives each stream what it gives alone."""
    module, variables, _ = _model("resnet")
    cfg = deepcache.Config(kernel="xla", skip_unchanged=True)
    cached = deepcache.transform(module, variables, frame_shape=(SIZE, SIZE, 3), config=cfg)
    a, c = _photo(SIZE, 0), _photo(SIZE, 5)
    streams = [[a, a, a], [a, a, c]]
    states = jax.vmap(lambda _: cached.init())(jnp.arange(2))
    step = jax.vmap(cached.step)
    for t in range(3):
        outs, states, info = step(states, jnp.asarray(np.stack([s[t] for s in streams])))
    assert list(np.asarray(info["skipped"])) == [True, False]
    for i, frames in enumerate(streams):
        st = cached.init()
        for f in frames:
            single, st, _ = cached.step(st, f)
        np.testing.assert_array_equal(np.asarray(outs[i]), np.asarray(single))


def test_skip_unchanged_and_dense_updates_are_bools():
    with pytest.raises(ValueError, match="skip_unchanged"):
        deepcache.Config(skip_unchanged=1)
    with pytest.raises(ValueError, match="dense_updates"):
        deepcache.Config(dense_updates="yes")


@pytest.mark.parametrize("name", ["resnet50", "yolo_tiny", "efficientnet_lite0"])
def test_step_lowers_for_gpu_with_pallas_kernels_and_epilogues(name, monkeypatch):
    """Under ``kernel="pallas"`` on a GPU every cached layer is a Triton kernel with
    its epilogue (residual adds, leaky ReLU, ReLU6) inside, and the one loop of the
    step with a data-dependent trip count is the still-frame skip (each test
    stalls the stream: a whole network pays for it, smaller work does not).

    Lowering for CUDA needs no GPU: the GPU's choices are made by tracing with
    the default backend reported as ``"gpu"``.
    """
    from dcjax import models

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    shape = (64, 64, 3)
    module, variables = models.create(name, input_size=shape[:2], width=0.25)
    config = deepcache.Config(kernel="pallas")
    cached = deepcache.transform(module, variables, frame_shape=shape, config=config)
    assert all(cached.epilogues)
    frame = jax.ShapeDtypeStruct(shape, jnp.uint8)

    def lowered(cached):
        traced = jax.jit(cached.step).trace(cached.init(), frame)
        return traced.lower(lowering_platforms=("cuda",)).as_text()

    text = lowered(cached)
    assert text.count("xla.gpu.triton") == len(cached.layers)
    assert text.count("stablehlo.while") == 2  # the diamond search's static steps, the skip
    config = deepcache.Config(kernel="pallas", skip_unchanged=False)
    text = lowered(deepcache.transform(module, variables, frame_shape=shape, config=config))
    assert text.count("stablehlo.while") == 1
    # "auto" computes these small layers densely on GPU: no kernel, no cache
    auto = deepcache.transform(module, variables, frame_shape=shape)
    assert lowered(auto).count("xla.gpu.triton") == 0
    assert all(c is None for c in auto.init().caches)


def test_auto_on_gpu_runs_the_dense_network_and_skips_still_frames(monkeypatch):
    """On GPU ``kernel="auto"`` computes small layers densely and keeps no cache for
    them: a moving frame's output is the model's own, and a still frame returns the
    last output without running the network. Run on CPU with the GPU's choices (the
    default backend reported as ``"gpu"``: no data-dependent loops but the skip's)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    module, variables, ref = _model("resnet")
    cached = deepcache.transform(module, variables, frame_shape=(SIZE, SIZE, 3))
    state = cached.init()
    assert cached.layers and all(c is None for c in state.caches)
    a = _photo(SIZE, 0)
    b, _ = _translate(a, 2, 1)
    outs, skipped = [], []
    for f in (a, b, b):
        out, state, info = cached.step(state, f)
        outs.append(np.asarray(out))
        skipped.append(bool(info["skipped"]))
    assert skipped == [False, False, True]
    _close(outs[0], ref(a))
    _close(outs[1], ref(b))
    np.testing.assert_array_equal(outs[2], outs[1])


def test_convolutions_with_an_explicit_precision_are_reused_at_that_precision():
    """A model traced under ``jax.default_matmul_precision("highest")`` carries the
    precision in its convolutions: they still go through the sparse kernels (and
    fuse their epilogues), whose own products keep that precision."""
    dn = ("NHWC", "HWIO", "NHWC")
    keys = jax.random.split(jax.random.key(4), 2)
    params = {  # 40 filters: a convolution on CPU (not `taps_pays`' sum of taps)
        "w1": jax.random.normal(keys[0], (3, 3, 3, 40)),
        "w2": jax.random.normal(keys[1], (3, 3, 40, 4)),
    }

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn)

    def model(p, x):
        with jax.default_matmul_precision("highest"):
            return conv(jax.nn.relu(conv(x, p["w1"])), p["w2"])

    cached = deepcache.transform(
        model, params, frame_shape=(SIZE, SIZE, 3), config=deepcache.Config(kernel="xla")
    )
    assert cached.epilogues[0] == ("custom_jvp_call",)
    state, frame = cached.init(), _photo(SIZE, 2)
    traced = jax.make_jaxpr(lambda s, f: cached.step(s, f))(state, frame)
    convs = [e for e in all_eqns(traced.jaxpr) if e.primitive.name == "conv_general_dilated"]
    # each layer's tile convolution per halving step and its dense fallback (not one
    # dense call and a select)
    plans = [
        plan(
            layer.in_shape,
            (*layer.kernel, layer.in_channels // layer.groups, layer.out_channels),
            ConvGeometry(
                strides=layer.strides,
                padding=layer.padding,
                dilation=layer.dilation,
                groups=layer.groups,
            ),
        )
        for layer in cached.layers
    ]
    assert len(plans) == 2
    assert len(convs) == sum(len(p.sizes) + 1 for p in plans)
    assert all(e.params["precision"] == (jax.lax.Precision.HIGHEST,) * 2 for e in convs)
    ref = jax.jit(lambda f: model(params, f[None]))
    for f in (frame, frame):
        out, state, _ = cached.step(state, f)
        _close(out, ref(f))


def test_reuse_fractions_of_masks_grouped_by_shape_keep_layer_order():
    """Per-layer fractions are reduced one map size at a time, then put back in
    layer order; static masks (Python bools) count as all or nothing."""
    rng = np.random.default_rng(0)
    masks = [
        rng.random((6, 5)) < 0.3,
        rng.random((3, 4)) < 0.5,
        True,
        rng.random((6, 5)) < 0.8,
        jnp.asarray(rng.random((3, 4)) < 0.1),
        False,
        rng.random((6, 5)) < 0.0,
    ]
    got = np.asarray(mean_of_masks([m if isinstance(m, bool) else jnp.asarray(m) for m in masks]))
    want = [float(np.mean(m)) for m in masks]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
    assert got.dtype == np.float32 and got.shape == (7,)
    assert mean_of_masks([]).shape == (0,)


@pytest.mark.parametrize("kernel", ["xla", "auto"])
def test_without_statistics_the_step_computes_the_same_and_reports_nan(kernel):
    """`Config.statistics=False` changes what the step reports, not what it computes:
    the same outputs and caches frame by frame, NaN reuse fractions and FLOP
    ratios on frames that ran, the true ones on still frames (nothing computed)."""
    module, variables, _ = _model("resnet")
    make = functools.partial(deepcache.transform, module, variables, frame_shape=(SIZE, SIZE, 3))
    with_stats = make(config=deepcache.Config(kernel=kernel))
    without = make(config=deepcache.Config(kernel=kernel, statistics=False))
    a = _photo(SIZE, 0)
    b, _ = _translate(a, 0, 0)
    b[4:12, 4:12] = _photo(SIZE, 3)[4:12, 4:12]
    c, _ = _translate(b, 2, 0)
    sw, so = with_stats.init(), without.init()
    for f in [a, b, b, c, a]:
        ow, sw, iw = with_stats.step(sw, f)
        oo, so, io = without.step(so, f)
        _close(oo, ow, 1e-6)
        for cw, co in zip(sw.caches, so.caches, strict=True):
            assert (cw is None) == (co is None)  # a layer computed in full keeps none
            if cw is not None:
                _close(co, cw, 1e-6)
        for key in ("match_ratio", "refreshed", "skipped", "dense_reuse", "input_reuse"):
            np.testing.assert_array_equal(np.asarray(io[key]), np.asarray(iw[key]))
        if bool(io["skipped"]):
            assert float(io["flops_ratio"]) == 0.0
            np.testing.assert_array_equal(np.asarray(io["reuse_fraction"]), 1.0)
        else:
            assert np.isnan(float(io["flops_ratio"]))
            assert np.isnan(np.asarray(io["reuse_fraction"])).all()
            assert 0.0 < float(iw["flops_ratio"]) <= 1.0
