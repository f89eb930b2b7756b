"""TensorRT 8.6 rules that can be seen in an ONNX graph: what will not parse or build, and what builds
but will not fuse.

Each rule is a read-only function in the one table ``RULES``, with its id, level, one-line fix and the
source it comes from (a section of the TensorRT 8.6 Developer Guide, the onnx-tensorrt 8.6 parser, or
the fixture file where our own engines showed it). Two shapes of rule function:

- ``(graph: gs.Graph) -> list[Finding]`` (``needs="graph"``): most rules; they read an onnx-graphsurgeon
  graph;
- ``(model: onnx.ModelProto) -> list[Finding]`` (``needs="model"``): the two that read what graphsurgeon
  does not keep faithfully (the opset imports and the IR version).

``lint_model`` runs shape inference on a copy first so graph rules see tensor types. Levels: ERROR means
TensorRT 8.6 will not parse or build the model; WARNING means it builds but fuses less, runs layers in a
wider precision or copies data; INFO is worth knowing and costs little.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Callable, Literal

from edgeq.docs import cite
from edgeq.errors import EdgeqError
from edgeq.findings import Finding, Level
from edgeq.graph import fusion, optable
from edgeq.graph.patterns import (
    ACTIVATION_OPS,
    WEIGHTED_OPS,
    QDQPair,
    constant_dtype,
    constant_value,
    consumers,
    dtype_name,
    input_indices,
    is_constant,
    is_dequantize,
    is_op,
    is_quantize,
    is_standard,
    iter_nodes,
    node_label,
    preserves_scale,
    producer,
    qdq_pair_of,
    qparams,
    same_scale,
    silu_input,
    skip_qdq_down,
    skip_qdq_up,
    upstream_dq,
)

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

SUPPORTED_TRT = ("8.6",)

# https://docs.nvidia.com/deeplearning/tensorrt/archives/tensorrt-861/developer-guide/index.html: chapter 7
# "Working with Quantized Types" (7.4 Explicit Quantization; 7.4.4 is anchored #qdq-placement-recs),
# chapter 8 "Working with Dynamic Shapes".
DEV_GUIDE = "TensorRT 8.6 Developer Guide"
QDQ_PLACEMENT = f"{DEV_GUIDE} §7.4.4 Q/DQ Layer-Placement Recommendations"
QDQ_PROCESSING = f"{DEV_GUIDE} §7.4.3 TensorRT Processing of Q/DQ Networks"
PARSER_QDQ = "onnx-tensorrt release/8.6-GA builtin_op_importers.cpp (QuantDequantLinearHelper)"
FIXTURES = "tests/fixtures/trt86-h200"


@dataclass(frozen=True)
class Rule:
    """One TensorRT 8.6 rule: ``check`` finds its hits; the rest says what it means and why we believe it."""

    id: str
    level: Level
    summary: str
    fix: str
    source: str
    check: Callable[..., list[Finding]]
    needs: Literal["graph", "model"] = "graph"


# --------------------------------------------------------------------------------------------------
# Parsing: operators, types, versions
# --------------------------------------------------------------------------------------------------


def check_op_unsupported(graph: gs.Graph) -> list[Finding]:
    """Operators the 8.6 parser has no importer for. Custom-domain ops need a plugin of that name."""
    missing: dict[str, list[str]] = {}
    custom: dict[str, list[str]] = {}
    for n in iter_nodes(graph):
        if is_standard(n):
            if not optable.is_supported(n.op) and not n.op.endswith("_TRT"):
                missing.setdefault(n.op, []).append(node_label(n))
        else:
            custom.setdefault(f"{n.domain}::{n.op}", []).append(node_label(n))
    out = [
        _finding(
            "op-unsupported",
            f"{op} is not in the TensorRT 8.6 ONNX parser's operator table ({len(nodes)} node(s))",
            nodes,
        )
        for op, nodes in missing.items()
    ]
    out += [
        _finding(
            "op-unsupported",
            f"custom operator {op} ({len(nodes)} node(s)): TensorRT 8.6 parses it only through a plugin "
            f"registered as '{op.split('::')[1]}'",
            nodes,
            level=Level.WARNING,
            fix="load the plugin at build time (trtexec --plugins=lib.so), or replace the operator",
        )
        for op, nodes in custom.items()
    ]
    return out


# Operators whose first input's type says nothing about what the layer computes in.
_TYPE_CHECK_SKIP = frozenset({"Cast", "Shape", "Size", "QuantizeLinear", "DequantizeLinear", "Constant"})


def check_op_type_unsupported(graph: gs.Graph) -> list[Finding]:
    """Operators whose data input has a type the 8.6 table does not list for them.

    INT64 tensors are left alone: the parser casts them to INT32 (see ``int64-weights``) and shape
    arithmetic is where they live. Types TensorRT 8.6 cannot hold at all (bfloat16, float8, int16, ...)
    are errors.
    """
    bad_type: dict[tuple[str, str], list[str]] = {}
    unlisted: dict[tuple[str, str], list[str]] = {}
    listed_types: dict[str, frozenset[str]] = {}  # op -> the 8.6 table's types, for the unlisted message
    for n in iter_nodes(graph):
        if not is_standard(n) or n.op in _TYPE_CHECK_SKIP:
            continue
        row = optable.op_support(n.op)
        if row is None or not row.types:
            continue
        if n.op == "ConstantOfShape":
            t = n.outputs[0] if n.outputs else None
        elif n.op == "Where":
            t = n.inputs[1] if len(n.inputs) > 1 else None
        else:
            t = n.inputs[0] if n.inputs else None
        if t is None or not t.name:
            continue
        name = dtype_name(constant_dtype(t))
        if name is None or name == "int64":
            continue
        trt_type = optable.TRT_TYPE_OF_ONNX.get(name)
        if trt_type is None:
            bad_type.setdefault((n.op, name), []).append(node_label(n))
        elif trt_type not in row.types:
            unlisted.setdefault((n.op, name), []).append(node_label(n))
            listed_types[n.op] = row.types
    out = [
        _finding(
            "op-type-unsupported",
            f"{op} reads {name}, a type TensorRT 8.6 does not support ({len(nodes)} node(s))",
            nodes,
            level=Level.ERROR,
        )
        for (op, name), nodes in bad_type.items()
    ]
    out += [
        _finding(
            "op-type-unsupported",
            f"{op} reads {name}; the 8.6 table lists {', '.join(sorted(listed_types[op]))} "
            f"for {op} ({len(nodes)} node(s))",
            nodes,
        )
        for (op, name), nodes in unlisted.items()
    ]
    return out


def check_opset_too_high(model: onnx.ModelProto) -> list[Finding]:
    """Opset above 17: name the nodes whose operator changed after opset 17 (those the 8.6 importers
    would read with the old semantics)."""
    import onnx

    from edgeq.graph.io import opset_of

    opset = opset_of(model)
    if opset <= optable.MAX_OPSET:
        return []
    changed: list[str] = []
    ops: set[str] = set()
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx"):
            continue
        try:
            since = onnx.defs.get_schema(n.op_type, opset, "").since_version
        except onnx.defs.SchemaError:
            continue
        if since > optable.MAX_OPSET:
            changed.append(n.name or n.op_type)
            ops.add(n.op_type)
    detail = f"; operators changed after 17: {', '.join(sorted(ops))}" if ops else ""
    return [
        _finding(
            "opset-too-high",
            f"opset {opset} > {optable.MAX_OPSET}, the newest the TensorRT 8.6 parser implements{detail}",
            changed,
        )
    ]


def check_ir_too_high(model: onnx.ModelProto) -> list[Finding]:
    if model.ir_version <= optable.MAX_IR_VERSION:
        return []
    return [
        _finding(
            "ir-too-high",
            f"IR version {model.ir_version} > {optable.MAX_IR_VERSION}: the 8.6 parser is built on onnx 1.13 "
            "(IR 8); older onnxruntime builds refuse IR 10+",
            [],
        )
    ]


def check_dynamic_shape(graph: gs.Graph) -> list[Finding]:
    """Inputs with symbolic or unknown dimensions: the engine needs an optimization profile."""
    dyn = []
    for t in graph.inputs:
        shape = getattr(t, "shape", None)
        if shape is None or any(not isinstance(d, int) or d < 0 for d in shape):
            dims = (
                "?"
                if shape is None
                else "x".join(str(d) if isinstance(d, int) and d >= 0 else str(d or "?") for d in shape)
            )
            dyn.append((t.name, dims))
    if not dyn:
        return []
    return [
        _finding(
            "dynamic-shape",
            "dynamic input dimensions: "
            + ", ".join(f"{name} ({dims})" for name, dims in dyn)
            + "; lint cannot see optimization profiles, the build needs --minShapes/--optShapes/--maxShapes",
            [name for name, _ in dyn],
        )
    ]


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def check_int64_weights(graph: gs.Graph) -> list[Finding]:
    """INT64 constants the parser casts to INT32: values that do not fit are clamped (WARNING); INT64
    constants fed to data inputs are shape arithmetic constant folding would remove (INFO).

    INT64 where the ONNX schema demands it (Reshape shape, Slice starts, Gather indices, ...) is normal
    and not reported. Slice's ``starts``/``ends`` of +-2**63-1 mean "to the end" and clamp harmlessly.
    """
    import numpy as np

    opset = graph.opset or 17
    clamped: list[str] = []
    foldable: list[str] = []
    seen: set[int] = set()
    for n in iter_nodes(graph):
        for t in n.inputs:
            if not t.name or id(t) in seen or not is_constant(t) or dtype_name(constant_dtype(t)) != "int64":
                continue
            seen.add(id(t))
            readers = [(c, j) for c in consumers(t) for j in input_indices(c, t)]
            v = constant_value(t)
            if v is not None and v.size:
                big = (v < _INT32_MIN) | (v > _INT32_MAX)
                sentinel = np.abs(v) >= 2**62
                if all(c.op == "Slice" and j in (1, 2) for c, j in readers):
                    big &= ~sentinel
                if bool(big.any()):
                    clamped.append(t.name)
                    continue
            if any(_input_accepts_float(c.op, c.domain, j, opset) for c, j in readers):
                foldable.append(t.name)
    out = []
    if clamped:
        out.append(
            _finding(
                "int64-weights",
                f"{len(clamped)} INT64 constant(s) hold values outside INT32: TensorRT 8.6 clamps "
                "them when it casts to INT32",
                clamped,
                level=Level.WARNING,
            )
        )
    if foldable:
        out.append(
            _finding(
                "int64-weights",
                f"{len(foldable)} INT64 constant(s) feed computations (unfolded shape arithmetic): "
                "TensorRT 8.6 casts them to INT32 with a warning",
                foldable,
            )
        )
    return out


@cache
def _input_accepts_float(op: str, domain: str, index: int, opset: int) -> bool:
    """Is input ``index`` of ``op`` a generic data input (its type constraint admits float)?"""
    import onnx

    try:
        schema = onnx.defs.get_schema(op, opset, domain or "")
    except onnx.defs.SchemaError:
        return False
    if not schema.inputs:
        return False
    formal = schema.inputs[min(index, len(schema.inputs) - 1)]
    allowed = next(
        (c.allowed_type_strs for c in schema.type_constraints if c.type_param_str == formal.type_str), None
    )
    if allowed is None:
        return formal.type_str in ("tensor(float)", "tensor(float16)")
    return "tensor(float)" in allowed


# --------------------------------------------------------------------------------------------------
# Q/DQ nodes the 8.6 parser refuses
# --------------------------------------------------------------------------------------------------


def _qdq_nodes(graph: gs.Graph) -> list[gs.Node]:
    return [n for n in iter_nodes(graph) if is_quantize(n) or is_dequantize(n)]


def _torch_qint8_nodes(graph: gs.Graph) -> set[str]:
    """Q/DQ nodes in PyTorch's qint8 export pattern (``passes.torch_qint8_pairs``: one place for it)."""
    from edgeq.graph.passes import torch_qint8_nodes

    return torch_qint8_nodes(graph, node_label)


