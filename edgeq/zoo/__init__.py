"""Test model zoo: the models behind the TensorRT 8.6 fixtures, rebuilt in code.

Why in code: tests and demos need ONNX models that look like what users bring (PyTorch exports and the
Q/DQ patterns of onnxruntime, PyTorch eager mode and NVIDIA ModelOpt) without committing model files
or needing torch. Node and tensor names follow ``torch.onnx.export(opset_version=13)`` (module scopes,
``<node>_output_0``, ``onnx::Conv_N`` for BatchNorm-folded weights) so they line up with the layer names
in ``tests/fixtures/trt86-h200/*.layers.json``. Architectures follow
``fixtures/reference_models_torch.py`` (torchvision ResNet, its YoloLike and UNetLike), scaled down.

The package's public API is what this module re-exports (``zoo.<name>``, and ``zoo.ZOO`` for pipeline
files' ``zoo:<name>``); the modules hold one family each: net (the graph writer), resnet, yolo, unet,
transformer (ViT-like), convnext, inception (the regions TensorRT 8.6 compiles with Myelin, and
Inception's concatenations), skeletons (refilled torchvision exports), exporters (the Q/DQ patterns),
registry (``build``).
"""

from __future__ import annotations

from edgeq.zoo.convnext import convnext_like
from edgeq.zoo.exporters import qdq_modelopt, qdq_ort, qdq_torch_eager, random_inputs
from edgeq.zoo.inception import inception_like
from edgeq.zoo.net import IR_VERSION, OPSET
from edgeq.zoo.registry import VARIANTS, ZOO, build
from edgeq.zoo.resnet import resnet50, resnet_like
from edgeq.zoo.skeletons import skeleton
from edgeq.zoo.transformer import vit_like
from edgeq.zoo.unet import unet_like
from edgeq.zoo.yolo import yolo_like

__all__ = [
    "IR_VERSION",
    "OPSET",
    "VARIANTS",
    "ZOO",
    "build",
    "convnext_like",
    "inception_like",
    "qdq_modelopt",
    "qdq_ort",
    "qdq_torch_eager",
    "random_inputs",
    "resnet50",
    "resnet_like",
    "skeleton",
    "unet_like",
    "vit_like",
    "yolo_like",
]
