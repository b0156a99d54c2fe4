"""Boxes: intersection over union and greedy non-maximum suppression.

Contract:

- Boxes are ``(K, 4)`` float arrays ``(x1, y1, x2, y2)`` in pixels, with
  ``x2 >= x1`` and ``y2 >= y1``; scores ``(K,)``.
- `iou(a, b)` is the ``(len(a), len(b))`` matrix of intersection over union
  (0 where both boxes are empty).
- `nms(boxes, scores, threshold)` keeps, highest score first, every box whose
  IoU with each box kept before it is at most ``threshold``; it returns the
  kept indices in that order.
"""

from __future__ import annotations

import numpy as np

__all__ = ["iou", "nms"]


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection over union of every box of ``a`` with every box of ``b``."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> np.ndarray:
    """Indices of the boxes greedy non-maximum suppression keeps (see the module docstring)."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    overlaps = iou(boxes, boxes)
    keep: list[int] = []
    suppressed = np.zeros(len(boxes), bool)
    for i in order:
        if suppressed[i]:
            continue
        keep.append(int(i))
        suppressed |= overlaps[i] > threshold
    return np.asarray(keep, np.int64)
