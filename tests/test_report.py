"""The fusion report on the real TensorRT 8.6 engines in tests/fixtures/trt86-h200.

Expected figures come from reading the fixture JSON (and fixtures/README.md): e.g. the ResNet-50
engines have 47 Constant layers and 47 weight copies ("Identity_N" MyelinReformat/Reformat into conv
biases), 53 convolutions + 1 Gemm, 16 residual blocks (3+4+6+3).
"""

from __future__ import annotations

import json
import re
from functools import cache

import numpy as np
import pytest
from conftest import FIXTURES

from edgeq.errors import ReportError
from edgeq.report import (
    POLICIES,
    LayerKind,
    apply_gate,
    build_report,
    load_layers,
    load_profile,
    render_html,
    report_to_dict,
)
from edgeq.report.layernames import nodes_from_metadata, split_layer_name
from edgeq.report.parse import parse_format

BLOCKS = [(li, b) for li, n in enumerate([3, 4, 6, 3], 1) for b in range(n)]  # ResNet-50's 16 blocks
RESIDUAL_ADDS = {f"/layer{li}/layer{li}.{b}/Add" for li, b in BLOCKS}


@cache
def report_of(stem: str, with_profile: bool = False):
    layers = load_layers(FIXTURES / f"{stem}.layers.json")
    profile = load_profile(FIXTURES / f"{stem}.profile.json") if with_profile else None
    return build_report(layers, profile)


def raw_text(stem: str) -> str:
    return (FIXTURES / f"{stem}.layers.json").read_text()


# --------------------------------------------------------------------------------------------------
# Formats and names
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "precision", "layout", "vector", "short"),
    [
        # every format string in the fixtures
        ("Row major linear FP32", "FP32", "linear", 1, "FP32 NCHW"),
        ("Row major linear FP16 format", "FP16", "linear", 1, "FP16 NCHW"),
        ("Row major Int8 format", "INT8", "linear", 1, "INT8 NCHW"),
        (
            "Thirty-two wide channel vectorized row major Int8 format",
            "INT8",
            "vectorized",
            32,
            "INT8 NC/32HW32",
        ),
        ("Channel major FP16 format where channel % 8 == 0", "FP16", "channel-last", 8, "FP16 NHWC8"),
        # others TensorRT 8.6 prints (trex activations.py lists them)
        ("Four wide channel vectorized row major Int8 format", "INT8", "vectorized", 4, "INT8 NC/4HW4"),
        ("Two wide channel vectorized row major FP16 format", "FP16", "vectorized", 2, "FP16 NC/2HW2"),
        ("Sixteen wide channel vectorized row major FP16 format", "FP16", "vectorized", 16, "FP16 NC/16HW16"),
        ("Channel major FP32 format", "FP32", "channel-last", 1, "FP32 NHWC"),
        ("Row major linear Int32", "INT32", "linear", 1, "INT32 NCHW"),
        ("Row major linear BOOL", "BOOL", "linear", 1, "BOOL NCHW"),
        ("Row major linear UInt8 format", "UINT8", "linear", 1, "UINT8 NCHW"),
        ("Channel major BFloat16 format where channel % 8 == 0", "BF16", "channel-last", 8, "BF16 NHWC8"),
        (
            "Thirty-two wide channel vectorized row major Int8 format with 3 spatial dimensions",
            "INT8",
            "vectorized",
            32,
            "INT8 NC/32DHW32",
        ),
    ],
)
def test_format_strings(raw, precision, layout, vector, short):
    f = parse_format(raw)
    assert (f.precision, f.layout, f.vector, f.short) == (precision, layout, vector, short)


def test_fixture_formats_are_all_understood():
    seen = set()
    for path in sorted(FIXTURES.glob("*.layers.json")):
        for lay in load_layers(path).layers:
            for t in lay.inputs + lay.outputs:
                assert t.format is not None and t.format.precision and t.format.layout != "unknown", t
                seen.add(t.format.raw)
    assert seen == {
        "Row major linear FP32",
        "Row major linear FP16 format",
        "Row major Int8 format",
        "Thirty-two wide channel vectorized row major Int8 format",
        "Channel major FP16 format where channel % 8 == 0",
    }


