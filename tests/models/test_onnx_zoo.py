import numpy as np
import pytest

from dcjax import models
from dcjax.models import onnx_zoo


def test_sizes_centerface_takes_and_the_nearest_one_it_would():
    assert onnx_zoo.input_size_error("centerface", (576, 768)) is None
    assert onnx_zoo.input_size_error("centerface", (32, 32)) is None
    problem = onnx_zoo.input_size_error("centerface", (300, 401))
    assert "multiples of 32" in problem and "288x416" in problem
    assert "32x32" in onnx_zoo.input_size_error("centerface", (10, 10))
    with pytest.raises(ValueError, match="multiples of 32"):
        onnx_zoo.create("centerface", (100, 128))


def test_unknown_names_and_real_weights():
    with pytest.raises(ValueError, match="unknown ONNX model 'yolo'.*centerface"):
        onnx_zoo.info("yolo")
    assert models.has_weights("centerface") and models.has_weights("efficientnet_lite0")
    assert not models.has_weights("resnet50")
    assert "centerface" not in models.names()  # the Flax zoo is its own registry


def test_centerface_by_name_runs_at_the_size_asked_and_finds_boxes():
    pytest.importorskip("onnx")
    model, params = onnx_zoo.create("centerface", (64, 96))
    heat, scale, offset, landmarks = model.apply(params, np.zeros((1, 64, 96, 3), np.float32))
    assert heat.shape == (1, 1, 16, 24) and landmarks.shape == (1, 10, 16, 24)
    info = onnx_zoo.info("centerface")
    boxes = info.boxes((heat, scale, offset, landmarks), (64, 96))
    assert boxes.shape[1:] == (4,)
    assert info.heatmap((heat, scale, offset, landmarks)).shape == (1, 1, 16, 24)
