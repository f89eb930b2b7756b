"""The precision gate and `edgeq report` on the real TensorRT 8.6 engines (tests/fixtures/trt86-h200)."""

from __future__ import annotations

import json
from functools import cache

import pytest
from conftest import FIXTURES

from edgeq.errors import ConfigError, ReportError
from edgeq.report import POLICIES, RULES, apply_gate, build_report, load_layers, policy_from_dict

INT8 = POLICIES["int8"]
FUSION = INT8.replace(require_fusion=True)


@cache
def report_of(stem: str):
    return build_report(load_layers(FIXTURES / f"{stem}.layers.json"))


def layers_file(stem: str) -> str:
    return str(FIXTURES / f"{stem}.layers.json")


# --------------------------------------------------------------------------------------------------
# Verdicts on the real engines
# --------------------------------------------------------------------------------------------------


def test_ortfb_fails_on_exactly_the_interior_reformat():
    g = apply_gate(report_of("resnet50_ortfb.explicit"), INT8)
    assert not g and g.passed is False
    [v] = g.violations
    assert (v.rule, v.layer, v.layer_type) == ("interior-reformat", 167, "Reformat")
    assert "INT8 NC/32HW32 -> INT8 NCHW" in v.message
    assert g.offending_layers == (167,)
    assert g.boundary_reformats == 2  # input_QuantizeLinear and output_DequantizeLinear pass
    assert g.int8_compute == 72 and g.checked == 73
    text = str(g)
    assert text.startswith("gate int8: FAILED on 1 layer (1 interior-reformat)")
    assert "#167 Reformat 'Reformatting CopyNode for Input Tensor 0 to copied_squeeze_after_" in text


def test_require_fusion_fails_on_the_16_unfused_residuals():
    r = report_of("resnet50_ortfb.explicit")
    g = apply_gate(r, FUSION)
    by_rule = g.by_rule()
    assert len(by_rule["unfused-residual"]) == 16 and len(by_rule["interior-reformat"]) == 1
    assert {v.nodes[0] for v in by_rule["unfused-residual"]} == {
        f"/layer{li}/layer{li}.{b}/Add" for li, n in enumerate([3, 4, 6, 3], 1) for b in range(n)
    }
    # the fusion policy alone: only the residuals
    only = apply_gate(r, POLICIES["fusion"])
    assert {v.rule for v in only.violations} == {"unfused-residual"} and len(only.violations) == 16
    # without the opt-in the same engine's residuals do not fail
    assert "unfused-residual" not in apply_gate(r, INT8).by_rule()


def test_require_fusion_names_the_separate_relu_too():
    g = apply_gate(report_of("r50b64_ortfb.explicit"), POLICIES["fusion"])
    assert len(g.violations) == 17  # 16 Adds + the last block's Relu, split into its own layer
    assert g.violations[-1].layer_name == "PWN(/layer4/layer4.2/relu_2/Relu)"


def test_implicit_fails_on_the_fp16_convolutions():
    g = apply_gate(report_of("resnet50.implicit"), INT8)
    by_rule = g.by_rule()
    compute = by_rule["int8-compute"]
    assert len(compute) == 54
    assert all("runs FP16" in v.message for v in compute)
    convs = [v for v in compute if any(n.endswith("Conv") for n in v.nodes)]
    assert len(convs) == 52
    assert "/conv1/Conv" not in {n for v in compute for n in v.nodes}  # the INT8 stem passes
    assert [v.layer for v in by_rule["interior-reformat"]] == [96]
    assert g.int8_compute == 1


@pytest.mark.parametrize("stem", ["resnet50_placed.explicit", "r50b64_placed.explicit"])
def test_placed_fails_only_on_the_interior_reformat(stem):
    r = report_of(stem)
    for policy in (INT8, FUSION):
        g = apply_gate(r, policy)
        assert [(v.rule, v.layer) for v in g.violations] == [("interior-reformat", 150)]


def test_r50b64_implicit_passes():
    g = apply_gate(report_of("r50b64.implicit"), FUSION)
    assert g and g.violations == ()
    assert str(g) == "gate int8: passed (55 layers checked, 55 INT8 compute, 1 boundary reformat allowed)"


def test_gate_none_only_reports():
    g = apply_gate(report_of("resnet50.implicit"), POLICIES["none"])
    assert g and "not applied" in str(g)


# --------------------------------------------------------------------------------------------------
# Allowlist and policies as data
# --------------------------------------------------------------------------------------------------


