"""Files as real exporters write them, built in code: PyTorch eager-mode qint8 (torch.onnx.export),
NVIDIA ModelOpt's default float16 int8 output, and onnx's own old test models (IR 3).

Each repaired model is checked against the semantics it must have, in real onnxruntime sessions.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

from edgeq import zoo
from edgeq.errors import EdgeqError
from edgeq.graph.clean import CleanOptions, clean_model
from edgeq.graph.io import load_model, opset_of, save_model
from edgeq.graph.passes import PASS_NAMES, convert_opset, qdq_float32, set_ir_version
from edgeq.graph.rules import lint_model
from edgeq.graph.verify import run_model


def normal_inputs(m: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    x = m.graph.input[0]
    shape = [d.dim_value for d in x.type.tensor_type.shape.dim]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(x.type.tensor_type.elem_type)
    return {x.name: np.random.default_rng(seed).standard_normal(shape).astype(dtype)}


@pytest.fixture(scope="module")
def torch_qint8() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(the file torch.onnx.export writes, the same network as PyTorch computed it: int8 zero-point 0)."""
    fp32 = zoo.resnet_like()
    return zoo.qdq_torch_eager(fp32, qint8=True), zoo.qdq_torch_eager(fp32, qint8=True, as_computed=True)


# --------------------------------------------------------------------------------------------------
# PyTorch eager-mode qint8
# --------------------------------------------------------------------------------------------------


def test_torch_qint8_file_does_not_compute_what_pytorch_did(torch_qint8) -> None:
    """The premise: uint8 zero-point 0 clamps the negatives PyTorch's qint8 tensors kept."""
    exported, computed = torch_qint8
    feeds = normal_inputs(exported)
    got, want = run_model(exported, feeds)["output"], run_model(computed, feeds)["output"]
    assert np.abs(got - want).max() > 0.1
    assert (want < 0).any()


def test_clean_names_the_torch_qint8_pattern_and_the_flag(torch_qint8) -> None:
    exported, _ = torch_qint8
    r = clean_model(exported)
    assert r.verification is not None and r.verification.max_abs == 0.0  # the rest is exact
    assert [f.rule for f in r.findings] == ["qdq-torch-qint8"]
    f = r.findings[0]
    assert "--torch-qint8" in f.fix and "PyTorch" in f.message and "zero-point 0" in f.message
    q_uint8 = [n.name for n in exported.graph.node if n.op_type == "QuantizeLinear"]
    q_uint8.remove("input_QuantizeLinear")  # the quantize stub: int8 already
    assert set(q_uint8) <= set(f.nodes)
    assert not any("non-zero" in x.message or "re-quantize" in x.fix for x in r.findings)


def test_torch_qint8_repair_reproduces_pytorch_exactly(torch_qint8) -> None:
    exported, computed = torch_qint8
    r = clean_model(exported, CleanOptions(torch_qint8=True))
    assert r.findings == [] and r.verification is not None and r.verification.max_abs == 0.0
    onnx.checker.check_model(r.model, full_check=True)
    by_pass = {c.pass_name: c for c in r.changes}
    assert "deliberately" in by_pass["qdq_torch_qint8"].message
    assert {"qdq_remove_casts", "fold_bias_dq"} <= set(by_pass)
    assert not any(n.op_type == "Cast" for n in r.model.graph.node)
    feeds = normal_inputs(exported)
    np.testing.assert_array_equal(run_model(r.model, feeds)["output"], run_model(computed, feeds)["output"])
    zps = {t.name: onnx.numpy_helper.to_array(t) for t in r.model.graph.initializer}
    for n in r.model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert zps[n.input[2]].dtype == np.int8 and not zps[n.input[2]].any()


# --------------------------------------------------------------------------------------------------
# Real PyTorch 2.11 eager-mode exports and PyTorch's own outputs (tests/fixtures/torch-eager, make.py)
# --------------------------------------------------------------------------------------------------

TORCH_EAGER = os.path.join(os.path.dirname(__file__), "fixtures", "torch-eager")


