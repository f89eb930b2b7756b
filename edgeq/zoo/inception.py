"""Inception-like: torchvision Inception v3's blocks (A: four branches with an average-pool branch; B: a
reduction whose max-pool branch is the block input itself; E: branches that split in two and concatenate
again inside) and GoogLeNet's max-pool branch, each branch a BN-folded Conv + ReLU, joined by Concat."""

from __future__ import annotations

import numpy as np
import onnx

from edgeq.zoo.net import Net


def _basic(net: Net, x: str, scope: str, cin: int, cout: int, k: int | tuple[int, int] = 1, s: int = 1,
           p: int | tuple[int, int] | None = None) -> str:
    """BasicConv2d: Conv (BatchNorm folded) + ReLU, ``k``/``p`` square or (h, w)."""
    kh, kw = (k, k) if isinstance(k, int) else k
    ph, pw = ((kh // 2, kw // 2) if p is None else (p, p) if isinstance(p, int) else p)
    w = net.rng.standard_normal((cout, cin, kh, kw)).astype(np.float32) * np.sqrt(2.0 / (cin * kh * kw))
    b = (0.1 * net.rng.standard_normal(cout)).astype(np.float32)
    wn = net.init(f"{scope.strip('/').replace('/', '.')}.conv.weight", w)
    bn = net.init(f"{scope.strip('/').replace('/', '.')}.conv.bias", b)
    y = net.node("Conv", f"{scope}/conv", [x, wn, bn], dilations=[1, 1], group=1, kernel_shape=[kh, kw],
                 pads=[ph, pw, ph, pw], strides=[s, s])[0]
    return net.relu(y, scope)


def _avgpool(net: Net, x: str, scope: str, pool_pad: bool) -> str:
    """F.avg_pool2d(x, 3, stride=1, padding=1), count_include_pad True (torch's default): one AveragePool
    with pads, or, with ``net.pool_pad``, an explicit zero Pad before an unpadded AveragePool, the form
    torch.onnx's opset 11-17 symbolic writes for count_include_pad."""
    if pool_pad:
        pads = net.const(scope, [0, 0, 1, 1, 0, 0, 1, 1], np.int64)
        x = net.node("Pad", scope, [x, pads], mode="constant")[0]
        return net.node("AveragePool", scope, [x], ceil_mode=0, kernel_shape=[3, 3], pads=[0, 0, 0, 0],
                        strides=[1, 1])[0]
    return net.node("AveragePool", scope, [x], ceil_mode=0, count_include_pad=1, kernel_shape=[3, 3],
                    pads=[1, 1, 1, 1], strides=[1, 1])[0]


def inception_a(net: Net, x: str, s: str, cin: int, w: int, pool_pad: bool = False) -> tuple[str, int]:
    b1 = _basic(net, x, f"{s}/branch1x1", cin, w)
    b5 = _basic(net, x, f"{s}/branch5x5_1", cin, w * 3 // 4)
    b5 = _basic(net, b5, f"{s}/branch5x5_2", w * 3 // 4, w, 5)
    b3 = _basic(net, x, f"{s}/branch3x3dbl_1", cin, w)
    b3 = _basic(net, _basic(net, b3, f"{s}/branch3x3dbl_2", w, w, 3), f"{s}/branch3x3dbl_3", w, w, 3)
    bp = _basic(net, _avgpool(net, x, f"{s}/avg_pool2d", pool_pad), f"{s}/branch_pool", cin, w // 2)
    return net.concat([b1, b5, b3, bp], s), 3 * w + w // 2


def inception_b(net: Net, x: str, s: str, cin: int, w: int, pool_pad: bool = False) -> tuple[str, int]:
    """The reduction block: the max-pool branch is the block input, pooled, with no convolution."""
    b3 = _basic(net, x, f"{s}/branch3x3", cin, w, 3, 2, 0)
    bd = _basic(net, _basic(net, x, f"{s}/branch3x3dbl_1", cin, w // 2), f"{s}/branch3x3dbl_2", w // 2, w, 3)
    bd = _basic(net, bd, f"{s}/branch3x3dbl_3", w, w, 3, 2, 0)
    bp = net.maxpool(x, f"{s}/max_pool2d", 3, 2, 0)
    return net.concat([b3, bd, bp], s), 2 * w + cin


def inception_e(net: Net, x: str, s: str, cin: int, w: int, pool_pad: bool = False) -> tuple[str, int]:
    """Branches that split into a 1x3 and a 3x1 convolution and concatenate again inside the block."""
    b1 = _basic(net, x, f"{s}/branch1x1", cin, w)
    b3 = _basic(net, x, f"{s}/branch3x3_1", cin, w)
    b3 = net.concat([_basic(net, b3, f"{s}/branch3x3_2a", w, w, (1, 3)),
                     _basic(net, b3, f"{s}/branch3x3_2b", w, w, (3, 1))], s)
    bd = _basic(net, _basic(net, x, f"{s}/branch3x3dbl_1", cin, w), f"{s}/branch3x3dbl_2", w, w, 3)
    bd = net.concat([_basic(net, bd, f"{s}/branch3x3dbl_3a", w, w, (1, 3)),
                     _basic(net, bd, f"{s}/branch3x3dbl_3b", w, w, (3, 1))], s)
    bp = _basic(net, _avgpool(net, x, f"{s}/avg_pool2d", pool_pad), f"{s}/branch_pool", cin, w)
    return net.concat([b1, b3, bd, bp], s), 6 * w


def googlenet_block(net: Net, x: str, s: str, cin: int, w: int, pool_pad: bool = False) -> tuple[str, int]:
    """GoogLeNet's Inception: the fourth branch a 3x3/1 MaxPool (ceil mode) then a 1x1 convolution."""
    b1 = _basic(net, x, f"{s}/branch1", cin, w)
    b2 = _basic(net, x, f"{s}/branch2/branch2.0", cin, w // 2)
    b2 = _basic(net, b2, f"{s}/branch2/branch2.1", w // 2, w, 3)
    b3 = _basic(net, _basic(net, x, f"{s}/branch3/branch3.0", cin, w // 4), f"{s}/branch3/branch3.1", w // 4,
                w // 2, 3)
    pool = net.node("MaxPool", f"{s}/branch4/branch4.0", [x], ceil_mode=1, kernel_shape=[3, 3],
                    pads=[1, 1, 1, 1], strides=[1, 1])[0]
    b4 = _basic(net, pool, f"{s}/branch4/branch4.1", cin, w // 2)
    return net.concat([b1, b2, b3, b4], s), 2 * w + w


BLOCKS = {"a": ("/Mixed_5b", inception_a, 1), "b": ("/Mixed_6a", inception_b, 2),
          "e": ("/Mixed_7b", inception_e, 1), "g": ("/inception5a", googlenet_block, 2)}


def inception_like(*, batch: int = 1, size: int = 64, width: int = 16, classes: int = 10, seed: int = 0,
                   blocks: tuple[str, ...] = ("a", "b", "e", "g"), pool_pad: bool = False) -> onnx.ModelProto:
    """Stem (3x3/2, 3x3, max-pool 3x3/2), then ``blocks`` in order (``a``: Inception A, ``b``: B, the
    reduction, ``e``: E, ``g``: a GoogLeNet block; one each, so a build that fails names its block), global
    average pool and a Gemm head. ``size`` >= 48. ``pool_pad``: the average-pool branches as an explicit Pad
    and an unpadded AveragePool (see ``_avgpool``)."""
    if size < 48:
        raise ValueError(f"inception_like needs size >= 48, got {size}")
    unknown = [b for b in blocks if b not in BLOCKS]
    if unknown or not blocks or len(set(blocks)) != len(blocks):
        raise ValueError(f"blocks must be distinct ones of {', '.join(BLOCKS)}, got {blocks}")
    net = Net(seed)
    x = _basic(net, "input", "/Conv2d_1a_3x3", 3, width, 3, 2, 0)
    x = _basic(net, x, "/Conv2d_2a_3x3", width, width, 3)
    x = net.maxpool(x, "/maxpool1", 3, 2, 0)
    c = width
    for b in blocks:
        scope, block, mult = BLOCKS[b]
        x, c = block(net, x, scope, c, mult * width, pool_pad=pool_pad)
    x = net.node("GlobalAveragePool", "/avgpool", [x])[0]
    x = net.node("Flatten", "", [x], axis=1)[0]
    w = net.init("fc.weight", net.rng.standard_normal((classes, c)).astype(np.float32) / np.sqrt(c))
    b = net.init("fc.bias", (0.01 * net.rng.standard_normal(classes)).astype(np.float32))
    net.node("Gemm", "/fc", [x, w, b], out="output", alpha=1.0, beta=1.0, transB=1)
    return net.model("inception_like", batch, size, [batch, classes])
