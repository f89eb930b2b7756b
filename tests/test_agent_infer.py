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


def test_python_backend_infer_without_tensorrt_fails_structured(agent, tmp_path):  # noqa: F811
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 1, 4), np.float32))
    (tmp_path / "e.plan").write_bytes(b"x")
    engine, out = f"--loadEngine={tmp_path / 'e.plan'}", f"--exportOutput={tmp_path / 'o.npz'}"
    code, obj, _ = run_agent(agent, "infer", engine, f"--loadInputs={tmp_path / 'in.npz'}", out)
    assert code == 1 and obj["error"]["stage"] == "import"
    code, obj, _ = run_agent(agent, "infer", engine, f"--loadInputs={tmp_path / 'none.npz'}", out)
    assert code == 1 and obj["error"]["stage"] == "input" and "none.npz" in obj["error"]["message"]
