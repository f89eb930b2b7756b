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

from edgeq.quant.autocalib import AUTO_CANDIDATES, TIE
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
    # the calibrators alone (--weights auto scores each with the learned rounding too: tests/test_rounding.py)
    result = quantize_file(model, QuantizeOptions(calib=calib, holdout_data=held, weights="nearest"),
                           output=tmp_path / "q.onnx")
    choice = result.choice
    assert choice is not None and choice.auto
    scores = {c.method: c.score.value for c in choice.candidates}
    assert set(scores) == set(AUTO_CANDIDATES)
    assert scores[choice.method] >= max(scores.values()) - TIE  # within float noise of the best
    # the accuracy check is the kept candidate's, on the separate held-out set, all of --calib calibrated
    acc = result.accuracy
    assert acc is not None and acc.samples == 8 and result.calibration_samples == 16
    assert acc.held_out == f"--holdout {held}"
    assert acc.task is not None and acc.task.value == pytest.approx(scores[choice.method])
    summary = json.loads((tmp_path / "q.json").read_text())
    assert summary["calibrator"] == choice.method
    assert [c["calibrator"] for c in summary["calibrators"]] == list(AUTO_CANDIDATES)
    # entropy (TensorRT's calibrator, the default before auto) clips the outliers that carry the output:
    # auto does clearly better, and the scales written are the kept calibrator's, not entropy's
    entropy = quantize_file(model, QuantizeOptions(calib=calib, holdout_data=held, calibrator="entropy"),
                            output=tmp_path / "e.onnx")
    assert entropy.choice is not None and not entropy.choice.auto
    assert entropy.accuracy is not None and entropy.accuracy.task is not None
    assert scores[choice.method] > entropy.accuracy.task.value + 0.01, (scores, entropy.accuracy.task.value)
    assert result.scales != entropy.scales
    # a plain candidate's figure is what that calibrator gives alone (or, cut short, a bound on it that is
    # no better than the winner's)
    single = quantize_file(model, QuantizeOptions(calib=calib, holdout_data=held, calibrator="mse"),
                           output=tmp_path / "m.onnx")
    assert single.accuracy is not None and single.accuracy.task is not None
    stopped = next(c for c in choice.candidates if c.method == "mse").stopped
    if stopped is None:
        assert single.accuracy.task.value == pytest.approx(scores["mse"])
    else:
        assert 1 <= stopped < 8 and single.accuracy.task.value <= scores["mse"] + 1e-9
        assert scores["mse"] <= scores[choice.method] + TIE


def test_holdout_fraction_is_the_fallback_and_says_so(setup, tmp_path):
    model, calib, _ = setup
    result = quantize_file(model, QuantizeOptions(calib=calib, holdout=0.25), output=tmp_path / "q.onnx")
    assert result.calibration_samples == 12 and result.holdout_samples == 4
    assert result.accuracy is not None and "of --calib" in result.accuracy.held_out
    assert any("--holdout DIR" in n for n in result.notes)


def test_cli_far_below_fp32_fails_names_the_blame_and_the_fix_and_min_metric_accepts_it(setup, tmp_path, cli):
    """A wrecked model is a failed check by default (issue 46): exit 1, naming the worst output, the
    regions a quick sensitivity pass blames and the exact --max-loss command; that command recovers it,
    and --min-metric 0 accepts the wrecked result on purpose."""
    import shlex

    from edgeq.quant.accuracy import FAR_BELOW

    model, calib, held = setup
    args = ("quantize", model, "--calib", calib, "--holdout", held, "--calibrator", "entropy")
    code, out, err = cli(*args, "-o", tmp_path / "a.onnx")
    said = " ".join(err.split())
    assert code == 1, (out, err)
    assert "accuracy far below FP32: cosine 0.6" in said and f"(under {FAR_BELOW['cosine']:g})" in said, said
    assert "worst output 'y'" in said
    assert "a quick sensitivity pass blames /conv1/Conv (+0.3" in said, said
    command = shlex.join(["edgeq", "quantize", str(model), "--calib", str(calib), "--holdout", str(held),
                          "--calibrator", "entropy", "--max-loss", "0.05"])
    assert command in said and "accept this result with --min-metric 0" in said, said
    assert not re.search(r"\d(\.\d+)?e[-+]\d", out), out  # figures without e-notation
    summary = json.loads((tmp_path / "a.json").read_text())
    assert summary["ok"] is False and summary["accuracy"]["wrecked"] is True
    assert summary["wrecked"]["blame"][0]["nodes"] == ["/conv1/Conv"]
    # the advice works as printed
    code, out, err = cli(*shlex.split(command)[1:], "-o", tmp_path / "r.onnx")
    assert code == 0 and "--max-loss 0.05 reached" in out, (out, err)
    # a bound of the user's decides instead: 0 accepts the wrecked result, a high one still fails
    code, out, err = cli(*args, "-o", tmp_path / "z.onnx", "--min-metric", "0")
    assert code == 0 and "passes --min-metric 0" in out and "far below" not in err, (out, err)
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


