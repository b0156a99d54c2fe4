"""The paper's evaluation as a function: models x videos x methods -> records.

`run_bench` is what ``dcjax bench`` runs: for every (model, video) pair it
decodes the frames at the model's input size (or at a size given, or at each
video's own size, the model built for it) and calls
`dcjax.eval.harness.evaluate` with the requested methods (plus DeepCache
variants for the threshold and block-size sweeps, refinement variants for the
``delta`` sweep), collecting one record per
(model, video, method variant). `compare_matchers` times each frame matcher
alone on consecutive frames (DeepCache's Table 4). The command writes the
records as a JSON list (`dcjax.bench.common.write_json`). With ``profile=True`` every method is
also timed layer by layer on the same frames (`dcjax.eval.profile`, what
``dcjax profile`` prints): each record gains ``profile`` (``frames``,
``wall_ms``, ``total_ms``, ms a frame per ``groups`` and per ``kinds`` of
operation, and ``busy_ms``) and each of its
``per_layer`` entries an ``ms``, so that where a speedup falls short of its
ideal the records say which layers (or the matcher) took the time.

Benchmarks are commands, not tests: the timings come from here only.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from dcjax import matching, models, video
from dcjax.config import RefineConfig
from dcjax.eval import harness, specs
from dcjax.eval import profile as profile_lib

__all__ = [
    "DEFAULT_MATCHERS",
    "DEFAULT_METHODS",
    "PAPER_MODELS",
    "PROFILE_WARMUP",
    "add_profiles",
    "compare_matchers",
    "run_bench",
]

#: The DeepCache paper's five models (REC_1, REC_2, REC_3, DET, DRV).
PAPER_MODELS = ("alexnet", "googlenet", "resnet50", "yolo_tiny", "dave")
DEFAULT_METHODS = ("nocache", "deepcache", "deepmon", "mil", "frame")
#: The matchers `compare_matchers` times by default: every one that matches (not "none").
DEFAULT_MATCHERS = tuple(m for m in matching.MATCHERS if m != "none")
#: Frames `run_bench(profile=True)` runs untimed before it profiles a method.
PROFILE_WARMUP = 3


def compare_matchers(
    frames: np.ndarray,
    *,
    video_label: str,
    names: Iterable[str] = DEFAULT_MATCHERS,
    block_size: int = 10,
    psnr_threshold: float = 20.0,
    repeats: int = 1,
) -> list[dict[str, Any]]:
    """Median matching time and mean match ratio of each matcher on consecutive frames.

    Args:
        frames: uint8 (T, H, W, 3), T >= 2.
        video_label: recorded as ``video``.
        names: matchers: ``static``, ``diamond``, ``three_step``, ``exhaustive``
            (DeepCache) and ``histogram`` (DeepMon's defaults).
        block_size, psnr_threshold: DeepCache's matching parameters.
        repeats: passes over the frames (the median is over all of them).

    Returns:
        One row per matcher: ``video``, ``matcher``, ``match_ratio``, ``ms``.
    """
    rows = []
    dev = [jnp.asarray(f) for f in frames]
    if len(dev) < 2:
        raise ValueError("dcjax: compare_matchers needs at least two frames")
    for name in names:
        # the histogram matcher with DeepMon's defaults; the searches as the
        # DeepCache step matches (motion and mask, not every vector), searching
        # every frame as the paper does
        options = {"prejudge": False} if name in matching.SEARCHES else None
        matcher = matching.StreamMatcher(
            name=name, options=matching.matcher_options(name, options), block_size=block_size,
            psnr_threshold=psnr_threshold,
        )  # fmt: skip
        fn = jax.jit(matcher.match_frames)
        jax.block_until_ready(fn(dev[0], dev[1]))
        times, ratios = [], []
        for _ in range(repeats):
            for prev, cur in zip(dev[:-1], dev[1:], strict=True):
                t0 = time.perf_counter()
                m = jax.block_until_ready(fn(prev, cur))
                times.append((time.perf_counter() - t0) * 1e3)
                ratios.append(float(m.mask.mean()))
        rows.append({
            "video": video_label,
            "matcher": name,
            "match_ratio": float(np.mean(ratios)),
            "ms": float(np.median(times)),
            "frame_shape": list(frames.shape[1:]),
        })  # fmt: skip
    return rows


def add_profiles(
    records: Sequence[dict[str, Any]],
    runners: Mapping[str, Any],
    frames: np.ndarray,
    *,
    progress: bool = False,
) -> None:
    """Profile each record's method on ``frames`` and add the times to the record.

    Each record gains ``profile``: ``frames`` (timed), ``wall_ms`` (median),
    ``total_ms``, ``groups`` (ms a frame per group: layers, ``dcjax.match``,
    the rest of the step; see `dcjax.eval.profile`), ``kinds`` (ms a frame per
    kind of operation, `dcjax.eval.profile.KINDS`) and ``busy_ms`` (the time a
    frame during which some operation ran); each ``per_layer`` entry
    gains ``ms``, its layer's group (None where no operation carries it). A
    method whose step is not one jitted function gets ``{"error": ...}``
    instead. The first `PROFILE_WARMUP` frames (fewer on short clips) are
    untimed.

    Args:
        records: metrics records of one (model, video), from
            `dcjax.eval.harness.evaluate`.
        runners: variant -> `Runner` (``Evaluation.runners``).
        frames: the uint8 frames the records were measured on.
        progress: a tqdm progress bar.
    """
    if len(frames) < 2:
        raise ValueError("dcjax: profiling needs at least 2 frames")
    warmup = min(PROFILE_WARMUP, len(frames) - 1)
    todo: Iterable = records
    if progress:
        from tqdm.auto import tqdm

        todo = tqdm(records, desc="profiling", unit="method", leave=False)
    for r in todo:
        try:
            p = profile_lib.profile(runners[r["variant"]], frames, warmup=warmup)
        except ValueError as e:  # a method without a jitted step
            r["profile"] = {"error": str(e)}
            continue
        r["profile"] = {
            "frames": p.frames,
            "wall_ms": p.wall_ms,
            "total_ms": p.total_ms,
            "groups": dict(p.groups),
            "kinds": dict(p.kinds),
            "busy_ms": p.busy_ms,
        }
        for layer in r["per_layer"]:
            layer["ms"] = p.groups.get(layer["name"])


def _variants(
    methods: Sequence[str],
    thresholds: Sequence[float],
    blocks: Sequence[int],
    deltas: Sequence[float] = (),
) -> list[str]:
    out = list(dict.fromkeys(methods))
    out += [f"deepcache:psnr_threshold={float(t)}" for t in thresholds if float(t) != 20.0]
    out += [f"deepcache:block_size={int(b)}" for b in blocks if int(b) != 10]
    default_delta = RefineConfig().delta
    for d in deltas:
        for m in ("deepcache+refine", "delta"):
            out.append(m if float(d) == default_delta else f"{m}:delta={float(d)}")
    return list(dict.fromkeys(out))


def run_bench(
    model_names: Sequence[str],
    videos: Sequence[str],
    methods: Sequence[str] = DEFAULT_METHODS,
    *,
    frames: int = 100,
    start: int = 0,
    pretrained: str | bool = "auto",
    width: float = 1.0,
    thresholds: Sequence[float] = (),
    blocks: Sequence[int] = (),
    deltas: Sequence[float] = (),
    matchers: Sequence[str] = (),
    progress: bool = True,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    profile: bool = False,
    on_truncated: Callable[[video.TruncatedVideoError, int], None] | None = None,
    input_size: tuple[int, int] | Literal["native"] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run the evaluation.

    Args:
        model_names: zoo models.
        videos: files FFmpeg reads, or bundled clip names.
        methods: method specs (see `dcjax.eval.registry.parse_method`).
        frames: frames per video.
        start: frames skipped at the start of every video.
        pretrained: True, False, or ``"auto"`` (real weights where the zoo has them).
        width: channel multiplier of the models (1.0: the published networks).
        thresholds: extra DeepCache PSNR thresholds (the threshold sweep).
        blocks: extra DeepCache block sizes (the block-size sweep).
        deltas: refinement thresholds: ``deepcache+refine`` and ``delta`` at
            each (the speed-agreement Pareto front).
        matchers: matchers to compare on each video (at the first model's input).
        progress: tqdm progress bars.
        on_record: called with every record as soon as it exists.
        profile: also time every method layer by layer on the same frames
            (`add_profiles`).
        on_truncated: for a video whose stream breaks before ``start +
            frames`` (`harness.load_frames`): None raises; otherwise it is
            called, once per model, and the frames decoded before the break
            are run.
        input_size: (H, W): every model built for frames of that size and
            every video decoded at it; ``"native"``: each video at its own
            size, not resized, the model built for it; None: each model's
            published input size (videos resized to it). Records say the size
            they ran at (``frame_shape``).

    Returns:
        ``(records, matcher_rows)``.
    """
    variants = _variants(methods, thresholds, blocks, deltas)
    records: list[dict[str, Any]] = []
    matcher_rows: list[dict[str, Any]] = []
    paths = {v: video.resolve(v) for v in videos}
    native = input_size == "native"
    for name in model_names:
        if name in models.onnx_zoo.names():  # a real ONNX file: its own weights
            use_pretrained = True
        else:
            spec_info = models.info(name)
            use_pretrained = spec_info.pretrained if pretrained == "auto" else bool(pretrained)
            use_pretrained = bool(use_pretrained and width == 1.0)
        bases: dict[Any, Any] = {}  # frame size -> the model built for it
        caches: dict[Any, dict[str, Any]] = {}  # frame size -> variant -> runner
        for v in videos:
            stored = video.info(paths[v])
            fps = float(stored.fps or 10.0)
            size = stored.size if native else input_size
            if size is not None:
                size = (int(size[0]), int(size[1]))
            if size not in bases:
                bases[size] = specs.model_spec(name, pretrained=use_pretrained, width=width,
                                                 fps=fps, input_size=size)  # fmt: skip
            base = bases[size]
            spec = base if fps == base.fps else dataclasses.replace(base, fps=fps)
            # Runners whose config records the frame rate (DeepMon's expiry) depend on
            # it; those with a measured plan, on the clip they calibrated on, and so
            # do those whose plans raced there (the fixed rules' plan may win one
            # clip's race and not another's).
            cache = {k: r for k, r in caches.get(size, {}).items()
                     if r.config.get("fps", fps) == fps
                     and r.config.get("plan", "prior") == "prior"
                     and "raced_ms" not in r.config}  # fmt: skip
            caches[size] = cache  # shared across the videos of this size
            clip = harness.load_frames(paths[v], None if native else spec.frame_shape,
                                       frames=frames, start=start,
                                       on_truncated=on_truncated)  # fmt: skip
            ev = harness.evaluate(spec, clip, variants, video_label=v, progress=progress,
                                  runner_cache=cache)  # fmt: skip
            if profile:
                add_profiles(ev.records, ev.runners, clip, progress=progress)
            for r in ev.records:
                r["pretrained"] = use_pretrained
                r["width"] = width
                r["start"] = start
                records.append(r)
                if on_record is not None:
                    on_record(r)
            if matchers and name == model_names[0]:
                matcher_rows += compare_matchers(clip, video_label=v, names=matchers)
    return records, matcher_rows
