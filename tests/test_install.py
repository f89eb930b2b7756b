"""``edgeq release install`` / ``release rollback`` / ``fleet status`` on three real OpenSSH sshd boards on
127.0.0.1 (tests/fleet_helpers.py), and the agent's board-side ``install``/``switch``/``rollback``/``status``.

The bundles are made by ``edgeq release --from`` a fleet directory written here (engine bytes of our own:
the boards' trtexec replays the recorded TensorRT 8.6.0 run whatever it loads, tests/trtexec_replay.py).
Each board's work dir is a local directory, so what ``fleet status`` reads over SSH is checked against
the symlink on disk too.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from fleet_helpers import make_bundle, make_members, reformat_layer, write_fleet
from trtexec_replay import calls

KIND = "sm9.0-trt8.6.0"  # what the loopback boards probe as (the replayed trtexec 8.6.0, gpu 9.0 in the file)
REPLAYED_QPS = 1233.99  # the recorded run log's throughput, what every loopback board measures


@pytest.fixture
def fleet(boards, servers, monkeypatch):
    """The three loopback boards (conftest) as a fleet file, in the test's own directory."""
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    members = make_members(boards, servers)
    return boards, members, write_fleet(boards, members, reformat_layer())


def current(member):
    link = member.work_dir / "releases" / "current"
    return os.readlink(link) if os.path.islink(link) else None


def history(member):
    path = member.work_dir / "releases" / "history"
    return json.loads(path.read_text()) if path.exists() else None


def loaded_engines(member):
    """The engines the board's trtexec loaded (inspect, profile), in order."""
    flag = "--loadEngine="
    return [a[len(flag):] for argv in calls(member.trtexec) for a in argv if a.startswith(flag)]


def status(cli, fleet_file, *extra):
    code, out, err = cli("fleet", "status", "--fleet", fleet_file, "--json", *extra)
    assert code == 0, (out, err)
    return {r["target"]: r for r in json.loads(out)["rows"]}


@pytest.mark.sshd
def test_install_canary_killed_board_rollback_and_status(fleet, servers, cli, no_backoff):
    root, members, fleet_file = fleet
    v1, name1 = make_bundle(root, "v1", created="2026-01-01T00:00:00Z")
    v2, name2 = make_bundle(root, "v2", created="2026-02-01T00:00:00Z", qps={"board1": 5000.0})
    v3, name3 = make_bundle(root, "v3", created="2026-03-01T00:00:00Z")
    assert len({name1, name2, name3}) == 3 and name1.startswith("net-20260101T000000Z-")

    # v1 on all three boards: each checked (gate, qps against its own recorded row) on its board
    code, out, err = cli("release", "install", v1, "--fleet", fleet_file, "--json", "--duration", "0")
    assert code == 0, (out, err)
    res = json.loads(out)
    assert res["version"] == name1 and res["passed"] and not res["stopped"]
    for r in res["rows"]:
        assert r["status"] == "installed" and r["kind"] == KIND and r["gate"] is True
        assert r["throughput_qps"] == REPLAYED_QPS and r["recorded_qps"] == 1200.0 and r["ratio"] == 1.028
        assert r["previous"] is None and r["uploaded_bytes"] == 6 << 20 and r["switched"] is True
    assert [current(m) for m in members] == [name1] * 3 and [history(m) for m in members] == [[name1]] * 3
    # checked where it was installed, before current pointed at it: never through releases/current
    for m in members:
        assert loaded_engines(m) == [str(m.work_dir / "releases" / name1 / "engine.plan")] * 2
    installed = members[0].work_dir / "releases" / name1
    engine = (root / "fleet-v1" / "targets" / "board1" / "engine.plan").read_bytes()
    assert (installed / "engine.plan").read_bytes() == engine
    assert json.loads((installed / "release.json").read_text())["kind"] == KIND
    rows = status(cli, fleet_file)
    assert {n: (r["version"], r["previous"]) for n, r in rows.items()} == {b: (name1, None) for b in rows}
    # again: nothing sent (the board's upload cache has it), nothing switched, checked again
    code, out, _ = cli("release", "install", v1, "--fleet", fleet_file, "--limit", "board1", "--json",
                       "--duration", "0")  # fmt: skip
    (again,) = json.loads(out)["rows"]
    assert code == 0 and again["uploaded_bytes"] == 0 and again["previous"] == name1 and again["gate"]
    assert status(cli, fleet_file, "--limit", "board1")["board1"]["history"] == [name1]

    # v2 with --canary 1: board1 measures 0.25x its recorded 5000 qps -> fails, is never switched (its
    # current and history stay v1's), and boards 2 and 3 are not touched
    code, out, err = cli("release", "install", v2, "--fleet", fleet_file, "--canary", "1", "--duration", "0")
    assert code == 1 and "Traceback" not in out + err, (out, err)
    assert "canary failed on board1: stopped; 2 other boards not touched" in out
    assert f"board1: failed, current left at {name1}, 1234 qps = 0.25x the recorded 5000, " in out
    assert "below --min-ratio 0.9" in err
    (row,) = [line for line in out.splitlines() if line.startswith("board1: failed")]
    assert row.count("qps") == 1 and row.count("1234") == 1 and "below --min-ratio 0.9" in row  # once
    code, out, _ = cli("release", "install", v2, "--fleet", fleet_file, "--canary", "1", "--json",
                       "--duration", "0")  # fmt: skip
    res = json.loads(out)
    rows2 = {r["target"]: r for r in res["rows"]}
    assert code == 1 and res["stopped"] and res["canary"] == ["board1"]
    assert rows2["board1"]["status"] == "failed" and rows2["board1"]["switched"] is None
    assert rows2["board1"]["ratio"] == 0.247
    assert rows2["board2"]["status"] == rows2["board3"]["status"] == "not run"
    assert [current(m) for m in members] == [name1] * 3 and history(members[0]) == [name1]
    assert (members[0].work_dir / "releases" / name2 / "engine.plan").is_file()  # installed, checked there
    assert loaded_engines(members[0])[-1] == str(members[0].work_dir / "releases" / name2 / "engine.plan")
    board1 = status(cli, fleet_file, "--limit", "board1")["board1"]  # read from the board
    assert (board1["version"], board1["history"]) == (name1, [name1])
    assert not (members[1].work_dir / "releases" / name2).exists()

    # v3, board2's sshd stopped once its engine upload has started, board3's once the installed engine is
    # being timed: board1 finishes, boards 2 and 3 keep v1
    from edgeq.orchestration.fleet_file import load_fleet
    from edgeq.orchestration.install import InstallOptions, install
    from edgeq.pipeline.stages import ProfileSettings

    killed = threading.Event()

    def progress(target, task, done, total):
        if target == "board2" and task.startswith("upload") and done > 0 and not killed.is_set():
            killed.set()
            servers[1].stop()

    timing = threading.Event()

    def on_row(row):
        if row.target == "board3" and row.stage == "profile" and not timing.is_set():
            timing.set()
            servers[2].stop()

    result = install(v3, load_fleet(fleet_file), InstallOptions(profile=ProfileSettings(duration=0)),
                     progress=progress, on_row=on_row)  # fmt: skip
    assert killed.is_set() and timing.is_set()
    rows3 = {r.target: r for r in result.rows}
    assert rows3["board1"].status == "installed" and rows3["board1"].switched is True
    assert rows3["board2"].status == "failed" and rows3["board2"].stage == "upload", rows3["board2"]
    assert rows3["board3"].status == "failed" and rows3["board3"].stage == "profile", rows3["board3"]
    assert result.exit_code == 1 and rows3["board2"].switched is rows3["board3"].switched is None
    assert (members[2].work_dir / "releases" / name3 / "engine.plan").is_file()  # installed, never current
    servers[1].ensure_running()
    servers[2].ensure_running()
    assert [current(m) for m in members] == [name3, name1, name1]
    assert [history(m) for m in members] == [[name1, name3], [name1], [name1]]
    rows = status(cli, fleet_file)
    assert {n: r["version"] for n, r in rows.items()} == {"board1": name3, "board2": name1, "board3": name1}
    assert rows["board1"]["previous"] == name1 and rows["board1"]["history"] == [name1, name3]
    assert rows["board3"]["history"] == [name1]
    code, out, _ = cli("fleet", "status", "--fleet", fleet_file)
    assert code == 0 and name3 in out and name1 in out

    # boards 2 and 3 back: installing v3 there resumes board2's upload where it stopped; board3 has it all
    code, out, err = cli("release", "install", v3, "--fleet", fleet_file, "--limit", "board2:board3",
                         "--json", "--duration", "0")  # fmt: skip
    resumed = {r["target"]: r for r in json.loads(out)["rows"]}
    assert code == 0 and {r["status"] for r in resumed.values()} == {"installed"}, (out, err)
    assert 0 < resumed["board2"]["uploaded_bytes"] < 6 << 20 and resumed["board3"]["uploaded_bytes"] == 0
    assert current(members[1]) == current(members[2]) == name3

    # rollback on every board: back to v1; again: nothing earlier than v1 -> each board fails its row
    code, out, err = cli("release", "rollback", "--fleet", fleet_file, "--json")
    assert code == 0, (out, err)
    back = {r["target"]: r for r in json.loads(out)["rows"]}
    assert all((r["previous"], r["version"]) == (name3, name1) for r in back.values())
    assert [current(m) for m in members] == [name1] * 3
    code, out, err = cli("release", "rollback", "--fleet", fleet_file, "--limit", "board2:board3")
    assert code == 1 and "no earlier version installed" in out + err and "board1" not in out + err
    assert current(members[1]) == name1
    assert {r["version"] for r in status(cli, fleet_file).values()} == {name1}
    code, _, err = cli("fleet", "status", "--fleet", fleet_file, "--limit", "board9")
    assert code == 2 and "'board9' matches no target" in err


