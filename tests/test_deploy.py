"""``edgeq deploy`` against a real OpenSSH sshd on 127.0.0.1, and its offline second half on real engines.

This machine has no TensorRT (like a target whose Python lacks it): a deploy must get as far as the
probe, say so in one line and exit 1, with the run directory holding what it did. The report + gate
half (``finish_run``) is tested on the real TensorRT 8.6 engine JSON in tests/fixtures/trt86-h200.

The whole deploy, every stage after the probe included, runs over SSH against a ``backend: trtexec``
target whose trtexec is a stand-in REPLAYING recorded TensorRT 8.6.0 runs (tests/trtexec_replay.py,
tests/fixtures/trt86-h200/resnet50_ortfb.explicit.*): those tests prove the orchestration, not TensorRT.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from conftest import FIXTURES
from onnx import TensorProto, helper, numpy_helper

from edgeq.errors import RemoteError
from edgeq.orchestration.deploy import DeployOptions, deploy_policy
from edgeq.pipeline.rundir import STAGES, StageRecord, new_run_dir
from edgeq.pipeline.stages import finish_run
from edgeq.remote.protocol import (
    AGENT_PROTOCOL,
    agent_argv,
    build_args,
    check_expectations,
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
    code, _, err = cli("deploy", model, "--target", "loopback", "--calib", calib, "--runs-dir", root / "runs",
                       "--placement", "trt")  # the rules (auto decides on the target: test_placement_auto.py)
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


def test_a_deploy_with_calib_cleans_the_model_once(tmp_path, monkeypatch):
    """deploy --calib: the clean stage's model goes to quantization as it is, not through the cleaning
    passes a second time (every call of the real ``clean_model`` counted), and it is that cleaned model
    that is quantized. A ``host: local`` target without TensorRT stops at the probe."""
    import edgeq.graph.clean
    from edgeq.errors import RemoteError
    from edgeq.orchestration.deploy import deploy
    from edgeq.quant.quantize import QuantizeOptions
    from edgeq.remote.targets import target_from_dict

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = tiny_model(tmp_path / "net.onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(3)
    for i in range(4):
        np.save(calib / f"s{i}.npy", rng.random((1, 3, 16, 16), dtype=np.float32))
    target = target_from_dict({"host": "local", "python": sys.executable, "tensorrt": "8.6",
                               "work_dir": str(tmp_path / "remote")}, tmp_path / "local.yaml")  # fmt: skip
    real, cleaned = edgeq.graph.clean.clean_model, []

    def counted(m, *args, **kwargs):
        cleaned.append([n.op_type for n in m.graph.node])
        return real(m, *args, **kwargs)

    monkeypatch.setattr(edgeq.graph.clean, "clean_model", counted)
    with pytest.raises(RemoteError, match="TensorRT not available"):
        deploy(model, target, DeployOptions(QuantizeOptions(calib=calib), runs_dir=tmp_path / "runs"))
    assert cleaned == [["Conv", "Identity", "Relu"]]  # once, on the model as given
    (run_dir,) = (tmp_path / "runs").iterdir()
    st = _stages(run_dir)
    assert [st[n]["status"] for n in ("clean", "quantize", "lint", "upload", "probe")] == [
        "ok", "ok", "ok", "ok", "failed",
    ]  # fmt: skip
    q = onnx.load(str(run_dir / "net.int8.onnx"))
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in q.graph.node}
    assert "Identity" not in {n.op_type for n in q.graph.node}


@pytest.mark.sshd
def test_calib_images_take_a_preprocessing_spec(workspace, cli):
    """--calib images/ needs --preprocess; deploy passes it to quantization as `edgeq quantize` does."""
    from PIL import Image

    root, model, _ = workspace
    images = root / "images"
    images.mkdir()
    rng = np.random.default_rng(2)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)).save(images / f"i{i}.png")
    spec = root / "pre.yaml"
    spec.write_text("resize: [16, 16]\nscale: 1/255\nchannels: RGB\nlayout: NCHW\n")
    args = ("deploy", model, "--target", "loopback", "--calib", images, "--runs-dir", root / "runs",
            "--placement", "trt")
    code, _, err = cli(*args, "--preprocess", spec)
    assert code == 1 and "TensorRT not available" in err
    (run_dir,) = (root / "runs").iterdir()
    assert _stages(run_dir)["quantize"]["status"] == "ok"


@pytest.mark.sshd
def test_deploy_takes_the_full_quantize_options(workspace, cli):
    """--calibrator, --placement and --overrides reach the quantization a deploy runs; a misspelt
    overrides file is exit 2 before any run directory exists."""
    root, model, _ = workspace
    calib = root / "calib"
    calib.mkdir()
    rng = np.random.default_rng(2)
    for i in range(4):
        np.save(calib / f"s{i}.npy", rng.random((1, 3, 16, 16), dtype=np.float32))
    bad = root / "bad.yaml"
    bad.write_text("forse: [/relu/Relu]\n")
    runs = root / "runs"
    code, _, err = cli("deploy", model, "--target", "loopback", "--calib", calib, "--overrides", bad,
                       "--runs-dir", runs)  # fmt: skip
    assert code == 2 and "unknown key 'forse'" in err and "did you mean 'force'" in err
    assert not runs.exists()
    over = root / "over.yaml"
    over.write_text("force: [/relu/Relu]\n")
    code, _, err = cli("deploy", model, "--target", "loopback", "--calib", calib, "--calibrator", "max",
                       "--placement", "all", "--overrides", over, "--runs-dir", runs)  # fmt: skip
    assert code == 1 and "TensorRT not available" in err
    (run_dir,) = runs.iterdir()
    data = _stages(run_dir)["quantize"]["data"]
    assert (data["calibrator"], data["placement"], data["forced"]) == ("max", "all", ["/relu/Relu"])
    q = onnx.load(str(run_dir / (MODEL_NAME[: -len(".onnx")] + ".int8.onnx")))
    producer = {o: n for n in q.graph.node for o in n.output}
    (relu,) = [n for n in q.graph.node if n.op_type == "Relu"]
    assert producer[relu.input[0]].op_type == "DequantizeLinear"  # forced: the Relu's input is quantized


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
    policy = deploy_policy(DeployOptions(), _target(tmp_path))
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
        deploy_policy(DeployOptions(), _target(tmp_path, {"policy": "int8", "allow": [name]})),
    )  # fmt: skip
    assert allowed.gate and len(allowed.gate.allowed) == 1


def test_finish_run_on_real_implicit_engine_fails_on_fp16(tmp_path):
    done = finish_run(
        tmp_path,
        FIXTURES / "resnet50.implicit.layers.json",
        FIXTURES / "resnet50.implicit.profile.json",
        None,
        deploy_policy(DeployOptions(), _target(tmp_path)),
    )
    assert not done.gate
    assert "int8-compute" in {v.rule for v in done.gate.violations}
    assert done.report.compute_precisions().get("FP16", 0) > 10
    # --gate none: report only
    none = finish_run(
        tmp_path, FIXTURES / "resnet50.implicit.layers.json", None, None,
        deploy_policy(DeployOptions(gate="none"), _target(tmp_path)),
    )  # fmt: skip
    assert none.gate


def test_pipeline_allowlist_is_added(tmp_path):
    policy = deploy_policy(DeployOptions(gate_allow=("/fc/Gemm",)), _target(tmp_path, {"allow": ["/head/*"]}))
    assert policy.name == "int8" and set(policy.allow) == {"/fc/Gemm", "/head/*"}


def test_a_pipelines_require_fusion_reaches_the_gate(tmp_path):
    """``gate: {require_fusion: true}`` in a pipeline file (deploy --pipeline, edgeq run) fails the
    engine whose residual Adds TensorRT left unfused; without it the target's int8 gate passes them."""
    from edgeq.orchestration.run import load_pipeline

    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(yaml.safe_dump({"gate": {"require_fusion": True}}))
    gate = load_pipeline(pipeline).gate
    assert gate is not None
    layers = FIXTURES / "resnet50_ortfb.explicit.layers.json"
    target = _target(tmp_path)
    asked = (gate.require_fusion, None)
    policies = [deploy_policy(DeployOptions(gate_require_fusion=f), target) for f in asked]
    verdicts = [finish_run(tmp_path, layers, None, None, policy).gate for policy in policies]
    assert "unfused-residual" in verdicts[0].by_rule() and "unfused-residual" not in verdicts[1].by_rule()


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
    check_expectations(t, "8.6.2.3", "8.7")
    with pytest.raises(RemoteError, match=r"runs TensorRT 8\.5\.2, but .*orin.yaml expects 8\.6") as ei:
        check_expectations(t, "8.5.2", "8.7")
    assert ei.value.exit_code == 1
    with pytest.raises(RemoteError, match=r"compute capability 7\.2 GPU"):
        check_expectations(t, "8.6.2", "7.2")


