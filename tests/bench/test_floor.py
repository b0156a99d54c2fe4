"""``dcjax bench floor``: a cached step's cost where almost nothing changes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcjax.bench import floor


def _frame(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@given(
    h=st.integers(3, 90),
    w=st.integers(3, 90),
    size=st.integers(1, 30),
    count=st.integers(2, 12),
)
def test_consecutive_frames_differ_in_two_squares_only(h, w, size, count):
    if 3 * size > min(h, w):
        with pytest.raises(ValueError, match="does not fit three times"):
            floor.near_still(_frame(h, w), count, size)
        return
    base = _frame(h, w)
    clip = floor.near_still(base, count, size)
    assert clip.shape == (count, h, w, 3) and clip.dtype == np.uint8
    assert np.array_equal(clip[0], base)
    for t in range(1, count):
        y, x = floor.square_at(t, size, (h, w))
        assert 0 <= y <= h - size and 0 <= x <= w - size
        expected = base.copy()
        expected[y : y + size, x : x + size] = 255 - base[y : y + size, x : x + size]
        assert np.array_equal(clip[t], expected)
        if t > 1:  # the squares of consecutive frames are a square apart on both axes
            py, px = floor.square_at(t - 1, size, (h, w))
            assert abs(y - py) >= size and abs(x - px) >= size
            assert not np.array_equal(clip[t], clip[t - 1])


def test_bad_clips_are_refused():
    with pytest.raises(ValueError, match="uint8"):
        floor.near_still(np.zeros((10, 10, 3), np.float32), 4, 2)
    with pytest.raises(ValueError, match="at least 2 frames"):
        floor.near_still(_frame(10, 10), 1, 2)


def test_the_summary_is_taken_over_the_frames_neither_refreshed_nor_skipped():
    ms = [10.0, 4.0, 6.0, 12.0, 5.0, 1.0]
    dense = [8.0, 8.0, 10.0, 9.0, 12.0, 8.0]
    infos = {
        "refreshed": np.array([True, False, False, True, False, False]),
        "skipped": np.array([False, False, False, False, False, True]),
        "flops_ratio": np.array([1.0, 0.1, 0.3, 1.0, 0.2, 0.0]),
    }
    s = floor.floor_summary(ms, dense, infos)
    assert set(s) == set(floor.FLOOR_KEYS)
    assert s["floor_frames"] == 3
    assert s["floor_ms"] == pytest.approx(5.0)  # frames 1, 2, 4
    assert s["floor_dense_ms"] == pytest.approx(10.0)
    assert s["ceiling"] == pytest.approx(2.0)
    assert s["floor_flops_ratio"] == pytest.approx(0.2)
    assert s["floor_ideal"] == pytest.approx(5.0)
    # the delta method's standard error of mean(dense) / mean(ms) over the three frames
    d, m = np.array([8.0, 10.0, 12.0]), np.array([4.0, 6.0, 5.0])
    r = d.mean() / m.mean()
    resid = (d - r * m) / m.mean()
    assert s["ceiling_se"] == pytest.approx(resid.std(ddof=1) / np.sqrt(3))


def test_a_method_that_recomputes_every_frame_has_no_floor():
    infos = {"refreshed": np.array([True, True]), "flops_ratio": np.ones(2)}
    s = floor.floor_summary([3.0, 3.0], [3.0, 3.1], infos)
    assert s["floor_frames"] == 0
    assert all(s[k] is None for k in floor.FLOOR_KEYS if k != "floor_frames")
    record = {"variant": "deepcache", "config": {"plan": "nocache"}, **s}
    (line,) = floor._notes([record, {**record, "floor_frames": 3}])
    assert line.startswith("deepcache recomputed every frame (plan nocache)")
    with pytest.raises(ValueError, match="same frames"):
        floor.floor_summary([1.0], [1.0, 2.0], {"refreshed": np.array([True])})
    with pytest.raises(ValueError, match="infos of 3"):
        floor.floor_summary([1.0, 2.0], [1.0, 2.0], {"refreshed": np.array([True] * 3)})


def test_statistics_off_leave_the_ideal_unknown():
    infos = {"refreshed": np.array([True, False]), "flops_ratio": np.array([1.0, np.nan])}
    s = floor.floor_summary([2.0, 1.0], [2.0, 2.0], infos)
    assert s["ceiling"] == pytest.approx(2.0)
    assert s["floor_flops_ratio"] is None and s["floor_ideal"] is None


def test_command_measures_the_floor_on_the_near_still_clip(tmp_path, capsys):
    out = tmp_path / "new" / "f.json"
    method = "deepcache+refine:delta=0.01,max_pixel_change=0.1,tuning=prior"
    floor.main(["--model", "dave", "--width", "0.25", "--frames", "6", "--square", "8",
                "--methods", method, "--json", str(out), "--no-progress"])  # fmt: skip
    text = capsys.readouterr().out
    assert "random-weight dave at 66x200: frame 0 of vtest, a 8-pixel square" in text
    assert method in text and f"records: {out}" in text
    data = json.loads(out.read_text())
    (rec,) = data["records"]
    assert data["machine"]["backend"] == "cpu"
    assert rec["variant"] == method and rec["square"] == 8 and rec["frames"] == 6
    assert rec["clip"] == "near_still"
    assert rec["refreshes"] >= 1 and rec["refreshed"][0]  # the first frame computes everything
    assert rec["floor_frames"] == 6 - rec["refreshes"]
    # the square is a small part of the frame: the floor frames compute a fraction
    assert 0 < rec["floor_flops_ratio"] < 0.5
    # the floor, recomputed from the per-frame figures written beside it
    kept = ~np.array(rec["refreshed"])
    ms, dense = np.array(rec["step_ms"])[kept], np.array(rec["dense_step_ms"])[kept]
    assert rec["floor_ms"] == pytest.approx(ms.mean())
    assert rec["ceiling"] == pytest.approx(dense.mean() / ms.mean())
    assert np.mean(rec["step_ms"]) == pytest.approx(rec["mean_ms"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--frames", "2"], "argument --frames: must be at least 3"),
        (["--square", "0"], "argument --square: must be at least 1"),
        (["--model", "nope"], "argument --model: unknown model 'nope'"),
        (["--methods", "nope"], "argument --methods: "),
        (["--methods", "nocache", "plain"], "argument --methods: nocache and plain always run"),
        (["--video", "/no/such.mp4"], "argument --video: no such video"),
        (["--model", "dave", "--width", "0.25", "--square", "40"],
         "argument --square: a square of 40 pixels does not fit"),
    ],
)  # fmt: skip
def test_bad_arguments_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        floor.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "dcjax: dcjax" not in err
