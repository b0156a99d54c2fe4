"""Shared fixtures of the eval tests: a tiny Flax CNN and short real frames."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.eval.registry import ModelSpec

SIZE = 40


class TinyCNN(nn.Module):
    """conv(s1) -> conv(s2) -> maxpool -> conv -> global mean -> dense: 3 reused convs."""

    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3), padding="SAME", name="conv1")(x))
        x = nn.relu(nn.Conv(16, (3, 3), strides=(2, 2), padding="SAME", name="conv2")(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(nn.Conv(16, (3, 3), padding="SAME", name="conv3")(x))
        return nn.Dense(self.num_classes, name="head")(x.mean((1, 2)))


def tiny_spec(size: int = SIZE, seed: int = 0) -> ModelSpec:
    module = TinyCNN()
    variables = module.init(jax.random.PRNGKey(seed), jnp.zeros((1, size, size, 3)))
    return ModelSpec(name="tiny", module=module, variables=variables, frame_shape=(size, size, 3))


@pytest.fixture(scope="session")
def spec() -> ModelSpec:
    return tiny_spec()


@pytest.fixture(scope="session")
def clip() -> np.ndarray:
    """Six real frames of the bundled fixed-camera clip at SIZE x SIZE."""
    from dcjax.eval.harness import load_frames

    return load_frames("vtest", (SIZE, SIZE, 3), frames=6)