def test_parse_agent_reply():
    ok = json.dumps({"protocol": 1, "agent": "x", "command": "probe", "ok": True, "result": {"a": 1}})
    assert parse_agent_reply("noise\n" + ok + "\n", "", 0, "probe")["result"] == {"a": 1}
    with pytest.raises(RemoteError, match="speaks protocol 2"):
        parse_agent_reply(json.dumps({"protocol": 2, "ok": True}), "", 0, "probe")
    with pytest.raises(RemoteError, match=r"no answer \(exit 127\): sh: 1: python9: not found") as ei:
        parse_agent_reply("", "sh: 1: python9: not found\n", 127, "probe")
    assert ei.value.exit_code == 1


def test_run_log_lines_are_on_disk_at_once(tmp_path):
    """deploy.log is what a user tails during a long build: the target's lines may not wait in a buffer."""
    from edgeq.pipeline.rundir import RunLog

    log = RunLog(tmp_path)
    log.line("build: started")
    log.remote_line("[I] [TRT] Local timing cache in use.")
    text = (tmp_path / "deploy.log").read_text()
    assert text.endswith("build: started\n  | [I] [TRT] Local timing cache in use.\n")
    log.close()


def test_run_dirs_are_unique_and_safe(tmp_path):
    a = new_run_dir(tmp_path, Path("my model (v2).onnx"), "orin agx")
    b = new_run_dir(tmp_path, Path("my model (v2).onnx"), "orin agx")
    assert a != b and a.name.startswith("my_model_v2-orin_agx-") and a.parent == b.parent == tmp_path


