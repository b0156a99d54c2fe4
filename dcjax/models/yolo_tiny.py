"""Tiny YOLO v1 (DeepCache's DET): a convolutional trunk and a fully-connected head.

Contract: ``YoloTiny()(x)`` maps (N, 448, 448, 3) float32 images (pixels scaled to
[0, 1], see `dcjax.models.preprocess`) to (N, S, S, B * 5 + num_classes) raw
predictions on an S x S grid (S = 7, B = 2 boxes, 20 VOC classes by default), the
Darknet ``tiny-yolo`` v1 layout: nine 3x3 convolutions with BatchNorm and leaky ReLU
(16, 32, 64, 128, 256, 512 channels each followed by max-pool 2/2, then 1024 and
256), then one dense layer to S*S*(5B+C) outputs reshaped to the grid. The dense
layer flattens the trunk's feature map, so its input size is fixed by the input size
used at ``init``; the grid size S stays 7 at any input size.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from dcjax.models.layers import ConvBN, leaky_relu, max_pool, scale_channels

__all__ = ["YoloTiny"]

_TRUNK = (16, 32, 64, 128, 256, 512)


class YoloTiny(nn.Module):
    """Tiny YOLO v1 for inference.

    Attributes:
        num_classes: object classes per grid cell (20 for PASCAL VOC).
        grid: grid side S.
        boxes: boxes B predicted per cell.
        width: channel multiplier of the trunk.
    """

    num_classes: int = 20
    grid: int = 7
    boxes: int = 2
    width: float = 1.0

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        for i, features in enumerate(_TRUNK):
            x = ConvBN(scale_channels(features, self.width), 3, act=leaky_relu, name=f"conv{i}")(x)
            x = max_pool(x, 2, 2)
        x = ConvBN(scale_channels(1024, self.width), 3, act=leaky_relu, name="conv6")(x)
        x = ConvBN(scale_channels(256, self.width), 3, act=leaky_relu, name="conv7")(x)
        x = x.reshape(x.shape[0], -1)
        depth = self.boxes * 5 + self.num_classes
        x = nn.Dense(self.grid * self.grid * depth, name="detection")(x)
        return x.reshape(x.shape[0], self.grid, self.grid, depth)
