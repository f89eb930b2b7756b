"""ONNX I/O (edgeq.graph.io) and bad input through the CLI: one line, exit 2, input untouched."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeq.errors import GraphError
from edgeq.graph import io


def _tiny(n_weights: int = 64, *, opset: int = 17) -> onnx.ModelProto:
    """x -> MatMul(W) -> Relu -> y, with W big enough (n_weights x 8 floats) to go to external data."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n_weights, 8)).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Relu", ["m"], ["y"], name="relu"),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n_weights])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "<not a file>"


# --------------------------------------------------------------------------------------------------
# load / save
# --------------------------------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path: Path) -> None:
    m = _tiny()
    p = io.save_model(m, tmp_path / "m.onnx")
    back = io.load_model(p)
    assert (
        numpy_helper.to_array(back.graph.initializer[0]).tobytes()
        == numpy_helper.to_array(m.graph.initializer[0]).tobytes()
    )
    assert [n.name for n in back.graph.node] == ["mm", "relu"]
    assert list(tmp_path.iterdir()) == [p]  # no temp files left behind


def test_external_data_round_trip(tmp_path: Path, cli) -> None:
    m = _tiny(256)
    p = io.save_model(m, tmp_path / "ext.onnx", external_data=True)
    data = tmp_path / "ext.onnx.data"
    assert data.is_file() and data.stat().st_size >= 256 * 8 * 4
    assert p.stat().st_size < 1024  # the weights are not inline
    back = io.load_model(p)
    w = numpy_helper.to_array(back.graph.initializer[0])
    assert np.array_equal(w, numpy_helper.to_array(m.graph.initializer[0]))
    # and the CLI reads it, writes a model that loads, and leaves both input files alone
    before = (_sha(p), _sha(data))
    code, _, err = cli("clean", p, "-o", tmp_path / "out" / "ext.clean.onnx")
    assert code == 0, err
    assert (_sha(p), _sha(data)) == before
    cleaned = io.load_model(tmp_path / "out" / "ext.clean.onnx")
    assert np.array_equal(numpy_helper.to_array(cleaned.graph.initializer[0]), w)


def test_output_onto_the_inputs_external_data_is_refused(tmp_path: Path, cli) -> None:
    # QA: `clean ext.onnx -o ext.onnx.data` replaced the input's weights with the cleaned model (exit 0).
    p = io.save_model(_tiny(256), tmp_path / "ext.onnx", external_data=True)
    data = tmp_path / "ext.onnx.data"
    read: list[Path] = []
    io.load_model(p, sources=read)
    assert read == [p, data]
    before = (_sha(p), _sha(data))
    code, out, err = cli("clean", p, "-o", data)
    assert code == 2 and "input" in err and len(err.strip().splitlines()) == 1, (out, err)
    assert (_sha(p), _sha(data)) == before


def test_the_size_estimate_is_the_serialized_size_without_serializing() -> None:
    """The 2 GB choice reads ``serialized_size``: within a few dozen bytes per tensor of protobuf's count,
    whether the weights are raw bytes, float_data, a Constant node's tensor, in a subgraph or a zoo net."""
    from edgeq import zoo

    rng = np.random.default_rng(1)
    floats = helper.make_tensor("f", TensorProto.FLOAT, [64, 8], rng.standard_normal(512).tolist())
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
        rng.standard_normal((64, 8)).astype(np.float32), "cv"))
    k = numpy_helper.from_array(rng.standard_normal((64, 8)).astype(np.float32), "k")
    branch = helper.make_graph([helper.make_node("Identity", ["k"], ["out"])], "b", [],
                               [helper.make_tensor_value_info("out", TensorProto.FLOAT, [64, 8])], [k])
    g = helper.make_graph(
        [const, helper.make_node("Add", ["f", "c"], ["a"]),
         helper.make_node("If", ["cond"], ["i"], then_branch=branch, else_branch=branch),
         helper.make_node("Add", ["a", "i"], ["y"])],
        "mixed", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 8])], [floats])
    models = [_tiny(256), helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              zoo.resnet_like(size=32, width=8, layers=(1, 1), classes=10, seed=0)]
    for m in models:
        exact, est = m.ByteSize(), io.serialized_size(m)
        assert exact - 64 <= est <= exact + 256 + 48 * len(m.graph.initializer), (est, exact)


