"""``dcjax run A.mp4 B.mp4 ... --model M``: several videos as streams of one batch.

Contract: every video is decoded at one frame size (the model's, ``--size``,
or with ``--native`` their common own size: videos of different sizes are an
error naming them), and stepped together through `dcjax.streams.Streams` (the
``deepcache`` method's options, from ``--method``) or, with ``--method
adaptive``, through `dcjax.switching.AdaptiveStreams` (measured plans switched
at run time by the streams' dirty fractions; every switch is printed and
counted per stream), beside dcjax's dense lowering of the same batch
(``nocache``), interleaved frame by frame. The model is tuned on the first
video's first frames, and the streams' schedule (`dcjax.streams.SCHEDULES`)
raced on them; the schedule is printed and recorded. A video
that ends early is finished: from then on its stream gets its last frame
again (a still frame, which contributes no tiles) and its outputs are not
kept, and the other streams go on. Prints one summary row per stream (frames,
refreshes, still frames, input reuse, top-1 agreement with the dense outputs)
and the batch's mean time a frame against the dense step; ``--json`` writes
the per-stream records and ``--outputs`` an ``.npz`` with each stream's
outputs (the model's first output leaf, one row a frame).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from dcjax.bench import arguments, common

__all__ = ["streams_run_command"]


#: The methods several videos run as streams of (``--method``).
STREAM_METHODS = ("deepcache", "adaptive")


def _method(sub: argparse.ArgumentParser, spec_text: str) -> tuple[str, Any]:
    """The method's name and its checked options (`_streams` resolves them for
    the model: ``guard`` names the model's score map)."""
    from dcjax.eval import methods, registry, switching_method

    name, options = registry.parse_method(spec_text)
    if name not in STREAM_METHODS:
        sub.error(f"argument --method: several videos run as streams of "
                  f"{' or '.join(STREAM_METHODS)} only, got {name!r}")  # fmt: skip
    arguments.check_method(sub, "--method", spec_text)
    with arguments.method_errors(sub, "--method"):
        if name == "deepcache":
            methods.deepcache_config(options)
        else:
            switching_method.adaptive_options(options)
    return name, options


def _streams(
    sub: argparse.ArgumentParser, name: str, options: Any, spec: Any, n: int, progress: bool
) -> Any:
    """The `Streams` (or `AdaptiveStreams`) of ``n`` streams of the method."""
    from dcjax.eval import methods, switching_method

    # a guard on a model without a score map, say
    with arguments.method_errors(sub, "--method", ValueError):
        if name == "deepcache":
            config = methods.deepcache_config(options, spec)
        else:
            adaptive_options = switching_method.adaptive_options(options, spec)
    if name == "deepcache":
        return methods.transform(spec, config).streams(n)
    adaptive = switching_method.build_adaptive(spec, *adaptive_options, progress=progress)
    print(f"plans: {len(adaptive.models)}, from input dirty fractions "
          f"{', '.join(f'{v:g}' for v in adaptive.levels)}", flush=True)  # fmt: skip
    return adaptive.streams(n)


def _size(sub, args, paths: list[str]) -> tuple[int, int] | None:
    """The one frame size every stream runs at (None: the model's own)."""
    if not args.native:
        return None if args.size is None else tuple(args.size)
    from dcjax import video

    sizes = {p: video.info(p).size for p in paths}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{os.path.basename(p)} {h}x{w}" for p, (h, w) in sizes.items())
        sub.error(f"argument --native: the videos have different frame sizes ({listed}); "
                  "streams of one batch share one size: pass --size HxW")  # fmt: skip
    return next(iter(sizes.values()))


