"""`edgeq lint`: each TensorRT 8.6 rule on a minimal model built to trigger it, silence on clean models,
the real onnxruntime QDQ output of the zoo models, and the command line."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeq import zoo
from edgeq.errors import EdgeqError
from edgeq.findings import Level
from edgeq.graph.io import save_model
from edgeq.graph.rules import FUSION_RULE_IDS, RULES, RULES_BY_ID, lint_model

FUSION_RULES = set(FUSION_RULE_IDS)


# --------------------------------------------------------------------------------------------------
# A tiny graph writer: one node per call, names chosen by the test so assertions can name nodes.
# --------------------------------------------------------------------------------------------------


class G:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(0)

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op: str, name: str, inputs: list[str], n_out: int = 1, domain: str = "", **attrs) -> str:
        outs = [f"{name}_out{i}" if i else f"{name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, domain=domain or None, **attrs))
        return outs[0]

    def qdq(self, x: str, name: str, scale: float = 0.05, zp: int = 0, zp_dtype=np.int8) -> str:
        s = self.const(f"{name}_scale", np.array(scale, np.float32))
        z = self.const(f"{name}_zp", np.array(zp, zp_dtype))
        q = self.op("QuantizeLinear", f"{name}_Q", [x, s, z])
        return self.op("DequantizeLinear", f"{name}_DQ", [q, s, z])

    def conv(self, x: str, name: str, c: int = 4, quantize_weight: bool = False) -> str:
        w = self.rng.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.2
        if quantize_weight:
            scale = np.abs(w).reshape(c, -1).max(1) / 127
            wq = np.round(w / scale[:, None, None, None]).astype(np.int8)
            wname = self.op(
                "DequantizeLinear",
                f"{name}_wDQ",
                [self.const(f"{name}_wq", wq), self.const(f"{name}_ws", scale.astype(np.float32)),
                 self.const(f"{name}_wz", np.zeros(c, np.int8))],
                axis=0,
            )
        else:
            wname = self.const(f"{name}_w", w)
        b = self.const(f"{name}_b", np.zeros(c, np.float32))
        return self.op("Conv", name, [x, wname, b], pads=[1, 1, 1, 1])

    def model(self, outputs: list[str], *, shape=(1, 4, 8, 8), opset: int = 17, ir: int = 8,
              inputs: list[onnx.ValueInfoProto] | None = None, out_type=TensorProto.FLOAT) -> onnx.ModelProto:
        ins = inputs or [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
        outs = [helper.make_tensor_value_info(o, out_type, None) for o in outputs]
        g = helper.make_graph(self.nodes, "t", ins, outs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = ir
        # Give outputs their inferred shapes: the ONNX checker (and so `edgeq lint FILE`) wants them.
        try:
            typed = onnx.shape_inference.infer_shapes(m).graph
        except onnx.shape_inference.InferenceError:
            return m
        inferred = {v.name: v for v in [*typed.value_info, *typed.output]}
        for o in m.graph.output:
            if o.name in inferred and inferred[o.name].type.tensor_type.HasField("shape"):
                o.type.CopyFrom(inferred[o.name].type)
        return m


def rule_hits(model: onnx.ModelProto, rule: str):
    return [f for f in lint_model(model) if f.rule == rule]


def nodes_of(findings) -> set[str]:
    return {n for f in findings for n in f.nodes}


# --------------------------------------------------------------------------------------------------
# The table itself
# --------------------------------------------------------------------------------------------------


def test_every_rule_has_id_level_fix_and_source():
    assert len(RULES_BY_ID) == len(RULES), "rule ids must be unique"
    for r in RULES:
        assert r.id == r.id.lower() and " " not in r.id
        assert isinstance(r.level, Level)
        assert r.fix.strip() and "\n" not in r.fix, r.id
        assert r.source.strip(), f"{r.id} cites no source"
        assert r.needs in ("graph", "model", "inputs", "registry")


def test_measured_sources_point_at_fixture_files_that_exist(trt_fixtures):
    import re

    for r in RULES:
        for name in re.findall(r"trt86-h200/([\w.]+\.(?:json|log))", r.source):
            assert (trt_fixtures / name).is_file(), f"{r.id} cites missing fixture {name}"
        cited = r"\b(resnet50\w*\.explicit\.layers\.json|resnet50\.implicit\.layers\.json)"
        for name in re.findall(cited, r.source):
            assert (trt_fixtures / name).is_file(), f"{r.id} cites missing fixture {name}"


def test_operator_table_loads_from_package_data():
    from edgeq.graph import optable

    table = optable.load_optable()
    assert len(table) > 100
    assert optable.is_supported("Conv") and "INT8" in table["Conv"].types
    assert not optable.is_supported("Hardmax")  # absent from the 8.6 matrix


def test_operator_table_needs_only_the_python39_traversable_api(monkeypatch):
    """On Python 3.9 (and 3.10) a package's Traversable may take one child per joinpath (zipfile.Path,
    MultiplexedPath): ``joinpath("data", name)`` raised TypeError there, e.g. for a zipped install."""
    import importlib.resources

    from edgeq.graph import optable

    real = importlib.resources.files("edgeq.graph")

    class Py39Traversable:  # the 3.9 importlib.abc.Traversable surface, over the real package files
        def __init__(self, path):
            self.path = path

        def joinpath(self, child):
            return Py39Traversable(self.path.joinpath(child))

        def __truediv__(self, child):
            return self.joinpath(child)

        def read_text(self, encoding=None):
            return self.path.read_text(encoding=encoding)

    monkeypatch.setattr(importlib.resources, "files", lambda pkg: Py39Traversable(real))
    optable.load_optable.cache_clear()
    try:
        table = optable.load_optable()
    finally:
        optable.load_optable.cache_clear()  # later tests read the table through the real files()
    assert len(table) > 100 and "INT8" in table["Conv"].types


# --------------------------------------------------------------------------------------------------
# Parsing rules, one minimal trigger model each
# --------------------------------------------------------------------------------------------------


def test_op_unsupported_names_the_nodes():
    g = G()
    h = g.op("Hardmax", "my_hardmax", ["x"])
    p = g.op("MyPlugin", "my_plugin", [h], domain="com.example")
    m = g.model([p])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    hits = rule_hits(m, "op-unsupported")
    std = [f for f in hits if f.level == Level.ERROR]
    custom = [f for f in hits if f.level == Level.WARNING]
    assert std and std[0].nodes == ("my_hardmax",) and "Hardmax" in std[0].message
    assert custom and custom[0].nodes == ("my_plugin",) and "plugin" in custom[0].message


def test_op_type_unsupported_int32_matmul():
    g = G()
    y = g.op("MatMul", "int_mm", ["a", "b"])
    m = g.model(
        [y],
        inputs=[helper.make_tensor_value_info(n, TensorProto.INT32, [2, 2]) for n in ("a", "b")],
        out_type=TensorProto.INT32,
    )
    hits = rule_hits(m, "op-type-unsupported")
    assert [f.nodes for f in hits] == [("int_mm",)]
    assert "int32" in hits[0].message and "FP32" in hits[0].message


def test_opset_too_high_names_changed_operators():
    g = G()
    axes = g.const("axes", np.array([2, 3], np.int64))
    r = g.op("ReduceMean", "gap", ["x", axes])  # opset 18 moved axes to an input
    relu = g.op("Relu", "act", [r])
    hits = rule_hits(g.model([relu], opset=19), "opset-too-high")
    assert len(hits) == 1 and hits[0].level == Level.ERROR
    assert hits[0].nodes == ("gap",) and "19" in hits[0].message and "ReduceMean" in hits[0].message


def test_ir_too_high():
    g = G()
    hits = rule_hits(g.model([g.op("Relu", "act", ["x"])], ir=10), "ir-too-high")
    assert len(hits) == 1 and "IR version 10" in hits[0].message


def test_qdq_uint8_and_asymmetric():
    g = G()
    a = g.qdq("x", "u8", zp=128, zp_dtype=np.uint8)  # uint8, symmetric around 128: clean can fix it
    b = g.qdq(a, "asym", zp=3)  # int8 with a shift: nothing can make it exact
    m = g.model([b])
    assert nodes_of(rule_hits(m, "qdq-uint8")) == {"u8_Q", "u8_DQ"}
    assert nodes_of(rule_hits(m, "qdq-asymmetric")) == {"asym_Q", "asym_DQ"}


def test_qdq_uint8_with_offset_zero_point_is_also_asymmetric():
    g = G()
    m = g.model([g.qdq("x", "u0", zp=0, zp_dtype=np.uint8)])
    assert nodes_of(rule_hits(m, "qdq-uint8")) == {"u0_Q", "u0_DQ"}
    assert nodes_of(rule_hits(m, "qdq-asymmetric")) == {"u0_Q", "u0_DQ"}


def test_qdq_scale_invalid():
    g = G()
    m = g.model([g.qdq("x", "neg", scale=-0.5)])
    assert nodes_of(rule_hits(m, "qdq-scale-invalid")) == {"neg_Q", "neg_DQ"}


def test_qdq_cast_between():
    g = G()
    s = g.const("s", np.array(0.05, np.float32))
    q = g.op("QuantizeLinear", "q", ["x", s, g.const("z8", np.array(0, np.int8))])
    c = g.op("Cast", "to_u8", [q], to=TensorProto.UINT8)
    dq = g.op("DequantizeLinear", "dq", [c, s, g.const("zu8", np.array(0, np.uint8))])
    hits = rule_hits(g.model([dq]), "qdq-cast-between")
    assert len(hits) == 1 and hits[0].nodes == ("q", "to_u8", "dq")


def test_qdq_int32_bias():
    g = G()
    bq = g.const("bias_q", np.arange(4, dtype=np.int32))
    b = g.op("DequantizeLinear", "bias_DQ", [bq, g.const("bs", np.array(0.01, np.float32)),
                                               g.const("bz", np.array(0, np.int32))])
    w = g.const("w", np.ones((4, 4, 1, 1), np.float32))
    y = g.op("Conv", "conv", ["x", w, b])
    hits = rule_hits(g.model([y]), "qdq-int32-bias")
    assert len(hits) == 1 and hits[0].nodes == ("bias_DQ",) and hits[0].level == Level.ERROR


def test_dynamic_shape_names_inputs():
    g = G()
    m = g.model([g.op("Relu", "act", ["x"])], shape=("N", 4, "H", 8))
    hits = rule_hits(m, "dynamic-shape")
    assert len(hits) == 1 and hits[0].nodes == ("x",) and hits[0].names == "inputs"
    # nothing gives its size: a warning whose fix carries numbers, not the export's names
    assert hits[0].level == Level.WARNING and "x (?, 4, ?, 8)" in hits[0].message
    assert "--optShapes x:1x4x1x8" in hits[0].fix


def test_dynamic_shape_is_info_once_its_shape_resolves():
    """issue 42: lint failed every real export on this warning alone. --shapes (or the exporter's size,
    tests/test_exporter.py) resolves the input: info, exit 0 under --fail-on warning."""
    g = G()
    m = g.model([g.op("Relu", "act", ["x"])], shape=("N", 4, "H", 8))
    (hit,) = [f for f in lint_model(m, shapes="x:1x4x16x8") if f.rule == "dynamic-shape"]
    assert hit.level == Level.INFO and "x:1x4x16x8 (--shapes)" in hit.message
    with pytest.raises(EdgeqError, match=r"x:1x5x16x8 does not fit the input's shape \(\?, 4, \?, 8\)"):
        lint_model(m, shapes="x:1x5x16x8")


def test_int64_weights_unfolded_shape_math_and_clamping():
    g = G()
    shp = g.op("Shape", "shape", ["x"])
    plus = g.op("Add", "shape_plus", [shp, g.const("offset", np.array([0, 0, 0, 1], np.int64))])
    big = g.op("Mul", "huge_mul", [plus, g.const("huge", np.array([2**40], np.int64))])
    m = g.model([big], out_type=TensorProto.INT64)
    hits = rule_hits(m, "int64-weights")
    by_level = {f.level: f for f in hits}
    assert by_level[Level.INFO].nodes == ("offset",)
    assert by_level[Level.WARNING].nodes == ("huge",) and "clamps" in by_level[Level.WARNING].message


def test_int64_where_onnx_requires_it_is_not_reported():
    g = G()
    r = g.op("Reshape", "flat", ["x", g.const("shape", np.array([1, -1], np.int64))])
    to_end = g.const("en", np.array([2**63 - 1], np.int64))  # "to the end": clamps harmlessly
    start, axis = g.const("st", np.array([0], np.int64)), g.const("ax", np.array([1], np.int64))
    s = g.op("Slice", "sl", [r, start, to_end, axis])
    assert rule_hits(g.model([s]), "int64-weights") == []


# --------------------------------------------------------------------------------------------------
# Fusion breakers: each fires on its pattern and stays silent on the placement TensorRT wants
# --------------------------------------------------------------------------------------------------


def _residual(both: bool) -> onnx.ModelProto:
    g = G()
    skip = g.qdq("x", "skip")
    c1 = g.conv(g.qdq("x", "in"), "conv1", quantize_weight=True)
    r1 = g.op("Relu", "relu1", [c1])
    c2 = g.conv(g.qdq(r1, "mid"), "conv2", quantize_weight=True)
    branch = g.qdq(c2, "conv2_out") if both else c2
    add = g.op("Add", "add", [branch, skip])
    return g.model([g.op("Relu", "relu2", [add])])


def test_fuse_add_both_quantized():
    hits = rule_hits(_residual(both=True), "residual-add")
    assert len(hits) == 1
    assert hits[0].nodes == ("add", "conv2_out_Q", "conv2_out_DQ") and "'conv2'" in hits[0].message


def test_residual_with_only_the_skip_quantized_is_clean():
    assert lint_model(_residual(both=False)) == []


def _stem(qdq_before_pool: bool) -> onnx.ModelProto:
    g = G()
    c = g.conv(g.qdq("x", "in"), "conv1", quantize_weight=True)
    r = g.op("Relu", "relu", [c])
    pooled_in = g.qdq(r, "relu_out") if qdq_before_pool else r
    p = g.op("MaxPool", "pool", [pooled_in], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    out = p if qdq_before_pool else g.qdq(p, "pool_out")
    return g.model([g.conv(out, "conv2", quantize_weight=True)])


def test_fuse_relu_maxpool():
    hits = rule_hits(_stem(qdq_before_pool=True), "conv-act-maxpool")
    assert len(hits) == 1 and hits[0].nodes == ("relu", "relu_out_Q", "relu_out_DQ", "pool")
    assert "'conv1'" in hits[0].message


def test_quantizing_after_the_pool_is_clean():
    assert lint_model(_stem(qdq_before_pool=False)) == []


def _silu(split: bool) -> onnx.ModelProto:
    g = G()
    c = g.conv(g.qdq("x", "in"), "conv", quantize_weight=True)
    s = g.op("Sigmoid", "sig", [c])
    y = g.op("Mul", "mul", [c, g.qdq(s, "sig_out") if split else s])
    return g.model([g.conv(g.qdq(y, "silu_out"), "next", quantize_weight=True)])


def test_fuse_silu_qdq_is_an_error():
    hits = rule_hits(_silu(split=True), "silu-whole")
    assert len(hits) == 1 and hits[0].level == Level.ERROR
    assert hits[0].nodes == ("sig", "mul", "sig_out_Q", "sig_out_DQ")


def test_silu_with_input_quantized_on_one_side_only_is_split():
    g = G()
    c = g.conv(g.qdq("x", "in"), "conv", quantize_weight=True)
    s = g.op("Sigmoid", "sig", [g.qdq(c, "c_out")])  # the Sigmoid reads a quantized copy, the Mul the float
    y = g.op("Mul", "mul", [c, s])
    hits = rule_hits(g.model([y]), "silu-whole")
    assert len(hits) == 1 and {"c_out_Q", "c_out_DQ"} <= set(hits[0].nodes)


def test_silu_quantized_after_is_clean():
    assert lint_model(_silu(split=False)) == []


def _concat(scales: tuple[float, float]) -> onnx.ModelProto:
    g = G()
    a = g.op("Relu", "a", ["x"])
    b = g.op("Sigmoid", "b", ["x"])
    cat = g.op("Concat", "cat", [g.qdq(a, "qa", scale=scales[0]), g.qdq(b, "qb", scale=scales[1])], axis=1)
    return g.model([cat])


def test_fuse_concat_scales():
    hits = rule_hits(_concat((0.05, 0.08)), "concat-scale")
    assert len(hits) == 1 and hits[0].nodes == ("cat", "qa_DQ", "qb_DQ")


def test_concat_with_one_shared_scale_is_clean():
    assert lint_model(_concat((0.05, 0.05))) == []


def test_concat_scale_is_seen_through_maxpool():
    g = G()
    x = g.qdq(g.op("Relu", "a", ["x"]), "qa", scale=0.05)
    p = g.op("MaxPool", "pool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1])  # same scale as its input
    cat = g.op("Concat", "cat", [x, p, g.qdq(g.op("Sigmoid", "b", ["x"]), "qb", scale=0.01)], axis=1)
    hits = rule_hits(g.model([cat]), "concat-scale")
    assert len(hits) == 1 and hits[0].nodes == ("cat", "qa_DQ", "qa_DQ", "qb_DQ")


def _dangling(scale2: float) -> onnx.ModelProto:
    g = G()
    c = g.conv(g.qdq("x", "in"), "conv1", quantize_weight=True)
    d = g.qdq(c, "c1", scale=0.05)
    a = g.op("Split", "split", [d, g.const("sizes", np.array([2, 2], np.int64))], n_out=2, axis=1)
    e = g.qdq(a, "s0", scale=scale2)
    w = g.const("w2", np.ones((4, 2, 1, 1), np.float32))
    return g.model([g.op("Conv", "conv2", [e, w])])


def test_fuse_dangling_dq_q():
    hits = rule_hits(_dangling(0.2), "data-movement")
    assert len(hits) == 1 and hits[0].nodes == ("c1_DQ", "split", "s0_Q")


def test_dq_q_with_the_same_scale_is_not_dangling():
    assert rule_hits(_dangling(0.05), "data-movement") == []


def test_fuse_conv_output_quantized():
    g = G()
    c = g.conv(g.qdq("x", "in"), "conv", quantize_weight=True)
    r = g.op("Relu", "relu", [g.qdq(c, "c_out")])
    hits = rule_hits(g.model([r]), "conv-epilogue")
    assert len(hits) == 1 and hits[0].nodes == ("conv", "c_out_Q", "c_out_DQ", "relu")


def test_fuse_conv_output_quantized_before_a_silu():
    g = G()
    c = g.conv(g.qdq("x", "in"), "conv", quantize_weight=True)
    x = g.qdq(c, "c_out")  # one Q/DQ read by both halves of the SiLU: not inside it, but after the conv
    y = g.op("Mul", "mul", [x, g.op("Sigmoid", "sig", [x])])
    m = g.model([y])
    hits = rule_hits(m, "conv-epilogue")
    assert len(hits) == 1 and hits[0].nodes == ("conv", "c_out_Q", "c_out_DQ", "sig", "mul")
    assert rule_hits(m, "silu-whole") == []


def test_a_trt_style_placement_of_a_yolo_block_is_clean():
    """Weighted-op inputs quantized, SiLU in float, one scale through the Split and across each Concat,
    the residual Add's conv branch unquantized, SPPF max-pools between Q/DQ of one scale."""
    g = G()

    def silu(t: str, name: str) -> str:
        return g.op("Mul", f"{name}_mul", [t, g.op("Sigmoid", f"{name}_sig", [t])])

    x = silu(g.conv(g.qdq("x", "in"), "cv1", quantize_weight=True), "act1")
    halves = g.const("halves", np.array([2, 2], np.int64))
    a = g.op("Split", "split", [g.qdq(x, "s1a", scale=0.1), halves], n_out=2, axis=1)
    b = "split_out1"  # the Split's second output
    y = silu(g.conv(g.qdq(b, "s1b", scale=0.1), "m_a", c=2, quantize_weight=True), "act2")  # same scale again
    # silu-residual: the SiLU before the residual Add reads the quantized convolution output
    y = silu(g.qdq(g.conv(g.qdq(y, "m_mid"), "m_b", c=2, quantize_weight=True), "m_b_out"), "act3")
    res = g.op("Add", "res", [y, g.qdq(b, "s1c", scale=0.1)])  # the SiLU's own output stays float
    cat = g.op("Concat", "cat", [a, b, g.qdq(res, "s1d", scale=0.1)], axis=1)  # 6 channels, one scale
    w = g.const("w6", np.ones((4, 6, 1, 1), np.float32) * 0.1)
    z = silu(g.op("Conv", "cv2", [g.qdq(cat, "s1e", scale=0.1), w]), "act4")
    z = g.qdq(z, "s2", scale=0.2)
    p1 = g.op("MaxPool", "pool1", [z], kernel_shape=[5, 5], pads=[2, 2, 2, 2])
    p2 = g.op("MaxPool", "pool2", [p1], kernel_shape=[5, 5], pads=[2, 2, 2, 2])
    sppf = g.op("Concat", "sppf", [z, p1, p2], axis=1)
    w12 = g.const("w12", np.ones((4, 12, 1, 1), np.float32) * 0.1)
    out = g.op("Conv", "cv3", [g.qdq(sppf, "s2b", scale=0.2), w12])
    model = g.model([out])
    onnx.checker.check_model(model, full_check=True)  # silence on a broken model would prove nothing
    assert lint_model(model) == []


