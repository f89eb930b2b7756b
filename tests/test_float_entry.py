"""float-entry: an INT8 region whose only ways in are Q/DQ on float data movement runs float.

Checked on the torchvision ShuffleNetV2 graph (the skeleton of the engines) and against the engines measured
with and without the rule in one H100 lease (tests/fixtures/trt86-h100-zoo3): the placements edgeq writes
today are the ones those engines were built from, and the engines show the QuantizeLinear layers and
reformats the rule removes.
"""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import ROOT

from edgeq import zoo
from edgeq.graph import registry
from edgeq.graph.io import graph_from_model, model_from_graph
from edgeq.graph.rules import lint_model
from edgeq.quant.decisions import candidate_plan, decision_points
from edgeq.quant.mirror import load_engine, plan_from_engine
from edgeq.quant.overrides import Overrides
from edgeq.quant.placement import plan_placement
from edgeq.quant.quantize import prepare_model
from edgeq.quant.regions import entry_regions, float_entries, float_entry_regions

FIXTURES = ROOT / "tests" / "fixtures"
ZOO3 = FIXTURES / "trt86-h100-zoo3"
ZOO4 = FIXTURES / "trt86-h100-zoo4"
YOLOV8N = FIXTURES / "trt86-h200-yolov8n"


def prepared(name: str):
    if name.startswith("yolo_like"):
        model = zoo.yolo_like(split="slice" if name.endswith("slice") else "split")
    elif name == "resnet50":
        model = zoo.resnet50(size=64, width=8)
    else:
        model = zoo.skeleton(FIXTURES / "trt86-h100-zoo" / "skeletons" / f"{name}.skel.onnx")
    return prepare_model(model)[0]


@pytest.fixture(scope="module")
def shufflenet():
    return graph_from_model(prepared("shufflenet_v2_x1_0"))


def summary(variant: str, lease=ZOO3) -> dict:
    return json.loads(gzip.decompress((lease / f"shufflenet.{variant}.quantize.json.gz").read_bytes()))


def placed(plan) -> tuple[dict, dict]:
    return ({s.tensor: sorted(s.consumers) for s in plan.sites}, {w.tensor: w.node for w in plan.weights})


def recorded(variant: str, lease=ZOO3) -> tuple[dict, dict]:
    d = summary(variant, lease)
    return ({a["tensor"]: sorted(a["consumers"]) for a in d["activations"]},
            {w["tensor"]: w["node"] for w in d["weights"]})


def test_each_branch_behind_a_slice_or_a_shuffle_runs_float(shufflenet) -> None:
    raw = plan_placement(shufflenet, float_entry=False)
    regions = float_entry_regions(shufflenet, raw)
    entries = [r.entries for r in regions]
    # 13 stride-1 units read their branch through a Slice; stage 2 and 3 end in a shuffle read by the next
    # stage's first unit, stage 4's by conv5
    assert len(regions) == 16 and all(len(e) == 1 for e in entries)
    assert sum(e[0].endswith("/Slice_1_output_0") for e in entries) == 13
    convs = {r.entries[0]: sorted(n for n in r.nodes if n.endswith(("/Conv", "/Gemm"))) for r in regions}
    unit = "/stage3/stage3.4/"
    assert convs[f"{unit}Slice_1_output_0"] == [f"{unit}branch2/branch2.{i}/Conv" for i in (0, 3, 5)]
    nxt = "/stage4/stage4.0/"
    first = [f"{nxt}branch1/branch1.{i}/Conv" for i in (0, 2)]
    first += [f"{nxt}branch2/branch2.{i}/Conv" for i in (0, 3, 5)]
    assert convs["/stage3/stage3.7/Reshape_1_output_0"] == sorted(first)
    assert convs["/stage4/stage4.3/Reshape_1_output_0"] == ["/conv5/conv5.0/Conv", "/fc/Gemm"]
    plan = plan_placement(shufflenet)
    # What stays INT8 is what the graph input's Q/DQ reaches through fused producers.
    assert "/maxpool/MaxPool_output_0" in {s.tensor for s in plan.sites} and len(plan.sites) == 5
    kept = ("input", "/maxpool/", "/stage2/stage2.0/")
    assert all(s.tensor.startswith(kept) for s in plan.sites)
    assert {w.node.split("/")[1] for w in plan.weights} == {"conv1", "stage2"}
    assert all(w.node.startswith(("/conv1/", "/stage2/stage2.0/")) for w in plan.weights)
    gone = {t for r in regions for t in r.sites}
    assert {f.tensor for f in plan.floats if f.rule == "float-entry"} == gone


