import math

import numpy as np
import pytest

from dcjax.models.centerface import STRIDE, decode


def _maps(h=16, w=20):
    return (np.zeros((1, 1, h, w)), np.zeros((1, 2, h, w)), np.zeros((1, 2, h, w)),
            np.zeros((1, 10, h, w)))  # fmt: skip


def test_decode_places_a_box_from_its_centre_scale_and_offset():
    heat, scale, offset, lm = _maps()
    heat[0, 0, 5, 7] = 0.9
    heat[0, 0, 5, 8] = 0.5  # the same face seen by the next cell: NMS drops it
    scale[0, :, 5, 7:9] = math.log(40 / STRIDE)  # 40 px high and wide
    offset[0, 0, 5, 7], offset[0, 1, 5, 7] = 0.25, 0.5
    lm[0, :, 5, 7] = 0.5  # every landmark at the box's centre
    faces = decode(heat, scale, offset, lm, image_size=(64, 80))
    cy, cx = (5 + 0.25 + 0.5) * STRIDE, (7 + 0.5 + 0.5) * STRIDE
    np.testing.assert_allclose(faces.boxes, [[cx - 20, cy - 20, cx + 20, cy + 20]])
    np.testing.assert_allclose(faces.scores, [0.9])
    np.testing.assert_allclose(faces.landmarks, [[[cx, cy]] * 5])


def test_decode_clips_to_the_image_and_drops_cells_under_the_threshold():
    heat, scale, offset, lm = _maps()
    heat[0, 0, 0, 0] = 0.3
    heat[0, 0, 10, 10] = 0.19
    scale[0, :, 0, 0] = math.log(40 / STRIDE)
    faces = decode(heat, scale, offset, lm, image_size=(64, 80))
    np.testing.assert_allclose(faces.boxes, [[0, 0, 40, 40]])
    assert len(decode(heat, scale, offset, lm, image_size=(64, 80), threshold=0.35).boxes) == 0


def test_decode_refuses_outputs_of_another_model():
    heat, scale, offset, lm = _maps()
    with pytest.raises(ValueError, match="1, 2, 2 and 10 channels"):
        decode(heat, scale, offset, lm[:, :4], image_size=(64, 80))


def test_the_bundled_centerface_finds_the_astronauts_face():
    """The real model on a real photo: one face, eyes above the nose above the
    mouth, every landmark inside the box."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("onnx")
    data = pytest.importorskip("skimage.data")
    from dcjax.models import from_onnx, onnx_file

    img = data.astronaut().astype(np.float32)
    fn, params = from_onnx(onnx_file("centerface"), input_shape=(1, 3, 512, 512))
    faces = decode(*jax.jit(fn)(params, img[None]), image_size=(512, 512))
    assert len(faces.boxes) == 1 and faces.scores[0] > 0.8
    (x1, y1, x2, y2), pts = faces.boxes[0], faces.landmarks[0]
    assert 60 < x2 - x1 < 200 and 60 < y2 - y1 < 200
    assert np.all((pts[:, 0] > x1) & (pts[:, 0] < x2) & (pts[:, 1] > y1) & (pts[:, 1] < y2))
    eyes, nose, mouth = pts[:2], pts[2], pts[3:]
    assert eyes[0, 0] < eyes[1, 0] and mouth[0, 0] < mouth[1, 0]
    assert eyes[:, 1].max() < nose[1] < mouth[:, 1].min()
