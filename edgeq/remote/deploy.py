"""``edgeq deploy``: clean -> (quantize) -> lint -> upload -> probe -> build -> inspect -> profile ->
report -> gate, with every artefact and every stage's outcome in one run directory.

The run directory (``runs/<model>-<target>-<timestamp>/``) is the product of a deploy, failed or not:
``stages.json`` (each stage's status, seconds and one-line summary, rewritten after every stage),
``deploy.log`` (stage lines plus the target's log stream), the cleaned (and quantized) ONNX, the lint
findings, ``probe.json``, the engine, the inspector's ``layers.json``, ``profile.json``,
``timings.json`` and the report (``report.json``, ``report.html``). The TensorRT work happens on the
target through the agent (``edgeq.remote.agent``); every remote command is an argv list the transport
quotes. ``finish_run`` is the host-only second half (report + gate from the fetched files), usable
offline on files from any earlier run.

On the target, everything lives under the target file's ``work_dir``: ``cache/<sha256>/<name>`` (the
content-addressed uploads: models and the agent zipapp, reused while unchanged), ``runs/<run>/`` (the
engine, layer info and profile of each run) and ``timing-cache/`` (one TensorRT timing cache per
TensorRT version and GPU, so rebuilds skip tactic timing).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from edgeq.errors import EdgeqError, GraphError, QuantError, RemoteError
from edgeq.findings import Level, ProgressFn, no_progress
from edgeq.fs import atomic_write_text, ensure_dir
from edgeq.remote.agent import PROTOCOL as AGENT_PROTOCOL  # the envelope version shipped with this host
from edgeq.remote.targets import Target, version_matches

if TYPE_CHECKING:  # the report and transport load lazily: a deploy that fails early never imports them
    from edgeq.remote.transport import Connection, SSHConfig
    from edgeq.report.fusion import FusionReport
    from edgeq.report.gate import GateResult
    from edgeq.report.policy import Policy

STAGES = ("clean", "quantize", "lint", "upload", "probe", "build", "inspect", "profile", "report", "gate")
EventFn = Callable[[str], None]


def _no_event(line: str) -> None:
    """Default sink for stage and remote log lines."""


# --------------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeployOptions:
    calib: Optional[Path] = None  # a float model is quantized with this calibration data
    accept_new_host_key: bool = False
    gate: Optional[str] = None  # policy name; None: the target's (else int8)
    gate_allow: tuple[str, ...] = ()  # extra allowlist (e.g. from a pipeline file)
    runs_dir: Path = Path("runs")
    fp16: Optional[bool] = None  # None: the target's build.fp16
    iterations: int = 10  # trtexec --iterations (at least N timed runs)
    duration: float = 3.0  # trtexec --duration (at least S seconds)
    warmup_ms: int = 200  # trtexec --warmUp
    cache_dir: Optional[Path] = None  # where the agent zipapp is built (default: the user cache)


@dataclass
class StageRecord:
    name: str
    status: str = "pending"  # pending | ok | failed | skipped
    seconds: float = 0.0
    summary: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunReport:
    """What ``finish_run`` produced: the report, the gate verdict and where they were written."""

    report: FusionReport
    gate: GateResult
    report_json: Path
    report_html: Path


@dataclass
class DeployResult:
    run_dir: Path
    stages: list[StageRecord]
    finished: Optional[RunReport] = None
    timings: dict[str, Any] = field(default_factory=dict)

    @property
    def gate_passed(self) -> bool:
        return self.finished is not None and bool(self.finished.gate)

    def stage(self, name: str) -> StageRecord:
        return next(s for s in self.stages if s.name == name)


# --------------------------------------------------------------------------------------------------
# The run directory
# --------------------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")
    return s or "model"


def new_run_dir(runs_dir: Path, model: Path, target_name: str, now: Optional[_dt.datetime] = None) -> Path:
    """``runs/<model>-<target>-<UTC timestamp>``; a suffix keeps two deploys in one second apart."""
    stamp = (now or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y%m%d-%H%M%S")
    base = f"{_slug(model.name.rsplit('.onnx', 1)[0])}-{_slug(target_name)}-{stamp}"
    ensure_dir(runs_dir)
    for i in range(1, 1000):
        path = runs_dir / (base if i == 1 else f"{base}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise EdgeqError(f"{runs_dir}: cannot create a run directory ({e.strerror or e})",
                             "choose another --runs-dir") from None
    raise EdgeqError(f"{runs_dir}: cannot create a run directory for {base}")


class RunLog:
    """``stages.json`` and ``deploy.log`` of one run; every change is on disk at once."""

    def __init__(self, run_dir: Path, on_event: EventFn = _no_event) -> None:
        self.run_dir = run_dir
        self.on_event = on_event
        self.stages = [StageRecord(n) for n in STAGES]
        self._log = open(run_dir / "deploy.log", "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.save()

    def line(self, text: str, *, echo: bool = True) -> None:
        stamp = time.strftime("%H:%M:%S")
        self._log.write(f"{stamp} {text}\n")
        self._log.flush()
        if echo:
            self.on_event(text)

    def remote_line(self, text: str) -> None:
        """A line of the target's stderr (TensorRT / trtexec log): kept in deploy.log, not echoed."""
        self._log.write(f"  | {text}\n")
        self._log.flush()  # a build runs for minutes: ``tail -f deploy.log`` shows TensorRT's progress

    def stage(self, name: str) -> StageRecord:
        return next(s for s in self.stages if s.name == name)

    def save(self) -> None:
        write_json(self.run_dir / "stages.json", {"stages": [asdict(s) for s in self.stages]})

    def close(self) -> None:
        self._log.close()


