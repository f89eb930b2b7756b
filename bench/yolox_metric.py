"""ddddocr's click-captcha detector judged by edgeq's detection metric, through ``--metric module:function``.

Its export is YOLOX without the decode: (1, anchors, 5 + classes) of grid offsets, log sizes, objectness
and class scores, which ddddocr decodes outside the model (``DetectionEngine.demo_postprocess``: strides 8,
16 and 32 at 416x416). ``detections`` decodes FP32's and the candidate's outputs the same way into
YOLOv8's layout (N, 4 + classes, anchors), boxes in pixels, each class scored objectness x class, and
scores them with edgeq's ``DetectionMetric`` at ddddocr's NMS IoU (0.45): FP32 detections with score
>= 0.25 kept at IoU 0.5 with the same class, as for the YOLOv8 detector.

    edgeq quantize common_det.onnx --calib calib/ --holdout held/ --metric yolox_metric:detections
    (with this directory on PYTHONPATH; ``bench/accuracy_bench.py --models dddet`` does it)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from edgeq.quant.metrics import ArrayCache, DetectionMetric, TaskScore, per_array

SIZE = (416, 416)  # ddddocr's input size
STRIDES = (8, 16, 32)
METRIC = DetectionMetric(nms_iou=0.45)  # ddddocr's multiclass_nms threshold


def _grid() -> tuple[np.ndarray, np.ndarray]:
    cells, strides = [], []
    for s in STRIDES:
        xv, yv = np.meshgrid(np.arange(SIZE[1] // s), np.arange(SIZE[0] // s))
        cells.append(np.stack((xv, yv), 2).reshape(-1, 2))
        strides.append(np.full((cells[-1].shape[0], 1), s))
    return np.concatenate(cells).astype(np.float64), np.concatenate(strides).astype(np.float64)


GRID, STRIDE = _grid()


def decode(raw: np.ndarray) -> np.ndarray:
    """(N, anchors, 5 + C) raw YOLOX -> (N, 4 + C, anchors): cx, cy, w, h in pixels, objectness x class."""
    p = np.asarray(raw, dtype=np.float64)
    xy = (p[..., :2] + GRID) * STRIDE
    wh = np.exp(np.clip(p[..., 2:4], -20.0, 20.0)) * STRIDE
    scores = p[..., 4:5] * p[..., 5:]
    return np.concatenate([xy, wh, scores], axis=-1).transpose(0, 2, 1)


# decoded per raw output array while it lives: auto's bound checks score the same outputs many times, and
# edgeq's own decode cache is keyed by the decoded array, so it must be the same array each time
_CACHE: ArrayCache = {}


def _decoded(raw: np.ndarray) -> np.ndarray:
    return per_array(_CACHE, raw, None, lambda: decode(raw))


def detections(reference: Sequence[Mapping[str, np.ndarray]], candidate: Sequence[Mapping[str, np.ndarray]]
               ) -> TaskScore:
    """edgeq's detection metric over the decoded outputs (the model's one output, 'output')."""
    def conv(outs: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        return [{"output": _decoded(o["output"])} for o in outs]

    return METRIC.score(conv(reference), conv(candidate))


# edgeq's DetectionMetric is bounded: FP32's own outputs keep every detection, so auto may stop a loser early
detections.bounded = True  # type: ignore[attr-defined]
