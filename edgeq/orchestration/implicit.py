"""``--placement implicit`` on a target: TensorRT's implicit engine built there, mirrored, and the explicit
engine judged against it (``deploy``, ``compare --target``; ``tune`` starts its search from the mirror).

Static rules lose to the first architecture they have no rule for (SE gates, channel shuffles);
TensorRT's implicit mode has already chosen, by timing on this target, which tensors to carry in INT8.
So: calibrate once; build the implicit engine from the cleaned FP32 model and the calibration cache of
the same ranges; read its layer JSON back onto that model (``edgeq.quant.mirror``: a Q/DQ on each edge the
engine read INT8, scaled from the same ranges, no second calibration); build that Q/DQ model; time the
two in alternation (``edgeq.orchestration.retime``) and gate the explicit one relative to implicit.

The precision gate and the mirror: layers the implicit engine itself ran in FP16/FP32 are reproduced on
purpose, so their ONNX nodes (exactly those, by name) are allowlisted in the int8 gate, and the output says
which; so are the nodes of the regions the mirror leaves float on purpose (``Plan.float_nodes``:
float-entry), which the relative gate excuses as well; any other float layer still fails it. Any other
node the explicit engine runs wider than implicit did fails the relative gate (``wider-than-baseline``)
even where the allowlist excused its layer. Likewise interior precision-changing reformats: when
implicit has some itself (a float region needs them), the relative gate judges their count against
implicit's, and the precision gate leaves them to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from edgeq.errors import EdgeqError, QuantError
from edgeq.findings import ProgressFn, no_progress
from edgeq.graph.trt86.regions import QUANTIZING_REFORMAT
from edgeq.orchestration.deploy import DeployOptions, DeployResult, deploy, deploy_policy, with_shapes
from edgeq.orchestration.variants import (
    Calibrated,
    TargetEngines,
    Variant,
    VariantOptions,
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
from edgeq.pipeline.rundir import new_run_dir, no_event
from edgeq.remote.runner import EventFn
from edgeq.remote.targets import Target

if TYPE_CHECKING:
    from edgeq.quant.accuracy import AccuracyReport
    from edgeq.quant.mirror import MirrorReport
    from edgeq.quant.plan import Plan
    from edgeq.report.compare_engine import Engine
    from edgeq.report.compare_gate import RelativeGate

ROUNDS = 3  # paired rounds of implicit and explicit before the relative gate (tune's default too)
NEEDS_CALIB = "give the float model and --calib: the implicit engine and its mirror come from one calibration"


@dataclass(frozen=True)
class ImplicitFloat:
    """What the implicit engine kept wider than INT8, as the precision gate takes it."""

    nodes: tuple[str, ...]  # ONNX nodes of its FP16/FP32 compute layers: the allowlist
    reformats: int  # its interior precision/layout-changing reformats
    by_design: tuple[str, ...] = ()  # nodes the mirror leaves float on purpose (float-entry): allowlisted

    def notes(self) -> list[str]:
        more = len(self.nodes) - 4
        shown = ", ".join(self.nodes[:4]) + (f", ... {more} more" if more > 0 else "")
        said = [f"precision gate: {len(self.nodes)} ONNX nodes the implicit engine ran in FP16/FP32 "
                "allowlisted (the mirror keeps them float on purpose)" + (f": {shown}" if self.nodes else "")]
        if self.by_design:
            said.append(f"precision gate: {len(self.by_design)} ONNX nodes of float-entry regions "
                        f"allowlisted (implicit entered them {QUANTIZING_REFORMAT}); the relative gate "
                        "excuses them too")
        if self.reformats:
            said.append(f"interior reformats: judged by the relative gate against implicit's own "
                        f"{self.reformats}, not by the precision gate")
        return said


def implicit_float(engine: Engine) -> ImplicitFloat:
    """``engine`` (the implicit one, its report mapped onto the ONNX model)'s float nodes and reformats."""
    report = engine.report
    by = report.onnx.by_precision() if report is not None and report.onnx is not None else {}
    nodes = tuple(sorted(set(by.get("FP16", [])) | set(by.get("FP32", []))))
    return ImplicitFloat(nodes, engine.stats.reformats if engine.built else 0)


def mirror_plan(cal: Calibrated, layers_json: Path) -> tuple[Plan, MirrorReport]:
    """The implicit engine's INT8 edges on the calibrated model (``edgeq quantize --from-engine``'s plan)."""
    from edgeq.graph.io import graph_from_model
    from edgeq.quant.mirror import load_engine, plan_from_engine

    return plan_from_engine(graph_from_model(cal.reference), load_engine(layers_json))


