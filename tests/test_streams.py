"""Many streams through one cached model (dcjax/streams.py)."""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import subprocess
import sys

import jax
import jax.extend
import numpy as np
import pytest

from dcjax import Config, transform
from tests import streams_worker as worker
from tests.transforms import small_models
from tests.translated import nothing_reusable

N, T, SIZE = worker.STREAMS, worker.FRAMES, worker.SIZE


@functools.cache
def _clip() -> np.ndarray:
    return worker.clip()


@functools.cache
def _cached(statistics: bool = False):
    if not statistics:
        return worker.cached_model()
    module, variables = small_models.create("resnet", SIZE)
    return transform(
        module, variables, frame_shape=(SIZE, SIZE, 3),
        config=Config(kernel="xla", refresh_every=3, statistics=True),
    )  # fmt: skip


def _single_streams(cached, frames, phases):
    """Each stream stepped alone with `CachedModel.step`: (T, N, ...) outputs and refreshes."""
    outs, refreshed = [], []
    for i, phase in enumerate(phases):
        state, o, r = cached.init(refresh_phase=phase), [], []
        for t in range(len(frames)):
            out, state, info = cached.step(state, frames[t, i])
            o.append(np.asarray(out))
            r.append(bool(info["refreshed"]))
        outs.append(o)
        refreshed.append(r)
    return np.swapaxes(np.asarray(outs), 0, 1), np.asarray(refreshed).T


def _close(a, b):
    scale = max(float(np.abs(b).max()), 1.0)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2e-5 * scale)


@functools.cache
def _reference():
    """The unsharded streams on the worker's clip: step by step, and `run`."""
    cached = _cached()
    streams = cached.streams(N)
    states, outs, refreshed = streams.init(), [], []
    for t in range(T):
        out, states, info = streams.step(states, _clip()[t])
        outs.append(np.asarray(out))
        refreshed.append(np.asarray(info["refreshed"]))
    run_outs, _, _ = streams.run(_clip())
    return streams, np.stack(outs), np.stack(refreshed), np.asarray(run_outs)


def test_streams_equal_independent_steps_with_staggered_refreshes():
    streams, outs, refreshed, run_outs = _reference()
    single, single_refreshed = _single_streams(_cached(), _clip(), streams.phases)
    _close(outs, single)
    np.testing.assert_array_equal(refreshed, single_refreshed)
    _close(run_outs, outs)
    assert streams.phases == [0, 0, 0, 1, 1, 1, 2, 2]  # refresh_every=3 over 8 streams
    # every stream refreshes on the first frame; after that, never all at once
    assert refreshed[0].all()
    assert not refreshed[1:].all(axis=1).any()
    assert refreshed[1:].any(axis=1).all()  # each later frame refreshes some stream (period 3)


@pytest.mark.parametrize(
    ("matcher", "key_shape"), [("static", (3, 1, SIZE, SIZE)), ("none", (3, 0))]
)
def test_streams_keep_the_same_position_key_as_planes_and_no_key_without_a_matcher(
    matcher, key_shape
):
    """Each stream's key under `jax.vmap`: the same-position matcher's luma
    planes, none without a matcher; the streams equal each stream stepped
    alone."""
    module, variables = small_models.create("resnet", SIZE)
    cached = transform(
        module, variables, frame_shape=(SIZE, SIZE, 3),
        config=Config(kernel="xla", matcher=matcher, refresh_every=3),
    )  # fmt: skip
    frames = _clip()[:, :3]
    streams = cached.streams(3)
    states, outs = streams.init(), []
    assert states.prev_frame.shape == key_shape
    for t in range(T):
        out, states, _ = streams.step(states, frames[t])
        outs.append(np.asarray(out))
    assert states.prev_frame.shape == key_shape
    single, _ = _single_streams(cached, frames, streams.phases)
    _close(np.stack(outs), single)


