"""Two or more engines of one model, side by side: what the baseline (implicit INT8) fused, computed in
INT8 and timed that the others did not, region by region, each difference mapped to ONNX nodes and to the
placement rule that explains it.

The data path, each step a value::

    engines = [engine_from_path(p) for p in ("implicit/", "explicit/")]   # layers + profile + run log
    comparison = compare_engines(engines)          # engines[0] is the baseline
    verdict = relative_gate(comparison.diffs[0])   # truthy when the candidate is no worse

Regions: engine layers of both engines that share an ONNX node are one region (union-find over node
names), so a fused ``conv3 + Add + Relu`` in one engine and ``conv3`` plus ``PWN(Add, Relu)`` in the
other line up. Reformats and no-ops belong to the region of the compute layer they feed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

from edgeq.errors import ReportError
from edgeq.report.explain import Explanation, Links, compute_nodes, explain, lint_explanations, merged
from edgeq.report.fusion import FusionReport, LayerKind, ReportLayer
from edgeq.report.fusion_build import build_report
from edgeq.report.parse import PRECISION_RANK, load_layers, load_profile
from edgeq.report.policy import Rule
from edgeq.report.runlog import RunFigures, build_error_from_log, run_figures_from_log

FILES_HINT = (
    "give a directory holding one *.layers.json (trtexec --exportLayerInfo) and optionally one "
    "*.profile.json and one *.run.log, or a *.layers.json file (its siblings are found by name)"
)
DEFAULT_MIN_RATIO = 0.97


# --------------------------------------------------------------------------------------------------
# Engines from files
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Engine:
    """One engine to compare, or one that failed to build (``error`` set, no report)."""

    name: str
    report: Optional[FusionReport]
    run: Optional[RunFigures] = None
    error: Optional[str] = None  # the TensorRT build error of a failed build
    files: tuple[str, ...] = ()

    @property
    def built(self) -> bool:
        return self.report is not None

    @cached_property
    def stats(self) -> EngineStats:
        """The engine's figures, computed once: every diff and every renderer reads these."""
        if self.report is None:
            raise ValueError(f"{self.name}: a failed build has no stats")
        return engine_stats(self.report)


def _one(found: list[Path], what: str, where: Path) -> Optional[Path]:
    if len(found) > 1:
        names = ", ".join(p.name for p in found[:4])
        raise ReportError(f"{where}: {len(found)} {what} files ({names}): which one?", hint=FILES_HINT)
    return found[0] if found else None


def _stem_of(path: Path) -> str:
    name = path.name
    for suffix in (".layers.json", ".build.log"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def engine_from_path(
    path: os.PathLike[str] | str, onnx_model: Any = None, name: Optional[str] = None
) -> Engine:
    """An engine from a directory (one ``*.layers.json``, optional ``*.profile.json`` and ``*.run.log``;
    a deploy run directory's ``layers.json``/``profile.json`` too) or from a ``*.layers.json`` file with
    its same-named siblings. A directory with only a ``*.build.log`` is a failed build."""
    p = Path(path)
    if not p.exists():
        raise ReportError(f"{p}: no such file or directory", hint=FILES_HINT)
    if p.is_dir():
        layers = _one(sorted(p.glob("*.layers.json")) or sorted(p.glob("layers.json")), "*.layers.json", p)
        profile = _one(
            sorted(p.glob("*.profile.json")) or sorted(p.glob("profile.json")), "*.profile.json", p
        )
        run_log = _one(sorted(p.glob("*.run.log")), "*.run.log", p)
        build_log = _one(sorted(p.glob("*.build.log")), "*.build.log", p)
        label = name or (_stem_of(layers) if layers and layers.name != "layers.json" else p.name)
    elif p.name.endswith(".layers.json") or p.name.endswith(".build.log"):
        stem = _stem_of(p)
        sib = p.parent / stem
        layers = Path(f"{sib}.layers.json")
        layers = layers if layers.is_file() else None  # a build log alone: a failed build
        profile = Path(f"{sib}.profile.json")
        run_log = Path(f"{sib}.run.log")
        build_log = Path(f"{sib}.build.log")
        profile, run_log, build_log = (f if f.is_file() else None for f in (profile, run_log, build_log))
        label = name or stem
    else:
        raise ReportError(f"{p}: not a directory or a *.layers.json file", hint=FILES_HINT)
    files = tuple(str(f) for f in (layers, profile, run_log, build_log) if f is not None)
    if layers is None:
        error = build_error_from_log(build_log) if build_log is not None else None
        if build_log is None or error is None:
            raise ReportError(f"{p}: no *.layers.json (and no build log with an error)", hint=FILES_HINT)
        return Engine(label, None, error=error, files=files)
    report = build_report(load_layers(layers), load_profile(profile) if profile else None, onnx_model)
    run = run_figures_from_log(run_log) if run_log is not None else None
    return Engine(label, report, run, files=files)


# --------------------------------------------------------------------------------------------------
# Per-engine figures
# --------------------------------------------------------------------------------------------------


def _rank(p: Optional[str]) -> int:
    return PRECISION_RANK.get(p or "", 9)  # unknown counts as widest: it cannot be proven narrower


@dataclass(frozen=True)
class EngineStats:
    layers: int
    compute: int
    precisions: dict[str, int]
    reformats: int  # interior reformats that change precision or layout
    copies: int  # interior same-format copies (Concat/Slice)
    reformat_ms: Optional[float]
    copy_ms: Optional[float]
    total_ms: Optional[float]
    unfused_residuals: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _ms(rls: Sequence[ReportLayer], timed: bool) -> Optional[float]:
    return sum(rl.time_ms or 0.0 for rl in rls) if timed else None


def engine_stats(report: FusionReport) -> EngineStats:
    interior = report.interior_reformats()
    copies = [rl for rl in interior if rl.same_format_copy]
    changing = [rl for rl in interior if not rl.same_format_copy]
    return EngineStats(
        layers=len(report.layers),
        compute=len(report.of_kind(LayerKind.COMPUTE)),
        precisions=report.compute_precisions(),
        reformats=len(changing),
        copies=len(copies),
        reformat_ms=_ms(changing, report.timed),
        copy_ms=_ms(copies, report.timed),
        total_ms=report.profile_total_ms,
        unfused_residuals=len(report.unfused_residuals),
    )


def fused_groups(report: FusionReport) -> dict[str, int]:
    """' + '-joined ONNX nodes of every compute layer that fused two or more -> its layer index."""
    out: dict[str, int] = {}
    for rl in report.of_kind(LayerKind.COMPUTE):
        nodes = compute_nodes(rl)
        if len(nodes) >= 2:
            out.setdefault(" + ".join(nodes), rl.index)
    return out


# --------------------------------------------------------------------------------------------------
# Regions
# --------------------------------------------------------------------------------------------------


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}

    def find(self, x: Any) -> Any:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: Any, b: Any) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


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


