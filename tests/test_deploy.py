"""``edgeq deploy`` against a real OpenSSH sshd on 127.0.0.1, and its offline second half on real engines.

This machine has no TensorRT (like a target whose Python lacks it): a deploy must get as far as the
probe, say so in one line and exit 1, with the run directory holding what it did. The report + gate
half (``finish_run``) is tested on the real TensorRT 8.6 engine JSON in tests/fixtures/trt86-h200;
only the transport of those files is skipped, not TensorRT.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from conftest import FIXTURES
from onnx import TensorProto, helper, numpy_helper

from edgeq.errors import RemoteError
from edgeq.remote.deploy import (
    AGENT_PROTOCOL,
    DeployOptions,
    _check_expectations,
    _policy,
    agent_argv,
    build_args,
    finish_run,
    new_run_dir,
    parse_agent_reply,
)
from edgeq.remote.targets import target_from_dict

# Spaces and shell metacharacters: the name travels as one quoted argv element, never through a shell.
MODEL_NAME = "tiny net $(touch pwned) & v1; x.onnx"


def tiny_model(path: Path) -> Path:
    """A float Conv+Relu at 16x16: small enough for a fast clean, real enough for lint and upload."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(8, np.float32), "b")
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["c"], name="/conv/Conv", pads=[1, 1, 1, 1]),
        helper.make_node("Identity", ["c"], ["c2"], name="/id/Identity"),  # clean removes it
        helper.make_node("Relu", ["c2"], ["output"], name="/relu/Relu"),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8, 16, 16])],
        [w, b],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture
def ssh_server(request):
    """conftest's ``sshd`` fixture when present; else a server from tests/sshd.py (same thing)."""
    try:
        return request.getfixturevalue("sshd")
    except pytest.FixtureLookupError:
        pass
    from sshd import SshdServer, sshd_available

    reason = sshd_available()
    if reason:
        pytest.skip(reason)
    server = SshdServer().start()
    request.addfinalizer(server.close)
    return server


