"""The benchmark programs' and the ``dcjax`` command's arguments.

`ArgumentParser`, whose errors are one line naming the argument, ``dcjax:
error: argument --frames: ... (see dcjax run --help)``, with exit status 2;
argument types (`number` and the ready-made ones below it, `comma_list`,
`frame_size`); checks of what a command names, made before any model loads:
`check_model`, `check_method` (and `method_errors` for what a method refuses
once the model is there), `check_video`, `check_output`, `check_input_size` (a
frame size a model takes); `input_size` (what ``--size`` / ``--native`` ask
for).

Everything that imports JAX, a model or a video does so when called, so that
``dcjax --help`` and argument errors stay quick.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

__all__ = [
    "ArgumentParser",
    "at_least",
    "check_input_size",
    "check_method",
    "check_model",
    "check_output",
    "check_video",
    "comma_list",
    "frame_size",
    "frames_int",
    "input_size",
    "message",
    "method_errors",
    "nonnegative_float",
    "nonnegative_int",
    "number",
    "positive_float",
    "positive_int",
    "program_parser",
    "unit_interval",
    "width",
]


class ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a single line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())
        self.exit(2, f"dcjax: error: {message} (see {self.prog} --help)\n")


def program_parser(name: str, description: str | None) -> ArgumentParser:
    """The parser of ``dcjax bench NAME``, its description (a module docstring)
    printed as written."""
    return ArgumentParser(
        prog=f"dcjax bench {name}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def number(kind: type, ok: Callable[[Any], bool], wanted: str) -> Callable[[str], Any]:
    """An argparse ``type``: parse ``kind`` (int or float), then check ``ok(value)``;
    the error says ``wanted`` (``must be ...``) and what was given."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{wanted}, got {text}")
        return value

    return parse


def at_least(n: int) -> Callable[[str], int]:
    """An argparse ``type``: an int >= ``n``."""
    return number(int, lambda v: v >= n, f"must be at least {n}")


positive_int = number(int, lambda v: v >= 1, "must be a positive int")
nonnegative_int = number(int, lambda v: v >= 0, "must be >= 0")
frames_int = number(int, lambda v: v >= 2, "needs at least 2 frames")
nonnegative_float = number(
    float, lambda v: math.isfinite(v) and v >= 0, "must be a finite number >= 0"
)
positive_float = number(float, lambda v: v > 0, "must be a positive number")
unit_interval = number(float, lambda v: 0 <= v <= 1, "must be a number in [0, 1]")
width = number(float, lambda v: 0 < v <= 4, "must be in (0, 4]")


def frame_size(text: str) -> tuple[int, int]:
    """An argparse ``type``: a frame size ``HxW``, height by width in pixels
    (``576x768``), as ``(H, W)``."""
    found = re.fullmatch(r"\s*([-+]?\d+)\s*[xX]\s*([-+]?\d+)\s*", text)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"must be HxW, height by width in pixels (e.g. 576x768), got {text!r}"
        )
    h, w = int(found[1]), int(found[2])
    if h < 1 or w < 1:
        raise argparse.ArgumentTypeError(
            f"height and width must be positive numbers of pixels, got {text!r}"
        )
    return h, w


def comma_list(item: Callable[[str], Any]) -> Callable[[str], list]:
    """An argparse ``type``: comma-separated values, each parsed by ``item``
    (an argparse type, or a collection of the accepted strings)."""

    def parse(text: str) -> list:
        values = [t.strip() for t in text.split(",") if t.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"no value in {text!r}")
        if callable(item):
            return [item(v) for v in values]
        bad = [v for v in values if v not in item]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(repr, bad))}; choose from {', '.join(item)}"
            )
        return values

    return parse


def message(error: BaseException) -> str:
    """An error's text without its ``dcjax: `` prefix (for a line that has one)."""
    return str(error).removeprefix("dcjax: ")


def check_model(parser: argparse.ArgumentParser, arg: str, name: str) -> None:
    """A zoo model's name (or a bundled ONNX model's, `dcjax.models.onnx_zoo`),
    else a one-line error naming ``arg``."""
    from dcjax import models

    known = (*models.names(), *models.onnx_zoo.names())
    if name not in known:
        parser.error(f"argument {arg}: unknown model {name!r}; choose from {', '.join(known)}")


