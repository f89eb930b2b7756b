"""``edgeq fleet validate`` against three real OpenSSH sshd instances on 127.0.0.1 (different ports).

Each board's trtexec replays the recorded TensorRT 8.6.0 ResNet-50 run (tests/fleet_helpers.py): the
tests prove the fleet orchestration (concurrency, one row per target, a failure staying in its row,
one build per kind, the Ansible inventory, JSON and JUnit), not TensorRT.
"""

from __future__ import annotations

import json
import threading
import xml.etree.ElementTree as ET

import pytest
import yaml
from fleet_helpers import builds, make_members, qdq_model, reformat_layer
from trtexec_replay import calls

from edgeq.errors import ConfigError
from edgeq.orchestration.fleet_file import load_fleet


@pytest.mark.sshd
def test_ansible_inventory_fleet_all_pass_one_build_per_kind_json_and_junit(boards, servers, cli):
    root = boards
    members = make_members(root, servers)
    allow = reformat_layer()  # the recorded engine's one interior reformat, allowlisted for the fleet
    inventory = {"all": {
        "vars": {"edgeq_python": members[0].target_dict()["python"], "edgeq_backend": "trtexec",
                 "edgeq_tensorrt": "8.6", "edgeq_gate": {"policy": "int8", "allow": [allow]},
                 "edgeq_gpu": {"compute_capability": "9.0"}},
        "children": {"jetsons": {"hosts": {
            m.name: {"ansible_host": m.server.host, "ansible_port": m.server.port,
                     "ansible_user": m.server.user,
                     "ansible_ssh_private_key_file": m.server.identity_file,
                     "edgeq_known_hosts": m.server.known_hosts, "edgeq_work_dir": str(m.work_dir),
                     "edgeq_trtexec": str(m.trtexec)}
            for m in members
        }}},
    }}  # fmt: skip
    inv = root / "inventory.yml"
    inv.write_text(yaml.safe_dump(inventory))
    model = qdq_model(root / "net.onnx")
    junit = root / "out" / "fleet.xml"
    code, out, err = cli("fleet", "validate", model, "--fleet", inv, "--build-once-per-kind", "--json",
                         "--junit", junit, "--duration", "0")  # fmt: skip
    assert code == 0, (out, err)
    assert "Traceback" not in out + err
    res = json.loads(out)
    rows = {r["target"]: r for r in res["targets"]}
    assert set(rows) == {"board1", "board2", "board3"} and res["passed"] is True
    for r in rows.values():
        assert r["status"] == "passed" and r["reachable"] is True and r["gate"] is True
        assert r["tensorrt"] == "8.6.0" and 0 < r["latency_p50_ms"] <= r["latency_p99_ms"]
        assert r["report"].endswith("report.html")
    # one kind (same compute capability + TensorRT): one build in the whole fleet, the others reuse it
    assert sum(builds(m) for m in members) == 1
    assert sorted(r["build"] for r in rows.values()) == ["ok", "reused", "reused"]
    # each board ran the engine (inspect + profile) from its own copy, byte-identical to the built one
    for m in members:
        loads = [a for a in calls(m.trtexec) if any(x.startswith("--loadEngine=") for x in a)]
        assert len(loads) == 2

    tree = ET.parse(junit)
    suite = tree.getroot().find("testsuite")
    assert tree.getroot().tag == "testsuites" and suite is not None
    assert suite.get("tests") == "3" and suite.get("failures") == "0"
    assert sorted(tc.get("name") for tc in suite.findall("testcase")) == ["board1", "board2", "board3"]
    assert not suite.findall("testcase/failure")


