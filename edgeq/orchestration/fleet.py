"""``edgeq fleet validate``: one model, prepared once, deployed to every target of a fleet at once.

The host half (clean -> quantize -> lint) runs once into ``<fleet dir>/host/``; then bounded workers
run each target's half (upload -> probe -> build -> inspect -> profile -> report -> gate) into
``<fleet dir>/<target>/``, a deploy's run directory each. An unreachable or failing target fails its
row only. ``fleet.json`` holds the matrix (target x reachable, TensorRT, GPU, build, gate, latency,
throughput, report); ``junit_xml`` renders it for CI (one testcase per target).

Engines are not portable across GPUs or TensorRT versions, but are across identical boards: with
``build_once_per_kind`` the first target of a kind (compute capability + TensorRT version) builds and
the others load that engine (``Probe.kind``).

The boards run through ``edgeq.orchestration.pool`` (workers, ``--max-fail``, Ctrl-C, shared with
``release install``): after Ctrl-C no board starts, the running ones stop at their next wait (the remote
build killed), and ``fleet.json`` records the boards that finished, ``interrupted`` set.
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

from edgeq import __version__, text
from edgeq.errors import EdgeqError
from edgeq.findings import ProgressFn, no_progress
from edgeq.fs import sha256_file
from edgeq.interrupt import EXIT_INTERRUPTED, Interrupted
from edgeq.orchestration import resume
from edgeq.orchestration.deploy import policy_for, with_shapes
from edgeq.orchestration.fleet_file import Fleet
from edgeq.orchestration.pool import INTERRUPTED, BoardPool
from edgeq.pipeline.accuracy import holdout_for
from edgeq.pipeline.rundir import Recorder, model_stem, new_run_dir, slug, write_json
from edgeq.pipeline.stages import (
    KindEngines,
    Prepared,
    Probe,
    ProfileSettings,
    conclude,
    direct_agent,
    gate_policy,
    on_target,
    prepare_host,
    probe,
)
from edgeq.quant.quantize import QuantizeOptions
from edgeq.remote.causes import cause_of
from edgeq.remote.protocol import agent_cache_dir
from edgeq.remote.runner import Runner, target_runner
from edgeq.remote.targets import Target


@dataclass(frozen=True)
class FleetOptions:
    quantize: QuantizeOptions = field(default_factory=QuantizeOptions)
    gate: Optional[str] = None
    gate_allow: tuple[str, ...] = ()
    gate_require_fusion: Optional[bool] = None  # a pipeline file's; None: each policy's own
    runs_dir: Path = Path("runs")
    accept_new_host_key: bool = False
    build_once_per_kind: bool = False
    workers: Optional[int] = None  # None: the fleet file's
    profile: ProfileSettings = field(default_factory=ProfileSettings)
    cache_dir: Optional[Path] = None
    fresh: bool = False  # run every target again, not resuming the last run (edgeq.orchestration.resume)
    max_fail: Optional[int] = None  # start no more targets after this many failures
    accuracy_gate: bool = False  # the engine on the held-out set gates each row (deploy --gate accuracy)
    # --placement auto (edgeq.orchestration.auto.AutoOptions): a float model with calibration data is placed
    # by the first board of each kind, through the placement cache; None: the host's placement for all
    auto: Optional[Any] = None
    engine: str = "native"  # who runs the boards: edgeq's own workers, or "ansible" (edgeq.ansible.engine)

    def settings(self) -> dict[str, Any]:
        """The options a target's result depends on (its resume key): not where or how fast it ran."""
        from edgeq.orchestration.placement_cache import calibration_digest
        from edgeq.pipeline.accuracy import settings as accuracy_settings

        return {"gate": self.gate, "gate_allow": list(self.gate_allow),
                "require_fusion": self.gate_require_fusion, "build_once_per_kind": self.build_once_per_kind,
                "profile": asdict(self.profile),
                **({"placement": "auto", "calibration": calibration_digest(self.quantize)}
                   if self.auto else {}),
                **accuracy_settings(self.quantize, self.accuracy_gate)}