def check_method(parser: argparse.ArgumentParser, arg: str, spec: str) -> None:
    """A method spec's name and options, checked without a model
    (`dcjax.eval.registry.check_method`)."""
    from dcjax.eval.registry import check_method as check

    with method_errors(parser, arg, ValueError):
        check(spec)


@contextlib.contextmanager
def method_errors(
    parser: argparse.ArgumentParser, arg: str, kind: type | None = None
) -> Iterator[None]:
    """A method spec's errors as a one-line error naming ``arg``, exit status 2:
    ``kind``, by default what a method refuses for this model
    (`dcjax.eval.registry.MethodOptionError`, raised while building its runner)."""
    from dcjax.eval.registry import MethodOptionError

    caught = MethodOptionError if kind is None else kind
    try:
        yield
    except caught as e:
        parser.error(f"argument {arg}: {message(e)}")


def check_video(
    parser: argparse.ArgumentParser, arg: str, path: str, start: int = 0, need: int = 2
) -> str:
    """The path of a video, checked before anything loads: a bundled clip or a
    file FFmpeg decodes, with at least ``need`` frames from ``start`` on (one
    compiles the steps, the others are timed).
    What is wrong is a one-line error naming ``arg`` (``--start`` for a start
    past the end), exit status 2."""
    from dcjax import video

    try:
        resolved = video.resolve(path)
    except FileNotFoundError as e:
        parser.error(f"argument {arg}: {e}")
    try:
        with video.read(resolved, start=start, max_frames=need) as frames:
            got = sum(1 for _ in frames)
    except video.VideoError as e:
        parser.error(f"argument {arg}: {message(e)}")
    except ValueError as e:  # the start is past the end
        parser.error(f"argument --start: {message(e)}")
    if got < need:
        counted = f"{got} frame" + "s" * (got != 1)
        parser.error(f"argument {arg}: video {path!r} has {counted} from frame {start} on; "
                     f"at least {need} are needed")  # fmt: skip
    return resolved


def check_input_size(
    parser: argparse.ArgumentParser,
    arg: str,
    model: str,
    size: Sequence[int],
    *,
    width: float = 1.0,
    source: str = "",
) -> None:
    """A frame size (H, W) zoo ``model`` can be built for
    (`dcjax.eval.specs.input_size_error`: any size that leaves each layer a
    pixel), else a one-line error naming ``arg``, ``source`` (e.g. the video
    whose size it is) first, and the nearest size the model takes."""
    from dcjax.eval.specs import input_size_error

    problem = input_size_error(model, size, width=width)
    if problem is not None:
        parser.error(f"argument {arg}: {source}{problem}")


def check_output(
    parser: argparse.ArgumentParser, arg: str, path: str | None, kind: str = "file"
) -> None:
    """Where a command will write, checked before anything runs: ``kind``
    ``"file"``, ``"video"`` (a name `dcjax.video.write` can encode to) or
    ``"dir"``. The parent directories are created now; what cannot be
    written is a one-line error naming ``arg``, exit status 2."""
    if path is None:
        return
    from dcjax import video

    if kind == "dir":
        if os.path.exists(path) and not os.path.isdir(path):
            parser.error(f"argument {arg}: {path!r} exists and is not a directory")
        parent = path
    else:
        if os.path.isdir(path):
            parser.error(f"argument {arg}: {path!r} is a directory; give a file name")
        parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        parser.error(f"argument {arg}: cannot create the directory {parent!r} ({e.strerror})")
    if not os.access(parent, os.W_OK):
        parser.error(f"argument {arg}: the directory {parent!r} is not writable")
    if kind == "video":
        try:
            video.check_writable(path)
        except ValueError as e:
            parser.error(f"argument {arg}: {message(e)}")


def input_size(args: argparse.Namespace, path: str) -> tuple[int, int] | None:
    """The frame size (H, W) a command runs at, as its ``--size`` and
    ``--native`` say: the size given, the video at ``path``'s own, or None
    for the model's published input size."""
    if getattr(args, "native", False):
        from dcjax import video

        return video.info(path).size
    size = getattr(args, "size", None)
    return None if size is None else tuple(size)
