"""The measured plan (`dcjax.autotune`): per-layer kernels from measurements,
the dense plan where caching cannot pay, calibration on the stream's frames."""

import dataclasses
import json
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcjax
from dcjax import autotune
from dcjax import lowerings as lowerings_mod
from dcjax.eval import methods
from dcjax.kernels import lowering
from dcjax.kernels import tuning as kt
from tests.translated import panning_frames
from tests.tuning_fakes import fake_measurements, race_samples_of

SHAPE = (24, 24, 3)


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.Conv(8, (1, 1))(x)
        return x.mean(axis=(1, 2))


@pytest.fixture(scope="module")
def model():
    net = Net()
    return net, net.init(jax.random.key(0), jnp.zeros((1, *SHAPE)))


def _frames(t=6, seed=0):
    frames = panning_frames(SHAPE, t, seed)
    frames[3] = frames[2]  # a still frame
    return frames


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """Timings by impl as the test sets them; a matcher cost of its choosing."""
    costs = {}
    matcher = {"diamond": 1e-4, "static": 1e-5}
    return costs, fake_measurements(monkeypatch, tmp_path / "tuning.json", costs, matcher)


def _check_outputs(cached, net, variables, frames):
    state = cached.init()
    for f in frames:
        out, state, info = cached.step(state, f)
        want = net.apply(variables, jnp.asarray(f, jnp.float32)[None] / 255.0)
        np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=2e-4, atol=2e-5)
    return info


def test_sparse_kernels_that_pay_make_a_cached_plan(model, fake):
    costs, _ = fake
    costs.update(dense=lambda f: 1e-3, xla=lambda f: 1e-4 + 5e-4 * f, rows=lambda f: 2e-3)
    net, variables = model
    cached = dcjax.transform(
        net, variables, frame_shape=SHAPE, config=dcjax.Config(tuning="measure")
    )
    t = cached.tuning
    assert t.plan == "cached" and t.saving > t.overhead > 0
    assert [c.impl for c in t.choices] == ["xla"] * 3
    # the row kernel lost on the 3x3 probe: not measured on the other 3x3 layer
    # (3 candidates of each probe, 2 of the other 3x3 layer, the two matchers)
    assert t.passed_over == 1 and "(10 measurements, 1 passed over, " in t.summary()
    assert [lp.kernel.impl for lp in cached.plan.layers] == ["xla"] * 3
    assert all(cached.keeps_cache) and cached.config.kernel == "auto"
    assert dcjax.Config(tuning="measure") == cached.config
    _check_outputs(cached, net, variables, _frames())


def test_dense_kernels_everywhere_make_the_dense_plan_with_the_still_skip(model, fake):
    costs, _ = fake
    costs.update(dense=lambda f: 1e-4, xla=lambda f: 2e-4, rows=lambda f: 3e-4)
    net, variables = model
    cached = dcjax.transform(
        net, variables, frame_shape=SHAPE, config=dcjax.Config(tuning="measure")
    )
    assert cached.tuning.plan == "dense" and cached.tuning.saving == 0
    assert cached.config == autotune.dense_config(dcjax.Config(tuning="measure"))
    assert not any(cached.keeps_cache)
    frames = _frames()
    _check_outputs(cached, net, variables, frames)
    state = cached.init()
    skipped = []
    for f in frames:
        _, state, info = cached.step(state, f)
        skipped.append(bool(info["skipped"]))
    assert skipped == [False, False, False, True, False, False]


def test_a_saving_below_the_matchers_cost_makes_the_dense_plan(model, fake, monkeypatch, tmp_path):
    costs, matcher = fake
    costs.update(dense=lambda f: 1e-3, xla=lambda f: 0.9e-3, rows=lambda f: 2e-3)
    net, variables = model
    # saving 3 x 0.1 ms against a matcher 1 ms dearer than the still test
    matcher["diamond"] = 1.1e-3
    cached = dcjax.transform(
        net, variables, frame_shape=SHAPE, config=dcjax.Config(tuning="measure")
    )
    assert cached.tuning.plan == "dense"
    assert cached.tuning.overhead == pytest.approx(1.1e-3 - 1e-5)
    matcher["diamond"] = 1e-4  # now it pays (measured afresh: another file)
    monkeypatch.setenv(kt.CACHE_ENV, str(tmp_path / "other.json"))
    cached = dcjax.transform(
        net, variables, frame_shape=SHAPE, config=dcjax.Config(tuning="measure")
    )
    assert cached.tuning.plan == "cached"