@pytest.mark.parametrize("name", ["yolo_like", "yolo_like_slice", "resnet50", "mobilenet_v2",
                                  "regnet_y_400mf"])
def test_data_movement_behind_a_layer_is_no_entry(name: str) -> None:
    """YOLO's C2f Split (or Slice) reads a convolution's output: the Q moves into that convolution, and the
    explicit engine equals the implicit one layer for layer (trt86-h100-zoo2/yolo.*)."""
    graph = graph_from_model(prepared(name))
    raw = plan_placement(graph, float_entry=False)
    assert float_entries(graph, raw) == []
    assert plan_placement(graph) == raw


def test_a_forced_node_keeps_its_region_int8(shufflenet) -> None:
    unit = "/stage3/stage3.2/"
    plan = plan_placement(shufflenet, overrides=Overrides(force=(f"{unit}branch2/branch2.3/Conv",)))
    sites, weights = placed(plan)
    assert f"{unit}Slice_1_output_0" in sites
    assert {f"{unit}branch2/branch2.{i}/Conv" for i in (0, 3, 5)} <= set(weights.values())
    assert not [t for t in sites if t.startswith("/stage3/stage3.3/")]  # the other branches stay float


def test_placement_and_mirror_are_what_the_measured_engines_were_built_from(shufflenet) -> None:
    """The four explicit engines of trt86-h100-zoo3 (the rules and the mirror, with and without float-entry)
    were built from these placements: the same Q/DQ consumers and weight DQs, tensor for tensor."""
    assert placed(plan_placement(shufflenet)) == recorded("static")
    assert placed(plan_placement(shufflenet, float_entry=False)) == recorded("static-nofe")
    layers = load_engine(ZOO3 / "shufflenet.implicit.layers.json.gz")
    mirror, report = plan_from_engine(shufflenet, layers)
    assert placed(mirror) == recorded("mirror")
    exact, exact_report = plan_from_engine(shufflenet, layers, float_entry=False)
    assert placed(exact) == recorded("mirror-nofe")
    # the implicit engine read 12 edges INT8; 5 of them, into stage 3's first unit, it quantized in the
    # reformat after the stage-2 shuffle: the mirror leaves that unit float and says so
    assert exact_report.int8_edges == report.int8_edges == 12
    assert report.float_entry == ("/stage2/stage2.3/Reshape_1_output_0",) and report.float_entry_edges == 5
    assert exact_report.float_entry == () and "left float" in report.summary_line()


def test_the_mirror_of_an_engine_that_ran_the_branches_int8(shufflenet) -> None:
    """trt86-h100-zoo4: the same model's implicit engine on another lease ran 43 edges INT8, entering 12
    branches through the quantizing reformat after a Slice or a shuffle. The mirror names all 12 and leaves
    them float; the engines were built from exactly these placements."""
    layers = load_engine(ZOO4 / "shufflenet.implicit.layers.json.gz")
    mirror, report = plan_from_engine(shufflenet, layers)
    exact, exact_report = plan_from_engine(shufflenet, layers, float_entry=False)
    assert placed(mirror) == recorded("mirror", ZOO4) and placed(exact) == recorded("mirror-nofe", ZOO4)
    assert placed(plan_placement(shufflenet)) == recorded("static", ZOO4)
    assert report.int8_edges == exact_report.int8_edges == 43
    assert len(report.float_entry) == 12 and report.float_entry_edges == 36
    assert {t.rsplit("/", 1)[1] for t in report.float_entry} == {"Slice_1_output_0", "Reshape_1_output_0"}
    assert set(report.float_entry) == set(summary("mirror", ZOO4)["mirror"]["float_entry"])


def _standalone_qs(path) -> list[str]:
    """The layers edgeq's engine reading calls float-entry: a QuantizeLinear of its own on float data
    movement (``EngineSignature.reformat`` of the registry entry)."""
    from edgeq.graph import registry
    from edgeq.report.explain import Links
    from edgeq.report.fusion_build import build_report
    from edgeq.report.parse import load_layers

    report = build_report(load_layers(gzip.decompress(path.read_bytes())))
    links = Links(report)
    return [rl.layer.name for rl in report.layers
            if (p := registry.explain_reformat(links.view(rl.index))) is not None and p.id == "float-entry"]