def streams_run_command(sub: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import jax

    from dcjax.eval import methods
    from dcjax.eval.harness import calibrated

    arguments.check_model(sub, "--model", args.model)
    name, options = _method(sub, args.method)
    if args.out:
        sub.error("argument --out: one video only; with several, use --outputs PATH.npz")
    paths = [arguments.check_video(sub, "VIDEO", v, args.start) for v in args.video]
    arguments.check_output(sub, "--json", args.json)
    arguments.check_output(sub, "--outputs", args.outputs)
    size = _size(sub, args, paths)
    if size is not None:
        arguments.check_input_size(sub, "--size", args.model, size, width=args.width)
    spec, _ = common.load_spec(args.model, pretrained=args.pretrained, width=args.width, fps=10.0,
                               input_size=size)  # fmt: skip
    clips = [common.load_clip(p, spec.frame_shape, frames=args.frames, start=args.start)
             for p in paths]  # fmt: skip
    lengths = [len(c) for c in clips]
    n, total = len(clips), max(lengths)
    h, w = spec.frame_shape[:2]
    print(f"{args.model} on {n} videos as streams of one batch at {h}x{w}: "
          f"{', '.join(str(k) for k in lengths)} frames", flush=True)  # fmt: skip
    spec = calibrated(spec, clips[0])  # tune and race on the first video's first frames
    streams = _streams(sub, name, options, spec, n, progress=not args.no_progress)
    raced = streams.raced or {}
    print(f"schedule: {streams.schedule}"
          + ("" if not raced else " (raced: " + ", ".join(
              f"{k} {1e3 * v:.1f} ms a step" for k, v in raced.items()) + ")"),
          flush=True)  # fmt: skip
    apply, leaves = methods.fast_apply(spec)
    dense = jax.jit(jax.vmap(apply, in_axes=(None, 0)))

    def batch(t: int) -> np.ndarray:  # a finished video repeats its last frame
        return np.stack([c[min(t, len(c) - 1)] for c in clips])

    states = streams.init()
    out, _, _ = streams.step(streams.init(), batch(0))  # compile both first
    jax.block_until_ready((out, dense(leaves, batch(0))))
    outs = [[] for _ in range(n)]
    refs = [[] for _ in range(n)]
    infos: list[dict[str, np.ndarray]] = []
    times = {"deepcache": [], "nocache": []}
    for t in common.progress(range(total), desc="streams", unit="frame",
                             quiet=args.no_progress):  # fmt: skip
        frames = batch(t)
        for m in ("deepcache", "nocache") if t % 2 == 0 else ("nocache", "deepcache"):
            t0 = time.perf_counter()
            if m == "deepcache":
                out, states, info = streams.step(states, frames)
                jax.block_until_ready((out, states))
            else:
                ref = jax.block_until_ready(dense(leaves, frames))
            times[m].append(time.perf_counter() - t0)
        infos.append({k: np.asarray(v) for k, v in info.items() if np.ndim(v) >= 1})
        first, first_ref = (np.asarray(jax.tree_util.tree_leaves(o)[0]) for o in (out, ref))
        for i in range(n):
            if t < lengths[i]:
                outs[i].append(first[i])
                refs[i].append(first_ref[i])
    records = _records(args, paths, lengths, outs, refs, infos, times, spec)
    records[-1]["schedule"] = streams.schedule
    switches = getattr(streams, "switches", None)
    if switches is not None:
        records[-1]["switches"] = len(switches)
        for r in records[:-1]:
            r["switches"] = sum(s.stream in (None, r["stream"]) for s in switches)
        for s in switches:
            who = "every stream" if s.stream is None else f"stream {s.stream}"
            print(f"switch: {who} from plan {s.old} to plan {s.new} before frame {s.frame} "
                  f"(input dirty fraction {s.level:.2f})")  # fmt: skip
    print(common.table(_rows(records)))
    summary = records[-1]
    print(f"batch: {summary['mean_ms']:.1f} ms a frame ({summary['throughput_fps']:.1f} "
          f"frames/s), dense {summary['dense_mean_ms']:.1f} ms: "
          f"{summary['speedup_vs_dense']:.2f}x")  # fmt: skip
    if args.json:
        common.write_json(args.json, records)
        print(f"wrote {args.json}")
    if args.outputs:
        os.makedirs(os.path.dirname(os.path.abspath(args.outputs)), exist_ok=True)
        np.savez(args.outputs, **{f"stream{i}": np.stack(o) for i, o in enumerate(outs)})
        print(f"wrote {args.outputs}")
    return 0


def _records(args, paths, lengths, outs, refs, infos, times, spec) -> list[dict[str, Any]]:
    """One record per stream, then the batch's."""
    records = []
    for i, (label, path) in enumerate(zip(args.video, paths, strict=True)):
        k = lengths[i]
        got, ref = np.stack(outs[i]), np.stack(refs[i])
        top1 = float(np.mean(got.argmax(-1) == ref.argmax(-1))) if got.shape[-1] > 1 else None

        def column(key, i=i, k=k):
            return np.asarray([info[key][i] for info in infos[:k]])

        records.append({
            "stream": i, "video": label, "path": path, "frames": k,
            "frame_shape": list(spec.frame_shape), "model": args.model, "method": args.method,
            "refreshes": int(column("refreshed").sum()),
            "still_fraction": float(column("skipped").mean()),
            "input_reuse": float(column("input_reuse").mean()),
            "top1_agreement": top1,
            "max_abs_err": float(np.abs(got - ref).max()),
        })  # fmt: skip
        if "plan" in infos[0]:  # switched plans: the frames each plan ran
            plans = column("plan")
            records[-1]["plan_frames"] = {int(p): int((plans == p).sum()) for p in np.unique(plans)}
    n, steps = len(lengths), len(times["deepcache"])
    mean = {m: 1e3 * float(np.mean(v)) / n for m, v in times.items()}
    records.append({
        "stream": None, "streams": n, "steps": steps, "model": args.model,
        "frame_shape": list(spec.frame_shape), "mean_ms": mean["deepcache"],
        "throughput_fps": 1e3 / mean["deepcache"],
        "p99_ms": float(np.percentile(1e3 * np.asarray(times["deepcache"]), 99)),
        "dense_mean_ms": mean["nocache"],
        "speedup_vs_dense": mean["nocache"] / mean["deepcache"],
    })  # fmt: skip
    return records


def _rows(records: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [
        {
            "stream": f"{r['stream']} {os.path.basename(r['video'])}",
            "frames": str(r["frames"]),
            "refreshes": str(r["refreshes"]),
            "still": f"{100 * r['still_fraction']:.0f} %",
            "input reuse": f"{100 * r['input_reuse']:.0f} %",
            "top-1": "-" if r["top1_agreement"] is None else f"{100 * r['top1_agreement']:.1f} %",
            **({} if "switches" not in r else {"switches": str(r["switches"])}),
        }  # fmt: skip
        for r in records
        if r["stream"] is not None
    ]
