"""The embedded demo: the whole pipeline on a model built in code, as far as this machine allows.

It exists so a newcomer sees every stage work on their own machine and learns exactly where the
machine stops them (no GPU, no TensorRT, no target), rather than reading about it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from edgeq.findings import Level, ProgressFn, no_progress
from edgeq.text import plural

if TYPE_CHECKING:
    import onnx

DONE, STOPPED, SKIPPED, FAILED = "done", "stopped", "skipped", "failed"
# edgeq/data/engines: gzipped copies of tests/fixtures/trt86-h200 engines (onnxruntime's placement and a
# hand-pruned one) and of trt86-h100-placed (edgeq's placement beside implicit), so an install has them.
RECORDED_ENGINES = ("resnet50.implicit", "resnet50_ortfb.explicit", "resnet50_placed.explicit",
                    "r50b8_edgeq.implicit", "r50b8_edgeq.explicit")


def recorded(stem: str, kind: str) -> str:
    """A recorded engine's ``layers`` or ``profile`` JSON text, from the package data."""
    import gzip
    from importlib.resources import files

    data = files("edgeq").joinpath(f"data/engines/{stem}.{kind}.json.gz").read_bytes()
    return gzip.decompress(data).decode("utf-8")


@dataclass
class DemoStep:
    name: str
    status: str
    summary: list[str] = field(default_factory=list)
    artifacts: list[Path] = field(default_factory=list)


@dataclass
class DemoResult:
    workdir: Path
    steps: list[DemoStep]

    @property
    def stopped_at(self) -> DemoStep | None:
        return next((s for s in self.steps if s.status == STOPPED), None)

    def __bool__(self) -> bool:
        return all(s.status != FAILED for s in self.steps)


def _lint_counts(model: onnx.ModelProto) -> tuple[int, int, list[str]]:
    from edgeq.graph.rules import lint_model

    findings = lint_model(model)
    errors = sum(f.level is Level.ERROR for f in findings)
    warnings = sum(f.level is Level.WARNING for f in findings)
    return errors, warnings, sorted({f.rule for f in findings})


def _counts(errors: int, warnings: int) -> str:
    return f"{plural(errors, 'error')}, {plural(warnings, 'warning')}"