def test_calibration_frames_choose_for_the_streams_fractions(model, fake, monkeypatch):
    costs, _ = fake
    monkeypatch.setattr(
        "dcjax.race.race_samples",
        lambda models, frames: race_samples_of([1.0] + [2.0] * (len(models) - 1)),
    )
    # xla pays below a dirty fraction of 0.5, rows above it
    costs.update(dense=lambda f: 1e-3, xla=lambda f: 1.6e-3 * f, rows=lambda f: 0.4e-3 + 0.4e-3 * f)
    net, variables = model
    cfg = dcjax.Config(tuning="measure", refresh_every=None)
    rng = np.random.default_rng(1)
    busy = np.repeat(_frames()[:1], 6, axis=0)
    busy[:, :, :16] = rng.integers(0, 256, (6, SHAPE[0], 16, 3))  # two thirds new every frame
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg, calibration=busy)
    fractions = [t.fraction for t in cached.tuning.layers]
    assert all(0.6 < f < 1 for f in fractions), fractions
    assert [c.impl for c in cached.tuning.choices] == ["rows"] * 3
    # a clip that changes in one corner only
    quiet = np.repeat(busy[:1], 6, axis=0)
    quiet[1::2, :4, :4] = 255 - quiet[1::2, :4, :4]
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg, calibration=quiet)
    assert all(0 < t.fraction < 0.5 for t in cached.tuning.layers)
    assert [c.impl for c in cached.tuning.choices] == ["xla"] * 3
    with pytest.raises(ValueError, match="calibration must be frames of shape"):
        dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg, calibration=busy[:1])


def test_with_calibration_frames_the_matchers_are_timed_on_them(model, fake, monkeypatch):
    # The search's cost depends on the motion it meets: a still camera's frames
    # cost a fraction of the synthetic moved pair's, so the stream's own frames decide.
    costs, matcher = fake
    costs.update(dense=lambda f: 1e-3, xla=lambda f: 0.9e-3, rows=lambda f: 2e-3)
    matcher["diamond"] = 1.1e-3  # on the moved pair: more than the 0.3 ms saved
    seen = []

    def on_frames(m, frames, repeats):
        seen.append((m.name, np.asarray(frames)))
        return {"diamond": 2e-4, "static": 1e-5}[m.name]

    monkeypatch.setattr(autotune, "_matcher_cost_on", on_frames)
    monkeypatch.setattr(autotune, "_matcher_warmups", lambda *a: [])
    monkeypatch.setattr(
        "dcjax.race.race_samples",
        lambda models, frames: race_samples_of([1.0] + [2.0] * (len(models) - 1)),
    )
    net, variables = model
    cfg = dcjax.Config(tuning="measure", refresh_every=None)
    frames = np.repeat(_frames(), 2, axis=0)  # 12 frames
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg, calibration=frames)
    assert cached.tuning.overhead == pytest.approx(2e-4 - 1e-5)
    assert cached.tuning.plan == "cached"
    assert [name for name, _ in seen] == ["diamond", "static"]
    for _, got in seen:  # the first MATCH_PAIRS pairs of the calibration frames
        np.testing.assert_array_equal(got, frames[: autotune.MATCH_PAIRS + 1])
    seen.clear()
    uncalibrated = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg)
    assert not seen and uncalibrated.tuning.plan == "dense"
    assert uncalibrated.tuning.overhead == pytest.approx(1.1e-3 - 1e-5)


def test_matchers_cost_on_frames_is_a_mean_over_their_pairs(monkeypatch):
    """Each frame is matched against the previous frame's key, made before and
    untimed, from a motion passed in: the match the step runs."""
    calls, keys, motions = [], [], []

    class Matcher:
        def key_of(self, frame):
            keys.append(1)
            return frame.astype(jnp.float32)

        def match(self, key, frame, frame_key, motion):
            calls.append(1)
            motions.append(motion)
            return types.SimpleNamespace(mask=key == frame_key)

    frames = np.zeros((4, 8, 8, 3), np.uint8)
    cost = autotune._matcher_cost_on(Matcher(), frames, repeats=2)
    assert 0 < cost < 1.0
    assert calls == [1]  # traced once, then the compiled matcher runs 3 pairs x 2 repeats
    assert isinstance(motions[0], jax.core.Tracer)  # an argument, as in the step
    assert len(keys) == 2  # traced once alone (the keys made before) and once in the match


def test_the_matchers_compile_beside_the_kernels_and_are_not_compiled_again(tmp_path):
    """`_matcher_warmups` compiles both matches (the plan's and the still
    test's) on the calibration frames, or on the moved pair where the file has
    no cost for it yet; `_overhead` then times the same compiled matches."""
    cfg = dcjax.Config(tuning="measure")
    cache = kt.TuningCache(tmp_path / "t.json")
    frames = np.zeros((3, *SHAPE), np.uint8)
    for m in autotune._matchers(cfg):
        autotune._MATCH_FNS.pop(repr(m), None)
    jobs = autotune._matcher_warmups(cfg, SHAPE, jnp.uint8, cache, frames)
    assert len(jobs) == 2
    for job in jobs:
        job()
    fns = [f for m in autotune._matchers(cfg) for f in autotune._match_fn(m)]
    sizes = [f._cache_size() for f in fns]
    assert sizes == [1, 1, 1, 1]  # each matcher's key and match
    autotune._overhead(cfg, SHAPE, jnp.uint8, cache, 1, frames)
    assert [f._cache_size() for f in fns] == sizes  # nothing compiled again
    synthetic = autotune._matcher_warmups(cfg, SHAPE, jnp.uint8, cache)
    assert len(synthetic) == 2
    autotune._overhead(cfg, SHAPE, jnp.uint8, cache, 1)  # measured, kept in the file
    assert autotune._matcher_warmups(cfg, SHAPE, jnp.uint8, cache) == []