@pytest.mark.parametrize(
    ("name", "nodes"),
    [
        ("/conv1/Conv + /relu/Relu + /maxpool/MaxPool", ("/conv1/Conv", "/relu/Relu", "/maxpool/MaxPool")),
        ("PWN(PWN(/a/Sigmoid), /a/Mul)", ("/a/Sigmoid", "/a/Mul")),
        (
            "PWN(/layer1/layer1.0/Add, PWN(/layer1/layer1.0/relu_2/Relu))",
            ("/layer1/layer1.0/Add", "/layer1/layer1.0/relu_2/Relu"),
        ),
        ("Reformatting CopyNode for Input Tensor 0 to /conv1/Conv + /relu/Relu", ()),
        ("{ForeignNode[/blocks.0/MatMul.../blocks.3/Add]}", ("/blocks.0/MatMul", "/blocks.3/Add")),
        ("input_QuantizeLinear", ("input_QuantizeLinear",)),
    ],
)
def test_split_layer_name(name, nodes):
    assert split_layer_name(name) == nodes


def test_metadata_is_the_onnx_node_list():
    # Real 8.6 metadata, U+001E between the nodes (resnet50.implicit.layers.json layer 95).
    lay = load_layers(FIXTURES / "resnet50.implicit.layers.json").layers[95]
    assert "\x1e" in lay.metadata
    assert nodes_from_metadata(lay.metadata) == ("/conv1/Conv", "/relu/Relu", "/maxpool/MaxPool")
    assert nodes_from_metadata("[ONNX Layer: /fc/Gemm]\x1e[ONNX Layer: /fc/Gemm]\x1e") == ("/fc/Gemm",)


# --------------------------------------------------------------------------------------------------
# The engines
# --------------------------------------------------------------------------------------------------


def test_ortfb_explicit_all_int8_two_boundaries_one_interior_reformat():
    r = report_of("resnet50_ortfb.explicit")
    assert r.mode == "explicit"
    assert len(r.layers) == 170
    assert r.kind_counts() == {"weights": 94, "reformat": 3, "compute": 72, "no-op": 1}
    assert r.compute_precisions() == {"INT8": 72}  # every compute layer INT8
    b = {rl.name: (rl.boundary, rl.formats) for rl in r.boundary_reformats()}
    assert b == {
        "input_QuantizeLinear": ("input", "FP32 NCHW -> INT8 NCHW"),
        "output_DequantizeLinear": ("output", "INT8 NCHW -> FP32 NCHW"),
    }
    assert r.summary_line() == (
        "explicit, 170 layers, compute 72 INT8, 2 boundary + 1 interior reformats, 16 unfused residual Adds"
    )
    [interior] = r.interior_reformats()
    assert interior.index == 167
    assert interior.formats == "INT8 NC/32HW32 -> INT8 NCHW"
    assert interior.name.startswith("Reformatting CopyNode for Input Tensor 0 to copied_squeeze_after_")
    # ... right before the final squeeze (a NoOp) behind the fc Gemm
    assert r.layers[166].onnx_nodes == ("/fc/Gemm",) and r.layers[168].kind == LayerKind.NOOP
    # onnxruntime's placement: stem Conv+Relu and MaxPool stay separate layers
    assert r.layers[95].onnx_nodes == ("/conv1/Conv", "/relu/Relu")
    assert r.layers[96].onnx_nodes == ("/maxpool/MaxPool",)


def test_ortfb_lists_the_16_unfused_residual_add_relu_layers():
    r = report_of("resnet50_ortfb.explicit")
    assert len(r.unfused_residuals) == 16
    adds = set()
    for u in r.unfused_residuals:
        rl = r.layers[u.add_layer]
        assert rl.layer_type == "PointWiseV2" and rl.precision == "INT8"
        assert rl.onnx_ops == ("Add", "Relu")  # Add and its Relu fused together, but not into the conv
        assert u.activation_layer is None
        adds.add(rl.onnx_nodes[0])
    assert adds == RESIDUAL_ADDS


def test_r50b64_ortfb_last_add_and_relu_are_two_layers():
    r = report_of("r50b64_ortfb.explicit")
    assert len(r.unfused_residuals) == 16
    last = r.unfused_residuals[-1]
    assert r.layers[last.add_layer].name == "PWN(/layer4/layer4.2/Add)"
    assert r.layers[last.activation_layer].name == "PWN(/layer4/layer4.2/relu_2/Relu)"