def test_cli_renders_a_finished_run_and_exits_1_on_the_gate(tmp_path, monkeypatch, cli):
    """The CLI half of a deploy that got through (engine files from the real fixtures): the stage table,
    the report path, and exit 1 naming the offending layer. Only the remote half is replaced."""
    import edgeq.orchestration.deploy as dep

    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "t.yaml").write_text("host: 127.0.0.1\nuser: me\nuse_agent: true\n")
    model = tmp_path / "resnet50_ortfb.onnx"
    model.write_bytes(b"unused")

    def finished_deploy(model_path, target, options, *, progress, on_event):
        run_dir = new_run_dir(Path(options.runs_dir), Path(model_path), target.name)
        done = finish_run(
            run_dir, FIXTURES / "resnet50_ortfb.explicit.layers.json",
            FIXTURES / "resnet50_ortfb.explicit.profile.json", None, deploy_policy(options, target),
        )  # fmt: skip
        stages = [StageRecord(n, "ok", 0.1, "") for n in STAGES]
        stages[-1] = StageRecord("gate", "failed", 0.0, done.gate.summary())
        return dep.DeployResult(run_dir, stages, done, {"stages": {}})

    monkeypatch.setattr(dep, "deploy", finished_deploy)
    code, out, _ = cli("deploy", model, "--target", "t")
    assert code == 1
    assert "gate int8: FAILED on 1 layer" in out and "[interior-reformat]" in out
    assert "report.html" in out and "run directory: runs" in out
    code, out, _ = cli("deploy", model, "--target", "t", "--gate", "none")
    assert code == 0 and "not applied" in out


# -- the whole deploy over SSH against a trtexec stand-in REPLAYING recorded TensorRT 8.6.0 runs ---------
#
# tests/trtexec_replay.py: the "trtexec" on this target prints the real logs of the resnet50_ortfb explicit
# build and run on an H200 (tests/fixtures/trt86-h200/resnet50_ortfb.explicit.*) and copies their real
# --exportLayerInfo / --exportProfile JSON where it is told to. It proves the orchestration (quoting over
# SSH, every stage, downloads, run directory, report, gate, exit codes, caches), not TensorRT: the engine
# it "builds" is a placeholder and the layers it reports are ResNet-50's, not the deployed model's.

QDQ_NAME = "resnet like $(touch pwned) & 'v1'; x.onnx"
ORTFB = "resnet50_ortfb.explicit"


def qdq_model(path: Path) -> Path:
    """A small explicit-INT8 model as onnxruntime quantizes it (float biases: TensorRT 8.6 parses it)."""
    from edgeq import zoo

    onnx.save(zoo.qdq_ort(zoo.resnet_like(size=32, width=8), quantize_bias=False), str(path))
    return path