def test_real_measurements_are_made_once_and_kept(model, monkeypatch, tmp_path):
    monkeypatch.setenv(kt.CACHE_ENV, str(tmp_path / "tuning.json"))
    net, variables = model
    cfg = dcjax.Config(tuning="measure")
    first = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg, progress=False)
    assert first.tuning.measured > 0 and (tmp_path / "tuning.json").exists()
    cache, machine = kt.TuningCache(tmp_path / "tuning.json"), kt.machine_key()
    for t in first.tuning.layers:
        p = _plan_of(t, first)
        names = {c.name for c in kt.candidates(p, "cpu")}
        assert "dense" in t.costs and set(t.costs) <= names
        assert all(len(v) == len(kt.FRACTIONS) and min(v) > 0 for v in t.costs.values())
        # a candidate left out lost on its class's probe: the file says it was passed over
        for name in names - set(t.costs):
            assert cache.get(machine, kt.layer_key(p, jnp.float32), name) == ()
    second = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg, progress=False)
    assert second.tuning.measured == 0
    assert second.tuning.choices == first.tuning.choices
    assert second.tuning.lowerings == first.tuning.lowerings
    _check_outputs(second, net, variables, _frames())


@pytest.mark.parametrize("plan", ["cached", "dense"])
def test_lowerings_are_measured_for_every_plan(model, fake, monkeypatch, plan):
    """The measured lowerings compute every convolution over a whole map, the
    cached plan's dense paths too: the transform measures them after the plan
    is made, whatever the plan, and the step is traced with them."""
    costs, _ = fake
    if plan == "cached":
        costs.update(dense=lambda f: 1e-3, xla=lambda f: 1e-4 + 5e-4 * f, rows=lambda f: 2e-3)
    else:
        costs.update(dense=lambda f: 1e-4, xla=lambda f: 2e-4, rows=lambda f: 3e-4)
    found = autotune.Lowerings(layers=(), choices={"a layer": "taps"})
    calls = []

    def fake_lowerings(*a, **k):
        calls.append(a)
        return found

    monkeypatch.setattr(autotune, "measure_lowerings", fake_lowerings)
    net, variables = model
    cfg = dcjax.Config(tuning="measure")
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg, progress=False)
    assert cached.tuning.plan == plan
    assert any(cached.keeps_cache) is (plan == "cached")
    assert len(calls) == 1 and cached.tuning.lowerings is found
    assert cached.lowerings == found.choices == cached._step.lowerings
    assert found.summary() in cached.tuning.summary()


@pytest.mark.parametrize(
    "kernel,tuning,measured",
    [("dense", "measure", True), ("xla", "measure", True), ("xla", "prior", False)],
)
def test_a_fixed_kernel_takes_measured_lowerings(
    model, monkeypatch, tmp_path, kernel, tuning, measured
):
    """A fixed kernel choice measures no kernel. Under ``tuning="measure"`` each
    layer's dense lowering is measured and recorded, for a step that reuses
    nothing (``kernel="dense"``) and for one that reuses (``"xla"``, whose
    dense paths take them); under ``"prior"`` nothing is measured."""
    path = tmp_path / "tuning.json"
    monkeypatch.setenv(kt.CACHE_ENV, str(path))
    net, variables = model
    cfg = dcjax.Config(kernel=kernel, tuning=tuning)
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg, progress=False)
    assert cached.tuning is None
    from dcjax.transforms import queries

    plans = [p for p in queries.layer_tile_plans(cached._analysis) if p is not None]
    names = set()
    if path.exists():
        for layers in json.loads(path.read_text())["machines"].values():
            names |= {n for per in layers.values() for n in per}
    names = {n for n in names if n.startswith(kt.LOWERING_PREFIX)}  # the race aside
    if measured:
        assert names == {kt.LOWERING_PREFIX + h for p in plans for h in lowering.lowerings(p)}
    else:
        assert names == set() and cached.lowerings == {}
    _check_outputs(cached, net, variables, _frames())


def _plan_of(t, cached):
    from dcjax.transforms import queries

    plans = queries.layer_tile_plans(cached._analysis)
    return plans[[x is t for x in cached.tuning.layers].index(True)]