def test_allowlist_by_onnx_node_name():
    r = report_of("resnet50.implicit")
    g = apply_gate(r, INT8.with_allow(["/layer*", "/avgpool/GlobalAveragePool", "/fc/Gemm"]))
    assert [(v.rule, v.layer) for v in g.violations] == [("interior-reformat", 96)]
    assert len(g.allowed) == 54 and {v.allowed_by for v in g.allowed} == {
        "/layer*",
        "/avgpool/GlobalAveragePool",
        "/fc/Gemm",
    }
    # the reformat copies the stem's output: allowed through the node it copies for
    g2 = apply_gate(r, INT8.with_allow(["/layer*", "/avgpool/*", "/fc/*", "/conv1/Conv"]))
    assert g2 and len(g2.allowed) == 55
    assert "55 excused by --allow" in str(g2)


def test_every_rule_cites_a_source():
    for rule in RULES.values():
        assert rule.source and ("fixtures" in rule.source or "docs/" in rule.source or "API" in rule.source)
    for p in POLICIES.values():
        assert p.source
        assert all(r.id in RULES for r in p.rules)


def test_policy_from_dict():
    p = policy_from_dict({"policy": "int8", "require_fusion": True, "allow": ["/head/*"]})
    assert p.name == "int8" and p.require_fusion and p.allow == ("/head/*",)
    assert {r.id for r in p.rules} == {
        "int8-compute",
        "unknown-precision",
        "interior-reformat",
        "unfused-residual",
    }
    assert policy_from_dict(None) == INT8
    assert policy_from_dict({"gate": "none"}).checks_anything is False
    assert policy_from_dict({"allow": "/fc/Gemm"}).allow == ("/fc/Gemm",)
    # a target YAML's gate section drives the gate
    g = apply_gate(
        report_of("resnet50_ortfb.explicit"),
        policy_from_dict({"allow": ["Reformatting CopyNode for Input Tensor 0 to copied_squeeze_after_*"]}),
    )
    assert g and len(g.allowed) == 1
    with pytest.raises(ConfigError, match="unknown key 'alow'"):
        policy_from_dict({"alow": ["x"]})
    with pytest.raises(ConfigError, match="unknown policy 'fp16'"):
        policy_from_dict({"policy": "fp16"})
    with pytest.raises(ConfigError, match="require_fusion"):
        policy_from_dict({"require_fusion": "yes"})
    with pytest.raises(ConfigError, match="allow"):
        policy_from_dict({"allow": [1, 2]})


def test_unknown_precision_fails_the_int8_gate():
    full = json.loads((FIXTURES / "resnet50_ortfb.explicit.layers.json").read_text(), strict=False)
    for t in full["Layers"][100]["Inputs"]:
        del t["Format/Datatype"]
    g = apply_gate(build_report(load_layers(full)), INT8)
    assert [(v.rule, v.layer) for v in g.violations] == [
        ("unknown-precision", 100),
        ("interior-reformat", 167),
    ]


def test_names_only_engine_cannot_be_gated():
    full = json.loads((FIXTURES / "resnet50_ortfb.explicit.layers.json").read_text(), strict=False)
    r = build_report(load_layers({"Layers": [x["Name"] for x in full["Layers"]]}))
    with pytest.raises(ReportError, match="LAYER_NAMES_ONLY"):
        apply_gate(r, INT8)


# --------------------------------------------------------------------------------------------------
# The CLI
# --------------------------------------------------------------------------------------------------


def test_cli_exit_1_names_the_offending_layer(cli):
    code, out, err = cli("report", layers_file("resnet50_ortfb.explicit"))
    assert code == 1, err
    assert "gate int8: FAILED on 1 layer" in out
    assert "#167 Reformat 'Reformatting CopyNode for Input Tensor 0 to copied_squeeze_after_" in out
    code, out, _ = cli("report", layers_file("resnet50_ortfb.explicit"), "--require-fusion")
    assert code == 1 and "16 unfused-residual" in out and "/layer1/layer1.0/Add" in out


def test_cli_exit_1_on_implicit_fp16(cli):
    code, out, _ = cli(
        "report",
        layers_file("resnet50.implicit"),
        "--profile",
        str(FIXTURES / "resnet50.implicit.profile.json"),
    )
    assert code == 1
    assert "54 int8-compute" in out and "runs FP16" in out
    assert "sum of per-layer averages" in out


