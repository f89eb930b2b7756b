"""Why a target could not be used, said one way by every command (issue 20.10/20.11): a host key that is
unknown or changed, a refused login, a refused connection and a connection that drops mid-build give
the same words and the same exit code from ``targets check``, ``deploy``, ``fleet validate`` and
``run``, against a real OpenSSH sshd on 127.0.0.1 (tests/sshd.py)."""

from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path

import pytest
import yaml
from fleet_helpers import FIXTURES, ORTFB, qdq_model
from trtexec_replay import Recorded, replay_trtexec


def _error_line(err: str) -> str:
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    return line[len("error: "):]


def _target(root: Path, name: str, sshd, sleep: float = 0.0, **keys) -> None:
    trtexec = replay_trtexec(
        root, name=f"trtexec-{name}", build=Recorded(FIXTURES / f"{ORTFB}.build.log"),
        run=Recorded(FIXTURES / f"{ORTFB}.run.log"), layers=FIXTURES / f"{ORTFB}.layers.json",
        profile=FIXTURES / f"{ORTFB}.profile.json", sleep=sleep,
    )  # fmt: skip
    (root / "targets").mkdir(exist_ok=True)
    (root / "targets" / f"{name}.yaml").write_text(yaml.safe_dump({
        "host": sshd.host, "port": sshd.port, "user": sshd.user, "identity_file": sshd.identity_file,
        "known_hosts": sshd.known_hosts, "work_dir": str(root / "remote"), "python": sys.executable,
        "tensorrt": "8.6", "backend": "trtexec", "trtexec": str(trtexec),
        "timeouts": {"connect": 5, "command": 60}, **keys,
    }))  # fmt: skip
    (root / f"fleet-{name}.yaml").write_text(yaml.safe_dump({"targets": [f"targets/{name}.yaml"]}))
    (root / f"run-{name}.yaml").write_text(yaml.safe_dump({"model": "net.onnx", "target": name}))


def _every_command(cli, name: str) -> dict[str, tuple[int, str]]:
    """(exit code, the error as the user reads it) from each command that reaches the target."""
    said = {}
    code, _, err = cli("targets", "check", name)
    said["targets check"] = (code, _error_line(err))
    code, _, err = cli("deploy", "net.onnx", "--target", name)
    said["deploy"] = (code, _error_line(err))
    code, out, _ = cli("fleet", "validate", "net.onnx", "--fleet", f"fleet-{name}.yaml", "--json")
    (row,) = json.loads(out)["targets"]
    said["fleet validate"] = (code, row["error"])
    code, out, _ = cli("run", f"run-{name}.yaml", "--json")
    (row,) = json.loads((Path("runs") / f"pipeline-run-{name}" / "fleet.json").read_text())["targets"]
    said["run"] = (code, row["error"])
    return said


