"""Benchmark of semantic early exits: ``dcjax bench semantic``.

Pretrained EfficientNet-Lite0 at 224x224 on a bundled clip (``vtest``, fixed
camera, by default). Methods, timed frame by frame with `CachedModel.step`
(matching included) after a warm-up, in the same process, interleaved over
``--repeats`` passes of the clip:

- ``no-cache``: the jitted model;
- ``semantic``: exits only (no layer is reused: ``psnr_threshold=inf``);
- ``deepcache``: exact DeepCache alone;
- ``deepcache+semantic``: both in one step.

Reported: seconds per frame (the median over passes of each pass's mean),
speedup over no-cache, top-1 agreement with no-cache, exit rate per exit point,
the ideal speedup implied by the skipped convolution FLOPs, the memory's size
in MB, the exit ceiling (`dcjax.semantic.ceiling`: per exit point, the most
frames any threshold could exit there at the target agreement, with the
calibrated centres and with centres fitted on the evaluation frames), and a
sweep of ``tau`` (latency against agreement, as the paper's Figure 9; by
default log-spaced over the AC the calibrated memory sees, `auto_taus`).
Calibration: ``--calibration other-clip`` uses the other bundled clip (``box``
for ``vtest``); ``split`` uses the first ``--calib-frames`` frames of the
evaluation clip and evaluates on the rest. Results go to
``bench-results/semantic.json``. Timings on a shared CPU are noisy.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from dcjax.bench.arguments import positive_int, program_parser
from dcjax.bench.common import machine, write_json

__all__ = ["auto_taus", "main", "run_benchmark"]

_MODEL = "efficientnet_lite0"
_TARGET = 0.97


def _frames(name: str, size: int) -> np.ndarray:
    from dcjax import video

    return np.stack(list(video.read(video.clip_path(name), size=(size, size))))


def _top1(out: Any) -> np.ndarray:
    return np.asarray(jnp.argmax(jnp.asarray(out).reshape(-1, out.shape[-1]), axis=-1))


def _time_stream(step, state, frames) -> tuple[float, Any, list, list]:
    """Step through ``frames``; seconds per frame, final state, outputs, infos."""
    outs, infos = [], []
    start = time.perf_counter()
    for f in frames:
        out, state, info = step(state, f)
        out.block_until_ready()
        outs.append(out)
        infos.append(info)
    return (time.perf_counter() - start) / len(frames), state, outs, infos


def run_benchmark(
    clip: str = "vtest",
    calibration: str = "other-clip",
    calib_frames: int = 100,
    frames: int | None = None,
    repeats: int = 3,
    taus: tuple[float, ...] | None = None,
    tau: float | None = None,
    max_fast: int = 10,
    window: int = 10,
    kernel: str = "auto",
    target_agreement: float = _TARGET,
    exit_points: tuple[str, ...] | None = None,
) -> dict:
    """Run the benchmark and return the results as a dict (see module docstring)."""
    from dcjax import models
    from dcjax.eval.registry import ModelSpec, make_runner
    from dcjax.semantic import memory_bytes

    module, variables = models.create(_MODEL, pretrained=True)
    size = models.input_shape(_MODEL)[0]
    data = _frames(clip, size)
    if calibration == "split":
        calib, data = data[:calib_frames], data[calib_frames:]
        calib_desc = f"first {calib_frames} frames of {clip}; evaluated on the rest"
    else:
        other = "box" if clip != "box" else "vtest"
        calib = _frames(other, size)
        calib_desc = f"all {len(calib)} frames of {other!r}"
    if frames is not None:
        data = data[:frames]
    spec = ModelSpec(
        name=_MODEL,
        module=module,
        variables=variables,
        frame_shape=tuple(data.shape[1:]),
        preprocess=lambda f: models.preprocess(_MODEL, f),
    )
    tau0 = 1.0 if tau is None else tau  # the compiled default; states carry their own
    sem = {"max_fast": max_fast, "window": window}
    if exit_points:
        sem["exit_points"] = tuple(exit_points)

    def build(method, **options):
        runner = make_runner(spec, method, {"kernel": kernel, **options})
        if runner.cached is not None and runner.cached.config.semantic is not None:
            runner.cached.calibrate(calib)  # the clip chosen here, not the method's default
        return runner

    plans = {
        "no-cache": ("nocache", {}),
        "semantic": ("semantic", {"tau": tau0, **sem}),
        "deepcache": ("deepcache", {}),
        "deepcache+semantic": ("deepcache+semantic", {"tau": tau0, **sem}),
    }
    compile_s: dict[str, float] = {}
    runners: dict[str, Any] = {}
    for name, (method, options) in plans.items():
        t0 = time.perf_counter()
        if method == "nocache":
            runner = make_runner(spec, method, options)
        elif "semantic" in method:
            runner = build(method, calibration="none", **options)
        else:
            runner = build(method, **options)
        runner.step(runner.init(), data[0])[0].block_until_ready()
        compile_s[name] = time.perf_counter() - t0
        runners[name] = runner
        _log(f"{name}: built and compiled in {compile_s[name]:.0f} s")
    cached_models = {name: r.cached for name, r in runners.items()}

    def with_tau(runner, t):
        def init():
            state = runner.init()
            return dataclasses.replace(
                state, semantic=dataclasses.replace(state.semantic, tau=jnp.float32(t))
            )

        return init

    ceiling = _ceiling(runners["semantic"].cached, calib, data, target_agreement)
    for kind, c in ceiling.items():
        best = max(c["points"], key=lambda q: q["ideal_speedup"])
        _log(
            f"exit ceiling ({kind} centres): stability {c['stability']:.3f}; best single exit "
            f"{best['name']} covers {best['coverage']:.2f} at {target_agreement:.0%} agreement "
            f"(ideal {best['ideal_speedup']:.2f}x)"
        )

    if taus is None:
        taus = auto_taus(ceiling["calibrated"])
        _log(f"tau sweep (from the calibrated memory's AC): {', '.join(f'{t:.3g}' for t in taus)}")

    _, _, ref_outs, _ = _time_stream(runners["no-cache"].step, (), data)
    ref = np.concatenate([_top1(o) for o in ref_outs])

    # the sweep: tau is a state field, one compiled step serves every tau
    sweep = []
    sem_runner = runners["semantic"]
    for t in taus:
        sec, _, outs, infos = _time_stream(sem_runner.step, with_tau(sem_runner, t)(), data)
        agree = float(np.mean(np.concatenate([_top1(o) for o in outs]) == ref))
        stats = _exit_stats(sem_runner.cached, infos)
        _log(f"tau={t}: {1e3 * sec:.1f} ms/frame, agreement {agree:.3f}")
        sweep.append(
            {
                "tau": t,
                "seconds_per_frame": sec,
                "top1_agreement": agree,
                "exit_rate": stats["exit_rate"],
                "mean_exit_depth": stats["mean_exit_depth"],
            }
        )
    if tau is None:  # the fastest tau of the sweep that keeps the agreement target
        ok = [s for s in sweep if s["top1_agreement"] >= target_agreement]
        tau0 = min(ok, key=lambda s: s["tau"])["tau"] if ok else max(taus)
    else:
        tau0 = tau

    steppers = {
        name: (r.step, with_tau(r, tau0) if "semantic" in name else r.init)
        for name, r in runners.items()
    }
    times: dict[str, list[float]] = {k: [] for k in steppers}
    last: dict[str, tuple] = {}
    for _ in range(repeats):
        for name, (step, init) in steppers.items():
            sec, _, outs, infos = _time_stream(step, init(), data)
            times[name].append(sec)
            _log(f"{name}: {1e3 * sec:.1f} ms/frame")
            last[name] = (outs, infos)
    base_s = float(np.median(times["no-cache"]))
    for s_ in sweep:
        s_["speedup_vs_median_no_cache"] = base_s / s_["seconds_per_frame"]
    results: dict[str, Any] = {}
    for name in steppers:
        outs, infos = last[name]
        sec = float(np.median(times[name]))
        entry = {
            "seconds_per_frame": sec,
            "seconds_per_frame_passes": times[name],
            "speedup": base_s / sec,
            "top1_agreement": float(np.mean(np.concatenate([_top1(o) for o in outs]) == ref)),
            "compile_seconds": compile_s[name],
        }
        if name != "no-cache":
            flops = np.asarray([float(i["flops_ratio"]) for i in infos])
            entry["flops_ratio_mean"] = float(flops.mean())
            entry["ideal_speedup"] = float(1.0 / max(flops.mean(), 1e-9))
            entry["efficiency"] = entry["speedup"] / entry["ideal_speedup"]
            if "exit" in infos[0]:
                entry.update(_exit_stats(cached_models[name], infos))
        results[name] = entry

    host = machine()
    return {
        "model": _MODEL,
        "clip": clip,
        "frames": len(data),
        "calibration": calib_desc,
        "tau": tau0,
        "tau_chosen": "given"
        if tau is not None
        else (f"smallest swept tau with agreement >= {target_agreement} (on the evaluation clip)"),
        "max_fast": max_fast,
        "window": window,
        "kernel": kernel,
        "repeats": repeats,
        "platform": {
            "machine": host["machine"],
            "cpus": host["cpu_count"],
            "jax": host["jax"],
            "backend": host["backend"],
            "note": "shared CPU; seconds are the median over passes of the per-pass mean",
        },
        "methods": results,
        "tau_sweep": sweep,
        "exit_points": list(cached_models["semantic"].exit_points),
        "memory_mb": memory_bytes(cached_models["semantic"].init().semantic) / 2**20,
        "exit_ceiling": ceiling,
    }


def auto_taus(ceiling: dict, count: int = 8) -> tuple[float, ...]:
    """``count`` thresholds log-spaced over the AC the exit points see.

    From the smallest 10th percentile of AC over the exit points of a
    `dcjax.semantic.exit_ceiling` result to four times the largest 90th: the
    range where ``tau`` changes how often frames exit, up to (almost) never
    (AC's scale depends on the calibration: on frames of another clip it is
    orders of magnitude larger).
    """
    qs = np.asarray([p["ac_quantiles"] for p in ceiling["points"]], np.float64)
    fallback = (0.05, 0.1, 0.2, 0.5, 1.0)
    if not np.isfinite(qs).any():  # fewer than two classes anywhere: no AC
        return fallback
    lo, hi = np.nanmin(qs[:, 0]), np.nanmax(qs[:, 2])
    if not (np.isfinite(lo) and np.isfinite(hi)) or hi <= 0:
        return fallback
    lo = max(lo, hi * 1e-4)
    return tuple(float(f"{t:.3g}") for t in np.geomspace(lo, 4.0 * hi, count))


def _ceiling(cached, calib: np.ndarray, data: np.ndarray, target: float) -> dict:
    """`dcjax.semantic.exit_ceiling` on ``data`` with two memories.

    ``calibrated``: centres from the calibration frames (the memory a stream
    starts with). ``oracle``: centres fitted on the evaluation frames
    themselves, the best memory SMTM could learn on this clip (an optimistic
    ceiling: no run-time memory knows the future frames).
    """
    from dcjax.semantic import exit_ceiling

    _, cal_vecs, cal_labels = cached.semantic_features(calib)
    _, vecs, labels = cached.semantic_features(data)
    plan = cached._semantic.plan
    total = float(max(cached.total_flops, 1))
    kw = {"target": target, "names": plan.names, "skipped": [f / total for f in plan.flops_after]}
    return {
        "calibrated": exit_ceiling(cal_vecs, cal_labels, vecs, labels, **kw),
        "oracle": exit_ceiling(vecs, labels, vecs, labels, **kw),
    }


def _log(message: str) -> None:
    print(f"[dcjax bench semantic {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr,
          flush=True)  # fmt: skip


def _exit_stats(cached, infos) -> dict:
    exits = np.asarray([int(i["exit"]) for i in infos])
    names = cached.exit_points
    per_point = {n: float(np.mean(exits == k)) for k, n in enumerate(names)}
    depth = np.where(exits < 0, len(names), exits)
    return {
        "exit_rate": float(np.mean(exits >= 0)),
        "exit_rate_per_point": per_point,
        "full_inference_rate": float(np.mean(exits < 0)),
        "mean_exit_depth": float(depth.mean()),
        "mean_fast_size": float(np.mean([int(i["fast_size"]) for i in infos])),
    }


def _taus(text: str) -> tuple[float, ...] | None:
    """``--taus``: ``auto`` (None) or comma-separated thresholds."""
    if text == "auto":
        return None
    try:
        return tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} must be auto or comma-separated numbers"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """``dcjax bench semantic``; returns the exit status (bad arguments exit with status 2)."""
    p = program_parser("semantic", __doc__)
    p.add_argument("--clip", default="vtest", help="bundled clip (default vtest)")
    p.add_argument("--calibration", choices=("other-clip", "split"), default="other-clip")
    p.add_argument("--calib-frames", type=positive_int, default=100)
    p.add_argument("--frames", type=positive_int, default=None,
                   help="evaluate on the first N frames")  # fmt: skip
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--tau", type=float, default=None)
    p.add_argument(
        "--taus",
        type=_taus,
        default=None,
        help="comma-separated, or auto: log-spaced over the AC the exit points see",
    )
    p.add_argument("--max-fast", type=positive_int, default=10)
    p.add_argument("--window", type=positive_int, default=10)
    p.add_argument("--kernel", default="auto")
    p.add_argument("--exit-points", default="", help="comma-separated; default: every block")
    p.add_argument("--out", default="bench-results/semantic.json")
    a = p.parse_args(argv)
    res = run_benchmark(
        clip=a.clip,
        calibration=a.calibration,
        calib_frames=a.calib_frames,
        frames=a.frames,
        repeats=a.repeats,
        taus=a.taus,
        tau=a.tau,
        max_fast=a.max_fast,
        window=a.window,
        kernel=a.kernel,
        exit_points=tuple(n for n in a.exit_points.split(",") if n) or None,
    )
    write_json(a.out, res, indent=2)
    for name, r in res["methods"].items():
        print(
            f"{name:20s} {1e3 * r['seconds_per_frame']:8.1f} ms/frame  "
            f"speedup {r['speedup']:.2f}x  "
            f"agreement {100 * r['top1_agreement']:.1f}%"
            + (f"  exits {100 * r['exit_rate']:.0f}%" if "exit_rate" in r else "")
        )
    for s in res["tau_sweep"]:
        print(
            f"tau={s['tau']:<6g} {1e3 * s['seconds_per_frame']:8.1f} ms/frame  "
            f"speedup {s['speedup_vs_median_no_cache']:.2f}x  "
            f"agreement {100 * s['top1_agreement']:.1f}%  "
            f"exits {100 * s['exit_rate']:.0f}%"
        )
    for kind, ceil in res["exit_ceiling"].items():
        print(
            f"exit ceiling at {100 * _TARGET:.0f}% agreement, {kind} centres (full-model top-1 "
            f"stable across consecutive frames {100 * ceil['stability']:.1f}%, known classes "
            f"{100 * ceil['known_classes']:.1f}%):"
        )
        for q in ceil["points"]:
            print(
                f"  {q['name']:10s} accuracy {100 * q['accuracy']:5.1f}%  "
                f"coverage {100 * q['coverage']:5.1f}%  ideal {q['ideal_speedup']:.2f}x"
            )
    print(f"memory {res['memory_mb']:.2f} MB; wrote {a.out}")
    return 0
