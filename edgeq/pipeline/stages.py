"""The pipeline's stages, in one place: small functions over plain data, composed by ``deploy``,
``fleet``, ``run`` and ``demo``.

clean -> quantize -> lint run on the host (``prepare``); ship -> probe -> build -> inspect -> profile
run on a target through a ``Runner`` (put / run / get: the SSH connection is one, ``SSHRunner``);
report -> gate run on the host again from the fetched files (``conclude``). Each stage takes and
returns values; the bookkeeping (``stages.json``, ``deploy.log``, timings) is the ``Recorder``'s
(``edgeq.pipeline.rundir``), so a composition decides only which stages run and on what, the way Polygraphy's
loaders compose.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from edgeq.errors import GraphError, QuantError, RemoteError
from edgeq.findings import Level, ProgressFn, no_progress
from edgeq.fs import atomic_write_text
from edgeq.pipeline.rundir import (
    STAGES,
    AgentFn,
    Recorder,
    StageRecord,
    model_stem,
    write_json,
)
from edgeq.pipeline.shapes import Shapes
from edgeq.remote.protocol import (
    DiskSpace,
    agent_failed,
    build_args,
    call_agent,
    check_expectations,
    disk_space,
    probe_facts,
)
from edgeq.remote.runner import Runner
from edgeq.remote.targets import Target
from edgeq.text import plural

if TYPE_CHECKING:
    from edgeq.pipeline.accuracy import AccuracyPlan, EngineAccuracy
    from edgeq.quant.quantize import QuantizeOptions
    from edgeq.report.fusion import FusionReport
    from edgeq.report.gate import GateResult
    from edgeq.report.policy import Policy

HOST_STAGES = STAGES[:3]


# --------------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """The host half's product: the model to ship (cleaned, maybe quantized) and where it is."""

    model: Any  # onnx.ModelProto
    model_file: Path
    qdq: bool
    cache_file: Optional[Path] = None
    stages: tuple[StageRecord, ...] = ()
    implicit_cache: Optional[Path] = None  # implicit INT8: the float model built with this calibration cache
    reference: Any = None  # the cleaned FP32 model a quantize stage started from (None: not quantized here)


@dataclass(frozen=True)
class Probe:
    facts: dict[str, Any]
    tensorrt: Optional[str]
    compute_capability: Optional[str]
    gpu: Optional[str]
    disk: Optional[DiskSpace] = None  # free space where the runs are written
    # where each of tensorrt, gpu and compute_capability came from: "probe", or "target file" when the
    # probe found none (no nvidia-smi, say) and the target file's value stands in
    sources: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """The facts in words, the target file's said so; nothing unknown printed as None."""
        said = [f"TensorRT {self.tensorrt}" if self.tensorrt else "TensorRT version unknown"]
        sm = f"sm {self.compute_capability}" if self.compute_capability else None
        if self.sources.get("gpu") == "probe":
            filed = " (target file)" if self.sources.get("compute_capability") == "target file" else ""
            said.append(", ".join(v for v in (self.gpu, sm and sm + filed) if v))
        else:
            filed = ", ".join(v for v in (self.gpu, sm) if v)
            said.append("no GPU found by the probe" + (f" (target file: {filed})" if filed else ""))
        if self.disk is not None:
            said.append(f"{self.disk.free_mib} MiB free disk at {self.disk.path}")
        return ", ".join(said)

    @property
    def kind(self) -> Optional[str]:
        """Engines are portable between targets of one kind: same compute capability and TensorRT.
        None when either is unknown: such a target never shares an engine."""
        if not self.compute_capability or not self.tensorrt:
            return None
        return f"sm{self.compute_capability}-trt{self.tensorrt}"


