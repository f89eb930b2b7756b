"""Ctrl-C under ``--engine ansible`` keeps the native engine's promise (issue 44): a real SIGINT to a real
``edgeq`` process while Ansible runs the boards' tasks (real ansible-runner and ansible-core, loopback
boards: real sshd on 127.0.0.1 whose trtexec replays a recorded TensorRT 8.6.0 run, two of them sleeping
20 s). It stops within seconds, the boards' commands are killed on the boards, no board is switched after
it, and each row says what its board kept. The native engine's own tests: test_fleet_interrupt.py and
test_install.py, whose assertions these repeat word for word."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from fleet_helpers import make_bundle, make_members, qdq_model, reformat_layer, write_fleet
from test_install import _running, _wait_for, current, history
from trtexec_replay import calls

pytest.importorskip("ansible_runner", reason="the Ansible engine needs edgeq's 'ansible' extra")

ROOT = Path(__file__).resolve().parents[1]


def _edgeq(*args: str, env: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    return subprocess.Popen([sys.executable, "-c", "from edgeq.cli import main; main()", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip


@pytest.mark.sshd
@pytest.mark.slow
def test_ctrl_c_stops_an_ansible_fleet_run_and_records_the_boards_that_finished(boards, servers):
    root = boards
    members = make_members(root, servers, slow={"board2": 20.0, "board3": 20.0})
    fleet = write_fleet(root, members, reformat_layer())
    model = qdq_model(root / "m.onnx")
    proc = _edgeq("fleet", "validate", str(model), "--fleet", str(fleet), "--duration", "0", "--junit",
                  "fleet.xml", "--engine", "ansible")  # fmt: skip
    try:
        _wait_for(lambda: proc.poll() is None and list(root.glob("runs/fleet-*/targets/board1/row.json"))
                  and all(any(a.startswith("--onnx=") for argv in calls(m.trtexec) for a in argv)
                          for m in members[1:]), 120)  # fmt: skip
        interrupted = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    stopped_in = time.monotonic() - interrupted
    assert proc.returncode == 130 and "Traceback" not in out + err, (out, err)
    assert stopped_in < 10, stopped_in  # not the 20 s each build sleeps
    assert "interrupted: 1/3 targets finished (1 passed); fleet directory: " in out, out
    (fleet_json,) = root.glob("runs/fleet-*/fleet.json")
    record = json.loads(fleet_json.read_text())
    rows = {r["target"]: r for r in record["targets"]}
    assert record["interrupted"] is True and record["passed"] is False
    assert rows["board1"]["status"] == "passed" and rows["board1"]["gate"] is True
    for b in ("board2", "board3"):
        assert (rows[b]["status"], rows[b]["error"]) == ("interrupted", "stopped during build"), rows[b]
    suite = ET.parse(root / "fleet.xml").getroot().find("testsuite")
    assert (suite.get("failures"), suite.get("skipped")) == ("0", "2")
    assert not any(_running(m.trtexec) for m in members[1:])  # the builds were killed on the boards


@pytest.mark.sshd
@pytest.mark.slow
def test_ctrl_c_during_an_ansible_install_switches_no_board_after_it(boards, servers, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    root = boards
    members = make_members(root, servers)
    fleet_file = write_fleet(root, members, reformat_layer())
    v1, name1 = make_bundle(root, "v1", created="2026-01-01T00:00:00Z", engine_mib=1)
    v2, name2 = make_bundle(root, "v2", created="2026-02-01T00:00:00Z", engine_mib=1)
    from edgeq.cli import run

    assert run(["release", "install", str(v1), "--fleet", str(fleet_file), "--duration", "0"]) == 0
    make_members(root, servers, slow={"board2": 20.0, "board3": 20.0})  # their trtexec, rewritten
    tmp = root / "tmp"
    tmp.mkdir()
    proc = _edgeq("release", "install", str(v2), "--fleet", str(fleet_file), "--duration", "0", "--engine",
                  "ansible", env={"TMPDIR": str(tmp)})  # fmt: skip
    try:
        timing = [f"--loadEngine={m.work_dir / 'releases' / name2 / 'engine.plan'}" for m in members]
        _wait_for(lambda: current(members[0]) == name2 and all(
            any(timing[i] in argv for argv in calls(members[i].trtexec)) for i in (1, 2)), 120)
        assert [glob.glob(str(tmp / "edgeq-install-*"))] != [[]]
        interrupted = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    stopped_in = time.monotonic() - interrupted
    assert proc.returncode == 130 and "Traceback" not in out + err, (out, err)
    assert stopped_in < 10, stopped_in
    assert [current(m) for m in members] == [name2, name1, name1]
    assert [history(m) for m in members] == [[name1, name2], [name1], [name1]]
    lines = {ln.split(":", 1)[0]: ln for ln in out.splitlines() if ln.startswith("board")}
    assert lines["board1"].startswith(f"board1: installed, current {name2} (was {name1})"), out
    for b in ("board2", "board3"):
        assert lines[b].startswith(f"{b}: interrupted, current left at {name1}"), out
        assert lines[b].endswith("stopped during inspect"), out
    assert "interrupted: 1/3 boards finished; no board was started or switched after Ctrl-C" in out
    assert not any(_running(m.trtexec) for m in members[1:])
    assert os.listdir(tmp) == []  # the install's files, Ansible's among them, removed
