"""EfficientNet-Lite0: EfficientNet-B0 without squeeze-excitation, with ReLU6.

Contract: ``EfficientNetLite0()(x)`` maps (N, 224, 224, 3) float32 images (normalised
as ``(pixel - 127) / 128`` per channel, see `dcjax.models.preprocess`) to (N,
num_classes) logits. Stem conv 32x3x3/2 + BN + ReLU6; sixteen MBConv blocks (1x1 expand,
depthwise kxk, 1x1 linear projection, residual when shapes match; no SE); head conv
1280x1x1 + BN + ReLU6; global average pool; fc. BatchNorm epsilon 1e-3 (TensorFlow's).
4,652,008 parameters with 1000 classes.

``tf_padding=True`` (the default, required by the pretrained weights) pads strided
convolutions like TensorFlow's ``SAME``: the extra cell goes on the bottom/right. The
pretrained ImageNet weights are loaded by `dcjax.models.create("efficientnet_lite0",
pretrained=True)`, see `dcjax.models.pretrained`. Any input size of at least 32 works.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from dcjax.models.layers import ConvBN, global_avg_pool, make_divisible, relu6

__all__ = ["EfficientNetLite0", "MBConv"]

# (expansion, kernel, stride, output channels, repeats) of EfficientNet-B0.
STAGES = (
    (1, 3, 1, 16, 1),
    (6, 3, 2, 24, 2),
    (6, 5, 2, 40, 2),
    (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3),
    (6, 5, 2, 192, 4),
    (6, 3, 1, 320, 1),
)
BN_EPS = 1e-3


def _padding(size: int, kernel: int, stride: int, tf_padding: bool) -> tuple[int, int]:
    """Low/high padding of one axis: TensorFlow ``SAME`` or symmetric ``kernel // 2``."""
    if not tf_padding:
        return kernel // 2, kernel // 2
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def _pads(x: jnp.ndarray, kernel: int, stride: int, tf_padding: bool) -> list[tuple[int, int]]:
    return [_padding(x.shape[axis], kernel, stride, tf_padding) for axis in (1, 2)]


class MBConv(nn.Module):
    """Mobile inverted bottleneck without squeeze-excitation.

    Attributes:
        features: output channels.
        expansion: hidden channels = input channels x expansion.
        kernel: depthwise kernel side.
        stride: depthwise stride.
        tf_padding: TensorFlow ``SAME`` padding for the depthwise convolution.
    """

    features: int
    expansion: int
    kernel: int
    stride: int
    tf_padding: bool = True

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        cin = x.shape[-1]
        hidden = cin * self.expansion
        y = x
        if self.expansion != 1:
            y = ConvBN(hidden, 1, act=relu6, bn_eps=BN_EPS, name="expand")(y)
        y = ConvBN(
            hidden,
            self.kernel,
            self.stride,
            _pads(y, self.kernel, self.stride, self.tf_padding),
            groups=hidden,
            act=relu6,
            bn_eps=BN_EPS,
            name="depthwise",
        )(y)
        y = ConvBN(self.features, 1, act=None, bn_eps=BN_EPS, name="project")(y)
        if self.stride == 1 and cin == self.features:
            y = y + x
        return y


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0 for inference.

    Attributes:
        num_classes: size of the classifier.
        width: channel multiplier of the blocks (1.0 is the published network; stem
            and head keep their widths, as in the Lite family).
        tf_padding: TensorFlow ``SAME`` padding of strided convolutions.
    """

    num_classes: int = 1000
    width: float = 1.0
    tf_padding: bool = True

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = ConvBN(
            32, 3, 2, _pads(x, 3, 2, self.tf_padding), act=relu6, bn_eps=BN_EPS, name="stem"
        )(x)
        index = 0
        for expansion, kernel, stride, features, repeats in STAGES:
            for i in range(repeats):
                x = MBConv(
                    make_divisible(features * self.width),
                    expansion,
                    kernel,
                    stride if i == 0 else 1,
                    self.tf_padding,
                    name=f"block{index}",
                )(x)
                index += 1
        x = ConvBN(1280, 1, act=relu6, bn_eps=BN_EPS, name="head")(x)
        x = global_avg_pool(x)
        return nn.Dense(self.num_classes, name="fc")(x)