@pytest.fixture
def trtexec_target(tmp_path, monkeypatch, ssh_server):
    """targets/replay.yaml: the loopback sshd with ``backend: trtexec`` and ``trtexec:`` the stand-in.

    Yields ``make(build=Recorded, run=Recorded, relative=False, keys=None, outputs_shift=0) -> (root,
    model, remote work dir, stand-in)``. ``relative``: the work_dir is relative to the login home, as in
    the shipped target files (a unique directory there, removed afterwards); else an absolute one under
    tmp_path. ``outputs_shift``: added to the stand-in's --exportOutput values. ``keys``:
    more target file keys.
    """
    import pwd
    import shutil

    from trtexec_replay import Recorded, replay_trtexec

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "targets").mkdir()
    bin_dir = tmp_path / "target bin"  # a space in trtexec's path too
    bin_dir.mkdir()
    made: list[Path] = []

    def make(
        build: Recorded = Recorded(FIXTURES / f"{ORTFB}.build.log"),
        run: Recorded = Recorded(FIXTURES / f"{ORTFB}.run.log"),
        relative: bool = False,
        keys: dict | None = None,
        outputs_shift: float = 0.0,
    ):
        trtexec = replay_trtexec(
            bin_dir, build=build, run=run,
            layers=FIXTURES / f"{ORTFB}.layers.json", profile=FIXTURES / f"{ORTFB}.profile.json",
            outputs_shift=outputs_shift,
        )  # fmt: skip
        # unique in the shared login home: two runs of the suite at once must not share a work dir
        unique = f".edgeq-test-{tmp_path.name}-{uuid.uuid4().hex[:8]}"
        work_dir = unique if relative else str(tmp_path / "remote home")
        remote = Path(pwd.getpwnam(ssh_server.user).pw_dir) / work_dir  # what the session resolves
        made.append(remote)
        target = {
            "host": ssh_server.host,
            "port": ssh_server.port,
            "user": ssh_server.user,
            "identity_file": str(ssh_server.identity_file),
            "known_hosts": str(ssh_server.known_hosts),
            "work_dir": work_dir,
            "python": sys.executable,
            "tensorrt": "8.6",
            "backend": "trtexec",
            "trtexec": str(trtexec),
            "timeouts": {"connect": 10, "command": 60},
            **(keys or {}),
        }
        (tmp_path / "targets" / "replay.yaml").write_text(yaml.safe_dump(target))
        return tmp_path, qdq_model(tmp_path / QDQ_NAME), remote, trtexec

    yield make
    for remote in made:
        shutil.rmtree(remote, ignore_errors=True)


def _on_target(path: str) -> Path:
    """A path the agent was given, as the target resolves it (relative ones: from the login home)."""
    import pwd

    return Path(pwd.getpwuid(os.getuid()).pw_dir) / path


def _flag(argv: list[str], flag: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in argv if a.startswith(flag + "=")]
    return value


def _real_latency_median(run_log: Path) -> float:
    """The median latency trtexec printed in the recorded run (its performance summary)."""
    import re

    (line,) = [ln for ln in run_log.read_text().splitlines() if "] [I] Latency: " in ln]
    return float(re.search(r"median = ([0-9.]+) ms", line).group(1))


