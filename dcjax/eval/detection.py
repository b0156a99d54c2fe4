"""Detection fidelity: a method's boxes against the uncached model's.

Contract: `match_f1(reference, boxes, threshold=0.5)` matches boxes
(``(K, 4)`` ``(x1, y1, x2, y2)``) one to one, greedily by IoU (highest
first; `dcjax.models.boxes.iou`), pairs above ``threshold`` counting as true
positives, and returns ``{"box_precision", "box_recall", "box_f1", "boxes",
"reference_boxes"}``, summed over frames when given lists of per-frame
arrays. With no boxes on either side, precision, recall and F1 are 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dcjax.models.boxes import iou

__all__ = ["match_f1"]


def _matches(reference: np.ndarray, boxes: np.ndarray, threshold: float) -> int:
    overlaps = iou(reference, boxes)
    used_r, used_b, hits = set(), set(), 0
    for flat in np.argsort(-overlaps, axis=None, kind="stable"):
        r, b = divmod(int(flat), overlaps.shape[1])
        if overlaps[r, b] <= threshold:
            break
        if r in used_r or b in used_b:
            continue
        used_r.add(r)
        used_b.add(b)
        hits += 1
    return hits


def match_f1(
    reference: np.ndarray | Sequence[np.ndarray],
    boxes: np.ndarray | Sequence[np.ndarray],
    threshold: float = 0.5,
) -> dict[str, float | int]:
    """Precision, recall and F1 of ``boxes`` against ``reference`` (see the module docstring)."""
    if isinstance(reference, np.ndarray) and reference.ndim == 2:
        reference, boxes = [reference], [boxes]
    if len(reference) != len(boxes):
        raise ValueError(
            f"dcjax: {len(reference)} frames of reference boxes but {len(boxes)} of boxes"
        )
    hits = n_ref = n_box = 0
    for r, b in zip(reference, boxes, strict=True):
        r, b = np.asarray(r).reshape(-1, 4), np.asarray(b).reshape(-1, 4)
        hits += _matches(r, b, threshold) if len(r) and len(b) else 0
        n_ref += len(r)
        n_box += len(b)
    precision = hits / n_box if n_box else 1.0
    recall = hits / n_ref if n_ref else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "box_precision": precision,
        "box_recall": recall,
        "box_f1": f1,
        "boxes": n_box,
        "reference_boxes": n_ref,
    }