def _run_engine(run_dir: Path, reference: Any, name: str, qps: Optional[float], latency: Optional[float]
                ) -> Engine:  # fmt: skip
    from edgeq.report.compare_engine import engine_from_path
    from edgeq.report.runlog import RunFigures

    e = engine_from_path(run_dir, onnx_model=reference, name=name)
    return replace(e, run=RunFigures(str(run_dir / "timings.json"), qps, latency, None))


# --------------------------------------------------------------------------------------------------
# deploy --placement implicit
# --------------------------------------------------------------------------------------------------


@dataclass
class ImplicitDeploy:
    run_dir: Path  # holds the calibration's files, the mirror and both deploy runs
    implicit: DeployResult
    explicit: DeployResult
    mirror: MirrorReport
    floats: ImplicitFloat
    relative: RelativeGate
    accuracy: Optional[AccuracyReport] = None
    paired: Optional[dict[str, Any]] = None  # implicit and explicit timed in alternation
    files: dict[str, str] = field(default_factory=dict)

    @property
    def gate_passed(self) -> bool:
        return self.explicit.gate_passed and bool(self.relative)

    def notes(self) -> list[str]:
        qps = self.implicit.timings.get("throughput_qps")
        said = [f"implicit engine: {self.implicit.run_dir} ({qps} qps)",
                f"mirror: {self.mirror.summary_line()}", *self.floats.notes()]
        if self.paired is not None:
            said.append(f"paired: explicit {self.paired['ratio']}x implicit in {self.paired['rounds']} "
                        "alternating rounds")
        if self.accuracy is not None:
            said.append(f"accuracy: {self.accuracy}")
        return said

    def to_dict(self) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir), "implicit_run": str(self.implicit.run_dir),
                "explicit_run": str(self.explicit.run_dir), "mirror": self.mirror.to_dict(),
                "allowlisted": list(self.floats.nodes), "float_entry_nodes": list(self.floats.by_design),
                "implicit_reformats": self.floats.reformats,
                "paired": self.paired, "relative_gate": self.relative.to_dict(),
                "accuracy": self.accuracy.to_dict() if self.accuracy is not None else None,
                "files": self.files, "notes": self.notes()}  # fmt: skip


@dataclass
class Mirrored:
    """Steps 1-2 of ``--placement implicit`` done: the implicit engine built on the target and its mirror
    written; what the explicit build and the relative gate then need (``deploy --placement auto`` too)."""

    run_dir: Path
    cal: Calibrated
    pair: Variant  # the implicit pair: the cleaned FP32 model and its calibration cache
    implicit: DeployResult
    plan: Plan
    report: MirrorReport
    model: Path  # the mirror's Q/DQ model
    floats: ImplicitFloat  # by_design: the regions the mirror leaves float on purpose
    accuracy: Optional[AccuracyReport]
    common: DeployOptions  # the options both builds share (the run directory, FP16 allowed)

    def explicit_options(self, options: DeployOptions) -> DeployOptions:
        """The explicit build's: implicit's own float nodes and the float-entry regions allowlisted, and
        interior reformats left to the relative gate when implicit has some."""
        return explicit_deploy_options(self.common, options.gate_allow, self.floats, self.pair.model)


# How the gate credits the nodes implicit ran float (the explicit engine keeps them float on purpose), as
# a pipeline's gate.allow or --allow are credited to those.
MIRROR_WHY = "the implicit engine (run float there)"


def explicit_deploy_options(common: DeployOptions, allow: tuple[str, ...], floats: ImplicitFloat,
                            reference: Path) -> DeployOptions:  # fmt: skip
    """One place for how an explicit engine judged against implicit is gated (a mirror, or a cached one),
    and scored: against ``reference``, the float model the implicit engine is built from and scored
    against, so the two engines' figures share one FP32 (not the Q/DQ model's weights dequantized)."""
    kept = tuple((n, MIRROR_WHY) for n in dict.fromkeys((*floats.nodes, *floats.by_design)))
    return replace(common, gate_allow=allow, intended=(*common.intended, *kept),
                   gate_reformats=False if floats.reformats else None, reference=reference)  # fmt: skip


class ImplicitBuildFailed(EdgeqError):
    """The implicit engine's deploy failed. ``calibrated``: the calibration it was built from, so a caller
    that ships something else instead (auto's rules fallback, compare's rows) does not calibrate again."""

    def __init__(self, message: str, hint: Optional[str], *, exit_code: int, calibrated: Calibrated) -> None:
        super().__init__(message, hint, exit_code=exit_code)
        self.calibrated = calibrated