def check_qdq_torch_qint8(graph: gs.Graph) -> list[Finding]:
    """uint8 zero-point 0 with a Cast between Q and DQ: torch.onnx.export's writing of qint8 tensors."""
    hits = sorted(_torch_qint8_nodes(graph))
    if not hits:
        return []
    return [
        _finding(
            "qdq-torch-qint8",
            f"{len(hits)} Q/DQ node(s) carry the uint8 zero-point 0 that PyTorch's exporter writes for qint8 "
            "tensors (with a Cast between Q and DQ): the file clamps negative values to 0 where PyTorch "
            "did not",
            hits,
        )
    ]


def check_qdq_float16(graph: gs.Graph) -> list[Finding]:
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
        _finding(
            "qdq-float16",
            f"{len(hits)} Q/DQ node(s) have float16/bfloat16 scales at opset {graph.opset}: defined from "
            "opset 19 only, so the ONNX checker and onnxruntime refuse the file",
            hits,
        )
    ]


def check_qdq_uint8(graph: gs.Graph) -> list[Finding]:
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
            _finding(
                "qdq-uint8", f"{len(hits)} Q/DQ node(s) quantize to uint8; TensorRT 8.6 takes int8 only", hits
            )
        )
    if missing_zp:
        out.append(
            _finding(
                "qdq-uint8",
                f"{len(missing_zp)} QuantizeLinear node(s) have no zero-point, so ONNX quantizes to uint8; "
                "TensorRT 8.6 takes int8 only",
                missing_zp,
                fix="give each an int8 zero-point of 0 (`edgeq quantize` writes them so)",
            )
        )
    return out


