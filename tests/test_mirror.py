"""``edgeq quantize --from-engine``: the mirror of a real implicit TensorRT 8.6.0 engine, checked against an
independent reading of its layer JSON, on the graph it was built from (skeletons refilled, zoo models).

The independent reading here parses the JSON itself (json, gzip), follows only ``Reformatting CopyNode``
layers back to an ONNX tensor, and takes the readers from each layer's ``[ONNX Layer: X]`` metadata: the
direct edges. The mirror must put a Q/DQ on every direct edge read INT8 and on none read in float; every
other Q/DQ it places must be one of the indirect reads the module docstring lists (a Concat built as
copies, a Split/Slice/Flatten TensorRT folded into the reader), each checked against the JSON below.
"""

from __future__ import annotations

import gzip
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from edgeq import zoo
from edgeq.errors import QuantError
from edgeq.graph.io import graph_from_model
from edgeq.quant.mirror import load_engine, plan_from_engine
from edgeq.quant.plan import Plan
from edgeq.quant.quantize import prepare_model

FIXTURES = Path(__file__).parent / "fixtures"
ZOO = FIXTURES / "trt86-h100-zoo"
SKELETONS = ZOO / "skeletons"
EDGEQ = FIXTURES / "trt86-h200-edgeq"
ZOO2 = FIXTURES / "trt86-h100-zoo2"  # a second lease (2026-11-25): implicit chose other precisions

# engine -> (graph, layer JSON). ResNet-50 and the YOLO-like net are the zoo builders the engines were
# exported from (node names do not depend on size or width); the four others the torchvision skeletons.
ENGINES: dict[str, tuple[str, Path]] = {
    "resnet50": ("resnet50", ZOO / "resnet50.implicit.layers.json.gz"),
    "mnv2": ("mobilenet_v2", ZOO / "mnv2.implicit.layers.json.gz"),
    "effb0": ("efficientnet_b0", ZOO / "effb0.implicit.layers.json.gz"),
    "regnet": ("regnet_y_400mf", ZOO / "regnet.implicit.layers.json.gz"),
    "shufflenet": ("shufflenet_v2_x1_0", ZOO / "shufflenet.implicit.layers.json.gz"),
    "yolo_edgeq": ("yolo_like", EDGEQ / "yolo_edgeq.implicit.layers.json"),
    "r50b64_edgeq": ("resnet50", EDGEQ / "r50b64_edgeq.implicit.layers.json"),
    "shufflenet_zoo2": ("shufflenet_v2_x1_0", ZOO2 / "shufflenet.implicit.layers.json.gz"),
    "yolo_zoo2": ("yolo_like", ZOO2 / "yolo.implicit.layers.json.gz"),
}
# What the mirror finds per engine (INT8 edges = Q/DQ consumers; weights = per-channel DQs). Measured
# once and kept, so a change in how the JSON is read shows up as a number that moved.
EXPECTED = {
    "resnet50": (71, 54), "mnv2": (64, 53), "effb0": (140, 82), "regnet": (151, 86),
    "shufflenet": (42, 41), "yolo_edgeq": (75, 36), "r50b64_edgeq": (71, 54),
    "shufflenet_zoo2": (12, 11), "yolo_zoo2": (75, 36),
}


@cache
def prepared(graph: str) -> onnx.ModelProto:
    """The graph as ``edgeq quantize`` prepares it (cleaned, named): what the engine's names refer to."""
    if graph == "resnet50":
        model = zoo.resnet50(size=64, width=8)
    elif graph == "yolo_like":
        model = zoo.yolo_like()
    else:
        model = zoo.skeleton(SKELETONS / f"{graph}.skel.onnx")
    return prepare_model(model)[0]


def mirror(engine: str, layers: Any = None, *, float_entry: bool = False) -> tuple[Plan, Any]:
    """The engine's INT8 edges exactly (``float_entry=False``: what these tests check against the JSON)."""
    graph, path = ENGINES[engine]
    return plan_from_engine(graph_from_model(prepared(graph)), layers or load_engine(path),
                            float_entry=float_entry)


def raw_layers(path: Path) -> list[dict[str, Any]]:
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return json.loads(data, strict=False)["Layers"]


