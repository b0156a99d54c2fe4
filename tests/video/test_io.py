"""dcjax.video.read / info on real files (written by write): good, truncated, missing, not video,
empty."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from dcjax.video import (
    EmptyVideoError,
    TruncatedVideoError,
    UnreadableVideoError,
    VideoError,
    VideoNotFoundError,
    VideoReader,
    clip_path,
    info,
    read,
)


def _write_with_pyav(path: Path, frames: np.ndarray, codec: str, fps: int = 10) -> None:
    """Encodes frames with ``codec`` into the container named by ``path``'s extension."""
    container = av.open(str(path), "w")
    stream = container.add_stream(codec, rate=fps)
    stream.height, stream.width = frames.shape[1:3]
    stream.pix_fmt = "yuv420p"
    container.start_encoding()  # writes the header even when there are no frames
    for frame in frames:
        for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)
    container.close()


def _truncate(source: Path, dest: Path, fraction: float) -> Path:
    """Copies the first ``fraction`` of the bytes of ``source`` to ``dest``."""
    data = source.read_bytes()
    dest.write_bytes(data[: int(len(data) * fraction)])
    return dest


def _collect_until_error(reader: VideoReader) -> tuple[list[np.ndarray], BaseException | None]:
    frames: list[np.ndarray] = []
    try:
        for frame in reader:
            frames.append(frame)
    except VideoError as error:
        return frames, error
    return frames, None


def _mean_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.abs(a.astype(np.float64) - b.astype(np.float64))))


# --- good files ---------------------------------------------------------------------------


def test_write_then_read_round_trip(synthetic_mp4: Path, synthetic_frames: np.ndarray) -> None:
    frames = list(read(synthetic_mp4))
    assert len(frames) == len(synthetic_frames)
    for decoded, original in zip(frames, synthetic_frames, strict=True):
        assert decoded.shape == original.shape and decoded.dtype == np.uint8
        assert decoded.flags["C_CONTIGUOUS"]
        assert _mean_abs(decoded, original) < 3.0  # lossy but close (crf 12)
    # Frames come in display order: each matches its own original best.
    assert _mean_abs(frames[30], synthetic_frames[30]) < _mean_abs(frames[30], synthetic_frames[31])


def test_info_of_written_file(synthetic_mp4: Path) -> None:
    meta = info(synthetic_mp4)
    assert meta.frames == 60
    assert meta.fps == pytest.approx(10.0)
    assert meta.size == (96, 128)
    assert meta.codec == "h264"
    assert meta.duration == pytest.approx(6.0, abs=0.15)
    assert meta.path == str(synthetic_mp4)


def test_start_and_max_frames_select_exact_frames(synthetic_mp4: Path) -> None:
    full = list(read(synthetic_mp4))
    part = list(read(synthetic_mp4, start=17, max_frames=5))
    assert len(part) == 5
    for got, want in zip(part, full[17:22], strict=True):
        np.testing.assert_array_equal(got, want)
    assert list(read(synthetic_mp4, max_frames=0)) == []
    tail = list(read(synthetic_mp4, start=55))
    assert len(tail) == 5
    np.testing.assert_array_equal(tail[-1], full[-1])


def test_reader_is_lazy_and_closable(synthetic_mp4: Path) -> None:
    with read(synthetic_mp4) as reader:
        first = next(reader)
        assert first.shape == (96, 128, 3)
        assert reader.next_index == 1
        second = next(reader)
        assert reader.next_index == 2
        assert not np.array_equal(first, second)
    with pytest.raises(StopIteration):
        next(reader)


