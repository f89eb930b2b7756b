"""Selection and retries on real loopback boards: ``--limit`` (fleet files and Ansible inventories),
resuming the last run (passed targets reused, failed and unfinished ones run again, ``--fresh``),
``--max-fail``, and JUnit's wall time. Each board is a real OpenSSH sshd on 127.0.0.1 whose trtexec
replays a recorded TensorRT 8.6.0 run (tests/fleet_helpers.py); a board's builds are counted from the
command lines its trtexec was given."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest
import yaml
from fleet_helpers import builds, make_members, qdq_model, reformat_layer, write_fleet
from trtexec_replay import calls

from edgeq.errors import ConfigError, EdgeqError
from edgeq.orchestration.fleet_file import load_fleet
from edgeq.remote.ssh import connections_opened


def _runs(member) -> int:
    """Every trtexec call that works on the board (build, inspect, profile): 0 more means nothing ran
    there. The probe's ``--help`` (its TensorRT banner) is not counted: a reused board is probed."""
    return sum("--help" not in argv for argv in calls(member.trtexec))


def _probes(member) -> int:
    return sum("--help" in argv for argv in calls(member.trtexec))


def _rows(out: str) -> dict[str, dict]:
    return {r["target"]: r for r in json.loads(out)["targets"]}


# -- --limit over fleet files and inventories (no boards needed) ------------------------------------------


def _target_files(root, names):
    (root / "targets").mkdir(exist_ok=True)
    for n in names:
        (root / "targets" / f"{n}.yaml").write_text("host: 127.0.0.1\nuser: me\nuse_agent: true\n")


