"""Reading video files through FFmpeg (PyAV); writing them is `dcjax.video.writer`.

Contract:

- :func:`read` opens the file at once (so a missing or unreadable file fails at
  the call, not at the first ``next``) and returns a :class:`VideoReader`, an
  iterator that decodes lazily, one frame per ``next``, and yields RGB frames
  as C-contiguous ``(H, W, 3)`` ``uint8`` arrays, in display order.
- ``size=(H, W)`` scales every frame to that size. ``mode="resize"`` scales the
  whole frame (the aspect ratio may change); ``mode="crop"`` first cuts the
  largest centred region with the aspect ratio of ``size``, then scales it.
  Scaling is area-averaging (FFmpeg's swscale ``AREA``), which anti-aliases
  when shrinking. Without ``size`` frames keep their stored size.
- ``start`` skips that many frames (they are decoded, not converted, so the
  count is exact for every codec); ``max_frames`` caps the number delivered.
- Errors are :class:`~dcjax.video.errors.VideoError` subclasses: a missing file
  (:class:`~dcjax.video.errors.VideoNotFoundError`), a file without a decodable
  video stream (:class:`~dcjax.video.errors.UnreadableVideoError`), a video
  with zero frames (:class:`~dcjax.video.errors.EmptyVideoError`), and a stream
  that breaks off, or ends before the frame count its container declares
  (:class:`~dcjax.video.errors.TruncatedVideoError`). Frames decoded before a
  truncation are delivered first; the error is raised by the ``next`` after the
  last good frame and names the index of the frame at which decoding stopped.
  A truncation is only noticed by reading up to it: a reader stopped early by
  ``max_frames`` never raises it.
- :func:`info` reads the container's header (and counts packets when the header
  has no frame count) without decoding.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

import numpy as np

try:
    import av
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "dcjax.video decodes through PyAV, which is not installed: pip install 'dcjax[video]'"
    ) from _error

from dcjax.video.errors import (
    EmptyVideoError,
    TruncatedVideoError,
    UnreadableVideoError,
    VideoNotFoundError,
)

__all__ = ["VideoInfo", "VideoReader", "info", "read"]

Mode = Literal["resize", "crop"]

# FFmpeg's probe takes any text file for "tty" (ANSI art rendered as video);
# a text file is never the video a user meant, so it is rejected as unreadable.
_TEXT_FORMATS = frozenset({"tty"})


@dataclass(frozen=True)
class VideoInfo:
    """What a video file's container says about its (best) video stream.

    Attributes:
        path: The file.
        frames: Number of frames: the container's count, or, when the
            container has none, the number of video packets in the file.
            For a truncated file this is what the header declares; only
            reading it finds where it breaks off.
        fps: Average frame rate in frames per second.
        size: Stored frame size ``(height, width)`` in pixels.
        codec: FFmpeg's name of the codec, e.g. ``"h264"``.
        duration: Duration in seconds.
    """

    path: str
    frames: int
    fps: float
    size: tuple[int, int]
    codec: str
    duration: float


def info(path: str | os.PathLike[str]) -> VideoInfo:
    """Describes a video file without decoding it.

    Args:
        path: A video file in any format FFmpeg reads.

    Returns:
        The frame count, frame rate, size, codec and duration.

    Raises:
        VideoNotFoundError: ``path`` does not exist.
        UnreadableVideoError: ``path`` is not a video FFmpeg can decode.
        EmptyVideoError: the video stream has no frames.
    """
    path = os.fspath(path)
    container, stream = _open(path)
    try:
        frames = stream.frames or _count_packets(container, stream)
        if frames <= 0:
            raise EmptyVideoError(f"dcjax: video '{path}' has no frames", path=path)
        fps = _fps(stream)
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            duration = container.duration / av.time_base
        else:
            duration = frames / fps if fps > 0 else 0.0
        return VideoInfo(
            path=path,
            frames=int(frames),
            fps=fps,
            size=(int(stream.height), int(stream.width)),
            codec=stream.codec_context.name,
            duration=duration,
        )
    finally:
        container.close()


def read(
    path: str | os.PathLike[str],
    *,
    size: tuple[int, int] | None = None,
    max_frames: int | None = None,
    start: int = 0,
    mode: Mode = "resize",
) -> VideoReader:
    """Decodes a video lazily into RGB ``uint8`` frames.

    Example::

        for frame in dcjax.video.read("clip.mp4", size=(224, 224), mode="crop"):
            ...  # frame: (224, 224, 3) uint8

    Args:
        path: A video file in any format FFmpeg reads.
        size: Output ``(height, width)``; ``None`` keeps the stored size.
        max_frames: Deliver at most this many frames; ``None`` reads to the end.
        start: Index of the first frame to deliver (earlier frames are skipped).
        mode: With ``size``, ``"resize"`` scales the whole frame and
            ``"crop"`` cuts the centred region with the aspect ratio of
            ``size`` before scaling.

    Returns:
        A :class:`VideoReader`: an iterator over ``(H, W, 3)`` ``uint8`` frames,
        also a context manager that closes the file.

    Raises:
        ValueError: an argument is invalid, or ``start`` is past the end of a
            video whose container declares its frame count.
        VideoNotFoundError: ``path`` does not exist.
        UnreadableVideoError: ``path`` is not a video FFmpeg can decode.
        EmptyVideoError: (while iterating) the video has no frames.
        TruncatedVideoError: (while iterating, after the good frames) the
            stream breaks off early.
    """
    out_size = _check_size(size)
    if mode not in ("resize", "crop"):
        raise ValueError(f"dcjax: mode must be 'resize' or 'crop', got {mode!r}")
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < 0:
        raise ValueError(f"dcjax: start must be a non-negative integer, got {start!r}")
    if max_frames is not None and (
        isinstance(max_frames, bool)
        or not isinstance(max_frames, (int, np.integer))
        or max_frames < 0
    ):
        raise ValueError(
            f"dcjax: max_frames must be a non-negative integer or None, got {max_frames!r}"
        )
    path = os.fspath(path)
    container, stream = _open(path)
    declared = stream.frames
    if declared and start >= declared:
        container.close()
        raise ValueError(
            f"dcjax: start={start} is past the end of '{path}', which has {declared} frames"
        )
    return VideoReader(
        path,
        container,
        stream,
        size=out_size,
        max_frames=None if max_frames is None else int(max_frames),
        start=int(start),
        mode=mode,
    )


class VideoReader(Iterator[np.ndarray]):
    """Iterator over the frames of an open video; made by :func:`read`.

    The file stays open until the last frame has been delivered, an error is
    raised, :meth:`close` is called, or the ``with`` block ends.

    Attributes:
        path: The file being read.
        size: Output ``(height, width)``, or ``None`` for the stored size.
        start: Index of the first delivered frame.
        max_frames: Cap on delivered frames, or ``None``.
        mode: ``"resize"`` or ``"crop"``.
        next_index: Index in the file of the next frame to deliver.
    """

    def __init__(
        self,
        path: str,
        container: av.container.InputContainer,
        stream: av.VideoStream,
        *,
        size: tuple[int, int] | None,
        max_frames: int | None,
        start: int,
        mode: Mode,
    ) -> None:
        self.path = path
        self.size = size
        self.start = start
        self.max_frames = max_frames
        self.mode = mode
        self.next_index = start
        self._container: av.container.InputContainer | None = container
        self._stream = stream
        self._frames = self._decode()

    def __iter__(self) -> VideoReader:
        return self

    def __next__(self) -> np.ndarray:
        return next(self._frames)

    def __enter__(self) -> VideoReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        """Stops decoding and closes the file; further ``next`` calls stop."""
        frames = getattr(self, "_frames", None)
        if frames is not None:
            frames.close()
        container = getattr(self, "_container", None)
        if container is not None:
            self._container = None
            container.close()

    def _decode(self) -> Iterator[np.ndarray]:
        """Generator behind ``__next__``: decode, skip, convert, check the end."""
        container, stream = self._container, self._stream
        assert container is not None
        scan = _Scan()
        decoded = 0  # frames decoded so far == file index of the next decoded frame
        delivered = 0
        try:
            if self.max_frames == 0:
                return
            for frame in _demux_decode(container, stream, scan):
                decoded += 1
                if decoded <= self.start:
                    continue
                self.next_index = decoded
                delivered += 1
                yield self._convert(frame)
                if self.max_frames is not None and delivered >= self.max_frames:
                    return
            shortfall = _shortfall(container, stream, scan)
            if scan.failure is not None or shortfall is not None:
                cause = f" ({_describe(scan.failure)})" if scan.failure is not None else ""
                kept = (
                    f"frames {self.start}..{decoded - 1} were delivered"
                    if decoded > self.start
                    else "no frame was delivered"
                )
                raise TruncatedVideoError(
                    f"dcjax: video '{self.path}' is truncated or corrupt: decoding stopped "
                    f"at frame {decoded}{shortfall or ''}{cause}; {kept}",
                    path=self.path,
                    frame=decoded,
                    expected=stream.frames or None,
                ) from scan.failure
            if decoded == 0:
                raise EmptyVideoError(f"dcjax: video '{self.path}' has no frames", path=self.path)
            if decoded <= self.start:
                raise ValueError(
                    f"dcjax: start={self.start} is past the end of '{self.path}', "
                    f"which has {decoded} frames"
                )
        finally:
            self._frames_done()

    def _frames_done(self) -> None:
        container = self._container
        if container is not None:
            self._container = None
            container.close()

    def _convert(self, frame: av.VideoFrame) -> np.ndarray:
        """One decoded frame to an RGB array of the requested size."""
        if self.size is None:
            return _contiguous(frame.to_ndarray(format="rgb24"))
        height, width = self.size
        top, left, crop_h, crop_w = _centre_crop(frame.height, frame.width, height, width)
        if self.mode == "resize" or (crop_h, crop_w) == (frame.height, frame.width):
            # One swscale pass from the decoder's pixel format.
            return _contiguous(_scale(frame, height, width))
        rgb = frame.to_ndarray(format="rgb24")[top : top + crop_h, left : left + crop_w]
        if (crop_h, crop_w) != (height, width):
            cropped = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            rgb = _scale(cropped, height, width)
        return _contiguous(rgb)


def _open(path: str) -> tuple[av.container.InputContainer, av.VideoStream]:
    """Opens ``path`` and picks its best video stream, with dcjax's errors."""
    if not os.path.exists(path):
        raise VideoNotFoundError(f"dcjax: video file '{path}' does not exist", path=path)
    if os.path.isdir(path):
        raise UnreadableVideoError(f"dcjax: '{path}' is a directory, not a video", path=path)
    try:
        container = av.open(path, metadata_errors="ignore")
    except av.error.FFmpegError as error:
        raise UnreadableVideoError(
            f"dcjax: cannot read '{path}' as a video ({_describe(error)}); "
            "give a video file that FFmpeg decodes (MP4, AVI, MKV, ...)",
            path=path,
        ) from error
    if container.format.name in _TEXT_FORMATS:
        container.close()
        raise UnreadableVideoError(f"dcjax: '{path}' is a text file, not a video", path=path)
    try:
        stream = container.streams.best("video")
    except (av.error.FFmpegError, ValueError):
        stream = None
    if stream is None:
        container.close()
        raise UnreadableVideoError(f"dcjax: '{path}' contains no video stream", path=path)
    return container, stream


