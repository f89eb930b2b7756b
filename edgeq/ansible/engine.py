"""``--engine ansible``: ``fleet validate`` and ``release install`` / ``rollback`` / ``fleet status`` with
each board a task of an Ansible play, run by ansible-runner. The command line, the host half, the bad-
input checks, the rows, the matrix, ``fleet.json``, JUnit and bundles are the native engine's; only who
runs the boards changes.

The fleet as edgeq read it becomes an inventory (``hostvars.inventory``: one host a target, in order, its
SSH access that target's, OpenSSH told to check host keys as edgeq does), and one play runs the
collection's module on every host (``edgeq.fleet.engine`` or ``edgeq.fleet.release``). The options map
onto Ansible's own keywords: ``--workers`` is ``forks``; ``--canary N`` is ``serial: [N, "100%"]`` with
``max_fail_percentage: 0`` (any canary failure ends the play, so no other board is touched).
``--max-fail N`` keeps edgeq's meaning, N failed boards in the whole run (Ansible's
``max_fail_percentage`` counts one batch at a time): each board's task reads the failures so far when it
starts, as the native pool does, and a board started after N is skipped.

Ctrl-C: edgeq's process asks the tasks to stop (``control.RunControl``: a file their waits look for):
a running board's remote command is killed there and its task ends "interrupted", a board not started
yet is not touched, an install switches no board after it; the play then runs out in seconds and each
row says what its board kept. A second Ctrl-C ends ansible-playbook itself.

The run's Ansible files (inventory, playbook, ansible-runner's artifacts) are kept under
``<fleet dir>/ansible/`` for ``fleet validate``; install's go with its temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

from edgeq.ansible import COLLECTIONS_PATH, require_ansible
from edgeq.ansible.control import RunControl
from edgeq.errors import EdgeqError
from edgeq.pipeline.rundir import slug
from edgeq.remote.targets import Target

PLAYBOOK = "edgeq.yml"
MODULES = ("edgeq.fleet.engine", "edgeq.fleet.release")
_RESULT_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped")


def check_options(options: Any) -> None:
    """What the Ansible engine does not run, said before any work (exit 2)."""
    from edgeq.pipeline.accuracy import wants_target_check

    require_ansible()
    if getattr(options, "auto", None) is not None:
        raise EdgeqError("--engine ansible places Q/DQ once on this machine; --placement auto (each board "
                         "kind decides) runs with --engine native",
                         "give --placement trt, or --engine native")  # fmt: skip
    quantize = getattr(options, "quantize", None)
    if quantize is not None and wants_target_check(quantize, getattr(options, "accuracy_gate", False)):
        raise EdgeqError("the accuracy check on the boards (--holdout, --min-cosine, --gate accuracy) runs "
                         "with --engine native", "drop it for --engine ansible, or use --engine native")


# -- fleet validate -------------------------------------------------------------------------------------
def validate_boards(fleet: Any, prepared: Any, fleet_dir: Path, options: Any, rows: list[Any],
                    priors: Mapping[str, Any], pool: Any, on_row: Callable[[Any], None]) -> None:  # fmt: skip
    """Each board of ``fleet`` a task of one play (``edgeq.fleet.engine``), its row filled from the task's
    result; ``pool.stop`` requested on Ctrl-C."""
    from edgeq.ansible.staging import save_prepared

    check_options(options)
    host_dir = Path(prepared.model_file).parent
    save_prepared(prepared, host_dir)
    p = options.profile
    task = {
        "prepared": str(host_dir.resolve()), "dest": str(Path(fleet_dir).resolve()),
        "gate": options.gate, "gate_allow": list(options.gate_allow),
        "gate_require_fusion": options.gate_require_fusion, "fp16": p.fp16, "iterations": p.iterations,
        "duration": p.duration, "min_shapes": p.shapes.min, "opt_shapes": p.shapes.opt,
        "max_shapes": p.shapes.max, "build_once_per_kind": options.build_once_per_kind,
        "previous": "{{ edgeq_previous | default(omit) }}",
    }  # fmt: skip
    task = {k: v for k, v in task.items() if v is not None}
    previous = {name: prior.board_dir for name, prior in priors.items()}
    results = run_play(Path(fleet_dir) / "ansible", fleet.targets, "edgeq.fleet.engine", task, rows, pool,
                       on_row, forks=pool.workers, max_fail=options.max_fail,
                       accept_new_host_key=options.accept_new_host_key, previous=previous,
                       name=f"edgeq fleet validate {Path(prepared.model_file).name}")  # fmt: skip
    for row in rows:
        _finish_row(row, results.get(row.target), not_started="interrupted", on_row=on_row,
                    error_when_not_started="not started" if pool.interrupted else None,
                    artifacts=Path(fleet_dir) / "ansible")  # fmt: skip


# -- release install / rollback / status ----------------------------------------------------------------
def install_boards(loaded: Any, work: Path, fleet: Any, targets: Sequence[Target], rows: list[Any],
                   result: Any, options: Any, pool: Any, on_row: Callable[[Any], None]) -> None:  # fmt: skip
    """``release install`` with each board a task (``edgeq.fleet.release``, state installed); ``--canary``
    as ``serial`` batches. ``loaded``: the bundle this process verified and unpacked into ``work``."""
    from edgeq.ansible.staging import save_loaded

    require_ansible()
    save_loaded(loaded, work)
    n = min(options.canary, len(targets))
    results = run_play(work / "ansible", tuple(targets), "edgeq.fleet.release",
                       _release_task("installed", options, loaded.bundle), rows, pool, on_row,
                       forks=pool.workers, max_fail=options.max_fail,
                       accept_new_host_key=options.accept_new_host_key, canary=n, staged=work,
                       name=f"edgeq release install {loaded.version}")  # fmt: skip
    # the canary boards' rows as their tasks last wrote them (a skipped task's result keeps no row)
    canary_failed = any((_row_of(results.get(r.target)).get("status") or r.status) != "installed"
                        for r in rows[:n])  # fmt: skip
    why = "interrupted" if pool.interrupted else "a canary board failed" if canary_failed else None
    for row in rows:
        _finish_row(row, results.get(row.target), not_started="not run", on_row=on_row,
                    error_when_not_started=f"not started: {why}" if why else None, artifacts=work / "ansible")
    result.stopped = canary_failed and not pool.interrupted


def release_boards(action: str, fleet: Any, targets: Sequence[Target], rows: list[Any], options: Any,
                   pool: Any, on_row: Callable[[Any], None]) -> None:  # fmt: skip
    """``release rollback`` / ``fleet status`` with each board a task (``edgeq.fleet.release``)."""
    require_ansible()
    state = "rolled_back" if action == "rollback" else "status"
    with tempfile.TemporaryDirectory(prefix=f"edgeq-{action}-") as tmp:
        results = run_play(Path(tmp) / "ansible", tuple(targets), "edgeq.fleet.release",
                           _release_task(state, options, None), rows, pool, on_row, forks=pool.workers,
                           max_fail=options.max_fail, accept_new_host_key=options.accept_new_host_key,
                           name=f"edgeq release {action}")  # fmt: skip
        for row in rows:
            _finish_row(row, results.get(row.target), not_started="not run", on_row=on_row,
                        error_when_not_started="not started: interrupted" if pool.interrupted else None,
                        artifacts=Path(tmp) / "ansible")  # fmt: skip


def _release_task(state: str, options: Any, bundle: Optional[Path]) -> dict[str, Any]:
    task: dict[str, Any] = {"state": state}
    if state == "installed":
        assert bundle is not None
        task.update(bundle=str(Path(bundle).resolve()), min_ratio=options.min_ratio,
                    iterations=options.profile.iterations, duration=options.profile.duration)  # fmt: skip
        if options.gate is not None:
            task["gate"] = options.gate
    return task


# -- the rows --------------------------------------------------------------------------------------------
def _row_of(result: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    return dict((result or {}).get("row") or {})


def _cells(row: Any) -> str:
    return json.dumps(asdict(row), sort_keys=True, default=str)


def _apply(row: Any, cells: Mapping[str, Any]) -> None:
    fields = set(getattr(row, "__dataclass_fields__", {}))
    for k, v in cells.items():
        if k in fields and k not in ("target", "destination"):
            setattr(row, k, v)


def _finish_row(row: Any, result: Optional[Mapping[str, Any]], *, not_started: str,
                error_when_not_started: Optional[str], artifacts: Path, on_row: Callable[[Any], None]
                ) -> None:  # fmt: skip
    """The row from its task's result (passed on when it says more than the live row did); a board
    Ansible never ran the task for: not started (Ctrl-C, a canary), or failed with what Ansible said."""
    before = _cells(row)
    cells = _row_of(result)
    if cells:
        _apply(row, cells)
    elif row.status not in ("pending", "running"):
        pass  # its task's last live record said how it ended (Ansible keeps no more of a skipped result)
    elif result is None and error_when_not_started is not None:
        row.status, row.error, row.stage = not_started, error_when_not_started, ""
        row.exit_code = 130 if not_started == "interrupted" else 1
    else:
        said = (result or {}).get("msg") or "Ansible ran no task for this board"
        row.status, row.stage, row.exit_code = "failed", "", 1
        row.error = f"{str(said).strip().splitlines()[0][:300]} (Ansible's log: {artifacts / 'artifacts'})"
    if _cells(row) != before:
        on_row(row)


# -- one play through ansible-runner --------------------------------------------------------------------
def run_play(private: Path, targets: Sequence[Target], module: str, args: Mapping[str, Any], rows: list[Any],
             pool: Any, on_row: Callable[[Any], None], *, forks: int, max_fail: Optional[int],
             accept_new_host_key: bool, name: str, canary: int = 0, staged: Optional[Path] = None,
             previous: Optional[Mapping[str, Path]] = None) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Run ``module`` with ``args`` on every target, ``forks`` at once (the first ``canary`` first); each
    host's result by host name. Live rows while it runs; Ctrl-C as the module docstring says."""
    import ansible_runner

    from edgeq.ansible.hostvars import GROUP, inventory

    private = private.resolve()  # ansible-runner runs from its project directory
    private.mkdir(parents=True, exist_ok=True)
    control = RunControl.create(private / "control",
                                {"max_fail": max_fail, "staged": str(staged) if staged else None})
    play: dict[str, Any] = {"name": name, "hosts": GROUP, "gather_facts": False,
                            "tasks": [{"name": module, module: dict(args)}]}  # fmt: skip
    if canary:
        play.update(serial=[canary, "100%"], max_fail_percentage=0)
    (private / "project").mkdir(exist_ok=True)
    (private / "inventory").mkdir(exist_ok=True)
    (private / "project" / PLAYBOOK).write_text(json.dumps([play], indent=2) + "\n")  # JSON is YAML
    hosts = private / "inventory" / "hosts.json"
    hosts.write_text(json.dumps(inventory(tuple(targets), accept_new_host_key, previous), indent=2) + "\n")
    # ssh's ControlPath (a socket: its path must be short), and ansible-runner's artifacts, whose "command"
    # file holds this process's whole environment (secrets of the user's among it): kept apart, and only
    # Ansible's own output and events copied into ``private/artifacts``
    cp_dir = _short_temp_dir()
    artifacts = Path(cp_dir) / "artifacts"
    results: dict[str, dict[str, Any]] = {}

    def handler(event: Mapping[str, Any]) -> bool:
        data = event.get("event_data") or {}
        if event.get("event") in _RESULT_EVENTS and data.get("task_action") == module and data.get("host"):
            results[str(data["host"])] = dict(data.get("res") or {})
        return True

    cancel = threading.Event()
    thread, runner = ansible_runner.run_async(
        private_data_dir=str(private), playbook=PLAYBOOK, inventory=str(hosts), forks=max(1, forks),
        envvars=_env(control, cp_dir), quiet=True, event_handler=handler, cancel_callback=cancel.is_set,
        suppress_env_files=True, ident="run", artifact_dir=str(artifacts),
        settings={"suppress_ansible_output": True, "pexpect_timeout": 1})  # fmt: skip
    by_slug = {slug(r.target): r for r in rows}
    shown: dict[str, str] = {}
    try:
        _wait(thread, control, pool, cancel, lambda: _live(control, by_slug, shown, on_row))
        _keep_log(artifacts / "run", private / "artifacts")
    finally:
        close_masters(Path(cp_dir))
        shutil.rmtree(cp_dir, ignore_errors=True)
    _live(control, by_slug, shown, on_row)
    if not results and getattr(runner, "status", None) not in ("successful",) and not pool.interrupted:
        tail = _stdout_tail(private)
        if tail:
            for r in rows:
                results.setdefault(r.target, {"msg": f"Ansible ended without running the task: {tail}"})
    return results


