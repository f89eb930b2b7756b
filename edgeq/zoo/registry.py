"""The zoo by name: ``ZOO`` (models), ``VARIANTS`` (export patterns) and ``build("yolo", "ort")``, the
way pipeline files' ``model: zoo:<name>`` and ``model_options`` reach a model in one export pattern."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import onnx

from edgeq.zoo.exporters import qdq_modelopt, qdq_ort, qdq_torch_eager
from edgeq.zoo.resnet import resnet_like
from edgeq.zoo.unet import unet_like
from edgeq.zoo.yolo import yolo_like


def _identity(model: onnx.ModelProto, **_: object) -> onnx.ModelProto:
    return model


ZOO: dict[str, Callable[..., onnx.ModelProto]] = {"resnet": resnet_like, "yolo": yolo_like, "unet": unet_like}
VARIANTS: dict[str, Callable[..., onnx.ModelProto]] = {
    "fp32": _identity,
    "ort": qdq_ort,
    "ortfb": partial(qdq_ort, quantize_bias=False),
    "torch": qdq_torch_eager,
    "modelopt": qdq_modelopt,
    "torch-qint8": partial(qdq_torch_eager, qint8=True),
    "modelopt-fp16": partial(qdq_modelopt, fp16=True),
}


def build(name: str, variant: str = "fp32", **kwargs: Any) -> onnx.ModelProto:
    """``build("yolo", "ort", size=64)``: a zoo model (kwargs go to its builder) in one export pattern."""
    if name not in ZOO:
        raise ValueError(f"unknown zoo model {name!r}; choose one of: {', '.join(ZOO)}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of: {', '.join(VARIANTS)}")
    return VARIANTS[variant](ZOO[name](**kwargs))
