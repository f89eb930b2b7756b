"""``deploy --max-loss X`` (and ``fleet validate``, pipelines): the task metric kept within X of FP32 at the
least speed on the target, decided there once per (model, data, X, TensorRT version, GPU).

A miss (the placement cache has no entry for the key, ``edgeq.orchestration.placement_cache``):

1. host: clean, the rules' placement, one calibration pass, the FP32 reference run once on the held-out
   set, every region INT8 scored (``edgeq.quant.sensitivity.prepare``, as ``edgeq sensitivity``);
2. target: that full INT8 Q/DQ model built and profiled: its per-layer profile, mapped onto the ONNX
   nodes, prices each region (``edgeq.quant.float_cost``);
3. host: the regions weighed and the cheapest set that meets X chosen (``edgeq.quant.budget``);
4. target: the chosen set's engine built, gated by the int8 policy with exactly its float nodes allowed
   (with the Q/DQ reformats at their edges, TensorRT's copies into and out of them); FP16 built from the
   FP32 model as a reference (and implicit INT8 with ``--baseline implicit``);
5. target: the engines timed in alternation (``edgeq.orchestration.retime``): the chosen one beside full
   INT8 and FP16 in the same rounds, so their ratios are figures a decision can rest on;
6. ``budget.json`` and ``budget.html`` (the three rows, accuracy against qps), the chosen run's
   ``report.html`` with the same section, and the decision in the placement cache.

A hit rebuilds the chosen Q/DQ model from the entry (its placement and scales: no calibration, no held-out
runs, no reference builds), builds only its engine, and prints the deciding run's rows beside this
run's qps, saying so.

Every sub-deploy is an ordinary deploy run directory under the budget's own.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from edgeq.errors import QuantError
from edgeq.findings import ProgressFn, no_progress
from edgeq.orchestration.auto import AutoDeploy, AutoOptions, cached_placement, record_decision
from edgeq.orchestration.deploy import (
    DeployOptions,
    DeployResult,
    deploy,
    deploy_policy,
    holdout_inputs,
    with_shapes,
)
from edgeq.orchestration.placement_cache import Decision, Lookup, PlacementCache, PlacementKey
from edgeq.pipeline.rundir import model_stem, new_run_dir, no_event
from edgeq.remote.runner import EventFn
from edgeq.remote.targets import Target

if TYPE_CHECKING:
    from edgeq.quant.budget import BudgetChoice
    from edgeq.quant.float_cost import CostModel
    from edgeq.quant.sensitivity import Setup

WHAT = "--max-loss"
BUDGET_JSON = "budget.json"
BUDGET_HTML = "budget.html"


def intended_why(max_loss: float) -> str:
    """How the precision gate credits the nodes the budget kept float."""
    return f"--max-loss {max_loss:g} (kept float on purpose)"


@dataclass
class BudgetDeploy(AutoDeploy):
    """One ``deploy --max-loss`` run: the chosen engine's deploy (``result``), the decision as the placement
    cache keeps it, and ``budget``: what ``budget.json`` holds (rows, points, regions weighed)."""

    budget: dict[str, Any] = field(default_factory=dict)

    @property
    def reached(self) -> bool:
        return bool(self.budget.get("reached"))

    def notes(self) -> list[str]:
        warned = (self.lookup.warning if self.lookup else None, self.cache_warning)
        said = [f"warning: {w}" for w in warned if w]
        ev = self.decision.evidence
        if self.from_cache:
            said.append(f"budget from cache (decided {ev.get('created', '?')} on {ev.get('target', '?')}): "
                        "only the chosen engine built; the full INT8 and FP16 rows are that run's")
        if self.lookup is not None:
            hit = "hit" if self.from_cache else "miss"
            entry = str(self.lookup.path) if self.from_cache else self.files.get("cache_entry", "not written")
            said.append(f"placement cache {hit} ({self.key.describe() if self.key else ''}): {entry}")
        else:
            said.append(f"placement cache not used: {self.uncached}")
        said += list(self.budget.get("notes", ()))
        for name, what in (("summary", "the rows, every set scored and every region weighed"),
                           ("html", "accuracy against qps")):
            if name in self.files:
                said.append(f"{what}: {self.files[name]}")
        return said

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"run_dir": str(self.run_dir), "kept": self.kept, "reason": self.decision.reason,
                "from_cache": self.from_cache, "key": asdict(self.key) if self.key else None,
                "cache": {"path": str(self.lookup.path) if self.lookup else None, "hit": self.from_cache,
                          "warning": self.lookup.warning if self.lookup else None,
                          "write_warning": self.cache_warning, "not_used": self.uncached or None},
                "implicit_build_seconds": None, "evidence": {k: v for k, v in self.decision.evidence.items()
                                                             if k != "budget"},
                "kept_run": str(self.result.run_dir), "files": self.files, "budget": self.budget,
                "notes": self.notes()}  # fmt: skip


def check_budget(model: Path, target: Target, options: DeployOptions) -> DeployOptions:
    """Usage errors before any work: the gate, the option files, a float model with --calib, the held-out
    set the sub-deploys' accuracy stage runs on; ``options`` with the model's shapes resolved."""
    from edgeq.orchestration.variants import VariantOptions, check_float_model

    q = options.quantize
    if q.max_loss is None:
        raise QuantError("deploy_budget without --max-loss")  # a caller's bug
    deploy_policy(options, target)
    q.check_inputs()
    checks = VariantOptions(quantize=q, accept_new_host_key=options.accept_new_host_key)
    check_float_model(model, target, checks, WHAT)
    options = with_shapes(model, options)
    holdout_inputs(model, q, options.accuracy_gate, options.profile.shapes)
    return options


def deploy_budget(
    model: Path,
    target: Target,
    options: DeployOptions,
    auto: AutoOptions = AutoOptions(),
    *,
    implicit: bool = False,
    progress: ProgressFn = no_progress,
    on_event: EventFn = no_event,
) -> BudgetDeploy:
    """``edgeq deploy --max-loss X``: see the module doc. ``implicit``: also build the implicit INT8 engine
    of the same calibration and time it in the same rounds (``--baseline implicit``)."""
    options = check_budget(Path(model), target, options)
    key, lookup, uncached = cached_placement(model, target, options.quantize, auto,
                                             cache_dir=options.cache_dir, progress=progress,
                                             accept_new_host_key=options.accept_new_host_key,
                                             shapes=options.profile.shapes)  # fmt: skip
    if key is not None and lookup is not None and lookup.decision is not None \
            and "budget" in lookup.decision.evidence:
        return _from_cache(Path(model), target, options, key, lookup, progress=progress, on_event=on_event)
    return _decide(Path(model), target, options, auto, key, lookup, uncached, implicit=implicit,
                   progress=progress, on_event=on_event)  # fmt: skip


# --------------------------------------------------------------------------------------------------
# The sub-deploys
# --------------------------------------------------------------------------------------------------


def _reference_options(common: DeployOptions, fp32: Optional[Path], float_model: bool = False
                       ) -> DeployOptions:  # fmt: skip
    """A reference engine's deploy (FP16, implicit; full INT8 keeps the user's gate: it is the chosen
    engine when no region goes float): no accuracy bound; a float model is not quantized again (its
    calibration data dropped)."""
    q = replace(common.quantize, max_loss=None, min_metric=None, min_cosine=None)
    if float_model:
        q = replace(q, calib=None, synthetic=None, overrides=None, placement="trt")
    return replace(common, quantize=q, gate="none" if float_model else common.gate, accuracy_gate=False,
                   intended=(), reference=fp32)  # fmt: skip


def _chosen_options(common: DeployOptions, fp32: Path, allow: tuple[tuple[str, str], ...]) -> DeployOptions:
    """The chosen engine's deploy: the user's gate with exactly the kept nodes (and their edges) allowed."""
    return replace(common, quantize=replace(common.quantize, max_loss=None), reference=fp32, intended=allow)


def allowances(qdq: Any, excluded: tuple[str, ...], chosen: tuple[str, ...], max_loss: float
               ) -> tuple[tuple[str, str], ...]:  # fmt: skip
    """(pattern, reason) for every node the Q/DQ model leaves float on purpose: the budget's choice, credited
    to ``--max-loss``, and the rest of the plan's excluded nodes (the user's override file)."""
    from edgeq.quant.overrides import INTENDED_FLOAT

    theirs = tuple(n for n in excluded if n not in set(chosen))
    return (*((p, intended_why(max_loss)) for p in (edge_allow(qdq, chosen) if chosen else ())),
            *((p, INTENDED_FLOAT) for p in (edge_allow(qdq, theirs) if theirs else ())))


def edge_allow(qdq: Any, nodes: tuple[str, ...]) -> tuple[str, ...]:
    """The gate's allowlist for ``nodes`` kept float in the Q/DQ model ``qdq``: the nodes themselves, and the
    Q/DQ nodes at their edges (a DequantizeLinear feeding one, a QuantizeLinear of one's output), whose
    reformat layers TensorRT names after them (with ``_clone_N`` for a copy per reader): exact patterns."""
    from edgeq.quant.sensitivity import exact_pattern

    kept = set(nodes)
    producer = {o: n.name for n in qdq.graph.node for o in n.output}
    readers: dict[str, set[str]] = {}
    for c in qdq.graph.node:
        for i in c.input:
            readers.setdefault(i, set()).add(c.name)
    edges: list[str] = []
    for n in qdq.graph.node:
        into = n.op_type == "DequantizeLinear" and any(kept & readers.get(o, set()) for o in n.output)
        out_of = n.op_type == "QuantizeLinear" and producer.get(n.input[0]) in kept
        if into or out_of:
            edges.append(n.name)
    return (*(exact_pattern(n) for n in nodes), *(exact_pattern(e) + "*" for e in dict.fromkeys(edges)))


def _settings(common: DeployOptions) -> Any:
    from edgeq.pipeline.stages import ProfileSettings

    return ProfileSettings(fp16=common.profile.fp16, shapes=common.profile.shapes)


def _target_score(run: DeployResult) -> Optional[Any]:
    """TensorRT's own figure on the held-out set, when the run measured it (``--holdout DIR``)."""
    acc = run.finished.accuracy if run.finished is not None else None
    return acc.engine if acc is not None else None


# --------------------------------------------------------------------------------------------------
# A miss: decide on the target
# --------------------------------------------------------------------------------------------------


def _decide(model: Path, target: Target, options: DeployOptions, auto: AutoOptions,
            key: Optional[PlacementKey], lookup: Optional[Lookup], uncached: str, *, implicit: bool,
            progress: ProgressFn, on_event: EventFn) -> BudgetDeploy:  # fmt: skip
    from edgeq.graph.io import load_model, save_model
    from edgeq.quant.budget import choose_within
    from edgeq.quant.quantize import build_qdq
    from edgeq.quant.sensitivity import SensitivityOptions, prepare

    q = options.quantize
    assert q.max_loss is not None
    ranking = SensitivityOptions(replace(q, max_loss=None), max_regions=None, alone=False)  # X: below
    setup = prepare(load_model(model), ranking, progress)
    scorer = setup.scorer
    assert setup.choice.outputs is not None and setup.choice.model is not None  # scored on the held-out set
    before = scorer.held.score(setup.choice.outputs)
    stem = model_stem(model)
    run_dir = new_run_dir(Path(options.runs_dir), model, target.name)
    settings = options.profile if options.profile.fp16 is not None else replace(options.profile, fp16=True)
    common = replace(options, runs_dir=run_dir, profile=settings)
    fp32 = Path(save_model(scorer.reference, run_dir / f"{stem}.fp32.onnx"))
    int8 = Path(save_model(setup.choice.model, run_dir / f"{stem}.int8.onnx"))

    _, base = scorer.plan()
    full_allow = allowances(setup.choice.model, base.excluded, (), q.max_loss)  # the user's own, if any
    full_options = replace(_reference_options(common, fp32), intended=full_allow)
    full = deploy(int8, target, full_options, progress=progress, on_event=on_event)
    costs = _cost_model(full, scorer.reference)
    choice = choose_within(scorer, setup.regions, q.max_loss, costs.price, before, progress)
    _, plan = scorer.plan(choice.nodes)
    allow = full_allow
    chosen = full
    chosen_file = int8
    if choice.regions:
        qdq = build_qdq(scorer.reference, plan, scorer.amax, scorer.rounding)
        chosen_file = Path(save_model(qdq, run_dir / f"{stem}.budget.onnx"))
        allow = allowances(qdq, plan.excluded, choice.nodes, q.max_loss)
        chosen = deploy(chosen_file, target, _chosen_options(common, fp32, allow), progress=progress,
                        on_event=on_event)  # fmt: skip
    fp16 = deploy(fp32, target, _reference_options(common, None, float_model=True), progress=progress,
                  on_event=on_event)  # fmt: skip
    runs = [("chosen", chosen), ("full INT8", full), ("FP16", fp16)]
    if implicit:
        runs.append(("implicit INT8", _implicit(setup, target, common, stem, progress=progress,
                                                on_event=on_event)))
    paired = _retime(target, runs, common, auto, progress)
    budget = {**_budget_dict(model, target, setup, choice, costs, runs, paired, before),
              "allow": [list(a) for a in allow]}
    created = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    evidence = {"created": created, "target": target.name, "implicit_build_seconds": None,
                "ratio": budget.get("measured_ratio"), "budget": budget}
    decision = Decision("explicit", choice.summary(), _plan_dict(plan), plan.scale_amax(scorer.amax), "",
                        allowlisted=tuple(p for p, _ in allow), evidence=evidence)
    out = BudgetDeploy(run_dir, chosen, decision, False, lookup, uncached, key, budget=budget)
    out.files.update(model=str(chosen_file), reference=str(fp32))
    if key is not None:
        entry, out.cache_warning = record_decision(PlacementCache(auto.cache_dir), key, decision)
        if entry is not None:
            out.files["cache_entry"] = entry
    _write(out)
    return out


def _plan_dict(plan: Any) -> dict[str, Any]:
    from edgeq.orchestration.placement_cache import plan_to_dict

    return plan_to_dict(plan)


def _cost_model(full: DeployResult, reference: Any) -> CostModel:
    """The full INT8 engine's report, mapped onto the cleaned model, as the regions' price list."""
    from edgeq.quant.float_cost import CostModel
    from edgeq.report.compare_engine import engine_from_path

    report = engine_from_path(full.run_dir, onnx_model=reference).report
    if report is None or not report.timed:
        raise QuantError(f"{WHAT}: the full INT8 engine on the target has no per-layer profile to price the "
                         f"regions ({full.run_dir})", "see its profile stage in stages.json", exit_code=1)
    return CostModel(report)


def _implicit(setup: Setup, target: Target, common: DeployOptions, stem: str, *, progress: ProgressFn,
              on_event: EventFn) -> DeployResult:  # fmt: skip
    """The implicit INT8 engine of the same calibration (the cleaned FP32 model and its cache)."""
    from edgeq.orchestration.variants import Calibrated, implicit_variant

    _, plan = setup.scorer.plan()
    cal = Calibrated(setup.scorer.reference, plan, setup.scorer.amax, stem)
    pair = implicit_variant(cal, Path(common.runs_dir), common.quantize)
    opts = replace(_reference_options(common, None, float_model=True), calib_cache=pair.calib_cache)
    return deploy(pair.model, target, opts, progress=progress, on_event=on_event)


def _retime(target: Target, runs: list[tuple[str, DeployResult]], common: DeployOptions, auto: AutoOptions,
            progress: ProgressFn) -> Optional[Any]:  # fmt: skip
    """The engines built timed in alternation (the chosen one only once when it is full INT8 itself);
    None with ``rounds`` 0 (each run's own timing stands)."""
    from edgeq.orchestration.retime import retime

    if not auto.rounds:
        return None
    engines = _timed_names(runs)
    return retime(target, [(name, path) for path, name in engines.items()], rounds=auto.rounds,
                  settings=_settings(common), accept_new_host_key=common.accept_new_host_key,
                  cache_dir=common.cache_dir, progress=progress)  # fmt: skip


def _timed_names(runs: list[tuple[str, DeployResult]]) -> dict[Path, str]:
    """Each engine file under the name it is timed as: the chosen engine is full INT8's own when no region
    went float, timed once, as full INT8."""
    engines: dict[Path, str] = {}
    for name, run in runs:
        engines[run.run_dir / "engine.plan"] = name  # a later name wins: full INT8 over chosen
    return engines


def _budget_dict(model: Path, target: Target, setup: Setup, choice: BudgetChoice, costs: CostModel,
                 runs: list[tuple[str, DeployResult]], paired: Optional[Any], before: Any) -> dict[str, Any]:
    """What ``budget.json`` holds and the reports draw: the rows (accuracy and qps of each engine), every
    set scored as a point (its qps modelled from the full INT8 engine's), the regions weighed."""
    from edgeq.quant.float_cost import SOURCE

    held = setup.scorer.held
    timed_as = _timed_names(runs)
    qps: dict[str, Optional[float]] = {}
    ratio: dict[str, Optional[float]] = {}
    full = dict(runs)["full INT8"]
    for name, run in runs:
        if paired is not None:
            i = paired.names.index(timed_as[run.run_dir / "engine.plan"])
            qps[name] = paired.median(i)
            ratio[name] = paired.ratio(i, paired.names.index("full INT8"))
        else:
            qps[name] = run.timings.get("throughput_qps")
            base = full.timings.get("throughput_qps")
            ratio[name] = qps[name] / base if qps[name] and base else None
    host = {"chosen": choice.after, "full INT8": before}
    what = {"chosen": (f"{len(choice.regions)} region(s), {len(choice.nodes)} node(s) float"
                       if choice.regions else "no region float: full INT8 itself"),
            "full INT8": "every region INT8 (the rules' placement)", "FP16": "the FP32 model, --fp16",
            "implicit INT8": "the FP32 model and the calibration cache, --int8 --fp16"}
    rows = []
    for name, run in runs:
        got = _target_score(run)
        h = host.get(name)
        rows.append({"name": name, "what": what[name], "host": h.text if h is not None else None,
                     "host_score": h.value if h is not None else None,
                     "target": got.text if got is not None else None,
                     "target_score": got.value if got is not None else None, "qps": qps[name],
                     "ratio": ratio[name], "run_dir": str(run.run_dir)})  # fmt: skip
    q_full = qps["full INT8"]
    points = []
    for p in choice.points:
        points.append({**p.to_dict(), "cost_us": round(p.cost.ms * 1000, 3),
                       "qps": costs.qps(q_full, p.cost.ms) if q_full else None})
    modelled = costs.qps(1.0, choice.cost.ms) if choice.regions else 1.0
    measured = ratio["chosen"]
    note = (f"cost model: {SOURCE}; modelled {modelled:.3f}x full INT8's qps for the chosen set, measured "
            f"{measured:.3f}x" if modelled is not None and measured is not None else f"cost model: {SOURCE}")
    timed = (f"median of {len(paired.qps[0])} alternating rounds (trtexec --noDataTransfers); x full INT8: "
             "the median of the per-round ratios" if paired is not None else "each engine's own timing")
    return {"model": str(model), "target": target.name, "metric": held.metric.name, "metric_why": held.why,
            "held_out": held.source, "samples": len(held.outputs), "max_loss": choice.max_loss,
            "reached": choice.reached, "summary": choice.summary(), "before": before.to_dict(),
            "after": choice.after.to_dict(),
            "chosen": {"regions": [r.to_dict() for r in choice.regions], "nodes": list(choice.nodes),
                       "cost": choice.cost.to_dict()},
            "rows": rows, "points": points, "candidates": [c.to_dict(before) for c in choice.candidates],
            "runs": choice.runs, "modelled_ratio": modelled, "measured_ratio": measured, "model_note": note,
            "timed": timed, "paired": paired.to_dict() if paired is not None else None,
            "notes": [*setup.notes, *choice.notes, *_unpriced(choice)], "from_cache": False}  # fmt: skip


def _unpriced(choice: BudgetChoice) -> list[str]:
    """Regions whose nodes no engine layer names (TensorRT folded them away, or renamed them): priced 0."""
    missing = [c.region.name for c in choice.candidates if not c.cost.nodes_found]
    if not missing:
        return []
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return [f"{len(missing)} region(s) priced at 0: no layer of the full INT8 engine names their nodes "
            f"({shown})"]


def _write(out: BudgetDeploy) -> None:
    """``budget.json``, ``budget.html`` and the chosen run's report page with the same section."""
    from edgeq.fs import atomic_write_text
    from edgeq.report.tradeoff_html import budget_section, render_budget_html

    summary, page = out.run_dir / BUDGET_JSON, out.run_dir / BUDGET_HTML
    out.files.update(summary=str(summary), html=str(page))
    atomic_write_text(summary, json.dumps(out.to_dict(), indent=2, default=str) + "\n")
    atomic_write_text(page, render_budget_html(out.budget))
    finished = out.result.finished
    if finished is not None:
        from edgeq.pipeline.accuracy import accuracy_html
        from edgeq.report.render import render_html
        from edgeq.report.tradeoff_html import TRADEOFF_CSS

        sections = [*([accuracy_html(finished.accuracy)] if finished.accuracy is not None else []),
                    f"<style>{TRADEOFF_CSS}</style>{budget_section(out.budget)}"]
        atomic_write_text(finished.report_html, render_html(finished.report, finished.gate, sections))


# --------------------------------------------------------------------------------------------------
# A hit: the chosen engine only
# --------------------------------------------------------------------------------------------------


def cached_allowances(decision: Decision) -> tuple[tuple[str, str], ...]:
    """The (pattern, reason) pairs a budget's decision allows, as it recorded them."""
    return tuple((str(p), str(why)) for p, why in decision.evidence["budget"].get("allow", ()))


def _from_cache(model: Path, target: Target, options: DeployOptions, key: PlacementKey, lookup: Lookup, *,
                progress: ProgressFn, on_event: EventFn) -> BudgetDeploy:  # fmt: skip
    """The chosen Q/DQ model rebuilt from the entry (no calibration, no held-out runs) and deployed alone;
    the rows are the deciding run's, the chosen engine's qps this run's own timing beside them."""
    from edgeq.graph.io import load_model, save_model
    from edgeq.orchestration.variants import Calibrated, placed_variant
    from edgeq.quant.quantize import prepare_model

    decision = lookup.decision
    assert decision is not None and options.quantize.max_loss is not None
    reference, _, _ = prepare_model(load_model(model))
    stem = model_stem(model)
    run_dir = new_run_dir(Path(options.runs_dir), model, target.name)
    settings = options.profile if options.profile.fp16 is not None else replace(options.profile, fp16=True)
    common = replace(options, runs_dir=run_dir, profile=settings)
    fp32 = Path(save_model(reference, run_dir / f"{stem}.fp32.onnx"))
    plan = decision.to_plan()
    qdq = placed_variant(Calibrated(reference, plan, decision.amax, stem), plan, "budget", run_dir).model
    opts = _chosen_options(common, fp32, cached_allowances(decision))
    chosen = deploy(qdq, target, opts, progress=progress, on_event=on_event)
    budget = dict(decision.evidence["budget"])
    rows = [dict(r) for r in budget.get("rows", ())]
    for r in rows:
        if r["name"] == "chosen":
            got = _target_score(chosen)
            r.update(decided_qps=r.get("qps"), qps=chosen.timings.get("throughput_qps"),
                     run_dir=str(chosen.run_dir), target=got.text if got is not None else r.get("target"),
                     target_score=got.value if got is not None else r.get("target_score"))
    created = decision.evidence.get("created", "?")
    budget.update(rows=rows, from_cache=True,
                  timed=f"from the deciding run ({created}); the chosen engine's qps is this run's own "
                        "timing")
    out = BudgetDeploy(run_dir, chosen, decision, True, lookup, "", key, budget=budget)
    out.files.update(model=str(qdq), reference=str(fp32))
    _write(out)
    return out
