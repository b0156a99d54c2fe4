r"""Writing video files through FFmpeg (PyAV).

Contract: :func:`write` encodes RGB ``uint8`` frames into a file (H.264 in MP4
by default; the container from the file's extension), for tests, synthetic
clips and annotated output, and removes the file where no frame was written;
:func:`check_writable` says beforehand, without touching the path, whether
the file's name and codec will do. Bad frames and names are ``ValueError``\ s
that name the frame or the fix.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from fractions import Fraction

import numpy as np

try:
    import av
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "dcjax.video encodes through PyAV, which is not installed: pip install 'dcjax[video]'"
    ) from _error

__all__ = ["check_writable", "write"]


def write(
    path: str | os.PathLike[str],
    frames: Iterable[np.ndarray],
    *,
    fps: float | Fraction = 30,
    codec: str = "libx264",
    crf: int = 18,
) -> int:
    """Encodes RGB frames into a video file.

    The container is chosen from the file extension; MP4 files are written
    with their index first (``+faststart``), so a cut-off copy still decodes
    up to the cut.

    Args:
        path: Output file, e.g. ``"out.mp4"``.
        frames: ``(H, W, 3)`` ``uint8`` frames (an iterable, or one
            ``(T, H, W, 3)`` array); all the same size, with even H and W for
            the 4:2:0 chroma subsampling that players expect.
        fps: Frame rate.
        codec: FFmpeg encoder name.
        crf: Constant rate factor (quality; lower is better) for x264/x265.

    Returns:
        The number of frames written.

    Raises:
        ValueError: a frame has the wrong dtype, shape or odd size, sizes
            differ, or ``frames`` is empty.
    """
    path = os.fspath(path)
    rate = Fraction(fps).limit_denominator(100_000) if not isinstance(fps, Fraction) else fps
    if rate <= 0:
        raise ValueError(f"dcjax: fps must be positive, got {fps!r}")
    options = {"movflags": "+faststart"} if path.lower().endswith((".mp4", ".mov")) else {}
    count = 0
    container = av.open(path, "w", options=options)
    try:
        stream = None
        shape: tuple[int, ...] = ()
        for frame in frames:
            frame = np.asarray(frame)
            if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
                raise ValueError(
                    f"dcjax: frame {count} must be (H, W, 3) uint8, got {frame.shape} {frame.dtype}"
                )
            if stream is None:
                shape = frame.shape
                if shape[0] % 2 or shape[1] % 2:
                    raise ValueError(
                        f"dcjax: frames must have even height and width for 4:2:0 video, "
                        f"got {shape[:2]}; crop or pad them by one pixel"
                    )
                stream = container.add_stream(codec, rate=rate)
                stream.width, stream.height = shape[1], shape[0]
                stream.pix_fmt = "yuv420p"
                if codec in ("libx264", "libx265"):
                    stream.options = {"crf": str(crf)}
            elif frame.shape != shape:
                raise ValueError(
                    f"dcjax: frame {count} has shape {frame.shape}, but frame 0 had {shape}"
                )
            video_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            for packet in stream.encode(video_frame):
                container.mux(packet)
            count += 1
        if stream is None:
            raise ValueError("dcjax: frames is empty; a video needs at least one frame")
        for packet in stream.encode(None):
            container.mux(packet)
    finally:
        container.close()
        if count == 0 and os.path.exists(path):
            os.remove(path)
    return count


def check_writable(path: str | os.PathLike[str], *, codec: str = "libx264") -> None:
    """Checks, without touching ``path``, that :func:`write` can encode to it.

    FFmpeg picks the container from the file's extension, and not every
    container holds every codec (WebM and GIF take no H.264): a long run that
    ends in writing its video checks this first.

    Raises:
        ValueError: ``path`` is a directory, its extension names no container
            FFmpeg writes, or that container cannot hold ``codec``.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"dcjax: '{path}' is a directory; give a video file name such as out.mp4")
    ext = os.path.splitext(path)[1]
    hint = "name it .mp4, .mkv, .mov or .avi"
    with tempfile.TemporaryDirectory() as tmp:  # the container is opened, never written
        try:
            container = av.open(os.path.join(tmp, "probe" + ext), "w")
        except (ValueError, av.error.FFmpegError) as error:
            raise ValueError(
                f"dcjax: FFmpeg writes no video format named by '{path}' ({error}); {hint}"
            ) from error
        try:
            container.add_stream(codec, rate=30)
        except (ValueError, av.error.FFmpegError) as error:
            raise ValueError(f"dcjax: cannot write '{path}': {error}; {hint}") from error
        finally:
            container.close()