def torch_eager(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray], float]:
    """(the file torch.onnx.export wrote, the batches and PyTorch's quantized outputs on them, one step
    of the output: the scale of the DequantizeLinear that writes it)."""
    model = onnx.load(os.path.join(TORCH_EAGER, f"{name}.onnx"))
    data = dict(np.load(os.path.join(TORCH_EAGER, f"{name}.npz")))
    data["input_wide"] = data["input"] * np.float32(3)  # past the calibrated range (make.py: x * 3.0)
    values = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t)
              for n in model.graph.node if n.op_type == "Constant"}
    (last,) = [n for n in model.graph.node if n.output[0] == model.graph.output[0].name]
    assert last.op_type == "DequantizeLinear"
    return model, data, float(values[last.input[1]])


def off_pytorch(model: onnx.ModelProto, data: dict[str, np.ndarray]) -> list[float]:
    """max |onnxruntime - PyTorch| on the test batch and on it x3."""
    name = model.graph.input[0].name
    return [float(np.abs(run_model(model, {name: data[x]})["output"] - data[y]).max())
            for x, y in (("input", "quantized"), ("input_wide", "quantized_wide"))]


def test_clean_torch_qint8_on_a_quint8_export_keeps_what_pytorch_computed() -> None:
    """fbgemm's default qconfig (quint8): the exported file is within one output step of PyTorch. Its
    uint8 zero-point 0 chains (after a ReLU) are quint8: the repair made them int8 and clamped at 127
    (11 steps off PyTorch past the calibrated range) while verification said PASSED against that."""
    model, data, step = torch_eager("torch_eager_fbgemm")
    assert max(off_pytorch(model, data)) <= 1.01 * step  # the file as exported: what PyTorch computed
    r = clean_model(model, CleanOptions(torch_qint8=True))
    assert "qdq_torch_qint8" not in {c.pass_name for c in r.changes}
    assert max(off_pytorch(r.model, data)) <= 1.01 * step
    assert r.verification is not None and r.verification and r.verification.max_abs == 0.0
    assert any(n.startswith("reference: the input itself") for n in r.verification.notes)
    plain = clean_model(model)  # and no advice to repair what is right
    assert "qdq-torch-qint8" not in {f.rule for f in plain.findings}
    assert {f.rule for f in plain.findings} == {"qdq-uint8"}  # TensorRT still needs int8: re-quantize
    assert not any("--torch-qint8" in f.fix for f in plain.findings)
    assert "qdq-torch-qint8" not in {f.rule for f in lint_model(model)}


def test_clean_torch_qint8_on_a_qint8_export_reproduces_pytorch() -> None:
    """qnnpack's symmetric qconfig (qint8 activations, affine: zero-points -128..38): the exporter wrote
    every tensor after the int8 stub as uint8 (-128 -> 128), 0.27 off PyTorch; read back as int8, one
    output step. Without the flag, clean turned the uint8 128 ones into int8 0 (exact to the file) and
    named only the rest."""
    model, data, step = torch_eager("torch_eager_qnnpack_qint8")
    assert min(off_pytorch(model, data)) > 50 * step  # the premise: the file is not what PyTorch computed
    plain = clean_model(model)
    (torch,) = [f for f in plain.findings if f.rule == "qdq-torch-qint8"]
    stub = "/quant/QuantizeLinear"
    uint8_q = {n.name for n in model.graph.node if n.op_type == "QuantizeLinear" and n.name != stub}
    assert len(uint8_q) == 15 and uint8_q < set(torch.nodes)  # every tensor after the stub
    assert len(torch.nodes) == 33 and "--torch-qint8" in torch.fix  # 15 Q and their 18 DQ
    assert {f.rule for f in lint_model(model) if f.rule.startswith("qdq-torch")} == {"qdq-torch-qint8"}
    r = clean_model(model, CleanOptions(torch_qint8=True))
    (repair,) = [c for c in r.changes if c.pass_name == "qdq_torch_qint8"]
    assert set(repair.nodes) == set(torch.nodes)
    assert max(off_pytorch(r.model, data)) <= 1.01 * step
    assert r.verification is not None and r.verification and r.verification.max_abs == 0.0
    assert any("repair applied" in n for n in r.verification.notes)
    # what is left is TensorRT's to refuse, said as such: qint8 zero-points other than 0
    assert {f.rule for f in r.findings} == {"qdq-asymmetric"}


