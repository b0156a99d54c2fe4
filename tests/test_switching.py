"""Plans switched at run time (`dcjax.switching`): the controller's hysteresis on
stand-in plans, and real measured plans of a small model against the model."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcjax
from dcjax.switching import Adaptive, Switch
from tests.tuning_fakes import fake_measurements


class _Plan:
    """A stand-in plan: its step reports the input dirty fraction it is fed."""

    def __init__(self, name):
        self.name, self.inits = name, 0

    def init(self):
        self.inits += 1
        return 0

    def step(self, state, frame):
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
    assert plans[0].inits == 1 and state.plan == 0  # the new plan from a fresh state


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


def test_measured_plans_switch_on_a_real_stream_and_stay_exact(monkeypatch, tmp_path):
    # the tile kernel pays at low dirty fractions, the row kernel at 1/2, nothing at 1
    costs = {
        "dense": lambda f: 1e-3,
        "xla": lambda f: 2e-3 * f + 1e-5,
        "rows": lambda f: 0.4e-3 + 0.8e-3 * f,
    }
    fake_measurements(monkeypatch, tmp_path / "tuning.json", costs)
    net = Net()
    variables = net.init(jax.random.key(0), jnp.zeros((1, *SHAPE)))
    cfg = dcjax.Config(tuning="measure", refresh_every=None, min_match=0.0)
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
