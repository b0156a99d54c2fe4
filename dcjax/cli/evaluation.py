"""``dcjax bench`` with no program: the paper's evaluation (Section 7).

Every model x video x method, optional sweeps (`dcjax.bench.evaluation.run_bench`),
at each model's published input size, at ``--size``, or with ``--native`` at
each video's own size (checked against every model first);
each record is written to the JSON as it comes, with the machine's CPU count and
``XLA_FLAGS``; a summary table is printed and, with ``--report``, the HTML
report written. Ctrl-C says how many records are kept and where (and writes
their report, marked as interrupted).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

from dcjax.bench import arguments, common

__all__ = ["bench_command"]


def bench_command(sub: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from dcjax.bench import evaluation
    from dcjax.eval import report

    model_names = args.models or [*evaluation.PAPER_MODELS, "efficientnet_lite0"]
    for m in model_names:
        arguments.check_model(sub, "--models", m)
    methods = args.methods or list(evaluation.DEFAULT_METHODS)
    for m in methods:
        arguments.check_method(sub, "--methods", m)
    paths = [arguments.check_video(sub, "--videos", v, args.start) for v in args.videos]
    _check_input_sizes(sub, args, model_names, paths)
    arguments.check_output(sub, "--json", args.json)
    arguments.check_output(sub, "--report", args.report)
    matchers = args.matchers
    if matchers is not None:
        matchers = matchers or list(evaluation.DEFAULT_MATCHERS)
        for m in matchers:
            if m not in evaluation.DEFAULT_MATCHERS:
                sub.error(f"argument --matchers: unknown matcher {m!r}; choose from "
                          f"{', '.join(evaluation.DEFAULT_MATCHERS)}")  # fmt: skip
    pretrained = {"auto": "auto", "yes": True, "no": False}[args.pretrained]
    records: list[dict[str, Any]] = []
    host = common.machine()  # after --cpus pinned the process
    cpus, xla_flags = host["cpus"], host["xla_flags"]
    # what moves the baselines: cores, XLA:CPU's library choice, the allocator
    conditions = {k: host[k] for k in ("cpus", "xla_flags", "memory")}

    def keep(record: dict[str, Any]) -> None:
        record.update(conditions)
        records.append(record)
        common.write_json(args.json, records)  # partial results survive an interrupt

    truncated: set[str | None] = set()

    def warn_once(error: Any, kept: int) -> None:  # each model decodes each video
        if error.path not in truncated:
            truncated.add(error.path)
            common.warn_truncated(error, kept)

    def report_to(records: list, note: str = "") -> str:
        intro = (
            f"{cpus} CPU core(s) of this machine, JAX {host['jax']} on "
            f"{host['backend']}; medians per frame with matching included."
            + (f" XLA_FLAGS={xla_flags}." if xla_flags else "")
            + f" Memory: {host['memory']}."
            + note
        )
        report.write_report(args.report, records, matcher_rows=matcher_rows,
                            title="dcjax bench", intro=intro)  # fmt: skip
        return args.report

    matcher_rows: list = []
    interrupted = " Interrupted: the records made before the interruption only."
    with (
        arguments.method_errors(sub, "--methods"),
        _saying_what_is_kept(
            records, args.json, (lambda r: report_to(r, interrupted)) if args.report else None
        ),
    ):
        records_out, matcher_rows = evaluation.run_bench(
            model_names, args.videos, methods, frames=args.frames, start=args.start,
            pretrained=pretrained,
            width=args.width, thresholds=args.thresholds, blocks=args.blocks,
            deltas=args.deltas,
            matchers=matchers or (), progress=not args.no_progress, on_record=keep,
            profile=args.profile, on_truncated=warn_once,
            input_size="native" if args.native else args.size,
        )  # fmt: skip
    for record in records_out:  # the same, for records not passed to `keep`
        record.update(conditions)
    common.write_json(args.json, records_out)
    if matcher_rows:
        common.write_json(os.path.splitext(args.json)[0] + ".matchers.json", matcher_rows)
    print(common.table([
        {k: row[k] for k in ("model", "video", *report.SHORT_COLUMNS, "cache MiB")}
        for row in report.summary_rows(records_out)
    ]))  # fmt: skip
    common.warn_records(records_out, lambda r: f"{r['model']} {r['video']} {r['method']}")
    print(f"wrote {args.json}")
    if args.report:
        print(f"wrote {report_to(records_out)}")
    return 0


def _check_input_sizes(
    sub: argparse.ArgumentParser, args: argparse.Namespace, models: list[str], paths: list[str]
) -> None:
    """Every model takes the frame size it will run at: ``--size``, or with
    ``--native`` each video's own (checked before any model loads)."""
    if args.size is not None:
        for m in models:
            arguments.check_input_size(sub, "--size", m, args.size, width=args.width)
    elif args.native:
        from dcjax import video

        sizes: dict[tuple[int, int], str] = {}  # each size once, named by its first video
        for p, v in zip(paths, args.videos, strict=True):
            sizes.setdefault(tuple(video.info(p).size), v)
        for m in models:
            for (h, w), v in sizes.items():
                arguments.check_input_size(sub, "--native", m, (h, w), width=args.width,
                                        source=f"{v} is {h}x{w}: ")  # fmt: skip


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
                kept += f" (no report: {type(e).__name__}: {arguments.message(e)})"
        raise KeyboardInterrupt(kept) from None
