"""``dcjax models``, and tiny ``run``/``profile``/``demo`` runs."""

from __future__ import annotations

import json
import os

import jax

from dcjax import autotune, cli, models, video
from dcjax.bench import common
from dcjax.cli import subcommands
from dcjax.eval import metrics, registry
from tests.cli import TINY


def test_a_truncated_video_runs_on_the_frames_before_the_break(bad_videos, tmp_path, capsys):
    js = tmp_path / "run.json"
    argv = ["run", str(bad_videos / "cut.mp4"), "--model", "dave", "--width", "0.25",
            "--frames", "50", "--no-progress", "--json", str(js)]  # fmt: skip
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert "dcjax: warning:" in err and "stopped at frame 9" in err and "those 9 frames" in err
    assert [r["frames"] for r in json.loads(js.read_text())] == [9] * 4  # with plain
    assert "9 frames from frame 0" in out
    argv = ["bench", "--models", "dave", "--width", "0.25", "--methods", "nocache", "--frames",
            "50", "--no-progress", "--videos", str(bad_videos / "cut.mp4"), "--json",
            str(tmp_path / "b.json"), "--report", str(tmp_path / "b.html")]  # fmt: skip
    assert cli.main(argv) == 0
    assert capsys.readouterr().err.count("dcjax: warning:") == 1
    assert json.loads((tmp_path / "b.json").read_text())[0]["frames"] == 9


def test_models_lists_the_zoo(capsys):
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    for name in models.names():
        assert name in out
    assert "227x227x3" in out and "66x200x3" in out
    assert "conv GFLOPs" in out
    assert "centerface" in out and "onnx" in out  # the bundled detector beside the zoo


def test_run_writes_json_and_annotated_video(tmp_path, capsys):
    js, mp4 = tmp_path / "run.json", tmp_path / "new" / "annotated.mp4"  # directory created
    argv = ["run", "vtest", *TINY, "--json", str(js), "--out", str(mp4)]
    assert cli.main(argv) == 0
    records = json.loads(js.read_text())
    assert [r["method"] for r in records] == ["nocache", "deepcache", "plain", "plain"]
    for r in records:
        metrics.check_record(r)
        assert r["model"] == "dave" and r["video"] == "vtest" and r["frames"] == 3
    assert video.info(mp4).frames == 3
    out = capsys.readouterr().out
    assert "vs plain" in out and "vs dense" in out and "p99 ms" in out


def test_profile_prints_where_the_time_goes_and_writes_json(tmp_path, capsys, monkeypatch):
    js = tmp_path / "profile.json"
    argv = ["profile", "vtest", "--model", "dave", "--width", "0.25", "--frames", "7",
            "--no-progress", "--json", str(js)]  # fmt: skip
    made, make_runner = [], registry.make_runner

    def recording(spec, *a, **k):
        made.append(spec.calibration)
        return make_runner(spec, *a, **k)

    monkeypatch.setattr(registry, "make_runner", recording)
    assert cli.main(argv) == 0
    # each method is built as bench builds it: calibrated on the clip's first
    # frames, so the measured tuning races to the plan that bench times
    assert len(made) == 2
    for calibration in made:
        assert calibration is not None and calibration.shape == (7, 66, 200, 3)
    out = capsys.readouterr().out
    assert "wall time (median)" in out and "dcjax.match" in out
    records = json.loads(js.read_text())
    assert [r["method"] for r in records] == ["nocache", "deepcache"]
    # the plan each cached method ran, as the race kept it
    tuned = [r for r in records if "tuning" in r]
    assert tuned and all(r["tuning"]["plan"] in autotune.PLANS + ("prior",) for r in tuned)
    assert all(f"{r['method']}: plan {r['tuning']['plan']}" in out for r in tuned)
    for r in records:
        assert r["model"] == "dave" and r["frames"] == 2 and r["wall_ms"] > 0
        assert any(g.startswith("Dave/conv") for g in r["groups"]) and r["total_ms"] > 0


def test_demo_writes_report(tmp_path, capsys):
    out_dir = tmp_path / "demo"
    argv = ["demo", *TINY, "--video", "vtest", "--size", "66x200", "--out", str(out_dir)]
    assert cli.main(argv) == 0
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
    assert [r["method"] for r in records] == ["nocache", "deepcache+refine", "plain", "plain"]
    assert records[1]["variant"] == common.DEMO_METHOD
    assert records[1]["config"]["max_pixel_change"] == 0.1