def check_qdq_asymmetric(graph: gs.Graph) -> list[Finding]:
    """Zero-points off the symmetric centre: int8 other than 0, uint8 other than 128 (uint8 128 is int8 0
    shifted; uint8 0 is a range of 0..255, not symmetric)."""
    import numpy as np

    signed: list[str] = []
    unsigned: list[str] = []
    torch = _torch_qint8_nodes(graph)  # reported as what they are by qdq-torch-qint8
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
            _finding(
                "qdq-asymmetric",
                f"{len(signed)} Q/DQ node(s) have non-zero int8 zero-points; TensorRT 8.6 supports "
                "symmetric quantization only (zero-point 0)",
                signed,
            )
        )
    if unsigned:
        out.append(
            _finding(
                "qdq-asymmetric",
                f"{len(unsigned)} uint8 Q/DQ node(s) have zero-points other than 128, so they are not an "
                "exact shift of int8 zero-point 0 (asymmetric); TensorRT 8.6 supports symmetric "
                "quantization only",
                unsigned,
            )
        )
    return out


def check_qdq_scale_invalid(graph: gs.Graph) -> list[Finding]:
    import numpy as np

    hits = []
    for n in _qdq_nodes(graph):
        s = qparams(n).scale
        if s is not None and s.size and not bool(np.all(np.isfinite(s) & (s > 0))):
            hits.append(node_label(n))
    if not hits:
        return []
    return [
        _finding(
            "qdq-scale-invalid", f"{len(hits)} Q/DQ node(s) have a zero, negative or non-finite scale", hits
        )
    ]


def check_qdq_cast_between(graph: gs.Graph) -> list[Finding]:
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
                    _finding(
                        "qdq-cast-between",
                        f"Cast '{node_label(cast)}' sits between QuantizeLinear '{node_label(q)}' and "
                        f"DequantizeLinear '{node_label(dqs[0])}'",
                        [node_label(q), node_label(cast), *(node_label(d) for d in dqs)],
                        fix=RULES_BY_ID["qdq-torch-qint8"].fix if node_label(q) in torch else None,
                    )
                )
    return out


def check_qdq_int32_bias(graph: gs.Graph) -> list[Finding]:
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
        _finding(
            "qdq-int32-bias",
            f"{len(hits)} DequantizeLinear node(s) read an int32 constant (quantized bias); the 8.6 parser "
            "fails: 'only activation types allowed as input to this layer'",
            hits,
        )
    ]


