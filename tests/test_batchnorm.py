"""A BatchNormalization after a convolution: clean folds it (float and int8 weights), lint names it in a
Q/DQ model, and the recorded TensorRT 8.6 engines show why (tests/fixtures/trt86-h200-batchnorm)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeq.findings import Level
from edgeq.graph.clean import CleanOptions, clean_model
from edgeq.graph.rules import lint_model
from edgeq.graph.verify import run_model, without_qdq

FIXTURE = Path(__file__).parent / "fixtures" / "trt86-h200-batchnorm" / "outputs.json"
C = 4  # output channels of the convolution


def _bn_params(gamma: np.ndarray) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(1)
    return [numpy_helper.from_array(a.astype(np.float32), n) for a, n in (
        (gamma, "bn_scale"), (rng.normal(size=C), "bn_bias"), (rng.normal(size=C), "bn_mean"),
        (rng.uniform(0.5, 2.0, size=C), "bn_var"))]


def _model(gamma: np.ndarray, *, qdq: bool, q_weight: np.ndarray | None = None) -> onnx.ModelProto:
    """x -> [Q/DQ] -> Conv (3x3, bias) -> BatchNormalization -> Relu [-> Q/DQ] -> y."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(C, 3, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(rng.normal(size=C).astype(np.float32), "b"), *_bn_params(gamma)]
    nodes = []
    x = "x"
    if qdq:
        q = q_weight if q_weight is not None else np.clip(np.rint(w / 0.02), -127, 127).astype(np.int8)
        inits += [numpy_helper.from_array(q, "w_q"),
                  numpy_helper.from_array(np.linspace(0.01, 0.03, C).astype(np.float32), "w_s"),
                  numpy_helper.from_array(np.zeros(C, np.int8), "w_z"),
                  numpy_helper.from_array(np.float32(0.03), "a_s"),
                  numpy_helper.from_array(np.int8(0), "a_z")]
        nodes += [helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], axis=0, name="w_DQ"),
                  helper.make_node("QuantizeLinear", ["x", "a_s", "a_z"], ["xq"], name="x_Q"),
                  helper.make_node("DequantizeLinear", ["xq", "a_s", "a_z"], ["xd"], name="x_DQ")]
        x = "xd"
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    nodes += [helper.make_node("Conv", [x, "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
              helper.make_node("BatchNormalization", ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["n"],
                               epsilon=1e-5, name="bn"),
              helper.make_node("Relu", ["n"], ["r"], name="relu")]
    if qdq:
        nodes += [helper.make_node("QuantizeLinear", ["r", "a_s", "a_z"], ["rq"], name="r_Q"),
                  helper.make_node("DequantizeLinear", ["rq", "a_s", "a_z"], ["y"], name="r_DQ")]
    else:
        nodes.append(helper.make_node("Identity", ["r"], ["y"], name="out"))
    g = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, C, 8, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


GAMMA = np.array([1.5, -0.7, 0.0, 0.3], np.float32)  # a negative and a zero channel too
X = np.random.default_rng(2).normal(size=(2, 3, 8, 8)).astype(np.float32)


def _ops(m: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in m.graph.node]


def _run(m: onnx.ModelProto) -> np.ndarray:
    return run_model(m, {"x": X}, "test")["y"]


def test_clean_folds_a_batchnorm_into_the_float_convolution_before_it() -> None:
    m = _model(GAMMA, qdq=False)
    result = clean_model(m, CleanOptions())
    assert "BatchNormalization" not in _ops(result.model)
    assert any(c.pass_name == "fold_batchnorm" and "folded 1" in c.message for c in result.changes)
    assert result.verification is not None and result.verification.passed
    np.testing.assert_allclose(_run(result.model), _run(m), rtol=1e-5, atol=1e-5)


def test_clean_folds_a_batchnorm_into_int8_weights_exactly_and_lint_stops_naming_it() -> None:
    m = _model(GAMMA, qdq=True)
    before = [f for f in lint_model(m) if f.rule == "qdq-conv-batchnorm"]
    assert len(before) == 1 and before[0].level == Level.ERROR and "bn" in before[0].nodes

    result = clean_model(m, CleanOptions())
    out = result.model
    assert "BatchNormalization" not in _ops(out)
    assert not [f for f in lint_model(out) if f.rule == "qdq-conv-batchnorm"]
    # The weight is still int8 behind a per-channel DQ: the old values with the BN's sign, positive scales.
    inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    conv = next(n for n in out.graph.node if n.op_type == "Conv")
    dq = next(n for n in out.graph.node if n.output[0] == conv.input[1])
    q_new, s_new = inits[dq.input[0]], inits[dq.input[1]]
    q_old = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}["w_q"]
    assert q_new.dtype == np.int8 and (s_new > 0).all()
    assert (q_new[0] == q_old[0]).all() and (q_new[1] == -q_old[1]).all() and (q_new[2] == 0).all()
    # Exact in real arithmetic: the float graphs agree to float32 rounding, and verify compares those.
    np.testing.assert_allclose(_run(without_qdq(out)), _run(without_qdq(m)), rtol=1e-5, atol=1e-5)
    assert result.verification is not None and result.verification.passed
    assert any("float graphs" in n for n in result.verification.notes)


def test_an_int8_weight_of_minus_128_under_a_negative_scale_is_left_and_still_named() -> None:
    q = np.clip(np.rint(np.random.default_rng(0).normal(size=(C, 3, 3, 3)) / 0.02), -127, 127).astype(np.int8)
    q[1, 0, 0, 0] = -128  # channel 1's BN factor is negative: +128 does not fit int8
    m = _model(GAMMA, qdq=True, q_weight=q)
    result = clean_model(m, CleanOptions())
    assert "BatchNormalization" in _ops(result.model)
    left = [c for c in result.changes if c.pass_name == "fold_batchnorm"]
    assert left and "left 1" in left[0].message and "-128" in left[0].message
    assert [f for f in lint_model(result.model) if f.rule == "qdq-conv-batchnorm"]


def test_quantize_prepares_a_model_with_its_batchnorm_folded() -> None:
    from edgeq.quant.quantize import prepare_model

    prepared, changes, _ = prepare_model(_model(GAMMA, qdq=False))
    assert "BatchNormalization" not in _ops(prepared)
    assert any(c.startswith("fold_batchnorm: folded 1") for c in changes)


def test_the_recorded_engines_that_disagree_with_onnxruntime_are_the_unfolded_ones() -> None:
    """Real TensorRT 8.6 outputs (H200): edgeq's accuracy stage reads an unfolded Q/DQ engine as a
    mismatch with onnxruntime's prediction, and the folded one as following it."""
    from edgeq.pipeline.accuracy import MISMATCH_COSINE
    from edgeq.quant.metrics import ClassificationMetric, CosineMetric

    rec = json.loads(FIXTURE.read_text())
    name = "p"

    def samples(rows: list[list[float]]) -> list[dict[str, np.ndarray]]:
        return [{name: np.asarray([r], np.float32)} for r in rows]

    fp32 = samples(rec["onnxruntime"]["fp32"])
    for engine, model in (("qdq_i8f16", "qdq"), ("qdq_i8", "qdq"), ("unf_i8f16", "unf_qdq")):
        got, predicted = samples(rec["engines"][engine]["outputs"]), samples(rec["onnxruntime"][model])
        assert CosineMetric().score(predicted, got).value < MISMATCH_COSINE, engine
        assert ClassificationMetric().score(fp32, predicted).value == 1.0
        assert ClassificationMetric().score(fp32, got).value < 0.75, engine
    got = samples(rec["engines"]["fold_i8f16"]["outputs"])
    predicted = samples(rec["onnxruntime"]["folded_qdq"])
    assert CosineMetric().score(predicted, got).value > 0.99
    assert ClassificationMetric().score(fp32, got).value == 1.0


FOLDED = Path(__file__).parent / "fixtures" / "trt86-h100-folded"


def test_deployed_with_its_batchnorm_folded_the_engine_does_what_onnxruntime_predicted() -> None:
    """The H100 deploy of the real classifier (clean folded its 35 BatchNormalizations): edgeq's accuracy
    record, read back, is a pass with TensorRT level with onnxruntime's prediction (16 of 16 each, where
    the unfolded engine on the H200 read 6 of 16), and says exactly what the deploy printed."""
    from edgeq.pipeline.accuracy import MISMATCH_COSINE, read_accuracy
    from edgeq.pipeline.stages import summary_figure

    acc = read_accuracy(FOLDED)
    assert acc is not None and acc.gated and acc.passed and acc.samples == 16
    assert acc.predicted is not None and acc.engine.value == acc.predicted.value == 1.0
    assert acc.agreement is not None and acc.agreement.value > MISMATCH_COSINE
    printed = (FOLDED / "deploy.txt").read_text()
    # recorded when --gate accuracy allowed a flat 0.01 below the prediction; now one unit of the headline
    assert acc.tolerance == pytest.approx(1 / 16)
    assert f"accuracy: ok - {acc.summary()}\n".replace("within 0.0625 ", "within 0.01 ") in printed
    assert "clean: ok - 6 changes" in printed and "explicit-int8 engine" in printed
    # the python backend's unrounded profile figures, as the summary line now gives them
    prof = json.loads((FOLDED / "agent-profile.json").read_text())["result"]
    assert prof["latency_ms"]["median"] == 0.6699479999952018
    assert summary_figure(prof["latency_ms"]["median"], ".4g") == "0.6699"
    assert summary_figure(prof["throughput_qps"], ".0f") == "1403"
    assert summary_figure(None, ".4g") == "?"
