"""The harness: run methods over the same frames in one process and measure them.

`evaluate` is the measuring loop behind ``dcjax run``, ``dcjax bench`` and
``dcjax demo``:

1. the frames are decoded up front (decoding is not timed) and put on the
   device as uint8 ``(H, W, 3)`` arrays;
2. every method is instantiated (`dcjax.eval.registry.make_runner`) and warmed up
   (`dcjax.eval.interleaving.warm_up`): stepped over the first frames from a
   fresh state, which compiles its step (the compile time is recorded, not
   counted), and, once all have compiled, called once more, untimed; a
   method with a twin without per-layer statistics (`Runner.timed`:
   DeepCache's methods, whose statistics need every layer's mask propagated,
   work the step does for the report alone) is timed through the twin;
3. every method restarts from a fresh state and the frames are streamed:
   for each frame, each method in turn calls ``step`` once and waits for
   everything it returned (``block_until_ready``), in an order drawn afresh
   each frame (`dcjax.eval.interleaving.frame_orders`), so that no method
   always runs right after the same one and inherits what it left in the
   processor's caches. Interleaving the methods frame by frame keeps them
   under the same machine load, so the ratio of mean times is robust to load
   changing during the run;
4. each method then steps a few more times on the last frame repeated (the
   fixed cost of matching and caching when everything is reusable); a method
   timed through its twin then runs over the same frames from a fresh state,
   untimed, for the statistics (``reuse_fraction``, ``flops_ratio``; the
   outputs, cache sizes and the rest come from the timed twin, whose steps
   compute the same up to float rounding between the two compiled programs,
   so with refinement, whose masks test computed values against thresholds,
   a value at a threshold can be decided differently in the two passes);
5. one record per method (`dcjax.eval.metrics.make_record`), each compared
   on the same frames with the baselines, which always run (`BASELINES`):
   ``nocache``, dcjax's dense lowering (``speedup_vs_dense``, and the
   reference of every fidelity metric), and ``plain`` in both its forms, the
   model as users write it (``speedup_vs_plain``, the faster form).

`load_frames` decodes a video (a path or a bundled clip name) at a model's
input size, or at its own (`dcjax.eval.specs.model_spec` builds the model).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dcjax import autotune, video
from dcjax.config import Config
from dcjax.eval import interleaving, metrics
from dcjax.eval.methods import state_bytes
from dcjax.eval.registry import ModelSpec, Runner, make_runner, parse_method

__all__ = [
    "CALIBRATION_FRAMES",
    "calibrated",
    "BASELINES",
    "Evaluation",
    "evaluate",
    "first_leaf",
    "input_masks",
    "load_frames",
]

#: The methods every evaluation runs as baselines (`dcjax.eval.metrics.BASELINES`).
BASELINES = metrics.BASELINES

#: The first frames of a clip that a method's measured tuning calibrates on
#: (`ModelSpec.calibration`), where the spec brings none.
CALIBRATION_FRAMES = 16


def calibrated(spec: ModelSpec, frames: Any) -> ModelSpec:
    """``spec``, calibrated on the first `CALIBRATION_FRAMES` of ``frames`` (the
    stream's first frames, which the measured tuning calibrates on) where it
    brings no calibration of its own and there are at least two frames."""
    if spec.calibration is not None or len(frames) < 2:
        return spec
    return dataclasses.replace(spec, calibration=np.asarray(frames[:CALIBRATION_FRAMES]))


def load_frames(
    path: str,
    frame_shape: Sequence[int] | None,
    *,
    frames: int,
    start: int = 0,
    mode: str = "resize",
    on_truncated: Callable[[video.TruncatedVideoError, int], None] | None = None,
) -> np.ndarray:
    """Decode up to ``frames`` frames of ``path`` resized to ``frame_shape``
    ((H, W, ...)), or with ``frame_shape=None`` at the video's own size.

    Args:
        on_truncated: what to do when the stream breaks before ``frames``
            frames (`dcjax.video.TruncatedVideoError`): None raises; otherwise
            it is called with the error and the number of frames decoded
            before the break, and those frames are returned (when there is at
            least one).

    Returns:
        uint8 (T, H, W, 3).
    """
    size = None if frame_shape is None else (int(frame_shape[0]), int(frame_shape[1]))
    out: list[np.ndarray] = []
    try:
        for frame in video.read(video.resolve(path), size=size, max_frames=frames,
                                start=start, mode=mode):  # fmt: skip
            out.append(frame)
    except video.TruncatedVideoError as e:
        if on_truncated is None or not out:
            raise
        on_truncated(e, len(out))
    if not out:
        raise ValueError(f"dcjax: no frames decoded from {path!r}")
    return np.stack(out).astype(np.uint8)


@dataclasses.dataclass
class Evaluation:
    """What `evaluate` measured.

    Attributes:
        records: one metrics record per method, in the order given.
        runners: variant -> the `Runner` that was timed: for a method with a
            twin without statistics (`Runner.timed`), the twin, whose steps
            report NaN ``reuse_fraction`` and ``flops_ratio``.
        infos: variant -> per-frame step infos stacked along T (numpy).
        latencies_ms: variant -> per-frame step times.
        outputs: variant -> (T, ...) outputs (numpy).
        boxes: for a detector (`ModelSpec.boxes`), variant -> each frame's
            boxes; else None.
    """

    records: list[dict[str, Any]]
    runners: dict[str, Runner]
    infos: dict[str, dict[str, np.ndarray]]
    latencies_ms: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    boxes: dict[str, list[np.ndarray]] | None = None


def first_leaf(out: Any) -> np.ndarray:
    """A step's output as the harness compares it: its one leaf as an array, or
    every leaf flattened and concatenated."""
    leaves = jax.tree_util.tree_leaves(out)
    return (
        np.asarray(leaves[0])
        if len(leaves) == 1
        else np.concatenate([np.asarray(x).reshape(-1) for x in leaves])
    )


def _static_frame_ms(runner: Runner, state: Any, frame: jax.Array, repeats: int = 5):
    """Mean step time on a frame repeated after itself (frames not refreshed only,
    but every frame of a method that recomputes every frame)."""
    times = []
    for _ in range(repeats):
        seconds, _, (_, state, info) = interleaving.timed_step(runner.step, state, frame)
        if not bool(np.asarray(info["refreshed"])) or runner.method in BASELINES:
            times.append(seconds * 1e3)
    return float(np.mean(times)) if times else None


#: Prefix of the `evaluate` runner-cache keys of timed twins (`Runner.timed`).
_TIMED = "timed:"


def _replay_infos(runner: Runner, frames: list, progress: bool, desc: str) -> list[dict]:
    """The step infos of ``runner`` over ``frames`` from its initial state."""
    state, infos = runner.init(), []
    if progress:
        from tqdm.auto import tqdm

        frames = tqdm(frames, desc=desc, unit="frame", leave=False)
    for f in frames:
        _, state, info = jax.block_until_ready(runner.step(state, f))
        infos.append(info)
    return infos


def evaluate(
    spec: ModelSpec,
    frames: np.ndarray,
    methods: Iterable[str | tuple[str, Mapping[str, Any]]],
    *,
    video_label: str = "",
    warmup: int = 2,
    progress: bool = True,
    runner_cache: dict[str, Runner] | None = None,
) -> Evaluation:
    """Run ``methods`` over ``frames`` interleaved, and measure them (module docstring).

    Args:
        spec: the model.
        frames: uint8 (T, H, W, 3) at ``spec.frame_shape``.
        methods: method specs (``"deepcache"``, ``"deepcache:psnr_threshold=25"``)
            or ``(name, options)`` pairs; the baselines are added where absent:
            ``nocache`` first, ``plain:form=args`` and ``plain:form=const`` last.
        video_label: what the records call the video (the path given).
        warmup: frames stepped (and discarded) to compile each method.
        progress: show a tqdm progress bar.
        runner_cache: variant -> `Runner` already built for this ``spec``; reused
            (no recompilation) and filled with the runners built here (timed
            twins, `Runner.timed`, under keys of their own).

    Returns:
        An `Evaluation`.
    """
    frames = np.asarray(frames)
    if frames.ndim != 4 or tuple(frames.shape[1:]) != tuple(spec.frame_shape):
        raise ValueError(
            f"dcjax: frames have shape {frames.shape[1:]} but the model takes {spec.frame_shape}"
        )
    spec = calibrated(spec, frames)
    parsed: list[tuple[str, str, dict]] = []
    for m in methods:
        if isinstance(m, str):
            name, opts = parse_method(m)
            variant = m
        else:
            name, opts = m[0], dict(m[1])
            variant = name + (":" + ",".join(f"{k}={v}" for k, v in opts.items()) if opts else "")
        if variant not in [p[0] for p in parsed]:
            parsed.append((variant, name, opts))
    if "nocache" not in [p[0] for p in parsed]:
        parsed.insert(0, ("nocache", "nocache", {}))
    for form in metrics.PLAIN_FORMS:  # the plain baselines, after the methods asked for
        variant = f"plain:form={form}"
        if variant not in [p[0] for p in parsed]:
            parsed.append((variant, "plain", {"form": form}))

    cache = {} if runner_cache is None else runner_cache
    with autotune.progress_bars(progress):
        for variant, name, opts in parsed:
            if variant not in cache:
                cache[variant] = make_runner(spec, name, opts)
            twin = cache[variant].timed
            if twin is not None and _TIMED + variant not in cache:
                cache[_TIMED + variant] = twin()
    # what is timed: a runner's twin without per-layer statistics, where it has one
    reporting = {variant: cache[variant] for variant, _, _ in parsed}
    runners = {v: cache.get(_TIMED + v, r) for v, r in reporting.items()}
    dev_frames = [jnp.asarray(f) for f in frames]
    compile_s = interleaving.warm_up(
        {v: (r.init, r.step) for v, r in runners.items()},
        dev_frames,
        steps=max(1, warmup),
        desc=f"compiling {spec.name}" if progress else None,
    )

    states = {v: r.init() for v, r in runners.items()}
    times = {v: [] for v in runners}
    faults: dict[str, list[int]] = {v: [] for v in runners}
    outs: dict[str, list] = {v: [] for v in runners}
    infos: dict[str, list] = {v: [] for v in runners}
    iterator: Iterable = dev_frames
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(dev_frames, desc=f"{spec.name} {os.path.basename(video_label)}",
                        unit="frame", leave=False)  # fmt: skip
    orders = interleaving.frame_orders(list(runners), len(dev_frames))
    for f, order in zip(iterator, orders, strict=True):
        for variant in order:
            timed = interleaving.timed_step(runners[variant].step, states[variant], f)
            times[variant].append(timed.seconds * 1e3)
            faults[variant].append(timed.faults)
            out, states[variant], info = timed.result
            outs[variant].append(out)
            infos[variant].append(info)

    static_ms = {v: _static_frame_ms(r, states[v], dev_frames[-1]) for v, r in runners.items()}
    for variant, runner in reporting.items():
        if runner is not runners[variant]:  # the statistics, from an untimed pass
            infos[variant] = _replay_infos(runner, dev_frames, progress, f"{variant} statistics")
    boxes = _boxes(spec, outs)
    detection = _detection(spec, outs, boxes)
    stacked_out = {v: np.stack([first_leaf(o) for o in outs[v]]) for v in runners}
    stacked_info = {
        v: {k: np.stack([np.asarray(i[k]) for i in infos[v]]) for k in infos[v][0]} for v in runners
    }
    backend = jax.default_backend()
    records = []
    for variant, name, _ in parsed:
        runner = runners[variant]
        records.append(
            metrics.make_record(
                model=spec.name,
                video=video_label,
                method=name,
                variant=variant,
                latencies_ms=times[variant],
                dense_latencies_ms=times["nocache"],
                plain_latencies_ms={f: times[f"plain:form={f}"] for f in metrics.PLAIN_FORMS},
                outputs=stacked_out[variant],
                reference=stacked_out["nocache"],
                infos=stacked_info[variant],
                layers=runner.layers,
                total_flops=runner.total_flops,
                cache_bytes=state_bytes(states[variant]),
                config=runner.config,
                frame_shape=spec.frame_shape,
                compile_s=compile_s[variant],
                static_frame_ms=static_ms[variant],
                backend=backend,
                detection=None if detection is None else detection[variant],
                page_faults=faults[variant],
            )
        )
    return Evaluation(
        records=records,
        runners=runners,
        infos=stacked_info,
        latencies_ms={v: np.asarray(t) for v, t in times.items()},
        outputs=stacked_out,
        boxes=boxes,
    )


def _boxes(spec: ModelSpec, outs: Mapping[str, list]) -> dict[str, list[np.ndarray]] | None:
    """Per variant, each frame's boxes, for a detector (`ModelSpec.boxes`)."""
    if spec.boxes is None:
        return None
    size = (int(spec.frame_shape[0]), int(spec.frame_shape[1]))
    return {v: [np.asarray(spec.boxes(o, size)) for o in frames] for v, frames in outs.items()}


def _detection(
    spec: ModelSpec, outs: Mapping[str, list], boxes: Mapping[str, list] | None
) -> dict[str, dict[str, Any]] | None:
    """Per variant, a detector's `metrics.DETECTION_KEYS` against ``nocache``."""
    if boxes is None:
        return None
    from dcjax.eval.detection import match_f1

    def heat(o):
        return np.asarray(spec.heatmap(o), np.float64)

    reference = None if spec.heatmap is None else [heat(r) for r in outs["nocache"]]
    out = {}
    for variant in outs:
        err = None
        if reference is not None:
            err = max(float(np.max(np.abs(heat(o) - r)))
                      for o, r in zip(outs[variant], reference, strict=True))  # fmt: skip
        out[variant] = {**match_f1(boxes["nocache"], boxes[variant]), "heatmap_max_err": err}
    return out


def input_masks(
    config: Mapping[str, Any], frames: np.ndarray, refreshed: np.ndarray | None = None
) -> np.ndarray:
    """The input reuse masks R0 a matcher configuration gives on consecutive frames.

    For plotting: frame ``t`` is matched against frame ``t - 1`` with the
    matcher of ``config`` (a `Config` as a dict, e.g. ``runner.config``); frame 0
    and the frames in ``refreshed`` get an all-false mask.

    Returns:
        bool (T, H, W).
    """
    # the matcher's fields of the Config, the matcher itself as the step makes it
    fields = ("block_size", "psnr_threshold", "color", "data_range", "key", "max_pixel_change",
              "pixel_change_size")  # fmt: skip
    matcher = autotune.matcher_of(
        Config(
            matcher=config.get("matcher", "static"),
            matcher_options=config.get("matcher_options"),  # a record's JSON lists are taken
            **{f: config[f] for f in fields if f in config},
        )
    )  # fmt: skip
    one = jax.jit(lambda prev, cur: matcher.match_frames(prev, cur).mask)

    masks = [np.zeros(frames.shape[1:3], bool)]
    for t in range(1, len(frames)):
        masks.append(np.asarray(one(jnp.asarray(frames[t - 1]), jnp.asarray(frames[t]))))
    out = np.stack(masks)
    if refreshed is not None:
        out[np.asarray(refreshed, bool).reshape(-1)] = False
    return out
