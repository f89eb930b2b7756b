"""What the TensorRT 8.6 parser accepts as Q/DQ: one entry per form it refuses, with its evidence.

Lint reports these on any Q/DQ model; ``edgeq clean`` repairs what it exactly can (its passes) and
reports what is left through the same entries (``clean_fix`` says what to do when the pass could not).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeq.findings import Level
from edgeq.graph.facts import Decisions, Hit, LintSpec, Match, Pattern
from edgeq.graph.patterns import (
    constant_dtype,
    consumers,
    dtype_name,
    is_constant,
    is_dequantize,
    is_op,
    is_quantize,
    iter_nodes,
    node_label,
    producer,
    qparams,
)
from edgeq.text import noun, plural

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

ORT = "tests/fixtures/trt86-h200"
PARSER_QDQ = "onnx-tensorrt release/8.6-GA builtin_op_importers.cpp (QuantDequantLinearHelper)"
GUIDE = "TensorRT 8.6 Developer Guide"


def _qdq_nodes(graph: gs.Graph) -> list[gs.Node]:
    return [n for n in iter_nodes(graph) if is_quantize(n) or is_dequantize(n)]


def _torch_qint8_nodes(graph: gs.Graph) -> set[str]:
    """Q/DQ nodes in PyTorch's qint8 export pattern (``passes.qdq.torch_qint8_pairs``: one place for it)."""
    from edgeq.graph.passes.qdq import torch_qint8_nodes

    return torch_qint8_nodes(graph, node_label)


def check_torch_qint8(graph: gs.Graph, _m: list[Match], _d: Decisions) -> list[Hit]:
    hits = sorted(_torch_qint8_nodes(graph))
    if not hits:
        return []
    return [Hit(torch_qint8_message(len(hits)), tuple(hits))]


def torch_qint8_message(n: int) -> str:
    """What lint and clean say of PyTorch's qint8 tensors written as uint8 (one sentence for both)."""
    from edgeq.text import plural

    return (f"{plural(n, 'Q/DQ node')} of qint8 tensors PyTorch computed carry the uint8 zero-points "
            "torch.onnx.export writes for them (a qint8 quantize stub upstream, a Cast between Q and DQ): "
            "the file computes a range shifted by 128 (zero-point 0: negatives clamped to 0) where PyTorch "
            "did not")


def check_float16(graph: gs.Graph, _m: list[Match], _d: Decisions) -> list[Hit]:
    """float16/bfloat16 Q/DQ scales below opset 19, where Q/DQ are defined on float32 only."""
    if (graph.opset or 0) >= 19:
        return []
    hits = [
        node_label(n)
        for n in _qdq_nodes(graph)
        if len(n.inputs) > 1 and dtype_name(constant_dtype(n.inputs[1])) in ("float16", "bfloat16")
    ]
    if not hits:
        return []
    return [
        Hit(
            f"{plural(len(hits), 'Q/DQ node')} {noun(len(hits), 'has', 'have')} float16/bfloat16 scales at "
            f"opset {graph.opset}: defined from "
            "opset 19 only, so the ONNX checker and onnxruntime refuse the file",
            tuple(hits),
        )
    ]


def check_uint8(graph: gs.Graph, _m: list[Match], _d: Decisions) -> list[Hit]:
    hits: list[str] = []
    missing_zp: list[str] = []
    torch = _torch_qint8_nodes(graph)  # reported as what they are by qdq-torch-qint8
    for n in _qdq_nodes(graph):
        if node_label(n) in torch:
            continue
        p = qparams(n)
        if p.zero_point_dtype != "uint8":
            continue
        (hits if p.zero_point is not None or is_dequantize(n) else missing_zp).append(node_label(n))
    out = []
    if hits:
        out.append(
            Hit(f"{plural(len(hits), 'Q/DQ node')} {noun(len(hits), 'quantizes', 'quantize')} to uint8; "
                "TensorRT 8.6 takes int8 only", tuple(hits))
        )
    if missing_zp:
        out.append(
            Hit(
                f"{plural(len(missing_zp), 'QuantizeLinear node')} {noun(len(missing_zp), 'has', 'have')} "
                "no zero-point, so ONNX quantizes to uint8; "
                "TensorRT 8.6 takes int8 only",
                tuple(missing_zp),
                fix="give each an int8 zero-point of 0 (`edgeq quantize` writes them so)",
            )
        )
    return out


