"""``--size HxW`` and ``--native``: the frame size ``run``, ``bench`` and ``demo`` run at.

Every zoo model takes any size that leaves each of its layers a pixel, whether
or not its strides divide it (`dcjax.eval.specs.input_size_error`); smaller
sizes are refused, naming the nearest size the model takes.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from dcjax import cli, video
from dcjax.bench import arguments, common
from dcjax.eval import harness, specs
from tests.cli import TINY

#: The bundled clip's own size.
VTEST = (288, 384)


@pytest.fixture
def sizes(monkeypatch):
    """What the command built and decoded: (input_size asked, the model's frame
    shape) per model built, (frame_shape asked, shape decoded) per clip."""
    built, decoded = [], []
    model_spec, load_frames = specs.model_spec, harness.load_frames

    def spec(*args, **kwargs):
        out = model_spec(*args, **kwargs)
        built.append((kwargs.get("input_size"), out.frame_shape))
        return out

    def frames(path, frame_shape, **kwargs):
        out = load_frames(path, frame_shape, **kwargs)
        decoded.append((frame_shape, out.shape[1:]))
        return out

    monkeypatch.setattr(specs, "model_spec", spec)
    monkeypatch.setattr(harness, "load_frames", frames)
    return built, decoded


def test_run_at_a_size_no_stride_divides(sizes, tmp_path, capsys):
    # squeezenet pools globally; its total stride, 16, divides neither 40 nor 52
    js = tmp_path / "run.json"
    argv = ["run", "vtest", "--model", "squeezenet", "--width", "0.25", "--frames", "3",
            "--no-progress", "--size", "40x52", "--json", str(js)]  # fmt: skip
    assert cli.main(argv) == 0
    built, decoded = sizes
    assert built == [((40, 52), (40, 52, 3))]
    assert decoded == [((40, 52, 3), (40, 52, 3))]  # resized from 288x384
    records = json.loads(js.read_text())
    assert [r["method"] for r in records] == ["nocache", "deepcache", "plain", "plain"]
    assert [r["frame_shape"] for r in records] == [[40, 52, 3]] * 4
    assert "3 frames from frame 0 at 40x52" in capsys.readouterr().out


def test_run_native_builds_the_model_for_the_clip_and_does_not_resize(sizes, tmp_path):
    # PilotNet's dense head on flattened features is built for 288x384
    js = tmp_path / "run.json"
    assert (
        cli.main(["run", "vtest", *TINY, "--native", "--method", "frame", "--json", str(js)]) == 0
    )
    built, decoded = sizes
    assert built == [(VTEST, (*VTEST, 3))]
    assert decoded == [(None, (*VTEST, 3))]  # decoded as stored
    assert {tuple(r["frame_shape"]) for r in json.loads(js.read_text())} == {(*VTEST, 3)}


def test_bench_native_runs_each_video_at_its_own_size_and_size_all_at_one(sizes, tmp_path):
    small = tmp_path / "small.mp4"
    rng = np.random.default_rng(0)
    video.write(small, rng.integers(0, 255, (3, 96, 128, 3), np.uint8), fps=10)
    js = tmp_path / "b.json"
    argv = ["bench", "--models", "dave", "--videos", "vtest", str(small), "--methods",
            "nocache", "--frames", "3", "--width", "0.25", "--no-progress", "--native",
            "--json", str(js)]  # fmt: skip
    assert cli.main(argv) == 0
    built, decoded = sizes
    assert built == [(VTEST, (*VTEST, 3)), ((96, 128), (96, 128, 3))]
    assert decoded == [(None, (*VTEST, 3)), (None, (96, 128, 3))]
    shapes = {(r["video"], tuple(r["frame_shape"])) for r in json.loads(js.read_text())}
    assert shapes == {("vtest", (*VTEST, 3)), (str(small), (96, 128, 3))}
    # --size: every video resized to it, one model built for both
    built.clear()
    decoded.clear()
    argv[argv.index("--native")] = "--size=70x101"
    assert cli.main(argv) == 0
    assert built == [((70, 101), (70, 101, 3))]
    assert decoded == [((70, 101, 3), (70, 101, 3))] * 2
    assert {tuple(r["frame_shape"]) for r in json.loads(js.read_text())} == {(70, 101, 3)}


def test_demo_at_a_size(sizes, tmp_path):
    out = tmp_path / "demo"
    assert (
        cli.main(["demo", *TINY, "--size", "70x101", "--method", "frame", "--out", str(out)]) == 0
    )
    assert sizes[0] == [((70, 101), (70, 101, 3))]
    records = json.loads((out / "metrics.json").read_text())
    assert {tuple(r["frame_shape"]) for r in records} == {(70, 101, 3)}


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "vtest", "--model", "dave"],
        ["bench", "--models", "dave"],
        ["demo"],
        ["profile", "vtest", "--model", "dave"],
    ],
)
def test_size_and_native_are_mutually_exclusive(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--size", "64x64", "--native"])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "--native: not allowed with argument --size" in lines[0]


@pytest.mark.parametrize(
    "value,says",
    [
        ("576", "must be HxW, height by width in pixels (e.g. 576x768), got '576'"),
        ("576x", "must be HxW"),
        ("x768", "must be HxW"),
        ("576x768x3", "must be HxW"),
        ("1.5x2", "must be HxW"),
        ("576*768", "must be HxW"),
        ("", "must be HxW"),
        ("0x768", "height and width must be positive numbers of pixels, got '0x768'"),
        ("576x0", "must be positive"),
        ("-3x5", "must be positive"),
    ],
)
def test_bad_sizes_exit_2_with_one_line(value, says, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "vtest", "--model", "dave", f"--size={value}"])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("dcjax: error: argument --size: ") and says in lines[0]


def test_frame_size_parses_height_by_width():
    assert arguments.frame_size("576x768") == (576, 768)
    assert arguments.frame_size(" 66 X 200 ") == (66, 200)
    with pytest.raises(argparse.ArgumentTypeError):
        arguments.frame_size("576")


@pytest.mark.parametrize(
    "argv,named,says",
    [
        # PilotNet's five valid convolutions need 61 pixels each way
        (["run", "vtest", "--model", "dave", "--size", "40x500"], "--size",
         "40x500 frames are too small for dave (a layer would have no pixel left); the "
         "nearest size it takes is 61x500"),
        (["demo", "--model", "alexnet", "--size", "30x30"], "--size",
         "nearest size it takes is 39x39"),
        (["bench", "--models", "resnet50", "dave", "--size", "60x60"], "--size", "for dave"),
        (["bench", "--models", "dave", "--videos", "vtest", "two.mp4", "--native"], "--native",
         "two.mp4 is 32x48: 32x48 frames are too small for dave"),
        (["run", "two.mp4", "--model", "dave", "--native"], "--native",
         "nearest size it takes is 61x61"),
    ],
)  # fmt: skip
def test_sizes_too_small_for_the_model_exit_2_before_it_loads(
    argv, named, says, bad_videos, monkeypatch, capsys
):
    monkeypatch.chdir(bad_videos)
    monkeypatch.setattr(common, "load_spec", None)  # checked before any model loads
    monkeypatch.setattr(specs, "model_spec", None)
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"dcjax: error: argument {named}: ") and says in lines[0]


def test_without_size_the_model_keeps_its_published_input(sizes, monkeypatch):
    """No flag: the model as published, the frames resized to it (as before)."""
    monkeypatch.setattr(harness, "evaluate", lambda *a, **k: (_ for _ in ()).throw(SystemExit(0)))
    with pytest.raises(SystemExit):
        cli.main(["run", "vtest", *TINY])
    assert sizes == ([(None, (66, 200, 3))], [((66, 200, 3), (66, 200, 3))])
