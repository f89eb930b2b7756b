"""Building the report: classify every layer, find boundaries and the INT8 region, join profile times
and ONNX nodes (``build_report``, the one entry point)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

from edgeq.errors import ReportError
from edgeq.graph import patterns, registry
from edgeq.report.fusion import (
    POINTWISE_TYPES,
    FusionReport,
    LayerKind,
    OnnxMapping,
    OnnxNodeRun,
    ReportLayer,
    UnfusedResidual,
    view_of,
)
from edgeq.report.layerkinds import LayerLinks, from_qdq, is_dq, is_q, layer_kinds
from edgeq.report.layernames import (
    REFORMAT_FOR,
    different_model,
    layer_nodes,
    nodes_from_metadata,
    op_from_node_name,
)
from edgeq.report.parse import FLOAT_DTYPES, PRECISION_RANK, EngineLayer, EngineLayers, Profile, Tensor

if TYPE_CHECKING:
    import onnx

# After a residual Add, a Swish's Mul and a PRelu also count as the activation TensorRT would have fused
# with it (the ONNX vocabulary is the graph side's, so "an activation" means the same to lint and here).
ACTIVATION_OPS = patterns.ACTIVATION_OPS | {"Mul", "PRelu"}


def _widest(precisions: Iterable[Optional[str]]) -> Optional[str]:
    ps = list(precisions)
    if not ps or any(p is None for p in ps):
        return None
    return max(ps, key=lambda p: PRECISION_RANK.get(p or "", 0))


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
    g = LayerLinks(layers)
    kinds = layer_kinds(layers, g)

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
        nodes = layer_nodes(lay, onnx_ops, unknown)
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
        if p.kind == LayerKind.REFORMAT and is_q(layers.layers[i], p.ins, p.outs)
    ]
    dqs = [
        i
        for i, p in enumerate(pre)
        if p.kind == LayerKind.REFORMAT and is_dq(layers.layers[i], p.ins, p.outs)
    ]
    # (a Q/DQ reformat with no format printed, as a range-profile engine inspected without input shapes
    # prints them, still says the engine is explicit)
    mode = "explicit" if qs or dqs or any(from_qdq(lay) for lay in layers.layers) else "implicit"
    region = ["inside"] * len(pre)
    if qs:
        first_qs = [q for q in qs if not (g.descendants([q2 for q2 in qs if q2 != q]) & {q})]
        inside = g.descendants(first_qs) | set(first_qs)
        for i in range(len(pre)):
            if i not in inside and pre[i].kind != LayerKind.WEIGHTS:
                region[i] = "before"
        for q in first_qs:
            boundary.setdefault(q, ("input", "first Q/DQ quantize of the INT8 region"))
    q_set = set(qs)

    def int8_follows(after: set[int]) -> bool:
        return any((pre[a].kind == LayerKind.COMPUTE and pre[a].precision == "INT8") or a in q_set
                   for a in after)  # fmt: skip

    for d in dqs:
        after = g.descendants([d])
        if not int8_follows(after):
            boundary.setdefault(d, ("output", "last Q/DQ dequantize of the INT8 region"))
            for a in after:
                if pre[a].kind != LayerKind.WEIGHTS:
                    region[a] = "after"

    # Past the last INT8 layer (the int8 gate's end of the region, not the report's ``region``, which the
    # relative gate's reformat counts read): a compute layer may dequantize in its epilogue, INT8 in and
    # float out (TensorRT fuses the last DQ into a MatMul/Conv that writes FP32), and what follows it, where
    # no INT8 layer or Q follows and it ends at a network output, is float by the Q/DQ model's own design,
    # not a fallback. Measured: tests/fixtures/trt86-h100-arith (PP-LCNet on an H100: 'MatMul.0 + Add.8'
    # INT8 -> FP32, then the output Softmax in FP32; YOLOv8n: the DFL convolution INT8 -> FP32, then the
    # box decoding's Sub/Add/Div/Mul in FP32).
    past: set[int] = set()
    for d in range(len(pre)) if mode == "explicit" else ():
        p = pre[d]
        if p.kind != LayerKind.COMPUTE or "INT8" not in p.ins or not p.outs or \
                not all(o in FLOAT_DTYPES for o in p.outs):
            continue
        after = g.descendants([d])
        if int8_follows(after):
            continue
        if any(t.name in net_out for a in (d, *after) for t in layers.layers[a].outputs):
            past |= {a for a in after if pre[a].kind != LayerKind.WEIGHTS}

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
        m = REFORMAT_FOR.match(lay.name)
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
                past_int8=lay.index in past and region[lay.index] == "inside",
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
        named = tuple(sorted({n for lay in layers.layers for n in nodes_from_metadata(lay.metadata)}))
        onnx_map = _onnx_mapping(
            model_name, onnx_ops, onnx_order, report_layers, tuple(dict.fromkeys(unknown)), named
        )
        if onnx_map.unknown:  # most of them: ``layernames.require_same_model`` refuses it (report, compare)
            notes.append(different_model(onnx_map.unknown, len(named), model_name))
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


def _reachable_tensors(g: LayerLinks, i: int, pre: list[_Pre]) -> set[str]:
    """Output tensors of layer ``i`` and of the no-ops after it."""
    out: set[str] = set()
    stack = [i]
    while stack:
        j = stack.pop()
        for t in g.layers[j].outputs:
            out.add(t.name)
            stack.extend(c for c in g.consumers.get(t.name, []) if pre[c].kind == LayerKind.NOOP)
    return out


def _onnx_mapping(
    model_name: str,
    ops: dict[str, str],
    order: list[str],
    rls: Sequence[ReportLayer],
    unknown: tuple[str, ...],
    engine_names: tuple[str, ...],
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
    return OnnxMapping(model_name, tuple(found), tuple(missing), unknown, engine_names)


def _unfused_residuals(rls: Sequence[ReportLayer], g: LayerLinks) -> tuple[UnfusedResidual, ...]:
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
        nodes = layer_nodes(lay, onnx_ops, unknown)
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
        onnx=_onnx_mapping(model_name, onnx_ops, order, rls, (), ()) if onnx_model is not None else None,
        profile_source=profile.source if profile else None,
        profile_total_ms=sum(t for t in times.values()) if profile else None,
        profile_iterations=profile.iterations if profile else None,
        notes=(
            "engine built with ProfilingVerbosity.LAYER_NAMES_ONLY: no types, formats or precisions; "
            "rebuild with --profilingVerbosity=detailed (trtexec) or ProfilingVerbosity.DETAILED",
        ),
    )