def test_nothing_sparse_note_only_when_every_layer_ran_in_full():
    rec = {"model": "m", "config": {"kernel": "dense"},
           "per_layer": [{"sparse": False}, {"sparse": False}]}  # fmt: skip
    assert 'kernel="dense" computes every layer in full' in subcommands.nothing_sparse_note(rec)
    rec["config"] = {"kernel": "auto", "plan": "dense"}  # the measured tuning's dense plan
    assert 'runs the "dense" plan' in subcommands.nothing_sparse_note(rec)
    assert "network plus matching" in subcommands.nothing_sparse_note(rec)
    rec["config"] = {"kernel": "auto", "plan": "nocache"}  # no matcher at all
    note = subcommands.nothing_sparse_note(rec)
    assert 'runs the "nocache" plan' in note and "without matching" in note
    assert "plus matching" not in note
    rec["config"] = {"kernel": "auto", "plan": "prior"}
    assert "too small or too thin" in subcommands.nothing_sparse_note(rec)
    rec["per_layer"][1]["sparse"] = True
    assert subcommands.nothing_sparse_note(rec) == ""
    # the baseline's layers say nothing about how they ran
    assert subcommands.nothing_sparse_note({"model": "m", "per_layer": [{"name": "a"}]}) == ""
    assert subcommands.nothing_sparse_note({"model": "m", "per_layer": []}) == ""


def _face_clip(path, frames=4, size=256):
    """A clip of a real face: scikit-image's astronaut photo, panning 4 pixels a frame."""
    import numpy as np
    from skimage import data, transform

    img = (transform.resize(data.astronaut(), (size + 32, size + 32)) * 255).astype(np.uint8)
    video.write(path, np.stack([img[8:8 + size, 4 * t:4 * t + size] for t in range(frames)]),
                fps=10)  # fmt: skip
    return path


def test_run_anonymize_blurs_the_faces_a_detector_finds(tmp_path, capsys):
    """CenterFace (the bundled ONNX file) through ``run``: detection fidelity in
    the records, and the written video blurred inside the boxes only."""
    import numpy as np

    clip = _face_clip(tmp_path / "face.mp4")
    js, out = tmp_path / "faces.json", tmp_path / "blurred.mp4"
    argv = ["run", str(clip), "--model", "centerface", "--size", "256x256", "--frames", "4",
            "--no-progress", "--json", str(js), "--out", str(out), "--anonymize"]  # fmt: skip
    assert cli.main(argv) == 0
    records = json.loads(js.read_text())
    for r in records:
        metrics.check_record(r)
        assert set(metrics.DETECTION_KEYS) <= set(r)
    nocache = records[0]
    assert nocache["method"] == "nocache" and nocache["reference_boxes"] >= 4  # a face a frame
    assert nocache["box_f1"] == 1.0 and nocache["heatmap_max_err"] == 0.0
    assert "box F1" in capsys.readouterr().out
    written = np.stack(list(video.read(out)))
    source = np.stack(list(video.read(clip)))
    changed = np.abs(written.astype(float) - source).mean(axis=(0, 3))
    # the face (about y 25-92, x 97-148 here) is blurred; the bottom-left corner is not
    assert changed[35:85, 105:140].mean() > 4 * changed[200:, :40].mean() + 2


def test_demo_defaults_to_centerface_at_the_clips_own_size(tmp_path, capsys):
    """The demo's default model is the detector, run at the video's own size (no
    ``--size``): detection fidelity printed, the blurred video written."""
    import numpy as np

    clip = _face_clip(tmp_path / "face.mp4", frames=3, size=224)
    out_dir = tmp_path / "demo"
    argv = ["demo", "--video", str(clip), "--frames", "3", "--no-progress", "--out", str(out_dir)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "pretrained centerface" in text and "at 224x224" in text
    assert "faces in 3 frames" in text and "box F1 against the uncached model's boxes" in text
    assert "top-1 agree" not in text and "top-1 stays" not in text  # a detector has none
    records = json.loads((out_dir / "metrics.json").read_text())
    assert {tuple(r["frame_shape"]) for r in records} == {(224, 224, 3)}
    assert records[1]["variant"] == common.DEMO_METHOD and records[1]["boxes"] >= 3
    blurred = np.stack(list(video.read(out_dir / "blurred.mp4")))
    source = np.stack(list(video.read(clip)))
    assert blurred.shape == source.shape
    changed = np.abs(blurred.astype(float) - source).mean(axis=(0, 3))
    assert changed.max() > 20 and changed[200:, :40].mean() < 2  # the face, not a corner


def test_run_anonymize_needs_a_detector_and_an_output(tmp_path, capsys):
    import pytest

    for extra, why in (
        (["--model", "centerface"], "--anonymize: needs --out"),
        (["--model", "dave", "--width", "0.25", "--out", str(tmp_path / "a.mp4")],
         "--anonymize: dave finds no boxes"),
        (["--model", "centerface", "--size", "100x100", "--out", str(tmp_path / "b.mp4")],
         "multiples of 32; the nearest size it takes is 96x96"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            cli.main(["run", "vtest", "--frames", "3", "--anonymize", "--no-progress", *extra])
        assert e.value.code == 2
        assert why in capsys.readouterr().err
