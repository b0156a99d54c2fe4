"""The ``dcjax`` command's parser and entry point: argument errors, the compilation cache."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dcjax import cli
from dcjax.bench import PROGRAMS, common
from tests.cli import TINY


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
    monkeypatch.setattr(common, "load_spec", None)  # checked before any model loads
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("dcjax: error:") and named in lines[0] and says in lines[0]


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
    env.pop("JAX_ENABLE_COMPILATION_CACHE", None)  # the suite turns it off (tests/conftest.py)
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


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_bench_programs_are_commands_of_their_own(program, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", program, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: dcjax bench {program} ")
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", program, "--no-such-option"])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dcjax: error:"), lines
    assert f"(see dcjax bench {program} --help)" in lines[0]


def test_bench_help_lists_the_programs(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "dcjax bench PROGRAM" in out and "--models" in out
    assert all(f"  {name} " in out for name in PROGRAMS)


@pytest.mark.parametrize(("flag", "shown"), [(["--no-progress"], False), ([], True)])
def test_a_bench_programs_no_progress_silences_the_kernel_tuning_bars(monkeypatch, flag, shown):
    from dcjax import autotune

    seen = []

    class Program:
        @staticmethod
        def main(argv):
            seen.append((argv, autotune._PROGRESS.get()))
            return 0

    monkeypatch.setattr("dcjax.cli.app._program", lambda name: Program)
    assert cli.main(["bench", "streams", *flag]) == 0
    assert seen == [(flag, shown)]
