"""``dcjax bench``: tiny runs of the paper's evaluation, interruptions, ``--cpus``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dcjax import cli
from dcjax.cli import subcommands


def test_interrupting_a_bench_keeps_its_records_and_exits_130(tmp_path, monkeypatch, capsys):
    from dcjax.bench import evaluation

    def interrupted(*args, on_record, **kwargs):
        on_record({"model": "dave", "method": "nocache"})
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluation, "run_bench", interrupted)
    out_json = tmp_path / "b.json"
    argv = ["bench", "--models", "dave", "--videos", "vtest", "--json", str(out_json)]
    assert cli.main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dcjax: interrupted; the records made so far (1) are in {out_json}"]
    (kept,) = json.loads(out_json.read_text())
    # the record as the bench made it, with the machine's description added as it came
    assert kept["model"] == "dave" and kept["method"] == "nocache"
    assert kept["cpus"] >= 1 and kept["xla_flags"] == os.environ.get("XLA_FLAGS", "")
    # with --report, the records made so far get their report; a failing report
    # is named and leaves the records alone
    from dcjax.eval import report

    written = []

    def fake_report(path, records, **kwargs):
        written.append((path, [r["method"] for r in records], kwargs["intro"]))
        if len(written) == 2:
            raise ValueError("dcjax: no latency to plot")
        open(path, "w").write("<html></html>")

    monkeypatch.setattr(report, "write_report", fake_report)
    out_html = tmp_path / "r" / "b.html"
    for expect in (f", their report in {out_html}", " (no report: ValueError: no latency to plot)"):
        assert cli.main([*argv, "--report", str(out_html)]) == 130
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"dcjax: interrupted; the records made so far (1) are in {out_json}{expect}"]
        assert len(json.loads(out_json.read_text())) == 1
    assert [w[:2] for w in written] == [(str(out_html), ["nocache"])] * 2
    assert "Interrupted" in written[0][2]
    assert out_html.exists()

    def interrupted_at_once(*args, on_record, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluation, "run_bench", interrupted_at_once)
    assert cli.main([*argv, "--report", str(out_html)]) == 130  # no records: no report
    assert capsys.readouterr().err.strip() == "dcjax: interrupted; no record was made"
    assert len(written) == 2
    monkeypatch.setattr(
        subcommands, "models_command", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    assert cli.main(["models"]) == 130
    assert capsys.readouterr().err.strip() == "dcjax: interrupted"


def test_bench_writes_json_and_report(tmp_path, capsys):
    js, html = tmp_path / "b.json", tmp_path / "b.html"
    argv = ["bench", "--models", "dave", "--videos", "vtest", "--methods", "deepcache", "frame",
            "--frames", "3", "--width", "0.25", "--no-progress", "--json", str(js),
            "--report", str(html)]  # fmt: skip
    assert cli.main(argv) == 0
    records = json.loads(js.read_text())
    assert [r["method"] for r in records] == ["nocache", "deepcache", "frame", "plain", "plain"]
    assert html.exists() and "latency_by_method.png" in html.read_text()
    assert f"{len(os.sched_getaffinity(0))} CPU core(s)" in html.read_text()
    assert "wrote" in capsys.readouterr().out
    assert all(r["cpus"] == len(os.sched_getaffinity(0)) for r in records)
    assert all(r["xla_flags"] == os.environ.get("XLA_FLAGS", "") for r in records)
    # the command's memory settings, a condition of every time (dcjax.allocator)
    from dcjax import allocator

    assert all(r["memory"] == allocator.setting() and "heap pad" in r["memory"] for r in records)


def test_bench_profile_says_where_the_time_went(tmp_path):
    js, html = tmp_path / "b.json", tmp_path / "b.html"
    argv = ["bench", "--models", "dave", "--videos", "vtest", "--methods", "deepcache",
            "--frames", "5", "--width", "0.25", "--no-progress", "--profile", "--json", str(js),
            "--report", str(html)]  # fmt: skip
    assert cli.main(argv) == 0
    records = json.loads(js.read_text())
    assert [r["profile"]["frames"] for r in records] == [2] * 4  # with the plain forms
    # every convolution has its own time; PilotNet's small fully connected layers
    # may be fused into a neighbour's operations (no time of their own: None)
    for r in records:
        convs = [lay for lay in r["per_layer"] if "/conv" in lay["name"]]
        assert len(convs) == 5 and all(lay["ms"] > 0 for lay in convs)
        assert {lay["name"] for lay in r["per_layer"]} - {lay["name"] for lay in convs} == {
            "Dave/fc0", "Dave/fc1", "Dave/fc2", "Dave/out"
        }  # fmt: skip
        assert all(lay["ms"] is None or lay["ms"] > 0 for lay in r["per_layer"])
        kinds = r["profile"]["kinds"]
        assert sum(kinds.values()) == pytest.approx(r["profile"]["total_ms"])
        assert kinds["products"] > 0 and 0 < r["profile"]["busy_ms"]
    page = html.read_text()
    section = page[page.index("Where the time went") :]
    assert "dcjax.match" in section and records[0]["per_layer"][0]["name"] in section
    assert "gathers, scatters, slices" in section and "between operations" in section


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"),
    reason="--cpus pins the process with os.sched_setaffinity (Linux); on this platform the "
    "CLI refuses --cpus with a one-line error instead",
)
def test_bench_on_one_core(tmp_path):
    """``--cpus 1`` pins the process (a subprocess: pinning this one would slow the tests)."""
    js = tmp_path / "b.json"
    code = (
        "import os, sys; from dcjax import cli; rc = cli.main(sys.argv[1:]); "
        "print('allowed', len(os.sched_getaffinity(0))); sys.exit(rc)"
    )
    argv = ["bench", "--cpus", "1", "--models", "dave", "--videos", "vtest",
            "--methods", "nocache", "--frames", "3", "--width", "0.25", "--no-progress",
            "--json", str(js)]  # fmt: skip
    flags = "--xla_cpu_experimental_ynn_fusion_type="  # the README's Eigen baseline
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300,
        env={**os.environ, "XLA_FLAGS": flags},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "allowed 1" in proc.stdout
    records = json.loads(js.read_text())
    assert [(r["cpus"], r["xla_flags"]) for r in records] == [(1, flags)] * 3  # and plain
