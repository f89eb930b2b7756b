"""What the engine runs: classify each engine layer, find the INT8 region, map layers to ONNX nodes.

A TensorRT engine layer is one kernel; it may hold several ONNX nodes (a fused Conv+Add+Relu) or
none (a reformat copy TensorRT inserted). This module answers, for each layer: is it real compute,
a weight, a format copy or a no-op; what precision does it compute in; which ONNX nodes did it
absorb; is it at the edge of the network (where a copy is expected) or in its interior.

The classification rules are data (``KIND_RULES``), each citing the fixture or document it comes from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Optional, Union

from edgeq.errors import ReportError
from edgeq.graph import patterns, registry
from edgeq.report.parse import PRECISION_RANK, EngineLayer, EngineLayers, Profile, Tensor
from edgeq.text import plural

if TYPE_CHECKING:
    import onnx


class LayerKind(str, Enum):
    COMPUTE = "compute"
    WEIGHTS = "weights"  # constants and copies/casts of constants: run once, not per inference
    REFORMAT = "reformat"  # a copy between formats/precisions on activations: a cost the gate sees
    NOOP = "no-op"  # reshape-only layers that move no data
    UNKNOWN = "unknown"  # names-only engine information: nothing to classify by


@dataclass(frozen=True)
class KindRule:
    rule: str
    layer_types: frozenset[str]
    kind: LayerKind
    source: str


# LayerType (or ParameterType) -> kind, before graph context is looked at. Order of checks:
# no-op, weights, reformat, then everything else is compute.
KIND_RULES: tuple[KindRule, ...] = (
    KindRule(
        "noop-layer",
        frozenset({"NoOp", "signal", "wait"}),
        LayerKind.NOOP,
        "fixtures trt86-h200/*.layers.json: NoOp 'copied_squeeze_after_...', 'reshape_after_/fc/Gemm' "
        "(no tactic, zero time in *.profile.json); trex parser.py drops signal/wait layers",
    ),
    KindRule(
        "constant-layer",
        frozenset({"Constant"}),
        LayerKind.WEIGHTS,
        "edgeq/docs/trt86-rules.md#reading-an-engine: Constant weight layers are not compute",
    ),
    KindRule(
        "reformat-layer",
        frozenset({"Reformat", "MyelinReformat"}),
        LayerKind.REFORMAT,
        "edgeq/docs/trt86-rules.md#reading-an-engine: Reformat layers; fixtures: Origin QDQ/REFORMAT/CAST",
    ),
)
WEIGHT_CHAIN_SOURCE = (
    "fixtures resnet50*.layers.json: 'Identity_N' MyelinReformat/Reformat(CAST) layers copy a Constant "
    "into a convolution's bias input; edgeq/docs/trt86-rules.md#reading-an-engine: MyelinReformat weight "
    "layers are not compute"
)
SHUFFLE_NOOP_SOURCE = "TensorRT: a Shuffle without transposes only reinterprets dimensions (pure reshape)"

POINTWISE_TYPES = frozenset({"PointWise", "PointWiseV2", "ElementWise", "Activation", "Scale"})
# After a residual Add, a Swish's Mul and a PRelu also count as the activation TensorRT would have fused
# with it (the ONNX vocabulary is the graph side's, so "an activation" means the same to lint and here).
ACTIVATION_OPS = patterns.ACTIVATION_OPS | {"Mul", "PRelu"}

_REFORMAT_FOR = re.compile(r"^Reformatting CopyNode for (Input|Output) Tensor \d+ to (?P<target>.+)$", re.S)
_FOREIGN = re.compile(r"^\{ForeignNode\[(?P<body>.*)\]\}$", re.S)
# Pieces of fused-layer names that TensorRT or the ONNX parser made up (not ONNX node names).
_SYNTHETIC = re.compile(
    r"^(\(Unnamed Layer\* \d+\)|transpose_before_|unsqueeze_node_after_|squeeze_after_|"
    r"copied_squeeze_after_|reshape_after_|reshape_before_|copied_)|(_quantized|_output)$"
)
_OP_FROM_NAME = re.compile(r"([A-Z][A-Za-z0-9]*?)(?:_\d+)?$")


# --------------------------------------------------------------------------------------------------
# Name -> ONNX nodes
# --------------------------------------------------------------------------------------------------


def _split_top(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside (), [] and {} (fused names nest: PWN(PWN(a), b))."""
    out: list[str] = []
    cur: list[str] = []
    depth, i = 0, 0
    while i < len(text):
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(0, depth - 1)
        if depth == 0 and text.startswith(sep, i):
            out.append("".join(cur))
            cur = []
            i += len(sep)
            continue
        cur.append(c)
        i += 1
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


