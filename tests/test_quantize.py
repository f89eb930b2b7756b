"""``edgeq quantize`` end to end: numerics in onnxruntime, the calibration cache against the Q/DQ
scales, the CLI's files, summary and exit codes.

Measured on these models (seeded N(0,1) synthetic data, 12 samples, 3 held out, trt placement), mean
cosine FP32 vs Q/DQ over the held-out samples: resnet_like >= 0.99997 (top-1 agreement 100%),
unet_like >= 0.9992, yolo_like 0.988-0.993 with entropy and 0.995-0.997 with max/percentile/mse
(3 seeds each). The asserted bounds leave margin below those figures.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import pytest

from edgeq import zoo
from edgeq.graph.io import load_model
from edgeq.quant.cache import read_calibration_cache
from edgeq.quant.calibrate import activation_scale
from edgeq.quant.data import calibration_set
from edgeq.quant.qdq import activation_scales
from edgeq.quant.quantize import QuantizeOptions, quantize_file, quantize_model

COSINE = {"resnet_like": 0.9999, "yolo_like": 0.985, "unet_like": 0.998}


@pytest.mark.parametrize("name", list(COSINE))
def test_qdq_model_stays_close_to_fp32(name):
    model = getattr(zoo, name)()
    data = calibration_set(model, None, synthetic=12, seed=0)
    result = quantize_model(model, data, QuantizeOptions(holdout=0.25))  # entropy, trt placement
    acc = result.accuracy
    assert acc is not None and acc.samples == 3 and result.calibration_samples == 9
    assert acc.cosine >= COSINE[name], str(acc)
    assert acc.cosine < 1.0  # it is quantized: not bit-identical
    assert f"{len(result.plan.sites)} activation Q/DQ pairs" in result.summary_line()
    out = acc.outputs[0]
    assert out.max_abs_error > 0
    if name == "resnet_like":  # (1, 10) logits: a classifier
        assert out.top1 == 1.0
    else:
        assert out.top1 is None
    # an independent check of the same figure on fresh inputs, straight from onnxruntime
    import onnxruntime as ort

    feeds = zoo.random_inputs(model, seed=99)
    cpu = ["CPUExecutionProvider"]
    ref = ort.InferenceSession(model.SerializeToString(), providers=cpu).run(None, feeds)[0]
    q = ort.InferenceSession(result.model.SerializeToString(), providers=cpu).run(None, feeds)[0]
    cos = float(np.dot(ref.ravel(), q.ravel()) / np.linalg.norm(ref) / np.linalg.norm(q))
    assert cos >= COSINE[name] - 0.005


@pytest.mark.parametrize("name", ["yolo_like", "unet_like"])
def test_calibration_cache_matches_qdq_scales(tmp_path, name):
    src = tmp_path / f"{name}.onnx"
    onnx.save(getattr(zoo, name)(), src)
    result = quantize_file(src, QuantizeOptions(calibrator="max", synthetic=6))
    header, cache = read_calibration_cache(tmp_path / f"{name}.int8.cache")
    assert header == "TRT-8600-EntropyCalibration2"
    qdq = activation_scales(load_model(tmp_path / f"{name}.int8.onnx"))
    assert len(qdq) == len(result.plan.sites) > 10
    for tensor, scale in qdq.items():
        assert cache[tensor] == scale, tensor  # bit-identical float32 scales
    # the cache covers every activation tensor of the cleaned model (implicit path), not just the plan's
    assert set(cache) == set(result.plan.activations)
    assert len(cache) > len(qdq)
    # scale groups: commuted tensors (Concat/Split outputs) carry their group's scale in the cache too
    for t in result.plan.commuted:
        members = result.plan.groups[result.plan.group_of(t)]
        assert cache[t] == cache[members[0]]
    # and every other tensor its own calibrated range
    others = set(cache) - set(qdq) - set(result.plan.commuted)
    assert all(cache[t] == pytest.approx(activation_scale(result.amax[t])) for t in others)


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_cli_quantize_synthetic_writes_model_cache_and_summary(tmp_path, cli):
    src = tmp_path / "m.onnx"
    onnx.save(zoo.resnet_like(), src)
    before = _sha(src)
    code, out, err = cli("quantize", src, "--synthetic", "8")
    assert code == 0, err
    assert (tmp_path / "m.int8.onnx").is_file() and (tmp_path / "m.int8.cache").is_file()
    assert (tmp_path / "m.int8.fp32.onnx").is_file()
    saved = json.loads((tmp_path / "m.int8.json").read_text())
    assert saved["fp32_model"] == str(tmp_path / "m.int8.fp32.onnx")
    # 6 weighted-op inputs, 1 residual skip, 1 pool input (pool-tail)
    assert saved["quantized"]["activations"] == 8 and saved["output"] == str(tmp_path / "m.int8.onnx")
    assert _sha(src) == before
    assert "activation Q/DQ pairs" in out and "residual-add" in out and "top-1" in out
    # --json: the same summary, machine-readable
    code, out, _ = cli("quantize", src, "--synthetic", "8", "-o", tmp_path / "o.onnx",
                       "--cache", tmp_path / "o.cache", "--json", "--calibrator", "percentile")
    assert code == 0
    s = json.loads(out)
    assert s["output"] == str(tmp_path / "o.onnx") and s["cache"] == str(tmp_path / "o.cache")
    assert s["fp32_model"] == str(tmp_path / "o.fp32.onnx")  # named after the cache it goes with
    assert s["quantized"]["activations"] == 8 and s["quantized"]["weights"] == 7
    assert s["float"]["by_rule"]["conv-act-maxpool"] == 1
    assert {"tensor": "/relu/Relu_output_0", "rule": "conv-act-maxpool"} in s["float_tensors"]
    assert s["rules"]["residual-add"]["source"]
    # no --holdout: every sample calibrates and is scored
    assert s["accuracy"]["samples"] == s["samples"]["calibration"] == 8
    assert s["accuracy"]["outputs"][0]["top1_agreement"] is not None
    assert s["calibrator"] == "percentile" and s["exit_code"] == 0
    assert (tmp_path / "o.onnx").is_file() and (tmp_path / "o.cache").is_file()


def test_cli_placement_all_and_min_cosine_gate(tmp_path, cli):
    src = tmp_path / "y.onnx"
    onnx.save(zoo.unet_like(size=32), src)
    code, out, _ = cli("quantize", src, "--synthetic", "5", "--placement", "all", "--json")
    s = json.loads(out)
    assert code == 0 and s["placement"] == "all" and s["quantized"]["activations"] > 20
    code, out, _ = cli("lint", tmp_path / "y.int8.onnx", "--json")
    assert "concat-scale" in {f["rule"] for f in json.loads(out)["findings"]}
    # a gate the Q/DQ model cannot meet: exit 1, the figure printed, files still written
    (tmp_path / "y.int8.onnx").unlink()
    code, out, _ = cli("quantize", src, "--synthetic", "5", "--min-cosine", "0.9999999")
    assert code == 1
    assert "fails --min-cosine 0.9999999" in out
    assert (tmp_path / "y.int8.onnx").is_file()
    code, out, _ = cli("quantize", src, "--synthetic", "5", "--min-cosine", "0.9")
    assert code == 0 and "passes --min-cosine 0.9" in out


def _one_line_error(code: int, out: str, err: str, *words: str) -> None:
    assert code == 2, (out, err)
    lines = [x for x in err.strip().splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]


def test_cli_bad_calibration_data_exits_2(tmp_path, cli):
    src = tmp_path / "m.onnx"
    onnx.save(zoo.resnet_like(size=32), src)  # input (1, 3, 32, 32)
    cases = {
        "shape": (np.zeros((1, 3, 16, 16), np.float32), "(1, 3, 16, 16)"),
        "dtype": (np.zeros((1, 3, 32, 32), np.complex64), "complex64"),
        "nan": (np.full((1, 3, 32, 32), np.nan, np.float32), "NaN"),
    }
    for case, (array, word) in cases.items():
        d = tmp_path / case
        d.mkdir()
        np.save(d / "a.npy", np.zeros((1, 3, 32, 32), np.float32))
        np.save(d / "b.npy", array)
        _one_line_error(*cli("quantize", src, "--calib", d), word)
    (tmp_path / "empty").mkdir()
    _one_line_error(*cli("quantize", src, "--calib", tmp_path / "empty"), "no calibration data")
    _one_line_error(*cli("quantize", src), "--calib DIR or --synthetic N")
    assert not (tmp_path / "m.int8.onnx").exists() and not (tmp_path / "m.int8.cache").exists()


def test_cli_bad_inputs_exit_2(tmp_path, cli):
    src = tmp_path / "m.onnx"
    model = zoo.resnet_like(size=32)
    onnx.save(model, src)
    bad = tmp_path / "o.yaml"
    bad.write_text("exclude: [\n")
    _one_line_error(*cli("quantize", src, "--synthetic", "3", "--overrides", bad), "invalid YAML")
    bad.write_text("exclude: ['/nothing/*']\n")
    _one_line_error(*cli("quantize", src, "--synthetic", "3", "--overrides", bad), "matches no node")
    _one_line_error(*cli("quantize", src, "--synthetic", "3", "--holdout", "1.5"), "--holdout")
    _one_line_error(*cli("quantize", src, "--synthetic", "3", "-o", src), "is the input model")
    _one_line_error(*cli("quantize", src, "--synthetic", "3", "-o", tmp_path / "o.fp32.onnx",
                         "--cache", tmp_path / "o.cache"), "the output and the FP32 model would both be")
    qdq = tmp_path / "q.onnx"
    onnx.save(zoo.qdq_ort(model, quantize_bias=False, samples=1), qdq)
    _one_line_error(*cli("quantize", qdq, "--synthetic", "3"), "already quantized")
    _one_line_error(*cli("quantize", tmp_path / "missing.onnx", "--synthetic", "3"), "no such file")


def test_cli_every_output_path_collision_is_refused(tmp_path, cli):
    """Issue 20.3: `-o b2.onnx --cache b2.json` wrote the summary JSON over the cache (exit 0)."""
    src = tmp_path / "b.onnx"
    onnx.save(zoo.resnet_like(size=32), src)
    out = tmp_path / "b2.onnx"
    for cache, what in (
        (tmp_path / "b2.json", "the cache and the summary would both be"),  # the summary: <-o stem>.json
        (tmp_path / "x" / ".." / "b2.json", "the cache and the summary would both be"),
        (out, "the output and the cache would both be"),
    ):
        _one_line_error(*cli("quantize", src, "--synthetic", "3", "-o", out, "--cache", cache), what)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["b.onnx"], cache  # nothing written


def test_cli_unwritable_output_fails_before_work_and_cache_goes_beside_o(tmp_path, cli):
    # QA: `-o DIR` calibrated first, then failed, leaving m.int8.cache behind; `--cache DIR` was a traceback;
    # with `-o elsewhere/q.onnx` the cache and its FP32 model landed beside the input, not with the model.
    src = tmp_path / "m.onnx"
    onnx.save(zoo.resnet_like(size=32), src)
    (tmp_path / "adir").mkdir()
    _one_line_error(*cli("quantize", src, "--synthetic", "3", "-o", tmp_path / "adir"), "directory")
    _one_line_error(*cli("quantize", src, "--synthetic", "3", "--cache", tmp_path / "adir"), "directory")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["adir", "m.onnx"]
    code, _, err = cli("quantize", src, "--synthetic", "3", "-o", tmp_path / "out" / "q.onnx")
    assert code == 0, err
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["q.cache", "q.fp32.onnx", "q.json", "q.onnx"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "m.onnx", "out"]


def test_cli_float16_model_is_refused_before_calibration(tmp_path, cli):
    # QA: an FP16 export calibrated, then failed in onnxruntime with "Type 'tensor(float16)' ... is invalid".
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float16), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "half",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 4, 6, 6])], [w])
    src = tmp_path / "half.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), src)
    _one_line_error(*cli("quantize", src, "--synthetic", "3"), "float16", "FP32 model")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["half.onnx"]


def test_cli_overrides_file(tmp_path, cli):
    src = tmp_path / "m.onnx"
    onnx.save(zoo.resnet_like(size=32), src)
    ov = tmp_path / "m.overrides.yaml"
    ov.write_text("# keep the classifier in float\nexclude:\n  - /fc/*\n")
    code, out, err = cli("quantize", src, "--synthetic", "4", "--overrides", ov, "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["overrides"]["excluded"] == ["/fc/Gemm"]
    assert "fc.weight" not in {w["tensor"] for w in s["weights"]}
    m = onnx.load(tmp_path / "m.int8.onnx")
    gemm = next(n for n in m.graph.node if n.op_type == "Gemm")
    assert gemm.input[1] == "fc.weight"  # float weight, no DequantizeLinear


def _with_identity_after_first_conv(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """An exporter's leftover Identity: cleaning removes it, so the cleaned model lacks its output."""
    g = model.graph
    conv = next(n for n in g.node if n.op_type == "Conv")
    t, extra = conv.output[0], conv.output[0] + "_identity"
    for n in g.node:
        for i, x in enumerate(n.input):
            if x == t:
                n.input[i] = extra
    identity = onnx.helper.make_node("Identity", [t], [extra], name="leftover")
    g.node.insert(list(g.node).index(conv) + 1, identity)
    onnx.checker.check_model(model)
    return model, extra


