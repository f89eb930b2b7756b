"""The target agent, run for real with this machine's Python (which has no TensorRT, like a bare target).

Covers: the zipapp (deterministic bytes, version stamp, no edgeq imports, Python 3.8 grammar), the
JSON protocol and exit codes of every subcommand without TensorRT, trtexec argv construction checked
against the command lines that built the real fixture engines, and trtexec output parsing on the real
fixture logs. The trtexec backend's process handling runs against a stand-in that replays recorded
trtexec 8.6 runs (tests/trtexec_replay.py): real logs and JSON, no TensorRT.
"""

from __future__ import annotations

import ast
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, ROOT
from trtexec_replay import Recorded, calls, replay_trtexec

from edgeq.agent import trtexec_backend as tb
from edgeq.agent.common import AgentError, percentiles
from edgeq.agent.trt_calibrator import cache_for_tensorrt
from edgeq.agent.trt_common import first_error, severity_name, version_number, write_atomic
from edgeq.agent.trt_cuda import open_cuda
from edgeq.agent.trt_engine import layer_info_result
from edgeq.agent.trt_profile import profile_records, tensor_bytes
from edgeq.remote import zipapp as za

ALLOWED_THIRD_PARTY = {"tensorrt", "pycuda", "cuda"}
# The modules of backend ``python`` beside its entry point ``trt_backend``.
PYTHON_BACKEND = ("trt_build", "trt_calibrator", "trt_common", "trt_cuda", "trt_engine", "trt_infer",
                  "trt_profile")


@pytest.fixture(scope="module")
def agent(tmp_path_factory) -> za.AgentBundle:
    return za.build_agent(tmp_path_factory.mktemp("agent"))


