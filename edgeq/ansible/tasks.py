"""The collection's three modules, on one board: what each action plugin calls, with the board's target,
its Ansible connection and the module's options.

Each runs the board work edgeq's fleet-wide commands run for that board, over ``connection.AnsibleRunner``:

- ``facts``: ship the agent (content-addressed), probe -> ``ansible_facts`` (``edgeq_*``);
- ``engine``: ``edgeq.orchestration.fleet.validate_board`` (upload, probe, build or reuse, inspect, profile,
  report, gate into ``<dest>/targets/<board>/``, resumed when an earlier record of the same inputs
  passed on a board that is still what it was): ``changed`` only when an engine was built;
- ``release``: ``edgeq.orchestration.install.run_board`` with ``install_step`` (compare-and-swap switch of
  ``current`` once the installed engine passed on the board), ``rollback_one`` or ``status_one``.

Each returns the module's result: the row edgeq's own outputs are made of (``row``, as ``fleet.json``
holds it) and the figures a playbook reads (layer precisions, reformats, the gate's verdict and reasons,
timings, the report files on this machine). A failing board is ``failed`` (an unreachable one too, so it
counts towards ``max_fail_percentage`` as towards ``--max-fail``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

from edgeq.ansible.connection import AnsibleRunner
from edgeq.ansible.control import RunControl
from edgeq.errors import EdgeqError
from edgeq.interrupt import Stop
from edgeq.remote.targets import Target


def connect_with(connection: Any) -> Callable[..., Any]:
    """``target_runner``'s signature over the task's Ansible connection (host keys: Ansible's ssh,
    told by the inventory or ``connection.check_host_key_policy``)."""

    @contextmanager
    def connect(target: Target, accept_new_host_key: bool = False, stop: Optional[Stop] = None
                ) -> Iterator[AnsibleRunner]:  # fmt: skip
        yield AnsibleRunner(connection, target, stop)

    return connect


def _agent() -> Any:
    from edgeq.remote.protocol import agent_cache_dir
    from edgeq.remote.zipapp import build_agent

    return build_agent(agent_cache_dir())


# -- facts -----------------------------------------------------------------------------------------------
def facts(connection: Any, target: Target, control: RunControl) -> dict[str, Any]:
    """What the probe says of the board, as ``ansible_facts`` (``edgeq_`` names)."""
    from edgeq.pipeline.stages import direct_agent, probe_from_facts

    agent = _agent()
    runner = AnsibleRunner(connection, target, control.stop())
    up = runner.put(agent.path, target.remote_path("cache"))
    raw = direct_agent(runner, target, up.remote_path)("probe", f"--workDir={target.remote_path('runs')}",
                                                       timeout=target.timeouts.command)  # fmt: skip
    found = probe_from_facts(raw, target)
    return {"changed": False, "ansible_facts": {FACT: facts_of(found)}, "msg": found.describe()}


# One fact, a mapping: the inventory's edgeq_<key> variables are target-file keys (edgeq_gpu, edgeq_tensorrt,
# edgeq_python), and a fact of the same name would take their place for the board's next task.
FACT = "edgeq_board"


def facts_of(found: Any) -> dict[str, Any]:
    """A ``Probe`` as the facts a playbook reads: TensorRT, GPU and compute capability, kind, L4T and its
    JetPack, DLA cores, disk, power mode, CUDA, driver, Python."""
    from edgeq.release.jetpack import jetpack_for, l4t_of

    raw = found.facts
    trt = raw.get("tensorrt") or {}
    jetson = (raw.get("platform") or {}).get("jetson") or {}
    dla = trt.get("num_DLA_cores")
    l4t = l4t_of(raw)
    return {
        "tensorrt": found.tensorrt,
        "gpu": found.gpu,
        "compute_capability": found.compute_capability,
        "kind": found.kind,
        "gpus": list(raw.get("gpus") or []),
        "sources": dict(found.sources),
        "l4t": l4t,
        "jetpack": jetpack_for(l4t),
        "jetson": jetson or None,
        # TensorRT's own count where the backend can ask it (python), else the DLA device nodes L4T shows
        "dla_cores": dla if isinstance(dla, int) else jetson.get("dla_device_nodes"),
        "disk": asdict(found.disk) if found.disk is not None else None,
        "power_mode": raw.get("power_mode"),
        "cuda": raw.get("cuda"),
        "driver": raw.get("driver"),
        "python": (raw.get("python") or {}).get("version"),
        "backend": trt.get("via") or "python",  # the agent backend that answered
    }


# -- engine ----------------------------------------------------------------------------------------------
def fleet_options(params: Mapping[str, Any], model_file: Path) -> Any:
    """The module's options as ``fleet validate``'s (its gate, build and profile settings)."""
    from edgeq.orchestration.fleet import FleetOptions
    from edgeq.pipeline.shapes import Shapes, resolve_shapes
    from edgeq.pipeline.stages import ProfileSettings

    mn, opt, mx = (str(params.get(f"{k}_shapes") or "") for k in ("min", "opt", "max"))
    given = Shapes(mn, opt, mx)
    profile = ProfileSettings(fp16=params.get("fp16"), iterations=int(params.get("iterations", 10)),
                              duration=float(params.get("duration", 3.0)),
                              shapes=resolve_shapes(model_file, given))  # fmt: skip
    return FleetOptions(gate=params.get("gate"), gate_allow=tuple(params.get("gate_allow") or ()),
                        gate_require_fusion=params.get("gate_require_fusion"), profile=profile,
                        build_once_per_kind=bool(params.get("build_once_per_kind")))  # fmt: skip


def prepared_for(params: Mapping[str, Any], dest: Path) -> Any:
    """The run's prepared model: the directory edgeq prepared (``prepared``), else ``model`` prepared once
    for the play into ``<dest>/prepared/``."""
    from edgeq.ansible.staging import prepare_once, read_prepared

    if params.get("prepared"):
        return read_prepared(Path(params["prepared"]))
    if not params.get("model"):
        raise EdgeqError("give 'model' (an ONNX file) or 'prepared' (a directory edgeq prepared)")
    cache = Path(params["calib_cache"]) if params.get("calib_cache") else None
    return prepare_once(Path(params["model"]), cache, dest / "prepared")


def engine(connection: Any, target: Target, params: Mapping[str, Any], control: RunControl,
           check_mode: bool = False) -> dict[str, Any]:  # fmt: skip
    """Validate the model on the board into ``<dest>/targets/<board>/``; the module's result."""
    from edgeq.ansible.kinds import KindFiles
    from edgeq.fs import sha256_file
    from edgeq.orchestration import resume
    from edgeq.orchestration.deploy import policy_for
    from edgeq.orchestration.fleet import validate_board
    from edgeq.orchestration.pool import BoardPool

    dest = Path(params["dest"])
    prepared = prepared_for(params, dest)
    options = fleet_options(params, prepared.model_file)
    policy_for(target, options.gate, options.gate_allow, options.gate_require_fusion)  # said before any SSH
    digest = ":".join(sha256_file(p) for p in (prepared.model_file, prepared.cache_file) if p)
    settings = options.settings()
    key = resume.board_key(target, digest, settings)
    board = resume.board_dir(dest, target.name)
    previous = Path(params["previous"]) if params.get("previous") else board
    prior = resume.priors([previous.parent.parent], [target.name]).get(target.name)
    if check_mode:
        return _engine_check(connection, target, control, prior, key)
    pool = BoardPool(1, control.max_fail, stop=control.stop(), failures=control.failures())
    shared = KindFiles(dest / "kinds", digest, settings) if options.build_once_per_kind else None
    row = validate_board(target, prepared, dest, options, key=key, prior=prior, pool=pool, agent=_agent(),
                         shared=shared, connect=connect_with(connection), on_row=control.live)  # fmt: skip
    if row.status == "failed":
        control.record_failure(target.name)
    return engine_result(row)


