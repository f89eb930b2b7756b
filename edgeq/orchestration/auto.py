"""``--placement auto`` (the default where a target is given): the target decides the placement, once
per (model, calibration, TensorRT version, GPU), and the placement cache remembers it.

A rule written from one GPU's engines is a guess about another GPU; the target answers it by timing. So
the first time a key (``edgeq.orchestration.placement_cache``) is seen: probe the target, build the
implicit engine there and mirror it (``edgeq.orchestration.implicit``, the ``--placement implicit``
steps), build the explicit engine, time both in alternation and keep the explicit one when the relative
gate passes at ``--min-ratio`` 0.98 (no node wider than implicit except the float-entry regions Q/DQ cannot
express on 8.6, each named by the gate). Otherwise the implicit engine is kept, and the output says why:

- the explicit engine failed the relative gate (slower, or wider): implicit is the faster engine measured
  on this target, already built, and its calibration cache is in the entry;
- the explicit build failed (e.g. a TensorRT internal error): the deploy does not fail, it says so with the
  build log's first error line (``explicit_build_failure``).

When the implicit build itself fails there is nothing to mirror or time against: the rules' Q/DQ model
(``--placement trt``) is deployed instead, the output says so in one line naming the failure, and nothing
is cached (the next deploy decides again).

Either way the decision is written to the placement cache, by ``record_decision``, the one writer (deploy,
fleet, compare and tune's start from the mirror on a miss: ``decision_from`` makes the entry from what was
judged, ``Judged``). The next deploy with the same key builds only
the engine that was kept (the explicit one from the cached placement and scales, no calibration, no
implicit build) and says "placement from cache". A target whose TensorRT version or GPU is unknown is
decided every time (nothing cached). A Q/DQ model, or a float model without calibration data, is deployed
as given: there is no placement to decide.
"""

from __future__ import annotations

import datetime as _dt
import json
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from edgeq.errors import EdgeqError
from edgeq.findings import ProgressFn, no_progress
from edgeq.orchestration.deploy import (
    DeployOptions,
    DeployResult,
    check_target,
    deploy,
    deploy_policy,
    with_shapes,
)
from edgeq.orchestration.implicit import (
    ROUNDS,
    ImplicitBuildFailed,
    ImplicitDeploy,
    ImplicitFloat,
    explicit_deploy_options,
    implicit_then_mirror,
    judge_explicit,
)
from edgeq.orchestration.placement_cache import Decision, Lookup, PlacementCache, PlacementKey
from edgeq.orchestration.variants import Calibrated, TargetEngines, VariantOptions
from edgeq.pipeline.rundir import new_run_dir, no_event
from edgeq.pipeline.shapes import Shapes
from edgeq.remote.runner import EventFn
from edgeq.remote.targets import Target

if TYPE_CHECKING:
    from edgeq.pipeline.stages import Prepared, Probe
    from edgeq.quant.mirror import MirrorReport
    from edgeq.quant.plan import Plan
    from edgeq.quant.quantize import QuantizeOptions
    from edgeq.report.compare_gate import RelativeGate
    from edgeq.report.policy import Policy

AUTO_MIN_RATIO = 0.98  # the explicit engine is kept at >= 0.98x implicit (paired medians)
RULES = "rules"  # what is kept when the implicit build fails: the rules' Q/DQ model (never cached)
WHAT = "--placement auto"


@dataclass(frozen=True)
class AutoOptions:
    cache_dir: Optional[Path] = None  # the placement cache; None: the user cache (placement_cache)
    rounds: int = ROUNDS  # paired rounds of implicit and explicit when deciding
    min_ratio: float = AUTO_MIN_RATIO


