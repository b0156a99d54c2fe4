"""GoogLeNet (Inception v1) in the Caffe ``bvlc_googlenet`` layout (DeepCache's REC_2).

Contract: ``GoogLeNet()(x)`` maps (N, 224, 224, 3) float32 images (Caffe normalisation,
see `dcjax.models.preprocess`) to (N, num_classes) logits. Layout of the BVLC model
without the two auxiliary heads: conv1 7x7/2, max-pool 3/2, LRN, conv2 1x1 and 3x3, LRN,
max-pool 3/2, inception 3a-3b, max-pool, 4a-4e, max-pool, 5a-5b, global average pool,
fc. All convolutions have biases and ReLU, there is no BatchNorm; pooling uses Caffe's
ceil rounding. 6,998,552 parameters with 1000 classes (the BVLC model's count minus its
auxiliary classifiers). Global pooling makes any input size of at least 32 work.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from dcjax.models.layers import (
    ConvBN,
    LocalResponseNorm,
    global_avg_pool,
    max_pool,
    relu,
    scale_channels,
)

__all__ = ["GoogLeNet", "Inception"]

# (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection) per inception module.
_INCEPTION: dict[str, tuple[int, int, int, int, int, int]] = {
    "3a": (64, 96, 128, 16, 32, 32),
    "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64),
    "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}


def _conv(features: int, kernel: int, stride: int = 1, *, name: str) -> ConvBN:
    return ConvBN(features, kernel, stride, kernel // 2, bn=False, act=relu, name=name)


class Inception(nn.Module):
    """One inception module: four branches concatenated along channels.

    Attributes:
        widths: (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection) channels.
    """

    widths: tuple[int, int, int, int, int, int]

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        c1, r3, c3, r5, c5, cp = self.widths
        b1 = _conv(c1, 1, name="1x1")(x)
        b3 = _conv(c3, 3, name="3x3")(_conv(r3, 1, name="3x3_reduce")(x))
        b5 = _conv(c5, 5, name="5x5")(_conv(r5, 1, name="5x5_reduce")(x))
        bp = _conv(cp, 1, name="pool_proj")(max_pool(x, 3, 1, 1))
        return jnp.concatenate([b1, b3, b5, bp], axis=-1)


class GoogLeNet(nn.Module):
    """BVLC GoogLeNet without auxiliary classifiers.

    Attributes:
        num_classes: size of the classifier.
        width: channel multiplier (1.0 is the published network).
    """

    num_classes: int = 1000
    width: float = 1.0

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        def c(n: int) -> int:
            return scale_channels(n, self.width)

        x = _conv(c(64), 7, 2, name="conv1")(x)
        x = max_pool(x, 3, 2, ceil_mode=True)
        x = LocalResponseNorm(5, 1e-4, 0.75, name="norm1")(x)
        x = _conv(c(64), 1, name="conv2_reduce")(x)
        x = _conv(c(192), 3, name="conv2")(x)
        x = LocalResponseNorm(5, 1e-4, 0.75, name="norm2")(x)
        x = max_pool(x, 3, 2, ceil_mode=True)
        for stage in ("3a", "3b", "pool", "4a", "4b", "4c", "4d", "4e", "pool", "5a", "5b"):
            if stage == "pool":
                x = max_pool(x, 3, 2, ceil_mode=True)
            else:
                c1, r3, c3, r5, c5, cp = (c(n) for n in _INCEPTION[stage])
                x = Inception((c1, r3, c3, r5, c5, cp), name=f"inception_{stage}")(x)
        x = global_avg_pool(x)
        return nn.Dense(self.num_classes, name="fc")(x)
