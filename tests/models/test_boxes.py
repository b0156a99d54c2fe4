import numpy as np
import pytest

from dcjax.models.boxes import iou, nms


def test_iou_of_known_boxes():
    a = np.array([[0, 0, 10, 10], [0, 0, 0, 0]], float)
    b = np.array([[5, 0, 15, 10], [20, 20, 30, 30], [0, 0, 10, 10]], float)
    got = iou(a, b)
    assert got.shape == (2, 3)
    np.testing.assert_allclose(got[0], [50 / 150, 0.0, 1.0])
    np.testing.assert_array_equal(got[1], 0.0)  # an empty box overlaps nothing


def test_nms_keeps_the_best_of_each_overlapping_group():
    boxes = np.array([[0, 0, 10, 10], [1, 0, 11, 10], [20, 20, 30, 30], [0, 0, 10, 9]], float)
    scores = np.array([0.5, 0.9, 0.4, 0.3])
    assert nms(boxes, scores, 0.3).tolist() == [1, 2]
    assert nms(boxes, scores, 0.95).tolist() == [1, 0, 2, 3]
    assert nms(np.zeros((0, 4)), np.zeros(0), 0.3).tolist() == []


@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_nms_output_never_overlaps_past_the_threshold(threshold):
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 50, (40, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(5, 20, (40, 2))], axis=1)
    keep = nms(boxes, rng.uniform(size=40), threshold)
    overlaps = iou(boxes[keep], boxes[keep])
    np.fill_diagonal(overlaps, 0)
    assert overlaps.max() <= threshold
    assert len(keep) >= 1