@dataclass
class Row:
    """One target's line of the matrix; ``status`` is pending | running | passed | failed | skipped
    (not started: ``--max-fail`` was reached; exit 1, but not a failure of this target) | interrupted
    (Ctrl-C stopped it, or came before it started)."""

    target: str
    destination: str
    status: str = "pending"
    stage: str = ""
    reachable: Optional[bool] = None
    tensorrt: Optional[str] = None
    gpu: Optional[str] = None
    compute_capability: Optional[str] = None
    kind: Optional[str] = None
    build: Optional[str] = None  # ok | reused | failed | not run
    gate: Optional[bool] = None
    gate_summary: str = ""
    accuracy: Optional[str] = None  # TensorRT's figure on the held-out set (and onnxruntime's prediction)
    accuracy_passed: Optional[bool] = None
    latency_p50_ms: Optional[float] = None
    latency_p99_ms: Optional[float] = None
    throughput_qps: Optional[float] = None
    report: Optional[str] = None
    run_dir: Optional[str] = None
    error: Optional[str] = None
    exit_code: int = 0  # what this row alone would exit with: its error's code (2: the user's to fix), gate 1
    cause: Optional[str] = None  # why the target could not be used (edgeq.remote.causes), when known
    failed_in: Optional[str] = None  # the stage a failed row stopped in (build, probe, ...; gate)
    sources: dict[str, str] = field(default_factory=dict)  # "probe" or "target file", per probed fact
    seconds: float = 0.0
    reused_from: Optional[str] = None  # the run this passed row was taken over from (not run again)
    rebuilt: Optional[str] = None  # why a board that passed with these inputs ran again: its facts changed
    placement: Optional[str] = None  # --placement auto: what its kind kept, decided where (or from cache)

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass
class FleetResult:
    fleet_dir: Path
    model: Path
    rows: list[Row]
    created: str
    host_stages: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0  # the run's wall time (the rows ran at once: their sum is more)
    interrupted: bool = False  # Ctrl-C: the rows that finished before it are what this run proved

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.passed for r in self.rows) and not self.interrupted

    @property
    def exit_code(self) -> int:
        """0 when every target passed, 130 when interrupted, else the highest of the rows' (a failure's
        cause exits as it would from ``deploy``: 2 for a host key, a login or a target file, 1 for the
        rest)."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        return 0 if self.passed else max([1, *(r.exit_code for r in self.rows)])

    def to_dict(self) -> dict[str, Any]:
        return {
            "fleet_dir": str(self.fleet_dir),
            "model": str(self.model),
            "created": self.created,
            "edgeq": __version__,
            "passed": self.passed,
            "interrupted": self.interrupted,
            "seconds": self.seconds,
            "host_stages": self.host_stages,
            "targets": [asdict(r) for r in self.rows],
        }


RowFn = Callable[[Row], None]


def _no_row(row: Row) -> None:
    """Default sink for row updates."""


def _fill(row: Row, rec: Recorder, target: Target) -> None:
    """The row's cells from the target's run directory records."""
    st = {s.name: s for s in rec.stages}
    up, pr, b, g = st["upload"], st["probe"], st["build"], st["gate"]
    row.reachable = up.status == "ok" if up.status != "not run" else None
    row.tensorrt = pr.data.get("tensorrt")
    row.compute_capability = pr.data.get("compute_capability")
    row.kind = pr.data.get("kind")
    row.gpu = pr.data.get("gpu")
    row.sources = dict(pr.data.get("sources") or {})
    row.build = "reused" if b.data.get("reused_from") else ("ok" if b.status == "ok" else b.status)
    lat = rec.timings.get("latency_ms") or {}
    row.latency_p50_ms, row.latency_p99_ms = lat.get("median"), lat.get("p99")
    row.throughput_qps = rec.timings.get("throughput_qps")
    if g.status in ("ok", "failed") and "passed" in g.data:
        row.gate, row.gate_summary = g.status == "ok", g.summary  # the accuracy verdict included
    acc = st["accuracy"]
    if acc.status == "ok" and acc.data:
        row.accuracy = _accuracy_cell(acc.data)
        row.accuracy_passed = bool(acc.data.get("passed"))
    report = rec.run_dir / "report.html"
    row.report = str(report) if report.exists() else None


def _accuracy_cell(data: dict[str, Any]) -> str:
    """``classification 0.950 (Q/DQ 0.963)``: TensorRT's headline figure beside onnxruntime's prediction."""
    trt, qdq = data["tensorrt"], data.get("onnxruntime_qdq")
    return f"{trt['metric']} {trt['value']:.3f}" + (f" (Q/DQ {qdq['value']:.3f})" if qdq else "")


@dataclass
class _Run:
    """What the boards of one run share: the pool (its lock on rows, failures so far, Ctrl-C), the
    resume keys."""

    fleet_dir: Path
    options: FleetOptions
    agent: Any
    shared: Optional[KindEngines]
    keys: dict[str, str]
    priors: dict[str, resume.Prior]
    pool: BoardPool
    placements: Optional[Any] = None  # auto.KindPlacements: one decision per board kind
    held: Any = None  # the held-out set every board's engine runs on (pipeline.accuracy.HeldOutSet), or None
    connect: Callable[..., Any] = target_runner  # (target, accept_new_host_key, stop) -> a Runner's context


def _reusable(target: Target, run: _Run) -> Optional[resume.Prior]:
    """The target's passed row of an earlier run, when its inputs (the resume key) are unchanged."""
    prior = run.priors.get(target.name)
    if run.options.fresh or prior is None or not prior.reusable(run.keys[target.name]):
        return None
    return prior


