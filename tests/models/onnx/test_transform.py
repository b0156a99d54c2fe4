"""An imported ONNX model through `dcjax.deepcache.transform`, checked against onnxruntime."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from dcjax import deepcache
from dcjax.models.onnx import from_onnx
from tests.models.onnx.graphs import rand, save
from tests.translated import nothing_reusable

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
skimage_data = pytest.importorskip("skimage.data")
from onnx import helper  # noqa: E402
from skimage.transform import resize  # noqa: E402

N = helper.make_node
SIZE = 32


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    """A small encoder-decoder in the file's NCHW layout (conv, batch norm,
    pooling, a strided conv, a transposed conv back up, a skip connection,
    two heads), like a CenterNet-style detector, and its onnxruntime session."""
    nodes = [
        N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        N("BatchNormalization", ["c1", "s", "bb", "m", "v"], ["n1"]),
        N("Relu", ["n1"], ["r1"]),
        N("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        N("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        N("Clip", ["c2", "lo", "hi"], ["r2"]),
        N("ConvTranspose", ["r2", "wt", "bt"], ["u"], strides=[2, 2]),
        N("Add", ["u", "p1"], ["skip"]),
        N("Conv", ["skip", "wh", "bh"], ["logit"]),
        N("Sigmoid", ["logit"], ["heat"]),
        N("Conv", ["skip", "wr"], ["reg"], pads=[1, 1, 1, 1]),
    ]
    inits = {
        "w1": rand(8, 3, 3, 3, seed=1) * 0.5, "b1": rand(8, seed=2) * 0.1,
        "s": rand(8, seed=3), "bb": rand(8, seed=4), "m": rand(8, seed=5) * 0.1,
        "v": np.abs(rand(8, seed=6)) + 0.5,
        "w2": rand(16, 8, 3, 3, seed=7) * 0.2, "b2": rand(16, seed=8) * 0.1,
        "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32),
        "wt": rand(16, 8, 2, 2, seed=9) * 0.2, "bt": rand(8, seed=10) * 0.1,
        "wh": rand(1, 8, 1, 1, seed=11), "bh": rand(1, seed=12),
        "wr": rand(4, 8, 3, 3, seed=13) * 0.2,
    }  # fmt: skip
    path = save(
        tmp_path_factory.mktemp("det") / "det.onnx", nodes, inits,
        x_shape=(1, 3, SIZE, SIZE), outputs=("heat", "reg"),
    )  # fmt: skip
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    fn, params = from_onnx(path, input_shape=(1, 3, SIZE, SIZE))
    return fn, params, lambda f: sess.run(None, {"x": f[None].transpose(0, 3, 1, 2)})


def _photo(seed: int = 0) -> np.ndarray:
    img = resize(skimage_data.astronaut(), (2 * SIZE, 2 * SIZE), anti_aliasing=True)
    y, x = np.random.default_rng(seed).integers(0, SIZE, 2)
    return img[y : y + SIZE, x : x + SIZE].astype(np.float32)


def _close(got, want):
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4 * np.abs(w).max())


def _transform(detector, **config):
    fn, params, _ = detector
    return deepcache.transform(
        fn, params, frame_shape=(SIZE, SIZE, 3), config=deepcache.Config(**config),
        progress=False,
    )  # fmt: skip


def test_a_cached_onnx_model_without_reuse_equals_onnxruntime(detector):
    cached = _transform(detector, psnr_threshold=float("inf"))
    assert len(cached.layers) >= 4  # its convolutions are cached layers
    state = cached.init()
    for seed in range(3):
        f = _photo(seed)
        out, state, info = cached.step(state, f)
        np.testing.assert_array_equal(np.asarray(info["reuse_fraction"]), 0.0)
        _close(out, detector[2](f))


def test_a_cached_onnx_model_reuses_where_the_frame_did_not_change(detector):
    """A patch of the frame changes; the given match marks the rest reusable:
    the layers reuse most of their outputs and the step still equals onnxruntime."""
    cached = _transform(detector, refresh_every=100, skip_unchanged=False)
    prev = _photo(1)
    cur = prev.copy()
    cur[4:12, 20:28] = np.random.default_rng(0).uniform(size=(8, 8, 3))
    mask = np.ones((SIZE, SIZE), bool)
    mask[4:12, 20:28] = False
    state = cached.init()
    _, state, _ = cached.step(state, prev, match=nothing_reusable((SIZE, SIZE)))
    match = deepcache.Match(motion=jnp.zeros(2, jnp.int32), mask=jnp.asarray(mask))
    out, state, info = cached.step(state, cur, match=match)
    _close(out, detector[2](cur))
    fractions = np.asarray(info["reuse_fraction"])
    assert fractions[0] > 0.7, fractions
    assert float(info["flops_ratio"]) < 0.8


def test_layers_are_named_after_the_files_nodes(detector):
    """Unnamed nodes take their op and first output, so plans, per-layer
    statistics and ``dcjax profile`` name what the file holds."""
    names = [layer.name for layer in _transform(detector, tuning="prior").layers]
    assert names[:2] == ["Conv_c1", "Conv_c2"]
    assert {"Conv_logit", "Conv_reg"} <= set(names) and len(set(names)) == len(names)
