"""Metrics records: definitions, consistency checks, agreement."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from dcjax.eval import metrics


def _record(**overrides):
    layers = [
        SimpleNamespace(name="a", flops=300, sparse=True),
        SimpleNamespace(name="b", flops=100),  # a method that does not say
    ]
    ref = np.array([[[0.0, 1.0, 0.5]], [[2.0, 1.0, 0.0]], [[0.0, 0.0, 3.0]], [[1, 0, 0]]])
    out = ref.copy()
    out[3] = [[0.0, 0.2, 0.1]]  # top-1 changes on one frame of four
    kwargs = dict(
        model="m", video="v.mp4", method="deepcache", variant="deepcache",
        latencies_ms=[4.0, 2.0, 2.0, 6.0], dense_latencies_ms=[5.0, 5.0, 4.0, 6.0],
        plain_latencies_ms={"args": [6.0, 6.0, 6.0, 6.0], "const": [5.5, 5.5, 5.5, 5.5]},
        outputs=out, reference=ref,
        infos={
            "flops_ratio": np.array([1.0, 0.5, 0.25, 0.25]),
            "match_ratio": np.array([0.0, 0.9, 0.7, np.nan]),
            "refreshed": np.array([True, False, False, False]),
            "refresh_band": np.array([-1, -1, 0, 1]),
            "reuse_fraction": np.array([[0, 0], [0.5, 0.0], [1.0, 0.5], [1.0, 0.5]]),
            "skipped": np.array([False, False, True, False]),
        },
        layers=layers, total_flops=400, cache_bytes=1234, config={"k": 1},
        frame_shape=(8, 8, 3), compile_s=1.5,
    )  # fmt: skip
    kwargs.update(overrides)
    return metrics.make_record(**kwargs)


def test_record_values():
    r = _record()
    metrics.check_record(r)
    assert set(metrics.RECORD_KEYS) <= set(r)
    assert r["mean_ms"] == 3.5 and r["p50_ms"] == 3.0
    assert r["p99_ms"] == pytest.approx(np.percentile([4.0, 2.0, 2.0, 6.0], 99))
    assert r["throughput_fps"] == pytest.approx(4 / 14.0 * 1000)
    assert r["dense_mean_ms"] == 5.0
    assert r["plain_mean_ms"] == 5.5 and r["plain_form"] == "const"  # the faster form
    assert r["speedup_vs_dense"] == pytest.approx(5.0 / 3.5)
    assert r["speedup_vs_plain"] == pytest.approx(5.5 / 3.5)
    assert r["ideal_speedup"] == pytest.approx(1.0 / 0.5)
    assert r["efficiency"] == pytest.approx((5.0 / 3.5) / 2.0)
    assert r["still_fraction"] == 0.25
    assert r["page_faults"] is None  # not counted
    assert _record(page_faults=[0, 10, 2, 0])["page_faults"] == 3.0  # mean a frame
    assert r["refresh_frame_ms"] == 4.0 and r["other_frame_ms"] == pytest.approx(10 / 3)
    assert r["top1_agreement"] == 0.75
    assert r["top5_agreement"] == 1.0  # three classes: everything is in the top five
    assert r["top1_stability"] == 0.0  # the reference's top-1 changes on every frame
    assert r["match_ratio"] == pytest.approx(0.8)  # refresh frame and NaN left out
    assert r["refreshes"] == 1 and r["band_refreshes"] == 2
    assert r["guarded_fraction"] == 0.0  # no guard reported
    assert r["cache_bytes"] == 1234
    assert [lay["reuse_fraction"] for lay in r["per_layer"]] == [0.625, 0.25]
    assert [lay["sparse"] for lay in r["per_layer"]] == [True, None]  # None: not said
    assert r["output_mse"] == pytest.approx(np.mean(np.square([1, 0.2, 0.1])) / 4)


def test_the_guarded_fraction_is_the_mean_over_frames():
    infos = {
        "flops_ratio": np.array([1.0, 0.5]),
        "match_ratio": np.array([0.0, 0.9]),
        "refreshed": np.array([True, False]),
        "reuse_fraction": np.zeros((2, 2)),
        "guarded": np.array([0.0, 0.3]),
    }
    r = _record(
        infos=infos, latencies_ms=[4.0, 2.0], dense_latencies_ms=[5.0, 5.0],
        plain_latencies_ms={"args": [6.0, 6.0]},
        outputs=np.zeros((2, 1, 3)), reference=np.zeros((2, 1, 3)),
    )  # fmt: skip
    metrics.check_record(r)
    assert r["guarded_fraction"] == pytest.approx(0.15)


def test_stability_counts_consecutive_frames_with_the_same_top1():
    ref = np.array([[0.0, 1.0], [0.0, 2.0], [3.0, 0.0], [4.0, 1.0], [5.0, 0.0]])
    assert metrics.stability(ref) == 0.75  # classes 1, 1, 0, 0, 0
    assert metrics.stability(ref[:, None]) == 0.75  # (T, 1, C) like a traced batch of one
    assert metrics.stability(ref[:1]) is None  # no pair of frames
    assert metrics.stability(np.zeros((3, 1))) is None  # regression


def test_agreement_top_k():
    ref = np.array([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]])
    out = np.array([[3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.0, 0.0]])
    assert metrics.agreement(ref, out, 1) == 0.5
    assert metrics.agreement(ref, out, 3) == 0.5
    assert metrics.agreement(ref, out, 4) == 1.0
    assert metrics.agreement(np.zeros((3, 1)), np.zeros((3, 1))) is None  # regression
    assert metrics.agreement(np.zeros((3, 7, 7, 30)), np.zeros((3, 7, 7, 30))) is None


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("speedup_vs_plain", 2.0, "ratio of means"),
        ("speedup_vs_dense", 2.0, "ratio of means"),
        ("throughput_fps", 2.0, "mean_ms"),
        ("efficiency", 0.1, "speedup_vs_dense / ideal"),
        ("plain_form", "jit", "plain_form"),
        ("still_fraction", 1.5, "outside"),
        ("top1_agreement", 1.5, "outside"),
        ("top1_stability", -0.5, "outside"),
        ("refreshes", 99, "refreshes"),
    ],
)
def test_check_record_catches_inconsistency(key, value, match):
    r = _record()
    r[key] = value
    with pytest.raises(ValueError, match=match):
        metrics.check_record(r)


@pytest.mark.parametrize("flag", ["yes", 1, 0.0])
def test_check_record_catches_a_per_layer_sparse_flag_that_is_not_a_bool(flag):
    r = _record()
    r["per_layer"][1]["sparse"] = flag
    with pytest.raises(ValueError, match="sparse"):
        metrics.check_record(r)


def test_per_layer_sparse_flags_become_json_bools():
    layers = [SimpleNamespace(name="a", flops=300, sparse=np.bool_(True)),
              SimpleNamespace(name="b", flops=100, sparse=np.bool_(False))]  # fmt: skip
    r = _record(layers=layers)
    metrics.check_record(r)
    assert json.loads(json.dumps(r["per_layer"])) == [
        {"name": "a", "flops": 300, "reuse_fraction": 0.625, "sparse": True},
        {"name": "b", "flops": 100, "reuse_fraction": 0.25, "sparse": False},
    ]


@pytest.mark.parametrize("key", ["name", "flops", "reuse_fraction"])
def test_check_record_catches_a_per_layer_entry_without_a_key(key):
    r = _record()
    del r["per_layer"][0][key]
    with pytest.raises(ValueError, match="lacks keys"):
        metrics.check_record(r)


def test_check_record_catches_missing_key():
    r = _record()
    del r["cache_bytes"]
    with pytest.raises(ValueError, match="cache_bytes"):
        metrics.check_record(r)


def test_latency_stats():
    s = metrics.latency_stats(list(range(1, 11)))
    assert s["p50_ms"] == 5.5 and math.isclose(s["p99_ms"], 9.91) and s["mean_ms"] == 5.5
    assert math.isclose(s["throughput_fps"], 1000 * 10 / 55)
    with pytest.raises(ValueError):
        metrics.latency_stats([])


@pytest.mark.parametrize(
    ("speedup", "ideal", "se", "warned"),
    [
        (1.58, 1.55, None, True),
        (1.55, 1.55, None, False),
        (1.2, 1.55, None, False),
        (1.3, None, None, False),
        (1.01, 1.0, 0.01, False),  # a dense step's own noise
        (1.03, 1.0, 0.01, True),  # beyond two standard errors
        (1.58, 1.55, float("nan"), True),  # no noise known: any excess
    ],
)
def test_a_speedup_above_its_ideal_beyond_the_noise_is_a_warning(speedup, ideal, se, warned):
    note = metrics.above_ideal("deepcache", speedup, ideal, se)
    assert (note is not None) == warned
    if warned:
        assert "deepcache" in note and f"{speedup:.2f}x" in note and f"{ideal:.2f}x" in note


def test_the_ratio_of_paired_means_has_the_standard_error_of_its_spread():
    """`ratio_se` against two independent figures: with a constant denominator,
    the standard error of a mean over that constant; and over many simulated
    runs of paired frames (a frame's load shared by both, noise of their own),
    the spread of the ratio of means itself."""
    num = [1.0, 2.0, 3.0, 4.0]
    assert metrics.ratio_se(num, [2.0] * 4) == pytest.approx(np.std(num, ddof=1) / 2 / 2.0)
    rng = np.random.default_rng(0)
    runs, n = 4000, 40
    shared = rng.gamma(4.0, 2.0, (runs, n))  # the frame's own cost, both methods
    dense = 50.0 + shared + rng.normal(0, 1.5, (runs, n))
    cached = 40.0 + 0.8 * shared + rng.normal(0, 2.0, (runs, n))
    ratios = dense.mean(1) / cached.mean(1)
    ses = [metrics.ratio_se(d, c) for d, c in zip(dense, cached)]
    assert np.mean(ses) == pytest.approx(ratios.std(), rel=0.1)
    assert metrics.ratio_se([1.0], [1.0]) is None
    with pytest.raises(ValueError, match="paired"):
        metrics.ratio_se([1.0, 2.0], [1.0])


def test_a_record_carries_its_speedups_standard_error():
    r = _record()
    dense, lat = [5.0, 5.0, 4.0, 6.0], [4.0, 2.0, 2.0, 6.0]
    assert r["speedup_vs_dense_se"] == pytest.approx(metrics.ratio_se(dense, lat))
    assert r["speedup_vs_dense_se"] > 0
    assert _record(latencies_ms=[4.0], dense_latencies_ms=[5.0], plain_latencies_ms={
        "args": [6.0]}, outputs=np.zeros((1, 1, 3)), reference=np.zeros((1, 1, 3)),
        infos={"flops_ratio": np.array([1.0]), "match_ratio": np.array([0.0]),
               "refreshed": np.array([True]), "reuse_fraction": np.zeros((1, 2))},
    )["speedup_vs_dense_se"] is None  # fmt: skip
    with pytest.raises(ValueError, match="standard error"):
        metrics.check_record({**r, "speedup_vs_dense_se": -0.1})


@pytest.mark.parametrize(
    ("speedup", "se", "cell"),
    [(0.97877, 0.02315, "0.98x ±0.02"), (1.0, 0.0, "1.00x"), (1.5, None, "1.50x")],
)
def test_a_speedup_cell_carries_its_standard_error(speedup, se, cell):
    assert metrics.speedup_cell(speedup, se) == cell
