"""Classification: torchvision's ResNet (basic and bottleneck blocks, BatchNorm folded), scaled down
or at ResNet-50 size, with the stem activations and pooling tails other exporters write."""

from __future__ import annotations

import numpy as np
import onnx

from edgeq.zoo.net import Net


def resnet_like(*, batch: int = 1, size: int = 64, width: int = 16, layers: tuple[int, ...] = (1, 1),
                bottleneck: bool = False, classes: int = 10, seed: int = 0, stem_act: str = "relu",
                tail: str = "gap") -> onnx.ModelProto:
    """torchvision ResNet (v1.5: stride on the 3x3) with BN folded, as ``torch.onnx.export`` writes it.

    The stem Conv->Relu->MaxPool and the residual Add->Relu are the patterns the 8.6 fusion rules are
    about (CaskConvActPool; Add fused into the block's last conv). ``stem_act`` (relu, relu6 as Clip,
    leakyrelu) and ``tail`` (gap: GlobalAveragePool, avgpool: AveragePool over the whole map, mean:
    ReduceMean over H, W) give the variants other exporters and networks write.
    """
    net = Net(seed, first_param_id=497 if bottleneck else 100)
    x = net.conv("input", "/conv1", 3, width, 7, 2, 3)
    if stem_act == "relu6":
        lo, hi = net.init("/relu/Constant_output_0", np.array(0, np.float32)), net.init(
            "/relu/Constant_1_output_0", np.array(6, np.float32))
        x = net.node("Clip", "/relu", [x, lo, hi])[0]
    elif stem_act == "leakyrelu":
        x = net.node("LeakyRelu", "/relu", [x], alpha=0.1)[0]
    else:
        x = net.relu(x, "/relu")
    x = net.maxpool(x, "/maxpool", 3, 2, 1)
    expansion = 4 if bottleneck else 1
    inplanes = width
    for li, blocks in enumerate(layers, start=1):
        planes = width * 2 ** (li - 1)
        for bi in range(blocks):
            stride = 2 if (li > 1 and bi == 0) else 1
            s = f"/layer{li}/layer{li}.{bi}"
            identity = x
            if bottleneck:
                y = net.relu(net.conv(x, f"{s}/conv1", inplanes, planes, 1), f"{s}/relu")
                y = net.relu(net.conv(y, f"{s}/conv2", planes, planes, 3, stride), f"{s}/relu")
                y = net.conv(y, f"{s}/conv3", planes, planes * expansion, 1, gain=0.5)
            else:
                y = net.relu(net.conv(x, f"{s}/conv1", inplanes, planes, 3, stride), f"{s}/relu")
                y = net.conv(y, f"{s}/conv2", planes, planes, 3, gain=0.5)
            if stride != 1 or inplanes != planes * expansion:
                identity = net.conv(x, f"{s}/downsample/downsample.0", inplanes, planes * expansion, 1,
                                    stride, 0)
            x = net.relu(net.add(y, identity, s), f"{s}/relu")
            inplanes = planes * expansion
    if tail == "avgpool":
        k = -(-size // 4)  # the last feature map's side: stem conv and pool halve, then each later layer
        for _ in layers[1:]:
            k = -(-k // 2)
        x = net.node("AveragePool", "/avgpool", [x], kernel_shape=[k, k], strides=[k, k])[0]
    elif tail == "mean":
        x = net.node("ReduceMean", "/avgpool", [x], axes=[2, 3], keepdims=1)[0]
    else:
        x = net.node("GlobalAveragePool", "/avgpool", [x])[0]
    x = net.node("Flatten", "", [x], axis=1)[0]
    fc_w = net.rng.standard_normal((classes, inplanes)).astype(np.float32) / np.sqrt(inplanes)
    fc_b = (0.01 * net.rng.standard_normal(classes)).astype(np.float32)
    net.init("fc.weight", fc_w)
    net.init("fc.bias", fc_b)
    net.node("Gemm", "/fc", [x, "fc.weight", "fc.bias"], out="output", alpha=1.0, beta=1.0, transB=1)
    return net.model("resnet_like", batch, size, [batch, classes])


def resnet50(*, batch: int = 1, size: int = 224, seed: int = 0, width: int = 64) -> onnx.ModelProto:
    """ResNet-50 sized (25.5M parameters) for benches; same names as the resnet50 fixtures.

    ``width``: the stem's channels (64 is ResNet-50's). A narrower one keeps every node, name and edge
    (what the fixtures' layer JSON maps onto) with a fraction of the weights: 8 is 0.6M parameters, for
    tests that run whole deploys on ResNet-50's graph and need not serialize, hash and copy 100 MB."""
    return resnet_like(batch=batch, size=size, width=width, layers=(3, 4, 6, 3), bottleneck=True,
                       classes=1000, seed=seed)
