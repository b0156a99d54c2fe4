"""MobileNetV2 (used in SMTM's evaluation), the torchvision layout.

Contract: ``MobileNetV2()(x)`` maps (N, 224, 224, 3) float32 images (ImageNet mean/std
normalisation, see `dcjax.models.preprocess`) to (N, num_classes) logits: stem conv
32x3x3/2, seventeen inverted-residual blocks (1x1 expand, 3x3 depthwise, 1x1 linear
projection, residual when shapes match) with BatchNorm and ReLU6, a 1x1 conv to 1280,
global average pool, fc. 3,504,872 parameters with 1000 classes. Any input size of at
least 32 works.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from dcjax.models.layers import Activation, ConvBN, global_avg_pool, make_divisible, relu6

__all__ = ["InvertedResidual", "MobileNetV2"]

# (expansion t, channels c, repeats n, stride s) of the paper's Table 2.
_SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class InvertedResidual(nn.Module):
    """Inverted residual block with a linear bottleneck.

    Attributes:
        features: output channels.
        stride: stride of the depthwise convolution.
        expansion: hidden channels = input channels x expansion.
        kernel: depthwise kernel side.
        act: activation after expansion and depthwise convolutions.
        bn_eps: BatchNorm epsilon.
    """

    features: int
    stride: int
    expansion: int
    kernel: int = 3
    act: Activation = relu6
    bn_eps: float = 1e-5

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        cin = x.shape[-1]
        hidden = cin * self.expansion
        y = x
        if self.expansion != 1:
            y = ConvBN(hidden, 1, act=self.act, bn_eps=self.bn_eps, name="expand")(y)
        y = ConvBN(
            hidden,
            self.kernel,
            self.stride,
            groups=hidden,
            act=self.act,
            bn_eps=self.bn_eps,
            name="depthwise",
        )(y)
        y = ConvBN(self.features, 1, act=None, bn_eps=self.bn_eps, name="project")(y)
        if self.stride == 1 and cin == self.features:
            y = y + x
        return y


class MobileNetV2(nn.Module):
    """MobileNetV2 for inference.

    Attributes:
        num_classes: size of the classifier.
        width: width multiplier (channels rounded to multiples of 8; the last conv
            keeps 1280 channels unless ``width > 1``, as in the paper).
    """

    num_classes: int = 1000
    width: float = 1.0

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = ConvBN(make_divisible(32 * self.width), 3, 2, act=relu6, name="stem")(x)
        index = 0
        for t, c, n, s in _SETTINGS:
            for i in range(n):
                x = InvertedResidual(
                    make_divisible(c * self.width), s if i == 0 else 1, t, name=f"block{index}"
                )(x)
                index += 1
        last = make_divisible(1280 * max(1.0, self.width))
        x = ConvBN(last, 1, act=relu6, name="head")(x)
        x = global_avg_pool(x)
        return nn.Dense(self.num_classes, name="fc")(x)
