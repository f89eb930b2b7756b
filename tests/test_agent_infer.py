"""The agent's ``infer``: held-out inputs in, the engine's outputs out, without numpy on the target.

The array files are checked against real numpy both ways; trtexec's ``--exportOutput`` parser on text in
trtexec 8.6's layout; the backend-neutral loop of the python backend (inputs checked and narrowed per
binding, outputs stacked per sample) on its pure functions; and the trtexec backend end to end through
the stand-in of tests/trtexec_replay.py, whose outputs come from onnxruntime (not TensorRT).
"""

from __future__ import annotations

import array
import io

import numpy as np
import onnx
import pytest
from conftest import FIXTURES
from onnx import TensorProto, helper
from test_agent import agent, run_agent  # noqa: F401 - the zipapp fixture
from trtexec_replay import Recorded, calls, replay_trtexec

from edgeq.agent import arrays
from edgeq.agent.common import AgentError
from edgeq.agent.infer import Binding, run_samples, samples_for
from edgeq.agent.trtexec_backend import infer_argv


def test_npz_from_the_agent_reads_in_numpy_with_every_binding_type(tmp_path):
    rng = np.random.default_rng(0)
    want = {
        "images/0:x": rng.standard_normal((3, 2, 5)).astype(np.float32),
        "half": rng.standard_normal((2, 4)).astype(np.float16),
        "ids": rng.integers(-9, 9, (2, 3)).astype(np.int32),
        "q": rng.integers(-128, 127, (2, 7)).astype(np.int8),
        "mask": rng.random((2, 3)) > 0.5,
        "u8": rng.integers(0, 255, (2, 1, 1)).astype(np.uint8),
        "scalar": np.asarray(np.float32(3.5)),
        "empty": np.zeros((2, 0), np.float32),
    }
    out = {k: arrays.Array(v.dtype.str, v.shape, v.tobytes()) for k, v in want.items()}
    arrays.write_npz(str(tmp_path / "o.npz"), out)
    with np.load(tmp_path / "o.npz") as z:
        assert sorted(z.files) == sorted(want)
        for k, v in want.items():
            assert z[k].dtype == v.dtype and z[k].shape == v.shape
            np.testing.assert_array_equal(z[k], v)
    for k, v in want.items():  # each .npy's header is what numpy writes: data 64-byte aligned
        data = arrays.npy_bytes(out[k])
        assert (data.index(b"\n") + 1) % 64 == 0
        np.testing.assert_array_equal(np.load(io.BytesIO(data)), v)


def test_npz_from_numpy_reads_in_the_agent_and_narrows_as_tensorrt_does(tmp_path):
    x = np.arange(12, dtype=">f4").reshape(3, 4)  # big-endian: swapped on reading
    ids = np.array([[1, -2], [3, 1 << 20]], np.int64)
    d = np.linspace(0, 1, 6).reshape(2, 3)  # float64: numpy's default
    np.savez(tmp_path / "i.npz", x=x, ids=ids, d=d)
    np.save(tmp_path / "obj.npy", np.array(["a"], dtype=object), allow_pickle=True)
    got = arrays.read_npz(str(tmp_path / "i.npz"))
    assert got["x"].shape == (3, 4) and got["x"].data == x.astype("<f4").tobytes()
    narrowed = arrays.for_binding(got["ids"], "INT32", "ids")
    assert narrowed.descr == "<i4" and narrowed.data == ids.astype(np.int32).tobytes()
    assert arrays.for_binding(got["d"], "FLOAT", "d").data == d.astype(np.float32).tobytes()
    with pytest.raises(arrays.ArrayError, match="outside INT32"):
        arrays.for_binding(arrays.Array("<i8", (1,), np.int64(1 << 40).tobytes()), "INT32", "big")
    with pytest.raises(arrays.ArrayError, match="the engine takes HALF"):
        arrays.for_binding(got["x"], "HALF", "x")
    with pytest.raises(arrays.ArrayError, match="Fortran order"):
        arrays.parse_npy(_npy(np.asfortranarray(np.ones((2, 3)))))
    with pytest.raises(arrays.ArrayError, match="only plain numeric"):
        arrays.parse_npy((tmp_path / "obj.npy").read_bytes())