@pytest.mark.sshd
def test_a_target_stopped_mid_run_fails_only_its_row(boards, servers, cli, no_backoff):
    """board2's sshd is stopped while its engine builds: its row fails (unreachable mid-run), the other
    two pass, the exit code says not all passed, and the JUnit XML carries one failure."""
    from edgeq.orchestration.fleet import FleetOptions, validate
    from edgeq.pipeline.stages import ProfileSettings

    root = boards
    members = make_members(root, servers, slow={"board2": 1.5})
    allow = reformat_layer()
    (root / "targets").mkdir()
    for m in members:
        (root / "targets" / f"{m.name}.yaml").write_text(yaml.safe_dump(m.target_dict()))
    fleet = root / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"workers": 3, "targets": [
        "targets/board[13].yaml",  # a glob
        {"target": "board2", "overrides": {"gate": {"allow": [allow]}}},
    ]}))  # fmt: skip
    # board1/board3 pass only with the allowlist: give it to the glob's targets through their files
    for m in (members[0], members[2]):
        text = yaml.safe_dump(m.target_dict(gate={"allow": [allow]}))
        (root / "targets" / f"{m.name}.yaml").write_text(text)

    stopped = threading.Event()

    def on_row(row):
        if row.target == "board2" and row.stage == "build" and not stopped.is_set():
            stopped.set()
            threading.Timer(0.5, servers[1].stop).start()

    options = FleetOptions(profile=ProfileSettings(duration=0))
    result = validate(qdq_model(root / "m.onnx"), load_fleet(fleet), options, on_row=on_row)
    rows = {r.target: r for r in result.rows}
    assert stopped.is_set()
    assert rows["board1"].passed and rows["board3"].passed
    b2 = rows["board2"]
    assert b2.status == "failed" and b2.reachable is True and b2.build == "failed"
    assert b2.error and b2.gate is None and b2.latency_p50_ms is None
    assert (b2.tensorrt, b2.gpu, b2.kind) == ("8.6.0", "NVIDIA H200", "sm9.0-trt8.6.0")  # probed before
    assert not result.passed
    stages = json.loads((result.fleet_dir / "targets" / "board2" / "stages.json").read_text())["stages"]
    assert {s["name"]: s["status"] for s in stages}["inspect"] == "not run"
    from edgeq.orchestration.fleet import junit_xml

    suite = ET.fromstring(junit_xml(result)).find("testsuite")
    assert suite.get("failures") == "1"
    (failed,) = [tc for tc in suite.findall("testcase") if tc.find("failure") is not None]
    assert failed.get("name") == "board2"

    # the CLI's exit code for the same fleet with board2 unreachable from the start: 1, one failed row
    code, out, err = cli("fleet", "validate", root / "m.onnx", "--fleet", fleet, "--json", "--duration", "0",
                         "--junit", root / "u.xml")  # fmt: skip
    assert code == 1 and "Traceback" not in out + err
    rows2 = {r["target"]: r for r in json.loads(out)["targets"]}
    assert rows2["board2"]["reachable"] is False and rows2["board2"]["status"] == "failed"
    cases = {tc.get("name"): tc for tc in ET.parse(root / "u.xml").getroot().iter("testcase")}
    assert "None" not in ET.tostring(cases["board2"], encoding="unicode")  # no run directory, none named
    assert "run directory: " in cases["board1"].find("system-out").text
    assert rows2["board1"]["status"] == rows2["board3"]["status"] == "passed"
    # the same as people read it: a line per target as it ends (stderr is not a terminal here), the matrix
    code, out, err = cli("fleet", "validate", root / "m.onnx", "--fleet", fleet, "--duration", "0")
    assert code == 1 and "Traceback" not in out + err
    assert "board1: passed" in err and "board2: failed" in err
    assert "2/3 targets passed" in out and "fleet directory:" in out


def test_fleet_file_errors_are_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "orin.yaml").write_text("host: 127.0.0.1\nuser: me\nuse_agent: true\n")
    f = tmp_path / "fleet.yaml"
    f.write_text("tragets: [orin]\n")
    with pytest.raises(ConfigError, match=r"unknown key 'tragets' \(did you mean 'targets'\?\)"):
        load_fleet(f)
    f.write_text("targets: [orin, orin]\n")
    with pytest.raises(ConfigError, match="'orin' is listed twice"):
        load_fleet(f)
    f.write_text("targets: ['targets/xavier-*.yaml']\n")
    with pytest.raises(ConfigError, match="matches no target file"):
        load_fleet(f)
    f.write_text("targets:\n  - target: orin\n    overrides: {build: {dla_cor: 0}}\n")
    with pytest.raises(ConfigError, match=r"yaml: 'targets' entry 1: unknown key 'overrides.build.dla_cor'"):
        load_fleet(f)
    f.write_text("targets:\n  - target: orin\n    name: orin-nofp16\n    overrides: {build: {fp16: false}}\n")
    (t,) = load_fleet(f).targets
    assert t.name == "orin-nofp16" and t.build.fp16 is False and t.host == "127.0.0.1"


