"""Which Q/DQ regions cost the task metric (``edgeq sensitivity``), and keeping the worst float until the
metric holds (``edgeq quantize --max-loss``).

Why: an accuracy figure says that a quantized model lost something, not where. On a trained YOLOv8n one
clipped tensor (``amax`` 0.28 under entropy against 4.07 under max) cost most of the lost detections;
the fix is to keep that part float, which a user can only do knowing which part it is (Polygraphy's
``debug precision`` and onnxruntime's ``qdq_loss_debug`` answer the same question).

The unit is what ``--overrides``' ``exclude`` takes, so a result is directly usable: a region is one
scale group of the plan (Q/DQ sites sharing one scale, through the data movement they commute across)
together with the nodes that read it in INT8; groups read by one node are one region. Excluding a
region's nodes leaves its tensors and its nodes' weights float (and what a placement pattern anchored
at one of them placed: the placement decides, as it would for the user's file); a weighted node whose
input stays float anyway is a region of its own (its weights). Every candidate is the plan
``quantize --overrides`` would place with those nodes excluded, scaled from ONE calibration pass (every
float activation is calibrated, so any placement has its ranges) and scored on the held-out samples
against ONE run of the FP32 reference: a region's "recovered" figure is exactly what excluding it buys.

Regions are ranked by the metric's rank (``TaskScore.rank``: its dense form included, so one string or
detection does not decide alone); the figures shown are the metric's headline. A model that loses
nothing on the metric with every region INT8 has nothing to recover: no region is scored.

Cost: two onnxruntime runs of the held-out set per region (alone and all-but-one). Regions are tried in
the order their calibrated range clips most (largest ``max |x| / amax`` first, from the same histograms),
so a cap (``max_regions``, a time budget) keeps the likely culprits and says what it skipped.
``--max-loss`` ranks every region (one run each) and needs at most two more runs per region.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeq.errors import QuantError
from edgeq.findings import ProgressFn, no_progress
from edgeq.quant.overrides import Overrides
from edgeq.unionfind import UnionFind

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnx_graphsurgeon as gs

    from edgeq.quant.accuracy import HeldOut
    from edgeq.quant.autocalib import Choice
    from edgeq.quant.budget import BudgetChoice
    from edgeq.quant.float_cost import CostModel, FloatCost
    from edgeq.quant.metrics import TaskScore
    from edgeq.quant.plan import Plan
    from edgeq.quant.quantize import QuantizeOptions

MAX_REGIONS = 20  # regions scored by default: 41 runs of the held-out set


@dataclass(frozen=True)
class QdqRegion:
    """A unit ``--overrides`` can exclude: ``nodes`` read ``tensors`` in INT8 (and are weighted nodes
    whose weights are int8); excluding ``nodes`` leaves all of it float."""

    name: str  # its first Q/DQ tensor (the scale group's id), or its node for a weights-only region
    tensors: tuple[str, ...]
    nodes: tuple[str, ...]
    clip: float = 1.0  # max |x| seen in calibration over the scale's amax, worst tensor (1.0: none clipped)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "tensors": list(self.tensors), "nodes": list(self.nodes),
                "clip": round(self.clip, 4)}


def qdq_regions(graph: gs.Graph, plan: Plan) -> list[QdqRegion]:
    """The plan's regions in graph order (see the module doc); forced nodes are the user's and never in
    one."""
    from edgeq.graph.patterns import moves_data

    nodes = {n.name: n for n in graph.nodes}
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    commuted = set(plan.commuted)
    forced = set(plan.forced)
    uf = UnionFind[str]()
    readers: dict[str, set[str]] = {}  # group id -> nodes reading it in INT8
    for site in plan.sites:
        gid = site.group
        uf.add(gid)
        seen = readers.setdefault(gid, set())
        stack = list(site.consumers)
        while stack:
            name = stack.pop()
            node = nodes.get(name)
            if node is None or name in seen:
                continue
            through = [o for o in node.outputs if o.name in commuted and plan.group_of(o.name) == gid]
            if through and moves_data(node):  # INT8 by commuting: its readers read this scale
                stack += [c.name for o in through for c in o.outputs]
            elif name not in forced:
                seen.add(name)
    owner: dict[str, str] = {}
    for gid, names in readers.items():
        for n in names:
            if n in owner:
                uf.union(owner[n], gid)
            else:
                owner[n] = gid
    members: dict[str, list[str]] = {}
    for gid in readers:
        members.setdefault(uf.find(gid), []).append(gid)
    tensors_of: dict[str, list[str]] = {}
    for s in plan.sites:
        tensors_of.setdefault(s.group, []).append(s.tensor)
    out = []
    for gids in members.values():
        ordered = sorted({n for g in gids for n in readers[g]}, key=lambda n: order.get(n, 0))
        if ordered:
            out.append(QdqRegion(gids[0], tuple(t for g in gids for t in tensors_of[g]), tuple(ordered)))
    taken = {n for r in out for n in r.nodes}
    out += [QdqRegion(w.node, (), (w.node,)) for w in plan.weights if w.node not in taken | forced]
    first = {r.name: min(order.get(n, 0) for n in r.nodes) for r in out}
    return sorted(out, key=lambda r: first[r.name])


def exact_pattern(name: str) -> str:
    """An ``--overrides`` pattern matching exactly ``name`` (glob characters and a ``re:`` prefix
    escaped), so a written override file names nodes as they are."""
    escaped = "".join(f"[{c}]" if c in "*?[" else c for c in name)
    return "[r]" + escaped[1:] if escaped.startswith("re:") else escaped


def with_excluded(base: Overrides | None, nodes: Collection[str], source: str = "sensitivity") -> Overrides:
    """``base`` (the user's overrides) with ``nodes`` excluded as well."""
    base = base or Overrides()
    extra = tuple(exact_pattern(n) for n in nodes)
    return Overrides(exclude=tuple(dict.fromkeys((*base.exclude, *extra))), force=base.force,
                     source=base.source if not nodes else source)


class Scorer:
    """Candidate placements of one reference model scored with one metric: each is the plan the
    placement rules give with some nodes excluded, scaled from one calibration (``amax``) and run over
    the held-out samples against the FP32 outputs computed once."""

    def __init__(self, reference: onnx.ModelProto, options: QuantizeOptions, amax: dict[str, float],
                 held: HeldOut, rounding: dict[str, np.ndarray] | None = None) -> None:
        self.reference = reference
        self.rounding = rounding  # the learned int8 weights (--weights), None: nearest
        self.options = options
        self.base = options.read_overrides()
        self.amax = amax
        self.held = held
        self.runs = 0
        self._graph: gs.Graph | None = None

    def plan(self, exclude: Collection[str] = ()) -> tuple[gs.Graph, Plan]:
        """(the graph placement read, the plan): placement only reads the graph, so one serves them all
        (``build_qdq`` inserts into a copy of its own)."""
        from edgeq.graph.io import graph_from_model
        from edgeq.quant.placement import plan_placement

        if self._graph is None:
            self._graph = graph_from_model(self.reference)
        return self._graph, plan_placement(self._graph, self.options.placement,
                                           with_excluded(self.base, exclude))

    def run(self, exclude: Collection[str] = ()) -> tuple[Plan, onnx.ModelProto, list[dict[str, np.ndarray]]]:
        """(the plan, its Q/DQ model, the model's held-out outputs) with ``exclude`` float."""
        from edgeq.quant.accuracy import run_outputs
        from edgeq.quant.quantize import build_qdq

        _, plan = self.plan(exclude)
        missing = [t for t in plan.tensors if t not in self.amax]
        if missing:
            raise QuantError(f"no calibration range for '{missing[0]}': the regions need every float "
                             "activation calibrated")
        model = build_qdq(self.reference, plan, self.amax, self.rounding)
        got = run_outputs(model, self.held.data, providers=self.options.providers, what="a candidate")
        self.runs += 1
        return plan, model, got

    def score(self, exclude: Collection[str] = ()) -> TaskScore:
        return self.held.score(self.run(exclude)[2])


# --------------------------------------------------------------------------------------------------
# edgeq sensitivity
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegionScore:
    region: QdqRegion
    alone: TaskScore | None  # only this region INT8, everything else float
    all_but_one: TaskScore  # everything INT8 but this region

    def recovered(self, all_int8: TaskScore) -> float:
        """What keeping this region float buys: score(all-but-one) - score(all INT8)."""
        return self.all_but_one.value - all_int8.value

    def recovered_rank(self, all_int8: TaskScore) -> float:
        """The same in the metric's rank (its dense form included): what the regions are ranked by, so a
        small set's coarse headline (one detection, one string) does not decide alone."""
        return self.all_but_one.rank - all_int8.rank

    def to_dict(self, all_int8: TaskScore) -> dict[str, Any]:
        return {**self.region.to_dict(), "alone": None if self.alone is None else self.alone.value,
                "all_but_one": self.all_but_one.value, "recovered": self.recovered(all_int8),
                "recovered_rank": self.recovered_rank(all_int8),
                "alone_text": None if self.alone is None else self.alone.text,
                "all_but_one_text": self.all_but_one.text}


@dataclass(frozen=True)
class SensitivityOptions:
    """``edgeq sensitivity``'s settings: one quantization's (calibration data, calibrator, placement,
    the user's overrides, the held-out set and the metric) plus the cost bounds."""

    quantize: QuantizeOptions
    max_regions: int | None = MAX_REGIONS
    budget_s: float | None = None
    alone: bool = True  # also score each region alone (the other half of the table)
    # --engine: a full INT8 engine's run (deploy run directory or layer JSON with its profile): each region
    # priced there (edgeq.quant.float_cost), the page draws accuracy against qps; with quantize.max_loss
    # the cheapest set that meets it is chosen and marked (as deploy --max-loss chooses)
    engine: Path | None = None

    def __post_init__(self) -> None:
        if self.max_regions is not None and self.max_regions < 1:
            raise QuantError(f"--max-regions must be at least 1, got {self.max_regions}")
        if self.budget_s is not None and self.budget_s <= 0:
            raise QuantError(f"--budget must be positive, got {self.budget_s:g} s")
        if self.quantize.placement not in ("trt", "all") or self.quantize.from_engine is not None:
            raise QuantError("sensitivity ranks what --overrides can exclude: placement trt or all",
                             "leave out --placement implicit and --from-engine")
        if self.quantize.max_loss is not None and self.engine is None:
            raise QuantError("sensitivity --max-loss chooses by what the regions cost on a target",
                             "give --engine (an earlier deploy's run directory), or use quantize --max-loss")


@dataclass
class SensitivityResult:
    metric: str
    metric_why: str
    fp32_samples: int
    all_int8: TaskScore
    scored: list[RegionScore]  # ranked: most recovered first
    skipped: list[tuple[QdqRegion, str]] = field(default_factory=list)  # not scored, and why
    regions: int = 0
    interrupted: bool = False
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    calibrator: str = ""
    files: dict[str, str] = field(default_factory=dict)
    priced: Priced | None = None  # --engine: each region's cost there, the chart, --max-loss's choice

    @property
    def loss(self) -> float:
        """The all-INT8 model's loss against FP32 on the metric (FP32 scores 1.0)."""
        return 1.0 - self.all_int8.value

    @property
    def nothing_to_recover(self) -> bool:
        """Every region INT8 already scores as FP32: no region was scored (``sensitivity`` stops)."""
        return self.loss <= 1e-12

    def advice(self) -> str:
        """The region to keep float first, named by its nodes as the table and ``--overrides`` name it."""
        if self.nothing_to_recover:
            return (f"nothing to recover: with every region INT8 the model scores as FP32 on {self.metric} "
                    f"({self.all_int8.text}); no region was scored")
        if not self.scored:
            return ""
        top = self.scored[0]
        gain = top.recovered(self.all_int8)
        share = gain / self.loss if self.loss > 0 else 0.0
        nodes = top.region.nodes
        named = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        return (f"keeping {named} float recovers {gain:+.4f} ({share:.0%} of the loss): exclude "
                f"{'its nodes' if len(nodes) > 1 else 'it'} with --overrides, or let 'edgeq quantize "
                "--max-loss X' choose")

    def to_dict(self) -> dict[str, Any]:
        skipped: dict[str, list[str]] = {}
        for r, why in self.skipped:
            skipped.setdefault(why, []).append(r.name)
        return {"metric": self.metric, "metric_chosen_by": self.metric_why, "calibrator": self.calibrator,
                "samples": self.fp32_samples, "fp32": 1.0, "all_int8": self.all_int8.to_dict(),
                "loss": self.loss, "nothing_to_recover": self.nothing_to_recover, "advice": self.advice(),
                "regions": self.regions, "scored": len(self.scored),
                "ranked": [s.to_dict(self.all_int8) for s in self.scored],
                "skipped": [{"why": why, "regions": names} for why, names in skipped.items()],
                "interrupted": self.interrupted, "seconds": round(self.seconds, 2), "notes": self.notes,
                **({"files": self.files} if self.files else {}),
                **({"engine": self.priced.to_dict(self)} if self.priced is not None else {})}


@dataclass(frozen=True)
class Priced:
    """``sensitivity --engine``: the regions priced on one full INT8 engine's profile."""

    engine: str
    qps: float  # the engine's measured throughput (its run's), else the profile's 1000 / total ms
    measured: bool  # whether ``qps`` was measured
    total_ms: float
    costs: dict[str, FloatCost]  # region name -> what keeping it float costs there
    fp16_ms: float | None  # the whole engine in FP16, modelled
    model: CostModel
    choice: BudgetChoice | None = None  # --max-loss

    def qps_of(self, cost_ms: float) -> float:
        got = self.model.qps(self.qps, cost_ms)
        return got if got is not None else self.qps

    def to_dict(self, result: SensitivityResult) -> dict[str, Any]:
        from edgeq.quant.float_cost import SOURCE

        fp16 = self.qps * self.total_ms / self.fp16_ms if self.fp16_ms else None
        return {"path": self.engine, "qps": self.qps, "qps_measured": self.measured,
                "total_ms": self.total_ms, "fp16_qps_modelled": fp16, "cost_model": SOURCE,
                "regions": {n: {**c.to_dict(), "qps": self.qps_of(c.ms)} for n, c in self.costs.items()},
                "budget": self.choice.to_dict() if self.choice is not None else None}  # fmt: skip


def engine_qps(path: str | Path) -> float | None:
    """A deploy run's measured throughput (``timings.json``), or its ``*.run.log``'s; None without one."""
    import json

    p = Path(path)
    timings = (p if p.is_dir() else p.parent) / "timings.json"
    if p.is_dir() and timings.is_file():
        qps = json.loads(timings.read_text(encoding="utf-8")).get("throughput_qps")
        if isinstance(qps, (int, float)) and qps > 0:
            return float(qps)
    from edgeq.report.compare_engine import engine_from_path

    run = engine_from_path(p).run
    return run.throughput_qps if run is not None and run.throughput_qps else None


def price_on(engine: str | Path, reference: onnx.ModelProto, regions: Sequence[QdqRegion]) -> Priced:
    """``regions`` priced on ``engine``'s profile (its layers mapped onto ``reference``)."""
    from edgeq.quant.float_cost import CostModel
    from edgeq.report.compare_engine import engine_from_path

    e = engine_from_path(engine, onnx_model=reference)
    if e.report is None or not e.report.timed or not e.report.profile_total_ms:
        raise QuantError(f"--engine {engine}: no per-layer profile to price the regions on",
                         "give a deploy run directory (it holds profile.json) or a *.layers.json with its "
                         "*.profile.json beside it")
    model = CostModel(e.report)
    total = e.report.profile_total_ms
    measured = engine_qps(engine)
    return Priced(str(engine), measured or 1000.0 / total, measured is not None, total,
                  {r.name: model.price(r.nodes) for r in regions}, model.fp16_ms(), model)


@dataclass(frozen=True)
class Setup:
    """What every candidate shares: the cleaned model, the base plan and its regions, the ranges, the
    held-out set with its FP32 outputs and metric, and the calibrator's all-INT8 outputs."""

    scorer: Scorer
    regions: list[QdqRegion]  # in the order they are tried (most clipped first)
    choice: Choice
    notes: tuple[str, ...]


def prepare(model: onnx.ModelProto, options: SensitivityOptions, progress: ProgressFn = no_progress
            ) -> Setup:
    """Clean, place, one statistics pass, the FP32 reference run once over the held-out set, the
    calibrator (``--calibrator auto``: the one quantize would choose), as ``calibrate_and_choose`` does;
    the histograms are kept to say how much each region's range clips."""
    from edgeq.graph.io import graph_from_model
    from edgeq.quant.calibrate import collect_histograms
    from edgeq.quant.quantize import calibration_data, choose, plan_for, prepare_model, split_data

    q = replace(options.quantize, cache_all_tensors=True)  # every placement's tensors get a range
    reference, _, _ = prepare_model(model, progress)
    graph = graph_from_model(reference)
    plan, _ = plan_for(graph, q)
    data = calibration_data(reference, q)
    calib, held, notes = split_data(data, q, reference)
    if held is None or not len(held):
        raise QuantError("no held-out samples to score on", "give --holdout DIR, or 2 samples or more")
    hists = collect_histograms(reference, list(plan.activations), calib, q.calibration(), progress)
    choice, held_out, notes = choose(reference, plan, hists, held, q, notes, progress, calib=calib)
    assert held_out is not None  # held is not empty
    return Setup(Scorer(reference, q, choice.amax, held_out, choice.learned),
                 clipped_regions(graph, plan, choice), choice, tuple(notes))


def clipped_regions(graph: gs.Graph, plan: Plan, choice: Choice) -> list[QdqRegion]:
    """The plan's regions, each with how much its calibrated range clips (``QdqRegion.clip``: the largest
    max |x| seen in calibration over the scale's amax), most clipped first, graph order among equals."""
    shared = plan.scale_amax(choice.amax)
    seen = choice.observed

    def clip(region: QdqRegion) -> float:
        ratios = [seen[t] / shared[t] for t in region.tensors if t in seen and shared.get(t, 0) > 0]
        return max(ratios, default=1.0)

    regions = [replace(r, clip=clip(r)) for r in qdq_regions(graph, plan)]
    return sorted(regions, key=lambda r: -r.clip)


# A wrecked model's quick sensitivity pass: the most clipped regions, one held-out run each.
QUICK_REGIONS = 6
QUICK_BLAMED = 3  # named in the failure message


def quick_blame(reference: onnx.ModelProto, choice: Choice, held: HeldOut, options: QuantizeOptions,
                regions: int = QUICK_REGIONS, progress: ProgressFn = no_progress
                ) -> list[tuple[QdqRegion, float]]:
    """(region, what keeping it float recovers on the metric's headline) for the regions whose float
    raises the metric's rank most, of the ``regions`` most clipped (all-but-one each, one held-out run
    each): what a wrecked model's failure names. Empty when none of them recovers anything."""
    assert choice.outputs is not None  # scored on the held-out set
    scorer = Scorer(reference, options, choice.amax, held, choice.learned)
    graph, plan = scorer.plan()
    before = held.score(choice.outputs)
    ranked = rank_regions(scorer, clipped_regions(graph, plan, choice), regions, progress)
    return [(r, s.value - before.value) for r, s in ranked if s.rank > before.rank][:QUICK_BLAMED]


def sensitivity(model: onnx.ModelProto, options: SensitivityOptions, progress: ProgressFn = no_progress
                ) -> SensitivityResult:
    """Score every region (up to the caps) alone and all-but-one; Ctrl-C keeps what finished
    (``interrupted``)."""
    started = time.monotonic()
    prep = prepare(model, options, progress)
    scorer, held = prep.scorer, prep.scorer.held
    assert prep.choice.outputs is not None  # scored on the held-out set
    all_int8 = held.score(prep.choice.outputs)
    notes = [*prep.notes, *([prep.choice.summary()] if prep.choice.auto else [])]
    result = SensitivityResult(held.metric.name, held.why, len(held.outputs), all_int8, [],
                               regions=len(prep.regions), notes=notes, calibrator=prep.choice.method)
    if result.nothing_to_recover:  # no float region could give anything back: stop before scoring any
        result.skipped += [(r, "nothing to recover") for r in prep.regions]
        result.seconds = time.monotonic() - started
        return result
    todo = prep.regions
    if options.max_regions is not None and len(todo) > options.max_regions:
        result.skipped += [(r, f"--max-regions {options.max_regions}") for r in todo[options.max_regions:]]
        todo = todo[:options.max_regions]
    every = {n for r in prep.regions for n in r.nodes}
    loop_started = time.monotonic()
    progress("sensitivity", 0, len(todo))
    for i, region in enumerate(todo):
        took = (time.monotonic() - loop_started) / i if i else 0.0
        if options.budget_s is not None and i and time.monotonic() - started + took > options.budget_s:
            result.skipped += [(r, f"--budget {options.budget_s:g} s") for r in todo[i:]]
            break
        try:
            but_one = scorer.score(region.nodes)
            alone = scorer.score(every - set(region.nodes)) if options.alone else None
        except KeyboardInterrupt:
            result.interrupted = True
            result.skipped += [(r, "interrupted") for r in todo[i:]]
            break
        result.scored.append(RegionScore(region, alone, but_one))
        progress("sensitivity", i + 1, len(todo))
    result.scored.sort(key=lambda s: (-s.recovered_rank(all_int8), s.alone.rank if s.alone else 0.0))
    if options.engine is not None and result.scored:
        result.priced = _priced(options, prep, result, all_int8, progress)
    result.seconds = time.monotonic() - started
    return result


def _priced(options: SensitivityOptions, prep: Setup, result: SensitivityResult, all_int8: TaskScore,
            progress: ProgressFn) -> Priced:
    """``--engine``: the scored regions priced there; ``--max-loss``: the cheapest set chosen among them,
    their all-but-one scores reused (no second run)."""
    assert options.engine is not None
    regions = [s.region for s in result.scored]
    priced = price_on(options.engine, prep.scorer.reference, regions)
    max_loss = options.quantize.max_loss
    if max_loss is None or result.interrupted:
        return priced
    from edgeq.quant.budget import choose_within

    known = {s.region.name: s.all_but_one for s in result.scored}
    choice = choose_within(prep.scorer, regions, max_loss, priced.model.price, all_int8, progress,
                           known=known)
    return replace(priced, choice=choice)


def sensitivity_file(path: str | Path, options: SensitivityOptions, out_dir: str | Path | None = None,
                     progress: ProgressFn = no_progress) -> SensitivityResult:
    """``edgeq sensitivity``: read the model, rank its regions, write ``sensitivity.json`` and
    ``sensitivity.html`` into ``out_dir`` (default ``<model stem>.sensitivity/``), also when interrupted
    (with what finished)."""
    import json

    from edgeq.fs import atomic_write_text, check_writable
    from edgeq.graph.io import load_model
    from edgeq.report.sensitivity_html import render_sensitivity_html

    src = Path(path)
    options.quantize.check_inputs()
    stem = src.name[: -len(".onnx")] if src.name.endswith(".onnx") else src.name
    out = Path(out_dir) if out_dir is not None else src.with_name(f"{stem}.sensitivity")
    if out.exists() and not out.is_dir():
        raise QuantError(f"{out}: exists and is not a directory", "give -o a directory")
    files = {"json": out / "sensitivity.json", "html": out / "sensitivity.html"}
    for p in files.values():
        check_writable(p, inputs=(src, *([options.engine] if options.engine is not None else [])))
    if options.engine is not None:  # a bad --engine before any work
        from edgeq.report.compare_engine import engine_from_path

        if engine_from_path(options.engine).report is None:
            raise QuantError(f"--engine {options.engine}: a failed build, no layers to price",
                             "give a built engine")
    model = load_model(src)
    result = sensitivity(model, options, progress)
    result.files = {k: str(p) for k, p in files.items()}
    out.mkdir(parents=True, exist_ok=True)
    d = {"model": str(src), **result.to_dict()}
    atomic_write_text(files["json"], json.dumps(d, indent=2, default=str) + "\n")
    atomic_write_text(files["html"], render_sensitivity_html(d))
    return result


# --------------------------------------------------------------------------------------------------
# quantize --max-loss
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeptFloat:
    """``--max-loss``: the regions kept float so the metric's loss against FP32 is at most ``max_loss``."""

    max_loss: float
    before: TaskScore  # every region INT8
    after: TaskScore  # with ``regions`` float
    regions: tuple[QdqRegion, ...]
    candidates: int  # regions ranked
    runs: int  # held-out runs it took
    speed: SpeedCost | None = None  # what the float regions' layers take in an earlier engine

    @property
    def reached(self) -> bool:
        return 1.0 - self.after.value <= self.max_loss + 1e-12

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n for r in self.regions for n in r.nodes)

    def summary(self) -> str:
        nodes = self.nodes
        names = ", ".join(nodes[:4]) + (f", ... {len(nodes) - 4} more" if len(nodes) > 4 else "")
        went = (f"{len(self.regions)} region(s) float ({len(nodes)} node(s): {names})" if self.regions
                else "no region float")
        verdict = "reached" if self.reached else "NOT reached"
        return (f"--max-loss {self.max_loss:g} {verdict}: {went}; {self.before.text} -> {self.after.text} "
                f"(loss {1 - self.before.value:.4f} -> {1 - self.after.value:.4f})")

    def speed_line(self) -> str:
        if not self.regions:
            return "speed cost: none (no region float)"
        if self.speed is None:
            return "speed cost: unmeasured (give an earlier deploy's run with --engine)"
        return self.speed.line()

    def to_dict(self) -> dict[str, Any]:
        return {"max_loss": self.max_loss, "reached": self.reached, "before": self.before.to_dict(),
                "after": self.after.to_dict(), "regions": [r.to_dict() for r in self.regions],
                "nodes": list(self.nodes), "candidates": self.candidates, "runs": self.runs,
                "speed": self.speed.to_dict() if self.speed is not None else None}