# --------------------------------------------------------------------------------------------------
# Fusion breakers: builds, but TensorRT 8.6 keeps layers apart
# --------------------------------------------------------------------------------------------------


def _pair_names(pairs: Iterable[QDQPair]) -> list[str]:
    out: list[str] = []
    for p in pairs:
        for name in p.names:
            if name not in out:
                out.append(name)
    return out


def check_fuse_add_both_quantized(graph: gs.Graph) -> list[Finding]:
    """Residual Add with Q/DQ on both inputs while one comes straight from a convolution.

    TensorRT fuses the Add (and a ReLU after it) into that convolution only when the convolution's side
    is not quantized; the skip side should carry the Q/DQ.
    """
    out = []
    for add in iter_nodes(graph):
        if not is_op(add, "Add") or len(add.inputs) != 2 or any(is_constant(t) for t in add.inputs):
            continue
        a, b = add.inputs
        if not (qdq_pair_of(a) and qdq_pair_of(b)):
            continue
        conv_sides = [(t, c) for t in (a, b) if (c := fusion.fused_origin(t)) is not None]
        if not conv_sides:
            continue
        pairs = [qdq_pair_of(t) for t, _ in conv_sides]
        convs = " or ".join(f"{c.op} '{node_label(c)}'" for _, c in conv_sides)
        which = (
            "both inputs come from weighted layers; keep the Q/DQ on one (the skip branch) only"
            if len(conv_sides) == 2
            else "remove the Q/DQ on the input from it"
        )
        out.append(
            _finding(
                "fuse-add-both-quantized",
                f"residual Add '{node_label(add)}' has Q/DQ on both inputs, so it cannot fuse into "
                f"{convs} and runs as a separate PointWise layer: {which}",
                [node_label(add), *_pair_names(p for p in pairs if p is not None)],
            )
        )
    return out


def check_fuse_relu_maxpool(graph: gs.Graph) -> list[Finding]:
    """Conv -> ReLU -> Q/DQ -> MaxPool: the Q/DQ stops Conv+ReLU+MaxPool fusing as CaskConvActPool."""
    out = []
    for pool in iter_nodes(graph):
        found = fusion.act_before_pool(pool)
        if found is None or qdq_pair_of(pool.inputs[0]) is None:
            continue
        act, _, conv = found
        _, crossed = skip_qdq_up(pool.inputs[0])
        out.append(
            _finding(
                "fuse-relu-maxpool",
                f"Q/DQ between '{node_label(act)}' and MaxPool '{node_label(pool)}' after convolution "
                f"'{node_label(conv)}' stops Conv+{act.op}+MaxPool fusing (CaskConvActPool); "
                "quantize after the pool instead",
                [node_label(act), *_pair_names(crossed), node_label(pool)],
            )
        )
    return out


def check_fuse_silu_qdq(graph: gs.Graph) -> list[Finding]:
    """Q/DQ inside a SiLU (x * Sigmoid(x)): 8.6 may find no kernel for the quantized PWN(Sigmoid, Mul).

    "Inside" means on the Sigmoid -> Mul edge, or the Sigmoid and the Mul reading ``x`` through different
    Q/DQ (one quantized copy, one float). One shared Q/DQ on ``x`` itself is the SiLU's input, not inside.
    """
    out = []
    for mul in iter_nodes(graph):
        x = silu_input(mul)
        if x is None:
            continue
        paths = [skip_qdq_up(t) for t in mul.inputs]
        sig_i = next(
            (i for i, (t, _) in enumerate(paths) if is_op(producer(t), "Sigmoid") and paths[1 - i][0] is x),
            None,
        )
        if sig_i is None:
            continue
        sig = producer(paths[sig_i][0])
        assert sig is not None  # sig_i was chosen for a Sigmoid producer
        to_mul = paths[sig_i][1]  # pairs on Sigmoid -> Mul
        _, to_sig = skip_qdq_up(sig.inputs[0])  # pairs on x -> Sigmoid
        direct = paths[1 - sig_i][1]  # pairs on x -> Mul
        split = [p.dq for p in to_sig] != [p.dq for p in direct]
        if not to_mul and not split:
            continue
        inside = list(to_mul) + ([*to_sig, *direct] if split else [])
        out.append(
            _finding(
                "fuse-silu-qdq",
                f"Q/DQ inside the SiLU '{node_label(sig)}' * '{node_label(mul)}': TensorRT 8.6 can "
                "fail to find any implementation for the quantized PWN(Sigmoid, Mul); keep the SiLU in "
                "float and quantize its output",
                [node_label(sig), node_label(mul), *_pair_names(inside)],
            )
        )
    return out


def check_fuse_concat_scales(graph: gs.Graph) -> list[Finding]:
    """Concat inputs quantized with different scales: TensorRT requantizes with copy (Reformat) layers."""
    out = []
    for cat in iter_nodes(graph):
        if not is_op(cat, "Concat"):
            continue
        dqs = []
        for t in cat.inputs:
            dq = upstream_dq(t)
            if dq is not None:
                dqs.append(dq)
        scales = [s for s in (qparams(d).scale for d in dqs) if s is not None]
        if len(dqs) < 2 or len(scales) != len(dqs):  # a scale computed at run time cannot be compared
            continue
        if all(same_scale(scales[0], s) for s in scales[1:]):
            continue
        shown = ", ".join(f"{float(s.ravel()[0]):.4g}" for s in scales if s.size == 1)
        out.append(
            _finding(
                "fuse-concat-scales",
                f"Concat '{node_label(cat)}' joins inputs quantized with "
                f"{len({float(s.ravel()[0]) for s in scales})} "
                f"different scales ({shown}); TensorRT inserts requantizing copies; give its inputs "
                f"one shared scale",
                [node_label(cat), *(node_label(d) for d in dqs)],
            )
        )
    return out


