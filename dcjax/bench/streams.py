"""Many streams at once: ``dcjax bench streams``.

    dcjax bench streams --model resnet50 --video vtest --streams 1 4 8

For each number of streams N, the N streams are one video at different time
offsets (stream i starts ``i * offset`` frames in), stepped together, and
five methods run on the same frames in one process, interleaved frame by
frame in an order drawn afresh each frame (seeded), so that no method always
runs right after the same one, after a warm-up that compiles each and then
calls every one once more, untimed (`dcjax.eval.interleaving`):

- ``plain``: ``jax.jit(model.apply)`` on the batch of N frames;
- ``dense``: dcjax's dense lowering (the ``nocache`` method) under
  ``jax.vmap`` over the N frames;
- ``deepcache``: `dcjax.streams.Streams` with staggered refreshes;
- ``deepcache_sync``: the same compiled step with every stream refreshing on
  the same frames (no stagger), for the latency it costs;
- ``deepcache_sequential``: the streams stepped one after the other by the
  model's own step (`dcjax.streams.Streams`' ``schedule="sequential"``),
  staggered.

Per method and N the records give ``mean_ms`` (the mean time of a step over
N: a frame's cost), ``throughput_fps`` (frames of all streams a second),
``p99_ms``, ``max_ms`` and ``step_mean_ms`` (a step's latency, which every
frame of the batch waits for), ``page_faults`` (a step's mean minor page
faults), ``step_ms`` (each timed step's milliseconds in
the clip's order, so that a slow step can be placed), ``speedup_vs_plain``
and ``speedup_vs_dense`` (ratios of mean times against the baselines at the
same N), and for the cached methods ``ideal_speedup`` (total FLOPs over the
FLOPs the streams' frames computed, from an untimed pass with statistics
over the same frames; the harness's key of the same name), the
``still_fraction`` (stream frames whose input was wholly reusable with no
motion), the ``refresh_fraction``, the ``top1_agreement`` with the dense
outputs and the ``plan`` the measured tuning chose, calibrated on the clip's
first frames (``"cached"``, ``"dense"``, ``"nocache"``; ``"prior"`` without
measurement). Records go to ``bench-results/streams.json``; ``--report PATH``
plots throughput against N.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dcjax.bench.arguments import (
    at_least,
    check_model,
    check_output,
    check_video,
    nonnegative_int,
    program_parser,
)
from dcjax.bench.common import (
    add_model_args,
    load_clip,
    machine,
    model_from_args,
    progress,
    table,
    warn_records,
    write_json,
)

__all__ = ["METHODS", "main", "run", "stream_clips"]

#: The methods measured at each number of streams.
METHODS = ("plain", "dense", "deepcache", "deepcache_sync", "deepcache_sequential")


def stream_clips(frames: np.ndarray, n: int, length: int, offset: int) -> np.ndarray:
    """(length, n, H, W, C): stream i is ``frames[i * step : i * step + length]``,
    with ``step`` the requested ``offset`` or less, so that every stream fits
    in the decoded frames."""
    if len(frames) < length:
        raise ValueError(f"dcjax: {len(frames)} frames decoded; {length} needed")
    step = offset if n == 1 else min(offset, (len(frames) - length) // (n - 1))
    return np.stack([frames[i * step : i * step + length] for i in range(n)], axis=1)


def _methods(spec, config) -> tuple[dict[str, Any], str]:
    """Per method ``(init(n), step(state, frames) -> (out, state, info))``, and
    the cached model's plan (`dcjax.eval.methods.tuning_dict`)."""
    import jax

    from dcjax.eval import methods

    module, variables, preprocess = spec.module, spec.variables, spec.preprocess
    plain = jax.jit(lambda v, f: module.apply(v, preprocess(f)))
    apply, leaves = methods.fast_apply(spec)
    dense = jax.jit(jax.vmap(apply, in_axes=(None, 0)))
    cached = methods.transform(spec, config)
    plan = methods.tuning_dict(cached)["plan"]
    by_n: dict[tuple[int, str], Any] = {}

    def streams(n, schedule):
        if (n, schedule) not in by_n:
            by_n[n, schedule] = cached.streams(n, schedule=schedule)
        return by_n[n, schedule]

    def cached_init(stagger, schedule="pooled"):
        return lambda n: streams(n, schedule).init(stagger=stagger)

    def cached_step(schedule="pooled"):
        return lambda state, frames: streams(frames.shape[0], schedule).step(state, frames)

    return {
        "plain": (lambda n: None, lambda s, f: (plain(variables, f), s, None)),
        "dense": (lambda n: None, lambda s, f: (dense(leaves, f), s, None)),
        "deepcache": (cached_init(True), cached_step()),
        "deepcache_sync": (cached_init(False), cached_step()),
        "deepcache_sequential": (
            cached_init(True, "sequential"),
            cached_step("sequential"),
        ),
    }, plan