@pytest.mark.sshd
def test_replayed_trtexec_deploy_runs_every_stage_and_the_int8_gate_fails(trtexec_target, cli):
    """Replays recorded TensorRT 8.6.0 outputs (resnet50_ortfb.explicit.*): proves the orchestration, not
    TensorRT. Every stage runs, the run directory holds every artefact, and the gate fails (exit 1) on
    the recorded engine's one interior reformat, named in one line; ``--gate none`` exits 0."""
    from trtexec_replay import ENGINE_PLACEHOLDER, calls

    root, model, remote, trtexec = trtexec_target()
    runs = root / "runs"
    code, out, err = cli("deploy", model, "--target", "replay", "--runs-dir", runs)
    assert code == 1, (out, err)
    assert "Traceback" not in out + err and not [ln for ln in err.splitlines() if ln.startswith("error:")]

    (run_dir,) = runs.iterdir()
    st = _stages(run_dir)
    assert {n: s["status"] for n, s in st.items()} == {
        "clean": "ok", "quantize": "skipped", "lint": "ok", "upload": "ok", "probe": "ok", "build": "ok",
        "inspect": "ok", "profile": "ok", "accuracy": "skipped", "report": "ok", "gate": "failed",
    }  # fmt: skip
    for name in ("engine.plan", "layers.json", "profile.json", "report.json", "report.html", "timings.json",
                 "stages.json", "probe.json", "deploy.log"):  # fmt: skip
        assert (run_dir / name).is_file(), name
    # what the target wrote came back byte for byte
    assert (run_dir / "engine.plan").read_bytes() == ENGINE_PLACEHOLDER
    assert (run_dir / "layers.json").read_bytes() == (FIXTURES / f"{ORTFB}.layers.json").read_bytes()
    assert (run_dir / "profile.json").read_bytes() == (FIXTURES / f"{ORTFB}.profile.json").read_bytes()
    # the probe read trtexec's banner; the build and profile replies were parsed from the real logs
    assert st["probe"]["data"]["tensorrt"] == "8.6.0"
    assert st["build"]["data"]["mode"] == "explicit-int8"
    assert st["build"]["data"]["engine_bytes"] == len(ENGINE_PLACEHOLDER)
    timings = json.loads((run_dir / "timings.json").read_text())
    assert timings["latency_ms"]["median"] == _real_latency_median(FIXTURES / f"{ORTFB}.run.log")
    assert set(timings["stages"]) == set(st) - {"quantize", "accuracy"}  # skipped: Q/DQ already, no --holdout
    assert "[I] Engine built in 303.457 sec." in (run_dir / "deploy.log").read_text()  # the target's log

    # the gate: one offending layer, named once, in one line with its rule
    report = json.loads((run_dir / "report.json").read_text())
    assert report["gate"]["passed"] is False
    (violation,) = report["gate"]["violations"]
    assert violation["rule"] == "interior-reformat"
    named = [ln for ln in out.splitlines() if violation["layer_name"][:40] in ln]
    assert len(named) == 1 and "[interior-reformat]" in named[0], out
    assert "gate int8: FAILED on 1 layer" in out
    assert st["gate"]["data"] == {"passed": False}

    # every argv element arrived whole: the model's name with spaces, quotes and $(...) included
    probe, build, inspect, profile = calls(trtexec)
    assert probe[1:] == ["--help"]
    cleaned = QDQ_NAME[: -len(".onnx")] + ".clean.onnx"
    onnx_remote = Path(_flag(build, "--onnx"))
    assert onnx_remote.name == cleaned and onnx_remote.parent.parent == remote / "cache"
    assert onnx_remote.read_bytes() == (run_dir / cleaned).read_bytes()
    assert {"--int8", "--profilingVerbosity=detailed", "--skipInference"} <= set(build)
    engine = _flag(build, "--saveEngine")
    assert Path(engine).parent == remote / "runs" / run_dir.name
    assert _flag(inspect, "--loadEngine") == _flag(profile, "--loadEngine") == engine
    assert Path(_flag(inspect, "--exportLayerInfo")).parent == Path(engine).parent
    assert Path(_flag(profile, "--exportProfile")).parent == Path(engine).parent
    assert "--separateProfileRun" in profile
    assert not (root / "pwned").exists() and not (Path.home() / "pwned").exists()

    code, out, err = cli("deploy", model, "--target", "replay", "--runs-dir", runs, "--gate", "none")
    assert code == 0, (out, err)
    assert "gate none: not applied" in out