def _wait(thread: threading.Thread, control: RunControl, pool: Any, cancel: threading.Event,
          poll: Callable[[], None]) -> None:  # fmt: skip
    """Until the play ends; the first Ctrl-C asks the boards to stop, a second one ends ansible-playbook.
    Never ``join``: a KeyboardInterrupt inside ``Thread.join`` can leave the thread marked stopped while
    it runs on (CPython 3.11, bpo-45274's handling), and the play would be abandoned, not wound down."""
    while thread.is_alive():
        try:
            time.sleep(0.25)
            poll()
        except KeyboardInterrupt:
            if pool.stop.was_requested:
                cancel.set()
            control.request_stop()
            pool.stop.request()


def _live(control: RunControl, by_slug: Mapping[str, Any], shown: dict[str, str],
          on_row: Callable[[Any], None]) -> None:  # fmt: skip
    """Each board's row as its task last wrote it, passed on when it changed."""
    for key, cells in control.read_live().items():
        row = by_slug.get(key)
        now = json.dumps(cells, sort_keys=True, default=str)
        if row is None or shown.get(key) == now:
            continue
        shown[key] = now
        _apply(row, cells)
        on_row(row)


def _short_temp_dir() -> str:
    """A private temporary directory whose path leaves room for ssh's control socket in it: a socket path
    holds 107 bytes, and ssh adds a 40-character name and a 17-character suffix (TMPDIR may be long)."""
    path = tempfile.mkdtemp(prefix="edgeq-cp-")
    if len(path) <= 48 or not os.path.isdir("/tmp"):
        return path
    os.rmdir(path)
    return tempfile.mkdtemp(prefix="edgeq-cp-", dir="/tmp")