def test_tuning_runs_only_for_auto_and_is_checked(model, fake):
    net, variables = model
    for cfg in (dcjax.Config(tuning="prior"), dcjax.Config(kernel="xla", tuning="measure")):
        assert dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg).tuning is None
    with pytest.raises(ValueError, match="Config.tuning must be None or one of"):
        dcjax.Config(tuning="fast")


def test_the_dense_plan_is_not_taken_where_it_would_change_the_method(model, fake):
    costs, _ = fake
    costs.update(dense=lambda f: 1e-4, xla=lambda f: 2e-4, rows=lambda f: 3e-4)
    net, variables = model
    for cfg in (
        dcjax.Config(tuning="measure", skip_unchanged=False),
        dcjax.Config(tuning="measure", matcher="histogram"),
    ):
        cached = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg)
        assert cached.tuning.plan == "cached" and cached.config == cfg
        assert [c.impl for c in cached.tuning.choices] == ["dense"] * 3
        assert not any(cached.keeps_cache)


@pytest.mark.parametrize(
    ("times", "plan"),
    [
        ((2e-3, 1e-3, 3e-3, 4e-3), "dense"),
        ((1e-3, 2e-3, 3e-3, 4e-3), "cached"),
        ((3e-3, 2e-3, 1e-3, 4e-3), "nocache"),
        ((3e-3, 2e-3, 4e-3, 1e-3), "prior"),
    ],
)
def test_with_calibration_frames_the_faster_plan_of_a_race_is_kept(
    model, fake, monkeypatch, times, plan
):
    """The measured plan races the dense plan, the step without a matcher and,
    where its kernels differ from the fixed rules', the fixed rules' plan."""
    costs, _ = fake
    costs.update(dense=lambda f: 1e-3, xla=lambda f: 1e-4, rows=lambda f: 2e-3)
    raced = []

    def race(models, frames):  # the cut plans after the others, slowest
        raced.append([(m.config.matcher, any(m.keeps_cache), m.tuning is None) for m in models])
        return race_samples_of(times, models, rest=5e-3)

    monkeypatch.setattr("dcjax.race.race_samples", race)
    net, variables = model
    cfg = dcjax.Config(tuning="measure")
    cached = dcjax.transform(
        net, variables, frame_shape=SHAPE, config=cfg, calibration=_frames(), progress=False
    )
    # the measurements compute the tiny layers with tiles, the fixed rules in full
    cuts = len(raced[0]) - 4
    assert raced == [
        [("diamond", True, False), ("static", False, True), ("none", False, True)]
        + [("diamond", False, True)]  # the fixed rules: every tiny layer in full
        + [("diamond", True, False)] * cuts  # the measured kernels, the dirtiest layers in full
    ]
    assert cached.tuning.plan == plan and cached.tuning.raced[:4] == times
    assert cached.tuning.raced[4] == 5e-3 if cuts else np.isnan(cached.tuning.raced[4])
    assert any(cached.keeps_cache) == (plan == "cached")
    matchers = {"cached": "diamond", "dense": "static", "nocache": "none", "prior": "diamond"}
    assert cached.config.matcher == matchers[plan]
    assert cached.config.skip_unchanged == (plan != "nocache")
    if plan in ("cached", "prior"):
        assert cached.config.tuning == ("prior" if plan == "prior" else "measure")
    if plan == "prior":  # the fixed rules' kernels: none measured
        assert all(lp.kernel is None for lp in cached.plan.layers)
        ms = dict(zip(autotune.PLANS, (1e3 * t for t in times), strict=False))
        assert methods.tuning_dict(cached) == {"plan": "prior", "raced_ms": ms}
        assert "measured kernels" in cached.tuning.summary()
    assert "raced on the calibration frames" in cached.tuning.summary()
    _check_outputs(cached, net, variables, _frames())


def test_the_fixed_rules_race_only_where_their_kernels_differ(model, fake, monkeypatch):
    from dcjax.kernels import auto

    costs, _ = fake
    costs.update(dense=lambda f: 1e-3, xla=lambda f: 1e-4, rows=lambda f: 2e-3)
    monkeypatch.setattr(auto, "choose", lambda p, backend, scattered=False: ("xla", None))
    counts = []
    monkeypatch.setattr(
        "dcjax.race.race_samples",
        lambda models, frames: counts.append([m.tuning and m.tuning.plan for m in models])
        or race_samples_of((1e-3, 2e-3, 3e-3), models, rest=4e-3),
    )  # fmt: skip
    net, variables = model
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, calibration=_frames(),
                             config=dcjax.Config(tuning="measure"), progress=False)  # fmt: skip
    # the measurements chose what the fixed rules give: nothing to race them for
    assert cached.tuning.plan == "cached" and len(counts) == 1
    assert counts[0][:3] == ["cached", None, None] and set(counts[0][3:]) <= {"cut"}
    assert np.isnan(cached.tuning.raced[3])


