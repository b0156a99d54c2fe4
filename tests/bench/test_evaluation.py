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
