"""The cost floor of a cached step: ``dcjax bench floor``.

    dcjax bench floor --model centerface --video vtest.avi --native \\
        --methods deepcache+refine:delta=0.01,max_pixel_change=0.1

A cached step pays on every frame it computes, whatever changed: the
matcher, the masks, each sparse layer's tile lists, gathers and scatters,
the layers it computes in full, and the dispatch of its operations. This
program measures that cost where almost nothing changes: one frame of the
video, with a small square inverted at a place that moves every frame
(`near_still`), so that each frame differs from the one before in two
squares and the still-frame skip never applies. The methods, dcjax's dense
step and plain ``jax.jit`` step over the same frames, interleaved
(`dcjax.eval.harness.evaluate`). Per method (`floor_summary`):

- ``floor_ms``: the mean step time over the frames neither refreshed nor
  skipped (``floor_frames`` of them), and
  ``floor_flops_ratio``: the FLOPs those frames computed, against a full
  recompute (``floor_ideal``: its inverse);
- ``ceiling``: the dense step's mean over the same frames / ``floor_ms``,
  with its standard error (`dcjax.eval.metrics.ratio_se`). No clip in which
  every frame changes at least this much takes the method further beside the
  dense step on this machine: it computes more on top of the floor. (Still
  frames, which the step skips, and changes the matcher lets pass cost less.)

The record's ``refresh_frame_ms`` is the refreshed frames' mean time and
``speedup_vs_dense`` the clip's, refreshes included; ``step_ms``,
``dense_step_ms`` and ``refreshed`` are the per-frame figures the floor is
taken from.

A plan that recomputes every frame (the race's ``nocache``) has no floor
frames: its floor is the dense step's.

The records (those of ``dcjax bench``, with the fields above, ``clip``
(``"near_still"``), ``start`` and ``square`` added) are written as JSON
(``bench-results/floor.json`` by default).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dcjax.bench.arguments import (
    at_least,
    check_method,
    check_model,
    check_output,
    check_video,
    message,
    method_errors,
    nonnegative_int,
    program_parser,
)
from dcjax.bench.common import (
    DEMO_METHOD,
    add_model_args,
    cell,
    load_clip,
    machine,
    model_from_args,
    table,
    warn_records,
    write_json,
)
from dcjax.eval import metrics

__all__ = ["DEFAULT_METHODS", "FLOOR_KEYS", "floor_summary", "main", "near_still", "square_at"]

#: What the program measures when no ``--methods`` are given: the demo's method.
DEFAULT_METHODS = (DEMO_METHOD,)

#: The fields `floor_summary` adds to a record.
FLOOR_KEYS = (
    "floor_frames",
    "floor_ms",
    "floor_dense_ms",
    "ceiling",
    "ceiling_se",
    "floor_flops_ratio",
    "floor_ideal",
)


def near_still(frame: np.ndarray, count: int, size: int) -> np.ndarray:
    """``count`` frames of ``frame``: the first as it is, each later one with
    a ``size`` x ``size`` square inverted (``255 - x``) at a place of its own
    (`square_at`), so that frame 1 differs from frame 0 inside its square and
    each later frame from the one before inside the squares of both, and
    nowhere else: consecutive squares never overlap.

    Raises:
        ValueError: ``frame`` is not a uint8 ``(H, W, C)`` array, ``count`` is
            under 2, or the square does not fit three times across the frame.
    """
    frame = np.asarray(frame)
    if frame.ndim != 3 or frame.dtype != np.uint8:
        raise ValueError(
            f"dcjax: near_still needs a uint8 (H, W, C) frame, got {frame.dtype} {frame.shape}"
        )
    if count < 2:
        raise ValueError(f"dcjax: near_still needs at least 2 frames, got {count}")
    h, w = frame.shape[:2]
    if size < 1 or 3 * size > min(h, w):
        raise ValueError(
            f"dcjax: a square of {size} pixels does not fit three times across a "
            f"{h}x{w} frame; take a size from 1 to {min(h, w) // 3}"
        )
    out = np.repeat(frame[None], count, axis=0)
    for t in range(1, count):
        y, x = square_at(t, size, (h, w))
        out[t, y : y + size, x : x + size] = 255 - out[t, y : y + size, x : x + size]
    return out


def square_at(t: int, size: int, shape: Sequence[int]) -> tuple[int, int]:
    """The top-left corner of `near_still`'s square in frame ``t`` (t >= 1),
    for a frame of ``shape`` (H, W, ...) at least three squares across: along
    each axis, the places ``size`` pixels apart (at least three), stepped
    through by the smallest stride from a third of their count up that is
    coprime with it, so that every place comes round and the corners of
    consecutive squares are at least ``size`` pixels apart on both axes."""
    corner = []
    for extent in shape[:2]:
        places = (extent - size) // size + 1  # corners 0, size, 2 size, ... that fit
        stride = next(s for s in range(max(1, places // 3), places + 1) if np.gcd(s, places) == 1)
        corner.append(((t - 1) * stride) % places * size)
    return corner[0], corner[1]


def floor_summary(
    latencies_ms: Sequence[float],
    dense_latencies_ms: Sequence[float],
    infos: Mapping[str, np.ndarray],
) -> dict[str, Any]:
    """The `FLOOR_KEYS` of one method, from its per-frame step times, the dense
    step's over the same frames, and its per-frame infos (``refreshed``,
    ``flops_ratio``, and ``skipped`` where it has it).

    The floor frames are those neither refreshed nor skipped; where there are
    none (a method that recomputes every frame), ``floor_frames`` is 0 and the
    other fields are None.

    Raises:
        ValueError: the times or the infos are not of the same frames.
    """
    ms = np.asarray(latencies_ms, np.float64)
    dense = np.asarray(dense_latencies_ms, np.float64)
    if ms.shape != dense.shape or ms.ndim != 1:
        raise ValueError(
            f"dcjax: floor_summary needs per-frame times of the same frames, got {ms.shape} "
            f"and {dense.shape}"
        )
    refreshed = np.asarray(infos["refreshed"], bool).reshape(-1)
    skipped = np.asarray(infos.get("skipped", np.zeros_like(refreshed)), bool).reshape(-1)
    if refreshed.shape != ms.shape or skipped.shape != ms.shape:
        raise ValueError(
            f"dcjax: floor_summary got {ms.size} frame times and infos of {refreshed.size}"
        )
    floor = ~refreshed & ~skipped
    out: dict[str, Any] = dict.fromkeys(FLOOR_KEYS)
    out["floor_frames"] = int(floor.sum())
    if not floor.any():
        return out
    floor_ms = float(ms[floor].mean())
    dense_ms = float(dense[floor].mean())
    ratio = np.asarray(infos["flops_ratio"], np.float64).reshape(-1)[floor]
    flops = float(ratio.mean()) if np.isfinite(ratio).all() else None
    out.update(
        floor_ms=floor_ms,
        floor_dense_ms=dense_ms,
        ceiling=dense_ms / floor_ms,
        ceiling_se=metrics.ratio_se(dense[floor], ms[floor]),
        floor_flops_ratio=flops,
        floor_ideal=None if not flops else 1.0 / flops,
    )
    return out


def _rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The printed table's rows: the methods, not the baselines."""
    return [
        {
            "method": r["variant"],
            "plan": str(r["config"].get("plan", "-")),
            "floor ms": cell(r["floor_ms"], ".1f"),
            "dense ms": cell(r["floor_dense_ms"], ".1f"),
            "ceiling": "-"
            if r["ceiling"] is None
            else metrics.speedup_cell(r["ceiling"], r["ceiling_se"]),
            "ideal": cell(r["floor_ideal"], ".1f", "x"),
            "refresh ms": cell(r["refresh_frame_ms"], ".1f"),
            "mean": metrics.speedup_cell(r["speedup_vs_dense"], r["speedup_vs_dense_se"]),
        }
        for r in records
    ]


