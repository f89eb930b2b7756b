"""Q/DQ placement for TensorRT 8.6: structural checks on the zoo models' quantized graphs.

Each model is quantized once per placement (real calibration on seeded synthetic data, real Q/DQ
insertion); the checks read the resulting ONNX the way TensorRT's Q/DQ propagation would.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeq import zoo
from edgeq.errors import ConfigError
from edgeq.graph.io import graph_from_model, infer_shapes, opset_of
from edgeq.graph.patterns import is_constant, preserves_scale, producer, qdq_pair_of, qparams, upstream_dq
from edgeq.graph.rules import lint_model
from edgeq.quant.data import calibration_set
from edgeq.quant.overrides import Overrides, load_overrides, overrides_from_dict
from edgeq.quant.placement import plan_placement
from edgeq.quant.quantize import QuantizeOptions, quantize_model
from edgeq.quant.rules import RULES, WEIGHTED_OPS

MODELS = {
    "resnet_like": zoo.resnet_like,
    "yolo_like": zoo.yolo_like,
    "yolo_slice": lambda: zoo.yolo_like(split="slice"),  # ultralytics writes chunk() as two Slices
    "unet_like": zoo.unet_like,
}
FUSION_RULES = {"residual-add", "conv-act-maxpool", "silu-whole", "concat-scale",
                "data-movement", "conv-epilogue"}


def _quantize(name: str, placement: str, overrides: Overrides | None = None):
    return _quantize_model(MODELS[name](), placement, overrides)


def _quantize_model(model, placement: str, overrides: Overrides | None = None):
    data = calibration_set(model, None, synthetic=4, seed=1)
    options = QuantizeOptions(calibrator="max", placement=placement, overrides=overrides, holdout=0.25)
    return quantize_model(model, data, options)


@pytest.fixture(scope="module")
def quantized() -> dict[tuple[str, str], object]:
    return {(n, p): _quantize(n, p) for n in MODELS for p in ("trt", "all")}


def _graph(result) -> gs.Graph:
    return graph_from_model(result.model)


def _int8_input(t: gs.Tensor, depth: int = 0) -> bool:
    """Does ``t`` reach its consumer in INT8 once TensorRT propagates DQ forward across commuting ops?"""
    if qdq_pair_of(t) is not None:
        return True
    p = producer(t)
    if p is None or not (p.op == "Concat" or preserves_scale(p)) or depth > 32:
        return False
    data = [x for x in p.inputs if not is_constant(x) and x.name] if p.op == "Concat" else [p.inputs[0]]
    return all(_int8_input(x, depth + 1) for x in data)


def _residual_adds(g: gs.Graph) -> list[gs.Node]:
    return [n for n in g.nodes
            if n.op == "Add" and len(n.inputs) == 2 and not any(is_constant(t) for t in n.inputs)]


# --------------------------------------------------------------------------------------------------
# Structure of the trt placement
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_every_weighted_op_has_int8_activation_and_weight_dq(quantized, name):
    g = _graph(quantized[(name, "trt")])
    weighted = [n for n in g.nodes if n.op in WEIGHTED_OPS]
    assert len(weighted) >= 7
    for n in weighted:
        assert _int8_input(n.inputs[0]), f"{n.name}: activation input not quantized"
        w_dq = producer(n.inputs[1])
        assert w_dq is not None and w_dq.op == "DequantizeLinear", f"{n.name}: weight has no DequantizeLinear"
        assert w_dq.inputs[0].dtype == np.int8 and is_constant(w_dq.inputs[0])
        if len(n.inputs) > 2:  # bias stays a float initializer (int32 bias DQ fails the 8.6 parser)
            assert isinstance(n.inputs[2], gs.Constant) and n.inputs[2].dtype == np.float32


def test_resnet_residual_add_quantizes_only_the_skip_branch(quantized):
    g = _graph(quantized[("resnet_like", "trt")])
    adds = _residual_adds(g)
    assert len(adds) == 2
    for add in adds:
        quantized_inputs = [t for t in add.inputs if _int8_input(t)]
        float_inputs = [t for t in add.inputs if not _int8_input(t)]
        assert len(quantized_inputs) == 1 and len(float_inputs) == 1, add.name
        # the float one comes straight from the block's last convolution (conv-add-relu fuses it)
        p = producer(float_inputs[0])
        assert p is not None and p.op == "Conv", add.name


@pytest.mark.parametrize("name", ["yolo_like", "yolo_slice"])
def test_silu_residual_quantizes_the_convolution_output(quantized, name):
    """silu-residual (yolo_fix1): one Q/DQ on the Conv output read by both Sigmoid and Mul, none
    inside the SiLU, the skip quantized, the SiLU's own output float into the Add."""
    g = _graph(quantized[(name, "trt")])
    adds = _residual_adds(g)
    assert len(adds) == 8
    for add in adds:
        silu_out = next(t for t in add.inputs if producer(t) is not None and producer(t).op == "Mul")
        skip = next(t for t in add.inputs if t is not silu_out)
        assert _int8_input(skip), add.name
        mul = producer(silu_out)
        sig_out = next(t for t in mul.inputs if producer(t) is not None and producer(t).op == "Sigmoid")
        x = next(t for t in mul.inputs if t is not sig_out)
        sig = producer(sig_out)
        assert sig.inputs[0] is x, f"{add.name}: Sigmoid and Mul read different tensors"
        pair = qdq_pair_of(x)
        assert pair is not None, f"{add.name}: the SiLU's input is not quantized"
        assert producer(pair.q.inputs[0]).op == "Conv"
        assert qdq_pair_of(sig_out) is None


