"""The pattern registry: one entry per TensorRT 8.6 fact, read by placement, lint, the report, compare
and tune; the SE-gate and channel-shuffle entries on the real torchvision graphs and engines behind them
(tests/fixtures/trt86-h100-zoo)."""

from __future__ import annotations

import gzip

import pytest
from conftest import ROOT

from edgeq import zoo
from edgeq.graph import registry
from edgeq.graph.facts import EngineSignature, Hit, LintSpec, Match, Pattern, Want
from edgeq.graph.io import graph_from_model, model_from_graph
from edgeq.graph.rules import lint_model
from edgeq.quant.placement import plan_placement
from edgeq.quant.quantize import prepare_model

ZOO = ROOT / "tests" / "fixtures" / "trt86-h100-zoo"
NEW = {"pointwise-region", "se-gate", "channel-shuffle"}


def skeleton(name: str):
    return zoo.skeleton(ZOO / "skeletons" / f"{name}.skel.onnx")


def engine(stem: str):
    from edgeq.report.fusion_build import build_report
    from edgeq.report.parse import load_layers

    return build_report(load_layers(gzip.decompress((ZOO / f"{stem}.layers.json.gz").read_bytes())))


def qdq(model, monkeypatch=None):
    """The Q/DQ model placement writes (every scale 0.05: positions are what lint reads)."""
    from edgeq.quant.qdq import insert_qdq

    prepared, _, _ = prepare_model(model)
    graph = graph_from_model(prepared)
    plan = plan_placement(graph)
    insert_qdq(graph, plan, {t: 1.0 for t in plan.activations})
    return model_from_graph(graph, like=prepared), plan


@pytest.fixture
def as_before_the_zoo_patterns(monkeypatch):
    """Placement as edgeq had it when the zoo engines were built (ca30c9b): the three patterns off."""
    from edgeq.graph.trt86 import conv

    monkeypatch.setattr(registry, "REGISTRY", tuple(p for p in registry.REGISTRY if p.id not in NEW))
    monkeypatch.setattr(conv, "se_squeezes", lambda graph: set())


# --------------------------------------------------------------------------------------------------
# One entry per fact


def test_ids_are_unique_and_older_ids_resolve_to_one_fact() -> None:
    seen = [i for p in registry.REGISTRY for i in (p.id, *p.aliases)]
    assert len(seen) == len(set(seen))
    assert registry.canonical("place-silu-residual") == "silu-residual"
    assert registry.canonical("fuse-silu-residual") == "silu-residual"
    assert registry.canonical("silu-add-not-fused") == "silu-residual"
    assert [p.precedence for p in registry.REGISTRY] == sorted(p.precedence for p in registry.REGISTRY)
    assert {"residual-add", "concat-conv", "silu-residual", "pool-tail", "se-gate"} <= set(registry.tunable())


def test_a_new_pattern_is_one_entry_that_every_consumer_reads(monkeypatch) -> None:
    """Register a pattern (keep every Relu's input float, call any Relu layer wider than INT8 its fault) and
    placement, lint and the engine explanation all act on it without another line anywhere."""
    from edgeq.report.explain import Links, wide_layer_rule

    def match(graph):
        return [Match("keep-relu-float", n.name, (n.name,), (Edge(n.inputs[0].name, n.name, Want.FLOAT),))
                for n in graph.nodes if n.op == "Relu"]

    def check(graph, matches, decisions):
        return [Hit(f"Relu {m.anchor} reads INT8", (m.anchor,)) for m in matches
                if any(i.inputs and i.inputs[0].op == "DequantizeLinear"
                       for i in [graph.tensors()[e.tensor] for e in m.edges])]

    from edgeq.findings import Level
    from edgeq.graph.facts import Edge

    extra = Pattern("keep-relu-float", "a test fact", "unverified", verified=False, match=match,
                    lint=LintSpec(Level.WARNING, "Relu reads INT8", "do not", check),
                    engine=EngineSignature("a Relu layer", wide=lambda v: "Relu" in v.ops), precedence=999)
    monkeypatch.setattr(registry, "REGISTRY", (*registry.REGISTRY, extra))
    model = zoo.resnet_like()
    prepared, _, _ = prepare_model(model)
    plan = plan_placement(graph_from_model(prepared))
    relu_inputs = {n.input[0] for n in prepared.graph.node if n.op_type == "Relu"}
    assert relu_inputs and not relu_inputs & {s.tensor for s in plan.sites}
    assert {f.rule for f in plan.floats if f.tensor in relu_inputs} == {"keep-relu-float"}

    report = engine("resnet50.explicit")
    links = Links(report)
    relu = next(rl for rl in report.layers if "Relu" in rl.onnx_ops and rl.kind.value == "compute")
    assert wide_layer_rule(report, links, relu) == "keep-relu-float"


