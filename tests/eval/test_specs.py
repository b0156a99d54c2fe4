"""Zoo models as ModelSpecs at any input size (`dcjax.eval.specs`)."""

import re

import numpy as np

from dcjax.eval import specs


def test_a_spec_at_another_size_runs_at_that_size():
    spec = specs.model_spec("dave", width=0.25, input_size=(70, 101))
    assert spec.frame_shape == (70, 101, 3)
    frame = np.zeros((1, 70, 101, 3), np.float32)
    out = spec.module.apply(spec.variables, spec.preprocess(frame))
    assert np.all(np.isfinite(np.asarray(out)))


def test_a_size_too_small_names_the_nearest_size_the_model_takes():
    assert specs.input_size_error("dave", (70, 101), width=0.25) is None
    problem = specs.input_size_error("dave", (8, 8), width=0.25)
    m = re.search(r"the nearest size it takes is (\d+)x(\d+)", problem)
    assert problem.startswith("8x8 frames are too small for dave") and m
    h, w = int(m.group(1)), int(m.group(2))
    assert specs.input_size_error("dave", (h, w), width=0.25) is None
    # one pixel less on either axis is refused (the nearest, not merely a size taken)
    assert specs.input_size_error("dave", (h - 1, w), width=0.25) is not None
    assert specs.input_size_error("dave", (h, w - 1), width=0.25) is not None
