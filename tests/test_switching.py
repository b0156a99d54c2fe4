"""Plans switched at run time (`dcjax.switching`): the controller's hysteresis on
stand-in plans, and real measured plans of a small model against the model."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcjax
from dcjax.switching import Adaptive, Switch
from tests.tuning_fakes import fake_measurements, race_samples_of


class _Plan:
    """A stand-in plan: its step reports the input dirty fraction it is fed."""

    def __init__(self, name):
        self.name, self.inits, self.steps = name, 0, 0

    def init(self):
        self.inits += 1
        return 0

    def step(self, state, frame):
        self.steps += 1
        dirty, refreshed, skipped = frame
        info = {"input_reuse": 1.0 - dirty, "refreshed": refreshed, "skipped": skipped}
        return self.name, state + 1, info


def _drive(adaptive, frames):
    state, plans = adaptive.init(), []
    for f in frames:
        out, state, info = adaptive.step(state, f)
        assert out == adaptive.models[info["plan"]].name  # the plan that ran
        plans.append(info["plan"])
    return plans, state


def test_a_sustained_change_switches_after_patience_frames_and_starts_afresh():
    plans = [_Plan("low"), _Plan("mid"), _Plan("high")]
    a = Adaptive(plans, [0.1, 0.4, 0.9], smoothing=1.0, margin=0.05, patience=3, start=1)
    assert a.borders == pytest.approx((0.25, 0.65))
    quiet = [(0.05, False, False)] * 5
    ran, state = _drive(a, [(0.4, False, False)] * 2 + quiet)
    # the average is the last frame (smoothing 1): three quiet frames, then the switch
    assert ran == [1, 1, 1, 1, 1, 0, 0]
    assert a.switches == [Switch(frame=5, old=1, new=0, level=pytest.approx(0.05))]
    # every plan stepped once on the first frame (precompiled: a switch compiles
    # nothing), then the new plan from a fresh state: two frames since
    assert [p.steps for p in plans] == [1 + 2, 5, 1]
    assert plans[0].inits == 2 and state.plan == 0 and state.state == 2


def test_spikes_refreshes_still_frames_and_the_margin_do_not_switch():
    plans = [_Plan("low"), _Plan("mid")]
    a = Adaptive(plans, [0.1, 0.5], smoothing=1.0, margin=0.05, patience=2, start=0)
    frames = [
        (0.1, False, False),
        (0.9, False, False),  # a spike: one frame
        (0.1, False, False),
        (1.0, True, False),  # refreshes and still frames are not counted
        (1.0, True, False),
        (0.0, False, True),
        (0.0, False, True),
        (0.33, False, False),  # past the border (0.3) by less than the margin
        (0.34, False, False),
        (0.34, False, False),
    ]
    ran, _ = _drive(a, frames)
    assert ran == [0] * len(frames) and a.switches == []


def test_smoothing_averages_the_dirty_fraction():
    a = Adaptive([_Plan("a"), _Plan("b")], [0.1, 0.9], smoothing=0.5, margin=0.0, patience=1)
    state = a.init()
    levels = []
    for dirty in (0.2, 0.6, 0.6):
        _, state, info = a.step(state, (dirty, False, False))
        levels.append(float(info["level"]))
    assert levels == pytest.approx([0.2, 0.4, 0.5])


def test_bad_controllers_are_errors():
    p = [_Plan("a"), _Plan("b")]
    with pytest.raises(ValueError, match="levels must increase"):
        Adaptive(p, [0.5, 0.1])
    with pytest.raises(ValueError, match="one level per model"):
        Adaptive(p, [0.5])
    with pytest.raises(ValueError, match="smoothing"):
        Adaptive(p, [0.1, 0.5], smoothing=0)
    with pytest.raises(ValueError, match="patience"):
        Adaptive(p, [0.1, 0.5], patience=0)


SHAPE = (24, 24, 3)


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.Conv(8, (3, 3))(x)
        return x.mean(axis=(1, 2))


#: Faked kernel costs: the tile kernel pays at low dirty fractions, the row
#: kernel at 1/2, nothing at 1.
COSTS = {
    "dense": lambda f: 1e-3,
    "xla": lambda f: 2e-3 * f + 1e-5,
    "rows": lambda f: 0.4e-3 + 0.8e-3 * f,
}


def _faked(monkeypatch, tmp_path):
    """`Net`, its variables and a measured config, the kernels' costs `COSTS`."""
    fake_measurements(monkeypatch, tmp_path / "tuning.json", COSTS)
    net = Net()
    variables = net.init(jax.random.key(0), jnp.zeros((1, *SHAPE)))
    return net, variables, dcjax.Config(tuning="measure", refresh_every=None, min_match=0.0)