@dataclass(frozen=True)
class RunReport:
    """What ``finish_run`` produced: the report, the gate verdict and where they were written."""

    report: FusionReport
    gate: GateResult
    report_json: Path
    report_html: Path
    accuracy: Optional[EngineAccuracy] = None  # the engine's outputs on the held-out set, scored

    @property
    def passed(self) -> bool:
        """The precision gate and, when measured, the accuracy verdict."""
        return bool(self.gate) and (self.accuracy is None or self.accuracy.passed)


@dataclass(frozen=True)
class ProfileSettings:
    """How a target builds (FP16 fallback) and times an engine: one value for deploy, fleet and run."""

    fp16: Optional[bool] = None  # None: the target's build.fp16
    iterations: int = 10  # trtexec --iterations
    duration: float = 3.0  # trtexec --duration
    warmup_ms: int = 200  # trtexec --warmUp
    # trtexec --minShapes/--optShapes/--maxShapes of a model with dynamic inputs (edgeq.pipeline.shapes):
    # as given, then resolved before any SSH; built with them, timed at --optShapes
    shapes: Shapes = field(default_factory=Shapes)




# --------------------------------------------------------------------------------------------------
# Host stages
# --------------------------------------------------------------------------------------------------


def has_qdq(model: Any) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def clean(model_path: Path, out_dir: Path, *, verify: bool = False,
          progress: ProgressFn = no_progress) -> tuple[Any, Path]:
    """(``CleanResult``, where the cleaned model was saved as ``<name>.clean.onnx``)."""
    from edgeq.graph.clean import CleanOptions, clean_model
    from edgeq.graph.io import load_model, save_model

    res = clean_model(load_model(model_path), CleanOptions(verify=verify), progress)
    path = save_model(res.model, Path(out_dir) / f"{model_stem(model_path)}.clean.onnx")
    return res, Path(path)


def quantize(model: Any, stem: str, out_dir: Path, options: QuantizeOptions,
             progress: ProgressFn = no_progress, suffix: str = "int8", *, cleaned: bool = False
             ) -> tuple[Any, Path, Path, Any]:
    """``edgeq quantize`` in-process: (Q/DQ model, ``<stem>.<suffix>.onnx``, ``<stem>.<suffix>.cache``,
    the ``QuantizeResult``). ``cleaned``: ``model`` is the clean stage's output, not cleaned again."""
    try:
        from edgeq.graph.io import save_model
        from edgeq.quant.quantize import calibration_data, implicit_model_path, quantize_model
    except ImportError:
        raise QuantError(
            "cannot quantize: edgeq.quant.quantize is not part of this edgeq build",
            "deploy a Q/DQ model (quantized elsewhere), or drop --calib to build an FP16 engine",
        ) from None
    cache = Path(out_dir) / f"{stem}.{suffix}.cache"
    data = calibration_data(model, options)
    q = quantize_model(model, data, replace(options, cache_path=cache), progress, cleaned=cleaned)
    # The implicit path's pair: the cache names the tensors of this cleaned FP32 model.
    save_model(q.reference, implicit_model_path(cache))
    path = save_model(q.model, Path(out_dir) / f"{stem}.{suffix}.onnx")
    return q.model, Path(path), cache, q


def lint(model: Any, out_dir: Path) -> tuple[int, int]:
    """(errors, findings), with ``lint.json`` written; a model 8.6 would refuse is a GraphError."""
    from edgeq.graph.rules import lint_model

    findings = lint_model(model)
    write_json(Path(out_dir) / "lint.json", [f.to_dict() for f in findings])
    errors = [f for f in findings if f.level == Level.ERROR]
    if errors:
        f = errors[0]
        raise GraphError(
            f"lint: TensorRT 8.6 would refuse this model: [{f.rule}] {f.message}"
            + (f" ({', '.join(f.nodes[:3])})" if f.nodes else ""),
            f"{f.fix}; all findings: {Path(out_dir) / 'lint.json'}",
            exit_code=1,
        )
    return len(errors), len(findings)


