"""Test model zoo: the models behind the TensorRT 8.6 fixtures, rebuilt in code.

Why in code: tests and demos need ONNX models that look like what users bring (PyTorch exports and the
Q/DQ patterns of onnxruntime, PyTorch eager mode and NVIDIA ModelOpt) without committing model files
or needing torch. Node and tensor names follow ``torch.onnx.export(opset_version=13)`` (module scopes,
``<node>_output_0``, ``onnx::Conv_N`` for BatchNorm-folded weights) so they line up with the layer names
in ``tests/fixtures/trt86-h200/*.layers.json``. Architectures follow
``fixtures/reference_models_torch.py`` (torchvision ResNet, its YoloLike and UNetLike), scaled down.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeq.graph.io import opset_of

IR_VERSION = 8  # what torch.onnx.export writes with onnx<=1.13 and what the TensorRT 8.6 parser is built on
OPSET = 13


# --------------------------------------------------------------------------------------------------
# A tiny graph writer that names things the way the PyTorch exporter does.
# --------------------------------------------------------------------------------------------------


class _Net:
    """Collects nodes/initializers; weights come from one seeded generator so models are reproducible."""

    def __init__(self, seed: int, first_param_id: int = 100) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._param_id = first_param_id
        self._used: dict[str, int] = {}

    # -- naming -------------------------------------------------------------------------------------
    def scope(self, scope: str, op: str) -> str:
        """Unique node name ``<scope>/<Op>`` as torch writes it: a module called again gets its scope
        suffixed (``/relu_1/Relu``, ``/pool_1/MaxPool``); a repeated top-level op its name (``/Concat_1``)."""
        base = f"{scope}/{op}"
        n = self._used.get(base, 0)
        self._used[base] = n + 1
        if n == 0:
            return base
        return f"/{op}_{n}" if not scope else f"{scope}_{n}/{op}"

    def _folded_name(self) -> tuple[str, str]:
        # torch's exporter names BN-folded Conv parameters onnx::Conv_<id>, weight and bias consecutive,
        # ids advancing by 3 per convolution (see the resnet50 fixtures: onnx::Conv_501, _504, ...).
        w, b = f"onnx::Conv_{self._param_id}", f"onnx::Conv_{self._param_id + 1}"
        self._param_id += 3
        return w, b

    # -- parameters ---------------------------------------------------------------------------------
    def init(self, name: str, array: np.ndarray) -> str:
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def _conv_params(self, cin: int, cout: int, k: int, groups: int = 1, gain: float = 1.0,
                     folded: bool = True) -> tuple[np.ndarray, np.ndarray]:
        fan_in = cin // groups * k * k
        w = self.rng.standard_normal((cout, cin // groups, k, k)).astype(np.float32)
        w *= gain * np.sqrt(2.0 / fan_in)
        if folded:
            # A BatchNorm folded into the conv: per-channel gamma/sqrt(var) scale and a shift.
            w *= self.rng.uniform(0.5, 1.5, size=(cout, 1, 1, 1)).astype(np.float32)
            b = (0.1 * self.rng.standard_normal(cout)).astype(np.float32)
        else:
            b = (0.05 * self.rng.standard_normal(cout)).astype(np.float32)
        return w, b

    # -- ops ----------------------------------------------------------------------------------------
    def node(self, op: str, scope: str, inputs: list[str], n_out: int = 1, out: str | None = None,
             **attrs: Any) -> list[str]:
        name = self.scope(scope, op)
        outs = [out] if out is not None else [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs

    def conv(self, x: str, scope: str, cin: int, cout: int, k: int, s: int = 1, p: int | None = None, *,
             param: str | None = None, gain: float = 1.0, out: str | None = None) -> str:
        """Conv; ``param`` = the module's parameter prefix for a plain conv, None for BN-folded."""
        p = k // 2 if p is None else p
        w, b = self._conv_params(cin, cout, k, gain=gain, folded=param is None)
        wn, bn = (f"{param}.weight", f"{param}.bias") if param else self._folded_name()
        self.init(wn, w)
        self.init(bn, b)
        return self.node("Conv", scope, [x, wn, bn], out=out, dilations=[1, 1], group=1,
                         kernel_shape=[k, k], pads=[p, p, p, p], strides=[s, s])[0]

    def conv_transpose(self, x: str, scope: str, cin: int, cout: int, k: int, s: int, *, param: str) -> str:
        w = self.rng.standard_normal((cin, cout, k, k)).astype(np.float32) * np.sqrt(2.0 / cin)
        b = (0.05 * self.rng.standard_normal(cout)).astype(np.float32)
        self.init(f"{param}.weight", w)
        self.init(f"{param}.bias", b)
        return self.node("ConvTranspose", scope, [x, f"{param}.weight", f"{param}.bias"], dilations=[1, 1],
                         group=1, kernel_shape=[k, k], pads=[0, 0, 0, 0], strides=[s, s])[0]

    def relu(self, x: str, scope: str) -> str:
        return self.node("Relu", scope, [x])[0]

    def silu(self, x: str, scope: str) -> str:
        # opset 13 has no SiLU: torch writes x * Sigmoid(x).
        sig = self.node("Sigmoid", scope, [x])[0]
        return self.node("Mul", scope, [x, sig])[0]

    def maxpool(self, x: str, scope: str, k: int, s: int, p: int) -> str:
        return self.node("MaxPool", scope, [x], ceil_mode=0, dilations=[1, 1], kernel_shape=[k, k],
                         pads=[p, p, p, p], strides=[s, s])[0]

    def add(self, a: str, b: str, scope: str) -> str:
        return self.node("Add", scope, [a, b])[0]

    def concat(self, xs: list[str], scope: str) -> str:
        return self.node("Concat", scope, xs, axis=1)[0]

    def model(self, name: str, batch: int, size: int, out_shape: list[int], opset: int = OPSET,
              channels: int = 3) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, channels, size, size])],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, out_shape)],
            self.inits,
        )
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="edgeq.zoo", producer_version="0")
        m.ir_version = IR_VERSION
        return m


