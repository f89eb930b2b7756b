"""``edgeq clean``: each pass alone on a tiny graph, then the zoo's export patterns end to end.

Numerics always come from real onnxruntime sessions (``edgeq.graph.verify.run_model``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeq.errors import ConfigError, GraphError
from edgeq.findings import Level
from edgeq.graph import passes
from edgeq.graph.clean import CleanOptions, clean_model, fit_findings
from edgeq.graph.io import graph_from_model, infer_shapes, model_from_graph, opset_of, save_model
from edgeq.graph.passes import PASS_NAMES, PASSES
from edgeq.graph.passes.base import Change, Unfit, quiet_graphsurgeon
from edgeq.graph.passes.qdq import torch_qint8_pairs
from edgeq.graph.verify import compare_models, random_inputs, run_model

OPTS = CleanOptions()
F = TensorProto.FLOAT


def C(name: str, arr) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def vi(name: str, shape, t: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, t, shape)


def model(nodes, inputs, outputs, inits=(), *, opset: int = 17, ir: int = 8) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)


def apply(pass_fn, m: onnx.ModelProto) -> tuple[onnx.ModelProto, list[Change]]:
    """Run one graph pass alone, the way clean_model does (shape-inferred import, export)."""
    graph = graph_from_model(infer_shapes(m))
    with quiet_graphsurgeon():
        changes = pass_fn(graph, OPTS)
    out = model_from_graph(graph, like=m)
    onnx.checker.check_model(out)
    return out, changes


def ops(m: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in m.graph.node]


def same_outputs(a: onnx.ModelProto, b: onnx.ModelProto, feeds) -> None:
    ra, rb = run_model(a, feeds), run_model(b, feeds)
    for k in ra:
        np.testing.assert_array_equal(ra[k], rb[k], err_msg=k)


def qdq_act(x: str, scale: float, zp, zp_type=np.uint8, cast_to: int | None = None, tag: str = "x"):
    """Q -> [Cast] -> DQ on activation ``x``; returns (nodes, inits, output name)."""
    inits = [C(f"{tag}_s", np.float32(scale)), C(f"{tag}_z", np.asarray(zp, dtype=zp_type))]
    nodes = [helper.make_node("QuantizeLinear", [x, f"{tag}_s", f"{tag}_z"], [f"{tag}_q"], name=f"{tag}_Q")]
    q = f"{tag}_q"
    if cast_to is not None:
        nodes.append(helper.make_node("Cast", [q], [f"{tag}_qc"], to=cast_to, name=f"{tag}_Cast"))
        q = f"{tag}_qc"
    nodes.append(
        helper.make_node("DequantizeLinear", [q, f"{tag}_s", f"{tag}_z"], [f"{tag}_dq"], name=f"{tag}_DQ")
    )
    return nodes, inits, f"{tag}_dq"


def wide_inputs(shape, seed=0) -> dict[str, np.ndarray]:
    """Values across and beyond the int8 range at scale 0.05, to exercise rounding and clamping."""
    return {"x": np.random.default_rng(seed).uniform(-12, 12, size=shape).astype(np.float32)}


# --------------------------------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------------------------------


def test_pass_table_is_ordered_named_and_documented() -> None:
    assert len(set(PASS_NAMES)) == len(PASSES)
    assert PASS_NAMES[:2] == ("set_ir_version", "convert_opset")
    assert (
        PASS_NAMES.index("fold_constants")
        < PASS_NAMES.index("qdq_remove_casts")
        < PASS_NAMES.index("qdq_to_int8")
    )
    assert PASS_NAMES[-1] == "toposort"
    for p in PASSES:
        doc = p.fn.__doc__ or ""
        assert p.summary and p.fn.__name__ == p.name
        assert "trt86-rules.md" in doc or "fixtures" in doc or "TensorRT" in doc, p.name


def test_unknown_skip_is_a_config_error() -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [1, 2])], [vi("y", [1, 2])])
    with pytest.raises(ConfigError, match="no_such_pass"):
        clean_model(m, CleanOptions(skip=("no_such_pass",)))


# --------------------------------------------------------------------------------------------------
# model passes
# --------------------------------------------------------------------------------------------------


def test_set_ir_version_lowers_and_refuses_float8() -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [1, 2])], [vi("y", [1, 2])], ir=10)
    out, changes = passes.set_ir_version(m, OPTS)
    assert out.ir_version == 8 and changes == [Change("set_ir_version", "IR version 10 -> 8")]
    assert passes.set_ir_version(out, OPTS)[1] == []

    f8 = model(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FN, name="to_fp8")],
        [vi("x", [1, 2])],
        [vi("y", [1, 2], TensorProto.FLOAT8E4M3FN)],
        ir=10,
        opset=19,
    )
    with pytest.raises(Unfit) as e:
        passes.set_ir_version(f8, OPTS)
    assert "to_fp8" in e.value.nodes[-1] or any("to_fp8" in n for n in e.value.nodes)


def _opset19_model() -> onnx.ModelProto:
    """Opset-18/19 signatures: Q with 'saturate', ReduceMean axes input, Split num_outputs, Pad 19."""
    return model(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q", saturate=1),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq"),
            helper.make_node("Pad", ["d", "pads"], ["p"], name="pad"),
            helper.make_node("Split", ["p"], ["a", "b"], name="split", axis=1, num_outputs=2),
            helper.make_node("ReduceMean", ["a", "axes"], ["ra"], name="mean", keepdims=1),
            helper.make_node("Add", ["ra", "b"], ["y"], name="add"),
        ],
        [vi("x", [1, 4, 6])],
        [vi("y", [1, 2, 8])],
        [
            C("s", np.float32(0.05)),
            C("z", np.int8(0)),
            C("pads", np.array([0, 0, 1, 0, 0, 1], np.int64)),
            C("axes", np.array([1], np.int64)),
        ],
        opset=19,
        ir=10,
    )


def test_convert_opset_19_to_17_by_converter_and_by_hand() -> None:
    m = _opset19_model()
    out, changes = passes.convert_opset(m, OPTS)
    onnx.checker.check_model(out, full_check=True)
    assert opset_of(out) == 17
    nodes = {n.name: n for n in out.graph.node}
    assert not any(a.name == "saturate" for a in nodes["q"].attribute)
    assert [a.name for a in nodes["mean"].attribute if a.name == "axes"] == ["axes"]  # back to an attribute
    split = nodes["split"]
    assert not any(a.name == "num_outputs" for a in split.attribute)
    sizes = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}[split.input[1]]
    assert sizes.tolist() == [2, 2]
    assert not any(n.domain for n in out.graph.node)
    assert {o.domain for o in out.opset_import} == {""}
    assert changes[0].message == "opset 19 -> 17 (onnx version converter)"
    assert set(changes[1].nodes) == {"q", "split"}  # what was converted by hand, by name
    same_outputs(m, out, wide_inputs([1, 4, 6]))


def test_convert_opset_names_every_blocking_node() -> None:
    m = model(
        [
            helper.make_node("Col2Im", ["x", "isz", "bsz"], ["c"], name="col2im_node"),
            helper.make_node("Pad", ["c", "pads", "", "pax"], ["y"], name="pad_with_axes"),
        ],
        [vi("x", [1, 4, 9])],
        [vi("y", None)],
        [
            C("isz", np.array([4, 4], np.int64)),
            C("bsz", np.array([2, 2], np.int64)),
            C("pads", np.array([1, 1], np.int64)),
            C("pax", np.array([2], np.int64)),
        ],
        opset=18,
    )
    with pytest.raises(Unfit) as e:
        passes.convert_opset(m, OPTS)
    assert set(e.value.nodes) == {"pad_with_axes"}  # hand-adapter refusals are reported first
    m.graph.node[1].input[3] = ""
    with pytest.raises(Unfit) as e:
        passes.convert_opset(m, OPTS)
    assert set(e.value.nodes) == {"col2im_node"}
    assert "Col2Im" in str(e.value)


def test_unfit_opset_becomes_an_error_finding_not_an_exception() -> None:
    m = model(
        [helper.make_node("Col2Im", ["x", "isz", "bsz"], ["y"], name="col2im_node")],
        [vi("x", [1, 4, 9])],
        [vi("y", [1, 1, 4, 4])],
        [C("isz", np.array([4, 4], np.int64)), C("bsz", np.array([2, 2], np.int64))],
        opset=18,
    )
    r = clean_model(m)
    errs = [f for f in r.findings if f.level == Level.ERROR]
    assert [(f.rule, f.nodes) for f in errs] == [("convert_opset", ("col2im_node",))]
    assert opset_of(r.model) == 18 and r.verification and not r.ok


# --------------------------------------------------------------------------------------------------
# graph passes, one at a time
# --------------------------------------------------------------------------------------------------


def test_fold_constants_folds_shape_subgraph_but_never_q_dq() -> None:
    w = np.random.default_rng(1).standard_normal((4, 3, 1, 1)).astype(np.float32)
    m = model(
        [
            # a float weight quantized in the graph: Q must stay Q (weight DQ is what TensorRT wants)
            helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], name="w_Q", axis=0),
            helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="w_DQ", axis=0),
            helper.make_node("Conv", ["x", "wd"], ["c"], name="conv"),
            # shape arithmetic that PyTorch writes for x.flatten(1)
            helper.make_node("Shape", ["c"], ["shp"], name="shape"),
            helper.make_node("Gather", ["shp", "zero"], ["n"], name="gather", axis=0),
            helper.make_node("Unsqueeze", ["n", "zero_1d"], ["n1"], name="unsq"),
            helper.make_node("Concat", ["n1", "minus1"], ["target"], name="concat", axis=0),
            helper.make_node("Reshape", ["c", "target"], ["y"], name="reshape"),
        ],
        [vi("x", [2, 3, 4, 4])],
        [vi("y", [2, 64])],
        [
            C("w", w),
            C("ws", np.full(4, 0.01, np.float32)),
            C("wz", np.zeros(4, np.int8)),
            C("zero", np.int64(0)),
            C("zero_1d", np.array([0], np.int64)),
            C("minus1", np.array([-1], np.int64)),
        ],
    )
    out, changes = apply(passes.fold_constants, m)
    assert ops(out) == ["QuantizeLinear", "DequantizeLinear", "Conv", "Reshape"]
    assert changes[0].pass_name == "fold_constants"
    assert set(changes[0].nodes) == {"shape", "gather", "unsq", "concat"}
    shape_in = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}[out.graph.node[3].input[1]]
    assert shape_in.tolist() == [2, -1]
    same_outputs(m, out, {"x": np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)})


def test_fold_constants_avoids_graphsurgeon_cast_elision_truncation() -> None:
    """Cast(int->float) * 0.5 -> Cast(int): graphsurgeon would cast 0.5 to 0 and break the Reshape."""
    m = model(
        [
            helper.make_node("Shape", ["x"], ["s"], name="shape"),
            helper.make_node("Cast", ["s"], ["sf"], to=F, name="to_float"),
            helper.make_node("Mul", ["sf", "factor"], ["m"], name="halve"),
            helper.make_node("Cast", ["m"], ["mi"], to=TensorProto.INT64, name="to_int"),
            helper.make_node("Reshape", ["x", "mi"], ["y"], name="reshape"),
        ],
        [vi("x", [2, 4])],
        [vi("y", [1, 8])],
        [C("factor", np.array([0.5, 2.0], np.float32))],
    )
    out, changes = apply(passes.fold_constants, m)
    assert changes and changes[0].nodes == ("halve",)
    same_outputs(m, out, {"x": np.arange(8, dtype=np.float32).reshape(2, 4)})


def test_remove_noops_identity_dropout_cast() -> None:
    m = model(
        [
            helper.make_node("Identity", ["x"], ["i"], name="ident"),
            helper.make_node("Cast", ["i"], ["c"], to=F, name="cast_same"),
            helper.make_node("Relu", ["c"], ["r"], name="relu"),
            helper.make_node("Cast", ["r"], ["h"], to=TensorProto.FLOAT16, name="cast_half"),
            helper.make_node("Cast", ["h"], ["f"], to=F, name="cast_back"),
            helper.make_node("Dropout", ["f"], ["y"], name="drop_out"),  # writes the graph output
            helper.make_node("Dropout", ["r"], ["z", "mask"], name="drop_mask_used"),
            helper.make_node("Cast", ["mask"], ["mask_f"], to=F, name="mask_to_float"),
            helper.make_node("Add", ["z", "mask_f"], ["y2"], name="add"),
        ],
        [vi("x", [1, 4])],
        [vi("y", [1, 4]), vi("y2", [1, 4])],
    )
    out, changes = apply(passes.remove_noops, m)
    by_kind = {c.message: c.nodes for c in changes}
    assert by_kind == {
        "removed 1 Identity": ("ident",),
        "removed 1 Cast to its own type": ("cast_same",),
        "removed 1 Dropout (inference)": ("drop_out",),
    }
    names = [n.name for n in out.graph.node]
    assert "cast_half" in names and "cast_back" in names and "drop_mask_used" in names
    assert [o.name for o in out.graph.output] == ["y", "y2"]
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)}
    same_outputs(m, out, feeds)


def test_qdq_remove_casts_only_exact_ones() -> None:
    n1, i1, d1 = qdq_act("x", 0.05, 128, np.uint8, cast_to=TensorProto.UINT8, tag="a")  # PyTorch: no-op
    n2, i2, d2 = qdq_act(
        "x", 0.05, 0, np.int8, cast_to=TensorProto.UINT8, tag="b"
    )  # int8 -> uint8: not exact
    n2[-1].input[2] = "b_zu"
    m = model(
        [*n1, *n2, helper.make_node("Add", [d1, d2], ["y"], name="add")],
        [vi("x", [1, 16])],
        [vi("y", [1, 16])],
        [*i1, *i2, C("b_zu", np.uint8(0))],
    )
    out, changes = apply(passes.qdq_remove_casts, m)
    assert changes == [Change("qdq_remove_casts", "removed 1 Cast nodes between Q and DQ", ("a_Cast",))]
    assert [n.name for n in out.graph.node if n.op_type == "Cast"] == ["b_Cast"]
    same_outputs(m, out, wide_inputs([1, 16]))
    f = fit_findings(out)
    assert any(x.rule == "qdq-cast-between" and "b_Cast" in x.nodes for x in f)


@pytest.mark.parametrize("zp,exact", [(128, True), (100, False), (0, False)])
def test_qdq_to_int8_activation_pairs(zp: int, exact: bool) -> None:
    nodes, inits, d = qdq_act("x", 0.05, zp, np.uint8)
    m = model(
        [*nodes, helper.make_node("Relu", [d], ["y"], name="relu")],
        [vi("x", [4, 64])],
        [vi("y", [4, 64])],
        inits,
    )
    out, changes = apply(passes.qdq_to_int8, m)
    zps = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    q, dq = out.graph.node[0], out.graph.node[1]
    if exact:
        assert changes[0].nodes == ("x_Q", "x_DQ")
        assert zps[q.input[2]].dtype == np.int8 and zps[q.input[2]] == 0
        assert zps[dq.input[2]].dtype == np.int8 and zps[dq.input[2]] == 0
        same_outputs(m, out, wide_inputs([4, 64]))  # bit-exact, clamping at both ends included
        assert fit_findings(out) == []
    else:
        assert changes == []
        assert zps[q.input[2]].dtype == np.uint8
        f = fit_findings(out)
        assert [(x.rule, x.level, x.nodes) for x in f] == [("qdq-uint8", Level.ERROR, ("x_Q", "x_DQ"))]


@pytest.mark.parametrize("stub", [np.int8, np.uint8], ids=["qint8-stub", "quint8-stub"])
def test_uint8_pair_matching_of_qdq_to_int8_and_torch_qint8_pairs(stub) -> None:
    """qdq_to_int8 takes Q -> DQ only; torch_qint8_pairs takes the exporter's Q -> Cast(to=UINT8) -> DQ
    chains, any zero-point, where the tensor is qint8 in PyTorch: an int8 quantize stub upstream. Behind a
    uint8 stub (a quint8 model) the same chains are what PyTorch computed and are not listed."""
    to = TensorProto.INT8 if stub == np.int8 else TensorProto.UINT8
    n0, i0, d0 = qdq_act("x", 0.05, 0, stub, cast_to=to, tag="stub")
    relu = helper.make_node("Relu", [d0], ["r"], name="relu")
    n1, i1, d1 = qdq_act("r", 0.05, 128, np.uint8, cast_to=TensorProto.UINT8, tag="c128")
    n2, i2, d2 = qdq_act("r", 0.05, 0, np.uint8, cast_to=TensorProto.UINT8, tag="c0")
    n3, i3, d3 = qdq_act("r", 0.05, 0, np.uint8, tag="p0")
    m = model(
        [*n0, relu, *n1, *n2, *n3, helper.make_node("Sum", [d1, d2, d3], ["y"], name="sum")],
        [vi("x", [1, 16])],
        [vi("y", [1, 16])],
        [*i0, *i1, *i2, *i3],
    )
    assert apply(passes.qdq_to_int8, m)[1] == []  # a Cast between Q and DQ, or zero-point 0: not exact
    graph = graph_from_model(infer_shapes(m))
    pairs = sorted((q.name, [r.name for r in rs]) for q, rs in torch_qint8_pairs(graph))
    if stub == np.int8:
        assert pairs == [("c0_Q", ["c0_Cast", "c0_DQ"]), ("c128_Q", ["c128_Cast", "c128_DQ"])]
    else:
        assert pairs == []


def test_qdq_to_int8_rebases_constant_weights_when_exact() -> None:
    rng = np.random.default_rng(3)
    w_ok = rng.integers(0, 200, size=(4, 3, 1, 1)).astype(np.uint8)  # w - 70 fits int8
    w_bad = np.array([0, 255], np.uint8).reshape(2, 1)  # w - 3 = 252: does not fit
    m = model(
        [
            helper.make_node("DequantizeLinear", ["w_ok", "ws", "wz"], ["wd"], name="w_ok_DQ", axis=0),
            helper.make_node("DequantizeLinear", ["w_bad", "bs", "bz"], ["bd"], name="w_bad_DQ"),
            helper.make_node("Conv", ["x", "wd"], ["y"], name="conv"),
        ],
        [vi("x", [1, 3, 2, 2])],
        [vi("y", [1, 4, 2, 2]), vi("bd", [2, 1])],
        [
            C("w_ok", w_ok),
            C("ws", np.full(4, 0.02, np.float32)),
            C("wz", np.array([70, 70, 60, 80], np.uint8)),
            C("w_bad", w_bad),
            C("bs", np.float32(0.1)),
            C("bz", np.uint8(3)),
        ],
    )
    out, changes = apply(passes.qdq_to_int8, m)
    assert [c.nodes for c in changes] == [("w_ok_DQ",)]
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    dq = out.graph.node[0]
    assert inits[dq.input[0]].dtype == np.int8 and not inits[dq.input[2]].any()
    same_outputs(m, out, {"x": np.random.default_rng(0).standard_normal((1, 3, 2, 2)).astype(np.float32)})
    assert [f.nodes for f in fit_findings(out)] == [("w_bad_DQ",)]


def test_fold_bias_dq_is_bit_exact_with_onnxruntime() -> None:
    rng = np.random.default_rng(7)
    bq = rng.integers(-(2**24), 2**24, size=6).astype(np.int32)
    bs = rng.uniform(1e-5, 1e-3, size=6).astype(np.float32)
    m = model(
        [
            helper.make_node(
                "DequantizeLinear", ["bq", "bs", "bz"], ["bias"], name="fc.bias_DequantizeLinear", axis=0
            ),
            helper.make_node("Add", ["x", "bias"], ["y"], name="add"),
        ],
        [vi("x", [2, 6])],
        [vi("y", [2, 6])],
        [C("bq", bq), C("bs", bs), C("bz", np.zeros(6, np.int32))],
    )
    out, changes = apply(passes.fold_bias_dq, m)
    assert changes == [
        Change(
            "fold_bias_dq",
            "folded 1 int32 bias DequantizeLinear into float initializers",
            ("fc.bias_DequantizeLinear",),
        )
    ]
    assert ops(out) == ["Add"]
    bias = {t.name: t for t in out.graph.initializer}["bias"]
    assert bias.data_type == TensorProto.FLOAT
    zeros = {"x": np.zeros((2, 6), np.float32)}
    ref = run_model(m, zeros)["y"]
    np.testing.assert_array_equal(numpy_helper.to_array(bias), ref[0])


def test_dedupe_initializers_merges_identical_only() -> None:
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    m = model(
        [
            helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
            helper.make_node("MatMul", ["a", "w2"], ["b"], name="mm2"),
            helper.make_node("MatMul", ["b", "w3"], ["y"], name="mm3"),
        ],
        [vi("x", [1, 4])],
        [vi("y", [1, 4])],
        [C("w1", w), C("w2", w.copy()), C("w3", w + 1)],
    )
    out, changes = apply(passes.dedupe_initializers, m)
    assert sorted(t.name for t in out.graph.initializer) == ["w1", "w3"]
    assert changes[0].nodes == ("mm2",) and "merged 1 duplicate" in changes[0].message
    same_outputs(m, out, {"x": np.ones((1, 4), np.float32)})


def test_remove_unused_drops_dead_nodes_and_initializers() -> None:
    m = model(
        [
            helper.make_node("Relu", ["x"], ["y"], name="relu"),
            helper.make_node("Mul", ["x", "k"], ["dead"], name="dead_mul"),
        ],
        [vi("x", [1, 4])],
        [vi("y", [1, 4])],
        [C("k", np.ones(4, np.float32)), C("never_read", np.ones(3, np.float32))],
    )
    r = clean_model(m)
    mine = [c for c in r.changes if c.pass_name == "remove_unused"]
    assert any("never_read" in c.message for c in mine)
    assert any(c.nodes == ("dead_mul",) for c in mine)
    assert ops(r.model) == ["Relu"] and list(r.model.graph.initializer) == []


def test_toposort_only_when_unsorted() -> None:
    nodes = [
        helper.make_node("Relu", ["a"], ["y"], name="second"),
        helper.make_node("Neg", ["x"], ["a"], name="first"),
    ]
    m = model(nodes, [vi("x", [1, 4])], [vi("y", [1, 4])])
    graph = graph_from_model(m)
    assert passes.toposort(graph, OPTS)[0].pass_name == "toposort"
    assert [n.name for n in graph.nodes] == ["first", "second"]
    assert passes.toposort(graph, OPTS) == []


def test_skip_leaves_a_pass_out() -> None:
    nodes, inits, d = qdq_act("x", 0.05, 128, np.uint8)
    m = model(
        [*nodes, helper.make_node("Identity", [d], ["y"], name="ident")],
        [vi("x", [1, 8])],
        [vi("y", [1, 8])],
        inits,
    )
    r = clean_model(m, CleanOptions(skip=("qdq_to_int8",)))
    assert "qdq_to_int8" not in r.passes_run
    assert {c.pass_name for c in r.changes} == {"remove_noops"}
    assert [f.rule for f in r.findings] == ["qdq-uint8"]  # what was skipped is still named


# --------------------------------------------------------------------------------------------------
# verification
# --------------------------------------------------------------------------------------------------


def test_compare_models_fails_on_a_changed_weight_and_says_why() -> None:
    w = np.full((4, 4), 0.5, np.float32)
    a = model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [1, 4])], [vi("y", [1, 4])], [C("w", w)]
    )
    b = onnx.ModelProto()
    b.CopyFrom(a)
    b.graph.initializer[0].CopyFrom(C("w", w + 0.01))
    ok = compare_models(a, a, atol=1e-4, rtol=1e-3)
    assert ok and ok.max_abs == 0.0 and str(ok).startswith("PASSED")
    bad = compare_models(a, b, atol=1e-4, rtol=1e-3)
    assert not bad and bad.failed_elements == 4 and bad.total_elements == 4
    assert "FAILED" in str(bad) and "'y'" in str(bad) and "atol 0.0001" in str(bad)
    assert bad.max_abs == pytest.approx(0.01 * float(random_inputs(a)["x"].sum()), rel=1e-3)
    assert compare_models(a, b, atol=1.0, rtol=1e-3)  # within a loose atol


def test_random_inputs_dynamic_dims_become_one() -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", ["batch", 3])], [vi("y", ["batch", 3])])
    assert random_inputs(m)["x"].shape == (1, 3)


def test_verify_runs_a_model_with_a_scalar_bool_input() -> None:
    # QA: an If condition as a rank-0 input came out of numpy as a scalar, which onnxruntime refuses.
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [vi("t", [1, 2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", [1, 2])])
    m = model([helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
              [vi("x", [1, 2]), vi("c", [], TensorProto.BOOL)], [vi("y", [1, 2])])
    feeds = random_inputs(m)
    assert isinstance(feeds["c"], np.ndarray) and feeds["c"].shape == ()
    assert run_model(m, feeds)["y"].shape == (1, 2)


# --------------------------------------------------------------------------------------------------
# the zoo: real export patterns, end to end
# --------------------------------------------------------------------------------------------------


def _pattern_report(m: onnx.ModelProto) -> dict[str, list[str]]:
    """Every pattern TensorRT 8.6 refuses, by node name."""
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    prod = {o: n for n in m.graph.node for o in n.output}
    rep: dict[str, list[str]] = {"cast_in_qdq": [], "uint8_or_asym": [], "int32_dq": [], "saturate": []}
    for n in m.graph.node:
        if (
            n.op_type == "Cast"
            and prod.get(n.input[0]) is not None
            and prod[n.input[0]].op_type == "QuantizeLinear"
        ):
            rep["cast_in_qdq"].append(n.name)
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            zp = inits.get(n.input[2]) if len(n.input) > 2 else None
            no_zp = zp is None and n.op_type == "QuantizeLinear"  # defaults to uint8
            if no_zp or (zp is not None and (zp.dtype == np.uint8 or zp.any()) and zp.dtype != np.int32):
                rep["uint8_or_asym"].append(n.name)
            x = inits.get(n.input[0])
            if x is not None and x.dtype == np.int32:
                rep["int32_dq"].append(n.name)
            if any(a.name == "saturate" for a in n.attribute):
                rep["saturate"].append(n.name)
    return rep


def _int64_inits_only_where_onnx_requires(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    """No new int64 weights: any int64 initializer is either from the input or a shape-type input."""
    old = {t.name for t in before.graph.initializer if t.data_type == TensorProto.INT64}
    shape_slots = {
        ("Reshape", 1), ("Split", 1), ("Slice", 1), ("Slice", 2), ("Slice", 3), ("Slice", 4),
        ("Unsqueeze", 1), ("Squeeze", 1), ("Expand", 1), ("Tile", 1), ("Resize", 3), ("Pad", 1),
    }  # fmt: skip
    uses = {(n.op_type, i): x for n in after.graph.node for i, x in enumerate(n.input)}
    for t in after.graph.initializer:
        if t.data_type == TensorProto.INT64 and t.name not in old:
            slots = [k for k, v in uses.items() if v == t.name]
            assert slots and all(s in shape_slots for s in slots), (t.name, slots)


@pytest.fixture(scope="module")
def zoo():
    from edgeq import zoo as z

    cache: dict[tuple[str, str], onnx.ModelProto] = {}

    def get(name: str, variant: str) -> onnx.ModelProto:
        if (name, variant) not in cache:
            cache[name, variant] = z.build(name, variant)
        return cache[name, variant]

    return get


def _assert_fits(r, source: onnx.ModelProto) -> None:
    m = r.model
    onnx.checker.check_model(m, full_check=True)
    assert opset_of(m) <= 17 and m.ir_version <= 8
    assert _pattern_report(m) == {"cast_in_qdq": [], "uint8_or_asym": [], "int32_dq": [], "saturate": []}
    assert r.findings == []
    assert r.verification is not None and r.verification.passed
    assert r.verification.max_abs == 0.0  # every rewrite is exact
    _int64_inits_only_where_onnx_requires(source, m)
    assert clean_model(m, CleanOptions(verify=False)).changes == []  # idempotent


def _by_pass(changes) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for c in changes:
        out.setdefault(c.pass_name, set()).update(c.nodes)
    return out


@pytest.mark.parametrize("name", ["resnet", "yolo"])
def test_clean_pytorch_eager_export(zoo, name: str) -> None:
    src = zoo(name, "torch")
    before = _pattern_report(src)
    assert before["cast_in_qdq"] and before["uint8_or_asym"] and before["int32_dq"]
    r = clean_model(src)
    _assert_fits(r, src)
    done = _by_pass(r.changes)
    assert done["qdq_remove_casts"] == set(before["cast_in_qdq"])
    # every uint8 activation Q/DQ converted; the int8 weight DQs were already fine
    assert done["qdq_to_int8"] == set(before["uint8_or_asym"])
    assert done["fold_bias_dq"] == set(before["int32_dq"])


@pytest.mark.parametrize("name", ["yolo", "unet"])
def test_clean_onnxruntime_qdq_export(zoo, name: str) -> None:
    src = zoo(name, "ort")
    before = _pattern_report(src)
    assert before["int32_dq"] and not before["uint8_or_asym"]
    r = clean_model(src)
    _assert_fits(r, src)
    done = _by_pass(r.changes)
    assert done["fold_bias_dq"] == set(before["int32_dq"])
    assert "qdq_to_int8" not in done and "qdq_remove_casts" not in done
    q_before = sum(n.op_type == "QuantizeLinear" for n in src.graph.node)
    assert sum(n.op_type == "QuantizeLinear" for n in r.model.graph.node) == q_before  # Q/DQ untouched


@pytest.mark.parametrize("name", ["resnet", "unet"])
def test_clean_modelopt_opset19_export(zoo, name: str) -> None:
    src = zoo(name, "modelopt")
    assert opset_of(src) == 19 and src.ir_version == 10
    r = clean_model(src)
    _assert_fits(r, src)
    msgs = [c.message for c in r.changes]
    assert "IR version 10 -> 8" in msgs and "opset 19 -> 17 (onnx version converter)" in msgs


def test_clean_fp32_model_changes_nothing_that_matters(zoo) -> None:
    src = zoo("resnet", "fp32")
    r = clean_model(src)
    _assert_fits(r, src)
    assert {c.pass_name for c in r.changes} <= {"dedupe_initializers", "fold_constants"}
    assert ops(r.model) == ops(src)


# --------------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------------


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_cli_clean_writes_default_output_and_keeps_input(zoo, tmp_path: Path, cli) -> None:
    src = save_model(zoo("resnet", "torch"), tmp_path / "r.onnx")
    h = _sha(src)
    code, out, err = cli("clean", src)
    assert code == 0, err
    assert _sha(src) == h
    dst = tmp_path / "r.clean.onnx"
    assert dst.is_file()
    for pass_name in ("qdq_remove_casts", "qdq_to_int8", "fold_bias_dq"):
        assert pass_name in out
    assert "PASSED" in out and "wrote" in out
    assert "Traceback" not in err
    assert _pattern_report(onnx.load(str(dst)))["cast_in_qdq"] == []


def test_cli_clean_json(zoo, tmp_path: Path, cli) -> None:
    src = save_model(zoo("unet", "modelopt"), tmp_path / "u.onnx")
    code, out, _ = cli("clean", src, "-o", tmp_path / "x" / "u17.onnx", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["opset"] == 17 and doc["ir_version"] == 8 and doc["verification"]["passed"] is True
    assert doc["output"].endswith("u17.onnx") and (tmp_path / "x" / "u17.onnx").is_file()
    assert {c["pass"] for c in doc["changes"]} >= {"set_ir_version", "convert_opset"}


def test_cli_refuses_output_equal_to_input(tmp_path: Path, cli) -> None:
    p = tmp_path / "m.onnx"
    save_model(model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [1, 2])], [vi("y", [1, 2])]), p)
    h = _sha(p)
    code, _, err = cli("clean", p, "-o", p)
    assert code == 2 and "input" in err and len(err.strip().splitlines()) == 1
    assert _sha(p) == h


def test_cli_unknown_skip_exit_2(tmp_path: Path, cli) -> None:
    p = tmp_path / "m.onnx"
    save_model(model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [1, 2])], [vi("y", [1, 2])]), p)
    code, _, err = cli("clean", p, "--skip", "fold_everything")
    assert code == 2 and "fold_everything" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.clean.onnx").exists()


@pytest.mark.parametrize("args", [("--opset", "5"), ("--opset", "-3"), ("--atol", "-1"), ("--rtol", "nan")])
def test_cli_bad_opset_or_tolerance_exit_2_before_work(args, tmp_path: Path, cli) -> None:
    # QA: --opset -3 ran every pass and exited 1 with a converter error; --atol -1 / nan "verified".
    p = tmp_path / "m.onnx"
    save_model(model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [1, 2])], [vi("y", [1, 2])]), p)
    code, out, err = cli("clean", p, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and args[0] in err, (out, err)
    assert not (tmp_path / "m.clean.onnx").exists()


def test_cli_unfit_model_exit_1_written_with_findings(tmp_path: Path, cli) -> None:
    nodes, inits, d = qdq_act("x", 0.05, 100, np.uint8)  # zero-point 100: no exact int8 form
    p = save_model(
        model([*nodes, helper.make_node("Relu", [d], ["y"])], [vi("x", [1, 8])], [vi("y", [1, 8])], inits),
        tmp_path / "a.onnx",
    )
    code, out, _ = cli("clean", p)
    assert code == 1
    assert "qdq-uint8" in out and "x_Q" in out and (tmp_path / "a.clean.onnx").is_file()


def test_cli_verification_failure_exit_1_nothing_written(tmp_path: Path, cli, monkeypatch) -> None:
    """A pass that changes the numbers (a bug we plant) must be caught by --verify, and not written."""
    import edgeq.graph.clean as clean_mod

    def perturb(graph, options):
        for t in graph.tensors().values():
            if getattr(t, "values", None) is not None and t.values.dtype == np.float32:
                t.values = t.values + 1.0
        return [Change("perturb", "added 1 to every float weight")]

    monkeypatch.setattr(clean_mod, "PASSES", (*PASSES, passes.Pass("perturb", perturb, "graph")))
    monkeypatch.setattr(clean_mod, "PASS_NAMES", (*PASS_NAMES, "perturb"))
    w = np.ones((2, 2), np.float32)
    p = save_model(
        model(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [1, 2])], [vi("y", [1, 2])], [C("w", w)]
        ),
        tmp_path / "m.onnx",
    )
    code, out, _ = cli("clean", p)
    assert code == 1 and "FAILED" in out and "not written" in out
    assert not (tmp_path / "m.clean.onnx").exists()
    code, out, _ = cli("clean", p, "--no-verify")
    assert code == 0 and (tmp_path / "m.clean.onnx").is_file()


def test_cli_help_lists_every_pass(cli) -> None:
    code, out, _ = cli("clean", "--help")
    assert code == 0
    for p in PASSES:
        assert p.name in out


def test_fit_findings_names_uint8_weight_without_zero_point() -> None:
    m = model(
        [helper.make_node("DequantizeLinear", ["w", "s"], ["y"], name="dq_u8_weight")],
        [],
        [vi("y", [2])],
        [C("w", np.array([200, 3], np.uint8)), C("s", np.float32(0.1))],
    )
    assert [(f.rule, f.level, f.nodes) for f in fit_findings(m)] == [
        ("qdq-uint8", Level.ERROR, ("dq_u8_weight",))
    ]


def test_cli_input_onnxruntime_cannot_run_is_one_clear_error(tmp_path: Path, cli) -> None:
    """A node of a domain no onnxruntime implements (a TensorRT plugin, say): every onnxruntime version
    refuses the input, so --verify cannot run; --no-verify still cleans (Identity removed, opset of
    today's onnx brought to 17) and keeps the node."""
    m = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Identity", ["x"], ["i"], name="debris"),
                helper.make_node("NoSuchKernel", ["i"], ["y"], name="plugin", domain="org.example.plugin"),
            ],
            "g",
            [vi("x", [1, 4])],
            [vi("y", [1, 4])],
        ),
        opset_imports=[
            helper.make_opsetid("", max(18, onnx.defs.onnx_opset_version())),  # what onnx stamps today
            helper.make_opsetid("org.example.plugin", 1),
        ],
    )
    p = tmp_path / "plugin.onnx"
    p.write_bytes(m.SerializeToString())
    code, _, err = cli("clean", p)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "input model" in errors[0] and "--no-verify" in errors[0]
    assert "NoSuchKernel" in errors[0]
    assert "Traceback" not in err and not (tmp_path / "plugin.clean.onnx").exists()
    code, _, _ = cli("clean", p, "--no-verify")
    assert code == 0
    out = onnx.load(str(tmp_path / "plugin.clean.onnx"))
    assert opset_of(out) == 17 and out.ir_version == 8
    assert [(n.op_type, n.domain) for n in out.graph.node] == [("NoSuchKernel", "org.example.plugin")]