@pytest.mark.parametrize(
    "model",
    [
        _residual(both=False),
        _stem(qdq_before_pool=False),
        _silu(split=False),
        _concat((0.05, 0.05)),
        _dangling(0.05),
    ],
    ids=["residual", "stem", "silu", "concat", "split"],
)
def test_the_clean_counterparts_are_valid_onnx(model):
    onnx.checker.check_model(model, full_check=True)


def test_rules_filter_and_trt_version():
    from edgeq.errors import EdgeqError

    m = _residual(both=True)
    assert {f.rule for f in lint_model(m, rules=["residual-add"])} == {"residual-add"}
    assert lint_model(m, rules=["qdq-uint8"]) == []
    assert lint_model(m, trt="8.6.1") == lint_model(m)
    with pytest.raises(EdgeqError, match=r"supported: 8\.6"):
        lint_model(m, trt="10.0")
    with pytest.raises(EdgeqError, match="unknown rule"):
        lint_model(m, rules=["no-such-rule"])


def test_lint_does_not_modify_the_model():
    m = _residual(both=True)
    before = m.SerializeToString()
    lint_model(m)
    assert m.SerializeToString() == before


# --------------------------------------------------------------------------------------------------
# The zoo: clean FP32 exports, real onnxruntime QDQ output, the other exporters' patterns
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["resnet", "yolo", "unet"])
def test_clean_fp32_zoo_models_have_no_findings(name):
    assert lint_model(zoo.build(name)) == []