def check_fuse_dangling_dq_q(graph: gs.Graph) -> list[Finding]:
    """An activation DQ whose value reaches a Q with a different scale through data-movement ops only
    (e.g. Conv -> Q/DQ -> Split -> Q/DQ -> Conv): TensorRT keeps a separate requantizing Scale layer.

    DQ -> Q with the same scale is an identity TensorRT removes, so it is not reported.
    """
    out = []
    for dq in _qdq_nodes(graph):
        if not is_dequantize(dq) or is_constant(dq.inputs[0]) or not dq.outputs:
            continue
        s_in = qparams(dq).scale
        stack: list[tuple[gs.Tensor, tuple[str, ...]]] = [(dq.outputs[0], ())]
        seen: set[int] = set()
        while stack:
            t, via = stack.pop()
            for n in consumers(t):
                if id(n) in seen:
                    continue
                seen.add(id(n))
                if is_quantize(n) and n.inputs[0] is t:
                    s_out = qparams(n).scale
                    if s_in is not None and s_out is not None and not same_scale(s_in, s_out):
                        path = " -> ".join(("DQ", *via, "Q"))
                        out.append(
                            _finding(
                                "fuse-dangling-dq-q",
                                f"DequantizeLinear '{node_label(dq)}' feeds QuantizeLinear "
                                f"'{node_label(n)}' with a different scale through data movement only "
                                f"({path}); TensorRT keeps a separate requantizing Scale layer; give both "
                                "one scale or drop the inner pair",
                                [node_label(dq), *via, node_label(n)],
                            )
                        )
                elif preserves_scale(n) and n.inputs and n.inputs[0] is t:
                    for o in n.outputs:
                        stack.append((o, (*via, node_label(n))))
    return out


def _activations(graph: gs.Graph) -> Iterator[tuple[tuple[gs.Node, ...], gs.Tensor]]:
    """``(activation nodes, the tensor they read)``: single-input activations, and SiLUs whose Sigmoid and
    Mul read one tensor (a SiLU split by Q/DQ inside is ``fuse-silu-qdq``'s business)."""
    for n in iter_nodes(graph):
        if not n.inputs or not is_standard(n):
            continue
        if n.op in ACTIVATION_OPS:
            if n.op == "Sigmoid" and any(silu_input(m) is not None for m in consumers(n.outputs[0])):
                continue
            yield (n,), n.inputs[0]
        elif silu_input(n) is not None:
            for i in (0, 1):
                sig = producer(n.inputs[i])
                if is_op(sig, "Sigmoid") and sig.inputs[0] is n.inputs[1 - i]:
                    yield (sig, n), n.inputs[1 - i]


def check_fuse_conv_output_quantized(graph: gs.Graph) -> list[Finding]:
    """Conv (or residual Add) -> Q/DQ -> activation (ReLU, SiLU, ...): the Q/DQ keeps the activation out
    of the convolution.

    Reported only when the chain is exclusive (each tensor read only on the way): otherwise no fusion
    was possible anyway. ConvTranspose is left out on purpose: a public report (TensorRT 10.8) found
    Q/DQ *between* ConvTranspose and its activation the only placement that fused correctly; unverified
    on 8.6, so lint calls neither placement wrong.
    """
    out = []
    for acts, t in _activations(graph):
        if qdq_pair_of(t) is None:
            continue
        float_t, crossed = skip_qdq_up(t)
        if len(consumers(float_t)) != 1 or {id(n) for n in consumers(t)} != {id(n) for n in acts}:
            continue
        if any(len(consumers(p.q.outputs[0])) != 1 for p in crossed) or any(
            len(consumers(p.dq.outputs[0])) != 1 for p in crossed[1:]
        ):
            continue
        p = producer(float_t)
        while p is not None and is_op(p, "BatchNormalization") and len(consumers(p.inputs[0])) == 1:
            p = producer(p.inputs[0])
        residual = is_op(p, "Add") and len(p.inputs) == 2 and not any(is_constant(x) for x in p.inputs)
        if p is None or not ((p.op in WEIGHTED_OPS and p.op != "ConvTranspose") or residual):
            continue
        if len(acts) == 2 and _feeds_silu_residual(acts[1]):
            continue  # silu-add-not-fused: here the Q/DQ before the SiLU is what makes both INT8
        kind = "residual Add" if residual else p.op
        act = "SiLU" if len(acts) == 2 else acts[0].op
        out.append(
            _finding(
                "fuse-conv-output-quantized",
                f"Q/DQ between {kind} '{node_label(p)}' and {act} '{node_label(acts[-1])}' keeps the {act} "
                f"from fusing into the {kind}; quantize after the activation",
                [node_label(p), *_pair_names(crossed), *(node_label(n) for n in acts)],
            )
        )
    return out


