"""Shared constants for the model-zoo tests: reduced sizes that keep every model fast."""

from __future__ import annotations

# Reduced (H, W) per model: large enough for every pooling stage, and a multiple of
# the total stride plus room for a translation by it. Models with a dense head on
# flattened features are built (and tested) at exactly this size.
SMALL_SIZE: dict[str, tuple[int, int]] = {
    "alexnet": (99, 99),
    "googlenet": (64, 64),
    "resnet50": (64, 64),
    "yolo_tiny": (128, 128),
    "dave": (66, 96),
    "mobilenet_v2": (64, 64),
    "vgg16": (64, 64),
    "squeezenet": (64, 64),
    "efficientnet_lite0": (64, 64),
}
SMALL_WIDTH = 0.25

# Output-space stride of each model's last spatial layer (product of all strides).
TOTAL_STRIDE: dict[str, int] = {
    "alexnet": 32,
    "googlenet": 32,
    "resnet50": 32,
    "yolo_tiny": 64,
    "dave": 8,
    "mobilenet_v2": 32,
    "vgg16": 32,
    "squeezenet": 16,
    "efficientnet_lite0": 32,
}