@pytest.mark.sshd
def test_a_gate_failure_or_a_board_no_engine_fits_fails_that_board(fleet, cli):
    root, members, fleet_file = fleet
    v1, name1 = make_bundle(root, "v1", created="2026-01-01T00:00:00Z", engine_mib=1)
    v2, name2 = make_bundle(root, "v2", created="2026-02-01T00:00:00Z", engine_mib=1)
    assert cli("release", "install", v1, "--fleet", fleet_file, "--duration", "0")[0] == 0
    # board3 without the gate's allowlist: the installed engine's interior reformat fails its gate
    nogate = root / "nogate.yaml"
    nogate.write_text(yaml.safe_dump({"targets": [
        "targets/board1.yaml",
        {"target": "targets/board3.yaml", "name": "board3", "overrides": {"gate": {"allow": []}}},
    ]}))  # fmt: skip
    code, out, err = cli("release", "install", v2, "--fleet", nogate, "--json", "--duration", "0")
    rows = {r["target"]: r for r in json.loads(out)["rows"]}
    assert code == 1, (out, err)
    assert rows["board1"]["status"] == "installed"
    assert rows["board3"]["status"] == "failed" and rows["board3"]["gate"] is False
    assert "gate failed" in rows["board3"]["error"] and rows["board3"]["switched"] is None
    assert [current(m) for m in members] == [name2, name1, name1]
    assert history(members[2]) == [name1]  # never switched, not even for a moment
    assert status(cli, fleet_file, "--limit", "board3")["board3"]["version"] == name1  # read from the board
    assert loaded_engines(members[2])[-1] == str(members[2].work_dir / "releases" / name2 / "engine.plan")

    # a bundle built for Orin (sm 8.7, TensorRT 8.6.2) only: refused on the H200 boards, naming both
    orin, _ = make_bundle(root, "orin", created="2026-04-01T00:00:00Z", engine_mib=1, cc="8.7", trt="8.6.2",
                          gpu="Orin")  # fmt: skip
    code, out, err = cli("release", "install", orin, "--fleet", fleet_file, "--limit", "board2", "--json")
    (row,) = json.loads(out)["rows"]
    assert code == 1 and row["status"] == "failed", (out, err)
    assert "no engine in the bundle fits board2: it has NVIDIA H200 sm 9.0, TensorRT 8.6.0" in row["error"]
    assert "the bundle offers sm8.7-trt8.6.2 (Orin, sm 8.7, TensorRT 8.6.2)" in row["error"]
    assert current(members[1]) == name1