def test_implicit_convolutions_ran_fp16_only_the_stem_int8():
    r = report_of("resnet50.implicit")
    assert r.mode == "implicit"
    compute = r.of_kind(LayerKind.COMPUTE)
    assert r.compute_precisions() == {"INT8": 1, "FP16": 54}
    [int8] = [rl for rl in compute if rl.precision == "INT8"]
    assert int8.layer_type == "CaskConvActPool"
    assert int8.onnx_nodes == ("/conv1/Conv", "/relu/Relu", "/maxpool/MaxPool")
    fp16_convs = [rl for rl in compute if rl.precision == "FP16" and "Conv" in rl.onnx_ops]
    assert len(fp16_convs) == 52  # the other 52 of ResNet-50's 53 convolutions
    assert {rl.layer_type for rl in fp16_convs} == {"CaskConvolution", "CaskGemmConvolution"}
    # the residual Adds fused into convolutions (implicit mode fuses them): none left over
    assert r.unfused_residuals == ()
    assert {n for rl in compute for n in rl.onnx_nodes if n.endswith("/Add")} == RESIDUAL_ADDS
    # a copy from the INT8 stem into FP16, and the two boundary copies
    assert [(rl.index, rl.formats) for rl in r.interior_reformats()] == [(96, "INT8 NC/32HW32 -> FP16 NHWC8")]
    assert [(rl.index, rl.boundary) for rl in r.boundary_reformats()] == [(94, "input"), (151, "output")]
    # 6 of the weight copies are Reformat (CAST) layers, not MyelinReformat: still weights
    casts = [rl for rl in r.of_kind(LayerKind.WEIGHTS) if rl.layer_type == "Reformat"]
    assert len(casts) == 6 and all(rl.layer.origin == "CAST" for rl in casts)


@pytest.mark.parametrize("stem", ["resnet50_placed.explicit", "r50b64_placed.explicit"])
def test_placed_fully_fused_but_16_fp32_identity_copies_and_one_interior_reformat(stem):
    r = report_of(stem)
    assert len(r.layers) == 153
    assert r.compute_precisions() == {"INT8": 55}
    stem_layer = next(rl for rl in r.layers if rl.layer_type == "CaskConvActPool")
    assert stem_layer.onnx_nodes == ("/conv1/Conv", "/relu/Relu", "/maxpool/MaxPool")
    assert r.unfused_residuals == ()
    fused_adds = {
        n
        for rl in r.of_kind(LayerKind.COMPUTE)
        if rl.layer_type == "CaskConvolution"
        for n in rl.onnx_nodes
        if n.endswith("/Add")
    }
    assert fused_adds == RESIDUAL_ADDS  # all 16 residual Adds inside convolutions
    identity_reformats = [
        rl for rl in r.layers if rl.layer_type == "Reformat" and rl.name.startswith("Identity_")
    ]
    if stem.startswith("resnet50"):  # README: "still 16 FP32 Identity_N reformats"
        assert len(identity_reformats) == 16
    assert all(
        rl.kind == LayerKind.WEIGHTS and rl.formats == "FP32 NCHW -> FP32 NCHW" for rl in identity_reformats
    )
    assert [rl.formats for rl in r.interior_reformats()] == ["INT8 NC/32HW32 -> INT8 NCHW"]
    assert {rl.name for rl in r.boundary_reformats()} == {"input_QuantizeLinear", "output_DequantizeLinear"}


def test_r50b64_implicit_all_int8():
    r = report_of("r50b64.implicit")
    assert r.compute_precisions() == {"INT8": 55}
    assert r.interior_reformats() == []
    fc = next(rl for rl in r.layers if rl.onnx_nodes == ("/fc/Gemm",) and rl.kind == LayerKind.COMPUTE)
    assert fc.in_precisions == ("INT8",) and fc.out_precisions == ("FP32",)  # INT8 math, FP32 result


