"""The ``dcjax`` command (also ``python -m dcjax``).

Subcommands:

- ``dcjax demo``: the pretrained EfficientNet-Lite0 over the bundled
  fixed-camera clip, without and with DeepCache; prints a short table and
  writes ``dcjax-demo/report.html`` (plots, a strip of frames with the reuse
  mask drawn over them) and ``dcjax-demo/metrics.json``.
- ``dcjax run VIDEO --model NAME [--pretrained] [--method deepcache]
  [--frames N] [--json out.json] [--out annotated.mp4]``: one model and one
  method (against ``nocache``) on any video FFmpeg reads.
- ``dcjax bench [--models M ...] [--videos PATH ...] [--methods ...]
  [--frames N] [--json out.json] [--report out.html]``: DeepCache's
  evaluation (Section 7): every model x video x method, optional sweeps.
- ``dcjax models``: the zoo with input shapes, parameters and FLOPs.

A bad argument is reported on one line, naming the argument, with exit
status 2 (``dcjax: error: argument --frames: ...``), before any model loads:
videos included (a file FFmpeg cannot read, or with fewer frames from
``--start`` on than the command needs), and where the results go (a directory
given for a file, an ``--out`` name FFmpeg cannot encode H.264 into; missing
parent directories are created). A video whose stream breaks part way runs on
the frames decoded before the break, with a warning on stderr that says where
it stopped. Ctrl-C ends a command with one line and exit status 130; ``bench``
writes each record to its JSON as it comes, says how many are there, and with
``--report`` writes their report (marked as interrupted) before it exits.

Compiled programs are kept between runs in JAX's persistent compilation cache
(`compilation_cache_dir`): a cached step takes far longer to compile than the
plain model (ResNet-50's DeepCache step about 45 s on a 2-core CPU, its
no-cache step 2 s), and a second run with the same model, method and shapes
loads it instead.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["COMPILATION_CACHE_MAX_BYTES", "build_parser", "compilation_cache_dir", "main"]

#: Size past which the command's compilation cache drops its least recently used programs.
COMPILATION_CACHE_MAX_BYTES = 2 << 30


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a single line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())
        self.exit(2, f"dcjax: error: {message} (see dcjax {self._sub_name()}--help)\n")

    def _sub_name(self) -> str:
        parts = self.prog.split()
        return (parts[-1] + " ") if len(parts) > 1 else ""


def _number(kind: type, ok, wanted: str):
    """An argparse ``type``: parse ``kind`` (int or float), then check ``ok(value)``."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{wanted}, got {text}")
        return value

    return parse


_positive_int = _number(int, lambda v: v >= 1, "must be a positive int")
_nonnegative_int = _number(int, lambda v: v >= 0, "must be >= 0")
_nonnegative_float = _number(
    float, lambda v: math.isfinite(v) and v >= 0, "must be a finite number >= 0"
)
_frames_int = _number(int, lambda v: v >= 2, "needs at least 2 frames")
_width = _number(float, lambda v: 0 < v <= 4, "must be in (0, 4]")


def _add_size_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--width", type=_width, default=1.0,
                   help="channel multiplier of zoo models (1.0: the published network; "
                        "small values for quick runs; no pretrained weights then)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--cpus", type=_positive_int, metavar="N",
                   help="run on N of this process's CPU cores (default: all); XLA:CPU "
                        "parallelises dense convolutions over cores but not the sparse "
                        "kernels' loops, so speedups depend on it")  # fmt: skip