def _feeds_silu_residual(mul: gs.Node) -> bool:
    """Is this SiLU's Mul the convolution branch of a residual Add (silu-add-not-fused)?"""
    for t in mul.outputs:
        for add, _, _ in skip_qdq_down(t):
            found = fusion.silu_residual(add)
            if found is not None and found[1] is mul:
                return True
    return False


def _quantized(tensor: gs.Tensor) -> bool:
    """Does ``tensor`` carry INT8 into its reader: a Q/DQ pair on it, or a DQ behind data movement?"""
    return upstream_dq(tensor) is not None  # a Q/DQ pair's DQ included


def check_fuse_concat_conv(graph: gs.Graph) -> list[Finding]:
    """A weighted op reading a Concat whose inputs are quantized, with no Q/DQ of its own on that input:
    TensorRT 8.6 does not carry the DQ forward across the Concat (concat-dq-not-forwarded)."""
    out = []
    for node in iter_nodes(graph):
        if not fusion.has_weight(node) or not node.inputs:
            continue
        t = node.inputs[0]
        cat = fusion.concat_behind(t)
        if cat is None or not any(_quantized(x) for x in cat.inputs if not is_constant(x)):
            continue
        out.append(
            _finding(
                "fuse-concat-conv",
                f"{node.op} '{node_label(node)}' reads Concat '{node_label(cat)}' whose inputs are quantized "
                "but has no Q/DQ of its own: TensorRT 8.6 concatenates in FP16 and runs it in FP16/FP32; "
                "add a Q/DQ on the Concat's output (the Concat's scale) right before it",
                [node_label(node), *(node_label(n) for n in fusion.epilogue(node)), node_label(cat)],
            )
        )
    return out


def check_fuse_silu_residual(graph: gs.Graph) -> list[Finding]:
    """A residual Add whose convolution branch is a SiLU of a float convolution output while the skip is
    quantized: Conv+SiLU+Add cannot fuse, so the SiLU+Add PointWise runs FP16 behind reformats."""
    out = []
    for add in iter_nodes(graph):
        found = fusion.silu_residual(add)
        if found is None:
            continue
        sig, mul, x, skip = found
        if qdq_pair_of(x) is not None or not _quantized(skip):
            continue
        conv = fusion.fused_origin(x, through_activations=False)
        assert conv is not None  # silu_residual checked it
        out.append(
            _finding(
                "fuse-silu-residual",
                f"residual Add '{node_label(add)}' reads the SiLU '{node_label(sig)}' * "
                f"'{node_label(mul)}' of {conv.op} '{node_label(conv)}' in float: TensorRT 8.6 cannot fuse "
                "Conv+SiLU+Add, so PWN(Sigmoid, Mul, Add) runs FP16 behind reformats; quantize the "
                "convolution's output (one Q/DQ read by both the Sigmoid and the Mul)",
                [node_label(conv), node_label(sig), node_label(mul), node_label(add)],
            )
        )
    return out


def check_fuse_pool_input_float(graph: gs.Graph) -> list[Finding]:
    """An averaging op reading a quantized convolution chain with its own input float: the convolution
    (with its Add and ReLU) and the pool end FP16 (pool-input-float)."""
    out = []
    for pool in iter_nodes(graph):
        conv = fusion.averaging_tail(pool)
        if conv is None or qdq_pair_of(pool.inputs[0]) is not None or not _quantized(conv.inputs[0]):
            continue
        out.append(
            _finding(
                "fuse-pool-input-float",
                f"{pool.op} '{node_label(pool)}' reads the chain of {conv.op} '{node_label(conv)}' in float: "
                "that convolution ends FP16 and the pool runs FP16; quantize the pool's input",
                [node_label(conv), *(node_label(n) for n in fusion.epilogue(conv)), node_label(pool)],
            )
        )
    return out


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------

_PLACE = "run `edgeq quantize --placement trt` on the float model"