def layer_reads(engine: str) -> list[tuple[str, list[str], bool, dict[str, Any]]]:
    """(ONNX tensor, the layer's metadata nodes, read INT8, layer) per layer input, looking back across
    ``Reformatting CopyNode`` layers only."""
    graph, path = ENGINES[engine]
    model = prepared(graph)
    tensors = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    layers = raw_layers(path)
    produced = {t["Name"]: lay for lay in layers for t in lay["Outputs"]}
    out = []
    for lay in layers:
        if lay["Name"].startswith("Reformatting CopyNode"):
            continue
        nodes = re.findall(r"\[ONNX Layer: (.*?)\]", lay.get("Metadata", ""))
        for t in lay["Inputs"]:
            name, int8 = t["Name"], "Int8" in t["Format/Datatype"]
            while name not in tensors and produced.get(name, {}).get("Name", "").startswith("Reformatting"):
                name = produced[name]["Inputs"][0]["Name"]
            out.append((name, nodes, int8, lay))
    return out


def direct_reads(engine: str) -> list[tuple[str, str, bool]]:
    """(tensor, reading node, read INT8) for every layer input some metadata node reads directly."""
    reads_of = {n.name: set(n.input) for n in prepared(ENGINES[engine][0]).graph.node}
    return [(t, n, int8) for t, nodes, int8, _ in layer_reads(engine) for n in nodes
            if n in reads_of and t in reads_of[n]]


def sites(plan: Plan) -> dict[str, set[str]]:
    return {s.tensor: set(s.consumers) for s in plan.sites}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_mirror_reproduces_every_int8_edge_of_the_engine(engine: str) -> None:
    plan, report = mirror(engine)
    got = sites(plan)
    reads = direct_reads(engine)
    assert reads, "the independent reading found no edges"
    int8 = {(t, n) for t, n, i8 in reads if i8}
    missing = [(t, n) for t, n in int8 if n not in got.get(t, ())]
    assert not missing, f"INT8 edges without a Q/DQ: {missing[:5]}"
    float_read = [(t, n) for t, n, i8 in reads if not i8 and n in got.get(t, ())]
    assert not float_read, f"Q/DQ where the engine read float: {float_read[:5]}"
    assert report.unmapped == () and report.unmapped_layers == ()
    assert report.mapped_layers == report.named_layers > 0
    # Every Q/DQ is a direct INT8 edge or an indirect one the JSON shows (checked kind by kind).
    model = prepared(ENGINES[engine][0])
    op = {n.name: n.op_type for n in model.graph.node}
    producer = {o: n for n in model.graph.node for o in n.output}
    held = {n for _, nodes, _, _ in layer_reads(engine) for n in nodes}
    int8_inputs: dict[str, set[str]] = {}  # node -> what its layers read in INT8
    for t, nodes, i8, _ in layer_reads(engine):
        for n in nodes if i8 else ():
            int8_inputs.setdefault(n, set()).add(t)
    copies = {n for _, nodes, _, lay in layer_reads(engine) if lay.get("Origin") == "CONCAT" for n in nodes}
    for t, consumers in got.items():
        for n in sorted(consumers - {n for t2, n in int8 if t2 == t}):
            if op[n] == "Concat":  # a layer wrote t straight into a Concat run as INT8 copies
                assert n in copies and n in int8_inputs, (t, n)
            elif n not in held:  # a Split/Flatten TensorRT folded into its INT8 readers
                assert op[n] in ("Split", "Slice", "Flatten"), (t, n, op[n])
            elif producer[t].name not in held:  # n reads a folded Slice: its layer read the Slice's input
                assert op[producer[t].name] in ("Slice", "Split"), (t, n)
                assert producer[t].input[0] in int8_inputs[n], (t, n)
            else:  # n's layer read a view of a Concat's buffer: t is one of that Concat's inputs
                views = [c for c in int8_inputs[n] if c in producer and producer[c].op_type == "Concat"]
                assert any(t in producer[c].input for c in views), (t, n)
    assert (report.int8_edges, len(plan.weights)) == EXPECTED[engine]
    assert report.int8_edges == sum(len(c) for c in got.values())


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_weights_follow_the_layer_precision(engine: str) -> None:
    """A weighted node gets its per-channel DQ when its layer declares Int8 weights (or declares none and
    reads INT8, as CaskConvActPool does); FP16/FP32 weights stay float."""
    plan, _ = mirror(engine)
    weights = {w.node: w.axis for w in plan.weights}
    model = prepared(ENGINES[engine][0])
    node = {n.name: n for n in model.graph.node}
    inits = {i.name for i in model.graph.initializer}
    declared: dict[str, set[str]] = {}
    undeclared_int8: set[str] = set()
    for lay in raw_layers(ENGINES[engine][1]):
        for n in re.findall(r"\[ONNX Layer: (.*?)\]", lay.get("Metadata", "")):
            if node[n].op_type not in ("Conv", "Gemm", "MatMul") or node[n].input[1] not in inits:
                continue
            if "Weights" in lay:
                declared.setdefault(n, set()).add(lay["Weights"]["Type"])
            elif any("Int8" in t["Format/Datatype"] for t in lay["Inputs"]):
                undeclared_int8.add(n)
    want = {n for n, types in declared.items() if "Int8" in types} | (undeclared_int8 - set(declared))
    assert set(weights) == want
    assert all(axis == 0 for n, axis in weights.items() if node[n].op_type == "Conv")