def _changed(runner: Runner, target: Target, run: _Run, prior: resume.Prior
             ) -> tuple[Optional[str], dict[str, Optional[str]], Probe]:
    """Probe the board on the run's connection (the agent is in its upload cache already): what changed
    since ``prior`` (None: nothing), its facts now, and the probe (a rebuild does not probe again)."""
    found = _probe_board(runner, target, run)
    facts = resume.board_facts(found)
    return resume.changed_facts(prior.recorded_facts(target), facts), facts, found


def _probe_board(runner: Runner, target: Target, run: _Run) -> Probe:
    """The board's probe on the run's connection (the agent is in its upload cache already)."""
    up = runner.put(run.agent.path, target.remote_path("cache"))
    return probe(direct_agent(runner, target, up.remote_path), target)


def _reuse(target: Target, run: _Run, row: Row, prior: resume.Prior, facts: dict[str, Optional[str]],
           started: float) -> None:  # fmt: skip
    """Take over the target's passed row of an earlier run (its board probed unchanged)."""
    dest = resume.board_dir(run.fleet_dir, target.name)
    resume.take_over(prior, dest)
    known = {f for f in Row.__dataclass_fields__}
    for k, v in prior.row.items():
        if k in known and k not in ("target", "destination", "rebuilt"):
            setattr(row, k, v)
    row.run_dir = str(dest)
    row.report = resume.moved(row.report, prior.board_dir, dest)
    row.reused_from = prior.run
    row.seconds = round(time.monotonic() - started, 3)
    resume.record(dest, asdict(row), run.keys[target.name], facts)


def _validate_one(target: Target, prepared: Prepared, run: _Run, row: Row, on_row: RowFn) -> None:
    options, lock = run.options, run.pool.lock

    def update(**cells: Any) -> None:
        with lock:
            for k, v in cells.items():
                setattr(row, k, v)
            on_row(row)

    with lock:
        why_not = run.pool.not_started()
    if why_not == INTERRUPTED:
        update(status="interrupted", error="not started", exit_code=EXIT_INTERRUPTED)
        return
    if why_not is not None:
        update(status="skipped", error=f"not started: {why_not}", exit_code=1)
        return
    prior = _reusable(target, run)
    started = time.monotonic()
    update(status="running", stage="connect" if prior is None else "probe")
    # one connection, opened lazily; Ctrl-C (the pool's stop) ends what runs on it
    with run.connect(target, options.accept_new_host_key, run.pool.stop) as runner:
        found: Optional[Probe] = None
        if prior is not None:
            try:
                why, facts, found = _changed(runner, target, run, prior)
            except Interrupted:
                _interrupted(row, started, run, on_row)
                return
            except EdgeqError as e:  # unreachable, or no longer what its target file says
                _failed_before_run(row, e, started, run, on_row)
                return
            if why is None:
                _reuse(target, run, row, prior, facts, started)
                update()
                return
            update(rebuilt=why)
        placement = None
        if run.placements is not None:  # --placement auto: the board's kind decides (or has decided)
            try:
                if found is None:
                    update(stage="placement")
                    found = _probe_board(runner, target, run)
                placement = run.placements.for_board(target, found)
            except EdgeqError as e:
                _failed_before_run(row, e, started, run, on_row)
                return
            prepared = placement.prepared
            update(placement=placement.cell())
        _run_on_board(runner, target, prepared, run, row, update, started, found, placement)