RULES: tuple[Rule, ...] = (
    Rule(
        "op-unsupported",
        Level.ERROR,
        "operator not in the TensorRT 8.6 ONNX parser's table",
        "replace the operator, or build with a TensorRT plugin of that name",
        optable.SOURCE,
        check_op_unsupported,
    ),
    Rule(
        "op-type-unsupported",
        Level.WARNING,
        "operator fed a type the 8.6 table does not list for it",
        "cast to a listed type before the operator (FP32/FP16 for most float ops)",
        optable.SOURCE + ' ("Supported Types" column; INT64 cast to INT32, DOUBLE to FLOAT)',
        check_op_type_unsupported,
    ),
    Rule(
        "opset-too-high",
        Level.ERROR,
        "opset above 17",
        "run `edgeq clean` (converts the model down to opset 17)",
        "onnx-tensorrt release/8.6-GA docs/operators.md ('TensorRT 8.6 supports operators up to Opset 17')",
        check_opset_too_high,
        needs="model",
    ),
    Rule(
        "ir-too-high",
        Level.WARNING,
        "IR version above 8",
        "run `edgeq clean` (sets IR version 8)",
        "onnx-tensorrt release/8.6-GA third_party/onnx at v1.13 (IR 8); "
        f"{FIXTURES}/*.build.log ('ONNX IR version: 0.0.7' for every model 8.6 built)",
        check_ir_too_high,
        needs="model",
    ),
    Rule(
        "qdq-uint8",
        Level.ERROR,
        "uint8 QuantizeLinear/DequantizeLinear",
        "run `edgeq clean` (makes uint8 zero-point 128 int8 zero-point 0, an exact shift; other uint8 "
        "zero-points need `edgeq quantize`)",
        f"{PARSER_QDQ}; onnx-tensorrt 8.6 docs/operators.md (DequantizeLinear: INT8); "
        f"{DEV_GUIDE} §7.1 Introduction to Quantization (signed INT8, symmetric)",
        check_qdq_uint8,
    ),
    Rule(
        "qdq-asymmetric",
        Level.ERROR,
        "zero-point off the symmetric centre (int8 0, uint8 128)",
        "re-quantize symmetric (`edgeq quantize`: int8, zero-point 0)",
        f"{PARSER_QDQ} ('TRT only supports symmetric quantization - zeroPt must be all zeros'); "
        "onnx-tensorrt 8.6 docs/operators.md (QuantizeLinear: y_zero_point must be 0)",
        check_qdq_asymmetric,
    ),
    Rule(
        "qdq-torch-qint8",
        Level.ERROR,
        "uint8 zero-point 0 where PyTorch's exporter wrote qint8 tensors (clamps negatives to 0)",
        "run `edgeq clean --torch-qint8` (int8 zero-point 0: what PyTorch computed)",
        "torch.onnx symbolic_helper quantize_helper (casts the int64 zero-point to uint8); "
        "ONNX QuantizeLinear (uint8 saturates to 0..255)",
        check_qdq_torch_qint8,
    ),
    Rule(
        "qdq-float16",
        Level.ERROR,
        "float16/bfloat16 Q/DQ scales below opset 19",
        "run `edgeq clean` (makes Q/DQ float32 with Casts around them)",
        "ONNX QuantizeLinear-13/DequantizeLinear-13 (scale: tensor(float)); -19 adds float16/bfloat16; "
        f"{PARSER_QDQ}",
        check_qdq_float16,
    ),
    Rule(
        "qdq-scale-invalid",
        Level.ERROR,
        "Q/DQ scale zero, negative or not finite",
        "recalibrate (`edgeq quantize`) so every scale is positive",
        f"{PARSER_QDQ} ('Scale coefficients must all be positive')",
        check_qdq_scale_invalid,
    ),
    Rule(
        "qdq-cast-between",
        Level.ERROR,
        "Cast between QuantizeLinear and DequantizeLinear (PyTorch eager-mode export)",
        "run `edgeq clean` (removes the Cast and makes the pair int8)",
        "onnx-tensorrt release/8.6-GA docs/operators.md (DequantizeLinear: INT8 input only, x_zero_point "
        f"zero); {PARSER_QDQ}",
        check_qdq_cast_between,
    ),
    Rule(
        "qdq-int32-bias",
        Level.ERROR,
        "DequantizeLinear of an int32 constant (onnxruntime's quantized bias)",
        "run `edgeq clean` (folds the bias back to float)",
        f"measured: {FIXTURES}/resnet50_ortqdq.explicit.build.log ('fc.bias_DequantizeLinear: only "
        "activation types allowed as input to this layer')",
        check_qdq_int32_bias,
    ),
    Rule(
        "dynamic-shape",
        Level.WARNING,
        "input with dynamic dimensions",
        "build with --minShapes/--optShapes/--maxShapes (trtexec names), or export with fixed shapes",
        f"{DEV_GUIDE} §8 Working with Dynamic Shapes (optimization profiles)",
        check_dynamic_shape,
    ),
    Rule(
        "int64-weights",
        Level.INFO,
        "INT64 constants the parser casts to INT32",
        "run `edgeq clean` (folds constants and shape subgraphs)",
        f"measured: {FIXTURES}/yolo_ortfb.explicit.build.log (onnx2trt_utils.cpp:374 'INT64 weights ... "
        "Attempting to cast down to INT32'); onnx-tensorrt onnx2trt_utils.cpp convertINT64 ('One or more "
        "weights outside the range of INT32 was clamped')",
        check_int64_weights,
    ),
    Rule(
        "fuse-add-both-quantized",
        Level.WARNING,
        "Q/DQ on both inputs of a residual Add fed by a convolution",
        _PLACE + " (quantizes only the skip branch)",
        f"measured: {FIXTURES}/resnet50_ortfb.explicit.layers.json (16 unfused PointWiseV2 Add+Relu layers, "
        f"0.73x implicit) vs resnet50_placed.explicit.layers.json (0); {QDQ_PLACEMENT}",
        check_fuse_add_both_quantized,
    ),
    Rule(
        "fuse-relu-maxpool",
        Level.WARNING,
        "Q/DQ between a convolution's ReLU and the MaxPool after it",
        _PLACE + " (quantizes after the pool)",
        f"measured: {FIXTURES}/resnet50_placed.explicit.layers.json and resnet50.implicit.layers.json "
        "(CaskConvActPool '/conv1/Conv + /relu/Relu + /maxpool/MaxPool') vs "
        "resnet50_ortfb.explicit.layers.json (conv1 and maxpool separate)",
        check_fuse_relu_maxpool,
    ),
    Rule(
        "fuse-silu-qdq",
        Level.ERROR,
        "Q/DQ inside a SiLU (Sigmoid * Mul)",
        _PLACE + " (keeps the SiLU in float, quantizes its output)",
        f"measured build failure: {FIXTURES}/yolo_ortfb.explicit.build.log ('Could not find any "
        "implementation for node PWN(PWN(.../Sigmoid), PWN(.../Mul))' for the stem's SiLU)",
        check_fuse_silu_qdq,
    ),
    Rule(
        "fuse-concat-scales",
        Level.WARNING,
        "Concat inputs quantized with different scales",
        _PLACE + " (one shared scale across a Concat's inputs)",
        "measured: trt86-h200 fixture set README, yolo implicit INT8 (27 interior Reformat copies around "
        f"the C2f split/concat and SPPF concat); {QDQ_PROCESSING} (Q/DQ propagation through Concat)",
        check_fuse_concat_scales,
    ),
    Rule(
        "fuse-dangling-dq-q",
        Level.WARNING,
        "DQ -> (data movement) -> Q with a different scale between convolutions",
        _PLACE + " (one scale through Split/Slice, no inner Q/DQ pair)",
        "NVIDIA/TensorRT issue #3861 (Q/DQ around Split/Concat in a YOLO bottleneck: 'from the first conv "
        "to the second conv there is a scale introduced'); not yet measured in our fixtures",
        check_fuse_dangling_dq_q,
    ),
    Rule(
        "fuse-conv-output-quantized",
        Level.WARNING,
        "Q/DQ between a convolution (or residual Add) and its activation",
        _PLACE + " (does not quantize weighted ops' outputs)",
        f"measured: {FIXTURES}/resnet50_placed.explicit.layers.json (Q/DQ between Conv/Add and ReLU removed: "
        f"all convolutions fused with their ReLU); {QDQ_PLACEMENT} (do not quantize outputs of weighted ops)",
        check_fuse_conv_output_quantized,
    ),
    Rule(
        "fuse-concat-conv",
        Level.WARNING,
        "convolution reading a quantized Concat without a Q/DQ of its own",
        _PLACE + " (a Q/DQ on the Concat's output before each convolution that reads it)",
        fusion.fact("concat-dq-not-forwarded").evidence,
        check_fuse_concat_conv,
    ),
    Rule(
        "fuse-silu-residual",
        Level.WARNING,
        "SiLU branch of a residual Add reading a float convolution output",
        _PLACE + " (quantizes the convolution's output before the SiLU)",
        fusion.fact("silu-add-not-fused").evidence,
        check_fuse_silu_residual,
    ),
    Rule(
        "fuse-pool-input-float",
        Level.WARNING,
        "averaging pool reading a quantized convolution chain in float",
        _PLACE + " (quantizes the pool's input)",
        fusion.fact("pool-input-float").evidence,
        check_fuse_pool_input_float,
    ),
)

