"""Two or more engines of one model, side by side: what the baseline (implicit INT8) fused, computed in
INT8 and timed that the others did not, region by region, each difference mapped to ONNX nodes and to the
placement rule that explains it.

The data path, each step a value (engine_from_path: compare_engine; relative_gate: compare_gate)::

    engines = [engine_from_path(p) for p in ("implicit/", "explicit/")]   # layers + profile + run log
    comparison = compare_engines(engines)          # engines[0] is the baseline
    verdict = relative_gate(comparison.diffs[0])   # truthy when the candidate is no worse

Regions (compare_regions) line up the layers of both engines by the ONNX nodes they share; this module
diffs each pair of engines region by region.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from edgeq.errors import ReportError
from edgeq.report.compare_engine import FILES_HINT, Engine, EngineStats, fused_groups, precision_rank
from edgeq.report.compare_regions import Region, region_members, region_side
from edgeq.report.explain import (
    Explanation,
    Links,
    compute_nodes,
    explain,
    lint_explanations,
    merged,
    narrower_than_implicit,
)
from edgeq.report.fusion import LayerKind
from edgeq.report.layernames import foreign_names, require_same_model

# --------------------------------------------------------------------------------------------------
# The comparison
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WiderNode:
    node: str
    base_precision: Optional[str]
    cand_precision: Optional[str]
    cand_layer: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Ratio:
    throughput: Optional[float]  # candidate / baseline (>1: candidate faster)
    latency: Optional[float]  # candidate / baseline median latency (<1: candidate faster)
    source: str  # "run logs" | "summed layer times" | "none"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PairDiff:
    """The candidate engine against the baseline."""

    baseline: str
    candidate: str
    ratio: Ratio
    missing_groups: tuple[str, ...]  # fused in the baseline, not in the candidate
    extra_groups: tuple[str, ...]  # fused in the candidate only
    wider: tuple[WiderNode, ...]  # ONNX nodes in a wider precision than in the baseline
    regions: tuple[Region, ...]
    base_stats: EngineStats
    cand_stats: EngineStats

    def top(self, n: int = 10) -> list[Region]:
        """Differing regions by time the candidate loses (most first), then the untimed ones."""
        diff = [r for r in self.regions if r.differs]
        return sorted(diff, key=lambda r: -(r.delta_ms if r.delta_ms is not None else float("-inf")))[:n]

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "ratio": self.ratio.to_dict(),
            "missing_groups": list(self.missing_groups),
            "extra_groups": list(self.extra_groups),
            "wider": [w.to_dict() for w in self.wider],
            "differing_regions": sum(r.differs for r in self.regions),
            "top": [r.to_dict() for r in self.top(top)],
            "regions": [r.to_dict() for r in self.regions],
        }


@dataclass(frozen=True)
class Comparison:
    engines: tuple[Engine, ...]  # [0] is the baseline
    diffs: tuple[PairDiff, ...]  # one per built candidate
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def baseline(self) -> Engine:
        return self.engines[0]

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        return {
            "schema": "edgeq-compare/1",
            "baseline": self.baseline.name,
            "engines": [
                {
                    "name": e.name,
                    "built": e.built,
                    "error": e.error,
                    "files": list(e.files),
                    "mode": e.report.mode if e.report else None,
                    "stats": e.stats.to_dict() if e.report else None,
                    "run": dict(e.run.__dict__) if e.run else None,
                }
                for e in self.engines
            ],
            "diffs": [d.to_dict(top) for d in self.diffs],
            "notes": list(self.notes),
        }


def _ratio(base: Engine, cand: Engine) -> Ratio:
    br, cr = base.run, cand.run
    if br and cr and br.throughput_qps and cr.throughput_qps:
        lat = None
        if br.latency_median_ms and cr.latency_median_ms:
            lat = cr.latency_median_ms / br.latency_median_ms
        return Ratio(cr.throughput_qps / br.throughput_qps, lat, "run logs")
    assert base.report is not None and cand.report is not None
    bt, ct = base.report.profile_total_ms, cand.report.profile_total_ms
    if bt and ct:
        return Ratio(bt / ct, ct / bt, "summed layer times")
    return Ratio(None, None, "none")


def diff_pair(base: Engine, cand: Engine, findings: Sequence[Any] = ()) -> PairDiff:
    b, c = base.report, cand.report
    if b is None or c is None:
        raise ValueError("diff_pair needs two built engines")
    if not (b.detailed and c.detailed):
        which = base.name if not b.detailed else cand.name
        raise ReportError(
            f"{which}: built with ProfilingVerbosity.LAYER_NAMES_ONLY: no precisions or formats to compare",
            hint="rebuild with --profilingVerbosity=detailed (trtexec) or ProfilingVerbosity.DETAILED",
        )
    links = (Links(b), Links(c))
    regions = []
    for bm, cm in region_members(b, c):
        bs, cs = region_side(b, bm), region_side(c, cm)
        nodes = tuple(dict.fromkeys(n for g in (*bs.groups, *cs.groups) for n in g))
        differences = []
        if sorted(bs.groups) != sorted(cs.groups):
            differences.append("fusion")
        if bs.precision != cs.precision and bs.groups and cs.groups:
            differences.append("precision")
        if bs.reformats != cs.reformats:
            differences.append("reformats")
        expl: list[Explanation] = []
        if differences:
            expl = merged(explain(b, c, bs.layers, cs.layers, bs.precision, cs.groups, links)
                          + lint_explanations(findings, nodes))
            narrower = None if expl else narrower_than_implicit(b, bs, cs)  # no pattern explains it
            expl += [narrower] if narrower else []
        regions.append(Region(nodes, bs, cs, tuple(differences), tuple(expl)))

    base_prec: dict[str, Optional[str]] = {}
    for rl in b.of_kind(LayerKind.COMPUTE):
        for n in compute_nodes(rl):
            base_prec.setdefault(n, rl.precision)
    wider = []
    for rl in c.of_kind(LayerKind.COMPUTE):
        for n in compute_nodes(rl):
            if n in base_prec and precision_rank(rl.precision) > precision_rank(base_prec[n]):
                wider.append(WiderNode(n, base_prec[n], rl.precision, rl.index))
    bg, cg = fused_groups(b), fused_groups(c)
    return PairDiff(
        baseline=base.name,
        candidate=cand.name,
        ratio=_ratio(base, cand),
        missing_groups=tuple(g for g in bg if g not in cg),
        extra_groups=tuple(g for g in cg if g not in bg),
        wider=tuple(wider),
        regions=tuple(regions),
        base_stats=base.stats,
        cand_stats=cand.stats,
    )


def _same_model(base: Engine, cand: Engine) -> None:
    """Refuse engines of different models: their diff ("0.33x", "49 fused only in the baseline") means
    nothing. Most of the candidate's compute nodes missing from the baseline's names is the sign, the
    one ``report --onnx`` gives for an engine against a model (``layernames.different_model``)."""
    if base.report is None or cand.report is None:
        return
    known = {n for rl in base.report.layers for n in rl.onnx_nodes}
    names = list(dict.fromkeys(n for rl in cand.report.of_kind(LayerKind.COMPUTE) for n in compute_nodes(rl)))
    require_same_model(cand.name, foreign_names(names, known), len(names), f"the baseline {base.name}",
                       "compare engines of one ONNX model: its implicit, explicit and FP16 builds")


def compare_engines(engines: Sequence[Engine], findings: Sequence[Any] = ()) -> Comparison:
    """Every built engine against ``engines[0]`` (the baseline); failed builds stay rows of their own."""
    if len(engines) < 2:
        raise ReportError("compare needs at least two engines (the first is the baseline)", hint=FILES_HINT)
    seen: dict[str, int] = {}
    unique = []
    for e in engines:  # names key the diffs and the page: two "implicit" directories stay apart
        seen[e.name] = seen.get(e.name, 0) + 1
        unique.append(e if seen[e.name] == 1 else replace(e, name=f"{e.name} ({seen[e.name]})"))
    engines = unique
    base = engines[0]
    if not base.built:
        raise ReportError(
            f"{base.name}: the baseline did not build ({base.error}); nothing to compare against",
            hint="put a built engine first (the implicit INT8 one)",
        )
    for e in engines[1:]:
        _same_model(base, e)
    notes = []
    timed = [e for e in engines if e.built and e.run is not None]
    if 0 < len(timed) < sum(e.built for e in engines):
        notes.append(
            "some engines have no run log: their ratios come from summed per-layer times, which "
            "are not comparable with trtexec throughput"
        )
    diffs = tuple(diff_pair(base, e, findings) for e in engines[1:] if e.built)
    return Comparison(tuple(engines), diffs, tuple(notes))