def validate_board(target: Target, prepared: Prepared, fleet_dir: Path, options: FleetOptions, *, key: str,
                   prior: Optional[resume.Prior], pool: BoardPool, agent: Any, shared: Optional[Any] = None,
                   connect: Callable[..., Any] = target_runner, on_row: RowFn = _no_row) -> Row:  # fmt: skip
    """One board of a fleet run, as ``validate_prepared`` runs each of its boards: the seam another engine
    runs boards through (``edgeq.ansible``: one Ansible task a board, ``connect`` its Ansible connection).
    ``key``: the board's resume key; ``prior``: its record of an earlier run; ``pool``: this board's view
    of the run (Ctrl-C, --max-fail and the failures so far); ``shared``: the run's engines by kind."""
    run = _Run(fleet_dir, options, agent, shared, {target.name: key}, {target.name: prior} if prior else {},
               pool, connect=connect)  # fmt: skip
    row = Row(target.name, f"{target.user}@{target.host}:{target.port}")
    _validate_one(target, prepared, run, row, on_row)
    return row


def _failed_before_run(row: Row, e: EdgeqError, started: float, run: _Run, on_row: RowFn) -> None:
    """A board that passed before could not be probed: failed now, its earlier record kept (not
    overwritten), so a later run reuses it once the board answers as it did."""
    cause = cause_of(e)
    with run.pool.lock:
        row.failed_in = row.stage
        row.error, row.exit_code, row.status, row.stage = str(e), e.exit_code, "failed", ""
        row.reachable = cause.answered if cause is not None else True
        row.cause = cause.name if cause is not None else None
        row.seconds = round(time.monotonic() - started, 3)
        run.pool.failures += 1
        on_row(row)


def _interrupted(row: Row, started: float, run: _Run, on_row: RowFn) -> None:
    """Ctrl-C stopped the board before its run directory was made (its earlier record kept)."""
    with run.pool.lock:
        row.status, row.error, row.exit_code = "interrupted", f"stopped during {row.stage}", EXIT_INTERRUPTED
        row.stage, row.seconds = "", round(time.monotonic() - started, 3)
        on_row(row)