def prepare(model_path: Path, rec: Recorder, spec: QuantizeOptions, out_dir: Optional[Path] = None,
            calib_cache: Optional[Path] = None) -> Prepared:
    """clean -> quantize (a float model with calibration data) -> lint, recorded in ``rec``.

    With ``calib_cache`` a float model is not quantized: it is built as implicit INT8 with that cache."""
    out = Path(out_dir or rec.run_dir)
    stem = model_stem(model_path)
    with rec.stage("clean") as r:
        cleaned, model_file = clean(model_path, out)
        model, changes = cleaned.model, len(cleaned.changes)
        r.summary, r.data = plural(changes, "change"), {"output": model_file.name, "changes": changes}
    qdq, cache, reference = has_qdq(model), None, None
    if qdq:
        rec.skip(
            "quantize", "the model already has Q/DQ nodes" + (" (--calib ignored)" if spec.has_data else "")
        )
    elif calib_cache is not None:
        rec.skip("quantize", f"implicit INT8 with the calibration cache {Path(calib_cache).name}")
    elif not spec.has_data:
        rec.skip("quantize", "float model and no --calib: building without INT8 (the INT8 gate will say so)")
    else:
        from edgeq.quant.quantize import implicit_model_path

        with rec.stage("quantize") as r:
            reference = model
            model, model_file, cache, q = quantize(model, stem, out, spec, rec.progress, cleaned=True)
            qdq = has_qdq(model)
            acc = q.accuracy.to_dict() if q.accuracy is not None else None
            r.data = {"output": model_file.name, "cache": cache.name, "accuracy": acc,
                      "fp32_model": implicit_model_path(cache).name,
                      "calibrator": q.to_dict()["calibrator"], "placement": spec.placement,
                      "overrides": str(spec.overrides) if spec.overrides else None,
                      "excluded": list(q.plan.excluded), "forced": list(q.plan.forced)}
            r.summary = f"{len(q.plan.sites)} activations quantized -> {model_file.name}"
            if q.wrecked:  # far below FP32 and no bound of the user's: a failed check (exit 1)
                said, fix = q.wrecked_message(model_path)
                raise QuantError(f"quantize: {said}", fix, exit_code=1)
            if not q.ok:
                raise QuantError(f"quantize: accuracy below the bound: {q.accuracy}",
                                 "see the quantize stage's accuracy; exclude sensitive layers (overrides)",
                                 exit_code=1)  # fmt: skip
    with rec.stage("lint") as r:
        errors, findings = lint(model, out)
        r.summary = f"{plural(errors, 'error')}, {plural(findings - errors, 'other finding')}"
        r.data = {"errors": errors, "findings": findings}
    records = tuple(StageRecord(**asdict(rec.log.stage(n))) for n in HOST_STAGES)
    implicit = Path(calib_cache) if calib_cache is not None and not qdq else None
    return Prepared(model, model_file, qdq, cache, records, implicit, reference)


def prepare_host(model_path: Path, host_dir: Path, spec: QuantizeOptions,
                 progress: ProgressFn = no_progress, calib_cache: Optional[Path] = None) -> Prepared:
    """``prepare`` once into a new ``host_dir`` with its own records, for a fleet's targets to share
    (``fleet validate``, ``edgeq run`` and the fleet bench alike; a board kind's placement under auto)."""
    Path(host_dir).mkdir(parents=True)
    rec = Recorder(Path(host_dir), progress=progress, stages=HOST_STAGES, task="prepare")
    with rec.finishing():
        return prepare(model_path, rec, spec, calib_cache=calib_cache)


# --------------------------------------------------------------------------------------------------
# Target stages (over a Runner)
# --------------------------------------------------------------------------------------------------


def ship(
    runner: Runner, target: Target, model_file: Path, agent_pyz: Any, progress: ProgressFn = no_progress
) -> tuple[Any, Any]:
    """Upload the agent zipapp and the model into the target's content-addressed cache."""
    cache = target.remote_path("cache")
    return runner.put(agent_pyz.path, cache, progress=progress), runner.put(
        model_file, cache, progress=progress
    )