def split_layer_name(name: str) -> tuple[str, ...]:
    """Candidate ONNX node names inside a fused engine layer name.

    "/conv1/Conv + /relu/Relu + /maxpool/MaxPool" -> 3 names; "PWN(PWN(/a/Sigmoid), /a/Mul)" ->
    2 names; "{ForeignNode[/a/MatMul.../b/Add]}" -> first and last; "Reformatting CopyNode for
    Input Tensor 0 to X" -> () (a copy TensorRT inserted, it absorbed no node).
    """
    if _REFORMAT_FOR.match(name):
        return ()
    out: list[str] = []

    def walk(piece: str) -> None:
        piece = piece.strip()
        m = _FOREIGN.match(piece)
        if m:
            for p in m.group("body").split("..."):
                walk(p)
            return
        if piece.startswith("PWN(") and piece.endswith(")"):
            for p in _split_top(piece[4:-1], ","):
                walk(p)
            return
        parts = _split_top(piece, " + ")
        if len(parts) > 1:
            for p in parts:
                walk(p)
            return
        if piece and piece not in out:
            out.append(piece)

    walk(name)
    return tuple(out)


def nodes_from_metadata(metadata: str) -> tuple[str, ...]:
    """8.6 ``Metadata``: "[ONNX Layer: a]\\x1e[ONNX Layer: b]" -> ("a", "b"), duplicates dropped."""
    out: list[str] = []
    for part in metadata.split("\x1e"):
        part = part.strip()
        if part.startswith("[ONNX Layer: ") and part.endswith("]"):
            n = part[len("[ONNX Layer: ") : -1]
            if n and n not in out:
                out.append(n)
    return tuple(out)


def op_from_node_name(name: str) -> str:
    """Best guess of an ONNX op type from a node name when no model is given.

    Exporters name nodes "/scope/OpType" (torch.onnx) or "OpType_12"; onnxruntime's quantizer
    "<tensor>_QuantizeLinear".
    """
    seg = name.rstrip("/").rsplit("/", 1)[-1]
    m = _OP_FROM_NAME.search(seg)
    return m.group(1) if m else seg


# --------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportLayer:
    """One engine layer with what edgeq worked out about it."""

    layer: EngineLayer
    kind: LayerKind
    precision: Optional[str]  # compute precision: widest data-input precision (None: unknown)
    in_precisions: tuple[Optional[str], ...]  # data inputs only (weights excluded)
    out_precisions: tuple[Optional[str], ...]
    onnx_nodes: tuple[str, ...]  # ONNX nodes fused into this layer
    onnx_ops: tuple[str, ...]  # their op types (from the model with --onnx, else guessed from names)
    related_nodes: tuple[str, ...] = ()  # reformats: the nodes of the layer the copy is for
    boundary: Optional[str] = None  # "input" / "output": a reformat at the network's edge
    boundary_reason: str = ""
    region: str = "inside"  # "before" the first Q, "inside" the INT8 region, "after" the last DQ
    time_ms: Optional[float] = None
    kind_rule: str = ""  # which rule decided ``kind``
    weight_inputs: tuple[int, ...] = ()  # input positions fed by weight layers (conv bias copies)

    @property
    def index(self) -> int:
        return self.layer.index

    @property
    def name(self) -> str:
        return self.layer.name

    @property
    def layer_type(self) -> str:
        return self.layer.layer_type

    @property
    def interior(self) -> bool:
        return self.region == "inside" and self.boundary is None

    @property
    def data_inputs(self) -> tuple[Tensor, ...]:
        """Activation inputs (a weight layer's inputs are all weights: then all of them)."""
        if self.kind == LayerKind.WEIGHTS:
            return self.layer.inputs
        return tuple(t for i, t in enumerate(self.layer.inputs) if i not in self.weight_inputs)

    @property
    def same_format_copy(self) -> bool:
        """A reformat whose every output has its input's precision and layout: a copy (TensorRT builds
        a Concat as copies into the output buffer), not a precision fallback or a layout change."""
        if self.kind != LayerKind.REFORMAT:
            return False
        fins = {t.format.short if t.format else None for t in self.data_inputs}
        fouts = {t.format.short if t.format else None for t in self.layer.outputs}
        return len(fins) == 1 and fins == fouts and None not in fins

    @property
    def formats(self) -> str:
        """'INT8 NC/32HW32 -> INT8 NCHW' (activations only) for display."""

        def fmt(ts: Sequence[Tensor]) -> str:
            return ", ".join(t.format.short if t.format else "?" for t in ts) or "-"

        return f"{fmt(self.data_inputs)} -> {fmt(self.layer.outputs)}"


