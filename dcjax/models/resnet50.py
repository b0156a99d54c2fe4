"""ResNet-50 (DeepCache's REC_3), the torchvision v1.5 layout.

Contract: ``ResNet50()(x)`` maps (N, 224, 224, 3) float32 images (ImageNet mean/std
normalisation, see `dcjax.models.preprocess`) to (N, num_classes) logits. Stem conv
7x7/2 + BN + ReLU + max-pool 3/2 (pad 1), then bottleneck stages of 3, 4, 6, 3 blocks
(stride 2 on the 3x3 convolution of each stage's first block, projection shortcut
with BN), global average pool, fc. BatchNorm uses running averages. 25,557,032
parameters with 1000 classes. Any input size of at least 32 works.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from dcjax.models.layers import ConvBN, global_avg_pool, max_pool, relu, scale_channels

__all__ = ["Bottleneck", "ResNet50"]


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand (x4), plus the shortcut, then ReLU.

    Attributes:
        width: channels of the 1x1 reduce and 3x3 convolutions.
        stride: stride of the 3x3 convolution and of the projection shortcut.
        project: use a 1x1 convolution + BN shortcut (channel or stride change).
    """

    width: int
    stride: int = 1
    project: bool = False

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        y = ConvBN(self.width, 1, name="conv1")(x)
        y = ConvBN(self.width, 3, self.stride, name="conv2")(y)
        y = ConvBN(self.width * 4, 1, act=None, name="conv3")(y)
        shortcut = x
        if self.project:
            shortcut = ConvBN(self.width * 4, 1, self.stride, act=None, name="downsample")(x)
        return relu(y + shortcut)


class ResNet50(nn.Module):
    """ResNet-50 for inference.

    Attributes:
        num_classes: size of the classifier.
        width: channel multiplier (1.0 is the published network).
    """

    num_classes: int = 1000
    width: float = 1.0

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = ConvBN(scale_channels(64, self.width), 7, 2, 3, name="stem")(x)
        x = max_pool(x, 3, 2, 1)
        for stage, (base, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True)):
            for block in range(blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                x = Bottleneck(
                    scale_channels(base, self.width),
                    stride,
                    project=block == 0,
                    name=f"layer{stage + 1}_{block}",
                )(x)
        x = global_avg_pool(x)
        return nn.Dense(self.num_classes, name="fc")(x)
