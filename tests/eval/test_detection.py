import numpy as np
import pytest

from dcjax.eval.detection import match_f1


def test_f1_of_known_box_sets():
    ref = np.array([[0, 0, 10, 10], [20, 20, 30, 30]], float)
    got = np.array([[1, 1, 10, 10], [50, 50, 60, 60], [0, 0, 10, 10]], float)
    m = match_f1(ref, got)  # one box of ref found (twice: the second copy is a false positive)
    assert m["boxes"] == 3 and m["reference_boxes"] == 2
    assert m["box_precision"] == pytest.approx(1 / 3)
    assert m["box_recall"] == pytest.approx(1 / 2)
    assert m["box_f1"] == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))


def test_f1_sums_over_frames_and_empty_frames_agree():
    ref = [np.zeros((0, 4)), np.array([[0, 0, 10, 10]], float)]
    assert match_f1(ref, [np.zeros((0, 4)), np.array([[0, 0, 10, 11]], float)])["box_f1"] == 1.0
    miss = match_f1(ref, [np.array([[0, 0, 5, 5]], float), np.zeros((0, 4))])
    assert miss["box_f1"] == 0.0 and miss["boxes"] == 1 and miss["reference_boxes"] == 1
    with pytest.raises(ValueError, match="2 frames of reference boxes but 1"):
        match_f1(ref, [np.zeros((0, 4))])


def test_a_box_at_the_iou_threshold_does_not_match():
    ref = np.array([[0, 0, 10, 10]], float)
    half = np.array([[0, 0, 10, 5]], float)  # IoU exactly 0.5
    assert match_f1(ref, half)["box_f1"] == 0.0
    assert match_f1(ref, half, threshold=0.4)["box_f1"] == 1.0