def check_asymmetric(graph: gs.Graph, _m: list[Match], _d: Decisions) -> list[Hit]:
    """Zero-points off the symmetric centre: int8 other than 0, uint8 other than 128 (uint8 128 is int8 0
    shifted; uint8 0 is a range of 0..255, not symmetric)."""
    import numpy as np

    signed: list[str] = []
    unsigned: list[str] = []
    torch = _torch_qint8_nodes(graph)
    for n in _qdq_nodes(graph):
        p = qparams(n)
        if p.zero_point is None or p.zero_point.size == 0 or node_label(n) in torch:
            continue
        center = 128 if p.zero_point_dtype == "uint8" else 0
        if bool(np.any(p.zero_point.astype(np.int64) != center)):
            (unsigned if p.zero_point_dtype == "uint8" else signed).append(node_label(n))
    out = []
    if signed:
        out.append(
            Hit(
                f"{plural(len(signed), 'Q/DQ node')} {noun(len(signed), 'has', 'have')} non-zero int8 "
                "zero-points; TensorRT 8.6 supports symmetric "
                "quantization only (zero-point 0)",
                tuple(signed),
            )
        )
    if unsigned:
        out.append(
            Hit(
                f"{plural(len(unsigned), 'uint8 Q/DQ node')} {noun(len(unsigned), 'has', 'have')} "
                "zero-points other than 128, so not an exact shift of int8 zero-point 0 (asymmetric); "
                "TensorRT 8.6 supports symmetric quantization only",
                tuple(unsigned),
            )
        )
    return out


def check_scale_invalid(graph: gs.Graph, _m: list[Match], _d: Decisions) -> list[Hit]:
    import numpy as np

    hits = []
    for n in _qdq_nodes(graph):
        s = qparams(n).scale
        if s is not None and s.size and not bool(np.all(np.isfinite(s) & (s > 0))):
            hits.append(node_label(n))
    if not hits:
        return []
    n = len(hits)
    return [Hit(f"{plural(n, 'Q/DQ node')} {noun(n, 'has', 'have')} a zero, negative or non-finite scale",
                tuple(hits))]


def check_cast_between(graph: gs.Graph, _m: list[Match], _d: Decisions) -> list[Hit]:
    """QuantizeLinear -> Cast -> DequantizeLinear, as PyTorch eager-mode export writes it."""
    out = []
    torch = _torch_qint8_nodes(graph)
    for q in _qdq_nodes(graph):
        if not is_quantize(q) or not q.outputs:
            continue
        for cast in consumers(q.outputs[0]):
            if not is_op(cast, "Cast") or not cast.outputs:
                continue
            dqs = [d for d in consumers(cast.outputs[0]) if is_dequantize(d)]
            if dqs:
                out.append(
                    Hit(
                        f"Cast '{node_label(cast)}' sits between QuantizeLinear '{node_label(q)}' and "
                        f"DequantizeLinear '{node_label(dqs[0])}'",
                        (node_label(q), node_label(cast), *(node_label(d) for d in dqs)),
                        fix=TORCH_QINT8_FIX if node_label(q) in torch else None,
                    )
                )
    return out


def check_int32_bias(graph: gs.Graph, _m: list[Match], _d: Decisions) -> list[Hit]:
    hits = [
        node_label(n)
        for n in _qdq_nodes(graph)
        if is_dequantize(n)
        and is_constant(n.inputs[0])
        and dtype_name(constant_dtype(n.inputs[0])) == "int32"
    ]
    if not hits:
        return []
    return [
        Hit(
            f"{plural(len(hits), 'DequantizeLinear node')} {noun(len(hits), 'reads', 'read')} an int32 "
            "constant (quantized bias); the 8.6 parser "
            "fails: 'only activation types allowed as input to this layer'",
            tuple(hits),
        )
    ]


