"""ConvNeXt-like: torchvision's ConvNeXt block (depthwise 7x7, then LayerNorm, Linear, GELU, Linear and a
layer scale over NHWC pixels), stem and downsampling with LayerNorm2d: convolutions edgeq quantizes,
between regions TensorRT 8.6 compiles with Myelin."""

from __future__ import annotations

import numpy as np
import onnx

from edgeq.zoo.net import Net
from edgeq.zoo.transformer import mlp


def _nhwc(net: Net, x: str, scope: str) -> str:
    return net.node("Transpose", scope, [x], perm=[0, 2, 3, 1])[0]


def _nchw(net: Net, x: str, scope: str) -> str:
    return net.node("Transpose", scope, [x], perm=[0, 3, 1, 2])[0]


def _layer_norm_2d(net: Net, x: str, scope: str, dim: int, param: str, dec: bool) -> str:
    """torchvision's LayerNorm2d: permute to NHWC, LayerNorm over channels, permute back."""
    return _nchw(net, net.layer_norm(_nhwc(net, x, scope), scope, dim, param=param, decomposed=dec), scope)


def convnext_like(*, batch: int = 1, size: int = 64, dims: tuple[int, ...] = (16, 32),
                  depths: tuple[int, ...] = (1, 1), classes: int = 10, seed: int = 0,
                  layernorm: str = "op") -> onnx.ModelProto:
    """ConvNeXt-like at ``dims``/``depths`` (torchvision's convnext_tiny is (96, 192, 384, 768), (3, 3, 9,
    3)). ``size`` must be a multiple of 4 * 2 ** (stages - 1)."""
    if len(dims) != len(depths) or size % (4 * 2 ** (len(dims) - 1)):
        raise ValueError(f"convnext_like needs len(dims) == len(depths) and size % "
                         f"{4 * 2 ** (len(dims) - 1)} == 0, got {dims}, {depths}, {size}")
    if layernorm not in ("op", "decomposed"):
        raise ValueError(f"layernorm must be 'op' or 'decomposed', got {layernorm!r}")
    dec = layernorm == "decomposed"
    net = Net(seed)
    x = net.conv("input", "/features/features.0/features.0.0", 3, dims[0], 4, 4, 0, param="features.0.0")
    x = _layer_norm_2d(net, x, "/features/features.0/features.0.1", dims[0], "features.0.1", dec)
    for si, (dim, depth) in enumerate(zip(dims, depths)):
        stage = 2 * si + 1
        if si:
            s = f"/features/features.{stage - 1}"
            x = _layer_norm_2d(net, x, f"{s}/features.{stage - 1}.0", dims[si - 1], f"features.{stage - 1}.0",
                               dec)
            x = net.conv(x, f"{s}/features.{stage - 1}.1", dims[si - 1], dim, 2, 2, 0,
                         param=f"features.{stage - 1}.1")
        for bi in range(depth):
            s = f"/features/features.{stage}/features.{stage}.{bi}/block"
            p = f"features.{stage}.{bi}.block"
            y = net.conv(x, f"{s}/block.0", dim, dim, 7, 1, 3, param=f"{p}.0", groups=dim)
            y = _nhwc(net, y, f"{s}/block.1")
            y = net.layer_norm(y, f"{s}/block.2", dim, param=f"{p}.2", decomposed=dec)
            y = mlp(net, y, s, dim, 4 * dim)
            scale = 0.1 * net.rng.uniform(0.5, 1.5, dim)
            gamma = net.init(f"features.{stage}.{bi}.layer_scale", scale.astype(np.float32))
            y = net.node("Mul", s, [y, gamma])[0]
            y = _nchw(net, y, f"{s}/block.6")
            x = net.add(y, x, f"/features/features.{stage}/features.{stage}.{bi}")
    x = net.node("GlobalAveragePool", "/avgpool", [x])[0]
    x = _layer_norm_2d(net, x, "/classifier/classifier.0", dims[-1], "classifier.0", dec)
    x = net.node("Flatten", "/classifier/classifier.1", [x], axis=1)[0]
    w = net.init("classifier.2.weight",
                 net.rng.standard_normal((classes, dims[-1])).astype(np.float32) / np.sqrt(dims[-1]))
    b = net.init("classifier.2.bias", (0.01 * net.rng.standard_normal(classes)).astype(np.float32))
    net.node("Gemm", "/classifier/classifier.2", [x, w, b], out="output", alpha=1.0, beta=1.0, transB=1)
    return net.model("convnext_like", batch, size, [batch, classes], opset=17)
