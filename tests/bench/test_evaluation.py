"""`dcjax.bench.evaluation.add_profiles`: per-layer times in the records, from each step."""

from __future__ import annotations

import pytest

from dcjax.bench import evaluation
from dcjax.eval import harness


def test_add_profiles_puts_each_methods_layer_times_in_its_record(spec, clip):
    method = "deepcache"  # the profile runs the network on still frames too
    ev = harness.evaluate(spec, clip, [method], progress=False)
    records = ev.records
    evaluation.add_profiles(records, ev.runners, clip)
    names = [layer.name for layer in ev.runners[method].layers]
    for r in records[:2]:  # nocache and deepcache run through dcjax's interpreter
        prof = r["profile"]
        assert prof["frames"] == len(clip) - evaluation.PROFILE_WARMUP
        assert prof["wall_ms"] > 0
        assert prof["total_ms"] == pytest.approx(sum(prof["groups"].values()))
        # every layer ran on every frame: each has its own time, read from the groups
        assert [lay["name"] for lay in r["per_layer"]] == names
        assert all(lay["ms"] == prof["groups"][lay["name"]] > 0 for lay in r["per_layer"])
    nocache, cached = records[:2]
    # the plain baselines are profiled too (their layers are XLA's to name)
    assert all(r["profile"]["wall_ms"] > 0 for r in records[2:])
    # the cached step matches frames; the baseline has no matcher to time
    assert cached["profile"]["groups"]["dcjax.match"] > 0
    assert "dcjax.match" not in nocache["profile"]["groups"]


def test_add_profiles_records_a_method_it_cannot_profile(spec, clip):
    ev = harness.evaluate(spec, clip, ["deepcache"], progress=False)
    runner = ev.runners["deepcache"]
    unjitted = type(runner)(**{**runner.__dict__, "step": lambda s, f: runner.step(s, f)})
    records = ev.records[1:2]
    evaluation.add_profiles(records, {"deepcache": unjitted}, clip)
    assert "no jitted step" in records[0]["profile"]["error"]
    assert all("ms" not in lay for lay in records[0]["per_layer"])
    with pytest.raises(ValueError, match="at least 2 frames"):
        evaluation.add_profiles(records, ev.runners, clip[:1])


def test_a_plan_raced_on_one_clip_is_raced_again_on_the_next(monkeypatch, tmp_path):
    """A runner of the fixed rules' kernels serves every clip of its size, but
    one whose plans raced on a clip's first frames (and kept the fixed rules'
    plan there) is made afresh for the next clip: its race may go otherwise."""
    from tests.tuning_fakes import fake_measurements, race_samples_of

    costs = {"dense": lambda f: 1e-3, "xla": lambda f: 1e-4 + 5e-4 * f, "rows": lambda f: 2e-3}
    fake_measurements(monkeypatch, tmp_path / "tuning.json", costs)
    raced = []

    def race(models, frames, *a, **k):  # the fixed rules' plan (fourth) fastest
        raced.append(len(models))
        return race_samples_of((2.0, 3.0, 3.0, 1.0), models, rest=4.0)

    monkeypatch.setattr("dcjax.race.race_samples", race)
    made = []
    make_runner = harness.make_runner
    monkeypatch.setattr(harness, "make_runner", lambda spec, name, opts: made.append(
        (name, dict(opts))) or make_runner(spec, name, opts))  # fmt: skip
    methods = ["deepcache:tuning=prior", "deepcache:tuning=measure"]
    records, _ = evaluation.run_bench(
        ["alexnet"], ["vtest", "box"], methods, frames=4, width=0.125, progress=False
    )
    measured = [r for r in records if r["variant"] == methods[1]]
    assert len(raced) == 2 and all(n >= 4 for n in raced)  # one race a clip, prior in it
    assert [r["config"]["plan"] for r in measured] == ["prior", "prior"]
    assert all("raced_ms" in r["config"] for r in measured)
    assert made.count(("deepcache", {"tuning": "measure"})) == 2
    assert made.count(("deepcache", {"tuning": "prior"})) == 1
