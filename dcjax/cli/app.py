"""The ``dcjax`` command's parser and entry point (`main`).

`build_parser` defines the subcommands and their options; `main` keeps freed
heap memory for reuse (`dcjax.allocator`, before anything runs), parses,
points JAX's persistent compilation cache at `compilation_cache_dir`, pins the
process to ``--cpus`` cores, runs the subcommand (`dcjax.cli.subcommands`,
`dcjax.cli.evaluation`) and turns Ctrl-C into one line and exit status 130.
``dcjax bench PROGRAM ...`` runs a benchmark program of `dcjax.bench` with the
rest of the arguments, as its own command (``dcjax bench PROGRAM --help``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dcjax import allocator
from dcjax.bench import PROGRAMS, arguments, common

__all__ = ["COMPILATION_CACHE_MAX_BYTES", "build_parser", "compilation_cache_dir", "main"]

#: Size past which the command's compilation cache drops its least recently used programs.
COMPILATION_CACHE_MAX_BYTES = 2 << 30


def _add_size_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--width", type=arguments.width, default=1.0,
                   help="channel multiplier of zoo models (1.0: the published network; "
                        "small values for quick runs; no pretrained weights then)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--cpus", type=arguments.positive_int, metavar="N",
                   help="run on N of this process's CPU cores (default: all); XLA:CPU "
                        "parallelises dense convolutions over cores but not the sparse "
                        "kernels' loops, so speedups depend on it")  # fmt: skip


def _add_frame_size_args(p: argparse.ArgumentParser, native: str, what: str = "the model") -> None:
    """``--size HxW`` and ``--native`` (one or the other; without either, frames
    are resized to the model's published input size, as ``dcjax models`` lists)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--size", type=arguments.frame_size, metavar="HxW",
                       help=f"build {what} for HxW frames (e.g. 576x768) and decode the "
                            "frames at that size (default: resized to the model's published "
                            "input, see dcjax models); any size that leaves each layer a "
                            "pixel, whether or not the model's strides divide it; models "
                            "with a dense head on flattened features (alexnet, vgg16, "
                            "yolo_tiny, dave) get random weights made for it")  # fmt: skip
    group.add_argument("--native", action="store_true", help=native)


