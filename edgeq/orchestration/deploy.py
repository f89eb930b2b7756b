"""``edgeq deploy``: the pipeline's stages (``edgeq.pipeline.stages``) composed for one model on one target.

clean -> (quantize) -> lint -> upload -> probe -> build -> inspect -> profile -> (accuracy) -> report ->
gate, with
every artefact and every stage's outcome in one run directory (``runs/<model>-<target>-<timestamp>/``):
``stages.json`` (each stage's status, seconds and one-line summary, rewritten after every stage),
``deploy.log`` (stage lines plus the target's log stream), the cleaned (and quantized) ONNX, the lint
findings, ``probe.json``, the engine, the inspector's ``layers.json``, ``profile.json``,
``timings.json`` and the report (``report.json``, ``report.html``); with ``--holdout``, the held-out
inputs shipped (``holdout-inputs.npz``), the engine's outputs on them (``engine-outputs.npz``; arrays
``<group>/<name>``, one group per shape, when a dynamic model's samples have several) and their
score against FP32 beside onnxruntime's Q/DQ prediction (``accuracy.json``, ``edgeq.pipeline.accuracy``).
The stages' ``finish_run`` is the
host-only second half (report + gate from the fetched files), usable offline on any earlier run's files.

On the target, everything lives under the target file's ``work_dir``: ``cache/<sha256>/<name>`` (the
content-addressed uploads: models and the agent zipapp, reused while unchanged), ``runs/<run>/`` (the
engine, layer info and profile of each run) and ``timing-cache/`` (one TensorRT timing cache per
TensorRT version and GPU, so rebuilds skip tactic timing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, TypeVar

from edgeq.errors import EdgeqError, GraphError
from edgeq.findings import ProgressFn, no_progress
from edgeq.pipeline.accuracy import HeldOutSet, plan_for
from edgeq.pipeline.rundir import Recorder, StageRecord, new_run_dir, no_event
from edgeq.pipeline.stages import (
    ProfileSettings,
    RunReport,
    conclude,
    direct_agent,
    gate_policy,
    on_target,
    prepare,
    probe,
)
from edgeq.quant.quantize import QuantizeOptions
from edgeq.remote.protocol import agent_cache_dir
from edgeq.remote.runner import EventFn, target_runner
from edgeq.remote.targets import Target

if TYPE_CHECKING:
    from edgeq.orchestration.fleet import FleetOptions
    from edgeq.pipeline.shapes import Shapes
    from edgeq.report.policy import Policy


@dataclass(frozen=True)
class DeployOptions:
    # A float model with calibration data (``quantize.calib``) is quantized first, with these settings.
    quantize: QuantizeOptions = field(default_factory=QuantizeOptions)
    accept_new_host_key: bool = False
    gate: Optional[str] = None  # policy name; None: the target's (else int8)
    gate_allow: tuple[str, ...] = ()  # extra allowlist (e.g. from a pipeline file)
    gate_require_fusion: Optional[bool] = None  # a pipeline file's require_fusion; None: the policy's
    # False: interior reformats are not the precision gate's (--placement implicit: the relative gate
    # counts them against the implicit engine's own); None: the policy's
    gate_reformats: Optional[bool] = None
    runs_dir: Path = Path("runs")
    profile: ProfileSettings = field(default_factory=ProfileSettings)  # FP16 fallback and trtexec timing
    cache_dir: Optional[Path] = None  # where the agent zipapp is built (default: the user cache)
    calib_cache: Optional[Path] = None  # implicit INT8: a float model built with this calibration cache
    # a Q/DQ model's own float model (a mirror's, under --placement implicit/auto): the accuracy stage's
    # FP32, as for the implicit engine beside it; None: the Q/DQ model's float graph (weights dequantized)
    reference: Optional[Path] = None
    # --gate accuracy: TensorRT's own accuracy on the held-out set gates the run (--holdout DIR, or
    # quantize.min_metric / min_cosine, run the engine on it too)
    accuracy_gate: bool = False
    # (node pattern, who kept it float and why): nodes kept float on purpose (``deploy --max-loss``'s
    # choice, the user's override file) that the precision gate allows, crediting each to its reason
    intended: tuple[tuple[str, str], ...] = ()


@dataclass
class DeployResult:
    run_dir: Path
    stages: list[StageRecord]
    finished: Optional[RunReport] = None
    timings: dict[str, Any] = field(default_factory=dict)

    @property
    def gate_passed(self) -> bool:
        """The precision gate and, with --holdout, the accuracy verdict."""
        return self.finished is not None and self.finished.passed

    def stage(self, name: str) -> StageRecord:
        return next(s for s in self.stages if s.name == name)


def policy_for(target: Target, gate: Optional[str] = None, allow: Sequence[str] = (),
               require_fusion: Optional[bool] = None) -> Policy:  # fmt: skip
    """The target's gate (else int8), ``--gate NAME`` over it, plus extra allowlisted names; a pipeline's
    ``require_fusion`` (not None) over the policy's own."""
    from edgeq.report.policy import POLICIES, policy_from_dict

    spec: dict[str, Any] = {}
    if target.gate is not None:
        spec = {"allow": list(target.gate.allow)}
        if target.gate.policy is not None:
            spec["policy"] = target.gate.policy
        if target.gate.require_fusion is not None:
            spec["require_fusion"] = target.gate.require_fusion
    policy = policy_from_dict(spec or None, where=f"{target.path}: gate", source=target.path.name)
    if gate is not None:
        if gate not in POLICIES:
            raise EdgeqError(f"--gate {gate}: unknown policy", f"one of {', '.join(POLICIES)}")
        policy = POLICIES[gate].replace(allow=policy.allow, allow_from=policy.allow_from)
    if require_fusion is not None:
        policy = policy.replace(require_fusion=require_fusion)
    return policy.with_allow(list(allow), source="the pipeline's gate.allow")


