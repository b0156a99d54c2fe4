"""What the benchmark programs and the ``dcjax`` command share.

- Arguments: `ArgumentParser`, whose errors are one line naming the argument,
  ``dcjax: error: argument --frames: ... (see dcjax run --help)``, with exit
  status 2; argument types (`number` and the ready-made ones below it,
  `comma_list`, `frame_size`); checks of what a command names, made before any
  model loads: `check_model`, `check_method` (and `method_errors` for what a
  method refuses once the model is there), `check_video`, `check_output`,
  `check_input_size` (a frame size a model takes).
- Models and frames: `load_spec` (the model a command runs, its pretrained
  weights or, loudly, random ones), `input_size` (what ``--size`` / ``--native``
  ask for), `load_clip`
  (a video that breaks part way runs on what decoded, with `warn_truncated`'s
  line on stderr).
- Output: `table` (rows of cells as aligned text), `write_json`, `machine` (the
  machine and JAX a result was measured on), `progress` (a progress bar).
- Timing: `time_interleaved`, the median and minimum of interleaved calls;
  the warnings printed beside a table of records (`warn_records`: a speedup
  above its ideal, `warn_above_ideal`; a method timed with fresh memory's
  page faults, `warn_page_faults`).

Everything that imports JAX, a model or a video does so when called, so that
``dcjax --help`` and argument errors stay quick.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NoReturn

__all__ = [
    "ArgumentParser",
    "Timed",
    "Timing",
    "at_least",
    "check_input_size",
    "check_method",
    "check_model",
    "check_output",
    "check_video",
    "comma_list",
    "unit_interval",
    "frame_size",
    "frames_int",
    "input_size",
    "load_clip",
    "load_spec",
    "machine",
    "message",
    "method_errors",
    "nonnegative_float",
    "nonnegative_int",
    "number",
    "positive_float",
    "positive_int",
    "program_parser",
    "progress",
    "table",
    "time_interleaved",
    "warn_above_ideal",
    "warn_page_faults",
    "warn_records",
    "warn_truncated",
    "width",
    "write_json",
]


# --- arguments --------------------------------------------------------------------------


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


# --- frames -----------------------------------------------------------------------------


def warn_truncated(error: Exception, kept: int) -> None:
    """A stream that breaks early: say so on stderr and go on with what decoded."""
    print(f"dcjax: warning: {message(error)}; going on with those {kept} frames",
          file=sys.stderr, flush=True)  # fmt: skip


def _printed(notes: Iterable[str | None]) -> list[str]:
    """The notes that are not None, each printed on stderr."""
    notes = [n for n in notes if n is not None]
    for note in notes:
        print(f"dcjax: {note}", file=sys.stderr, flush=True)
    return notes


def warn_above_ideal(rows: Iterable[tuple[str, float, float | None]]) -> list[str]:
    """For each ``(label, speedup_vs_dense, ideal)`` whose speedup is above its
    ideal, `dcjax.eval.metrics.above_ideal`'s warning, printed on stderr;
    returns the warnings."""
    from dcjax.eval.metrics import above_ideal

    return _printed(above_ideal(*row) for row in rows)


def warn_page_faults(rows: Iterable[tuple[str, float | None]]) -> list[str]:
    """For each ``(label, page_faults)`` above `dcjax.eval.metrics.FAULTS_WARNED`,
    `dcjax.eval.metrics.faulted`'s warning, printed on stderr; returns the
    warnings."""
    from dcjax.eval.metrics import faulted

    return _printed(faulted(*row) for row in rows)


def warn_records(
    records: Sequence[dict[str, Any]],
    label: Callable[[dict[str, Any]], str] = lambda r: r["method"],
) -> list[str]:
    """`warn_above_ideal` and `warn_page_faults` over records of the harness
    (`dcjax.eval.metrics`) or of ``dcjax bench streams``, labelled by
    ``label(record)`` (the method's name by default). Records without an
    ``ideal_speedup`` (the streams bench's baselines) and the harness's
    baselines are left out of the first: their ideal is 1 by definition, and
    the plain model may well be faster than dcjax's dense lowering; their
    page faults are warned about like any method's."""
    from dcjax.eval.metrics import BASELINES

    return warn_above_ideal(
        (label(r), r["speedup_vs_dense"], r["ideal_speedup"])
        for r in records
        if "ideal_speedup" in r and r["method"] not in BASELINES
    ) + warn_page_faults((label(r), r.get("page_faults")) for r in records)


def input_size(args: argparse.Namespace, path: str) -> tuple[int, int] | None:
    """The frame size (H, W) a command runs at, as its ``--size`` and
    ``--native`` say: the size given, the video at ``path``'s own, or None
    for the model's published input size."""
    if getattr(args, "native", False):
        from dcjax import video

        return video.info(path).size
    size = getattr(args, "size", None)
    return None if size is None else tuple(size)


def load_clip(path: str, frame_shape: Sequence[int] | None, *, frames: int, start: int = 0) -> Any:
    """The frames a command runs on (`dcjax.eval.harness.load_frames`): resized to
    ``frame_shape`` (H, W, ...), or at the video's own size for None; a truncated
    video keeps the frames decoded before the break, with a warning."""
    from dcjax.eval import harness

    return harness.load_frames(path, frame_shape, frames=frames, start=start,
                               on_truncated=warn_truncated)  # fmt: skip


def load_spec(
    name: str,
    *,
    pretrained: bool,
    width: float,
    fps: float,
    input_size: tuple[int, int] | None = None,
):
    """The model a command runs, built for ``input_size`` frames (None: its
    published input), and whether its weights are pretrained."""
    from dcjax.eval.specs import model_spec

    if pretrained and width != 1.0:
        pretrained = False
    kwargs = {"width": width, "fps": fps, "input_size": input_size}
    try:
        return model_spec(name, pretrained=pretrained, **kwargs), pretrained
    except Exception as e:  # missing extra or weights: degrade, loudly
        if not pretrained:
            raise
        print(f"dcjax: pretrained {name} unavailable ({type(e).__name__}: {e}); "
              "using random weights", file=sys.stderr)  # fmt: skip
        return model_spec(name, pretrained=False, **kwargs), False


# --- output -----------------------------------------------------------------------------


def table(rows: Sequence[dict[str, str]]) -> str:
    """Rows of cells (the first row's keys are the columns) as text: a header
    line, then one line per row; the first column left-aligned, the others
    right-aligned."""
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    line = lambda r: "  ".join(str(r[c]).rjust(widths[c]) if i else str(r[c]).ljust(widths[c])
                               for i, c in enumerate(cols))  # fmt: skip
    return "\n".join([line({c: c for c in cols}), *(line(r) for r in rows)])


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # NumPy scalars
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def write_json(path: str, data: Any, *, indent: int = 1) -> None:
    """``data`` as indented JSON at ``path`` (its directories made); dataclasses
    and NumPy scalars are written as dicts and numbers."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=indent, default=_json_default)


def machine() -> dict[str, Any]:
    """The machine and JAX results are measured on: ``jax`` (version),
    ``backend``, ``device`` (the first device), ``platform``, ``machine`` (the
    architecture), ``cpu_count`` (the machine's cores), ``cpus`` (the cores
    this process may run on), ``load_average`` (None where unknown),
    ``xla_flags`` and ``memory`` (the allocator's and dispatch's settings,
    `dcjax.allocator.setting`: large layers' times depend on them)."""
    import jax

    from dcjax import allocator

    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0]),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpus": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "memory": allocator.setting(),
    }