@dataclass(frozen=True)
class EngineView:
    """A layer as the pattern registry's engine signatures read it (``edgeq.graph.facts.LayerView``)."""

    ops: frozenset[str]
    kind: str
    pointwise: bool
    inputs: int
    gated: bool
    upstream: frozenset[str] = frozenset()
    downstream: frozenset[str] = frozenset()
    formats: str = ""


def view_of(rl: ReportLayer, upstream: Iterable[str] = (), downstream: Iterable[str] = ()) -> EngineView:
    """``rl`` for the registry: its ops, whether it is a PointWise layer, its activation inputs and whether
    one of them is a per-channel gate (1x1 in space beside a full map)."""
    spatial = [t.dims[2:] for t in rl.data_inputs if len(t.dims) >= 3]
    gated = any(all(d == 1 for d in s) for s in spatial) and any(any(d != 1 for d in s) for s in spatial)
    pointwise = rl.layer.layer_type in POINTWISE_TYPES or rl.layer.parameter_type in POINTWISE_TYPES
    return EngineView(frozenset(rl.onnx_ops), rl.kind.value, pointwise, len(rl.in_precisions), gated,
                      frozenset(upstream), frozenset(downstream), rl.formats)


@dataclass(frozen=True)
class UnfusedResidual:
    """A residual Add that TensorRT ran as its own point-wise layer instead of inside a convolution."""

    add_layer: int
    activation_layer: Optional[int]  # a separate point-wise layer for the Relu after it, if any
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class OnnxNodeRun:
    """Where one ONNX node ended up in the engine."""

    name: str
    op_type: str
    layers: tuple[int, ...]
    kind: str  # kind of the layer that runs it ("compute", "reformat", "no-op")
    precision: Optional[str]


@dataclass(frozen=True)
class OnnxMapping:
    """ONNX graph -> engine: which nodes ran in which precision, which vanished."""

    model: str
    nodes: tuple[OnnxNodeRun, ...]  # found in some layer, in graph order
    not_found: tuple[tuple[str, str], ...]  # (name, op_type): fused away (Q/DQ) or eliminated
    unknown: tuple[str, ...] = ()  # names the engine reports that the model does not have

    def by_precision(self) -> dict[str, list[str]]:
        """Compute-layer nodes by precision ("INT8", "FP16", "FP32", "unknown")."""
        out: dict[str, list[str]] = {}
        for n in self.nodes:
            if n.kind == LayerKind.COMPUTE.value:
                out.setdefault(n.precision or "unknown", []).append(n.name)
        return out

    def in_kind(self, kind: LayerKind) -> list[str]:
        return [n.name for n in self.nodes if n.kind == kind.value]