@pytest.fixture
def workspace(tmp_path, monkeypatch, ssh_server):
    """A project directory with targets/loopback.yaml pointing at the sshd, and a model to deploy."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the agent zipapp is built here
    (tmp_path / "targets").mkdir()
    remote = tmp_path / "remote home"
    target = {
        "host": ssh_server.host,
        "port": ssh_server.port,
        "user": ssh_server.user,
        "identity_file": str(ssh_server.identity_file),
        "known_hosts": str(ssh_server.known_hosts),
        "work_dir": str(remote),
        "python": sys.executable,  # a real Python 3 without TensorRT
        "tensorrt": "8.6",
        "backend": "python",
        "timeouts": {"connect": 10, "command": 60},
    }
    (tmp_path / "targets" / "loopback.yaml").write_text(yaml.safe_dump(target))
    model = tiny_model(tmp_path / MODEL_NAME)
    return tmp_path, model, remote


def _stages(run_dir: Path) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads((run_dir / "stages.json").read_text())["stages"]}


@pytest.mark.sshd
def test_deploy_without_tensorrt_stops_at_probe_in_one_line(workspace, cli):
    root, model, remote = workspace
    runs = root / "runs"
    code, out, err = cli("deploy", model, "--target", "loopback", "--runs-dir", runs)
    assert code == 1, err
    assert "Traceback" not in err + out
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, err
    assert "probe on loopback" in errors[0] and "TensorRT not available" in errors[0]

    (run_dir,) = runs.iterdir()
    assert run_dir.name.startswith("tiny_net_touch_pwned_v1_x-loopback-")
    cleaned = run_dir / (MODEL_NAME[: -len(".onnx")] + ".clean.onnx")
    m = onnx.load(str(cleaned))
    assert [n.op_type for n in m.graph.node] == ["Conv", "Relu"]  # clean ran: the Identity is gone
    st = _stages(run_dir)
    assert [st[n]["status"] for n in ("clean", "quantize", "lint", "upload", "probe")] == [
        "ok", "skipped", "ok", "ok", "failed",
    ]  # fmt: skip
    assert all(st[n]["status"] == "not run" for n in ("build", "inspect", "profile", "report", "gate"))
    assert "TensorRT not available" in st["probe"]["summary"]
    up = st["upload"]["data"]
    assert up["model"]["bytes_sent"] == cleaned.stat().st_size > 0 and not up["model"]["cached"]
    assert up["agent"]["bytes_sent"] > 0
    reply = json.loads((run_dir / "agent-probe.json").read_text())
    assert reply["protocol"] == AGENT_PROTOCOL and reply["error"]["stage"] == "import"
    assert (run_dir / "deploy.log").read_text().count("probe: failed") == 1
    assert "clean" in json.loads((run_dir / "timings.json").read_text())["stages"]
    # the model arrived under its own name, in the content-addressed cache, verified
    assert Path(up["model"]["remote_path"]).name == cleaned.name
    assert (remote / "cache" / up["model"]["sha256"] / cleaned.name).is_file()
    assert not (root / "pwned").exists() and not (Path.home() / "pwned").exists()

    # second deploy: nothing changed, nothing sent
    code2, _, err2 = cli("deploy", model, "--target", "loopback", "--runs-dir", runs)
    assert code2 == 1 and "TensorRT not available" in err2
    (second,) = [d for d in runs.iterdir() if d != run_dir]
    up2 = _stages(second)["upload"]["data"]
    assert up2["model"]["bytes_sent"] == 0 and up2["model"]["cached"]
    assert up2["agent"]["bytes_sent"] == 0 and up2["agent"]["cached"]
    assert up2["agent"]["remote_path"] == up["agent"]["remote_path"]


@pytest.mark.sshd
def test_float_model_with_calib_is_quantized_before_upload(workspace, cli):
    root, model, _ = workspace
    calib = root / "calib"
    calib.mkdir()
    rng = np.random.default_rng(1)
    for i in range(4):
        np.save(calib / f"s{i}.npy", rng.random((1, 3, 16, 16), dtype=np.float32))
    code, _, err = cli("deploy", model, "--target", "loopback", "--calib", calib, "--runs-dir", root / "runs")
    assert code == 1 and "TensorRT not available" in err
    (run_dir,) = (root / "runs").iterdir()
    st = _stages(run_dir)
    assert [st[n]["status"] for n in ("clean", "quantize", "lint", "upload", "probe")] == [
        "ok", "ok", "ok", "ok", "failed",
    ]  # fmt: skip
    stem = MODEL_NAME[: -len(".onnx")]
    q = onnx.load(str(run_dir / f"{stem}.int8.onnx"))
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in q.graph.node}
    assert (run_dir / f"{stem}.int8.cache").read_text().startswith("TRT-8600-EntropyCalibration2")
    assert st["quantize"]["data"]["accuracy"] is not None
    assert Path(st["upload"]["data"]["model"]["remote_path"]).name == f"{stem}.int8.onnx"


@pytest.mark.sshd
def test_unknown_host_key_refused_then_accepted_on_request(workspace, cli, ssh_server):
    root, model, _ = workspace
    Path(ssh_server.known_hosts).write_text("")
    code, _, err = cli("deploy", model, "--target", "loopback", "--runs-dir", root / "runs")
    assert code != 0 and "Traceback" not in err
    assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1
    (run_dir,) = (root / "runs").iterdir()
    st = _stages(run_dir)
    assert st["upload"]["status"] == "failed" and st["probe"]["status"] == "not run"
    assert "host key" in st["upload"]["summary"].lower()
    assert Path(ssh_server.known_hosts).read_text() == ""  # never auto-added

    code, _, err = cli("targets", "check", "loopback", "--accept-new-host-key")
    assert code == 1 and "TensorRT not available" in err
    assert f"[{ssh_server.host}]:{ssh_server.port}" in Path(ssh_server.known_hosts).read_text()


def test_missing_model_is_exit_2_without_a_run_dir(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "t.yaml").write_text("host: 127.0.0.1\nuser: me\nuse_agent: true\n")
    code, _, err = cli("deploy", tmp_path / "nope.onnx", "--target", "t", "--runs-dir", tmp_path / "runs")
    assert code == 2 and "nope.onnx: no such file" in err
    assert not (tmp_path / "runs").exists()
    code, _, err = cli("deploy", tmp_path / "nope.onnx", "--target", "tt", "--runs-dir", tmp_path / "runs")
    assert code == 2 and "target 'tt' not found" in err and "did you mean 't'" in err


def test_usage_errors_are_exit_2_before_a_run_dir(tmp_path, monkeypatch, cli):
    # QA: --gate bogus cleaned, linted and connected before failing (exit 1, run dir left behind); a
    # missing identity_file left a run dir; --runs-dir naming a file was a traceback.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "t.yaml").write_text("host: 127.0.0.1\nuser: me\nuse_agent: true\n")
    key = tmp_path / "no-key"
    (tmp_path / "targets" / "k.yaml").write_text(f"host: 127.0.0.1\nuser: me\nidentity_file: {key}\n")
    model = tiny_model(tmp_path / "m.onnx")
    runs = tmp_path / "runs"
    for args, word in [
        (("--target", "t", "--gate", "bogus"), "--gate bogus"),
        (("--target", "k"), "identity_file"),
    ]:
        code, out, err = cli("deploy", model, *args, "--runs-dir", runs)
        assert code == 2 and word in err and len(err.strip().splitlines()) == 1, (out, err)
        assert not runs.exists()
    code, out, err = cli("deploy", model, "--target", "t", "--runs-dir", model)
    assert code == 2 and "not a directory" in err and "Traceback" not in out + err


# -- the post-build half, offline, on the real engines ---------------------------------------------------


def _target(tmp_path: Path, gate: dict | None = None):
    d = {"host": "127.0.0.1", "user": "me", "use_agent": True}
    if gate is not None:
        d["gate"] = gate
    return target_from_dict(d, tmp_path / "t.yaml")


def test_finish_run_on_real_explicit_engine(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    policy = _policy(DeployOptions(), _target(tmp_path))
    done = finish_run(
        run,
        FIXTURES / "resnet50_ortfb.explicit.layers.json",
        FIXTURES / "resnet50_ortfb.explicit.profile.json",
        None,
        policy,
    )
    # measured: every compute layer INT8; one interior reformat (INT8 32-wide -> INT8 row major) fails it
    assert not done.gate
    rules = {v.rule for v in done.gate.violations}
    assert rules == {"interior-reformat"} and len(done.gate.violations) == 1
    assert done.report.compute_precisions().keys() == {"INT8"}
    saved = json.loads(done.report_json.read_text())
    assert saved["gate"]["passed"] is False
    assert "<html" in done.report_html.read_text().lower()

    # the target's allowlist (by the offending layer's name) excuses it
    name = done.gate.violations[0].layer_name
    allowed = finish_run(
        run, FIXTURES / "resnet50_ortfb.explicit.layers.json", None, None,
        _policy(DeployOptions(), _target(tmp_path, {"policy": "int8", "allow": [name]})),
    )  # fmt: skip
    assert allowed.gate and len(allowed.gate.allowed) == 1


def test_finish_run_on_real_implicit_engine_fails_on_fp16(tmp_path):
    done = finish_run(
        tmp_path,
        FIXTURES / "resnet50.implicit.layers.json",
        FIXTURES / "resnet50.implicit.profile.json",
        None,
        _policy(DeployOptions(), _target(tmp_path)),
    )
    assert not done.gate
    assert "int8-compute" in {v.rule for v in done.gate.violations}
    assert done.report.compute_precisions().get("FP16", 0) > 10
    # --gate none: report only
    none = finish_run(
        tmp_path, FIXTURES / "resnet50.implicit.layers.json", None, None,
        _policy(DeployOptions(gate="none"), _target(tmp_path)),
    )  # fmt: skip
    assert none.gate


def test_pipeline_allowlist_is_added(tmp_path):
    policy = _policy(DeployOptions(gate_allow=("/fc/Gemm",)), _target(tmp_path, {"allow": ["/head/*"]}))
    assert policy.name == "int8" and set(policy.allow) == {"/fc/Gemm", "/head/*"}


# -- host side of the agent protocol ---------------------------------------------------------------------


def test_agent_argv_uses_equals_form(tmp_path):
    t = _target(tmp_path)
    argv = agent_argv(t, "edgeq/cache/abc/edgeq-agent-1.pyz", "build", "--tacticSources=-CUBLAS")
    assert argv[:3] == ["python3", "edgeq/cache/abc/edgeq-agent-1.pyz", "build"]
    assert "--backend=python" in argv and "--trtexec=/usr/src/tensorrt/bin/trtexec" in argv


def test_build_args_follow_the_target(tmp_path):
    t = target_from_dict(
        {"host": "h", "user": "u", "use_agent": True, "work_dir": "/w",
         "build": {"workspace": 1024, "tactic_sources": ["-CUBLAS", "-CUDNN"], "dla_core": 0}},
        tmp_path / "t.yaml",
    )  # fmt: skip
    args = build_args(t, "/w/cache/s/m -x.onnx", "/w/runs/r/engine.plan", int8=True, fp16=False,
                      trt_version="8.6.2", cc="8.7")  # fmt: skip
    assert args == [
        "--onnx=/w/cache/s/m -x.onnx", "--saveEngine=/w/runs/r/engine.plan", "--int8", "--workspace=1024",
        "--tacticSources=-CUBLAS,-CUDNN", "--timingCacheFile=/w/timing-cache/timing-8.6.2-sm8.7.cache",
        "--useDLACore=0", "--allowGPUFallback",
    ]  # fmt: skip
    float_args = build_args(t, "m.onnx", "e.plan", int8=False, fp16=True)
    assert "--int8" not in float_args and "--fp16" in float_args


def test_probe_facts_must_match_the_target_file(tmp_path):
    d = {"host": "h", "user": "u", "use_agent": True, "tensorrt": "8.6", "gpu": {"compute_capability": "8.7"}}
    t = target_from_dict(d, tmp_path / "orin.yaml")
    _check_expectations(t, "8.6.2.3", "8.7")
    with pytest.raises(RemoteError, match=r"runs TensorRT 8\.5\.2, but .*orin.yaml expects 8\.6") as ei:
        _check_expectations(t, "8.5.2", "8.7")
    assert ei.value.exit_code == 1
    with pytest.raises(RemoteError, match=r"compute capability 7\.2 GPU"):
        _check_expectations(t, "8.6.2", "7.2")


def test_parse_agent_reply():
    ok = json.dumps({"protocol": 1, "agent": "x", "command": "probe", "ok": True, "result": {"a": 1}})
    assert parse_agent_reply("noise\n" + ok + "\n", "", 0, "probe")["result"] == {"a": 1}
    with pytest.raises(RemoteError, match="speaks protocol 2"):
        parse_agent_reply(json.dumps({"protocol": 2, "ok": True}), "", 0, "probe")
    with pytest.raises(RemoteError, match=r"no answer \(exit 127\): sh: 1: python9: not found") as ei:
        parse_agent_reply("", "sh: 1: python9: not found\n", 127, "probe")
    assert ei.value.exit_code == 1


def test_run_dirs_are_unique_and_safe(tmp_path):
    a = new_run_dir(tmp_path, Path("my model (v2).onnx"), "orin agx")
    b = new_run_dir(tmp_path, Path("my model (v2).onnx"), "orin agx")
    assert a != b and a.name.startswith("my_model_v2-orin_agx-") and a.parent == b.parent == tmp_path


def test_cli_renders_a_finished_run_and_exits_1_on_the_gate(tmp_path, monkeypatch, cli):
    """The CLI half of a deploy that got through (engine files from the real fixtures): the stage table,
    the report path, and exit 1 naming the offending layer. Only the remote half is replaced."""
    import edgeq.remote.deploy as dep

    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "t.yaml").write_text("host: 127.0.0.1\nuser: me\nuse_agent: true\n")
    model = tmp_path / "resnet50_ortfb.onnx"
    model.write_bytes(b"unused")

    def finished_deploy(model_path, target, options, *, progress, on_event):
        run_dir = new_run_dir(Path(options.runs_dir), Path(model_path), target.name)
        done = finish_run(
            run_dir, FIXTURES / "resnet50_ortfb.explicit.layers.json",
            FIXTURES / "resnet50_ortfb.explicit.profile.json", None, _policy(options, target),
        )  # fmt: skip
        stages = [dep.StageRecord(n, "ok", 0.1, "") for n in dep.STAGES]
        stages[-1] = dep.StageRecord("gate", "failed", 0.0, done.gate.summary())
        return dep.DeployResult(run_dir, stages, done, {"stages": {}})

    monkeypatch.setattr(dep, "deploy", finished_deploy)
    code, out, _ = cli("deploy", model, "--target", "t")
    assert code == 1
    assert "gate int8: FAILED on 1 layer" in out and "[interior-reformat]" in out
    assert "report.html" in out and "run directory: runs" in out
    code, out, _ = cli("deploy", model, "--target", "t", "--gate", "none")
    assert code == 0 and "not applied" in out
