"""Semantic early exits in the cached step: exactness, exits, DeepCache, vmap, calibration."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcjax import deepcache, semantic
from tests.semantic import models

SHAPE = models.SHAPE
INF = float("inf")


def _cached(tau: float, **cfg):
    """A calibrated transform, shared between tests (compiling is the slow part)."""
    return _shared(tau, tuple(sorted(cfg.items())))


@functools.cache
def _shared(tau: float, items: tuple):
    return _fresh(tau, **dict(items))


def _fresh(tau: float, **cfg):
    module, variables = models.shared()
    sem = {k: cfg.pop(k) for k in ("exit_points", "batch_axis", "max_fast") if k in cfg}
    config = deepcache.Config(semantic=deepcache.SemanticConfig(tau=tau, **sem), **cfg)
    cached = deepcache.transform(module, variables, frame_shape=SHAPE, config=config)
    cached.calibrate(models.calibration())
    return cached


def _ref(frame):
    module, variables = models.shared()
    return np.asarray(module.apply(variables, jnp.asarray(frame)[None]))


def _stream():
    return np.concatenate([models.frames(3, 1, seed=50), models.frames(3, 4, seed=51)])


def test_tau_inf_reproduces_the_model():
    cached = _fresh(INF, psnr_threshold=INF)
    state = cached.init()
    for f in _stream():
        out, state, info = cached.step(state, f)
        assert int(info["exit"]) == -1 and int(info["exit_class"]) == -1
        assert float(info["flops_ratio"]) == pytest.approx(1.0)
        np.testing.assert_allclose(np.asarray(out), _ref(f), rtol=1e-6, atol=1e-6)
        assert np.isfinite(np.asarray(info["ac"])).all()  # every exit point was tested
    # never reusing (psnr_threshold=inf): the step keeps no layer caches
    assert all(c is None for c in state.caches)
    assert not any(cached.keeps_cache) and not any(cached.sparse)
    # the memory learned the stream: FT counts the model's predictions
    np.testing.assert_array_equal(np.asarray(state.semantic.frequency), [0, 3, 0, 0, 3, 0])
    assert cached.trace_count == 1  # fixed shapes: one compilation for the stream


def test_tau_minus_inf_always_exits_at_the_first_exit_point():
    cached = _cached(-INF, psnr_threshold=INF)
    state = cached.init()
    block0 = cached.layers[0].flops / cached.total_flops
    for f in _stream():
        out, state, info = cached.step(state, f)
        assert int(info["exit"]) == 0
        cls = int(info["exit_class"])
        assert cls >= 0
        # the output is the stored mean output of the chosen class, in the model's shape
        assert out.shape == _ref(f).shape
        means = np.asarray(state.semantic.out_means[0])
        np.testing.assert_allclose(np.asarray(out)[0], means[cls][0], rtol=1e-6)
        assert float(info["flops_ratio"]) == pytest.approx(block0)
        np.testing.assert_array_equal(np.asarray(state.layer_valid), [True, False, False, False])
        assert np.isnan(np.asarray(info["ac"])[1:]).all()  # later exit points not reached


def test_memory_exits_on_recently_seen_class_and_agrees():
    cached = _cached(0.3, psnr_threshold=INF)
    state = cached.init()
    frames = models.frames(6, 3, seed=60)
    exits, agree = [], []
    for f in frames:
        out, state, info = cached.step(state, f)
        exits.append(int(info["exit"]))
        agree.append(int(np.argmax(out)) == int(np.argmax(_ref(f))))
    assert exits[0] == -1 and max(exits[1:]) >= 0, exits  # exits once the class is hot
    assert all(agree)
    # Eq. 7: centres were updated (counts grew past the calibration's 4) for class 3
    assert float(state.semantic.counts[0, 3]) > 4
    assert int(state.semantic.since_seen[3]) == 0


def test_run_matches_step_and_compiles_once():
    cached = _fresh(0.3, psnr_threshold=INF)
    frames = _stream()
    state = cached.init()
    step_outs, step_exits = [], []
    for f in frames:
        out, state, info = cached.step(state, f)
        step_outs.append(np.asarray(out))
        step_exits.append(int(info["exit"]))
    assert cached.trace_count == 1
    outs, _, infos = cached.run(frames, cached.init())
    np.testing.assert_allclose(np.asarray(outs), np.stack(step_outs), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(infos["exit"]), step_exits)


def _tau(state, tau: float):
    """``state`` with another exit threshold (a state field: no recompilation)."""
    return dataclasses.replace(
        state, semantic=dataclasses.replace(state.semantic, tau=jnp.float32(tau))
    )


def test_skipped_layers_do_not_reuse_stale_caches():
    """An exit leaves stale caches; the next frame recomputes those layers in full."""
    never = _cached(INF, refresh_every=100)
    a, b = models.frames(1, 1, seed=70)[0], models.frames(1, 4, seed=71)[0]
    state = never.init()
    _, state, _ = never.step(state, a)  # every cache holds frame a
    cut = deepcache.Match(motion=jnp.zeros(2, jnp.int32), mask=jnp.zeros(SHAPE[:2], bool))
    _, state, info = never.step(_tau(state, -INF), b, match=cut)  # new scene, exit at block0
    assert int(info["exit"]) == 0
    np.testing.assert_array_equal(np.asarray(state.layer_valid), [True, False, False, False])
    state = _tau(state, INF)
    # the same frame again: the matcher reuses everything it can
    out, state, info = never.step(state, b)
    assert int(info["exit"]) == -1 and not bool(info["refreshed"])
    fractions = np.asarray(info["reuse_fraction"])
    assert fractions[0] == 1.0  # block0 ran on b: its cache is valid
    np.testing.assert_array_equal(fractions[1:], 0.0)  # skipped on b: recomputed
    np.testing.assert_allclose(np.asarray(out), _ref(b), rtol=1e-5, atol=1e-6)
    # the frame after that reuses every layer again
    out, state, info = never.step(state, b)
    np.testing.assert_array_equal(np.asarray(info["reuse_fraction"]), 1.0)
    np.testing.assert_allclose(np.asarray(out), _ref(b), rtol=1e-5, atol=1e-6)


def test_with_deepcache_identical_frames_reuse_and_exit():
    cached = _cached(0.3)
    f = models.frames(1, 2, seed=80)[0]
    state = cached.init()
    _, state, info = cached.step(state, f)
    assert bool(info["refreshed"]) and int(info["exit"]) == -1
    exited = False
    for _ in range(4):
        out, state, info = cached.step(state, f)
        assert float(info["reuse_fraction"][0]) == 1.0  # block0 always runs: reused
        exited |= int(info["exit"]) >= 0
        assert int(np.argmax(out)) == int(np.argmax(_ref(f)))
    assert exited


def _stack(states):
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *states)


def test_vmap_over_streams_is_correct():
    cached = _cached(0.3, psnr_threshold=INF)
    streams = np.stack([models.frames(4, 1, seed=90), models.frames(4, 5, seed=91)])
    singles = []
    for s in streams:
        state, outs = cached.init(), []
        for f in s:
            out, state, info = cached.step(state, f)
            outs.append((np.asarray(out), int(info["exit"])))
        singles.append(outs)
    step = jax.jit(jax.vmap(cached.step))
    state = _stack([cached.init(), cached.init()])
    for t in range(streams.shape[1]):
        out, state, info = step(state, jnp.asarray(streams[:, t]))
        for b in range(2):
            np.testing.assert_allclose(np.asarray(out[b]), singles[b][t][0], rtol=1e-5, atol=1e-6)
            assert int(info["exit"][b]) == singles[b][t][1]


def test_vmap_with_batch_axis_keeps_conditionals_and_exits_together():
    cached = _cached(-INF, psnr_threshold=INF, batch_axis="streams")
    step = jax.vmap(cached.step, axis_name="streams")
    state = _stack([cached.init(), cached.init()])
    frames = jnp.asarray(np.stack([models.frames(1, 0)[0], models.frames(1, 3)[0]]))
    jaxpr = jax.make_jaxpr(step)(state, frames)
    text = str(jaxpr)
    assert "cond[" in text  # not turned into select_n: exits still skip work
    out, state, info = jax.jit(step)(state, frames)
    np.testing.assert_array_equal(np.asarray(info["exit"]), [0, 0])
    # one stream that cannot exit (empty memory) keeps the whole batch running
    empty = dataclasses.replace(
        cached.init(),
        semantic=dataclasses.replace(
            cached.init().semantic, counts=jnp.zeros_like(cached.init().semantic.counts)
        ),
    )
    state = _stack([cached.init(), empty])
    out, state, info = jax.jit(step)(state, frames)
    np.testing.assert_array_equal(np.asarray(info["exit"]), [-1, -1])
    for b in range(2):
        np.testing.assert_allclose(
            np.asarray(out[b]), _ref(np.asarray(frames[b])), rtol=1e-5, atol=1e-6
        )


def test_calibrate_averages_semantic_vectors_per_model_label():
    module, variables = models.shared()
    cached = _cached(0.3)
    memory = cached.init().semantic
    images = models.calibration()
    _, inter = module.apply(
        variables, jnp.asarray(images), capture_intermediates=True, mutable=["intermediates"]
    )
    labels = np.argmax(np.asarray(module.apply(variables, jnp.asarray(images))), -1)
    np.testing.assert_array_equal(np.bincount(labels, minlength=6), [4] * 6)
    for e, name in enumerate(cached.exit_points):
        feats = np.asarray(inter["intermediates"][name]["__call__"][0]).mean(axis=(1, 2))
        for k in range(6):
            np.testing.assert_allclose(
                np.asarray(memory.centres[e][k]), feats[labels == k].mean(0), rtol=1e-4, atol=1e-6
            )
    np.testing.assert_array_equal(np.asarray(memory.counts), 4.0)
    np.testing.assert_allclose(np.asarray(memory.prior), 1 / 6, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(memory.frequency), 0.0)


def test_semantic_features_are_the_full_model_and_feed_the_ceiling():
    module, variables = models.shared()
    cached = _cached(0.3)
    images = models.calibration()
    outs, vecs, labels = cached.semantic_features(images, batch_size=5)  # a padded last batch
    _, inter = module.apply(
        variables, jnp.asarray(images), capture_intermediates=True, mutable=["intermediates"]
    )
    ref = np.asarray(module.apply(variables, jnp.asarray(images)))
    np.testing.assert_allclose(outs[0][:, 0], ref, rtol=1e-4, atol=1e-5)  # (N, 1, classes)
    np.testing.assert_array_equal(labels, np.argmax(ref, -1))
    for e, name in enumerate(cached.exit_points):
        feats = np.asarray(inter["intermediates"][name]["__call__"][0]).mean(axis=(1, 2))
        np.testing.assert_allclose(vecs[e], feats, rtol=1e-4, atol=1e-6)
    # the palette's classes are separable at the last exit point: it can exit everywhere
    res = semantic.exit_ceiling(vecs, labels, vecs, labels, names=cached.exit_points)
    assert res["points"][-1]["accuracy"] == 1.0 and res["points"][-1]["coverage"] == 1.0
    plain = deepcache.transform(module, variables, frame_shape=SHAPE)
    with pytest.raises(ValueError, match="semantic exits"):
        plain.semantic_features(images)


def test_semantic_config_validation():
    with pytest.raises(ValueError, match="max_fast"):
        deepcache.SemanticConfig(max_fast=1)
    with pytest.raises(ValueError, match="confidence"):
        deepcache.SemanticConfig(confidence=0.0)
    with pytest.raises(ValueError, match="tau"):
        deepcache.SemanticConfig(tau=float("nan"))
    with pytest.raises(ValueError, match="exit_points"):
        deepcache.SemanticConfig(exit_points=())
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="max_exits"):
            deepcache.SemanticConfig(max_exits=bad)
    with pytest.raises(ValueError, match="min_agreement"):
        deepcache.SemanticConfig(min_agreement=1.5)
    with pytest.raises(ValueError, match="holdout"):
        deepcache.SemanticConfig(holdout=0.75)
    with pytest.raises(ValueError, match="Config.semantic"):
        deepcache.Config(semantic={"tau": 1.0})