def run_demo(workdir: str | Path = "edgeq-demo", *, samples: int = 16, progress: ProgressFn = no_progress,
             on_step: Callable[[DemoStep], None] | None = None) -> DemoResult:
    """Build test models, then clean -> lint -> quantize -> (agent probe) -> report, stopping honestly."""
    from edgeq import zoo
    from edgeq.fs import ensure_dir
    from edgeq.graph.io import load_model, save_model

    wd = ensure_dir(workdir)  # a file in the way is a one-line error, before any work
    steps: list[DemoStep] = []

    def record(step: DemoStep) -> DemoStep:
        steps.append(step)
        if on_step:
            on_step(step)
        return step

    # 1. Models, built in code: FP32 and the two export patterns TensorRT 8.6 cannot parse.
    progress("building test models", 0, 3)
    fp32 = zoo.resnet_like(size=64, width=16, layers=(1, 1))
    torch_qdq = zoo.qdq_torch_eager(fp32)
    ort_qdq = zoo.qdq_ort(fp32, quantize_bias=True)
    paths = {
        "fp32": save_model(fp32, wd / "resnet_like.onnx"),
        "torch": save_model(torch_qdq, wd / "resnet_like_torch_qdq.onnx"),
        "ort": save_model(ort_qdq, wd / "resnet_like_ort_qdq.onnx"),
    }
    progress("building test models", 3, 3)
    record(DemoStep("models", DONE, [
        "ResNet-like (Conv-ReLU-MaxPool stem, residual Adds), 64x64, built with onnx.helper",
        "its PyTorch-eager-style Q/DQ export (uint8 Cast inside Q/DQ, int32 bias) and onnxruntime QDQ export",
    ], list(paths.values())))

    # 2. Lint the exports as they come: what TensorRT 8.6 would refuse or not fuse.
    lines = []
    for key in ("torch", "ort"):
        e, w, rules = _lint_counts(load_model(paths[key]))
        lines.append(f"{paths[key].name}: {_counts(e, w)} ({', '.join(rules)})")
    record(DemoStep("lint (exports as written)", DONE, lines))

    # 3. Clean the PyTorch-eager export and verify it numerically against the input.
    from edgeq.pipeline import stages

    cleaned, clean_path = stages.clean(paths["torch"], wd, verify=True, progress=progress)
    e, w, rules = _lint_counts(cleaned.model)
    by_pass: dict[str, int] = {}
    for c in cleaned.changes:
        by_pass[c.pass_name] = by_pass.get(c.pass_name, 0) + 1
    record(DemoStep("clean", DONE if cleaned.verification is None or cleaned.verification else FAILED, [
        "changes: " + ", ".join(f"{k} x{v}" for k, v in by_pass.items()),
        f"onnxruntime verification: {cleaned.verification}",
        f"lint after clean: {_counts(e, w)}" + (f" ({', '.join(rules)})" if rules else ""),
        "clean makes the export parse; where its Q/DQ sit (fusion) is what `edgeq quantize` decides",
    ], [clean_path]))

    # 4. Quantize the FP32 model with TensorRT-aware placement, and with onnxruntime-style placement.
    qlines: list[str] = []
    artifacts: list[Path] = []
    from edgeq.graph.rules import FUSION_RULE_IDS as fusion_rule_ids
    from edgeq.quant.quantize import QuantizeOptions

    ok = True
    for placement in ("trt", "all"):
        options = QuantizeOptions(synthetic=samples, placement=placement)
        _, out, cache, res = stages.quantize(fp32, "resnet_like", wd, options, progress,
                                               suffix=f"int8.{placement}")
        artifacts += [out, cache]
        e, w, rules = _lint_counts(res.model)
        fusion = [r for r in rules if r in fusion_rule_ids]
        qlines.append(
            f"--placement {placement}: {res.summary_line()}; lint: {_counts(e, w)}"
            + (f" ({', '.join(fusion)})" if fusion else "")
        )
        if placement == "trt":
            # The implicit path builds from the cleaned FP32 model: its tensor names are the cache's.
            artifacts.append(save_model(res.reference, wd / "resnet_like.clean.onnx"))
            ok = ok and not fusion and e == 0
    record(DemoStep("quantize", DONE if ok else FAILED, qlines, artifacts))

    # 5. The target side: the agent that would build the engine, run here where there is no TensorRT.
    from edgeq.remote.zipapp import build_agent

    pyz = build_agent(wd / "agent")
    proc = subprocess.run(
        [sys.executable, str(pyz.path), "probe"], capture_output=True, text=True, timeout=120
    )
    try:
        probe = json.loads(proc.stdout)
    except json.JSONDecodeError:
        probe = {"ok": False, "error": {"message": proc.stderr.strip()[-200:] or "no output"}}
    if probe.get("ok") and probe.get("result", {}).get("tensorrt"):
        record(DemoStep("engine build", STOPPED, [
            f"TensorRT {probe['result']['tensorrt']} is present here, but the demo does not build engines: "
            "run `edgeq deploy MODEL --target NAME` against a target file",
        ], [pyz.path]))
    else:
        msg = (probe.get("error") or {}).get("message") or "TensorRT not available"
        record(DemoStep("engine build", STOPPED, [
            f"agent probe on this machine: {msg}",
            "an engine needs a GPU with TensorRT 8.6: `edgeq deploy "
            f"{artifacts[0].name} --target orin-agx` builds, profiles and gates it on a target over SSH",
        ], [pyz.path]))

    # 6. What report and gate say of real TensorRT 8.6 engines (recorded on an H200, shipped in the package).
    from edgeq.report.policy import POLICIES

    rlines = []
    for stem in RECORDED_ENGINES:
        rep, gate = stages.report_and_gate(recorded(stem, "layers"), recorded(stem, "profile"), None,
                                             POLICIES["int8"])  # fmt: skip
        rlines.append(f"{stem}: {rep.summary_line()}; {gate.summary_line()}")
    record(DemoStep("report (recorded engines)", DONE, rlines))
    return DemoResult(wd, steps)