# --------------------------------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stem", ["resnet50_ortfb.explicit", "resnet50.implicit", "r50b64_placed.explicit"])
def test_profile_join(stem):
    profile = load_profile(FIXTURES / f"{stem}.profile.json")
    raw = json.loads((FIXTURES / f"{stem}.profile.json").read_text())
    assert profile.iterations == raw[0]["count"] and len(profile.layers) == len(raw) - 1
    r = report_of(stem, with_profile=True)
    assert r.unmatched_profile == ()
    assert all(rl.time_ms is not None for rl in r.layers)  # every layer timed
    total = sum(rl.time_ms for rl in r.layers)
    assert total == pytest.approx(r.profile_total_ms) == pytest.approx(profile.total_ms)
    assert sum(t.percentage for t in profile.layers) == pytest.approx(100.0, abs=0.01)
    for rl, t in zip(r.layers, profile.layers):
        assert rl.name == t.name
        assert 100.0 * rl.time_ms / total == pytest.approx(t.percentage, abs=0.01)
    # constants and no-ops take no time per inference; the "Identity_N" weight copies do (measured)
    assert all(rl.time_ms == 0 for rl in r.layers if rl.layer_type in ("Constant", "NoOp"))
    copies = [rl for rl in r.of_kind(LayerKind.WEIGHTS) if rl.layer_type != "Constant"]
    assert len(copies) == 47 and all(rl.time_ms > 0.003 for rl in copies)
    by_kind = r.time_by_kind()
    assert sum(by_kind.values()) == pytest.approx(total)
    assert by_kind["weights"] == pytest.approx(sum(rl.time_ms for rl in copies))
    assert any(n.startswith("47 weight-copy layers") for n in r.notes)


def test_edgeq_agent_profile_format():
    trt = json.loads((FIXTURES / "resnet50_ortfb.explicit.profile.json").read_text())
    agent = {
        "format": "edgeq-profile",
        "version": 1,
        "iterations": 200,
        "layers": [{"name": d["name"], "averageMs": d["averageMs"]} for d in trt[1:]],
        "latencyMs": {"p50": 0.8},
    }
    p = load_profile(agent)
    assert p.producer == "edgeq" and p.iterations == 200
    r = build_report(load_layers(FIXTURES / "resnet50_ortfb.explicit.layers.json"), p)
    assert r.profile_total_ms == pytest.approx(report_of("resnet50_ortfb.explicit", True).profile_total_ms)
    del agent["layers"][3]["averageMs"]
    with pytest.raises(ReportError, match=r'layers\[3\]: missing key "averageMs"'):
        load_profile(agent)
    with pytest.raises(ReportError, match='missing key "layers"'):
        load_profile({"Layers": []})


def test_profile_from_another_engine_is_noted():
    r = build_report(
        load_layers(FIXTURES / "resnet50.implicit.layers.json"),
        load_profile(FIXTURES / "resnet50_ortfb.explicit.profile.json"),
    )
    assert len(r.unmatched_profile) > 50
    assert any("different engine" in n for n in r.notes)


# --------------------------------------------------------------------------------------------------
# Python inspector form
# --------------------------------------------------------------------------------------------------


def test_python_inspector_json_string_is_the_same_report():
    # IEngineInspector.get_engine_information(LayerInformationFormat.JSON) returns the JSON as a str;
    # trtexec --exportLayerInfo writes that same string to a file (TensorRT samples/common/
    # sampleInference.cpp, printLayerInfo). So the string, handed over directly, gives the same report.
    text = raw_text("resnet50_ortfb.explicit")
    r = build_report(load_layers(text))
    assert r.source == "<text>"
    assert report_to_dict(r)["layers"] == report_to_dict(report_of("resnet50_ortfb.explicit"))["layers"]
    assert build_report(load_layers(text.encode())).compute_precisions() == {"INT8": 72}


