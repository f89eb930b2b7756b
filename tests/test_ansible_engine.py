"""``--engine ansible`` against the native engine on the same loopback fleet (issue 44): real ansible-core
and ansible-runner, real OpenSSH sshd on 127.0.0.1 (tests/fleet_helpers.py, one sshd a board, whose trtexec
replays the recorded TensorRT 8.6.0 run). The engines must give the same verdicts, rows, JUnit and
``current`` on every board; only who runs the boards differs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from fleet_helpers import builds, make_bundle, make_members, qdq_model, reformat_layer, write_fleet

pytest.importorskip("ansible_runner", reason="the Ansible engine needs edgeq's 'ansible' extra")

# What a fleet row must say alike under both engines (not how long it took, nor where its files are).
VERDICT = ("status", "reachable", "cause", "exit_code", "gate", "build", "tensorrt", "gpu",
           "compute_capability", "kind", "latency_p50_ms", "throughput_qps")  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mixed_fleet(root: Path, servers: list) -> tuple[Path, list]:
    """board1 passes; board2 fails its gate (no allowlist for the recorded engine's reformat); board3's
    known_hosts holds another key for it (a changed host key); board4 is a port nothing listens on."""
    from sshd import keygen

    members = make_members(root, servers)
    allow = reformat_layer()
    (root / "targets").mkdir(exist_ok=True)
    for m in members:
        extra = {"gate": {"allow": [allow]}} if m.name != "board2" else {}
        (root / "targets" / f"{m.name}.yaml").write_text(yaml.safe_dump(m.target_dict(**extra)))
    other = keygen(root / "other_host_key")
    kind, blob = Path(str(other) + ".pub").read_text().split()[:2]
    changed = root / "known_hosts_board3"
    changed.write_text(f"[127.0.0.1]:{servers[2].port} {kind} {blob}\n")
    b3 = yaml.safe_load((root / "targets" / "board3.yaml").read_text())
    (root / "targets" / "board3.yaml").write_text(yaml.safe_dump({**b3, "known_hosts": str(changed)}))
    b4 = {**members[0].target_dict(gate={"allow": [allow]}), "port": _free_port(),
          "work_dir": str(root / "remote-board4")}  # fmt: skip
    (root / "targets" / "board4.yaml").write_text(yaml.safe_dump(b4))
    fleet = root / "fleet.yaml"
    fleet.write_text("workers: 4\ntargets:\n  - targets/board*.yaml\n")
    return fleet, members


def _verdicts(out: str) -> dict[str, dict]:
    return {r["target"]: {k: r[k] for k in VERDICT} for r in json.loads(out)["targets"]}


def _junit(path: Path) -> dict[str, tuple]:
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    cases = {}
    for tc in suite.findall("testcase"):
        failure, skipped = tc.find("failure"), tc.find("skipped")
        cases[tc.get("name")] = (failure.get("type") if failure is not None else None, skipped is not None)
    return {"counts": tuple(suite.get(k) for k in ("tests", "failures", "skipped", "errors")), **cases}


@pytest.mark.sshd
@pytest.mark.slow
def test_both_engines_give_the_same_rows_and_junit_for_pass_fail_changed_key_and_unreachable(
        boards, servers, cli, no_backoff):  # fmt: skip
    root = boards
    fleet, members = _mixed_fleet(root, servers)
    model = qdq_model(root / "net.onnx")
    outs, dirs = {}, {}
    for engine in ("native", "ansible"):
        code, out, err = cli("fleet", "validate", model, "--fleet", fleet, "--json", "--duration", "0",
                             "--fresh", "--engine", engine, "--junit", root / f"{engine}.xml")  # fmt: skip
        assert "Traceback" not in out + err, err
        assert code == 2, (engine, out, err)  # a changed host key is the user's to fix: exit 2, as in deploy
        outs[engine], dirs[engine] = _verdicts(out), Path(json.loads(out)["fleet_dir"])
    native, ansible = outs["native"], outs["ansible"]
    assert native == ansible
    assert native["board1"]["status"] == "passed" and native["board1"]["gate"] is True
    assert (native["board2"]["status"], native["board2"]["gate"], native["board2"]["reachable"]) == \
        ("failed", False, True)  # fmt: skip
    assert (native["board3"]["cause"], native["board3"]["reachable"], native["board3"]["exit_code"]) == \
        ("host key changed", True, 2)  # fmt: skip
    assert (native["board4"]["cause"], native["board4"]["reachable"]) == ("connection refused", False)
    assert _junit(root / "native.xml") == _junit(root / "ansible.xml")
    assert _junit(root / "native.xml")["board2"] == ("gate", False)

    # the same files in each board's run directory (the Ansible engine's tasks write them where edgeq does)
    for b in ("board1", "board2"):
        assert sorted(p.name for p in (dirs["native"] / "targets" / b).iterdir()) == \
            sorted(p.name for p in (dirs["ansible"] / "targets" / b).iterdir())  # fmt: skip
    # the changed key was refused by Ansible's ssh itself (OpenSSH), never accepted; both say which key
    said = {e: next(r["error"] for r in json.loads((d / "fleet.json").read_text())["targets"]
                    if r["target"] == "board3") for e, d in dirs.items()}  # fmt: skip
    offered = re.search(r"offers ssh-ed25519 (SHA256:\S+),", said["native"])
    assert offered and f"has CHANGED: the server offers ED25519 {offered.group(1)}, " in said["ansible"]
    assert not (root / "remote-board3").exists()  # nothing reached the board behind the changed key
    # Ansible's record of the run: the inventory, the play, Ansible's output; no key, no environment dump
    kept = dirs["ansible"] / "ansible"
    assert (kept / "inventory" / "hosts.json").is_file() and (kept / "artifacts" / "stdout").is_file()
    secret = Path(members[0].server.identity_file).read_text().splitlines()[1]  # a line of the private key
    for path in kept.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert secret not in text, path
            assert "XDG_CACHE_HOME" not in text, path  # ansible-runner's "command" (the environment): gone


@pytest.mark.sshd
@pytest.mark.slow
def test_ansible_engine_resumes_a_passed_fleet_and_builds_nothing_again(boards, servers, cli):
    root = boards
    members = make_members(root, servers)
    fleet = write_fleet(root, members, reformat_layer())
    model = qdq_model(root / "net.onnx")
    args = ("fleet", "validate", model, "--fleet", fleet, "--json", "--duration", "0", "--engine", "ansible",
            "--build-once-per-kind")  # fmt: skip
    code, out, err = cli(*args)
    assert code == 0, (out, err)
    first = json.loads(out)
    # one build for the one kind, across Ansible's worker processes (a file lock, not a thread lock)
    assert sum(builds(m) for m in members) == 1
    assert sorted(r["build"] for r in first["targets"]) == ["ok", "reused", "reused"]
    code, out, err = cli(*[a for a in args if a != "--json"])
    assert code == 0, (out, err)
    assert sum(builds(m) for m in members) == 1  # nothing built again
    run = Path(first["fleet_dir"]).name
    # as people read it: a line a board as it ends (stderr is no terminal here), then the matrix
    assert all(f"board{i}: passed, reused from {run}" in err for i in (1, 2, 3)), err
    assert "3/3 targets passed; fleet directory: " in out
    (again,) = [d for d in Path("runs").glob("fleet-*") if d.name != run]
    rows = json.loads((again / "fleet.json").read_text())["targets"]
    assert {r["reused_from"] for r in rows} == {run}
    # and the run directory releases as the native engine's does: one engine for the kind, every board
    code, out, err = cli("release", "--from", again, "-o", root / "net.tar.gz", "--json")
    assert code == 0, (out, err)
    manifest = json.loads(out)
    assert list(manifest["engines"]) == ["sm9.0-trt8.6.0"] and len(manifest["targets"]) == 3


def _currents(members: list) -> list:
    def one(m):
        link = m.work_dir / "releases" / "current"
        return os.readlink(link) if os.path.islink(link) else None

    return [one(m) for m in members]


ROW = ("status", "version", "previous", "switched", "kind", "gate", "ratio", "kept", "exit_code")


@pytest.mark.sshd
@pytest.mark.slow
def test_install_and_rollback_leave_the_same_current_under_both_engines(boards, servers, cli, monkeypatch):
    """v1 installed everywhere, then v2 whose recorded throughput board3 cannot reach (so board3 fails and
    keeps v1), then a rollback; then all of it again under the other engine, from clean boards. Every step
    leaves the same ``current`` on every board and the same rows; a failed canary touches no other board."""
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    root = boards
    members = make_members(root, servers)
    fleet = write_fleet(root, members, reformat_layer())
    v1, name1 = make_bundle(root, "v1", created="2026-01-01T00:00:00Z", engine_mib=1)
    v2, name2 = make_bundle(root, "v2", created="2026-02-01T00:00:00Z", engine_mib=1, qps={"board3": 5000.0})
    v3, _ = make_bundle(root, "v3", created="2026-03-01T00:00:00Z", engine_mib=1, qps={"board1": 5000.0})
    seen: dict[str, list] = {}
    for engine in ("native", "ansible"):
        for m in members:
            shutil.rmtree(m.work_dir / "releases", ignore_errors=True)
        steps = []
        for cmd in (("install", v1, "--duration", "0"), ("install", v2, "--duration", "0"),
                    ("install", v3, "--duration", "0", "--canary", "1"), ("rollback",),
                    ("install", v3, "--duration", "0", "--max-fail", "1", "--workers", "1", "--canary", "0")):
            code, out, err = cli("release", *cmd, "--fleet", fleet, "--json", "--engine", engine)
            assert "Traceback" not in out + err and out, (engine, cmd, code, err)
            rows = {r["target"]: {k: r[k] for k in ROW} for r in json.loads(out)["rows"]}
            steps.append((code, rows, _currents(members)))
        seen[engine] = steps
    for step, (native, ansible) in enumerate(zip(seen["native"], seen["ansible"])):
        assert native == ansible, (step, json.dumps(native[1], indent=1), json.dumps(ansible[1], indent=1))
    (c1, _, after1), (c2, rows2, after2), (c3, rows3, after3), (c4, rows4, after4), (c5, rows5, after5) = \
        seen["ansible"]  # fmt: skip
    assert (c1, after1) == (0, [name1] * 3)
    assert c2 == 1 and after2 == [name2, name2, name1]  # board3 below --min-ratio: kept v1
    assert rows2["board3"]["kept"] == f"current left at {name1}"
    assert c3 == 1 and after3 == after2  # the canary (board1) failed: no board switched
    assert [rows3[b]["status"] for b in ("board1", "board2", "board3")] == ["failed", "not run", "not run"]
    # back a version where there is one; board3 never left v1, so it has none to go back to
    assert c4 == 1 and after4 == [name1] * 3, (c4, after4)
    assert [rows4[b]["status"] for b in ("board1", "board2", "board3")] == ["ok", "ok", "failed"]
    # --max-fail 1, one board at a time: board1 fails, the others are not started (skipped, not failed)
    assert c5 == 1 and after5 == after4
    assert [rows5[b]["status"] for b in ("board1", "board2", "board3")] == ["failed", "skipped", "skipped"]