def test_convert_opset_refuses_float8_qdq_by_name() -> None:
    z8 = helper.make_tensor("z8", TensorProto.FLOAT8E4M3FN, [], [0.0])
    m = model(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z8"], ["q"], name="fp8_Q", saturate=1),
            helper.make_node("DequantizeLinear", ["q", "s", "z8"], ["y"], name="fp8_DQ"),
        ],
        [vi("x", [1, 4])],
        [vi("y", [1, 4])],
        [C("s", np.float32(0.1)), z8],
        opset=19,
        ir=9,
    )
    with pytest.raises(Unfit) as e:
        passes.convert_opset(m, OPTS)
    assert set(e.value.nodes) == {"fp8_Q", "fp8_DQ"} and "FLOAT8E4M3FN" in str(e.value)


def test_cli_nan_outputs_are_a_failure_of_the_input_not_a_pass(tmp_path: Path, cli) -> None:
    """Issue 20.5: a model whose weights are NaN "PASSED: max abs error 0" (NaN == NaN was taken as equal)."""
    from edgeq import zoo

    m = zoo.resnet_like(size=32)
    for t in m.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(np.full_like(numpy_helper.to_array(t), np.nan), t.name))
    src = save_model(m, tmp_path / "nan.onnx")
    before = src.read_bytes()
    code, out, err = cli("clean", src)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, (out, err)
    assert "the input model" in errors[0] and "NaN" in errors[0] and "PASSED" not in out
    assert not (tmp_path / "nan.clean.onnx").exists() and src.read_bytes() == before
    # inf in both is no agreement either; a finite reference still compares as before
    div = [helper.make_node("Div", ["x", "zero"], ["y"], name="div")]
    inf = model(div, [vi("x", [1, 4])], [vi("y", [1, 4])], [C("zero", np.zeros((1, 4), np.float32))])
    with pytest.raises(GraphError, match="the input model computes non-finite values"):
        compare_models(inf, inf, atol=1e-4, rtol=1e-3)
    finite = zoo.resnet_like(size=32)
    assert compare_models(finite, finite, atol=1e-4, rtol=1e-3)


