"""Plots, the HTML report, the bench driver and the matcher comparison."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from dcjax.bench import evaluation
from dcjax.eval import plots, report, specs


@pytest.fixture(scope="module")
def bench_result():
    return evaluation.run_bench(["dave"], ["vtest"], ["nocache", "deepcache", "deepmon"], frames=3,
                           width=0.25, thresholds=[20, 30], blocks=[20], deltas=[0.05, 0.2],
                           matchers=["static",
                           "histogram"], progress=False)  # fmt: skip


def test_run_bench_variants(bench_result):
    records, rows = bench_result
    assert [r["variant"] for r in records] == [
        "nocache", "deepcache", "deepmon", "deepcache:psnr_threshold=30.0",
        "deepcache:block_size=20", "deepcache+refine", "delta", "deepcache+refine:delta=0.2",
        "delta:delta=0.2", "plain:form=args", "plain:form=const",
    ]  # fmt: skip
    assert records[3]["config"]["psnr_threshold"] == 30.0
    assert records[4]["config"]["block_size"] == 20
    assert [r["config"]["refine"]["delta"] for r in records[5:9]] == [0.05, 0.05, 0.2, 0.2]
    assert [r["config"]["matcher"] == "none" for r in records[5:9]] == [False, True, False, True]
    assert all(r["model"] == "dave" and r["video"] == "vtest" for r in records)
    assert [r["matcher"] for r in rows] == ["static", "histogram"]
    assert all(0 <= r["match_ratio"] <= 1 and r["ms"] > 0 for r in rows)


def test_report_writes_html_and_its_pngs(bench_result, tmp_path):
    records, rows = bench_result
    frames = np.zeros((3, 16, 16, 3), np.uint8)
    masks = np.zeros((3, 16, 16), bool)
    masks[1, :8] = True
    extra = {"strip": plots.mask_strip(frames, masks, [1, 2])}
    path = tmp_path / "r" / "report.html"
    pngs = report.write_report(str(path), records, figures=extra, matcher_rows=rows)
    text = path.read_text()
    for name in ("strip", "latency_by_method", "per_layer", "threshold_sweep",
                 "block_size_sweep", "delta_pareto", "matchers", "cache_memory"):  # fmt: skip
        assert name in pngs, name
        assert os.path.getsize(pngs[name]) > 1000
        with open(pngs[name], "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert f"href='{name}.png'" in text
    assert len(re.findall(r"src='data:image/png;base64,", text)) == len(pngs)
    assert "deepcache:psnr_threshold=30.0" in text and "dave" in text


@pytest.mark.parametrize("count", [1, 2])
def test_report_of_the_first_records_alone(bench_result, tmp_path, count):
    """What an interrupted bench has made so far (the no-cache record, then the
    first method's) is enough for a report."""
    records, _ = bench_result
    path = tmp_path / "partial.html"
    pngs = report.write_report(str(path), records[:count], title="dcjax bench")
    text = path.read_text()
    assert "latency_by_method" in pngs
    assert all(r["method"] in text for r in records[:count])
    assert "deepmon" not in text  # the third record's method


def test_sweep_needs_two_values(bench_result):
    records, _ = bench_result
    assert plots.sweep(records[:2], "psnr_threshold") is None
    fig = plots.sweep(records, "psnr_threshold")
    # Only the variants that differ from the default in the swept key: not block_size=20.
    assert list(fig.axes[0].lines[0].get_xdata()) == [20.0, 30.0]
    fig = plots.sweep(records, "block_size")
    assert list(fig.axes[0].lines[0].get_xdata()) == [10.0, 20.0]


def test_pareto_front_keeps_the_undominated_points():
    pts = [(1.0, 100.0), (2.0, 90.0), (1.5, 85.0), (3.0, 70.0), (2.0, 95.0), (0.5, 100.0)]
    assert plots.pareto_front(pts) == [0, 4, 3]
    assert plots.pareto_front([]) == []


def test_pareto_plot_has_one_front_per_method(bench_result):
    records, _ = bench_result
    assert plots.pareto(records[:2]) is None  # no refinement variants, one deepcache point
    fig = plots.pareto(records)
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["deepcache", "delta", "deepcache+refine", "deepmon"]
    # every variant of a method is a point; deepcache has 3 (default, threshold, block)
    points = [ln for ln in ax.lines if ln.get_linestyle() == "None"]
    assert [len(ln.get_xdata()) for ln in points] == [3, 2, 2, 1]
    speedups = sorted(r["speedup_vs_dense"] for r in records if r["method"] == "delta")
    assert sorted(points[1].get_xdata()) == pytest.approx(speedups)


def test_pareto_plot_places_mil_by_its_threshold(bench_result):
    records, _ = bench_result
    base = next(r for r in records if r["method"] == "deepmon")
    mil = [
        {**base, "method": "mil", "variant": f"mil:psnr_threshold={t}", "speedup_vs_dense": s,
         "config": {**base["config"], "psnr_threshold": t}}
        for t, s in ((20.0, 3.0), (30.0, 1.5))
    ]  # fmt: skip
    fig = plots.pareto([r for r in records if r["method"] == "deepcache"] + mil)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["deepcache", "mil"]
    assert sorted(t.get_text() for t in ax.texts) == ["20 dB", "30 dB"]


def test_zoo_table_lists_the_zoo():
    from dcjax import models

    rows = specs.zoo_table()
    assert [r["name"] for r in rows] == [*models.names(), *models.onnx_zoo.names()]
    alex = next(r for r in rows if r["name"] == "alexnet")
    assert alex["convs"] == 5 and 1.0e9 < alex["conv_flops"] < 1.5e9 and alex["source"] == "flax"
    assert {r["name"] for r in rows if r["pretrained"]} == {
        "efficientnet_lite0", "mobilenet_v2", "centerface"}  # fmt: skip
    face = rows[-1]
    assert face["source"] == "onnx" and face["task"] == "detection"
    assert face["input_shape"] == [288, 384, 3] and face["params"] > 1_000_000
    # CenterFace's convolutions, its three transposed ones included (lhs dilation)
    assert face["convs"] > 50 and face["conv_flops"] > 1e9


def test_per_layer_table_says_how_each_layer_was_computed():
    layers = [
        {"name": "a", "flops": 300, "reuse_fraction": 0.5, "sparse": True},
        {"name": "b", "flops": 100, "reuse_fraction": 0.5, "sparse": False},
        {"name": "c", "flops": 100, "reuse_fraction": 0.5, "sparse": None},
    ]
    html = report._per_layer_table({"per_layer": layers})
    rows = re.findall(r"<tr>(.*?)</tr>", html)
    cells = [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row) for row in rows]
    head = cells[0]
    assert "computed" in head
    col, share = head.index("computed"), head.index("computed share")
    by_name = {row[0]: row for row in cells[1:]}
    assert [by_name[n][col] for n in "abc"] == ["sparse", "in full", "–"]
    # a layer computed in full computes its whole share, not what it could have reused
    assert [by_name[n][share] for n in "abc"] == ["30.0%", "20.0%", "10.0%"]
    # no column at all where no layer says (the baseline's records)
    plain = [{k: v for k, v in lay.items() if k != "sparse"} for lay in layers]
    assert ">computed<" not in report._per_layer_table({"per_layer": plain})
    assert report.computed_cells(plain) == [{}, {}, {}]


def test_the_summary_gives_each_methods_speedup_with_its_standard_error(bench_result):
    records, _ = bench_result
    rows = report.summary_rows(records)
    for r, row in zip(records, rows, strict=True):
        se = r["speedup_vs_dense_se"]
        assert se is not None and se >= 0  # three frames
        want = f"{r['speedup_vs_dense']:.2f}x" + (f" ±{se:.2f}" if se else "")
        assert row["vs dense"] == want
    assert rows[0]["vs dense"] == "1.00x"  # nocache against itself: no spread