def _side(report: FusionReport, members: list[int]) -> Side:
    rls = [report.layers[i] for i in sorted(members)]
    compute = [rl for rl in rls if rl.kind == LayerKind.COMPUTE]
    inner = [rl for rl in rls if rl.kind == LayerKind.REFORMAT and rl.interior]
    precision = max((rl.precision for rl in compute), key=_rank, default="") if compute else ""
    return Side(
        layers=tuple(rl.index for rl in rls),
        groups=tuple(compute_nodes(rl) for rl in compute),
        precision=precision,
        reformats=sum(not rl.same_format_copy for rl in inner),
        copies=sum(rl.same_format_copy for rl in inner),
        time_ms=_ms(rls, report.timed),
    )


def _regions(base: FusionReport, cand: FusionReport) -> list[tuple[list[int], list[int]]]:
    """(baseline layer indices, candidate layer indices) per region, in candidate engine order."""
    uf = _UnionFind()
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
                ins = [_rank(p) for p in rl.in_precisions]
                outs = [_rank(p) for p in rl.out_precisions]
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
    for bm, cm in _regions(b, c):
        bs, cs = _side(b, bm), _side(c, cm)
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
        regions.append(Region(nodes, bs, cs, tuple(differences), tuple(expl)))

    base_prec: dict[str, Optional[str]] = {}
    for rl in b.of_kind(LayerKind.COMPUTE):
        for n in compute_nodes(rl):
            base_prec.setdefault(n, rl.precision)
    wider = []
    for rl in c.of_kind(LayerKind.COMPUTE):
        for n in compute_nodes(rl):
            if n in base_prec and _rank(rl.precision) > _rank(base_prec[n]):
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
    notes = []
    timed = [e for e in engines if e.built and e.run is not None]
    if 0 < len(timed) < sum(e.built for e in engines):
        notes.append(
            "some engines have no run log: their ratios come from summed per-layer times, which "
            "are not comparable with trtexec throughput"
        )
    diffs = tuple(diff_pair(base, e, findings) for e in engines[1:] if e.built)
    return Comparison(tuple(engines), diffs, tuple(notes))


# --------------------------------------------------------------------------------------------------
# The relative gate
# --------------------------------------------------------------------------------------------------