def test_measured_plans_switch_on_a_real_stream_and_stay_exact(monkeypatch, tmp_path):
    net, variables, cfg = _faked(monkeypatch, tmp_path)
    a = dcjax.adaptive(
        net, variables, frame_shape=SHAPE, config=cfg, levels=(0.125, 0.25, 0.5, 1.0),
        smoothing=1.0, patience=2, start=0, progress=False,
    )  # fmt: skip
    # 0.125 and 0.25 choose the same kernels: three plans
    assert len(a.models) == 3 and a.levels == (0.125, 0.5, 1.0)
    assert [m.tuning.plan for m in a.models] == ["cached", "cached", "dense"]
    assert [m.tuning.choices[0].impl for m in a.models] == ["xla", "rows", "dense"]
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, SHAPE).astype(np.uint8)
    frames = []
    for t in range(12):
        f = base.copy()
        if t >= 4:  # from frame 4 on, the whole frame is new on every frame
            f = rng.integers(0, 256, SHAPE).astype(np.uint8)
        elif t % 2:
            f[:4, :4] = 255 - f[:4, :4]  # a small change in one corner
        frames.append(f)
    state, ran = a.init(), []
    for f in frames:
        out, state, info = a.step(state, f)
        ran.append(int(info["plan"]))
        want = net.apply(variables, jnp.asarray(f, jnp.float32)[None] / 255.0)
        np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=2e-4, atol=2e-5)
    assert ran[:5] == [0] * 5 and ran[-1] == 2
    assert [(s.old, s.new) for s in a.switches] == [(0, 2)]


def test_adaptive_needs_the_measured_auto_kernel():
    net = Net()
    variables = net.init(jax.random.key(0), jnp.zeros((1, *SHAPE)))
    with pytest.raises(ValueError, match="need kernel='auto' with the measured tuning"):
        dcjax.adaptive(net, variables, frame_shape=SHAPE, config=dcjax.Config(kernel="xla"))
    with pytest.raises(ValueError, match="levels must increase within"):
        dcjax.adaptive(
            net, variables, frame_shape=SHAPE, config=dcjax.Config(tuning="measure"),
            levels=(0.5, 0.2),
        )  # fmt: skip


def _measured_plans(monkeypatch, tmp_path, **controller):
    """Three measured plans of `Net` (tile kernel, row kernel, dense) by level."""
    net, variables, cfg = _faked(monkeypatch, tmp_path)
    a = dcjax.adaptive(
        net, variables, frame_shape=SHAPE, config=cfg, levels=(0.125, 0.5, 1.0),
        smoothing=1.0, patience=2, start=0, progress=False, **controller,
    )  # fmt: skip
    assert [m.tuning.choices[0].impl for m in a.models] == ["xla", "rows", "dense"]
    return net, variables, a


def _two_streams(t_busy=4, frames=10):
    """Stream 0 turns wholly new on every frame from ``t_busy`` on; stream 1
    changes a corner on odd frames throughout."""
    rng = np.random.default_rng(1)
    base = [rng.integers(0, 256, SHAPE).astype(np.uint8) for _ in range(2)]
    out = []
    for t in range(frames):
        pair = [b.copy() for b in base]
        if t >= t_busy:
            pair[0] = rng.integers(0, 256, SHAPE).astype(np.uint8)
        if t % 2:
            pair[1][:4, :4] = 255 - pair[1][:4, :4]
        out.append(np.stack(pair))
    return out


@pytest.mark.parametrize("schedule", ["pooled", "sequential"])
def test_switched_streams_follow_their_dirty_fractions_and_stay_exact(
    monkeypatch, tmp_path, schedule
):
    """Sequential: only the stream that turned busy switches (to the dense plan),
    the quiet one keeps the tile kernel. Pooled: the batch switches on the
    average of the two (about 0.5: the row kernel's plan). Every output equals
    the model's."""
    net, variables, a = _measured_plans(monkeypatch, tmp_path)
    streams = a.streams(2, schedule=schedule)
    assert streams.schedule == schedule and streams.raced is None
    states, ran = streams.init(), []
    for frames in _two_streams():
        outs, states, infos = streams.step(states, frames)
        assert np.shape(infos["plan"]) == (2,) and np.shape(infos["level"]) == (2,)
        ran.append(tuple(int(p) for p in infos["plan"]))
        want = net.apply(variables, jnp.asarray(frames, jnp.float32) / 255.0)
        np.testing.assert_allclose(np.asarray(outs)[:, 0], want, rtol=2e-4, atol=2e-5)
    assert ran[:5] == [(0, 0)] * 5
    if schedule == "sequential":
        assert ran[-1] == (2, 0)
        assert [(s.stream, s.old, s.new) for s in streams.switches] == [(0, 0, 2)]
        assert all(s.level == pytest.approx(1.0, abs=0.05) for s in streams.switches)
    else:
        assert ran[-1] == (1, 1)
        assert [(s.stream, s.old, s.new) for s in streams.switches] == [(None, 0, 1)]
        assert 0.4 < streams.switches[0].level < 0.65
    assert a.switches == []  # the single-stream controller's record is its own