@pytest.fixture(scope="module")
def ort_models():
    return {name: zoo.build(name, "ortfb") for name in ("resnet", "yolo")}


def test_onnxruntime_qdq_resnet_has_the_measured_fusion_breakers(ort_models):
    found = {f.rule for f in lint_model(ort_models["resnet"])}
    assert {"residual-add", "conv-act-maxpool"} <= found
    assert not any(r.startswith("qdq-") for r in found)  # ortfb: parses fine, fuses badly


def test_onnxruntime_qdq_yolo_has_the_measured_fusion_breakers(ort_models):
    findings = lint_model(ort_models["yolo"])
    found = {f.rule for f in findings}
    assert {"silu-whole", "concat-scale"} <= found
    silu = [f for f in findings if f.rule == "silu-whole"]
    # The fixture's build failed on the stem's SiLU: the same nodes are named here.
    stem = ("/stem/stem.0/stem.0.2/Sigmoid", "/stem/stem.0/stem.0.2/Mul")
    assert any(set(stem) <= set(f.nodes) for f in silu)


def test_onnxruntime_default_bias_quantization_is_the_measured_parse_error():
    hits = rule_hits(zoo.build("resnet", "ort"), "qdq-int32-bias")
    assert len(hits) == 1 and hits[0].level == Level.ERROR and len(hits[0].nodes) >= 1


