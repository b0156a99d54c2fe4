"""The ``dcjax`` command: argument errors, ``models``, and tiny ``run``/``demo``/``bench``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from dcjax import cli, models, video
from dcjax.eval import metrics

TINY = ["--model", "dave", "--width", "0.25", "--frames", "3", "--no-progress"]


@pytest.mark.parametrize(
    "argv,named",
    [
        ([], "COMMAND"),
        (["frobnicate"], "COMMAND"),
        (["run"], "VIDEO"),
        (["run", "vtest"], "--model"),
        (["run", "missing_video.mp4", "--model", "dave"], "VIDEO"),
        (["run", "vtest", "--model", "nope"], "--model"),
        (["run", "vtest", "--model", "dave", "--method", "bogus"], "--method"),
        (["run", "vtest", "--model", "dave", "--method", "deepcache:x"], "--method"),
        (["run", "vtest", "--model", "dave", "--method", "deepcache:block_size=-3"], "--method"),
        (["run", "vtest", "--model", "dave", "--method", "mil:fraction=2"], "--method"),
        (["bench", "--methods", "nocache", "deepmon:grid=(4,0)"], "--methods"),
        (["profile", "vtest", "--model", "dave", "--methods", "frame:min_match=2"], "--methods"),
        (["run", "vtest", "--model", "dave", "--frames", "1"], "--frames"),
        (["bench", "--frames", "ten"], "--frames"),
        (["bench", "--models", "dave", "nope"], "--models"),
        (["bench", "--methods", "bogus"], "--methods"),
        (["bench", "--videos", "nowhere.avi"], "--videos"),
        (["bench", "--matchers", "bogus"], "--matchers"),
        (["bench", "--deltas", "-0.1"], "--deltas"),
        (["bench", "--deltas", "nan"], "--deltas"),
        (["bench", "--pretrained", "maybe"], "--pretrained"),
        (["bench", "--cpus", "0"], "--cpus"),
        (["bench", "--cpus", str(10**6)], "--cpus"),
        (["demo", "--width", "0"], "--width"),
        (["demo", "--video", "nowhere.avi"], "--video"),
        (["profile", "vtest", "--model", "dave", "--frames", "5"], "--frames"),
        (["profile", "vtest", "--model", "dave", "--methods", "bogus"], "--methods"),
        (["profile", "nowhere.avi", "--model", "dave"], "VIDEO"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("dcjax: error:") and named in lines[0]


def test_options_the_model_refuses_exit_2_with_one_line(tmp_path, capsys):
    # only the method's factory, with the model loaded, can tell that a layer is unknown
    out_json = tmp_path / "b.json"
    argv = ["bench", "--models", "dave", "--width", "0.25", "--frames", "3", "--no-progress",
            "--videos", "vtest", "--methods", "nocache", "deepcache+refine:layers=('nope',)",
            "--json", str(out_json)]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--methods" in lines[0] and "nope" in lines[0], lines


@pytest.fixture(scope="module")
def bad_videos(tmp_path_factory):
    d = tmp_path_factory.mktemp("videos")
    frames = np.random.default_rng(0).integers(0, 255, (2, 32, 48, 3), np.uint8)
    video.write(d / "one.mp4", frames[:1], fps=10)
    video.write(d / "two.mp4", frames, fps=10)
    (d / "empty.mp4").write_bytes(b"")
    (d / "noise.mp4").write_bytes(np.random.default_rng(1).bytes(5000))
    data = open(video.resolve("vtest"), "rb").read()
    (d / "cut.mp4").write_bytes(data[: len(data) // 10])  # breaks after 9 frames
    (d / "cut_early.mp4").write_bytes(data[: len(data) // 50])  # before the first frame
    (d / "adir").mkdir()
    (d / "afile.txt").write_text("")
    return d


@pytest.mark.parametrize(
    "argv,named,says",
    [
        (["run", "noise.mp4", "--model", "dave"], "VIDEO", "cannot read"),
        (["run", "empty.mp4", "--model", "dave"], "VIDEO", "cannot read"),
        (["run", "cut_early.mp4", "--model", "dave"], "VIDEO", "truncated"),
        (["run", "one.mp4", "--model", "dave"], "VIDEO", "1 frame from frame 0"),
        (["run", "two.mp4", "--model", "dave", "--start", "1"], "VIDEO", "1 frame from frame 1"),
        (["run", "two.mp4", "--model", "dave", "--start", "5"], "--start", "past the end"),
        (["profile", "two.mp4", "--model", "dave"], "VIDEO", "at least 6"),
        (["bench", "--videos", "vtest", "noise.mp4"], "--videos", "noise.mp4"),
        (["bench", "--videos", "two.mp4", "--start", "2"], "--start", "past the end"),
        (["demo", "--video", "empty.mp4"], "--video", "cannot read"),
        # where the results go, checked before the run as well
        (["run", "two.mp4", "--model", "dave", "--out", "x.webm"], "--out", "libx264"),
        (["run", "two.mp4", "--model", "dave", "--out", "x.txt"], "--out", "no video format"),
        (["run", "two.mp4", "--model", "dave", "--out", "adir"], "--out", "directory"),
        (["run", "two.mp4", "--model", "dave", "--json", "adir"], "--json", "directory"),
        (["profile", "vtest", "--model", "dave", "--json", "adir"], "--json", "directory"),
        (["bench", "--videos", "two.mp4", "--report", "adir"], "--report", "directory"),
        (["bench", "--videos", "two.mp4", "--json", "afile.txt/b.json"], "--json", "afile.txt"),
        (["demo", "--out", "afile.txt"], "--out", "not a directory"),
    ],
)
def test_bad_videos_and_outputs_exit_2_with_one_line_before_anything_loads(
    argv, named, says, bad_videos, monkeypatch, capsys
):
    monkeypatch.chdir(bad_videos)
    monkeypatch.setattr(cli, "_load_spec", None)  # checked before any model loads
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("dcjax: error:") and named in lines[0] and says in lines[0]


def test_a_truncated_video_runs_on_the_frames_before_the_break(bad_videos, tmp_path, capsys):
    js = tmp_path / "run.json"
    argv = ["run", str(bad_videos / "cut.mp4"), "--model", "dave", "--width", "0.25",
            "--frames", "50", "--no-progress", "--json", str(js)]  # fmt: skip
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert "dcjax: warning:" in err and "stopped at frame 9" in err and "those 9 frames" in err
    assert [r["frames"] for r in json.loads(js.read_text())] == [9, 9]
    assert "9 frames from frame 0" in out
    argv = ["bench", "--models", "dave", "--width", "0.25", "--methods", "nocache", "--frames",
            "50", "--no-progress", "--videos", str(bad_videos / "cut.mp4"), "--json",
            str(tmp_path / "b.json"), "--report", str(tmp_path / "b.html")]  # fmt: skip
    assert cli.main(argv) == 0
    assert capsys.readouterr().err.count("dcjax: warning:") == 1
    assert json.loads((tmp_path / "b.json").read_text())[0]["frames"] == 9


def test_interrupting_a_bench_keeps_its_records_and_exits_130(tmp_path, monkeypatch, capsys):
    from dcjax.bench import evaluation as bench

    def interrupted(*args, on_record, **kwargs):
        on_record({"model": "dave", "method": "nocache"})
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_bench", interrupted)
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

    monkeypatch.setattr(bench, "run_bench", interrupted_at_once)
    assert cli.main([*argv, "--report", str(out_html)]) == 130  # no records: no report
    assert capsys.readouterr().err.strip() == "dcjax: interrupted; no record was made"
    assert len(written) == 2
    monkeypatch.setattr(cli, "_models", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    assert cli.main(["models"]) == 130
    assert capsys.readouterr().err.strip() == "dcjax: interrupted"


def test_compilation_cache_dir(monkeypatch, tmp_path):
    for var in ("JAX_COMPILATION_CACHE_DIR", "DCJAX_COMPILATION_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cli.compilation_cache_dir() == str(tmp_path / ".cache" / "dcjax" / "xla")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cli.compilation_cache_dir() == str(tmp_path / "xdg" / "dcjax" / "xla")
    monkeypatch.setenv("DCJAX_COMPILATION_CACHE", "~/mine")
    assert cli.compilation_cache_dir() == str(tmp_path / "mine")
    for off in ("off", "0", "OFF", "no"):
        monkeypatch.setenv("DCJAX_COMPILATION_CACHE", off)
        assert cli.compilation_cache_dir() is None
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))  # JAX's own wins
    assert cli.compilation_cache_dir() == str(tmp_path / "jax")


def test_compiled_steps_are_kept_between_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(XDG_CACHE_HOME=str(tmp_path), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    env.pop("DCJAX_COMPILATION_CACHE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "dcjax", "run", "vtest", *TINY, "--method", "deepcache"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    entries = os.listdir(tmp_path / "dcjax" / "xla")
    # the no-cache step, the cached step and its timed twin, each compiled once
    assert sum(e.endswith("-cache") for e in entries) >= 3, entries


def test_module_entry_point_bad_argument():
    proc = subprocess.run(
        [sys.executable, "-m", "dcjax", "bench", "--frames", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "--frames" in proc.stderr


def test_models_lists_the_zoo(capsys):
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    for name in models.names():
        assert name in out
    assert "227x227x3" in out and "66x200x3" in out
    assert "conv GFLOPs" in out


def test_run_writes_json_and_annotated_video(tmp_path, capsys):
    js, mp4 = tmp_path / "run.json", tmp_path / "new" / "annotated.mp4"  # directory created
    argv = ["run", "vtest", *TINY, "--json", str(js), "--out", str(mp4)]
    assert cli.main(argv) == 0
    records = json.loads(js.read_text())
    assert [r["method"] for r in records] == ["nocache", "deepcache"]
    for r in records:
        metrics.check_record(r)
        assert r["model"] == "dave" and r["video"] == "vtest" and r["frames"] == 3
    assert video.info(mp4).frames == 3
    assert "speedup" in capsys.readouterr().out


def test_profile_prints_where_the_time_goes_and_writes_json(tmp_path, capsys):
    js = tmp_path / "profile.json"
    argv = ["profile", "vtest", "--model", "dave", "--width", "0.25", "--frames", "7",
            "--no-progress", "--json", str(js)]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "wall time (median)" in out and "dcjax.match" in out
    records = json.loads(js.read_text())
    assert [r["method"] for r in records] == ["nocache", "deepcache"]
    for r in records:
        assert r["model"] == "dave" and r["frames"] == 2 and r["wall_ms"] > 0
        assert any(g.startswith("Dave/conv") for g in r["groups"]) and r["total_ms"] > 0


def test_demo_writes_report(tmp_path, capsys):
    out_dir = tmp_path / "demo"
    assert cli.main(["demo", *TINY, "--out", str(out_dir)]) == 0
    text = capsys.readouterr().out
    assert "ideal" in text and "reuse per layer" in text and "Dave" in text
    # PilotNet: five convolutions, then its four fully connected layers
    assert "5 convolutions, then 4 fully connected;" in text and "Dave/fc0" in text
    # how each layer was computed: on CPU every layer of the tiny PilotNet is too
    # small for a sparse kernel (`dcjax.kernels.auto`), so all run in full
    if jax.default_backend() == "cpu":
        rows = [line for line in text.splitlines() if line.startswith("Dave/")]
        assert len(rows) == 9 and all(" in full " in row for row in rows), rows
        # ... and the demo says why it gains nothing on moving frames
        assert "No layer of dave is computed sparsely here" in text
        assert 'kernel="auto"' in text and "(cpu; dcjax/kernels/auto.py)" in text
    html = (out_dir / "report.html").read_text()
    for png in ("reuse_masks.png", "timeline.png", "latency_by_method.png", "per_layer.png"):
        assert os.path.exists(out_dir / png), png
        assert f"href='{png}'" in html
    records = json.loads((out_dir / "metrics.json").read_text())
    assert [r["method"] for r in records] == ["nocache", "deepcache"]


def test_nothing_sparse_note_only_when_every_layer_ran_in_full():
    rec = {"model": "m", "config": {"kernel": "dense"},
           "per_layer": [{"sparse": False}, {"sparse": False}]}  # fmt: skip
    assert 'kernel="dense" computes every layer in full' in cli._nothing_sparse_note(rec)
    rec["per_layer"][1]["sparse"] = True
    assert cli._nothing_sparse_note(rec) == ""
    # the baseline's layers say nothing about how they ran
    assert cli._nothing_sparse_note({"model": "m", "per_layer": [{"name": "a"}]}) == ""
    assert cli._nothing_sparse_note({"model": "m", "per_layer": []}) == ""


def test_bench_writes_json_and_report(tmp_path, capsys):
    js, html = tmp_path / "b.json", tmp_path / "b.html"
    argv = ["bench", "--models", "dave", "--videos", "vtest", "--methods", "deepcache", "frame",
            "--frames", "3", "--width", "0.25", "--no-progress", "--json", str(js),
            "--report", str(html)]  # fmt: skip
    assert cli.main(argv) == 0
    records = json.loads(js.read_text())
    assert [r["method"] for r in records] == ["nocache", "deepcache", "frame"]
    assert html.exists() and "latency_by_method.png" in html.read_text()
    assert f"{len(os.sched_getaffinity(0))} CPU core(s)" in html.read_text()
    assert "wrote" in capsys.readouterr().out
    assert all(r["cpus"] == len(os.sched_getaffinity(0)) for r in records)
    assert all(r["xla_flags"] == os.environ.get("XLA_FLAGS", "") for r in records)


def test_bench_profile_says_where_the_time_went(tmp_path):
    js, html = tmp_path / "b.json", tmp_path / "b.html"
    argv = ["bench", "--models", "dave", "--videos", "vtest", "--methods", "deepcache",
            "--frames", "5", "--width", "0.25", "--no-progress", "--profile", "--json", str(js),
            "--report", str(html)]  # fmt: skip
    assert cli.main(argv) == 0
    records = json.loads(js.read_text())
    assert [r["profile"]["frames"] for r in records] == [2, 2]
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


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
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
    assert [(r["cpus"], r["xla_flags"]) for r in records] == [(1, flags)]