@pytest.mark.sshd
def test_a_switch_or_rollback_whose_current_changed_meanwhile_is_refused(fleet, agent_pyz, cli):
    """Two operators on one board: another install switches board1 while this one is checking its engine
    there; this install's switch is refused (its row fails, naming what current became) and current is
    the other install's. board2, untouched by the other operator, is switched as usual."""
    import hashlib

    from edgeq.cli.release import _line
    from edgeq.orchestration.fleet_file import load_fleet
    from edgeq.orchestration.install import InstallOptions, install, rollback
    from edgeq.pipeline.stages import ProfileSettings

    root, members, fleet_file = fleet
    v1, name1 = make_bundle(root, "v1", created="2026-01-01T00:00:00Z", engine_mib=1)
    v2, name2 = make_bundle(root, "v2", created="2026-02-01T00:00:00Z", engine_mib=1)
    assert cli("release", "install", v1, "--fleet", fleet_file, "--limit", "board1:board2", "--duration",
               "0")[0] == 0  # fmt: skip
    releases = members[0].work_dir / "releases"
    other = root / "other.plan"
    other.write_bytes(b"the other operator's engine")
    sha = hashlib.sha256(other.read_bytes()).hexdigest()

    def other_operator(*args):  # the real agent on board1's releases directory
        code, reply = _agent(agent_pyz, *args, f"--releasesDir={releases}")
        assert code == 0, reply

    raced = []

    def on_row(row):
        if row.target == "board1" and row.stage == "inspect" and not raced:
            raced.append(row.stage)
            other_operator("install", "--version=net-other", f"--engine={other}", f"--sha256={sha}")
            other_operator("switch", "--version=net-other")

    fleet_obj = load_fleet(fleet_file)
    options = InstallOptions(limit="board1:board2", canary=0, profile=ProfileSettings(duration=0))
    result = install(v2, fleet_obj, options, on_row=on_row)
    rows = {r.target: r for r in result.rows}
    assert raced and result.exit_code == 1
    b1 = rows["board1"]
    assert (b1.status, b1.stage, b1.previous, b1.switched, b1.gate) == ("failed", "switch", name1, None, True)
    assert "current changed to net-other during this install (another install?): not switched" in b1.error
    assert "current left at" not in _line("install", b1)  # it was not left: someone else moved it
    assert current(members[0]) == "net-other" and history(members[0]) == [name1, "net-other"]
    assert (releases / name2 / "engine.plan").is_file()  # installed and checked, never current
    assert rows["board2"].status == "installed" and rows["board2"].switched is True
    assert current(members[1]) == name2

    # rollback reads current first and expects it still: moved meanwhile (back to v1 by the other
    # operator) -> refused, left as the other operator set it; then, unraced, it goes back one version
    def on_rollback(row):
        if row.target == "board1" and row.stage == "rollback" and len(raced) == 1:
            raced.append(row.stage)
            other_operator("switch", f"--version={name1}")

    back = rollback(fleet_obj, InstallOptions(limit="board1"), on_row=on_rollback)
    (row,) = back.rows
    assert len(raced) == 2 and back.exit_code == 1 and row.status == "failed" and row.previous == "net-other"
    assert f"current changed to {name1} during this rollback (another install?): not rolled back" in row.error
    assert current(members[0]) == name1 and history(members[0]) == [name1, "net-other", name1]
    code, out, err = cli("release", "rollback", "--fleet", fleet_file, "--limit", "board1", "--json")
    (row,) = json.loads(out)["rows"]
    assert code == 0 and (row["previous"], row["version"]) == (name1, "net-other"), (out, err)
    assert current(members[0]) == "net-other"