def test_lint_runs_every_registry_check_under_one_id_per_fact() -> None:
    m = zoo.build("resnet", "ortfb")
    found = lint_model(m)
    assert {f.rule for f in found} >= {"residual-add", "conv-act-maxpool"}
    assert not any(f.rule.startswith(("fuse-", "place-")) for f in found)
    assert lint_model(m, rules=["fuse-add-both-quantized"]) == [f for f in found if f.rule == "residual-add"]


# --------------------------------------------------------------------------------------------------
# Squeeze-and-Excitation gates (EfficientNet-B0, RegNetY-400MF)


@pytest.mark.parametrize("name", ["efficientnet_b0", "regnet_y_400mf"])
def test_se_gates_found_and_placed_as_the_implicit_engine_ran_them(name: str) -> None:
    prepared, _, _ = prepare_model(skeleton(name))
    graph = graph_from_model(prepared)
    gates = registry.pattern("se-gate").match(graph)  # type: ignore[misc]
    assert len(gates) == 16
    plan = plan_placement(graph)
    sites = {s.tensor: s for s in plan.sites}
    for m in gates:
        pool, fc2, sig, mul = m.nodes
        excitation = f"{fc2}_output_0"
        assert sites[excitation].consumers == (sig,) and sites[excitation].rule == "se-gate"
        x = next(e.tensor for e in m.edges if e.consumer == mul)
        assert {mul, pool} <= set(sites[x].consumers)
    # the squeeze is the gate's, not a classifier's pooling tail
    assert not [s for s in plan.sites if s.rule == "pool-tail" and "/se/" in s.tensor + " ".join(s.consumers)]


def test_lint_names_the_16_fp16_gates_of_the_measured_engine(as_before_the_zoo_patterns, monkeypatch) -> None:
    old, _ = qdq(skeleton("efficientnet_b0"))
    monkeypatch.undo()
    found = [f for f in lint_model(old) if f.rule == "se-gate"]
    assert len(found) == 16
    measured = engine("effb0.explicit")
    fp16 = [rl for rl in measured.layers if rl.kind.value == "compute" and rl.precision == "FP16"]
    assert len(fp16) == 16
    for rl in fp16:  # every FP16 gate in the engine is named by one finding, by its ONNX nodes
        assert any(set(rl.onnx_nodes) & set(f.nodes) for f in found), rl.name
    new, _ = qdq(skeleton("efficientnet_b0"))
    assert [f for f in lint_model(new) if f.rule in ("se-gate", "conv-epilogue")] == []


@pytest.mark.parametrize("stem", ["effb0", "regnet"])
def test_the_report_explains_each_fp16_gate_by_the_se_entry(stem: str) -> None:
    from edgeq.report.explain import Links, group_violations, wide_layer_rule
    from edgeq.report.gate import apply_gate
    from edgeq.report.policy import POLICIES

    report = engine(f"{stem}.explicit")
    links = Links(report)
    wide = [rl for rl in report.layers if rl.kind.value == "compute" and rl.precision == "FP16"]
    assert len(wide) == 16 and {wide_layer_rule(report, links, rl) for rl in wide} == {"se-gate"}
    regions = group_violations(report, apply_gate(report, POLICIES["int8"]).violations)
    assert regions and all(r.rules == ("se-gate",) for r in regions)
    assert not apply_gate(engine(f"{stem}.implicit"), POLICIES["int8"]).violations


# --------------------------------------------------------------------------------------------------
# Channel shuffles (ShuffleNetV2)