@pytest.mark.sshd
def test_replayed_trtexec_second_deploy_reuses_uploads_and_timing_cache(trtexec_target, cli):
    """Replays recorded TensorRT 8.6.0 outputs: a second deploy of an unchanged model sends nothing (model
    and agent come from the target's content-addressed cache) and hands trtexec the same timing cache.
    The work_dir is relative to the login home, as in the shipped target files."""
    from trtexec_replay import calls

    root, model, remote, trtexec = trtexec_target(relative=True)  # like the examples' "edgeq"
    runs = root / "runs"
    assert cli("deploy", model, "--target", "replay", "--runs-dir", runs)[0] == 1
    (first,) = runs.iterdir()
    code, out, err = cli("deploy", model, "--target", "replay", "--runs-dir", runs)
    assert code == 1, (out, err)
    (second,) = [d for d in runs.iterdir() if d != first]

    up1, up2 = (_stages(d)["upload"]["data"] for d in (first, second))
    assert up1["model"]["bytes_sent"] > 0 and up1["agent"]["bytes_sent"] > 0
    assert up2["model"]["bytes_sent"] == 0 and up2["model"]["cached"]
    assert up2["agent"]["bytes_sent"] == 0 and up2["agent"]["cached"]
    assert up2["model"]["remote_path"] == up1["model"]["remote_path"]

    builds = [a for a in calls(trtexec) if any(x.startswith("--onnx=") for x in a)]
    assert len(builds) == 2
    cache1, cache2 = (_flag(a, "--timingCacheFile") for a in builds)
    assert cache1 == cache2 and _on_target(cache1).parent == remote / "timing-cache"
    assert _on_target(cache1).parent.is_dir()  # the agent made the directory trtexec writes the cache into
    assert _stages(second)["build"]["data"]["timing_cache"] == cache1
    # each run has its own directory on the target, under the work_dir in the login home
    engines = [_on_target(_flag(a, "--saveEngine")) for a in builds]
    assert engines == [remote / "runs" / d.name / "engine.plan" for d in (first, second)]
    assert all(e.is_file() for e in engines)


@pytest.mark.sshd
def test_replayed_trtexec_deploy_passes_the_targets_build_settings_to_trtexec(trtexec_target, cli):
    """Replays recorded TensorRT 8.6.0 outputs: the target file's build section and --no-fp16 arrive as
    trtexec 8.6's own flags, on every trtexec call that needs them (DLA on build, inspect and profile)."""
    from trtexec_replay import calls

    build = {"workspace": 2048, "tactic_sources": ["-CUBLAS", "-CUBLAS_LT", "-CUDNN"], "dla_core": 1,
             "allow_gpu_fallback": True, "timing_cache": False}  # fmt: skip
    root, model, _, trtexec = trtexec_target(keys={"build": build})
    code, out, err = cli("deploy", model, "--target", "replay", "--runs-dir", root / "runs", "--no-fp16",
                         "--iterations", "7", "--duration", "0.5", "--gate", "none")  # fmt: skip
    assert code == 0, (out, err)
    _, b, i, p = calls(trtexec)
    assert b[1:] == [
        b[1], b[2], "--int8", "--memPoolSize=workspace:2048", "--tacticSources=-CUBLAS,-CUBLAS_LT,-CUDNN",
        "--useDLACore=1", "--allowGPUFallback", "--profilingVerbosity=detailed", "--skipInference",
    ]  # fmt: skip
    assert b[1].startswith("--onnx=") and b[2].startswith("--saveEngine=")
    assert "--useDLACore=1" in i and "--allowGPUFallback" not in i
    assert {"--useDLACore=1", "--iterations=7", "--duration=0.5", "--warmUp=200"} <= set(p)


@pytest.mark.sshd
@pytest.mark.parametrize(
    ("log", "stage", "message"),
    [
        ("yolo_ortfb.explicit.build.log", "build", "Error[10]: Could not find any implementation for node"),
        ("resnet50_ortqdq.explicit.build.log", "parse",
         "Error[3]: fc.bias_DequantizeLinear: only activation types allowed as input to this layer."),
    ],
)  # fmt: skip
def test_replayed_trtexec_build_failure_is_one_line(trtexec_target, cli, log, stage, message):
    """Replays a recorded failing TensorRT 8.6.0 build (its real log, exit code 1): one error line naming
    the build and TensorRT's own error text, exit 1; stages.json says build failed, later stages not run."""
    from trtexec_replay import Recorded

    root, model, _, _ = trtexec_target(build=Recorded(FIXTURES / log, 1))
    runs = root / "runs"
    code, out, err = cli("deploy", model, "--target", "replay", "--runs-dir", runs)
    assert code == 1
    assert "Traceback" not in out + err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, err
    assert "build on replay" in errors[0] and f"stage '{stage}'" in errors[0] and message in errors[0]
    (run_dir,) = runs.iterdir()
    st = _stages(run_dir)
    assert st["build"]["status"] == "failed" and message in st["build"]["summary"]
    assert all(st[n]["status"] == "not run" for n in ("inspect", "profile", "report", "gate"))
    assert not (run_dir / "engine.plan").exists()
    # TensorRT's whole log is kept in deploy.log, once (it streamed in; the reply's copy is not repeated)
    logged = (run_dir / "deploy.log").read_text().splitlines()
    recorded = (FIXTURES / log).read_text().splitlines()
    assert [ln[4:] for ln in logged if ln.startswith("  | ")] == recorded


