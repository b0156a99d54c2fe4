"""The reuse ceiling of a zoo model on a video: ``dcjax bench ceiling``.

    dcjax bench ceiling --model efficientnet_lite0 --video vtest
    dcjax bench ceiling --model mobilenet_v2 --video vtest.avi --native

At the model's published input size, or ``--size HxW`` / ``--native`` (the
video's own). Runs every setting of a sweep of PSNR thresholds, ``RefineConfig.delta``
values and refinement layer rules (a ``delta`` of 0 is plain DeepCache) over
the same frames with every reuse taken (`dcjax.eval.ceiling.reuse_ceiling`,
``kernel="reference"``), prints each setting's ideal speedup against its
fidelity and the best setting at ``--target`` top-1 agreement
(`dcjax.eval.ceiling.best`: no kernel can make a setting faster than its
ideal), and writes the records as JSON (``bench-results/ceiling.json`` by
default).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from dcjax.bench.arguments import (
    at_least,
    check_model,
    check_video,
    nonnegative_float,
    nonnegative_int,
    number,
    program_parser,
)
from dcjax.bench.common import add_model_args, cell, load_clip, model_from_args, table, write_json
from dcjax.eval.ceiling import best, reuse_ceiling, sweep_configs

__all__ = ["main"]

_threshold = number(float, lambda v: v > 0, "must be a positive number of dB")
_target = number(float, lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]")


def _rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The printed table's rows."""
    return [
        {
            "setting": r["label"],
            "ideal": cell(r["ideal_speedup"], ".2f", "x"),
            "ideal (reuse frames)": cell(r["ideal_speedup_reuse"], ".2f", "x"),
            "input reuse": cell(100 * r["input_reuse"], ".1f") + " %",
            "top-1": "-" if r["top1_agreement"] is None else f"{100 * r['top1_agreement']:.1f} %",
            "rel MSE": cell(r["output_rel_mse"], ".2e"),
        }
        for r in records
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """``dcjax bench ceiling``; returns the exit status (bad arguments exit with status 2)."""
    ap = program_parser("ceiling", __doc__)
    ap.add_argument("--model", default="efficientnet_lite0", help="zoo model")
    add_model_args(ap)
    ap.add_argument("--video", default="vtest", help="video file or bundled clip name")
    ap.add_argument("--frames", type=at_least(2), default=80, help="frames (default 80)")
    ap.add_argument("--start", type=nonnegative_int, default=0, help="frames to skip first")
    ap.add_argument("--thresholds", type=_threshold, nargs="+", default=[20.0],
                    help="PSNR thresholds in dB (default 20; inf never reuses)")  # fmt: skip
    ap.add_argument("--deltas", type=nonnegative_float, nargs="+", default=[0.0, 0.05],
                    help="refinement deltas (0: plain DeepCache; default 0 0.05)")  # fmt: skip
    ap.add_argument("--layers", choices=("auto", "all"), nargs="+", default=["auto"],
                    help="refinement layer rules (default auto)")  # fmt: skip
    ap.add_argument("--target", type=_target, default=0.97,
                    help="top-1 agreement the best setting must keep (default 0.97)")  # fmt: skip
    ap.add_argument("--out", default=os.path.join("bench-results", "ceiling.json"))
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    check_model(ap, "--model", args.model)
    path = check_video(ap, "--video", args.video, args.start)
    spec, want = model_from_args(ap, args, path)
    # a video that breaks part way runs on the frames decoded before the break
    frames = load_clip(path, spec.frame_shape, frames=args.frames, start=args.start)
    weights = "pretrained" if want else "random-weight"
    h, w = spec.frame_shape[:2]
    print(f"{weights} {args.model} at {h}x{w} over {len(frames)} frames of {args.video} "
          f"from frame {args.start}, every reuse taken (kernel='reference')")  # fmt: skip
    configs = sweep_configs(args.thresholds, args.deltas, args.layers)
    records = reuse_ceiling(
        spec.module, spec.variables, frames, configs, preprocess=spec.preprocess,
        progress=not args.no_progress and sys.stderr.isatty(),
    )  # fmt: skip
    for r in records:
        r.update(
            model=args.model, video=args.video, pretrained=bool(want), start=args.start,
            width=args.width, frame_shape=list(spec.frame_shape),
        )  # fmt: skip
    print(table(_rows(records)))
    top = best(records, args.target)
    if records[0]["top1_agreement"] is None:
        print("the output is not class scores: no top-1 agreement (compare rel MSE)")
    elif top is None:
        print(f"no setting keeps {100 * args.target:.0f} % top-1 agreement")
    else:
        print(f"best at >= {100 * args.target:.0f} % top-1 agreement: {top['label']}, "
              f"ideal {top['ideal_speedup']:.2f}x")  # fmt: skip
    write_json(args.out, records)
    print(f"wrote {args.out}")
    return 0