@dataclass(frozen=True)
class SpeedCost:
    """The float regions' nodes in an engine built earlier (a deploy's layer JSON and profile): the time
    of the layers that hold them there, out of the whole engine's. Their float time is not known until
    an engine is built with them float; this is the time at stake."""

    engine: str
    layers: int  # engine layers holding a float region's node
    nodes_found: int  # of the regions' nodes, those the engine's layers name
    nodes: int
    ms: float | None  # summed profiled time of those layers; None without a profile
    total_ms: float | None

    def line(self) -> str:
        if self.ms is None or not self.total_ms:
            return (f"speed cost: unmeasured ({self.engine} has no profile); {self.layers} of its layers "
                    f"hold {self.nodes_found} of the {self.nodes} float nodes")
        return (f"speed cost: the {self.layers} layers holding {self.nodes_found} of the {self.nodes} float "
                f"nodes took {self.ms:.3f} ms of {self.total_ms:.3f} ms ({self.ms / self.total_ms:.1%}) in "
                f"{self.engine}, in the precision that engine ran them")

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "layers": self.layers, "nodes_found": self.nodes_found,
                "nodes": self.nodes, "ms": self.ms, "total_ms": self.total_ms}


def speed_cost(engine: str | Path | None, reference: onnx.ModelProto | None, nodes: Sequence[str]
               ) -> SpeedCost | None:
    """``nodes``' layers in ``engine`` (a deploy run directory or a ``*.layers.json``), or None without
    one. The layers are matched by the ONNX nodes they fuse (``reference``: the cleaned model)."""
    if engine is None:
        return None
    from edgeq.report.compare_engine import engine_from_path

    e = engine_from_path(engine, onnx_model=reference)
    if e.report is None:
        raise QuantError(f"--engine {engine}: a failed build, no layers to price", "give a built engine")
    wanted = set(nodes)
    hit = [rl for rl in e.report.layers if wanted & set(rl.onnx_nodes)]
    found = wanted & {n for rl in hit for n in rl.onnx_nodes}
    from edgeq.report.compare_engine import summed_ms

    ms, total = summed_ms(hit, e.report.timed), e.report.profile_total_ms
    return SpeedCost(str(engine), len(hit), len(found), len(wanted), ms, total)


