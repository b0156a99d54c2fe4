"""masked_conv's dispatch, errors, auto choice and the tile plan helpers."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from dcjax.bench.kernels import LAYERS, blocky_mask
from dcjax.kernels import (
    IMPLS,
    ConvGeometry,
    Epilogue,
    choose_impl,
    conv,
    default_tile,
    dirty_fraction,
    masked_conv,
    plan,
    reference_masked_conv,
)


def _problem(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(1, 20, 20, 3)).astype(np.float32)
    w = rng.normal(size=(3, 3, 3, 5)).astype(np.float32)
    cached = rng.normal(size=(1, 20, 20, 5)).astype(np.float32)
    mask = rng.random((1, 20, 20)) > 0.3
    return x, w, mask, cached, ConvGeometry(strides=(1, 1), padding="SAME")


def test_auto_is_default_and_correct() -> None:
    x, w, mask, cached, geom = _problem()
    out = np.asarray(masked_conv(x, w, mask, cached, geom))
    ref = np.asarray(reference_masked_conv(x, w, mask, cached, geom))
    np.testing.assert_allclose(out[~mask], ref[~mask], rtol=1e-4, atol=1e-4)


def test_auto_table_choices_are_valid() -> None:
    for name, (h, w_, cin, cout, k, s, g, pad, _) in LAYERS.items():
        p = plan(
            (1, h, w_, cin),
            (k, k, cin // g, cout),
            ConvGeometry(strides=(s, s), padding=pad, groups=g),
        )
        for backend in ("cpu", "gpu", "tpu"):
            impl, tile = choose_impl(p, backend)
            assert impl in IMPLS and impl not in ("auto", "pallas"), (name, backend, impl)
            assert tile is None or (len(tile) == 2 and min(tile) >= 1)


def test_unknown_impl_and_bad_shapes_raise() -> None:
    x, w, mask, cached, geom = _problem()
    with pytest.raises(ValueError, match="impl must be one of"):
        masked_conv(x, w, mask, cached, geom, impl="cuda")
    with pytest.raises(ValueError, match="reuse_mask has shape"):
        masked_conv(x, w, mask[:, :10], cached, geom)
    with pytest.raises(ValueError, match="cached has shape"):
        masked_conv(x, w, mask, cached[..., :2], geom)
    with pytest.raises(ValueError, match="groups"):
        masked_conv(x, w, mask, cached, dataclasses.replace(geom, groups=2))
    if jax.default_backend() == "cpu":
        for impl in ("pallas", "pallas_gpu", "pallas_tpu"):
            with pytest.raises(ValueError, match="interpret=True"):
                masked_conv(x, w, mask, cached, geom, impl=impl)


@pytest.mark.parametrize("impl", ["reference", "dense", "xla", "rows", "auto"])
def test_every_impl_honours_the_contract_under_jit(impl: str) -> None:
    x, w, mask, cached, geom = _problem(seed=2)
    out = np.asarray(jax.jit(lambda *a: masked_conv(*a, geom, impl=impl))(x, w, mask, cached))
    ref = np.asarray(reference_masked_conv(x, w, mask, cached, geom))
    np.testing.assert_allclose(out[~mask], ref[~mask], rtol=1e-4, atol=1e-4)
    fresh = np.asarray(conv(x, w, geom))
    is_fresh = np.isclose(out, fresh, rtol=1e-4, atol=1e-4).all(-1)
    is_cached = (out == cached).all(-1)
    # where reusable, each pixel is the cache or the fresh value, nothing else
    assert (is_fresh | is_cached)[mask].all()


@pytest.mark.parametrize(
    ("side", "tile"), [(1, 1), (3, 3), (27, 4), (55, 4), (56, 4), (112, 8), (224, 16)]
)
def test_default_tile_rule(side: int, tile: int) -> None:
    assert default_tile(side, side) == (tile, tile)
    t = default_tile(side, side)[0]
    assert 1 <= t <= 16 and (t >= 4 or t == side)


@pytest.mark.parametrize(
    ("k", "s", "d", "pad"),
    [(11, 4, 1, "VALID"), (5, 1, 1, ((2, 2), (2, 2))), (3, 2, 2, "SAME"), (1, 3, 1, "VALID")],
)
def test_plan_geometry_matches_conv(k: int, s: int, d: int, pad) -> None:
    x = jax.ShapeDtypeStruct((2, 31, 29, 4), np.float32)
    w = jax.ShapeDtypeStruct((k, k, 4, 8), np.float32)
    p = plan(x.shape, w.shape, ConvGeometry(strides=(s, s), padding=pad, dilation=(d, d)))
    out = jax.eval_shape(
        lambda x, w: conv(x, w, ConvGeometry(strides=(s, s), padding=pad, dilation=(d, d))), x, w
    )
    assert out.shape == (2, p.ho, p.wo, 8)
    assert p.win_h == (p.th - 1) * s + (k - 1) * d + 1
    assert p.num_tiles == 2 * p.nty * p.ntx
    assert p.sizes[-1] == p.chunk and p.capacity >= p.dense_threshold
    assert all(a == 2 * b for a, b in zip(p.sizes, p.sizes[1:], strict=False))


def test_dirty_fraction_counts_tiles() -> None:
    mask = np.ones((2, 8, 8), bool)
    assert float(dirty_fraction(mask, tile=(4, 4))) == 0.0
    mask[0, 0, 0] = False  # one tile of 8
    mask[1, 7, 7] = False  # one more
    assert float(dirty_fraction(mask, (2, 8, 8, 3), tile=(4, 4))) == pytest.approx(2 / 8)
    assert float(dirty_fraction(mask, tile=(8, 8))) == pytest.approx(2 / 2)
    with pytest.raises(ValueError, match="does not match"):
        dirty_fraction(mask, (2, 9, 8, 3))


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 0.5, 1.0])
def test_blocky_mask_is_one_blob_of_the_requested_size(fraction: float) -> None:
    m = blocky_mask((55, 55), fraction, 3, seed=1)
    assert m.shape == (55, 55)
    assert abs((~m).mean() - fraction) < 0.06
    if 0 < fraction < 1:
        ndimage = pytest.importorskip("scipy.ndimage")

        _, count = ndimage.label(~m)
        assert count == 1


def test_auto_row_steps_are_longer_for_blob_masks() -> None:
    from dcjax.kernels import auto, rows

    big = plan((1, 56, 56, 64), (3, 3, 64, 64), ConvGeometry(strides=(1, 1), padding="SAME"))
    assert auto.row_chunk(big) == auto.BLOB_ROW_CHUNK == 64
    assert auto.row_chunk(big, scattered=True) is None  # refinement: the row kernel's own 16
    assert rows.row_plan(big, chunk=auto.row_chunk(big)).sizes[-1] == 64
    # a 7x7 map's dense threshold is 29 pixels: capped there, one step of 32 rows
    small_map = plan((1, 7, 7, 512), (3, 3, 512, 512), ConvGeometry(strides=(1, 1), padding="SAME"))
    assert auto.row_chunk(small_map) == 32
    assert rows.row_plan(small_map, chunk=32).sizes == (32,)
    assert rows.row_plan(small_map).sizes == (32, 16)  # the row kernel's own rule


@pytest.mark.parametrize("fraction", [0.02, 0.2, 0.45])
def test_auto_rows_with_long_steps_match_the_oracle(fraction: float) -> None:
    # a layer auto gives the row kernel (above the small-layer cut), with blob masks
    # whose dirty counts take one, two and three of the 64-row-based steps
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1, 28, 28, 64)).astype(np.float32)
    w = rng.normal(size=(3, 3, 64, 64)).astype(np.float32) / 24
    cached = rng.normal(size=(1, 28, 28, 64)).astype(np.float32)
    geom = ConvGeometry(strides=(1, 1), padding="SAME")
    assert choose_impl(plan(x.shape, w.shape, geom), "cpu")[0] == "rows"
    mask = blocky_mask((28, 28), fraction, block=2, seed=1)[None]
    out = np.asarray(masked_conv(x, w, mask, cached, geom, impl="auto"))
    ref = np.asarray(reference_masked_conv(x, w, mask, cached, geom))
    np.testing.assert_allclose(out[~mask], ref[~mask], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out[mask], cached[mask])  # reusable pixels kept bit for bit


def test_auto_runs_small_layers_dense_on_cpu() -> None:
    from dcjax.kernels import auto

    small = plan((1, 14, 14, 32), (3, 3, 32, 32), ConvGeometry(strides=(1, 1), padding="SAME"))
    big = plan((1, 56, 56, 64), (3, 3, 64, 64), ConvGeometry(strides=(1, 1), padding="SAME"))
    assert auto.dense_flops(small) < auto.SMALL_LAYER_FLOPS < auto.dense_flops(big)
    assert auto.choose(small, "cpu") == ("dense", None)
    assert auto.choose(big, "cpu")[0] == "rows"  # 64 channels: per-tap row gathers pay
    rgb = plan((1, 227, 227, 3), (11, 11, 3, 96), ConvGeometry(strides=(4, 4), padding="VALID"))
    # 3 channels: the tile kernel, whose dirty tiles recompute some reusable pixels
    assert auto.choose(rgb, "cpu")[0] == "xla"
    assert auto.choose(rgb, "cpu", scattered=True)[0] == "rows"
    # ...except a stem computed as a sum of taps (YOLO-tiny's), even when scattered
    yolo_stem = plan((1, 448, 448, 3), (3, 3, 3, 16), ConvGeometry(strides=(1, 1), padding="SAME"))
    assert auto.choose(yolo_stem, "cpu") == auto.choose(yolo_stem, "cpu", scattered=True)
    assert auto.choose(yolo_stem, "cpu", scattered=True)[0] == "xla"
    pointwise = plan(
        (1, 56, 56, 256), (1, 1, 256, 64), ConvGeometry(strides=(1, 1), padding="SAME")
    )
    assert auto.choose(pointwise, "cpu")[0] == "rows"
    # on GPU a layer runs dense unless its dense convolution is large (a high-resolution map)
    assert auto.choose(small, "gpu") == auto.choose(big, "gpu") == ("dense", None)
    hires = plan((1, 448, 448, 64), (3, 3, 64, 64), ConvGeometry(strides=(1, 1), padding="SAME"))
    assert auto.dense_flops(big) < auto.GPU_SMALL_LAYER_FLOPS < auto.dense_flops(hires)
    assert auto.choose(hires, "gpu")[0] == "pallas_gpu"
    # a depthwise layer with a channel multiplier, which the Pallas kernel does not
    # compute, runs dense however large: the tile kernel would read its loops'
    # predicates on the host
    multiplier = plan(
        (1, 448, 448, 64), (7, 7, 1, 256), ConvGeometry(strides=(1, 1), padding="SAME", groups=64)
    )
    assert auto.dense_flops(multiplier) > auto.GPU_SMALL_LAYER_FLOPS
    assert auto.choose(multiplier, "gpu") == ("dense", None)
    depthwise = plan(
        (1, 56, 56, 64), (3, 3, 1, 64), ConvGeometry(strides=(1, 1), padding="SAME", groups=64)
    )
    grouped = plan(
        (1, 27, 27, 96), (5, 5, 48, 256), ConvGeometry(strides=(1, 1), padding="SAME", groups=2)
    )
    assert auto.choose(grouped, "cpu")[0] == "rows"  # AlexNet's conv2: 2 groups of 48 channels
    assert auto.choose(depthwise, "cpu", scattered=True)[0] != "rows"  # rows too short to gather
    assert auto.dense_flops(depthwise) < auto.SMALL_LAYER_FLOPS
    # few FLOPs on a large map: cached when the layer does enough arithmetic per value
    # the sparse kernel moves (ResNet-50's and GoogLeNet's 64 -> 64 1x1 layer)...
    wide = plan((1, 56, 56, 64), (1, 1, 64, 64), ConvGeometry(strides=(1, 1), padding="SAME"))
    # ...not when it is thin (EfficientNet-Lite0's stem, first projection and
    # expansion, MobileNetV2's 24 -> 144 expansion), nor depthwise
    stem = plan((1, 225, 225, 3), (3, 3, 3, 32), ConvGeometry(strides=(2, 2), padding="VALID"))
    project = plan((1, 112, 112, 32), (1, 1, 32, 16), ConvGeometry(strides=(1, 1), padding="SAME"))
    expand = plan((1, 112, 112, 16), (1, 1, 16, 96), ConvGeometry(strides=(1, 1), padding="SAME"))
    expand56 = plan((1, 56, 56, 24), (1, 1, 24, 144), ConvGeometry(strides=(1, 1), padding="SAME"))
    wide_dw = plan(
        (1, 112, 112, 96), (3, 3, 1, 96), ConvGeometry(strides=(1, 1), padding="SAME", groups=96)
    )
    for p in (wide, stem, project, expand, expand56, wide_dw):
        assert auto.dense_flops(p) < auto.SMALL_LAYER_FLOPS and p.ho * p.wo >= auto.LARGE_MAP_PIXELS
    assert auto.intensity(wide) == 32.0
    assert auto.intensity(project) == pytest.approx(32 * 16 / 48)
    assert auto.intensity(stem) == pytest.approx(27 * 32 / 59)
    assert auto.choose(wide, "cpu")[0] == "rows"
    for p in (stem, project, expand, expand56, wide_dw):
        assert auto.intensity(p) < auto.LARGE_MAP_MIN_INTENSITY or p.groups > 1
        assert auto.choose(p, "cpu") == ("dense", None)
    narrow = plan((1, 55, 56, 16), (1, 1, 16, 96), ConvGeometry(strides=(1, 1), padding="SAME"))
    assert auto.choose(narrow, "cpu") == ("dense", None)


def _bn_add_relu(y, mean, factor, bias, residual):
    return jax.numpy.maximum((y - mean) * factor + bias + residual, 0.0)


@pytest.mark.parametrize("impl", ["reference", "dense", "xla", "rows", "auto", "pallas"])
@pytest.mark.parametrize("dense_path", [False, True])
def test_epilogue_is_applied_to_fresh_pixels_only(impl: str, dense_path: bool) -> None:
    x, w, mask, cached, geom = _problem(seed=3)
    mask = np.full_like(mask, not dense_path)  # nothing reusable: the dense path
    mask[:, 2:7, 3:9] = False  # one dirty blob
    rng = np.random.default_rng(4)
    ops = tuple(rng.normal(size=(5,)).astype(np.float32) for _ in range(3))
    residual = rng.normal(size=cached.shape).astype(np.float32)
    epi = Epilogue(_bn_add_relu, ops, (residual,))
    run = jax.jit(
        lambda *a: masked_conv(*a, geom, impl=impl, epilogue=epi, interpret=impl == "pallas")
    )
    out = np.asarray(run(x, w, mask, cached))
    fresh = np.asarray(_bn_add_relu(conv(x, w, geom), *ops, residual))
    np.testing.assert_allclose(out[~mask], fresh[~mask], rtol=1e-4, atol=1e-4)
    is_fresh = np.isclose(out, fresh, rtol=1e-4, atol=1e-4).all(-1)
    is_cached = (out == cached).all(-1)
    # a cached pixel is the cached epilogue output, never passed through it again
    assert (is_fresh | is_cached)[mask].all()
    if impl in ("xla", "rows", "pallas") and not dense_path:
        assert is_cached[mask].mean() > 0.5 and not is_fresh[is_cached & mask].any()


def test_epilogue_operands_per_stream_under_vmap() -> None:
    """Per-stream pixel operands are pooled like x; per-stream vectors fall back."""
    x, w, mask, cached, geom = _problem(seed=5)
    rng = np.random.default_rng(6)
    xs = np.concatenate([x, x[:, ::-1]])[:, None]
    ms, cs = np.stack([mask, mask[:, ::-1]]), np.stack([cached, cached[:, ::-1]])
    bias = rng.normal(size=(2, 5)).astype(np.float32)  # one bias per stream
    res = rng.normal(size=cs.shape).astype(np.float32)  # a residual per stream
    for impl in ("xla", "rows"):

        def one(x, m, c, b, r, impl=impl):
            epi = Epilogue(lambda y, b, r: y * b + r, (b,), (r,))
            return masked_conv(x, w, m, c, geom, impl=impl, epilogue=epi)

        out = np.asarray(jax.jit(jax.vmap(one))(xs, ms, cs, bias, res))
        pooled = jax.vmap(one, in_axes=(0, 0, 0, None, 0))  # shared bias: streams pooled
        shared = np.asarray(jax.jit(pooled)(xs, ms, cs, bias[0], res))
        for s in range(2):
            dirty = ~ms[s]
            fresh = np.asarray(conv(xs[s], w, geom))
            want = fresh * bias[s] + res[s]
            np.testing.assert_allclose(out[s][dirty], want[dirty], atol=1e-4)
            want = fresh * bias[0] + res[s]
            np.testing.assert_allclose(shared[s][dirty], want[dirty], atol=1e-4)