def test_python_inspector_layer_names_only():
    # Built with ProfilingVerbosity.LAYER_NAMES_ONLY (the builder's default), "Layers" holds only the
    # names (TensorRT Python API docs, EngineInspector; trex parser.py rejects that form).
    full = json.loads(raw_text("resnet50.implicit"), strict=False)
    names_only = {"Layers": [lay["Name"] for lay in full["Layers"]], "Bindings": full["Bindings"]}
    engine = load_layers(json.dumps(names_only))
    assert not engine.detailed and len(engine) == 153
    r = build_report(engine)
    assert not r.detailed and {rl.kind for rl in r.layers} == {LayerKind.UNKNOWN}
    assert r.layers[95].onnx_nodes == ("/conv1/Conv", "/relu/Relu", "/maxpool/MaxPool")  # from the name
    assert "DETAILED" in r.notes[0]
    d = report_to_dict(r)
    assert json.loads(json.dumps(d)) == d and d["summary"]["kinds"] == {"unknown": 153}
    assert "DETAILED" in render_html(r)
    with pytest.raises(ReportError, match="LAYER_NAMES_ONLY") as e:
        apply_gate(r, POLICIES["int8"])
    assert "detailed" in (e.value.hint or "")
    assert apply_gate(r, POLICIES["none"])  # report-only still works


def test_without_bindings_boundaries_come_from_the_graph():
    # TensorRT before 8.6 wrote no "Bindings" (trex parser.py); infer inputs/outputs from the layers.
    full = json.loads(raw_text("resnet50_ortfb.explicit"), strict=False)
    del full["Bindings"]
    r = build_report(load_layers(full))
    assert r.network_inputs == ("input",) and r.network_outputs == ("output",)
    assert {rl.index for rl in r.boundary_reformats()} == {47, 169}
    assert [rl.index for rl in r.interior_reformats()] == [167]


def test_without_execution_context_formats_are_unknown():
    # Without inspector.execution_context, format information is not shown for shape-dependent
    # tensors (TensorRT C++ API, IEngineInspector::setExecutionContext).
    full = json.loads(raw_text("resnet50_ortfb.explicit"), strict=False)
    for t in full["Layers"][100]["Inputs"] + full["Layers"][100]["Outputs"]:
        del t["Format/Datatype"]
    r = build_report(load_layers(full))
    assert r.layers[100].precision is None
    assert r.compute_precisions() == {"INT8": 71, "unknown": 1}


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------


def test_bad_layer_files(tmp_path):
    with pytest.raises(ReportError, match="no such file"):
        load_layers(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ReportError, match="not JSON"):
        load_layers(tmp_path / "bad.json")
    with pytest.raises(ReportError, match='missing key "Layers"'):
        load_layers('{"layers": []}')
    with pytest.raises(ReportError, match="per-layer profile"):
        load_layers(FIXTURES / "resnet50_ortfb.explicit.profile.json")
    full = json.loads(raw_text("resnet50_ortfb.explicit"), strict=False)
    del full["Layers"][95]["LayerType"]
    with pytest.raises(ReportError, match=r'Layers\[95\].*missing key "LayerType"'):
        load_layers(full)
    del full["Layers"][96]["Inputs"][0]["Name"]
    full["Layers"][95]["LayerType"] = "CaskConvolution"
    with pytest.raises(ReportError, match=r'Layers\[96\].*Inputs\[0\]: missing key "Name"'):
        load_layers(full)
    with pytest.raises(ReportError, match='"Layers" is empty'):
        load_layers({"Layers": [], "Bindings": []})


# --------------------------------------------------------------------------------------------------
# ONNX mapping
# --------------------------------------------------------------------------------------------------


