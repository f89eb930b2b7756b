"""Board facts (issue 21.4): the agent's probe reads L4T from /etc/nv_tegra_release, CUDA and the driver;
the release manifest records them per engine with the JetPack they mean; the build refuses to start on a
disk without room in ``fleet validate`` and ``edgeq run`` as in ``deploy``.

A fake board's files live under ``EDGEQ_PROBE_ROOT`` (nothing is written to /etc): in-process for the
parsing, and on real loopback boards (sshd on 127.0.0.1) through a ``python`` that sets it, the way a
board's own files would be read.
"""

from __future__ import annotations

import json
import stat
import sys

import pytest
import yaml
from fleet_helpers import make_members, qdq_model, reformat_layer, write_fleet
from test_target_disk import _builds, local_target, small_disk  # noqa: F401 (small_disk: a fixture)

from edgeq.agent import probe
from edgeq.release.jetpack import jetpack_for, l4t_from_line, l4t_of

# as JetPack 6.0 DP writes it (L4T 36.2.0), and JetPack 4.6.1 (L4T 32.7.1)
R36 = ("# R36 (release), REVISION: 2.0, GCID: 34956989, BOARD: generic, EABI: aarch64, "
       "DATE: Fri Nov 24 00:00:00 UTC 2023\n# KERNEL_VARIANT: oot\nTARGET_USERSPACE_LIB_DIR=nvidia\n")
R32 = ("# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t186ref, EABI: aarch64, "
       "DATE: Sat Feb 19 17:07:00 UTC 2022\n")
NVRM = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  540.2.0  Release Build  (buildbrain@)\n"


def fake_board(root, release=R36, cuda="12.2.140", nvrm=NVRM):
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "nv_tegra_release").write_text(release)
    (root / "usr/local/cuda").mkdir(parents=True, exist_ok=True)
    version = {"cuda": {"name": "CUDA SDK", "version": cuda}}
    (root / "usr/local/cuda/version.json").write_text(json.dumps(version))
    (root / "proc/driver/nvidia").mkdir(parents=True, exist_ok=True)
    (root / "proc/driver/nvidia/version").write_text(nvrm)
    return root


@pytest.mark.parametrize("text, release, board", [
    (R36, "36.2.0", "generic"),
    (R32, "32.7.1", "t186ref"),
    ("# R35 (release), REVISION: 4.1", "35.4.1", None),
])
def test_nv_tegra_release_parses_to_the_l4t_release(text, release, board):
    got = probe.parse_nv_tegra_release(text)
    assert got["release"] == release and got.get("board") == board
    assert got["line"] == text.splitlines()[0]
    assert l4t_from_line(text) == release


@pytest.mark.parametrize("text", ["", "\n", "R36 2.0", "# R36 (release)"])
def test_what_is_not_that_line_is_no_release(text):
    assert probe.parse_nv_tegra_release(text) is None


def test_the_probe_reads_l4t_cuda_and_driver_from_the_boards_files(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEQ_PROBE_ROOT", str(fake_board(tmp_path)))
    facts = probe.system_facts()
    assert facts["l4t"]["release"] == "36.2.0"
    assert facts["cuda"]["toolkit"] == "12.2.140"
    assert facts["driver"] == "540.2.0"
    # CUDA 10's version.txt, a desktop driver's line, no L4T
    (tmp_path / "usr/local/cuda/version.json").unlink()
    (tmp_path / "usr/local/cuda/version.txt").write_text("CUDA Version 10.2.300\n")
    (tmp_path / "etc/nv_tegra_release").unlink()
    (tmp_path / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n")
    facts = probe.system_facts()
    assert facts["l4t"] is None and facts["cuda"]["toolkit"] == "10.2.300" and facts["driver"] == "535.104.05"


def test_jetpack_from_l4t():
    assert jetpack_for("36.2.0") == "6.0 DP" and jetpack_for("35.4.1") == "5.1.2"
    assert jetpack_for("32.7.1") == "4.6.1"
    assert jetpack_for("36.9.0") == "6.x"  # a release the table does not list: its major only
    assert jetpack_for("99.1.0") is None and jetpack_for(None) is None
    assert l4t_of({"l4t": {"release": "36.3.0"}}) == "36.3.0"
    assert l4t_of({"platform": {"jetson": {"l4t": "# R35 (release), REVISION: 5.0"}}}) == "35.5.0"
    assert l4t_of({}) is None


def _python_on(root, name, board_root):
    """The board's python: this interpreter, with its files under ``board_root``."""
    wrapper = root / f"python-{name}"
    wrapper.write_text(f'#!/bin/sh\nEDGEQ_PROBE_ROOT={board_root} exec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


@pytest.mark.sshd
def test_the_manifest_records_each_engines_board_facts(servers, boards, tmp_path, cli):
    members = make_members(tmp_path, servers[:2])
    fleet = write_fleet(tmp_path, members, reformat_layer())
    # two boards of one kind (the recording's GPU and TensorRT) on different L4T releases
    roots = {"board1": fake_board(tmp_path / "fs1"), "board2": fake_board(tmp_path / "fs2", R32, "10.2.300")}
    for m in members:
        t = yaml.safe_load((tmp_path / "targets" / f"{m.name}.yaml").read_text())
        t["python"] = _python_on(tmp_path, m.name, roots[m.name])
        (tmp_path / "targets" / f"{m.name}.yaml").write_text(yaml.safe_dump(t))
    model = qdq_model(tmp_path / "m.onnx")
    code, out, err = cli("fleet", "validate", model, "--fleet", fleet, "--json", "--duration", "0")
    assert code == 0, (out, err)
    fleet_dir = json.loads(out)["fleet_dir"]
    code, out, err = cli("release", "--from", fleet_dir, "-o", tmp_path / "b.tar.gz", "--json")
    assert code == 0, err
    engines = json.loads(out)["engines"]
    (engine,) = engines.values()  # one kind: the engine is the first builder's, its facts that board's
    board = roots[engine["built_on"]]
    want = ("36.2.0", "6.0 DP", "12.2.140") if board == roots["board1"] else ("32.7.1", "4.6.1", "10.2.300")
    assert (engine["l4t"], engine["jetpack"], engine["cuda"]) == want
    assert engine["cuda_driver"] == "540.2.0"
    assert isinstance(engine["disk_free_mib"], int) and engine["disk_free_mib"] > 0


def test_fleet_and_run_refuse_a_build_on_a_disk_without_room(tmp_path, monkeypatch, cli, small_disk):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    disk = small_disk(8)  # room for the agent and the model, not for a build
    trtexec = local_target(tmp_path, disk / "edgeq")
    (tmp_path / "fleet.yaml").write_text("targets: [here]\n")
    model = qdq_model(tmp_path / "net.onnx")
    code, out, err = cli("fleet", "validate", model, "--fleet", tmp_path / "fleet.yaml", "--json",
                         "--duration", "0")  # fmt: skip
    assert code == 1 and "Traceback" not in err
    (row,) = json.loads(out)["targets"]
    assert "build not started" in row["error"] and "MiB free on" in row["error"] and "needs" in row["error"]
    assert _builds(trtexec) == 0
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"model": str(model), "fleet": "fleet.yaml",
                                                     "profile": {"duration": 0}}))
    code, out, err = cli("run", tmp_path / "p.yaml", "--json")
    assert code == 1 and "Traceback" not in err
    fleet = json.loads((tmp_path / "runs" / "pipeline-p" / "fleet.json").read_text())
    assert "build not started" in fleet["targets"][0]["error"]
    assert _builds(trtexec) == 0