def progress(items: Iterable, *, desc: str, unit: str, quiet: bool = False) -> Iterable:
    """``items`` with a progress bar on stderr (none when ``quiet``), cleared when done."""
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit=unit, disable=quiet, leave=False)


# --- timing -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timed:
    """One thing `time_interleaved` times: ``call(*prepare())``.

    ``prepare`` (not timed) gives the arguments of each sample, e.g. a fresh
    copy of a buffer the call donates. With ``feeds_back``, queued calls
    (``calls > 1``) pass each call's output as the last argument of the
    next, as a stream passes a cache from one step to the next.
    """

    call: Callable[..., Any]
    prepare: Callable[[], tuple] = tuple
    feeds_back: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timing:
    """Milliseconds a call: the median and the minimum of the samples."""

    median_ms: float
    min_ms: float


def time_interleaved(
    timed: Sequence[Timed], reps: int, *, calls: int = 1, warmup: int = 3
) -> list[Timing]:
    """The `Timing` of each of ``timed``, sampled in turn ``reps`` times.

    Each is first run ``warmup`` times untimed (compiling it). A sample waits
    for the results (``jax.block_until_ready``); interleaving the samples keeps
    every call under the same machine load. With ``calls > 1`` each sample is
    that many calls queued back to back, divided by ``calls``: on an
    accelerator this times the device's work instead of one call's dispatch
    and synchronisation.
    """
    import jax

    def sample(t: Timed) -> float:
        args = jax.block_until_ready(t.prepare())
        t0 = time.perf_counter()
        out = t.call(*args)
        for _ in range(calls - 1):
            out = t.call(*args[:-1], out) if t.feeds_back else t.call(*args)
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / calls

    for t in timed:
        for _ in range(warmup):
            sample(t)
    samples: list[list[float]] = [[] for _ in timed]
    for _ in range(reps):
        for i, t in enumerate(timed):
            samples[i].append(sample(t))
    return [Timing(median_ms=statistics.median(s) * 1e3, min_ms=min(s) * 1e3) for s in samples]
