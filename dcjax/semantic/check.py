"""Whether a calibrated memory's exits agree with the full model, on images held back.

`SemanticExits.calibrate` holds back a share of its images
(`SemanticConfig.holdout`), builds centres from the others, and lets each
held-back image exit as the step would at the configured ``tau``: at the first
exit point whose confidence AC (Eq. 4) of the cumulative similarity SA (Eq.
3) passes ``tau``, with the class of the highest SA. Where fewer than
`SemanticConfig.min_agreement` of the images that exit get the full model's
top-1, the memory is switched off (`dcjax.semantic.guard`): the stream runs
without exits, and the check says why.

The simulation is numpy on the semantic vectors and the full model's labels
(`confidences`, shared with `dcjax.semantic.ceiling`); its memory is every
calibrated class, not updated while it runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

__all__ = ["CalibrationCheck", "check_held_back", "confidences", "held_back"]

_EPS = 1e-6


def _cosine(v: np.ndarray, c: np.ndarray) -> np.ndarray:
    vn = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), _EPS)
    cn = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), _EPS)
    return vn @ cn.T


def confidences(
    calib_vectors: Sequence[np.ndarray],
    calib_labels: np.ndarray,
    eval_vectors: Sequence[np.ndarray],
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per exit point in order, ``(SA, AC)`` of each evaluation input.

    Centres are the per-class means of the calibration vectors (classes:
    ``np.unique(calib_labels)``, the columns of SA); SA accumulates Eq. 3 over
    the exit points, AC is Eq. 4 of the two highest (``-inf`` with one class).
    """
    calib_labels = np.asarray(calib_labels)
    classes = np.unique(calib_labels)
    n = np.asarray(eval_vectors[0]).shape[0]
    sa = np.zeros((n, classes.size))
    for level, (cv, ev) in enumerate(zip(calib_vectors, eval_vectors, strict=True)):
        cv = np.asarray(cv, np.float64).reshape(calib_labels.shape[0], -1)
        ev = np.asarray(ev, np.float64).reshape(n, -1)
        centres = np.stack([cv[calib_labels == c].mean(axis=0) for c in classes])
        sa = sa + 2.0**level * _cosine(ev, centres)  # Eq. 3, l = level + 1
        if classes.size >= 2:
            top2 = np.sort(sa, axis=1)[:, -2:]
            ac = (top2[:, 1] - top2[:, 0]) / np.maximum(np.abs(top2[:, 0]), _EPS)  # Eq. 4
        else:
            ac = np.full((n,), -np.inf)
        yield sa, ac


def held_back(n: int, share: float) -> np.ndarray:
    """``(n,)`` bool: ``share`` of ``n`` images, spread evenly (every 4th for 0.25)."""
    i = np.arange(n)
    return np.floor((i + 1) * share) > np.floor(i * share)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CalibrationCheck:
    """The held-back check of a calibration.

    Attributes:
        held_back: images held back.
        exited: how many of them exited at ``tau``.
        agreement: the share of those whose exit class is the full model's
            top-1 (None when none exited).
        min_agreement: the share required.
        passed: whether the memory keeps its exits.
    """

    held_back: int
    exited: int
    agreement: float | None
    min_agreement: float
    passed: bool

    def describe(self) -> str:
        """One line for a user: what was measured and what it decided."""
        if self.held_back == 0:
            return "no calibration image held back: exits not checked"
        if self.agreement is None:
            return f"none of {self.held_back} held-back calibration images exited: exits kept"
        verdict = "exits kept" if self.passed else "the stream runs without exits"
        return (
            f"{self.exited} of {self.held_back} held-back calibration images exited, "
            f"{100 * self.agreement:.0f} % with the full model's top-1 "
            f"(min_agreement {100 * self.min_agreement:.0f} %): {verdict}"
        )


def check_held_back(
    vectors: Sequence[np.ndarray],
    labels: np.ndarray,
    *,
    tau: float,
    share: float,
    min_agreement: float,
) -> CalibrationCheck:
    """Exits of the held-back ``share`` of the images against centres of the others.

    Args:
        vectors: per exit point, ``(N, D_e)`` semantic vectors of every image.
        labels: ``(N,)`` the full model's top-1 of every image.
        tau: the exit threshold.
        share: the share of the images held back (`held_back`).
        min_agreement: the agreement the exits must keep.
    """
    labels = np.asarray(labels)
    held = held_back(labels.shape[0], share)
    if not held.any() or held.all():
        return CalibrationCheck(
            held_back=0, exited=0, agreement=None, min_agreement=min_agreement, passed=True
        )
    classes = np.unique(labels[~held])
    n = int(held.sum())
    exit_class = np.full((n,), -1)
    done = np.zeros((n,), bool)
    for sa, ac in confidences(
        [np.asarray(v)[~held] for v in vectors],
        labels[~held],
        [np.asarray(v)[held] for v in vectors],
    ):
        take = ~done & (ac > tau)
        exit_class[take] = classes[np.argmax(sa[take], axis=1)]
        done |= take
    exited = int(done.sum())
    agreement = float(np.mean(exit_class[done] == labels[held][done])) if exited else None
    return CalibrationCheck(
        held_back=n,
        exited=exited,
        agreement=agreement,
        min_agreement=min_agreement,
        passed=agreement is None or agreement >= min_agreement,
    )