def _running(program) -> bool:
    """Is a process running ``program`` (a board's trtexec stand-in) still alive? From /proc."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(program).encode() in cmdline.read_bytes():
                return True
        except OSError:
            continue
    return False


def _wait_for(predicate, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.sshd
def test_ctrl_c_during_install_switches_no_board_after_it_and_says_what_each_kept(fleet, servers):
    """Issue 27.1: a real SIGINT to a real ``edgeq release install`` while board1 has switched and boards 2
    and 3 are timing the new engine (their trtexec sleeping 20 s): it stops within seconds, boards 2 and
    3 keep v1 (no switch after the interrupt; their trtexec killed on the board), one line per board
    says what it kept, exit 130, and no /tmp/edgeq-install-* is left (TMPDIR is the test's own)."""
    root, members, fleet_file = fleet
    v1, name1 = make_bundle(root, "v1", created="2026-01-01T00:00:00Z", engine_mib=1)
    v2, name2 = make_bundle(root, "v2", created="2026-02-01T00:00:00Z", engine_mib=1)
    from edgeq.cli import run

    assert run(["release", "install", str(v1), "--fleet", str(fleet_file), "--duration", "0"]) == 0
    make_members(root, servers, slow={"board2": 20.0, "board3": 20.0})  # their trtexec, rewritten
    tmp = root / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", "from edgeq.cli import main; main()", "release",
                             "install", str(v2), "--fleet", str(fleet_file), "--duration", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        timing = [f"--loadEngine={m.work_dir / 'releases' / name2 / 'engine.plan'}" for m in members]
        _wait_for(lambda: current(members[0]) == name2 and all(
            any(timing[i] in argv for argv in calls(members[i].trtexec)) for i in (1, 2)))
        assert [glob.glob(str(tmp / "edgeq-install-*"))] != [[]]  # the install's own, while it runs
        interrupted = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    stopped_in = time.monotonic() - interrupted
    assert proc.returncode == 130 and "Traceback" not in out + err, (out, err)
    assert stopped_in < 10, stopped_in  # not the 20 s the boards' trtexec sleeps
    assert [current(m) for m in members] == [name2, name1, name1]
    assert [history(m) for m in members] == [[name1, name2], [name1], [name1]]
    lines = {ln.split(":", 1)[0]: ln for ln in out.splitlines() if ln.startswith("board")}
    assert lines["board1"].startswith(f"board1: installed, current {name2} (was {name1})"), out
    for b in ("board2", "board3"):  # what the board runs first (issue 43.6)
        assert lines[b] == f"{b}: interrupted, current left at {name1}, stopped during inspect", out
    assert "interrupted: 1/3 boards finished; no board was started or switched after Ctrl-C" in out
    assert not any(_running(m.trtexec) for m in members[1:])  # killed on the boards, not left running
    assert os.listdir(tmp) == []


@pytest.mark.sshd
def test_a_board_never_reached_reads_current_unknown_not_none(fleet, servers, cli, no_backoff):
    """Issue 27.8: it read "current left at (none)" while the board ran v1. What it runs was never read."""
    root, members, fleet_file = fleet
    v1, name1 = make_bundle(root, "v1", created="2026-01-01T00:00:00Z", engine_mib=1)
    v2, _ = make_bundle(root, "v2", created="2026-02-01T00:00:00Z", engine_mib=1)
    code, _, _ = cli("release", "install", v1, "--fleet", fleet_file, "--limit", "board3", "--duration", "0")
    assert code == 0
    servers[2].stop()
    code, out, err = cli("release", "install", v2, "--fleet", fleet_file, "--limit", "board3")
    assert code == 1, (out, err)
    (line,) = [ln for ln in out.splitlines() if ln.startswith("board3:")]
    said = "board3: failed, current unknown (unreachable: connection refused), cannot connect"
    assert line.startswith(said) and "(none)" not in line, line
    code, out, _ = cli("release", "install", v2, "--fleet", fleet_file, "--limit", "board3", "--json")
    (row,) = json.loads(out)["rows"]
    assert (row["seen"], row["cause"], row["kept"]) == (False, "connection refused",
                                                        "current unknown (unreachable: connection refused)")
    servers[2].ensure_running()
    assert current(members[2]) == name1


@pytest.mark.sshd
def test_install_max_fail_starts_no_board_after_n_failures_and_says_skipped(fleet, servers, cli, no_backoff):
    """Issue 27.20: ``release install --max-fail`` as ``fleet validate``'s (one mechanism,
    edgeq.orchestration.pool): one board at a time, board1 unreachable -> boards 2 and 3 are skipped,
    never touched (no release directory on them), and said so, not FAILED."""
    root, members, fleet_file = fleet
    v1, name1 = make_bundle(root, "v1", created="2026-01-01T00:00:00Z", engine_mib=1)
    servers[0].stop()
    code, out, err = cli("release", "install", v1, "--fleet", fleet_file, "--workers", "1", "--max-fail", "1",
                         "--canary", "0", "--json")  # fmt: skip
    assert code == 1, (out, err)
    rows = {r["target"]: r for r in json.loads(out)["rows"]}
    assert rows["board1"]["status"] == "failed" and rows["board1"]["cause"] == "connection refused"
    for b in ("board2", "board3"):
        assert rows[b]["status"] == "skipped" and rows[b]["error"] == "not started: max-fail: 1 failed"
        assert rows[b]["kept"] == "not touched"
    assert not (members[1].work_dir / "releases").exists() and not (members[2].work_dir / "releases").exists()
    code, out, _ = cli("release", "install", v1, "--fleet", fleet_file, "--workers", "1", "--max-fail", "1",
                       "--canary", "0")  # fmt: skip
    assert code == 1 and "board2: skipped, " in out and "FAILED" not in out, out
    servers[0].ensure_running()
    code, out, err = cli("release", "install", v1, "--fleet", fleet_file, "--max-fail", "1",
                         "--duration", "0")  # fmt: skip
    assert code == 0 and [current(m) for m in members] == [name1] * 3, (out, err)


def _keys(root):
    keys = {}
    for who in ("alice", "mallory"):
        key = root / f"id_{who}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(key)], check=True)
        keys[who] = key
    allowed = root / "allowed_signers"
    pub = (root / "id_alice.pub").read_text().split()
    allowed.write_text(f'alice@example.com namespaces="edgeq-release" {pub[0]} {pub[1]}\n')
    return keys, allowed


def _tamper(bundle, dst):
    """The attack of issue 21: an engine edited, its sha256 and the manifest's own hash recomputed."""
    import gzip
    import hashlib
    import io
    import tarfile

    from edgeq.release.bundle import MANIFEST, read_bundle, seal

    files = read_bundle(bundle)
    m = json.loads(files[MANIFEST])
    path = next(iter(m["engines"].values()))["path"]
    files[path] = files[path][:-16] + b"\x90" * 16
    for f in m["files"]:
        if f["path"] == path:
            f["sha256"], f["size"] = hashlib.sha256(files[path]).hexdigest(), len(files[path])
    files[MANIFEST] = json.dumps(seal(m), indent=2, sort_keys=True).encode()
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            tar.addfile(info, io.BytesIO(files[name]))
    dst.write_bytes(raw.getvalue())
    return dst


def test_sign_verify_and_the_tamper_and_rehash_attack(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    keys, allowed = _keys(tmp_path)
    bundle, _ = make_bundle(tmp_path, "v1", created="2026-01-01T00:00:00Z", engine_mib=1)
    code, out, err = cli("release", "verify", bundle, "--allowed-signers", allowed)
    assert code == 1 and "[signature]" in out and "not signed" in out, (out, err)

    code, out, err = cli("release", "sign", bundle, "--key", keys["alice"])
    sig = tmp_path / "v1.tar.gz.sig"
    assert code == 0 and sig.read_text().startswith("-----BEGIN SSH SIGNATURE-----"), err
    code, out, _ = cli("release", "verify", bundle, "--allowed-signers", allowed)
    assert code == 0 and "signed by alice@example.com" in out and 'Good "edgeq-release" signature' in out
    code, out, _ = cli("release", "verify", bundle, "--allowed-signers", allowed, "--json")
    assert code == 0 and json.loads(out)["signer"]["principal"] == "alice@example.com"

    # the attack: plain verify still passes (the manifest agrees with itself), the signature does not
    bad = _tamper(bundle, tmp_path / "bad.tar.gz")
    (tmp_path / "bad.tar.gz.sig").write_bytes(sig.read_bytes())
    code, out, _ = cli("release", "verify", bad)
    assert code == 0 and "OK" in out
    code, out, err = cli("release", "verify", bad, "--allowed-signers", allowed)
    assert code == 1 and "Traceback" not in out + err
    assert "the signature does not match the bundle (signed by alice@example.com" in out

    # signed with a key the file does not list; an ssh-keygen signature of another namespace
    code, _, _ = cli("release", "sign", bundle, "--key", keys["mallory"])
    code, out, _ = cli("release", "verify", bundle, "--allowed-signers", allowed)
    assert code == 1 and "untrusted" in out
    other = subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(keys["alice"]), "-n", "file"],
                           input=bundle.read_bytes(), capture_output=True, check=True).stdout  # fmt: skip
    sig.write_bytes(other)
    code, out, _ = cli("release", "verify", bundle, "--allowed-signers", allowed)
    assert code == 1 and "does not match" in out

    # bad input: one line, exit 2, nothing written
    code, _, err = cli("release", "sign", tmp_path / "nope.tar.gz", "--key", keys["alice"])
    assert code == 2 and "no such bundle" in err and not (tmp_path / "nope.tar.gz.sig").exists()
    code, _, err = cli("release", "sign", bundle, "--key", tmp_path / "nokey")
    assert code == 2 and "no such key" in err
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, _, err = cli("release", "verify", bundle, "--allowed-signers", allowed)
    assert code == 2 and "ssh-keygen not found" in err and len(err.strip().splitlines()) == 1