@pytest.mark.sshd
def test_a_replayed_build_failure_names_the_qdq_region_it_broke_on(trtexec_target, cli):
    """The real log of an 8.6 build that failed inside a SiLU (yolo_edgeq_all.explicit.build.log), for a
    Q/DQ model lint lets through (the zoo's YOLO-like net as edgeq places it): the one error line names
    the nodes TensorRT named, with the entry that explains the error."""
    from trtexec_replay import Recorded

    from edgeq import zoo
    from edgeq.quant.data import calibration_set
    from edgeq.quant.quantize import QuantizeOptions, quantize_model

    log = FIXTURES.parent / "trt86-h200-edgeq" / "yolo_edgeq_all.explicit.build.log"
    root, _, _, _ = trtexec_target(build=Recorded(log, 1))
    float_model = zoo.yolo_like()
    qdq = quantize_model(float_model, calibration_set(float_model, None, synthetic=2, seed=0),
                         QuantizeOptions(holdout=0.0)).model
    model = root / "yolo.int8.onnx"
    onnx.save(qdq, model)
    code, out, err = cli("deploy", model, "--target", "replay", "--runs-dir", root / "runs")
    assert code == 1 and "Traceback" not in out + err
    [line] = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert "Error[10]: Could not find any implementation for node PWN(PWN(/stem/stem.0/stem.0.2/Sigm" in line
    assert line.split(" (the TensorRT log")[0].endswith(
        "; Q/DQ region: around '/stem/stem.0/stem.0.2/Sigmoid', '/stem/stem.0/stem.0.2/Mul' "
        "(edgeq rules silu-whole)")


@pytest.mark.sshd
def test_trtexec_that_cannot_start_fails_the_probe_with_the_loaders_message(trtexec_target, cli):
    """A trtexec whose TensorRT libraries are missing (the dynamic loader's own message, exit 127, as on a
    Jetson with a broken LD_LIBRARY_PATH) must stop the deploy at the probe with that message; it used to
    pass the probe as "TensorRT None" and fail later with the wrong hint or no reason at all."""
    root, model, _, trtexec = trtexec_target()
    trtexec.write_text(
        '#!/bin/sh\necho "$0: error while loading shared libraries: libnvinfer.so.8: cannot open shared '
        'object file: No such file or directory" >&2\nexit 127\n'
    )
    runs = root / "runs"
    code, out, err = cli("deploy", model, "--target", "replay", "--runs-dir", runs)
    assert code == 1 and "Traceback" not in out + err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, err
    assert "probe on replay" in errors[0] and "stage 'import'" in errors[0]
    assert "exit 127" in errors[0] and "libnvinfer.so.8: cannot open shared object file" in errors[0]
    (run_dir,) = runs.iterdir()
    st = _stages(run_dir)
    assert st["probe"]["status"] == "failed" and st["build"]["status"] == "not run"

    code, _, err = cli("targets", "check", "replay")
    assert code == 1 and "libnvinfer.so.8" in err


@pytest.mark.sshd
def test_replayed_trtexec_that_dies_after_passed_still_deploys_with_a_warning(trtexec_target, cli):
    """trtexec 8.6.0 printed ``&&&& PASSED``, wrote the engine and died at exit (fixture
    trt86-h200-edgeq/agent/build.trtexec.json): the engine is checked and the build counts, with a
    warning naming the signal in deploy.log and stages.json. The same for inspect and profile, whose
    JSON files are checked instead."""
    import signal

    from trtexec_replay import Recorded, replay_trtexec

    root, model, _, trtexec = trtexec_target()
    replay_trtexec(
        trtexec.parent,
        build=Recorded(FIXTURES / f"{ORTFB}.build.log", signal=signal.SIGSEGV),
        run=Recorded(FIXTURES / f"{ORTFB}.run.log", signal=signal.SIGSEGV),
        layers=FIXTURES / f"{ORTFB}.layers.json",
        profile=FIXTURES / f"{ORTFB}.profile.json",
        engine_bytes=27 << 20,  # the recorded log loaded back a 27 MiB engine
    )
    runs = root / "runs"
    code, out, err = cli("deploy", model, "--target", "replay", "--runs-dir", runs, "--gate", "none")
    assert code == 0, (out, err)
    (run_dir,) = runs.iterdir()
    build = _stages(run_dir)["build"]
    assert build["status"] == "ok" and "killed by signal 11 (SIGSEGV)" in build["summary"]
    log = (run_dir / "deploy.log").read_text()
    for stage in ("build", "inspect", "profile"):
        assert f"{stage}: warning - trtexec printed PASSED, then was killed by signal 11" in log
        assert _stages(run_dir)[stage]["status"] == "ok"
    assert "so the profile counts" in _stages(run_dir)["profile"]["summary"]
    assert (run_dir / "engine.plan").stat().st_size == 27 << 20