def test_external_data_threshold_picks_external(tmp_path: Path, monkeypatch) -> None:
    """Models over the protobuf limit go to external data by themselves (threshold lowered to test it)."""
    monkeypatch.setattr(io, "EXTERNAL_DATA_THRESHOLD", 1000)
    io.save_model(_tiny(256), tmp_path / "big.onnx")
    assert (tmp_path / "big.onnx.data").is_file()
    io.save_model(_tiny(4), tmp_path / "small.onnx")
    assert not (tmp_path / "small.onnx.data").exists()


def test_failing_save_leaves_no_partial_output(tmp_path: Path, monkeypatch) -> None:
    dest = tmp_path / "out.onnx"
    dest.write_bytes(b"previous contents")

    def half_written(model, path, *, external):  # the disk fills up halfway through
        Path(path).write_bytes(model.SerializeToString()[:100])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(io, "_save", half_written)
    with pytest.raises(GraphError, match="No space left"):
        io.save_model(_tiny(), dest)
    assert dest.read_bytes() == b"previous contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]
    with pytest.raises(GraphError):
        io.save_model(_tiny(), tmp_path / "new.onnx")
    assert not (tmp_path / "new.onnx").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]


def test_cli_unwritable_output_is_one_line_exit_2(tmp_path: Path, cli) -> None:
    src = io.save_model(_tiny(), tmp_path / "m.onnx")
    (tmp_path / "adir").mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for dest, word in ((tmp_path / "adir", "directory"), (blocker / "sub" / "m.onnx", "cannot write")):
        code, _, err = cli("clean", src, "-o", dest)
        assert code == 2 and len(err.strip().splitlines()) == 1 and word in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "file", "m.onnx"]
    assert list((tmp_path / "adir").iterdir()) == []


def test_unsorted_graph_is_sorted_on_load(tmp_path: Path) -> None:
    m = _tiny()
    nodes = list(m.graph.node)[::-1]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    p = tmp_path / "unsorted.onnx"
    p.write_bytes(m.SerializeToString())
    assert [n.name for n in io.load_model(p).graph.node] == ["mm", "relu"]


def test_default_output_and_opset() -> None:
    assert io.default_output("dir/model.onnx", "clean") == Path("dir/model.clean.onnx")
    assert io.default_output("model", "int8") == Path("model.int8.onnx")
    assert io.opset_of(_tiny(opset=13)) == 13


def test_infer_shapes_fills_value_info() -> None:
    typed = io.infer_shapes(_tiny())
    m = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in typed.graph.value_info}
    assert m["m"] == [1, 8]


def test_graph_round_trip_keeps_ir_version() -> None:
    m = _tiny()
    m.ir_version = 7
    back = io.model_from_graph(io.graph_from_model(m), like=m)
    assert back.ir_version == 7
    onnx.checker.check_model(back)


# --------------------------------------------------------------------------------------------------
# bad input through the CLI
# --------------------------------------------------------------------------------------------------