def _run_on_board(runner: Runner, target: Target, prepared: Prepared, run: _Run, row: Row,
                  update: Callable[..., None], started: float, probed: Optional[Probe] = None,
                  placement: Optional[Any] = None) -> None:  # fmt: skip
    """The target's half of the pipeline into a fresh board directory, recorded for the next run."""
    fleet_dir, options, lock = run.fleet_dir, run.options, run.pool.lock

    def event(line: str) -> None:
        if line.endswith(": started"):
            update(stage=line.split(":", 1)[0])

    run_dir = resume.board_dir(fleet_dir, target.name)
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier, unfinished or failed try (edgeq run's work dir)
    run_dir.mkdir(parents=True)
    rec = Recorder(run_dir, event)
    row.run_dir = str(rec.run_dir)
    rec.copy(prepared.stages)
    if row.rebuilt:
        rec.log.line(f"{row.rebuilt}: rebuilt (it passed with these inputs on the board as it was then)")
    cause, facts, stopped = None, None, None
    try:
        gate = (options.gate, options.gate_allow, options.gate_require_fusion)
        policy = placement.policy(target, *gate) if placement is not None else policy_for(target, *gate)
        with rec.finishing():
            found = on_target(runner, target, prepared, rec, run.agent, options.profile, run.shared,
                              remote_name=f"{fleet_dir.name}-{run_dir.name}", probed=probed,
                              accuracy=_accuracy_plan(prepared, run))
            facts = resume.board_facts(found)
            update(gpu=found.gpu, kind=found.kind)
            conclude(rec, prepared.model, gate_policy(policy, prepared.stages))
    except Interrupted as e:  # Ctrl-C: its remote command killed, the run directory says how far it got
        stopped = f"stopped during {row.stage}"
        row.exit_code = e.exit_code
    except EdgeqError as e:
        row.error, row.exit_code, row.failed_in = str(e), e.exit_code, row.stage
        cause = cause_of(e)
    with lock:
        _fill(row, rec, target)
        if cause is not None:  # the same cause reads the same in every command (edgeq.remote.causes)
            row.cause, row.reachable = cause.name, cause.answered
        row.seconds = round(time.monotonic() - started, 3)
        row.status = "passed" if row.error is None and row.gate else "failed"
        if stopped is not None:
            row.status, row.error = "interrupted", stopped
        elif row.error is None and not row.gate:
            row.error, row.exit_code, row.failed_in = row.gate_summary or "gate failed", 1, "gate"
        row.stage = ""
        run.pool.failures += row.status == "failed"
        resume.record(run_dir, asdict(row), run.keys[target.name], facts)
    update()


def validate(
    model: Path,
    fleet: Fleet,
    options: FleetOptions = FleetOptions(),
    *,
    on_row: RowFn = _no_row,
    progress: ProgressFn = no_progress,
    now: Optional[_dt.datetime] = None,
) -> FleetResult:
    """Validate ``model`` on every target of ``fleet``; a failing target is a failed row, not an error.

    Errors of the model itself (unreadable, refused by lint, bad calibration data) stop the run before
    any target is contacted, as in ``deploy``.
    """
    from edgeq.orchestration.auto import auto_applies
    from edgeq.orchestration.deploy import check_model_path

    started = time.monotonic()
    model = check_model_path(model)
    check_gates(fleet, options)
    if options.engine == "ansible":  # what it does not run, and Ansible itself: said before any work
        from edgeq.ansible.engine import check_options

        check_options(options)
    options.quantize.check_inputs()
    from edgeq.orchestration.deploy import holdout_inputs

    options = with_shapes(model, options)  # a dynamic input without a shape: before any work
    # a bad held-out set, or none within the engine's profile: before any work
    holdout_inputs(model, options.quantize, options.accuracy_gate, options.profile.shapes)
    stamp = now or _dt.datetime.now(_dt.timezone.utc)
    fleet_dir = new_run_dir(Path(options.runs_dir), Path(f"fleet-{model_stem(model)}"), slug(fleet.path.stem),
                            now=stamp)  # fmt: skip
    resume.mark_run(fleet_dir, fleet.path, model)
    auto = options.auto is not None and auto_applies(model, options.quantize)
    # under auto the host only cleans and lints: each board kind's placement quantizes
    spec = replace(options.quantize, calib=None, synthetic=None) if auto else options.quantize
    prepared = prepare_host(model, fleet_dir / "host", spec, progress)
    earlier = [] if options.fresh else resume.earlier_runs(fleet_dir, fleet.path, model)
    options = options if auto else replace(options, auto=None)  # a Q/DQ model or no data: nothing to decide
    return validate_prepared(model, prepared, fleet, fleet_dir, options, on_row=on_row, created=stamp,
                             resume_from=earlier, started=started)


def _accuracy_plan(prepared: Prepared, run: _Run) -> Any:
    """The board's accuracy stage: the run's one held-out set, scored against the board's own prepared
    model (under --placement auto each kind quantizes its own); None: no held-out set, stage skipped."""
    from edgeq.pipeline.accuracy import plan_for

    if run.held is None:
        return None
    return plan_for(prepared, run.held, run.options.quantize, run.options.accuracy_gate)


def check_gates(fleet: Fleet, options: FleetOptions) -> None:
    """A bad --gate is the user's, said once, before any work."""
    for t in fleet.targets:
        policy_for(t, options.gate, options.gate_allow, options.gate_require_fusion)


def validate_prepared(
    model: Path,
    prepared: Prepared,
    fleet: Fleet,
    fleet_dir: Path,
    options: FleetOptions = FleetOptions(),
    *,
    on_row: RowFn = _no_row,
    created: Optional[_dt.datetime] = None,
    source_sha256: Optional[str] = None,
    resume_from: Sequence[Path] = (),
    started: Optional[float] = None,
) -> FleetResult:
    """The targets' half of ``validate`` for a model already prepared (``pipeline.prepare``);
    ``source_sha256``: the model's hash when the caller has it (``edgeq run``), not read again;
    ``resume_from``: earlier runs (newest first) whose passed, unchanged targets are reused;
    ``started``: when the run began (``time.monotonic()``), for its wall time."""
    from edgeq.remote.zipapp import build_agent

    started = time.monotonic() if started is None else started
    stamp = created or _dt.datetime.now(_dt.timezone.utc)
    agent = build_agent(options.cache_dir or agent_cache_dir())
    rows = [Row(t.name, f"{t.user}@{t.host}:{t.port}") for t in fleet.targets]
    for r in rows:
        on_row(r)
    model_digest = ":".join(sha256_file(p) for p in (prepared.model_file, prepared.cache_file) if p)
    settings = options.settings()
    keys = {t.name: resume.board_key(t, model_digest, settings) for t in fleet.targets}
    pool = BoardPool(max(1, min(options.workers or fleet.workers, len(rows))), options.max_fail)
    run = _Run(fleet_dir, options, agent, KindEngines() if options.build_once_per_kind else None, keys,
               {} if options.fresh else resume.priors(resume_from, [t.name for t in fleet.targets]), pool,
               placements=_placements(model, fleet_dir, options),
               held=holdout_for(prepared.model, options.quantize, options.accuracy_gate,
                                options.profile.shapes))
    if options.engine == "ansible":  # the same board work, each board a task of an Ansible play
        from edgeq.ansible.engine import validate_boards

        validate_boards(fleet, prepared, fleet_dir, options, rows, run.priors, pool, on_row)
    else:
        pool.run([partial(_validate_one, t, prepared, run, r, on_row) for t, r in zip(fleet.targets, rows)],
                 "edgeq-fleet")  # fmt: skip
    result = FleetResult(
        fleet_dir, model, rows, stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), [asdict(s) for s in prepared.stages],
        round(time.monotonic() - started, 3), pool.interrupted,
    )
    kinds = run.placements.kinds if run.placements is not None else {}
    if len(kinds) == 1:  # one kind: its model is the fleet's shipped model (release bundles it)
        prepared = next(iter(kinds.values())).prepared
    write_json(fleet_dir / "fleet.json", {
        **result.to_dict(),
        "placements": {k: kp.to_dict(fleet_dir) for k, kp in sorted(kinds.items())} or None,
        "source_sha256": source_sha256 or sha256_file(model),
        "model_file": os.path.relpath(prepared.model_file, fleet_dir),  # the directory moves as one
        "cache_file": os.path.relpath(prepared.cache_file, fleet_dir) if prepared.cache_file else None,
    })  # fmt: skip
    return result


