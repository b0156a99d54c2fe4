"""The harness: one process, the same frames, records consistent with what was measured."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.bench.common import write_json
from dcjax.eval import harness, metrics, registry, specs


@pytest.fixture(scope="module")
def evaluation(spec, clip):
    return harness.evaluate(spec, clip, ["deepcache", "frame"], video_label="vtest",
                            progress=False)  # fmt: skip


def test_records_are_consistent_with_the_measurements(evaluation, clip):
    recs = {r["variant"]: r for r in evaluation.records}
    # the baselines added: nocache first, the plain model's two forms last
    assert list(recs) == ["nocache", "deepcache", "frame", "plain:form=args", "plain:form=const"]
    plain = {
        f: float(np.mean(evaluation.latencies_ms[f"plain:form={f}"])) for f in ("args", "const")
    }
    for variant, r in recs.items():
        metrics.check_record(r)
        assert r["frames"] == len(clip)
        ms = evaluation.latencies_ms[variant]
        assert r["mean_ms"] == pytest.approx(float(np.mean(ms)))
        assert r["p99_ms"] == pytest.approx(float(np.percentile(ms, 99)))
        ref = float(np.mean(evaluation.latencies_ms["nocache"]))
        assert r["speedup_vs_dense"] == pytest.approx(ref / float(np.mean(ms)))
        assert r["plain_form"] == min(plain, key=plain.get)
        assert r["speedup_vs_plain"] == pytest.approx(min(plain.values()) / float(np.mean(ms)))
        ratio = evaluation.infos[variant]["flops_ratio"]
        assert r["ideal_speedup"] == pytest.approx(1.0 / float(np.mean(ratio)))
        assert r["refreshes"] == int(evaluation.infos[variant]["refreshed"].sum())
    base = recs["nocache"]
    assert base["speedup_vs_dense"] == 1.0 and base["top1_agreement"] == 1.0
    assert base["output_mse"] == 0 and base["still_fraction"] == 0.0
    for form in ("args", "const"):  # the plain model computes what the dense lowering does
        assert recs[f"plain:form={form}"]["output_rel_mse"] < 1e-10
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


def test_deepcache_is_timed_without_statistics_and_reports_them_from_a_second_pass(
    evaluation, spec, clip
):
    """The timed step is the twin without per-layer statistics; the record's
    statistics equal those of the reporting runner stepped alone over the clip,
    and its outputs those of the timed steps."""
    timed = evaluation.runners["deepcache"]
    assert timed.config["statistics"] is False and timed.timed is None
    reporting = registry.make_runner(spec, "deepcache", {})
    assert reporting.config["statistics"] is True and reporting.timed is not None
    state, outs, infos = reporting.init(), [], []
    for f in clip:
        out, state, info = reporting.step(state, jnp.asarray(f))
        outs.append(np.asarray(out))
        infos.append(info)
    ratios = np.array([float(i["flops_ratio"]) for i in infos])
    reuse = np.stack([np.asarray(i["reuse_fraction"]) for i in infos])
    assert np.isfinite(ratios).all() and ratios[0] == 1.0  # the first frame: computed in full
    np.testing.assert_allclose(evaluation.infos["deepcache"]["flops_ratio"], ratios, rtol=1e-6)
    rec = {r["variant"]: r for r in evaluation.records}["deepcache"]
    assert rec["config"]["statistics"] is False
    assert rec["ideal_speedup"] == pytest.approx(1.0 / ratios.mean())
    convs = rec["per_layer"][: reuse.shape[1]]
    np.testing.assert_allclose([lay["reuse_fraction"] for lay in convs], reuse.mean(0), rtol=1e-6)
    np.testing.assert_allclose(evaluation.outputs["deepcache"], np.stack(outs).reshape(
        evaluation.outputs["deepcache"].shape), rtol=1e-5, atol=1e-6)  # fmt: skip
    # whatever the option says, the statistics are reported (and the step timed without)
    ev = harness.evaluate(spec, clip[:3], ["deepcache:statistics=False"], progress=False)
    rec = ev.records[1]
    metrics.check_record(rec)
    assert np.isfinite(ev.infos["deepcache:statistics=False"]["flops_ratio"]).all()
    assert rec["ideal_speedup"] == pytest.approx(1.0 / ratios[:3].mean())
    # the timed steps report no statistics on frames that ran
    state = timed.init()
    _, state, info = timed.step(state, jnp.asarray(clip[0]))
    assert np.isnan(float(info["flops_ratio"]))
    assert np.isnan(np.asarray(info["reuse_fraction"])).all()


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


def test_the_order_of_the_methods_is_drawn_afresh_each_frame(spec, clip):
    """Each frame steps every method once, in an order of its own: no method
    always runs right after the same one (and inherits what it left in the
    processor's caches)."""
    calls: list[str] = []
    cache = {}
    variants = ["nocache", "frame", "plain:form=args", "plain:form=const"]
    for v in variants:
        r = registry.make_runner(spec, *registry.parse_method(v))

        def step(state, frame, _v=v, _step=r.step):
            calls.append(_v)
            return _step(state, frame)

        cache[v] = dataclasses.replace(r, step=step, timed=None)
    frames = np.concatenate([clip, clip])
    harness.evaluate(spec, frames, ["frame"], progress=False, runner_cache=cache, warmup=1)
    n = len(variants)
    assert calls[:n] == variants  # one warm-up step each, in the methods' order,
    assert calls[n : 2 * n] == variants  # then the untimed round (`interleaving.warm_up`)
    timed = calls[2 * n : 2 * n + n * len(frames)]
    rounds = [timed[i : i + n] for i in range(0, len(timed), n)]
    assert all(sorted(r) == sorted(variants) for r in rounds)
    before = {v: {r[r.index(v) - 1] for r in rounds if r.index(v) > 0} for v in variants}
    assert all(len(b) > 1 for b in before.values()), before


def test_wrong_frame_shape_is_an_error(spec, clip):
    with pytest.raises(ValueError, match="frames have shape"):
        harness.evaluate(spec, clip[:, :20], ["deepcache"], progress=False)


def test_json_round_trip(evaluation, tmp_path):
    path = tmp_path / "sub" / "out.json"
    write_json(str(path), evaluation.records)
    loaded = json.loads(path.read_text())
    assert [r["variant"] for r in loaded] == [r["variant"] for r in evaluation.records]
    assert [r["variant"] for r in loaded][:3] == ["nocache", "deepcache", "frame"]
    for r in loaded:
        metrics.check_record(r)


def test_input_masks(evaluation, clip):
    masks = harness.input_masks(evaluation.runners["deepcache"].config, clip)
    assert masks.shape == clip.shape[:3] and masks.dtype == bool
    assert not masks[0].any()
    same = harness.input_masks({"matcher": "static"}, np.stack([clip[0]] * 2))
    assert same[1].all()


def test_load_frames_keeps_what_decoded_before_a_break(tmp_path):
    from dcjax import video

    data = open(video.resolve("vtest"), "rb").read()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) // 10])  # breaks after 9 frames
    with pytest.raises(video.TruncatedVideoError):
        harness.load_frames(str(cut), (32, 48, 3), frames=50)
    seen = []
    kept = harness.load_frames(str(cut), (32, 48, 3), frames=50,
                               on_truncated=lambda e, n: seen.append((e.frame, n)))  # fmt: skip
    whole = harness.load_frames("vtest", (32, 48, 3), frames=len(kept))
    assert seen == [(len(kept), len(kept))] and 0 < len(kept) < 50
    np.testing.assert_array_equal(kept, whole)  # the frames before the break, as decoded whole
    # stopping before the break is no truncation
    assert len(harness.load_frames(str(cut), (32, 48, 3), frames=3, on_truncated=seen.append)) == 3
    assert len(seen) == 1
    # a break before the first frame asked for leaves nothing to go on with
    with pytest.raises(video.TruncatedVideoError):
        harness.load_frames(str(cut), (32, 48, 3), frames=5, start=len(kept), on_truncated=print)


def test_calibrated_takes_the_streams_first_frames_unless_the_spec_has_its_own():
    spec = specs.model_spec("dave", width=0.25, input_size=(64, 64))
    frames = np.arange(20 * 4).reshape(20, 1, 2, 2).astype(np.uint8)
    got = harness.calibrated(spec, frames)
    np.testing.assert_array_equal(got.calibration, frames[: harness.CALIBRATION_FRAMES])
    assert harness.calibrated(got, frames[5:]) is got  # its own calibration stays
    assert harness.calibrated(spec, frames[:1]) is spec  # one frame shows no change