def run_agent(agent: za.AgentBundle, *args: str, timeout: float = 60) -> tuple[int, dict, str]:
    """Run the zipapp with the real interpreter; stdout must be exactly one JSON object."""
    proc = subprocess.run(
        [sys.executable, str(agent.path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # as on a target: no edgeq around
    )
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, (
        f"stdout must hold one JSON line, got: {proc.stdout!r} / stderr {proc.stderr[-500:]}"
    )
    assert "Traceback" not in proc.stdout
    obj = json.loads(lines[0])
    assert obj["protocol"] == 1 and obj["agent"] == agent.version
    assert set(obj) == {"protocol", "agent", "command", "ok", "error" if not obj["ok"] else "result"}
    return proc.returncode, obj, proc.stderr


# -- zipapp ------------------------------------------------------------------------------------------


def test_zipapp_is_deterministic_and_reused(tmp_path):
    a = za.build_agent(tmp_path / "a")
    b = za.build_agent(tmp_path / "b")
    assert a.path.read_bytes() == b.path.read_bytes()
    assert (a.sha256, a.version) == (b.sha256, b.version)
    assert a.path.name == f"edgeq-agent-{a.version}.pyz"
    mtime = a.path.stat().st_mtime_ns
    again = za.build_agent(tmp_path / "a")
    assert again.path.stat().st_mtime_ns == mtime  # unchanged sources: the file is not rewritten


def test_version_stamp_follows_the_sources(tmp_path):
    src = tmp_path / "agent"
    shutil.copytree(za.AGENT_DIR, src, ignore=shutil.ignore_patterns("__pycache__"))
    data1, v1 = za.agent_zip_bytes(src)
    assert v1 == za.agent_zip_bytes()[1]
    (src / "common.py").write_text((src / "common.py").read_text() + "\n# changed\n")
    data2, v2 = za.agent_zip_bytes(src)
    assert v1 != v2 and data1 != data2
    stamp = zipfile.ZipFile(io.BytesIO(data2)).read("edgeq_agent/_stamp.py").decode()
    assert v2 in stamp


def _agent_modules(agent: za.AgentBundle) -> dict[str, str]:
    with zipfile.ZipFile(agent.path) as zf:
        return {n: zf.read(n).decode() for n in zf.namelist() if n.endswith(".py")}


def test_zipapp_imports_only_stdlib_tensorrt_and_cuda(agent):
    modules = _agent_modules(agent)
    assert "__main__.py" in modules
    for module in ("trt_backend", *PYTHON_BACKEND):
        assert f"edgeq_agent/{module}.py" in modules
    for name, src in modules.items():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                assert top != "edgeq", f"{name} imports edgeq"
                assert top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY or top == "edgeq_agent", (
                    f"{name} imports {top}"
                )


def test_only_the_python_backend_imports_tensorrt(agent):
    for name, src in _agent_modules(agent).items():
        mentions = any(
            isinstance(n, (ast.Import, ast.ImportFrom))
            and any(a.name.split(".")[0] in ALLOWED_THIRD_PARTY for a in n.names)
            | (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in ALLOWED_THIRD_PARTY)
            for n in ast.walk(ast.parse(src))
        )
        if name not in ("edgeq_agent/trt_common.py", "edgeq_agent/trt_cuda.py"):
            assert not mentions, f"{name} imports TensorRT/CUDA (only trt_common and trt_cuda may)"


def test_agent_sources_parse_as_python_38(agent):
    for name, src in _agent_modules(agent).items():
        tree = ast.parse(src, filename=name, feature_version=(3, 8))
        for node in ast.walk(tree):
            # No annotations at all: Python 3.8 evaluates them, and list[str] / X | Y fail there at runtime.
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.returns is None, f"{name}:{node.lineno} return annotation"
                for a in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
                    assert a.annotation is None, f"{name}:{node.lineno} annotated argument"
            assert not isinstance(node, ast.AnnAssign), f"{name}:{node.lineno} annotated assignment"
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("removeprefix", "removesuffix"), f"{name}:{node.lineno} 3.9+ str API"


# -- protocol, real interpreter, no TensorRT -------------------------------------------------------------


def test_probe_reports_tensorrt_not_available(agent):
    code, obj, stderr = run_agent(agent, "probe")
    assert code == 1 and obj["command"] == "probe" and obj["ok"] is False
    err = obj["error"]
    assert err["stage"] == "import"
    assert err["message"].startswith("TensorRT not available: ")
    facts = err["details"]
    assert facts["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert facts["platform"]["machine"]
    assert isinstance(facts["gpus"], list)  # none here: no nvidia-smi, no Jetson device tree
    assert set(facts["cuda_python"]) == {"cuda", "pycuda", "libcudart"}  # what `profile` could use
    assert all(isinstance(v, bool) for v in facts["cuda_python"].values())
    assert "Traceback" not in stderr


@pytest.mark.parametrize("command", ["build", "inspect", "profile"])
def test_commands_without_tensorrt_fail_structured(agent, tmp_path, command):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"not really onnx: TensorRT is imported before the file is read")
    args = {
        "build": ["--onnx", str(model), "--saveEngine", str(tmp_path / "e.plan"), "--int8", "--fp16"],
        "inspect": ["--loadEngine", str(model), "--exportLayerInfo", str(tmp_path / "l.json")],
        "profile": ["--loadEngine", str(model), "--exportProfile", str(tmp_path / "p.json")],
    }[command]
    code, obj, stderr = run_agent(agent, command, *args)
    assert (code, obj["command"], obj["ok"]) == (1, command, False)
    assert obj["error"]["stage"] == "import" and "TensorRT not available" in obj["error"]["message"]
    assert "Traceback" not in stderr


def test_missing_input_is_stage_input(agent, tmp_path):
    code, obj, _ = run_agent(agent, "build", "--onnx", str(tmp_path / "nope.onnx"), "--saveEngine", "e.plan")
    assert code == 1 and obj["error"]["stage"] == "input" and "nope.onnx" in obj["error"]["message"]


def test_usage_errors_exit_2_with_json(agent):
    code, obj, _ = run_agent(agent, "build", "--onnx", "x.onnx")
    assert code == 2 and obj["command"] == "build" and obj["error"]["stage"] == "usage"
    assert "--saveEngine" in obj["error"]["message"]
    code, obj, _ = run_agent(agent, "frobnicate")
    assert code == 2 and obj["error"]["stage"] == "usage"
    code, obj, _ = run_agent(agent)
    assert code == 2 and "probe, build, inspect, profile or infer" in obj["error"]["message"]


def test_bad_tactic_source_is_a_usage_error(agent, tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    code, obj, _ = run_agent(
        agent, "build", "--onnx", str(model), "--saveEngine", str(tmp_path / "e"), "--tacticSources=-CUBLASS"
    )
    assert code == 2 and obj["error"]["stage"] == "usage" and "CUBLAS_LT" in obj["error"]["message"]


def test_trtexec_backend_missing_binary(agent, tmp_path):
    code, obj, _ = run_agent(agent, "probe", "--backend", "trtexec", "--trtexec", str(tmp_path / "trtexec"))
    assert code == 1 and obj["error"]["stage"] == "import" and "trtexec not found" in obj["error"]["message"]
    assert obj["error"]["details"]["python"]["version"]


def test_trtexec_probe_reads_the_version_banner(agent, tmp_path):
    """The probe asks trtexec for --help; trtexec 8.6 prints its banner first (the stand-in replays the
    recorded one, ``[TensorRT v8600]``), and that is the TensorRT version a trtexec target reports."""
    trtexec = replay_trtexec(tmp_path, build=Recorded(FIXTURES / "resnet50_ortfb.explicit.build.log"))
    code, obj, _ = run_agent(agent, "probe", "--backend=trtexec", f"--trtexec={trtexec}")
    assert code == 0 and obj["ok"], obj
    assert obj["result"]["tensorrt"] == {"version": "8.6.0", "via": "trtexec"}
    assert obj["result"]["trtexec"]["path"] == str(trtexec)
    assert calls(trtexec) == [[str(trtexec), "--help"]]


def test_trtexec_build_failure_comes_back_structured(agent, tmp_path):
    trtexec = replay_trtexec(tmp_path, build=Recorded(FIXTURES / "yolo_ortfb.explicit.build.log", 1))
    model = tmp_path / "yolo.onnx"
    model.write_bytes(b"x")
    code, obj, stderr = run_agent(
        agent,
        "build",
        "--backend",
        "trtexec",
        "--trtexec",
        str(trtexec),
        "--onnx",
        str(model),
        "--saveEngine",
        str(tmp_path / "y.plan"),
        "--int8",
        "--fp16",
    )
    assert code == 1 and obj["error"]["stage"] == "build"
    assert obj["error"]["message"].startswith("Error[10]: Could not find any implementation for node PWN(")
    assert any("&&&& FAILED" in ln for ln in obj["error"]["log"])
    assert "Building engine failed" in stderr  # the log streamed live on stderr


EDGEQ_AGENT = FIXTURES.parent / "trt86-h200-edgeq" / "agent"


def _build_that_dies_after_passed(agent, tmp_path, *, engine_bytes, run):
    """The real TensorRT 8.6.0 trtexec build log that ends in ``&&&& PASSED`` (fixture
    build.trtexec.json: the agent called it a failure whose message was the PASSED line), then SIGSEGV."""
    trtexec = replay_trtexec(
        tmp_path,
        build=Recorded(EDGEQ_AGENT / "build.trtexec.err", signal=signal.SIGSEGV),
        run=run,
        engine_bytes=engine_bytes,
    )
    (tmp_path / "small.int8.onnx").write_bytes(b"x")
    engine = tmp_path / "small.trtexec.plan"
    args = ["build", "--backend=trtexec", f"--trtexec={trtexec}", f"--onnx={tmp_path / 'small.int8.onnx'}",
            f"--saveEngine={engine}", "--int8", "--fp16"]
    return (*run_agent(agent, *args), trtexec, engine)


def test_trtexec_passed_then_killed_counts_when_the_engine_checks_out(agent, tmp_path):
    run = Recorded(EDGEQ_AGENT / "inspect.trtexec.err")  # the same engine loaded back: PASSED
    size = 1971860  # the Python backend's engine of the same model (build.python.json): "1 MiB" loaded
    code, obj, _, trtexec, engine = _build_that_dies_after_passed(agent, tmp_path, engine_bytes=size, run=run)
    assert code == 0 and obj["ok"], obj
    (warning,) = obj["result"]["warnings"]
    assert "PASSED, then was killed by signal 11 (SIGSEGV)" in warning and "deserializes" in warning
    assert obj["result"]["engine_bytes"] == engine.stat().st_size == size
    assert calls(trtexec)[-1] == [str(trtexec), f"--loadEngine={engine}", "--skipInference"]


@pytest.mark.parametrize(
    ("engine_bytes", "run", "why"),
    [
        (0, None, "without writing"),
        (300_000, None, "incomplete (300000 bytes, it loaded 1 MiB)"),
        (1971860, Recorded(FIXTURES / "yolo_ortfb.explicit.build.log", 1), "does not deserialize: Error[10]"),
    ],
    ids=["no-engine", "truncated", "does-not-deserialize"],
)
def test_trtexec_passed_then_killed_without_a_valid_engine_fails_saying_why(agent, tmp_path, engine_bytes,
                                                                           run, why):
    code, obj, _, _, _ = _build_that_dies_after_passed(agent, tmp_path, engine_bytes=engine_bytes, run=run)
    assert code == 1 and obj["error"]["stage"] == "build"
    message = obj["error"]["message"]
    assert message.startswith("trtexec printed PASSED, then was killed by signal 11 (SIGSEGV)")
    assert why in message


def _run_that_dies_after_passed(agent, tmp_path, command, *, layers=None, profile=None):
    """The real 8.6.0 inspect / profile logs (PASSED), then SIGSEGV at exit, as the build above."""
    log = EDGEQ_AGENT / f"{command}.trtexec.err"
    died = Recorded(log, signal=signal.SIGSEGV)
    trtexec = replay_trtexec(tmp_path, run=died, layers=layers, profile=profile)
    engine = tmp_path / "small.trtexec.plan"
    engine.write_bytes(b"plan")
    out = tmp_path / "out.json"
    flag = "--exportLayerInfo" if command == "inspect" else "--exportProfile"
    return run_agent(agent, command, "--backend=trtexec", f"--trtexec={trtexec}", f"--loadEngine={engine}",
                     f"{flag}={out}")  # fmt: skip


@pytest.mark.parametrize("command", ["inspect", "profile"])
def test_inspect_and_profile_count_when_trtexec_dies_after_passed_with_files_out(agent, tmp_path, command):
    recorded = {"layers": EDGEQ_AGENT / "small.trtexec.layers.json"} if command == "inspect" else {
        "profile": EDGEQ_AGENT / "small.trtexec.profile.json"}
    code, obj, _ = _run_that_dies_after_passed(agent, tmp_path, command, **recorded)
    assert code == 0 and obj["ok"], obj
    (warning,) = obj["result"]["warnings"]
    assert warning.startswith("trtexec printed PASSED, then was killed by signal 11 (SIGSEGV)")
    assert warning.endswith(f"so the {command} counts")
    if command == "inspect":
        assert obj["result"]["layers"] > 0
    else:
        assert obj["result"]["throughput_qps"] > 0


@pytest.mark.parametrize("command", ["inspect", "profile"])
def test_inspect_and_profile_dying_after_passed_without_their_files_fail(agent, tmp_path, command):
    code, obj, _ = _run_that_dies_after_passed(agent, tmp_path, command)
    assert code == 1 and obj["error"]["stage"] == command
    message = obj["error"]["message"]
    assert message.startswith("trtexec printed PASSED, then was killed by signal 11 (SIGSEGV)")
    assert f"{tmp_path / 'out.json'} is not complete" in message


def test_trtexec_parse_failure_is_stage_parse(agent, tmp_path):
    trtexec = replay_trtexec(tmp_path, build=Recorded(FIXTURES / "resnet50_ortqdq.explicit.build.log", 1))
    model = tmp_path / "r.onnx"
    model.write_bytes(b"x")
    code, obj, _ = run_agent(
        agent,
        "build",
        "--backend",
        "trtexec",
        "--trtexec",
        str(trtexec),
        "--onnx",
        str(model),
        "--saveEngine",
        str(tmp_path / "r.plan"),
        "--int8",
    )
    assert code == 1 and obj["error"]["stage"] == "parse"
    assert "fc.bias_DequantizeLinear: only activation types allowed" in obj["error"]["message"]


def test_trtexec_timeout_kills_and_reports(agent, tmp_path):
    trtexec = replay_trtexec(tmp_path, run=Recorded(FIXTURES / "resnet50_placed.explicit.run.log"), sleep=30)
    engine = tmp_path / "e.plan"
    engine.write_bytes(b"x")
    code, obj, _ = run_agent(
        agent,
        "profile",
        "--backend",
        "trtexec",
        "--trtexec",
        str(trtexec),
        "--timeout",
        "1",
        "--loadEngine",
        str(engine),
        "--exportProfile",
        str(tmp_path / "p.json"),
        timeout=20,
    )
    assert (
        code == 1 and obj["error"]["stage"] == "profile" and "timed out after 1 s" in obj["error"]["message"]
    )


def test_trtexec_exit_0_without_its_output_file_is_an_error(agent, tmp_path):
    trtexec = replay_trtexec(tmp_path, run=Recorded(FIXTURES / "resnet50_placed.explicit.run.log"))
    engine = tmp_path / "e.plan"
    engine.write_bytes(b"x")
    args = ["--trtexec", str(trtexec), "--loadEngine", str(engine), f"--exportProfile={tmp_path / 'p.json'}"]
    code, obj, _ = run_agent(agent, "profile", "--backend", "trtexec", *args)
    assert code == 1 and obj["error"]["stage"] == "profile" and "did not write" in obj["error"]["message"]


def test_trtexec_profile_parses_real_run_log(agent, tmp_path):
    real_profile = FIXTURES / "resnet50_placed.explicit.profile.json"
    run_log = FIXTURES / "resnet50_placed.explicit.run.log"
    trtexec = replay_trtexec(tmp_path, run=Recorded(run_log), profile=real_profile)
    engine = tmp_path / "e.plan"
    engine.write_bytes(b"x")
    out = tmp_path / "out dir" / "p.json"  # the agent creates the directory
    args = ["--trtexec", str(trtexec), "--loadEngine", str(engine), f"--exportProfile={out}"]
    code, obj, _ = run_agent(agent, "profile", "--backend", "trtexec", *args)
    assert code == 0 and obj["ok"], obj
    assert out.read_bytes() == real_profile.read_bytes()
    r = obj["result"]
    assert r["profile_json"] == str(out)
    assert r["throughput_qps"] == pytest.approx(1470.79)
    assert r["latency_ms"]["median"] == pytest.approx(0.765137)
    assert r["latency_ms"]["p99"] == pytest.approx(0.9021)
    assert r["gpu_compute_ms"]["mean"] == pytest.approx(0.673613)
    assert r["tensorrt"] == "8.6.0"


def test_trtexec_inspect_reply_matches_the_python_backends(agent, tmp_path):
    layers = FIXTURES / "resnet50_placed.explicit.layers.json"
    trtexec = replay_trtexec(
        tmp_path, run=Recorded(FIXTURES / "resnet50_placed.explicit.run.log"), layers=layers
    )
    engine = tmp_path / "e.plan"
    engine.write_bytes(b"x")
    out = tmp_path / "l.json"
    args = ["--trtexec", str(trtexec), "--loadEngine", str(engine), f"--exportLayerInfo={out}"]
    code, obj, _ = run_agent(agent, "inspect", "--backend", "trtexec", *args)
    assert code == 0 and obj["ok"], obj
    assert out.read_bytes() == layers.read_bytes()
    py_out = tmp_path / "py.json"
    python_reply = layer_info_result(layers.read_text(encoding="utf-8"), str(py_out), "8.6.0")
    assert obj["result"] == dict(python_reply, layers_json=str(out))  # same keys, same values
    assert py_out.read_bytes() == layers.read_bytes()


# -- trtexec argv construction (pure) -------------------------------------------------------------------


def _fixture_command(log: str) -> list[str]:
    first = (FIXTURES / log).read_text().splitlines()[0]
    return shlex.split(first.split(" # ", 1)[1])


def test_explicit_argv_matches_the_fixture_build():
    want = _fixture_command("resnet50_ortfb.explicit.build.log")  # how the real explicit engine was built
    got = tb.build_argv(
        "trtexec",
        "resnet50_ortfb.onnx",
        "resnet50_ortfb.explicit.plan",
        int8=True,
        fp16=True,
        tactic_sources=["-CUBLAS", "-CUBLAS_LT", "-cudnn"],
    )
    assert got[0] == want[0] and sorted(got[1:]) == sorted(want[1:])
    assert not any(a.startswith("--calib") for a in got)


def test_implicit_argv_reads_the_calibration_cache():
    argv = tb.build_argv(
        "/usr/src/tensorrt/bin/trtexec", "m.onnx", "m.plan", int8=True, fp16=True, calib="m.cache"
    )
    assert argv[:3] == ["/usr/src/tensorrt/bin/trtexec", "--onnx=m.onnx", "--saveEngine=m.plan"]
    assert {"--int8", "--fp16", "--calib=m.cache", "--profilingVerbosity=detailed", "--skipInference"} <= set(
        argv
    )
    with pytest.raises(ValueError, match="only means something with --int8"):
        tb.build_argv("trtexec", "m.onnx", "m.plan", calib="m.cache")


def test_fp16_only_argv():
    argv = tb.build_argv("trtexec", "m.onnx", "m.plan", fp16=True)
    assert "--fp16" in argv and "--int8" not in argv


def test_dla_workspace_and_timing_cache_argv():
    argv = tb.build_argv(
        "trtexec",
        "a b.onnx",
        "e.plan",
        int8=True,
        dla_core=1,
        allow_gpu_fallback=True,
        workspace_mib=2048,
        timing_cache="/home/n/edgeq/timing.cache",
    )
    assert "--onnx=a b.onnx" in argv  # one argv element: the transport quotes it, no shell splits it
    assert argv.index("--useDLACore=1") + 1 == argv.index("--allowGPUFallback")
    assert "--memPoolSize=workspace:2048" in argv and "--timingCacheFile=/home/n/edgeq/timing.cache" in argv
    with pytest.raises(ValueError, match="needs a DLA core"):
        tb.build_argv("trtexec", "m.onnx", "m.plan", allow_gpu_fallback=True)
    with pytest.raises(ValueError, match="DLA core must be >= 0"):
        tb.build_argv("trtexec", "m.onnx", "m.plan", dla_core=-1)
    with pytest.raises(ValueError, match="positive number of MiB"):
        tb.build_argv("trtexec", "m.onnx", "m.plan", workspace_mib=0)
    with pytest.raises(ValueError, match="tactic source"):
        tb.build_argv("trtexec", "m.onnx", "m.plan", tactic_sources=["CUDNN"])


def test_inspect_and_profile_argv_match_the_fixture_runs():
    want = _fixture_command("resnet50_placed.explicit.run.log")
    got_profile = tb.profile_argv(
        "trtexec",
        "resnet50_placed.explicit.plan",
        "resnet50_placed.explicit.profile.json",
        warmup_ms=200,
        iterations=10,
        duration_s=5,
    )
    # The fixture run did inspect+profile in one call; we split them. Together they cover its flags.
    got_inspect = tb.inspect_argv(
        "trtexec", "resnet50_placed.explicit.plan", "resnet50_placed.explicit.layers.json"
    )
    combined = set(got_profile[1:]) | set(got_inspect[1:])
    assert set(want[1:]) <= combined
    assert "--skipInference" in got_inspect and "--separateProfileRun" in got_profile
    assert tb.inspect_argv("t", "e", "l.json", dla_core=0)[2] == "--useDLACore=0"
    # a re-timing (edgeq tune) asks for the latency run alone: no profiler run to wait for
    timing_only = tb.profile_argv("trtexec", "e.plan", None)
    assert not [a for a in timing_only if "Profile" in a] and "--duration=3" in timing_only
    assert "--noDataTransfers" not in timing_only
    assert "--noDataTransfers" in tb.profile_argv("trtexec", "e.plan", None, no_data_transfers=True)


# -- trtexec output parsing on the real logs ------------------------------------------------------------


def test_performance_summary_from_real_log():
    lines = (FIXTURES / "resnet50_placed.explicit.run.log").read_text().splitlines()
    s = tb.parse_performance_summary(lines)
    assert s["throughput_qps"] == pytest.approx(1470.79)
    assert s["latency_ms"] == pytest.approx(
        {
            "min": 0.749756,
            "max": 1.40332,
            "mean": 0.773826,
            "median": 0.765137,
            "p90": 0.775635,
            "p95": 0.871826,
            "p99": 0.9021,
        }
    )
    assert s["gpu_compute_time_ms"]["median"] == pytest.approx(0.665527)
    assert tb.version_from_banner(lines) == "8.6.0"


def test_error_extraction_from_real_build_logs():
    yolo = (FIXTURES / "yolo_ortfb.explicit.build.log").read_text().splitlines()
    stage, msg = tb.error_from_log(yolo)
    assert stage == "build" and "PWN(PWN(/stem/stem.0/stem.0.2/Sigmoid)" in msg
    unet = (FIXTURES / "unet.implicit.build.log").read_text().splitlines()
    stage, msg = tb.error_from_log(unet)
    assert stage in ("build", "parse") and msg


LOADER_ERROR = (  # what glibc's dynamic loader prints when trtexec's TensorRT libraries are missing
    "{0}: error while loading shared libraries: libnvinfer.so.8: cannot open shared object file: "
    "No such file or directory"
)


def test_error_without_a_trtexec_report_is_its_last_line():
    """trtexec killed or never started: no [E] line, no &&&& FAILED; its last words are the reason."""
    stage, msg = tb.error_from_log(["", LOADER_ERROR.format("trtexec"), ""])
    assert stage == "build" and msg == "trtexec failed: " + LOADER_ERROR.format("trtexec")
    assert tb.error_from_log([]) == ("build", "trtexec failed without output")


def test_trtexec_that_cannot_start_fails_the_probe(agent, tmp_path):
    script = tmp_path / "trtexec"
    script.write_text(f'#!/bin/sh\necho "{LOADER_ERROR.format("$0")}" >&2\nexit 127\n')
    script.chmod(0o755)
    code, obj, _ = run_agent(agent, "probe", "--backend=trtexec", f"--trtexec={script}")
    assert code == 1 and obj["error"]["stage"] == "import"
    assert obj["error"]["message"] == (
        f"trtexec at {script} printed no TensorRT banner (exit 127): {LOADER_ERROR.format(script)}"
    )
    assert obj["error"]["details"]["trtexec"]["version"] is None


# -- python backend helpers that need no TensorRT --------------------------------------------------------


def test_profile_records_have_trtexecs_shape():
    real = json.loads((FIXTURES / "resnet50_placed.explicit.profile.json").read_text())
    recs = profile_records(["a", "b"], {"a": [1.0, 3.0], "b": [2.0, 2.0]}, 2)
    assert set(recs[0]) == set(real[0]) == {"count"}
    assert set(recs[1]) == set(real[1])
    assert recs[1]["averageMs"] == 2.0 and recs[1]["medianMs"] == 3.0
    assert sum(r["percentage"] for r in recs[1:]) == pytest.approx(100.0)


def test_inspect_reply_is_what_the_report_parser_reads(tmp_path):
    """The python backend's inspect output goes through ``load_layers`` exactly like trtexec's.

    The input is real engine-inspector JSON (trtexec --exportLayerInfo writes
    ``getEngineInformation(kJSON)`` verbatim), with 8.6's U+001E separators inside Metadata.
    """
    from edgeq.report.parse import load_layers

    text = (FIXTURES / "resnet50_placed.explicit.layers.json").read_text(encoding="utf-8")
    out = tmp_path / "layers.json"
    reply = layer_info_result(text, str(out), "8.6.2.3")
    assert out.read_text(encoding="utf-8") == text  # byte for byte what the inspector returned
    layers = load_layers(out)
    assert reply == {"layers_json": str(out), "layers": len(layers), "detailed": True, "tensorrt": "8.6.2.3"}
    assert layers.detailed and len(layers) == 153
    assert any("\x1e" in lay.metadata for lay in layers.layers)
    # The Python inspector's str goes to load_layers directly as well.
    assert [lay.name for lay in load_layers(text).layers] == [lay.name for lay in layers.layers]

    # An engine built without ProfilingVerbosity.DETAILED: names only, and the reply says so.
    names = json.dumps({"Layers": [lay.name for lay in layers.layers[:3]], "Bindings": ["input"]})
    reply = layer_info_result(names, str(tmp_path / "names.json"), "8.6.0")
    assert reply["detailed"] is False and not load_layers(tmp_path / "names.json").detailed

    with pytest.raises(AgentError) as e:
        layer_info_result('{"Bindings": []}', str(tmp_path / "bad.json"), "8.6.0")
    assert e.value.stage == "inspect" and "Layers" in e.value.message
    assert not (tmp_path / "bad.json").exists()


def test_profile_from_profiler_callbacks_joins_the_engine_layers(tmp_path):
    """Per-layer times as the IProfiler callback delivers them (engine layer names, ms per run) become
    a profile file that ``load_profile`` reads and that joins every layer of the same engine."""
    from edgeq.report.fusion_build import build_report
    from edgeq.report.parse import load_layers, load_profile

    real = json.loads((FIXTURES / "resnet50_placed.explicit.profile.json").read_text())
    layers = load_layers(FIXTURES / "resnet50_placed.explicit.layers.json")
    order, times = [], {}
    for run in range(3):  # what report_layer_time(layer_name, ms) records, run after run
        for rec in real[1:]:
            if rec["name"] not in times:
                times[rec["name"]] = []
                order.append(rec["name"])
            times[rec["name"]].append(rec["averageMs"] * (1.0 + 0.01 * run))
    out = tmp_path / "profile.json"
    write_atomic(str(out), json.dumps(profile_records(order, times), indent=1).encode())
    prof = load_profile(out)
    assert prof.iterations == 3 and prof.producer == "trtexec"  # trtexec's --exportProfile shape
    assert [t.name for t in prof.layers] == [r["name"] for r in real[1:]]
    first = prof.layers[0]
    assert first.average_ms == pytest.approx(real[1]["averageMs"] * 1.01)
    assert first.median_ms == pytest.approx(real[1]["averageMs"] * 1.01)
    report = build_report(layers, prof)
    assert report.unmatched_profile == ()
    assert sum(t.percentage for t in prof.layers) == pytest.approx(100.0)


def test_python_backend_replies_reach_the_report_through_the_host_parser(tmp_path):
    """A synthetic inspect + profile reply as the python backend prints it (its own result builders,
    the agent's envelope, one JSON line) goes through deploy's ``parse_agent_reply`` and the paths it
    names load with ``load_layers`` / ``load_profile`` into one report."""
    from edgeq.agent.__main__ import envelope
    from edgeq.remote.protocol import parse_agent_reply
    from edgeq.report.fusion_build import build_report
    from edgeq.report.parse import load_layers, load_profile

    text = (FIXTURES / "r50b64_placed.explicit.layers.json").read_text(encoding="utf-8")
    inspect_result = layer_info_result(text, str(tmp_path / "layers.json"), "8.6.2.3")
    names = [lay.name for lay in load_layers(text).layers]
    times = {n: [0.01 * (i + 1), 0.012 * (i + 1)] for i, n in enumerate(names)}
    (tmp_path / "profile.json").write_text(json.dumps(profile_records(names, times)))
    profile_result = {"profile_json": str(tmp_path / "profile.json"), "latency_ms": percentiles([1.0, 2.0])}

    replies = {}
    for command, result in (("inspect", inspect_result), ("profile", profile_result)):
        stdout = json.dumps(envelope(command, result=result), sort_keys=True) + "\n"
        replies[command] = parse_agent_reply(stdout, "", 0, command)["result"]
    layers = load_layers(replies["inspect"]["layers_json"])
    prof = load_profile(replies["profile"]["profile_json"])
    assert replies["inspect"]["layers"] == len(layers) and replies["inspect"]["detailed"]
    assert prof.iterations == 2 and [t.name for t in prof.layers] == names
    report = build_report(layers, prof)
    assert report.unmatched_profile == ()


def test_calibration_cache_is_replayed_with_the_running_tensorrt_header():
    """edgeq writes TRT-8600 headers; on JetPack 6 (TensorRT 8.6.2) the header names 8602, the scales
    are untouched, and the calibrator class follows the algorithm."""
    from edgeq.quant.cache import format_calibration_cache, parse_calibration_cache

    scales = {"input": 0.0078125, "/conv1/Conv_output_0": 0.031, "a: b c": 1.5}
    text = format_calibration_cache(scales).encode()
    cls, data = cache_for_tensorrt(text, "8.6.2.3")
    assert cls == "IInt8EntropyCalibrator2"
    header, got = parse_calibration_cache(data.decode())
    assert header == "TRT-8602-EntropyCalibration2"
    assert got == parse_calibration_cache(text.decode())[1]
    assert data.split(b"\n", 1)[1] == text.split(b"\n", 1)[1]
    cls, data = cache_for_tensorrt(b"TRT-8501-MinMaxCalibration\nx: 3c010204\n", "8.6.0.12")
    assert (cls, data) == ("IInt8MinMaxCalibrator", b"TRT-8600-MinMaxCalibration\nx: 3c010204\n")
    for bad in (b"", b"input: 3c010204\n", b"TRT-8600-LegacyCalibration\n"):
        with pytest.raises(AgentError) as e:
            cache_for_tensorrt(bad, "8.6.0")
        assert e.value.stage == "input"


def test_version_numbers_agree_with_trtexecs_banner():
    for version, number in (("8.6.0", 8600), ("8.6.1.6", 8601), ("8.6.2.3", 8602), ("10.3.0.26", 10300)):
        assert version_number(version) == number
    # the banner of the real fixture runs: [TensorRT v8600]
    banner = (FIXTURES / "resnet50_placed.explicit.run.log").read_text().splitlines()
    assert version_number(tb.version_from_banner(banner)) == 8600


def test_tensor_bytes_pads_vectorized_dimensions():
    assert tensor_bytes([1, 3, 224, 224], 4) == 1 * 3 * 224 * 224 * 4
    assert tensor_bytes([1, 3, 224, 224], 1, vectorized_dim=1, components=32) == 32 * 224 * 224
    assert tensor_bytes([8, 64, 7, 7], 2, vectorized_dim=1, components=8) == 8 * 64 * 49 * 2
    assert tensor_bytes([], 4) == 4  # a scalar
    assert severity_name(1) == "ERROR" and severity_name(0) == "INTERNAL_ERROR"


def test_python_backend_checks_build_options_like_trtexec(agent, tmp_path):
    """Option errors are usage errors before TensorRT is even imported, with trtexec's wording."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    cache = tmp_path / "m.cache"
    cache.write_text("TRT-8600-EntropyCalibration2\n")
    base = ["build", f"--onnx={model}", f"--saveEngine={tmp_path / 'e'}"]
    code, obj, _ = run_agent(agent, *base, f"--calib={cache}")
    assert code == 2 and obj["error"]["stage"] == "usage"
    assert "only means something with --int8" in obj["error"]["message"]
    code, obj, _ = run_agent(agent, *base, "--int8", "--allowGPUFallback")
    assert code == 2 and "needs a DLA core" in obj["error"]["message"]
    dla = ["--useDLACore=0", "--allowGPUFallback"]
    code, obj, _ = run_agent(agent, *base, "--int8", f"--calib={cache}", *dla)
    assert code == 1 and obj["error"]["stage"] == "import"  # valid options: on to TensorRT, absent here


def test_output_directories_are_created_or_reported(agent, tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    cache = tmp_path / "timing-cache" / "timing-8.6.2-sm8.7.cache"
    engine = tmp_path / "run" / "e.plan"
    args = [f"--onnx={model}", f"--saveEngine={engine}", f"--timingCacheFile={cache}"]
    code, obj, _ = run_agent(agent, "build", *args)
    assert code == 1 and obj["error"]["stage"] == "import"  # no TensorRT here, but the directories exist
    assert cache.parent.is_dir() and (tmp_path / "run").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, obj, _ = run_agent(agent, "build", f"--onnx={model}", f"--saveEngine={blocker / 'e.plan'}")
    assert code == 1 and obj["error"]["stage"] == "output" and "saveEngine" in obj["error"]["message"]


_STUCK_AGENT = """
import signal, sys, time
from edgeq.agent import __main__ as agent

def stuck(args, log):
    # Stands in for TensorRT inside a C++ call: the main thread neither returns nor runs Python
    # signal handlers (SIGTERM is blocked for it, so only the agent's other threads can see it).
    log.write("[INFO] building")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    sys.stderr.write("stuck\\n")
    sys.stderr.flush()
    time.sleep(60)

agent.run_command = stuck
sys.exit(agent.main(sys.argv[1:]))
"""


_BUSY_AGENT = """
import sys, time
from edgeq.agent import __main__ as agent

def busy(args, log):
    # A build step in Python (parsing, calibration): SIGTERM reaches the main thread's handler and the
    # watchdog's wakeup fd at once.
    log.write("[INFO] building")
    sys.stderr.write("stuck\\n")
    sys.stderr.flush()
    while True:
        time.sleep(0.001)

agent.run_command = busy
sys.exit(agent.main(sys.argv[1:]))
"""


def _stuck_agent(
    tmp_path: Path, *args: str, python: str = sys.executable, script: str = _STUCK_AGENT
) -> subprocess.Popen:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    argv = [python, "-c", script, "build", f"--onnx={model}", f"--saveEngine={tmp_path / 'e'}"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYENV_VERSION")}
    env["PYTHONPATH"] = str(ROOT)  # the agent sources only (edgeq/__init__ and remote/__init__ are inert)
    return subprocess.Popen(
        [*argv, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_python_backend_timeout_replies_while_tensorrt_is_stuck(tmp_path):
    started = time.monotonic()
    proc = _stuck_agent(tmp_path, "--timeout=1")
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - started < 20
    assert proc.returncode == 1, err
    lines = out.splitlines()
    assert len(lines) == 1
    obj = json.loads(lines[0])
    assert obj["ok"] is False and obj["command"] == "build"
    assert obj["error"]["stage"] == "build" and obj["error"]["message"] == "build timed out after 1 s"
    assert obj["error"]["log"] == ["[INFO] building"]


def test_python_backend_sigterm_replies_while_tensorrt_is_stuck(tmp_path):
    _sigterm_stuck_agent(tmp_path, sys.executable)


def test_sigterm_while_python_runs_gets_one_reply_naming_the_signal(tmp_path):
    """Main thread and watchdog both see the signal: one JSON reply, the same one whoever answers."""
    for _ in range(3):
        _sigterm_stuck_agent(tmp_path, sys.executable, script=_BUSY_AGENT)


def test_watchdog_works_on_python_38(tmp_path):
    """JetPack 5 runs Python 3.8: the wakeup-fd watchdog must work there too (JetPack 6: 3.10)."""
    py38 = _python38()
    if py38 is None:
        pytest.skip("no Python 3.8 interpreter on this machine")
    proc = _stuck_agent(tmp_path, "--timeout=1", python=py38)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert json.loads(out)["error"]["message"] == "build timed out after 1 s"
    _sigterm_stuck_agent(tmp_path, py38)


def _sigterm_stuck_agent(tmp_path: Path, python: str, script: str = _STUCK_AGENT) -> None:
    proc = _stuck_agent(tmp_path, python=python, script=script)
    deadline = time.monotonic() + 20
    lines = []
    while time.monotonic() < deadline and (not lines or lines[-1] != "stuck"):
        lines.append(proc.stderr.readline().strip())
    assert lines[-2:] == ["[INFO] building", "stuck"]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 130
    obj = json.loads(out)
    assert obj["error"]["stage"] == "interrupted" and f"signal {signal.SIGTERM:d}" in obj["error"]["message"]


def test_cuda_buffers_fail_structured_without_a_gpu():
    """``profile``'s CUDA setup on this GPU-less machine: cuda-python and pycuda are absent, so it
    falls through to libcudart via ctypes; the CUDA toolkit here has one but there is no driver, and
    the real cudaStreamCreate error comes back as data (without libcudart: an import error)."""
    import ctypes.util

    with pytest.raises(AgentError) as e:
        open_cuda()
    if ctypes.util.find_library("cudart"):
        assert e.value.stage == "cuda"
        assert e.value.message.startswith("cudaStreamCreate failed: cudaError")
    else:
        assert e.value.stage == "import" and len(e.value.details["errors"]) == 3


def test_log_errors_since_a_mark_skip_recovered_errors():
    """8.6.1 logs ERRORs for a timing cache it cannot read and builds anyway (NVIDIA/TensorRT#3566):
    a later failure must be reported with its own error line, also after the buffer wrapped."""
    from edgeq.agent.common import LogBuffer

    log = LogBuffer(io.StringIO(), keep=5)
    log.write("[ERROR] 1: [stdArchiveReader.cpp] Error Code 1: Serialization (Magic tag does not match)")
    log.write("[ERROR] 4: The timing cache will not be used!")
    mark = log.mark()
    for i in range(6):
        log.write(f"[INFO] tactic {i}")
    failure = "[ERROR] 10: Could not find any implementation for node X."
    log.write(failure)
    log.write("[E] trtexec style")
    assert log.errors(mark) == [failure, "[E] trtexec style"]
    assert first_error(log, "none", mark) == "10: Could not find any implementation for node X."
    assert first_error(log, "none", log.mark()) == "none"
    assert len(log.tail()) == 5 and log.written == 10


def test_percentiles_nearest_rank():
    p = percentiles([float(x) for x in range(1, 101)])
    assert (p["min"], p["max"], p["median"], p["p90"], p["p99"]) == (1.0, 100.0, 50.5, 90.0, 99.0)
    assert percentiles([]) == {}


def test_sigterm_stops_the_running_tool(agent, tmp_path):
    """The host stopping the agent (transport TERMs its process group) takes trtexec down with it."""
    pidfile = tmp_path / "tool.pid"
    script = tmp_path / "trtexec"
    script.write_text(f"#!/bin/sh\necho $$ > {shlex.quote(str(pidfile))}\necho '[I] build'\nexec sleep 60\n")
    script.chmod(0o755)
    engine = tmp_path / "m.onnx"
    engine.write_bytes(b"x")
    proc = subprocess.Popen(
        [sys.executable, str(agent.path), "build", "--backend=trtexec", f"--trtexec={script}",
         f"--onnx={engine}", f"--saveEngine={tmp_path / 'e.plan'}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    tool_pid = int(pidfile.read_text())
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 130
    obj = json.loads(out)
    assert obj["ok"] is False and obj["error"]["stage"] == "interrupted"
    while time.monotonic() < deadline:
        try:
            os.kill(tool_pid, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{tool_pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            break  # killed, waiting to be reaped by init
        time.sleep(0.05)
    else:
        pytest.fail("the tool outlived the agent")


def _python38() -> str | None:
    """A real Python 3.8 (JetPack 5's Python) if this machine has one; the agent must run on it."""
    import glob

    candidates = [
        shutil.which("python3.8"),
        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8"))),
    ]
    for c in filter(None, candidates):
        try:
            r = subprocess.run(
                [c, "-c", "import sys; print(sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0 and r.stdout.strip() == "(3, 8)":
            return c
    return None


def test_agent_runs_on_python_38(agent, tmp_path):
    py38 = _python38()
    if py38 is None:
        pytest.skip("no Python 3.8 interpreter on this machine (the grammar check above still ran)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYENV_VERSION")}
    proc = subprocess.run(
        [py38, str(agent.path), "probe"], capture_output=True, text=True, timeout=60, env=env
    )
    obj = json.loads(proc.stdout)
    assert proc.returncode == 1 and obj["error"]["stage"] == "import"
    assert obj["error"]["details"]["python"]["version"].startswith("3.8.")
    trtexec = replay_trtexec(tmp_path, build=Recorded(FIXTURES / "yolo_ortfb.explicit.build.log", 1))
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    args = [
        "build",
        "--backend=trtexec",
        f"--trtexec={trtexec}",
        f"--onnx={model}",
        f"--saveEngine={tmp_path / 'e'}",
    ]
    proc = subprocess.run([py38, str(agent.path), *args], capture_output=True, text=True, timeout=60, env=env)
    obj = json.loads(proc.stdout)
    assert proc.returncode == 1 and obj["error"]["message"].startswith(
        "Error[10]: Could not find any implementation"
    )




def _deploy_builds_agent(dest: str, start: Any, seen: Any) -> None:
    from edgeq.remote.zipapp import build_agent

    start.wait()
    st = build_agent(Path(dest)).path.stat()  # from here on, this deploy uploads the file
    seen.put((st.st_ino, st.st_mtime_ns))


def test_building_the_agent_again_leaves_the_file_alone_while_another_deploy_uploads_it(tmp_path) -> None:
    """Deploys at once (processes) all build the agent: none may rewrite the file another is already
    uploading (the upload checks size and mtime, and failed with 'changed during the upload')."""
    import multiprocessing

    from edgeq.remote.zipapp import build_agent

    ctx = multiprocessing.get_context("fork")
    for attempt in range(4):
        dest = tmp_path / str(attempt)
        dest.mkdir()
        start, seen = ctx.Barrier(6), ctx.Queue()
        procs = [ctx.Process(target=_deploy_builds_agent, args=(str(dest), start, seen)) for _ in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        final = next(dest.iterdir()).stat()
        assert {seen.get(timeout=10) for _ in procs} == {(final.st_ino, final.st_mtime_ns)}
        assert len(list(dest.iterdir())) == 1  # no temporary files left
    path = build_agent(tmp_path / "0").path
    path.write_bytes(b"damaged")  # a damaged copy is replaced whole
    assert build_agent(tmp_path / "0").path.read_bytes() != b"damaged"


def test_a_timing_cache_tensorrt_refuses_twice_leaves_the_build_without_one(tmp_path):
    """A YOLOX mirror on an H100 (tests/fixtures/trt86-h100-more/dddet.mirror.agent-build.json): the cache
    its implicit build had written was refused ("Myelin error from unknown graph"), then the empty one
    too, and the agent failed the build there. trtexec builds on in that state; so does the agent now,
    without a cache, and it saves none."""
    import ast
    from pathlib import Path

    from edgeq.agent.common import LogBuffer
    from edgeq.agent.trt_build import _timing_cache

    reply = json.loads((Path(__file__).parent / "fixtures" / "trt86-h100-more" /
                        "dddet.mirror.agent-build.json").read_text())
    error = ast.literal_eval(reply["error"]) if isinstance(reply["error"], str) else reply["error"]
    refusal = [line for line in error["log"] if line.startswith("[ERROR]")][:2]
    assert "Myelin error from unknown graph" in refusal[0] and "will not be used" in refusal[1]

    class Config:  # TensorRT's side as recorded: every set_timing_cache logs the refusal, returns False
        def __init__(self, log):
            self.log, self.installed = log, []

        def create_timing_cache(self, blob):
            return ("cache", blob)

        def set_timing_cache(self, cache, ignore_mismatch):
            for line in refusal:
                self.log.write(line)
            return False

    (tmp_path / "t.cache").write_bytes(b"written by the implicit build")
    log = LogBuffer(stream=io.StringIO())
    cache, info = _timing_cache(None, Config(log), str(tmp_path / "t.cache"), log)
    assert cache is None and info["disabled"] and not info["reused"]
    assert any("building without one" in line for line in log.tail())
    assert (tmp_path / "t.cache").read_bytes() == b"written by the implicit build"


# -- an engine with dynamic inputs is inspected at its shapes ---------------------------------------------


def test_a_range_profile_engine_is_inspected_at_the_shapes_it_is_timed_at():
    """TensorRT 8.6 on an H200 (trt86-h200-more/rec.rules.layers.json.gz, PP-OCRv4's recogniser built over a
    range of widths): the agent's inspector had a context but no input shapes, and every tensor's format
    read "N/A due to dynamic shapes", so edgeq could read no precision and the int8 gate would fail every
    layer. Both backends now inspect at the ``--shapes`` the host times the engine at: the python
    backend sets them on the context and has it infer every tensor's shape before reading (setting them
    alone still printed "N/A" on an H100, trt86-h100-int8-writes; with ``infer_shapes`` the formats
    printed, trt86-h100-paired/dyn.*), trtexec runs one inference at them instead of ``--skipInference``
    (measured on an H100: PP-OCRv4's recogniser's formats all printed, trt86-h100-paired/rec.trtexec.*);
    a static engine is inspected as before."""
    import gzip
    from types import SimpleNamespace

    from edgeq.agent.trt_engine import engine_information
    from edgeq.report.parse import load_layers

    real = ROOT / "tests" / "fixtures" / "trt86-h200-more" / "rec.rules.layers.json.gz"
    layers = json.loads(gzip.decompress(real.read_bytes()), strict=False)["Layers"]
    formats = {t["Format/Datatype"] for lay in layers for t in (*lay["Inputs"], *lay["Outputs"])}
    assert formats == {"N/A due to dynamic shapes"}
    parsed = load_layers(gzip.decompress(real.read_bytes()).decode())
    assert parsed.layers and all(t.precision is None for lay in parsed.layers for t in lay.inputs)

    argv = tb.inspect_argv("trtexec", "e.plan", "l.json", shapes="x:1x3x48x320")
    assert "--shapes=x:1x3x48x320" in argv and "--skipInference" not in argv and "--iterations=1" in argv
    assert "--skipInference" in tb.inspect_argv("trtexec", "e.plan", "l.json")

    # What TensorRT 8.6.0 printed on an H100 for a two-convolution engine over a range of widths
    # (trt86-h100-paired/dyn.*): "N/A" with the shapes set and read back, formats once the context
    # inferred every shape (IExecutionContext::inferShapes). The stand-in inspector answers with those.
    lease = ROOT / "tests" / "fixtures" / "trt86-h100-paired"
    na_json = (lease / "dyn.python.shapes-set.layers.json").read_text()
    inferred_json = (lease / "dyn.python.inferred.layers.json").read_text()
    steps = json.loads((lease / "dyn.python.steps.json").read_text())
    assert steps["c_shape_set"] == steps["d_shapes_read"] == [4, 4]
    assert steps["e_infer_shapes"] == [[], [0, 4]]
    order: list[str] = []

    class Context:
        unset: tuple[str, ...] = ()

        def set_input_shape(self, name, dims):
            order.append(f"set {name} {tuple(dims)}")
            return True

        def infer_shapes(self):
            order.append("infer")
            return list(self.unset)

    class Inspector:
        execution_context = None

        def get_engine_information(self, fmt):
            order.append("read")
            return inferred_json if order[-3:-1] == ["set x (1, 3, 32, 48)", "infer"] else na_json

    engine = SimpleNamespace(
        create_engine_inspector=Inspector, create_execution_context=Context, num_io_tensors=2,
        get_tensor_name=lambda i: "xy"[i], get_tensor_mode=lambda n: "INPUT" if n == "x" else "OUTPUT",
        get_tensor_shape=lambda n: [1, 3, 32, -1])  # fmt: skip
    trt = SimpleNamespace(TensorIOMode=SimpleNamespace(INPUT="INPUT"),
                          LayerInformationFormat=SimpleNamespace(JSON="JSON"))
    log = SimpleNamespace(mark=lambda: 0)
    text = engine_information(trt, engine, log, "x:1x3x32x48")
    assert order == ["set x (1, 3, 32, 48)", "infer", "read"]
    got = load_layers(text)
    assert [t.precision for lay in got.layers for t in (*lay.inputs, *lay.outputs)] == ["FP32"] * 4
    order.clear()
    assert "N/A" in engine_information(trt, engine, log) and order == ["read"]
    Context.unset = ("x",)  # a dynamic input left without a shape: one clear error, not an "N/A" JSON
    with pytest.raises(AgentError, match="input shapes not all given: x"):
        engine_information(trt, engine, log, "x:1x3x32x48")
