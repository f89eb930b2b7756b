"""The accuracy check and ``--calibrator auto`` (issue: a default that does not silently wreck trained
models, a check that tells the truth). Real onnxruntime sessions on a model built in code whose
activations have trained-like outliers: rare large values that entropy clips and that carry the output.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeq.quant.autocalib import AUTO_CANDIDATES, HYBRID, TIE
from edgeq.quant.quantize import QuantizeOptions, quantize_file

C, H, W = 4, 8, 8


def _outlier_model() -> onnx.ModelProto:
    """x -> Conv 1x1 (4->8) -> Relu -> Conv 1x1 (8->4) -> y: both convolutions read tensors whose rare
    outliers decide the output of the samples that have them."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((8, C, 1, 1)).astype(np.float32) * 0.5
    w2 = rng.standard_normal((C, 8, 1, 1)).astype(np.float32) * 0.5
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["h"], name="/conv1/Conv"),
        helper.make_node("Relu", ["h"], ["r"], name="/relu/Relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="/conv2/Conv"),
    ]
    graph = helper.make_graph(
        nodes, "outliers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, H, W])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _samples(directory: Path, n: int, seed: int) -> Path:
    """N(0, 1) inputs where one pixel in ~200 is +-40: the outliers a trained network's activations have."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        x = rng.standard_normal((1, C, H, W)).astype(np.float32)
        spikes = rng.random(x.shape) < 0.005
        x[spikes] = 40.0 * np.sign(rng.standard_normal(int(spikes.sum())))
        np.save(directory / f"{i:03d}.npy", x)
    return directory


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("acc")
    model = d / "m.onnx"
    onnx.save(_outlier_model(), model)
    return model, _samples(d / "calib", 16, 1), _samples(d / "held", 8, 2)


def test_auto_scores_every_calibrator_on_the_holdout_set_and_keeps_the_best(setup, tmp_path):
    model, calib, held = setup
    result = quantize_file(model, QuantizeOptions(calib=calib, holdout_data=held), output=tmp_path / "q.onnx")
    choice = result.choice
    assert choice is not None and choice.auto
    scores = {c.method: c.score.value for c in choice.candidates}
    assert set(scores) == {"entropy", "percentile", "mse", "max", HYBRID}
    # entropy clips the outliers that carry the output; auto must not keep it here
    assert choice.method != "entropy"
    assert scores[choice.method] >= max(scores.values()) - TIE  # within float noise of the best
    assert scores[choice.method] > scores["entropy"] + 0.01, scores
    # the accuracy check is the kept candidate's, on the separate held-out set, all of --calib calibrated
    acc = result.accuracy
    assert acc is not None and acc.samples == 8 and result.calibration_samples == 16
    assert acc.held_out == f"--holdout {held}"
    assert acc.task is not None and acc.task.value == pytest.approx(scores[choice.method])
    summary = json.loads((tmp_path / "q.json").read_text())
    assert summary["calibrator"] == choice.method
    assert [c["calibrator"] for c in summary["calibrators"]] == list(AUTO_CANDIDATES)
    # the scales written are the kept calibrator's
    entropy = quantize_file(model, QuantizeOptions(calib=calib, holdout_data=held, calibrator="entropy"),
                            output=tmp_path / "e.onnx")
    assert entropy.choice is not None and not entropy.choice.auto
    assert entropy.accuracy is not None and entropy.accuracy.task is not None
    assert entropy.accuracy.task.value == pytest.approx(scores["entropy"])
    assert result.scales != entropy.scales


def test_holdout_fraction_is_the_fallback_and_says_so(setup, tmp_path):
    model, calib, _ = setup
    result = quantize_file(model, QuantizeOptions(calib=calib, holdout=0.25), output=tmp_path / "q.onnx")
    assert result.calibration_samples == 12 and result.holdout_samples == 4
    assert result.accuracy is not None and "of --calib" in result.accuracy.held_out
    assert any("--holdout DIR" in n for n in result.notes)


def test_cli_far_below_fp32_warns_and_min_metric_gates(setup, tmp_path, cli):
    model, calib, held = setup
    args = ("quantize", model, "--calib", calib, "--holdout", held, "--calibrator", "entropy")
    code, out, err = cli(*args, "-o", tmp_path / "a.onnx")
    assert code == 0
    assert "warning: accuracy far below FP32" in err, err
    assert not re.search(r"\d(\.\d+)?e[-+]\d", out), out  # figures without e-notation
    code, out, err = cli(*args, "-o", tmp_path / "b.onnx", "--min-metric", "0.999")
    assert code == 1 and "fails --min-metric 0.999" in out, out
    code, out, err = cli("quantize", model, "--calib", calib, "--holdout", held, "-o", tmp_path / "c.onnx",
                         "--min-metric", "0.99")
    assert code == 0 and "passes --min-metric 0.99" in out, (out, err)
    assert "auto chose" in out


def test_user_metric_module_function_decides(setup, tmp_path, monkeypatch):
    """--metric module:function: the user's figure ranks the calibrators (here: prefer the smallest
    error on the outlier pixels only, which max keeps exactly)."""
    model, calib, held = setup
    (tmp_path / "mymetric.py").write_text(
        "import numpy as np\n"
        "def outliers(ref, got):\n"
        "    r = np.concatenate([x['y'].ravel() for x in ref])\n"
        "    g = np.concatenate([x['y'].ravel() for x in got])\n"
        "    return -float(np.abs(r - g)[np.abs(r) > 5].mean())\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("mymetric", None)
    result = quantize_file(model, QuantizeOptions(calib=calib, holdout_data=held, metric="mymetric:outliers"),
                           output=tmp_path / "q.onnx")
    assert result.choice is not None
    values = {c.method: c.score.value for c in result.choice.candidates}
    assert values[result.choice.method] >= max(values.values()) - TIE
    assert result.accuracy is not None and result.accuracy.task is not None
    assert result.accuracy.task.metric == "mymetric:outliers"


def test_bad_metric_and_holdout_are_one_line_exit_2(setup, tmp_path, cli):
    model, calib, _ = setup
    for extra, words in ((("--metric", "nosuch"), "unknown metric 'nosuch'"),
                         (("--metric", "no_such_module_x:f"), "cannot load f from no_such_module_x"),
                         (("--holdout", str(tmp_path / "missing")), "held-out data not found")):
        code, out, err = cli("quantize", model, "--calib", calib, "-o", tmp_path / "x.onnx", *extra)
        assert code == 2, (out, err)
        lines = [x for x in err.splitlines() if x.startswith("error:")]
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in err, err
        assert not (tmp_path / "x.onnx").exists()


def test_user_metric_returning_nan_is_refused(setup, tmp_path, monkeypatch):
    model, calib, held = setup
    (tmp_path / "nanmetric.py").write_text("def f(ref, got):\n    return float('nan')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("nanmetric", None)
    from edgeq.errors import QuantError

    with pytest.raises(QuantError, match="returned NaN"):
        quantize_file(model, QuantizeOptions(calib=calib, holdout_data=held, metric="nanmetric:f"),
                      output=tmp_path / "q.onnx")
    assert not (tmp_path / "q.onnx").exists()


def test_auto_stops_scoring_once_a_calibrator_agrees_with_fp32_everywhere(tmp_path):
    """A candidate that keeps every held-out top-1 answer cannot be beaten (the built-in metrics top out
    at 1.0): the rest are not scored, and the summary says so."""
    from edgeq import zoo

    model = tmp_path / "r.onnx"
    onnx.save(zoo.resnet_like(layers=(1, 1, 1)), model)
    rng = np.random.default_rng(3)
    for part, n in (("calib", 6), ("held", 3)):
        (tmp_path / part).mkdir()
        for i in range(n):
            np.save(tmp_path / part / f"{i}.npy", rng.random((1, 3, 64, 64), dtype=np.float32))
    result = quantize_file(model, QuantizeOptions(calib=tmp_path / "calib", holdout_data=tmp_path / "held",
                                                  metric="classification"), output=tmp_path / "q.onnx")
    choice = result.choice
    assert choice is not None and choice.auto
    assert [c.method for c in choice.candidates] == ["entropy"] and choice.candidates[0].score.value == 1.0
    assert choice.untried == AUTO_CANDIDATES[1:]
    assert "were not scored" in choice.summary()
    summary = json.loads((tmp_path / "q.json").read_text())
    assert summary["calibrator"] == "entropy"
