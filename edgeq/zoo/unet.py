"""Segmentation: a UNet-like network (ConvTranspose upsampling, concatenated skips), its convs plain
modules with their own parameter names."""

from __future__ import annotations

import onnx

from edgeq.zoo.net import Net


def unet_like(*, batch: int = 1, size: int = 64, width: int = 8, seed: int = 0) -> onnx.ModelProto:
    """UNet-like (the reference's UNetLike at ``w=width``): ConvTranspose 2x2/2 + Relu, concat skips."""
    if size % 4:
        raise ValueError(f"unet_like needs size % 4 == 0, got {size}")
    w = width
    net = Net(seed)

    def blk(x: str, name: str, cin: int, cout: int) -> str:
        s = f"/{name}/{name}"
        x = net.relu(net.conv(x, f"{s}.0", cin, cout, 3, param=f"{name}.0"), f"{s}.1")
        return net.relu(net.conv(x, f"{s}.2", cout, cout, 3, param=f"{name}.2"), f"{s}.3")

    e1 = blk("input", "e1", 3, w)
    e2 = blk(net.maxpool(e1, "/pool", 2, 2, 0), "e2", w, 2 * w)
    e3 = blk(net.maxpool(e2, "/pool", 2, 2, 0), "e3", 2 * w, 4 * w)
    u2 = net.relu(net.conv_transpose(e3, "/u2", 4 * w, 2 * w, 2, 2, param="u2"), "/act")
    d2 = blk(net.concat([u2, e2], ""), "d2", 4 * w, 2 * w)
    u1 = net.relu(net.conv_transpose(d2, "/u1", 2 * w, w, 2, 2, param="u1"), "/act")
    d1 = blk(net.concat([u1, e1], ""), "d1", 2 * w, w)
    net.conv(d1, "/out", w, 2, 1, param="out", out="output")
    return net.model("unet_like", batch, size, [batch, 2, size, size])