def test_a_tie_keeps_the_preferred_plan(model, fake, monkeypatch):
    """Plans that tie on the calibration frames: the race keeps the first of
    `autotune.PREFERENCE` (the dense step with the still-frame skip), not the
    one whose median happened to be least."""
    costs, _ = fake
    costs.update(dense=lambda f: 1e-3, xla=lambda f: 1e-4, rows=lambda f: 2e-3)
    swing = 1e-4 * np.where(np.arange(6) % 2, 1.0, -1.0)  # frame to frame, in turns
    samples = 1e-3 + np.stack([swing, -swing, swing, -swing], axis=-1)[None].repeat(3, 0)
    samples[..., 0] -= 1e-6  # the measured plan: least by a hair
    monkeypatch.setattr("dcjax.race.race_samples", lambda models, frames: samples)
    net, variables = model
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, calibration=_frames(),
                             config=dcjax.Config(tuning="measure"), progress=False)  # fmt: skip
    assert autotune.PREFERENCE[0] == "dense" and cached.tuning.plan == "dense"
    assert not any(cached.keeps_cache) and cached.config.matcher == "static"


def test_a_dense_plan_races_the_step_without_a_matcher(model, fake, monkeypatch):
    """Where the layers' measurements already chose the dense plan, it races
    the nocache step on the calibration frames (the still-frame test may cost
    a small network more than it saves), and the faster is kept."""
    costs, _ = fake
    costs.update(dense=lambda f: 1e-4, xla=lambda f: 1e-2, rows=lambda f: 1e-2)
    raced = []
    for times, plan in (((2e-3, 1e-3), "nocache"), ((1e-3, 2e-3), "dense")):
        monkeypatch.setattr("dcjax.race.race_samples", lambda models, frames, t=times: raced.append(
            len(models)) or race_samples_of(t))  # fmt: skip
        net, variables = model
        cached = dcjax.transform(net, variables, frame_shape=SHAPE, calibration=_frames(),
                                 config=dcjax.Config(tuning="measure"), progress=False)  # fmt: skip
        assert cached.tuning.plan == plan
        assert np.isnan(cached.tuning.raced[0]) and cached.tuning.raced[1:3] == times
        assert np.isnan(cached.tuning.raced[3])
        assert cached.config.matcher == {"dense": "static", "nocache": "none"}[plan]
        assert "cached" not in cached.tuning.summary().split("raced")[1]
        _check_outputs(cached, net, variables, _frames())
    assert raced == [2, 2]


def test_race_times_each_model_on_the_frames(model):
    net, variables = model
    models = [
        dcjax.transform(net, variables, frame_shape=SHAPE, config=dcjax.Config(kernel=k))
        for k in ("xla", "dense")
    ]
    times = dcjax.race.race(models, _frames(4), rounds=1)
    assert len(times) == 2 and all(0 < t < 5 for t in times)


def test_calibration_reports_fractions_whatever_the_statistics_setting(model):
    net, variables = model
    rng = np.random.default_rng(2)
    frames = np.repeat(_frames()[:1], 5, axis=0)
    frames[:, :8, :8] = rng.integers(0, 256, (5, 8, 8, 3))
    for statistics in (True, False):
        cal = dcjax.calibrate(
            net, variables, frame_shape=SHAPE, frames=frames,
            config=dcjax.Config(statistics=statistics),
        )  # fmt: skip
        assert cal.frames == 4  # the first frame is a refresh
        assert 0 < cal.input < 0.5
        assert all(cal.input <= f <= 1 for f in cal.layers), cal.layers