def test_torch_eager_and_modelopt_patterns():
    torch_rules = {f.rule for f in lint_model(zoo.build("resnet", "torch"))}
    assert {"qdq-cast-between", "qdq-uint8", "qdq-int32-bias"} <= torch_rules
    modelopt = {f.rule for f in lint_model(zoo.build("resnet", "modelopt"))}
    assert {"opset-too-high", "ir-too-high"} <= modelopt


def _bypass(graph, pair) -> None:
    """Remove a Q/DQ pair: readers of the DQ read the Q's input instead."""
    x, y = pair.q.inputs[0], pair.dq.outputs[0]
    for reader in list(y.outputs):
        for i, t in enumerate(reader.inputs):
            if t is y:
                reader.inputs[i] = x
    pair.dq.outputs.clear()


def test_the_measured_resnet50_placed_edit_clears_every_fusion_breaker(ort_models):
    """The fixture ``resnet50_placed`` is onnxruntime's QDQ with three kinds of pair removed, and it
    fused fully on 8.6; the same edit on the zoo ResNet must leave no fusion finding."""
    from edgeq.graph import patterns as P
    from edgeq.graph.io import graph_from_model, model_from_graph

    model = ort_models["resnet"]
    graph = graph_from_model(model)
    remove = []
    for n in graph.nodes:
        if n.op == "Relu" and P.qdq_pair_of(n.inputs[0]):  # (a) Conv/Add -> Q/DQ -> ReLU
            remove.append(P.qdq_pair_of(n.inputs[0]))
        if n.op == "MaxPool" and P.qdq_pair_of(n.inputs[0]):  # (b) Q/DQ before the stem MaxPool
            remove.append(P.qdq_pair_of(n.inputs[0]))
        if n.op == "Add":  # (c) the Add input straight from the block's last Conv
            for t in n.inputs:
                pair = P.qdq_pair_of(t)
                conv = P.producer(pair.q.inputs[0]) if pair else None
                if P.is_op(conv, "Conv") and "downsample" not in conv.name:  # the downsample conv is the skip
                    remove.append(pair)
    assert len(remove) >= 5
    for pair in remove:
        _bypass(graph, pair)
    graph.cleanup().toposort()
    placed = model_from_graph(graph, like=model)
    found = {f.rule for f in lint_model(placed)}
    assert not found & FUSION_RULES, found
    assert {f.rule for f in lint_model(model)} & FUSION_RULES  # and the unedited model had them


