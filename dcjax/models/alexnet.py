"""AlexNet in the Caffe/BVLC layout (DeepCache's REC_1).

Contract: ``AlexNet()(x)`` maps (N, 227, 227, 3) float32 images (Caffe normalisation:
RGB in 0..255 minus the ImageNet channel means, see `dcjax.models.preprocess`) to
(N, num_classes) logits. Layout of ``bvlc_alexnet``: conv1 96x11x11/4, ReLU, LRN(5),
max-pool 3/2; conv2 256x5x5 pad 2 in 2 groups, ReLU, LRN(5), max-pool 3/2; conv3 384x3x3;
conv4 384x3x3 in 2 groups; conv5 256x3x3 in 2 groups; max-pool 3/2; fc6 4096, fc7 4096,
fc8. 60,965,224 parameters with 1000 classes. Inference only (no dropout).

The dense head flattens the last feature map, so its input size is fixed by the input
size used at ``init``: build with a smaller input (``create(..., input_size=...)``) and
the model works at that size. Pooling uses Caffe's ceil rounding.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from dcjax.models.layers import ConvBN, LocalResponseNorm, max_pool, relu, scale_channels

__all__ = ["AlexNet"]


class AlexNet(nn.Module):
    """Caffe AlexNet with grouped convolutions and cross-channel LRN.

    Attributes:
        num_classes: size of the last dense layer.
        width: channel multiplier for convolutions and hidden dense layers (1.0 is
            the published network; smaller values make fast test models).
    """

    num_classes: int = 1000
    width: float = 1.0

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        def c(n: int) -> int:
            return scale_channels(n, self.width)

        def conv(n: int, k: int, s: int, p: int, g: int, name: str) -> ConvBN:
            return ConvBN(c(n), k, s, p, groups=g, bn=False, act=relu, name=name)

        x = conv(96, 11, 4, 0, 1, "conv1")(x)
        x = LocalResponseNorm(5, 1e-4, 0.75, name="norm1")(x)
        x = max_pool(x, 3, 2, ceil_mode=True)
        x = conv(256, 5, 1, 2, 2, "conv2")(x)
        x = LocalResponseNorm(5, 1e-4, 0.75, name="norm2")(x)
        x = max_pool(x, 3, 2, ceil_mode=True)
        x = conv(384, 3, 1, 1, 1, "conv3")(x)
        x = conv(384, 3, 1, 1, 2, "conv4")(x)
        x = conv(256, 3, 1, 1, 2, "conv5")(x)
        x = max_pool(x, 3, 2, ceil_mode=True)
        x = x.reshape(x.shape[0], -1)
        x = relu(nn.Dense(c(4096), name="fc6")(x))
        x = relu(nn.Dense(c(4096), name="fc7")(x))
        return nn.Dense(self.num_classes, name="fc8")(x)