def test_the_nocache_plan_steps_the_dense_lowering_alone(model):
    """Nothing reused, matched or skipped: `step` runs the model's dense
    lowering, leaves the state as it is, and reports what the full step would
    on a frame computed in full (same keys, shapes and dtypes)."""
    net, variables = model
    prior = dcjax.Config(tuning="prior")
    bare = dcjax.transform(net, variables, frame_shape=SHAPE, progress=False,
                           config=autotune.nocache_config(prior))  # fmt: skip
    full = dcjax.transform(net, variables, frame_shape=SHAPE, progress=False,
                           config=autotune.dense_config(prior))  # fmt: skip
    assert bare.bare and not full.bare
    state = bare.init()
    full_state = full.init()
    for f in _frames(4):
        out, new_state, info = bare.step(state, f)
        assert new_state is state
        np.testing.assert_allclose(np.asarray(out), np.asarray(bare.apply(f)), rtol=1e-5, atol=1e-5)
        _, full_state, full_info = full.step(full_state, f)
        assert set(info) == set(full_info)
        for k in info:
            assert np.shape(info[k]) == np.shape(full_info[k]), k
            assert np.asarray(info[k]).dtype == np.asarray(full_info[k]).dtype, k
        assert bool(info["refreshed"]) and not bool(info["skipped"])
        assert not bool(info["nonfinite"])  # computed in the program, for integer frames too
        assert float(info["flops_ratio"]) == 1.0
        np.testing.assert_array_equal(np.asarray(info["reuse_fraction"]), 0.0)
    outs, _, _ = bare.run(_frames(4))  # the scan keeps the full step
    np.testing.assert_allclose(np.asarray(outs[-1]), np.asarray(bare.apply(_frames(4)[-1])),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_progress_bars_false_silences_the_tuning_bars(model, monkeypatch, tmp_path):
    """``progress_bars(False)`` (what the harness and ``--no-progress`` use) wins over
    ``transform(progress=True)``; outside it the bars are shown."""
    shown = []

    def bar(items, total, what):
        shown.append(what)
        return items

    monkeypatch.setattr(autotune, "_bar", bar)
    net, variables = model
    cfg = dcjax.Config(tuning="measure")
    costs = {"dense": lambda f: 1e-3, "xla": lambda f: 2e-3 * f, "rows": lambda f: 1e-3 * f}
    fake_measurements(monkeypatch, tmp_path / "quiet.json", costs)
    with autotune.progress_bars(False):
        dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg, progress=True)
    assert shown == []
    monkeypatch.setenv(kt.CACHE_ENV, str(tmp_path / "shown.json"))
    dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg, progress=True)
    assert "compiling" in shown and "timing" in shown


@pytest.mark.parametrize("verdict", ["prior", "measured", "race"])
def test_measured_lowerings_run_only_where_the_whole_dense_step_is_faster(model, tmp_path, verdict):
    """A layer measured fastest by another lowering than the fixed rules' makes the
    dense step with the measured set race the one with the prior's; the slower set
    is dropped, the race is kept in the file, and nothing is recorded outside
    the result (the model is traced within ``lowering.use(result.choices)``)."""
    from dcjax.transforms import queries

    net, variables = model
    cached = dcjax.transform(
        net, variables, frame_shape=SHAPE, config=dcjax.Config(tuning="prior"), progress=False
    )
    analysis, leaves = cached._analysis, cached._traced.leaves
    plans = [p for p in queries.layer_tile_plans(analysis) if p is not None]
    priors = [lowering.prior(p) for p in plans]
    cache = kt.TuningCache(tmp_path / "t.json")
    machine = kt.machine_key()
    measured = _fake_lowering_costs(cache, plans)
    key = lowerings_mod._race_key(analysis, measured)
    if verdict != "race":
        won, lost = ("prior", "measured") if verdict == "prior" else ("measured", "prior")
        cache.put(machine, key, f"lowerings:{won}", (1e-3,))
        cache.put(machine, key, f"lowerings:{lost}", (2e-3,))
        cache.put(machine, key, "lowerings:kept", (float(verdict == "measured"),))
    puts = cache.puts
    got = autotune.measure_lowerings(analysis, leaves, cache=cache, progress=False)
    assert got.raced is not None and min(got.raced) > 0
    kept = got.kept
    assert verdict == "race" or kept is (verdict == "measured")
    assert cache.get(machine, key, "lowerings:kept") == (float(kept),)  # kept in the file
    assert cache.puts == puts + (3 if verdict == "race" else 0)  # the race, run once
    want = [("dot" if i == 1 and kept else priors[i]) for i in range(len(plans))]
    assert [t.choice for t in got.layers if t is not None] == want
    assert got.choices == (measured if kept else {})
    with lowering.use(got.choices):
        assert [lowering.chosen(p) for p in plans] == want
    assert [lowering.chosen(p) for p in plans] == priors  # nothing recorded outside
    assert "unlike the fixed rules" in got.summary()


def _fake_lowering_costs(cache, plans):
    """Lowering costs in ``cache``: each layer's prior fastest, but the second's
    "dot" (its prior is XLA's convolution). Returns the measured set."""
    machine = kt.machine_key()
    priors = [lowering.prior(p) for p in plans]
    assert priors[1] == "conv"  # 3x3 on 8 channels (24x24)
    for i, p in enumerate(plans):
        fastest = "dot" if i == 1 else priors[i]
        for h in lowering.lowerings(p):
            seconds = 1e-3 if h == fastest else 2e-3
            cache.put(machine, kt.layer_key(p), kt.LOWERING_PREFIX + h, (seconds,))
    return lowering.choices((p, "dot" if i == 1 else priors[i]) for i, p in enumerate(plans))