# --------------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def residual_files(tmp_path):
    bad, good = tmp_path / "both.onnx", tmp_path / "skip only.onnx"
    save_model(_residual(both=True), bad)
    save_model(_residual(both=False), good)
    return bad, good


def test_cli_json_parses_and_exit_codes(cli, residual_files):
    bad, good = residual_files
    code, out, _ = cli("lint", bad, "--json")
    doc = json.loads(out)
    assert code == 1
    assert doc["trt"] == "8.6" and doc["summary"]["by_rule"] == {"residual-add": 1}
    f = doc["findings"][0]
    assert f["rule"] == "residual-add" and f["level"] == "warning" and f["nodes"][0] == "add"
    assert f["fix"] and f["source"]
    code, out, _ = cli("lint", good, "--json")
    assert code == 0 and json.loads(out)["findings"] == []


def test_cli_fail_on_threshold(cli, residual_files):
    bad, _ = residual_files
    assert cli("lint", bad, "--fail-on", "error")[0] == 0  # a warning does not fail at --fail-on error
    assert cli("lint", bad, "--fail-on", "never")[0] == 0
    assert cli("lint", bad, "--fail-on", "info")[0] == 1
    assert cli("lint", bad, "--fail-on", "sometimes")[0] == 2


def test_cli_table_output(cli, residual_files):
    bad, good = residual_files
    code, out, _ = cli("lint", bad)
    assert code == 1 and "residual-add" in out and "fail" in out
    code, out, _ = cli("lint", good)
    assert code == 0 and "no findings" in out