def test_limit_over_a_fleet_files_groups(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _target_files(tmp_path, ["orin-agx", "orin-nano", "xavier-nx", "spare"])
    f = tmp_path / "fleet.yaml"
    f.write_text(yaml.safe_dump({
        "targets": ["orin-agx", "orin-nano", "xavier-nx", "spare"],
        "groups": {"orins": ["orin-*"], "lab": ["orin-nano", "xavier-nx"]},
    }))  # fmt: skip
    fleet = load_fleet(f)
    names = lambda p: [t.name for t in fleet.limited(p).targets]  # noqa: E731
    assert names(None) == ["orin-agx", "orin-nano", "xavier-nx", "spare"]
    assert names("orins") == ["orin-agx", "orin-nano"]
    assert names("orins:&lab") == ["orin-nano"]
    assert names("all:!lab") == ["orin-agx", "spare"]
    assert names("ungrouped") == ["spare"]
    assert names("xavier*,spare") == ["xavier-nx", "spare"]
    with pytest.raises(EdgeqError, match="'orinz' matches no target or group"):
        fleet.limited("orinz")
    f.write_text(yaml.safe_dump({"targets": ["orin-agx"], "groups": {"lab": ["xavier-nx"]}}))
    with pytest.raises(ConfigError, match="'groups': 'lab' lists 'xavier-nx', no target of this fleet"):
        load_fleet(f)


def test_limit_over_inventory_groups_and_children(tmp_path):
    ini = tmp_path / "hosts.ini"
    ini.write_text(
        "[all:vars]\nedgeq_use_agent=true\nansible_user=ops\n\n"
        "[orins]\norin1 ansible_host=10.0.0.5\norin2 ansible_host=10.0.0.6\n\n"
        "[xaviers]\nxav ansible_host=10.0.1.9\n\n"
        "[lab:children]\nxaviers\n\n[lab]\norin2\n"
    )
    fleet = load_fleet(ini)
    names = lambda p: [t.name for t in fleet.limited(p).targets]  # noqa: E731
    assert names("lab") == ["orin2", "xav"]  # its own host and its child group's
    assert names("orins:!lab") == ["orin1"]
    assert names("orins:&lab") == ["orin2"]
    assert names("xav:orin1") == ["orin1", "xav"]
    yml = tmp_path / "inventory.yml"
    jetsons = {"children": {"nanos": {"hosts": {"nano1": {}, "nano2": {}}}, "agx": {"hosts": {"agx1": {}}}}}
    yml.write_text(yaml.safe_dump({"all": {
        "vars": {"edgeq_use_agent": True, "ansible_user": "ops"},
        "children": {"jetsons": jetsons, "desktops": {"hosts": {"rtx": {}}}},
    }}, sort_keys=False))  # fmt: skip
    fleet = load_fleet(yml)
    assert names("jetsons") == ["nano1", "nano2", "agx1"]
    assert names("jetsons:!nanos") == ["agx1"]
    assert names("all:!jetsons") == ["rtx"]
    assert names("nano*") == ["nano1", "nano2"]  # the group nanos (and the hosts' names)
    with pytest.raises(EdgeqError, match="'&tx2' matches no target or group"):
        fleet.limited("all:&tx2")


# -- on boards ----------------------------------------------------------------------------------------------


@pytest.mark.sshd
def test_limit_runs_only_the_selected_boards(boards, servers, cli):
    root = boards
    members = make_members(root, servers)
    fleet = write_fleet(root, members, reformat_layer())
    model = qdq_model(root / "m.onnx")
    opened = connections_opened()
    code, out, err = cli("fleet", "validate", model, "--fleet", fleet, "--limit", "board*:!board2", "--json",
                         "--duration", "0")  # fmt: skip
    assert code == 0, (out, err)
    assert list(_rows(out)) == ["board1", "board3"]
    assert [_runs(m) > 0 for m in members] == [True, False, True]
    # one SSH connection per board for the whole run (upload, probe, build, inspect, profile)
    now = connections_opened()
    dest = [f"{s.user}@{s.host}:{s.port}" for s in servers]
    assert [now.get(d, 0) - opened.get(d, 0) for d in dest] == [1, 0, 1]
    # a pattern naming nothing: one line, exit 2, nothing contacted, no run directory
    before = sorted(p.name for p in (root / "runs").iterdir())
    code, out, err = cli("fleet", "validate", model, "--fleet", fleet, "--limit", "board1:boards2")
    assert code == 2 and "'boards2' matches no target or group" in err and "Traceback" not in out + err
    assert sorted(p.name for p in (root / "runs").iterdir()) == before
    assert _runs(members[1]) == 0


@pytest.mark.sshd
def test_a_rerun_retries_only_the_failed_and_unfinished_boards(boards, servers, cli, no_backoff):
    """Run 1: board2 is down and fails. Run 2 (board2 back): board1 and board3 are reused (nothing runs on
    them, their rows say from which run), board2 is built. board3's record is then removed, as if the run
    had stopped before it finished: run 3 runs board3 only. A changed target file runs its board again;
    ``--fresh`` runs them all; a changed option (--iterations) too."""
    root = boards
    members = make_members(root, servers)
    fleet = write_fleet(root, members, reformat_layer())
    model = qdq_model(root / "m.onnx")
    args = ("fleet", "validate", model, "--fleet", fleet, "--json", "--duration", "0")

    servers[1].stop()
    code, out, err = cli(*args)
    assert code == 1, (out, err)
    first = json.loads(out)
    assert {t: r["status"] for t, r in _rows(out).items()} == {"board1": "passed", "board2": "failed",
                                                               "board3": "passed"}  # fmt: skip
    run1 = first["fleet_dir"].rsplit("/", 1)[-1]
    servers[1].ensure_running()
    calls_before, probes_before, opened = [_runs(m) for m in members], [_probes(m) for m in members], \
        connections_opened()

    code, out, err = cli(*args)
    assert code == 0, (out, err)
    rows = _rows(out)
    assert _runs(members[0]) == calls_before[0] and _runs(members[2]) == calls_before[2]
    # each reused board was probed (unchanged since run 1), on the run's one connection to it
    assert [_probes(m) - n for m, n in zip(members, probes_before)] == [1, 1, 1]
    now = connections_opened()
    assert [now.get(d, 0) - opened.get(d, 0) for d in (f"{s.user}@{s.host}:{s.port}" for s in servers)] \
        == [1, 1, 1]
    assert builds(members[1]) == 1
    assert rows["board1"]["reused_from"] == rows["board3"]["reused_from"] == run1
    assert rows["board2"]["reused_from"] is None and rows["board2"]["status"] == "passed"
    run2 = json.loads(out)["fleet_dir"]
    # the reused board's run directory was taken over into the new run: its stage records and report
    stages = json.loads((root / run2 / "targets" / "board1" / "stages.json").read_text())["stages"]
    assert {s["name"]: s["status"] for s in stages}["build"] == "ok"
    assert rows["board1"]["report"].startswith(str(root / run2)) or rows["board1"]["report"].startswith(run2)
    # as people read it: a line per target as it ends
    code, _, text = cli("fleet", "validate", model, "--fleet", fleet, "--duration", "0")
    assert code == 0 and f"board1: passed, reused from {run1}" in text

    # board3 "unfinished" in the latest run: only it runs again
    latest = sorted((root / "runs").iterdir(), key=lambda p: p.stat().st_mtime)[-1]
    (latest / "targets" / "board3" / "row.json").unlink()
    before = [_runs(m) for m in members]
    code, out, err = cli(*args)
    assert code == 0, (out, err)
    assert [_runs(m) > n for m, n in zip(members, before)] == [False, False, True]

    # board2's target file changed: only board2 runs again
    t2 = root / "targets" / "board2.yaml"
    changed = {**yaml.safe_load(t2.read_text()), "timeouts": {"connect": 10, "command": 61}}
    t2.write_text(yaml.safe_dump(changed))
    before = [_runs(m) for m in members]
    code, out, err = cli(*args)
    assert code == 0, (out, err)
    assert [_runs(m) > n for m, n in zip(members, before)] == [False, True, False]

    before = [builds(m) for m in members]
    code, out, err = cli(*args, "--fresh")
    assert code == 0, (out, err)
    assert [builds(m) - n for m, n in zip(members, before)] == [1, 1, 1]
    assert all(r["reused_from"] is None for r in _rows(out).values())

    before = [builds(m) for m in members]
    code, out, err = cli(*args, "--iterations", "11")  # an input of every board changed
    assert code == 0, (out, err)
    assert [builds(m) - n for m, n in zip(members, before)] == [1, 1, 1]


@pytest.mark.sshd
def test_max_fail_stops_starting_boards_and_they_count_as_failed(boards, servers, cli, no_backoff):
    """Skipped boards make the run fail (exit 1) but are not failures themselves: the matrix says
    skipped, JUnit ``<skipped/>`` (issue 27.9: they read FAILED and ``<failure type="skipped">``)."""
    root = boards
    members = make_members(root, servers)
    fleet = write_fleet(root, members, reformat_layer())
    model = qdq_model(root / "m.onnx")
    junit = root / "fleet.xml"
    servers[0].stop()
    code, out, err = cli("fleet", "validate", model, "--fleet", fleet, "--workers", "1", "--max-fail", "1",
                         "--json", "--junit", junit, "--duration", "0")  # fmt: skip
    assert code == 1, (out, err)
    rows = _rows(out)
    assert rows["board1"]["status"] == "failed" and rows["board1"]["reachable"] is False
    for b in ("board2", "board3"):
        assert rows[b]["status"] == "skipped" and rows[b]["error"] == "not started: max-fail: 1 failed"
    assert _runs(members[1]) == _runs(members[2]) == 0
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "2")
    assert [f.get("type") for f in suite.findall("testcase/failure")] == ["target"]
    skipped = {tc.get("name"): tc.find("skipped") for tc in suite.findall("testcase")}
    assert skipped["board1"] is None
    assert [skipped[b].get("message") for b in ("board2", "board3")] == ["skipped (max-fail)"] * 2
    from edgeq.orchestration.fleet import FleetResult, Row, matrix

    cells = matrix(FleetResult(root, model, [Row(**r) for r in rows.values()], "now"))
    assert [c["result"] for c in cells][1:] == ["skipped (max-fail)", "skipped (max-fail)"]
    code, out, err = cli("fleet", "validate", model, "--fleet", fleet, "--workers", "1", "--max-fail", "1",
                         "--duration", "0")  # fmt: skip
    matrix_rows = {ln.split()[1]: ln for ln in out.splitlines() if re.match(r"\W+board\d", ln)}
    assert code == 1 and "FAILED" in matrix_rows["board1"], out
    assert all("skipped" in matrix_rows[b] and "FAILED" not in matrix_rows[b] for b in ("board2", "board3"))
    # a skipped board has no record: the next run (board1 back) runs all three
    servers[0].ensure_running()
    code, out, err = cli("fleet", "validate", model, "--fleet", fleet, "--json", "--duration", "0")
    assert code == 0, (out, err)
    assert all(builds(m) == 1 for m in members)