def test_implicit_path_fp32_model_holds_every_cache_tensor(tmp_path):
    """The cache's names are the cleaned model's: the saved <name>.int8.fp32.onnx is the model to build the
    implicit engine from (trtexec --int8 --calib=<cache> --onnx=<it>), and it computes what the input does."""
    import onnxruntime as ort

    model, leftover = _with_identity_after_first_conv(zoo.resnet_like(size=32))
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    result = quantize_file(src, QuantizeOptions(calibrator="max", synthetic=4))
    fp32_path = tmp_path / "m.int8.fp32.onnx"
    assert result.paths["fp32_model"] == str(fp32_path)
    fp32 = load_model(fp32_path)  # edgeq's loader: checker, no dangling inputs
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in fp32.graph.node)
    _, cache = read_calibration_cache(tmp_path / "m.int8.cache")
    tensors = ({t for n in fp32.graph.node for t in (*n.input, *n.output)}
               | {i.name for i in fp32.graph.input} | {i.name for i in fp32.graph.initializer})
    assert cache and set(cache) <= tensors
    # every activation of the saved model has a range: TensorRT can run each of its layers in INT8
    activations = {t for n in fp32.graph.node for t in n.output} | {i.name for i in fp32.graph.input}
    assert activations <= set(cache)
    # while the input model has a tensor the cache knows nothing of: why the saved model is needed
    assert leftover in {t for n in model.graph.node for t in n.output} and leftover not in cache
    # same function as the input model, in onnxruntime
    feeds = zoo.random_inputs(model, seed=5)
    cpu = ["CPUExecutionProvider"]
    want = ort.InferenceSession(model.SerializeToString(), providers=cpu).run(None, feeds)
    got = ort.InferenceSession(str(fp32_path), providers=cpu).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
