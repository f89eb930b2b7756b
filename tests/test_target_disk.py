"""A target whose disk is full (issue 20.9): the probe reports the free space where the agent works, the
build stage refuses to start below what the model needs, and a disk that fills up mid-run is named
(``[Errno 28] No space left on device``) where the user reads the error, not only in deploy.log.

The target is this machine (``host: local``: the agent runs as a subprocess) with its work_dir on a
small tmpfs, and a trtexec stand-in replaying the recorded TensorRT 8.6.0 ResNet-50 run
(tests/trtexec_replay.py): real files on a real full filesystem, not TensorRT.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fleet_helpers import FIXTURES, ORTFB, qdq_model
from trtexec_replay import Recorded, calls, replay_trtexec

MiB = 1 << 20


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs mounted for the test (root and a kernel that allows it), unmounted after."""
    made = []

    def mount(size_mib: int) -> Path:
        where = tmp_path / f"disk{len(made)}"
        where.mkdir()
        try:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(where)],
                               capture_output=True, timeout=20)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            pytest.skip("cannot mount a tmpfs here")
        if r.returncode != 0:
            pytest.skip("cannot mount a tmpfs here")
        made.append(where)
        return where

    yield mount
    for where in made:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=20)


def local_target(root: Path, work_dir: Path) -> Path:
    """targets/here.yaml: this machine, trtexec replaying the recorded ResNet-50 build and run."""
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    trtexec = replay_trtexec(
        bin_dir, build=Recorded(FIXTURES / f"{ORTFB}.build.log"), run=Recorded(FIXTURES / f"{ORTFB}.run.log"),
        layers=FIXTURES / f"{ORTFB}.layers.json", profile=FIXTURES / f"{ORTFB}.profile.json",
    )  # fmt: skip
    (root / "targets").mkdir(exist_ok=True)
    (root / "targets" / "here.yaml").write_text(yaml.safe_dump({
        "host": "local", "work_dir": str(work_dir), "python": sys.executable, "tensorrt": "8.6",
        "backend": "trtexec", "trtexec": str(trtexec), "build": {"timing_cache": False},
    }))  # fmt: skip
    return trtexec


def _builds(trtexec: Path) -> int:
    return sum(any(a.startswith("--onnx=") for a in argv) for argv in calls(trtexec))


def test_the_build_refuses_to_start_on_a_disk_without_room_for_the_engine(tmp_path, monkeypatch, cli,
                                                                          small_disk):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    disk = small_disk(8)  # room for the agent and the model, not for a build
    trtexec = local_target(tmp_path, disk / "edgeq")
    model = qdq_model(tmp_path / "net.onnx")
    code, out, err = cli("targets", "check", "here", "--json")
    assert code == 0, err
    facts = json.loads(out)
    assert facts["disk"]["path"].startswith(str(disk)) and 0 < facts["disk"]["free_bytes"] <= 8 * MiB
    code, out, _ = cli("targets", "check", "here")
    assert code == 0 and f"MiB free disk at {facts['disk']['path']}" in " ".join(out.split())
    code, out, err = cli("deploy", model, "--target", "here")
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 1 and "Traceback" not in err
    assert "build not started" in line and "MiB free on" in line and str(disk) in line and "needs" in line
    assert _builds(trtexec) == 0  # trtexec never started a build
    (run_dir,) = (tmp_path / "runs").iterdir()
    stages = {s["name"]: s for s in json.loads((run_dir / "stages.json").read_text())["stages"]}
    assert stages["probe"]["status"] == "ok" and stages["build"]["status"] == "failed"
    assert stages["probe"]["data"]["disk"]["free_bytes"] <= 8 * MiB
    assert json.loads((run_dir / "probe.json").read_text())["disk"]["free_bytes"] <= 8 * MiB


def test_a_disk_that_fills_up_mid_run_is_named_where_the_user_reads_it(tmp_path, monkeypatch, small_disk):
    """The disk fills (someone else's file) once the build is done: the inspect stage's trtexec prints
    PASSED and fails to write layers.json with ENOSPC; the error says the disk is full."""
    from edgeq.errors import RemoteError
    from edgeq.orchestration.deploy import DeployOptions, deploy
    from edgeq.remote.targets import resolve_target

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    disk = small_disk(96)
    trtexec = local_target(tmp_path, disk / "edgeq")
    filler = disk / "someone else's file"

    def fill_up(line: str) -> None:
        if line == "inspect: started":
            with open(filler, "wb") as f, contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * MiB)
                    f.flush()

    with pytest.raises(RemoteError) as info:
        deploy(qdq_model(tmp_path / "net.onnx"), resolve_target("here"), DeployOptions(), on_event=fill_up)
    message = str(info.value)
    assert _builds(trtexec) == 1 and filler.exists()
    assert "failed at stage 'inspect'" in message
    assert "no space left on the target's disk" in message and "[Errno 28] No space left on device" in message
    assert info.value.exit_code == 1 and "free space" in (info.value.hint or "")
