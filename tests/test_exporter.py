"""The exporter read from the model and the one resolver of dynamic input shapes (edgeq.graph.exporter,
edgeq.graph.shapes), as clean's verification, lint and deploy's profile use them. Models built in code,
named and shaped as ultralytics and paddle2onnx export theirs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeq.errors import EdgeqError
from edgeq.graph.clean import CleanOptions, clean_model
from edgeq.graph.exporter import identify
from edgeq.graph.shapes import input_shapes
from edgeq.pipeline.shapes import Shapes, resolve_shapes


def flattening(name: str = "images", dims=("batch", 3, "height", "width"), outputs=None,
               meta: dict[str, str] | None = None, producer: str = "pytorch") -> onnx.ModelProto:
    """A model that runs at one input size only, as a detector's head does: its Reshape takes exactly
    3*8*8 values a sample (so verification at the dynamic dimensions' 1 fails in onnxruntime)."""
    shape = numpy_helper.from_array(np.array([-1, 192], np.int64), "shape")
    nodes = [helper.make_node("Reshape", [name, "shape"], ["flat"], name="flatten")]
    out = outputs or [helper.make_tensor_value_info("flat", TensorProto.FLOAT, [None, 192])]
    if outputs:
        nodes.append(helper.make_node("Identity", ["flat"], [outputs[0].name], name="id"))
    inp = helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))
    graph = helper.make_graph(nodes, "g", [inp], out, [shape])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name=producer)
    m.ir_version = 8
    for k, v in (meta or {}).items():
        m.metadata_props.add(key=k, value=v)
    return m


ULTRALYTICS = {"author": "Ultralytics", "task": "detect", "batch": "1", "imgsz": "[8, 8]", "stride": "32"}


def test_ultralytics_metadata_gives_the_size_and_the_preset() -> None:
    e = identify(flattening(meta=ULTRALYTICS))
    assert e.kind == "ultralytics" and e.certain and e.preset == "yolo"
    assert e.shapes == {"images": (1, 3, 8, 8)} and "imgsz [8, 8]" in e.why


@pytest.mark.parametrize(("out_dims", "kind", "shape"), [
    (["p2o.DynamicDimension.3", 1, "p2o.DynamicDimension.4", "p2o.DynamicDimension.5"], "ppocr-det",
     (1, 3, 640, 640)),
    (["p2o.DynamicDimension.2", "p2o.DynamicDimension.3", 6625], "ppocr-rec", (1, 3, 48, 320)),
    ([-1, 2], "ppocr-cls", (1, 3, 48, 192)),
])  # fmt: skip
def test_paddle2onnx_signatures_give_paddleocrs_documented_defaults(out_dims, kind, shape) -> None:
    out = [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_dims)]
    m = flattening("x", ("p2o.DynamicDimension.0", 3, "?", "p2o.DynamicDimension.1"), out)
    e = identify(m)
    assert e.kind == kind and not e.certain and e.shapes == {"x": shape}  # a suggestion, not a certainty
    assert "PaddleOCR's" in e.why


def test_an_unknown_export_resolves_nothing() -> None:
    e = identify(flattening())
    assert not e and e.shapes == {}
    assert input_shapes(flattening()).missing == {"images": ("batch", 3, "height", "width")}


def test_shapes_flag_wins_and_is_checked_against_the_model() -> None:
    m = flattening(meta=ULTRALYTICS)
    assert input_shapes(m).shapes == {"images": (1, 3, 8, 8)}
    given = input_shapes(m, "images:2x3x8x8")
    assert given.shapes == {"images": (2, 3, 8, 8)} and given.sources == {"images": "--shapes"}
    with pytest.raises(EdgeqError, match=r"--shapes names 'x', which is not an input of the model"):
        input_shapes(m, "x:1x3x8x8")
    with pytest.raises(EdgeqError, match=r"images:1x4x8x8 does not fit the input's shape \(\?, 3, \?, \?\)"):
        input_shapes(m, "images:1x4x8x8")


def test_clean_verifies_at_the_models_own_size_and_says_which_shape_failed() -> None:
    """issue 42: clean verified nudenet's 320n at 1x3x1x1 and failed, without saying at what shape."""
    result = clean_model(flattening(meta=ULTRALYTICS))
    assert result.verification and "dynamic inputs run at images:1x3x8x8 (from its metadata" in str(
        result.verification)
    with pytest.raises(EdgeqError) as info:
        clean_model(flattening())  # nothing gives its size: run at 1, and the fix names one in numbers
    assert "onnxruntime cannot run the input model at images:1x3x1x1" in info.value.message
    assert "give --shapes images:1x3x224x224 with the size the model runs at" in str(info.value.hint)
    assert clean_model(flattening(), CleanOptions(shapes="images:1x3x8x8")).verification


def test_deploy_builds_at_the_shapes_quantize_recorded_else_the_models_own(tmp_path) -> None:
    """issue 42: deploy of quantize's output said '--optShapes images:batchx3xheightxwidth' though quantize
    had just calibrated at 1x3x320x320. Now <name>.int8.json's shapes make the profile (opt the most common,
    min/max spanning them); without it, the model's own size; without that, a fix in numbers."""
    model = tmp_path / "m.int8.onnx"
    onnx.save(flattening(dims=("batch", 3, "height", "width")), model)
    with pytest.raises(EdgeqError) as info:
        resolve_shapes(model, Shapes())
    assert "give --optShapes images:1x3x224x224" in str(info.value.hint)
    seen = [{"shape": [1, 3, 8, 8], "samples": 3}, {"shape": [1, 3, 16, 4], "samples": 1}]
    summary = tmp_path / "m.int8.json"
    summary.write_text(json.dumps({"output": str(model), "input_shapes": {"images": seen}}))
    got = resolve_shapes(model, Shapes())
    assert (got.min, got.opt, got.max) == ("images:1x3x8x4", "images:1x3x8x8", "images:1x3x16x8")
    assert "m.int8.json" in got.source
    summary.write_text(json.dumps({"output": "other.onnx", "input_shapes": {"images": seen}}))
    onnx.save(flattening(meta=ULTRALYTICS), model)  # another model's summary is not this one's: its own size
    own = resolve_shapes(model, Shapes())
    assert own.opt == own.min == own.max == "images:1x3x8x8" and "metadata" in own.source


def test_a_summary_is_read_only_beside_the_model_it_describes(tmp_path) -> None:
    from edgeq.pipeline.shapes import recorded_samples

    model = tmp_path / "a.onnx"
    (tmp_path / "a.json").write_text("not json")
    assert recorded_samples(model) == {}
    assert recorded_samples(Path(tmp_path / "missing.onnx")) == {}