@dataclass
class AutoDeploy:
    """One ``--placement auto`` deploy: the run of the engine kept, what decided it and at what cost."""

    run_dir: Path  # holds the placement's files, ``placement.json`` and the deploy run(s)
    result: DeployResult  # the kept engine's deploy run (its stages, report and gate)
    decision: Decision
    from_cache: bool
    lookup: Optional[Lookup] = None  # None: nothing cached for this target (see ``uncached``)
    uncached: str = ""  # why the cache was not used
    key: Optional[PlacementKey] = None
    decided: Optional[ImplicitDeploy] = None  # this run decided with an explicit engine built
    implicit_run: Optional[DeployResult] = None  # this run built the implicit engine
    files: dict[str, str] = field(default_factory=dict)
    cache_warning: Optional[str] = None  # the decision could not be written to the cache
    calibrated: Optional[Calibrated] = None  # this run's calibration (a miss): compare's rows reuse it
    implicit_error: Optional[EdgeqError] = None  # this run's implicit build failed: compare's baseline row

    @property
    def kept(self) -> str:
        return self.decision.kept

    @property
    def relative(self) -> Optional[RelativeGate]:
        """The relative gate of the kept explicit engine decided in this run (a kept implicit engine is
        the baseline itself; a cached one was judged when it was decided)."""
        return self.decided.relative if self.decided is not None and self.kept == "explicit" else None

    @property
    def gate_passed(self) -> bool:
        return self.result.gate_passed

    def notes(self) -> list[str]:
        ev = self.decision.evidence
        warned = [self.lookup.warning if self.lookup is not None else None, self.cache_warning]
        said = [f"warning: {w}" for w in warned if w]
        ratio = f", explicit {ev['ratio']}x implicit" if ev.get("ratio") is not None else ""
        secs = ev.get("implicit_build_seconds")
        if self.kept == RULES:
            said.append(f"kept the rules' placement (--placement trt): {self.decision.reason}")
        elif self.from_cache:
            saved = f", saving its {secs} s build" if secs is not None else ""
            built = "the implicit engine built as kept" if self.kept == "implicit" else \
                f"no implicit engine built{saved}"
            said.append(f"placement from cache (decided {ev.get('created', '?')} on {ev.get('target', '?')}: "
                        f"kept {self.kept}{ratio}); {built}")
        else:
            said.append(f"placement decided on {ev.get('target')}: implicit engine built in {secs} s{ratio}; "
                        f"kept {self.kept}")
        if self.kept != RULES:
            said.append(f"kept {self.kept}: {self.decision.reason}")
        if self.lookup is not None:
            hit = "hit" if self.from_cache else "miss"
            entry = self.files.get("cache_entry")
            where = f"written to {entry}" if entry else "not written"
            where = str(self.lookup.path) if self.from_cache else where
            said.append(f"placement cache {hit} ({self.key.describe() if self.key else ''}): {where}")
        else:
            said.append(f"placement cache not used: {self.uncached}")
        if self.decided is not None:
            said += [n for n in self.decided.notes() if not n.startswith("implicit engine:")]
        if "summary" in self.files:
            said.append(f"decision and evidence: {self.files['summary']}")
        return said

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"run_dir": str(self.run_dir), "kept": self.kept, "reason": self.decision.reason,
                "from_cache": self.from_cache, "key": asdict(self.key) if self.key else None,
                "cache": {"path": str(self.lookup.path) if self.lookup else None,
                          "hit": self.from_cache, "warning": self.lookup.warning if self.lookup else None,
                          "write_warning": self.cache_warning,
                          "not_used": self.uncached or None},
                "implicit_build_seconds": None if self.from_cache else
                self.decision.evidence.get("implicit_build_seconds"),
                "evidence": self.decision.evidence, "kept_run": str(self.result.run_dir),
                "implicit": self.decided.to_dict() if self.decided is not None else None,
                "files": self.files, "notes": self.notes()}  # fmt: skip


def auto_applies(model: Path, quantize: QuantizeOptions) -> bool:
    """A float model with calibration data: there is a placement to decide (else deploy as given)."""
    from edgeq.graph.io import load_model
    from edgeq.pipeline.stages import has_qdq

    return quantize.has_data and Path(model).is_file() and not has_qdq(load_model(model))


def explicit_build_failure(run_dir: Optional[Path], error: EdgeqError) -> str:
    """Why the explicit build failed, in one line: the build log's first TensorRT error, else the deploy's
    error. The one place to name the Q/DQ region involved once the build log's parser can."""
    from edgeq.report.runlog import build_error_from_log

    log = run_dir / "deploy.log" if run_dir is not None else None
    line = build_error_from_log(log) if log is not None and log.is_file() else None
    return line or error.message