def rank_regions(scorer: Scorer, regions: Sequence[QdqRegion], max_regions: int | None = MAX_REGIONS,
                 progress: ProgressFn = no_progress) -> list[tuple[QdqRegion, TaskScore]]:
    """(region, the score with every other region INT8) for the first ``max_regions``, best first: the
    region whose float recovers most leads."""
    todo = list(regions)[:max_regions] if max_regions is not None else list(regions)
    ranked = []
    progress("ranking regions", 0, len(todo))
    for i, r in enumerate(todo):
        ranked.append((r, scorer.score(r.nodes)))
        progress("ranking regions", i + 1, len(todo))
    return sorted(ranked, key=lambda x: -x[1].rank)  # the rank: dense forms included (metrics.TaskScore)


def float_until(scorer: Scorer, regions: Sequence[QdqRegion], max_loss: float,
                max_regions: int | None = MAX_REGIONS, progress: ProgressFn = no_progress,
                before: TaskScore | None = None) -> KeptFloat:
    """Exclude the worst regions until ``1 - score <= max_loss``: rank them (all-but-one each), then add
    them in that order, each re-checked with those already float and kept unless it lowers the score
    (one that recovered nothing alone is still tried and a tie is kept: two branches judged by the worse
    of them each recover nothing alone), stopping at the target; then drop, last added first, any kept
    region the target no longer needs (re-checked again), so no region stays float for nothing. At most
    three held-out runs per region."""
    if not 0.0 <= max_loss < 1.0:
        raise QuantError(f"--max-loss must be in [0, 1), got {max_loss}")
    runs0 = scorer.runs
    before = before if before is not None else scorer.score()

    def ok(s: TaskScore) -> bool:
        return 1.0 - s.value <= max_loss + 1e-12

    if ok(before):
        return KeptFloat(max_loss, before, before, (), 0, scorer.runs - runs0)
    ranked = rank_regions(scorer, regions, max_regions, progress)
    kept: list[QdqRegion] = []
    best = before
    progress("--max-loss", 0, len(ranked))
    for i, (region, alone) in enumerate(ranked):
        if ok(best):
            break
        progress("--max-loss", i + 1, len(ranked))
        got = alone if not kept else scorer.score([n for r in (*kept, region) for n in r.nodes])
        if got.rank >= best.rank:
            kept.append(region)
            best = got
    if ok(best):
        for region in list(reversed(kept[:-1])):  # the last one was needed to get there
            rest = [r for r in kept if r is not region]
            got = scorer.score([n for r in rest for n in r.nodes])
            if ok(got):
                kept, best = rest, got
    progress("--max-loss", len(ranked), len(ranked))
    return KeptFloat(max_loss, before, best, tuple(kept), len(ranked), scorer.runs - runs0)


