"""The exits' guard and the calibration's held-back check (finding 7 of the never-wrong contract).

Semantic exits' defaults must never return garbage for long: at most
``max_exits`` exits in a row, each run of them checked by a full inference; a
stream whose checks disagree runs without exits; a calibration whose held-back
images do not exit to the full model's class switches the exits off.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
import pytest

from dcjax import deepcache
from dcjax.semantic import guard as guard_lib
from dcjax.semantic.check import check_held_back, held_back
from tests.semantic import models

SHAPE = models.SHAPE
INF = float("inf")


@functools.cache
def _cached(tau: float, max_exits: int):
    module, variables = models.shared()
    sem = deepcache.SemanticConfig(tau=tau, max_exits=max_exits)
    config = deepcache.Config(semantic=sem, psnr_threshold=INF)
    cached = deepcache.transform(module, variables, frame_shape=SHAPE, config=config)
    cached.calibrate(models.calibration())
    return cached


def _full_class(frame) -> int:
    module, variables = models.shared()
    return int(np.argmax(np.asarray(module.apply(variables, jnp.asarray(frame)[None]))))


def test_the_guard_bounds_streaks_cools_down_after_a_mismatch_and_switches_off():
    g = guard_lib.fresh()
    step = functools.partial(guard_lib.after_frame, max_exits=2, min_agreement=0.9)

    def frame(g, exited, exit_class=-1, predicted=0):
        return step(g, exited=jnp.bool_(exited), exit_class=jnp.int32(exit_class),
                    predicted=jnp.int32(predicted))  # fmt: skip

    allows = lambda g: bool(guard_lib.allows(g, 2))
    assert allows(g)
    g = frame(frame(g, True, 5), True, 5)
    assert not allows(g)  # two exits in a row: the next frame runs in full
    g = frame(g, False, predicted=5)  # a check that agrees
    assert (int(g.checks), int(g.mismatches), int(g.streak)) == (1, 0, 0) and allows(g)
    g = frame(frame(g, True, 3), True, 3)
    g = frame(g, False, predicted=4)  # a check that disagrees: two full frames of cool-down
    assert (int(g.checks), int(g.mismatches)) == (2, 1) and bool(g.enabled)
    for _ in range(2):
        assert not allows(g)
        g = frame(g, False, predicted=4)
    assert allows(g)
    # a full frame that is not a check (the memory did not exit) restarts the streak
    g = frame(frame(g, True, 4), False, predicted=4)
    assert int(g.streak) == 0 and int(g.checks) == 2
    g = frame(frame(g, True, 1), True, 1)
    g = frame(g, False, predicted=2)  # the second mismatch of 3 checks: off for good
    assert not bool(g.enabled)
    for _ in range(10):
        g = frame(g, False, predicted=2)
        assert not allows(g)


def test_no_more_than_max_exits_in_a_row_and_each_run_is_checked():
    cached = _cached(-INF, 3)  # the memory would exit on every frame
    state = cached.init()
    infos = []
    for f in models.frames(14, 1, seed=50):
        out, state, info = cached.step(state, f)
        infos.append({k: int(info[k]) for k in ("exit", "exit_class", "predicted_class",
                                                "exit_check")})  # fmt: skip
        infos[-1]["full"] = _full_class(f)
    exited = [i["exit"] >= 0 for i in infos]
    assert exited == [True, True, True, False] * 3 + [True, True]
    for t, i in enumerate(infos):
        if not exited[t]:  # a check: the full model's class against the last exit's
            assert i["predicted_class"] == i["full"]
            want = 1 if i["full"] == infos[t - 1]["exit_class"] else -1
            assert i["exit_check"] == want
        else:
            assert i["exit_check"] == 0
    assert int(state.semantic.guard.checks) == 3 and bool(state.semantic.guard.enabled)


def test_a_wrong_memory_is_caught_by_its_checks_and_switched_off():
    """Centres moved one class over and a threshold every frame passes: every
    exit returns a wrong class; two checks disagree, and the stream runs
    without exits from then on."""
    cached = _cached(-INF, 3)
    state = cached.init()
    memory = state.semantic
    wrong = dataclasses.replace(
        memory, centres=tuple(jnp.roll(c, -1, axis=0) for c in memory.centres)
    )  # class k's centre now sits at k - 1
    state = dataclasses.replace(state, semantic=wrong)
    frames = models.frames(30, 1, seed=80)
    wrong_outputs, enabled, exits = 0, [], []
    for f in frames:
        out, state, info = cached.step(state, f)
        wrong_outputs += int(np.argmax(np.asarray(out))) != _full_class(f)
        enabled.append(bool(info["exits_enabled"]))
        exits.append(int(info["exit"]) >= 0)
    guard = state.semantic.guard
    assert int(guard.mismatches) == 2 and not bool(guard.enabled)
    off = enabled.index(False)
    assert not any(exits[off:])  # no exit once switched off
    assert wrong_outputs <= 2 * 3  # at most two runs of max_exits wrong exits
    assert any(exits)


def test_held_back_images_are_spread_evenly():
    np.testing.assert_array_equal(np.nonzero(held_back(12, 0.25))[0], [3, 7, 11])
    assert not held_back(10, 0.0).any()
    assert held_back(10, 0.5).sum() == 5


def test_the_held_back_check_passes_clustered_classes_and_fails_near_ties():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 10)
    centres = rng.normal(size=(4, 16)) * 3
    clustered = [centres[labels] + rng.normal(size=(40, 16)) * 0.1]
    check = check_held_back(clustered, labels, tau=-INF, share=0.25, min_agreement=0.9)
    assert check.passed and check.exited == 10 and check.agreement == 1.0
    # labels that do not follow the vectors: exits agree by chance only
    shuffled = rng.permutation(labels)
    check = check_held_back(clustered, shuffled, tau=-INF, share=0.25, min_agreement=0.9)
    assert not check.passed and check.agreement < 0.6
    assert "runs without exits" in check.describe()
    # a threshold no image passes: nothing exits, nothing to refuse
    check = check_held_back(clustered, shuffled, tau=INF, share=0.25, min_agreement=0.9)
    assert check.passed and check.exited == 0 and check.agreement is None
    assert check_held_back(clustered, labels, tau=0.0, share=0.0, min_agreement=0.9).held_back == 0


def test_a_calibration_whose_exits_disagree_runs_without_exits_and_says_so():
    module, variables = models.shared()
    rng = np.random.default_rng(0)
    # images halfway between two classes: the model's top-1 flips with the noise
    mix = 0.5 * models.PALETTE[0] + 0.5 * models.PALETTE[1]
    tied = (mix + rng.normal(0, 0.05, (24, *SHAPE))).astype(np.float32)
    config = deepcache.Config(semantic=deepcache.SemanticConfig(tau=-INF), psnr_threshold=INF)
    cached = deepcache.transform(module, variables, frame_shape=SHAPE, config=config)
    with pytest.warns(UserWarning, match="semantic exits switched off"):
        cached.calibrate(np.concatenate([models.calibration(), tied]))
    check = cached.semantic_check
    assert not check.passed and check.held_back == 12 and check.agreement < 0.9
    state = cached.init()
    for f in models.frames(4, 2, seed=90):
        out, state, info = cached.step(state, f)
        assert int(info["exit"]) == -1 and not bool(info["exits_enabled"])
        assert int(np.argmax(np.asarray(out))) == _full_class(f)
