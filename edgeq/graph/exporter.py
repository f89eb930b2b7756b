"""Which exporter wrote a model, and what that says about its dynamic inputs and its preprocessing.

Real exports leave their input size open (ultralytics: ``[batch, 3, height, width]``; paddle2onnx:
``[p2o.DynamicDimension.0, 3, ?, p2o.DynamicDimension.1]``) while the model was trained, and is deployed,
at one size the exporter knows. Where the exporter writes it into the file (ultralytics: ``imgsz`` in
``metadata_props``), that size is the model's own; where it does not (paddle2onnx writes no metadata),
the project's documented default for that kind of model stands in, named with its source. One table
(``KINDS``), each entry a fact with its source; ``identify`` is the one reader, and
``edgeq.pipeline.shapes`` the one consumer that turns it into shapes for every command.

``Export.certain``: the model's metadata names the exporter (ultralytics' ``author: Ultralytics``), so
edgeq may act on it unasked (the ``yolo`` preprocessing preset); a kind read from the graph's signature
alone (paddle2onnx's input ``x`` and its ``p2o.`` dimension names) is only a suggestion.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from edgeq.graph.shapes import model_inputs, value_dims

if TYPE_CHECKING:
    import onnx

# ultralytics writes these in ``ultralytics/engine/exporter.py`` (``Exporter.__call__``: self.metadata =
# {"description", "author": "Ultralytics", ..., "stride", "task", "batch", "imgsz": self.imgsz, "names"}),
# then ``export_onnx`` copies each into ``model_onnx.metadata_props``; imgsz as ``str([h, w])``.
ULTRALYTICS_SOURCE = "ultralytics engine/exporter.py (metadata_props: author, task, batch, imgsz)"
# PaddleOCR's inference defaults (tools/infer/utility.py, release/2.7): --rec_image_shape "3, 48, 320" and
# --cls_image_shape "3, 48, 192" (the recogniser's and classifier's input, batch 1 here); the detector's
# size varies with each image (DetResizeForTest, multiples of 32): create_predictor's TensorRT profile
# for it has opt_input_shape x [1, 3, 640, 640]. rapidocr-onnxruntime 1.4.4's config.yaml uses the same
# rec_img_shape [3, 48, 320] and cls_image_shape [3, 48, 192].
PADDLEOCR_SOURCE = "PaddleOCR tools/infer/utility.py (release/2.7)"


@dataclass(frozen=True)
class Kind:
    """One kind of export: its preprocessing preset and its input's default shape (where the file
    says none), each with the source it comes from."""

    name: str
    preset: str
    default: tuple[int, ...] = ()  # NCHW; () where the file itself gives the size (ultralytics)
    source: str = ""
    said: str = ""  # the default's source in a few words, for messages


KINDS: dict[str, Kind] = {
    "ultralytics": Kind("ultralytics", "yolo", (), ULTRALYTICS_SOURCE),
    "ppocr-det": Kind("PP-OCR text detector (DB)", "ppocr-det", (1, 3, 640, 640),
                      f"{PADDLEOCR_SOURCE}: the detector's TensorRT opt_input_shape x [1, 3, 640, 640]",
                      "PaddleOCR's TensorRT opt shape for its detector"),
    "ppocr-rec": Kind("PP-OCR text recogniser (CTC)", "ppocr-rec", (1, 3, 48, 320),
                      f"{PADDLEOCR_SOURCE}: --rec_image_shape '3, 48, 320'",
                      "PaddleOCR's default --rec_image_shape 3, 48, 320"),
    "ppocr-cls": Kind("PP-OCR direction classifier", "ppocr-cls", (1, 3, 48, 192),
                      f"{PADDLEOCR_SOURCE}: --cls_image_shape '3, 48, 192'",
                      "PaddleOCR's default --cls_image_shape 3, 48, 192"),
}


@dataclass(frozen=True)
class Export:
    """What the model says about itself: ``kind`` a key of ``KINDS`` ('' when nothing identifies it);
    ``shapes`` one full shape for each input the export leaves dynamic, where known; ``why`` the evidence,
    in words; ``certain``: the metadata names the exporter (see the module doc)."""

    kind: str = ""
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    why: str = ""
    certain: bool = False

    @property
    def source(self) -> str:
        return KINDS[self.kind].source if self.kind else ""

    @property
    def preset(self) -> str:
        return KINDS[self.kind].preset if self.kind else ""

    def __bool__(self) -> bool:
        return bool(self.kind)


def metadata(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def identify(model: onnx.ModelProto) -> Export:
    """The exporter and its sizes (``Export``); an empty ``Export`` when nothing identifies it."""
    meta = metadata(model)
    inputs = model_inputs(model)
    if meta.get("author", "").lower().startswith("ultralytics"):
        return _ultralytics(meta, inputs)
    kind = _paddleocr_kind(model, inputs)
    if kind:
        name, dims = inputs[0]
        shape = _filled(dims, KINDS[kind].default)
        out = _shown(value_dims(model.graph.output[0]))
        k = KINDS[kind]
        why = f"paddle2onnx's input '{name}' {_shown(dims)}, output {out}: a {k.name}; {k.said}"
        return Export(kind, {name: shape} if shape else {}, why, certain=False)
    return Export()


def _ultralytics(meta: dict[str, str], inputs: list[tuple[str, tuple[Any, ...]]]) -> Export:
    task = meta.get("task", "")
    why = f"its metadata: author '{meta.get('author')}'" + (f", task '{task}'" if task else "")
    size = _imgsz(meta.get("imgsz", ""))
    shapes: dict[str, tuple[int, ...]] = {}
    if size is not None and len(inputs) == 1:
        name, dims = inputs[0]
        batch = _int(meta.get("batch", "")) or 1
        shape = _filled(dims, (batch, 3, *size))
        if shape:
            shapes[name] = shape
            why += f", imgsz {list(size)}"
    return Export("ultralytics", shapes, why, certain=True)


def _paddleocr_kind(model: onnx.ModelProto, inputs: list[tuple[str, tuple[Any, ...]]]) -> str:
    """paddle2onnx's signature: one input ``x`` of rank 4 with 3 channels, PaddlePaddle as producer or its
    dimension names (``p2o.DynamicDimension.N``); the kind from the output:
    a one-channel map (DB detector), a per-step class distribution (CTC recogniser), or 2 classes
    (the 0/180 degree classifier)."""
    if len(inputs) != 1 or len(model.graph.output) != 1:
        return ""
    name, dims = inputs[0]
    paddle = model.producer_name.lower().startswith("paddle") or any(str(d).startswith("p2o.") for d in dims)
    if name != "x" or len(dims) != 4 or dims[1] != 3 or not paddle:
        return ""
    out = value_dims(model.graph.output[0])
    if len(out) == 4 and out[1] == 1:
        return "ppocr-det"
    if len(out) == 3 and isinstance(out[2], int) and out[2] > 2:
        return "ppocr-rec"
    if len(out) == 2 and out[1] == 2:
        return "ppocr-cls"
    return ""


def _filled(dims: tuple[Any, ...], default: tuple[int, ...]) -> Optional[tuple[int, ...]]:
    """``default`` where it fits ``dims`` (same rank, equal where ``dims`` is fixed), else None."""
    if len(dims) != len(default):
        return None
    if any(isinstance(d, int) and d > 0 and d != v for d, v in zip(dims, default)):
        return None
    return tuple(default)


def _imgsz(text: str) -> Optional[tuple[int, int]]:
    """ultralytics' ``imgsz``: ``[320, 320]`` (or one number, a square)."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return None
    if isinstance(value, int) and value > 0:
        return value, value
    if (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(v, int) and v > 0 for v in value)):  # fmt: skip
        return int(value[0]), int(value[1])
    return None


def _int(text: str) -> int:
    return int(text) if re.fullmatch(r"\d+", text.strip()) else 0


def _shown(dims: tuple[Any, ...]) -> str:
    """``[?, 3, ?, ?]``: a dimension's value, ``?`` where it is open (paddle2onnx's names are no help)."""
    return "[" + ", ".join(str(d) if isinstance(d, int) else "?" for d in dims) + "]"
