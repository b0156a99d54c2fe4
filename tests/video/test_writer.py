"""dcjax.video.write and check_writable: bad frames, and names FFmpeg cannot write."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dcjax.video import check_writable, write


def test_write_rejects_bad_frames(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="even height and width"):
        write(tmp_path / "odd.mp4", np.zeros((2, 15, 16, 3), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        write(tmp_path / "float.mp4", np.zeros((2, 16, 16, 3), np.float32))
    with pytest.raises(ValueError, match="empty"):
        write(tmp_path / "none.mp4", [])
    assert not (tmp_path / "none.mp4").exists()


def test_check_writable_agrees_with_write(tmp_path: Path) -> None:
    frames = np.zeros((2, 16, 16, 3), np.uint8)
    for name in ("a.mp4", "a.mkv", "a.mov", "a.avi"):
        check_writable(tmp_path / name)
        assert not (tmp_path / name).exists()  # checked, not touched
        assert write(tmp_path / name, frames, fps=10) == 2
    for name, why in (("a.webm", "libx264"), ("a.gif", "libx264"), ("a.txt", "no video format"),
                      ("noext", "no video format"), (".", "directory")):  # fmt: skip
        with pytest.raises(ValueError, match=why):
            check_writable(tmp_path / name)
        with pytest.raises((ValueError, OSError)):  # where write fails, later
            write(tmp_path / name, frames, fps=10)