def _npy(a: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.save(f, a)
    return f.getvalue()


# What trtexec 8.6 writes for --exportOutput, laid out as samples/common/sampleReporting.cpp's
# exportJSONOutput writes it (no recording of it is in the fixtures): per output binding, the name
# unescaped, the dimensions as sampleOptions.h prints Dims, the values as C++'s operator<< prints them.
EXPORT_OUTPUT_86 = """[
  { "name" : "scores:0"
  , "dimensions" : "1x2x3"
  , "values" : [ 0.25, -1.5e-05, nan, -nan, inf, -inf ]
  }
, { "name" : "say "hi""
  , "dimensions" : "2"
  , "values" : [ 1, 0 ]
  }
, { "name" : "scalar"
  , "dimensions" : ""
  , "values" : [ 123457 ]
  }
]
"""


def test_export_output_is_read_in_trtexec_86s_layout():
    (scores, quoted, scalar) = arrays.parse_export_output(EXPORT_OUTPUT_86)
    assert scores[:2] == ("scores:0", (1, 2, 3))
    v = scores[2]
    assert v[:2] == [0.25, -1.5e-05] and np.isnan(v[2]) and np.isnan(v[3]) and v[4:] == [np.inf, -np.inf]
    assert quoted == ('say "hi"', (2,), [1.0, 0.0])
    assert scalar == ("scalar", (), [123457.0])
    assert arrays.parse_export_output("[\n]\n") == []
    with pytest.raises(arrays.ArrayError, match=r"'b' has 1 values for dimensions 2"):
        arrays.parse_export_output('[\n  { "name" : "b"\n  , "dimensions" : "2"\n'
                                   '  , "values" : [ 1 ]\n  }\n]\n')
    with pytest.raises(arrays.ArrayError, match="no outputs in trtexec's output format"):
        arrays.parse_export_output('{"something": "else"}')


def _bindings() -> list[Binding]:
    return [Binding("x", (1, 4), "FLOAT", True), Binding("ids", (1, 2), "INT32", True),
            Binding("y", (1, 4), "FLOAT", False)]  # fmt: skip


def test_samples_are_checked_against_the_engines_bindings_and_narrowed():
    x = np.arange(12, dtype=np.float32).reshape(3, 1, 4)
    ids = np.arange(6, dtype=np.int64).reshape(3, 1, 2)
    inputs = {"x": arrays.Array("<f4", x.shape, x.tobytes()),
              "ids": arrays.Array("<i8", ids.shape, ids.tobytes())}
    feeds = samples_for(_bindings(), inputs)
    assert len(feeds) == 3
    assert feeds[1] == {"x": x[1].tobytes(), "ids": ids[1].astype(np.int32).tobytes()}
    with pytest.raises(AgentError, match=r"input 'x': held-out samples of shape \[1, 5\], the engine takes"):
        samples_for(_bindings(), {**inputs, "x": arrays.Array("<f4", (3, 1, 5), bytes(60))})
    with pytest.raises(AgentError, match="the engine's input 'ids' is not in the held-out data"):
        samples_for(_bindings(), {"x": inputs["x"]})


def test_samples_run_in_order_and_outputs_stack_per_binding():
    """The python backend's loop: one execution per sample, each output's bytes stacked in sample order
    in the binding's type; an execution that returns the wrong size is said, naming the sample."""
    x = np.arange(8, dtype=np.float32).reshape(2, 1, 4)
    ids = np.zeros((2, 1, 2), np.int32)
    inputs = {"x": arrays.Array("<f4", x.shape, x.tobytes()),
              "ids": arrays.Array("<i4", ids.shape, ids.tobytes())}
    seen = []

    def execute(feed):  # the device: y = 2 * x
        seen.append(feed["x"])
        a = array.array("f")
        a.frombytes(feed["x"])
        return {"y": array.array("f", [2 * v for v in a]).tobytes()}

    out = run_samples(_bindings(), samples_for(_bindings(), inputs), execute)
    assert seen == [x[0].tobytes(), x[1].tobytes()]
    assert out["y"].descr == "<f4" and out["y"].shape == (2, 1, 4)
    assert out["y"].data == (2 * x).tobytes()
    with pytest.raises(AgentError, match=r"sample 0: output 'y' came back with 4 bytes, expected 16"):
        run_samples(_bindings(), samples_for(_bindings(), inputs), lambda feed: {"y": bytes(4)})


def test_infer_argv_quotes_names_for_load_inputs():
    argv = infer_argv("/t/trtexec", "/r/e.plan", [("in:0", "/r/a b/0.bin"), ("x", "/r/1.bin")], "/r/o.json")
    assert argv == ["/t/trtexec", "--loadEngine=/r/e.plan", "--loadInputs='in:0':/r/a b/0.bin,'x':/r/1.bin",
                    "--exportOutput=/r/o.json", "--warmUp=0", "--iterations=1", "--duration=0"]  # fmt: skip
    with pytest.raises(ValueError, match="cannot name a tensor with ','"):
        infer_argv("t", "e", [("a,b", "f")], "o")
    assert "--useDLACore=1" in infer_argv("t", "e", [("a", "f")], "o", dla_core=1)


def _two_input_model(path):
    """y = x * 2 + float(ids): a float input and an INT64 one (a TensorRT 8.6 INT32 binding)."""
    nodes = [helper.make_node("Cast", ["ids"], ["idsf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "two"], ["x2"]),
             helper.make_node("Add", ["x2", "idsf"], ["y"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_trtexec_backend_runs_each_sample_and_returns_the_outputs(agent, tmp_path):  # noqa: F811
    """Through the stand-in (onnxruntime, not TensorRT): one trtexec run per sample with both inputs as
    raw files (INT64 narrowed to INT32), its JSON read back into one stacked .npz."""
    trtexec = replay_trtexec(tmp_path, build=Recorded(FIXTURES / "resnet50_ortfb.explicit.build.log"),
                             run=Recorded(FIXTURES / "resnet50_ortfb.explicit.run.log"))  # fmt: skip
    model = _two_input_model(tmp_path / "two.onnx")
    engine = tmp_path / "e.plan"
    backend = ["--backend=trtexec", f"--trtexec={trtexec}"]
    code, obj, _ = run_agent(agent, "build", *backend, f"--onnx={model}", f"--saveEngine={engine}", "--int8")
    assert code == 0, obj
    x = np.random.default_rng(1).standard_normal((3, 1, 4)).astype(np.float32)
    ids = np.arange(12, dtype=np.int64).reshape(3, 1, 4) - 5
    np.savez(tmp_path / "in.npz", x=x, ids=ids)
    out = tmp_path / "out dir" / "out.npz"
    code, obj, _ = run_agent(agent, "infer", *backend, f"--loadEngine={engine}",
                             f"--loadInputs={tmp_path / 'in.npz'}", f"--exportOutput={out}")  # fmt: skip
    assert code == 0, obj
    res = obj["result"]
    assert res["samples"] == 3 and res["outputs"] == {"y": {"shape": [3, 1, 4], "dtype": "<f8"}}
    assert res["tensorrt"] == "8.6.0"
    with np.load(out) as z:
        np.testing.assert_allclose(z["y"], 2 * x + ids, rtol=1e-5)  # 6 significant digits, as trtexec prints
    runs = [a for a in calls(trtexec) if any(s.startswith("--exportOutput=") for s in a)]
    assert len(runs) == 3
    assert sorted(p.name for p in (tmp_path / "out dir").iterdir()) == ["out.npz"]  # its temporary files gone

    # an engine input the held-out data lacks: trtexec would feed it random values; the agent refuses
    np.savez(tmp_path / "x_only.npz", x=x)
    code, obj, _ = run_agent(agent, "infer", *backend, f"--loadEngine={engine}",
                             f"--loadInputs={tmp_path / 'x_only.npz'}", f"--exportOutput={out}")  # fmt: skip
    assert code == 1 and obj["error"]["stage"] == "input"
    assert obj["error"]["message"] == ("the engine's input 'ids' is not in the held-out data (trtexec fed it "
                                       "random values)")


def test_python_backend_infer_without_tensorrt_fails_structured(agent, tmp_path):  # noqa: F811
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 1, 4), np.float32))
    (tmp_path / "e.plan").write_bytes(b"x")
    engine, out = f"--loadEngine={tmp_path / 'e.plan'}", f"--exportOutput={tmp_path / 'o.npz'}"
    code, obj, _ = run_agent(agent, "infer", engine, f"--loadInputs={tmp_path / 'in.npz'}", out)
    assert code == 1 and obj["error"]["stage"] == "import"
    code, obj, _ = run_agent(agent, "infer", engine, f"--loadInputs={tmp_path / 'none.npz'}", out)
    assert code == 1 and obj["error"]["stage"] == "input" and "none.npz" in obj["error"]["message"]


# -- samples of several shapes (an engine with a dynamic input, each sample at its own shape) ------------

WIDTHS = [24, 16, 24, 40, 16, 32]  # held-out text lines, each its own width, two widths twice


def _crnn(path):
    """A CRNN-like recogniser, its width free as ddddocr's: x 1x1x16xW -> conv, relu, 2x2 max pool, the
    height averaged away, the width as the sequence: y (W/2)x1x4, so the output's shape follows W."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("ReduceMean", ["p"], ["m"], axes=[2], keepdims=0),
             helper.make_node("Transpose", ["m"], ["y"], perm=[2, 0, 1])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "crnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 16, "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 1, 4])],
        [helper.make_tensor("w", TensorProto.FLOAT, [4, 1, 3, 3], rng.standard_normal(36).tolist()),
         helper.make_tensor("b", TensorProto.FLOAT, [4], [0.1, -0.1, 0.2, 0.0])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _ragged(widths=WIDTHS):
    rng = np.random.default_rng(9)
    return [{"x": rng.standard_normal((1, 1, 16, w)).astype(np.float32)} for w in widths]


def test_the_host_groups_samples_by_shape_and_puts_the_outputs_back_in_order(tmp_path):
    """What travels: one array per input and shape group (``<group>/<input>`` when there are several), one
    ``--shapes`` per group in trtexec's syntax; what comes back is put back in the samples' order. Two
    shapes inside one group is still edgeq's bug; a static model (no dynamic input) is one group."""
    from edgeq.pipeline.accuracy import group_by_shape, group_shapes, pack_inputs, unpack_outputs

    feeds = _ragged()
    groups = group_by_shape(feeds, ["x"])
    assert groups == [[0, 2], [1, 4], [3], [5]]  # by first appearance
    assert group_shapes(feeds, groups, ["x"]) == ["x:1x1x16x24", "x:1x1x16x16", "x:1x1x16x40", "x:1x1x16x32"]
    pack_inputs(feeds, tmp_path / "in.npz", groups)
    with np.load(tmp_path / "in.npz") as z:
        assert sorted(z.files) == ["0/x", "1/x", "2/x", "3/x"]
        np.testing.assert_array_equal(z["1/x"], np.stack([feeds[1]["x"], feeds[4]["x"]]))
    # the agent's outputs per group, y = the sample's own first row, (W,) long: reassembled per sample
    arrays.write_npz(str(tmp_path / "out.npz"), {
        f"{k}/y": arrays.Array("<f4", (len(g), feeds[g[0]]["x"].shape[3]),
                               b"".join(feeds[i]["x"][0, 0, 0].tobytes() for i in g))
        for k, g in enumerate(groups)})  # fmt: skip
    reference = [{"y": np.zeros(w, np.float64)} for w in WIDTHS]
    got = unpack_outputs(tmp_path / "out.npz", reference, groups)
    for feed, out in zip(feeds, got):
        assert out["y"].dtype == np.float64
        np.testing.assert_array_equal(out["y"], feed["x"][0, 0, 0])
    with pytest.raises(RuntimeError, match="edgeq bug: held-out samples of 2 shapes for input 'x'"):
        pack_inputs(feeds, tmp_path / "bad.npz", [[0, 1], [2, 3, 4, 5]])
    assert not (tmp_path / "bad.npz").exists()
    assert group_by_shape(feeds, []) == [list(range(len(WIDTHS)))] and group_shapes(feeds, [[0]], []) == []


def test_python_backend_sets_each_groups_shapes_before_its_samples_and_sizes_buffers_for_the_largest(
        tmp_path):  # fmt: skip
    """The python backend's pure parts (no TensorRT here): the groups read from what the host packed, each
    group's bindings taken at its shapes (``set_input_shape``, outputs sized from ``get_tensor_shape``:
    here a stand-in that computes y's shape from x's width), one buffer per tensor of the largest size,
    and each group run after its shapes are set again; the outputs file reads back in sample order."""
    from edgeq.agent.infer import grouped, largest, load_groups, plan_groups, run_groups
    from edgeq.agent.shapes import parse_shapes
    from edgeq.pipeline.accuracy import group_by_shape, group_shapes, pack_inputs, unpack_outputs

    feeds = _ragged()
    groups = group_by_shape(feeds, ["x"])
    pack_inputs(feeds, tmp_path / "in.npz", groups)
    shapes = group_shapes(feeds, groups, ["x"])
    loaded = load_groups(str(tmp_path / "in.npz"), shapes)
    assert [s for s, _ in loaded] == shapes and [g["x"].shape[0] for _, g in loaded] == [2, 2, 1, 1]
    seen = []

    def bindings_at(text):  # the context set to the group's shapes, its tensors' shapes read back
        ((_, dims),) = parse_shapes(text)
        seen.append(("set", dims[3]))
        return [Binding("x", dims, "FLOAT", True), Binding("y", (dims[3] // 2, 1, 4), "FLOAT", False)]

    def execute(bindings, feed):  # the engine: y's (W/2)*4 values are x's first ones
        seen.append(("run", len(feed["x"]) // 64))
        return {"y": feed["x"][: bindings[1].nbytes]}

    plans = plan_groups(loaded, bindings_at)
    assert largest(plans) == {"x": 16 * 40 * 4, "y": 20 * 4 * 4}
    out = grouped(run_groups(plans, bindings_at, execute))
    ran = [("set", 24), ("run", 24), ("run", 24), ("set", 16), ("run", 16), ("run", 16), ("set", 40),
           ("run", 40), ("set", 32), ("run", 32)]  # fmt: skip
    assert seen == [("set", w) for w in (24, 16, 40, 32)] + ran  # all checked first, then run group by group
    arrays.write_npz(str(tmp_path / "out.npz"), out)
    got = unpack_outputs(tmp_path / "out.npz", [{"y": np.zeros(1, np.float32)}] * len(feeds), groups)
    for feed, o, w in zip(feeds, got, WIDTHS):
        assert o["y"].shape == (w // 2, 1, 4)
        np.testing.assert_array_equal(o["y"].ravel(), feed["x"].ravel()[: w * 2])
    # a group whose samples are not at the shapes the engine was set to: said, naming the input
    with pytest.raises(AgentError, match=r"input 'x': held-out samples of shape \[1, 1, 16, 16\], the engine "
                                         r"takes \[1, 1, 16, 24\]"):  # fmt: skip
        plan_groups(load_groups(str(tmp_path / "in.npz"), [shapes[0]] * 4), bindings_at)
    pack_inputs([feeds[0], feeds[2]], tmp_path / "one.npz")  # one group: arrays named by input alone
    with pytest.raises(AgentError, match=r"array 'x' is in none of the 2 groups of --shapes"):
        load_groups(str(tmp_path / "one.npz"), shapes[:2])


def test_trtexec_backend_runs_each_sample_at_its_own_shape(agent, tmp_path):  # noqa: F811
    """End to end through the stand-in (onnxruntime, not TensorRT) on a CRNN-like model with a free width:
    held-out samples of four widths, packed and grouped by the host, each run with ``--shapes`` at its
    own width; every output matches onnxruntime on that sample, back in the samples' order."""
    import onnxruntime as ort

    from edgeq.pipeline.accuracy import group_by_shape, group_shapes, pack_inputs, unpack_outputs

    trtexec = replay_trtexec(tmp_path, build=Recorded(FIXTURES / "resnet50_ortfb.explicit.build.log"),
                             run=Recorded(FIXTURES / "resnet50_ortfb.explicit.run.log"))  # fmt: skip
    model = _crnn(tmp_path / "crnn.onnx")
    engine = tmp_path / "e.plan"
    backend = ["--backend=trtexec", f"--trtexec={trtexec}"]
    profile = ["--minShapes=x:1x1x16x16", "--optShapes=x:1x1x16x24", "--maxShapes=x:1x1x16x40"]
    code, obj, _ = run_agent(agent, "build", *backend, f"--onnx={model}", f"--saveEngine={engine}", "--int8",
                             *profile)  # fmt: skip
    assert code == 0, obj
    feeds = _ragged()
    groups = group_by_shape(feeds, ["x"])
    pack_inputs(feeds, tmp_path / "in.npz", groups)
    out = tmp_path / "out.npz"
    shapes = [f"--shapes={s}" for s in group_shapes(feeds, groups, ["x"])]
    code, obj, _ = run_agent(agent, "infer", *backend, f"--loadEngine={engine}",
                             f"--loadInputs={tmp_path / 'in.npz'}", f"--exportOutput={out}",
                             *shapes)  # fmt: skip
    assert code == 0, obj
    assert obj["result"]["samples"] == len(WIDTHS)
    assert obj["result"]["outputs"]["3/y"] == {"shape": [1, 16, 1, 4], "dtype": "<f8"}
    runs = [a for a in calls(trtexec) if any(s.startswith("--exportOutput=") for s in a)]
    assert [next(s for s in a if s.startswith("--shapes=")) for a in runs] == [
        f"--shapes=x:1x1x16x{w}" for w in (24, 24, 16, 16, 40, 32)]  # one trtexec run a sample, by group
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    want = [{"y": session.run(["y"], feed)[0]} for feed in feeds]
    got = unpack_outputs(out, want, groups)
    for w, g, exp in zip(WIDTHS, got, want):
        assert g["y"].shape == exp["y"].shape == (w // 2, 1, 4)
        np.testing.assert_allclose(g["y"], exp["y"], rtol=1e-5, atol=1e-6)  # trtexec prints 6 digits