def resnet50_like(qdq: bool):
    """ResNet-50's graph with torchvision's node names (what the fixture engines were built from),
    4 channels and 1x1 kernels so it is tiny; ``qdq`` adds onnxruntime-named Q/DQ pairs."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    c = 4
    nodes, inits = [], []

    def weight(name, shape):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name))
        return name

    def node(op, name, inputs, out=None, **attrs):
        out = out or f"{name}_output_0"
        nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def q(t):
        if not qdq:
            return t
        qo = node("QuantizeLinear", f"{t}_QuantizeLinear", [t, "s", "zp"], out=f"{t}_QuantizeLinear_Output")
        return node(
            "DequantizeLinear", f"{t}_DequantizeLinear", [qo, "s", "zp"], out=f"{t}_DequantizeLinear_Output"
        )

    def conv(name, x):
        return node("Conv", name, [x, weight(f"{name}.w", [c, c, 1, 1]), weight(f"{name}.b", [c])])

    x = q("input")
    x = q(node("Relu", "/relu/Relu", [conv("/conv1/Conv", x)]))
    x = q(node("MaxPool", "/maxpool/MaxPool", [x], kernel_shape=[1, 1]))
    for li, b in BLOCKS:
        p = f"/layer{li}/layer{li}.{b}"
        y = q(node("Relu", f"{p}/relu/Relu", [conv(f"{p}/conv1/Conv", x)]))
        y = q(node("Relu", f"{p}/relu_1/Relu", [conv(f"{p}/conv2/Conv", y)]))
        y = q(conv(f"{p}/conv3/Conv", y))
        skip = q(conv(f"{p}/downsample/downsample.0/Conv", x)) if b == 0 else x
        x = q(node("Relu", f"{p}/relu_2/Relu", [node("Add", f"{p}/Add", [y, skip])]))
    x = q(node("GlobalAveragePool", "/avgpool/GlobalAveragePool", [x]))
    x = node("Flatten", "/Flatten", [x], axis=1)
    gemm_out = "output_QuantizeLinear_Input" if qdq else "output"
    x = node(
        "Gemm", "/fc/Gemm", [x, weight("fc.weight", [10, c]), weight("fc.bias", [10])], out=gemm_out, transB=1
    )
    if qdq:
        qo = node(
            "QuantizeLinear", "output_QuantizeLinear", [x, "s", "zp"], out="output_QuantizeLinear_Output"
        )
        node("DequantizeLinear", "output_DequantizeLinear", [qo, "s", "zp"], out="output")
        inits += [
            helper.make_tensor("s", TensorProto.FLOAT, [], [0.05]),
            helper.make_tensor("zp", TensorProto.INT8, [], [0]),
        ]
    graph = helper.make_graph(
        nodes,
        "resnet50_like",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, c, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 10])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_onnx_mapping_explicit(tmp_path):
    import onnx

    path = tmp_path / "resnet50_ortfb.onnx"
    onnx.save(resnet50_like(qdq=True), str(path))
    r = build_report(load_layers(FIXTURES / "resnet50_ortfb.explicit.layers.json"), onnx_model=path)
    m = r.onnx
    assert m is not None and m.unknown == ()
    ran = m.by_precision()
    assert set(ran) == {"INT8"}
    ops = {n.name: n.op_type for n in m.nodes}
    counts = {}
    for n in ran["INT8"]:
        counts[ops[n]] = counts.get(ops[n], 0) + 1
    assert counts == {"Conv": 53, "Relu": 49, "MaxPool": 1, "Add": 16, "GlobalAveragePool": 1, "Gemm": 1}
    assert m.in_kind(LayerKind.REFORMAT) == ["input_QuantizeLinear", "output_DequantizeLinear"]
    # everything else vanished: the Q/DQ pairs TensorRT fused into the INT8 kernels, and the Flatten
    assert {op for _, op in m.not_found} == {"QuantizeLinear", "DequantizeLinear", "Flatten"}
    assert len(m.not_found) == sum(1 for n in resnet50_like(True).graph.node) - len(m.nodes)
    d = report_to_dict(r)["onnx"]
    assert (
        len(d["by_precision"]["INT8"]) == 121 and {"name": "/Flatten", "op_type": "Flatten"} in d["not_found"]
    )


def test_onnx_mapping_implicit_fp16():
    r = build_report(
        load_layers(FIXTURES / "resnet50.implicit.layers.json"), onnx_model=resnet50_like(qdq=False)
    )
    ran = r.onnx.by_precision()
    assert ran["INT8"] == ["/conv1/Conv", "/relu/Relu", "/maxpool/MaxPool"]
    assert len(ran["FP16"]) == 52 + 48 + 16 + 2  # convs, relus, adds, avgpool + fc
    assert r.onnx.not_found == (("/Flatten", "Flatten"),)


def test_onnx_mismatch_is_noted():
    model = resnet50_like(qdq=False)
    for n in model.graph.node:
        n.name = "other" + n.name
    r = build_report(load_layers(FIXTURES / "resnet50.implicit.layers.json"), onnx_model=model)
    assert len(r.onnx.nodes) == 0 and len(r.onnx.unknown) > 100
    assert any("different model" in n for n in r.notes)


# --------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------


def hostile_engine():
    """The ortfb engine with a layer name full of what breaks HTML and terminals."""
    full = json.loads(raw_text("resnet50_ortfb.explicit"), strict=False)
    bad = '<script>alert("x")</script>\x1e\x1b[31m&amp;'
    full["Layers"][167]["Name"] = "Reformatting CopyNode " + bad
    return load_layers(full), bad


def test_json_round_trips_with_control_characters():
    r = report_of("resnet50_ortfb.explicit", True)
    d = report_to_dict(r, apply_gate(r, POLICIES["int8"]))
    text = json.dumps(d)
    assert json.loads(text) == d  # strict parse: control characters escaped in the output
    assert "\x1e" in d["layers"][95]["metadata"]  # kept, not mangled
    assert d["summary"]["interior_reformats"] == [167] and d["gate"]["passed"] is False
    engine, bad = hostile_engine()
    d2 = report_to_dict(build_report(engine))
    assert json.loads(json.dumps(d2)) == d2 and d2["layers"][167]["name"].endswith(bad)


def test_html_is_self_contained_and_escaped():
    engine, _ = hostile_engine()
    r = build_report(engine, load_profile(FIXTURES / "resnet50_ortfb.explicit.profile.json"))
    g = apply_gate(r, POLICIES["int8"])
    page = render_html(r, g)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert not re.search(r"(src|href)\s*=|url\(|@import|<link|https?://", page)  # no external assets
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", page)  # no raw control characters
    assert '<span class="ctl">\\x1e</span>' in page and '<span class="ctl">\\x1b</span>' in page
    assert "&amp;amp;" in page
    # precision colours and time bars
    assert page.count('style="background:#2e7d32">INT8') >= 72
    # one time bar per timed layer: the renamed layer 167 no longer matches its profile entry
    assert len(re.findall(r'class="bar" style="width:[\d.]+px"', page)) == 169
    assert r.layers[167].time_ms is None and len(r.unmatched_profile) == 1
    assert "FAILED" in page and "interior-reformat" in page


def test_html_where_the_time_goes_adds_up_with_a_row_for_weight_copies():
    """ResNet-50 (onnxruntime's QDQ export): its 47 weight-copy layers take 16.9% of the profiled time
    (the report's note); the shares left them out and read 97.6% + 2.4%."""
    r = report_of("resnet50_ortfb.explicit", with_profile=True)
    page = render_html(r, apply_gate(r, POLICIES["int8"]))
    section = page[page.index("<h2>Where the time goes</h2>"):]
    section = section[: section.index("</table>")]
    rows = re.findall(r"</span> ([^<]+)</td><td>(\d+)</td><td>([\d.]+) µs</td><td>([\d.]+)%</td>", section)
    shares = {label: float(pct) for label, _, _, pct in rows}
    assert abs(sum(shares.values()) - 100.0) <= 0.3, shares
    copies = [rl for rl in r.layers if rl.kind == LayerKind.WEIGHTS and rl.time_ms]
    (counted,) = [int(n) for label, n, _, _ in rows if label == "weight copies"]
    assert counted == len(copies) == 47
    note = next(n for n in r.notes if "weight-copy layers" in n)
    assert f"{shares['weight copies']:.1f}% of the profiled time" in note  # the note and the table agree
    total_us = sum(float(us) for _, _, us, _ in rows)
    assert abs(total_us - r.profile_total_ms * 1000) <= 0.05 * len(rows)


def test_cli_html_never_overwrites_an_input_and_refuses_a_directory(tmp_path, cli):
    # QA: `--html layers.json` overwrote the engine's layer file with HTML; `--html DIR` was a traceback.
    import shutil

    layers = tmp_path / "layers.json"
    shutil.copy(FIXTURES / "resnet50_ortfb.explicit.layers.json", layers)
    before = layers.read_bytes()
    code, out, err = cli("report", layers, "--html", layers, "--gate", "none")
    assert code == 2 and "input" in err and len(err.strip().splitlines()) == 1, (out, err)
    assert layers.read_bytes() == before
    (tmp_path / "out").mkdir()
    code, out, err = cli("report", layers, "--html", tmp_path / "out")
    assert code == 2 and "directory" in err and "Traceback" not in out + err
    assert list((tmp_path / "out").iterdir()) == []