@pytest.mark.sshd
def test_a_fleet_with_allowed_signers_installs_only_trusted_bundles(fleet, cli):
    root, members, fleet_file = fleet
    keys, _ = _keys(root)
    fleet_file.write_text(fleet_file.read_text() + "allowed_signers: allowed_signers\n")
    bundle, name = make_bundle(root, "v1", created="2026-01-01T00:00:00Z", engine_mib=1)
    code, out, err = cli("release", "install", bundle, "--fleet", fleet_file, "--duration", "0")
    assert code == 2 and "refused:" in err and "not signed" in err and "Traceback" not in out + err
    assert f"{bundle}: not signed" in err and f"edgeq release sign {bundle} " in err  # the user's file
    assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1
    assert cli("release", "sign", bundle, "--key", keys["mallory"])[0] == 0
    code, _, err = cli("release", "install", bundle, "--fleet", fleet_file, "--duration", "0")
    assert code == 2 and "untrusted" in err
    bad = _tamper(bundle, root / "bad.tar.gz")
    assert cli("release", "sign", bundle, "--key", keys["alice"])[0] == 0
    (root / "bad.tar.gz.sig").write_bytes((root / "v1.tar.gz.sig").read_bytes())
    code, _, err = cli("release", "install", bad, "--fleet", fleet_file, "--duration", "0")
    assert code == 2 and "does not match" in err
    flipped = bytearray(bundle.read_bytes())  # damaged in transit: refused before any board, exit 1
    flipped[len(flipped) // 2] ^= 1
    (root / "flip.tar.gz").write_bytes(bytes(flipped))
    (root / "flip.tar.gz.sig").write_bytes((root / "v1.tar.gz.sig").read_bytes())
    no_signers = root / "plain.yaml"
    no_signers.write_text("targets: ['targets/board*.yaml']\n")
    code, _, err = cli("release", "install", root / "flip.tar.gz", "--fleet", no_signers)
    assert code == 2 and ("does not verify" in err or "corrupt bundle" in err), err  # refused, as above
    code, _, err = cli("release", "install", root / "nope.tar.gz", "--fleet", fleet_file)
    assert code == 2 and "nope.tar.gz: no such bundle" in err
    assert [current(m) for m in members] == [None] * 3  # nothing reached a board

    code, out, err = cli("release", "install", bundle, "--fleet", fleet_file, "--limit", "board1",
                         "--duration", "0")  # fmt: skip
    assert code == 0 and "signed by alice@example.com" in out, (out, err)
    rows = status(cli, fleet_file, "--limit", "board1")
    assert rows["board1"]["version"] == name and rows["board1"]["release"]["signer"] == "alice@example.com"
    # a missing file is the fleet file's error
    (root / "fleet2.yaml").write_text("targets: [targets/board1.yaml]\nallowed_signers: nope\n")
    code, _, err = cli("fleet", "status", "--fleet", root / "fleet2.yaml")
    assert code == 2 and "allowed_signers" in err and "does not exist" in err


def test_a_bundle_refused_before_any_board_exits_2_and_names_the_users_file(tmp_path, cli, monkeypatch):
    """Not a bundle (an ONNX model), unsigned, edited and re-hashed, or damaged in transit: refused before
    any board is touched, exit 2 whether or not the fleet names allowed_signers (one cause, one code), the
    message naming the file the user gave (``unsigned.tar.gz.sig``, not the private copy's name). The
    boards are 127.0.0.1 ports nothing listens on: contacting one would fail its row (exit 1)."""
    from fleet_helpers import qdq_model

    monkeypatch.chdir(tmp_path)
    keys, _ = _keys(tmp_path)
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "b1.yaml").write_text(
        f"host: 127.0.0.1\nport: 1\nuser: me\nuse_agent: true\nknown_hosts: {tmp_path / 'kh'}\n")
    plain = tmp_path / "plain.yaml"
    plain.write_text("targets: ['targets/b1.yaml']\n")
    signed = tmp_path / "signed.yaml"
    signed.write_text(plain.read_text() + "allowed_signers: allowed_signers\n")
    bundle, _ = make_bundle(tmp_path, "unsigned", created="2026-01-01T00:00:00Z", engine_mib=1)

    code, out, err = cli("release", "install", bundle, "--fleet", signed)
    assert code == 2 and f"{bundle}: not signed (no unsigned.tar.gz.sig beside it)" in err, (out, err)
    assert "bundle.tar.gz" not in err.replace("unsigned.tar.gz", "")

    model = qdq_model(tmp_path / "model.onnx")
    for fleet in (plain, signed):
        code, out, err = cli("release", "install", model, "--fleet", fleet)
        assert code == 2 and f"{model}: not a .tar.gz bundle" in err, (fleet, out, err)
        assert "corrupt" not in err and "damaged" not in err and len(err.strip().splitlines()) == 1

    good = tmp_path / "good.tar.gz"
    good.write_bytes(bundle.read_bytes())
    assert cli("release", "sign", good, "--key", keys["alice"])[0] == 0
    bad = _tamper(good, tmp_path / "bad.tar.gz")  # edited, its hashes recomputed: only a signature tells
    flipped = bytearray(good.read_bytes())
    flipped[len(flipped) // 2] ^= 1
    flip = tmp_path / "flip.tar.gz"
    flip.write_bytes(bytes(flipped))
    for b in (bad, flip):
        (tmp_path / f"{b.name}.sig").write_bytes((tmp_path / "good.tar.gz.sig").read_bytes())
    # (the edited bundle without allowed_signers verifies, the manifest agreeing with itself: only a
    # signature catches it, test_sign_verify_and_the_tamper_and_rehash_attack)
    runs = {(b.name, f.name): cli("release", "install", b, "--fleet", f) for b, f in
            ((bad, signed), (flip, plain), (flip, signed))}  # fmt: skip
    assert {k: code for k, (code, _, _) in runs.items()} == dict.fromkeys(runs, 2), runs
    assert "does not match" in runs["bad.tar.gz", "signed.yaml"][2]
    assert "corrupt bundle" in runs["flip.tar.gz", "plain.yaml"][2]


# -- the agent's side, without SSH ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent_pyz(tmp_path_factory):
    from edgeq.remote.zipapp import build_agent

    return build_agent(tmp_path_factory.mktemp("agent"))


def _agent(pyz, *args):
    proc = subprocess.run([sys.executable, str(pyz.path), *args, "--backend=trtexec"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    return proc.returncode, json.loads(proc.stdout)


def test_agent_install_switch_rollback_status(agent_pyz, tmp_path):
    import hashlib

    root = tmp_path / "releases"
    engines = {}
    for v in ("a", "b", "c"):
        engines[v] = tmp_path / f"{v}.plan"
        engines[v].write_bytes(v.encode() * 1000)
    sha = {v: hashlib.sha256(p.read_bytes()).hexdigest() for v, p in engines.items()}
    d = f"--releasesDir={root}"

    code, reply = _agent(agent_pyz, "install", d, "--version=r1", f"--engine={engines['a']}",
                         f"--sha256={sha['b']}")  # fmt: skip
    assert code == 1 and reply["error"]["stage"] == "verify"
    assert "the manifest says" in reply["error"]["message"]
    assert not (root / "r1").exists()
    code, reply = _agent(agent_pyz, "install", d, "--version=../x", f"--engine={engines['a']}",
                         f"--sha256={sha['a']}")  # fmt: skip
    assert code == 2 and "not a release version name" in reply["error"]["message"]
    for v, name in (("a", "r1"), ("b", "r2"), ("c", "r3")):
        code, reply = _agent(agent_pyz, "install", d, f"--version={name}", f"--engine={engines[v]}",
                             f"--sha256={sha[v]}", '--meta={"kind": "k"}')  # fmt: skip
        assert code == 0 and reply["result"]["existing"] is False
        assert _agent(agent_pyz, "switch", d, f"--version={name}")[1]["result"]["changed"] is True
    code, reply = _agent(agent_pyz, "install", d, "--version=r1", f"--engine={engines['c']}",
                         f"--sha256={sha['c']}")  # fmt: skip
    assert code == 1 and "already installed with another engine" in reply["error"]["message"]
    st = _agent(agent_pyz, "status", d)[1]["result"]
    assert (st["current"], st["previous"], st["history"]) == ("r3", "r2", ["r1", "r2", "r3"])
    assert st["release"]["kind"] == "k" and st["installed"] == ["r1", "r2", "r3"]
    assert os.readlink(root / "current") == "r3"  # relative: the releases directory can move
    # a failed install's undo only when current is still that version
    code, reply = _agent(agent_pyz, "rollback", d, "--expect=r2")
    assert code == 1 and reply["error"]["stage"] == "rollback"
    assert reply["error"]["message"] == ("current changed to r3 during this rollback (another install?): "
                                         "not rolled back")
    assert os.readlink(root / "current") == "r3"
    assert [_agent(agent_pyz, "rollback", d)[1]["result"]["current"] for _ in range(2)] == ["r2", "r1"]
    code, reply = _agent(agent_pyz, "rollback", d)
    assert code == 1 and "no earlier version" in reply["error"]["message"]
    assert _agent(agent_pyz, "rollback", d, "--expect=r1", "--allowNone")[1]["result"]["current"] is None
    assert not os.path.lexists(root / "current")
    assert not [p for p in os.listdir(root) if ".tmp-" in p]  # no temporary left behind


def _installed(agent_pyz, tmp_path):
    """releases/ with r1, r2 and r3 installed, nothing current yet."""
    import hashlib

    root = tmp_path / "releases"
    for name in ("r1", "r2", "r3"):
        engine = tmp_path / f"{name}.plan"
        engine.write_bytes(name.encode() * 1000)
        code, _ = _agent(agent_pyz, "install", f"--releasesDir={root}", f"--version={name}",
                         f"--engine={engine}", f"--sha256={hashlib.sha256(engine.read_bytes()).hexdigest()}")
        assert code == 0
    return root


def test_agent_switch_is_compare_and_swap_under_the_releases_lock(agent_pyz, tmp_path):
    import fcntl
    import time

    root = _installed(agent_pyz, tmp_path)
    d = f"--releasesDir={root}"
    # --expect= (empty): no current expected; then r1 is current and the same expectation no longer holds
    assert _agent(agent_pyz, "switch", d, "--version=r1", "--expect=")[1]["result"]["changed"] is True
    code, reply = _agent(agent_pyz, "switch", d, "--version=r2", "--expect=")
    assert code == 1 and reply["error"]["stage"] == "switch"
    assert reply["error"]["message"] == ("current changed to r1 during this install (another install?): "
                                         "not switched")
    assert os.readlink(root / "current") == "r1" and json.loads((root / "history").read_text()) == ["r1"]
    # the same version already current (two installs of one release): nothing to do, not a conflict
    assert _agent(agent_pyz, "switch", d, "--version=r1", "--expect=r2")[1]["result"]["changed"] is False

    # the compare happens under the flock: a switch started while another operation holds releases/.lock
    # waits for it, and then sees what that operation made current (r3, by hand here) and refuses
    with open(root / ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = subprocess.Popen([sys.executable, str(agent_pyz.path), "switch", d, "--version=r2",
                                 "--expect=r1", "--backend=trtexec"], stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        assert proc.poll() is None  # blocked on the lock
        os.symlink("r3", root / ".current.by-hand")
        os.replace(root / ".current.by-hand", root / "current")
        fcntl.flock(held, fcntl.LOCK_UN)
    reply = json.loads(proc.communicate(timeout=60)[0])
    assert proc.returncode == 1 and "current changed to r3 during this install" in reply["error"]["message"]
    assert os.readlink(root / "current") == "r3" and json.loads((root / "history").read_text()) == ["r1"]
    assert not [p for p in os.listdir(root) if ".tmp-" in p]


def test_agent_refused_switch_releases_the_lock(tmp_path):
    """In-process (the agent's module, not its subprocess, whose exit would drop the lock anyway)."""
    import argparse
    import fcntl

    from edgeq.agent.common import AgentError
    from edgeq.agent.releases import rollback, switch

    root = tmp_path / "releases"
    for name in ("r1", "r2"):
        (root / name).mkdir(parents=True)
        (root / name / "engine.plan").write_bytes(b"x")
    os.symlink("r1", root / "current")
    with pytest.raises(AgentError, match="current changed to r1 during this install"):
        switch(argparse.Namespace(releasesDir=str(root), version="r2", expect="r2"))
    with pytest.raises(AgentError, match="current changed to r1 during this rollback"):
        rollback(argparse.Namespace(releasesDir=str(root), expect="r2", allowNone=False))
    with open(root / ".lock", "a") as f:  # another open file: blocked if the refused calls still held it
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(f, fcntl.LOCK_UN)
    assert os.readlink(root / "current") == "r1" and not (root / "history").exists()
    assert switch(argparse.Namespace(releasesDir=str(root), version="r2", expect="r1"))["changed"] is True


def test_an_inventory_names_allowed_signers_and_its_groups_serve_limit(tmp_path):
    from edgeq.orchestration.fleet_file import load_fleet

    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "allowed").write_text("")
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {
        "vars": {"edgeq_use_agent": True, "ansible_user": "ops", "edgeq_allowed_signers": "keys/allowed"},
        "children": {"orins": {"hosts": {"orin1": {}, "orin2": {}}},
                     "xaviers": {"hosts": {"xav1": {}}, "children": {"lab": {"hosts": {"xav2": {}}}}}},
    }}))  # fmt: skip
    fleet = load_fleet(inv)
    assert fleet.allowed_signers == tmp_path / "keys" / "allowed"
    assert fleet.groups["xav2"] == {"all", "xaviers", "lab"} and fleet.groups["orin1"] == {"all", "orins"}
    names = lambda pattern: [t.name for t in fleet.limited(pattern).targets]  # noqa: E731
    assert names("xaviers") == ["xav1", "xav2"] and names("all:!lab") == ["orin1", "orin2", "xav1"]
    assert names("orin*:&orins") == ["orin1", "orin2"] and names(None) == ["orin1", "orin2", "xav1", "xav2"]
    ini = tmp_path / "hosts.ini"
    ini.write_text("[orins]\norin1 ansible_host=10.0.0.5\n[jetsons:children]\norins\n"
                   "[all:vars]\nedgeq_use_agent=true\nansible_user=ops\n")
    assert {"orins", "jetsons"} <= load_fleet(ini).groups["orin1"]  # [jetsons:children] holds orins


# -- issue 43: a fleet operator's defects ------------------------------------------------------------------


def _edited(bundle, dst):
    """Damaged in a way the archive does not show: an engine's bytes changed, the manifest left as it was."""
    import gzip
    import io
    import tarfile

    from edgeq.release.bundle import read_bundle

    files = read_bundle(bundle)
    path = next(p for p in files if p.endswith("engine.plan"))
    files[path] = files[path][:-16] + b"\x90" * 16
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            tar.addfile(info, io.BytesIO(files[name]))
    dst.write_bytes(raw.getvalue())
    return dst


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sign_verifies_first_and_every_refusal_names_the_damage_before_signatures(tmp_path, cli, monkeypatch):
    """Issue 43.2: ``release sign`` signed a truncated bundle and a model ("wrote ....sig", exit 0), and
    installing the truncated one said "not signed ... (sign it: ...)". Sign verifies the bundle first
    (exit 2, no .sig written); install and verify name the damage, never the signature, first."""
    from fleet_helpers import qdq_model

    from edgeq.release.sign import signature_path

    monkeypatch.chdir(tmp_path)
    keys, allowed = _keys(tmp_path)
    bundle, _ = make_bundle(tmp_path, "v1", created="2026-01-01T00:00:00Z", engine_mib=1)
    truncated = tmp_path / "t.tar.gz"
    truncated.write_bytes(bundle.read_bytes()[:40000])  # head -c 40000 v1.tar.gz > t.tar.gz
    model = qdq_model(tmp_path / "model.onnx")
    edited = _edited(bundle, tmp_path / "edited.tar.gz")
    for bad, said in ((truncated, "corrupt bundle"), (model, "not a .tar.gz bundle"),
                      (edited, "does not verify ([modified] engines/")):  # fmt: skip
        code, out, err = cli("release", "sign", bad, "--key", keys["alice"])
        (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert code == 2 and "Traceback" not in out + err and "wrote" not in out, (out, err)
        assert line.startswith(f"error: not signed: {bad}: ") and said in line, line
        assert not signature_path(bad).exists()

    (tmp_path / "targets").mkdir()  # a board nothing listens for: reaching it would fail a row (exit 1)
    (tmp_path / "targets" / "b1.yaml").write_text(f"host: 127.0.0.1\nport: {_closed_port()}\nuser: me\n"
                                                  f"use_agent: true\nknown_hosts: {tmp_path / 'kh'}\n")
    signed = tmp_path / "signed.yaml"
    signed.write_text("targets: ['targets/b1.yaml']\nallowed_signers: allowed_signers\n")
    for bad, said in ((truncated, "corrupt bundle"), (edited, "does not verify")):
        code, out, err = cli("release", "install", bad, "--fleet", signed)
        (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert code == 2 and line.startswith(f"error: not installed: {bad}: ") and said in line, line
        assert "signed" not in line and "sign it" not in line, line
    code, out, err = cli("release", "verify", truncated, "--allowed-signers", allowed)
    assert code == 1 and "corrupt bundle" in err and "signature" not in out + err, (out, err)
    code, out, err = cli("release", "sign", bundle, "--key", keys["alice"])  # an intact bundle signs
    assert code == 0 and signature_path(bundle).is_file(), err


@pytest.mark.sshd
def test_install_puts_one_board_first_by_default_and_canary_0_goes_all_at_once(fleet, cli):
    """Issue 43.3: ``--canary`` defaulted to 0, every board at once, while the docs called the canary the
    safe default. By default one board installs first and the others only once it passed; ``--canary 0``
    goes all at once, and ``--help`` says both."""
    root, members, fleet_file = fleet
    v1, name1 = make_bundle(root, "v1", created="2026-01-01T00:00:00Z", engine_mib=1,
                            qps={"board1": 5000.0})  # board1 measures 0.25x its row: it fails  # fmt: skip
    code, out, err = cli("release", "install", v1, "--fleet", fleet_file, "--duration", "0")
    assert code == 1 and "canary failed on board1: stopped; 2 other boards not touched" in out, (out, err)
    assert [current(m) for m in members] == [None] * 3
    assert not any((m.work_dir / "releases").exists() for m in members[1:])  # never touched
    code, out, err = cli("release", "install", v1, "--fleet", fleet_file, "--duration", "0", "--canary", "0",
                         "--json")  # fmt: skip
    res = json.loads(out)
    assert code == 1 and res["canary"] == [] and not res["stopped"], (out, err)
    assert [r["status"] for r in res["rows"]] == ["failed", "installed", "installed"]
    assert [current(m) for m in members] == [None, name1, name1]
    code, out, _ = cli("release", "install", "--help")
    text = " ".join(out.split())
    assert code == 0 and "Canary first, by default" in text
    assert "--canary 0 installs on every board at once" in text


@pytest.mark.sshd
def test_status_and_install_say_unknown_alike_for_a_board_not_read(fleet, servers, cli, no_backoff):
    """Issue 43.4: ``fleet status`` showed an unreachable board (refused, an unresolvable name, a changed
    host key, a hung sshd) as "current (none)" with ``"version": null``, which reads "runs nothing", while
    ``release install`` said "current unknown (unreachable: ...)". One wording in both; null only for a
    board read and found to run nothing."""
    from fleet_helpers import SilentPeer
    from sshd import keygen

    root, members, _ = fleet
    kind, blob = Path(f"{keygen(root / 'other_host_key')}.pub").read_text().split()[:2]
    (root / "kh_changed").write_text(f"[127.0.0.1]:{servers[1].port} {kind} {blob}\n")
    peer = SilentPeer("banner")
    boards = {
        "refused": members[0].target_dict(port=_closed_port()),
        "badname": members[0].target_dict(host="orin..lab"),
        "changed": members[1].target_dict(known_hosts=str(root / "kh_changed")),
        "hung": peer.target_dict(root, connect=2),
    }
    for name, d in boards.items():
        (root / "targets" / f"{name}.yaml").write_text(yaml.safe_dump(d))
    mixed = root / "mixed.yaml"
    mixed.write_text("targets: [targets/board1.yaml, targets/refused.yaml, targets/badname.yaml, "
                     "targets/changed.yaml, targets/hung.yaml]\n")
    try:
        code, out, err = cli("fleet", "status", "--fleet", mixed, "--json")
        rows = {r["target"]: r for r in json.loads(out)["rows"]}
        code_text, text, _ = cli("fleet", "status", "--fleet", mixed)
    finally:
        peer.close()
    kept = {"refused": "current unknown (unreachable: connection refused)",
            "badname": "current unknown (unreachable: unknown host name)",
            "changed": "current unknown (host key changed)",
            "hung": "current unknown (unreachable: no SSH banner)"}  # fmt: skip
    assert code == code_text == 2, (out, err)  # a changed key, a bad name: yours to fix
    b1 = rows["board1"]
    assert (b1["status"], b1["version"], b1["current"]) == ("ok", None, None)
    lines = {ln.split(":", 1)[0]: ln for ln in text.splitlines()}
    assert lines["board1"].startswith("board1: ok, current (none)"), text  # read: it runs nothing
    for name, words in kept.items():
        r = rows[name]
        assert (r["status"], r["version"], r["current"], r["previous"]) == ("failed", *["unknown"] * 3), r
        assert r["kept"] == words and lines[name].startswith(f"{name}: failed, {words}, "), lines[name]
        assert "(none)" not in lines[name]
    code, out, _ = cli("release", "install", make_bundle(root, "v1", created="2026-01-01T00:00:00Z",
                                                           engine_mib=1)[0],
                       "--fleet", mixed, "--limit", "refused")  # fmt: skip
    (line,) = [ln for ln in out.splitlines() if ln.startswith("refused:")]
    assert code == 1 and line.startswith(f"refused: failed, {kept['refused']}, "), line  # the same words


def test_an_install_row_leads_with_what_the_board_runs_now():
    """Issue 43.6: a board not switched read like an upgrade ("board2: interrupted, NEW (was OLD), ...,
    current left at OLD"; "b2: failed, NEW, cannot connect"). Each row says first what the board runs
    now: the new version only where it was switched to it."""
    from edgeq.cli.release import _line
    from edgeq.orchestration.install import BoardRow

    old, new = "net-20260101T000000Z-4d23b264", "net-20260201T000000Z-fc9b2a1f"
    rows = {
        "installed": BoardRow("b1", "d", "installed", version=new, previous=old, seen=True, switched=True,
                              throughput_qps=12345.6, recorded_qps=12000.0, ratio=1.029, gate=True),
        "interrupted": BoardRow("b2", "d", "interrupted", stage="profile", version=new, previous=old,
                                seen=True, error="stopped during profile"),
        "failed": BoardRow("b3", "d", "failed", version=new, previous=old, seen=True, throughput_qps=309.0,
                           recorded_qps=1234.0, ratio=0.25, gate=True, error="below --min-ratio 0.9"),
        "unreachable": BoardRow("b4", "d", "failed", stage="connect", version=new, cause="connection refused",
                                error="cannot connect to me@127.0.0.1:1: connection refused"),
        "not run": BoardRow("b5", "d", "not run", version=new, error="not started: a canary board failed"),
    }  # fmt: skip
    lines = {k: _line("install", r) for k, r in rows.items()}
    assert lines["installed"] == (f"b1: [green]installed[/], current {new} (was {old}), 12.3k qps = 1.03x "
                                  "the recorded 12.0k, gate passed")  # no "1.235e+04" (issue 43.9)
    assert lines["interrupted"].endswith(f"interrupted[/], current left at {old}, stopped during profile")
    assert lines["failed"].endswith(f"failed[/], current left at {old}, 309 qps = 0.25x the recorded 1234, "
                                    "gate passed, below --min-ratio 0.9")
    assert lines["unreachable"].endswith("failed[/], current unknown (unreachable: connection refused), "
                                         "cannot connect to me@127.0.0.1:1: connection refused")
    assert lines["not run"].endswith("not run[/], not touched, not started: a canary board failed")
    assert all(new not in line for k, line in lines.items() if k != "installed"), lines
