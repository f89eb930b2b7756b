"""``edgeq run``: a whole pipeline file (zoo model -> prepare -> a loopback target -> release), resumable.

The target is a real OpenSSH sshd on 127.0.0.1 whose trtexec replays a recorded TensorRT 8.6.0 run
(tests/fleet_helpers.py): the test proves the stages and their skipping, not TensorRT.
"""

from __future__ import annotations

import json

import pytest
import yaml
from fleet_helpers import make_members, reformat_layer, write_fleet
from trtexec_replay import calls

from edgeq.errors import ConfigError
from edgeq.orchestration.run import load_spec


@pytest.fixture
def board(tmp_path, monkeypatch, sshd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (member,) = make_members(tmp_path, [sshd])
    write_fleet(tmp_path, [member], reformat_layer())
    return tmp_path, member


def _stages(out: str) -> dict[str, str]:
    return {s["name"]: s["status"] for s in json.loads(out)["stages"]}


@pytest.mark.sshd
def test_second_run_skips_unchanged_stages_and_a_changed_gate_reruns_only_the_targets(board, cli):
    root, member = board
    spec = {
        "name": "tiny", "model": "zoo:resnet", "model_options": {"size": 32, "width": 8}, "synthetic": 8,
        "quantize": {"calibrator": "max"}, "target": "board1", "profile": {"duration": 0},
        "release": {"output": "release/tiny.tar.gz"},
    }  # fmt: skip
    pipeline = root / "tiny.yaml"
    pipeline.write_text(yaml.safe_dump(spec))

    code, out, err = cli("run", pipeline, "--json")
    assert code == 0, (out, err)
    assert _stages(out) == {"model": "ran", "prepare": "ran", "targets": "ran", "release": "ran"}
    work = root / "runs" / "pipeline-tiny"
    assert (work / "host" / "resnet.int8.onnx").is_file() and (work / "host" / "resnet.int8.cache").is_file()
    bundle = (root / "release" / "tiny.tar.gz").read_bytes()
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        names = set(tar.getnames())
    assert {"model/resnet.int8.onnx", "model/resnet.int8.cache", "model/resnet.int8.fp32.onnx",
            "engines/sm9.0-trt8.6.0/engine.plan", "reports/board1/report.html", "manifest.json"} <= names
    builds = len(calls(member.trtexec))

    code, out, err = cli("run", pipeline)
    assert code == 0, (out, err)
    for name in ("model", "prepare", "targets", "release"):
        (line,) = [ln for ln in out.splitlines() if ln.startswith(name)]
        assert "skipped" in line and "unchanged" in line, out
    assert len(calls(member.trtexec)) == builds  # nothing ran on the target
    assert (root / "release" / "tiny.tar.gz").read_bytes() == bundle

    # a gate change: the model and its preparation stand, the targets and the release run again
    spec["gate"] = {"policy": "int8", "allow": ["/nothing/*"]}
    pipeline.write_text(yaml.safe_dump(spec))
    code, out, err = cli("run", pipeline, "--json")
    assert code == 0, (out, err)
    assert _stages(out) == {"model": "skipped", "prepare": "skipped", "targets": "ran", "release": "ran"}
    assert len(calls(member.trtexec)) > builds


def test_pipeline_file_errors_are_one_line(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("model: zoo:resnet\ntarget: a\nfleet: f.yaml\n")
    with pytest.raises(ConfigError, match="give one of 'target', 'fleet', 'targets'"):
        load_spec(p)
    p.write_text("model: zoo:resnet\nquantise: {calibrator: max}\n")
    with pytest.raises(ConfigError, match=r"unknown key 'quantise' \(did you mean 'quantize'\?\)"):
        load_spec(p)
    p.write_text("model: zoo:resnet\nquantize: {calibrater: max}\n")
    with pytest.raises(ConfigError, match=r"unknown key 'quantize.calibrater' \(did you mean 'calibrator'"):
        load_spec(p)
    p.write_text("model: zoo:resnet\nrelease: {output: x.tar.gz}\n")
    with pytest.raises(ConfigError, match="'release' needs targets"):
        load_spec(p)


def test_example_pipelines_are_valid():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    specs = [load_spec(p) for p in sorted((root / "pipelines").glob("*.yaml")) if "preprocess" not in p.name]
    zoo = {s.model for s in specs if s.model.startswith("zoo:")}
    assert zoo == {"zoo:resnet", "zoo:yolo", "zoo:unet"}


@pytest.mark.sshd
def test_a_model_path_is_hashed_once_per_run(board, cli, monkeypatch):
    import edgeq.orchestration.fleet
    import edgeq.orchestration.run
    from edgeq import zoo
    from edgeq.fs import sha256_file
    from edgeq.graph.io import save_model

    root, _ = board
    model = root / "net.onnx"
    save_model(zoo.build("resnet", "fp32", size=32, width=8), model)
    spec = {"name": "hashed", "model": str(model), "synthetic": 8, "quantize": {"calibrator": "max"},
            "target": "board1", "profile": {"duration": 0}}  # fmt: skip
    pipeline = root / "hashed.yaml"
    pipeline.write_text(yaml.safe_dump(spec))
    hashed: list[str] = []

    def counted(path, *args, **kwargs):
        hashed.append(str(path))
        return sha256_file(path, *args, **kwargs)

    for module in (edgeq.orchestration.run, edgeq.orchestration.fleet):
        monkeypatch.setattr(module, "sha256_file", counted)
    code, out, err = cli("run", pipeline, "--json")
    assert code == 0, (out, err)
    assert hashed.count(str(model)) == 1
    fleet = json.loads((root / "runs" / "pipeline-hashed" / "fleet.json").read_text())
    assert fleet["source_sha256"] == sha256_file(model)
