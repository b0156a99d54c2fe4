"""Streams: one compile for a whole stream, inside jit, scan and vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dcjax.matching import match
from tests.matching.frames import degrade, photo


def _pan(n: int, velocity=(1, -2), shape=(64, 84), origin=(150, 150), seed=0):
    """``n`` frames of a camera panning so that frame t+1 = frame t moved by velocity."""
    img = photo("astronaut")
    vy, vx = velocity
    frames = []
    for t in range(n):
        y, x = origin[0] + t * vy, origin[1] + t * vx
        frames.append(degrade(img[y : y + shape[0], x : x + shape[1]], seed=seed + t))
    return np.stack(frames)


def test_one_compile_for_a_stream():
    traces = []

    @jax.jit
    def step(prev, cur, motion):
        traces.append(1)  # runs only while tracing
        m = match(prev, cur, init_motion=motion, k_skip=2)
        return m.motion, m.match_ratio

    frames = _pan(6)
    motion = jnp.zeros((2,), jnp.int32)
    for t in range(1, len(frames)):
        motion, ratio = step(frames[t - 1], frames[t], motion)
        assert tuple(np.asarray(motion)) == (1, -2)
        assert float(ratio) > 0.6
    assert len(traces) == 1


def test_scan_over_a_stream_feeds_the_motion_forward():
    frames = jnp.asarray(_pan(5, velocity=(-2, 1)))

    def step(carry, cur):
        prev, motion = carry
        m = match(prev, cur, init_motion=motion, k_skip=2)
        return (cur, m.motion), (m.motion, m.match_ratio)

    init = (frames[0], jnp.zeros((2,), jnp.int32))
    _, (motions, ratios) = jax.jit(lambda f: jax.lax.scan(step, init, f[1:]))(frames)
    np.testing.assert_array_equal(np.asarray(motions), np.tile([-2, 1], (4, 1)))
    assert (np.asarray(ratios) > 0.6).all()


def test_vmap_over_streams_equals_one_stream_at_a_time():
    velocities = [(1, -2), (-3, 0), (0, 4)]
    prevs, curs = [], []
    for i, v in enumerate(velocities):
        f = _pan(2, velocity=v, origin=(150 + 7 * i, 140 + 5 * i), seed=10 * i)
        prevs.append(f[0])
        curs.append(f[1])
    prevs, curs = np.stack(prevs), np.stack(curs)
    batched = jax.jit(jax.vmap(lambda p, c: match(p, c, k_skip=2)))(prevs, curs)
    for i, v in enumerate(velocities):
        one = match(prevs[i], curs[i], k_skip=2)
        assert tuple(np.asarray(batched.motion[i])) == v
        np.testing.assert_array_equal(np.asarray(batched.motion[i]), np.asarray(one.motion))
        np.testing.assert_array_equal(np.asarray(batched.mask[i]), np.asarray(one.mask))
        np.testing.assert_array_equal(
            np.asarray(batched.block_vectors[i]), np.asarray(one.block_vectors)
        )
        np.testing.assert_allclose(
            np.asarray(batched.block_psnr[i]), np.asarray(one.block_psnr), atol=1e-4
        )