def direct_agent(runner: Runner, target: Target, agent_remote: str) -> AgentFn:
    """The agent called outside a run directory (``targets check``): nothing recorded, no logs to name;
    a run's stages call it through ``Recorder.agent`` instead."""

    def call(command: str, *args: str, timeout: float) -> dict[str, Any]:
        from edgeq.remote.ssh import ConnectionDropped

        try:
            reply = call_agent(runner, target, agent_remote, command, *args, timeout=timeout)
        except ConnectionDropped as e:  # the agent's command is the stage here (probe, profile)
            e.during(command)
            raise
        if not reply.get("ok"):
            raise agent_failed(command, reply, target, runner.destination)
        return reply.get("result") or {}

    return call


def probe(agent: AgentFn, target: Target) -> Probe:
    """The target's facts (TensorRT, GPUs, compute capability), checked against the target file."""
    facts = agent("probe", f"--workDir={target.remote_path('runs')}", timeout=target.timeouts.command)
    check_expectations(target, *probe_facts(facts))
    return probe_from_facts(facts, target)


def probe_from_facts(facts: dict[str, Any], target: Target) -> Probe:
    """The probe's facts as a ``Probe``. No GPU listed (e.g. trtexec without nvidia-smi): the target
    file's GPU and compute capability stand in, and ``sources`` says so."""
    trt, cc = probe_facts(facts)
    gpus = facts.get("gpus") or []
    gpu = gpus[0].get("name") if gpus else None
    sources = {k: "probe" for k, v in (("tensorrt", trt), ("gpu", gpu), ("compute_capability", cc)) if v}
    if not gpu and target.gpu_name:
        gpu, sources["gpu"] = target.gpu_name, "target file"
    if not cc and target.compute_capability:
        cc, sources["compute_capability"] = target.compute_capability, "target file"
    return Probe(facts, trt, cc, gpu, disk_space(facts), sources)


# What a build needs free on the target's disk, checked before it starts: the engine (TensorRT keeps the
# weights at the build's precision, FP32 at most: no more than the ONNX file holds, FP32 or INT8) plus a
# margin for the timing cache, the layer and profile JSON and trtexec's log.
BUILD_DISK_MARGIN = 64 << 20


def check_build_room(found: Probe, model_file: Path, target: Target) -> None:
    """Refuse to start a build the target's disk cannot take (when the probe could say)."""
    need = Path(model_file).stat().st_size + BUILD_DISK_MARGIN
    disk = found.disk
    if disk is None or disk.free_bytes >= need:
        return
    from edgeq.remote.upload import NO_SPACE_HINT

    raise RemoteError(
        f"build not started on {target.name}: {disk.free_mib} MiB free on {disk.path}, the build needs "
        f"about {-(-need >> 20)} MiB (an engine up to the model's size, plus its logs and JSON)",
        NO_SPACE_HINT,
        exit_code=1,
    )


def build(
    agent: AgentFn,
    target: Target,
    onnx_remote: str,
    engine_remote: str,
    *,
    int8: bool,
    fp16: bool,
    found: Probe,
    calib_remote: Optional[str] = None,
    shapes: Shapes = Shapes(),
) -> dict[str, Any]:
    """trtexec/TensorRT build; with ``calib_remote`` implicit INT8 from that calibration cache; ``shapes``:
    the optimization profile of a model with dynamic inputs."""
    args = build_args(target, onnx_remote, engine_remote, int8=int8 or calib_remote is not None, fp16=fp16,
                      trt_version=found.tensorrt, cc=found.compute_capability)  # fmt: skip
    if calib_remote is not None:
        args.append(f"--calib={calib_remote}")
    args += shapes.build_args()
    t = target.timeouts
    return agent("build", *args, f"--timeout={t.build:g}", timeout=t.build + 60)