def deploy_auto(
    model: Path,
    target: Target,
    options: DeployOptions = DeployOptions(),
    auto: AutoOptions = AutoOptions(),
    *,
    progress: ProgressFn = no_progress,
    on_event: EventFn = no_event,
) -> AutoDeploy:
    """``edgeq deploy`` with ``--placement auto``: see the module doc. Bad input is refused before any
    directory exists; a target failure raises (exit 1); a failed explicit build is a fallback, not one."""
    from edgeq.orchestration.variants import check_float_model

    q = options.quantize
    deploy_policy(options, target)  # a bad --gate before any work
    q.check_inputs()
    checks = VariantOptions(quantize=q, accept_new_host_key=options.accept_new_host_key)
    check_float_model(model, target, checks, WHAT)
    options = with_shapes(model, options)  # every build below: the one optimization profile
    key, lookup, uncached = cached_placement(model, target, q, auto, cache_dir=options.cache_dir,
                                             accept_new_host_key=options.accept_new_host_key,
                                             progress=progress, shapes=options.profile.shapes)  # fmt: skip
    cache = PlacementCache(auto.cache_dir)
    if key is not None and lookup is not None and lookup.decision is not None:
        return _from_cache(model, target, options, key, lookup, progress=progress, on_event=on_event)
    return _decide(model, target, options, auto, cache, key, lookup, uncached, progress=progress,
                   on_event=on_event)  # fmt: skip


def cached_placement(model: Path, target: Target, quantize: QuantizeOptions, auto: AutoOptions, *,
                     accept_new_host_key: bool = False, cache_dir: Optional[Path] = None,
                     progress: ProgressFn = no_progress, shapes: Optional[Shapes] = None,
                     ) -> tuple[Optional[PlacementKey], Optional[Lookup], str]:  # fmt: skip
    """The target probed (the key's TensorRT version and GPU) and its placement cache read: (key, lookup,
    why uncached). The one lookup of deploy and tune's start under auto; ``shapes``: a dynamic model's
    resolved optimization profile, part of the key."""
    from edgeq.orchestration.placement_cache import key_for
    from edgeq.pipeline.stages import probe_from_facts

    facts = check_target(target, accept_new_host_key=accept_new_host_key, cache_dir=cache_dir,
                         progress=progress)  # fmt: skip
    profile = "|".join((shapes.min, shapes.opt, shapes.max)) if shapes else ""  # not where they came from
    key, uncached = key_for(Path(model), quantize, probe_from_facts(facts, target), profile)
    return key, (PlacementCache(auto.cache_dir).get(key) if key is not None else None), uncached


def _decide(model: Path, target: Target, options: DeployOptions, auto: AutoOptions, cache: PlacementCache,
            key: Optional[PlacementKey], lookup: Optional[Lookup], uncached: str, *,
            progress: ProgressFn, on_event: EventFn) -> AutoDeploy:  # fmt: skip
    """A miss: implicit, its mirror, the explicit engine and the relative gate; the decision cached."""
    from edgeq.fs import atomic_write_text

    failed: list[str] = []

    def watch(line: str) -> None:
        stage, _, rest = line.partition(": ")
        if rest.startswith("failed"):
            failed.append(stage)
        on_event(line)

    try:
        m = implicit_then_mirror(model, target, options, what=WHAT, progress=progress, on_event=watch)
    except EdgeqError as e:
        if not failed or failed[-1] != "build":  # the target, the data or the model: not a build to replace
            raise
        return _rules_fallback(model, target, options, e, key, lookup, uncached, progress=progress,
                               on_event=on_event)  # fmt: skip
    failed.clear()
    before = set(m.run_dir.iterdir())
    decided: Optional[ImplicitDeploy] = None
    build_error: Optional[str] = None
    try:
        explicit = deploy(m.model, target, m.explicit_options(options), progress=progress, on_event=watch)
    except EdgeqError as e:
        if not failed or failed[-1] != "build":
            raise
        runs = sorted(p for p in set(m.run_dir.iterdir()) - before if p.is_dir())
        build_error = explicit_build_failure(runs[0] if runs else None, e)
    else:
        decided = judge_explicit(target, m, explicit, options, rounds=auto.rounds, min_ratio=auto.min_ratio,
                                 progress=progress)  # fmt: skip
    judged = Judged(target.name, m.plan, m.cal.amax, Path(m.pair.calib_cache or "").read_text(), m.floats,
                    m.report, m.implicit.run_dir, m.implicit.stage("build").seconds,
                    m.implicit.timings.get("throughput_qps"), auto.min_ratio,
                    decided.relative if decided is not None else None,
                    decided.explicit.run_dir if decided is not None else None, build_error)  # fmt: skip
    decision = decision_from(judged)
    result = decided.explicit if decision.kept == "explicit" and decided is not None else m.implicit
    out = AutoDeploy(m.run_dir, result, decision, False, lookup, uncached, key, decided, m.implicit,
                     calibrated=m.cal)  # fmt: skip
    out.files.update(_kept_files(decision.kept, m.model, m.pair.model, m.pair.calib_cache))
    if key is not None:
        entry, out.cache_warning = record_decision(cache, key, decision)
        if entry is not None:
            out.files["cache_entry"] = entry
    out.files["summary"] = str(m.run_dir / "placement.json")
    atomic_write_text(m.run_dir / "placement.json", json.dumps(out.to_dict(), indent=2, default=str) + "\n")
    return out


