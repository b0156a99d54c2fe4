"""The subcommands ``dcjax demo``, ``dcjax run``, ``dcjax profile`` and ``dcjax models``.

Each takes its own parser (for one-line argument errors) and the parsed
arguments, checks what they name before any model loads
(`dcjax.bench.arguments`), and returns the exit status.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from dcjax.bench import arguments, common

__all__ = [
    "COLUMNS_NOTE",
    "PROFILE_WARMUP",
    "demo_command",
    "models_command",
    "nothing_sparse_note",
    "profile_command",
    "run_command",
]

#: Frames `dcjax profile` runs before it times.
PROFILE_WARMUP = 5


def _short_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    from dcjax.eval.report import SHORT_COLUMNS, summary_rows

    columns = SHORT_COLUMNS
    if any("box_f1" in r for r in records):  # a detector: its fidelity instead of top-1's
        columns = (*(c for c in columns if c != "top-1 agree"), "box F1", "boxes", "heat err")
    return [{k: row[k] for k in columns} for row in summary_rows(records)]


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
    return common.table(rows)


def _where_time_went(records: Sequence[dict[str, Any]]) -> str:
    from dcjax.eval.metrics import BASELINES

    lines = []
    for r in records:
        if r["method"] in BASELINES:
            continue
        parts = [
            f"{label} {r[key]:.1f} ms"
            for label, key in (
                ("refresh frames", "refresh_frame_ms"),
                ("other frames", "other_frame_ms"),
                ("a repeated frame", "static_frame_ms"),
            )
            if r.get(key) is not None
        ]
        lines.append(
            f"{r['variant']}: {', '.join(parts)} (means); dcjax dense "
            f"{r['dense_mean_ms']:.1f} ms, plain jax.jit ({r['plain_form']}) "
            f"{r['plain_mean_ms']:.1f} ms"
        )
    return "\n".join(["\nwhere the time goes:", *lines]) if lines else ""


#: What the columns of the command line's tables mean.
COLUMNS_NOTE = (
    "mean ms and fps over every frame (refresh and still frames included), matching "
    "included; vs plain / vs dense: ratios of mean times against jax.jit(model.apply) in "
    "its faster form (plain) and dcjax's own dense lowering (nocache), timed on the same "
    "frames, interleaved (vs dense ± its standard error from the paired frames); "
    "ideal = 1 / FLOPs fraction computed (still frames compute none); still = frames "
    "skipped whole."
)


def nothing_sparse_note(record: dict[str, Any]) -> str:
    """Why a cached method gained nothing on moving frames, when it computed
    every layer in full (per-layer ``sparse`` all false); else ``""``."""
    layers = record.get("per_layer") or []
    if not layers or any(lay.get("sparse") is not False for lay in layers):
        return ""
    import jax

    config = record.get("config", {})
    kernel, plan = config.get("kernel", "auto"), config.get("plan", "prior")
    if kernel != "auto":
        why = f'kernel="{kernel}" computes every layer in full'
    elif plan in ("dense", "nocache"):
        why = (
            f"timed on this machine ({jax.default_backend()}), no sparse plan beat the dense "
            f'step, so the step runs the "{plan}" plan (dcjax/autotune.py; cached.tuning)'
        )
    else:
        why = (
            f'kernel="auto" computes in full the layers too small or too thin for a sparse '
            f"kernel to pay on this backend ({jax.default_backend()}; dcjax/kernels/auto.py)"
        )
    if plan == "nocache":
        then = (
            "The cached step is then the dense step alone, without matching or the "
            "still-frame skip: as fast as not caching."
        )
    else:
        then = (
            "The cached step is then the network plus matching: it saves time only on frames "
            "that match whole (a still scene), whose last output it returns (the bundled clip "
            "box has many)."
        )
    return f"\nNo layer of {record['model']} is computed sparsely here: {why}. {then}"


def _input_size(sub, args, model: str, path: str, label: str) -> tuple[int, int] | None:
    """The frame size ``--size`` / ``--native`` ask for (None: neither), checked
    against the model before it loads."""
    size = arguments.input_size(args, path)
    if size is not None and args.native:
        arguments.check_input_size(sub, "--native", model, size, width=args.width,
                                source=f"{label} is {size[0]}x{size[1]}: ")  # fmt: skip
    elif size is not None:
        arguments.check_input_size(sub, "--size", model, size, width=args.width)
    return size


def models_command(sub: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from dcjax.eval.specs import zoo_table

    rows = zoo_table()
    print(common.table([
        {"model": r["name"], "input": "x".join(map(str, r["input_shape"])),
         "task": r["task"], "params": f"{r['params'] / 1e6:.2f}M",
         "conv GFLOPs": f"{r['conv_flops'] / 1e9:.3f}", "convs": str(r["convs"]),
         "pretrained": "yes" if r["pretrained"] else "no", "from": r["source"]}
        for r in rows
    ]))  # fmt: skip
    return 0


def demo_command(sub: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    arguments.check_model(sub, "--model", args.model)
    arguments.check_method(sub, "--method", args.method)
    path = arguments.check_video(sub, "--video", args.video)
    arguments.check_output(sub, "--out", args.out, "dir")
    if args.size is None:  # the demo runs at the clip's own size unless told
        args.native = True
    size = _input_size(sub, args, args.model, path, args.video)
    import numpy as np

    from dcjax import models, video
    from dcjax.eval import harness, plots, report

    fps = video.info(path).fps or 10.0
    spec, pretrained = common.load_spec(args.model, pretrained=not args.no_pretrained,
                                        width=args.width, fps=fps, input_size=size)  # fmt: skip
    frames = _load(path, spec, args, frames=args.frames)
    weights = "pretrained" if pretrained else "random-weight"
    print(f"dcjax demo: {weights} {args.model} on {args.video} ({len(frames)} frames at "
          f"{spec.frame_shape[0]}x{spec.frame_shape[1]}), without and with {args.method}; "
          "compiling and measuring kernels first (minutes on 2 cores)...", flush=True)  # fmt: skip
    with arguments.method_errors(sub, "--method"):
        ev = harness.evaluate(spec, frames, ["nocache", args.method], video_label=args.video,
                              progress=not args.no_progress)  # fmt: skip
    rec = ev.records[1]
    print()
    print(common.table(_short_rows(ev.records)))
    common.warn_records(ev.records)
    print(f"\n{rec['frames']} frames. {COLUMNS_NOTE}")
    if rec["top1_stability"] is not None and spec.boxes is None:
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
        note = nothing_sparse_note(rec)
        if note:
            print(note)
    if pretrained and ev.outputs["nocache"].shape[-1] == 1000:
        labels = models.imagenet_labels()
        top = np.bincount(ev.outputs["nocache"].reshape(len(frames), -1).argmax(-1)).argmax()
        print(f"\nmost frequent top-1 class (no cache): {labels[top]}")

    os.makedirs(args.out, exist_ok=True)
    written = [os.path.join(args.out, "report.html"), os.path.join(args.out, "metrics.json")]
    if spec.boxes is not None:
        blurred = os.path.join(args.out, "blurred.mp4")
        video.write(blurred, _blurred(frames, ev.boxes[args.method]), fps=fps)
        written.append(blurred)
        found = sum(len(b) for b in ev.boxes[args.method])
        print(f"\n{args.method} found {found} faces in {len(frames)} frames "
              f"(the uncached model {rec['reference_boxes']}); box F1 against the uncached "
              f"model's boxes {rec['box_f1']:.3f}, the heat map's largest error "
              f"{rec['heatmap_max_err']:.3f}")  # fmt: skip
    figures: dict[str, Any] = {}
    runner = ev.runners[args.method]
    if "matcher" in runner.config:
        masks = harness.input_masks(runner.config, frames, ev.infos[args.method]["refreshed"])
        picks = [int(i) for i in np.linspace(1, len(frames) - 1, 6).round()]
        figures["reuse_masks"] = plots.mask_strip(frames, masks, picks)
    figures["timeline"] = plots.timeline(ev.latencies_ms, ev.infos)
    common.write_json(os.path.join(args.out, "metrics.json"), ev.records)
    html_path = os.path.join(args.out, "report.html")
    report.write_report(
        html_path, ev.records, figures=figures,
        title=f"dcjax demo: {args.model} on {args.video}",
        intro=f"{weights} {args.model}, {len(frames)} frames; reuse masks: green = reused "
              "input pixels, red = recomputed.",
    )  # fmt: skip
    print(f"\nwrote {', '.join(written)}")
    return 0


def run_command(sub: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if len(args.video) > 1:
        from dcjax.cli.streams_run import streams_run_command

        return streams_run_command(sub, args)
    args.video = args.video[0]
    if args.outputs:
        sub.error("argument --outputs: with several videos only (one video: --json, --out)")
    arguments.check_model(sub, "--model", args.model)
    arguments.check_method(sub, "--method", args.method)
    path = arguments.check_video(sub, "VIDEO", args.video, args.start)
    arguments.check_output(sub, "--json", args.json)
    arguments.check_output(sub, "--out", args.out, "video")
    if args.anonymize and not args.out:
        sub.error("argument --anonymize: needs --out (the video to write)")
    size = _input_size(sub, args, args.model, path, args.video)
    from dcjax import video
    from dcjax.eval import harness

    fps = video.info(path).fps or 10.0
    spec, _ = common.load_spec(args.model, pretrained=args.pretrained, width=args.width, fps=fps,
                               input_size=size)  # fmt: skip
    if args.anonymize and spec.boxes is None:
        sub.error(f"argument --anonymize: {args.model} finds no boxes; use a detector "
                  "(--model centerface)")  # fmt: skip
    frames = _load(path, spec, args, frames=args.frames, start=args.start)
    print(f"{args.model} on {args.video}: {len(frames)} frames from frame {args.start} at "
          f"{spec.frame_shape[0]}x{spec.frame_shape[1]}, nocache and {args.method}",
          flush=True)  # fmt: skip
    with arguments.method_errors(sub, "--method"):
        ev = harness.evaluate(spec, frames, ["nocache", args.method], video_label=args.video,
                              progress=not args.no_progress)  # fmt: skip
    print(common.table(_short_rows(ev.records)))
    common.warn_records(ev.records)
    if args.json:
        common.write_json(args.json, ev.records)
        print(f"wrote {args.json}")
    if args.out and args.anonymize:
        video.write(args.out, _blurred(frames, ev.boxes[args.method]), fps=fps)
        n = sum(len(b) for b in ev.boxes[args.method])
        print(f"wrote {args.out} ({n} face boxes blurred over {len(frames)} frames)")
    elif args.out:
        runner = ev.runners[args.method]
        masks = (
            harness.input_masks(runner.config, frames, ev.infos[args.method]["refreshed"])
            if "matcher" in runner.config
            else None
        )
        video.write(args.out, _annotate(frames, masks), fps=fps)
        print(f"wrote {args.out}")
    return 0


def profile_command(sub: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    arguments.check_model(sub, "--model", args.model)
    for m in args.methods:
        arguments.check_method(sub, "--methods", m)
    if args.frames <= PROFILE_WARMUP:
        sub.error(f"argument --frames: needs more than {PROFILE_WARMUP} (those are untimed)")
    path = arguments.check_video(sub, "VIDEO", args.video, args.start, need=PROFILE_WARMUP + 1)
    arguments.check_output(sub, "--json", args.json)
    size = _input_size(sub, args, args.model, path, args.video)
    from dcjax.eval import harness, methods, profile, registry

    spec, _ = common.load_spec(args.model, pretrained=args.pretrained, width=args.width, fps=10.0,
                               input_size=size)  # fmt: skip
    frames = _load(path, spec, args, frames=args.frames, start=args.start)
    spec = harness.calibrated(spec, frames)  # the plan that bench and run would race to
    results, plans, labels = [], {}, {}
    todo = common.progress(args.methods, desc=f"profiling {args.model}", unit="method",
                           quiet=args.no_progress)  # fmt: skip
    for spec_text in todo:
        with arguments.method_errors(sub, "--methods"):
            runner = registry.make_runner(spec, *registry.parse_method(spec_text))
        if runner.cached is not None:  # the plan the race kept, as bench records it
            plans[spec_text] = methods.tuning_dict(runner.cached)
            tuning = runner.cached.tuning
            labels[spec_text] = "plan prior" if tuning is None else tuning.label
        runner = runner.timed() if runner.timed is not None else runner  # what bench times
        try:
            results.append((spec_text, profile.profile(runner, frames, warmup=PROFILE_WARMUP)))
        except ValueError as e:
            sub.error(f"argument --methods: {e}")
    print(_profile_table(results))
    for m, label in labels.items():
        print(f"{m}: {label}")
    if args.json:
        shape = [int(d) for d in spec.frame_shape]
        out = [{"model": args.model, "video": args.video, "method": m, "frame_shape": shape,
                **({"tuning": plans[m]} if m in plans else {}), **p.as_dict()}
               for m, p in results]  # fmt: skip
        common.write_json(args.json, out)
        print(f"wrote {args.json}")
    return 0


def _load(path: str, spec, args: argparse.Namespace, *, frames: int, start: int = 0):
    """The frames at the model's frame size; with ``--native`` decoded as stored
    (``spec`` was built for the video's size), not resized."""
    shape = None if args.native else spec.frame_shape
    return common.load_clip(path, shape, frames=frames, start=start)


def _profile_table(results) -> str:
    """One row per group, one column of ms a frame per method, then the totals."""
    from dcjax.eval import profile

    rows = profile.table_rows([(m, p.as_dict()) for m, p in results])
    return f"{common.table(rows)}\n{profile.TABLE_NOTE}"


def _even(frames):
    """Frames cropped to even heights and widths (what H.264 encodes)."""
    return frames[:, : frames.shape[1] // 2 * 2, : frames.shape[2] // 2 * 2]


def _blurred(frames, boxes):
    """Frames (cropped to even sizes) with each box's pixels replaced by a
    strong blur (a box filter a third of the box's size, twice), as an
    anonymiser does."""
    import numpy as np
    from scipy import ndimage

    out = _even(frames).copy()
    h, w = out.shape[1:3]
    for frame, frame_boxes in zip(out, boxes, strict=True):
        for x1, y1, x2, y2 in np.round(np.asarray(frame_boxes)).astype(int):
            x1, y1, x2, y2 = max(x1, 0), max(y1, 0), min(x2, w), min(y2, h)
            if x2 <= x1 or y2 <= y1:
                continue
            size = max(3, min(y2 - y1, x2 - x1) // 3)
            patch = frame[y1:y2, x1:x2].astype(np.float32)
            for _ in range(2):
                patch = ndimage.uniform_filter(patch, size=(size, size, 1), mode="nearest")
            frame[y1:y2, x1:x2] = patch.clip(0, 255).astype(np.uint8)
    return out


def _annotate(frames, masks):
    """Frames (cropped to even sizes) with reused pixels tinted green, recomputed red."""
    import numpy as np

    out = _even(frames).astype(np.float32)
    if masks is not None:
        m = masks[:, : out.shape[1], : out.shape[2], None]
        tint = np.where(m, np.float32([0, 200, 0]), np.float32([230, 0, 0]))
        out = 0.7 * out + 0.3 * tint
    return out.clip(0, 255).astype(np.uint8)