def _fps(stream: av.VideoStream) -> float:
    """Average frame rate, falling back to FFmpeg's guesses."""
    for rate in (stream.average_rate, stream.guessed_rate, stream.base_rate):
        if rate:
            return float(rate)
    return 0.0


@dataclass
class _Scan:
    """What demuxing saw: packets, how far in time they reached, the error if any."""

    packets: int = 0
    end_time: float | None = None
    failure: BaseException | None = None


def _demux_decode(
    container: av.container.InputContainer, stream: av.VideoStream, scan: _Scan
) -> Iterator[av.VideoFrame]:
    """Decoded frames in display order; on an FFmpeg error, what the decoder holds.

    Records packets, their end time and the error in ``scan`` instead of raising.
    """
    try:
        for packet in container.demux(stream):
            if packet.size:
                scan.packets += 1
                if packet.pts is not None and packet.time_base is not None:
                    end = float((packet.pts + (packet.duration or 0)) * packet.time_base)
                    scan.end_time = end if scan.end_time is None else max(scan.end_time, end)
            yield from packet.decode()
    except av.error.FFmpegError as error:
        scan.failure = error
        # Deliver the frames the decoder still holds (reordered or delayed by
        # threads) before the caller reports where the stream broke.
        try:
            flushed = stream.codec_context.decode(None)
        except av.error.FFmpegError:
            flushed = []
        yield from flushed