def test_cli_exit_0(cli):
    code, out, err = cli("report", layers_file("r50b64.implicit"))
    assert code == 0, err + out
    assert "gate int8: passed" in out
    code, out, _ = cli("report", layers_file("resnet50.implicit"), "--gate", "none")
    assert code == 0 and "not applied" in out
    code, _, _ = cli(
        "report", layers_file("resnet50_placed.explicit"), "--allow", "Reformatting CopyNode*copied_squeeze*"
    )
    assert code == 0


def test_cli_json_and_html(cli, tmp_path):
    html = tmp_path / "out" / "report.html"
    code, out, _ = cli(
        "report",
        layers_file("resnet50_ortfb.explicit"),
        "--profile",
        str(FIXTURES / "resnet50_ortfb.explicit.profile.json"),
        "--json",
        "--html",
        str(html),
    )
    assert code == 1
    d = json.loads(out)
    assert d["exit_code"] == 1 and d["gate"]["passed"] is False
    assert [v["layer"] for v in d["gate"]["violations"]] == [167]
    assert d["summary"]["compute_precisions"] == {"INT8": 72}
    assert d["profile"]["iterations"] == 3156
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "interior-reformat" in page
    assert not list(html.parent.glob(".*.tmp"))  # atomic write left nothing behind


def test_cli_bad_input_exit_2(cli, tmp_path):
    code, _, err = cli("report", str(tmp_path / "nope.json"))
    assert code == 2 and "no such file" in err and "Traceback" not in err
    (tmp_path / "x.json").write_text("this is not json")
    code, _, err = cli("report", str(tmp_path / "x.json"))
    assert code == 2 and "not JSON" in err
    (tmp_path / "y.json").write_text('{"Bindings": ["input"]}')
    code, _, err = cli("report", str(tmp_path / "y.json"))
    assert code == 2 and 'missing key "Layers"' in err
    code, _, err = cli("report", str(FIXTURES / "resnet50_ortfb.explicit.profile.json"))
    assert code == 2 and "--profile" in err
    code, _, err = cli(
        "report", layers_file("resnet50_ortfb.explicit"), "--profile", str(tmp_path / "y.json")
    )
    assert code == 2 and 'missing key "layers"' in err
    code, _, err = cli("report", layers_file("resnet50_ortfb.explicit"), "--gate", "fp16")
    assert code == 2 and "unknown gate" in err
    names_only = tmp_path / "names.json"
    names_only.write_text(json.dumps({"Layers": ["a", "b"], "Bindings": []}))
    code, _, err = cli("report", str(names_only))
    assert code == 2 and "LAYER_NAMES_ONLY" in err and "detailed" in err
    assert cli("report", str(names_only), "--gate", "none")[0] == 0


def test_cli_never_prints_raw_control_characters(cli, tmp_path):
    full = json.loads((FIXTURES / "resnet50_ortfb.explicit.layers.json").read_text(), strict=False)
    full["Layers"][167]["Name"] = "evil\x1b[2J\x1e[b]name"
    path = tmp_path / "evil.layers.json"
    path.write_text(json.dumps(full))
    code, out, _ = cli("report", str(path), "--all-layers")
    assert code == 1
    assert "\x1b" not in out and "\x1e" not in out
    assert "evil\\x1b[2J\\x1e[b]name" in out.replace("\n", "")


# --------------------------------------------------------------------------------------------------
# The INT8 region on small hand-made engines (the shapes TensorRT prints, fewer layers)
# --------------------------------------------------------------------------------------------------

F32, I8, I8V = (
    "Row major linear FP32",
    "Row major Int8 format",
    "Thirty-two wide channel vectorized row major Int8 format",
)


def engine(*specs):
    """specs: (LayerType, name, [(input, format)], [(output, format)], extra keys)."""
    layers = []
    for ltype, name, ins, outs, *extra in specs:
        d = {
            "Name": name,
            "LayerType": ltype,
            "Inputs": [{"Name": n, "Format/Datatype": f, "Dimensions": [1, 8, 4, 4]} for n, f in ins],
            "Outputs": [{"Name": n, "Format/Datatype": f, "Dimensions": [1, 8, 4, 4]} for n, f in outs],
        }
        d.update(extra[0] if extra else {})
        layers.append(d)
    return build_report(load_layers({"Layers": layers, "Bindings": ["input", "output"]}))


QDQ = {"Origin": "QDQ"}


