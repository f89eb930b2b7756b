"""The README's first command: `edgeq demo` runs every stage this machine allows and says where it stops."""

from __future__ import annotations

import importlib.util

from edgeq.orchestration.demo import DONE, STOPPED, run_demo

HAS_TRT = importlib.util.find_spec("tensorrt") is not None


def test_demo_runs_each_stage_and_stops_at_the_engine_build(tmp_path, cli):
    code, out, err = cli("demo", "--workdir", tmp_path / "d", "--samples", "8")
    assert code == 0, err
    assert "Traceback" not in out + err
    for name in ("models", "lint (exports as written)", "clean", "quantize", "engine build"):
        assert name in out
    # Where it stops is said plainly, with the reason.
    assert "The demo stopped at 'engine build'" in out
    if not HAS_TRT:
        assert "TensorRT not available" in out
    written = {p.name for p in (tmp_path / "d").iterdir()}
    assert {"resnet_like.onnx", "resnet_like_torch_qdq.clean.onnx", "resnet_like.int8.trt.onnx",
            "resnet_like.int8.trt.cache", "resnet_like.clean.onnx"} <= written


def test_demo_steps_carry_the_figures_that_matter(tmp_path):
    result = run_demo(tmp_path, samples=8)
    steps = {s.name: s for s in result.steps}
    assert steps["clean"].status == DONE
    assert any("PASSED" in line for line in steps["clean"].summary)
    q = steps["quantize"]
    assert q.status == DONE
    trt_line = next(line for line in q.summary if line.startswith("--placement trt"))
    all_line = next(line for line in q.summary if line.startswith("--placement all"))
    # TensorRT-aware placement leaves no fusion breaker; onnxruntime-style placement does.
    from edgeq.graph.rules import FUSION_RULE_IDS

    assert not any(r in trt_line.split("; lint: ")[1] for r in FUSION_RULE_IDS)
    assert "residual-add" in all_line
    assert steps["engine build"].status == STOPPED
    assert result.stopped_at is steps["engine build"]
    rep = steps["report (recorded engines)"]
    assert any(line.startswith("resnet50.implicit") and "FAILED" in line for line in rep.summary)
    assert bool(result)


def test_demo_workdir_that_is_a_file_is_one_line_exit_2(tmp_path, cli):
    # QA: `edgeq demo -o some-file` was a FileExistsError traceback.
    f = tmp_path / "taken"
    f.write_text("mine")
    code, out, err = cli("demo", "-o", f)
    assert code == 2 and "not a directory" in err and "Traceback" not in out + err
    assert f.read_text() == "mine"


def test_ci_runs_the_readmes_test_command_and_the_readme_starts_with_the_demo():
    # Acceptance (issue 2): the README's two set-up commands, and .ci/run calling the README's test command.
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```bash\n")[1:]]
    assert blocks[0] == "pip install -c constraints.txt -e . && edgeq demo"
    assert blocks[1] == "bash tests/run.sh"
    ci = [ln for ln in (root / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith("#")]
    assert ci[-1] == "exec bash tests/run.sh"