def _engine_check(connection: Any, target: Target, control: RunControl, prior: Any, key: str
                  ) -> dict[str, Any]:  # fmt: skip
    """Check mode: would an engine be built? Not when the board's earlier record has these inputs and
    the board, probed now, is what it was (nothing is built or timed; the agent goes to its cache)."""
    from edgeq.orchestration import resume
    from edgeq.pipeline.stages import direct_agent, probe

    if prior is None or not prior.reusable(key):
        why = "no earlier record" if prior is None else "its earlier record did not pass with these inputs"
        return {"changed": True, "status": "would build", "msg": f"an engine would be built ({why})"}
    runner = AnsibleRunner(connection, target, control.stop())
    up = runner.put(_agent().path, target.remote_path("cache"))
    found = probe(direct_agent(runner, target, up.remote_path), target)
    changed = resume.changed_facts(prior.recorded_facts(target), resume.board_facts(found))
    if changed is not None:
        return {"changed": True, "status": "would build", "msg": f"an engine would be built ({changed})"}
    return {"changed": False, "status": "passed", "row": dict(prior.row),
            "msg": f"passed with these inputs in {prior.run}: nothing to build"}


def engine_result(row: Any) -> dict[str, Any]:
    """The module's result for a board's row: ``changed`` only when an engine was built on it."""
    out: dict[str, Any] = {
        "changed": row.build == "ok" and not row.reused_from,  # a resumed row keeps the build it reports
        "status": row.status,
        "row": asdict(row),
        "build": row.build,
        "engine": {"kind": row.kind, "tensorrt": row.tensorrt, "gpu": row.gpu,
                   "compute_capability": row.compute_capability},
        "timings": {"latency_p50_ms": row.latency_p50_ms, "latency_p99_ms": row.latency_p99_ms,
                    "throughput_qps": row.throughput_qps, "seconds": row.seconds},
    }
    board = Path(row.run_dir) if row.run_dir else None
    if board is not None:
        names = ("report.html", "report.json", "layers.json", "profile.json", "engine.plan", "stages.json",
                 "deploy.log")
        out["files"] = {name: str(board / name) for name in names if (board / name).is_file()}
        out.update(_report_figures(board))
        timings = _read_json(board / "timings.json") or {}
        out["timings"]["build_seconds"] = timings.get("build_seconds")
    if row.status == "skipped":  # --max-fail reached before it started: not tried, not failed
        out.update(skipped=True, msg=f"{row.target}: {row.error}")
    elif row.status != "passed":
        out["failed"] = True
        out["msg"] = f"{row.target}: {row.status}: {row.error or row.gate_summary or 'failed'}"
    else:
        out["msg"] = f"{row.target}: passed" + (f" ({row.gate_summary})" if row.gate_summary else "")
    return out