def test_float_tail_after_the_last_dq_is_outside_the_region():
    r = engine(
        ("Reformat", "input_QuantizeLinear", [("input", F32)], [("q0", I8)], QDQ),
        ("CaskConvolution", "/conv/Conv", [("q0", I8)], [("c0", I8V)]),
        ("Reformat", "c0_DequantizeLinear", [("c0", I8V)], [("d0", F32)], QDQ),
        ("CaskSoftMax", "/softmax/Softmax", [("d0", F32)], [("output", F32)]),
    )
    assert [(rl.boundary, rl.region) for rl in r.layers] == [
        ("input", "inside"),
        (None, "inside"),
        ("output", "inside"),
        (None, "after"),
    ]
    assert apply_gate(r, INT8)


def test_a_float_tail_after_an_int8_layers_float_epilogue_is_not_a_fallback():
    """TensorRT fuses the last DQ into the last INT8 layer (INT8 in, FP32 out): what follows it, with no
    INT8 layer or Q after it and ending at an output, is float by the model's design, not a fallback;
    a float layer that an INT8 layer or a Q still follows is one."""
    tail = engine(
        ("Reformat", "input_QuantizeLinear", [("input", F32)], [("q0", I8)], QDQ),
        ("CaskConvolution", "/fc/MatMul + /fc/Add", [("q0", I8)], [("c0", F32)]),
        ("CaskSoftMaxV2", "/softmax/Softmax", [("c0", F32)], [("output", F32)]),
    )
    assert [rl.past_int8 for rl in tail.layers] == [False, False, True]
    g = apply_gate(tail, INT8)
    assert g and g.checked == 1 and g.int8_compute == 1, g.summary()
    island = engine(
        ("Reformat", "input_QuantizeLinear", [("input", F32)], [("q0", I8)], QDQ),
        ("CaskConvolution", "/a/Conv", [("q0", I8)], [("c0", F32)]),
        ("CaskSoftMaxV2", "/s/Softmax", [("c0", F32)], [("m0", F32)]),
        ("Reformat", "m0_QuantizeLinear", [("m0", F32)], [("q1", I8V)], QDQ),
        ("CaskConvolution", "/b/Conv", [("q1", I8V)], [("output", F32)]),
    )
    assert [(v.rule, v.layer) for v in apply_gate(island, INT8).violations] == [
        ("int8-compute", 2), ("interior-reformat", 3)]


def test_real_engines_end_their_int8_region_at_the_last_int8_layer():
    """tests/fixtures/trt86-h100-arith (an H100): the direction classifier's output Softmax reads the FP32
    its MatMul writes (the int8 gate had failed the engine on it); the YOLOv8n's box decoding after its
    DFL convolution is float by the placement, its DFL Softmax (between a DQ'd read and a Q) still a
    fallback."""
    import gzip

    arith = FIXTURES.parent / "trt86-h100-arith"
    def report(name):
        return build_report(load_layers(json.loads(gzip.decompress(
            (arith / f"{name}.layers.json.gz").read_bytes()), strict=False)))

    orient = apply_gate(report("orient"), INT8)
    assert orient and orient.checked == orient.int8_compute == 52, orient.summary()
    det = apply_gate(report("det"), INT8)
    failed = {n for v in det.violations for n in v.nodes}
    assert "/model.22/dfl/Softmax" in failed and "/model.2/m.0/cv1/act/Mul" in failed
    past = {n for rl in report("det").layers if rl.past_int8 for n in rl.onnx_nodes}
    assert {"/model.22/Sub", "/model.22/Sub_1", "/model.22/Mul_5"} <= past and not past & failed


def test_float_island_between_dq_and_q_fails():
    r = engine(
        ("Reformat", "input_QuantizeLinear", [("input", F32)], [("q0", I8)], QDQ),
        ("CaskConvolution", "/a/Conv", [("q0", I8)], [("c0", I8V)]),
        ("Reformat", "c0_DequantizeLinear", [("c0", I8V)], [("d0", F32)], QDQ),
        ("PointWiseV2", "PWN(PWN(/s/Sigmoid), /s/Mul)", [("d0", F32)], [("m0", F32)]),
        ("Reformat", "m0_QuantizeLinear", [("m0", F32)], [("q1", I8V)], QDQ),
        ("CaskConvolution", "/b/Conv", [("q1", I8V)], [("c1", I8)]),
        ("Reformat", "output_DequantizeLinear", [("c1", I8)], [("output", F32)], QDQ),
    )
    g = apply_gate(r, INT8)
    assert [(v.rule, v.layer) for v in g.violations] == [
        ("interior-reformat", 2),
        ("int8-compute", 3),
        ("interior-reformat", 4),
    ]
    assert g.violations[1].nodes == ("/s/Sigmoid", "/s/Mul")
    assert apply_gate(r, INT8.with_allow(["/s/*", "c0_*", "m0_*"]))