def test_lint_and_clean_give_the_same_advice_for_torch_qint8(torch_qint8) -> None:
    exported, _ = torch_qint8
    found = lint_model(exported)
    rules = {f.rule for f in found}
    assert "qdq-torch-qint8" in rules and not rules & {"qdq-uint8", "qdq-asymmetric"}
    torch = next(f for f in found if f.rule == "qdq-torch-qint8")
    assert "edgeq clean --torch-qint8" in torch.fix
    casts = [f for f in found if f.rule == "qdq-cast-between"]
    assert len(casts) == sum(n.op_type == "Cast" for n in exported.graph.node)
    for f in casts:  # the quantize stub's int8 pair is exact to clean; the rest need the flag
        assert ("--torch-qint8" in f.fix) == (f.nodes[0] in torch.nodes), f.nodes
    assert not lint_model(clean_model(exported, CleanOptions(torch_qint8=True, verify=False)).model,
                          rules=["qdq-torch-qint8", "qdq-uint8", "qdq-asymmetric", "qdq-cast-between"])


def test_quint8_zero_point_128_is_not_taken_for_qint8() -> None:
    """uint8 zero-point 128 (quint8) is an exact shift; it is neither the qint8 pattern nor asymmetric."""
    found = lint_model(zoo.build("resnet", "torch"))
    assert {f.rule for f in found} & {"qdq-torch-qint8", "qdq-asymmetric"} == set()


def test_cli_torch_qint8(torch_qint8, tmp_path, cli) -> None:
    exported, _ = torch_qint8
    src = save_model(exported, tmp_path / "r18.onnx")
    code, out, _ = cli("clean", src)
    assert code == 1 and "--torch-qint8" in out
    code, out, _ = cli("clean", src, "--torch-qint8", "-o", tmp_path / "fixed.onnx")
    assert code == 0 and "deliberately" in out and (tmp_path / "fixed.onnx").exists()


def as_torch_onnx_export(m: onnx.ModelProto) -> onnx.ModelProto:
    """zoo's qint8 file rewritten into torch.onnx.export's exact form (torch 2.5, eager mode; the TorchScript
    exporter's symbolic_helper.quantize_helper / dequantize_helper): every quantized op dequantizes its
    inputs itself, so a QuantizeLinear output is read by one ``Cast -> DequantizeLinear`` per reader
    (``Cast(tensor, to=qdtype)``); scales and zero-points are ``Constant`` nodes (the exporter folds the
    Casts on them into Constants, uint8 zero-point 0 for qint8 activations); weights are Constant int8
    tensors read by their DQ, biases Constant int32 behind ``Cast(to=INT32)``. In ResNet-18's export: 33
    QuantizeLinear, 83 DequantizeLinear, 62 Cast."""
    from onnx import helper

    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    nodes: list[onnx.NodeProto] = []
    serial = iter(range(1_000_000))

    def constant(value: onnx.TensorProto, scope: str) -> str:
        name = f"{scope}/Constant_{next(serial)}_output_0"
        nodes.append(helper.make_node("Constant", [], [name], name=name[: -len("_output_0")], value=value))
        return name

    def cast(x: str, to: int, scope: str) -> str:
        name = f"{scope}/Cast_{next(serial)}_output_0"
        nodes.append(helper.make_node("Cast", [x], [name], name=name[: -len("_output_0")], to=to))
        return name

    def dq_of(dq: onnx.NodeProto, value: str, scope: str, suffix: str) -> onnx.NodeProto:
        s, z = (constant(inits[t], scope) for t in dq.input[1:3])
        return helper.make_node("DequantizeLinear", [value, s, z], [dq.output[0] + suffix],
                                name=dq.name + suffix, axis=next((a.i for a in dq.attribute), 1))

    for n in g.node:
        scope = n.name.rsplit("_", 1)[0]
        if n.op_type == "QuantizeLinear":
            s, z = (constant(inits[t], scope) for t in n.input[1:3])
            nodes.append(helper.make_node("QuantizeLinear", [n.input[0], s, z], list(n.output), name=n.name))
        elif n.op_type == "DequantizeLinear" and n.input[0] in inits:  # a weight or a bias
            w, kind = constant(inits[n.input[0]], scope), inits[n.input[0]].data_type
            nodes.append(dq_of(n, cast(w, kind, scope) if kind == onnx.TensorProto.INT32 else w, scope, ""))
        elif n.op_type == "DequantizeLinear":  # behind zoo's Cast: one Cast -> DQ per reader of its output
            q = producer[producer[n.input[0]].input[0]]
            to = next(a.i for a in producer[n.input[0]].attribute if a.name == "to")
            for k, r in enumerate(readers[n.output[0]]):
                dq = dq_of(n, cast(q.output[0], to, r.name), r.name, f"_{k}")
                nodes.append(dq)
                r.input[:] = [dq.output[0] if i == n.output[0] else i for i in r.input]
        elif n.op_type != "Cast":
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    used = {i for n in g.node for i in n.input}
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    onnx.checker.check_model(out, full_check=True)
    return out


