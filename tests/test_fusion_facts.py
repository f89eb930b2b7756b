"""The fusion facts against real TensorRT 8.6.0 engines: lint predicts what the engines ran wider than INT8.

``tests/fixtures/trt86-h200-edgeq`` holds engines built from edgeq's placement before the three measured
rules (concat-conv, silu-residual, pool-tail). That placement is today's plan without
the sites those rules add, so it is rebuilt here in code from the same zoo models (node names do not
depend on size or width), and lint must name every ONNX node TensorRT ran in FP16/FP32; on today's
placement it must name nothing.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from edgeq import zoo
from edgeq.graph.io import graph_from_model, model_from_graph
from edgeq.graph.rules import RULES_BY_ID, lint_model
from edgeq.quant.placement import plan_placement
from edgeq.quant.qdq import insert_qdq
from edgeq.quant.quantize import prepare_model
from edgeq.quant.rules import RULES as PLACEMENT_RULES
from edgeq.report.fusion_build import build_report
from edgeq.report.parse import load_layers

FIXTURES = Path(__file__).parent / "fixtures"
MEASURED_RULES = {"concat-conv", "silu-residual", "pool-tail"}


def _qdq_model(model, *, without: frozenset[str] = frozenset()):
    """edgeq's trt placement of ``model`` (scales all 1: lint reads structure), minus sites of ``without``."""
    reference, _, _ = prepare_model(model)
    graph = graph_from_model(reference)
    plan = plan_placement(graph)
    plan = dataclasses.replace(plan, sites=tuple(s for s in plan.sites if s.rule not in without))
    insert_qdq(graph, plan, {s.tensor: 1.0 for s in plan.sites})
    return model_from_graph(graph, like=reference)


CASES = {
    "yolo_edgeq": (lambda: zoo.yolo_like(), {"concat-conv", "silu-residual"}, 17),
    "r50b64_edgeq": (lambda: zoo.resnet50(size=64, width=8), {"pool-tail"}, 1),
    "r50b8_edgeq": (lambda: zoo.resnet50(size=64, width=8), {"pool-tail"}, 1),
}


@pytest.mark.parametrize("engine", list(CASES))
def test_lint_names_every_node_the_engine_ran_wider_than_int8(engine):
    build, rules, count = CASES[engine]
    old = _qdq_model(build(), without=frozenset(MEASURED_RULES))
    report = build_report(load_layers(FIXTURES / "trt86-h200-edgeq" / f"{engine}.explicit.layers.json"),
                          onnx_model=old)
    assert report.onnx is not None and not report.onnx.unknown  # the rebuilt model is the engine's model
    by_precision = report.onnx.by_precision()
    wider = set(by_precision.get("FP16", [])) | set(by_precision.get("FP32", []))
    assert wider  # the engine did fall back: a test that cannot fail would prove nothing
    findings = lint_model(old)
    assert {f.rule for f in findings} == rules
    assert len(findings) == count
    named = {n for f in findings for n in f.nodes}
    assert wider <= named, sorted(wider - named)
    # lint names the fallback regions, not the model: most INT8 nodes are in no finding
    int8 = set(by_precision.get("INT8", []))
    assert len(named & int8) < len(int8) / 2


@pytest.mark.parametrize("build", [lambda: zoo.yolo_like(), lambda: zoo.yolo_like(split="slice"),
                                   lambda: zoo.resnet50(size=64, width=8), lambda: zoo.unet_like(),
                                   lambda: zoo.resnet_like(stem_act="relu6", tail="mean")])
def test_lint_is_silent_on_the_measured_placement(build):
    assert lint_model(_qdq_model(build())) == []


def test_yolo_fix2_is_what_edgeq_now_places():
    """yolo_fix2 (49/49 INT8, 1.00x implicit) = edgeq's old model + a Q/DQ before every Concat-reading
    convolution + one on each SiLU-residual convolution output: exactly the sites the new rules add."""
    reference, _, _ = prepare_model(zoo.yolo_like())
    plan = plan_placement(graph_from_model(reference))
    added = [s for s in plan.sites if s.rule in MEASURED_RULES]
    concat_readers = {c for s in added if s.rule == "concat-conv" for c in s.consumers}
    silu_inputs = [s for s in added if s.rule == "silu-residual"]
    assert len(concat_readers) == 9 and all(c.endswith("cv2.0/Conv") or "/cv1/" in c for c in concat_readers)
    assert len(silu_inputs) == 8 and all(s.tensor.endswith("/b/b.0/Conv_output_0") for s in silu_inputs)
    layers = load_layers(FIXTURES / "trt86-h200-edgeq" / "yolo_fix2.explicit.layers.json")
    names = " ".join(lay.name for lay in layers.layers)
    for c in concat_readers:  # each such convolution is an INT8 CaskConvolution with its SiLU in fix2
        assert c in names


def test_every_pattern_rests_on_an_engine_file_or_says_unverified():
    """Each registry entry cites engine files that exist (``.json.gz`` for the zoo's), or says unverified;
    lint, placement and the rules doc read that one entry, so they share one description per fact."""
    from edgeq.graph import registry

    fixture_files = {p.name for p in FIXTURES.rglob("*") if p.is_file()}
    fixture_files |= {n[: -len(".gz")] for n in fixture_files if n.endswith(".gz")}
    for p in registry.REGISTRY:
        if p.kind != "fusion" or p.id == "weighted-inputs":
            continue
        cited = set(re.findall(r"[\w.-]+\.(?:layers\.json|build\.log|run\.log)", p.evidence))
        assert cited, p.id
        assert cited <= fixture_files, (p.id, cited - fixture_files)
        if "expected" in p.fact or not p.verified:
            assert "unverified" in p.evidence or "unverified" in p.fact, p.id
        if p.lint is not None:
            assert RULES_BY_ID[p.id].source == p.evidence
        assert PLACEMENT_RULES[p.id].source == p.evidence
    for rule_id in (*MEASURED_RULES, "se-gate", "channel-shuffle"):  # each names the engine pair it rests on
        assert any(f in PLACEMENT_RULES[rule_id].source for f in ("yolo_", "r50b64_", "effb0", "shufflenet"))