# --------------------------------------------------------------------------------------------------
# FP32 builders
# --------------------------------------------------------------------------------------------------


def resnet_like(*, batch: int = 1, size: int = 64, width: int = 16, layers: tuple[int, ...] = (1, 1),
                bottleneck: bool = False, classes: int = 10, seed: int = 0, stem_act: str = "relu",
                tail: str = "gap") -> onnx.ModelProto:
    """torchvision ResNet (v1.5: stride on the 3x3) with BN folded, as ``torch.onnx.export`` writes it.

    The stem Conv->Relu->MaxPool and the residual Add->Relu are the patterns the 8.6 fusion rules are
    about (CaskConvActPool; Add fused into the block's last conv). ``stem_act`` (relu, relu6 as Clip,
    leakyrelu) and ``tail`` (gap: GlobalAveragePool, avgpool: AveragePool over the whole map, mean:
    ReduceMean over H, W) give the variants other exporters and networks write.
    """
    net = _Net(seed, first_param_id=497 if bottleneck else 100)
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


def resnet50(*, batch: int = 1, size: int = 224, seed: int = 0) -> onnx.ModelProto:
    """ResNet-50 sized (25.5M parameters) for benches; same names as the resnet50 fixtures."""
    return resnet_like(batch=batch, size=size, width=64, layers=(3, 4, 6, 3), bottleneck=True,
                       classes=1000, seed=seed)


def _cbs(net: _Net, x: str, scope: str, cin: int, cout: int, k: int = 1, s: int = 1) -> str:
    """Conv-BN(folded)-SiLU, the reference's ``cbs`` Sequential: scopes ``<scope>.0`` and ``<scope>.2``."""
    y = net.conv(x, f"{scope}/{scope.rsplit('/', 1)[-1]}.0", cin, cout, k, s)
    return net.silu(y, f"{scope}/{scope.rsplit('/', 1)[-1]}.2")