@dataclass(frozen=True)
class FusionReport:
    source: str
    detailed: bool
    mode: str  # "explicit" (Q/DQ reformats found) or "implicit"
    layers: tuple[ReportLayer, ...]
    bindings: tuple[str, ...]
    network_inputs: tuple[str, ...]
    network_outputs: tuple[str, ...]
    unfused_residuals: tuple[UnfusedResidual, ...] = ()
    onnx: Optional[OnnxMapping] = None
    profile_source: Optional[str] = None
    profile_total_ms: Optional[float] = None
    profile_iterations: Optional[int] = None
    unmatched_profile: tuple[str, ...] = ()  # profile names with no layer (a different engine?)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def of_kind(self, kind: LayerKind) -> list[ReportLayer]:
        return [rl for rl in self.layers if rl.kind == kind]

    def compute_precisions(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for rl in self.of_kind(LayerKind.COMPUTE):
            out[rl.precision or "unknown"] = out.get(rl.precision or "unknown", 0) + 1
        return out

    def kind_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for rl in self.layers:
            out[rl.kind.value] = out.get(rl.kind.value, 0) + 1
        return out

    def interior_reformats(self) -> list[ReportLayer]:
        return [rl for rl in self.of_kind(LayerKind.REFORMAT) if rl.interior]

    def boundary_reformats(self) -> list[ReportLayer]:
        return [rl for rl in self.of_kind(LayerKind.REFORMAT) if rl.boundary]

    @property
    def timed(self) -> bool:
        return self.profile_total_ms is not None

    def summary_line(self) -> str:
        """One line for logs and the demo: layer kinds, compute precisions, copies, unfused Adds."""
        if not self.detailed:
            return f"{len(self.layers)} layers, names only (built without ProfilingVerbosity.DETAILED)"
        precisions = ", ".join(f"{n} {p}" for p, n in sorted(self.compute_precisions().items()))
        text = (
            f"{self.mode}, {plural(len(self.layers), 'layer')}, compute {precisions or 'none'}, "
            f"{len(self.boundary_reformats())} boundary + "
            f"{len(self.interior_reformats())} interior reformats, "
            f"{plural(len(self.unfused_residuals), 'unfused residual Add')}"
        )
        if self.profile_total_ms is not None:
            text += f", {self.profile_total_ms:.3f} ms"
        return text

    def time_by_kind(self) -> dict[str, float]:
        """Profiled milliseconds per layer kind (empty without a profile)."""
        out: dict[str, float] = {}
        for rl in self.layers:
            if rl.time_ms is not None:
                out[rl.kind.value] = out.get(rl.kind.value, 0.0) + rl.time_ms
        return out


# --------------------------------------------------------------------------------------------------
# Building it
# --------------------------------------------------------------------------------------------------


def _widest(precisions: Iterable[Optional[str]]) -> Optional[str]:
    ps = list(precisions)
    if not ps or any(p is None for p in ps):
        return None
    return max(ps, key=lambda p: PRECISION_RANK.get(p or "", 0))


class _Graph:
    """Producer/consumer links between engine layers through tensor names."""

    def __init__(self, el: EngineLayers) -> None:
        self.layers = el.layers
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for lay in el.layers:
            for t in lay.outputs:
                self.producer.setdefault(t.name, lay.index)
            for t in lay.inputs:
                self.consumers.setdefault(t.name, []).append(lay.index)
        produced = set(self.producer)
        consumed = set(self.consumers)
        if el.has_bindings and el.bindings:
            self.inputs = tuple(b for b in el.bindings if b not in produced)
            self.outputs = tuple(b for b in el.bindings if b in produced)
        else:  # pre-8.6 JSON: infer from the graph
            self.inputs = tuple(sorted(consumed - produced))
            self.outputs = tuple(sorted(produced - consumed))

    def successors(self, i: int) -> set[int]:
        return {c for t in self.layers[i].outputs for c in self.consumers.get(t.name, ())}

    def descendants(self, starts: Iterable[int]) -> set[int]:
        seen: set[int] = set()
        stack = list(starts)
        while stack:
            for s in self.successors(stack.pop()):
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return seen


def _base_kind(lay: EngineLayer) -> tuple[LayerKind, str]:
    for r in KIND_RULES:
        if lay.layer_type in r.layer_types or lay.parameter_type in r.layer_types:
            return r.kind, r.rule
    if (lay.layer_type == "Shuffle" or lay.parameter_type == "Shuffle") and _pure_reshape(lay):
        return LayerKind.NOOP, "shuffle-reshape"
    return LayerKind.COMPUTE, "compute"


def _pure_reshape(lay: EngineLayer) -> bool:
    def identity(v: str) -> bool:
        nums = [int(x) for x in re.findall(r"-?\d+", v)]
        return nums == list(range(len(nums)))

    same_format = [t.format for t in lay.inputs[:1]] == [t.format for t in lay.outputs[:1]]
    return same_format and all(identity(lay.param(k)) for k in ("FirstTranspose", "SecondTranspose"))


def _kinds(el: EngineLayers, g: _Graph) -> list[tuple[LayerKind, str]]:
    kinds = [_base_kind(lay) for lay in el.layers]
    # A layer whose every input comes from weights works on weights only (Constant -> "Identity_N"
    # copy -> conv bias): not on the activation path, so the gate does not judge it. It may still run
    # on every inference (measured in the fixtures' profiles); the report shows that time.
    changed = True
    while changed:
        changed = False
        for lay in el.layers:
            k, _ = kinds[lay.index]
            if k == LayerKind.WEIGHTS or not lay.inputs:
                continue
            prods = [g.producer.get(t.name) for t in lay.inputs]
            if all(p is not None and kinds[p][0] == LayerKind.WEIGHTS for p in prods):
                kinds[lay.index] = (LayerKind.WEIGHTS, "weight-chain")
                changed = True
    return kinds


def _from_qdq(lay: EngineLayer) -> bool:
    """A reformat TensorRT made from a Q/DQ node (8.6 says so in Origin; older JSON only in the name)."""
    return lay.origin == "QDQ" or lay.name.endswith(("QuantizeLinear", "DequantizeLinear"))


def _is_q(rl_layer: EngineLayer, ins: Sequence[Optional[str]], outs: Sequence[Optional[str]]) -> bool:
    """A Q/DQ reformat that quantizes (float -> INT8)."""
    return _from_qdq(rl_layer) and "INT8" in outs and any(p in ("FP32", "FP16", "BF16") for p in ins)


def _is_dq(rl_layer: EngineLayer, ins: Sequence[Optional[str]], outs: Sequence[Optional[str]]) -> bool:
    return _from_qdq(rl_layer) and "INT8" in ins and any(p in ("FP32", "FP16", "BF16") for p in outs)


@dataclass(frozen=True)
class _Pre:
    """What is known about a layer before boundaries and the region are worked out."""

    kind: LayerKind
    rule: str
    weight_inputs: tuple[int, ...]  # input positions fed by weight layers
    ins: tuple[Optional[str], ...]
    outs: tuple[Optional[str], ...]
    precision: Optional[str]
    nodes: tuple[str, ...]


def _onnx_index(model: Any) -> tuple[str, dict[str, str], list[str]]:
    """(model name, node name -> op type, node names in graph order), subgraphs included."""
    import onnx

    if isinstance(model, (str, os.PathLike)):
        from edgeq.graph.io import load_model

        name = str(model)
        model = load_model(model, load_external_data=False, check=False)
    elif isinstance(model, onnx.ModelProto):
        name = model.graph.name or "<model>"
    else:
        raise ReportError(f"--onnx: expected an ONNX model, got {type(model).__name__}")
    ops: dict[str, str] = {}
    order: list[str] = []

    def walk(graph: onnx.GraphProto) -> None:
        for n in graph.node:
            if n.name and n.name not in ops:
                ops[n.name] = n.op_type
                order.append(n.name)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sub in a.graphs:
                    walk(sub)

    walk(model.graph)
    if not ops:
        raise ReportError(
            f"{name}: the ONNX model has no named nodes to map the engine back to",
            hint="export with node names (torch.onnx does by default)",
        )
    return name, ops, order


def build_report(
    layers: EngineLayers,
    profile: Optional[Profile] = None,
    onnx_model: Union[str, os.PathLike, onnx.ModelProto, None] = None,
) -> FusionReport:
    """Classify every layer, find boundaries and the INT8 region, join times and ONNX nodes."""
    if not layers.detailed:
        return _names_only_report(layers, profile, onnx_model)
    g = _Graph(layers)
    kinds = _kinds(layers, g)

    onnx_ops: dict[str, str] = {}
    onnx_order: list[str] = []
    model_name = ""
    if onnx_model is not None:
        model_name, onnx_ops, onnx_order = _onnx_index(onnx_model)

    def data_inputs(lay: EngineLayer) -> list[Tensor]:
        weights = pre[lay.index].weight_inputs
        return [t for j, t in enumerate(lay.inputs) if j not in weights]

    # Per-layer precision and ONNX nodes.
    pre: list[_Pre] = []
    by_name = {lay.name: lay.index for lay in layers.layers}
    unknown: list[str] = []
    for lay in layers.layers:
        kind, rule = kinds[lay.index]
        producers = [g.producer.get(t.name) for t in lay.inputs]
        weights = tuple(
            j for j, p in enumerate(producers) if p is not None and kinds[p][0] == LayerKind.WEIGHTS
        )
        ins = tuple(t.precision for j, t in enumerate(lay.inputs) if j not in weights)
        outs = tuple(t.precision for t in lay.outputs)
        precision = _widest(ins) if ins else _widest(outs)
        nodes = _layer_nodes(lay, onnx_ops, unknown)
        pre.append(_Pre(kind, rule, weights, ins, outs, precision, nodes))

    # Boundaries: a reformat whose data comes straight from a network input, or whose result goes
    # straight (through no-ops only) to a network output.
    net_in, net_out = set(g.inputs), set(g.outputs)

    def from_inputs(tensor: str, depth: int = 0) -> bool:
        p = g.producer.get(tensor)
        if p is None:
            return tensor in net_in
        if pre[p].kind != LayerKind.NOOP or depth > 50:
            return False
        return bool(layers.layers[p].inputs) and all(
            from_inputs(t.name, depth + 1) for t in layers.layers[p].inputs
        )

    def to_outputs(tensor: str, depth: int = 0) -> bool:
        cons = g.consumers.get(tensor, [])
        if not cons:
            return tensor in net_out
        if depth > 50 or any(pre[c].kind != LayerKind.NOOP for c in cons):
            return False
        return all(to_outputs(t.name, depth + 1) for c in cons for t in layers.layers[c].outputs)

    boundary: dict[int, tuple[str, str]] = {}
    for lay in layers.layers:
        if pre[lay.index].kind != LayerKind.REFORMAT:
            continue
        dins = data_inputs(lay)
        if dins and all(from_inputs(t.name) for t in dins):
            boundary[lay.index] = ("input", "reads network input " + ", ".join(repr(t.name) for t in dins))
        elif lay.outputs and all(to_outputs(t.name) for t in lay.outputs):
            boundary[lay.index] = (
                "output",
                "writes network output "
                + ", ".join(repr(o) for o in sorted(net_out & _reachable_tensors(g, lay.index, pre))),
            )

    # The INT8 region of an explicit engine: from the first Q to the last DQ (Q/DQ-origin reformats).
    qs = [
        i
        for i, p in enumerate(pre)
        if p.kind == LayerKind.REFORMAT and _is_q(layers.layers[i], p.ins, p.outs)
    ]
    dqs = [
        i
        for i, p in enumerate(pre)
        if p.kind == LayerKind.REFORMAT and _is_dq(layers.layers[i], p.ins, p.outs)
    ]
    mode = "explicit" if qs or dqs else "implicit"
    region = ["inside"] * len(pre)
    if qs:
        first_qs = [q for q in qs if not (g.descendants([q2 for q2 in qs if q2 != q]) & {q})]
        inside = g.descendants(first_qs) | set(first_qs)
        for i in range(len(pre)):
            if i not in inside and pre[i].kind != LayerKind.WEIGHTS:
                region[i] = "before"
        for q in first_qs:
            boundary.setdefault(q, ("input", "first Q/DQ quantize of the INT8 region"))
    for d in dqs:
        after = g.descendants([d])
        reaches_int8 = any(
            (pre[a].kind == LayerKind.COMPUTE and pre[a].precision == "INT8") or a in qs for a in after
        )
        if not reaches_int8:
            boundary.setdefault(d, ("output", "last Q/DQ dequantize of the INT8 region"))
            for a in after:
                if pre[a].kind != LayerKind.WEIGHTS:
                    region[a] = "after"

    # Profile join by name (queue per name: duplicated names keep engine order).
    times: dict[int, float] = {}
    unmatched: list[str] = []
    if profile is not None:
        queue: dict[str, list[int]] = {}
        for lay in layers.layers:
            queue.setdefault(lay.name, []).append(lay.index)
        for t in profile.layers:
            pending = queue.get(t.name)
            if pending:
                times[pending.pop(0)] = t.average_ms
            else:
                unmatched.append(t.name)

    report_layers: list[ReportLayer] = []
    for lay in layers.layers:
        p = pre[lay.index]
        related: tuple[str, ...] = ()
        m = _REFORMAT_FOR.match(lay.name)
        if m and m.group("target") in by_name:
            related = pre[by_name[m.group("target")]].nodes
        b = boundary.get(lay.index)
        report_layers.append(
            ReportLayer(
                layer=lay,
                kind=p.kind,
                precision=p.precision,
                in_precisions=p.ins,
                out_precisions=p.outs,
                onnx_nodes=p.nodes,
                onnx_ops=tuple(onnx_ops.get(n) or op_from_node_name(n) for n in p.nodes),
                related_nodes=related,
                boundary=b[0] if b else None,
                boundary_reason=b[1] if b else "",
                region=region[lay.index] if p.kind != LayerKind.WEIGHTS else "inside",
                time_ms=times.get(lay.index),
                kind_rule=p.rule,
                weight_inputs=p.weight_inputs,
            )
        )

    notes: list[str] = []
    copies = [rl for rl in report_layers if rl.kind == LayerKind.WEIGHTS and rl.time_ms]
    total_ms = sum(times.values())
    if copies and total_ms > 0:
        ms = sum(rl.time_ms or 0.0 for rl in copies)
        notes.append(
            f"{len(copies)} weight-copy layers (e.g. {copies[0].name!r}) run on every inference: "
            f"{ms:.4f} ms, {100 * ms / total_ms:.1f}% of the profiled time. They copy constants into "
            "convolution inputs (often ONNX Identity nodes on initializers; 'edgeq clean' removes those)"
        )
    if profile is not None and unmatched:
        notes.append(
            f"{len(unmatched)} of {len(profile.layers)} profile entries match no engine layer "
            "(profile from a different engine?)"
        )
    onnx_map = None
    if onnx_model is not None:
        onnx_map = _onnx_mapping(
            model_name, onnx_ops, onnx_order, report_layers, tuple(dict.fromkeys(unknown))
        )
        if onnx_map.unknown:
            notes.append(
                f"{len(onnx_map.unknown)} ONNX node names in the engine are not in {model_name} "
                "(a different model?)"
            )
    return FusionReport(
        source=layers.source,
        detailed=True,
        mode=mode,
        layers=tuple(report_layers),
        bindings=layers.bindings,
        network_inputs=g.inputs,
        network_outputs=g.outputs,
        unfused_residuals=_unfused_residuals(report_layers, g),
        onnx=onnx_map,
        profile_source=profile.source if profile else None,
        profile_total_ms=total_ms if profile is not None else None,
        profile_iterations=profile.iterations if profile else None,
        unmatched_profile=tuple(unmatched),
        notes=tuple(notes),
    )


def _reachable_tensors(g: _Graph, i: int, pre: list[_Pre]) -> set[str]:
    """Output tensors of layer ``i`` and of the no-ops after it."""
    out: set[str] = set()
    stack = [i]
    while stack:
        j = stack.pop()
        for t in g.layers[j].outputs:
            out.add(t.name)
            stack.extend(c for c in g.consumers.get(t.name, []) if pre[c].kind == LayerKind.NOOP)
    return out


def _layer_nodes(lay: EngineLayer, onnx_ops: dict[str, str], unknown: list[str]) -> tuple[str, ...]:
    """ONNX nodes of a layer: 8.6 Metadata first, then the pieces of the fused name."""
    meta = nodes_from_metadata(lay.metadata)
    pieces = split_layer_name(lay.name)
    if onnx_ops:
        cands = list(meta) + [p for p in pieces if p in onnx_ops]
        if lay.name in onnx_ops:
            cands.append(lay.name)
        unknown.extend(n for n in meta if n not in onnx_ops)
        return tuple(dict.fromkeys(n for n in cands if n in onnx_ops))
    if meta:
        return meta
    return tuple(p for p in pieces if not _SYNTHETIC.search(p))


def _onnx_mapping(
    model_name: str,
    ops: dict[str, str],
    order: list[str],
    rls: Sequence[ReportLayer],
    unknown: tuple[str, ...],
) -> OnnxMapping:
    where: dict[str, list[int]] = {}
    for rl in rls:
        for n in rl.onnx_nodes:
            where.setdefault(n, []).append(rl.index)
    pref = {
        LayerKind.COMPUTE: 0,
        LayerKind.REFORMAT: 1,
        LayerKind.NOOP: 2,
        LayerKind.WEIGHTS: 3,
        LayerKind.UNKNOWN: 4,
    }
    found, missing = [], []
    for n in order:
        idx = where.get(n)
        if not idx:
            missing.append((n, ops[n]))
            continue
        main = min((rls[i] for i in idx), key=lambda rl: pref[rl.kind])
        found.append(OnnxNodeRun(n, ops[n], tuple(idx), main.kind.value, main.precision))
    return OnnxMapping(model_name, tuple(found), tuple(missing), unknown)


def _unfused_residuals(rls: Sequence[ReportLayer], g: _Graph) -> tuple[UnfusedResidual, ...]:
    """Residual Adds left as their own point-wise layer (registry: residual-add's unfused form), with the
    Relu after them, fused or not."""
    out: list[UnfusedResidual] = []
    for rl in rls:
        if rl.kind != LayerKind.COMPUTE or not registry.is_unfused_residual(view_of(rl)):
            continue
        act = None
        succ = [rls[s] for s in g.successors(rl.index)]
        if len(succ) == 1:
            s = succ[0]
            s_pointwise = s.layer.layer_type in POINTWISE_TYPES or s.layer.parameter_type in POINTWISE_TYPES
            if (
                s.kind == LayerKind.COMPUTE
                and s_pointwise
                and s.onnx_ops
                and set(s.onnx_ops) <= ACTIVATION_OPS
            ):
                act = s.index
        nodes = rl.onnx_nodes + (rls[act].onnx_nodes if act is not None else ())
        out.append(UnfusedResidual(rl.index, act, nodes))
    return tuple(out)


def _names_only_report(layers: EngineLayers, profile: Optional[Profile], onnx_model: Any) -> FusionReport:
    """LAYER_NAMES_ONLY engines: list what can be listed, say plainly what cannot be known."""
    onnx_ops: dict[str, str] = {}
    order: list[str] = []
    model_name = ""
    if onnx_model is not None:
        model_name, onnx_ops, order = _onnx_index(onnx_model)
    times = {t.name: t.average_ms for t in profile.layers} if profile else {}
    unknown: list[str] = []
    rls = []
    for lay in layers.layers:
        nodes = _layer_nodes(lay, onnx_ops, unknown)
        rls.append(
            ReportLayer(
                layer=lay,
                kind=LayerKind.UNKNOWN,
                precision=None,
                in_precisions=(),
                out_precisions=(),
                onnx_nodes=nodes,
                onnx_ops=tuple(onnx_ops.get(n) or op_from_node_name(n) for n in nodes),
                time_ms=times.get(lay.name),
                kind_rule="names-only",
            )
        )
    return FusionReport(
        source=layers.source,
        detailed=False,
        mode="unknown",
        layers=tuple(rls),
        bindings=layers.bindings,
        network_inputs=(),
        network_outputs=(),
        onnx=_onnx_mapping(model_name, onnx_ops, order, rls, ()) if onnx_model is not None else None,
        profile_source=profile.source if profile else None,
        profile_total_ms=sum(t for t in times.values()) if profile else None,
        profile_iterations=profile.iterations if profile else None,
        notes=(
            "engine built with ProfilingVerbosity.LAYER_NAMES_ONLY: no types, formats or precisions; "
            "rebuild with --profilingVerbosity=detailed (trtexec) or ProfilingVerbosity.DETAILED",
        ),
    )