def _add_video_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("video", metavar="VIDEO", help="video file (or bundled clip name)")
    p.add_argument("--model", required=True, help="zoo model (see dcjax models)")
    p.add_argument("--pretrained", action="store_true", help="real weights (efficientnet_lite0)")
    p.add_argument("--start", type=_nonnegative_int, default=0, help="frames to skip first")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``dcjax`` command."""
    parser = _Parser(
        prog="dcjax",
        description="DeepCache for JAX: reuse CNN work across frames.",
        epilog="Compiled steps are kept between runs in $XDG_CACHE_HOME/dcjax/xla "
        "(~/.cache/dcjax/xla, at most 2 GiB); DCJAX_COMPILATION_CACHE=DIR puts them "
        "elsewhere, DCJAX_COMPILATION_CACHE=off keeps none.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    demo = sub.add_parser("demo", help="EfficientNet-Lite0 on a bundled clip, with and without "
                                       "DeepCache; writes dcjax-demo/report.html")  # fmt: skip
    demo.add_argument("--frames", type=_frames_int, default=80, help="frames (default 80)")
    demo.add_argument(
        "--video",
        default="vtest",
        help="bundled clip name or video file (default vtest, fixed camera)",
    )
    demo.add_argument("--model", default="efficientnet_lite0", help="zoo model")
    demo.add_argument(
        "--method",
        default="deepcache",
        help="method spec compared with nocache (default deepcache)",
    )
    demo.add_argument("--out", default="dcjax-demo", help="output directory")
    demo.add_argument("--no-pretrained", action="store_true", help="random weights")
    _add_size_args(demo)

    run = sub.add_parser("run", help="one model and method on a video")
    _add_video_model_args(run)
    run.add_argument("--method", default="deepcache", help="method spec (default deepcache)")
    run.add_argument("--frames", type=_frames_int, default=100, help="frames (default 100)")
    run.add_argument("--json", metavar="PATH", help="write the metrics records here")
    run.add_argument("--out", metavar="PATH", help="write the frames with the reuse mask here")
    _add_size_args(run)

    bench = sub.add_parser("bench", help="the paper's evaluation: models x videos x methods")
    bench.add_argument(
        "--models",
        nargs="+",
        default=None,
        metavar="M",
        help="zoo models (default: the paper's five and efficientnet_lite0)",
    )
    bench.add_argument(
        "--videos",
        nargs="+",
        default=["vtest", "box"],
        metavar="PATH",
        help="video files or bundled clip names (default: vtest box)",
    )
    bench.add_argument(
        "--methods",
        nargs="+",
        default=None,
        metavar="METHOD",
        help="method specs (default: nocache deepcache deepmon mil frame)",
    )
    bench.add_argument("--frames", type=_frames_int, default=100, help="frames per video")
    bench.add_argument(
        "--start",
        type=_nonnegative_int,
        default=0,
        help="frames to skip at the start of every video",
    )
    bench.add_argument(
        "--thresholds",
        nargs="+",
        type=float,
        default=[],
        metavar="T",
        help="DeepCache PSNR thresholds to sweep (Fig. 16)",
    )
    bench.add_argument(
        "--blocks",
        nargs="+",
        type=_positive_int,
        default=[],
        metavar="B",
        help="DeepCache block sizes to sweep (Fig. 17)",
    )
    bench.add_argument(
        "--deltas",
        nargs="+",
        type=_nonnegative_float,
        default=[],
        metavar="D",
        help="refinement thresholds to sweep: deepcache+refine and delta at each "
        "(speed against agreement, a Pareto front in the report)",
    )
    bench.add_argument(
        "--matchers",
        nargs="*",
        default=None,
        metavar="MATCHER",
        help="compare matchers on each video (Table 4); no value: all",
    )
    bench.add_argument(
        "--pretrained",
        choices=("auto", "yes", "no"),
        default="auto",
        help="real weights where available (auto), always, never",
    )
    bench.add_argument(
        "--json",
        metavar="PATH",
        default="bench-results/bench.json",
        help="metrics records (default bench-results/bench.json)",
    )
    bench.add_argument("--report", metavar="PATH", help="HTML report with plots")
    bench.add_argument(
        "--profile",
        action="store_true",
        help="also time every method layer by layer on the same frames (as dcjax profile "
        "does): the records get the times and the report a table of where the time went",
    )
    _add_size_args(bench)

    prof = sub.add_parser("profile", help="where each method's time goes, layer by layer")
    _add_video_model_args(prof)
    prof.add_argument(
        "--methods",
        nargs="+",
        default=["nocache", "deepcache"],
        metavar="METHOD",
        help="method specs (default: nocache deepcache)",
    )
    prof.add_argument(
        "--frames", type=_frames_int, default=20, help="frames, the first 5 untimed (default 20)"
    )
    prof.add_argument("--json", metavar="PATH", help="write the profiles here")
    _add_size_args(prof)

    sub.add_parser("models", help="the model zoo with input shapes and FLOPs")
    return parser  # fmt: skip


def compilation_cache_dir() -> str | None:
    """Where the command keeps compiled programs, or None for nowhere.

    ``JAX_COMPILATION_CACHE_DIR``, where set, is JAX's own setting and wins;
    else ``DCJAX_COMPILATION_CACHE``: a directory, or ``off``; else
    ``$XDG_CACHE_HOME/dcjax/xla`` (``~/.cache/dcjax/xla``).
    """
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    value = os.environ.get("DCJAX_COMPILATION_CACHE", "").strip()
    if value.lower() in ("off", "0", "no", "false", "none"):
        return None
    if value:
        return os.path.expanduser(value)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dcjax", "xla")


def _use_compilation_cache() -> None:
    """Point JAX's persistent compilation cache at `compilation_cache_dir`, capped
    at `COMPILATION_CACHE_MAX_BYTES` (JAX's own ``JAX_COMPILATION_CACHE_*``
    settings are left alone); a directory that cannot be made means no cache."""
    path = compilation_cache_dir()
    if path is None or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    if "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ:
        jax.config.update("jax_compilation_cache_max_size", COMPILATION_CACHE_MAX_BYTES)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "models":
        _use_compilation_cache()
    if getattr(args, "cpus", None) is not None:
        _pin_cpus(_subparser(parser, args.command), args.cpus)
    handler = {"demo": _demo, "run": _run, "bench": _bench, "models": _models,
               "profile": _profile}[args.command]  # fmt: skip
    try:
        return handler(parser, args)
    except KeyboardInterrupt as e:  # Ctrl-C: one line, the shell's status for SIGINT
        print(f"dcjax: interrupted{e.args[0] if e.args else ''}", file=sys.stderr)
        return 130


# --- validation shared by the subcommands ------------------------------------------------


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:  # argparse keeps subparsers here
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    return parser


def _pin_cpus(sub: argparse.ArgumentParser, n: int) -> None:
    """Restrict the process to its first ``n`` allowed cores, before XLA starts."""
    if not hasattr(os, "sched_setaffinity"):
        sub.error("argument --cpus: this platform cannot restrict a process to some cores")
    allowed = sorted(os.sched_getaffinity(0))
    if n > len(allowed):
        sub.error(f"argument --cpus: {n} cores asked for, this process may use {len(allowed)}")
    os.sched_setaffinity(0, allowed[:n])


def _check_model(sub: argparse.ArgumentParser, arg: str, name: str) -> None:
    from dcjax import models

    if name not in models.names():
        sub.error(
            f"argument {arg}: unknown model {name!r}; choose from {', '.join(models.names())}"
        )


def _check_method(sub: argparse.ArgumentParser, arg: str, spec: str) -> None:
    """The method's name and options, checked without a model (`registry.check_method`)."""
    from dcjax.eval.registry import check_method

    with _method_errors(sub, arg, ValueError):
        check_method(spec)