@pytest.mark.parametrize("engine", ["effb0", "regnet"])
def test_se_gates_read_fc2_in_int8(engine: str) -> None:
    """The SE gate PWN(Sigmoid, Mul) ran INT8: fc2's output is quantized into the Sigmoid, the feature map
    into the Mul (edgeq's rules left fc2's output float: 16 FP16 gates behind reformats)."""
    plan, _ = mirror(engine)
    got = sites(plan)
    model = prepared(ENGINES[engine][0])
    gates = [n for n in model.graph.node if n.op_type == "Sigmoid" and "scale_activation" in n.name]
    assert len(gates) == 16
    for sig in gates:
        fc2_out = sig.input[0]
        assert fc2_out.endswith("fc2/Conv_output_0") and sig.name in got.get(fc2_out, ()), sig.name
        mul = next(n for n in model.graph.node if n.op_type == "Mul" and sig.output[0] in n.input)
        feature = next(i for i in mul.input if i != sig.output[0])
        assert mul.name in got.get(feature, ()), mul.name


def test_shufflenet_keeps_the_channel_shuffles_float() -> None:
    """Implicit kept every Concat, shuffle (Reshape, Transpose) and Slice FP32 and quantized once into each
    branch convolution; stage 4 it ran FP16 throughout."""
    plan, _ = mirror("shufflenet")
    got = sites(plan)
    model = prepared("shufflenet_v2_x1_0")
    op = {n.name: n.op_type for n in model.graph.node}
    movers = ("Concat", "Reshape", "Transpose", "Slice")
    assert not [(t, n) for t, cs in got.items() for n in cs if op[n] in movers]
    branch = [n for n in model.graph.node if re.search(r"/branch[12]\.0/Conv$", n.name)]
    assert len(branch) == 19  # the first convolution of each branch: 5 in stage 2, 9 in stage 3, 5 in stage 4
    for conv in branch:
        quantized = conv.name in got.get(conv.input[0], ())
        assert quantized == (not conv.name.startswith("/stage4/")), conv.name
    assert not [t for t in got if t.startswith("/stage4/")]
    assert not [w for w in plan.weights if w.node.startswith("/stage4/") or w.node == "/fc/Gemm"]


def test_int8_data_movement_shares_one_scale_with_its_tensors() -> None:
    """YOLO's SPPF (MaxPool chain into a Concat) and the C2f Split/Concat ran INT8 copies: their inputs and
    outputs get one scale group, the Split outputs INT8 by commuting."""
    plan, _ = mirror("yolo_edgeq")
    sppf = ["/p5/p5.2/cv1/cv1.2/Mul_output_0", "/p5/p5.2/m/MaxPool_output_0", "/p5/p5.2/m_1/MaxPool_output_0",
            "/p5/p5.2/m_2/MaxPool_output_0", "/p5/p5.2/Concat_output_0"]
    assert {plan.group_of(t) for t in sppf} == {sppf[0]}
    assert "/stem/stem.2/Split_output_1" in plan.commuted
    assert plan.group_of("/stem/stem.2/Split_output_1") == plan.group_of("/stem/stem.2/Concat_output_0")
    amax = {t: float(i + 1) for i, t in enumerate(plan.activations)}
    shared = plan.scale_amax(amax)
    assert len({shared[t] for t in sppf}) == 1 and shared[sppf[0]] == max(amax[t] for t in sppf)