def _statistics(spec, config, clips: np.ndarray) -> dict[str, np.ndarray]:
    """Per stream frame (T, N): FLOP ratio, still and refreshed, from an
    untimed pass with statistics, each stream stepped alone (streams are
    independent; the stagger only moves the refreshes)."""
    from dcjax.eval import methods

    cached = methods.transform(spec, dataclasses.replace(config, statistics=True))
    out = {"flops_ratio": [], "skipped": [], "refreshed": []}
    for i in range(clips.shape[1]):
        _, _, infos = cached.run(clips[:, i])
        for k in out:
            out[k].append(np.asarray(infos[k]))
    return {k: np.stack(v, axis=1) for k, v in out.items()}


def _agreement(a: np.ndarray, b: np.ndarray) -> float | None:
    """Top-1 agreement of two output stacks (…, classes), None for one output value."""
    if a.shape[-1] < 2:
        return None
    return float(np.mean(a.argmax(-1) == b.argmax(-1)))


def run(
    spec,
    frames: np.ndarray,
    *,
    streams: Sequence[int],
    length: int,
    offset: int = 25,
    config: Any = None,
    quiet: bool = True,
) -> list[dict[str, Any]]:
    """One record per method and number of streams (see the module docstring)."""
    import jax
    import jax.numpy as jnp

    from dcjax.eval import interleaving, methods
    from dcjax.eval.harness import calibrated
    from dcjax.eval.metrics import ratio_se

    if config is None:
        config = methods.deepcache_config({})
    config = dataclasses.replace(config, statistics=False)
    spec = calibrated(spec, frames)
    runners, plan = _methods(spec, config)
    clips_max = stream_clips(frames, max(streams), length, offset)
    stats = _statistics(spec, config, clips_max)
    records = []
    orders = interleaving.frame_orders(METHODS, length * len(streams))
    for n in streams:
        clips = jnp.asarray(stream_clips(frames, n, length, offset))
        times: dict[str, list[float]] = {m: [] for m in METHODS}
        faults: dict[str, list[int]] = {m: [] for m in METHODS}
        outs: dict[str, list[np.ndarray]] = {m: [] for m in METHODS}
        interleaving.warm_up(
            {m: (functools.partial(init, n), step) for m, (init, step) in runners.items()}, clips
        )
        states = {m: init(n) for m, (init, _) in runners.items()}
        for t in progress(range(length), desc=f"{n} streams", unit="frame", quiet=quiet):
            for m in next(orders):
                timed = interleaving.timed_step(runners[m][1], states[m], clips[t])
                out, states[m], _ = timed.result
                times[m].append(timed.seconds)
                faults[m].append(timed.faults)
                outs[m].append(np.asarray(jax.tree_util.tree_leaves(out)[0]))
        mean = {m: 1e3 * float(np.mean(v)) / n for m, v in times.items()}
        ratio = stats["flops_ratio"][:, :n]
        for m in METHODS:
            step_ms = 1e3 * np.asarray(times[m])
            rec = {
                "model": spec.name, "frame_shape": list(spec.frame_shape), "method": m,
                "streams": n, "frames": length, "mean_ms": mean[m],
                "throughput_fps": 1e3 / mean[m], "step_mean_ms": float(step_ms.mean()),
                "p99_ms": float(np.percentile(step_ms, 99)), "max_ms": float(step_ms.max()),
                "step_ms": [round(float(v), 3) for v in step_ms],
                "speedup_vs_plain": mean["plain"] / mean[m],
                "speedup_vs_dense": mean["dense"] / mean[m],
                "speedup_vs_dense_se": ratio_se(times["dense"], times[m]),
                "page_faults": float(np.mean(faults[m])),
            }  # fmt: skip
            if m.startswith("deepcache"):
                rec.update(
                    ideal_speedup=float(1.0 / max(ratio.mean(), 1e-9)),
                    still_fraction=float(stats["skipped"][:, :n].mean()),
                    refresh_fraction=float(stats["refreshed"][:, :n].mean()),
                    top1_agreement=_agreement(np.stack(outs[m]), np.stack(outs["dense"])),
                    kernel=config.kernel,
                    plan=plan,
                )
            records.append(rec)
    return records


