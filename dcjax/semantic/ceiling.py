"""The exit ceiling: how much any SMTM threshold could exit at a given agreement.

SMTM exits at point ``l`` when the confidence AC (Eq. 4) of the cumulative
similarity SA (Eq. 3) to the class centres passes ``tau``; the exit returns the
class with the highest SA. Whatever ``tau`` is, an exit can only agree with the
full model where that arg-max is the full model's top-1. This module measures,
from semantic vectors and labels alone (numpy, no model), per exit point:

- ``accuracy``: how often the arg-max of SA is the full model's top-1 (every
  frame forced to exit there);
- ``coverage``: the largest fraction of frames that can exit there, taking the
  frames in decreasing AC (the best any single threshold can do), with at least
  ``target`` of them agreeing with the full model;
- ``tau``: the threshold that achieves that coverage;
- ``ac_quantiles``: the 10th, 50th and 90th percentiles of AC there (the
  scale of useful thresholds, which depends on the calibration);
- ``ideal_speedup`` (given the fraction of the model's FLOPs an exit there
  skips): the FLOP speedup of exiting that coverage there, everything else
  running in full.

Centres are the per-class means of the calibration vectors, labelled with the
full model's own top-1 (as `SemanticExits.calibrate` does); the fast memory is
every calibrated class, and the centres are not updated while evaluating. The
run-time memory also learns from its full inferences, so this is a ceiling of
the calibrated memory, not a simulation of the stream. ``stability`` is the
fraction of consecutive evaluation frames with the same full-model top-1: an
exit that returns the previous frame's class would agree that often.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dcjax.semantic.check import confidences

__all__ = ["exit_ceiling"]


def exit_ceiling(
    calib_vectors: Sequence[np.ndarray],
    calib_labels: np.ndarray,
    eval_vectors: Sequence[np.ndarray],
    eval_labels: np.ndarray,
    *,
    target: float = 0.97,
    names: Sequence[str] | None = None,
    skipped: Sequence[float] | None = None,
) -> dict:
    """The per-exit ceiling of SMTM's exits (see the module docstring).

    Args:
        calib_vectors: per exit point, ``(N_cal, D_e)`` semantic vectors.
        calib_labels: ``(N_cal,)`` the full model's top-1 on the calibration inputs.
        eval_vectors: per exit point, ``(N, D_e)`` semantic vectors.
        eval_labels: ``(N,)`` the full model's top-1 on the evaluation inputs.
        target: the agreement the exiting frames must keep.
        names: exit point names (default ``"0"``, ``"1"``, ...).
        skipped: per exit point, the fraction of the model's FLOPs an exit
            there skips (adds ``ideal_speedup`` to each point).

    Returns:
        ``{"points": [{"name", "accuracy", "coverage", "tau", "ac_quantiles"[,
        "ideal_speedup"]}, ...],
        "stability", "known_classes"}``; ``known_classes`` is the fraction of
        evaluation frames whose top-1 has a calibrated centre (no exit can
        return any other class).
    """
    if len(calib_vectors) != len(eval_vectors):
        raise ValueError(
            f"dcjax: {len(calib_vectors)} calibration and {len(eval_vectors)} evaluation "
            "exit points; they must match"
        )
    if not 0.0 < target <= 1.0:
        raise ValueError(f"dcjax: target must be in (0, 1], got {target!r}")
    calib_labels = np.asarray(calib_labels)
    eval_labels = np.asarray(eval_labels)
    names = [str(i) for i in range(len(eval_vectors))] if names is None else list(names)
    classes = np.unique(calib_labels)
    n = eval_labels.shape[0]
    points = []
    levels = confidences(calib_vectors, calib_labels, eval_vectors)
    for level, ((sa, ac), name) in enumerate(zip(levels, names, strict=True)):
        agree = classes[np.argmax(sa, axis=1)] == eval_labels
        order = np.argsort(-ac, kind="stable")
        precision = np.cumsum(agree[order]) / np.arange(1, n + 1)
        ok = np.nonzero((precision >= target - 1e-12) & np.isfinite(ac[order]))[0]
        count = int(ok[-1]) + 1 if ok.size else 0
        # a threshold just under the last exiting frame's AC (exits need AC > tau)
        tau = float(np.nextafter(ac[order][count - 1], -np.inf)) if count else float("inf")
        finite = ac[np.isfinite(ac)]
        quantiles = np.quantile(finite, [0.1, 0.5, 0.9]) if finite.size else [np.nan] * 3
        point = {
            "name": name,
            "accuracy": float(agree.mean()),
            "coverage": count / n,
            "tau": tau,
            "ac_quantiles": [float(q) for q in quantiles],
        }
        if skipped is not None:
            point["ideal_speedup"] = 1.0 / (1.0 - point["coverage"] * float(skipped[level]))
        points.append(point)
    stability = float(np.mean(eval_labels[1:] == eval_labels[:-1])) if n > 1 else 1.0
    return {
        "points": points,
        "stability": stability,
        "known_classes": float(np.mean(np.isin(eval_labels, classes))),
    }
