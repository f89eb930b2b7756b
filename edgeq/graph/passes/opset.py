"""The model passes that lower a file to what the 8.6 parser was built for: IR version 8 and opset 17
(onnx's version converter, with hand adapters for the ops it cannot take down exactly)."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from edgeq.errors import GraphError, first_line
from edgeq.graph.passes.base import Change, CleanOptions, Unfit

if TYPE_CHECKING:
    import onnx

# Types newer than IR 8: float8 arrived with IR 9, 4-bit ints with IR 10, float4 with IR 11.
_NEWER_THAN_IR8 = (
    "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4", "INT4", "FLOAT4E2M1",
    "FLOAT8E8M0", "UINT2", "INT2",
)  # fmt: skip


def _types_newer_than_ir8() -> dict[int, str]:
    import onnx

    out: dict[int, str] = {}
    for n in _NEWER_THAN_IR8:
        v = getattr(onnx.TensorProto, n, None)
        if v is not None:
            out[int(v)] = n
    return out


def set_ir_version(model: onnx.ModelProto, options: CleanOptions) -> tuple[onnx.ModelProto, list[Change]]:
    """Lower the IR version to 8: the 8.6 parser is built on onnx 1.13 (IR 8).

    Current onnx writes IR 10+, which older onnxruntime builds refuse and the 8.6 parser was never built
    for (edgeq/docs/trt86-rules.md#parsing). Refused when the model uses types IR 8 lacks (float8, int4).
    Runs first: graphsurgeon folds constants with onnxruntime at the graph's IR version, and
    onnxruntime refuses IR versions newer than it knows.
    """
    if model.ir_version <= options.ir_version:
        return model, []
    newer = _types_newer_than_ir8()
    users: list[str] = []
    g = model.graph
    for t in g.initializer:
        if t.data_type in newer:
            users.append(f"{t.name} ({newer[t.data_type]})")
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        et = vi.type.tensor_type.elem_type
        if et in newer:
            users.append(f"{vi.name} ({newer[et]})")
    for n in g.node:
        for a in n.attribute:
            if a.name in ("to", "output_dtype") and a.i in newer:
                users.append(f"{n.name or n.op_type} ({newer[a.i]})")
    if users:
        raise Unfit(
            f"IR version {model.ir_version} cannot be lowered to {options.ir_version}: the model uses "
            f"types IR {options.ir_version} lacks: {', '.join(users[:6])}",
            hint="TensorRT 8.6 has no float8/int4; re-export the model with int8 Q/DQ",
            nodes=tuple(users),
        )
    old = model.ir_version
    model.ir_version = options.ir_version
    return model, [Change("set_ir_version", f"IR version {old} -> {options.ir_version}")]


_HOLD_DOMAIN = "edgeq.hold"


@dataclass(frozen=True)
class _Known:
    """What the hand adapters look up, gathered once per model: a Q/DQ model has hundreds of Q/DQ
    nodes, and rebuilding these maps per node made opset conversion quadratic."""

    types: dict[str, int]  # element type of every tensor whose type the model states
    shapes: dict[str, list[int]]  # inferred shapes (-1: unknown dimension); only gathered for Split


def known_types(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> ONNX element type. Where several say, an initializer wins over value_info and
    graph inputs/outputs, which win over a Constant node's value."""
    g = model.graph
    types: dict[str, int] = {}
    for n in g.node:
        if n.op_type == "Constant":
            value = next((a.t for a in n.attribute if a.name == "value"), None)
            for o in n.output:
                if value is not None and value.data_type:
                    types.setdefault(o, value.data_type)
    for v in list(g.value_info) + list(g.input) + list(g.output):
        if v.type.tensor_type.elem_type:
            types[v.name] = v.type.tensor_type.elem_type
    for t in g.initializer:
        if t.data_type:
            types[t.name] = t.data_type
    return types


def _hand_adapt_qdq(node: onnx.NodeProto, model: onnx.ModelProto, known: _Known) -> str | None:
    """QuantizeLinear/DequantizeLinear 19+ -> 13: drop 'saturate' (it only applies to float8) and the
    other post-13 attributes when they have their default meaning; refuse non-int8/uint8 types."""
    import onnx

    allowed = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8}
    if node.op_type == "DequantizeLinear":
        allowed.add(onnx.TensorProto.INT32)
    typed = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if node.op_type == "DequantizeLinear" and typed is None:
        typed = node.input[0]
    if typed is not None:
        dt = known.types.get(typed)
        if dt and dt not in allowed:
            return f"type {onnx.TensorProto.DataType.Name(dt)} (opset 13 has int8/uint8 only)"
    keep = []
    for a in node.attribute:
        if a.name == "saturate":
            continue  # only defined for float8 outputs, which we refused above
        if a.name == "block_size":
            if a.i != 0:
                return "blocked quantization (block_size) does not exist before opset 21"
            continue
        if a.name == "output_dtype":
            if len(node.input) < 3 and a.i not in (0, onnx.TensorProto.UINT8):
                return "output_dtype without a zero-point does not exist before opset 21"
            continue
        if a.name == "precision":
            return "'precision' does not exist before opset 23"
        keep.append(a)
    del node.attribute[:]
    node.attribute.extend(keep)
    return None


