"""The edgeq.fleet collection as a playbook author meets it (issue 44): ``ansible-doc`` renders every module
with the options its action plugin takes, ``ansible-lint`` passes its production profile, the playbook in
the collection runs as written, and the modules are idempotent, check-mode aware and refuse a connection
that does not verify host keys. Real ansible-core and ansible-runner; real sshd on 127.0.0.1 whose
trtexec replays the recorded TensorRT 8.6.0 run (tests/fleet_helpers.py)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from fleet_helpers import builds, make_bundle, make_members, qdq_model, reformat_layer

pytest.importorskip("ansible_runner", reason="the collection's tests need edgeq's 'ansible' extra")

from edgeq.ansible import COLLECTION_DIR, COLLECTIONS_PATH

MODULES = ("facts", "engine", "release")
BIN = Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS_PATH), "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "False", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            **extra}  # fmt: skip


def _specs() -> dict[str, dict[str, Any]]:
    """The argument specs the action plugins validate with (module_utils/specs.py), read as Ansible does."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("specs", COLLECTION_DIR / "plugins/module_utils/specs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {m: getattr(module, m.upper()) for m in MODULES}


def test_ansible_doc_renders_every_module_with_the_options_its_plugin_takes():
    specs = _specs()
    listed = subprocess.run([BIN / "ansible-doc", "-l", "edgeq.fleet"], env=_env(), capture_output=True,
                            text=True, check=True).stdout  # fmt: skip
    names = sorted(ln.split()[0] for ln in listed.splitlines() if ln.strip())
    assert names == sorted(f"edgeq.fleet.{m}" for m in MODULES)
    for m in MODULES:
        res = subprocess.run([BIN / "ansible-doc", "-j", f"edgeq.fleet.{m}"], env=_env(), capture_output=True,
                             text=True)  # fmt: skip
        assert res.returncode == 0 and "ERROR" not in res.stderr, res.stderr
        doc = json.loads(res.stdout)[f"edgeq.fleet.{m}"]
        options = doc["doc"].get("options") or {}
        assert set(options) == set(specs[m]), m  # documented = validated, no option more or less
        for name, spec in specs[m].items():
            assert options[name]["type"] == spec["type"], (m, name)
            assert options[name].get("default") == spec.get("default"), (m, name)
            assert options[name].get("choices") == spec.get("choices"), (m, name)
        assert doc["doc"]["attributes"]["check_mode"]["support"] == "full"
        assert doc["return"] and yaml.safe_load(doc["examples"])  # RETURN documented, EXAMPLES valid YAML
        text = subprocess.run([BIN / "ansible-doc", f"edgeq.fleet.{m}"], env=_env(), capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
        assert "EXAMPLES:" in text and "RETURN VALUES:" in text


@pytest.mark.slow
def test_the_collection_passes_ansible_lint_production_profile(tmp_path):
    if shutil.which("ansible-lint", path=str(BIN)) is None:
        pytest.skip("ansible-lint is not installed (edgeq's 'ansible' extra)")
    copy = tmp_path / "ansible_collections" / "edgeq" / "fleet"
    shutil.copytree(COLLECTION_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    env = _env(ANSIBLE_COLLECTIONS_PATH=str(tmp_path), HOME=str(tmp_path),
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    res = subprocess.run([BIN / "ansible-lint", "--offline", "--nocolor", "--profile", "production", "."],
                         cwd=copy, env=env, capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Profile 'production' was required, and it passed" in res.stdout + res.stderr


# -- plays against loopback boards ------------------------------------------------------------------------
def _inventory(root: Path, members: list, group: str = "jetsons", **host_extra: Any) -> Path:
    """The boards as a user's inventory: access, edgeq_* target keys, strict host keys for OpenSSH."""
    hosts = {}
    for m in members:
        t = m.target_dict()
        strict = f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={t['known_hosts']}"
        hosts[m.name] = {
            "ansible_host": t["host"], "ansible_port": t["port"], "ansible_user": t["user"],
            "ansible_ssh_private_key_file": t["identity_file"],
            "ansible_ssh_common_args": strict, "edgeq_known_hosts": t["known_hosts"],
            "edgeq_work_dir": t["work_dir"], "edgeq_python": t["python"],
            "edgeq_backend": "trtexec", "edgeq_trtexec": t["trtexec"], "edgeq_tensorrt": "8.6",
            "edgeq_gpu": t["gpu"], **host_extra.get(m.name, {}),
        }  # fmt: skip
    inv = root / "inventory.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {group: {"hosts": hosts}}}}))
    return inv


def _play(root: Path, inventory: Path, playbook: str | Path, *args: str, **env: str
          ) -> tuple[int, list[str], dict[str, list[dict]]]:  # fmt: skip
    """ansible-playbook through ansible-runner (which collects each task's result): (exit code, the plays
    started, a batch each, and each host's task results in order, with the module that gave each)."""
    import ansible_runner

    plays: list[str] = []
    results: dict[str, list[dict]] = {}

    def handler(event: dict) -> bool:
        data = event.get("event_data") or {}
        if event.get("event") == "playbook_on_play_start":
            plays.append(str(data.get("name") or data.get("play")))
        if event.get("event") in ("runner_on_ok", "runner_on_failed", "runner_on_skipped") and "host" in data:
            results.setdefault(data["host"], []).append({"action": data.get("task_action"), **data["res"]})
        return True

    private = root / f"ansible-{len(list(root.glob('ansible-*')))}"
    private.mkdir()
    # ansible-runner turns host key checking off unless told (Ansible's own default is on): told here
    env = {k: v for k, v in _env(**{"ANSIBLE_HOST_KEY_CHECKING": "True", **env}).items()
           if k.startswith(("ANSIBLE_", "PATH"))}  # fmt: skip
    r = ansible_runner.run(private_data_dir=str(private), playbook=str(playbook), inventory=str(inventory),
                           cmdline=shlex.join(args), envvars=env, quiet=True, event_handler=handler,
                           suppress_env_files=True)  # fmt: skip
    return r.rc, plays, results


def _current(member) -> str | None:
    link = member.work_dir / "releases" / "current"
    return os.readlink(link) if os.path.islink(link) else None


@pytest.mark.sshd
@pytest.mark.slow
def test_the_collections_playbook_as_written_gates_then_installs_in_canary_batches(boards, servers,
                                                                                    monkeypatch):  # fmt: skip
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    root = boards
    members = make_members(root, servers)
    allow = {"edgeq_gate": {"allow": [reformat_layer()]}}
    model = qdq_model(root / "net.onnx")
    bundle, version = make_bundle(root, "v1", created="2026-01-01T00:00:00Z", engine_mib=1)
    playbook = "edgeq.fleet.validate_and_install"  # the collection's own file, run by its name
    args = ("-e", f"model={model}", "-e", f"bundle={bundle}", "-e", f"runs={root / 'runs'}")

    # board2's engine fails the gate (its one interior reformat not allowlisted): nothing is installed
    inv = _inventory(root, members, board1=allow, board3=allow)
    code, _, results = _play(root, inv, playbook, *args)
    assert code != 0, results
    engine = {h: next(r for r in rs if r["action"] == "edgeq.fleet.engine") for h, rs in results.items()
              if any(r["action"] == "edgeq.fleet.engine" for r in rs)}
    assert set(engine) == {"board1", "board2", "board3"}, results
    assert engine["board2"].get("status") == "failed", engine["board2"]
    assert engine["board2"]["gate"]["passed"] is False
    assert engine["board2"]["gate"]["violations"][0]["layer_name"] == reformat_layer()
    assert not any(r["action"] == "edgeq.fleet.release" for rs in results.values() for r in rs)
    assert [_current(m) for m in members] == [None] * 3

    inv = _inventory(root, members, **{m.name: allow for m in members})
    code, plays, results = _play(root, inv, playbook, *args)
    assert code == 0, results
    assert [_current(m) for m in members] == [version] * 3
    batches = [p for p in plays if p.startswith("Install the release")]
    assert len(batches) == 3  # serial: 1, then 50%, then the rest: one board each
    for host, rs in results.items():
        facts = next(r for r in rs if r["action"] == "edgeq.fleet.facts")
        assert facts["ansible_facts"]["edgeq_board"]["kind"] == "sm9.0-trt8.6.0"
        engine = next(r for r in rs if r["action"] == "edgeq.fleet.engine")
        assert engine["status"] == "passed" and engine["gate"]["passed"] is True
        assert engine["precisions"]["INT8"] > 0 and Path(engine["files"]["report.html"]).is_file()
        assert Path(engine["files"]["report.html"]).parent == root / "runs" / "targets" / host
        release = next(r for r in rs if r["action"] == "edgeq.fleet.release")
        assert release["changed"] is True and release["current"] == version
    # the gate run's passed boards were reused by this run: the play built one engine for the kind in all
    assert sum(builds(m) for m in members) == 1


@pytest.mark.sshd
@pytest.mark.slow
def test_engine_is_idempotent_and_check_mode_builds_nothing(boards, servers):
    root = boards
    members = make_members(root, servers[:1])
    inv = _inventory(root, members, board1={"edgeq_gate": {"allow": [reformat_layer()]}})
    model = qdq_model(root / "net.onnx")
    playbook = root / "engine.yml"
    playbook.write_text(yaml.safe_dump([{"name": "engine", "hosts": "jetsons", "gather_facts": False,
                                         "tasks": [{"name": "Engine", "edgeq.fleet.engine": {
                                             "model": str(model), "dest": str(root / "runs"),
                                             "duration": 0}}]}]))  # fmt: skip

    def engine(*args: str) -> dict:
        code, _, results = _play(root, inv, playbook, *args)
        assert code == 0, results
        return results["board1"][0]

    first = engine("--check")
    assert first["changed"] is True and "would be built" in first["msg"] and builds(members[0]) == 0
    built = engine()
    assert built["changed"] is True and built["build"] == "ok" and builds(members[0]) == 1
    again = engine()
    assert again["changed"] is False, again
    assert again["row"]["reused_from"] and builds(members[0]) == 1
    assert engine("--check")["changed"] is False


@pytest.mark.sshd
@pytest.mark.slow
def test_release_module_is_idempotent_and_its_check_mode_switches_nothing(boards, servers, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    root = boards
    members = make_members(root, servers[:1])
    inv = _inventory(root, members, board1={"edgeq_gate": {"allow": [reformat_layer()]}})
    bundle, version = make_bundle(root, "v1", created="2026-01-01T00:00:00Z", engine_mib=1)

    def release(state: str, *args: str) -> dict:
        playbook = root / f"{state}.yml"
        task = {"state": state, "duration": 0, **({"bundle": str(bundle)} if state == "installed" else {})}
        playbook.write_text(yaml.safe_dump([{"name": state, "hosts": "jetsons", "gather_facts": False,
                                             "tasks": [{"name": state, "edgeq.fleet.release": task}]}]))
        code, _, results = _play(root, inv, playbook, *args)
        return {"code": code, **results["board1"][0]}

    would = release("installed", "--check")
    assert (would["code"], would["changed"], _current(members[0])) == (0, True, None)
    assert would["msg"].startswith(f"would install {version} (sm9.0-trt8.6.0) over (none)")
    done = release("installed")
    assert (done["code"], done["changed"], done["current"]) == (0, True, version)
    assert _current(members[0]) == version
    again = release("installed")  # checked on the board again, current already points at it
    assert (again["code"], again["changed"], again["current"]) == (0, False, version)
    status = release("status", "--check")
    assert (status["changed"], status["current"]) == (False, version)
    back = release("rolled_back")  # no version before it: fails, and current is left where it was
    assert back["code"] != 0 and back["status"] == "failed" and _current(members[0]) == version, back
    assert "no earlier version installed to roll back to" in back["msg"]


def _python_on(root: Path, board_root: Path) -> str:
    wrapper = root / "python-fake-board"
    wrapper.write_text(f'#!/bin/sh\nEDGEQ_PROBE_ROOT={board_root} exec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


@pytest.mark.sshd
def test_facts_say_l4t_jetpack_and_the_power_mode_of_the_board(boards, servers):
    from test_board_facts import fake_board

    root = boards
    members = make_members(root, servers[:1])
    board = fake_board(root / "fs")
    (board / "var/lib/nvpmodel").mkdir(parents=True)
    (board / "var/lib/nvpmodel/status").write_text("pmode:0002 fmode:quiet\n")
    (board / "etc/nvpmodel.conf").write_text("< POWER_MODEL ID=0 NAME=MAXN >\nCPU_ONLINE CORE_0 1\n"
                                             "< POWER_MODEL ID=2 NAME=30W >\n< PM_CONFIG DEFAULT=2 >\n")
    inv = _inventory(root, members, board1={"edgeq_python": _python_on(root, board)})
    playbook = root / "facts.yml"
    playbook.write_text(yaml.safe_dump([{"name": "facts", "hosts": "jetsons", "gather_facts": False,
                                         "tasks": [{"name": "Facts", "edgeq.fleet.facts": None}]}]))
    code, _, results = _play(root, inv, playbook, "--check")  # check mode: facts read all the same
    assert code == 0, results
    board = results["board1"][0]["ansible_facts"]["edgeq_board"]
    assert (board["l4t"], board["jetpack"]) == ("36.2.0", "6.0 DP")
    assert board["power_mode"] == {"id": 2, "name": "30W", "default": 2}
    assert (board["tensorrt"], board["kind"]) == ("8.6.0", "sm9.0-trt8.6.0")
    assert board["cuda"]["toolkit"] == "12.2.140"
    assert board["disk"]["free_bytes"] > 0 and board["driver"] == "540.2.0"


@pytest.mark.sshd
def test_modules_refuse_a_connection_that_does_not_verify_host_keys(boards, servers):
    root = boards
    members = make_members(root, servers[:1])
    playbook = root / "facts.yml"
    playbook.write_text(yaml.safe_dump([{"name": "facts", "hosts": "jetsons", "gather_facts": False,
                                         "tasks": [{"name": "Facts", "edgeq.fleet.facts": None}]}]))
    loose = _inventory(root, members, board1={"ansible_ssh_common_args": "-o StrictHostKeyChecking=no"})
    code, _, results = _play(root, loose, playbook)
    said = results["board1"][0]["msg"]
    assert code != 0 and "turn host key checking off (StrictHostKeyChecking=no)" in said
    code, _, results = _play(root, _inventory(root, members), playbook, ANSIBLE_HOST_KEY_CHECKING="False")
    assert code != 0 and "host_key_checking is off" in results["board1"][0]["msg"]
    assert not (members[0].work_dir / "cache").exists()  # nothing was sent to the board
    # and a changed key is refused by OpenSSH itself, never accepted (a new session: ssh's ControlPersist
    # would reuse a connection opened, and checked, before the key changed)
    another = Path(str(members[0].server.identity_file) + ".pub").read_text()  # a key, not the board's
    Path(members[0].server.known_hosts).write_text(f"[127.0.0.1]:{members[0].server.port} {another}")
    fresh = tempfile.mkdtemp(prefix="edgeq-test-cp-", dir="/tmp")  # a socket's path must be short
    try:
        inv = _inventory(root, members)
        code, _, results = _play(root, inv, playbook, ANSIBLE_SSH_CONTROL_PATH_DIR=fresh)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    assert code != 0 and "has CHANGED" in results["board1"][0]["msg"]
