"""SqueezeNet 1.1 (used in DeepCache's memory study).

Contract: ``SqueezeNet()(x)`` maps (N, 224, 224, 3) float32 images (ImageNet mean/std
normalisation, see `dcjax.models.preprocess`) to (N, num_classes) logits: conv1 64x3x3/2,
max-pool 3/2 (ceil), fire 2-3, max-pool, fire 4-5, max-pool, fire 6-9, a 1x1 classifier
convolution with ReLU, global average pool. 1,235,496 parameters with 1000 classes (the
torchvision ``squeezenet1_1`` count). Any input size of at least 32 works.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from dcjax.models.layers import ConvBN, global_avg_pool, max_pool, scale_channels

__all__ = ["Fire", "SqueezeNet"]

# (squeeze, expand 1x1, expand 3x3) for fire2 .. fire9.
_FIRES = (
    (16, 64, 64),
    (16, 64, 64),
    (32, 128, 128),
    (32, 128, 128),
    (48, 192, 192),
    (48, 192, 192),
    (64, 256, 256),
    (64, 256, 256),
)


class Fire(nn.Module):
    """Squeeze 1x1, then expand 1x1 and 3x3 concatenated along channels.

    Attributes:
        squeeze: channels of the squeeze convolution.
        expand1: channels of the 1x1 expand convolution.
        expand3: channels of the 3x3 expand convolution.
    """

    squeeze: int
    expand1: int
    expand3: int

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        s = ConvBN(self.squeeze, 1, bn=False, name="squeeze")(x)
        e1 = ConvBN(self.expand1, 1, bn=False, name="expand1x1")(s)
        e3 = ConvBN(self.expand3, 3, bn=False, name="expand3x3")(s)
        return jnp.concatenate([e1, e3], axis=-1)


class SqueezeNet(nn.Module):
    """SqueezeNet 1.1 for inference.

    Attributes:
        num_classes: channels of the classifier convolution.
        width: channel multiplier (1.0 is the published network).
    """

    num_classes: int = 1000
    width: float = 1.0

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = ConvBN(scale_channels(64, self.width), 3, 2, 0, bn=False, name="conv1")(x)
        x = max_pool(x, 3, 2, ceil_mode=True)
        for i, (s, e1, e3) in enumerate(_FIRES):
            if i in (2, 4):
                x = max_pool(x, 3, 2, ceil_mode=True)
            widths = (scale_channels(n, self.width) for n in (s, e1, e3))
            x = Fire(*widths, name=f"fire{i + 2}")(x)
        x = ConvBN(self.num_classes, 1, bn=False, name="classifier")(x)
        return global_avg_pool(x)