def _hand_adapt_pad(node: onnx.NodeProto, model: onnx.ModelProto, known: _Known) -> str | None:
    """Pad 18/19 -> 13: identical unless the 'axes' input (18) or mode 'wrap' (19) is used."""
    if len(node.input) > 3 and node.input[3]:
        return "the 'axes' input does not exist before opset 18"
    for a in node.attribute:
        if a.name == "mode" and a.s == b"wrap":
            return "mode 'wrap' does not exist before opset 19"
    return None


def _hand_adapt_split(node: onnx.NodeProto, model: onnx.ModelProto, known: _Known) -> str | None:
    """Split 18 -> 13: 'num_outputs' becomes an explicit 'split' input (needs the static axis size)."""
    import numpy as np
    import onnx

    num = next((a.i for a in node.attribute if a.name == "num_outputs"), None)
    if num is None:
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    shape = known.shapes.get(node.input[0])
    if not shape or not (-len(shape) <= axis < len(shape)) or shape[axis] <= 0:
        return "'num_outputs' needs a static size along the split axis"
    dim = shape[axis]
    chunk = -(-dim // num)  # Split-18: ceil(dim / n), the last chunk smaller
    sizes = [min(chunk, dim - i * chunk) for i in range(num)]
    if any(s <= 0 for s in sizes):
        return f"'num_outputs'={num} does not divide axis size {dim}"
    name = f"{node.name or node.output[0]}_split_sizes"
    # Split-13 requires 'split' as an int64 tensor (ONNX spec), so this is the one int64 constant we add.
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(sizes, dtype=np.int64), name))
    while len(node.input) < 2:
        node.input.append("")
    node.input[1] = name
    keep = [a for a in node.attribute if a.name != "num_outputs"]
    del node.attribute[:]
    node.attribute.extend(keep)
    return None


def _hand_adapt_cast(node: onnx.NodeProto, model: onnx.ModelProto, known: _Known) -> str | None:
    """Cast/CastLike 19 -> 13: drop 'saturate', which only applies to float8 targets (refused with
    the IR version: TensorRT 8.6 has no float8); the rest is identical."""
    keep = [a for a in node.attribute if a.name != "saturate"]
    del node.attribute[:]
    node.attribute.extend(keep)
    return None


# Ops onnx's version converter has no down-adapter for (or a wrong one: Q/DQ and Cast keep
# 'saturate'), converted by hand. Each returns None when done, or why it cannot be done exactly.
HAND_ADAPTERS: dict[str, Callable[[onnx.NodeProto, onnx.ModelProto, _Known], str | None]] = {
    "QuantizeLinear": _hand_adapt_qdq,
    "DequantizeLinear": _hand_adapt_qdq,
    "Cast": _hand_adapt_cast,
    "CastLike": _hand_adapt_cast,
    "Pad": _hand_adapt_pad,
    "Split": _hand_adapt_split,
}