@pytest.mark.parametrize("variant", ["mirror-split", "mirror-mul", "mirror-clip"])
def test_no_qdq_form_quantizes_in_the_reformat_as_the_implicit_engine_does(shufflenet, variant: str) -> None:
    """bench/entry_bench.py kept the 12 regions INT8 three ways (one Q/DQ per reader; Mul(x, 1) or
    Clip(x, -128 s, 127 s) before the Q): TensorRT 8.6 merged the Qs, folded the Mul, moved the Q back through
    the Clip, and ran each of the 12 as a layer of its own, where lint's reading (``q_layer_at``) said it
    would. The implicit engine and the mirror have none."""
    _, report = plan_from_engine(shufflenet, load_engine(ZOO4 / "shufflenet.implicit.layers.json.gz"))
    qs = _standalone_qs(ZOO4 / f"shufflenet.{variant}.layers.json.gz")
    assert len(qs) == 12
    assert {q.split("_QuantizeLinear")[0] for q in qs} == set(report.float_entry)
    assert _standalone_qs(ZOO4 / "shufflenet.implicit.layers.json.gz") == []
    assert _standalone_qs(ZOO4 / "shufflenet.mirror.layers.json.gz") == []


def _layers(variant: str) -> list[dict]:
    return json.loads(gzip.decompress((ZOO3 / f"shufflenet.{variant}.layers.json.gz").read_bytes()),
                      strict=False)["Layers"]


@pytest.mark.parametrize("variant", ["static", "static-nofe", "mirror", "mirror-nofe"])
def test_the_engines_show_the_quantize_layers_the_rule_removes(variant: str) -> None:
    """Without the rule, a QuantizeLinear on float data movement is a layer of its own (FP32 row-major in,
    INT8 NC/4HW4 or row-major out) or moved back into the shuffle (``_clone_N``); edgeq's engine reading
    names it float-entry (compare's explanation). With the rule the engines have none."""
    from edgeq.report.compare import diff_pair
    from edgeq.report.compare_engine import Engine
    from edgeq.report.fusion_build import build_report
    from edgeq.report.parse import load_layers

    def report(v: str):
        return build_report(load_layers(gzip.decompress((ZOO3 / f"shufflenet.{v}.layers.json.gz")
                                                        .read_bytes())))

    q_layers = [lay["Name"] for lay in _layers(variant) if "QuantizeLinear" in lay["Name"]
                and lay["Name"] != "input_QuantizeLinear" and "Int8" in lay["Outputs"][0]["Format/Datatype"]
                and "FP32" in lay["Inputs"][0]["Format/Datatype"]]
    d = diff_pair(Engine("implicit", report("implicit")), Engine(variant, report(variant)))
    explained = [r for r in d.regions if "float-entry" in r.rules]
    if variant.endswith("-nofe"):
        assert q_layers and explained
        if variant == "static-nofe":
            assert sum(n.endswith("Slice_1_output_0_QuantizeLinear") for n in q_layers) == 13
        else:
            assert all("_QuantizeLinear_clone_" in n for n in q_layers)
    else:
        assert q_layers == [] and explained == []


def test_lint_names_a_quantizelinear_on_float_data_movement(shufflenet) -> None:
    from edgeq.quant.qdq import insert_qdq

    def model(float_entry: bool):
        ref = prepared("shufflenet_v2_x1_0")
        graph = graph_from_model(ref)
        plan = plan_placement(graph, float_entry=float_entry)
        insert_qdq(graph, plan, {t: 1.0 for t in plan.activations})
        return model_from_graph(graph, like=ref)

    hits = [f for f in lint_model(model(False)) if f.rule == "float-entry"]
    assert len(hits) == 16 and all(f.level.value == "warning" for f in hits)
    assert any("Slice_1_output_0" in n for f in hits for n in f.nodes)
    assert [f for f in lint_model(model(True)) if f.rule == "float-entry"] == []
    assert registry.pattern("float-entry").lint is not None


def test_tune_tries_each_region_int8_as_one_decision(shufflenet) -> None:
    raw = plan_placement(shufflenet, float_entry=False)
    regions = float_entry_regions(shufflenet, raw)
    decisions = decision_points(raw, (), regions)
    whole = [d for d in decisions if d.rule == "float-entry"]
    assert len(whole) == 16 and not any(d.start for d in whole)
    start = candidate_plan(raw, decisions, {})
    assert placed(start) == placed(plan_placement(shufflenet))  # the start is the rules' placement
    d = next(d for d in whole if d.sites[0].startswith("/stage2/stage2.1/"))
    on = candidate_plan(raw, decisions, {d.id: True})
    added = {s.tensor for s in on.sites} - {s.tensor for s in start.sites}
    assert added == set(d.sites) and len(d.weights) == 3  # the branch's three convolutions, together
    assert {w.tensor for w in on.weights} - {w.tensor for w in start.weights} == set(d.weights)
    everything = candidate_plan(raw, decisions, {x.id: True for x in decisions})
    assert placed(everything) == placed(raw)


