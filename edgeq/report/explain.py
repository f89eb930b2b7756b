"""Why a layer runs wider than INT8, read from the engine's structure, as a placement rule id.

Shared by ``compare`` (a region that differs from the baseline) and the report page (violations grouped
by region). The rule ids are ``edgeq.quant.rules.RULES`` entries (the rules whose measured engines show
exactly these structures); the rules' text stays there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from edgeq.report.fusion import FusionReport, LayerKind, ReportLayer

POOL_OPS = frozenset({"GlobalAveragePool", "AveragePool", "ReduceMean"})


@dataclass(frozen=True)
class Explanation:
    rule: str  # a placement rule id (edgeq.quant.rules) or a lint rule id (edgeq.graph.rules)
    why: str  # what in the engines matched it

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "why": self.why}


def placement_rule(rule_id: str) -> str:
    """The id, checked against ``edgeq.quant.rules.RULES`` (a missing id is a bug here)."""
    from edgeq.quant.rules import RULES

    return RULES[rule_id].id


def _is_qdq_name(n: str) -> bool:
    return "quantizelinear" in n.lower()  # QuantizeLinear, DequantizeLinear and their _clone_N copies


def compute_nodes(rl: ReportLayer) -> tuple[str, ...]:
    """The ONNX nodes a compute layer ran, Q/DQ nodes left out (they are not compute in either mode)."""
    return tuple(n for n in rl.onnx_nodes if not _is_qdq_name(n))


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


def wide_layer_rule(
    report: FusionReport, links: Links, rl: ReportLayer, upstream: Iterable[str] = ()
) -> Optional[str]:
    """The placement rule that explains compute layer ``rl`` running wider than INT8, if one does.

    ``upstream``: more op types known to feed it (e.g. from a baseline engine's matching layers).
    """
    ops = set(rl.onnx_ops)
    downstream = links.nearest_compute(rl.index, forward=True)
    down_ops = set(report.layers[downstream].onnx_ops) if downstream is not None else set()
    if {"Sigmoid", "Mul"} <= ops and {"Add", "Sum"} & ops:
        return placement_rule("place-silu-residual")
    if POOL_OPS & ops or POOL_OPS & down_ops:
        return placement_rule("place-pool-tail")
    if "Conv" in ops:
        feeding = links.upstream_ops(rl.index) | set(upstream)
        if "Concat" in feeding or "multi-producer" in feeding:
            return placement_rule("place-concat-conv")
    return None


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
        nodes = tuple(dict.fromkeys(n for v in vs for n in v.nodes if not _is_qdq_name(n)))
        total = sum(t for t in times if t is not None) if report.timed else None
        out.append(ViolationRegion(scope, tuple(vs), tuple(rules), nodes, total))
    return sorted(out, key=lambda g: (-(g.time_ms or 0.0), -len(g.violations), g.scope))