def with_build_region(e: RemoteError, log: Path, prepared: Prepared) -> RemoteError:
    """A failed explicit build's error with the Q/DQ region TensorRT broke on (read from the build's log in
    deploy.log and the Q/DQ model: ``edgeq.report.runlog.build_failure``); ``e`` itself when the log names
    none or the model has no Q/DQ."""
    from edgeq.report.runlog import build_failure

    if not prepared.qdq or not log.is_file():
        return e
    found = build_failure(log.read_text(encoding="utf-8", errors="replace"), prepared.model)
    if found is None or found.region is None:
        return e
    rule = f" (edgeq rules {found.rule})" if found.rule else ""
    return RemoteError(f"{e.message}; Q/DQ region: {found.region}{rule}", e.hint, exit_code=e.exit_code)


def _dla(target: Target) -> list[str]:
    return [f"--useDLACore={target.build.dla_core}"] if target.build.dla_core is not None else []


def inspect(agent: AgentFn, target: Target, engine_remote: str, layers_remote: str,
            shapes: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    """The engine's layer JSON; ``shapes``: the ``--shapes`` it is timed at, for an engine with dynamic
    inputs, whose formats the inspector prints only at concrete shapes."""
    t = target.timeouts
    return agent("inspect", f"--loadEngine={engine_remote}", f"--exportLayerInfo={layers_remote}",
                 *_dla(target), *shapes, f"--timeout={t.command:g}", timeout=t.command + 60)  # fmt: skip


def profile(
    agent: AgentFn,
    target: Target,
    engine_remote: str,
    profile_remote: Optional[str],
    settings: ProfileSettings,
    *,
    data_transfers: bool = True,
) -> dict[str, Any]:
    """Time an engine; with ``profile_remote`` also its per-layer times (a second run). Without the
    bindings' host<->device copies when ``data_transfers`` is false (re-timing: orchestration.retime)."""
    t = target.timeouts
    per_layer = [f"--exportProfile={profile_remote}"] if profile_remote else []
    copies = [] if data_transfers else ["--noDataTransfers"]
    return agent(
        "profile", f"--loadEngine={engine_remote}", *per_layer,
        f"--warmUp={settings.warmup_ms}", f"--iterations={settings.iterations}",
        f"--duration={settings.duration:g}", *_dla(target), *copies, *settings.shapes.run_args(),
        f"--timeout={t.profile:g}",
        timeout=t.profile + 60,
    )  # fmt: skip


class KindEngines:
    """Engines built in one fleet run, by kind (compute capability + TensorRT): one build per kind."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self.engines: dict[str, tuple[Path, str]] = {}  # kind -> (local engine, target that built it)

    def lock(self, kind: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(kind, threading.Lock())


def on_target(
    runner: Runner,
    target: Target,
    prepared: Prepared,
    rec: Recorder,
    agent_pyz: Any,
    settings: ProfileSettings,
    shared: Optional[KindEngines] = None,
    remote_name: Optional[str] = None,
    probed: Optional[Probe] = None,
    accuracy: Optional[AccuracyPlan] = None,
) -> Probe:
    """upload -> probe -> build (or reuse the kind's engine) -> inspect -> profile -> accuracy; files into
    the run dir. ``probed``: the board's probe, already taken on this connection (a resumed run's check),
    not repeated. ``accuracy``: the engine run on held-out inputs and scored (else the stage is skipped)."""
    run_dir = rec.run_dir
    remote_run = target.remote_path("runs", remote_name or run_dir.name)
    with rec.stage("upload") as r:
        up_agent, up_model = ship(runner, target, prepared.model_file, agent_pyz, rec.progress)
        r.data = {"agent": {"version": agent_pyz.version, **asdict(up_agent)}, "model": asdict(up_model)}
        up_cache = None
        if prepared.implicit_cache is not None:
            up_cache = runner.put(prepared.implicit_cache, target.remote_path("cache"), progress=rec.progress)
            r.data["calibration_cache"] = asdict(up_cache)
        r.summary = (
            f"model {up_model.bytes_sent} B sent{' (cached)' if up_model.cached else ''}, agent "
            f"{agent_pyz.version} {up_agent.bytes_sent} B sent{' (cached)' if up_agent.cached else ''}"
        )
    agent = rec.agent(runner, target, up_agent.remote_path)
    with rec.stage("probe") as r:
        found = probed if probed is not None else probe(agent, target)
        write_json(run_dir / "probe.json", found.facts)
        r.summary = found.describe() + (" (probed by the resume check)" if probed is not None else "")
        r.data = {
            "tensorrt": found.tensorrt,
            "compute_capability": found.compute_capability,
            "gpu": found.gpu,
            "kind": found.kind,
            "disk": asdict(found.disk) if found.disk is not None else None,
            "sources": found.sources,
        }
    engine_remote = f"{remote_run}/engine.plan"
    fp16 = target.build.fp16 if settings.fp16 is None else settings.fp16
    share = shared if found.kind is not None else None
    lock = share.lock(found.kind) if share is not None and found.kind else threading.Lock()
    with lock:
        reused = share.engines.get(found.kind) if share is not None and found.kind else None
        if reused is not None:
            with rec.stage("build") as r:
                up = runner.put(reused[0], target.remote_path("cache"), progress=rec.progress)
                engine_remote = up.remote_path
                (run_dir / "engine.plan").write_bytes(reused[0].read_bytes())
                r.status = "skipped"
                r.summary = (
                    f"engine of kind {found.kind} built on {reused[1]}, reused ({up.bytes_sent} B sent)"
                )
                r.data = {"reused_from": reused[1], "kind": found.kind}
        else:
            with rec.stage("build") as r:
                check_build_room(found, prepared.model_file, target)
                try:
                    built = build(agent, target, up_model.remote_path, engine_remote, int8=prepared.qdq,
                                  fp16=fp16, found=found, shapes=settings.shapes,
                                  calib_remote=up_cache.remote_path if up_cache is not None else None)
                except RemoteError as e:
                    raise with_build_region(e, run_dir / "deploy.log", prepared) from None
                runner.get(engine_remote, run_dir / "engine.plan")
                r.data = {**built, "kind": found.kind}
                size, secs = built.get("engine_bytes"), built.get("build_seconds")
                r.summary = f"{built.get('mode')} engine, {size} B in {secs} s"
                _warnings(rec, r, "build", built)
                rec.timings["build_seconds"] = built.get("build_seconds")
            if share is not None and found.kind:
                share.engines[found.kind] = (run_dir / "engine.plan", target.name)
    with rec.stage("inspect") as r:
        got = inspect(agent, target, engine_remote, f"{remote_run}/layers.json", settings.shapes.run_args())
        runner.get(f"{remote_run}/layers.json", run_dir / "layers.json")
        r.summary = f"{got.get('layers')} layers"
        _warnings(rec, r, "inspect", got)
    with rec.stage("profile") as r:
        prof = profile(agent, target, engine_remote, f"{remote_run}/profile.json", settings)
        runner.get(f"{remote_run}/profile.json", run_dir / "profile.json")
        rec.timings.update(
            {k: prof.get(k) for k in ("latency_ms", "gpu_compute_ms", "throughput_qps") if k in prof}
        )
        lat, qps = (prof.get("latency_ms") or {}).get("median"), prof.get("throughput_qps")
        r.summary = f"median {summary_figure(lat, '.4g')} ms, {summary_figure(qps, '.0f')} qps"
        _warnings(rec, r, "profile", prof)
    if accuracy is None:
        rec.skip("accuracy", "no --holdout: the engine's outputs were not checked")
        return found
    from edgeq.pipeline.accuracy import measure

    with rec.stage("accuracy") as r:
        acc = measure(runner, agent, target, engine_remote, remote_run, accuracy, run_dir, _dla(target),
                      settings.shapes)
        r.summary, r.data = acc.summary(), acc.to_dict()
    return found


def summary_figure(value: Any, spec: str) -> str:
    """A profile figure for a summary line: the python backend reports raw floats (0.6699479999952018 ms
    came back from an H100), trtexec rounded ones; '?' where the reply has none."""
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "?"


def _warnings(rec: Recorder, record: Any, stage: str, reply: dict[str, Any]) -> None:
    """The agent's warnings (e.g. trtexec died at exit after PASSED, its outputs checked and kept) into
    deploy.log and the stage's summary: a result that counts despite them says so."""
    for warning in reply.get("warnings") or ():
        rec.log.line(f"{stage}: warning - {warning}")
        record.summary += f" (warning: {warning})"


# --------------------------------------------------------------------------------------------------
# Report and gate (host)
# --------------------------------------------------------------------------------------------------


def finish_run(
    run_dir: Path,
    layers_json: Path,
    profile_json: Optional[Path],
    onnx_model: Any,
    policy: Policy,
) -> RunReport:
    """Report + gate from an engine's inspector JSON and profile (as fetched from the target), and the
    run's ``accuracy.json`` when the engine's accuracy was measured.

    Writes ``report.json`` and ``report.html`` into ``run_dir``; the verdict is returned, not raised.
    """
    from edgeq.pipeline.accuracy import accuracy_html, read_accuracy
    from edgeq.report.render import render_html, report_to_dict

    report, gate = report_and_gate(Path(layers_json), Path(profile_json) if profile_json else None,
                                   onnx_model, policy)  # fmt: skip
    acc = read_accuracy(run_dir)
    data = report_to_dict(report, gate)
    if acc is not None:
        data["accuracy"] = acc.to_dict()
    rj = write_json(Path(run_dir) / "report.json", data)
    rh = Path(run_dir) / "report.html"
    atomic_write_text(rh, render_html(report, gate, [accuracy_html(acc)] if acc is not None else []))
    return RunReport(report=report, gate=gate, report_json=rj, report_html=rh, accuracy=acc)


def report_and_gate(layers: Any, profile_src: Any, model: Any, policy: Policy) -> tuple[Any, Any]:
    """(report, gate verdict) from layer info and an optional profile: paths, JSON text or dicts."""
    from edgeq.report.fusion_build import build_report
    from edgeq.report.gate import apply_gate
    from edgeq.report.parse import load_layers, load_profile

    prof = load_profile(profile_src) if profile_src is not None else None
    report = build_report(load_layers(layers), prof, model)
    return report, apply_gate(report, policy)


def gate_policy(policy: Policy, stages: Sequence[StageRecord]) -> Policy:
    """``policy`` with the nodes the quantize stage left float on purpose allowlisted (an override file's
    ``exclude``, the regions ``quantize --max-loss`` kept float): intended float, listed as such by the
    gate; any other float layer still fails it."""
    from edgeq.quant.overrides import INTENDED_FLOAT

    quantized = [s for s in stages if s.name == "quantize" and s.status == "ok"]
    excluded = [str(n) for s in quantized for n in s.data.get("excluded") or ()]
    return policy.with_allow(excluded, source=INTENDED_FLOAT) if excluded else policy


def conclude(rec: Recorder, model: Any, policy: Policy) -> RunReport:
    """report -> gate from the run directory's layers.json and profile.json."""
    with rec.stage("report") as r:
        finished = finish_run(rec.run_dir, rec.run_dir / "layers.json", rec.run_dir / "profile.json", model,
                              policy)  # fmt: skip
        r.summary = f"{len(finished.report.layers)} layers -> {finished.report_html.name}"
    with rec.stage("gate") as r:
        r.summary = finished.gate.summary()
        r.data = {"passed": bool(finished.gate)}
        if finished.accuracy is not None:
            r.summary += "; " + finished.accuracy.summary()
            r.data["accuracy_passed"] = finished.accuracy.passed
        if not finished.passed:
            r.status = "failed"
    return finished
