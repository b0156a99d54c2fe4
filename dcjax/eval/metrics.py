"""Metrics records: one JSON-serialisable dict per (model, video, method).

`make_record` turns what the harness measured (per-frame latencies, outputs,
step infos) into a record with the keys of `RECORD_KEYS`; `check_record`
verifies a record's schema and internal consistency (the tests and the
report rely on it). The definitions:

- Time per frame: ``mean_ms``, ``p50_ms`` and ``p99_ms`` of the per-frame wall
  time of ``step`` (matching included, ``block_until_ready`` on everything it
  returns, after a warm-up that compiles), refresh and still frames included;
  ``throughput_fps`` = frames over their total time (``1000 / mean_ms``).
- Two baselines, timed in the same process on the same frames, interleaved
  with the method frame by frame: ``plain_mean_ms``, the model as users write
  it, ``jax.jit(model.apply)``, in the faster (by mean) of its two common
  forms, named in ``plain_form``: ``"args"`` (variables passed as arguments)
  or ``"const"`` (closed over as constants, which lets XLA fold batch norms
  into the convolutions); and ``dense_mean_ms``, dcjax's own dense lowering
  (``nocache``: every layer computed in full, the way the cached step computes
  what it does not reuse). ``speedup_vs_plain`` = ``plain_mean_ms /
  mean_ms`` and ``speedup_vs_dense`` = ``dense_mean_ms / mean_ms``: ratios of
  mean times, what the cache gains over what a user would run without it, and
  what the cache alone adds. ``speedup_vs_dense_se``: the standard error of
  ``speedup_vs_dense`` from the paired per-frame times (`ratio_se`; ``None``
  for fewer than two frames), the run's own noise.
- ``ideal_speedup`` = ``1 / mean(flops_ratio)``: the speedup a perfect sparse
  kernel with free matching would give over the dense lowering, from the
  FLOPs of convolutions and matrix products computed, every frame counted
  (a still frame skipped whole computes none). ``efficiency`` =
  ``speedup_vs_dense / ideal_speedup``, at most 1 up to timing noise (a
  speedup above its ideal beyond `ABOVE_IDEAL_SE` standard errors is warned
  about: `above_ideal`).
  ``still_fraction``: the fraction of frames the method skipped whole as
  still (0 for methods that never do).
- Where the time goes: ``refresh_frame_ms`` and ``other_frame_ms``, the mean
  time of the frames recomputed in full and of the others;
  ``static_frame_ms``, the mean time of a frame identical to the previous one
  (everything reusable: the fixed cost of matching and caching).
- ``page_faults``: the mean minor page faults of a timed frame
  (`dcjax.eval.interleaving.timed_step`; ``None`` where not counted). Each
  fault costs microseconds; a method whose frames fault thousands of pages is
  timed with its memory's first touch (docs/performance-notes.md, "The
  heap's growth is faulted in before the timed frames").
- ``top1_agreement``: fraction of frames whose arg-max class equals the
  no-cache output's; ``top5_agreement``: fraction whose no-cache top-1 class is
  among the method's top five. ``None`` for outputs that are not class scores
  (detection grids, regression).
- ``top1_stability``: fraction of consecutive frame pairs on which the
  no-cache output's top-1 class stays the same: how stable the model itself is
  on the clip. Reuse hands a frame features computed from slightly different
  pixels, so where the model's own top-1 flips this often between frames,
  approximate reuse flips it too, whatever the cache does. ``None`` as above.
- ``output_mse``: mean squared difference from the no-cache output;
  ``output_rel_mse``: the same divided by the no-cache output's variance.
- ``match_ratio``: mean over non-refresh frames of the fraction of input
  blocks matched (``None`` when the method matches nothing).
- ``refreshes``: frames recomputed in full (the first frame included).
- ``band_refreshes``: frames that recomputed one band of a banded periodic
  refresh (`dcjax.Config.refresh_bands`; 0 for the other methods).
- ``guarded_fraction``: the mean fraction of the frame a guard recomputed
  (`dcjax.Config.guard`; 0 without one).
- ``cache_bytes``: bytes of the per-stream state after the last frame.
- ``per_layer``: per reused convolution, ``name``, ``flops`` and the mean
  ``reuse_fraction`` of its output; for DeepCache's methods then per fully
  connected layer, the mean fraction of its inputs whose weight rows were not
  read (0 unless refined). ``sparse``: whether the method computes the layer
  sparsely (False: in full on every frame, as ``kernel="auto"`` does with
  layers too small or too thin for a sparse kernel to pay; the reuse
  fraction is then what the layer could have skipped); None where the
  method does not say.
- ``config``: the method's full settings.
- Detectors' records (a `ModelSpec` with ``boxes``) also carry
  `DETECTION_KEYS`: ``box_f1``, ``box_precision`` and ``box_recall`` of the
  method's boxes against the no-cache output's at IoU 0.5 over the clip
  (`dcjax.eval.detection.match_f1`), ``boxes`` and ``reference_boxes`` (how
  many), and ``heatmap_max_err``, the largest absolute difference of the score
  map from the no-cache one over the clip.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "ABOVE_IDEAL_SE",
    "BASELINES",
    "DETECTION_KEYS",
    "FAULTS_WARNED",
    "PLAIN_FORMS",
    "RECORD_KEYS",
    "above_ideal",
    "agreement",
    "check_record",
    "faulted",
    "fidelity",
    "ideal_speedup",
    "stability",
    "latency_stats",
    "make_record",
    "ratio_se",
    "speedup_cell",
]

RECORD_KEYS = (
    "model",
    "video",
    "method",
    "variant",
    "frames",
    "frame_shape",
    "mean_ms",
    "p50_ms",
    "p99_ms",
    "throughput_fps",
    "plain_mean_ms",
    "plain_form",
    "dense_mean_ms",
    "speedup_vs_plain",
    "speedup_vs_dense",
    "speedup_vs_dense_se",
    "ideal_speedup",
    "efficiency",
    "still_fraction",
    "top1_agreement",
    "top5_agreement",
    "top1_stability",
    "output_mse",
    "output_rel_mse",
    "match_ratio",
    "page_faults",
    "refreshes",
    "band_refreshes",
    "guarded_fraction",
    "cache_bytes",
    "total_flops",
    "per_layer",
    "config",
    "compile_s",
    "refresh_frame_ms",
    "other_frame_ms",
    "static_frame_ms",
    "backend",
    "timing",
)


#: Keys of a detector's records (see the module docstring).
DETECTION_KEYS = (
    "box_f1",
    "box_precision",
    "box_recall",
    "boxes",
    "reference_boxes",
    "heatmap_max_err",
)

#: The methods every evaluation runs as baselines (`dcjax.eval.methods`): their
#: records are the references of the others' speedups and fidelity.
BASELINES = ("nocache", "plain")

#: The forms of the plain baseline, ``jax.jit(model.apply)`` (see the module docstring).
PLAIN_FORMS = ("args", "const")


def latency_stats(ms: Sequence[float]) -> dict[str, float]:
    """``mean_ms``, ``p50_ms``, ``p99_ms`` and ``throughput_fps`` of per-frame times in ms."""
    a = np.asarray(ms, np.float64)
    if a.size == 0:
        raise ValueError("dcjax: no latencies to summarise")
    mean = float(a.mean())
    return {
        "mean_ms": mean,
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "throughput_fps": 1000.0 * a.size / float(a.sum()),
    }


def ratio_se(num_ms: Sequence[float], den_ms: Sequence[float]) -> float | None:
    """The standard error of ``mean(num_ms) / mean(den_ms)`` from paired samples
    (the same frames): with ``r`` that ratio and ``e = num - r * den`` per
    frame, ``std(e) / sqrt(n) / mean(den)`` (the delta method; the sample
    standard deviation). None for fewer than two pairs.

    Raises:
        ValueError: the sequences differ in length.
    """
    num, den = np.asarray(num_ms, np.float64), np.asarray(den_ms, np.float64)
    if num.shape != den.shape:
        raise ValueError(f"dcjax: ratio_se got {num.size} and {den.size} paired times")
    if num.size < 2:
        return None
    r = num.mean() / den.mean()
    return float((num - r * den).std(ddof=1) / math.sqrt(num.size) / den.mean())


def speedup_cell(speedup: float, se: float | None) -> str:
    """A speedup as a table cell, ``"1.23x"``, with its standard error where
    one is known and not zero (a baseline against itself): ``"1.23x ±0.02"``."""
    cell = f"{speedup:.2f}x"
    return cell if not se else f"{cell} ±{se:.2f}"


def _scores(outputs: np.ndarray) -> np.ndarray | None:
    """(T, C) class scores, or None when the output is not a score vector."""
    if outputs.ndim == 3 and outputs.shape[1] == 1:
        outputs = outputs[:, 0]
    if outputs.ndim != 2 or outputs.shape[1] < 2:
        return None
    return outputs


def agreement(reference: np.ndarray, outputs: np.ndarray, k: int = 1) -> float | None:
    """Fraction of frames whose reference top-1 class is in the output's top ``k``.

    Args:
        reference: (T, 1, C) or (T, C) no-cache scores.
        outputs: the method's scores, same shape.
        k: 1 for top-1 agreement, 5 for top-5.

    Returns:
        A fraction in [0, 1], or None for outputs that are not class scores.
    """
    ref, out = _scores(np.asarray(reference)), _scores(np.asarray(outputs))
    if ref is None or out is None:
        return None
    k = min(k, out.shape[1])
    top = np.argsort(-out, axis=1)[:, :k]
    return float(np.mean(np.any(top == ref.argmax(1)[:, None], axis=1)))


def stability(reference: np.ndarray) -> float | None:
    """Fraction of consecutive frames whose reference top-1 class is unchanged.

    Args:
        reference: (T, 1, C) or (T, C) no-cache scores.

    Returns:
        A fraction in [0, 1]; None for outputs that are not class scores or
        fewer than two frames.
    """
    ref = _scores(np.asarray(reference))
    if ref is None or len(ref) < 2:
        return None
    top = ref.argmax(1)
    return float(np.mean(top[1:] == top[:-1]))


def ideal_speedup(flops_ratio: np.ndarray) -> float:
    """``1 / mean(flops_ratio)``: the speedup of computing only the FLOPs the step had to."""
    return 1.0 / max(float(np.mean(np.asarray(flops_ratio, np.float64))), 1e-12)


#: How many standard errors of the run's noise (`ratio_se`) a speedup must
#: exceed its ideal by to be warned about (`above_ideal`): under normal noise
#: a one-sided false alarm about once in 44 runs.
ABOVE_IDEAL_SE = 2.0


def above_ideal(
    label: str, speedup: float, ideal: float | None, se: float | None = None
) -> str | None:
    """A one-line warning when ``speedup`` (a method's ``speedup_vs_dense``)
    exceeds its ``ideal`` (`ideal_speedup`) by more than `ABOVE_IDEAL_SE`
    times its standard error ``se`` (``speedup_vs_dense_se``; None: by
    anything), else None.

    No kernel computes fewer FLOPs than the ideal counts, so a speedup above it
    says the dense step was slowed by something the method was not (the
    machine, the methods run between them): the run should be repeated
    before its figures are used. A step that is the dense step (ideal 1)
    lands on either side of its ideal by noise alone: that is not warned
    about.
    """
    margin = 0.0 if se is None or not math.isfinite(se) else ABOVE_IDEAL_SE * se
    if ideal is None or not speedup > ideal + margin:
        return None
    noise = "" if not margin else f" by more than the run's noise ({ABOVE_IDEAL_SE:g} x {se:.3f})"
    return (
        f"warning: {label} ran {speedup:.2f}x the dense step, above its ideal {ideal:.2f}x "
        f"(the FLOPs it skipped){noise}: the dense step was slowed by something else; "
        "repeat the run"
    )


#: Mean minor page faults a timed call above which a record is warned about
#: (`faulted`): 4 MiB of fresh pages, about 9 ms at the 9 us a fault measured
#: on the 2-core EPYC VM (docs/performance-notes.md, "The heap's growth is
#: faulted in before the timed frames"), 7-20 % of the 45-130 ms steps timed
#: there; the warm-up's reserve leaves the cached and dense steps at 0-40.
FAULTS_WARNED = 1024


def faulted(label: str, page_faults: float | None) -> str | None:
    """A one-line warning when ``page_faults`` (a record's mean minor page
    faults a timed call) exceeds `FAULTS_WARNED`, else None: that method's
    time includes the kernel zero-filling fresh memory, which a method reusing
    its heap does not pay, so its speedups are skewed by it."""
    if page_faults is None or not page_faults > FAULTS_WARNED:
        return None
    return (
        f"warning: {label} faulted {page_faults:.0f} pages a timed call: its time includes "
        "fresh memory zero-filled by the kernel (a heap grown past the warm-up's reserve, "
        "or memory mapped outside the heap; dcjax.allocator)"
    )


def fidelity(reference: np.ndarray, outputs: np.ndarray) -> dict[str, float | None]:
    """``top1_agreement``, ``top5_agreement``, ``top1_stability``, ``output_mse``
    and ``output_rel_mse`` (None for a constant reference) of (T, ...) outputs
    against the no-cache ones (module docstring)."""
    outputs, reference = np.asarray(outputs, np.float64), np.asarray(reference, np.float64)
    mse = float(np.mean(np.square(outputs - reference)))
    var = float(np.var(reference))
    return {
        "top1_agreement": agreement(reference, outputs, 1),
        "top5_agreement": agreement(reference, outputs, 5),
        "top1_stability": stability(reference),
        "output_mse": mse,
        "output_rel_mse": float(mse / var) if var > 0 else None,
    }


def _mean_or_none(values: np.ndarray) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _bool_or_none(value: Any) -> bool | None:
    return None if value is None else bool(value)


def _finite_or_none(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(x)


def make_record(
    *,
    model: str,
    video: str,
    method: str,
    variant: str,
    latencies_ms: Sequence[float],
    dense_latencies_ms: Sequence[float],
    plain_latencies_ms: Mapping[str, Sequence[float]],
    outputs: np.ndarray,
    reference: np.ndarray,
    infos: Mapping[str, np.ndarray],
    layers: Sequence[Any],
    total_flops: int,
    cache_bytes: int,
    config: Mapping[str, Any],
    frame_shape: Sequence[int],
    compile_s: float | None = None,
    static_frame_ms: float | None = None,
    backend: str = "cpu",
    timing: str = "interleaved",
    detection: Mapping[str, Any] | None = None,
    page_faults: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Build one metrics record (see the module docstring for the definitions).

    Args:
        model, video, method, variant: identification (``variant`` is the
            method spec with its options, e.g. ``deepcache:psnr_threshold=25``).
        latencies_ms: the method's per-frame step times.
        dense_latencies_ms: ``nocache``'s (dcjax's dense lowering), same frames.
        plain_latencies_ms: per form of `PLAIN_FORMS` measured, the plain
            ``jax.jit(model.apply)``'s, same frames.
        outputs, reference: (T, ...) outputs of the method and of ``nocache``.
        infos: per-frame step infos stacked along T (``flops_ratio``,
            ``match_ratio``, ``refreshed``, ``reuse_fraction``).
        layers: objects with ``name`` and ``flops``, matching ``reuse_fraction``.
        total_flops: FLOPs (convolutions and matrix products) of a full recompute.
        cache_bytes: bytes of the final per-stream state.
        config: the method's settings.
        frame_shape: (H, W, 3).
        compile_s: warm-up (compile) seconds.
        static_frame_ms: mean step time on a repeated frame, if measured.
        backend: jax backend the timings come from.
        timing: how methods were timed (``interleaved``: every method steps on a
            frame before the next frame).
        detection: a detector's `DETECTION_KEYS`, added to the record.
        page_faults: the minor page faults of each timed frame, if counted.
    """
    lat = latency_stats(latencies_ms)
    dense_ms = latency_stats(dense_latencies_ms)["mean_ms"]
    if not plain_latencies_ms:
        raise ValueError("dcjax: make_record needs the plain baseline's latencies")
    plain = {form: latency_stats(ms)["mean_ms"] for form, ms in plain_latencies_ms.items()}
    plain_form = min(plain, key=plain.get)
    speedup_dense = dense_ms / lat["mean_ms"]
    flops_ratio = np.asarray(infos["flops_ratio"], np.float64)
    ideal = ideal_speedup(flops_ratio)
    refreshed = np.asarray(infos["refreshed"], bool).reshape(-1)
    ratios = np.asarray(infos["match_ratio"], np.float64).reshape(-1)
    considered = ratios[~refreshed] if (~refreshed).any() else ratios
    considered = considered[np.isfinite(considered)]
    reuse = np.asarray(infos["reuse_fraction"], np.float64).reshape(len(flops_ratio), -1)
    if "dense_reuse" in infos:  # a CachedModel's fully connected layers follow its convolutions
        dense = np.asarray(infos["dense_reuse"], np.float64).reshape(len(flops_ratio), -1)
        reuse = np.concatenate([reuse, dense], axis=1)
    per_layer = [
        {
            "name": lay.name,
            "flops": int(lay.flops),
            "reuse_fraction": float(reuse[:, i].mean()) if reuse.shape[1] else 0.0,
            "sparse": _bool_or_none(getattr(lay, "sparse", None)),
        }
        for i, lay in enumerate(layers)
    ]
    return {
        "model": model,
        "video": video,
        "method": method,
        "variant": variant,
        "frames": int(len(latencies_ms)),
        "frame_shape": [int(d) for d in frame_shape],
        **lat,
        "plain_mean_ms": plain[plain_form],
        "plain_form": plain_form,
        "dense_mean_ms": dense_ms,
        "speedup_vs_plain": plain[plain_form] / lat["mean_ms"],
        "speedup_vs_dense": speedup_dense,
        "speedup_vs_dense_se": ratio_se(dense_latencies_ms, latencies_ms),
        "ideal_speedup": float(ideal),
        "efficiency": float(speedup_dense / ideal),
        "still_fraction": float(np.mean(np.asarray(infos["skipped"], bool)))
        if "skipped" in infos
        else 0.0,
        **fidelity(reference, outputs),
        "match_ratio": _finite_or_none(float(considered.mean()) if considered.size else None),
        "refreshes": int(refreshed.sum()),
        "band_refreshes": int((np.asarray(infos["refresh_band"]) >= 0).sum())
        if "refresh_band" in infos
        else 0,
        "guarded_fraction": float(np.mean(np.asarray(infos["guarded"], np.float64)))
        if "guarded" in infos
        else 0.0,
        "cache_bytes": int(cache_bytes),
        "total_flops": int(total_flops),
        "per_layer": per_layer,
        "config": dict(config),
        "compile_s": None if compile_s is None else float(compile_s),
        "refresh_frame_ms": _mean_or_none(np.asarray(latencies_ms)[refreshed]),
        "other_frame_ms": _mean_or_none(np.asarray(latencies_ms)[~refreshed]),
        "static_frame_ms": None if static_frame_ms is None else float(static_frame_ms),
        "page_faults": None if page_faults is None else float(np.mean(page_faults)),
        "backend": backend,
        "timing": timing,
        **({} if detection is None else {k: detection[k] for k in DETECTION_KEYS}),
    }


def check_record(record: Mapping[str, Any], *, rtol: float = 1e-9) -> None:
    """Raise ValueError when ``record`` lacks a key or is inconsistent.

    Checks: every key of `RECORD_KEYS`; times positive with ``p50_ms <=
    p99_ms``; ``throughput_fps`` equal to ``1000 / mean_ms``; both speedups
    equal to the ratios of the recorded means, ``efficiency`` to
    ``speedup_vs_dense / ideal_speedup``; ``plain_form`` one of
    `PLAIN_FORMS`; ``ideal_speedup >= 1``; ``speedup_vs_dense_se`` None or
    at least 0; fractions in [0, 1]; ``per_layer``
    entries with name, FLOPs and reuse.
    """
    missing = [k for k in RECORD_KEYS if k not in record]
    if missing:
        raise ValueError(f"dcjax: record lacks {', '.join(missing)}")
    for key in ("mean_ms", "p50_ms", "p99_ms", "plain_mean_ms", "dense_mean_ms"):
        if not record[key] > 0:
            raise ValueError(f"dcjax: record {key} {record[key]} is not positive")
    if record["p50_ms"] > record["p99_ms"] * (1 + rtol):
        raise ValueError(f"dcjax: record p50_ms {record['p50_ms']} > p99_ms {record['p99_ms']}")
    checks = (
        ("throughput_fps", 1000.0 / record["mean_ms"], "1000 / mean_ms"),
        ("speedup_vs_plain", record["plain_mean_ms"] / record["mean_ms"], "ratio of means"),
        ("speedup_vs_dense", record["dense_mean_ms"] / record["mean_ms"], "ratio of means"),
        (
            "efficiency",
            record["speedup_vs_dense"] / record["ideal_speedup"],
            "speedup_vs_dense / ideal",
        ),
    )
    for key, want, what in checks:
        if not math.isclose(record[key], want, rel_tol=max(rtol, 1e-9)):
            raise ValueError(f"dcjax: {key} {record[key]} != {what} {want}")
    if record["plain_form"] not in PLAIN_FORMS:
        raise ValueError(f"dcjax: plain_form {record['plain_form']!r} not in {PLAIN_FORMS}")
    if record["ideal_speedup"] < 1 - 1e-6:
        raise ValueError(f"dcjax: ideal_speedup {record['ideal_speedup']} < 1")
    se = record["speedup_vs_dense_se"]
    if se is not None and not se >= 0:
        raise ValueError(f"dcjax: speedup_vs_dense_se {se} is not a standard error")
    for key in ("top1_agreement", "top5_agreement", "top1_stability", "match_ratio",
                "still_fraction"):  # fmt: skip
        v = record[key]
        if v is not None and not 0 <= v <= 1:
            raise ValueError(f"dcjax: {key} {v} outside [0, 1]")
    if record["top1_agreement"] is not None and record["top5_agreement"] < record["top1_agreement"]:
        raise ValueError("dcjax: top5_agreement < top1_agreement")
    if not 0 <= record["refreshes"] <= record["frames"]:
        raise ValueError(f"dcjax: refreshes {record['refreshes']} not in [0, frames]")
    for layer in record["per_layer"]:
        if not {"name", "flops", "reuse_fraction"} <= set(layer):
            raise ValueError(f"dcjax: per_layer entry {layer} lacks keys")
        if not 0 <= layer["reuse_fraction"] <= 1:
            raise ValueError(f"dcjax: per_layer reuse_fraction {layer} outside [0, 1]")
        if layer.get("sparse") is not None and not isinstance(layer["sparse"], bool):
            raise ValueError(f"dcjax: per_layer sparse {layer} is not a bool or None")
    present = [k for k in DETECTION_KEYS if k in record]
    if present and len(present) != len(DETECTION_KEYS):
        missing = sorted(set(DETECTION_KEYS) - set(present))
        raise ValueError(f"dcjax: a detector's record lacks {', '.join(missing)}")
    for key in ("box_f1", "box_precision", "box_recall") if present else ():
        if not 0 <= record[key] <= 1:
            raise ValueError(f"dcjax: {key} {record[key]} outside [0, 1]")