@pytest.mark.parametrize("name,expected", [("yolo_like", 9), ("yolo_slice", 9), ("unet_like", 2)])
def test_convolution_reading_a_concat_has_its_own_qdq(quantized, name, expected):
    """concat-conv (yolo_edgeq vs yolo_fix2): a Q/DQ right before every convolution that reads a
    Concat, in the Concat's scale group; the Concat's inputs keep their Q/DQ (one scale)."""
    g = _graph(quantized[(name, "trt")])
    readers = [n for n in g.nodes if n.op in WEIGHTED_OPS
               and (pair := qdq_pair_of(n.inputs[0])) is not None and pair.q.inputs[0].inputs
               and pair.q.inputs[0].inputs[0].op == "Concat"]
    assert len(readers) == expected
    for conv in readers:
        pair = qdq_pair_of(conv.inputs[0])
        cat = pair.q.inputs[0].inputs[0]
        scales = {float(qparams(upstream_dq(t)).scale) for t in cat.inputs}
        assert scales == {float(qparams(pair.dq).scale)}, conv.name
    # and no convolution reads a Concat any other way
    for n in g.nodes:
        if n.op in WEIGHTED_OPS:
            p = producer(n.inputs[0])
            assert p is None or p.op != "Concat", n.name


@pytest.mark.parametrize("tail", ["gap", "avgpool", "mean"])
def test_pool_tail_input_is_quantized(tail):
    """pool-tail (r50b64_edgeq vs r50b64_tailfix): the pool reads a Q/DQ of the last Relu, so the
    last convolution (with its Add and Relu) ends INT8."""
    g = _graph(_quantize_model(zoo.resnet_like(tail=tail), "trt"))
    pool = next(n for n in g.nodes if n.op in ("GlobalAveragePool", "AveragePool", "ReduceMean"))
    pair = qdq_pair_of(pool.inputs[0])
    assert pair is not None, tail
    assert producer(pair.q.inputs[0]).op == "Relu"


@pytest.mark.parametrize("act", ["relu6", "leakyrelu"])
def test_no_qdq_between_clip_or_leakyrelu_and_maxpool(act):
    g = _graph(_quantize_model(zoo.resnet_like(stem_act=act), "trt"))
    pool = next(n for n in g.nodes if n.op == "MaxPool")
    a = producer(pool.inputs[0])
    assert a is not None and a.op == {"relu6": "Clip", "leakyrelu": "LeakyRelu"}[act]
    assert producer(a.inputs[0]).op == "Conv"
    assert {c.op for c in pool.outputs[0].outputs} == {"QuantizeLinear"}


def test_no_qdq_between_relu_and_stem_maxpool(quantized):
    g = _graph(quantized[("resnet_like", "trt")])
    pool = next(n for n in g.nodes if n.op == "MaxPool")
    relu = producer(pool.inputs[0])
    assert relu is not None and relu.op == "Relu"  # no DequantizeLinear in between
    assert producer(relu.inputs[0]).op == "Conv"
    readers = {c.op for c in pool.outputs[0].outputs}
    assert readers == {"QuantizeLinear"}  # quantized after the pool instead