def test_clean_torch_qint8_verifies_the_exporters_own_q_cast_dq_chains(torch_qint8, tmp_path, cli) -> None:
    """Issue 20.2: on the exporter's real form (Constant zero-points, one Cast -> DQ per reader) the
    verification reference missed the chains and said "verify FAILED", writing nothing."""
    fp32 = zoo.resnet_like()
    exported, computed = as_torch_onnx_export(torch_qint8[0]), torch_qint8[1]
    count = {op: sum(n.op_type == op for n in exported.graph.node)
             for op in ("QuantizeLinear", "DequantizeLinear", "Cast")}
    assert count["DequantizeLinear"] > count["Cast"] > count["QuantizeLinear"]  # ResNet-18: 83 > 62 > 33
    feeds = normal_inputs(exported)
    want = run_model(computed, feeds)["output"]
    assert np.abs(run_model(exported, feeds)["output"] - want).max() > 0.1  # the file clamps negatives
    assert np.abs(run_model(fp32, feeds)["output"] - want).max() > 0  # quantized, not the float model
    src = save_model(exported, tmp_path / "r18.onnx")
    code, out, _ = cli("clean", src, "--torch-qint8", "-o", tmp_path / "fixed.onnx", "--json")
    assert code == 0, out
    assert json.loads(out)["verification"]["passed"] is True
    fixed = load_model(tmp_path / "fixed.onnx")
    np.testing.assert_array_equal(run_model(fixed, feeds)["output"], want)  # what PyTorch computed
    assert not any(n.op_type in ("Cast", "Constant") for n in fixed.graph.node)
    # without the flag the pattern is named as PyTorch's, not as uint8 Q/DQ to re-quantize
    r = clean_model(exported, CleanOptions(verify=False))
    assert [f.rule for f in r.findings] == ["qdq-torch-qint8"]
    assert "qdq-torch-qint8" in {f.rule for f in lint_model(exported)}


# --------------------------------------------------------------------------------------------------
# NVIDIA ModelOpt: float16 network with float16 Q/DQ at opset 19
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def modelopt_fp16() -> onnx.ModelProto:
    m = zoo.build("resnet", "modelopt-fp16")
    assert opset_of(m) == 19 and m.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    return m


