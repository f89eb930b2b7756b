"""Every Q/DQ model is evaluated as the engine computes it (``edgeq.quant.evaluate``): the arithmetic the
Q/DQ graph defines, the same on every host, not onnxruntime's fused integer kernels (which saturate on
x86 with AVX2 and no VNNI). Pinned against a numpy reference of that arithmetic (tests/qdq_reference.py)
on a small model built in code and quantized by edgeq, through the function every consumer calls."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from qdq_reference import clear_samples, run, small_net

from edgeq.quant.evaluate import ENGINE_ARITHMETIC, Arithmetic, session_options

INTEGER_KERNELS = ("QLinear", "QGemm", "ConvInteger", "MatMulInteger", "DynamicQuantize")


@pytest.fixture(scope="module")
def qdq(tmp_path_factory) -> onnx.ModelProto:
    """small_net quantized by edgeq: --placement all (a Q/DQ pair on every Conv, Add, pool and Gemm input
    and output: the most arithmetic to get right), per-channel int8 weights, max ranges."""
    from edgeq.quant.data import calibration_set
    from edgeq.quant.quantize import QuantizeOptions, quantize_model

    d = tmp_path_factory.mktemp("calib")
    rng = np.random.default_rng(1)
    for i in range(8):
        np.save(d / f"{i}.npy", rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
    model = small_net()
    options = QuantizeOptions(calib=d, calibrator="max", placement="all", holdout=0.0)
    return quantize_model(model, calibration_set(model, d), options).model


def _optimized(model: onnx.ModelProto, arithmetic: Arithmetic, path) -> Counter[str]:
    """The op types of the graph onnxruntime runs for ``arithmetic`` (its optimized model, saved)."""
    import onnxruntime as ort

    so = session_options(arithmetic)
    so.optimized_model_filepath = str(path)
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def test_evaluation_computes_the_qdq_arithmetic_as_numpy_does(qdq):
    from edgeq.quant.accuracy import run_outputs

    weights = {n.input[0]: n for n in qdq.graph.node if n.op_type == "DequantizeLinear"
               and any(i.name == n.input[0] for i in qdq.graph.initializer)}
    scales = {i.name: onnx.numpy_helper.to_array(i) for i in qdq.graph.initializer}
    assert len(weights) == 3 and all(scales[n.input[1]].size > 1 for n in weights.values())  # per-channel
    assert sum(n.op_type == "QuantizeLinear" for n in qdq.graph.node) >= 6
    feeds = clear_samples(qdq, 6, seed=5)
    got = run_outputs(qdq, feeds)  # what the accuracy check, auto, sensitivity and deploy's prediction run
    for feed, out in zip(feeds, got):
        want = run(qdq, feed)[0]["y"]
        np.testing.assert_allclose(out["y"], want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_evaluation_runs_no_integer_kernel_where_onnxruntime_would_fuse(qdq, tmp_path):
    fused = _optimized(qdq, Arithmetic.FUSED, tmp_path / "fused.onnx")
    used = _optimized(qdq, ENGINE_ARITHMETIC, tmp_path / "used.onnx")
    assert any(op.startswith(INTEGER_KERNELS) for op in fused), fused  # onnxruntime's default path fuses
    assert not any(op.startswith(INTEGER_KERNELS) for op in used), used
    # every activation pair runs as written; each weight's DequantizeLinear is folded into a float weight
    activations = sum(n.op_type == "QuantizeLinear" for n in qdq.graph.node)
    assert used["QuantizeLinear"] == used["DequantizeLinear"] == activations
    assert used["Conv"] + used.get("FusedConv", 0) == 2 and used["Gemm"] == 1