def test_auto_keeps_scoring_when_a_calibrator_keeps_every_label_and_the_margin_decides(tmp_path):
    """A candidate that keeps every held-out top-1 answer is not the end of the search (it was before
    issue 46): on a few samples "every one" may be one or two, and the label margin still tells the
    candidates apart. Every candidate is scored and the kept one holds the most margin among those
    with every label."""
    from edgeq import zoo

    model = tmp_path / "r.onnx"
    onnx.save(zoo.resnet_like(layers=(1, 1, 1)), model)
    rng = np.random.default_rng(3)
    for part, n in (("calib", 6), ("held", 3)):
        (tmp_path / part).mkdir()
        for i in range(n):
            np.save(tmp_path / part / f"{i}.npy", rng.random((1, 3, 64, 64), dtype=np.float32))
    result = quantize_file(model, QuantizeOptions(calib=tmp_path / "calib", holdout_data=tmp_path / "held",
                                                  metric="classification", weights="nearest"),
                           output=tmp_path / "q.onnx")
    choice, acc = result.choice, result.accuracy
    assert choice is not None and choice.auto and acc is not None and acc.task is not None
    assert [c.method for c in choice.candidates] == list(AUTO_CANDIDATES) and choice.untried == ()
    assert acc.task.value == 1.0 and "were not scored" not in choice.summary()
    full = [c for c in choice.candidates if c.stopped is None]
    assert all(c.score.value == 1.0 for c in full)  # every label kept by each: the margins decide
    assert acc.task.figures["label_margin"] >= max(c.score.figures["label_margin"] for c in full) - TIE
    assert all(c.score.rank <= acc.task.rank + TIE for c in choice.candidates)
    assert json.loads((tmp_path / "q.json").read_text())["calibrator"] == choice.method


