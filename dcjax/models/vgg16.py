"""VGG-16 (configuration D, as in SMTM's evaluation), without BatchNorm.

Contract: ``VGG16()(x)`` maps (N, 224, 224, 3) float32 images (ImageNet mean/std
normalisation, see `dcjax.models.preprocess`) to (N, num_classes) logits: thirteen 3x3
convolutions with ReLU in five blocks, each ending in max-pool 2/2, then fc 4096,
fc 4096, fc. 138,357,544 parameters with 1000 classes (the torchvision ``vgg16``
count, whose adaptive pool is the identity at 224x224). The dense head flattens the
last feature map, so its input size is fixed by the input size used at ``init``.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from dcjax.models.layers import ConvBN, max_pool, relu, scale_channels

__all__ = ["VGG16"]

_BLOCKS = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


class VGG16(nn.Module):
    """VGG-16 for inference.

    Attributes:
        num_classes: size of the classifier.
        width: channel multiplier for convolutions and hidden dense layers.
    """

    num_classes: int = 1000
    width: float = 1.0

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        for b, block in enumerate(_BLOCKS):
            for i, features in enumerate(block):
                x = ConvBN(
                    scale_channels(features, self.width), 3, bn=False, name=f"conv{b + 1}_{i + 1}"
                )(x)
            x = max_pool(x, 2, 2)
        x = x.reshape(x.shape[0], -1)
        x = relu(nn.Dense(scale_channels(4096, self.width), name="fc6")(x))
        x = relu(nn.Dense(scale_channels(4096, self.width), name="fc7")(x))
        return nn.Dense(self.num_classes, name="fc8")(x)