def _graph(concat_of_convs: bool):
    """x -> conv -> relu (y); y read by two Slices (a channel split: a fork) or, with
    ``concat_of_convs``, two convolutions whose outputs a Concat joins; then Reshape -> a convolution."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = [numpy_helper.from_array(np.ones((8, c, 1, 1), np.float32), f"w{i}")
         for i, c in enumerate((3, 8, 8, 16))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], "conv0"),
             helper.make_node("Relu", ["c0"], ["y"], "relu0")]
    if concat_of_convs:
        nodes += [helper.make_node("Conv", ["y", "w1"], ["a"], "conv_a"),
                  helper.make_node("Conv", ["y", "w2"], ["b"], "conv_b")]
    else:
        for name, lo, hi in (("a", 0, 4), ("b", 4, 8)):
            consts = [numpy_helper.from_array(np.array(v, np.int64), f"{name}_{k}")
                      for k, v in (("s", [lo]), ("e", [hi]), ("ax", [1]))]
            w.extend(consts)
            ins = ["y", f"{name}_s", f"{name}_e", f"{name}_ax"]
            nodes.append(helper.make_node("Slice", ins, [name], f"slice_{name}"))
    w.append(numpy_helper.from_array(np.array([1, -1, 4, 4], np.int64), "shape"))
    nodes += [helper.make_node("Concat", ["a", "b"], ["cat"], "cat", axis=1),
              helper.make_node("Reshape", ["cat", "shape"], ["r"], "reshape"),
              helper.make_node("Conv", ["r", "w3"], ["out"], "conv_out")]
    cat_c = 16 if concat_of_convs else 8
    w[3] = numpy_helper.from_array(np.ones((8, cat_c, 1, 1), np.float32), "w3")
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], w)
    return graph_from_model(onnx.shape_inference.infer_shapes(helper.make_model(g)))


@pytest.mark.parametrize("concat_of_convs", [True, False])
def test_a_q_moves_back_into_the_layers_that_write_it_unless_a_fork_stops_it(concat_of_convs: bool) -> None:
    """TensorRT 8.6 moves a Q back through Reshape and Concat into the convolutions that write the Concat's
    inputs (fused, no entry); behind a channel split the Q stops at the fork, a layer of its own."""
    from edgeq.graph.trt86.regions import q_layer_at

    graph = _graph(concat_of_convs)
    at = q_layer_at(graph.tensors()["r"], lambda t: False)
    assert (at is None) == concat_of_convs
    if not concat_of_convs:
        assert at.name == "y"
    assert q_layer_at(graph.tensors()["r"], lambda t: t.name == "y") is None  # y INT8 already: requantized


def _mirror_diff(lease, tmp_path):
    """``diff_pair`` of a lease's implicit engine (the baseline) and its mirror, mapped onto the model."""
    from edgeq.report.compare import diff_pair
    from edgeq.report.compare_engine import engine_from_path

    engines = {}
    for v in ("implicit", "mirror"):
        (tmp_path / v).mkdir()
        for part in ("layers", "profile"):
            data = gzip.decompress((lease / f"shufflenet.{v}.{part}.json.gz").read_bytes())
            (tmp_path / v / f"{part}.json").write_bytes(data)
        engines[v] = engine_from_path(tmp_path / v, onnx_model=prepared("shufflenet_v2_x1_0"), name=v)
    return diff_pair(engines["implicit"], engines["mirror"])