@pytest.mark.sshd
def test_agent_killed_on_the_target_fails_the_stage_naming_the_signal(trtexec_target, cli):
    """The agent killed mid-build (OOM killer, a user's kill -9) while the link is up: the build stage
    fails naming the signal, not "connection dropped ... may still be running"."""
    import signal

    from trtexec_replay import Recorded

    killer = Recorded(FIXTURES / f"{ORTFB}.build.log", kill_parent=signal.SIGKILL)
    root, model, _, _ = trtexec_target(build=killer)
    runs = root / "runs"
    code, out, err = cli("deploy", model, "--target", "replay", "--runs-dir", runs)
    assert code == 1 and "Traceback" not in out + err
    (run_dir,) = runs.iterdir()
    build = _stages(run_dir)["build"]
    assert build["status"] == "failed"
    assert "the agent was killed by signal KILL on the target" in build["summary"]
    assert "dropped" not in build["summary"] and "may still be running" not in out + err


@pytest.mark.sshd
def test_two_deploys_of_one_new_model_to_one_target_at_once_both_succeed(trtexec_target):
    """Both upload the agent and the model into the target's cache at the same moment: neither collides
    with the other's upload (each file is sent once, the other deploy finds it cached)."""
    import threading

    from edgeq.orchestration.deploy import DeployOptions, deploy
    from edgeq.remote.targets import load_target

    root, model, _, _ = trtexec_target()
    target = load_target(root / "targets" / "replay.yaml")
    start = threading.Barrier(2)
    results: list = []

    def one() -> None:
        start.wait()
        try:
            results.append(deploy(model, target, DeployOptions(runs_dir=root / "runs", gate="none")))
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 2 and not [r for r in results if isinstance(r, Exception)], results
    run_dirs = sorted((root / "runs").iterdir())
    assert len(run_dirs) == 2
    for run_dir in run_dirs:
        stages = _stages(run_dir)
        assert all(s["status"] in ("ok", "skipped") for s in stages.values()), stages


def test_targets_check_is_the_probe_stage(tmp_path, monkeypatch):
    """``check_target`` probes through ``pipeline.probe``: the same facts and the same errors as a
    deploy's probe stage, without a run directory."""
    from contextlib import contextmanager

    import edgeq.orchestration.deploy as dep
    from edgeq.remote.exec import CommandResult
    from edgeq.remote.upload import Upload

    trt = {"version": "8.5.2"}

    class Runner:
        destination = "fake"

        def put(self, local, remote_dir, *, progress=None):
            return Upload(f"{remote_dir}/x/{Path(local).name}", "x", 7, 0, False)

        def run(self, argv, *, timeout=None, check=True, on_stderr=None):
            assert argv[2] == "probe"
            reply = {"protocol": AGENT_PROTOCOL, "ok": True,
                     "result": {"tensorrt": trt, "gpus": [{"name": "Orin", "compute_capability": "8.7"}]}}
            return CommandResult(tuple(argv), 0, json.dumps(reply), "")

    @contextmanager
    def runner(target, accept_new_host_key=False):
        yield Runner()

    monkeypatch.setattr(dep, "target_runner", runner)
    target = target_from_dict({"host": "h", "user": "u", "use_agent": True, "tensorrt": "8.6"},
                              tmp_path / "t.yaml")  # fmt: skip
    with pytest.raises(RemoteError, match=r"runs TensorRT 8\.5\.2, but .* expects 8\.6"):
        dep.check_target(target, cache_dir=tmp_path / "agent")
    trt["version"] = "8.6.1"
    facts = dep.check_target(target, cache_dir=tmp_path / "agent")
    assert facts["tensorrt"]["version"] == "8.6.1" and facts["agent"]["bytes_sent"] == 7