@dataclass(frozen=True)
class Judged:
    """What a decision is made of, wherever the implicit engine was built, mirrored and the explicit one
    judged against it (deploy's miss, tune's start from the mirror): one ``decision_from`` for both, so a
    later deploy or tune of the key reads the same entry whoever wrote it."""

    target: str
    plan: Plan  # the mirror's placement, as the explicit engine was built from it
    amax: dict[str, float]  # the calibration's ranges (before scale sharing)
    calibration_cache: str  # the implicit engine's calibration cache (its text)
    floats: ImplicitFloat  # implicit's float nodes, the float-entry nodes, its interior reformats
    mirror: MirrorReport
    implicit_run: Path
    implicit_build_seconds: Optional[float]
    implicit_qps: Optional[float]
    min_ratio: float
    relative: Optional[RelativeGate] = None  # None: no explicit engine was timed (its build failed)
    explicit_run: Optional[Path] = None
    build_error: Optional[str] = None  # the explicit build's first error line


def decision_from(j: Judged) -> Decision:
    """What is kept and why (the explicit engine when the relative gate passed, else implicit), with the
    placement, its scales and the evidence: the one way a decision is made into a cache entry."""
    from edgeq.orchestration.placement_cache import plan_to_dict

    if j.relative is not None and j.relative:
        kept, reason = "explicit", j.relative.summary()
    elif j.relative is not None:
        failures = "; ".join(f"[{r}] {msg}" for r, msg in j.relative.failures[:3])
        more = len(j.relative.failures) - 3
        failures += f"; {more} more" if more > 0 else ""
        r = j.relative.ratio.throughput
        speed = f" ({r:.3f}x implicit's throughput)" if r is not None else ""
        kept = "implicit"
        reason = f"the mirror's explicit engine{speed} failed the relative gate against implicit: {failures}"
    else:
        kept = "implicit"
        reason = f"the explicit build failed on {j.target}: {j.build_error} (the implicit engine is shipped)"
    ratio = j.relative.ratio.throughput if j.relative is not None else None
    build_s = round(j.implicit_build_seconds, 2) if j.implicit_build_seconds is not None else None
    explicit = str(j.explicit_run) if j.explicit_run is not None else None
    evidence = {
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "target": j.target,
        "implicit_build_seconds": build_s, "implicit_qps": j.implicit_qps,
        "ratio": round(ratio, 4) if ratio is not None else None, "min_ratio": j.min_ratio,
        "relative_gate": j.relative.to_dict() if j.relative is not None else None,
        "explicit_build_error": j.build_error, "mirror": j.mirror.to_dict(),
        "runs": {"implicit": str(j.implicit_run), "explicit": explicit},
        "layers": {"implicit": str(j.implicit_run / "layers.json"),
                   "explicit": str(j.explicit_run / "layers.json") if j.explicit_run is not None else None},
    }  # fmt: skip
    return Decision(kept, reason, plan_to_dict(j.plan), j.plan.scale_amax(j.amax), j.calibration_cache,
                    j.floats.nodes, j.floats.by_design, j.floats.reformats, evidence)  # fmt: skip


def record_decision(cache: PlacementCache, key: PlacementKey, decision: Decision
                    ) -> tuple[Optional[str], Optional[str]]:  # fmt: skip
    """The one writer of the placement cache (deploy, fleet, compare and tune): (the entry's path, None),
    or (None, a warning) when it cannot be written: that costs the next deploy a decision, no more."""
    try:
        return str(cache.put(key, decision)), None
    except OSError as e:
        return None, f"placement cache: cannot write {cache.path(key)} ({e.strerror or e}); not cached"


