"""A tiny four-block classifier (32x32) for the semantic-exit tests."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "PALETTE",
    "SHAPE",
    "SIZE",
    "Block",
    "TinyNet",
    "calibration",
    "create",
    "frames",
    "shared",
]

SIZE = 32
SHAPE = (SIZE, SIZE, 3)


class Block(nn.Module):
    """conv 3x3 (stride) + relu."""

    features: int
    stride: int = 1

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Conv(self.features, (3, 3), strides=self.stride, padding="SAME")(x)
        return nn.relu(x)


class TinyNet(nn.Module):
    """Four blocks, GAP, dense head."""

    num_classes: int = 6

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = Block(8, 2, name="block0")(x)
        x = Block(8, 1, name="block1")(x)
        x = Block(16, 2, name="block2")(x)
        x = Block(16, 1, name="block3")(x)
        return nn.Dense(self.num_classes, name="fc")(x.mean(axis=(1, 2)))


PALETTE = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [0, 1, 1], [1, 0, 1]], np.float32)


def frames(n: int, cls: int = 0, seed: int = 0) -> np.ndarray:
    """``n`` float32 frames in [0, 1] of class ``cls``: its colour plus smooth noise."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(size=(n, SIZE // 4, SIZE // 4, 3)).astype(np.float32)
    noise = np.repeat(np.repeat(base, 4, axis=1), 4, axis=2)
    return 0.2 * noise + 0.8 * PALETTE[cls]


def create(seed: int = 0) -> tuple[TinyNet, dict]:
    """The model with a nearest-class-mean head: frames of colour k are class k."""
    module = TinyNet(num_classes=len(PALETTE))
    variables = module.init(jax.random.PRNGKey(seed), jnp.zeros((1, SIZE, SIZE, 3)))

    @jax.jit
    def features(x):
        _, state = module.apply(variables, x, capture_intermediates=True, mutable=["intermediates"])
        return state["intermediates"]["block3"]["__call__"][0].mean(axis=(1, 2))

    n = len(PALETTE)
    feats = np.asarray(features(np.concatenate([frames(8, k, seed=100 + k) for k in range(n)])))
    mu = feats.reshape(n, 8, -1).mean(1)
    params = dict(variables["params"])
    params["fc"] = {"kernel": jnp.asarray(2 * mu.T), "bias": jnp.asarray(-(mu**2).sum(1))}
    return module, {"params": params}


@functools.cache
def shared() -> tuple[TinyNet, dict]:
    """`create()`, made once per test process."""
    return create()


@functools.cache
def calibration() -> np.ndarray:
    """Four frames of each class: the calibration images of the tests."""
    return np.concatenate([frames(4, k, seed=10 + k) for k in range(len(PALETTE))])