# The relative gate's rules, as data with the engines that show each (tests/fixtures).
RELATIVE_RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule(
            "wider-than-baseline",
            "an ONNX node runs in a wider precision than in the baseline engine",
            "measured: trt86-h200-edgeq/yolo_edgeq.explicit vs yolo_edgeq.implicit (13 FP16 + 4 FP32 layers "
            "where implicit ran INT8, 0.55x)",
        ),
        Rule(
            "more-reformats",
            "more precision- or layout-changing interior reformats than the baseline engine",
            "measured: trt86-h200-edgeq/r50b64_edgeq.explicit (3 interior reformats, implicit 0; 0.96x)",
        ),
        Rule(
            "slower-than-baseline",
            "throughput under --min-ratio (default 0.97) times the baseline's",
            "measured: trt86-h200/resnet50_ortfb.explicit (all INT8, yet 0.73x implicit: unfused residuals); "
            "yolo_fix2 vs its implicit engine timed on one machine: 1.00x",
        ),
        Rule(
            "not-built",
            "the candidate engine did not build: there is no engine to deploy",
            "measured: trt86-h200-edgeq/yolo_edgeq_all.explicit.build.log ('Could not find any "
            "implementation for node PWN(...)', trtexec FAILED)",
        ),
        Rule(
            "no-timing",
            "no run logs or profiles for both engines: the throughput ratio cannot be checked",
            "trtexec --exportProfile / the run's 'Throughput:' line (tests/fixtures/README.md)",
        ),
    )
}


@dataclass(frozen=True)
class RelativeGate:
    """``bool()`` is the verdict; ``str()`` names what failed or the figures that passed."""

    candidate: str
    baseline: str
    min_ratio: float
    failures: tuple[tuple[str, str], ...]  # (rule, message)
    ratio: Ratio

    def __bool__(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        r = self.ratio
        fig = f"{r.throughput:.3f}x ({r.source})" if r.throughput is not None else "no ratio"
        if self:
            return (
                f"gate relative: {self.candidate} passed against {self.baseline} "
                f"(throughput {fig}, minimum {self.min_ratio:g})"
            )
        rules = ", ".join(dict.fromkeys(rule for rule, _ in self.failures))
        return f"gate relative: {self.candidate} FAILED against {self.baseline} ({rules}; throughput {fig})"

    def __str__(self) -> str:
        return "\n".join(
            [self.summary(), *(f"  [{rule}] {msg}" for rule, msg in self.failures[:12])]
            + ([f"  ... and {len(self.failures) - 12} more"] if len(self.failures) > 12 else [])
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "baseline": self.baseline,
            "passed": bool(self),
            "summary": self.summary(),
            "min_ratio": self.min_ratio,
            "ratio": self.ratio.to_dict(),
            "failures": [{"rule": r, "message": m} for r, m in self.failures],
        }


def relative_gate(diff: PairDiff, min_ratio: float = DEFAULT_MIN_RATIO) -> RelativeGate:
    """Fail the candidate on any node wider than in the baseline, more precision/layout-changing
    reformats, or a throughput ratio under ``min_ratio``."""
    fails: list[tuple[str, str]] = []
    by_layer: dict[int, list[WiderNode]] = {}
    for w in diff.wider:
        by_layer.setdefault(w.cand_layer, []).append(w)
    for layer, ws in by_layer.items():
        names = ", ".join(w.node for w in ws[:3]) + (f" (+{len(ws) - 3})" if len(ws) > 3 else "")
        fails.append(
            (
                "wider-than-baseline",
                f"#{layer} {names}: {ws[0].cand_precision} (baseline {ws[0].base_precision})",
            )
        )
    b, c = diff.base_stats.reformats, diff.cand_stats.reformats
    if c > b:
        fails.append(("more-reformats", f"{c} precision/layout-changing interior reformats (baseline {b})"))
    r = diff.ratio.throughput
    if r is None:
        fails.append(("no-timing", RELATIVE_RULES["no-timing"].description))
    elif r < min_ratio:
        fails.append(
            (
                "slower-than-baseline",
                f"throughput {r:.3f}x the baseline's ({diff.ratio.source}), minimum {min_ratio:g}",
            )
        )
    return RelativeGate(diff.candidate, diff.baseline, min_ratio, tuple(fails), diff.ratio)


def relative_gates(
    comparison: Comparison, min_ratio: float = DEFAULT_MIN_RATIO, only: Optional[Sequence[str]] = None
) -> list[RelativeGate]:
    """One verdict per candidate (those named in ``only``, else all), in the comparison's order: a built
    candidate is judged by ``relative_gate``; one that did not build fails with TensorRT's error."""
    diffs = {d.candidate: d for d in comparison.diffs}
    gates = []
    for e in comparison.engines[1:]:
        if only is not None and e.name not in only:
            continue
        if e.name in diffs:
            gates.append(relative_gate(diffs[e.name], min_ratio))
        else:
            failure = ("not-built", e.error or "the build failed")
            none = Ratio(None, None, "none")
            gates.append(RelativeGate(e.name, comparison.baseline.name, min_ratio, (failure,), none))
    return gates