def _rules_fallback(model: Path, target: Target, options: DeployOptions, error: EdgeqError,
                    key: Optional[PlacementKey], lookup: Optional[Lookup], uncached: str, *,
                    progress: ProgressFn, on_event: EventFn) -> AutoDeploy:  # fmt: skip
    """The implicit build itself failed: there is no engine to mirror or to time against, so the rules'
    Q/DQ model (``--placement trt``) is deployed instead of failing. Nothing is cached: the failure may be
    the target's (memory, a timeout), and the next deploy tries to decide again."""
    from edgeq.fs import atomic_write_text

    why = error.message.removeprefix(f"{WHAT}: the implicit engine: ")
    rules = replace(options, quantize=replace(options.quantize, placement="trt"))
    result = deploy(model, target, rules, progress=progress, on_event=on_event)
    reason = f"the implicit build failed on {target.name}: {why} (the rules' Q/DQ model is shipped)"
    evidence = {"created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "target": target.name, "implicit_build_seconds": None, "implicit_build_error": why,
                "ratio": None, "runs": {"rules": str(result.run_dir)}}  # fmt: skip
    decision = Decision(RULES, reason, {}, {}, "", evidence=evidence)
    out = AutoDeploy(result.run_dir, result, decision, False, lookup, uncached, key, implicit_error=error,
                     calibrated=error.calibrated if isinstance(error, ImplicitBuildFailed) else None)
    quantized = result.stage("quantize").data.get("output")
    out.files["model"] = str(result.run_dir / quantized) if quantized else str(model)
    summary = result.run_dir / "placement.json"
    out.files["summary"] = str(summary)
    atomic_write_text(summary, json.dumps(out.to_dict(), indent=2, default=str) + "\n")
    return out


def _kept_files(kept: str, qdq: Path, fp32: Path, calib_cache: Optional[Path]) -> dict[str, str]:
    """The model every board of the kind is given: the Q/DQ model, or the FP32 model and its cache."""
    if kept == "explicit":
        return {"model": str(qdq), "reference": str(fp32)}  # the accuracy stage's FP32, as implicit's
    return {"model": str(fp32), "calib_cache": str(calib_cache)}


def _from_cache(model: Path, target: Target, options: DeployOptions, key: PlacementKey, lookup: Lookup, *,
                progress: ProgressFn, on_event: EventFn) -> AutoDeploy:  # fmt: skip
    """A hit: the kept engine's model rebuilt from the entry (no calibration), then one deploy."""
    from edgeq.fs import atomic_write_text
    from edgeq.graph.io import load_model, save_model
    from edgeq.orchestration.variants import Calibrated, placed_variant
    from edgeq.quant.quantize import prepare_model

    decision = lookup.decision
    assert decision is not None
    reference, _, _ = prepare_model(load_model(model))
    stem = Path(model).name.removesuffix(".onnx")
    run_dir = new_run_dir(Path(options.runs_dir), Path(model), target.name)
    settings = options.profile if options.profile.fp16 is not None else replace(options.profile, fp16=True)
    placed = replace(options.quantize, calib=None, synthetic=None)  # the entry's scales: nothing to calibrate
    common = replace(options, runs_dir=run_dir, profile=settings, quantize=placed)
    qdq = calib_cache = run_dir
    fp32 = Path(save_model(reference, run_dir / f"{stem}.implicit.fp32.onnx"))  # also the mirror's FP32
    if decision.kept == "explicit":
        plan = decision.to_plan()
        qdq = placed_variant(Calibrated(reference, plan, decision.amax, stem), plan, "mirror", run_dir).model
        floats = ImplicitFloat(decision.allowlisted, decision.implicit_reformats, decision.float_entry_nodes)
        result = deploy(qdq, target, explicit_deploy_options(common, options.gate_allow, floats, fp32),
                        progress=progress, on_event=on_event)  # fmt: skip
    else:
        calib_cache = run_dir / f"{stem}.implicit.cache"
        atomic_write_text(calib_cache, decision.calibration_cache)
        result = deploy(fp32, target, replace(common, gate="none", calib_cache=calib_cache),
                        progress=progress, on_event=on_event)  # fmt: skip
    out = AutoDeploy(run_dir, result, decision, True, lookup, "", key)
    if decision.kept == "explicit":
        out.files.update(model=str(qdq), reference=str(fp32))
    else:
        out.files.update(model=str(fp32), calib_cache=str(calib_cache))
    out.files["summary"] = str(run_dir / "placement.json")
    atomic_write_text(run_dir / "placement.json", json.dumps(out.to_dict(), indent=2, default=str) + "\n")
    return out