@contextlib.contextmanager
def _method_errors(sub: argparse.ArgumentParser, arg: str, kind: type | None = None):
    """A method spec's errors as a one-line error naming ``arg``, exit status 2:
    ``kind``, by default what a method refuses for this model
    (`registry.MethodOptionError`, raised while building its runner)."""
    from dcjax.eval.registry import MethodOptionError

    caught = MethodOptionError if kind is None else kind
    try:
        yield
    except caught as e:
        sub.error(f"argument {arg}: {_message(e)}")


def _check_video(
    sub: argparse.ArgumentParser, arg: str, path: str, start: int = 0, need: int = 2
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
        sub.error(f"argument {arg}: {e}")
    try:
        with video.read(resolved, start=start, max_frames=need) as frames:
            got = sum(1 for _ in frames)
    except video.VideoError as e:
        sub.error(f"argument {arg}: {_message(e)}")
    except ValueError as e:  # the start is past the end
        sub.error(f"argument --start: {_message(e)}")
    if got < need:
        counted = f"{got} frame" + "s" * (got != 1)
        sub.error(f"argument {arg}: video {path!r} has {counted} from frame {start} on; "
                  f"at least {need} are needed")  # fmt: skip
    return resolved


def _check_output(
    sub: argparse.ArgumentParser, arg: str, path: str | None, kind: str = "file"
) -> None:
    """Where a subcommand will write, checked before anything runs: ``kind``
    ``"file"``, ``"video"`` (a name `dcjax.video.write` can encode to) or
    ``"dir"``. The parent directories are created now; what cannot be
    written is a one-line error naming ``arg``, exit status 2."""
    if path is None:
        return
    from dcjax import video

    if kind == "dir":
        if os.path.exists(path) and not os.path.isdir(path):
            sub.error(f"argument {arg}: {path!r} exists and is not a directory")
        parent = path
    else:
        if os.path.isdir(path):
            sub.error(f"argument {arg}: {path!r} is a directory; give a file name")
        parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        sub.error(f"argument {arg}: cannot create the directory {parent!r} ({e.strerror})")
    if not os.access(parent, os.W_OK):
        sub.error(f"argument {arg}: the directory {parent!r} is not writable")
    if kind == "video":
        try:
            video.check_writable(path)
        except ValueError as e:
            sub.error(f"argument {arg}: {_message(e)}")


@contextlib.contextmanager
def _saying_what_is_kept(records: list, path: str, report_to=None):
    """An interruption names where the records made so far are (each is written
    as it comes) and, given ``report_to(records)`` (which writes the report and
    returns its path), writes their report too; a report that fails is named
    with its error, and the records stay where they are."""
    try:
        yield
    except KeyboardInterrupt:
        if not records:
            raise KeyboardInterrupt("; no record was made") from None
        kept = f"; the records made so far ({len(records)}) are in {path}"
        if report_to is not None:
            try:
                kept += f", their report in {report_to(records)}"
            except Exception as e:  # the records are what must not be lost
                kept += f" (no report: {type(e).__name__}: {_message(e)})"
        raise KeyboardInterrupt(kept) from None


def _message(error: BaseException) -> str:
    return str(error).removeprefix("dcjax: ")


def _warn_truncated(error: Exception, kept: int) -> None:
    """A stream that breaks early: say so on stderr and go on with what decoded."""
    print(f"dcjax: warning: {_message(error)}; going on with those {kept} frames",
          file=sys.stderr, flush=True)  # fmt: skip


def _load_clip(path: str, frame_shape, *, frames: int, start: int = 0):
    """The frames a subcommand runs on (`harness.load_frames`); a truncated
    video keeps the frames decoded before the break, with a warning."""
    from dcjax.eval import harness

    return harness.load_frames(path, frame_shape, frames=frames, start=start,
                               on_truncated=_warn_truncated)  # fmt: skip


def _table(rows: Sequence[dict[str, str]]) -> str:
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    line = lambda r: "  ".join(str(r[c]).rjust(widths[c]) if i else str(r[c]).ljust(widths[c])
                               for i, c in enumerate(cols))  # fmt: skip
    return "\n".join([line({c: c for c in cols}), *(line(r) for r in rows)])


def _short_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    from dcjax.eval.report import summary_rows

    keep = ("method", "median ms", "speedup", "ideal", "efficiency", "top-1 agree", "match",
            "refreshes")  # fmt: skip
    return [{k: row[k] for k in keep} for row in summary_rows(records)]


def _per_layer_text(record: dict[str, Any], limit: int | None = None) -> str:
    from dcjax.eval.report import computed_cells

    layers = record["per_layer"]
    total = sum(lay["flops"] for lay in layers) or 1
    rows = []
    for lay, cell in list(zip(layers, computed_cells(layers), strict=True))[:limit]:
        bar = "#" * round(20 * lay["reuse_fraction"])
        name = lay["name"] if len(lay["name"]) <= 34 else "…" + lay["name"][-33:]
        rows.append({
            "layer": name,
            "FLOPs": f"{100 * lay['flops'] / total:.1f}%",
            "reuse": f"{100 * lay['reuse_fraction']:.0f}%",
            **cell,
            "": bar.ljust(20, "."),
        })  # fmt: skip
    return _table(rows)


def _where_time_went(records: Sequence[dict[str, Any]]) -> str:
    lines = []
    for r in records:
        if r["method"] == "nocache":
            continue
        parts = [
            f"{label} {r[key]:.1f} ms"
            for label, key in (
                ("refresh frames", "latency_refresh_ms"),
                ("other frames", "latency_reuse_ms"),
                ("a repeated frame", "static_frame_ms"),
            )
            if r.get(key) is not None
        ]
        lines.append(
            f"{r['variant']}: {', '.join(parts)} (median); no cache "
            f"{r['nocache_latency_ms']['median']:.1f} ms"
        )
    return "\n".join(["\nwhere the time goes:", *lines]) if lines else ""


def _nothing_sparse_note(record: dict[str, Any]) -> str:
    """Why a cached method gained nothing on moving frames, when it computed
    every layer in full (per-layer ``sparse`` all false); else ``""``."""
    layers = record.get("per_layer") or []
    if not layers or any(lay.get("sparse") is not False for lay in layers):
        return ""
    import jax

    kernel = record.get("config", {}).get("kernel", "auto")
    why = (
        f'kernel="auto" computes in full the layers too small or too thin for a sparse '
        f"kernel to pay on this backend ({jax.default_backend()}; dcjax/kernels/auto.py)"
        if kernel == "auto"
        else f'kernel="{kernel}" computes every layer in full'
    )
    return (
        f"\nNo layer of {record['model']} is computed sparsely here: {why}. The cached step "
        "is then the network plus matching: it saves time only on frames that match whole "
        "(a still scene), whose last output it returns (the bundled clip box has many)."
    )


def _load_spec(name: str, *, pretrained: bool, width: float, fps: float, quiet: bool = False):
    from dcjax.eval.harness import model_spec

    if pretrained and width != 1.0:
        pretrained = False
    try:
        return model_spec(name, pretrained=pretrained, width=width, fps=fps), pretrained
    except Exception as e:  # missing extra or weights: degrade, loudly
        if not pretrained:
            raise
        print(f"dcjax: pretrained {name} unavailable ({type(e).__name__}: {e}); "
              "using random weights", file=sys.stderr)  # fmt: skip
        return model_spec(name, pretrained=False, width=width, fps=fps), False


# --- subcommands --------------------------------------------------------------------------


def _models(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from dcjax.eval.harness import zoo_table

    rows = zoo_table()
    print(_table([
        {"model": r["name"], "input": "x".join(map(str, r["input_shape"])),
         "task": r["task"], "params": f"{r['params'] / 1e6:.2f}M",
         "conv GFLOPs": f"{r['conv_flops'] / 1e9:.3f}", "convs": str(r["convs"]),
         "pretrained": "yes" if r["pretrained"] else "no"}
        for r in rows
    ]))  # fmt: skip
    return 0


def _demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    sub = _subparser(parser, "demo")
    _check_model(sub, "--model", args.model)
    _check_method(sub, "--method", args.method)
    path = _check_video(sub, "--video", args.video)
    _check_output(sub, "--out", args.out, "dir")
    import numpy as np

    from dcjax import models, video
    from dcjax.bench import evaluation as bench
    from dcjax.eval import harness, plots, report

    fps = video.info(path).fps or 10.0
    spec, pretrained = _load_spec(args.model, pretrained=not args.no_pretrained,
                                  width=args.width, fps=fps)  # fmt: skip
    frames = _load_clip(path, spec.frame_shape, frames=args.frames)
    weights = "pretrained" if pretrained else "random-weight"
    print(f"dcjax demo: {weights} {args.model} on {args.video} ({len(frames)} frames at "
          f"{spec.frame_shape[0]}x{spec.frame_shape[1]}), without and with {args.method}; "
          "compiling first (about a minute)...", flush=True)  # fmt: skip
    with _method_errors(sub, "--method"):
        ev = harness.evaluate(spec, frames, ["nocache", args.method], video_label=args.video,
                              progress=not args.no_progress)  # fmt: skip
    rec = ev.records[1]
    print()
    print(_table(_short_rows(ev.records)))
    print(f"\nideal speedup = 1 / FLOPs fraction computed; efficiency = measured / ideal. "
          f"Times are medians of {rec['frames']} per-frame steps, matching included.")  # fmt: skip
    if rec["top1_stability"] is not None:
        print(f"The uncached model's own top-1 stays the same from one frame to the next on "
              f"{100 * rec['top1_stability']:.0f}% of them: where it flips often, features "
              "reused from nearly equal pixels flip it too.")  # fmt: skip
    print(_where_time_went(ev.records))
    if rec["per_layer"]:
        cached = getattr(ev.runners[rec["variant"]], "cached", None)
        n_dense = len(cached.dense_layers) if cached is not None else 0
        kinds = f"{len(rec['per_layer']) - n_dense} convolutions"
        if n_dense:  # their reuse: the fraction of weight rows not read
            kinds += f", then {n_dense} fully connected"
        computed = any(lay.get("sparse") is not None for lay in rec["per_layer"])
        print(f"\nreuse per layer ({args.method}, {kinds}; FLOPs = share of the model's"
              + ("; computed: sparse, skipping what it reuses, or in full on every frame"
                 if computed else "") + "):")  # fmt: skip
        print(_per_layer_text(rec))
        note = _nothing_sparse_note(rec)
        if note:
            print(note)
    if pretrained and ev.outputs["nocache"].shape[-1] == 1000:
        labels = models.imagenet_labels()
        top = np.bincount(ev.outputs["nocache"].reshape(len(frames), -1).argmax(-1)).argmax()
        print(f"\nmost frequent top-1 class (no cache): {labels[top]}")

    os.makedirs(args.out, exist_ok=True)
    figures: dict[str, Any] = {}
    runner = ev.runners[args.method]
    if "matcher" in runner.config:
        masks = harness.input_masks(runner.config, frames, ev.infos[args.method]["refreshed"])
        picks = [int(i) for i in np.linspace(1, len(frames) - 1, 6).round()]
        figures["reuse_masks"] = plots.mask_strip(frames, masks, picks)
    figures["timeline"] = plots.timeline(ev.latencies_ms, ev.infos)
    bench.write_json(os.path.join(args.out, "metrics.json"), ev.records)
    html_path = os.path.join(args.out, "report.html")
    report.write_report(
        html_path, ev.records, figures=figures,
        title=f"dcjax demo: {args.model} on {args.video}",
        intro=f"{weights} {args.model}, {len(frames)} frames; reuse masks: green = reused "
              "input pixels, red = recomputed.",
    )  # fmt: skip
    print(f"\nwrote {html_path} and {os.path.join(args.out, 'metrics.json')}")
    return 0


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    sub = _subparser(parser, "run")
    _check_model(sub, "--model", args.model)
    _check_method(sub, "--method", args.method)
    path = _check_video(sub, "VIDEO", args.video, args.start)
    _check_output(sub, "--json", args.json)
    _check_output(sub, "--out", args.out, "video")
    from dcjax import video
    from dcjax.bench import evaluation as bench
    from dcjax.eval import harness

    fps = video.info(path).fps or 10.0
    spec, _ = _load_spec(args.model, pretrained=args.pretrained, width=args.width, fps=fps)
    frames = _load_clip(path, spec.frame_shape, frames=args.frames, start=args.start)
    print(f"{args.model} on {args.video}: {len(frames)} frames from frame {args.start} at "
          f"{spec.frame_shape[0]}x{spec.frame_shape[1]}, nocache and {args.method}",
          flush=True)  # fmt: skip
    with _method_errors(sub, "--method"):
        ev = harness.evaluate(spec, frames, ["nocache", args.method], video_label=args.video,
                              progress=not args.no_progress)  # fmt: skip
    print(_table(_short_rows(ev.records)))
    if args.json:
        bench.write_json(args.json, ev.records)
        print(f"wrote {args.json}")
    if args.out:
        runner = ev.runners[args.method]
        masks = (
            harness.input_masks(runner.config, frames, ev.infos[args.method]["refreshed"])
            if "matcher" in runner.config
            else None
        )
        video.write(args.out, _annotate(frames, masks), fps=fps)
        print(f"wrote {args.out}")
    return 0


def _profile(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    sub = _subparser(parser, "profile")
    _check_model(sub, "--model", args.model)
    for m in args.methods:
        _check_method(sub, "--methods", m)
    if args.frames <= _PROFILE_WARMUP:
        sub.error(f"argument --frames: needs more than {_PROFILE_WARMUP} (those are untimed)")
    path = _check_video(sub, "VIDEO", args.video, args.start, need=_PROFILE_WARMUP + 1)
    _check_output(sub, "--json", args.json)
    import json

    from dcjax.eval import profile, registry

    spec, _ = _load_spec(args.model, pretrained=args.pretrained, width=args.width, fps=10.0)
    frames = _load_clip(path, spec.frame_shape, frames=args.frames, start=args.start)
    results = []
    for spec_text in _progress(args.methods, args.no_progress, f"profiling {args.model}"):
        with _method_errors(sub, "--methods"):
            runner = registry.make_runner(spec, *registry.parse_method(spec_text))
        runner = runner.timed() if runner.timed is not None else runner  # what bench times
        try:
            results.append((spec_text, profile.profile(runner, frames, warmup=_PROFILE_WARMUP)))
        except ValueError as e:
            sub.error(f"argument --methods: {e}")
    print(_profile_table(results))
    if args.json:
        out = [{"model": args.model, "video": args.video, "method": m, **p.as_dict()}
               for m, p in results]  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")
    return 0


#: Frames `dcjax profile` runs before it times.
_PROFILE_WARMUP = 5


def _progress(items, quiet: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit="method", disable=quiet, leave=False)


def _profile_table(results) -> str:
    """One row per group, one column of ms a frame per method, then the totals."""
    from dcjax.eval import profile

    rows = profile.table_rows([(m, p.as_dict()) for m, p in results])
    return f"{_table(rows)}\n{profile.TABLE_NOTE}"


def _annotate(frames, masks):
    """Frames (cropped to even sizes) with reused pixels tinted green, recomputed red."""
    import numpy as np

    h, w = frames.shape[1] // 2 * 2, frames.shape[2] // 2 * 2
    out = frames[:, :h, :w].astype(np.float32)
    if masks is not None:
        m = masks[:, :h, :w, None]
        tint = np.where(m, np.float32([0, 200, 0]), np.float32([230, 0, 0]))
        out = 0.7 * out + 0.3 * tint
    return out.clip(0, 255).astype(np.uint8)


def _bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    sub = _subparser(parser, "bench")
    from dcjax.bench import evaluation as bench
    from dcjax.eval import report

    model_names = args.models or [*bench.PAPER_MODELS, "efficientnet_lite0"]
    for m in model_names:
        _check_model(sub, "--models", m)
    methods = args.methods or list(bench.DEFAULT_METHODS)
    for m in methods:
        _check_method(sub, "--methods", m)
    for v in args.videos:
        _check_video(sub, "--videos", v, args.start)
    _check_output(sub, "--json", args.json)
    _check_output(sub, "--report", args.report)
    matchers = args.matchers
    if matchers is not None:
        from dcjax.config import MATCHERS

        matchers = matchers or list(bench.DEFAULT_MATCHERS)
        for m in matchers:
            if m not in MATCHERS:
                sub.error(f"argument --matchers: unknown matcher {m!r}; choose from "
                          f"{', '.join(MATCHERS)}")  # fmt: skip
    pretrained = {"auto": "auto", "yes": True, "no": False}[args.pretrained]
    records: list[dict[str, Any]] = []
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    xla_flags = os.environ.get("XLA_FLAGS", "")

    def keep(record: dict[str, Any]) -> None:
        record["cpus"] = cpus
        record["xla_flags"] = xla_flags  # XLA:CPU's library choice moves the baseline
        records.append(record)
        bench.write_json(args.json, records)  # partial results survive an interrupt

    truncated: set[str | None] = set()

    def warn_once(error: Any, kept: int) -> None:  # each model decodes each video
        if error.path not in truncated:
            truncated.add(error.path)
            _warn_truncated(error, kept)

    def report_to(records: list, note: str = "") -> str:
        import jax

        intro = (
            f"{cpus} CPU core(s) of this machine, JAX {jax.__version__} on "
            f"{jax.default_backend()}; medians per frame with matching included."
            + (f" XLA_FLAGS={xla_flags}." if xla_flags else "")
            + note
        )
        report.write_report(args.report, records, matcher_rows=matcher_rows,
                            title="dcjax bench", intro=intro)  # fmt: skip
        return args.report

    matcher_rows: list = []
    interrupted = " Interrupted: the records made before the interruption only."
    with (
        _method_errors(sub, "--methods"),
        _saying_what_is_kept(
            records, args.json, (lambda r: report_to(r, interrupted)) if args.report else None
        ),
    ):
        records_out, matcher_rows = bench.run_bench(
            model_names, args.videos, methods, frames=args.frames, start=args.start,
            pretrained=pretrained,
            width=args.width, thresholds=args.thresholds, blocks=args.blocks,
            deltas=args.deltas,
            matchers=matchers or (), progress=not args.no_progress, on_record=keep,
            profile=args.profile, on_truncated=warn_once,
        )  # fmt: skip
    for record in records_out:  # the same, for records not passed to `keep`
        record["cpus"] = cpus
        record["xla_flags"] = xla_flags
    bench.write_json(args.json, records_out)
    if matcher_rows:
        bench.write_json(os.path.splitext(args.json)[0] + ".matchers.json", matcher_rows)
    print(_table([
        {k: row[k] for k in ("model", "video", "method", "median ms", "speedup", "ideal",
                             "efficiency", "top-1 agree", "match", "cache MiB")}
        for row in report.summary_rows(records_out)
    ]))  # fmt: skip
    print(f"wrote {args.json}")
    if args.report:
        print(f"wrote {report_to(records_out)}")
    return 0