def _read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _report_figures(board: Path) -> dict[str, Any]:
    """Layer precisions, reformats and the gate's verdict and reasons, from the board's report.json."""
    report = _read_json(board / "report.json")
    if report is None:
        return {}
    layers = report.get("layers") or []
    summary = report.get("summary") or {}
    by_index = {la.get("index"): la for la in layers}

    def named(indices: Any) -> list[dict[str, Any]]:
        return [{"index": i, "name": (by_index.get(i) or {}).get("name")} for i in indices or []]

    gate = report.get("gate") or {}
    return {
        "precisions": summary.get("compute_precisions"),
        "layers": [{"name": la.get("name"), "kind": la.get("kind"), "precision": la.get("precision")}
                   for la in layers],
        "reformats": {"boundary": named(summary.get("boundary_reformats")),
                      "interior": named(summary.get("interior_reformats"))},
        "gate": {"passed": gate.get("passed"), "policy": (gate.get("policy") or {}).get("name"),
                 "summary": gate.get("summary"), "violations": gate.get("violations") or [],
                 "allowed": gate.get("allowed") or []},
    }


# -- release ---------------------------------------------------------------------------------------------
STATES = ("installed", "rolled_back", "status")


def release(connection: Any, target: Target, params: Mapping[str, Any], control: RunControl,
            check_mode: bool = False) -> dict[str, Any]:  # fmt: skip
    """Install, roll back or read the board's release (``state``); the module's result."""
    from edgeq.orchestration.install import (
        BoardRow,
        InstallOptions,
        install_step,
        rollback_one,
        run_board,
        status_one,
    )
    from edgeq.orchestration.pool import BoardPool
    from edgeq.pipeline.stages import ProfileSettings

    state = params.get("state") or "installed"
    profile = ProfileSettings(iterations=int(params.get("iterations", 10)),
                              duration=float(params.get("duration", 3.0)))
    options = InstallOptions(gate=params.get("gate"), min_ratio=float(params.get("min_ratio", 0.9)),
                             profile=profile)
    row = BoardRow(target.name, f"{target.user}@{target.host}:{target.port}")
    pool = BoardPool(1, control.max_fail, stop=control.stop(), failures=control.failures())
    loaded = _loaded(params, control) if state == "installed" else None
    if loaded is not None:
        row.version = loaded.version
    check: dict[str, Any] = {}
    if check_mode:
        fn, ok = _check_step(state, loaded, check), "ok"
    elif state == "installed":
        assert loaded is not None
        fn, ok = install_step(loaded, options, _work(params, control)), "installed"
    else:
        fn, ok = (rollback_one if state == "rolled_back" else status_one), "ok"
    run_board(fn, target, row, pool, options, ok=ok, connect=connect_with(connection), on_row=control.live)
    if row.status == "failed":
        control.record_failure(target.name)
    return release_result(state, row, check)