def _shortfall(
    container: av.container.InputContainer, stream: av.VideoStream, scan: _Scan
) -> str | None:
    """Why a cleanly ended stream is short of what its container declares, or None.

    The stream header's frame count is compared with the packets read. Without
    one (Matroska, WebM, MPEG-TS...), the container's duration is compared with
    the end time of the last packet, with two frames (or 1%) of slack so that
    variable-frame-rate files are not flagged.
    """
    if stream.frames:
        if scan.packets < stream.frames:
            return f" of the {stream.frames} its container declares"
        return None
    if not container.duration or scan.end_time is None:
        return None
    declared = container.duration / av.time_base
    start = container.start_time / av.time_base if container.start_time else 0.0
    reached = scan.end_time - start
    fps = _fps(stream)
    slack = max(2.0 / fps if fps > 0 else 0.0, 0.01 * declared)
    if reached < declared - slack:
        return f" (at {reached:.2f} s of the {declared:.2f} s its container declares)"
    return None


def _count_packets(container: av.container.InputContainer, stream: av.VideoStream) -> int:
    """Number of non-empty packets of ``stream`` (demuxed, not decoded)."""
    count = 0
    try:
        for packet in container.demux(stream):
            if packet.size:
                count += 1
    except av.error.FFmpegError:
        pass
    return count