def convert_opset(model: onnx.ModelProto, options: CleanOptions) -> tuple[onnx.ModelProto, list[Change]]:
    """Convert opset > 17 down to 17: the TensorRT 8.6 parser's importers follow opset <= 17 semantics.

    Opsets 18-19 moved ReduceX axes to an input and changed Split, Pad, Resize and Q/DQ ('saturate');
    NVIDIA ModelOpt writes int8 Q/DQ models only at opset 19 (edgeq/docs/trt86-rules.md#parsing). Uses
    onnx.version_converter; ops it has no adapter for (Q/DQ, Pad, Split) are converted by hand. If any
    op cannot be converted, the model is left as it was and the blocking nodes are named.
    """
    import onnx
    import onnx.version_converter

    from edgeq.graph.io import infer_shapes, opset_of

    current = opset_of(model)
    if current <= options.opset:
        return model, []
    work = onnx.ModelProto()
    work.CopyFrom(model)
    shapes: dict[str, list[int]] = {}
    if any(n.op_type == "Split" for n in work.graph.node):
        with contextlib.suppress(GraphError):
            inferred = infer_shapes(work)
            for vi in list(inferred.graph.value_info) + list(inferred.graph.input):
                dims = vi.type.tensor_type.shape.dim
                shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else -1 for d in dims]
    known = _Known(known_types(work), shapes)

    blocked: dict[str, str] = {}
    held: list[onnx.NodeProto] = []
    hand_done: list[str] = []
    for n in work.graph.node:
        if n.domain not in ("", "ai.onnx"):
            continue
        adapt = HAND_ADAPTERS.get(n.op_type)
        if adapt is None:
            continue
        before = n.SerializeToString()
        why = adapt(n, work, known)
        if why:
            blocked[n.name or n.op_type] = f"{n.op_type}: {why}"
        else:
            held.append(n)
            if n.SerializeToString() != before:
                hand_done.append(n.name or n.op_type)
    if blocked:
        raise _unfit_opset(current, options.opset, blocked)

    if options.opset < 13:
        # Below 13 these ops have other signatures (Q/DQ without 'axis', Split with a 'split'
        # attribute): the converter's own adapters take them from their opset-13 form.
        held, hand_done = [], []
    # The converter skips nodes of other domains: park the hand-converted nodes in one meanwhile.
    for n in held:
        n.domain = _HOLD_DOMAIN
    work.opset_import.append(onnx.helper.make_opsetid(_HOLD_DOMAIN, 1))
    failed_ops: set[str] = set()
    while True:
        try:
            converted = onnx.version_converter.convert_version(work, options.opset)
            break
        except (RuntimeError, ValueError, onnx.checker.ValidationError) as e:
            op = _op_named_in(str(e), {n.op_type for n in work.graph.node if n.domain in ("", "ai.onnx")})
            if op is None or op in failed_ops:
                raise Unfit(
                    f"opset {current} cannot be converted to {options.opset}: {first_line(e)}",
                    hint=f"re-export the model at opset {options.opset}",
                ) from None
            # Collect every blocking op type, not just the first, by parking it too and retrying.
            failed_ops.add(op)
            msg = _converter_reason(str(e))
            for n in work.graph.node:
                if n.op_type == op and n.domain in ("", "ai.onnx"):
                    blocked[n.name or n.op_type] = f"{op}: {msg}"
                    n.domain = _HOLD_DOMAIN
    if blocked:
        raise _unfit_opset(current, options.opset, blocked)

    for n in converted.graph.node:
        if n.domain == _HOLD_DOMAIN:
            n.domain = ""
    keep = [o for o in converted.opset_import if o.domain != _HOLD_DOMAIN]
    del converted.opset_import[:]
    converted.opset_import.extend(keep)
    converted.ir_version = min(converted.ir_version, model.ir_version) or model.ir_version
    changes = [Change("convert_opset", f"opset {current} -> {options.opset} (onnx version converter)")]
    if hand_done:
        changes.append(
            Change(
                "convert_opset",
                f"converted {len(hand_done)} Q/DQ/Cast/Pad/Split nodes by hand (dropped 'saturate', "
                "num_outputs -> split sizes)",
                tuple(hand_done),
            )
        )
    return converted, changes


def _op_named_in(message: str, ops: set[str]) -> str | None:
    for op in sorted(ops, key=len, reverse=True):
        if re.search(rf"\b{re.escape(op)}\b", message):
            return op
    return None


def _converter_reason(message: str) -> str:
    first = message.strip().splitlines()[0] if message.strip() else "no adapter"
    m = re.search(r"(?:failed|Assertion.*?failed):\s*(.*)$", first)
    return (m.group(1) if m else first).strip()


def _unfit_opset(current: int, target: int, blocked: dict[str, str]) -> Unfit:
    items = list(blocked.items())
    shown = "; ".join(f"{k} ({v})" for k, v in items[:4]) + (
        f" (+{len(items) - 4} more)" if len(items) > 4 else ""
    )
    return Unfit(
        f"opset {current} cannot be converted to {target}: {shown}",
        hint=f"re-export these nodes at opset {target} or replace them",
        nodes=tuple(k for k, _ in items),
    )