def test_channel_shuffles_stay_float_and_each_branch_convolution_quantizes_itself() -> None:
    prepared, _, _ = prepare_model(skeleton("shufflenet_v2_x1_0"))
    graph = graph_from_model(prepared)
    shuffles = registry.pattern("channel-shuffle").match(graph)  # type: ignore[misc]
    assert len(shuffles) == 3  # one data-movement region per stage, chained through the identity halves
    inside = {n for m in shuffles for n in m.nodes}
    plan = plan_placement(graph, float_entry=False)  # the pattern's own decision, before float-entry
    nodes = {n.name: n for n in graph.nodes}
    for s in plan.sites:
        assert not set(s.consumers) & inside, s.tensor  # nothing in a shuffle region reads a Q/DQ
        assert all(nodes[c].op in ("Conv", "Gemm", "ReduceMean") for c in s.consumers)
    readers = [n for n in graph.nodes
               if n.op == "Conv" and n.inputs[0].inputs and n.inputs[0].inputs[0].name in inside]
    # 13 stride-1 blocks' branch convolutions, both branches of stage3.0 and stage4.0, and conv5
    assert len(readers) == 13 + 4 + 1
    read = {n.inputs[0].name for n in readers}
    assert {s.rule for s in plan.sites if s.tensor in read} == {"channel-shuffle"}
    # Each of those Q/DQ reads float data movement: float-entry leaves the branches behind them float.
    floats = {f.tensor: f.rule for f in plan_placement(graph).floats}
    assert {floats.get(t) for t in read} == {"float-entry"}


def test_lint_and_compare_name_the_shuffles_edgeq_ran_int8(as_before_the_zoo_patterns, monkeypatch) -> None:
    from edgeq.report.compare import diff_pair
    from edgeq.report.compare_engine import Engine

    old, _ = qdq(skeleton("shufflenet_v2_x1_0"))
    monkeypatch.undo()
    assert len([f for f in lint_model(old) if f.rule == "channel-shuffle"]) == 3
    new, _ = qdq(skeleton("shufflenet_v2_x1_0"))
    assert [f for f in lint_model(new) if f.rule == "channel-shuffle"] == []
    base, cand = engine("shufflenet.implicit"), engine("shufflenet.explicit")
    d = diff_pair(Engine("implicit", base), Engine("explicit", cand))
    explained = [r for r in d.regions if "channel-shuffle" in r.rules]
    assert len(explained) >= 10
    assert all("NC/32HW32" in e.why for r in explained for e in r.explanations if e.rule == "channel-shuffle")


# --------------------------------------------------------------------------------------------------
# PointWise regions in general (unverified beyond SE and SiLU + Add)


def _graph(nodes, inits):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _conv(name, x, out, inits):
    import numpy as np
    from onnx import helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((8, 8, 1, 1)).astype(np.float32)
    inits.append(numpy_helper.from_array(w, f"{name}.w"))
    return helper.make_node("Conv", [x, f"{name}.w"], [out], name=name)


def test_a_gated_region_of_two_branches_reads_int8_on_every_input() -> None:
    from onnx import helper

    inits: list = []
    nodes = [_conv("a", "x", "a_out", inits), _conv("b", "x", "b_out", inits),
             helper.make_node("Tanh", ["a_out"], ["t"], name="tanh"),
             helper.make_node("Sigmoid", ["b_out"], ["s"], name="sig"),
             helper.make_node("Mul", ["t", "s"], ["g"], name="gate"), _conv("c", "g", "y", inits)]
    prepared, _, _ = prepare_model(_graph(nodes, inits))
    plan = plan_placement(graph_from_model(prepared))
    sites = {s.tensor: s for s in plan.sites}
    assert sites["a_out"].consumers == ("tanh",) and sites["b_out"].consumers == ("sig",)
    assert {sites["a_out"].rule, sites["b_out"].rule} == {"pointwise-region"}
    assert "g" in sites  # the region's output is the next convolution's INT8 input


def test_two_convolutions_joined_by_an_add_stay_as_they_were() -> None:
    from onnx import helper

    inits: list = []
    nodes = [_conv("a", "x", "a_out", inits), _conv("b", "x", "b_out", inits),
             helper.make_node("Add", ["a_out", "b_out"], ["s"], name="add"), _conv("c", "s", "y", inits)]
    prepared, _, _ = prepare_model(_graph(nodes, inits))
    plan = plan_placement(graph_from_model(prepared))
    assert {s.tensor for s in plan.sites} == {"x", "s"}
