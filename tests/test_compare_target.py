"""`edgeq compare --target` against a real OpenSSH sshd on 127.0.0.1 whose Python has no TensorRT: one
calibration writes every variant, then the build stage stops with one clear line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from test_deploy import ssh_server, tiny_model, trtexec_target  # noqa: F401 - fixtures


@pytest.fixture
def loopback(tmp_path, monkeypatch, sshd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "targets").mkdir()
    target = {
        "host": sshd.host, "port": sshd.port, "user": sshd.user, "identity_file": str(sshd.identity_file),
        "known_hosts": str(sshd.known_hosts), "work_dir": str(tmp_path / "remote"), "python": sys.executable,
        "tensorrt": "8.6", "backend": "python", "timeouts": {"connect": 10, "command": 60},
    }  # fmt: skip
    (tmp_path / "targets" / "loopback.yaml").write_text(yaml.safe_dump(target))
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(2)
    for i in range(3):
        np.save(calib / f"s{i}.npy", rng.random((1, 3, 16, 16), dtype=np.float32))
    return tmp_path, tiny_model(tmp_path / "tiny.onnx"), calib


@pytest.mark.sshd
def test_compare_on_a_target_without_tensorrt_stops_at_the_build_stage(loopback, cli):
    root, model, calib = loopback
    code, out, err = cli(
        "compare", model, "--target", "loopback", "--calib", calib, "--runs-dir", root / "runs",
        "--placement", "trt",
    )
    assert code == 1, err
    assert "Traceback" not in out + err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, err
    assert errors[0].startswith("error: build stage: cannot build 'implicit' on loopback: ")
    assert "TensorRT not available" in errors[0]
    # the calibration ran once and wrote every variant before the build stage
    (run_dir,) = (root / "runs").glob("compare-tiny-loopback-*")
    names = sorted(p.name for p in run_dir.iterdir() if p.is_file())
    assert names == [
        "tiny.explicit-all.onnx",
        "tiny.explicit.onnx",
        "tiny.implicit.cache",
        "tiny.implicit.fp32.onnx",
    ]
    assert (run_dir / "tiny.implicit.cache").read_text().startswith("TRT-8600-EntropyCalibration2")
    ops = {
        n: [x.op_type for x in onnx.load(str(run_dir / n)).graph.node] for n in names if n.endswith(".onnx")
    }
    assert "QuantizeLinear" not in ops["tiny.implicit.fp32.onnx"]
    # --placement all quantizes more tensors than edgeq's placement (the Conv output before the Relu too)
    assert ops["tiny.explicit-all.onnx"].count("QuantizeLinear") > ops["tiny.explicit.onnx"].count(
        "QuantizeLinear"
    )


def test_compare_on_a_target_needs_calibration_data(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    model = tiny_model(tmp_path / "tiny.onnx")
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "t.yaml").write_text(
        yaml.safe_dump({"host": "127.0.0.1", "user": "u", "use_agent": True})
    )
    code, _, err = cli("compare", model, "--target", "t")
    assert code == 2 and "needs --calib" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.sshd
def test_compare_replayed_on_a_trtexec_target_builds_each_variant_once(trtexec_target, cli):  # noqa: F811
    """Replays one recorded TensorRT 8.6.0 build and run for every variant (tests/trtexec_replay.py): proves
    the orchestration (implicit built with --int8 --calib, explicit ones with --int8, each profiled and
    read back as an engine row), not TensorRT: every variant gets the same recorded engine."""
    from test_deploy import _flag
    from trtexec_replay import calls

    root, _, _, trtexec = trtexec_target()
    model = tiny_model(root / "tiny.onnx")
    calib = root / "calib"
    calib.mkdir()
    np.save(calib / "s0.npy", np.random.default_rng(3).random((2, 3, 16, 16), dtype=np.float32))
    code, out, err = cli(
        "compare", model, "--target", "replay", "--calib", calib, "--runs-dir", root / "runs", "--json",
        "--gate", "relative", "--placement", "trt",
    )  # fmt: skip
    assert code == 0, err
    d = json.loads(out)
    # the relative gate judges edgeq's explicit engine, not the --placement all comparison build
    assert [(g["candidate"], g["passed"]) for g in d["gates"]] == [("explicit", True)]
    assert [(e["name"], e["built"]) for e in d["engines"]] == [
        ("implicit", True), ("explicit", True), ("explicit-all", True),
    ]  # fmt: skip
    assert [x["candidate"] for x in d["diffs"]] == ["explicit", "explicit-all"]
    assert all(x["ratio"]["source"] == "run logs" and x["ratio"]["throughput"] == 1.0 for x in d["diffs"])
    builds = [argv for argv in calls(trtexec) if any(a.startswith("--onnx=") for a in argv)]
    assert [Path(_flag(a, "--onnx")).name for a in builds] == [
        "tiny.implicit.fp32.clean.onnx", "tiny.explicit.clean.onnx", "tiny.explicit-all.clean.onnx",
    ]  # fmt: skip
    assert Path(_flag(builds[0], "--calib")).name == "tiny.implicit.cache"
    assert all("--int8" in a and "--fp16" in a for a in builds)
    assert not [a for a in builds[1:] if any(x.startswith("--calib=") for x in a)]


@pytest.mark.sshd
def test_deploy_with_an_implicit_baseline_applies_the_relative_gate(trtexec_target, cli):  # noqa: F811
    """deploy --baseline implicit --gate relative on the replayed trtexec target: the run's explicit engine,
    then the implicit one from the same calibration (its cache), then the relative gate (exit 0: the replay
    gives both the same recorded engine)."""
    from test_deploy import _flag
    from trtexec_replay import calls

    root, _, _, trtexec = trtexec_target()
    model = tiny_model(root / "tiny.onnx")
    calib = root / "calib"
    calib.mkdir()
    for i in range(3):
        np.save(calib / f"s{i}.npy", np.random.default_rng(i).random((1, 3, 16, 16), dtype=np.float32))
    runs = root / "runs"
    args = ("deploy", model, "--target", "replay", "--calib", calib, "--runs-dir", runs)
    code, out, err = cli(*args, "--baseline", "implicit", "--gate", "relative", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["gate"]["policy"]["name"] == "none"  # the relative gate replaces the int8 policy
    rel = d["relative_gate"]
    assert rel["passed"] and rel["candidate"] == "explicit" and rel["baseline"] == "implicit"
    assert rel["ratio"]["source"] == "run logs"
    builds = [a for a in calls(trtexec) if any(x.startswith("--onnx=") for x in a)]
    assert len(builds) == 2 and not any(x.startswith("--calib=") for x in builds[0])
    assert Path(_flag(builds[1], "--calib")).name == "tiny.int8.cache"
    (run_dir,) = runs.iterdir()
    assert len(list((run_dir / "baseline").iterdir())) == 1  # the implicit build's own run directory
    # usage errors before any run
    code, _, err = cli(*args, "--gate", "relative")
    assert code == 2 and "--baseline implicit" in err
    code, _, err = cli("deploy", model, "--target", "replay", "--baseline", "implicit")
    assert code == 2 and "--calib" in err
    assert len(list(runs.iterdir())) == 1