def _notes(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """A line for each method with no floor frames: its plan recomputed every frame."""
    return [
        f"{r['variant']} recomputed every frame (plan {r['config'].get('plan', '-')}): its "
        "floor is the dense step's"
        for r in records
        if not r["floor_frames"]
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """``dcjax bench floor``; returns the exit status (bad arguments exit with status 2)."""
    ap = program_parser("floor", __doc__)
    ap.add_argument("--model", default="centerface", help="zoo model (default centerface)")
    ap.add_argument("--video", default="vtest", help="video file or bundled clip name")
    ap.add_argument("--start", type=nonnegative_int, default=0,
                    help="the frame the clip is made of (default 0)")  # fmt: skip
    ap.add_argument("--frames", type=at_least(3), default=40,
                    help="frames stepped and timed (default 40)")  # fmt: skip
    ap.add_argument("--square", type=at_least(1), default=16,
                    help="side of the square inverted in each frame (default 16)")  # fmt: skip
    ap.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS),
                    help="method specs (default: the demo's)")  # fmt: skip
    add_model_args(ap)
    ap.add_argument("--json", default=os.path.join("bench-results", "floor.json"))
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    from dcjax import video
    from dcjax.eval import harness, registry

    check_model(ap, "--model", args.model)
    for m in args.methods:
        check_method(ap, "--methods", m)
    if all(registry.parse_method(m)[0] in metrics.BASELINES for m in args.methods):
        ap.error(f"argument --methods: {' and '.join(metrics.BASELINES)} always run as the "
                 "baselines; name a method to measure, e.g. deepcache")  # fmt: skip
    path = check_video(ap, "--video", args.video, args.start, need=1)
    check_output(ap, "--json", args.json)
    spec, pretrained = model_from_args(ap, args, path, fps=video.info(path).fps or 10.0)
    base = np.asarray(load_clip(path, spec.frame_shape, frames=1, start=args.start))[0]
    try:
        frames = near_still(base, args.frames, args.square)
    except ValueError as e:
        ap.error(f"argument --square: {message(e)}")
    h, w = spec.frame_shape[:2]
    print(f"{'pretrained' if pretrained else 'random-weight'} {args.model} at {h}x{w}: frame "
          f"{args.start} of {args.video}, a {args.square}-pixel square inverted at a new place "
          f"in each of {args.frames} frames")  # fmt: skip
    with method_errors(ap, "--methods"):
        ev = harness.evaluate(spec, frames, args.methods, video_label=args.video,
                              progress=not args.no_progress)  # fmt: skip
    dense = ev.latencies_ms["nocache"]
    records = []
    for r in ev.records:
        if r["method"] in metrics.BASELINES:
            continue
        ms, infos = ev.latencies_ms[r["variant"]], ev.infos[r["variant"]]
        r.update(floor_summary(ms, dense, infos))
        r.update(
            clip="near_still", start=args.start, square=args.square, pretrained=bool(pretrained),
            step_ms=[float(x) for x in ms], dense_step_ms=[float(x) for x in dense],
            refreshed=[bool(x) for x in np.asarray(infos["refreshed"]).reshape(-1)],
        )  # fmt: skip
        records.append(r)
    print(table(_rows(records)))
    print("floor: mean ms of the frames neither refreshed nor skipped; ceiling: the dense "
          "step's mean on those frames / floor; ideal: 1 / their FLOP ratio; mean: the clip's "
          "speedup over the dense step, refreshes included")  # fmt: skip
    for line in _notes(records):
        print(line)
    warn_records(records, lambda r: r["variant"])
    write_json(args.json, {"machine": machine(), "records": records})
    print(f"records: {args.json}")
    return 0