def _rows(records: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    from dcjax.eval.metrics import speedup_cell

    def ideal(r):
        return f"{r['ideal_speedup']:.2f}x" if "ideal_speedup" in r else "-"

    return [
        {
            "N": str(r["streams"]),
            "method": r["method"],
            "mean ms": f"{r['mean_ms']:.1f}",
            "frames/s": f"{r['throughput_fps']:.1f}",
            "p99 ms": f"{r['p99_ms']:.0f}",
            "vs plain": f"{r['speedup_vs_plain']:.2f}x",
            "vs dense": speedup_cell(r["speedup_vs_dense"], r.get("speedup_vs_dense_se")),
            "ideal": ideal(r),
            "still": f"{100 * r['still_fraction']:.0f} %" if "still_fraction" in r else "-",
        }  # fmt: skip
        for r in records
    ]


def plot(records: Sequence[dict[str, Any]], path: str) -> None:
    """Throughput (frames/s of all streams) against the number of streams, per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for m in METHODS:
        rs = sorted((r for r in records if r["method"] == m), key=lambda r: r["streams"])
        ax.plot([r["streams"] for r in rs], [r["throughput_fps"] for r in rs], "o-", label=m)
    first = records[0]
    h, w = first["frame_shape"][:2]
    ax.set(xlabel="streams", ylabel="frames / s (all streams)")
    ax.set_title(f"{first['model']} at {h}x{w}")
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = program_parser("streams", __doc__)
    ap.add_argument("--model", default="resnet50", help="zoo model (default resnet50)")
    ap.add_argument("--video", default="vtest", help="video file or bundled clip name")
    ap.add_argument("--streams", type=at_least(1), nargs="+", default=[1, 4, 8],
                    help="numbers of streams (default 1 4 8)")  # fmt: skip
    ap.add_argument("--frames", type=at_least(3), default=40, help="frames per stream")
    ap.add_argument("--offset", type=at_least(1), default=25,
                    help="frames between stream starts (fewer if the video is short)")  # fmt: skip
    ap.add_argument("--start", type=nonnegative_int, default=0, help="frames to skip first")
    add_model_args(ap)
    ap.add_argument("--json", default=os.path.join("bench-results", "streams.json"))
    ap.add_argument("--report", metavar="PATH", help="plot of throughput against N (PNG)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    check_model(ap, "--model", args.model)
    path = check_video(ap, "--video", args.video, args.start, need=args.frames)
    check_output(ap, "--json", args.json)
    if args.report:
        check_output(ap, "--report", args.report)
    spec, _ = model_from_args(ap, args, path)
    need = args.frames + args.offset * (max(args.streams) - 1)
    frames = load_clip(path, spec.frame_shape, frames=need, start=args.start)
    if len(frames) < args.frames:
        ap.error(f"argument --video: {len(frames)} frames decoded, --frames {args.frames} needed")
    records = run(spec, frames, streams=args.streams, length=args.frames, offset=args.offset,
                  quiet=args.no_progress)  # fmt: skip
    print(table(_rows(records)))
    warn_records(records, lambda r: f"{r['method']} at {r['streams']} streams")
    write_json(args.json, {"machine": machine(), "video": args.video, "records": records})
    print(f"records: {args.json}")
    if args.report:
        plot(records, args.report)
        print(f"plot: {args.report}")
    return 0
