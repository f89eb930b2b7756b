"""The regions of a pairwise comparison: layers of two engines that share an ONNX node are one region
(union-find over node names), so a fused ``conv3 + Add + Relu`` in one engine and ``conv3`` plus
``PWN(Add, Relu)`` in the other line up. Reformats and no-ops belong to the region of the compute layer they
feed. The alignment is its own algorithm, so it lives apart from the diff that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from edgeq.report.compare_engine import precision_rank, summed_ms
from edgeq.report.explain import Explanation, Links, compute_nodes
from edgeq.report.fusion import FusionReport, LayerKind
from edgeq.unionfind import UnionFind

# --------------------------------------------------------------------------------------------------
# Regions
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One engine's part of a region."""

    layers: tuple[int, ...]  # engine layer indices, compute and the copies that feed them
    groups: tuple[tuple[str, ...], ...]  # ONNX nodes of each compute layer
    precision: Optional[str]  # widest compute precision ("" when the engine has no compute here)
    reformats: int  # precision/layout-changing reformats
    copies: int
    time_ms: Optional[float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": list(self.layers),
            "groups": [list(g) for g in self.groups],
            "precision": self.precision,
            "reformats": self.reformats,
            "copies": self.copies,
            "time_ms": self.time_ms,
        }


@dataclass(frozen=True)
class Region:
    nodes: tuple[str, ...]
    base: Side
    cand: Side
    differences: tuple[str, ...]  # "fusion", "precision", "reformats"
    explanations: tuple[Explanation, ...] = ()

    @property
    def differs(self) -> bool:
        return bool(self.differences)

    @property
    def delta_ms(self) -> Optional[float]:
        if self.base.time_ms is None or self.cand.time_ms is None:
            return None
        return self.cand.time_ms - self.base.time_ms

    @property
    def rules(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.rule for e in self.explanations))

    def label(self, limit: int = 3) -> str:
        shown = ", ".join(self.nodes[:limit])
        return (
            shown + (f" (+{len(self.nodes) - limit})" if len(self.nodes) > limit else "") or "(no ONNX node)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": list(self.nodes),
            "baseline": self.base.to_dict(),
            "candidate": self.cand.to_dict(),
            "differences": list(self.differences),
            "delta_ms": self.delta_ms,
            "explanations": [e.to_dict() for e in self.explanations],
        }


def region_side(report: FusionReport, members: list[int]) -> Side:
    rls = [report.layers[i] for i in sorted(members)]
    compute = [rl for rl in rls if rl.kind == LayerKind.COMPUTE]
    inner = [rl for rl in rls if rl.kind == LayerKind.REFORMAT and rl.interior]
    precision = max((rl.precision for rl in compute), key=precision_rank, default="") if compute else ""
    return Side(
        layers=tuple(rl.index for rl in rls),
        groups=tuple(compute_nodes(rl) for rl in compute),
        precision=precision,
        reformats=sum(not rl.same_format_copy for rl in inner),
        copies=sum(rl.same_format_copy for rl in inner),
        time_ms=summed_ms(rls, report.timed),
    )


def region_members(base: FusionReport, cand: FusionReport) -> list[tuple[list[int], list[int]]]:
    """(baseline layer indices, candidate layer indices) per region, in candidate engine order."""
    uf = UnionFind[Any]()
    reports = (base, cand)
    for side, report in enumerate(reports):
        for rl in report.of_kind(LayerKind.COMPUTE):
            uf.find((side, rl.index))
            for n in compute_nodes(rl) or (f"#layer{side}:{rl.index}",):
                uf.union((side, rl.index), ("node", n))
    members: dict[Any, tuple[list[int], list[int]]] = {}
    for side, report in enumerate(reports):
        links = Links(report)
        for rl in report.layers:
            if rl.kind == LayerKind.WEIGHTS:
                continue
            if rl.kind == LayerKind.COMPUTE:
                root = uf.find((side, rl.index))
            else:
                # A quantizing copy (float in, INT8 out) is the cost of the float layer before it; a
                # dequantizing one, a copy or a no-op belongs to the layer it feeds.
                ins = [precision_rank(p) for p in rl.in_precisions]
                outs = [precision_rank(p) for p in rl.out_precisions]
                back_first = bool(ins and outs) and max(ins) > max(outs)
                k = links.nearest_compute(rl.index, forward=not back_first)
                if k is None:
                    k = links.nearest_compute(rl.index, forward=back_first)
                root = uf.find((side, k)) if k is not None else uf.find((side, f"edge:{rl.index}"))
            members.setdefault(root, ([], []))[side].append(rl.index)

    def order(m: tuple[list[int], list[int]]) -> tuple[float, float]:
        b, c = m
        return (min(c) if c else -1.0, min(b) if b else -1.0)

    ordered = sorted(members.values(), key=order)
    # Regions only the baseline has go after the region that precedes them in the baseline.
    with_c = [m for m in ordered if m[1]]
    out: list[tuple[list[int], list[int]]] = []
    only_b = sorted((m for m in ordered if not m[1]), key=lambda m: min(m[0]))
    for m in with_c:
        while only_b and m[0] and min(only_b[0][0]) < min(m[0]):
            out.append(only_b.pop(0))
        out.append(m)
    return out + only_b