# --------------------------------------------------------------------------------------------------
# compare --target: the decided engine beside implicit and the rules
# --------------------------------------------------------------------------------------------------


def engines_auto(model: Path, target: Target, options: VariantOptions, auto: AutoOptions = AutoOptions(), *,
                 progress: ProgressFn = no_progress) -> TargetEngines:  # fmt: skip
    """``compare --target`` under ``--placement auto`` (its default with ``--calib``): the placement is
    decided (or read from the placement cache) by ``deploy_auto``, and its engine is ``explicit``, the
    gated one, beside the implicit baseline, the rules' placement (``explicit-trt``) and ``explicit-all``
    from one calibration (``--fp16``, ``--qdq-model`` as without it). The implicit engine the decision
    built is the baseline; a cache hit builds it (the baseline is never skipped). A decision that kept
    implicit has no explicit engine to show unless this run built and judged one."""
    from edgeq.graph.io import graph_from_model
    from edgeq.graph.rules import lint_model
    from edgeq.orchestration.variants import (
        Variant,
        calibrate_once,
        check_float_model,
        compare_dir,
        deploy_one,
        implicit_variant,
        placed_variant,
        side_variants,
        variant_engine,
        with_variant_shapes,
    )
    from edgeq.pipeline.stages import ProfileSettings
    from edgeq.quant.placement import plan_placement

    float_model = check_float_model(model, target, options, "compare --target")
    options = with_variant_shapes(model, options)
    run_dir = compare_dir(Path(model), target, options)
    runs = run_dir / "runs"
    decide = DeployOptions(quantize=options.quantize, accept_new_host_key=options.accept_new_host_key,
                           gate="none", runs_dir=run_dir / "placement",
                           profile=ProfileSettings(fp16=True, shapes=options.shapes))  # fmt: skip
    placed = deploy_auto(model, target, decide, auto, progress=progress)
    # one calibration for every row: the decision's when this run decided (its implicit engine is the
    # baseline), else one of the same data (less --holdout, as the decision's) for the baseline and rules
    cal = placed.calibrated or calibrate_once(Path(model), options.quantize, holdout=True)[0]
    implicit = implicit_variant(cal, run_dir, options.quantize)
    # the decision's implicit engine (built, or failed: not built a second time), else one built here
    baseline = placed.implicit_run or placed.implicit_error or deploy_one(implicit, target, options, runs,
                                                                           progress)
    engines = [variant_engine(implicit, baseline)]
    gated: list[str] = []
    shown: Optional[DeployResult] = placed.result
    shipped = placed.files["model"]
    if placed.kept == "implicit":  # the explicit engine judged and lost in this run, or none built
        shown = placed.decided.explicit if placed.decided is not None else None
        shipped = placed.decided.files.get("mirror_model", "") if placed.decided is not None else ""
    if shown is not None:
        engines.append(variant_engine(Variant("explicit", Path(shipped)), shown))
        gated.append("explicit")
    every = plan_placement(graph_from_model(cal.reference), "all")
    variants = [placed_variant(cal, p, name, run_dir) for p, name in ((cal.plan, "explicit-trt"),
                                                                       (every, "explicit-all"))]  # fmt: skip
    side, user = side_variants(options, implicit.model)
    variants += side
    gated += user
    engines += [variant_engine(v, deploy_one(v, target, options, runs, progress)) for v in variants]
    return TargetEngines(run_dir, tuple(engines), tuple(lint_model(float_model)), tuple(gated), placed)