def test_ini_inventory_hosts_groups_and_vars(tmp_path):
    inv = tmp_path / "hosts.ini"
    inv.write_text(
        "[all:vars]\nedgeq_use_agent=true\nansible_user=ops\n\n"
        "[orins]\norin1 ansible_host=10.0.0.5 ansible_port=2222\n"
        "orin2 ansible_ssh_host=10.0.0.6 ansible_ssh_port=2200 ansible_user=nv\n\n"
        "[xaviers]\nxav ansible_host=10.0.1.9 ansible_ssh_private_key_file=/nonexistent/key\n"
    )
    fleet = load_fleet(inv)
    t = {x.name: x for x in fleet.targets}
    assert fleet.kind == "ansible" and set(t) == {"orin1", "orin2", "xav"}
    assert (t["orin1"].host, t["orin1"].port, t["orin1"].user) == ("10.0.0.5", 2222, "ops")
    assert (t["orin2"].host, t["orin2"].port, t["orin2"].user) == ("10.0.0.6", 2200, "nv")
    assert t["orin1"].use_agent
    assert str(t["xav"].identity_file) == "/nonexistent/key"


def test_ini_inventory_values_are_read_as_ansible_reads_them(tmp_path):
    """Issue 20.8: `edgeq_tensorrt="8.6"` in [group:vars] kept its quotes, and unquoted it became the float
    8.6 and was refused. Ansible's ini plugin reads a value with Python's literal syntax (quotes are
    string delimiters, {...} a dict), else as text; a version keeps its text (8.10 is not 8.1)."""
    inv = tmp_path / "hosts.ini"
    inv.write_text(
        "[all:vars]\nedgeq_use_agent=yes\nansible_user=ops\n\n"
        '[orins]\norin1 ansible_host=10.0.0.5\norin2 ansible_host=10.0.0.6 edgeq_tensorrt="8.6.2"\n\n'
        '[orins:vars]\nedgeq_tensorrt="8.6"\nedgeq_build={"fp16": False, "workspace": 2048}\n'
        "edgeq_python = /usr/bin/python3.8\n\n"
        "[xaviers]\nxav ansible_host=10.0.1.9 ansible_ssh_private_key_file=/nonexistent/key\n\n"
        "[xaviers:vars]\nedgeq_tensorrt=8.10\nedgeq_use_agent=False\n"
    )
    t = {x.name: x for x in load_fleet(inv).targets}
    assert (t["orin1"].tensorrt, t["orin2"].tensorrt, t["xav"].tensorrt) == ("8.6", "8.6.2", "8.10")
    assert t["orin1"].build.fp16 is False and t["orin1"].build.workspace == 2048
    assert t["orin1"].python == "/usr/bin/python3.8"
    assert t["orin1"].use_agent is True and t["xav"].use_agent is False


def test_an_error_in_a_fleet_files_overrides_names_the_fleet_file(tmp_path, monkeypatch, cli):
    """Issue 20.13: an unknown key in a fleet file's `overrides:` was reported against the target file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    target = tmp_path / "targets" / "orin.yaml"
    target.write_text("host: 127.0.0.1\nuser: me\nuse_agent: true\n")
    f = tmp_path / "fleet.yaml"
    for overrides, said in (
        ("{buidl: {fp16: false}}", r"unknown key 'overrides.buidl' \(did you mean 'build'\?\)"),
        ("{build: {dla_cor: 0}}", r"unknown key 'overrides.build.dla_cor' \(did you mean 'dla_core'\?\)"),
        ("{port: http}", r"'overrides.port' must be an integer port"),
        ("{host: local}", r"'user' has no meaning with 'host: local'.*with the overrides of"),
    ):
        f.write_text(f"targets:\n  - orin\n  - target: orin\n    name: b\n    overrides: {overrides}\n")
        with pytest.raises(ConfigError, match=said) as info:
            load_fleet(f)
        assert str(info.value).startswith(f"{f}: 'targets' entry 2"), str(info.value)
        code, _, err = cli("fleet", "validate", "m.onnx", "--fleet", f)
        (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert code == 2 and line.startswith(f"error: {f}: 'targets' entry 2") and "Traceback" not in err