def _cycle() -> onnx.ModelProto:
    g = helper.make_graph(
        [
            helper.make_node("Add", ["x", "b"], ["a"], name="add_in_cycle"),
            helper.make_node("Relu", ["a"], ["b"], name="relu_in_cycle"),
        ],
        "cycle",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _dangling() -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "ghost"], ["y"], name="reads_ghost")],
        "dangling",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _make_bad(kind: str, tmp: Path) -> tuple[Path, str]:
    """Returns the path to pass and a word the error line must contain."""
    if kind == "missing":
        return tmp / "nope.onnx", "no such file"
    if kind == "directory":
        d = tmp / "adir.onnx"
        d.mkdir()
        return d, "not a file"
    if kind == "not-onnx":
        p = tmp / "notes.onnx"
        p.write_text("this is a text file, not a model\n" * 20)
        return p, "not an ONNX model"
    if kind == "empty":
        p = tmp / "empty.onnx"
        p.write_bytes(b"")
        return p, "empty"
    if kind == "truncated":
        p = tmp / "trunc.onnx"
        p.write_bytes(_tiny(256).SerializeToString()[:3000])
        return p, "truncated"
    if kind == "missing-external":
        p = io.save_model(_tiny(256), tmp / "ext.onnx", external_data=True)
        (tmp / "ext.onnx.data").unlink()
        return p, "ext.onnx.data"
    if kind == "short-external":
        p = io.save_model(_tiny(256), tmp / "ext.onnx", external_data=True)
        data = tmp / "ext.onnx.data"
        data.write_bytes(data.read_bytes()[:100])
        return p, "external data"
    if kind == "escaping-external":
        p = io.save_model(_tiny(256), tmp / "sub" / "ext.onnx", external_data=True)
        m = onnx.load(str(p), load_external_data=False)
        for e in m.graph.initializer[0].external_data:
            if e.key == "location":
                e.value = "../outside.data"
        (tmp / "outside.data").write_bytes((tmp / "sub" / "ext.onnx.data").read_bytes())
        p.write_bytes(m.SerializeToString())
        return p, "outside"
    if kind == "json-file":  # onnx.load parses *.json as JSON protobuf: a layer file given as the model
        p = tmp / "layers.json"
        p.write_text('{"Layers": [], "Bindings": []}')
        return p, "not an ONNX model"
    if kind == "cycle":
        p = tmp / "cycle.onnx"
        p.write_bytes(_cycle().SerializeToString())
        return p, "cycle"
    if kind == "dangling":
        p = tmp / "dangling.onnx"
        p.write_bytes(_dangling().SerializeToString())
        return p, "ghost"
    raise AssertionError(kind)


BAD = [
    "missing", "directory", "not-onnx", "empty", "truncated", "missing-external", "short-external",
    "escaping-external", "cycle", "dangling", "json-file",
]  # fmt: skip


@pytest.mark.parametrize("kind", BAD)
def test_bad_input_one_line_exit_2_input_unchanged(kind: str, tmp_path: Path, cli) -> None:
    path, word = _make_bad(kind, tmp_path)
    before = {p: _sha(p) for p in tmp_path.rglob("*")}
    code, out, err = cli("clean", path)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (out, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err + out
    assert lines[0].startswith("error:")
    assert word.lower() in lines[0].lower(), lines[0]
    assert {p: _sha(p) for p in tmp_path.rglob("*")} == before  # nothing changed, nothing written


@pytest.mark.parametrize("kind", ["cycle", "dangling", "truncated", "missing-external", "json-file"])
def test_bad_input_raises_graph_error_in_library(kind: str, tmp_path: Path) -> None:
    path, word = _make_bad(kind, tmp_path)
    with pytest.raises(GraphError, match="(?i)" + word.replace(".", r"\.")):
        io.load_model(path)


def test_cycle_error_names_the_nodes(tmp_path: Path) -> None:
    path, _ = _make_bad("cycle", tmp_path)
    with pytest.raises(GraphError) as e:
        io.load_model(path)
    assert "add_in_cycle" in str(e.value) and "relu_in_cycle" in str(e.value)


def test_atomic_writes_get_normal_file_permissions(tmp_path):
    """mkstemp's 0600 must not leak into outputs; a replaced file keeps its mode."""
    import os
    import stat

    from edgeq.fs import atomic_write_text

    old = os.umask(0o022)
    try:
        new = tmp_path / "new.cache"
        atomic_write_text(new, "x")
        assert stat.S_IMODE(new.stat().st_mode) == 0o644
        kept = tmp_path / "kept.cache"
        kept.write_text("a")
        kept.chmod(0o640)
        atomic_write_text(kept, "b")
        assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and kept.read_text() == "b"
    finally:
        os.umask(old)