def implicit_then_mirror(
    model: Path,
    target: Target,
    options: DeployOptions,
    *,
    what: str = "--placement implicit",
    progress: ProgressFn = no_progress,
    on_event: EventFn = no_event,
) -> Mirrored:
    """Calibrate once, build the implicit engine on ``target`` and mirror it (checked on held-out data)."""
    from edgeq.graph.io import load_model
    from edgeq.quant.accuracy import compare_accuracy

    q = options.quantize
    if q.calib is None:
        raise QuantError(f"{what} needs calibration data (--calib)", NEEDS_CALIB)
    deploy_policy(options, target)  # a bad --gate before any work
    q.check_inputs()
    checks = VariantOptions(quantize=q, accept_new_host_key=options.accept_new_host_key)
    check_float_model(model, target, checks, what)
    options = with_shapes(model, options)  # both engines: one optimization profile
    cal, held = calibrate_once(Path(model), q, holdout=True)  # before any directory: bad data writes nothing
    run_dir = new_run_dir(Path(options.runs_dir), Path(model), target.name)
    settings = options.profile if options.profile.fp16 is not None else replace(options.profile, fp16=True)
    common = replace(options, runs_dir=run_dir, profile=settings)

    # 1. the implicit engine: the FP32 model and the cache of the same ranges, no gate of its own
    pair = implicit_variant(cal, run_dir, q)
    try:
        implicit = deploy(pair.model, target, replace(common, gate="none", calib_cache=pair.calib_cache),
                          progress=progress, on_event=on_event)  # fmt: skip
    except EdgeqError as e:
        raise ImplicitBuildFailed(f"{what}: the implicit engine: {e.message}", e.hint,
                                  exit_code=e.exit_code, calibrated=cal) from None  # fmt: skip
    impl_engine = _run_engine(implicit.run_dir, cal.reference, "implicit",
                              implicit.timings.get("throughput_qps"), None)  # fmt: skip

    # 2. its mirror, from the same ranges; accuracy on the held-out samples
    plan, report = mirror_plan(cal, implicit.run_dir / "layers.json")
    mirrored = placed_variant(cal, plan, "mirror", run_dir)
    accuracy = None
    if held is not None and len(held):
        accuracy = compare_accuracy(cal.reference, load_model(mirrored.model), held, threshold=q.min_cosine,
                                    providers=q.providers, progress=progress)  # fmt: skip
        if not accuracy:
            raise QuantError(f"the mirror's accuracy is below min_cosine {q.min_cosine}: {accuracy}",
                             "see implicit.json; the implicit engine's INT8 choices cost that much here",
                             exit_code=1)  # fmt: skip
    # the regions the mirror leaves float on purpose (float-entry: implicit entered them by a quantizing
    # reformat) are allowlisted beside implicit's own float nodes
    floats = replace(implicit_float(impl_engine), by_design=plan.float_nodes)
    return Mirrored(run_dir, cal, pair, implicit, plan, report, mirrored.model, floats, accuracy, common)


