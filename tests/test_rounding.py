"""``--weights adaround`` (edgeq.quant.rounding): each int8 weight floor or ceil of w/scale, chosen to lower
its layer's output error on calibration activations; the Q/DQ model otherwise identical to nearest
rounding's.

Models are built in code. Inputs are smooth images (a coarse random grid upsampled, plus a little noise):
neighbouring pixels correlate as in real images, which is where a layer's rounding errors can cancel (on
independent N(0,1) inputs every weight's error adds alone and nearest is already the best choice).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import ROOT
from onnx import TensorProto, helper, numpy_helper

from edgeq import zoo
from edgeq.graph.io import graph_from_model
from edgeq.quant.autocalib import TIE, choose_calibrator
from edgeq.quant.data import calibration_set
from edgeq.quant.metrics import TaskScore
from edgeq.quant.placement import plan_placement
from edgeq.quant.quantize import QuantizeOptions, build_qdq, prepare_model, quantize_model
from edgeq.quant.rounding import ADAROUND, RoundingOptions, layer_of, learn_rounding, patches

CPU = ["CPUExecutionProvider"]


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_quant_qdq", "1")  # Q/DQ computed as written
    return ort.InferenceSession(model.SerializeToString(), so, providers=CPU)


def _run(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    s = _session(model)
    return [s.run(None, f)[0] for f in feeds]


def smooth(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """A batch of smooth images: a coarse N(0,1) grid repeated 4x4, plus N(0, 0.05) noise."""
    rng = np.random.default_rng(seed)
    b, c, h, w = shape
    coarse = rng.normal(size=(b, c, -(-h // 4), -(-w // 4)))
    x = np.repeat(np.repeat(coarse, 4, axis=2), 4, axis=3)[:, :, :h, :w]
    return (x + rng.normal(scale=0.05, size=shape)).astype(np.float32)


def one_node(op: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...], seed: int = 0,
             **attrs) -> onnx.ModelProto:
    """One weighted node (no bias) reading graph input x: its output is what the layer computes."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.normal(size=w_shape).astype(np.float32), "w")
    node = helper.make_node(op, ["x", "w"], ["y"], name=f"the_{op}", **attrs)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))
    graph = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