def _loop_carries(jaxpr):
    """Shapes of every loop carry in ``jaxpr`` and the jaxprs nested in it."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            out += [tuple(v.aval.shape) for v in eqn.params["body_jaxpr"].jaxpr.outvars]
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            out += _loop_carries(sub)
    return out


def test_no_loop_of_the_streams_step_carries_a_cache_with_its_batch_axis_of_1():
    # Under vmap a (1, H, W, C) carry becomes (N, 1, H, W, C), which XLA:CPU
    # lays out apart from the state's (N, H, W, C) buffer and copies in and
    # out of the loop on every step (docs/performance-notes.md).
    cached = _cached()
    states = cached.streams(N).init()
    frames = np.zeros((N, SIZE, SIZE, 3), np.uint8)
    step = jax.vmap(cached._step, in_axes=(None, 0, 0, None))
    jaxpr = jax.make_jaxpr(step)(cached._traced.leaves, states, frames, None).jaxpr
    caches = {tuple(c.shape[1:]) for c in states.caches if c is not None}
    assert caches and all(len(c) == 3 for c in caches)
    carries = _loop_carries(jaxpr)
    assert {(N, *c) for c in caches} <= set(carries)  # the caches do go through loops
    assert not [s for s in carries if len(s) == 5 and s[1] == 1 and tuple(s[2:]) in caches]


def test_sequential_streams_equal_the_pooled_ones():
    pooled, outs, refreshed, run_outs = _reference()
    streams = _cached().streams(N, schedule="sequential")
    assert streams.phases == pooled.phases
    states = streams.init()
    assert isinstance(states, tuple) and len(states) == N
    got, got_refreshed = [], []
    for t in range(T):
        out, states, info = streams.step(states, _clip()[t])
        got.append(np.asarray(out))
        got_refreshed.append(np.asarray(info["refreshed"]))
    _close(np.stack(got), outs)
    np.testing.assert_array_equal(np.stack(got_refreshed), refreshed)
    run, states, infos = streams.run(_clip())
    _close(run, run_outs)
    assert np.asarray(infos["refreshed"]).shape == (T, N)
    assert len(states) == N


@pytest.mark.parametrize(
    ("times", "schedule"), [((2.0, 1.0), "sequential"), ((1.0, 2.0), "pooled")]
)
def test_auto_schedule_races_the_two_on_the_calibration_frames(monkeypatch, times, schedule):
    module, variables = small_models.create("resnet", SIZE)
    calibration = _clip()[:, 0]
    cached = transform(
        module, variables, frame_shape=(SIZE, SIZE, 3),
        config=Config(kernel="xla", refresh_every=3), calibration=calibration,
    )  # fmt: skip
    assert cached.calibration is calibration
    raced = []

    def race(models, frames):
        raced.append(([m.schedule for m in models], np.asarray(frames)))
        return times

    monkeypatch.setattr("dcjax.race.race", race)
    streams = cached.streams(3)
    [(names, frames)] = raced
    assert names == ["pooled", "sequential"]
    assert frames.shape == (T, 3, SIZE, SIZE, 3)  # stream i starts i * T // 3 frames in
    for i in range(3):
        np.testing.assert_array_equal(frames[:, i], np.roll(calibration, -(i * T // 3), axis=0))
    assert streams.schedule == schedule
    assert streams.raced == {"pooled": times[0], "sequential": times[1]}
    states = streams.init()
    assert isinstance(states, tuple) == (schedule == "sequential")
    out, _, _ = streams.step(states, _clip()[0, :3])
    assert out.shape[0] == 3
    # without calibration frames, or on a mesh, it pools without a race
    raced.clear()
    assert _cached().streams(2).schedule == "pooled" and _cached().streams(2).raced is None
    mesh = jax.make_mesh((1,), ("streams",))
    assert cached.streams(2, mesh=mesh).schedule == "pooled"
    assert not raced


def test_auto_schedule_keeps_the_faster_of_a_real_race():
    module, variables = small_models.create("resnet", SIZE)
    cached = transform(
        module, variables, frame_shape=(SIZE, SIZE, 3),
        config=Config(kernel="xla", refresh_every=3), calibration=_clip()[:4, 0],
    )  # fmt: skip
    streams = cached.streams(2)
    assert set(streams.raced) == {"pooled", "sequential"}
    assert all(t > 0 for t in streams.raced.values())
    assert streams.schedule == min(streams.raced, key=streams.raced.get)


def test_given_matches_go_to_each_stream_under_both_schedules():
    from dcjax import Match

    cached = _cached()
    rng = np.random.default_rng(3)
    clip = _clip()[:2, :3]
    masks = rng.random((3, SIZE, SIZE)) < 0.7
    matches = Match(motion=np.zeros((3, 2), np.int32), mask=masks)
    # the first steps are given matches too (nothing reusable): one program each
    nothing = Match(motion=np.zeros((3, 2), np.int32), mask=np.zeros((3, SIZE, SIZE), bool))
    results = {}
    for schedule in ("pooled", "sequential"):
        streams = cached.streams(3, stagger=False, schedule=schedule)
        states = streams.init()
        _, states, _ = streams.step(states, clip[0], nothing)
        results[schedule], _, _ = streams.step(states, clip[1], matches)
    for i in range(3):
        state = cached.init()
        _, state, _ = cached.step(state, clip[0, i], nothing_reusable((SIZE, SIZE)))
        want, _, _ = cached.step(
            state, clip[1, i], Match(motion=np.zeros(2, np.int32), mask=masks[i])
        )
        for got in results.values():
            _close(np.asarray(got)[i], want)


def test_a_sequential_still_stream_skips_its_network_while_others_move():
    cached = _cached(statistics=True)
    streams = cached.streams(2, stagger=False, schedule="sequential")
    clip = _clip()[:2, :2].copy()
    clip[1, 0] = 255 - clip[0, 0]  # stream 0 changes everywhere
    clip[1, 1] = clip[0, 1]  # stream 1 stands still
    states = streams.init()
    for t in range(2):
        out, states, info = streams.step(states, clip[t])
    assert np.asarray(info["skipped"]).tolist() == [False, True]


def test_bad_schedules_and_sequential_states_are_errors():
    cached = _cached()
    with pytest.raises(ValueError, match="schedule must be one of"):
        cached.streams(2, schedule="fast")
    mesh = jax.make_mesh((1,), ("streams",))
    with pytest.raises(ValueError, match="sequential schedule runs on one device"):
        cached.streams(2, mesh=mesh, schedule="sequential")
    streams = cached.streams(2, schedule="sequential")
    frames = _clip()[0, :2]
    with pytest.raises(ValueError, match="states must be the tuple of 2 states"):
        streams.step(cached.streams(2).init(), frames)  # the pooled schedule's stack
    with pytest.raises(ValueError, match="states must be the tuple of 2 states"):
        streams.step(cached.streams(3, schedule="sequential").init(), frames)


def test_unstaggered_streams_refresh_together():
    cached = _cached()
    streams = cached.streams(N, stagger=False)
    assert streams.phases == [0] * N
    states = streams.init()
    refreshed = []
    for t in range(T):
        _, states, info = streams.step(states, _clip()[t])
        refreshed.append(np.asarray(info["refreshed"]))
    refreshed = np.stack(refreshed)
    assert (refreshed.all(axis=1) | ~refreshed.any(axis=1)).all()
    assert refreshed[3].all()  # the period of 3 after the first frame


def test_a_still_stream_contributes_no_tiles():
    """Two moving streams and a still one: the still one reuses every pixel of
    every layer while the network runs for the others, and gives the output of
    its own last frame."""
    cached = _cached(statistics=True)
    streams = cached.streams(3, stagger=False)
    clip = _clip()[:2, :3].copy()
    clip[1, 0] = np.roll(clip[0, 0], 4, axis=1)  # stream 0 pans
    clip[1, 1] = clip[0, 1]  # stream 1 stands still
    clip[1, 2] = 255 - clip[0, 2]  # stream 2 changes everywhere
    states = streams.init()
    for t in range(2):
        out, states, info = streams.step(states, clip[t])
    assert np.asarray(info["skipped"]).tolist() == [False, True, False]
    fractions = np.asarray(info["reuse_fraction"])
    np.testing.assert_array_equal(fractions[1], 1.0)
    assert (fractions[[0, 2]] < 1.0).any()
    alone, _ = _single_streams(cached, clip[:, 1:2], [0])
    _close(np.asarray(out)[1], alone[-1, 0])


def test_refresh_phase_moves_the_first_periodic_refresh():
    cached = _cached()
    for phase in range(3):
        state, refreshed = cached.init(refresh_phase=phase), []
        for t in range(T):
            _, state, info = cached.step(state, _clip()[t, 0])
            refreshed.append(bool(info["refreshed"]))
        expected = [t == 0 or (t + phase) % 3 == 0 for t in range(T)]
        assert refreshed == expected, phase


@pytest.mark.parametrize("phase", [-1, 3, 1.5, True])
def test_refresh_phase_out_of_range_is_an_error(phase):
    with pytest.raises(ValueError, match="refresh_phase must be an int in 0..2"):
        _cached().init(refresh_phase=phase)


def test_bad_streams_input_is_an_error_naming_the_argument():
    cached = _cached()
    streams = cached.streams(2)
    states = streams.init()
    frames = _clip()[0, :2]
    with pytest.raises(ValueError, match=r"frames\[1\] has frame shape \(16, 32, 3\)"):
        streams.step(states, [frames[0], frames[1][:16]])
    with pytest.raises(ValueError, match="frames has 3 streams on axis 0; expected 2"):
        streams.step(states, _clip()[0, :3])
    with pytest.raises(ValueError, match=r"frames must have shape \(2, 32, 32, 3\)"):
        streams.step(states, frames[0])
    with pytest.raises(ValueError, match=r"states\.prev_frame has shape \(3, .* expected \(2, "):
        streams.step(cached.streams(3).init(), frames)
    with pytest.raises(ValueError, match=r"states\.prev_frame has shape \(1, 32, 32\)"):
        streams.step(cached.init(), frames)  # one stream's state
    other = dataclasses.replace(cached.config, refine=None, skip_unchanged=False)
    module, variables = small_models.create("resnet", SIZE)
    elsewhere = transform(module, variables, frame_shape=(SIZE, SIZE, 3), config=other)
    with pytest.raises(ValueError, match="states were not made for this model and config"):
        streams.step(elsewhere.streams(2).init(), frames)
    with pytest.raises(ValueError, match="n \\(streams\\) must be a positive int"):
        cached.streams(0)
    mesh = jax.make_mesh((1,), ("cams",))
    with pytest.raises(ValueError, match="not the streams axis 'streams'"):
        cached.streams(2, mesh=mesh)
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
        cached.streams(2, mesh="cpu")


def _worker(out, *args, devices):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    )
    return subprocess.Popen(
        [sys.executable, "-m", "tests.streams_worker", str(out), *map(str, args)],
        env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait(proc):
    try:
        out, _ = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    assert proc.returncode == 0, out


def test_streams_sharded_over_four_devices_equal_one_device(tmp_path):
    _wait(_worker(tmp_path / "sharded.npz", devices=4))
    got = np.load(tmp_path / "sharded.npz")
    assert int(got["devices"]) == 4
    _, outs, refreshed, run_outs = _reference()
    _close(got["outs"], outs)
    np.testing.assert_array_equal(got["refreshed"], refreshed)
    _close(got["run"], run_outs)


def test_mesh_that_does_not_divide_the_streams_is_an_error(tmp_path):
    script = (
        "import jax; from tests import streams_worker as w\n"
        "mesh = jax.make_mesh((4,), ('streams',))\n"
        "try:\n    w.cached_model().streams(6, mesh=mesh)\n"
        "except ValueError as e:\n    print(e)\n"
    )
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "4 devices, which does not divide n=6 streams" in out.stdout, out.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_streams_over_two_processes_equal_one_process(tmp_path):
    """`jax.distributed` on loopback: two processes of two devices each, each
    feeding and reading its own four streams."""
    port = _free_port()
    procs = [_worker(tmp_path / f"p{i}.npz", i, 2, port, devices=2) for i in range(2)]
    for p in procs:
        _wait(p)
    _, outs, refreshed, _ = _reference()
    for i in range(2):
        got = np.load(tmp_path / f"p{i}.npz")
        assert int(got["processes"]) == 2 and int(got["devices"]) == 4
        first = int(got["first"])
        assert first == 4 * i
        _close(got["outs"], outs[:, first : first + 4])
        np.testing.assert_array_equal(got["refreshed"], refreshed[:, first : first + 4])


def test_streams_of_one_model_share_their_jitted_step():
    cached = _cached()
    a, b = cached.streams(2), cached.streams(4, stagger=False, schedule="pooled")
    assert a._step_fn(False) is b._step_fn(False)  # compiled once a shape, not once a Streams
    mesh = jax.make_mesh((1,), ("streams",))
    assert cached.streams(2, mesh=mesh)._step_fn(False) is not a._step_fn(False)
