"""The streams benchmark (`dcjax bench streams`) on a small model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dcjax.bench import streams


def test_stream_clips_start_at_offsets_that_fit_the_video():
    frames = np.arange(30)[:, None, None, None] * np.ones((1, 2, 2, 3), np.uint8)
    clips = streams.stream_clips(frames, 3, 10, offset=5)
    assert clips.shape == (10, 3, 2, 2, 3)
    assert clips[0, :, 0, 0, 0].tolist() == [0, 5, 10]
    assert clips[:, 2, 0, 0, 0].tolist() == list(range(10, 20))
    # a short video: the offsets shrink so that every stream has its frames
    clips = streams.stream_clips(frames, 5, 22, offset=5)
    assert clips[0, :, 0, 0, 0].tolist() == [0, 2, 4, 6, 8]
    assert clips[-1, -1, 0, 0, 0] == 29
    with pytest.raises(ValueError, match="30 frames decoded; 31 needed"):
        streams.stream_clips(frames, 1, 31, offset=5)


def test_records_per_method_and_number_of_streams(tmp_path, capsys):
    out, plot = tmp_path / "s.json", tmp_path / "s.png"
    argv = ["--model", "squeezenet", "--width", "0.25", "--size", "64x64", "--streams", "1",
            "2", "--frames", "4", "--offset", "3", "--json", str(out), "--report", str(plot),
            "--no-progress"]  # fmt: skip
    assert streams.main(argv) == 0
    records = json.loads(out.read_text())["records"]
    assert [(r["streams"], r["method"]) for r in records] == [
        (n, m) for n in (1, 2) for m in streams.METHODS
    ]
    for r in records:
        assert r["frame_shape"] == [64, 64, 3] and r["frames"] == 4
        assert r["mean_ms"] > 0 and r["p99_ms"] >= r["step_mean_ms"] * 0.999 - 1e-9
        assert r["throughput_fps"] == pytest.approx(1e3 / r["mean_ms"])
        # each timed step, in order: the summaries are theirs
        assert len(r["step_ms"]) == 4 and min(r["step_ms"]) > 0
        assert np.mean(r["step_ms"]) == pytest.approx(r["step_mean_ms"], rel=1e-3)
        assert max(r["step_ms"]) == pytest.approx(r["max_ms"], rel=1e-3, abs=1e-3)
        assert r["page_faults"] >= 0  # counted for every method
        # a frame's cost is the step's time over the streams that share it
        assert r["step_mean_ms"] == pytest.approx(r["mean_ms"] * r["streams"])
        same_n = {q["method"]: q for q in records if q["streams"] == r["streams"]}
        assert r["speedup_vs_dense"] == pytest.approx(same_n["dense"]["mean_ms"] / r["mean_ms"])
        assert r["speedup_vs_plain"] == pytest.approx(same_n["plain"]["mean_ms"] / r["mean_ms"])
        if r["method"].startswith("deepcache"):
            assert r["ideal_speedup"] >= 1.0 and 0 <= r["still_fraction"] <= 1
            assert r["refresh_fraction"] >= 0.25  # the first of 4 frames at least
            assert 0 <= r["top1_agreement"] <= 1
        else:
            assert "ideal_speedup" not in r
    assert plot.stat().st_size > 0
    text = capsys.readouterr().out
    assert "deepcache_sync" in text and f"records: {out}" in text


def test_every_method_runs_once_more_after_all_have_compiled(monkeypatch, tmp_path):
    """The timed frames start after a round of every method, so that no
    method's first timed step is its first call after the others compiled."""
    calls, made = [], streams._methods

    def counting(spec, config):
        runners, plan = made(spec, config)

        def wrap(m, step):
            return lambda s, f: (calls.append((f.shape[0], m)), step(s, f))[1]

        return {m: (init, wrap(m, step)) for m, (init, step) in runners.items()}, plan

    monkeypatch.setattr(streams, "_methods", counting)
    argv = ["--model", "squeezenet", "--width", "0.25", "--size", "32x32", "--streams", "1",
            "2", "--frames", "3", "--json", str(tmp_path / "s.json"), "--no-progress"]  # fmt: skip
    assert streams.main(argv) == 0
    k = len(streams.METHODS)
    for n in (1, 2):
        seq = [m for size, m in calls if size == n]
        assert len(seq) == k * (2 + 1 + 3)  # two warm-up steps, the round, three frames
        assert seq[: 2 * k] == [m for m in streams.METHODS for _ in range(2)]
        assert seq[2 * k : 3 * k] == list(streams.METHODS)  # the round, then the timed frames
        for t in range(3):
            assert sorted(seq[(3 + t) * k : (4 + t) * k]) == sorted(streams.METHODS)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--streams", "0"], "argument --streams: must be at least 1, got 0"),
        (["--size", "64"], "argument --size: must be HxW"),
        (["--size", "64x64", "--native"], "not allowed with argument --size"),
        (["--model", "nope"], "--model"),
    ],
)
def test_bad_arguments_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        streams.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
