"""What the benchmark programs and the ``dcjax`` command share, besides their
arguments (`dcjax.bench.arguments`).

- Models and frames: `load_spec` (the model a command runs, its pretrained
  weights or, loudly, random ones), `load_clip` (a video that breaks part way
  runs on what decoded, with `warn_truncated`'s line on stderr).
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
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dcjax.bench.arguments import check_input_size, frame_size, input_size, message, width

__all__ = [
    "DEMO_METHOD",
    "Timed",
    "Timing",
    "add_model_args",
    "cell",
    "load_clip",
    "load_spec",
    "machine",
    "model_from_args",
    "progress",
    "table",
    "time_interleaved",
    "warn_above_ideal",
    "warn_page_faults",
    "warn_records",
    "warn_truncated",
    "write_json",
]

#: What ``dcjax demo`` compares with the dense step: DeepCache with refinement
#: at its strictest measured setting and the per-pixel cap on reused blocks,
#: the best box F1 and heat-map error among the settings as fast as plain
#: DeepCache on CenterFace over vtest.avi (docs/benchmarks.md, 2026-11-29), and
#: on the bundled clip ahead of the cap in squares (docs/performance-notes.md,
#: "Isolated pixels over the cap (pixel_change_size)").
DEMO_METHOD = "deepcache+refine:delta=0.01,max_pixel_change=0.1"


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


def warn_above_ideal(rows: Iterable[tuple]) -> list[str]:
    """For each ``(label, speedup_vs_dense, ideal)`` or ``(label,
    speedup_vs_dense, ideal, speedup_vs_dense_se)`` whose speedup is above its
    ideal beyond the run's noise, `dcjax.eval.metrics.above_ideal`'s warning,
    printed on stderr; returns the warnings."""
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
        (label(r), r["speedup_vs_dense"], r["ideal_speedup"], r.get("speedup_vs_dense_se"))
        for r in records
        if "ideal_speedup" in r and r["method"] not in BASELINES
    ) + warn_page_faults((label(r), r.get("page_faults")) for r in records)


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


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The options of a program's one zoo model that `model_from_args` reads:
    ``--size HxW`` or ``--native``, ``--pretrained`` and ``--width``."""
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--size", type=frame_size, metavar="HxW", help="run at this frame size")
    size.add_argument("--native", action="store_true", help="run at the video's own size")
    parser.add_argument("--pretrained", choices=("auto", "yes", "no"), default="auto",
                        help="real weights where the zoo has them (auto)")  # fmt: skip
    parser.add_argument("--width", type=width, default=1.0,
                        help="channel multiplier of zoo models")  # fmt: skip


def model_from_args(
    parser: argparse.ArgumentParser, args: argparse.Namespace, path: str, *, fps: float = 10.0
):
    """The zoo model ``args.model`` built as `add_model_args`'s options say, for
    the video at ``path`` (`load_spec`), and whether its weights are
    pretrained. A size the model cannot take, or ``--pretrained yes`` where
    the zoo has no weights at this width, is a one-line error naming the
    argument (exit status 2)."""
    from dcjax import models

    hw = input_size(args, path)
    if hw is not None:
        check_input_size(parser, "--size", args.model, hw, width=args.width)
    has = models.has_weights(args.model) and args.width == 1.0
    if args.pretrained == "yes" and not has:
        parser.error(f"argument --pretrained: no pretrained weights for {args.model} at this width")
    want = args.pretrained == "yes" or (args.pretrained == "auto" and has)
    return load_spec(args.model, pretrained=want, width=args.width, fps=fps, input_size=hw)


# --- output -----------------------------------------------------------------------------


def cell(x: float | None, spec: str, unit: str = "") -> str:
    """An optional number as a table cell: ``format(x, spec) + unit``, or
    ``"-"`` for None."""
    return "-" if x is None else format(x, spec) + unit


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
