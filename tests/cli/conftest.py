"""Fixtures of the command's tests: broken and odd videos and paths."""

import numpy as np
import pytest

from dcjax import video


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