def test_a_prior_model_is_traced_with_the_fixed_rules_after_a_measured_one(
    model, monkeypatch, tmp_path
):
    """Choices belong to the model that measured them: a ``tuning="prior"``
    transform in the same process, after one that kept a measured lowering,
    traces its step with the fixed rules'."""
    from dcjax.transforms import queries
    from tests.kernels._strategies import all_eqns

    net, variables = model
    cfg = dict(kernel="dense", matcher="none", skip_unchanged=False)  # the dense step

    def made(tuning):
        config = dcjax.Config(**cfg, tuning=tuning)
        return dcjax.transform(net, variables, frame_shape=SHAPE, config=config, progress=False)

    prior = made("prior")
    plans = [p for p in queries.layer_tile_plans(prior._analysis) if p is not None]
    path = tmp_path / "tuning.json"
    cache = kt.TuningCache(path)
    measured = _fake_lowering_costs(cache, plans)
    key = lowerings_mod._race_key(prior._analysis, measured)
    machine = kt.machine_key()
    for label, v in (("prior", 2e-3), ("measured", 1e-3), ("kept", 1.0)):
        cache.put(machine, key, f"lowerings:{label}", (v,))
    cache.save()
    monkeypatch.setenv(kt.CACHE_ENV, str(path))

    def dots(cached):
        state, frame = cached.init(), jnp.asarray(_frames()[0])
        jaxpr = jax.make_jaxpr(lambda s, f: cached.step(s, f))(state, frame)
        return sum(e.primitive.name == "dot_general" for e in all_eqns(jaxpr.jaxpr))

    first = made("measure")
    assert first.lowerings == measured
    again = made("prior")
    assert again.lowerings == {}
    assert dots(first) > dots(again) == dots(prior)  # the second layer as a product, or not
    _check_outputs(first, net, variables, _frames())


def test_with_statistics_keeps_the_plan_and_leaves_the_model_as_it_was(model):
    net, variables = model
    cfg = dcjax.Config(kernel="xla", tuning="prior")
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg, progress=False)
    twin = cached.with_statistics(False)
    assert twin.config == dataclasses.replace(cfg, statistics=False)
    assert cached.config.statistics is True  # the original untouched
    assert twin.keeps_cache == cached.keeps_cache and all(twin.keeps_cache)
    a, b = cached.init(), twin.init()
    for f in _frames():
        out_a, a, info_a = cached.step(a, f)
        out_b, b, info_b = twin.step(b, f)
        np.testing.assert_allclose(np.asarray(out_a), np.asarray(out_b), rtol=1e-6, atol=1e-7)
        if not bool(info_b["skipped"]):
            assert np.isnan(float(info_b["flops_ratio"]))
        assert np.isfinite(float(info_a["flops_ratio"]))
    semantic = dcjax.transform(
        net, variables, frame_shape=SHAPE, progress=False,
        config=dcjax.Config(semantic=dcjax.SemanticConfig(), tuning="prior"),
    )  # fmt: skip
    with pytest.raises(ValueError, match="semantic exits always report"):
        semantic.with_statistics(False)


def _tuning(fractions, impls):
    """A cached `autotune.Tuning` whose layers have ``fractions`` and chose
    ``impls`` (None: a layer not tuned); dense costs 2 ms, the others 1 ms."""
    layers = []
    for f, impl in zip(fractions, impls, strict=True):
        if impl is None:
            layers.append(None)
            continue
        cost = 2e-3 if impl == "dense" else 1e-3
        layers.append(kt.LayerTuning(
            costs={"dense": (2e-3,) * 5, impl: (cost,) * 5},
            expected={"dense": 2e-3, impl: cost},
            choice=kt.KernelChoice(impl=impl), fraction=f,
        ))  # fmt: skip
    return autotune.Tuning(
        plan="cached", layers=tuple(layers), saving=1.0, overhead=0.0, measured=0, seconds=0.0
    )


def test_a_cut_computes_in_full_the_layers_dirty_from_its_fraction():
    t = _tuning([0.1, 0.3, 0.6, 0.9, 0.7], ["xla", "rows", "xla", "dense", None])
    half = autotune.cut_tuning(t, 0.5)
    assert [c and c.impl for c in half.choices] == ["xla", "rows", "dense", "dense", None]
    assert half.plan == "cut" and half.cut == 0.5
    assert half.saving == pytest.approx(2e-3)  # two layers save 1 ms each now
    assert "layers dirty 50% or more in full" in half.summary()
    quarter = autotune.cut_tuning(t, 0.25)
    assert [c and c.impl for c in quarter.choices] == ["xla", "dense", "dense", "dense", None]
    assert quarter.layers[1].costs == t.layers[1].costs  # the measurements kept
    # nothing to cut: the dirtiest layers are in full already, or no fractions
    # known; or nothing left to reuse
    assert autotune.cut_tuning(t, 0.8) is None
    assert autotune.cut_tuning(t, 0.05) is None
    assert autotune.cut_tuning(_tuning([None, None], ["xla", "rows"]), 0.25) is None
    assert autotune.CUTS and all(0 < c < 1 for c in autotune.CUTS)
    assert set(autotune.CUTS) <= set(kt.FRACTIONS)