class _Streams:
    """A stand-in `Streams` of a stand-in plan: frames are rows of (dirty,
    refreshed, skipped), one per stream."""

    def __init__(self, plan, n, schedule):
        self.plan, self.n, self.schedule, self.raced = plan, n, schedule, None
        self.phases = list(range(n))

    def init(self):
        self.plan.inits += 1
        return np.zeros(self.n)

    def step(self, states, frames):
        frames = np.asarray(frames, np.float64)
        info = {
            "input_reuse": 1.0 - frames[:, 0],
            "refreshed": frames[:, 1] > 0,
            "skipped": frames[:, 2] > 0,
        }
        return np.array([self.plan.name] * self.n), states + 1, info


def test_a_pooled_batch_averages_the_streams_that_ran_and_restarts_them_all():
    class Plan(_Plan):
        def streams(self, n, *, stagger, schedule):
            return _Streams(self, n, "pooled" if schedule == "auto" else schedule)

    plans = [Plan("low"), Plan("high")]
    a = Adaptive(plans, [0.1, 0.9], smoothing=1.0, margin=0.0, patience=2, start=0)
    streams = a.streams(3)
    assert streams.schedule == "pooled"
    state = streams.init()
    busy, quiet = (0.9, 0, 0), (0.1, 0, 0)
    batches = [
        [busy, quiet, (1.0, 1, 0)],  # (0.9 + 0.1) / 2: a refresh does not count
        [busy, busy, (0.0, 0, 1)],  # 0.9: a still frame does not count
        [busy, busy, busy],  # 0.9 again: patience reached, all three switch
        [busy, quiet, quiet],
    ]
    ran = []
    for frames in batches:
        outs, state, infos = streams.step(state, frames)
        assert set(outs) == {a.models[int(infos["plan"][0])].name}
        ran.append(int(infos["plan"][0]))
    assert ran == [0, 0, 0, 1]
    assert [(s.frame, s.stream, s.new) for s in streams.switches] == [(3, None, 1)]
    assert streams.switches[0].level == pytest.approx(0.9)
    # plan 1: precompiled on the first batch, then fresh at the switch, then a step
    assert plans[1].inits == 2 and np.array_equal(state.state, np.ones(3))
    with pytest.raises(TypeError, match="AdaptiveState"):
        streams.step((state,), batches[0])


def test_calibration_frames_add_their_own_level_and_the_run_starts_on_it(monkeypatch, tmp_path):
    """With calibration frames, the frames' own input dirty fraction is a level:
    its plan chooses the kernels `transform` chooses for the same frames, and
    the run starts on it."""
    net, variables, cfg = _faked(monkeypatch, tmp_path)
    monkeypatch.setattr(  # the tuned plan wins its race
        "dcjax.race.race_samples",
        lambda models, frames: race_samples_of([1.0] + [2.0] * (len(models) - 1)),
    )  # fmt: skip
    rng = np.random.default_rng(3)
    frames = np.repeat(rng.integers(0, 256, (1, *SHAPE)).astype(np.uint8), 6, axis=0)
    frames[1::2, :6, :6] = 255 - frames[1::2, :6, :6]  # a corner changes: a low fraction
    cal = dcjax.calibrate(net, variables, frame_shape=SHAPE, frames=frames, config=cfg)
    assert 0 < cal.input < 0.5
    a = dcjax.adaptive(net, variables, frame_shape=SHAPE, config=cfg, levels=(0.5, 1.0),
                       calibration=frames, progress=False)  # fmt: skip
    assert a.levels[a.start] == pytest.approx(cal.input)
    assert a.init().plan == a.start == 0
    same = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg, calibration=frames)
    assert a.models[a.start].tuning.choices == same.tuning.choices
    assert [t.fraction for t in a.models[a.start].tuning.layers] == pytest.approx(
        [t.fraction for t in same.tuning.layers], rel=1e-4
    )
