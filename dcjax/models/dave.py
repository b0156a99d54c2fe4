"""DAVE-2 / PilotNet, NVIDIA's end-to-end steering network (DeepCache's DRV).

Contract: ``Dave()(x)`` maps (N, 66, 200, 3) float32 images (pixels scaled to [-1, 1],
see `dcjax.models.preprocess`) to (N, 1) steering angles in radians, ``2 * atan(z)`` of
the last dense output as in the widely used TensorFlow re-implementation. Layout: three
5x5/2 convolutions (24, 36, 48), two 3x3 convolutions (64, 64), all ``VALID`` with
ReLU, then dense 100, 50, 10, 1. 252,219 parameters. The dense head flattens the
1x18x64 feature map, so its input size is fixed by the input size used at ``init``.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from dcjax.models.layers import ConvBN, relu, scale_channels

__all__ = ["Dave"]

_CONVS = ((24, 5, 2), (36, 5, 2), (48, 5, 2), (64, 3, 1), (64, 3, 1))


class Dave(nn.Module):
    """PilotNet steering regressor for inference.

    Attributes:
        num_classes: outputs of the last dense layer (1: the steering angle).
        width: channel multiplier of the convolutions.
    """

    num_classes: int = 1
    width: float = 1.0

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        for i, (features, kernel, stride) in enumerate(_CONVS):
            x = ConvBN(
                scale_channels(features, self.width), kernel, stride, 0, bn=False, name=f"conv{i}"
            )(x)
        x = x.reshape(x.shape[0], -1)
        for i, features in enumerate((100, 50, 10)):
            x = relu(nn.Dense(features, name=f"fc{i}")(x))
        x = nn.Dense(self.num_classes, name="out")(x)
        return 2.0 * jnp.arctan(x)