def test_modelopt_fp16_lowers_to_valid_float32_qdq(modelopt_fp16) -> None:
    r = clean_model(modelopt_fp16)
    m = r.model
    assert opset_of(m) == 17 and r.findings == []
    onnx.checker.check_model(m, full_check=True)
    assert r.verification is not None and r.verification.passed and r.verification.max_abs == 0.0
    assert any("float16" in n for n in r.verification.notes)
    inits = {t.name: t for t in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert inits[n.input[1]].data_type == onnx.TensorProto.FLOAT
    casts = [c for c in r.changes if c.pass_name == "qdq_float32" and c.nodes]
    assert casts and "Cast" in casts[0].message and "layer" in casts[0].message
    # runs in onnxruntime and stays close to the float16 original (onnxruntime rounds float16 its own way)
    feeds = normal_inputs(modelopt_fp16)
    a = run_model(modelopt_fp16, feeds)["output"].astype(np.float64)
    b = run_model(m, feeds)["output"].astype(np.float64)
    assert b.dtype == a.dtype and np.abs(a - b).max() <= 0.05 * np.abs(a).max()


def test_lint_flags_float16_qdq_below_opset_19(modelopt_fp16) -> None:
    """What clean used to write: the opset lowered, the float16 Q/DQ kept."""
    m, _ = set_ir_version(modelopt_fp16, CleanOptions())
    m, _ = convert_opset(m, CleanOptions())
    found = [f for f in lint_model(m) if f.rule == "qdq-float16"]
    assert found and found[0].level.value == "error"
    assert not [f for f in lint_model(modelopt_fp16) if f.rule == "qdq-float16"]  # valid at opset 19


def test_no_verify_never_writes_a_model_the_checker_rejects(modelopt_fp16, tmp_path, cli) -> None:
    src = save_model(modelopt_fp16, tmp_path / "mo.onnx")
    dest = tmp_path / "out.onnx"
    code, _, err = cli("clean", src, "--no-verify", "--skip", "qdq_float32", "-o", dest)
    assert code == 2 and not dest.exists()
    assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1 and "qdq_float32" in err
    code, _, _ = cli("clean", src, "--no-verify", "-o", dest)
    assert code == 0
    onnx.checker.check_model(onnx.load(str(dest)), full_check=True)


def test_opset_above_17_is_a_usage_error(tmp_path, cli) -> None:
    src = save_model(zoo.resnet_like(), tmp_path / "m.onnx")
    for opset in ("18", "19"):
        code, _, err = cli("clean", src, "--opset", opset)
        assert code == 2 and "7 to 17" in err


# --------------------------------------------------------------------------------------------------
# onnx's own test models: old IR versions, legacy operators
# --------------------------------------------------------------------------------------------------

_DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
# alexnet, vgg19 and zfnet512 make their weights with ConstantOfShape: folding them takes seconds each
# (hundreds of MB), so the suite leaves them to a manual run; the other six are IR 3 networks too.
_SLOW = ("light_bvlc_alexnet.onnx", "light_vgg19.onnx", "light_zfnet512.onnx")
_LIGHT = glob.glob(os.path.join(_DATA, "light", "*.onnx"))
_OLD = sorted(p for p in _LIGHT if os.path.basename(p) not in _SLOW)
_OLD += sorted(glob.glob(os.path.join(_DATA, "pytorch-operator", "*", "model.onnx")))


@pytest.mark.skipif(not _OLD, reason="this onnx wheel ships no backend test data")
def test_every_onnx_test_model_cleans_to_a_valid_model_or_is_refused_in_one_line() -> None:
    cleaned = refused = 0
    for path in _OLD:
        model = load_model(path)
        try:
            r = clean_model(model, CleanOptions(verify=path.endswith("model.onnx")))
        except EdgeqError as e:
            assert e.exit_code == 2 and "\n" not in str(e), path
            refused += 1
            continue
        onnx.checker.check_model(r.model, full_check=True)
        assert r.verification is None or r.verification.passed, (path, str(r.verification))
        cleaned += 1
    assert refused <= 12 and cleaned + refused == len(_OLD)  # refused: legacy Add/Gemm-6 onnxruntime dropped


@pytest.mark.skipif(not _OLD, reason="this onnx wheel ships no backend test data")
def test_ir3_initializers_stay_graph_inputs_and_onnxruntime_stays_quiet(tmp_path) -> None:
    """inception_v2 made onnxruntime's constant folding print optimizer warnings (in colour) to the
    terminal's stderr, below Python: run the command as a user does, in its own process."""
    path = next(p for p in _OLD if "inception_v2" in p)
    assert onnx.load(path).ir_version == 3
    dest = tmp_path / "inc.onnx"
    cmd = [sys.executable, "-c", "from edgeq.cli import main; main()", "clean", path, "--no-verify"]
    cmd += ["-o", dest]
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "onnxruntime" not in proc.stderr and "\x1b[" not in proc.stderr
    m = onnx.load(str(dest))
    assert m.ir_version == 3 and {t.name for t in m.graph.initializer} <= {i.name for i in m.graph.input}


def test_pass_names_cover_the_new_passes() -> None:
    order = PASS_NAMES.index
    assert order("convert_opset") < order("qdq_float32") < order("fold_constants")
    assert PASS_NAMES.index("qdq_torch_qint8") < PASS_NAMES.index("qdq_remove_casts")


def test_a_pass_that_breaks_a_valid_model_is_a_bug_not_a_user_error(monkeypatch) -> None:
    """A rewrite of ours that the checker rejects raises with a traceback, never as 'bad input'."""
    from edgeq.graph import clean as clean_mod
    from edgeq.graph.passes import PASSES, Pass

    def break_types(graph, options):  # a buggy pass: float16 scale at opset 17
        for n in graph.nodes:
            if n.op == "QuantizeLinear":
                n.inputs[1].values = n.inputs[1].values.astype(np.float16)
                return []
        return []

    monkeypatch.setattr(clean_mod, "PASSES", (*PASSES, Pass("break_types", break_types, "graph")))
    with pytest.raises(RuntimeError, match="edgeq bug"):
        clean_model(zoo.build("resnet", "ort"), CleanOptions(verify=False))


def test_opset19_cast_saturate_is_dropped_when_lowering() -> None:
    """Cast-19 carries 'saturate' (float8 only); onnx's converter keeps it, which opset 17 rejects."""
    from onnx import TensorProto as T
    from onnx import helper as h

    nodes = [
        h.make_node("Cast", ["x"], ["c"], to=T.FLOAT16, saturate=1, name="to_half"),
        h.make_node("Relu", ["c"], ["r"]),
        h.make_node("Cast", ["r"], ["y"], to=T.FLOAT, saturate=1, name="to_float"),
    ]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 3])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 19)], ir_version=10)
    r = clean_model(m)
    assert opset_of(r.model) == 17 and r.findings == [] and r.verification is not None
    assert r.verification.max_abs == 0.0
    assert all(a.name != "saturate" for n in r.model.graph.node for a in n.attribute)


def test_qdq_float32_alone_keeps_graph_outputs_and_constant_node_scales() -> None:
    """A float16 Q -> DQ pair whose DQ writes the graph output and whose scale is a Constant node."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    scale = h.make_node("Constant", [], ["s"], value=nh.from_array(np.array(0.05, np.float16), "v"))
    nodes = [
        scale,
        h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="Q"),
        h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="DQ"),
    ]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT16, [8])],
                     [h.make_tensor_value_info("y", T.FLOAT16, [8])], [nh.from_array(np.int8(0), "z")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 19)], ir_version=9)
    out, _ = set_ir_version(m, CleanOptions())
    out, _ = convert_opset(out, CleanOptions())
    out, changes = qdq_float32(out, CleanOptions())
    onnx.checker.check_model(out, full_check=True)
    assert [o.name for o in out.graph.output] == ["y"]
    assert {c.op_type for c in out.graph.node} >= {"Cast"} and changes[-1].nodes
    x = np.array([-9, -1.3, -0.02, 0, 0.024, 0.026, 3.3, 7], np.float16)
    want = run_model(m, {"x": x})["y"]
    got = run_model(out, {"x": x})["y"]
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)