def test_any_batch_size_and_myelin_weight_copies_give_the_same_plan() -> None:
    """r50 at batch 8 and 64 (H200, edgeq's cleaned model) and batch 64 from the uncleaned export (41
    '_clone_N' Constant layers, 47 MyelinReformat 'Identity_N' weight copies): one plan."""
    want = sites(mirror("r50b64_edgeq")[0])
    others = (EDGEQ / "r50b8_edgeq.implicit.layers.json", FIXTURES / "trt86-h200/r50b64.implicit.layers.json")
    for path in others:
        plan, report = mirror("r50b64_edgeq", load_engine(path))
        assert sites(plan) == want, path.name
        assert report.unmapped == () and report.mapped_layers == report.named_layers == 56


def test_fused_names_and_foreign_nodes_without_metadata() -> None:
    """Without 8.6's Metadata the fused names carry the nodes: 'A + B', 'PWN(PWN(A), B)', and a Myelin
    '{ForeignNode[first...last]}' holds every node between first and last."""
    from dataclasses import replace

    layers = load_engine(ENGINES["effb0"][1])
    bare = replace(layers, layers=tuple(replace(lay, metadata="") for lay in layers.layers))
    assert sites(mirror("effb0", bare)[0]) == sites(mirror("effb0")[0])
    gate = next(i for i, lay in enumerate(layers.layers)
                if lay.name.startswith("PWN(PWN(/features/features.1/"))
    first, last = re.findall(r"\[ONNX Layer: (.*?)\]", layers.layers[gate].metadata)
    foreign = replace(layers.layers[gate], name=f"{{ForeignNode[{first}...{last}]}}", metadata="")
    myelin = replace(layers, layers=(*layers.layers[:gate], foreign, *layers.layers[gate + 1:]))
    assert sites(mirror("effb0", myelin)[0]) == sites(mirror("effb0")[0])
    # A '_clone_N' layer, and an unnamed layer between fc2 and the gate, which reads through it in INT8.
    fc2 = gate - 1
    assert layers.layers[fc2].name.endswith("/fc2/Conv")
    clone = replace(bare.layers[fc2], name=bare.layers[fc2].name + "_clone_1")
    unnamed = "(Unnamed Layer* 900) [Shuffle]"
    between = replace(layers.layers[fc2], name=unnamed, layer_type="Shuffle", metadata="",
                      inputs=layers.layers[fc2].outputs,
                      outputs=(replace(layers.layers[fc2].outputs[0], name=f"{unnamed}_output"),))
    reader = replace(layers.layers[gate], inputs=(between.outputs[0], *layers.layers[gate].inputs[1:]))
    odd = (*bare.layers[:fc2], clone, between, reader, *bare.layers[gate + 1:])
    plan, report = mirror("effb0", replace(layers, layers=odd))
    assert sites(plan) == sites(mirror("effb0")[0]) and report.unmapped == ()


def _with_strangers(tmp_path: Path) -> Path:
    """effb0's engine with one SE gate reading a tensor the model lacks, and a layer of a node it lacks."""
    layers = raw_layers(ENGINES["effb0"][1])
    gate = next(lay for lay in layers if lay["Name"].startswith("PWN(PWN(/features/features.1/"))
    gate["Inputs"][1]["Name"] = "/features/bogus/Mul_output_0"
    stranger = json.loads(json.dumps(gate))
    stranger.update(Name="/bogus/Conv", Metadata="[ONNX Layer: /bogus/Conv]")
    layers.append(stranger)
    path = tmp_path / "strangers.layers.json"
    path.write_text(json.dumps({"Layers": layers, "Bindings": ["input", "output"]}))
    return path


def test_unmapped_tensors_and_layers_are_listed_never_dropped(tmp_path, cli) -> None:
    path = _with_strangers(tmp_path)
    plan, report = mirror("effb0", load_engine(path))
    assert [(u.tensor, u.precision) for u in report.unmapped] == [("/features/bogus/Mul_output_0", "INT8")]
    assert "no layer writes it" in report.unmapped[0].reason
    assert report.unmapped_layers == ("/bogus/Conv",)
    assert "1 tensors unmapped (/features/bogus/Mul_output_0)" in report.summary_line()
    # the rest of the engine still mirrors: only the gate's feature-map edge is missing
    want = sites(mirror("effb0")[0])
    mul = "/features/features.1/features.1.0/block/block.1/Mul"
    assert {t: c - {mul} for t, c in sites(plan).items()} == {t: c - {mul} for t, c in want.items()}
    src = tmp_path / "effb0.onnx"
    onnx.save(zoo.skeleton(SKELETONS / "efficientnet_b0.skel.onnx"), src)
    code, _, err = cli("quantize", src, "--synthetic", "3", "--calibrator", "max", "--from-engine", path)
    assert code == 0
    assert "unmapped: /features/bogus/Mul_output_0 read INT8 by 'PWN(PWN(" in err
    assert "unmapped layer: /bogus/Conv" in err
    summary = json.loads((tmp_path / "effb0.int8.json").read_text())
    assert summary["mirror"]["unmapped"][0]["tensor"] == "/features/bogus/Mul_output_0"
    assert summary["mirror"]["unmapped_layers"] == ["/bogus/Conv"]


