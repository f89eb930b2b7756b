"""The Q/DQ patterns users bring, applied to a zoo model: onnxruntime's ``quantize_static``, NVIDIA
ModelOpt and PyTorch eager mode; and ``random_inputs``, the seeded data they calibrate on."""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeq.graph.io import opset_of


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

    probe = _copy(model)
    have = {o.name for o in probe.graph.output}
    for n in names:
        if n not in have:
            probe.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    from edgeq.graph.io import ort_session

    sess = ort_session(probe)
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