def test_the_relative_gate_excuses_what_the_mirror_leaves_float_on_purpose(shufflenet, tmp_path) -> None:
    """``deploy --placement implicit``: stage 3's first unit, INT8 in the implicit engine behind its
    quantizing reformat, runs FP16 in the mirror's engine by float-entry. The relative gate names those
    nodes as excused, not as wider-than-baseline; the extra reformat it costs is still counted."""
    from edgeq.orchestration.implicit import ImplicitFloat
    from edgeq.report.compare_gate import relative_gate

    plan, _ = plan_from_engine(shufflenet, load_engine(ZOO3 / "shufflenet.implicit.layers.json.gz"))
    diff = _mirror_diff(ZOO3, tmp_path)
    wider = {w.node for w in diff.wider}
    assert wider and wider <= set(plan.float_nodes) and all(n.startswith("/stage3/stage3.0/") for n in wider)
    strict = relative_gate(diff)
    assert {r for r, _ in strict.failures} == {"wider-than-baseline", "more-reformats"}
    judged = relative_gate(diff, by_design=plan.float_nodes)
    assert [r for r, _ in judged.failures] == ["more-reformats"] and set(judged.excused) == wider
    assert "8 nodes float by design (float-entry) excused" in judged.summary()
    assert judged.to_dict()["excused"] == list(judged.excused)
    notes = ImplicitFloat((), 0, plan.float_nodes).notes()
    assert any("8 ONNX nodes of float-entry regions allowlisted" in n for n in notes)


def test_a_slower_mirror_says_how_much_of_it_q_dq_cannot_express(shufflenet, tmp_path) -> None:
    """trt86-h100-zoo4's mirror is 0.923x its implicit engine, which entered 12 regions by quantizing
    reformats: the relative gate fails it as slower, excuses those nodes, and says the gap may be what Q/DQ
    cannot express on 8.6 and where to look; without by-design nodes the message is the plain ratio."""
    from edgeq.report.compare_gate import relative_gate

    plan, _ = plan_from_engine(shufflenet, load_engine(ZOO4 / "shufflenet.implicit.layers.json.gz"))
    diff = _mirror_diff(ZOO4, tmp_path)
    judged = dict(relative_gate(diff, by_design=plan.float_nodes).failures)
    slower = judged["slower-than-baseline"]
    assert "wider-than-baseline" not in judged and float(slower.split("x ")[0].split()[-1]) < 0.95
    excused = len(relative_gate(diff, by_design=plan.float_nodes).excused)
    assert excused > 12 and f"{excused} nodes run float by design" in slower and "float-entry" in slower
    plain = dict(relative_gate(diff).failures)["slower-than-baseline"]
    assert "float-entry" not in plain and "wider-than-baseline" in dict(relative_gate(diff).failures)


@pytest.fixture(scope="module")
def yolov8n():
    """nudenet 3.4.2's trained YOLOv8n (a real ultralytics export), the graph its implicit engine was built
    from (the skeleton of edgeq's cleaned ``.int8.fp32.onnx``)."""
    return graph_from_model(prepare_model(zoo.skeleton(YOLOV8N / "yolov8n.skel.onnx"))[0])


def test_a_real_yolov8n_mirror_keeps_what_its_implicit_engine_ran_int8(yolov8n) -> None:
    """trt86-h200-yolov8n: the implicit engine wrote model.2's cv1 output INT8, reformatted it to FP16 for
    model.2's FP16 bottleneck and for copies of the Split's outputs that quantize into its Concat, then ran
    the rest of the network INT8, through every C2f's Split and Concat, SPPF's pools and the head's
    upsample. The mirror keeps every INT8 edge of the engine: cv1's output gets its Q/DQ before the
    Split TensorRT folds (it was written INT8), so the body is entered by that write and no region is
    entered by a quantizing reformat (before, the Concat was such an entry, kept INT8; once, 3 of 99
    edges were kept)."""
    layers = load_engine(YOLOV8N / "yolov8n.implicit.layers.json.gz")
    plan, report = plan_from_engine(yolov8n, layers)
    exact, _ = plan_from_engine(yolov8n, layers, float_entry=False)
    assert report.int8_edges == 100 and report.reformatted == ("/model.2/cv1/act/Mul_output_0",)
    assert sum(len(s.consumers) for s in plan.sites) == report.int8_edges
    assert placed(plan) == placed(exact) and report.float_entry == () and report.float_entry_edges == 0
    assert placed(plan)[0]["/model.2/cv1/act/Mul_output_0"] == ["/model.2/Split"]
    assert placed(plan)[0]["/model.2/Concat_output_0"] == ["/model.2/cv2/conv/Conv"]
    assert report.int8_entry == () and entry_regions(yolov8n, exact) == []
    assert float_entry_regions(yolov8n, exact) == []
    # Each Concat the engine built as INT8 -> INT8 copies (read straight from the JSON) is INT8 in the plan.
    raw = json.loads(gzip.decompress((YOLOV8N / "yolov8n.implicit.layers.json.gz").read_bytes()),
                     strict=False)["Layers"]
    int8_copies = {t["Name"] for lay in raw if lay["Name"].endswith(" copy") for t in lay["Outputs"]
                   if "Int8" in lay["Inputs"][0]["Format/Datatype"]}
    concats = {o.name for n in yolov8n.nodes if n.op == "Concat" for o in n.outputs}
    int8 = {s.tensor for s in plan.sites} | set(plan.commuted)
    assert int8_copies & concats and int8_copies & concats <= int8