def test_a_cut_plan_that_wins_the_race_runs_its_kernels(model, fake, monkeypatch):
    """The cut plans race beside the others; one that wins is kept with its own
    kernels (the dirtiest layers in full), its outputs the model's."""
    costs, _ = fake
    costs.update(dense=lambda f: 1e-3, xla=lambda f: 1e-4, rows=lambda f: 2e-3)
    monkeypatch.setattr(autotune, "CUTS", (0.3,))  # the frames dirty 1/4, 1/3, 1/3
    seen = []

    def race(models, frames):  # the cut plan fastest
        seen.append([m.tuning and m.tuning.plan for m in models])
        return race_samples_of((2e-3,) * (len(models) - 1) + (1e-3,))

    monkeypatch.setattr("dcjax.race.race_samples", race)
    net, variables = model
    cfg = dcjax.Config(tuning="measure")
    frames = _frames()
    cached = dcjax.transform(
        net, variables, frame_shape=SHAPE, config=cfg, calibration=frames, progress=False
    )
    assert seen[0][-1] == "cut" and seen[0].count("cut") == 1
    t = cached.tuning
    assert t.plan == "cut" and t.cut == 0.3 and t.raced[-1] == 1e-3
    dirty = [lt.fraction >= 0.3 for lt in t.layers]
    assert dirty == [False, True, True]
    assert [c.impl for c in t.choices] == ["dense" if d else "xla" for d in dirty]
    assert [lp.kernel.impl for lp in cached.plan.layers] == [c.impl for c in t.choices]
    assert list(cached.keeps_cache) == [not d for d in dirty]
    names = [c.impl for c in t.choices]
    kernels = {n: names.count(n) for n in sorted(set(names))}
    got = methods.tuning_dict(cached)
    ms = got.pop("raced_ms")
    assert len(ms) == len(seen[0]) and ms.pop("cut") == pytest.approx(1.0)
    assert ms == pytest.approx(dict.fromkeys(ms, 2.0))
    assert got == {"plan": "cut", "kernels": kernels, "cut": 0.3}
    _check_outputs(cached, net, variables, frames)


def test_a_cut_that_ties_with_the_tuned_plan_is_kept(model, fake, monkeypatch):
    """A cut within the race's noise of the plan it cuts is kept: the same
    kernels where it reuses, its cut layers exact, fewer caches."""
    costs, _ = fake
    costs.update(dense=lambda f: 1e-3, xla=lambda f: 1e-4, rows=lambda f: 2e-3)
    monkeypatch.setattr(autotune, "CUTS", (0.3,))
    swing = 1e-4 * np.where(np.arange(4) % 2, 1.0, -1.0)  # frame to frame, in turns

    def race(models, frames):  # the cut least by a hair, within the noise
        samples = race_samples_of((2e-3,) * len(models))
        samples[..., 0] = 1e-3 + swing
        samples[..., -1] = 1e-3 - swing - 1e-6
        return samples

    monkeypatch.setattr("dcjax.race.race_samples", race)
    net, variables = model
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, calibration=_frames(),
                             config=dcjax.Config(tuning="measure"), progress=False)  # fmt: skip
    assert autotune.PREFERENCE.index("cut") < autotune.PREFERENCE.index("cached")
    assert cached.tuning.plan == "cut" and cached.tuning.cut == 0.3
    assert not all(cached.keeps_cache)

    def slower(models, frames):  # the cut slower beyond the noise: the tuned plan stays
        samples = race(models, frames)
        samples[..., -1] = 1.2e-3 + swing
        return samples

    monkeypatch.setattr("dcjax.race.race_samples", slower)
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, calibration=_frames(),
                             config=dcjax.Config(tuning="measure"), progress=False)  # fmt: skip
    assert cached.tuning.plan == "cached" and all(cached.keeps_cache)


def test_with_tuning_takes_a_cached_plan_of_the_models_layers(model, fake):
    costs, _ = fake
    costs.update(dense=lambda f: 1e-3, xla=lambda f: 1e-4, rows=lambda f: 2e-3)
    net, variables = model
    cached = dcjax.transform(
        net, variables, frame_shape=SHAPE, config=dcjax.Config(tuning="measure"), progress=False
    )
    t = cached.tuning
    with pytest.raises(ValueError, match="tuning of 2 layers for 3"):
        cached.with_tuning(dataclasses.replace(t, layers=t.layers[:2]))
    with pytest.raises(ValueError, match="cached plan"):
        cached.with_tuning(dataclasses.replace(t, plan="dense"))
    full = dataclasses.replace(
        t, layers=tuple(dataclasses.replace(lt, choice=kt.KernelChoice(impl="dense"))
                        for lt in t.layers),
    )  # fmt: skip
    twin = cached.with_tuning(full)
    assert not any(twin.keeps_cache) and all(cached.keeps_cache)  # the original untouched
    assert twin.tuning is full and cached.tuning is t
    _check_outputs(twin, net, variables, _frames())
