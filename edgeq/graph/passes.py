"""Cleaning passes: each one small, named, testable alone, and reporting what it changed.

A graph pass is ``(graph: gs.Graph, options: CleanOptions) -> list[Change]`` and edits the graphsurgeon
graph in place. Two passes need the ``onnx.ModelProto`` itself (the IR version and the opset import
live outside the graph, and ``onnx.version_converter`` works on models); they have the signature
``(model, options) -> tuple[onnx.ModelProto, list[Change]]``. A pass either makes an exact change or
leaves the graph alone: what it cannot fix exactly is left for ``clean.fit_findings`` to name, or, for
the all-or-nothing model passes, raised as ``Unfit`` (which ``clean_model`` turns into an ERROR finding).

Sources cited in docstrings: ``edgeq/docs/trt86-rules.md`` (the shipped rules, from the TensorRT 8.6
developer guide, the onnx-tensorrt 8.6 importers and the measured logs in ``tests/fixtures/trt86-h200``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Union

from edgeq.errors import GraphError, first_line
from edgeq.graph.patterns import constant_value, producer

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnx_graphsurgeon as gs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CleanOptions:
    """What ``edgeq clean`` aims for. Defaults are TensorRT 8.6's limits (opset 17, IR 8).

    Tolerances are for ``--verify``; every Q/DQ rewrite here is exact, so they only absorb float
    reordering from constant folding (elementwise: a value fails when it is beyond both atol and rtol,
    as Polygraphy's comparator does).
    """

    opset: int = 17
    ir_version: int = 8
    verify: bool = True
    atol: float = 1e-4
    rtol: float = 1e-3
    seed: int = 0
    skip: tuple[str, ...] = ()
    # The file came from PyTorch's exporter with qint8 activations: its uint8 zero-point 0 Q/DQ become
    # int8 zero-point 0, restoring what PyTorch computed (a deliberate change; see qdq_torch_qint8).
    torch_qint8: bool = False

    def __post_init__(self) -> None:
        # The 8.6 parser reads opsets back to 7; the version converter has no adapters below that.
        if not 7 <= self.opset <= 17:
            raise GraphError(f"--opset {self.opset}: TensorRT 8.6 parses opsets 7 to 17", "use --opset 17")
        if not (self.atol >= 0 and self.rtol >= 0):  # NaN too: every comparison with it passes
            raise GraphError(f"tolerances must be >= 0 (--atol {self.atol}, --rtol {self.rtol})")


@dataclass(frozen=True)
class Change:
    """One thing a pass changed: the pass name, what it did, and the nodes involved."""

    pass_name: str
    message: str
    nodes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"pass": self.pass_name, "message": self.message, "nodes": list(self.nodes)}


class Unfit(GraphError):
    """A whole-model pass cannot make the model fit; ``nodes`` names what blocks it."""

    def __init__(self, message: str, hint: str | None = None, *, nodes: tuple[str, ...] = ()) -> None:
        super().__init__(message, hint, exit_code=1)
        self.nodes = nodes


GraphPass = Callable[["gs.Graph", CleanOptions], "list[Change]"]
ModelPass = Callable[["onnx.ModelProto", CleanOptions], "tuple[onnx.ModelProto, list[Change]]"]


@dataclass(frozen=True)
class Pass:
    name: str
    fn: Union[GraphPass, ModelPass]
    kind: Literal["model", "graph"]

    @property
    def summary(self) -> str:
        doc = (self.fn.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------



def node_name(node: gs.Node) -> str:
    if node.name:
        return node.name
    out = next((t.name for t in node.outputs if t.name), "?")
    return f"{node.op}->{out}"


@contextlib.contextmanager
def quiet_graphsurgeon() -> Iterator[None]:
    """graphsurgeon logs to stdout; library code never prints, so silence it for the duration."""
    from onnx_graphsurgeon.logger import G_LOGGER

    from edgeq.graph.io import quiet_onnxruntime

    quiet_onnxruntime()  # graphsurgeon folds constants in onnxruntime sessions of its own
    old = G_LOGGER.severity
    G_LOGGER.severity = G_LOGGER.CRITICAL
    try:
        yield
    finally:
        G_LOGGER.severity = old


def _onnx_dtype(dtype: Any) -> int | None:
    """graphsurgeon stores numpy dtypes (or, for types numpy lacks, onnx enums)."""
    import numpy as np
    import onnx

    if dtype is None:
        return None
    if isinstance(dtype, int):
        return dtype
    try:
        return int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    except (TypeError, KeyError, ValueError):
        return None


def _const(t: gs.Tensor) -> np.ndarray | None:
    import onnx_graphsurgeon as gs

    return t.values if isinstance(t, gs.Constant) else None


def _opt_input(node: gs.Node, i: int) -> gs.Tensor | None:
    if len(node.inputs) > i and not node.inputs[i].is_empty():
        return node.inputs[i]
    return None


def _replace_input(consumer: gs.Node, old: gs.Tensor, new: gs.Tensor) -> None:
    for i, t in enumerate(consumer.inputs):
        if t is old:
            consumer.inputs[i] = new


def bypass(graph: gs.Graph, node: gs.Node) -> bool:
    """Remove a one-in/one-out node, wiring its input straight to its consumers.

    Keeps graph output names: if the node wrote a graph output, its producer writes it instead.
    Returns False (and changes nothing) when that cannot be done without renaming a graph tensor.
    """
    import onnx_graphsurgeon as gs

    inp, out = node.inputs[0], node.outputs[0]
    if out in graph.outputs:
        prod = producer(inp)
        if (
            prod is None
            or isinstance(inp, gs.Constant)
            or inp in graph.inputs
            or inp in graph.outputs
            or len(prod.outputs) == 0
        ):
            return False
        for consumer in list(inp.outputs):
            if consumer is not node:
                _replace_input(consumer, inp, out)
        node.outputs.clear()
        node.inputs.clear()
        prod.outputs[prod.outputs.index(inp)] = out
        return True
    for consumer in list(out.outputs):
        _replace_input(consumer, out, inp)
    node.outputs.clear()
    node.inputs.clear()
    return True


def _prune(graph: gs.Graph) -> None:
    """Drop the nodes this pass disconnected, and only those: dead code is remove_unused's to report."""
    graph.nodes = [n for n in graph.nodes if len(n.outputs)]


def _q_type(q: gs.Node) -> int:
    """The integer type a QuantizeLinear produces: its zero-point's type, else output_dtype, else uint8."""
    import onnx

    zp = _opt_input(q, 2)
    if zp is not None:
        dt = _onnx_dtype(zp.dtype)
        if dt is not None:
            return dt
    return int(q.attrs.get("output_dtype", 0)) or onnx.TensorProto.UINT8


def _broadcast_param(values: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """Shape a per-axis scale/zero-point so it broadcasts against the tensor (ONNX Q/DQ 'axis')."""
    if values.ndim == 0 or values.size == 1:
        return values.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = values.size
    return values.reshape(shape)


# --------------------------------------------------------------------------------------------------
# model passes
# --------------------------------------------------------------------------------------------------

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


def _known_types(model: onnx.ModelProto) -> dict[str, int]:
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
    known = _Known(_known_types(work), shapes)

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


def qdq_float32(model: onnx.ModelProto, options: CleanOptions) -> tuple[onnx.ModelProto, list[Change]]:
    """Make float16/bfloat16 Q/DQ float32 below opset 19, where Q/DQ are defined on float32 only.

    NVIDIA ModelOpt's default int8 output is an fp16 network with fp16 Q/DQ scales at opset 19; lowered
    to 17 as it is, the file fails the checker and onnxruntime. TensorRT 8.6 reads float32 Q/DQ
    (edgeq/docs/trt86-rules.md#qdq-float16). Scales become float32 of the same values (exact); a
    QuantizeLinear reads its input through a Cast to float32 (exact), a DequantizeLinear writes float32
    and a Cast takes it back to the network's type (the one rounding, as the fp16 DequantizeLinear did).
    """
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from edgeq.graph.io import half_types, opset_of

    if opset_of(model) >= 19:
        return model, []
    half = half_types()
    g = model.graph
    types = _known_types(model)
    inits = {t.name: t for t in g.initializer}
    taken = {o for n in g.node for o in n.output} | set(inits) | {i.name for i in g.input}

    def fresh(base: str) -> str:
        name, i = base, 1
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        taken.add(name)
        return name

    f32: dict[str, str] = {}  # half initializer -> its float32 copy

    def as_float32(t: str, before: list[onnx.NodeProto], label: str) -> str:
        if t in inits:
            if t not in f32:
                f32[t] = fresh(f"{t}_float32")
                values = numpy_helper.to_array(inits[t]).astype(np.float32)
                g.initializer.append(numpy_helper.from_array(values, f32[t]))
            return f32[t]
        out = fresh(f"{t}_float32")
        before.append(helper.make_node("Cast", [t], [out], to=onnx.TensorProto.FLOAT, name=fresh(label)))
        return out

    nodes: list[onnx.NodeProto] = []
    q_casts: list[str] = []
    dq_casts: list[str] = []
    for n in g.node:
        scale_type = types.get(n.input[1], 0) if len(n.input) > 1 else 0
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") or n.domain not in ("", "ai.onnx"):
            nodes.append(n)
            continue
        if scale_type not in half:
            nodes.append(n)
            continue
        label = n.name or n.output[0]
        before: list[onnx.NodeProto] = []
        after: list[onnx.NodeProto] = []
        n.input[1] = as_float32(n.input[1], before, f"{label}_scale_to_float32")
        if n.op_type == "QuantizeLinear":
            n.input[0] = as_float32(n.input[0], before, f"{label}_input_to_float32")
            if before and before[-1].output[0] == n.input[0]:
                q_casts.append(before[-1].name)
        else:
            out = n.output[0]
            n.output[0] = fresh(f"{out}_float32")
            back = fresh(f"{label}_to_half")
            cast = helper.make_node("Cast", [n.output[0]], [out], to=scale_type, name=back)
            after.append(cast)
            dq_casts.append(cast.name)
        nodes.extend([*before, n, *after])
    if not q_casts and not dq_casts and not f32:
        return model, []
    del g.node[:]
    g.node.extend(nodes)
    used = {i for n in g.node for i in n.input}
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    changes = [Change("qdq_float32", f"{len(f32)} float16/bfloat16 Q/DQ scales -> float32 (exact)")]
    if q_casts or dq_casts:
        changes.append(
            Change(
                "qdq_float32",
                f"inserted {len(q_casts)} Cast to float32 before QuantizeLinear and {len(dq_casts)} Cast "
                "back after DequantizeLinear: each converts one tensor elementwise, a layer of its own "
                "in TensorRT 8.6 unless the builder folds it into the Q/DQ (unmeasured)",
                tuple(q_casts + dq_casts),
            )
        )
    return model, changes


# --------------------------------------------------------------------------------------------------
# graph passes
# --------------------------------------------------------------------------------------------------


def fold_constants(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Fold constant subgraphs and static shape computations into initializers (graphsurgeon).

    TensorRT 8.6 casts INT64 weights down with a warning and handles shape arithmetic poorly;
    folding beforehand avoids most of both (edgeq/docs/trt86-rules.md#parsing). graphsurgeon never folds
    Q/DQ nodes, so quantized weights stay int8 + DequantizeLinear as TensorRT needs them.
    """
    import onnx_graphsurgeon as gs

    fold_shapes = True
    risky = _cast_elision_hazards(graph)
    changes: list[Change] = []
    if risky:
        # graphsurgeon's shape-cast elision casts float constants to int (0.5 -> 0): skip shape folding.
        fold_shapes = False
        changes.append(
            Change(
                "fold_constants",
                "shape folding skipped: graphsurgeon's shape-cast elision would truncate fractional "
                "constants feeding these nodes",
                tuple(node_name(n) for n in risky),
            )
        )
    before = [(n, list(n.outputs)) for n in graph.nodes]
    with quiet_graphsurgeon():
        try:
            graph.fold_constants(fold_shapes=fold_shapes, error_ok=False)
        except Exception as e:  # onnxruntime failures surface as many types; retry per partition
            log.info("constant folding failed as a whole (%s); retrying per partition", e)
            graph.fold_constants(fold_shapes=fold_shapes, partitioning="recursive", error_ok=True)
    # graphsurgeon turns a folded node's outputs into Constants in place (and may detach them).
    done = [n for n, outs in before if outs and all(isinstance(t, gs.Constant) for t in outs)]
    folded = [n for n in done if n.op != "Constant"]
    lowered = [n for n in done if n.op == "Constant"]
    for n in folded + lowered:
        n.outputs.clear()
        n.inputs.clear()
    _prune(graph)
    if folded:
        ops = sorted({n.op for n in folded})
        changes.append(
            Change(
                "fold_constants",
                f"folded {len(folded)} constant nodes ({', '.join(ops)}) into initializers",
                tuple(node_name(n) for n in folded),
            )
        )
    if lowered:
        changes.append(
            Change(
                "fold_constants",
                f"turned {len(lowered)} Constant nodes into initializers",
                tuple(node_name(n) for n in lowered),
            )
        )
    return changes


_ELISION_OPS = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Greater", "Less", "Concat"}


def _cast_elision_hazards(graph: gs.Graph) -> list[gs.Node]:
    """Nodes graphsurgeon's shape-cast elision would rewrite with a fractional float constant."""
    import numpy as np
    import onnx

    out = []
    for n in graph.nodes:
        if n.op not in _ELISION_OPS:
            continue
        ins = [producer(t) for t in n.inputs]
        if not any(
            p is not None and p.op == "Cast" and p.attrs.get("to") == onnx.TensorProto.FLOAT for p in ins
        ):
            continue
        consts = [c for c in (_const(t) for t in n.inputs) if c is not None]
        if any(c.dtype.kind == "f" and not np.all(np.mod(c, 1) == 0) for c in consts):
            out.append(n)
    return out


def _is_noop(graph: gs.Graph, node: gs.Node) -> str | None:
    if len(node.inputs) == 0 or len(node.outputs) == 0 or node.inputs[0].is_empty():
        return None
    if node.op == "Identity":
        return "Identity"
    if node.op == "Dropout":
        training = _opt_input(node, 2)
        if training is not None:
            v = _const(training)
            if v is None or bool(v.any()):
                return None
        if (
            len(node.outputs) > 1
            and not node.outputs[1].is_empty()
            and (node.outputs[1].outputs or node.outputs[1] in graph.outputs)
        ):
            return None  # the mask is used
        return "Dropout (inference)"
    if node.op == "Cast":
        prod = producer(node.inputs[0])
        if prod is not None and prod.op == "QuantizeLinear":
            return None  # Q -> Cast -> DQ is qdq_remove_casts' job
        src = _onnx_dtype(node.inputs[0].dtype)
        if src is not None and src == node.attrs.get("to"):
            return "Cast to its own type"
    return None


def remove_noops(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Remove Identity, inference-mode Dropout and Casts to a tensor's own type.

    They compute nothing, but sit between Q/DQ and the ops TensorRT fuses them with, hiding
    patterns from both the 8.6 fusion passes and our own Q/DQ passes
    (edgeq/docs/trt86-rules.md#what-fuses). A Dropout whose mask is used is kept.
    """
    removed: dict[str, list[str]] = {}
    for node in list(graph.nodes):
        kind = _is_noop(graph, node)
        if kind is None:
            continue
        name = node_name(node)
        while len(node.outputs) > 1:  # Dropout's unused mask
            node.outputs.pop()
        if bypass(graph, node):
            removed.setdefault(kind, []).append(name)
    _prune(graph)
    return [Change("remove_noops", f"removed {len(v)} {k}", tuple(v)) for k, v in removed.items()]


def _uint8_pairs(
    graph: gs.Graph, zero_point: int, *, through_cast: bool
) -> list[tuple[gs.Node, list[gs.Node], list[gs.Node]]]:
    """``(q, casts, dqs)``: each QuantizeLinear with a given uint8 zero-point of all ``zero_point`` whose
    readers are all DequantizeLinear with such a zero-point (an absent one reads as 0), none a graph output.

    ``through_cast``: a reader ``Cast(to=UINT8)`` (PyTorch's exporter writes one) is looked through, its
    DQs taken as the pair's. One matcher, so ``qdq_to_int8`` and ``qdq_torch_qint8`` agree on what a uint8
    Q/DQ pair is.
    """
    import numpy as np
    import onnx

    def fits(zp: np.ndarray | None) -> bool:
        return zp is not None and zp.dtype == np.uint8 and bool(np.all(zp == zero_point))

    out = []
    for q in graph.nodes:
        if q.op != "QuantizeLinear" or not q.outputs or _opt_input(q, 2) is None or not fits(_zp_values(q)):
            continue
        qout = q.outputs[0]
        casts: list[gs.Node] = []
        dqs: list[gs.Node] = []
        ok = qout not in graph.outputs and bool(qout.outputs)
        for r in qout.outputs:
            if through_cast and r.op == "Cast" and r.attrs.get("to") == onnx.TensorProto.UINT8 and r.outputs:
                casts.append(r)
                dqs.extend(r.outputs[0].outputs)
                ok = ok and bool(r.outputs[0].outputs) and r.outputs[0] not in graph.outputs
            else:
                dqs.append(r)
        if ok and all(d.op == "DequantizeLinear" and fits(_zp_values(d)) for d in dqs):
            out.append((q, casts, dqs))
    return out


def torch_qint8_pairs(graph: gs.Graph, *, exporter_cast: bool = True) -> list[tuple[gs.Node, list[gs.Node]]]:
    """QuantizeLinear nodes with a uint8 zero-point of all zeros whose readers are all DequantizeLinear
    with the same zero-point, directly or through a ``Cast(to=UINT8)``; with each, those Casts and DQs.

    torch.onnx.export writes a qint8 (signed, symmetric) tensor this way: it casts the op's int64
    zero-point 0 to uint8 and puts a Cast between Q and DQ. uint8 zero-point 0 clamps every negative
    value to 0, so the file does not compute what PyTorch did. ``exporter_cast`` keeps only pairs with
    that Cast, the exporter's mark (a uint8 zero-point 0 without it may be a real quint8 tensor).
    """
    pairs = _uint8_pairs(graph, 0, through_cast=True)
    return [(q, casts + dqs) for q, casts, dqs in pairs if casts or not exporter_cast]


def torch_qint8_nodes(graph: gs.Graph, label: Callable[[gs.Node], str] = node_name) -> set[str]:
    """The Q and DQ nodes of ``torch_qint8_pairs``, by ``label``: what clean and lint report."""
    out: set[str] = set()
    for q, readers in torch_qint8_pairs(graph):
        out.add(label(q))
        out.update(label(r) for r in readers if r.op == "DequantizeLinear")
    return out


def qdq_torch_qint8(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """With --torch-qint8: make PyTorch's uint8 zero-point 0 Q/DQ int8 zero-point 0, what PyTorch computed.

    Only on request, because it changes the file's function: the file clamps negative values to 0 where
    PyTorch's qint8 tensors did not (edgeq/docs/trt86-rules.md#qdq-torch-qint8). The Casts between Q and DQ
    become
    Cast(to=INT8), which qdq_remove_casts then removes; verification compares against the input with
    only this repair applied, so everything else clean does is still checked to be exact.
    """
    import numpy as np
    import onnx

    if not options.torch_qint8:
        return []
    zps: dict[int, gs.Constant] = {}
    done: list[str] = []
    for q, readers in torch_qint8_pairs(graph, exporter_cast=False):
        zq = _zp_values(q)
        assert zq is not None  # torch_qint8_pairs checked it
        _set_zp(q, _new_zp(zps, q, zq.shape))
        q.outputs[0].dtype = np.int8
        done.append(node_name(q))
        for r in readers:
            if r.op == "Cast":
                r.attrs["to"] = onnx.TensorProto.INT8
                r.outputs[0].dtype = np.int8
            else:
                zd = _zp_values(r)
                assert zd is not None
                _set_zp(r, _new_zp(zps, r, zd.shape))
                done.append(node_name(r))
    if not done:
        return []
    return [
        Change(
            "qdq_torch_qint8",
            f"uint8 zero-point 0 -> int8 zero-point 0 on {len(done)} Q/DQ nodes: deliberately changes the "
            "file's function back to PyTorch's qint8 (negative values are no longer clamped to 0); "
            "verification compares against the input with this repair applied",
            tuple(done),
        )
    ]


def qdq_remove_casts(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Remove the Cast PyTorch eager-mode export writes between QuantizeLinear and DequantizeLinear.

    TensorRT 8.6 cannot parse a Cast inside a Q/DQ pair (edgeq/docs/trt86-rules.md#parsing). Only Casts to
    the type the QuantizeLinear already produces are removed (exact); any other is left for the
    findings, since dropping it would change the values.
    """
    removed = []
    for node in list(graph.nodes):
        if node.op != "Cast" or not node.inputs or not node.outputs:
            continue
        q = producer(node.inputs[0])
        if q is None or q.op != "QuantizeLinear":
            continue
        consumers = node.outputs[0].outputs
        if not consumers or any(c.op != "DequantizeLinear" for c in consumers):
            continue
        if node.attrs.get("to") != _q_type(q):
            continue
        name = node_name(node)
        if bypass(graph, node):
            removed.append(name)
    _prune(graph)
    if not removed:
        return []
    return [Change("qdq_remove_casts", f"removed {len(removed)} Cast nodes between Q and DQ", tuple(removed))]


def _zp_values(node: gs.Node) -> np.ndarray | None:
    """Zero-point values of a Q/DQ node, or None when it is not a constant. Absent means 0.

    An initializer or a ``Constant`` node's output: torch.onnx.export writes the zero-points of its
    eager-mode Q -> Cast -> DQ chains as ``Constant`` nodes, which only fold_constants lowers (and the
    --torch-qint8 verification reference runs no folding)."""
    import numpy as np

    zp = _opt_input(node, 2)
    if zp is None:
        return np.zeros((), dtype=np.uint8)
    return constant_value(zp)


def _new_zp(cache: dict[int, gs.Constant], node: gs.Node, shape: tuple[int, ...]) -> gs.Constant:
    """An int8 zero-point of zeros replacing ``node``'s; nodes that shared one share the new one."""
    import numpy as np
    import onnx_graphsurgeon as gs

    old = _opt_input(node, 2)
    key = id(old) if old is not None else -len(shape) - 1
    if key not in cache:
        base = old.name if old is not None else node_name(node) + "_zero_point"
        cache[key] = gs.Constant(f"{base}_int8", np.zeros(shape, dtype=np.int8))
    return cache[key]


def _set_zp(node: gs.Node, zp: gs.Constant) -> None:
    if len(node.inputs) > 2:
        node.inputs[2] = zp
    else:
        node.inputs.append(zp)


def qdq_to_int8(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Convert uint8 / asymmetric Q/DQ to int8 symmetric (zero-point 0) where that is exact.

    TensorRT 8.6 only takes signed symmetric int8: a uint8 zero-point is an invalid type and a
    non-zero one "TensorRT only supports symmetric quantization" (onnx-tensorrt 8.6
    builtin_op_importers.cpp; edgeq/docs/trt86-rules.md#qdq-uint8). Exact cases: an activation Q -> DQ
    pair with uint8 zero-point 128 (q_u8 - 128 = q_i8 for every input, clamp bounds included); a constant
    (weight) feeding a DequantizeLinear, with any zero-point, when every w - zp fits int8. Other
    zero-points are not exact and are left for the findings.
    """
    import numpy as np
    import onnx_graphsurgeon as gs

    converted_pairs: list[str] = []
    converted_weights: list[str] = []
    zps: dict[int, gs.Constant] = {}
    rebased: dict[tuple[int, int], gs.Constant] = {}
    for q, _, dqs in _uint8_pairs(graph, 128, through_cast=False):
        zq, dzs = _zp_values(q), [_zp_values(d) for d in dqs]
        assert zq is not None  # _uint8_pairs checked every zero-point
        if any(d.attrs.get("axis", 1) != q.attrs.get("axis", 1) and zq.size > 1 for d in dqs):
            continue
        _set_zp(q, _new_zp(zps, q, zq.shape))
        for d, dz in zip(dqs, dzs):
            assert dz is not None
            _set_zp(d, _new_zp(zps, d, dz.shape))
        q.outputs[0].dtype = np.int8
        converted_pairs.append(node_name(q))
        converted_pairs.extend(node_name(d) for d in dqs)

    for d in list(graph.nodes):
        if d.op != "DequantizeLinear" or not d.inputs:
            continue
        w = _const(d.inputs[0])
        z = _zp_values(d)
        if w is None or z is None or w.dtype not in (np.uint8, np.int8):
            continue
        if w.dtype == np.int8 and not np.any(z):
            continue  # already int8 symmetric
        axis = int(d.attrs.get("axis", 1))
        shifted = w.astype(np.int16) - _broadcast_param(z.astype(np.int16), axis, w.ndim)
        if shifted.min(initial=0) < -128 or shifted.max(initial=0) > 127:
            continue
        key = (id(d.inputs[0]), id(_opt_input(d, 2)))
        if key not in rebased:
            rebased[key] = gs.Constant(f"{d.inputs[0].name}_int8", shifted.astype(np.int8))
        d.inputs[0] = rebased[key]
        _set_zp(d, _new_zp(zps, d, z.shape))
        converted_weights.append(node_name(d))
    _prune(graph)
    changes = []
    if converted_pairs:
        changes.append(
            Change(
                "qdq_to_int8",
                f"uint8 zero-point 128 -> int8 zero-point 0 on {len(converted_pairs)} Q/DQ nodes "
                "(exact shift)",
                tuple(converted_pairs),
            )
        )
    if converted_weights:
        changes.append(
            Change(
                "qdq_to_int8",
                f"re-based {len(converted_weights)} constant DQ inputs to int8 zero-point 0 "
                "(exact: w - zp fits int8)",
                tuple(converted_weights),
            )
        )
    return changes


def fold_bias_dq(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Fold a DequantizeLinear of an int32 constant (a quantized bias) into a float initializer.

    onnxruntime's QDQ export quantizes biases to int32 by default; the 8.6 parser refuses it:
    "fc.bias_DequantizeLinear: only activation types allowed as input to this layer"
    (measured: tests/fixtures/trt86-h200/resnet50_ortqdq.explicit.build.log). Computed as
    onnxruntime does, float32((q - zp)) * scale, so the values are bit-identical.
    """
    import numpy as np

    folded = []
    for d in list(graph.nodes):
        if d.op != "DequantizeLinear" or not d.inputs or not d.outputs:
            continue
        q = _const(d.inputs[0])
        scale = _const(d.inputs[1]) if len(d.inputs) > 1 else None
        z = _zp_values(d)
        if q is None or scale is None or z is None or q.dtype != np.int32:
            continue
        out = d.outputs[0]
        if out in graph.outputs:
            continue
        axis = int(d.attrs.get("axis", 1))
        diff = (q.astype(np.int64) - _broadcast_param(z.astype(np.int64), axis, q.ndim)).astype(np.float32)
        values = (diff * _broadcast_param(scale.astype(np.float32), axis, q.ndim)).astype(scale.dtype)
        name = node_name(d)
        d.outputs.clear()
        d.inputs.clear()
        out.to_constant(values)
        folded.append(name)
    _prune(graph)
    if not folded:
        return []
    return [
        Change(
            "fold_bias_dq",
            f"folded {len(folded)} int32 bias DequantizeLinear into float initializers",
            tuple(folded),
        )
    ]


def dedupe_initializers(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Merge initializers with identical type, shape and bytes into one.

    Exporters (and folding) repeat the same constants: Q/DQ scales and zero-points, shape vectors,
    weights. The TensorRT 8.6 parser makes one weights object per initializer, so duplicates cost
    engine weight memory (shared with the CPU on Jetson) and parse time; one copy also makes equal
    Q/DQ scales visibly shared (edgeq/docs/trt86-rules.md#concat-scale).
    Values are unchanged.
    """
    import onnx_graphsurgeon as gs

    seen: dict[tuple[Any, ...], gs.Constant] = {}
    merged: dict[str, list[str]] = {}
    users: dict[str, set[str]] = {}
    protected = {id(t) for t in list(graph.inputs) + list(graph.outputs)}
    for node in graph.nodes:
        for i, t in enumerate(node.inputs):
            if not isinstance(t, gs.Constant) or id(t) in protected:
                continue
            v = t.values
            key = (str(v.dtype), v.shape, str(t.export_dtype), hashlib.sha256(v.tobytes()).digest())
            kept = seen.setdefault(key, t)
            if kept is t:
                continue
            node.inputs[i] = kept
            merged.setdefault(kept.name, [])
            if t.name not in merged[kept.name]:
                merged[kept.name].append(t.name)
            users.setdefault(kept.name, set()).add(node_name(node))
    if not merged:
        return []
    n = sum(len(v) for v in merged.values())
    examples = ", ".join(f"{k} <- {v[0]}{'...' if len(v) > 1 else ''}" for k, v in list(merged.items())[:2])
    nodes = sorted(set().union(*users.values()))
    return [
        Change(
            "dedupe_initializers",
            f"merged {n} duplicate initializers into {len(merged)} ({examples})",
            tuple(nodes),
        )
    ]


def remove_unused(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Drop nodes that feed no graph output, their initializers, and node outputs nobody reads.

    The TensorRT 8.6 parser imports every node, dead or not: a dead branch holding an op outside the
    8.6 operator table (edgeq/graph/data/trt86-onnx-operators.csv) fails the whole parse. Initializers that no
    node reads at all are dropped when the graph is imported; ``clean_model`` reports those here too.
    """
    import onnx_graphsurgeon as gs

    before = list(graph.nodes)
    consts_before = {t.name for t in graph.tensors().values() if isinstance(t, gs.Constant)}
    outs_before = {id(n): len(n.outputs) for n in before}
    graph.cleanup(remove_unused_node_outputs=True)
    kept = {id(n) for n in graph.nodes}
    dead = [node_name(n) for n in before if id(n) not in kept]
    consts_after = {t.name for t in graph.tensors().values() if isinstance(t, gs.Constant)}
    trimmed = [node_name(n) for n in graph.nodes if len(n.outputs) < outs_before.get(id(n), 0)]
    changes = []
    if dead:
        changes.append(Change("remove_unused", f"removed {len(dead)} nodes that feed no output", tuple(dead)))
    gone = sorted(consts_before - consts_after)
    if gone:
        changes.append(
            Change("remove_unused", f"dropped {len(gone)} unused initializers ({', '.join(gone[:4])})")
        )
    if trimmed:
        changes.append(
            Change("remove_unused", f"dropped unread outputs of {len(trimmed)} nodes", tuple(trimmed))
        )
    return changes


def toposort(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Sort nodes topologically: the ONNX spec requires it, and so do onnxruntime and the checker.

    TensorRT 8.6's parser sorts on its own, but the same file also goes through onnxruntime (--verify,
    calibration) and graphsurgeon's folding, which need file order = data order. A graph already in a
    valid order is left as it is (graphsurgeon would pick another one).
    """
    produced = {t.name for t in graph.inputs} | {
        t.name for n in graph.nodes for t in n.inputs if not t.inputs
    }
    in_order = True
    for n in graph.nodes:
        if any(t.name not in produced for t in n.inputs if not t.is_empty()):
            in_order = False
            break
        produced.update(t.name for t in n.outputs)
    if in_order:
        return []
    before = [id(n) for n in graph.nodes]
    graph.toposort()
    moved = sum(1 for a, n in zip(before, graph.nodes) if a != id(n))
    if not moved:
        return []
    return [Change("toposort", f"reordered nodes into topological order ({moved} positions changed)")]


# The order matters:
# - set_ir_version first: graphsurgeon folds with onnxruntime at the graph's IR version, which must be
#   one onnxruntime knows; convert_opset next, so every graph pass sees opset <= 17 semantics and
#   folding tidies the constants the converter adds; qdq_float32 right after it, because float16 Q/DQ
#   are invalid below opset 19 and every later pass (and onnxruntime folding) needs a valid model.
# - fold_constants before the Q/DQ passes: it lowers Constant nodes and folds the Casts PyTorch puts on
#   zero-points and scales, so the Q/DQ passes can read their types and values (it never folds Q/DQ).
# - remove_noops before the Q/DQ passes: Identity/Dropout between Q and DQ hide the pairs (it leaves
#   the Q -> Cast -> DQ pattern to qdq_remove_casts, so that change is reported where it belongs).
# - qdq_torch_qint8 (only with --torch-qint8) before qdq_remove_casts: it retargets PyTorch's Casts to
#   INT8, which makes them no-ops that qdq_remove_casts removes.
# - qdq_remove_casts before qdq_to_int8: the int8 conversion needs Q directly feeding DQ.
# - dedupe, remove_unused, toposort last: earlier passes create duplicates, orphans and reorderings.
PASSES: tuple[Pass, ...] = (
    Pass("set_ir_version", set_ir_version, "model"),
    Pass("convert_opset", convert_opset, "model"),
    Pass("qdq_float32", qdq_float32, "model"),
    Pass("fold_constants", fold_constants, "graph"),
    Pass("remove_noops", remove_noops, "graph"),
    Pass("qdq_torch_qint8", qdq_torch_qint8, "graph"),
    Pass("qdq_remove_casts", qdq_remove_casts, "graph"),
    Pass("qdq_to_int8", qdq_to_int8, "graph"),
    Pass("fold_bias_dq", fold_bias_dq, "graph"),
    Pass("dedupe_initializers", dedupe_initializers, "graph"),
    Pass("remove_unused", remove_unused, "graph"),
    Pass("toposort", toposort, "graph"),
)

PASS_NAMES: tuple[str, ...] = tuple(p.name for p in PASSES)