def judge_explicit(
    target: Target,
    m: Mirrored,
    explicit: DeployResult,
    options: DeployOptions,
    *,
    rounds: int = ROUNDS,
    min_ratio: Optional[float] = None,
    progress: ProgressFn = no_progress,
) -> ImplicitDeploy:
    """Step 4: implicit and the explicit engine timed in alternation, the relative gate on the paired
    medians (``min_ratio``: the gate's default, else this), and ``implicit.json`` written."""
    from edgeq.fs import atomic_write_text
    from edgeq.orchestration.retime import retime
    from edgeq.pipeline.stages import ProfileSettings
    from edgeq.report.compare_gate import DEFAULT_MIN_RATIO

    implicit, cal = m.implicit, m.cal
    paired: Optional[dict[str, Any]] = None
    qps: list[Optional[float]] = [run.timings.get("throughput_qps") for run in (implicit, explicit)]
    if rounds and explicit.finished is not None:
        engines = [(name, run.run_dir / "engine.plan") for name, run in (("implicit", implicit),
                                                                          ("explicit", explicit))]
        timed = retime(target, engines, rounds=rounds, settings=ProfileSettings(fp16=m.common.profile.fp16,
                                                                       shapes=m.common.profile.shapes),
                       accept_new_host_key=options.accept_new_host_key, cache_dir=options.cache_dir,
                       progress=progress)  # fmt: skip
        paired, qps = timed.to_dict(), [timed.median(0), timed.median(1)]
    relative = relative_to_implicit(cal.reference, implicit.run_dir, explicit.run_dir, (qps[0], qps[1]),
                                    DEFAULT_MIN_RATIO if min_ratio is None else min_ratio,
                                    m.floats.by_design, paired)  # fmt: skip
    result = ImplicitDeploy(m.run_dir, implicit, explicit, m.report, m.floats, relative, m.accuracy, paired)
    summary = m.run_dir / "implicit.json"
    result.files = {"mirror_model": str(m.model), "fp32_model": str(m.pair.model),
                    "cache": str(m.pair.calib_cache), "summary": str(summary)}  # fmt: skip
    atomic_write_text(summary, json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    return result


def relative_to_implicit(reference: Any, implicit_run: Path, explicit_run: Path,
                         qps: tuple[Optional[float], Optional[float]], min_ratio: float,
                         by_design: tuple[str, ...] = (), paired: Optional[dict[str, Any]] = None
                         ) -> RelativeGate:  # fmt: skip
    """The relative gate of an explicit engine against the implicit one, each read from its run directory
    and mapped onto ``reference``: deploy's judgement and tune's of its start from the mirror. ``paired``
    (the two timed in alternation, ``Paired.to_dict()``): judged by its median round ratio
    (``judged_by_rounds``); without it, by ``qps``."""
    from edgeq.orchestration.retime import judged_by_rounds
    from edgeq.report.compare import diff_pair
    from edgeq.report.compare_gate import relative_gate

    base = _run_engine(implicit_run, reference, "implicit", qps[0], None)
    cand = _run_engine(explicit_run, reference, "explicit", qps[1], None)
    diff = judged_by_rounds(diff_pair(base, cand), paired)
    return relative_gate(diff, min_ratio, by_design=by_design)


def deploy_implicit(
    model: Path,
    target: Target,
    options: DeployOptions = DeployOptions(),
    *,
    rounds: int = ROUNDS,
    progress: ProgressFn = no_progress,
    on_event: EventFn = no_event,
) -> ImplicitDeploy:
    """``edgeq deploy --placement implicit``: see the module doc. Everything under one directory,
    ``runs/<model>-<target>-<time>/``: the implicit pair, ``<stem>.mirror.onnx``, ``implicit.json`` and the
    two deploy runs. Bad input is refused before it exists; a target failure raises (exit 1)."""
    m = implicit_then_mirror(model, target, options, progress=progress, on_event=on_event)
    # 3. the explicit engine, gated with implicit's own float nodes and the float-entry regions allowlisted
    explicit = deploy(m.model, target, m.explicit_options(options), progress=progress, on_event=on_event)
    return judge_explicit(target, m, explicit, options, rounds=rounds, progress=progress)


# --------------------------------------------------------------------------------------------------
# compare --target --placement implicit
# --------------------------------------------------------------------------------------------------


def engines_with_mirror(
    model: Path, target: Target, options: VariantOptions, *, progress: ProgressFn = no_progress
) -> TargetEngines:
    """``compare --target --placement implicit``: implicit first, then its mirror as ``explicit`` (the
    gated one), the rules' placement (``explicit-trt``) and ``explicit-all`` beside it, all from one
    calibration; ``--fp16`` and ``--qdq-model`` as without it."""
    from edgeq.graph.io import graph_from_model
    from edgeq.graph.rules import lint_model
    from edgeq.quant.placement import plan_placement

    float_model = check_float_model(model, target, options, "compare --target --placement implicit")
    options = with_variant_shapes(model, options)
    cal, _ = calibrate_once(Path(model), options.quantize)
    run_dir = compare_dir(Path(model), target, options)
    runs = run_dir / "runs"
    implicit = implicit_variant(cal, run_dir, options.quantize)
    built = deploy_one(implicit, target, options, runs, progress)
    if isinstance(built, EdgeqError):
        raise EdgeqError(f"compare --placement implicit: the implicit engine did not build on {target.name}: "
                         f"{built}", "there is no engine to mirror", exit_code=1)  # fmt: skip
    plan, _ = mirror_plan(cal, Path(built.run_dir) / "layers.json")
    every = plan_placement(graph_from_model(cal.reference), "all")
    variants = [placed_variant(cal, p, name, run_dir)
                for p, name in ((plan, "explicit"), (cal.plan, "explicit-trt"), (every, "explicit-all"))]
    side, gated = side_variants(options, implicit.model)
    variants += side
    gated = ["explicit", *gated]
    engines = [variant_engine(implicit, built)]
    engines += [variant_engine(v, deploy_one(v, target, options, runs, progress)) for v in variants]
    return TargetEngines(run_dir, tuple(engines), tuple(lint_model(float_model)), tuple(gated))