def apply_max_loss(reference: onnx.ModelProto, choice: Choice, held: HeldOut | None, options: QuantizeOptions,
                   progress: ProgressFn = no_progress) -> tuple[Plan, Choice, KeptFloat]:
    """``quantize --max-loss``: (the plan with the regions kept float excluded, the calibrator's choice
    with that plan's model and held-out outputs, what was kept float), from the calibration ``choice``
    made and the held-out set its accuracy check uses."""
    if options.max_loss is None:
        raise QuantError("apply_max_loss without --max-loss")  # a caller's bug
    if held is None or choice.outputs is None:
        raise QuantError("--max-loss needs held-out samples to score on",
                         hint="give --holdout DIR, or at least 2 samples and a --holdout fraction above 0")
    scorer = Scorer(reference, options, choice.amax, held, choice.learned)
    graph, plan = scorer.plan()
    # Every region is ranked (one held-out run each): quantize keeps no histograms to say which clip.
    kept = float_until(scorer, qdq_regions(graph, plan), options.max_loss, None, progress,
                       before=held.score(choice.outputs))
    if not kept.regions:
        return plan, choice, kept
    plan, model, outputs = scorer.run(kept.nodes)
    return plan, replace(choice, model=model, outputs=outputs), kept


def overrides_text(base: Overrides | None, choice: KeptFloat, command: str = "edgeq quantize") -> str:
    """The override file that replays ``choice`` (``--overrides``; ``deploy`` and ``tune`` read it the
    same way): the user's own patterns, then the regions ``--max-loss`` kept float."""
    import yaml

    base = base or Overrides()
    exclude = list(dict.fromkeys((*base.exclude, *(exact_pattern(n) for n in choice.nodes))))
    head = (f"# {command} --max-loss {choice.max_loss:g}: {len(choice.regions)} region(s) kept float\n"
            f"# {choice.before.text} -> {choice.after.text}\n"
            "# replay with --overrides THIS_FILE (quantize, deploy, tune)\n")
    body: dict[str, Any] = {"version": 1, "exclude": exclude}
    if base.force:
        body["force"] = list(base.force)
    return head + yaml.safe_dump(body, sort_keys=False, allow_unicode=True)
