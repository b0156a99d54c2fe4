"""Shared fixtures for the video tests: small real files written with PyAV."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dcjax.video import camera_motion, write


@pytest.fixture(scope="session")
def synthetic_frames() -> np.ndarray:
    """60 frames (96x128) of a panning, shaking camera with one moving object."""
    clip = camera_motion(60, (96, 128), pan=(1, 2), jitter=1, objects=1, seed=3)
    return clip.frames


@pytest.fixture(scope="session")
def synthetic_mp4(tmp_path_factory: pytest.TempPathFactory, synthetic_frames: np.ndarray) -> Path:
    """The synthetic frames as an H.264 MP4 (index first, +faststart)."""
    path = tmp_path_factory.mktemp("video") / "synthetic.mp4"
    assert write(path, synthetic_frames, fps=10, crf=12) == len(synthetic_frames)
    return path
