"""Small Flax models for the transform's tests.

Together they use strided and dilated convolutions, grouped and depthwise
convolutions, VALID, SAME and explicit padding, max and average pooling,
residual adds, channel concatenation of parallel branches, BatchNorm in
inference mode, nearest upsampling (broadcast + reshape and jax.image.resize),
and a dense head. Each has a total stride (the product of its strides) so that
translation tests can shift by a multiple of it.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class PlainNet(nn.Module):
    """conv s2 SAME -> BN -> relu -> maxpool s2 -> dilated conv -> avgpool s2 -> dense."""

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(8, (5, 5), strides=2, padding="SAME")(x)
        x = nn.BatchNorm(use_running_average=True)(x)
        x = nn.relu(x)
        x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")
        x = nn.Conv(8, (3, 3), kernel_dilation=2, padding=((2, 2), (2, 2)))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, (2, 2), (2, 2))
        x = x.reshape(x.shape[0], -1)
        return nn.Dense(5)(x)


PlainNet.total_stride = 8


class ResidualBlock(nn.Module):
    features: int

    @nn.compact
    def __call__(self, x):
        y = nn.Conv(self.features, (3, 3), padding="SAME", use_bias=False)(x)
        y = nn.BatchNorm(use_running_average=True)(y)
        y = nn.relu(y)
        y = nn.Conv(self.features, (3, 3), padding="SAME", use_bias=False)(y)
        y = nn.BatchNorm(use_running_average=True)(y)
        return nn.relu(x + y)


class ResNetLike(nn.Module):
    """Stem, residual block, grouped VALID conv s2, depthwise conv, GAP + dense."""

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(8, (3, 3), padding="SAME")(x)
        x = ResidualBlock(8)(x)
        x = nn.Conv(8, (3, 3), strides=2, padding="VALID", feature_group_count=2)(x)
        x = nn.relu(x)
        x = nn.Conv(8, (3, 3), padding="SAME", feature_group_count=8)(x)  # depthwise
        x = nn.relu(x)
        return nn.Dense(4)(x.mean(axis=(1, 2)))


ResNetLike.total_stride = 2


class InceptionLike(nn.Module):
    """Parallel branches concatenated, pooled, upsampled back: a dense-output model."""

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(6, (3, 3), strides=2, padding=((1, 1), (1, 1)))(x)
        b1 = nn.Conv(4, (1, 1))(x)
        b2 = nn.Conv(4, (3, 3), padding="SAME")(nn.Conv(4, (1, 1))(x))
        b3 = nn.Conv(4, (1, 1))(nn.max_pool(x, (3, 3), (1, 1), padding="SAME"))
        x = jnp.concatenate([b1, b2, b3], axis=-1)
        x = nn.relu(x)
        x = nn.avg_pool(x, (2, 2), (2, 2))
        x = nn.Conv(8, (3, 3), padding="SAME")(x)
        x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)  # nearest upsampling x2
        x = nn.Conv(4, (3, 3), padding="SAME")(x)
        n, h, w, c = x.shape
        x = jax.image.resize(x, (n, 2 * h, 2 * w, c), "nearest")
        return nn.Conv(3, (1, 1))(x)


InceptionLike.total_stride = 4


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expansion, depthwise 3x3, 1x1 projection, residual."""

    features: int
    expand: int = 3

    @nn.compact
    def __call__(self, x):
        y = nn.Conv(self.features * self.expand, (1, 1), use_bias=False)(x)
        y = nn.relu6(nn.BatchNorm(use_running_average=True)(y))
        wide = y.shape[-1]
        y = nn.Conv(wide, (3, 3), padding="SAME", feature_group_count=wide, use_bias=False)(y)
        y = nn.relu6(nn.BatchNorm(use_running_average=True)(y))
        y = nn.Conv(self.features, (1, 1), use_bias=False)(y)
        return x + nn.BatchNorm(use_running_average=True)(y)


class MobileNetLike(nn.Module):
    """Stem, an inverted residual block on a 32x32 map (a chain of
    `dcjax.kernels.chain` where the tests lower its size rule), a strided
    depthwise conv, GAP + dense."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu6(nn.Conv(8, (3, 3), padding="SAME")(x))
        x = InvertedResidual(8)(x)
        x = nn.Conv(8, (3, 3), strides=2, padding="SAME", feature_group_count=8)(x)
        return nn.Dense(4)(nn.relu6(x).mean(axis=(1, 2)))


MobileNetLike.total_stride = 2

MODELS = {
    "plain": PlainNet,
    "resnet": ResNetLike,
    "inception": InceptionLike,
    "mobilenet": MobileNetLike,
}


def create(name: str, size: int = 32, seed: int = 0):
    """(module, variables) with randomised BatchNorm statistics."""
    module = MODELS[name]()
    variables = module.init(jax.random.key(seed), jnp.zeros((1, size, size, 3)))
    if "batch_stats" in variables:
        keys = iter(jax.random.split(jax.random.key(seed + 1), 1000))
        stats = jax.tree_util.tree_map(
            lambda a: jax.random.uniform(next(keys), a.shape, minval=0.5, maxval=1.5),
            variables["batch_stats"],
        )
        variables = {**variables, "batch_stats": stats}
    return module, variables
