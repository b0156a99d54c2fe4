"""``dcjax run A B ...``: several videos as streams of one batch (dcjax/cli/streams_run.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dcjax import cli, video
from dcjax.eval import harness, specs

SIZE = ["--size", "64x64"]
MODEL = ["--model", "dave", "--width", "0.25", "--no-progress"]


@pytest.fixture(scope="module")
def short_clip(tmp_path_factory):
    """The first 3 frames of the bundled vtest clip, as a file of its own."""
    path = tmp_path_factory.mktemp("streams") / "short.mp4"
    frames = harness.load_frames("vtest", None, frames=3)
    video.write(path, frames, fps=10)
    return path


def test_a_video_that_ends_early_finishes_and_the_others_go_on(tmp_path, short_clip, capsys):
    out, outputs = tmp_path / "r.json", tmp_path / "o.npz"
    argv = ["run", "vtest", str(short_clip), *MODEL, *SIZE, "--frames", "6",
            "--json", str(out), "--outputs", str(outputs)]  # fmt: skip
    assert cli.main(argv) == 0
    records = json.loads(out.read_text())
    streams, batch = records[:-1], records[-1]
    assert [r["frames"] for r in streams] == [6, 3]
    assert [r["video"] for r in streams] == ["vtest", str(short_clip)]
    assert all(r["frame_shape"] == [64, 64, 3] for r in records)
    assert batch["streams"] == 2 and batch["steps"] == 6
    assert batch["speedup_vs_dense"] == pytest.approx(batch["dense_mean_ms"] / batch["mean_ms"])
    got = np.load(outputs)
    assert got["stream0"].shape[0] == 6 and got["stream1"].shape[0] == 3
    # the first frame of each stream is computed in full: the plain model's output
    spec = specs.model_spec("dave", width=0.25, input_size=(64, 64))
    for name, clip in (("stream0", "vtest"), ("stream1", str(short_clip))):
        first = harness.load_frames(clip, spec.frame_shape, frames=1)[0]
        want = np.asarray(spec.apply(first)).reshape(got[name][0].shape)
        np.testing.assert_allclose(got[name][0], want, rtol=1e-4, atol=1e-4)
    assert all(np.isfinite(r["max_abs_err"]) for r in streams)
    text = capsys.readouterr().out
    assert "2 videos as streams of one batch at 64x64" in text and "batch:" in text
    # tuned on the first video's frames, the streams' schedule raced on them
    assert batch["schedule"] in ("pooled", "sequential")
    assert f"schedule: {batch['schedule']} (raced: pooled " in text


def test_adaptive_streams_switch_plans_and_report_each_switch(tmp_path, short_clip, capsys):
    """Two plans (tuned for a quiet and a wholly new input) and a controller that
    switches on the first frame past a border: the batch's records count the
    plans' frames and the switches, and every switch is printed."""
    out = tmp_path / "r.json"
    argv = ["run", "vtest", str(short_clip), *MODEL, *SIZE, "--frames", "6", "--json", str(out),
            "--method", "adaptive:levels=0.01|1,patience=1,margin=0,smoothing=1"]  # fmt: skip
    assert cli.main(argv) == 0
    records = json.loads(out.read_text())
    streams, batch = records[:-1], records[-1]
    text = capsys.readouterr().out
    assert "plans: " in text and batch["schedule"] in ("pooled", "sequential")
    assert batch["switches"] == text.count("switch: ")
    for r in streams:
        assert sum(r["plan_frames"].values()) == r["frames"]
        if batch["schedule"] == "sequential":
            assert r["switches"] == text.count(f"switch: stream {r['stream']} ")
        else:
            assert r["switches"] == batch["switches"] == text.count("switch: every stream")
        assert np.isfinite(r["max_abs_err"]) and r["max_abs_err"] < 1e-3


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--method", "frame"], "argument --method: several videos run as streams of "
                                "deepcache or adaptive only"),
        (["--method", "adaptive:levels=0.5|0.2"], "levels='0.5|0.2' must increase"),
        (["--out", "x.mp4"], "argument --out: one video only"),
        (["--native"], "argument --native: the videos have different frame sizes"),
        (["--method", "deepcache:guard=True"], "argument --method: dave has no score map to "
                                               "guard"),
    ],
)  # fmt: skip
def test_bad_stream_runs_exit_2_with_one_line(extra, message, short_clip, tmp_path, capsys):
    small = tmp_path / "small.mp4"
    video.write(small, harness.load_frames("vtest", (32, 48, 3), frames=2), fps=10)
    with pytest.raises(SystemExit) as e:
        cli.main(["run", str(small), str(short_clip), *MODEL, "--frames", "2", *extra])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_outputs_need_several_videos(capsys, tmp_path):
    with pytest.raises(SystemExit):
        cli.main(["run", "vtest", *MODEL, "--frames", "2", "--outputs", str(tmp_path / "o.npz")])
    assert "argument --outputs: with several videos only" in capsys.readouterr().err