def test_another_models_engine_is_refused() -> None:
    for engine, other in (("mnv2", "effb0"), ("effb0", "mnv2"), ("shufflenet", "yolo_edgeq")):
        graph, _ = ENGINES[engine]
        with pytest.raises(QuantError, match=r"not of this model: \d+ of \d+ named layers map"):
            plan_from_engine(graph_from_model(prepared(graph)), load_engine(ENGINES[other][1]))


# --------------------------------------------------------------------------------------------------
# End to end: edgeq quantize --from-engine
# --------------------------------------------------------------------------------------------------


def _qdq_edges(model: onnx.ModelProto) -> dict[str, set[str]]:
    """Activation tensor -> the nodes reading its DequantizeLinear output (weights left out)."""
    inits = {i.name for i in model.graph.initializer}
    q_of = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    out: dict[str, set[str]] = {}
    for dq in (n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in q_of):
        src = q_of[dq.input[0]]
        if src in inits:
            continue
        readers = {n.name for n in model.graph.node if dq.output[0] in n.input}
        out.setdefault(src, set()).update(readers)
    return out


@pytest.fixture(scope="module")
def shufflenet_files(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("shufflenet")
    src = d / "shufflenet.onnx"
    onnx.save(zoo.skeleton(SKELETONS / "shufflenet_v2_x1_0.skel.onnx"), src)
    calib = d / "calib"
    calib.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        np.save(calib / f"{i}.npy", rng.standard_normal((1, 3, 224, 224)).astype(np.float32))
    return src, calib


def test_cli_quantize_from_engine_end_to_end(shufflenet_files, tmp_path, cli) -> None:
    import onnxruntime as ort

    src, calib = shufflenet_files
    out = tmp_path / "s.int8.onnx"
    code, stdout, err = cli("quantize", src, "--calib", calib, "--calibrator", "max", "-o", out,
                            "--from-engine", ENGINES["shufflenet"][1], "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["placement"] == "mirror"
    assert summary["mirror"]["int8_edges"] == 42 and summary["mirror"]["unmapped"] == []
    # 35 of the 42 are the branches the engine entered by quantizing float data movement in a reformat:
    # left float (float-entry), the 7 others (conv1, MaxPool, stage 2's first unit) placed as read.
    assert summary["mirror"]["float_entry_edges"] == 35 and len(summary["mirror"]["float_entry"]) == 11
    assert {"mirror-int8", "mirror-float", "mirror-inside-layer", "float-entry"} <= set(summary["rules"])
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    plan, _ = mirror("shufflenet", float_entry=True)
    exact, _ = mirror("shufflenet")
    got = _qdq_edges(model)
    assert got == sites(plan) and sum(len(c) for c in got.values()) == 7
    assert all(n in exact_consumers for t, cs in got.items() for n in cs
               for exact_consumers in [sites(exact)[t]])  # a subset of the engine's own edges
    weight_dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.attribute]
    assert len(weight_dqs) == len(plan.weights) == 6
    assert not [w for w in plan.weights if w.node.startswith(("/stage3/", "/stage4/"))]
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"input": np.load(calib / "0.npy")})
    assert y.shape == (1, 1000) and np.isfinite(y).all()
    assert summary["accuracy"]["outputs"][0]["cosine"] > 0.9
    code, stdout, _ = cli("quantize", src, "--calib", calib, "--calibrator", "max", "-o", tmp_path / "t.onnx",
                          "--from-engine", ENGINES["shufflenet"][1])
    assert code == 0 and "mirrored 42 INT8 edges" in stdout and "35 of the INT8 edges left float" in stdout


