"""The harness: one process, the same frames, records consistent with what was measured."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from dcjax.eval import bench, harness, metrics


@pytest.fixture(scope="module")
def evaluation(spec, clip):
    return harness.evaluate(spec, clip, ["deepcache", "frame"], video_label="vtest",
                            progress=False)  # fmt: skip


def test_records_are_consistent_with_the_measurements(evaluation, clip):
    recs = {r["variant"]: r for r in evaluation.records}
    assert list(recs) == ["nocache", "deepcache", "frame"]  # nocache added first
    for variant, r in recs.items():
        metrics.check_record(r)
        assert r["frames"] == len(clip)
        ms = evaluation.latencies_ms[variant]
        assert r["latency_ms"]["median"] == pytest.approx(float(np.median(ms)))
        ref = float(np.median(evaluation.latencies_ms["nocache"]))
        assert r["speedup"] == pytest.approx(ref / float(np.median(ms)))
        ratio = evaluation.infos[variant]["flops_ratio"]
        assert r["ideal_speedup"] == pytest.approx(1.0 / float(np.mean(ratio)))
        assert r["refreshes"] == int(evaluation.infos[variant]["refreshed"].sum())
    base = recs["nocache"]
    assert base["speedup"] == 1.0 and base["top1_agreement"] == 1.0 and base["output_mse"] == 0
    assert base["cache_bytes"] == 0 and recs["deepcache"]["cache_bytes"] > 0
    assert recs["deepcache"]["config"]["kernel"] == "auto"
    # the convolutions, then the fully connected head (computed in full: no rows skipped)
    layers = recs["deepcache"]["per_layer"]
    assert [lay["name"] for lay in layers] == [f"TinyCNN/conv{i}" for i in (1, 2, 3)] + [
        "TinyCNN/head"
    ]
    assert layers[-1]["flops"] == 2 * 16 * 10 and layers[-1]["reuse_fraction"] < 1.0
    assert [lay["name"] for lay in base["per_layer"]] == [lay["name"] for lay in layers]
    # which layers the cached step computes sparsely; the baseline says nothing. On
    # CPU the tiny model's layers are all too small for a sparse kernel under "auto"
    if jax.default_backend() == "cpu":
        assert [lay["sparse"] for lay in layers] == [False] * 4
    assert all(lay["sparse"] is None for lay in base["per_layer"])


def test_outputs_match_nocache_on_identical_frames(spec, clip):
    frames = np.stack([clip[0]] * 4)
    ev = harness.evaluate(spec, frames, ["deepcache"], progress=False)
    np.testing.assert_allclose(ev.outputs["deepcache"], ev.outputs["nocache"], rtol=1e-4,
                               atol=1e-4)  # fmt: skip
    rec = ev.records[1]
    assert rec["top1_agreement"] == 1.0
    # 1 full frame, 3 still ones that skip the network (`skip_unchanged`)
    assert rec["ideal_speedup"] == pytest.approx(4.0)
    ev = harness.evaluate(spec, frames, ["deepcache:skip_unchanged=False"], progress=False)
    # 1 full frame, 3 where only the dense head (16 -> 10) runs
    head = 2 * 16 * 10 / ev.records[1]["total_flops"]
    assert ev.records[1]["ideal_speedup"] == pytest.approx(4.0 / (1.0 + 3 * head))


def test_wrong_frame_shape_is_an_error(spec, clip):
    with pytest.raises(ValueError, match="frames have shape"):
        harness.evaluate(spec, clip[:, :20], ["deepcache"], progress=False)


def test_json_round_trip(evaluation, tmp_path):
    path = tmp_path / "sub" / "out.json"
    bench.write_json(str(path), evaluation.records)
    loaded = json.loads(path.read_text())
    assert [r["variant"] for r in loaded] == ["nocache", "deepcache", "frame"]
    for r in loaded:
        metrics.check_record(r)


def test_input_masks(evaluation, clip):
    masks = harness.input_masks(evaluation.runners["deepcache"].config, clip)
    assert masks.shape == clip.shape[:3] and masks.dtype == bool
    assert not masks[0].any()
    same = harness.input_masks({"matcher": "static"}, np.stack([clip[0]] * 2))
    assert same[1].all()


def test_resolve_video(tmp_path):
    assert harness.resolve_video("vtest").endswith(".mp4")
    with pytest.raises(FileNotFoundError, match="no such video"):
        harness.resolve_video(str(tmp_path / "missing.mp4"))
