"""hardswish-unfused, held against the real MobileNetV3 engines of the corpus (TensorRT 8.6.0, an H100):
which HardSwish inputs the rules quantize is which ones the implicit engine ran INT8 into a PointWise layer
of its own."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import ROOT

from edgeq import zoo
from edgeq.graph.io import graph_from_model
from edgeq.graph.rules import lint_model
from edgeq.quant.mirror import load_engine, plan_from_engine
from edgeq.quant.placement import plan_placement
from edgeq.quant.quantize import prepare_model

CORPUS = ROOT / "tests" / "fixtures" / "trt86-h100-corpus"


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "mobilenet_v3_large"])
def test_the_rules_quantize_the_hardswish_inputs_the_engine_ran_int8(name: str) -> None:
    graph = graph_from_model(prepare_model(zoo.skeleton(CORPUS / f"{name}.skel.onnx.gz"))[0])
    hardswish = {n.name: n.inputs[0].name for n in graph.nodes if n.op == "HardSwish"}
    rules = {s.tensor: s for s in plan_placement(graph).sites}
    engine_file = CORPUS / f"{name}.implicit.layers.json.gz"
    mirror = {s.tensor for s in plan_from_engine(graph, load_engine(engine_file))[0].sites}
    ours = {h for h, t in hardswish.items() if t in rules}
    engine = {h for h, t in hardswish.items() if t in mirror}
    assert ours == engine and len(ours) in (9, 10)  # the depthwise convolutions and the stem
    assert {rules[hardswish[h]].rule for h in ours} == {"hardswish-unfused"}
    raw = json.loads(gzip.decompress(engine_file.read_bytes()), strict=False)["Layers"]
    fused = {h for h in hardswish for lay in raw if "Conv" in lay["Name"] and h in lay["Name"]}
    assert fused and not (fused & ours)  # the dense convolutions fuse theirs, and get no Q/DQ there


def test_quantize_writes_the_hardswish_qdq_and_lint_leaves_it_alone(tmp_path, cli) -> None:
    """conv-epilogue's lint asks for no Q/DQ between a convolution and its activation, except where a
    later entry wants it INT8: this one."""
    src = tmp_path / "mnv3.onnx"
    import onnx

    onnx.save(zoo.skeleton(CORPUS / "mobilenet_v3_small.skel.onnx.gz"), src)
    out = tmp_path / "mnv3.int8.onnx"
    code, _, _ = cli("quantize", src, "--synthetic", "2", "--calibrator", "max", "-o", out)
    assert code == 0
    model = onnx.load(str(out))
    assert not [f for f in lint_model(model) if f.rule == "conv-epilogue"]
    summary = json.loads(out.with_suffix(".json").read_text())
    assert sum(a["rule"] == "hardswish-unfused" for a in summary["activations"]) == 9
