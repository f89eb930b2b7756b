"""Facts about a target say where they came from (issue 20.12): a board whose probe finds no GPU shows the
target file's GPU and compute capability as the target file's, in ``targets check``, the fleet matrix
and the release manifest, and nothing is printed as "None".

The target is this machine (``host: local``, the agent a subprocess) with no nvidia-smi on its PATH: the
probe finds no GPU, as on a board whose driver tools are missing. trtexec replays the recorded TensorRT
8.6.0 ResNet-50 run (tests/trtexec_replay.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml
from fleet_helpers import FIXTURES, ORTFB, qdq_model, reformat_layer
from trtexec_replay import Recorded, replay_trtexec

from edgeq.orchestration.fleet import FleetResult, Row, matrix


def test_facts_from_the_target_file_are_shown_as_such_and_none_is_never_printed(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no nvidia-smi: the probe finds no GPU
    trtexec = replay_trtexec(
        tmp_path / "bin", build=Recorded(FIXTURES / f"{ORTFB}.build.log"),
        run=Recorded(FIXTURES / f"{ORTFB}.run.log"), layers=FIXTURES / f"{ORTFB}.layers.json",
        profile=FIXTURES / f"{ORTFB}.profile.json",
    )  # fmt: skip
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "board.yaml").write_text(yaml.safe_dump({
        "host": "local", "work_dir": str(tmp_path / "work"), "python": sys.executable, "tensorrt": "8.6",
        "backend": "trtexec", "trtexec": str(trtexec), "gate": {"allow": [reformat_layer()]},
        "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0"},
    }))  # fmt: skip
    (tmp_path / "fleet.yaml").write_text("targets: [board]\n")
    model = qdq_model(tmp_path / "net.onnx")

    code, out, err = cli("targets", "check", "board")
    assert code == 0, err
    assert "None" not in out
    said = " ".join(out.split())
    assert "no GPU found by the probe" in said and "target file: NVIDIA H200, sm 9.0" in said

    code, out, err = cli("fleet", "validate", model, "--fleet", "fleet.yaml", "--json", "--duration", "0")
    assert code == 0, (out, err)
    (row,) = json.loads(out)["targets"]
    assert (row["gpu"], row["compute_capability"]) == ("NVIDIA H200", "9.0")
    assert row["sources"] == {"tensorrt": "probe", "gpu": "target file", "compute_capability": "target file"}
    cells = matrix(FleetResult(tmp_path, model, [Row(**row)], ""))  # the matrix the CLI prints
    assert cells[0]["GPU (sm)"] == "target file: NVIDIA H200 (9.0)"
    code, out, _ = cli("fleet", "validate", model, "--fleet", "fleet.yaml", "--duration", "0")
    assert code == 0 and "None" not in out

    fleet_dir = sorted((tmp_path / "runs").glob("fleet-*"))[-1]
    code, out, err = cli("release", "--from", fleet_dir, "-o", tmp_path / "b.tar.gz", "--json")
    assert code == 0, err
    (engine,) = json.loads(out)["engines"].values()
    assert (engine["gpu"], engine["compute_capability"]) == ("NVIDIA H200", "9.0")
    assert engine["sources"] == row["sources"]
    # as a person reads it, in a terminal wide enough for the table
    shown = subprocess.run([sys.executable, "-c", "from edgeq.cli import main; main()", "release", "inspect",
                            str(tmp_path / "b.tar.gz")], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert shown.returncode == 0 and "None" not in shown.stdout, shown.stderr
    assert "NVIDIA H200 (target file)" in shown.stdout and "9.0 (target file)" in shown.stdout
