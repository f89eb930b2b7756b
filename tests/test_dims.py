"""Input dimensions that share a placeholder name ('?', as paddle2onnx writes them): lint names them,
clean names them apart, and the recorded TensorRT 8.6 builds show why (tests/fixtures/trt86-h100-dims)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeq.findings import Level
from edgeq.graph.clean import CleanOptions, clean_model
from edgeq.graph.rules import lint_model
from edgeq.graph.verify import run_model
from edgeq.report.runlog import build_error_from_log

FIXTURES = Path(__file__).parent / "fixtures" / "trt86-h100-dims"


def _dims(vi: onnx.ValueInfoProto) -> list[object]:
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


def _classifier(x_shape: list[object], extra: list[object] | None = None) -> onnx.ModelProto:
    """x -> Conv 3x3 -> Relu -> GlobalAveragePool -> Flatten -> y, as the PP-OCR classifier's input is
    declared (``[-1, 3, '?', '?']``); ``extra`` adds a second input added to x."""
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["y"], name="flat")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    if extra is not None:
        nodes[0].input[0] = "xs"
        nodes.insert(0, helper.make_node("Add", ["x", "x2"], ["xs"], name="add"))
        inputs.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, extra))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4])
    g = helper.make_graph(nodes, "cls", inputs, [y], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def test_lint_names_the_two_dimensions_paddle2onnx_called_question_mark_as_an_error() -> None:
    findings = [f for f in lint_model(_classifier([-1, 3, "?", "?"])) if f.rule == "dim-name-shared"]
    assert len(findings) == 1 and findings[0].level == Level.ERROR
    assert "'?'" in findings[0].message and "x axis 2, x axis 3" in findings[0].message
    assert findings[0].nodes == ("x",) and "edgeq clean" in findings[0].fix


def test_clean_names_them_apart_still_dynamic_and_the_outputs_do_not_change() -> None:
    model = _classifier([-1, 3, "?", "?"])
    result = clean_model(model, CleanOptions())
    assert result.ok
    change = next(c for c in result.changes if c.pass_name == "name_dims_apart")
    assert "x axis 2 -> x_dim2" in change.message and "x axis 3 -> x_dim3" in change.message
    x = next(i for i in result.model.graph.input if i.name == "x")
    assert _dims(x)[2:] == ["x_dim2", "x_dim3"]
    assert _dims(model.graph.input[0])[2:] == ["?", "?"]  # the argument is not modified
    assert not [f for f in lint_model(result.model) if f.rule == "dim-name-shared"]
    feed = {"x": np.random.default_rng(1).normal(size=(2, 3, 48, 192)).astype(np.float32)}  # not square
    np.testing.assert_array_equal(run_model(model, feed)["y"], run_model(result.model, feed)["y"])


def test_names_that_are_identifiers_are_real_ties_and_stay() -> None:
    """``batch`` on two inputs means one size: neither lint nor clean touches it (nor a lone '?')."""
    model = _classifier(["batch", 3, "?", 64], extra=["batch", 3, 32, 64])
    assert not [f for f in lint_model(model) if f.rule == "dim-name-shared"]
    result = clean_model(model, CleanOptions())
    assert not [c for c in result.changes if c.pass_name == "name_dims_apart"]
    assert _dims(result.model.graph.input[0]) == ["batch", 3, "?", 64]


def test_the_recorded_builds_failed_on_the_shared_name_and_went_on_once_it_was_gone() -> None:
    """Both builds of the real classifier (implicit, then the rules' Q/DQ model) stopped at the error the
    rule quotes; with the dimensions renamed the builder got to timing tactics."""
    for log in ("implicit.deploy.log", "explicit.deploy.log"):
        error = build_error_from_log(FIXTURES / log)
        assert error is not None and "Input dimensions with this name are inconsistent" in error
    renamed = FIXTURES / "renamed-implicit.deploy.log"
    assert build_error_from_log(renamed) is None
    assert "timing cache in use" in renamed.read_text()


class _Engine:
    """The four ``ICudaEngine`` calls ``set_input_shapes`` makes (8.5+ I/O tensor API), for an engine with
    one input at ``shape``: what TensorRT 8.6 reported for the classifier's implicit engine."""

    def __init__(self, shape: list[int]) -> None:
        self.shape, self.num_io_tensors = shape, 1

    def get_tensor_name(self, i: int) -> str:
        return "x"

    def get_tensor_mode(self, name: str) -> str:
        return "INPUT"

    def get_tensor_shape(self, name: str) -> list[int]:
        return self.shape


def test_an_engine_a_one_shape_profile_made_static_runs_at_that_shape() -> None:
    """The classifier (x: -1x3xHxW, built at the calibration data's 1x3x48x192, min = opt = max) came back
    from TensorRT 8.6 with x static [1, 3, 48, 192], and the agent refused the profile run that asked for
    that very shape: 15 minutes of implicit build lost (the recorded reply). The same shape now runs; a
    different one is still refused, naming the engine's."""
    import json
    import re
    from types import SimpleNamespace

    import pytest

    from edgeq.agent.common import AgentError
    from edgeq.agent.trt_profile import set_input_shapes

    reply = json.loads((FIXTURES / "classifier.implicit.profile-reply.json").read_text())
    assert not reply["ok"] and reply["error"]["stage"] == "input"
    found = re.search(r"--shapes names 'x', whose shape is static \[([\d, ]+)\]", reply["error"]["message"])
    assert found, reply["error"]["message"]
    static = [int(d) for d in found.group(1).split(",")]
    assert static == [1, 3, 48, 192]
    trt = SimpleNamespace(TensorIOMode=SimpleNamespace(INPUT="INPUT"))
    asked: list[tuple[str, object]] = []

    def set_input_shape(name: str, dims: object) -> bool:
        asked.append((name, dims))
        return True

    context = SimpleNamespace(set_input_shape=set_input_shape)
    set_input_shapes(trt, _Engine(static), context, "x:1x3x48x192")
    assert asked == []  # nothing to set: the engine has the shape already
    with pytest.raises(AgentError, match=r"whose shape is static \[1, 3, 48, 192\] in the engine"):
        set_input_shapes(trt, _Engine(static), context, "x:1x3x48x96")
    set_input_shapes(trt, _Engine([-1, 3, -1, -1]), context, "x:1x3x48x192")  # dynamic: set on the context
    assert asked == [("x", (1, 3, 48, 192))]