def test_float_preprocessing_before_the_first_q_is_outside_the_region():
    r = engine(
        ("PointWiseV2", "/norm/Mul", [("input", F32)], [("n0", F32)]),
        ("Reformat", "n0_QuantizeLinear", [("n0", F32)], [("q0", I8)], QDQ),
        ("CaskConvolution", "/conv/Conv", [("q0", I8)], [("c0", I8)]),
        ("Reformat", "output_DequantizeLinear", [("c0", I8)], [("output", F32)], QDQ),
    )
    assert [rl.region for rl in r.layers] == ["before", "inside", "inside", "inside"]
    assert r.layers[1].boundary == "input"  # the first Q, though not at the binding
    assert apply_gate(r, INT8)


def test_shuffle_without_transpose_is_a_no_op():
    same = {"ParameterType": "Shuffle", "FirstTranspose": [0, 1, 2, 3], "SecondTranspose": [0, 1, 2, 3]}
    moved = {"ParameterType": "Shuffle", "FirstTranspose": [0, 2, 3, 1], "SecondTranspose": [0, 1, 2, 3]}
    r = engine(
        ("Reformat", "input_QuantizeLinear", [("input", F32)], [("q0", I8)], QDQ),
        ("Shuffle", "/r/Reshape", [("q0", I8)], [("s0", I8)], same),
        ("Shuffle", "/t/Transpose", [("s0", I8)], [("s1", I8)], moved),
        ("Reformat", "output_DequantizeLinear", [("s1", I8)], [("output", F32)], QDQ),
    )
    assert [rl.kind.value for rl in r.layers] == ["reformat", "no-op", "compute", "reformat"]


def test_cli_onnx(cli, tmp_path):
    import onnx
    from test_report import resnet50_like

    path = tmp_path / "model.onnx"
    onnx.save(resnet50_like(qdq=False), str(path))
    code, out, _ = cli("report", layers_file("resnet50.implicit"), "--onnx", str(path), "--gate", "none")
    assert code == 0
    assert "ONNX" in out and "118 FP16" in out and "3 INT8" in out
    code, _, err = cli("report", layers_file("resnet50.implicit"), "--onnx", str(tmp_path / "missing.onnx"))
    assert code == 2 and "no such file" in err


@pytest.mark.parametrize("lease, tensors", [("trt86-h200-more", 254), ("trt86-h100-int8-writes", 252)])
def test_layer_information_exported_without_input_shapes_is_one_clear_error(tmp_path, cli, lease, tensors):
    """The real JSONs of a range-profile engine (PP-OCRv4's recogniser): inspected with no input shapes
    (H200), and with the execution context's input shapes set first (H100, the python backend, the next
    lease): every format "N/A due to dynamic shapes" both times. The gate says that in one line, with the
    ways out (this agent, which has the context infer the shapes; a one-shape build, which TensorRT 8.6
    makes static), exit 2, rather than failing all 59 compute layers as precisions not printed; the report
    itself still lists the layers. The same recogniser inspected by the trtexec backend at its shapes (the
    lease after) names every format, and the gate judges it layer by layer."""
    import gzip

    real = FIXTURES.parent / lease / "rec.rules.layers.json.gz"
    path = tmp_path / "rec.layers.json"
    path.write_bytes(gzip.decompress(real.read_bytes()))
    with pytest.raises(ReportError, match=rf"dynamic input shapes.*its {tensors} tensor formats read .N/A"):
        apply_gate(build_report(load_layers(path)), INT8)
    code, out, err = cli("report", path, "--gate", "int8")
    assert code == 2 and "infers every tensor's shape" in err and "Traceback" not in err
    assert "--minShapes, --optShapes and --maxShapes the same" in err
    assert len(err.strip().splitlines()) == 1
    code, out, _ = cli("report", path, "--gate", "none")
    assert code == 0 and f"{len(load_layers(path).layers)} layers" in " ".join(out.split())
    assert build_report(load_layers(path)).mode == "explicit"  # its Q/DQ reformats say so, formats or not
    shaped = tmp_path / "rec.trtexec.layers.json"
    real = FIXTURES.parent / "trt86-h100-paired" / "rec.trtexec.layers.json.gz"
    shaped.write_bytes(gzip.decompress(real.read_bytes()))
    result = apply_gate(build_report(load_layers(shaped)), INT8)
    rules = {v.rule for v in result.violations}
    assert not result.passed and rules == {"int8-compute", "interior-reformat"}, rules