def test_verify_prints_its_figures_without_e_notation(tmp_path, cli):
    """Issue 43.9: ``clean`` printed "max abs error 5.22e-08 ... max rel error 5.88e-07". A Conv and its
    BatchNormalization folded into one (fold_batchnorm) round differently by a few 1e-6: printed as
    decimals (``edgeq.text.number``), as every other figure, and so is ``--atol 1e-5``."""
    import re

    rng = np.random.default_rng(0)
    arrays = {"W": rng.standard_normal((8, 3, 3, 3)), "s": rng.uniform(0.5, 2, 8),
              "b": rng.standard_normal(8), "m": rng.standard_normal(8), "v": rng.uniform(0.5, 2, 8)}
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()]
    nodes = [helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["y", "s", "b", "m", "v"], ["z"])]  # fmt: skip
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    src = tmp_path / "bn.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(src))
    code, out, err = cli("clean", src, "--atol", "1e-5", "--rtol", "0.01")
    (line,) = [ln for ln in out.splitlines() if ln.startswith("verify")]
    assert code == 0 and "fold_batchnorm" in out, (out, err)
    m = re.search(r"max abs error (\S+) \(atol 0\.00001\), max rel error (\S+) \(rtol 0\.01\)", line)
    assert m is not None and float(m.group(1)) > 0, line  # the fold moved the figures: nonzero
    assert not re.search(r"\d[eE][-+]?\d", out + err), line