LAYERS = {
    "conv strided, dilated, asymmetric pads": ("Conv", (2, 4, 9, 11), (6, 4, 3, 3), {
        "strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
    "conv in 2 groups": ("Conv", (1, 4, 8, 8), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    "depthwise SAME_UPPER stride 2": ("Conv", (1, 4, 7, 7), (4, 1, 3, 3),
                                      {"group": 4, "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "conv 1-D dilated": ("Conv", (2, 3, 10), (5, 3, 3), {"dilations": [2]}),
    "convtranspose stride 2, pads, output_padding": ("ConvTranspose", (1, 4, 5, 6), (4, 3, 3, 3),
                                                     {"strides": [2, 2], "pads": [1, 0, 1, 1],
                                                      "output_padding": [1, 0], "dilations": [1, 2]}),
    "convtranspose in 2 groups": ("ConvTranspose", (1, 4, 3, 3), (4, 2, 2, 2),
                                  {"group": 2, "strides": [2, 2]}),
    "gemm transB": ("Gemm", (5, 7), (3, 7), {"transB": 1}),
    "gemm transA": ("Gemm", (7, 5), (7, 3), {"transA": 1}),
    "matmul 3-D input": ("MatMul", (2, 5, 7), (7, 3), {}),
}


@pytest.mark.parametrize("case", list(LAYERS))
def test_patches_times_rows_is_the_layer_output(case: str) -> None:
    """The layer as rows x patches (what every error is computed from) reproduces onnxruntime's output
    exactly, position by position: strides, pads, dilations, groups, auto_pad, ConvTranspose, Gemm."""
    op, x_shape, w_shape, attrs = LAYERS[case]
    model = one_node(op, x_shape, w_shape, **attrs)
    x = np.random.default_rng(1).normal(size=x_shape).astype(np.float32)
    y = ort.InferenceSession(model.SerializeToString(), providers=CPU).run(None, {"x": x})[0]
    node = graph_from_model(model).nodes[0]
    layer = layer_of(node, None)
    assert not isinstance(layer, str), layer
    cols = patches(layer, [x], 10**9, np.random.default_rng(0))[0]  # (groups, K, positions)
    got = layer.rows @ cols  # (groups, rows, positions)
    if op in ("Gemm", "MatMul"):
        want = y.reshape(-1, y.shape[-1]).T[None]
    else:  # (B, C, out...) -> (C, B * out) -> (groups, C / groups, positions)
        want = np.moveaxis(y, 1, 0).reshape(y.shape[1], -1).reshape(layer.groups, -1, cols.shape[2])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _weights_only(model: onnx.ModelProto):
    reference, _, _ = prepare_model(model)
    plan = plan_placement(graph_from_model(reference), "trt")
    return reference, replace(plan, sites=(), groups={}, group_ids={})


def _int8_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The int8 weights a Q/DQ model stores (``insert_qdq`` names them ``<weight>_quantized``)."""
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer
            if i.data_type == TensorProto.INT8 and i.name.endswith("_quantized")}


def _check_floor_or_ceil(reference: onnx.ModelProto, qdq: onnx.ModelProto) -> int:
    """Every int8 weight of ``qdq`` is floor or ceil of w / scale (its DequantizeLinear's scale), within
    [-127, 127]; returns how many differ from round-half-to-even."""
    floats = {i.name: numpy_helper.to_array(i) for i in reference.graph.initializer}
    inits = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    differ = 0
    for n in qdq.graph.node:
        if n.op_type != "DequantizeLinear" or inits.get(n.input[0]) is None or inits[n.input[0]].ndim == 0:
            continue
        q, scale = inits[n.input[0]], inits[n.input[1]]
        w = floats[n.input[0][: -len("_quantized")]]
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
        shape = [1] * w.ndim
        if scale.ndim:
            shape[axis] = -1
        ratio = w / scale.reshape(shape)
        assert ((q == np.floor(ratio)) | (q == np.ceil(ratio))).all()
        assert q.min() >= -127 and q.max() <= 127
        differ += int((q != np.rint(ratio)).sum())
    return differ


def test_learned_rounding_lowers_the_layer_error_on_fresh_inputs() -> None:
    """A 3x3 convolution of 16 channels: learned from 8 calibration images, its output error on 8 other
    images is well below nearest rounding's (measured: 0.55x at seed 0 to 3), and every value is floor
    or ceil of w / scale."""
    model = one_node("Conv", (1, 16, 24, 24), (32, 16, 3, 3), pads=[1, 1, 1, 1])
    reference, plan = _weights_only(model)
    calib = [{"x": smooth((1, 16, 24, 24), s)} for s in range(8)]
    fresh = [{"x": smooth((1, 16, 24, 24), 100 + s)} for s in range(8)]
    rounding = learn_rounding(reference, plan, calib, RoundingOptions(samples=8))
    assert len(rounding.layers) == 1 and not rounding.skipped
    layer = rounding.layers[0]
    assert layer.learned < 0.8 * layer.nearest and layer.flipped > 0  # on the calibration activations
    fp32 = _run(reference, fresh)
    err = {}
    for name, values in (("nearest", None), ("learned", rounding.values)):
        qdq = build_qdq(reference, plan, {}, values)
        err[name] = sum(float(np.square(a - b).sum()) for a, b in zip(fp32, _run(qdq, fresh)))
        if values is not None:
            assert _check_floor_or_ceil(reference, qdq) == layer.flipped > 0
    assert err["learned"] < 0.8 * err["nearest"], err


def test_quantized_inputs_make_up_for_the_input_quantization() -> None:
    """Full INT8 (activation Q/DQ before the conv, its range clipping 4% of the input): the rounding
    learned against the quantized input lowers the layer's output error on fresh images below nearest's
    and below the rounding learned on FP32's input, which does not know the input is quantized
    (measured, seeds 0 and 3: 0.955x and 0.957x nearest's, against 0.997x and 0.998x)."""
    model = one_node("Conv", (1, 16, 24, 24), (32, 16, 3, 3), pads=[1, 1, 1, 1], seed=3)
    reference, _, _ = prepare_model(model)
    plan = plan_placement(graph_from_model(reference), "trt")
    assert plan.sites and plan.weights
    calib = [{"x": smooth((1, 16, 24, 24), s)} for s in range(8)]
    fresh = [{"x": smooth((1, 16, 24, 24), 100 + s)} for s in range(8)]
    amax = {t: 2.0 for t in plan.tensors}  # |x| > 2 clipped: an input error the weights can make up for
    activations = build_qdq(reference, replace(plan, weights=()), amax)  # the input's Q/DQ, weights float
    fp32 = _run(reference, fresh)

    def error(values) -> float:
        got = _run(build_qdq(reference, plan, amax, values), fresh)
        return sum(float(np.square(a - b).sum()) for a, b in zip(fp32, got))

    opts = RoundingOptions(samples=8)
    quant_in = learn_rounding(reference, plan, calib, opts, quantized=activations)
    fp32_in = learn_rounding(reference, plan, calib, opts)
    assert quant_in.quantized_inputs and not fp32_in.quantized_inputs
    assert error(quant_in.values) < 0.97 * error(None)
    assert error(quant_in.values) < 0.98 * error(fp32_in.values)


def _node(n: onnx.NodeProto) -> tuple:
    return n.op_type, n.name, list(n.input), list(n.output), [str(x) for x in n.attribute]


def _pair(name: str):
    """``name`` from the zoo quantized with nearest and with learned rounding (synthetic data, max)."""
    model = getattr(zoo, name)(size=32)
    data = calibration_set(model, None, synthetic=4, seed=0)
    opts = QuantizeOptions(synthetic=4, calibrator="max", holdout=0.0)
    near = quantize_model(model, data, replace(opts, weights="nearest"))
    learned = quantize_model(model, data, replace(opts, weights="adaround"))
    assert near.choice.weights == "nearest" and learned.choice.weights == ADAROUND
    return near, learned


def _same_but_int8_weight_values(near, learned) -> None:
    """Same nodes in the same order (op, name, inputs, outputs, attributes), same graph inputs and outputs,
    the same initializers bit for bit (every scale and zero point) except the int8 weights' values, each
    floor or ceil of w / scale; the same plan, Q/DQ scales and calibration cache."""
    a, b = near.model.graph, learned.model.graph
    assert [_node(n) for n in a.node] == [_node(n) for n in b.node]
    assert [str(x) for x in (*a.input, *a.output)] == [str(x) for x in (*b.input, *b.output)]
    ia = {i.name: i for i in a.initializer}
    ib = {i.name: i for i in b.initializer}
    assert list(ia) == list(ib)
    changed = [k for k in ia if ia[k].SerializeToString() != ib[k].SerializeToString()]
    weights = _int8_weights(near.model)
    assert changed and set(changed) <= set(weights)  # only int8 weight values differ
    for k in changed:
        assert (ia[k].dims, ia[k].data_type) == (ib[k].dims, ib[k].data_type)
    assert _check_floor_or_ceil(learned.reference, learned.model) > 0
    assert learned.plan == near.plan and learned.scales == near.scales and learned.cache == near.cache
    d = learned.to_dict()
    assert d["weight_rounding"] == ADAROUND and len(d["rounding"]["layers"]) == len(weights)


@pytest.mark.parametrize("name", ["unet_like", "resnet_like"])
def test_the_qdq_model_is_nearest_rounding_s_node_for_node(name: str) -> None:
    """The same Q/DQ placement and scales, only the int8 weights' values differ: TensorRT 8.6 reads the
    graph, and an int8 weight's values change no fusion, precision or layer (ConvTranspose: unet_like)."""
    _same_but_int8_weight_values(*_pair(name))


def test_yolo_like_lints_and_maps_onto_its_engine_s_layers_the_same() -> None:
    """The zoo's YOLO-like net: node for node the same model; edgeq's TensorRT 8.6 rules find the same in
    both; and the layers of the engine TensorRT 8.6 built from edgeq's placement of this net
    (tests/fixtures/trt86-h100-placed, H100) map onto the same nodes of each, every layer that names
    nodes naming nodes of both graphs."""
    from edgeq.graph.rules import lint_model
    from edgeq.report.compare_engine import engine_from_path

    near, learned = _pair("yolo_like")
    _same_but_int8_weight_values(near, learned)
    assert [f.to_dict() for f in lint_model(near.model)] == [f.to_dict() for f in lint_model(learned.model)]
    fixture = ROOT / "tests" / "fixtures" / "trt86-h100-placed" / "yolo_edgeq.explicit.layers.json"
    maps = []
    for m in (near.model, learned.model):
        report = engine_from_path(fixture, onnx_model=m).report
        assert report is not None
        maps.append([(rl.name, tuple(rl.onnx_nodes)) for rl in report.layers])
    assert maps[0] == maps[1]
    named = [nodes for _, nodes in maps[0] if nodes]
    in_graph = {n.name for n in near.model.graph.node}
    assert len(named) > 30 and all(set(nodes) <= in_graph for nodes in named)


def test_budget_spent_keeps_nearest_and_says_so() -> None:
    model = one_node("Conv", (1, 8, 12, 12), (8, 8, 3, 3))
    reference, plan = _weights_only(model)
    r = learn_rounding(reference, plan, [{"x": smooth((1, 8, 12, 12), 0)}], RoundingOptions(budget_s=1e-9))
    assert r.values == {} and r.layers == ()
    assert r.skipped == (("the_Conv", "the rounding budget (1e-09 s) spent"),)
    assert "no layer learned" in r.summary()
    assert build_qdq(reference, plan, {}, r.values).SerializeToString() == \
           build_qdq(reference, plan, {}).SerializeToString()


def test_a_batched_matmul_weight_keeps_nearest_with_why() -> None:
    w = numpy_helper.from_array(np.ones((2, 4, 3), np.float32), "w3")
    nodes = [helper.make_node("MatMul", ["x", "w3"], ["y"], name="batched")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    node = graph_from_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])).nodes[0]
    assert layer_of(node, None) == "MatMul weight of rank 3"


def test_auto_scores_each_calibrator_with_each_rounding_and_learns_only_when_needed() -> None:
    """``choose_calibrator`` with ``weights=(nearest, adaround)``: every calibrator with nearest rounding,
    then every one with the learned rounding (the worst samples of the best so far first, asked to beat
    it by more than TIE); the best pair is kept, and the learned rounding is built only once a nearest
    candidate has left room to beat (none agreed with FP32 everywhere)."""
    from edgeq.quant.calibrate import CalibOptions, TensorHistogram

    hist = TensorHistogram()
    hist.update(np.random.default_rng(0).normal(size=4096).astype(np.float32))
    built: list[tuple[str, str]] = []

    def build(amax, weights):
        m = onnx.ModelProto()
        m.producer_name = "max" if amax["t"] == pytest.approx(hist.amax) else "other"
        m.producer_version = weights
        built.append((m.producer_name, weights))
        return m

    def scorer(ranks):
        def score(model, beat, order):
            r = ranks[(model.producer_name, model.producer_version)]
            ran = beat is None or r > beat
            return TaskScore("x", r, f"{r}", per_sample=(r, r - 0.1)), ([{}, {}] if ran else None), None
        return score

    def choose(ranks, perfect=None):
        built.clear()
        return choose_calibrator(("max", "percentile"), {"t": hist}, CalibOptions(), build, scorer(ranks),
                                 perfect=perfect, weights=("nearest", ADAROUND))

    ranks = {("max", "nearest"): 0.8, ("other", "nearest"): 0.7, ("max", ADAROUND): 0.75,
             ("other", ADAROUND): 0.85}
    c = choose(ranks)
    assert built == [("max", "nearest"), ("other", "nearest"), ("max", ADAROUND), ("other", ADAROUND)]
    assert (c.method, c.weights) == ("percentile", ADAROUND)
    assert c.kept.label == "percentile + adaround weights"
    assert "auto chose percentile + adaround weights" in c.summary()
    ranks[("other", ADAROUND)] = 0.8 + TIE / 2  # not above the best by more than TIE: nearest stays
    c = choose(ranks)
    assert (c.method, c.weights) == ("max", "nearest") and len(c.candidates) == 4
    c = choose({**ranks, ("max", "nearest"): 1.0}, perfect=1.0)  # nothing left to win: nothing learned
    assert built == [("max", "nearest")] and c.untried == ("percentile", "max + adaround weights",
                                                           "percentile + adaround weights")


def test_quantize_auto_scores_the_learned_rounding(tmp_path) -> None:
    """End to end on real held-out samples (--calibrator auto, the default): the learned rounding is one
    more candidate, and the model holds its int8 weights exactly when it was kept."""
    model = zoo.resnet_like()
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    for part, seeds in (("calib", range(8)), ("held", range(50, 56))):
        (tmp_path / part).mkdir()
        for s in seeds:
            np.save(tmp_path / part / f"{s}.npy", smooth(tuple(shape), s))
    data = calibration_set(model, tmp_path / "calib")
    opts = QuantizeOptions(calib=tmp_path / "calib", holdout_data=tmp_path / "held")
    result = quantize_model(model, data, opts)
    choice = result.choice
    assert choice.auto and choice.rounding is not None and not choice.rounding.quantized_inputs
    learned = [c for c in choice.candidates if c.weights == ADAROUND]
    assert [c.method for c in learned] == [c.method for c in choice.candidates if c.weights == "nearest"]
    assert (choice.weights == ADAROUND) == (choice.kept in learned)
    stored = _int8_weights(result.model)
    holds = all(np.array_equal(stored[f"{t}_quantized"], v) for t, v in choice.rounding.values.items())
    assert holds == (choice.weights == ADAROUND)
    d = json.loads(json.dumps(result.to_dict(), default=str))
    assert d["weight_rounding"] == choice.weights and d["rounding"]["layers"]
    assert [c["weights"] for c in d["calibrators"]][-1] == ADAROUND
    assert ("not kept" in result.rounding_line()) == (choice.weights != ADAROUND)
    # without held-out samples the samples that score were learned from: auto keeps nearest, and says why
    alone = quantize_model(model, data, QuantizeOptions(calib=tmp_path / "calib"))
    assert alone.choice.auto and alone.choice.rounding is None and alone.choice.weights == "nearest"
    assert {c.weights for c in alone.choice.candidates} == {"nearest"}
    assert any(n.startswith("nearest weight rounding: --weights auto scores") for n in alone.notes)


def test_cli_weights_option(tmp_path, cli) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(zoo.resnet_like(), src)
    code, out, err = cli("quantize", src, "--synthetic", "4", "--calibrator", "max", "--weights", "adaround")
    assert code == 0, out + err
    d = json.loads((tmp_path / "m.int8.json").read_text())
    assert d["weight_rounding"] == "adaround" and d["rounding"]["layers"]
    assert "weights: learned rounding on" in out
    code, out, err = cli("quantize", src, "--synthetic", "4", "--weights", "upward")
    assert code == 2 and "upward" in (out + err) and "Traceback" not in (out + err)


def test_pipeline_and_cache_key_take_weights(tmp_path) -> None:
    from edgeq.errors import ConfigError
    from edgeq.orchestration.placement_cache import calibration_digest
    from edgeq.orchestration.run import load_spec

    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "0.npy", np.zeros((1, 3, 8, 8), np.float32))
    p = tmp_path / "p.yaml"
    p.write_text(f"model: zoo:resnet\ncalib: {tmp_path / 'calib'}\nquantize: {{weights: adaround}}\n")
    spec = load_spec(p)
    assert spec.quantize.weights == "adaround"
    auto = replace(spec.quantize, weights="auto")
    keys = {calibration_digest(replace(auto, weights=w)) for w in ("auto", "nearest", "adaround")}
    assert len(keys) == 3
    p.write_text(f"model: zoo:resnet\ncalib: {tmp_path / 'calib'}\nquantize: {{weights: upward}}\n")
    with pytest.raises(ConfigError, match=r"p\.yaml: 'quantize': unknown --weights 'upward'"):
        load_spec(p)