@pytest.mark.sshd
def test_junit_suite_time_is_the_runs_wall_time(boards, servers):
    from edgeq.orchestration.fleet import FleetOptions, junit_xml, validate
    from edgeq.pipeline.stages import ProfileSettings

    root = boards
    members = make_members(root, servers, sleep=1.0)  # each board's trtexec takes a second a call
    fleet = write_fleet(root, members, reformat_layer())
    options = FleetOptions(profile=ProfileSettings(duration=0))
    result = validate(qdq_model(root / "m.onnx"), load_fleet(fleet), options)
    assert result.passed
    suite = ET.fromstring(junit_xml(result)).find("testsuite")
    cases = [float(tc.get("time")) for tc in suite.findall("testcase")]
    assert float(suite.get("time")) == pytest.approx(result.seconds, abs=0.001)
    assert max(cases) <= result.seconds < sum(cases)  # the boards ran at once
    assert cases == [pytest.approx(r.seconds, abs=0.001) for r in result.rows]


@pytest.mark.sshd
def test_edgeq_run_resumes_its_targets_and_takes_limit_and_fresh(boards, servers, cli, no_backoff):
    root = boards
    members = make_members(root, servers)
    write_fleet(root, members, reformat_layer())
    spec = {"name": "fl", "model": "zoo:resnet", "model_options": {"size": 32, "width": 8}, "synthetic": 8,
            "quantize": {"calibrator": "max"}, "fleet": "fleet.yaml", "profile": {"duration": 0}}  # fmt: skip
    pipeline = root / "fl.yaml"
    pipeline.write_text(yaml.safe_dump(spec))
    servers[2].stop()
    code, out, err = cli("run", pipeline, "--json")
    assert code == 1, (out, err)
    servers[2].ensure_running()
    before = [_runs(m) for m in members]
    code, out, err = cli("run", pipeline, "--json")
    assert code == 0, (out, err)
    assert [_runs(m) > n for m, n in zip(members, before)] == [False, False, True]
    fleet = json.loads((root / "runs" / "pipeline-fl" / "fleet.json").read_text())
    assert [t["reused_from"] for t in fleet["targets"]][:2] == ["pipeline-fl", "pipeline-fl"]
    before = [builds(m) for m in members]
    code, out, err = cli("run", pipeline, "--json", "--fresh", "--limit", "board2")
    assert code == 0, (out, err)
    assert [builds(m) - n for m, n in zip(members, before)] == [0, 1, 0]
    code, out, err = cli("run", pipeline, "--limit", "nosuch")
    assert code == 2 and "'nosuch' matches no target or group" in err