def test_resize_and_crop_geometry(synthetic_mp4: Path) -> None:
    native = next(read(synthetic_mp4))  # 96 x 128
    resized = next(read(synthetic_mp4, size=(60, 70)))
    assert resized.shape == (60, 70, 3) and resized.dtype == np.uint8
    # A crop to the frame's height keeps the centred 96 x 96 block, pixel for pixel.
    square = next(read(synthetic_mp4, size=(96, 96), mode="crop"))
    np.testing.assert_array_equal(square, native[:, 16:112])
    # Crop then scale: close to scaling the centred block; resize squeezes it instead.
    cropped = next(read(synthetic_mp4, size=(48, 48), mode="crop"))
    squeezed = next(read(synthetic_mp4, size=(48, 48), mode="resize"))
    block = native[:, 16:112].reshape(48, 2, 48, 2, 3).mean(axis=(1, 3))
    assert _mean_abs(cropped, block) < 2.0
    assert _mean_abs(squeezed, block) > _mean_abs(cropped, block) + 2.0


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"size": (224,)}, "size"),
        ({"size": (0, 224)}, "size"),
        ({"size": (224.5, 224)}, "size"),
        ({"mode": "stretch"}, "mode"),
        ({"start": -1}, "start"),
        ({"max_frames": -2}, "max_frames"),
        ({"start": 60}, "start=60"),
    ],
)
def test_bad_arguments_name_the_argument(
    synthetic_mp4: Path, kwargs: dict[str, object], argument: str
) -> None:
    with pytest.raises(ValueError, match=argument):
        read(synthetic_mp4, **kwargs)  # type: ignore[arg-type]


# --- bundled clips ----------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "fps"), [("vtest", 10.0), ("box", 30000 / 1001)])
def test_bundled_clip_reads_fully(name: str, fps: float) -> None:
    path = clip_path(name)
    meta = info(path)
    assert meta.frames == 300
    assert meta.size == (288, 384)
    assert meta.fps == pytest.approx(fps, rel=1e-6)
    assert meta.codec == "h264"
    count = 0
    for frame in read(path, size=(224, 224), mode="crop"):
        assert frame.shape == (224, 224, 3) and frame.dtype == np.uint8
        count += 1
    assert count == meta.frames


def test_vtest768_is_vtest_at_the_cameras_resolution() -> None:
    """The same 10 fps camera at 768x576: downscaled, its frames match vtest's."""
    meta = info(clip_path("vtest768"))
    assert meta.size == (576, 768) and meta.frames == 100
    assert meta.fps == pytest.approx(10.0)
    big = list(read(clip_path("vtest768"), max_frames=50, size=(144, 192)))
    small = list(read(clip_path("vtest"), max_frames=50, size=(144, 192)))
    err = [np.abs(a.astype(np.int16) - b).mean() for a, b in zip(big, small, strict=True)]
    assert max(err) < 3.0
    # and not the same frame throughout: frame 40 differs from frame 0 more
    assert np.abs(big[40].astype(np.int16) - small[0]).mean() > max(err)


def test_bundled_fixed_camera_is_static_and_handheld_moves() -> None:
    """Over 15 s, vtest's view stays put (only people move); box's view changes."""

    def changed_fraction(name: str) -> float:
        frames = list(read(clip_path(name), max_frames=151, size=(144, 192)))
        diff = np.abs(frames[150].astype(np.int16) - frames[0]).max(axis=-1)
        return float((diff > 20).mean())

    assert changed_fraction("vtest") < 0.1
    assert changed_fraction("box") > 0.3