def _ends_model() -> onnx.ModelProto:
    """x -> Conv -> Relu -> Conv -> Tanh -> Conv -> Relu -> Conv -> y, shaped like a trained network:
    one early channel fires rarely and huge (Relu(100 x0 - 200): 0 on 98% of pixels, up to ~200), which
    only switches a saturating unit (Tanh) downstream, so clipping it costs nothing while max's range for
    it coarsens every other value of the tensor; and the last layer's input carries those rare events
    at ~10 against a bulk under ~3 (a confident detection's class evidence), which is the answer there,
    so clipping it (entropy does) loses exactly the samples that have them."""
    rng = np.random.default_rng(0)
    w1 = np.zeros((8, C, 1, 1), np.float32)
    w1[:7] = rng.standard_normal((7, C, 1, 1)) * 0.5
    w1[7, 0] = 100.0
    b1 = np.zeros(8, np.float32)
    b1[7] = -200.0
    w2 = np.zeros((8, 8, 1, 1), np.float32)
    w2[:7, :7] = rng.standard_normal((7, 7, 1, 1)) * 0.5
    w2[7, 7] = 1.0
    w3 = np.zeros((8, 8, 1, 1), np.float32)
    w3[:7, :7] = rng.standard_normal((7, 7, 1, 1)) * 0.5
    w3[7, 7] = 30.0
    b3 = np.zeros(8, np.float32)
    b3[7] = -20.0
    w4 = (rng.standard_normal((C, 8, 1, 1)) * 0.5).astype(np.float32)
    w4[:, 7] = 1.0
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["h1"], name="/conv1/Conv"),
        helper.make_node("Relu", ["h1"], ["a"], name="/relu1/Relu"),
        helper.make_node("Conv", ["a", "w2"], ["h2"], name="/conv2/Conv"),
        helper.make_node("Tanh", ["h2"], ["b"], name="/tanh/Tanh"),
        helper.make_node("Conv", ["b", "w3", "b3"], ["h3"], name="/conv3/Conv"),
        helper.make_node("Relu", ["h3"], ["c"], name="/relu3/Relu"),
        helper.make_node("Conv", ["c", "w4"], ["y"], name="/head/Conv"),
    ]
    inits = [numpy_helper.from_array(v, n) for n, v in
             (("w1", w1), ("b1", b1), ("w2", w2), ("w3", w3), ("b3", b3), ("w4", w4))]
    graph = helper.make_graph(
        nodes, "ends",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, H, W])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _normal_samples(directory: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        np.save(directory / f"{i:03d}.npy", rng.standard_normal((1, C, H, W)).astype(np.float32))
    return directory


def test_auto_never_clips_the_ends_and_beats_every_single_calibrator(tmp_path):
    """The hybrid that keeps max's range on the graph input and on the last layer's input (and
    entropy's elsewhere) is closer to FP32 than any one calibrator: entropy clips the last layer's
    rare large inputs, the others give the early outlier channel a range that coarsens its tensor."""
    from edgeq.graph.io import graph_from_model
    from edgeq.quant.autocalib import ENDS, end_tensors
    from edgeq.quant.quantize import plan_for, prepare_model

    model = tmp_path / "m.onnx"
    onnx.save(_ends_model(), model)
    reference = prepare_model(onnx.load(model))[0]
    plan = plan_for(graph_from_model(reference), QuantizeOptions())[0]
    assert set(plan.tensors) == {"x", "a", "b", "c"}, plan.tensors
    assert end_tensors(reference, plan) == {"x", "c"}
    calib, held = _normal_samples(tmp_path / "calib", 16, 1), _normal_samples(tmp_path / "held", 8, 2)
    result = quantize_file(model, QuantizeOptions(calib=calib, holdout_data=held, metric="cosine"),
                           output=tmp_path / "q.onnx")
    choice = result.choice
    assert choice is not None and choice.method == ENDS, choice.summary()
    best = result.accuracy.task.value if result.accuracy and result.accuracy.task else 0.0
    single = {}
    for method in ("entropy", "percentile", "mse", "max"):
        r = quantize_file(model, QuantizeOptions(calib=calib, holdout_data=held, metric="cosine",
                                                 calibrator=method), output=tmp_path / f"{method}.onnx")
        assert r.accuracy is not None and r.accuracy.task is not None
        single[method] = r
    assert best > max(r.accuracy.task.value for r in single.values() if r.accuracy and r.accuracy.task) + 0.01
    # what it kept: max's range on the ends, entropy's in between
    assert result.scales["c"] == single["max"].scales["c"] > single["entropy"].scales["c"]
    assert result.scales["a"] == single["entropy"].scales["a"] < single["max"].scales["a"]
    # candidates cut short (could not win): their figure bounds what all samples would give
    for c in choice.candidates:
        if c.stopped is not None and c.method in single:
            assert single[c.method].accuracy.task.value <= c.score.value + 1e-9 <= best + TIE


def test_candidates_run_the_hardest_samples_first_and_stop_once_they_cannot_win(setup, tmp_path):
    """A candidate's held-out pass in any sample order scores the same and returns its outputs in the
    set's own order; with a figure to beat, it stops at the first sample where even FP32's outputs on
    the rest could not lift it above that figure, which the worst sample reaches first."""
    from edgeq.quant.accuracy import run_outputs
    from edgeq.quant.autocalib import scorer
    from edgeq.quant.data import calibration_set
    from edgeq.quant.metrics import metric_from_spec

    model, calib, held = setup
    fp32 = onnx.load(model)
    data = calibration_set(fp32, held)
    reference = run_outputs(fp32, data)
    candidate = quantize_file(model, QuantizeOptions(calib=calib, holdout_data=held, calibrator="entropy"),
                              output=tmp_path / "e.onnx").model
    score = scorer(metric_from_spec("cosine"), reference, data, None, bounded=True)
    full, outputs, stopped = score(candidate, None, None)
    n = len(reference)
    backwards, outputs2, stopped2 = score(candidate, None, list(reversed(range(n))))
    assert stopped is None and stopped2 is None and outputs is not None and outputs2 is not None
    assert backwards.value == pytest.approx(full.value)
    for a, b in zip(outputs, outputs2):
        np.testing.assert_array_equal(a["y"], b["y"])
    per = full.per_sample
    worst = sorted(range(n), key=per.__getitem__)
    assert worst[0] != 0 and per[worst[0]] < per[0] - 0.01, per  # the set's first sample is not its worst
    beat = 1.0 - (1.0 - per[worst[0]]) / n + 1e-9  # what FP32 on every other sample would lift it to
    bound, none, after = score(candidate, beat, worst)
    assert none is None and after == 1 and full.value <= bound.value <= beat
    in_order = score(candidate, beat, None)
    assert in_order[2] is None or in_order[2] > 1


def test_a_candidate_bound_is_not_rescored_after_every_sample_of_a_large_held_out_set(setup, tmp_path):
    """Each bound check scores the whole held-out set: checked after every sample, a candidate that runs
    them all costs O(n^2) metric work (on 100 detector images as much as running the model). Checked
    after each early sample, then once per quarter more, a 48-sample pass scores a few times log(n)
    and still stops, and then reports a bound that no full run beats."""
    from edgeq.quant.accuracy import run_outputs
    from edgeq.quant.autocalib import scorer
    from edgeq.quant.data import calibration_set
    from edgeq.quant.metrics import metric_from_spec

    model, calib, _ = setup
    fp32 = onnx.load(model)
    held = _samples(tmp_path / "held48", 48, 7)
    data = calibration_set(fp32, held)
    reference = run_outputs(fp32, data)
    candidate = quantize_file(model, QuantizeOptions(calib=calib, holdout_data=held, calibrator="entropy"),
                              output=tmp_path / "e.onnx").model
    cosine = metric_from_spec("cosine")
    calls: list[int] = []

    class Counted:
        name = cosine.name

        def score(self, reference, candidate):  # type: ignore[no-untyped-def]
            calls.append(len(candidate))
            return cosine.score(reference, candidate)

    score = scorer(Counted(), reference, data, None, bounded=True)
    full, outputs, stopped = score(candidate, -1.0, None)  # a figure it always beats: never stops
    assert stopped is None and outputs is not None and len(outputs) == 48
    assert len(calls) <= 20, len(calls)  # 47 checks and the final score if every sample were checked
    calls.clear()
    beat = 1.0 - (1.0 - full.rank) / 2  # half its loss: reached part-way through, then it stops
    bound, none, after = score(candidate, beat, None)
    assert none is None and after is not None and after < 48, after
    assert full.rank <= bound.rank + 1e-9 and bound.rank <= beat


def test_the_summary_says_a_tie_was_kept_for_coming_first_not_for_a_better_figure():
    """Two candidates level on the held-out set: the one scored first is kept, and the line says that
    rather than "by +0.0000"; a runner-up cut short is only known to be no better."""
    from edgeq.quant.autocalib import Candidate, Choice
    from edgeq.quant.metrics import TaskScore

    def cand(method: str, value: float, stopped: int | None = None) -> Candidate:
        return Candidate(method, TaskScore("classification", value, f"{value:.4f}"), 0.1, stopped)

    model = onnx.ModelProto()
    level = Choice("percentile", {}, model, None, (cand("percentile", 0.98), cand("entropy", 0.98)))
    assert "level with entropy (a tie keeps the one scored first)" in level.summary()
    cut = Choice("percentile", {}, model, None, (cand("percentile", 0.98), cand("entropy", 0.98, 12)))
    assert "at least level with entropy (stopped once it could do no better)" in cut.summary()
    ahead = Choice("percentile", {}, model, None, (cand("percentile", 0.98), cand("entropy", 0.9)))
    assert "by +0.0800 over entropy" in ahead.summary()


def test_a_user_metric_that_says_it_is_bounded_lets_auto_stop_a_losing_candidate(setup, tmp_path,
                                                                                  monkeypatch):
    """``bounded = True`` on the user's function (FP32's outputs never score worse than a candidate's, as
    with edgeq's own metrics): auto may stop a candidate that can no longer win, and chooses as it does
    without the attribute, where every candidate runs every sample (a user's function is not assumed
    to be bounded)."""
    model, calib, held = setup
    (tmp_path / "boundmetric.py").write_text(
        "from edgeq.quant.metrics import metric_from_spec\n"
        "_cos = metric_from_spec('cosine')\n"
        "def bounded(ref, got):\n"
        "    return _cos.score(ref, got)\n"
        "bounded.bounded = True\n"
        "def unbounded(ref, got):\n"
        "    return _cos.score(ref, got)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("boundmetric", None)
    runs = {}
    for fn in ("bounded", "unbounded"):
        r = quantize_file(model, QuantizeOptions(calib=calib, holdout_data=held, metric=f"boundmetric:{fn}",
                                                 weights="nearest"), output=tmp_path / f"{fn}.onnx")
        assert r.choice is not None and len(r.choice.candidates) == len(AUTO_CANDIDATES)
        runs[fn] = r.choice
    assert runs["bounded"].method == runs["unbounded"].method
    assert all(c.stopped is None for c in runs["unbounded"].candidates)
    cut = [c for c in runs["bounded"].candidates if c.stopped is not None]
    assert cut, runs["bounded"].summary()
    full = {c.method: c.score.rank for c in runs["unbounded"].candidates}
    for c in cut:  # its bound is no less than what all samples give, and no better than the winner
        assert full[c.method] <= c.score.rank + 1e-9 <= full[runs["bounded"].method] + TIE


# --- classifiers judged by their labels; thin evidence (issue 46) ------------------------------------------

B, K = 4, 10  # the classifier's batch (rows per sample) and classes


def _logits_classifier() -> onnx.ModelProto:
    """x (B, C, H, W) with outliers -> Conv 1x1 -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> (B, K)
    raw logits. Class 0's weights are 20x the others' and its bias -30: it never wins, but its large
    logit dominates a cosine over the row, so the cosine ranks calibrators by class 0's error while the
    labels are decided among the other nine."""
    rng = np.random.default_rng(1)
    w1 = rng.standard_normal((16, C, 1, 1)).astype(np.float32) * 0.5
    w2 = rng.standard_normal((K, 16)).astype(np.float32) * 0.3
    w2[0] *= 20
    b2 = np.zeros(K, np.float32)
    b2[0] = -30.0
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], name="/conv/Conv"),
             helper.make_node("Relu", ["h"], ["r"], name="/relu/Relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="/pool/GlobalAveragePool"),
             helper.make_node("Flatten", ["p"], ["f"], name="/flatten/Flatten"),
             helper.make_node("Gemm", ["f", "w2", "b2"], ["logits"], name="/fc/Gemm", transB=1)]
    graph = helper.make_graph(
        nodes, "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, C, H, W])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [B, K])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (b2, "b2"))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _batches(directory: Path, n: int, seed: int) -> Path:
    """``_samples``' inputs, B to a sample."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        x = rng.standard_normal((B, C, H, W)).astype(np.float32)
        spikes = rng.random(x.shape) < 0.005
        x[spikes] = 40.0 * np.sign(rng.standard_normal(int(spikes.sum())))
        np.save(directory / f"{i:03d}.npy", x)
    return directory


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("cls")
    onnx.save(_logits_classifier(), d / "m.onnx")
    return d / "m.onnx", _batches(d / "calib", 16, 1), _batches(d / "held", 16, 2)


def _labels(model: onnx.ModelProto, held: Path) -> int:
    """How many of the held-out rows ``model`` labels as the float classifier does."""
    from edgeq.quant.accuracy import run_outputs
    from edgeq.quant.metrics import ClassificationMetric

    feeds = [{"x": np.load(p)} for p in sorted(held.glob("*.npy"))]
    score = ClassificationMetric().score(run_outputs(_logits_classifier(), feeds), run_outputs(model, feeds))
    return round(score.value * score.figures["rows"])


def test_auto_on_a_logits_classifier_keeps_the_calibrator_with_the_most_labels(classifier, tmp_path):
    """--metric auto reads (N, classes) logits as a classifier's and ranks the calibrators by top-1 labels
    (the label margin only breaks ties): the one kept labels at least as many rows as any other, the
    summary says the classification metric chose it. By cosine, auto keeps another that labels fewer."""
    model, calib, held = classifier
    result = quantize_file(model, QuantizeOptions(calib=calib, holdout_data=held, weights="nearest"),
                           output=tmp_path / "q.onnx")
    choice, acc = result.choice, result.accuracy
    assert choice is not None and acc is not None and acc.task is not None
    assert acc.task.metric == "classification" and "labels" in acc.metric_why
    assert f"auto chose {choice.method} by classification (top-1 agreement" in choice.summary()
    kept = acc.task.value
    for c in choice.candidates:  # a candidate stopped early is bounded by its figure: fewer labels still
        assert c.score.value <= kept + 1e-12 and c.score.rank <= acc.task.rank + TIE, (c.method, c.score.text)
    assert json.loads((tmp_path / "q.json").read_text())["accuracy"]["task"]["metric"] == "classification"
    by_cosine = quantize_file(model, QuantizeOptions(calib=calib, holdout_data=held, metric="cosine",
                                                     weights="nearest"), output=tmp_path / "c.onnx")
    assert by_cosine.choice is not None and by_cosine.choice.method != choice.method
    assert _labels(by_cosine.model, held) < _labels(result.model, held) == round(kept * B * 16)


def test_thin_evidence_is_said_with_the_samples_that_would_tell_the_candidates_apart(classifier, tmp_path):
    """Three held-out samples: the kept calibrator and the runner-up differ by less than the samples'
    scatter can tell; the summary, the notes and the JSON say so and how many samples would."""
    from edgeq.quant.autocalib import Candidate, evidence
    from edgeq.quant.metrics import TaskScore

    model, calib, held = classifier
    few = tmp_path / "few"
    few.mkdir()
    for p in sorted(held.glob("*.npy"))[:3]:
        (few / p.name).write_bytes(p.read_bytes())
    result = quantize_file(model, QuantizeOptions(calib=calib, holdout_data=few, weights="nearest"),
                           output=tmp_path / "q.onnx")
    assert result.choice is not None
    said = result.choice.evidence
    assert said.startswith(f"thin evidence: on 3 samples {result.choice.method} and "), said
    need = re.search(r"about (\d+) samples would tell them apart", said)
    assert need is not None and int(need.group(1)) > 3 and said in result.notes
    assert json.loads((tmp_path / "q.json").read_text())["thin_evidence"] == said

    def cand(name: str, *figures: float) -> Candidate:
        mean = sum(figures) / len(figures)
        return Candidate(name, TaskScore("m", mean, name, ranked_per_sample=figures), 0.0)

    best = cand("a", 1.0, 1.0, 0.9, 1.0)
    assert evidence(best, [best, cand("b", 0.5, 0.6, 0.4, 0.5)]) == ""  # better on every sample by far
    assert evidence(best, [best, cand("b", 1.0, 1.0, 0.9, 1.0)]) == ""  # the same on every sample
    assert evidence(cand("a", 0.9999, 0.9998), [cand("b", 0.9998, 0.9999)]) == ""  # alike for any purpose
    thin = evidence(cand("a", 1.0, 0.0, 1.0, 1.0), [cand("b", 0.0, 1.0, 1.0, 0.5)])
    # differences +1, -1, 0, +0.5: mean 0.125, standard error 0.427; 2 SE / mean = 6.8: 4 x 6.8^2 = 187
    assert thin.startswith("thin evidence: on 4 samples a and b differ by +0.1250 +- 0.8539") and \
        "about 187 samples would" in thin, thin
    # the headline favours a (its count over the set), the samples favour b on every one: not "thin" with a
    # negative difference and thousands of samples to tell them apart, but the disagreement said
    mixed = evidence(cand("a", 0.5, 0.5, 0.6, 0.5), [cand("b", 0.8, 0.7, 0.8, 0.8)])
    assert mixed.startswith("mixed evidence: a ranks first over the 4 samples, yet per sample b scores "
                            "higher by 0.2500 +- 0.0577"), mixed


def test_calib_alone_scores_every_sample_and_says_so(setup, tmp_path):
    """With --calib only, every sample calibrates and is scored (a fifth held out left auto deciding on
    three of these sixteen)."""
    model, calib, _ = setup
    result = quantize_file(model, QuantizeOptions(calib=calib), output=tmp_path / "q.onnx")
    assert result.calibration_samples == result.holdout_samples == 16
    assert result.accuracy is not None and result.accuracy.samples == 16
    assert result.accuracy.held_out.startswith("the calibration samples themselves")
    assert any("scored on the 16 calibration samples themselves" in n for n in result.notes)
    assert result.choice is not None and result.choice.auto