def _loaded(params: Mapping[str, Any], control: RunControl) -> Any:
    """The bundle: the one edgeq's install already verified and unpacked, else verified and unpacked
    once for the play (``allowed_signers``: only bundles its keys signed)."""
    from edgeq.ansible.staging import read_loaded, stage_bundle

    staged = control.settings.get("staged")
    if staged:
        return read_loaded(Path(staged))
    if not params.get("bundle"):
        raise EdgeqError("state installed needs 'bundle' (the release bundle, .tar.gz)")
    signers = Path(params["allowed_signers"]) if params.get("allowed_signers") else None
    return stage_bundle(Path(params["bundle"]), signers, _bundle_cache())


def _bundle_cache() -> Path:
    from edgeq.remote.protocol import agent_cache_dir

    return agent_cache_dir().parent / "bundles"


def _work(params: Mapping[str, Any], control: RunControl) -> Path:
    """Where install keeps what it fetches back (the layers of the engine it checked)."""
    staged = control.settings.get("staged")
    work = Path(staged) if staged else _bundle_cache() / "work"
    work.mkdir(parents=True, exist_ok=True)
    return work


def _check_step(state: str, loaded: Any, said: dict[str, Any]) -> Callable[[Any], None]:
    """Check mode: read the board's release (and, for an install, which engine fits it); change nothing."""
    from edgeq.orchestration.install import pick_engine
    from edgeq.pipeline.stages import probe

    def step(board: Any) -> None:
        board.update(stage="status")
        got = board.agent("status")
        current, previous = got.get("current"), got.get("previous")
        board.update(previous=current, seen=True)
        if state == "installed":
            board.update(stage="probe")
            found = probe(board.call, board.target)
            kind = pick_engine(loaded, board.target, found.compute_capability, found.tensorrt, found.gpu)
            board.update(kind=kind)
            said.update(changed=current != loaded.version,
                        msg=f"would install {loaded.version} ({kind}) over {current or '(none)'}")
        elif state == "rolled_back":
            if not previous:
                raise EdgeqError(f"{board.target.name}: no earlier version to roll back to", exit_code=1)
            said.update(changed=True, msg=f"would roll back {current} -> {previous}")
            board.update(version=previous)
        else:
            board.update(version=current)
            said.update(changed=False, msg=f"current {current or '(none)'}")

    return step


def release_result(state: str, row: Any, check: Mapping[str, Any]) -> dict[str, Any]:
    from edgeq.orchestration.install import kept

    if check:
        changed = bool(check.get("changed"))
    elif state == "installed":
        changed = bool(row.switched)
    else:
        changed = state == "rolled_back" and row.ok
    moved = not check and ((row.ok and state != "installed") or bool(row.switched))
    current = row.version if moved else row.previous  # else: as read at the start, and not changed
    out: dict[str, Any] = {"changed": changed, "status": row.status,
                           "row": {**asdict(row), "kept": kept(row)}, "current": current,
                           "previous": row.previous, "kind": row.kind, "gate": row.gate,
                           "throughput_qps": row.throughput_qps, "ratio": row.ratio}  # fmt: skip
    if row.status == "skipped":  # --max-fail reached before it started: not tried, not failed
        out.update(skipped=True, msg=f"{row.target}: {row.error}; {kept(row)}")
    elif not row.ok:
        out["failed"] = True
        said = kept(row)
        out["msg"] = f"{row.target}: {row.status}: {row.error or 'failed'}" + (f"; {said}" if said else "")
    else:
        out["msg"] = str(check.get("msg") or f"{row.target}: {row.status} {row.version or ''}".strip())
    return out
