"""What users hand a cached model (`dcjax.inputs`): frames and matches, and
the one-line errors that name the argument."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from dcjax import deepcache
from tests.transforms import small_models

SIZE = 32


@pytest.fixture(scope="module")
def plain_cached():
    module, variables = small_models.create("plain", SIZE)
    return deepcache.transform(module, variables, frame_shape=(SIZE, SIZE, 3))


def test_wrong_frame_shape_names_both_shapes(plain_cached):
    with pytest.raises(ValueError, match=r"frame has shape \(30, 32, 3\) but the model was "):
        plain_cached.step(plain_cached.init(), np.zeros((30, SIZE, 3), np.float32))


def test_wrong_frame_rank(plain_cached):
    with pytest.raises(ValueError, match=r"frame must have shape \(32, 32, 3\)"):
        plain_cached.step(plain_cached.init(), np.zeros((1, SIZE, SIZE, 3), np.float32))
    with pytest.raises(ValueError, match=r"frames must have shape"):
        plain_cached.run(np.zeros((SIZE, SIZE, 3), np.float32))


@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.complex64])
def test_wrong_frame_dtype(plain_cached, dtype):
    with pytest.raises(TypeError, match="frame has dtype"):
        plain_cached.step(plain_cached.init(), np.zeros((SIZE, SIZE, 3), dtype))


def test_not_an_array(plain_cached):
    with pytest.raises(TypeError, match="frame must be an array"):
        plain_cached.step(plain_cached.init(), "a frame")


def test_bad_match(plain_cached):
    with pytest.raises(ValueError, match="match.mask has shape"):
        plain_cached.step(
            plain_cached.init(),
            np.zeros((SIZE, SIZE, 3), np.float32),
            match=deepcache.Match(motion=jnp.zeros(2, jnp.int32), mask=jnp.ones((4, 4), bool)),
        )
    with pytest.raises(TypeError, match="match must be a deepcache.Match"):
        plain_cached.step(plain_cached.init(), np.zeros((SIZE, SIZE, 3)), match=(0, 0))


def test_float_frames_beyond_one_are_a_clear_error():
    """Float frames are matched with a PSNR peak of 1.0: frames in 0..255 would
    never match, so the first such frame is refused unless Config.data_range says so."""
    module, variables = small_models.create("plain", SIZE)
    frame = np.random.default_rng(0).uniform(0, 255, (SIZE, SIZE, 3)).astype(np.float32)
    cached = deepcache.transform(module, variables, frame_shape=(SIZE, SIZE, 3))
    with pytest.raises(ValueError, match="PSNR peak of 1.0.*data_range"):
        cached.step(cached.init(), frame)
    with pytest.raises(ValueError, match="frames holds floating-point values up to 2"):
        cached.run(np.stack([frame / 255.0, frame]))
    cached.step(cached.init(), frame / 255.0)  # in [0, 1]: accepted
    ranged = deepcache.transform(
        module, variables, frame_shape=(SIZE, SIZE, 3), config=deepcache.Config(data_range=255.0)
    )
    out, _, _ = ranged.step(ranged.init(), frame)
    np.testing.assert_allclose(out, ranged.apply(frame), rtol=1e-5, atol=1e-5)


def test_fractional_motion_is_a_clear_error(plain_cached):
    frame = np.zeros((SIZE, SIZE, 3), np.float32)
    mask = jnp.ones((SIZE, SIZE), bool)
    with pytest.raises(ValueError, match=r"match.motion must be whole pixels, got \[1.5, 0.0\]"):
        half = deepcache.Match(motion=jnp.array([1.5, 0.0]), mask=mask)
        plain_cached.step(plain_cached.init(), frame, match=half)
    whole = deepcache.Match(motion=jnp.array([2.0, -1.0]), mask=mask)
    # the first frame is recomputed whatever the match says and reports none
    _, state, info = plain_cached.step(plain_cached.init(), frame, match=whole)
    assert np.asarray(info["motion"]).tolist() == [0, 0]
    _, _, info = plain_cached.step(state, frame, match=whole)
    assert np.asarray(info["motion"]).tolist() == [2, -1]