def _check_size(size: object) -> tuple[int, int] | None:
    """Validates ``size=(height, width)``."""
    if size is None:
        return None
    try:
        height, width = size  # type: ignore[misc]
    except (TypeError, ValueError):
        height = width = None
    for value in (height, width):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(
                f"dcjax: size must be (height, width) with two positive integers, got {size!r}"
            )
    return int(height), int(width)  # type: ignore[arg-type]


def _centre_crop(height: int, width: int, out_h: int, out_w: int) -> tuple[int, int, int, int]:
    """Largest centred box of an (height, width) frame with aspect out_h:out_w.

    Returns:
        ``(top, left, crop_height, crop_width)``.
    """
    if width * out_h > height * out_w:  # frame wider than the target
        crop_h, crop_w = height, max(1, round(height * out_w / out_h))
    else:
        crop_h, crop_w = max(1, round(width * out_h / out_w)), width
    return (height - crop_h) // 2, (width - crop_w) // 2, crop_h, crop_w


def _scale(frame: av.VideoFrame, height: int, width: int) -> np.ndarray:
    """The frame as RGB, scaled to (height, width) by area averaging."""
    return frame.to_ndarray(format="rgb24", width=width, height=height, interpolation="AREA")


def _contiguous(array: np.ndarray) -> np.ndarray:
    """The array as C-contiguous uint8 (swscale may hand back padded rows)."""
    return np.ascontiguousarray(array, dtype=np.uint8)


def _describe(error: BaseException | None) -> str:
    """A short cause for messages: FFmpeg's text without the path repeated."""
    if error is None:
        return ""
    strerror = getattr(error, "strerror", None)
    return str(strerror) if strerror else str(error)