def _c2f(net: _Net, x: str, scope: str, cin: int, cout: int, n: int = 1, split: str = "split") -> str:
    c = cout // 2
    y = _cbs(net, x, f"{scope}/cv1", cin, 2 * c)
    if split == "slice":  # ultralytics' export of ``chunk(2, 1)``: two Slices on the channel axis
        ys = []
        for i, (lo, hi) in enumerate(((0, c), (c, 2 * c))):
            args = [net.init(f"{scope}/Constant_{3 * i + j}_output_0", np.array([v], np.int64))
                    for j, v in enumerate((lo, hi, 1))]
            ys.append(net.node("Slice", scope, [y, *args])[0])
    else:
        sizes = net.init(f"onnx::Split_{net._param_id}", np.array([c, c], dtype=np.int64))
        net._param_id += 1
        ys = list(net.node("Split", scope, [y, sizes], n_out=2, axis=1))
    for i in range(n):
        b = f"{scope}/m.{i}"
        t = _cbs(net, ys[-1], f"{b}/a", c, c, 3)
        t = _cbs(net, t, f"{b}/b", c, c, 3)
        ys.append(net.add(ys[-1], t, b))
    return _cbs(net, net.concat(ys, scope), f"{scope}/cv2", (2 + n) * c, cout)


def _sppf(net: _Net, x: str, scope: str, cin: int, cout: int) -> str:
    c = cin // 2
    x = _cbs(net, x, f"{scope}/cv1", cin, c)
    y1 = net.maxpool(x, f"{scope}/m", 5, 1, 2)
    y2 = net.maxpool(y1, f"{scope}/m", 5, 1, 2)
    y3 = net.maxpool(y2, f"{scope}/m", 5, 1, 2)
    return _cbs(net, net.concat([x, y1, y2, y3], scope), f"{scope}/cv2", c * 4, cout)


def _upsample(net: _Net, x: str) -> str:
    # nn.Upsample(scale_factor=2, mode="nearest") at opset 13: Resize(X, roi="", scales).
    scales = net.init(f"onnx::Resize_{net._param_id}", np.array([1, 1, 2, 2], dtype=np.float32))
    net._param_id += 1
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
    net = _Net(seed)
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


def unet_like(*, batch: int = 1, size: int = 64, width: int = 8, seed: int = 0) -> onnx.ModelProto:
    """UNet-like (the reference's UNetLike at ``w=width``): ConvTranspose 2x2/2 + Relu, concat skips."""
    if size % 4:
        raise ValueError(f"unet_like needs size % 4 == 0, got {size}")
    w = width
    net = _Net(seed)

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


def skeleton(path: str | Path, *, seed: int = 0) -> onnx.ModelProto:
    """A real exporter's graph whose large weights were left out (``*.skel.onnx``), refilled in memory.

    The skeletons under ``tests/fixtures/trt86-h100-zoo/skeletons`` keep every node and tensor name of
    the torchvision export behind the H100 engines, and an external-data reference for each initializer
    over 4096 elements. Each such tensor is refilled with seeded data of its dims (He-normal for weights
    of rank 2 and up, small values for vectors), so the model runs in onnxruntime and lines up with the
    engines' layer names.
    """
    model = onnx.load(str(path), load_external_data=False)
    rng = np.random.default_rng(seed)
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL:
            continue
        dims = tuple(int(d) for d in t.dims)
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
        if len(dims) >= 2:
            fan_in = int(np.prod(dims[1:]))
            values = rng.standard_normal(dims) * np.sqrt(2.0 / max(fan_in, 1))
        else:
            values = 0.01 * rng.standard_normal(dims)
        filled = numpy_helper.from_array(values.astype(dtype), t.name)
        t.CopyFrom(filled)
    return model


# --------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------

def random_inputs(model: onnx.ModelProto, *, seed: int = 0,
                  batch: int | None = None) -> dict[str, np.ndarray]:
    """Seeded standard-normal inputs of the model's (static) shapes; ``batch`` overrides dim 0.

    Standard-normal, not ``verify.random_inputs``' image-like [0, 1): this is the calibration data the
    zoo's Q/DQ variants are made with, as the fixtures' models were calibrated.
    """
    from edgeq.graph.verify import static_inputs

    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for name, (dims, dtype) in static_inputs(model).items():
        if batch is not None and dims:
            dims[0] = batch
        if np.issubdtype(dtype, np.floating):
            feeds[name] = rng.standard_normal(dims).astype(dtype)
        else:
            feeds[name] = rng.integers(0, 10, size=dims).astype(dtype)
    return feeds