def close_masters(cp_dir: Path) -> None:
    """End the run's ssh master connections (ControlPersist would keep one a board open for a minute after
    edgeq exits); best effort."""
    import subprocess

    for sock in cp_dir.iterdir():
        if sock.is_socket():
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "edgeq-board"], timeout=10,
                           stdin=subprocess.DEVNULL, capture_output=True, check=False)  # fmt: skip


def _keep_log(run: Path, dest: Path) -> None:
    """Ansible's output and its events (the hosts' results) from ansible-runner's artifacts, nothing else."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("stdout", "rc", "status"):
        if (run / name).is_file():
            shutil.copyfile(run / name, dest / name)
    if (run / "job_events").is_dir():
        shutil.copytree(run / "job_events", dest / "job_events", dirs_exist_ok=True)


def _env(control: RunControl, cp_dir: str) -> dict[str, str]:
    """ansible-playbook's environment: this Python's Ansible first (the collection's plugins import edgeq
    from it), the collection, host keys checked, the run's control directory; nothing that holds a secret."""
    theirs = os.environ.get("ANSIBLE_COLLECTIONS_PATH")
    collections = os.pathsep.join([str(COLLECTIONS_PATH), *([theirs] if theirs else [])])
    callbacks = ",".join(filter(None, [os.environ.get("ANSIBLE_CALLBACKS_ENABLED"), "edgeq.fleet.preload"]))
    return {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)]),
        "ANSIBLE_CALLBACKS_ENABLED": callbacks,  # edgeq imported once, before the workers fork
        "ANSIBLE_COLLECTIONS_PATH": collections,
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_SSH_CONTROL_PATH_DIR": cp_dir,
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_PYTHON_INTERPRETER": "auto_silent",
        "EDGEQ_ANSIBLE_RUN": str(Path(str(control.root)).resolve()),
    }


def _stdout_tail(private: Path) -> str:
    try:
        text = (private / "artifacts" / "stdout").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-3:])[:400]