def test_cli_usage_and_input_errors(cli, residual_files, tmp_path):
    bad, _ = residual_files
    code, _, err = cli("lint", bad, "--trt", "10.0")
    assert code == 2 and "8.6" in err and "Traceback" not in err
    code, _, err = cli("lint", bad, "--rule", "nope")
    assert code == 2 and "unknown rule" in err
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not a model at all")
    code, _, err = cli("lint", junk)
    assert code == 2 and "junk.onnx" in err and "Traceback" not in err
    assert cli("lint", tmp_path / "missing.onnx")[0] == 2


def test_resnet50_findings_match_the_measured_engine(trt_fixtures):
    """Lint, run on onnxruntime's QDQ of the zoo ResNet-50 (named as torch exports it), names exactly the
    16 residual Adds that TensorRT 8.6 left as separate PointWiseV2 layers in the real engine, and the
    stem MaxPool it ran on its own."""
    import re

    text = (trt_fixtures / "resnet50_ortfb.explicit.layers.json").read_text()
    layers = json.loads(text, strict=False)["Layers"]
    unfused = sorted(
        re.search(r"/layer\d/layer\d\.\d+/Add", layer["Name"]).group(0)
        for layer in layers
        if layer.get("LayerType") == "PointWiseV2"
    )
    assert len(unfused) == 16
    model = zoo.qdq_ort(zoo.resnet50(size=64, width=8), quantize_bias=False, samples=1)  # structure only
    findings = lint_model(model, rules=["residual-add", "conv-act-maxpool"])
    assert sorted(f.nodes[0] for f in findings if f.rule == "residual-add") == unfused
    pools = [f for f in findings if f.rule == "conv-act-maxpool"]
    assert len(pools) == 1 and pools[0].nodes[-1] == "/maxpool/MaxPool"
    assert {"Name": "/maxpool/MaxPool", "LayerType": "CaskPooling"}.items() <= next(
        layer for layer in layers if layer["Name"] == "/maxpool/MaxPool"
    ).items()