# --------------------------------------------------------------------------------------------------
# Q/DQ variants: the export patterns users bring
# --------------------------------------------------------------------------------------------------

_IR_FOR_OPSET = {17: 8, 18: 8, 19: 9, 20: 9, 21: 10}  # highest opset each IR version covers (onnx docs)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


class _PreprocessAdvice(logging.Filter):
    """onnxruntime's quantizer logs "Please consider (to run) pre-processing before quantization" on the
    root logger for every model it has not shape-inferred itself: advice for its users, noise in edgeq's
    output (the zoo's models are built with their shapes)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith("Please consider")


@contextlib.contextmanager
def _quiet_ort_preprocess_advice() -> Iterator[None]:
    """Drop that advice while edgeq calls the quantizer, and nothing else, and only then."""
    quiet = _PreprocessAdvice()
    root = logging.getLogger()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


def qdq_ort(model: onnx.ModelProto, *, quantize_bias: bool = True, samples: int = 4,
            seed: int = 0) -> onnx.ModelProto:
    """The real ``onnxruntime.quantization.quantize_static`` output, as the fixtures were made.

    QDQ format, per-channel symmetric int8 weights, symmetric int8 activations on every quantizable
    tensor (Q/DQ on both Add inputs, inside SiLU, around MaxPool), MinMax calibration on ``samples``
    seeded standard-normal batches. ``quantize_bias=True`` (ort's default) writes the bias as an int32
    initializer behind a DequantizeLinear (the ``*_ortqdq`` fixtures, which TensorRT 8.6 fails to
    parse); False keeps float biases (``*_ortfb``).

    What ort does to versions: onnxruntime 1.31 keeps the input's opset (13) and IR version (8) for
    these models. Should a later ort bump the IR version while the opset still fits the input's IR
    version, it is set back (the graph is unchanged by that); an opset bump is kept, as ort wrote it.
    """
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.i = 0

        def get_next(self) -> dict[str, np.ndarray] | None:
            if self.i >= samples:
                return None
            self.i += 1
            return random_inputs(model, seed=seed * 1000 + self.i)

    with tempfile.TemporaryDirectory(prefix="edgeq-zoo-") as tmp, _quiet_ort_preprocess_advice():
        out = Path(tmp) / "model.qdq.onnx"
        quantize_static(
            _copy(model), str(out), _Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True,
                           "QuantizeBias": quantize_bias},
        )
        qdq = onnx.load(str(out), load_external_data=True)
    if qdq.ir_version > model.ir_version and _IR_FOR_OPSET.get(opset_of(qdq), 99) <= model.ir_version:
        qdq.ir_version = model.ir_version
    return qdq


def qdq_modelopt(model: onnx.ModelProto, *, fp16: bool = False) -> onnx.ModelProto:
    """What NVIDIA ModelOpt writes: int8 Q/DQ at opset 19 and IR 10, per-channel weights, float bias.

    ``fp16=True``: ModelOpt 0.47's default int8 output, the network converted to float16: float16
    inputs, outputs, weights, biases and Q/DQ scales (float16 Q/DQ exist from opset 19 on).

    Built from ``qdq_ort(model, quantize_bias=False)`` and converted with ``onnx.version_converter``
    (which moves Split/Resize and Q/DQ to their opset-18/19 signatures), then stamped IR 10 as current
    onnx writes. This is the case ``edgeq clean`` must bring back to opset <= 17 / IR <= 8.
    """
    from onnx import version_converter

    qdq = version_converter.convert_version(qdq_ort(model, quantize_bias=False), 19)
    qdq.ir_version = 10
    if fp16:
        g = qdq.graph
        sizes = {n.input[i] for n in g.node if n.op_type == "Resize" for i in (1, 2) if len(n.input) > i}
        for i, t in enumerate(g.initializer):
            if t.data_type == TensorProto.FLOAT and t.name not in sizes:  # Resize scales stay float
                g.initializer[i].CopyFrom(numpy_helper.from_array(
                    numpy_helper.to_array(t).astype(np.float16), t.name))
        for v in list(g.input) + list(g.output):
            if v.type.tensor_type.elem_type == TensorProto.FLOAT:
                v.type.tensor_type.elem_type = TensorProto.FLOAT16
        del g.value_info[:]
    qdq.producer_name = "edgeq.zoo (modelopt pattern)"
    return qdq


def _activation_ranges(model: onnx.ModelProto, names: list[str], batches: list[dict[str, np.ndarray]]
                       ) -> dict[str, float]:
    """Max |x| of the named tensors over onnxruntime forward passes (tensors exposed as outputs)."""
    import onnxruntime as ort

    probe = _copy(model)
    have = {o.name for o in probe.graph.output}
    for n in names:
        if n not in have:
            probe.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    ranges = dict.fromkeys(names, 0.0)
    for feeds in batches:
        for n, v in zip(names, sess.run(names, feeds)):
            ranges[n] = max(ranges[n], float(np.abs(v).max()))
    return ranges


# Which input of a weighted op holds the output channels of its weight: Conv/Gemm(transB=1) axis 0,
# ConvTranspose axis 1 (weight is Cin x Cout/g x kh x kw), Gemm(transB=0) axis 1.
def _weight_axis(node: onnx.NodeProto) -> int:
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return 0


_WEIGHTED = ("Conv", "ConvTranspose", "Gemm")
_TORCH_ACT_CONSUMERS = (*_WEIGHTED, "Add", "Concat")


def qdq_torch_eager(model: onnx.ModelProto, *, samples: int = 4, seed: int = 0, qint8: bool = False,
                    as_computed: bool = False) -> onnx.ModelProto:
    """The pattern a PyTorch eager-mode quantized model exports as, hand-built on ``model``.

    ``qint8=True``: activations quantized as torch.qint8 (signed, symmetric), written as torch 2.5's
    ``torch.onnx.export`` writes them: the quantize stub on the graph input gets an int8 zero-point 0 and
    ``Cast(to=INT8)``, every other activation a *uint8* zero-point 0 and ``Cast(to=UINT8)`` (the
    exporter casts the op's int64 zero-point to uint8), which clamps negative values to 0.
    ``as_computed=True`` writes what PyTorch computed instead: int8 zero-point 0 everywhere, no Cast.

    Activations feeding Conv/ConvTranspose/Gemm/Add/Concat: QuantizeLinear to uint8 with zero-point 128
    ('quint8'), a ``Cast(to=UINT8)`` (the exporter writes one between Q and DQ), DequantizeLinear.
    Weights: int8 initializers, per-channel scale, zero-point 0, behind DequantizeLinear (axis 0; axis 1
    for ConvTranspose, where the output channels are). Biases: int32 initializers behind
    DequantizeLinear with scale = activation scale * weight scale per channel. Activation scales are
    max|x|/127 over onnxruntime forward passes on ``samples`` seeded random batches (the same data
    ``qdq_ort`` calibrates on), so zero-point 128 is exactly
    int8 zero-point 0 shifted (what ``edgeq clean`` relies on to convert it).
    """
    src = model
    model = _copy(model)
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for i, name in enumerate(node.input):
            if node.op_type in _WEIGHTED and i > 0:
                continue
            if node.op_type in _TORCH_ACT_CONSUMERS and name and name not in inits:
                consumers.setdefault(name, []).append(node)
    targets = list(consumers)
    batches = [random_inputs(src, seed=seed * 1000 + i) for i in range(1, samples + 1)]
    ranges = _activation_ranges(src, targets, batches)
    act_scale = {t: max(ranges[t], 1e-6) / 127.0 for t in targets}
    graph_inputs = {i.name for i in g.input}

    new_inits: list[onnx.TensorProto] = []
    prologue: dict[str, list[onnx.NodeProto]] = {}  # nodes to insert before the first consumer

    def add_init(name: str, arr: np.ndarray) -> str:
        new_inits.append(numpy_helper.from_array(arr, name))
        return name

    for t in targets:
        s = add_init(f"{t}_scale", np.array(act_scale[t], dtype=np.float32))
        zp_value = np.array(128, dtype=np.uint8)
        if qint8:
            signed = as_computed or t in graph_inputs
            zp_value = np.array(0, dtype=np.int8 if signed else np.uint8)
        zp = add_init(f"{t}_zero_point", zp_value)
        q = helper.make_node("QuantizeLinear", [t, s, zp], [f"{t}_quantized"], name=f"{t}_QuantizeLinear")
        to = TensorProto.INT8 if zp_value.dtype == np.int8 else TensorProto.UINT8
        cast = helper.make_node("Cast", [f"{t}_quantized"], [f"{t}_quantized_cast"], name=f"{t}_Cast", to=to)
        dq_in = f"{t}_quantized" if as_computed else f"{t}_quantized_cast"
        dq = helper.make_node("DequantizeLinear", [dq_in, s, zp], [f"{t}_dequantized"],
                              name=f"{t}_DequantizeLinear")
        prologue.setdefault(consumers[t][0].name, []).extend([q, dq] if as_computed else [q, cast, dq])
        for node in consumers[t]:
            for i, name in enumerate(node.input):
                if name == t and not (node.op_type in _WEIGHTED and i > 0):
                    node.input[i] = f"{t}_dequantized"

    for node in g.node:
        if node.op_type not in _WEIGHTED or len(node.input) < 2 or node.input[1] not in inits:
            continue
        axis = _weight_axis(node)
        w_name = node.input[1]
        w = numpy_helper.to_array(inits[w_name]).astype(np.float32)
        red = tuple(d for d in range(w.ndim) if d != axis)
        w_scale = np.maximum(np.abs(w).max(axis=red), 1e-8) / 127.0
        shape = [1] * w.ndim
        shape[axis] = -1
        w_q = np.clip(np.round(w / w_scale.reshape(shape)), -127, 127).astype(np.int8)
        tag = f"{node.name}_{w_name}"
        nodes = [helper.make_node(
            "DequantizeLinear",
            [add_init(f"{tag}_quantized", w_q), add_init(f"{tag}_scale", w_scale.astype(np.float32)),
             add_init(f"{tag}_zero_point", np.zeros(w_scale.shape, np.int8))],
            [f"{tag}_dequantized"], name=f"{tag}_DequantizeLinear", axis=axis)]
        node.input[1] = f"{tag}_dequantized"
        a = node.input[0].removesuffix("_dequantized")
        if len(node.input) > 2 and node.input[2] in inits and a in act_scale:
            b_name = node.input[2]
            b = numpy_helper.to_array(inits[b_name]).astype(np.float64)
            b_scale = (act_scale[a] * w_scale).astype(np.float32)
            b_q = np.clip(np.round(b / b_scale), -(2**31), 2**31 - 1).astype(np.int32)
            btag = f"{node.name}_{b_name}"
            nodes.append(helper.make_node(
                "DequantizeLinear",
                [add_init(f"{btag}_quantized", b_q), add_init(f"{btag}_scale", b_scale),
                 add_init(f"{btag}_zero_point", np.zeros(b_scale.shape, np.int32))],
                [f"{btag}_dequantized"], name=f"{btag}_DequantizeLinear", axis=0))
            node.input[2] = f"{btag}_dequantized"
        prologue.setdefault(node.name, []).extend(nodes)

    ordered: list[onnx.NodeProto] = []
    for node in g.node:
        ordered.extend(prologue.get(node.name, []))
        ordered.append(node)
    used = {i for n in ordered for i in n.input}
    kept = [i for i in g.initializer if i.name in used]
    del g.node[:]
    g.node.extend(ordered)
    del g.initializer[:]
    g.initializer.extend(kept + new_inits)
    model.producer_name = "pytorch" if qint8 else "edgeq.zoo (pytorch eager-mode pattern)"
    return model


# --------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------


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