def write_json(path: Path, obj: Any) -> Path:
    """Every JSON artefact of a run, written the one way (atomic, indented, anything else as str)."""
    atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")
    return path


# --------------------------------------------------------------------------------------------------
# Agent protocol (host side)
# --------------------------------------------------------------------------------------------------


def agent_argv(target: Target, agent_path: str, command: str, *args: str) -> list[str]:
    """``[python, agent.pyz, command, --backend=..., ...]``. Values ride in ``--flag=value`` form so a
    value starting with '-' (``-CUBLAS``, a file named ``-x.onnx``) is never read as an option."""
    return [
        target.python,
        agent_path,
        command,
        f"--backend={target.backend}",
        f"--trtexec={target.trtexec}",
        *args,
    ]


def parse_agent_reply(
    stdout: str, stderr: str, exit_code: int, what: str, signal: Optional[str] = None
) -> dict[str, Any]:
    """The one JSON object the agent printed, or a RemoteError saying why there is none (``signal``:
    the one that killed it)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "protocol" in obj:
            if obj["protocol"] != AGENT_PROTOCOL:
                raise RemoteError(
                    f"{what}: the agent speaks protocol {obj['protocol']}, edgeq speaks {AGENT_PROTOCOL}",
                    "update edgeq on this host (the agent is shipped from it)",
                    exit_code=1,
                )
            return obj
    tail = [ln for ln in stderr.strip().splitlines() if ln.strip()][-1:] or ["no output"]
    if signal:
        raise RemoteError(
            f"{what}: the agent was killed by signal {signal} on the target: {tail[0][:300]}",
            "see the target's kernel log (dmesg: out of memory?) and deploy.log for what it was doing",
            exit_code=1,
        )
    raise RemoteError(
        f"{what}: the agent gave no answer (exit {exit_code}): {tail[0][:300]}",
        "check the target's 'python' in the target file (Python 3.8+ is needed)",
        exit_code=1,
    )


def call_agent(
    conn: Connection,
    target: Target,
    agent_remote: str,
    command: str,
    *args: str,
    timeout: float,
    on_stderr: Optional[EventFn] = None,
) -> dict[str, Any]:
    """Run one agent command on the target; its reply envelope (``ok`` with ``result`` or ``error``).

    ``check=False``: a non-zero exit still carries the agent's JSON answer, which says more than the
    exit code (the stage that failed, TensorRT's log)."""
    argv = agent_argv(target, agent_remote, command, *args)
    res = conn.run(argv, timeout=timeout, check=False, on_stderr=on_stderr)
    return parse_agent_reply(res.stdout, res.stderr, res.exit_code, f"{command} on {target.name}", res.signal)


def _agent_failed(
    command: str, reply: dict[str, Any], target: Target, destination: str, run_dir: Optional[Path] = None
) -> RemoteError:
    """The one-line error for a reply with ``ok`` false: the agent's stage and message, and a hint."""
    err = reply.get("error") or {}
    return RemoteError(
        f"{command} on {target.name} ({destination}) failed at stage "
        f"'{err.get('stage', '?')}': {err.get('message', 'no message')}",
        _hint(command, err, target, run_dir),
        exit_code=1,
    )


def _probe_facts(facts: dict[str, Any]) -> tuple[Optional[str], Optional[str]]:
    """(TensorRT version, first GPU's compute capability) from the probe's facts, either may be None."""
    gpus = facts.get("gpus") or []
    return (facts.get("tensorrt") or {}).get("version"), (gpus[0].get("compute_capability") if gpus else None)


# --------------------------------------------------------------------------------------------------
# Host-side stages
# --------------------------------------------------------------------------------------------------


def has_qdq(model: Any) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def _quantize(model: Any, calib: Path, cache_path: Path, progress: ProgressFn) -> Any:
    """``edgeq quantize`` in-process: TensorRT-aware Q/DQ placement plus the calibration cache."""
    try:
        from edgeq.quant.data import calibration_set
        from edgeq.quant.quantize import QuantizeOptions, quantize_model
    except ImportError:
        raise QuantError(
            "cannot quantize: edgeq.quant.quantize is not part of this edgeq build",
            "deploy a Q/DQ model (quantized elsewhere), or drop --calib to build an FP16 engine",
        ) from None
    data = calibration_set(model, calib)
    return quantize_model(model, data, QuantizeOptions(cache_path=cache_path), progress)


def _policy(options: DeployOptions, target: Target) -> Policy:
    from edgeq.report.policy import POLICIES, policy_from_dict

    spec: dict[str, Any] = {}
    if target.gate is not None:
        spec = {"policy": target.gate.policy, "allow": list(target.gate.allow)}
        if target.gate.require_fusion is not None:
            spec["require_fusion"] = target.gate.require_fusion
    policy = policy_from_dict(spec or None, where=f"{target.path}: gate")
    if options.gate is not None:
        if options.gate not in POLICIES:
            raise EdgeqError(f"--gate {options.gate}: unknown policy", f"one of {', '.join(POLICIES)}")
        policy = POLICIES[options.gate].with_allow(list(policy.allow))
    return policy.with_allow(list(options.gate_allow))


def finish_run(
    run_dir: Path,
    layers_json: Path,
    profile_json: Optional[Path],
    onnx_model: Any,
    policy: Policy,
) -> RunReport:
    """Report + gate from an engine's inspector JSON and profile (as fetched from the target).

    Writes ``report.json`` and ``report.html`` into ``run_dir``; the verdict is returned, not raised.
    """
    from edgeq.report.fusion import build_report
    from edgeq.report.gate import apply_gate
    from edgeq.report.parse import load_layers, load_profile
    from edgeq.report.render import render_html, report_to_dict

    layers = load_layers(Path(layers_json))
    profile = load_profile(Path(profile_json)) if profile_json is not None else None
    report = build_report(layers, profile, onnx_model)
    gate = apply_gate(report, policy)
    rj = write_json(Path(run_dir) / "report.json", report_to_dict(report, gate))
    rh = Path(run_dir) / "report.html"
    atomic_write_text(rh, render_html(report, gate))
    return RunReport(report=report, gate=gate, report_json=rj, report_html=rh)


# --------------------------------------------------------------------------------------------------
# deploy
# --------------------------------------------------------------------------------------------------


class _Deploy:
    def __init__(
        self,
        model_path: Path,
        target: Target,
        options: DeployOptions,
        policy: Policy,
        ssh_config: SSHConfig,
        progress: ProgressFn,
        on_event: EventFn,
    ) -> None:
        self.model_path = model_path
        self.target = target
        self.options = options
        self.policy = policy
        self.ssh_config = ssh_config
        self.progress = progress
        self.run_dir = new_run_dir(Path(options.runs_dir), model_path, target.name)
        self.log = RunLog(self.run_dir, on_event)
        self.timings: dict[str, Any] = {"stages": {}}
        self.remote_run = target.remote_path("runs", self.run_dir.name)
        self.done = 0

    @contextmanager
    def stage(self, name: str) -> Iterator[StageRecord]:
        rec = self.log.stage(name)
        self.progress("deploy", self.done, len(STAGES))
        self.log.line(f"{name}: started")
        started = time.monotonic()
        try:
            yield rec
        except BaseException as e:
            rec.status = "failed"
            rec.summary = str(e) if isinstance(e, EdgeqError) else f"{type(e).__name__}: {e}"
            raise
        else:
            if rec.status == "pending":
                rec.status = "ok"
        finally:
            rec.seconds = round(time.monotonic() - started, 3)
            self.timings["stages"][name] = rec.seconds
            self.log.line(f"{name}: {rec.status}" + (f" - {rec.summary}" if rec.summary else ""))
            self.log.save()
            self.done += 1
            self.progress("deploy", self.done, len(STAGES))

    def skip(self, name: str, why: str) -> None:
        rec = self.log.stage(name)
        rec.status, rec.summary = "skipped", why
        self.log.line(f"{name}: skipped - {why}")
        self.log.save()
        self.done += 1

    # -- the remote half ------------------------------------------------------------------------------
    def agent(
        self, conn: Connection, agent_remote: str, command: str, *args: str, timeout: float
    ) -> dict[str, Any]:
        """``call_agent`` with the reply kept as ``agent-<command>.json`` and its log in deploy.log."""
        streamed = 0

        def on_stderr(line: str) -> None:
            nonlocal streamed
            streamed += 1
            self.log.remote_line(line)

        reply = call_agent(conn, self.target, agent_remote, command, *args, timeout=timeout,
                           on_stderr=on_stderr)  # fmt: skip
        write_json(self.run_dir / f"agent-{command}.json", reply)
        if not reply.get("ok"):
            # The reply's log is a tail of the stderr that already streamed into deploy.log; it is the
            # only copy only when nothing streamed.
            if not streamed:
                for ln in (reply.get("error") or {}).get("log") or []:
                    self.log.remote_line(str(ln))
            raise _agent_failed(command, reply, self.target, conn.config.destination, self.run_dir)
        return reply.get("result") or {}

    def run(self) -> DeployResult:
        opts, target = self.options, self.target
        from edgeq.graph.clean import CleanOptions, clean_model
        from edgeq.graph.io import load_model, save_model

        # clean
        with self.stage("clean") as rec:
            model = load_model(self.model_path)
            res = clean_model(model, CleanOptions(verify=False))
            model = res.model
            # Keep the user's file name (spaces and all): it travels as one quoted argv element.
            stem = self.model_path.name.rsplit(".onnx", 1)[0]
            model_file = self.run_dir / f"{stem}.clean.onnx"
            save_model(model, model_file)
            rec.summary = f"{len(res.changes)} change(s)"
            rec.data = {"output": model_file.name, "changes": len(res.changes)}

        # quantize
        qdq = has_qdq(model)
        if qdq:
            self.skip(
                "quantize", "the model already has Q/DQ nodes" + (" (--calib ignored)" if opts.calib else "")
            )
        elif opts.calib is None:
            self.skip(
                "quantize", "float model and no --calib: building without INT8 (the INT8 gate will say so)"
            )
        else:
            with self.stage("quantize") as rec:
                cache_file = self.run_dir / f"{stem}.int8.cache"
                q = _quantize(model, Path(opts.calib), cache_file, self.progress)
                model = q.model
                model_file = self.run_dir / f"{stem}.int8.onnx"
                save_model(model, model_file)
                qdq = has_qdq(model)
                acc = q.accuracy.to_dict() if q.accuracy is not None else None
                rec.data = {"output": model_file.name, "cache": cache_file.name, "accuracy": acc}
                rec.summary = f"{len(q.plan.sites)} activations quantized -> {model_file.name}"

        # lint
        from edgeq.graph.rules import lint_model

        with self.stage("lint") as rec:
            findings = lint_model(model)
            write_json(self.run_dir / "lint.json", [f.to_dict() for f in findings])
            errors = [f for f in findings if f.level == Level.ERROR]
            rec.summary = f"{len(errors)} error(s), {len(findings) - len(errors)} other finding(s)"
            rec.data = {"errors": len(errors), "findings": len(findings)}
            if errors:
                f = errors[0]
                raise GraphError(
                    f"lint: TensorRT 8.6 would refuse this model: [{f.rule}] {f.message}"
                    + (f" ({', '.join(f.nodes[:3])})" if f.nodes else ""),
                    f"{f.fix}; all findings: {self.run_dir / 'lint.json'}",
                    exit_code=1,
                )

        from edgeq.remote.transport import Connection
        from edgeq.remote.zipapp import build_agent

        fp16 = target.build.fp16 if opts.fp16 is None else opts.fp16
        with Connection(self.ssh_config) as conn:
            # upload
            with self.stage("upload") as rec:
                bundle = build_agent(opts.cache_dir or _cache_dir())
                cache = target.remote_path("cache")
                up_agent = conn.put_cached(bundle.path, cache, progress=self.progress)
                up_model = conn.put_cached(model_file, cache, progress=self.progress)
                rec.data = {
                    "agent": {"version": bundle.version, **asdict(up_agent)},
                    "model": asdict(up_model),
                }
                rec.summary = (
                    f"model {up_model.bytes_sent} B sent{' (cached)' if up_model.cached else ''}, agent "
                    f"{bundle.version} {up_agent.bytes_sent} B sent{' (cached)' if up_agent.cached else ''}"
                )
            agent_remote = up_agent.remote_path
            t = target.timeouts

            # probe
            with self.stage("probe") as rec:
                facts = self.agent(conn, agent_remote, "probe", timeout=t.command)
                write_json(self.run_dir / "probe.json", facts)
                trt_version, cc = _probe_facts(facts)
                gpus = facts.get("gpus") or []
                rec.summary = (
                    f"TensorRT {trt_version}, {gpus[0].get('name') if gpus else 'no GPU listed'}, sm {cc}"
                )
                rec.data = {"tensorrt": trt_version, "compute_capability": cc}
                _check_expectations(target, trt_version, cc)

            # build
            engine_remote = f"{self.remote_run}/engine.plan"
            with self.stage("build") as rec:
                args = build_args(target, up_model.remote_path, engine_remote, int8=qdq, fp16=fp16,
                                  trt_version=trt_version, cc=cc)  # fmt: skip
                args.append(f"--timeout={t.build:g}")
                built = self.agent(conn, agent_remote, "build", *args, timeout=t.build + 60)
                conn.get(engine_remote, self.run_dir / "engine.plan")
                rec.data = built
                size, secs = built.get("engine_bytes"), built.get("build_seconds")
                rec.summary = f"{built.get('mode')} engine, {size} B in {secs} s"
                for warning in built.get("warnings") or ():  # e.g. trtexec died at exit after PASSED
                    self.log.line(f"build: warning - {warning}")
                    rec.summary += f" (warning: {warning})"
                self.timings["build_seconds"] = built.get("build_seconds")

            dla = [f"--useDLACore={target.build.dla_core}"] if target.build.dla_core is not None else []
            # inspect
            with self.stage("inspect") as rec:
                layers_remote = f"{self.remote_run}/layers.json"
                got = self.agent(
                    conn, agent_remote, "inspect", f"--loadEngine={engine_remote}",
                    f"--exportLayerInfo={layers_remote}", *dla, f"--timeout={t.command:g}",
                    timeout=t.command + 60,
                )  # fmt: skip
                conn.get(layers_remote, self.run_dir / "layers.json")
                rec.summary = f"{got.get('layers')} layers"

            # profile
            with self.stage("profile") as rec:
                profile_remote = f"{self.remote_run}/profile.json"
                prof = self.agent(
                    conn, agent_remote, "profile", f"--loadEngine={engine_remote}",
                    f"--exportProfile={profile_remote}", f"--warmUp={opts.warmup_ms}",
                    f"--iterations={opts.iterations}", f"--duration={opts.duration:g}", *dla,
                    f"--timeout={t.profile:g}", timeout=t.profile + 60,
                )  # fmt: skip
                conn.get(profile_remote, self.run_dir / "profile.json")
                self.timings.update(
                    {k: prof.get(k) for k in ("latency_ms", "gpu_compute_ms", "throughput_qps") if k in prof}
                )
                lat = (prof.get("latency_ms") or {}).get("median")
                rec.summary = f"median {lat} ms, {prof.get('throughput_qps')} qps"

        # report + gate (host only)
        with self.stage("report") as rec:
            finished = finish_run(
                self.run_dir,
                self.run_dir / "layers.json",
                self.run_dir / "profile.json",
                model,
                self.policy,
            )
            rec.summary = f"{len(finished.report.layers)} layers -> {finished.report_html.name}"
        with self.stage("gate") as rec:
            rec.summary = finished.gate.summary()
            rec.data = {"passed": bool(finished.gate)}
            if not finished.gate:
                rec.status = "failed"
        return DeployResult(self.run_dir, self.log.stages, finished, self.timings)


def build_args(
    target: Target,
    onnx_remote: str,
    engine_remote: str,
    *,
    int8: bool,
    fp16: bool,
    trt_version: Optional[str] = None,
    cc: Optional[str] = None,
) -> list[str]:
    """The agent's ``build`` options for this target (trtexec names, ``--flag=value`` form).

    ``--int8`` only for a Q/DQ model (explicit quantization); a float model builds FP16/FP32 and the
    INT8 gate reports it. The timing cache is per TensorRT version and GPU: TensorRT refuses a cache
    from another device, so the name carries both.
    """
    b = target.build
    args = [f"--onnx={onnx_remote}", f"--saveEngine={engine_remote}"]
    if int8:
        args.append("--int8")
    if fp16:
        args.append("--fp16")
    if b.workspace:
        args.append(f"--workspace={b.workspace}")
    if b.tactic_sources:
        args.append("--tacticSources=" + ",".join(b.tactic_sources))
    if b.timing_cache:
        name = f"timing-{trt_version or 'trt'}-sm{cc or 'x'}.cache"
        args.append(f"--timingCacheFile={target.remote_path('timing-cache', name)}")
    if b.dla_core is not None:
        args.append(f"--useDLACore={b.dla_core}")
        if b.allow_gpu_fallback:
            args.append("--allowGPUFallback")
    return args


def _check_expectations(target: Target, trt_version: Optional[str], cc: Optional[str]) -> None:
    if target.tensorrt and not version_matches(target.tensorrt, trt_version):
        raise RemoteError(
            f"{target.name} runs TensorRT {trt_version}, but {target.path} expects {target.tensorrt}",
            "engines only load on the TensorRT they were built with: fix 'tensorrt' in the target file",
            exit_code=1,
        )
    if target.compute_capability and cc and cc != target.compute_capability:
        raise RemoteError(
            f"{target.name} has a compute capability {cc} GPU, but {target.path} expects "
            f"{target.compute_capability}",
            "is this the right machine? fix 'gpu.compute_capability' in the target file",
            exit_code=1,
        )


def _hint(command: str, err: dict[str, Any], target: Target, run_dir: Optional[Path]) -> Optional[str]:
    """The fix for a failed agent stage; ``run_dir`` None (``targets check``): no logs to point at."""
    stage = err.get("stage")
    where = f"; logs in {run_dir}" if run_dir is not None else ""
    if stage == "import" and target.backend == "python":
        return (
            f"install TensorRT 8.6's Python package for {target.python} on the target, or set "
            f"'backend: trtexec' in {target.path}{where}"
        )
    if stage == "import":
        return f"set 'trtexec' in {target.path} to trtexec's path on the target; check it starts there{where}"
    if run_dir is None:
        return None
    if stage in ("parse", "build"):
        return f"the TensorRT log is in {run_dir / 'deploy.log'} and {run_dir / f'agent-{command}.json'}"
    return f"logs in {run_dir}"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgeq" / "agent"


def deploy(
    model: Path,
    target: Target,
    options: DeployOptions = DeployOptions(),
    *,
    progress: ProgressFn = no_progress,
    on_event: EventFn = _no_event,
) -> DeployResult:
    """Deploy ``model`` to ``target``; see the module docstring for the stages and the run directory.

    A stage that fails raises its ``EdgeqError`` (after its outcome and the ones not reached are on
    disk); a gate violation is a result (``DeployResult.gate_passed`` False), not an exception.
    """
    model = Path(model)
    if not model.is_file():
        what = "not a file" if model.exists() else "no such file"
        raise GraphError(f"{model}: {what}", "check the model path")
    # Usage errors before a run directory exists: the gate name and the target's key files.
    policy = _policy(options, target)
    ssh_config = target.ssh_config(options.accept_new_host_key)
    d = _Deploy(model, target, options, policy, ssh_config, progress, on_event)
    try:
        result = d.run()
    except BaseException as e:  # EdgeqError, or Ctrl-C: either way the run directory says how far it got
        d.timings["failed"] = str(e) or type(e).__name__
        for s in d.log.stages:
            if s.status == "pending":
                s.status = "not run"
        if isinstance(e, EdgeqError) and not e.hint:
            e.hint = f"stage log: {d.run_dir / 'stages.json'}"
        raise
    finally:
        write_json(d.run_dir / "timings.json", d.timings)
        d.log.save()
        d.log.close()
    return result


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
    from edgeq.remote.transport import Connection
    from edgeq.remote.zipapp import build_agent

    with Connection(target.ssh_config(accept_new_host_key)) as conn:
        bundle = build_agent(cache_dir or _cache_dir())
        up = conn.put_cached(bundle.path, target.remote_path("cache"), progress=progress)
        reply = call_agent(conn, target, up.remote_path, "probe", timeout=target.timeouts.command)
        if not reply.get("ok"):
            raise _agent_failed("probe", reply, target, conn.config.destination)
        facts = reply.get("result") or {}
        _check_expectations(target, *_probe_facts(facts))
        facts["agent"] = {
            "version": bundle.version,
            "remote_path": up.remote_path,
            "bytes_sent": up.bytes_sent,
        }
        return facts


def summarize(result: DeployResult) -> list[str]:
    """One line per stage, for the CLI."""
    return [f"{s.name:<9} {s.status:<8} {s.seconds:7.2f}s  {s.summary}" for s in result.stages]


__all__: Sequence[str] = (
    "STAGES",
    "DeployOptions",
    "DeployResult",
    "RunReport",
    "StageRecord",
    "agent_argv",
    "call_agent",
    "check_target",
    "deploy",
    "finish_run",
    "new_run_dir",
    "parse_agent_reply",
    "summarize",
)
