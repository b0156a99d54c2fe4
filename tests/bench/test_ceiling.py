"""``dcjax bench ceiling``: the reuse ceiling of a zoo model on a video, as a command."""

from __future__ import annotations

import json

import pytest

from dcjax.bench import ceiling


def test_command_prints_the_table_and_writes_the_records(tmp_path, capsys):
    out = tmp_path / "new" / "c.json"
    ceiling.main(["--model", "dave", "--width", "0.25", "--frames", "3", "--thresholds", "20",
                  "--deltas", "0", "--out", str(out), "--no-progress"])  # fmt: skip
    text = capsys.readouterr().out
    assert "random-weight dave at 66x200 over 3 frames of vtest" in text
    assert "psnr=20" in text and "not class scores" in text and f"wrote {out}" in text
    (rec,) = json.loads(out.read_text())
    assert rec["model"] == "dave" and rec["frames"] == 3 and rec["pretrained"] is False
    assert rec["top1_agreement"] is None and rec["ideal_speedup"] >= 1.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--frames", "1"], "argument --frames: must be at least 2"),
        (["--model", "nope"], "argument --model: unknown model 'nope'"),
        (["--video", "/no/such.mp4"], "argument --video: no such video"),
        (["--thresholds", "-3"], "must be a positive number of dB"),
        (["--deltas", "nan"], "must be a finite number >= 0"),
        (["--target", "1.5"], "argument --target: must be in [0, 1]"),
        (["--model", "alexnet", "--pretrained", "yes"], "no pretrained weights for alexnet"),
        (["--size", "0x64"], "argument --size: height and width must be positive"),
        (["--size", "64x64", "--native"], "not allowed with argument --size"),
    ],
)
def test_bad_arguments_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        ceiling.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_ceiling_at_another_size_runs_the_model_at_that_size(tmp_path, capsys):
    out = tmp_path / "c.json"
    ceiling.main(["--model", "dave", "--width", "0.25", "--frames", "2", "--size", "96x224",
                  "--deltas", "0", "--out", str(out), "--no-progress"])  # fmt: skip
    assert "dave at 96x224 over 2 frames" in capsys.readouterr().out
    (rec,) = json.loads(out.read_text())
    assert rec["frame_shape"] == [96, 224, 3] and rec["width"] == 0.25


def test_an_unreadable_video_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "noise.mp4"
    bad.write_bytes(b"\x00not a video\xff" * 50)
    with pytest.raises(SystemExit) as e:
        ceiling.main(["--model", "dave", "--width", "0.25", "--video", str(bad)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("dcjax: error: argument --video: ")
    assert "noise.mp4" in err and "dcjax: dcjax" not in err