def with_intended(policy: Policy, intended: Sequence[tuple[str, str]]) -> Policy:
    """``policy`` allowing each (pattern, why) kept float on purpose, credited to its why."""
    for why in dict.fromkeys(w for _, w in intended):
        policy = policy.with_allow([p for p, w in intended if w == why], source=why)
    return policy


def deploy_policy(options: DeployOptions, target: Target) -> Policy:
    policy = with_intended(policy_for(target, options.gate, options.gate_allow, options.gate_require_fusion),
                           options.intended)
    if options.gate_reformats is not None:
        policy = policy.replace(forbid_interior_reformats=options.gate_reformats
                                and policy.forbid_interior_reformats)  # fmt: skip
    return policy


def check_model_path(model: Path) -> Path:
    model = Path(model)
    if not model.is_file():
        what = "not a file" if model.exists() else "no such file"
        raise GraphError(f"{model}: {what}", "check the model path")
    return model


def deploy(
    model: Path,
    target: Target,
    options: DeployOptions = DeployOptions(),
    *,
    progress: ProgressFn = no_progress,
    on_event: EventFn = no_event,
) -> DeployResult:
    """Deploy ``model`` to ``target``; see the module docstring for the stages and the run directory.

    A stage that fails raises its ``EdgeqError`` (after its outcome and the ones not reached are on
    disk); a gate violation is a result (``DeployResult.gate_passed`` False), not an exception.
    """
    from edgeq.remote.zipapp import build_agent

    model = check_model_path(model)
    # Usage errors before a run directory exists: the gate name and the target's key files.
    policy = deploy_policy(options, target)
    options.quantize.check_inputs()
    options = with_shapes(model, options)
    holdout = holdout_inputs(model, options.quantize, options.accuracy_gate, options.profile.shapes)
    if not target.is_local:
        target.ssh_config(options.accept_new_host_key)  # key files checked before a run directory exists
    rec = Recorder(new_run_dir(Path(options.runs_dir), model, target.name), on_event, progress)
    with rec.finishing():
        prepared = prepare(model, rec, options.quantize, calib_cache=options.calib_cache)
        if options.reference is not None and prepared.qdq and prepared.reference is None:
            from edgeq.graph.io import load_model

            prepared = replace(prepared, reference=load_model(options.reference))
        plan = None
        if holdout is not None:
            plan = plan_for(prepared, holdout, options.quantize, options.accuracy_gate)
        with target_runner(target, options.accept_new_host_key) as runner:
            on_target(runner, target, prepared, rec, build_agent(options.cache_dir or agent_cache_dir()),
                      options.profile, accuracy=plan)  # fmt: skip
        finished = conclude(rec, prepared.model, gate_policy(policy, prepared.stages))
    return DeployResult(rec.run_dir, rec.stages, finished, rec.timings)


OptionsT = TypeVar("OptionsT", "DeployOptions", "FleetOptions")


def with_shapes(model: Path, options: OptionsT) -> OptionsT:
    """``options`` with the optimization profile of ``model``'s dynamic inputs resolved (the flags, else
    the calibration data's shape: ``edgeq.pipeline.shapes``), so every build of one deploy or fleet,
    nested ones included, uses the same; exit 2 before any SSH when a dynamic input has no shape to use."""
    from edgeq.pipeline.shapes import resolve_shapes

    shapes = resolve_shapes(check_model_path(model), options.profile.shapes, options.quantize)
    if shapes == options.profile.shapes:
        return options
    return replace(options, profile=replace(options.profile, shapes=shapes))


def holdout_inputs(model: Path, quantize: QuantizeOptions, gate: bool, shapes: Optional[Shapes] = None
                   ) -> Optional[HeldOutSet]:  # fmt: skip
    """The held-out samples the engine will run on, indexed and checked against the model's inputs before
    a run directory exists (a bad directory or shape is a usage error), those within the engine's profile
    (``shapes``, resolved: ``pipeline.accuracy.in_profile``); None when not asked for."""
    from edgeq.pipeline.accuracy import holdout_for, wants_target_check

    if not wants_target_check(quantize, gate):
        return None
    from edgeq.graph.io import load_model

    return holdout_for(load_model(model), quantize, gate, shapes)


def check_target(
    target: Target,
    *,
    accept_new_host_key: bool = False,
    cache_dir: Optional[Path] = None,
    progress: ProgressFn = no_progress,
) -> dict[str, Any]:
    """``edgeq targets check``: connect (host key verified), ship the agent, probe, compare with the file.

    Returns the probe's facts; raises the same one-line errors a deploy would at those stages.
    """
    from edgeq.remote.zipapp import build_agent

    with target_runner(target, accept_new_host_key) as runner:
        bundle = build_agent(cache_dir or agent_cache_dir())
        up = runner.put(bundle.path, target.remote_path("cache"), progress=progress)
        facts = probe(direct_agent(runner, target, up.remote_path), target).facts
        facts["agent"] = {
            "version": bundle.version,
            "remote_path": up.remote_path,
            "bytes_sent": up.bytes_sent,
        }
        return facts
