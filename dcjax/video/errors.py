"""Errors raised while opening and decoding video.

Every error is a :class:`VideoError`, so ``except dcjax.video.VideoError`` catches
them all. Each concrete error also derives from the built-in exception a caller
would expect without knowing about dcjax:

- :class:`VideoNotFoundError` is a :class:`FileNotFoundError` (an ``OSError``);
- :class:`UnreadableVideoError` (no decodable video stream, not a video file) and
  :class:`EmptyVideoError` (a video stream with zero frames) are ``ValueError``;
- :class:`TruncatedVideoError` (the stream ends or breaks before the frame count
  its container declares) is an :class:`UnreadableVideoError`; it carries the
  index of the frame at which decoding stopped. Frames decoded before it were
  already delivered by :func:`dcjax.video.read`.

Messages name the file and, where there is one, the fix.
"""

from __future__ import annotations

import errno
import os

__all__ = [
    "EmptyVideoError",
    "TruncatedVideoError",
    "UnreadableVideoError",
    "VideoError",
    "VideoNotFoundError",
]


class VideoError(Exception):
    """Base class of every error raised by :mod:`dcjax.video`.

    Attributes:
        path: The video file concerned (``None`` when there is no single file).
    """

    def __init__(self, message: str, *, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(message)
        self.path = None if path is None else os.fspath(path)


class VideoNotFoundError(VideoError, FileNotFoundError):
    """The video file (or a bundled or optional clip) does not exist."""

    def __init__(self, message: str, *, path: str | os.PathLike[str] | None = None) -> None:
        VideoError.__init__(self, message, path=path)
        # FileNotFoundError's own attributes, as ``open()`` would set them.
        self.errno = errno.ENOENT
        self.strerror = os.strerror(errno.ENOENT)
        self.filename = self.path

    def __str__(self) -> str:
        return str(self.args[0])


class UnreadableVideoError(VideoError, ValueError):
    """The file exists but holds no video stream that FFmpeg can decode."""


class EmptyVideoError(VideoError, ValueError):
    """The file holds a video stream without a single frame."""


class TruncatedVideoError(UnreadableVideoError):
    """Decoding stopped before the end of the stream that the container declares.

    Attributes:
        frame: Index (0-based, counted from the start of the file) of the first
            frame that could not be decoded. Frames ``0 .. frame - 1`` decoded
            normally and were delivered.
        expected: Frame count declared by the container, or ``None`` if unknown.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        frame: int,
        expected: int | None = None,
    ) -> None:
        super().__init__(message, path=path)
        self.frame = frame
        self.expected = expected