def test_removing_the_qdq_inside_each_silu_clears_fuse_silu(ort_models):
    """Only the Sigmoid -> Mul pair is inside; one Q/DQ shared by Sigmoid and Mul is the SiLU's input."""
    from edgeq.graph import patterns as P
    from edgeq.graph.io import graph_from_model, model_from_graph

    model = ort_models["yolo"]
    graph = graph_from_model(model)
    for mul in list(graph.nodes):
        if P.silu_input(mul) is not None:
            for t in mul.inputs:
                pair = P.qdq_pair_of(t)
                if pair and P.is_op(P.producer(pair.q.inputs[0]), "Sigmoid"):
                    _bypass(graph, pair)
    graph.cleanup().toposort()
    edited = model_from_graph(graph, like=model)
    assert rule_hits(edited, "silu-whole") == []
    assert rule_hits(model, "silu-whole")
    # What is left is onnxruntime's Q/DQ on each convolution's output, before its SiLU.
    left = rule_hits(edited, "conv-epilogue")
    stem = [f for f in left if "/stem/stem.0/stem.0.2/Mul" in f.nodes]
    assert len(stem) == 1 and "SiLU" in stem[0].message


# --------------------------------------------------------------------------------------------------
# The pattern helpers the placement engine shares
# --------------------------------------------------------------------------------------------------