@pytest.mark.parametrize("name,expected", [("yolo_like", 9), ("unet_like", 2)])
def test_concat_inputs_share_one_scale(quantized, name, expected):
    g = _graph(quantized[(name, "trt")])
    concats = [n for n in g.nodes if n.op == "Concat"]
    assert len(concats) == expected
    for cat in concats:
        scales = []
        for t in cat.inputs:
            dq = upstream_dq(t)
            assert dq is not None, f"{cat.name}: input {t.name} not quantized"
            scales.append(float(qparams(dq).scale))
        assert len(set(scales)) == 1, f"{cat.name}: scales {scales}"


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("placement", ["trt", "all"])
def test_all_qdq_int8_symmetric(quantized, name, placement):
    m = quantized[(name, placement)].model
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    qdq = [n for n in m.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert len(qdq) > 20
    for n in qdq:
        assert len(n.input) == 3, f"{n.name}: zero-point missing (ONNX default would be uint8)"
        zp, scale = inits[n.input[2]], inits[n.input[1]]
        assert zp.dtype == np.int8 and not zp.any(), n.name
        assert scale.dtype == np.float32 and (scale > 0).all() and zp.shape == scale.shape
        if n.op_type == "QuantizeLinear":
            assert scale.shape == ()  # activations per-tensor
    assert m.ir_version <= 8 and opset_of(m) <= 17


def test_weight_scales_per_channel_on_the_output_axis(quantized):
    reference = quantized[("unet_like", "trt")].reference
    ref = {i.name: numpy_helper.to_array(i) for i in reference.graph.initializer}
    g = _graph(quantized[("unet_like", "trt")])
    seen = set()
    for n in g.nodes:
        if n.op not in ("Conv", "ConvTranspose"):
            continue
        dq = producer(n.inputs[1])
        axis = dq.attrs["axis"]
        q = dq.inputs[0].values.astype(np.float32)
        scale = dq.inputs[1].values
        original = ref[dq.inputs[0].name[: -len("_quantized")]]
        expected_axis = 1 if n.op == "ConvTranspose" else 0
        assert axis == expected_axis, n.name
        assert scale.shape == (original.shape[expected_axis],)
        shape = [1] * original.ndim
        shape[axis] = -1
        # dequantized weights within half a step of the float ones, per channel, and each channel's
        # largest |w| lands on +-127 (the scale is that channel's max / 127)
        err = np.abs(q * scale.reshape(shape) - original)
        assert (err <= scale.reshape(shape) / 2 + 1e-7).all(), n.name
        other = tuple(i for i in range(q.ndim) if i != axis)
        assert (np.abs(q).max(axis=other) == 127).all(), n.name
        seen.add(n.op)
    assert seen == {"Conv", "ConvTranspose"}


def test_gemm_and_matmul_axes():
    """Gemm transB=1: axis 0; transB=0: axis 1; 2-D MatMul: axis 1; grouped ConvTranspose: per-tensor."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "w_t"),
        numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float32), "w_n"),
        numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32), "w_m"),
        numpy_helper.from_array(rng.standard_normal((2, 3, 2, 2)).astype(np.float32), "w_ct"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w_t"], ["a"], name="gemm_t", transB=1),
        helper.make_node("Gemm", ["x", "w_n"], ["b"], name="gemm_n"),
        helper.make_node("Add", ["a", "b"], ["c"], name="add"),
        helper.make_node("MatMul", ["c", "w_m"], ["y"], name="matmul"),
        helper.make_node("ConvTranspose", ["img", "w_ct"], ["z"], name="convt", group=2, strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes, "axes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
         helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    plan = plan_placement(graph_from_model(infer_shapes(model)))
    axes = {w.node: w.axis for w in plan.weights}
    assert axes == {"gemm_t": 0, "gemm_n": 1, "matmul": 1, "convt": None}
    assert {s.tensor for s in plan.sites} == {"x", "c", "img"}


# --------------------------------------------------------------------------------------------------
# The plan accounts for every tensor, with a known rule
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_every_float_tensor_has_a_rule(quantized, name):
    plan = quantized[(name, "trt")].plan
    sites = {s.tensor for s in plan.sites}
    floats = {f.tensor for f in plan.floats}
    assert sites | set(plan.commuted) | floats == set(plan.activations)
    assert not (sites & floats) and not (set(plan.commuted) & floats)
    for f in plan.floats:
        assert f.rule in RULES
    assert {s.rule for s in plan.sites} <= set(RULES)


def test_float_rules_name_the_reason():
    plan = _quantize("resnet_like", "trt").plan
    rule_of = {f.tensor: f.rule for f in plan.floats}
    assert rule_of["/relu/Relu_output_0"] == "conv-act-maxpool"
    assert rule_of["/layer1/layer1.0/conv2/Conv_output_0"] == "residual-add"
    assert rule_of["/conv1/Conv_output_0"] == "conv-epilogue"
    yolo = _quantize("yolo_like", "trt").plan
    assert {f.rule for f in yolo.floats if f.tensor.endswith("Sigmoid_output_0")} == {"silu-whole"}


def test_rules_are_data_with_sources():
    assert {"weighted-inputs", "conv-epilogue", "residual-add",
            "conv-act-maxpool", "data-movement", "concat-scale", "silu-whole",
            "place-override"} <= set(RULES)
    for r in RULES.values():
        assert r.id and len(r.description) > 40 and len(r.source) > 20


# --------------------------------------------------------------------------------------------------
# lint agrees: no fusion breaker in trt output, the known ones in all output
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,breakers",
    [
        ("resnet_like", {"residual-add", "conv-act-maxpool"}),
        ("yolo_like", {"residual-add", "silu-whole", "concat-scale"}),
        ("yolo_slice", {"residual-add", "silu-whole", "concat-scale"}),
        ("unet_like", {"concat-scale"}),
    ],
)
def test_lint_finds_breakers_only_in_all_placement(quantized, name, breakers):
    trt = {f.rule for f in lint_model(quantized[(name, "trt")].model)}
    assert not trt & FUSION_RULES, trt
    assert not trt, trt  # nothing else either: the output parses under the 8.6 rules
    found = {f.rule for f in lint_model(quantized[(name, "all")].model)}
    assert breakers <= found, found


# --------------------------------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------------------------------


def test_override_exclude_keeps_node_float():
    result = _quantize("resnet_like", "trt", Overrides(exclude=("/layer1/*/conv2/Conv",)))
    g = _graph(result)
    conv = next(n for n in g.nodes if n.name == "/layer1/layer1.0/conv2/Conv")
    assert producer(conv.inputs[0]).op == "Relu"  # no Q/DQ on its input
    assert isinstance(conv.inputs[1], gs.Constant) and conv.inputs[1].dtype == np.float32
    assert {"/layer1/layer1.0/relu/Relu_output_0": "place-override"}.items() <= {
        f.tensor: f.rule for f in result.plan.floats}.items()
    assert result.plan.excluded == ("/layer1/layer1.0/conv2/Conv",)


def test_override_force_quantizes_every_input():
    result = _quantize("resnet_like", "trt", Overrides(force=("re:/layer1/layer1\\.0/Add",)))
    g = _graph(result)
    add = next(n for n in g.nodes if n.name == "/layer1/layer1.0/Add")
    assert all(qdq_pair_of(t) is not None for t in add.inputs)
    forced = [s for s in result.plan.sites if s.rule == "place-override"]
    assert [s.tensor for s in forced] == ["/layer1/layer1.0/conv2/Conv_output_0"]
    assert "residual-add" in {f.rule for f in lint_model(result.model)}


def test_override_file_errors(tmp_path):
    good = tmp_path / "o.yaml"
    good.write_text("exclude:\n  - /fc/Gemm\nforce: []\n")
    assert load_overrides(good).exclude == ("/fc/Gemm",)
    cases = {
        "exclude: [\n": "invalid YAML at line",
        "include: [a]\n": "unknown key 'include'",
        "exclude: 3\n": "must be a list",
        "- a\n- b\n": "expected a mapping",
        "force: ['re:(']\n": "bad regular expression",
    }
    for text, message in cases.items():
        p = tmp_path / "bad.yaml"
        p.write_text(text)
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
            load_overrides(p)
    with pytest.raises(ConfigError, match="not found"):
        load_overrides(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not a file"):  # QA: a directory was "not found"
        load_overrides(tmp_path)
    g = graph_from_model(zoo.resnet_like())
    with pytest.raises(ConfigError, match="matches no node"):
        plan_placement(g, "trt", overrides_from_dict({"exclude": ["/no/such/*"]}))
    with pytest.raises(ConfigError, match="both forced and excluded"):
        plan_placement(g, "trt", overrides_from_dict({"exclude": ["/fc/*"], "force": ["/fc/Gemm"]}))


def test_plan_needs_named_nodes():
    m = zoo.resnet_like()
    m.graph.node[0].name = ""
    from edgeq.errors import QuantError

    with pytest.raises(QuantError, match="unique, non-empty names"):
        plan_placement(graph_from_model(m))