# --------------------------------------------------------------------------------------------------
# fleet validate: one decision per board kind
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KindPlacement:
    """What every board of one kind is given under auto: the kept model, prepared once, and the gate
    the decision implies (implicit's own float nodes allowlisted; a kept implicit engine: no INT8 gate)."""

    kind: str
    decided_on: str  # the board that decided (or read the cache)
    decided: AutoDeploy
    prepared: Prepared

    def policy(self, target: Target, gate: Optional[str], allow: tuple[str, ...],
               require_fusion: Optional[bool]) -> Policy:  # fmt: skip
        from edgeq.orchestration.deploy import policy_for, with_intended

        d = self.decided.decision
        if "budget" in d.evidence:  # --max-loss: exactly the kept nodes (and their edge Q/DQ), said as such
            from edgeq.orchestration.budget import cached_allowances

            return with_intended(policy_for(target, gate, allow, require_fusion), cached_allowances(d))
        if d.kept == "implicit":
            return policy_for(target, "none", allow, require_fusion)
        policy = policy_for(target, gate, (*allow, *d.allowlisted, *d.float_entry_nodes), require_fusion)
        if d.implicit_reformats:
            policy = policy.replace(forbid_interior_reformats=False)
        return policy

    def cell(self) -> str:
        """The fleet matrix's words for it: what was kept, where it was decided, from the cache or not."""
        ev = self.decided.decision.evidence
        if "budget" in ev:
            b = ev["budget"]
            how = "from cache" if self.decided.from_cache else f"decided on {self.decided_on}"
            return f"--max-loss {b['max_loss']:g}: {len(b['chosen']['regions'])} region(s) float ({how})"
        ratio = f" {ev['ratio']}x" if ev.get("ratio") is not None else ""
        how = "from cache" if self.decided.from_cache else \
            f"decided on {self.decided_on}, implicit build {ev.get('implicit_build_seconds')} s"
        if self.decided.kept == RULES:
            how = f"the implicit build failed on {self.decided_on}"
        return f"{self.decided.kept}{ratio} ({how})"

    def to_dict(self, base: Path) -> dict[str, Any]:
        import os

        d = self.decided.to_dict()
        return {"kind": self.kind, "decided_on": self.decided_on, "kept": d["kept"], "reason": d["reason"],
                "from_cache": d["from_cache"], "key": d["key"], "cache": d["cache"],
                "implicit_build_seconds": d["implicit_build_seconds"], "evidence": d["evidence"],
                "run_dir": os.path.relpath(self.decided.run_dir, base),
                "model_file": os.path.relpath(self.prepared.model_file, base),
                "cache_file": os.path.relpath(self.prepared.implicit_cache, base)
                if self.prepared.implicit_cache else None}  # fmt: skip


class KindPlacements:
    """``fleet validate`` under auto: the first board of each kind (compute capability + TensorRT) decides,
    through the placement cache; the other boards of the kind wait for it and get the same model. A kind
    whose decision failed fails its other boards with that error rather than trying again on each."""

    def __init__(self, model: Path, options: DeployOptions, auto: AutoOptions, out_dir: Path,
                 progress: ProgressFn = no_progress) -> None:  # fmt: skip
        self.model, self.options, self.auto, self.out_dir = Path(model), options, auto, Path(out_dir)
        self.progress = progress
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self.kinds: dict[str, KindPlacement] = {}
        self._failed: dict[str, EdgeqError] = {}

    def for_board(self, target: Target, found: Probe) -> KindPlacement:
        from edgeq.graph.io import load_model
        from edgeq.pipeline.rundir import slug
        from edgeq.pipeline.stages import prepare_host

        kind = found.kind or f"target-{slug(target.name)}"  # unknown GPU or TensorRT: decided alone
        with self._guard:
            lock = self._locks.setdefault(kind, threading.Lock())
        with lock:
            if kind in self.kinds:
                return self.kinds[kind]
            if kind in self._failed:
                e = self._failed[kind]
                raise EdgeqError(f"placement of kind {kind}: {e.message}", e.hint, exit_code=e.exit_code)
            where = self.out_dir / slug(kind)
            try:
                options = replace(self.options, runs_dir=where)
                if self.options.quantize.max_loss is not None:  # the kind's budget, on its first board
                    from edgeq.orchestration.budget import deploy_budget

                    decided: AutoDeploy = deploy_budget(self.model, target, options, self.auto,
                                                        progress=self.progress)  # fmt: skip
                else:
                    decided = deploy_auto(self.model, target, options, self.auto, progress=self.progress)
                files = decided.files
                cache = Path(files["calib_cache"]) if "calib_cache" in files else None
                placed = replace(self.options.quantize, calib=None, synthetic=None)  # quantized already
                prepared = prepare_host(Path(files["model"]), where / "host", placed, calib_cache=cache)
                if "reference" in files:  # the mirror: scored against the float model, as implicit is
                    prepared = replace(prepared, reference=load_model(files["reference"]))
            except EdgeqError as e:
                self._failed[kind] = e
                raise
            self.kinds[kind] = KindPlacement(kind, target.name, decided, prepared)
            return self.kinds[kind]