def test_what_a_layer_wrote_is_read_back_across_float_copies_but_not_into_a_concats_buffer(yolov8n) -> None:
    """The precision a tensor was written in, on the real H200 YOLOv8n JSON: ``cv1``'s output is a copy
    turning the convolution's INT8 into FP16, so it was written INT8, also across a chain of two such
    copies. A Concat's buffer is written by one copy per input (here FP16 -> INT8 quantizing copies, one
    reformatting an FP16 layer's output): its precision is the buffer's, INT8, not one input's FP16."""
    from dataclasses import replace

    from edgeq.quant.mirror import _Graph, _Mirror

    layers = load_engine(YOLOV8N / "yolov8n.implicit.layers.json.gz")
    cv1 = "/model.2/cv1/act/Mul_output_0"
    m = _Mirror(_Graph(yolov8n), layers)
    assert m._precision_written(cv1) == "INT8" and m._precision_written("/model.2/Concat_output_0") == "INT8"
    i = next(i for i, lay in enumerate(layers.layers) if any(t.name == cv1 for t in lay.outputs))
    copy = layers.layers[i]
    assert copy.name.startswith("Reformatting CopyNode for Output Tensor 0 to /model.2/cv1/")
    fp32 = replace(copy.outputs[0].format, precision="FP32")
    first = replace(copy, outputs=(replace(copy.outputs[0], name="between", format=fp32),))
    second = replace(copy, inputs=(first.outputs[0],))
    chained = replace(layers, layers=(*layers.layers[:i], first, second, *layers.layers[i + 1:]))
    plan, report = plan_from_engine(yolov8n, chained)
    assert report.reformatted == (cv1,) and placed(plan)[0][cv1] == ["/model.2/Split"]


def test_shufflenet_regions_are_branches_and_stay_float(shufflenet) -> None:
    """The bound that keeps YOLOv8n's body INT8 leaves every region the ShuffleNet engines were measured
    on float: each is a branch (convolutions and their activations, no data movement inside)."""
    raw = plan_placement(shufflenet, float_entry=False)
    assert all(r.branch for r in entry_regions(shufflenet, raw)) and len(entry_regions(shufflenet, raw)) == 16
    for lease, count in ((ZOO3, 1), (ZOO4, 12)):
        exact, _ = plan_from_engine(shufflenet, load_engine(lease / "shufflenet.implicit.layers.json.gz"),
                                    float_entry=False)
        found = entry_regions(shufflenet, exact)
        assert len(found) == count and all(r.branch and r.through == () for r in found)
        assert plan_from_engine(shufflenet, load_engine(lease / "shufflenet.implicit.layers.json.gz"))[1] \
            .int8_entry == ()


def test_lint_leaves_a_quantizelinear_into_an_int8_body_alone(yolov8n) -> None:
    """The mirror of the real YOLOv8n engine keeps the Q/DQ on model.2's Concat: a layer of its own on
    TensorRT 8.6 (``q_layer_at`` goes back to the Split's fork), the way into a region that runs INT8 through
    data movement. Lint does not ask to leave it float (its fix would float the network's body)."""
    from edgeq.graph.trt86.regions import q_layer_at, runs_int8_through_data_movement
    from edgeq.quant.qdq import insert_qdq

    ref = prepare_model(zoo.skeleton(YOLOV8N / "yolov8n.skel.onnx"))[0]
    graph = graph_from_model(ref)
    plan, _ = plan_from_engine(graph, load_engine(YOLOV8N / "yolov8n.implicit.layers.json.gz"))
    at = q_layer_at(graph.tensors()["/model.2/Concat_output_0"], lambda t: t.name in plan.tensors)
    assert at is not None and at.name == "/model.2/Split_output_1"
    insert_qdq(graph, plan, {t: 1.0 for t in plan.activations})
    model = model_from_graph(graph, like=ref)
    q = next(n for n in graph_from_model(model).nodes
             if n.op == "QuantizeLinear" and n.inputs[0].name == "/model.2/Concat_output_0")
    assert runs_int8_through_data_movement(q)
    assert [f for f in lint_model(model) if f.rule == "float-entry"] == []