NOT_TRIED = ("skipped", "interrupted")  # rows that did not run to a verdict: neither passed nor failed


def _placements(model: Path, fleet_dir: Path, options: FleetOptions) -> Optional[Any]:
    """--placement auto: the per-kind decisions, into ``<fleet dir>/placement/<kind>/``."""
    if options.auto is None:
        return None
    from edgeq.orchestration.auto import KindPlacements
    from edgeq.orchestration.deploy import DeployOptions

    deploy_options = DeployOptions(quantize=options.quantize, accept_new_host_key=options.accept_new_host_key,
                                   gate=options.gate, gate_allow=options.gate_allow,
                                   gate_require_fusion=options.gate_require_fusion, profile=options.profile,
                                   cache_dir=options.cache_dir)  # fmt: skip
    return KindPlacements(model, deploy_options, options.auto, fleet_dir / "placement")


def junit_xml(result: FleetResult, suite: str = "edgeq fleet validate") -> str:
    """JUnit XML as CI systems read it: testsuites > testsuite > testcase (failure on a failed row,
    ``<skipped/>`` on a board not started after --max-fail or stopped by Ctrl-C)."""
    import xml.etree.ElementTree as ET

    skipped = sum(r.status in NOT_TRIED for r in result.rows)
    failures = sum(not r.passed for r in result.rows) - skipped
    root = ET.Element("testsuites", tests=str(len(result.rows)), failures=str(failures), errors="0",
                      skipped=str(skipped))  # fmt: skip
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(result.rows)), failures=str(failures),
                       errors="0", skipped=str(skipped), timestamp=result.created,
                       time=f"{result.seconds:.3f}")  # fmt: skip
    for r in result.rows:
        tc = ET.SubElement(ts, "testcase", classname=f"edgeq.fleet.{slug(result.model.name)}", name=r.target,
                           time=f"{r.seconds:.3f}")  # fmt: skip
        if r.status in NOT_TRIED:
            ET.SubElement(tc, "skipped", message=_result(r)[:500])
        elif not r.passed:
            kind = "gate" if r.gate is False and r.reachable else "target"
            fail = ET.SubElement(tc, "failure", message=(r.error or "failed")[:500], type=kind)
            fail.text = "\n".join(f"{k}: {v}" for k, v in asdict(r).items() if v not in (None, ""))
        lines = [f"{label}: {v}" for label, v in (("run directory", r.run_dir), ("report", r.report)) if v]
        if lines:  # a board that never got a run directory (unreachable) has nothing to point at
            ET.SubElement(tc, "system-out").text = "\n".join(lines)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def rerun_note(r: Row) -> str:
    """Whether a resumed run took the row over or built it again, and why."""
    if r.reused_from:
        return f"reused from {r.reused_from}"
    return f"{r.rebuilt}: rebuilt" if r.rebuilt else ""