def _reflash(member, *, trt: str) -> None:
    """The board's TensorRT as its trtexec banner says it (``8.6.2`` -> ``[TensorRT v8602]``)."""
    script = member.trtexec.read_text()
    banner = re.search(r"\[TensorRT v\d+\]", script)
    assert banner is not None
    major, minor, patch = (int(x) for x in trt.split("."))
    code = major * 1000 + minor * 100 + patch  # NV_TENSORRT_VERSION's layout, as trtexec 8.6 prints it
    member.trtexec.write_text(script.replace(banner.group(0), f"[TensorRT v{code}]"))


def _probes(member) -> int:
    """How many times the board was probed (each probe asks its trtexec stand-in for ``--help``)."""
    from trtexec_replay import calls

    return sum(argv[1:] == ["--help"] for argv in calls(member.trtexec))


@pytest.mark.sshd
def test_a_reused_board_is_probed_and_rebuilt_when_reflashed(boards, servers, cli, no_backoff):
    """Run 1 on board1 (L4T 36.2.0, files under EDGEQ_PROBE_ROOT), board2 (TensorRT 8.6.2) and board3.
    Then board1 is reflashed to L4T 35.4.1 and board2 to TensorRT 8.6.0, their target files unchanged:
    run 2 rebuilds them, saying why, and reuses board3, one SSH connection per board. A reused board
    that does not answer fails, its record kept: once back, it is reused again."""
    from test_board_facts import _python_on, fake_board

    root = boards
    members = make_members(root, servers)
    fleet = write_fleet(root, members, reformat_layer())
    board_root = fake_board(root / "fs1")
    t = yaml.safe_load((root / "targets" / "board1.yaml").read_text())
    t["python"] = _python_on(root, "board1", board_root)
    (root / "targets" / "board1.yaml").write_text(yaml.safe_dump(t))
    _reflash(members[1], trt="8.6.2")
    model = qdq_model(root / "m.onnx")
    args = ("fleet", "validate", model, "--fleet", fleet, "--json", "--duration", "0")
    code, out, err = cli(*args)
    assert code == 0, [r["error"] for r in _rows(out).values()]
    run1 = json.loads(out)["fleet_dir"]
    facts = json.loads((root / run1 / "targets" / "board1" / "row.json").read_text())["facts"]
    assert facts == {"tensorrt": "8.6.0", "gpu": "NVIDIA H200", "compute_capability": "9.0", "l4t": "36.2.0"}
    assert _rows(out)["board2"]["tensorrt"] == "8.6.2"

    (board_root / "etc" / "nv_tegra_release").write_text("# R35 (release), REVISION: 4.1, GCID: 33958178\n")
    _reflash(members[1], trt="8.6.0")
    before, opened = [builds(m) for m in members], connections_opened()
    probed = [_probes(m) for m in members]
    code, out, err = cli(*args)
    assert code == 0, (out, err)
    rows = _rows(out)
    assert [builds(m) - n for m, n in zip(members, before)] == [1, 1, 0]
    # one probe a board: a rebuilt board's deploy takes the resume check's probe, it does not ask again
    assert [_probes(m) - n for m, n in zip(members, probed)] == [1, 1, 1]
    assert rows["board1"]["rebuilt"] == "L4T 36.2.0 -> 35.4.1" and rows["board1"]["reused_from"] is None
    assert rows["board2"]["rebuilt"] == "TensorRT 8.6.2 -> 8.6.0" and rows["board2"]["tensorrt"] == "8.6.0"
    assert rows["board3"]["reused_from"] == run1.rsplit("/", 1)[-1] and rows["board3"]["rebuilt"] is None
    now = connections_opened()
    assert [now.get(d, 0) - opened.get(d, 0) for d in (f"{s.user}@{s.host}:{s.port}" for s in servers)] \
        == [1, 1, 1]
    run2 = json.loads(out)["fleet_dir"]
    log = (root / run2 / "targets" / "board2" / "deploy.log").read_text()
    assert "TensorRT 8.6.2 -> 8.6.0: rebuilt" in log

    # as people read it, piped: back to TensorRT 8.6.2 on board2
    _reflash(members[1], trt="8.6.2")
    code, _, text = cli("fleet", "validate", model, "--fleet", fleet, "--duration", "0")
    assert code == 0 and "board2: passed, TensorRT 8.6.0 -> 8.6.2: rebuilt" in text, text
    assert "board1: passed, reused from" in text and "board3: passed, reused from" in text

    # board3 down: it cannot be probed, so it fails (unreachable); its passed record stays for the next run
    servers[2].stop()
    code, out, err = cli(*args)
    assert code == 1 and _rows(out)["board3"]["status"] == "failed", (out, err)
    assert _rows(out)["board3"]["reachable"] is False and _rows(out)["board3"]["cause"]
    servers[2].ensure_running()
    before = [builds(m) for m in members]
    code, out, err = cli(*args)
    assert code == 0, (out, err)
    assert _rows(out)["board3"]["reused_from"] == run1.rsplit("/", 1)[-1]
    assert [builds(m) - n for m, n in zip(members, before)] == [0, 0, 0]
