"""Why an engine differs from what placement meant: the registry pattern whose engine signature the
layers show (``edgeq.graph.registry``).

Shared by ``compare`` (a region that differs from the baseline) and the report page (violations grouped
by region). Each signature is the engine-side half of one pattern entry; no pattern or op-type list is
named here, so a new pattern's explanation comes with its entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from edgeq.graph import registry
from edgeq.report.fusion import EngineView, FusionReport, LayerKind, ReportLayer, view_of
from edgeq.report.layernames import is_qdq_name
from edgeq.report.parse import PRECISION_RANK


@dataclass(frozen=True)
class Explanation:
    rule: str  # a pattern id (edgeq.graph.registry) or a lint rule id (edgeq.graph.rules)
    why: str  # what in the engines matched it

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "why": self.why}


def compute_nodes(rl: ReportLayer) -> tuple[str, ...]:
    """The ONNX nodes a compute layer ran, Q/DQ nodes left out (they are not compute in either mode)."""
    return tuple(n for n in rl.onnx_nodes if not is_qdq_name(n))


class Links:
    """Producers (all of them: a Concat's copies write one tensor) and consumers of each layer."""

    def __init__(self, report: FusionReport) -> None:
        self.report = report
        producers: dict[str, list[int]] = {}
        consumers: dict[str, list[int]] = {}
        for rl in report.layers:
            for t in rl.layer.outputs:
                producers.setdefault(t.name, []).append(rl.index)
            for t in rl.layer.inputs:
                consumers.setdefault(t.name, []).append(rl.index)
        self.producers, self.consumers = producers, consumers

    def before(self, i: int) -> list[int]:
        return [p for t in self.report.layers[i].layer.inputs for p in self.producers.get(t.name, ())]

    def after(self, i: int) -> list[int]:
        return [c for t in self.report.layers[i].layer.outputs for c in self.consumers.get(t.name, ())]

    def nearest_compute(self, i: int, forward: bool) -> Optional[int]:
        """The first compute layer reached from layer ``i`` through non-compute layers."""
        seen = {i}
        frontier = [i]
        for _ in range(16):
            nxt: list[int] = []
            for j in frontier:
                for k in self.after(j) if forward else self.before(j):
                    if k in seen:
                        continue
                    seen.add(k)
                    if self.report.layers[k].kind == LayerKind.COMPUTE:
                        return k
                    nxt.append(k)
            frontier = nxt
            if not frontier:
                break
        return None

    def upstream_ops(self, i: int, depth: int = 6) -> set[str]:
        """Op types (and 'multi-producer' when several layers write one tensor: a Concat built as copies)
        of the non-compute layers and the compute layers just behind layer ``i``."""
        ops: set[str] = set()
        frontier, seen = [i], {i}
        for _ in range(depth):
            nxt = []
            for j in frontier:
                for t in self.report.layers[j].layer.inputs:
                    prods = self.producers.get(t.name, [])
                    if len(prods) > 1:
                        ops.add("multi-producer")
                    for k in prods:
                        if k in seen:
                            continue
                        seen.add(k)
                        rl = self.report.layers[k]
                        ops.update(rl.onnx_ops)
                        if rl.kind != LayerKind.COMPUTE and rl.kind != LayerKind.WEIGHTS:
                            nxt.append(k)
            frontier = nxt
        return ops


    def view(self, i: int, upstream: Iterable[str] = ()) -> EngineView:
        """Layer ``i`` with what feeds it and the next compute layer's ops, for the engine signatures."""
        down = self.nearest_compute(i, forward=True)
        down_ops = self.report.layers[down].onnx_ops if down is not None else ()
        return view_of(self.report.layers[i], self.upstream_ops(i) | set(upstream), down_ops)


def wide_layer_rule(
    report: FusionReport, links: Links, rl: ReportLayer, upstream: Iterable[str] = ()
) -> Optional[str]:
    """The pattern that explains compute layer ``rl`` running wider than INT8, if one does.

    ``upstream``: more op types known to feed it (e.g. from a baseline engine's matching layers).
    """
    p = registry.explain_wide(links.view(rl.index, upstream))
    return p.id if p is not None else None


def _rank(p: Optional[str]) -> int:
    return PRECISION_RANK.get(p or "", -1)


def explain(base: FusionReport, cand: FusionReport, base_layers: Sequence[int], cand_layers: Sequence[int],
            base_precision: Optional[str], cand_groups: Iterable[tuple[str, ...]],
            links: tuple[Links, Links]) -> list[Explanation]:
    """Which patterns explain how the candidate's region differs from the baseline's: a fusion the baseline
    has and the candidate lacks (or runs as the unfused form), a compute layer wider than the baseline's,
    a reformat the candidate's placement causes."""
    out: list[Explanation] = []
    b_compute = [i for i in base_layers if base.layers[i].kind == LayerKind.COMPUTE]
    c_compute = [i for i in cand_layers if cand.layers[i].kind == LayerKind.COMPUTE]
    groups = set(cand_groups)
    for p in registry.with_signature("fused"):
        sig = p.engine
        assert sig is not None and sig.fused is not None
        fused = [i for i in b_compute if sig.fused(view_of(base.layers[i]))]
        if not fused:
            continue
        if sig.unfused is not None:  # the candidate runs the unfused form
            if any(sig.unfused(view_of(cand.layers[i])) for i in c_compute):
                out.append(Explanation(p.id, sig.describe))
        else:
            for i in fused:
                if compute_nodes(base.layers[i]) not in groups:
                    fused_nodes = " + ".join(compute_nodes(base.layers[i]))
                    out.append(Explanation(p.id, f"the baseline fuses {fused_nodes}; the candidate does not"))
    base_upstream: set[str] = set()
    for i in b_compute:
        base_upstream |= links[0].upstream_ops(i)
    for i in c_compute:
        rl = cand.layers[i]
        if _rank(rl.precision) <= (_rank(base_precision) if base_precision else 0):
            continue
        rule = wide_layer_rule(cand, links[1], rl, base_upstream)
        if rule is not None:
            what = f"{' + '.join(compute_nodes(rl)) or rl.name} runs {rl.precision or '?'}"
            what += f" (baseline {base_precision})" if base_precision else ""
            out.append(Explanation(rule, what))
    b_reformat = {r.id for i in base_layers if (r := registry.explain_reformat(links[0].view(i))) is not None}
    for i in cand_layers:
        rl = cand.layers[i]
        if rl.kind != LayerKind.REFORMAT or rl.same_format_copy:
            continue
        r = registry.explain_reformat(links[1].view(i))
        if r is not None and r.id not in b_reformat and r.engine is not None:
            out.append(Explanation(r.id, f"{r.engine.describe}: {rl.formats}"))
    return list(dict.fromkeys(out))


# The placement that keeps float what the implicit engine ran float (``edgeq.quant.rules``, the mirror's).
MIRROR_FLOAT = "mirror-float"


def narrower_than_implicit(base: FusionReport, base_side: Any, cand_side: Any) -> Optional[Explanation]:
    """What no pattern explains: a region the implicit baseline ran wider (FP16/FP32) than the candidate's
    INT8, and the candidate is not faster there: in implicit mode TensorRT times each layer in every
    precision it may use and keeps the fastest, so the candidate's Q/DQ force INT8 where TensorRT found
    it slower. Measured:
    ``trt86-h200/resnet50_placed.explicit`` against ``resnet50.implicit`` (54 FP16 layers implicit, each
    slower INT8). The mirror placement keeps these float, as implicit did."""
    b, c = base_side.precision, cand_side.precision
    if base.mode != "implicit" or not b or not c or _rank(c) >= _rank(b):
        return None
    b_ms, c_ms = base_side.time_ms, cand_side.time_ms
    if b_ms is not None and c_ms is not None and c_ms < b_ms:
        return None  # INT8 paid off here: nothing to explain away
    return Explanation(MIRROR_FLOAT, f"the implicit baseline ran it {b}, TensorRT's timed choice; the "
                                     f"candidate's Q/DQ make it {c}")


def merged(explanations: Iterable[Explanation]) -> list[Explanation]:
    """One explanation per pattern: what the engine shows and what lint found, under the fact's one id."""
    whys: dict[str, list[str]] = {}
    for e in explanations:
        if e.why not in whys.setdefault(e.rule, []):
            whys[e.rule].append(e.why)
    return [Explanation(rule, "; ".join(w)) for rule, w in whys.items()]


def lint_explanations(findings: Iterable[Any], nodes: Sequence[str]) -> list[Explanation]:
    """Lint findings (``edgeq.graph.rules.lint_model``) that name one of the region's nodes."""
    names = set(nodes)
    out = []
    for f in findings:
        hit = [n for n in getattr(f, "nodes", ()) if n in names]
        if hit:
            out.append(Explanation(f.rule, f"{f.message} ({', '.join(hit[:3])})"))
    return out


# --------------------------------------------------------------------------------------------------
# Gate violations grouped by region (the report page)
# --------------------------------------------------------------------------------------------------


def scope_of(name: str) -> str:
    """The exporter's module scope of an ONNX node name: one block of the network. torch.onnx names a
    Sequential's children '<parent>.<i>', so '/p3/p3.1/cv2/cv2.0/Conv' -> '/p3/p3.1' (one C2f block),
    '/layer4/layer4.2/conv3/Conv' -> '/layer4/layer4.2'; otherwise the first scope: '/h4/cv2/cv2.0/Conv' ->
    '/h4', '/fc/Gemm' -> '/fc'. Names without a scope group under '(graph)'."""
    if not name.startswith("/"):
        return "(graph)"
    parts = [p for p in name.split("/") if p][:-1] or [name.strip("/")]
    if len(parts) >= 2 and parts[1].startswith(parts[0] + "."):
        return f"/{parts[0]}/{parts[1]}"
    return f"/{parts[0]}"


@dataclass(frozen=True)
class ViolationRegion:
    scope: str
    violations: tuple[Any, ...]  # edgeq.report.gate.Violation
    rules: tuple[str, ...]  # placement rule ids that explain the wide layers in it
    nodes: tuple[str, ...]
    time_ms: Optional[float]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self.violations:
            out[v.rule] = out.get(v.rule, 0) + 1
        return out


def group_violations(report: FusionReport, violations: Sequence[Any]) -> list[ViolationRegion]:
    """Violations by the module scope of their ONNX nodes, most expensive region first (then most
    violations), each with the placement rules that explain its wide compute layers."""
    links = Links(report)
    groups: dict[str, list[Any]] = {}
    for v in violations:
        names = [n for n in v.nodes if n.startswith("/")] or list(v.nodes) or [v.layer_name]
        groups.setdefault(scope_of(names[0]), []).append(v)
    out = []
    for scope, vs in groups.items():
        rules: list[str] = []
        for v in vs:
            rl = report.layers[v.layer]
            if rl.kind == LayerKind.COMPUTE and v.rule == "int8-compute":
                rule = wide_layer_rule(report, links, rl)
                if rule is not None and rule not in rules:
                    rules.append(rule)
        layers = {v.layer for v in vs}
        times = [report.layers[i].time_ms for i in layers]
        nodes = tuple(dict.fromkeys(n for v in vs for n in v.nodes if not is_qdq_name(n)))
        total = sum(t for t in times if t is not None) if report.timed else None
        out.append(ViolationRegion(scope, tuple(vs), tuple(rules), nodes, total))
    return sorted(out, key=lambda g: (-(g.time_ms or 0.0), -len(g.violations), g.scope))