def _one_line_error(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    lines = [x for x in err.strip().splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]


def test_cli_from_engine_bad_input_exits_2_and_writes_nothing(shufflenet_files, tmp_path, cli) -> None:
    src, calib = shufflenet_files
    names = tmp_path / "names.json"
    names.write_text(json.dumps({"Layers": ["/conv1/conv1.0/Conv", "/maxpool/MaxPool"], "Bindings": []}))
    notjson = tmp_path / "x.json"
    notjson.write_text("Layers: no")
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps([{"count": 10}, {"name": "a", "averageMs": 0.1}]))
    cases = {
        EDGEQ / "yolo_edgeq.implicit.layers.json": "not of this model: 0 of 68 named layers map",
        tmp_path / "missing.json": "no such file",
        notjson: "not JSON",
        profile: "per-layer profile",
        names: "--profilingVerbosity=detailed",
        ZOO / "shufflenet.explicit.layers.json.gz": "explicit (Q/DQ) engine",
    }
    before = sorted(p.name for p in tmp_path.iterdir())
    for path, words in cases.items():
        code, _, err = cli("quantize", src, "--calib", calib, "-o", tmp_path / "o.onnx",
                           "--from-engine", path)
        _one_line_error(code, err, words)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    code, _, err = cli("quantize", src, "--calib", calib, "--placement", "all", "--from-engine",
                       ENGINES["shufflenet"][1], "-o", tmp_path / "o.onnx")
    _one_line_error(code, err, "--from-engine")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("engine", ["shufflenet_zoo2", "shufflenet", "resnet50"])
def test_tune_from_the_mirror_decides_both_ways(engine: str) -> None:
    """``edgeq tune``'s default start: the mirror as quantize places it; each site the rules place where the
    engine kept float can be tried INT8 (with its convolutions' weight DQs; a float-entry region's sites and
    weights as one decision), each tunable mirror site tried float, and no candidate changes the scale of a
    mirror site."""
    from edgeq.quant.decisions import RULES_INT8, candidate_plan, mirror_decisions
    from edgeq.quant.placement import plan_placement
    from edgeq.quant.regions import float_entry_regions

    graph = graph_from_model(prepared(ENGINES[engine][0]))
    rules = plan_placement(graph, "trt", float_entry=False)
    regions = float_entry_regions(graph, rules)
    m, _ = mirror(engine, float_entry=True)
    plan, decisions = mirror_decisions(m, rules, regions)
    start = candidate_plan(plan, decisions, {})
    assert start.sites == m.sites and start.weights == m.weights
    amax = {t: 1.0 + i for i, t in enumerate(plan.activations)}
    assert {t: a for t, a in plan.scale_amax(amax).items() if t in m.group_ids} == m.scale_amax(amax)
    added = [d for d in decisions if d.rule == RULES_INT8]
    kept_int8 = {s.tensor for s in m.sites} | set(m.commuted)
    assert sorted(t for d in added for t in d.sites) == sorted(
        s.tensor for s in rules.sites if s.tensor not in kept_int8)
    rules_weight = {w.node: w.tensor for w in rules.weights}
    for d in added:
        assert not d.start
        on = candidate_plan(plan, decisions, {d.id: True})
        assert set(on.tensors) == set(start.tensors) | set(d.sites)
        new_weights = {w.tensor for w in on.weights} - {w.tensor for w in start.weights}
        assert new_weights == set(d.weights)
        assert {rules_weight[c] for c in d.consumers if c in rules_weight} <= {w.tensor for w in on.weights}
    assert any(d.weights for d in added) == engine.startswith("shufflenet")  # convolutions implicit ran float
    # A float-entry region is tried INT8 whole: every weight of its convolutions comes with it.
    whole = [d for d in added if ":float-entry:" in d.id]
    assert bool(whole) == engine.startswith("shufflenet") and (len(regions) == 16) == bool(whole)
    for d in whole:
        region = next(r for r in regions if r.entries[0] in d.sites)
        assert set(d.sites) == set(region.sites) - {s.tensor for s in m.sites}
        on = candidate_plan(plan, decisions, {d.id: True})
        assert {rules_weight[n] for n in region.nodes if n in rules_weight} <= {w.tensor for w in on.weights}
    tunable = [d for d in decisions if d.rule != RULES_INT8]
    assert all(d.start and set(d.sites) <= {s.tensor for s in m.sites} for d in tunable)