RULES_BY_ID: dict[str, Rule] = {r.id: r for r in RULES}

# Rules whose findings mean "builds, but Q/DQ placement keeps layers from fusing" (``fuse-*``): what the
# ``trt`` placement must never produce.
FUSION_RULE_IDS: tuple[str, ...] = tuple(r.id for r in RULES if r.id.startswith("fuse-"))


def _finding(
    rule_id: str, message: str, nodes: Iterable[str], *, level: Level | None = None, fix: str | None = None
) -> Finding:
    rule = RULES_BY_ID[rule_id]
    return Finding(
        level=level or rule.level,
        rule=rule_id,
        message=message,
        fix=fix or rule.fix,
        source=cite(rule_id),  # the shipped section holds this rule's evidence (``Rule.source``)
        nodes=tuple(nodes),
    )


# --------------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------------


def normalize_trt(version: str) -> str:
    """``8.6``, ``8.6.1``, ``8.6.2.3`` -> ``8.6``; anything else is a usage error naming what is supported."""
    v = str(version).strip()
    major_minor = ".".join(v.split(".")[:2])
    if major_minor in SUPPORTED_TRT:
        return major_minor
    raise EdgeqError(
        f"TensorRT {v!s} is not supported by edgeq lint",
        hint=f"supported: {', '.join(SUPPORTED_TRT)}",
        exit_code=2,
    )


def select_rules(rules: Iterable[str] | None = None) -> list[Rule]:
    if rules is None:
        return list(RULES)
    wanted = list(dict.fromkeys(rules))
    unknown = [r for r in wanted if r not in RULES_BY_ID]
    if unknown:
        raise EdgeqError(f"unknown rule id(s): {', '.join(unknown)}", hint=f"known: {', '.join(RULES_BY_ID)}")
    return [r for r in RULES if r.id in wanted]


def lint_model(
    model: onnx.ModelProto, *, trt: str = "8.6", rules: Iterable[str] | None = None
) -> list[Finding]:
    """Every finding TensorRT ``trt`` would give this model, most severe first. The model is not changed."""
    from edgeq.graph.io import typed_graph_from_model

    normalize_trt(trt)
    selected = select_rules(rules)
    graph = typed_graph_from_model(model)
    found: list[Finding] = []
    for rule in selected:
        found.extend(rule.check(model) if rule.needs == "model" else rule.check(graph))
    return sort_findings(found)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    order = {r.id: i for i, r in enumerate(RULES)}
    return sorted(findings, key=lambda f: (f.level.rank, order.get(f.rule, len(order))))


def summarize(findings: Sequence[Finding]) -> dict[str, Any]:
    """Counts by level and by rule, for JSON output and reports."""
    by_level = {lv.value: sum(f.level == lv for f in findings) for lv in Level}
    by_rule: dict[str, int] = {}
    for f in findings:
        by_rule[f.rule] = by_rule.get(f.rule, 0) + 1
    return {"total": len(findings), "by_level": by_level, "by_rule": by_rule}