def test_pattern_helpers_walk_through_qdq_pairs():
    from edgeq.graph import patterns as P
    from edgeq.graph.io import graph_from_model

    g = G()
    c = g.conv(g.qdq("x", "in"), "conv", quantize_weight=True)
    r = g.op("Relu", "relu", [g.qdq(g.qdq(c, "a"), "b")])  # two pairs back to back
    graph = graph_from_model(g.model([r]))
    nodes = {n.name: n for n in graph.nodes}
    relu, conv = nodes["relu"], nodes["conv"]

    assert P.is_qdq(relu.inputs[0]) and not P.is_qdq(conv.outputs[0])
    src, pairs = P.skip_qdq_up(relu.inputs[0])
    assert src is conv.outputs[0] and [p.names for p in pairs] == [("b_Q", "b_DQ"), ("a_Q", "a_DQ")]
    assert P.real_producer(relu.inputs[0]) is conv
    assert P.real_producer(nodes["in_DQ"].outputs[0]) is None  # a graph input behind the pair
    readers = P.skip_qdq_down(conv.outputs[0])
    assert [(n.name, i, len(crossed)) for n, i, crossed in readers] == [("relu", 0, 2)]
    assert P.is_weight_dq(nodes["conv_wDQ"]) and not P.is_weight_dq(nodes["a_DQ"])
    assert P.upstream_dq(relu.inputs[0]) is nodes["b_DQ"] and P.upstream_dq(conv.outputs[0]) is None
    qp = P.qparams(nodes["conv_wDQ"])
    assert qp.zero_point_dtype == "int8" and qp.axis == 0 and qp.scale.shape == (4,) and not qp.per_tensor
    assert P.qparams(nodes["a_Q"]).per_tensor


def test_upstream_dq_and_concat_behind_walk_the_same_data_movement():
    """Both look back through scale-preserving ops only: the walk stops at a Concat, a DQ or anything else."""
    from edgeq.graph import fusion
    from edgeq.graph import patterns as P
    from edgeq.graph.io import graph_from_model

    g = G()
    cat = g.op("Concat", "cat", [g.qdq(g.op("Relu", "a", ["x"]), "qa"), "x"], axis=1)
    pooled = g.op("Transpose", "t", [g.op("MaxPool", "pool", [cat], kernel_shape=[1, 1])], perm=[0, 1, 3, 2])
    requant = g.op("Reshape", "r", [g.qdq(pooled, "qc"), g.const("shape", np.array([1, -1], np.int64))])
    graph = graph_from_model(g.model([requant, g.op("Relu", "relu", [pooled])]))
    n = {node.name: node for node in graph.nodes}
    moved, requant, relu = (n[k].outputs[0] for k in ("t", "r", "relu"))

    assert P.scale_source(moved) is n["cat"] and fusion.concat_behind(moved) is n["cat"]
    assert P.upstream_dq(moved) is None  # a Concat, not a DQ, behind the data movement
    assert P.scale_source(requant) is n["qc_DQ"] and P.upstream_dq(requant) is n["qc_DQ"]
    assert fusion.concat_behind(requant) is None  # a Q/DQ pair on the way
    assert P.scale_source(relu) is n["relu"] and fusion.concat_behind(relu) is None
    assert P.scale_source(graph.inputs[0]) is None and P.upstream_dq(graph.inputs[0]) is None


def test_qparams_without_zero_point_is_uint8_as_onnx_says():
    from edgeq.graph import patterns as P
    from edgeq.graph.io import graph_from_model

    g = G()
    q = g.op("QuantizeLinear", "q", ["x", g.const("s", np.array(0.1, np.float32))])
    dq = g.op("DequantizeLinear", "dq", [q, "s"])
    m = g.model([dq])
    graph = graph_from_model(m)
    assert P.qparams(next(n for n in graph.nodes if n.name == "q")).zero_point_dtype == "uint8"
    assert nodes_of(rule_hits(m, "qdq-uint8")) == {"q", "dq"}
