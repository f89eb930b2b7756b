"""Detection: a YOLOv8-like network (C2f, SPPF, nearest upsample + concat), its C2f split written as
one Split or as the two Slices of ultralytics' exports."""

from __future__ import annotations

import numpy as np
import onnx

from edgeq.zoo.net import Net


def _cbs(net: Net, x: str, scope: str, cin: int, cout: int, k: int = 1, s: int = 1) -> str:
    """Conv-BN(folded)-SiLU, the reference's ``cbs`` Sequential: scopes ``<scope>.0`` and ``<scope>.2``."""
    y = net.conv(x, f"{scope}/{scope.rsplit('/', 1)[-1]}.0", cin, cout, k, s)
    return net.silu(y, f"{scope}/{scope.rsplit('/', 1)[-1]}.2")


def _c2f(net: Net, x: str, scope: str, cin: int, cout: int, n: int = 1, split: str = "split") -> str:
    c = cout // 2
    y = _cbs(net, x, f"{scope}/cv1", cin, 2 * c)
    if split == "slice":  # ultralytics' export of ``chunk(2, 1)``: two Slices on the channel axis
        ys = []
        for i, (lo, hi) in enumerate(((0, c), (c, 2 * c))):
            args = [net.init(f"{scope}/Constant_{3 * i + j}_output_0", np.array([v], np.int64))
                    for j, v in enumerate((lo, hi, 1))]
            ys.append(net.node("Slice", scope, [y, *args])[0])
    else:
        sizes = net.init(f"onnx::Split_{net.next_param_id()}", np.array([c, c], dtype=np.int64))
        ys = list(net.node("Split", scope, [y, sizes], n_out=2, axis=1))
    for i in range(n):
        b = f"{scope}/m.{i}"
        t = _cbs(net, ys[-1], f"{b}/a", c, c, 3)
        t = _cbs(net, t, f"{b}/b", c, c, 3)
        ys.append(net.add(ys[-1], t, b))
    return _cbs(net, net.concat(ys, scope), f"{scope}/cv2", (2 + n) * c, cout)


def _sppf(net: Net, x: str, scope: str, cin: int, cout: int) -> str:
    c = cin // 2
    x = _cbs(net, x, f"{scope}/cv1", cin, c)
    y1 = net.maxpool(x, f"{scope}/m", 5, 1, 2)
    y2 = net.maxpool(y1, f"{scope}/m", 5, 1, 2)
    y3 = net.maxpool(y2, f"{scope}/m", 5, 1, 2)
    return _cbs(net, net.concat([x, y1, y2, y3], scope), f"{scope}/cv2", c * 4, cout)


def _upsample(net: Net, x: str) -> str:
    # nn.Upsample(scale_factor=2, mode="nearest") at opset 13: Resize(X, roi="", scales).
    scales = net.init(f"onnx::Resize_{net.next_param_id()}", np.array([1, 1, 2, 2], dtype=np.float32))
    return net.node("Resize", "/up", [x, "", scales], coordinate_transformation_mode="asymmetric",
                    cubic_coeff_a=-0.75, mode="nearest", nearest_mode="floor")[0]


def yolo_like(*, batch: int = 1, size: int = 64, width: int = 16, seed: int = 0,
              split: str = "split") -> onnx.ModelProto:
    """YOLOv8-like (the reference's YoloLike at ``w=width``): C2f, SPPF, nearest upsample + concat.

    ``size`` must be a multiple of 32 (five stride-2 convs, two 2x upsamples re-joined by Concat).
    ``split="slice"`` writes each C2f's split as two Slices, as ultralytics' exports do.
    """
    if size % 32:
        raise ValueError(f"yolo_like needs size % 32 == 0, got {size}")
    w = width
    net = Net(seed)
    x = _cbs(net, "input", "/stem/stem.0", 3, w // 2, 3, 2)
    x = _cbs(net, x, "/stem/stem.1", w // 2, w, 3, 2)
    x = _c2f(net, x, "/stem/stem.2", w, w, split=split)
    x = _cbs(net, x, "/p3/p3.0", w, 2 * w, 3, 2)
    p3 = _c2f(net, x, "/p3/p3.1", 2 * w, 2 * w, 2, split=split)
    x = _cbs(net, p3, "/p4/p4.0", 2 * w, 4 * w, 3, 2)
    p4 = _c2f(net, x, "/p4/p4.1", 4 * w, 4 * w, 2, split=split)
    x = _cbs(net, p4, "/p5/p5.0", 4 * w, 8 * w, 3, 2)
    x = _c2f(net, x, "/p5/p5.1", 8 * w, 8 * w, split=split)
    p5 = _sppf(net, x, "/p5/p5.2", 8 * w, 8 * w)
    h4 = _c2f(net, net.concat([_upsample(net, p5), p4], ""), "/h4", 12 * w, 4 * w, split=split)
    h3 = _c2f(net, net.concat([_upsample(net, h4), p3], ""), "/h3", 6 * w, 2 * w, split=split)
    net.conv(h3, "/out", 2 * w, 84, 1, param="out", out="output")
    return net.model("yolo_like", batch, size, [batch, 84, size // 8, size // 8])