def _add_video_model_args(p: argparse.ArgumentParser, *, many: bool = False) -> None:
    if many:
        p.add_argument("video", metavar="VIDEO", nargs="+",
                       help="video file (or bundled clip name); several run as streams of "
                            "one batch (the deepcache method)")  # fmt: skip
    else:
        p.add_argument("video", metavar="VIDEO", help="video file (or bundled clip name)")
    p.add_argument("--model", required=True, help="zoo model (see dcjax models)")
    p.add_argument("--pretrained", action="store_true",
                   help="real weights (efficientnet_lite0, mobilenet_v2)")  # fmt: skip
    p.add_argument(
        "--start", type=arguments.nonnegative_int, default=0, help="frames to skip first"
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``dcjax`` command."""
    parser = arguments.ArgumentParser(
        prog="dcjax",
        description="DeepCache for JAX: reuse CNN work across frames.",
        epilog="Compiled steps are kept between runs in $XDG_CACHE_HOME/dcjax/xla "
        "(~/.cache/dcjax/xla, at most 2 GiB); DCJAX_COMPILATION_CACHE=DIR puts them "
        "elsewhere, DCJAX_COMPILATION_CACHE=off keeps none.",
    )
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=arguments.ArgumentParser
    )
    sub.required = True

    demo = sub.add_parser("demo", help="a real detector (CenterFace) on a bundled clip at the "
                                       "camera's resolution, with and without DeepCache; "
                                       "writes dcjax-demo/report.html")  # fmt: skip
    demo.add_argument("--frames", type=arguments.frames_int, default=40, help="frames (default 40)")
    demo.add_argument(
        "--video",
        default="vtest768",
        help="bundled clip name or video file (default vtest768: a fixed camera at 768x576)",
    )
    demo.add_argument("--model", default="centerface",
                      help="zoo model or bundled ONNX detector (default centerface)")  # fmt: skip
    demo.add_argument(
        "--method",
        default=common.DEMO_METHOD,
        help=f"method spec compared with nocache (default {common.DEMO_METHOD}: DeepCache "
        "with no pixel of a reused block changed by more than 10 %% of the range, and "
        "inside the network the change test at 1 %% of each layer's scale)",
    )
    demo.add_argument("--out", default="dcjax-demo", help="output directory")
    demo.add_argument("--no-pretrained", action="store_true", help="random weights")
    _add_frame_size_args(demo, "the clip's own frame size, not resized (the default; vtest768: "
                               "576x768)")  # fmt: skip
    _add_size_args(demo)

    run = sub.add_parser("run", help="one model and method on a video, or on several as streams")
    _add_video_model_args(run, many=True)
    run.add_argument("--method", default="deepcache", help="method spec (default deepcache)")
    run.add_argument(
        "--frames", type=arguments.frames_int, default=100, help="frames (default 100)"
    )
    run.add_argument("--json", metavar="PATH", help="write the metrics records here")
    run.add_argument("--out", metavar="PATH", help="write the frames with the reuse mask here")
    run.add_argument("--anonymize", action="store_true",
                     help="with a detector (--model centerface) and --out: write the video with "
                          "the detected faces blurred instead")  # fmt: skip
    run.add_argument("--outputs", metavar="PATH",
                     help="several videos: each stream's outputs here (.npz)")  # fmt: skip
    _add_frame_size_args(run, "the video's own frame size: the model built for it, the "
                              "frames not resized")  # fmt: skip
    _add_size_args(run)

    bench = sub.add_parser(
        "bench",
        help="the paper's evaluation: models x videos x methods; or a benchmark program "
        "(dcjax bench PROGRAM --help)",
        usage="%(prog)s [options]\n       %(prog)s PROGRAM [program options]",
        description="The paper's evaluation: every model x video x method, optional sweeps.\n"
        "With a PROGRAM first, one of the benchmark programs instead, with options of\n"
        "its own (dcjax bench PROGRAM --help).",
        epilog="programs:\n" + "\n".join(f"  {name:<10} {what}" for name, what in PROGRAMS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    bench.add_argument("--frames", type=arguments.frames_int, default=100, help="frames per video")
    bench.add_argument(
        "--start",
        type=arguments.nonnegative_int,
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
        type=arguments.positive_int,
        default=[],
        metavar="B",
        help="DeepCache block sizes to sweep (Fig. 17)",
    )
    bench.add_argument(
        "--deltas",
        nargs="+",
        type=arguments.nonnegative_float,
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
    _add_frame_size_args(bench, "each video at its own frame size, not resized, with every "
                                "model built for it", what="every model")  # fmt: skip
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
        "--frames",
        type=arguments.frames_int,
        default=20,
        help="frames, the first 5 untimed (default 20)",
    )
    prof.add_argument("--json", metavar="PATH", help="write the profiles here")
    _add_frame_size_args(prof, "the video's own frame size: the model built for it, the "
                               "frames not resized")  # fmt: skip
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


def _keep_freed_memory() -> str | None:
    """`dcjax.allocator.keep_freed_memory` with the configured pad and
    `dcjax.allocator.run_on_calling_thread` (neither with a pad of 0); an error
    line, or None."""
    try:
        pad = allocator.configured_pad()
    except ValueError as e:
        return str(e)
    if pad:
        allocator.keep_freed_memory(pad)
        allocator.run_on_calling_thread()
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    error = _keep_freed_memory()  # before the first executable runs
    if error:
        print(error, file=sys.stderr)
        return 2
    if len(argv) >= 2 and argv[0] == "bench" and argv[1] in PROGRAMS:
        from dcjax import autotune

        def program() -> int:  # its --no-progress silences the kernel tuning's bars too
            with autotune.progress_bars("--no-progress" not in argv[2:]):
                return _program(argv[1]).main(argv[2:])

        return _interruptible(program)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "models":
        _use_compilation_cache()
    sub = _subparser(parser, args.command)
    if getattr(args, "cpus", None) is not None:
        _pin_cpus(sub, args.cpus)
    from dcjax.cli import evaluation, subcommands

    handler = {"demo": subcommands.demo_command, "run": subcommands.run_command,
               "bench": evaluation.bench_command, "models": subcommands.models_command,
               "profile": subcommands.profile_command}[args.command]  # fmt: skip
    from dcjax import autotune

    def run() -> int:
        with autotune.progress_bars(not getattr(args, "no_progress", False)):
            return handler(sub, args)

    return _interruptible(run)


def _program(name: str):
    import importlib

    return importlib.import_module(f"dcjax.bench.{name}")


def _interruptible(run) -> int:
    """``run()``'s exit status; Ctrl-C is one line and the shell's status for SIGINT."""
    try:
        return run()
    except KeyboardInterrupt as e:
        print(f"dcjax: interrupted{e.args[0] if e.args else ''}", file=sys.stderr)
        return 130


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