@pytest.fixture
def project(tmp_path, monkeypatch, sshd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    qdq_model(tmp_path / "net.onnx")
    return tmp_path


@pytest.mark.sshd
@pytest.mark.parametrize("cause", ["host key changed", "host key unknown", "authentication refused"])
def test_a_host_key_or_login_refusal_is_exit_2_and_the_same_words_everywhere(project, sshd, cli, cause):
    """Issue 20.10: these exited 2 from targets check/deploy but 1 from fleet validate, which showed a
    host-key mismatch as 'reachable: no'."""
    from sshd import keygen

    keys: dict = {}
    if cause == "host key changed":
        kind, blob = Path(f"{keygen(project / 'other_host_key')}.pub").read_text().split()[:2]
        (project / "known_hosts").write_text(f"[{sshd.host}]:{sshd.port} {kind} {blob}\n")
        keys["known_hosts"] = str(project / "known_hosts")
    elif cause == "host key unknown":
        (project / "known_hosts").write_text("# nothing for this target\n")
        keys["known_hosts"] = str(project / "known_hosts")
    else:
        keys["identity_file"] = str(keygen(project / "id_not_authorized"))
    _target(project, "board", sshd, **keys)
    said = _every_command(cli, "board")
    assert {code for code, _ in said.values()} == {2}, said
    assert len({words for _, words in said.values()}) == 1, said
    rows = [json.loads((d / "fleet.json").read_text())["targets"][0]
            for d in [*Path("runs").glob("fleet-*"), Path("runs") / "pipeline-run-board"]]  # fmt: skip
    assert all(r["reachable"] is True and r["cause"] == cause and r["exit_code"] == 2 for r in rows), rows
    assert cli("fleet", "validate", "net.onnx", "--fleet", "fleet-board.yaml")[0] == 2  # the matrix too


@pytest.mark.sshd
def test_a_refused_connection_says_so_not_errno_none(project, sshd, cli, no_backoff):
    """Issue 20.11: "[Errno None] Unable to connect to port N on 127.0.0.1" -> "connection refused by
    127.0.0.1:N", exit 1 from every command, the fleet row unreachable. (Every attempt is real; the
    backoff between them is not waited out.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens here once the socket closes
    _target(project, "gone", sshd, port=port)
    said = _every_command(cli, "gone")
    assert {code for code, _ in said.values()} == {1}, said
    assert len({words for _, words in said.values()}) == 1, said
    words = said["deploy"][1]
    assert f"connection refused by 127.0.0.1:{port} (4 attempt(s))" in words and "Errno" not in words
    (row,) = json.loads((next(Path("runs").glob("fleet-*")) / "fleet.json").read_text())["targets"]
    assert row["reachable"] is False and row["cause"] == "connection refused"


@pytest.mark.sshd
def test_a_connection_dropped_mid_build_names_the_build_stage(project, sshd, cli):
    """Issue 20.11: the error named the interpreter ("dropped while running /usr/bin/python3"), not the
    stage that was running."""
    from edgeq.errors import RemoteError
    from edgeq.orchestration.deploy import DeployOptions, deploy
    from edgeq.remote.targets import resolve_target

    _target(project, "flaky", sshd, sleep=3.0)

    def drop_during_build(line: str) -> None:
        if line == "build: started":
            threading.Timer(1.0, sshd.kill_sessions).start()

    with pytest.raises(RemoteError) as info:
        deploy(project / "net.onnx", resolve_target("flaky"), DeployOptions(), on_event=drop_during_build)
    message = str(info.value)
    assert f"connection to {sshd.user}@{sshd.host}:{sshd.port} dropped during the build stage" in message
    assert sys.executable not in message and "python" not in message.split("(")[0]
    assert info.value.exit_code == 1
    (run_dir,) = Path("runs").iterdir()
    stages = {s["name"]: s for s in json.loads((run_dir / "stages.json").read_text())["stages"]}
    assert stages["build"]["status"] == "failed" and "during the build stage" in stages["build"]["summary"]


@pytest.mark.sshd
def test_a_connection_dropped_during_targets_check_names_the_probe(project, sshd, cli):
    """The same outside a run directory: targets check's probe, not the interpreter it ran."""
    import os
    import time

    started = project / "probe started"
    python = project / "python"  # the target's Python, slow to answer the probe
    python.write_text(f'#!/bin/sh\ncase "$2" in probe) touch "{started}"; sleep 5;; esac\n'
                      f'exec {sys.executable} "$@"\n')  # fmt: skip
    os.chmod(python, 0o755)
    _target(project, "slow", sshd, python=str(python))

    def drop_once_probing() -> None:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        sshd.kill_sessions()

    killer = threading.Thread(target=drop_once_probing)
    killer.start()
    code, _, err = cli("targets", "check", "slow")
    killer.join()
    line = _error_line(err)
    assert code == 1 and f"{sshd.user}@{sshd.host}:{sshd.port} dropped during the probe stage" in line
    assert str(python) not in line


@pytest.mark.sshd
@pytest.mark.parametrize("host, said", [
    ("orin+nano", "unknown host name orin+nano: Name or service not known"),  # the resolver's NXDOMAIN
    ("orin..lab", "'orin..lab' is not a valid host name (label empty or too long)"),  # was a traceback
])
def test_a_host_name_that_does_not_resolve_is_the_users_no_retry_exit_2(project, sshd, cli, monkeypatch,
                                                                        host, said):
    """Issue 27.17: retried 4 times (7 s) and exit 1, as if the board were down. Both names fail in this
    machine's own resolver (glibc refuses '+' in a host name without asking a DNS server; Python's IDNA
    codec an empty label), so no network is needed. Any sleep between attempts is recorded, not waited."""
    import time
    import types

    slept: list[float] = []
    monkeypatch.setattr("edgeq.remote.ssh.time", types.SimpleNamespace(sleep=slept.append,
                                                                       monotonic=time.monotonic))
    _target(project, "typo", sshd, host=host)
    results = _every_command(cli, "typo")
    assert {code for code, _ in results.values()} == {2}, results
    assert len({words for _, words in results.values()}) == 1, results
    assert f"cannot connect to {sshd.user}@{host}:{sshd.port}: {said}" in results["deploy"][1]
    assert "attempt" not in results["deploy"][1] and slept == []  # asked once
    (row,) = json.loads((next(Path("runs").glob("fleet-*")) / "fleet.json").read_text())["targets"]
    assert row["reachable"] is False and row["cause"] == "unknown host name" and row["exit_code"] == 2