def gpu_cell(r: Row) -> str:
    """GPU and compute capability, marked when the target file gave them (the probe found no GPU)."""
    text = f"{r.gpu or '-'} ({r.compute_capability or '-'})"
    filed = [k for k in ("gpu", "compute_capability") if r.sources.get(k) == "target file"]
    return f"target file: {text}" if filed else text


def failure(r: Row) -> str:
    """Why a failed row failed, in a word or two for its matrix cell (the full reason is its error): the
    cause of a connection failure, else the stage it stopped in (``gate``, ``build``, ...)."""
    return r.cause or r.failed_in or "error"


def _result(r: Row) -> str:
    """The matrix's last cell: the verdict, with how a resumed run got it or why the board did not run."""
    note = rerun_note(r)
    if r.passed:
        return f"passed ({note})" if note else "passed"
    if r.status == "skipped":
        return "skipped (max-fail)"
    if r.status == "interrupted":
        return f"interrupted ({r.error or 'Ctrl-C'})"
    return f"FAILED: {r.error or ''}" + (f" ({note})" if note else "")


def matrix(result: FleetResult) -> list[dict[str, str]]:
    """The matrix as text cells, in column order, for any renderer; the accuracy column only when the
    engines were run on a held-out set."""
    measured = any(r.accuracy for r in result.rows)
    return [
        {
            "target": r.target,
            "reachable": {True: "yes", False: "no", None: "-"}[r.reachable],
            "TensorRT": r.tensorrt or "-",
            "GPU (sm)": gpu_cell(r),
            "build": (r.build or "-") + (f"; placement {r.placement}" if r.placement else ""),
            "gate": {True: "passed", False: "FAILED", None: "-"}[r.gate],
            **({"accuracy": r.accuracy or "-"} if measured else {}),
            "p50 ms": text.ms(r.latency_p50_ms),
            "p99 ms": text.ms(r.latency_p99_ms),
            "qps": text.qps(r.throughput_qps),  # "2110", never "2.11e+03"
            "report": r.report or "-",
            "result": _result(r),
        }
        for r in result.rows
    ]


__all__: Sequence[str] = ("NOT_TRIED", "FleetOptions", "FleetResult", "Row", "junit_xml", "matrix",
                          "rerun_note", "validate", "validate_board")