# --- errors -----------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.mp4"
    with pytest.raises(VideoNotFoundError, match="does not exist") as caught:
        read(missing)  # fails at the call, not at the first next()
    assert isinstance(caught.value, FileNotFoundError)
    assert caught.value.filename == str(missing)
    assert str(missing) in str(caught.value)
    with pytest.raises(FileNotFoundError):
        info(missing)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("notes.txt", b"this is a text file, not a video\n" * 40),
        ("fake.mp4", b"this is a text file, not a video\n" * 40),
        ("noise.avi", np.random.default_rng(0).integers(0, 256, 50_000, np.uint8).tobytes()),
    ],
)
def test_non_video_file(tmp_path: Path, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(UnreadableVideoError) as caught:
        read(path)
    assert isinstance(caught.value, ValueError)
    assert str(path) in str(caught.value)
    with pytest.raises(UnreadableVideoError):
        info(path)


def test_directory_is_not_a_video(tmp_path: Path) -> None:
    with pytest.raises(UnreadableVideoError, match="directory"):
        read(tmp_path)


def test_zero_frame_video(tmp_path: Path) -> None:
    path = tmp_path / "empty.avi"
    _write_with_pyav(path, np.zeros((0, 32, 32, 3), np.uint8), "mpeg4")
    assert path.stat().st_size > 0
    reader = read(path)
    with pytest.raises(EmptyVideoError, match="no frames") as caught:
        next(reader)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(EmptyVideoError):
        info(path)


def test_container_without_video_stream(tmp_path: Path) -> None:
    path = tmp_path / "empty.mp4"  # an MP4 muxer drops a track without samples
    _write_with_pyav(path, np.zeros((0, 32, 32, 3), np.uint8), "libx264")
    with pytest.raises(UnreadableVideoError, match="no video stream"):
        read(path)


def test_truncated_mp4_delivers_frames_then_names_the_frame(
    tmp_path: Path, synthetic_mp4: Path
) -> None:
    full = list(read(synthetic_mp4))
    cut = _truncate(synthetic_mp4, tmp_path / "cut.mp4", 0.6)
    frames, error = _collect_until_error(read(cut))
    assert isinstance(error, TruncatedVideoError)
    assert 0 < error.frame < 60
    assert error.frame == len(frames)
    assert error.expected == 60
    assert f"stopped at frame {error.frame} " in str(error)
    assert str(cut) in str(error)
    assert isinstance(error, ValueError)
    for got, want in zip(frames, full[: len(frames)], strict=True):
        np.testing.assert_array_equal(got, want)


def test_truncation_after_start_counts_from_file_start(tmp_path: Path, synthetic_mp4: Path) -> None:
    cut = _truncate(synthetic_mp4, tmp_path / "cut.mp4", 0.6)
    whole, error = _collect_until_error(read(cut))
    assert isinstance(error, TruncatedVideoError)
    frames, error2 = _collect_until_error(read(cut, start=10))
    assert isinstance(error2, TruncatedVideoError)
    assert error2.frame == error.frame
    assert len(frames) == error.frame - 10
    np.testing.assert_array_equal(frames[0], whole[10])


def test_reading_stopped_before_the_cut_raises_nothing(tmp_path: Path, synthetic_mp4: Path) -> None:
    cut = _truncate(synthetic_mp4, tmp_path / "cut.mp4", 0.6)
    assert len(list(read(cut, max_frames=10))) == 10


@pytest.mark.parametrize(("suffix", "codec"), [(".avi", "mpeg4"), (".mkv", "libx264")])
def test_truncated_other_containers(
    tmp_path: Path, synthetic_frames: np.ndarray, suffix: str, codec: str
) -> None:
    """AVI declares its frame count in the header, Matroska only its duration."""
    path = tmp_path / f"whole{suffix}"
    _write_with_pyav(path, synthetic_frames, codec)
    assert len(list(read(path))) == 60
    assert info(path).frames == 60  # Matroska: counted from packets
    cut = _truncate(path, tmp_path / f"cut{suffix}", 0.5)
    frames, error = _collect_until_error(read(cut))
    assert isinstance(error, TruncatedVideoError)
    assert error.frame == len(frames)
    assert 0 < error.frame < 60
    assert f"frame {error.frame}" in str(error)


def test_variable_frame_rate_matroska_is_not_mistaken_for_truncated(tmp_path: Path) -> None:
    """Without a frame count, the duration check must tolerate irregular timestamps."""
    path = tmp_path / "vfr.mkv"
    container = av.open(str(path), "w")
    stream = container.add_stream("libx264", rate=30)
    stream.width, stream.height = 64, 48
    stream.pix_fmt = "yuv420p"
    stream.time_base = Fraction(1, 1000)
    rng = np.random.default_rng(0)
    pts = 0
    for _ in range(40):
        image = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        frame.pts, frame.time_base = pts, Fraction(1, 1000)
        pts += int(rng.choice([10, 33, 100, 300]))
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)
    container.close()
    assert len(list(read(path))) == 40
    cut = _truncate(path, tmp_path / "cut.mkv", 0.5)
    frames, error = _collect_until_error(read(cut))
    assert isinstance(error, TruncatedVideoError)
    assert error.frame == len(frames) < 40