def check_conv_batchnorm(graph: gs.Graph, _m: list[Match], _d: Decisions) -> list[Hit]:
    """A BatchNormalization reading a convolution whose weight is int8 behind a DequantizeLinear."""
    hits = []
    for n in iter_nodes(graph):
        if not is_op(n, "BatchNormalization") or not n.inputs:
            continue
        conv = producer(n.inputs[0])
        if not is_op(conv, "Conv") or len(conv.inputs) < 2:
            continue
        dq = producer(conv.inputs[1])
        if dq is None or not is_dequantize(dq) or not is_constant(dq.inputs[0]):
            continue
        if dtype_name(constant_dtype(dq.inputs[0])) == "int8":
            hits.append(node_label(n))
    if not hits:
        return []
    return [Hit(f"{plural(len(hits), 'BatchNormalization')} after a convolution with int8 weights: "
                "TensorRT 8.6's explicit engine computes wrong outputs for it (measured: top-1 agreement 9 "
                "of 16 where onnxruntime's Q/DQ model agrees 16 of 16)", tuple(hits))]


TORCH_QINT8_FIX = "run `edgeq clean --torch-qint8` (the zero-points read back as int8: what PyTorch computed)"

PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        "qdq-uint8",
        "The 8.6 parser takes int8 Q/DQ only; uint8 zero-point 128 is an exact shift of int8 zero-point 0.",
        f"{PARSER_QDQ}; onnx-tensorrt 8.6 docs/operators.md (DequantizeLinear: INT8); {GUIDE} §7.1 "
        "Introduction to Quantization (signed INT8, symmetric)",
        lint=LintSpec(
            Level.ERROR,
            "uint8 QuantizeLinear/DequantizeLinear",
            "run `edgeq clean` (makes uint8 zero-point 128 int8 zero-point 0, an exact shift; other uint8 "
            "zero-points need `edgeq quantize`)",
            check_uint8,
        ),
        clean_fix="re-quantize to int8 with zero-point 0 (`edgeq quantize` on the float model)",
        kind="qdq",
        precedence=200,
    ),
    Pattern(
        "qdq-asymmetric",
        "TensorRT 8.6 supports symmetric quantization only: zero-point 0.",
        f"{PARSER_QDQ} ('TRT only supports symmetric quantization - zeroPt must be all zeros'); "
        "onnx-tensorrt 8.6 docs/operators.md (QuantizeLinear: y_zero_point must be 0)",
        lint=LintSpec(
            Level.ERROR,
            "zero-point off the symmetric centre (int8 0, uint8 128)",
            "re-quantize symmetric (`edgeq quantize`: int8, zero-point 0)",
            check_asymmetric,
        ),
        clean_fix="re-quantize symmetric (zero-point 0)",
        kind="qdq",
        precedence=200,
    ),
    Pattern(
        "qdq-torch-qint8",
        "torch.onnx.export writes a qint8 tensor after its quantize stub as uint8 Q/DQ (its zero-point "
        "cast to uint8) with a Cast between Q and DQ: the file computes a range shifted by 128 where "
        "PyTorch did not. A quint8 export's uint8 Q/DQ are what PyTorch computed.",
        "torch.onnx symbolic_helper quantize_helper (casts the int64 zero-point to uint8) and "
        "quantize_per_tensor (the stub keeps its type); ONNX QuantizeLinear (uint8 saturates to 0..255); "
        "measured: tests/fixtures/torch-eager (PyTorch 2.11 eager mode, fbgemm quint8 and qnnpack qint8)",
        lint=LintSpec(
            Level.ERROR,
            "uint8 Q/DQ where PyTorch's exporter wrote qint8 tensors",
            TORCH_QINT8_FIX,
            check_torch_qint8,
        ),
        clean_fix="edgeq clean --torch-qint8 (the zero-points read back as int8: what PyTorch computed)",
        kind="qdq",
        precedence=200,
    ),
    Pattern(
        "qdq-float16",
        "Q/DQ scales are float32 below opset 19 (float16/bfloat16 from opset 19), and 8.6 reads opset 17.",
        "ONNX QuantizeLinear-13/DequantizeLinear-13 (scale: tensor(float)); -19 adds float16/bfloat16; "
        f"{PARSER_QDQ}",
        lint=LintSpec(
            Level.ERROR,
            "float16/bfloat16 Q/DQ scales below opset 19",
            "run `edgeq clean` (makes Q/DQ float32 with Casts around them)",
            check_float16,
        ),
        clean_fix="do not skip qdq_float32",
        kind="qdq",
        precedence=200,
    ),
    Pattern(
        "qdq-scale-invalid",
        "Every Q/DQ scale must be positive and finite.",
        f"{PARSER_QDQ} ('Scale coefficients must all be positive')",
        lint=LintSpec(
            Level.ERROR,
            "Q/DQ scale zero, negative or not finite",
            "recalibrate (`edgeq quantize`) so every scale is positive",
            check_scale_invalid,
        ),
        clean_fix="recalibrate (`edgeq quantize`) so every scale is positive",
        kind="qdq",
        precedence=200,
    ),
    Pattern(
        "qdq-cast-between",
        "The 8.6 parser reads DequantizeLinear of INT8 only: a Cast between Q and DQ (PyTorch eager-mode "
        "export) does not parse.",
        f"onnx-tensorrt release/8.6-GA docs/operators.md (DequantizeLinear: INT8 input only); {PARSER_QDQ}",
        lint=LintSpec(
            Level.ERROR,
            "Cast between QuantizeLinear and DequantizeLinear",
            "run `edgeq clean` (removes the Cast and makes the pair int8)",
            check_cast_between,
        ),
        clean_fix="re-export with int8 Q/DQ and no Cast between them",
        kind="qdq",
        precedence=200,
    ),
    Pattern(
        "qdq-int32-bias",
        "A DequantizeLinear of an int32 constant (onnxruntime's quantized bias) does not parse: bias stays "
        "float.",
        f"measured: {ORT}/resnet50_ortqdq.explicit.build.log ('fc.bias_DequantizeLinear: only activation "
        "types allowed as input to this layer')",
        lint=LintSpec(
            Level.ERROR,
            "DequantizeLinear of an int32 constant (onnxruntime's quantized bias)",
            "run `edgeq clean` (folds the bias back to float)",
            check_int32_bias,
        ),
        clean_fix="keep biases float (quantize_bias=False)",
        build_error=r"only activation types allowed as input to this layer",
        kind="qdq",
        precedence=200,
    ),
    Pattern(
        "qdq-conv-batchnorm",
        "A BatchNormalization after a convolution whose weight is int8 behind a DequantizeLinear builds, "
        "but TensorRT 8.6's engine computes wrong outputs; folded into the convolution first (exact for "
        "per-channel int8 weights: q * sign(f), scale * |f|), the same model's engine matches FP32. "
        "Exporters that fold BN (torch.onnx in eval mode, ultralytics) never write it; paddle2onnx does.",
        f"measured: {ORT}-batchnorm/README.md (PP-OCR's direction classifier, 35 BatchNormalization after "
        "quantized convolutions, 4x H200: unfolded, top-1 agreement 9 of 16 and cosine 0.67 with FP32 "
        "where onnxruntime's Q/DQ model agrees 16 of 16; folded, 16 of 16)",
        lint=LintSpec(
            Level.ERROR,
            "BatchNormalization after a convolution with int8 weights",
            "run `edgeq clean` (folds it into the convolution's int8 weights, exactly)",
            check_conv_batchnorm,
        ),
        clean_fix="fold the BatchNormalization into the float model's convolution, then `edgeq quantize`",
        kind="qdq",
        precedence=200,
    ),
)
