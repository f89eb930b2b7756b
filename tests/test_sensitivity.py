"""``edgeq sensitivity`` and ``quantize --max-loss`` on a model built in code with one trained-like outlier.

The model: two branches read the input. Branch B's first convolution fires rarely and large on one
channel (``relu(100 * x0 - 250)``: zero unless x0 > 2.5, then up to ~100) next to channels of ordinary
size, and the convolution after it reads that channel: the entropy calibrator clips the rare tail (its
amax is about a tenth of the max seen), which is the YOLOv8n case of issue 29 (amax 0.28 against 4.07).
Everything runs for real: onnxruntime, the placement rules, the calibrator, the metric.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from conftest import ROOT
from onnx import TensorProto, helper, numpy_helper

from edgeq.graph.io import graph_from_model
from edgeq.quant.placement import plan_placement
from edgeq.quant.quantize import prepare_model
from edgeq.quant.sensitivity import Scorer, qdq_regions, speed_cost, with_excluded

CULPRIT = "/c/Conv"  # reads the clipped tensor 'rb'
ENTROPY = ("--calibrator", "entropy", "--metric", "cosine")  # TensorRT's calibrator, the one that clips


def outlier_model(path: Path, second: bool = False) -> Path:
    """``second``: a copy of branch B (``/f/Conv`` reads ``rf``, output ``out_f``) clipped the same way."""
    rng = np.random.default_rng(1)
    wa = rng.standard_normal((8, 4, 3, 3)) * 0.3
    we = rng.standard_normal((8, 8, 3, 3)) * 0.2
    wd = rng.standard_normal((4, 8, 1, 1)) * 0.5
    wb = rng.standard_normal((8, 4, 1, 1)) * 0.5
    wb[0] = 0.0
    wb[0, 0] = 100.0
    bb = np.zeros(8)
    bb[0] = -250.0  # channel 0 of rb: relu(100 * x0 - 250), rare and large
    wc = rng.standard_normal((4, 8, 1, 1)) * 0.5
    wc[:, 0] = 0.3
    weights = {"wa": wa, "ba": np.zeros(8), "we": we, "be": np.zeros(8), "wd": wd, "bd": np.zeros(4),
               "wb": wb, "bb": bb, "wc": wc, "bc": np.zeros(4)}
    conv = helper.make_node
    nodes = [
        conv("Conv", ["input", "wa", "ba"], ["ca"], name="/a/Conv", pads=[1, 1, 1, 1]),
        conv("Relu", ["ca"], ["ra"], name="/a/Relu"),
        conv("Conv", ["ra", "we", "be"], ["ce"], name="/e/Conv", pads=[1, 1, 1, 1]),
        conv("Relu", ["ce"], ["re"], name="/e/Relu"),
        conv("Conv", ["re", "wd", "bd"], ["out_a"], name="/d/Conv"),
        conv("Conv", ["input", "wb", "bb"], ["cb"], name="/b/Conv"),
        conv("Relu", ["cb"], ["rb"], name="/b/Relu"),
        conv("Conv", ["rb", "wc", "bc"], ["out_b"], name=CULPRIT),
    ]
    outputs = ["out_a", "out_b"]
    if second:
        nodes += [conv("Conv", ["input", "wb", "bb"], ["cf"], name="/g/Conv"),
                  conv("Relu", ["cf"], ["rf"], name="/g/Relu"),
                  conv("Conv", ["rf", "wc", "bc"], ["out_f"], name="/f/Conv")]
        outputs.append("out_f")
    graph = helper.make_graph(
        nodes, "outlier", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 8, 8]) for n in outputs],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def samples(d: Path, n: int, seed: int) -> Path:
    d.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        np.save(d / f"s{i:02d}.npy", rng.standard_normal((1, 4, 8, 8)).astype(np.float32))
    return d


@pytest.fixture
def case(tmp_path):
    return (outlier_model(tmp_path / "m.onnx"), samples(tmp_path / "calib", 16, 0),
            samples(tmp_path / "holdout", 8, 1))


def _one_line_error(code: int, out: str, err: str, *words: str) -> None:
    assert code == 2, (out, err)
    lines = [x for x in err.strip().splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]


def test_regions_are_what_overrides_exclude_and_excluding_one_floats_exactly_its_tensors(case):
    model, _, _ = case
    reference, _, _ = prepare_model(onnx.load(model))
    graph = graph_from_model(reference)
    plan = plan_placement(graph, "trt")
    regions = {r.name: r.nodes for r in qdq_regions(graph, plan)}
    assert regions == {"input": ("/a/Conv", "/b/Conv"), "ra": ("/e/Conv",), "re": ("/d/Conv",),
                       "rb": (CULPRIT,)}  # fmt: skip
    sites = {s.tensor for s in plan.sites}
    weights = {w.node for w in plan.weights}
    for name, nodes in regions.items():
        cut = plan_placement(graph, "trt", with_excluded(None, nodes))
        assert {s.tensor for s in cut.sites} == sites - {name}
        assert {w.node for w in cut.weights} == weights - set(nodes)
        assert set(cut.excluded) == set(nodes)


def test_sensitivity_names_the_clipped_region_first_and_keeping_it_float_recovers_the_loss(case, cli):
    model, calib, holdout = case
    out_dir = model.parent / "sens"
    code, out, err = cli("sensitivity", model, "--calib", calib, "--holdout", holdout, *ENTROPY,
                         "-o", out_dir, "--json")
    assert code == 0, err
    d = json.loads(out)
    saved = json.loads((out_dir / "sensitivity.json").read_text())
    assert saved["ranked"] == d["ranked"] and saved["all_int8"] == d["all_int8"]
    assert d["calibrator"] == "entropy" and d["samples"] == 8 and d["scored"] == d["regions"] == 4
    assert d["loss"] > 0.05  # the clipped tail costs the metric
    first = d["ranked"][0]
    assert first["nodes"] == [CULPRIT] and first["name"] == "rb"
    assert first["recovered"] >= 0.5 * d["loss"]  # keeping it float recovers most of the loss
    assert first["clip"] > 5 and first["clip"] == max(r["clip"] for r in d["ranked"])
    assert first["alone"] == pytest.approx(d["all_int8"]["value"], abs=0.01)  # alone, it loses it all
    for r in d["ranked"][1:]:
        assert r["recovered"] < 0.1 * d["loss"] and r["alone"] > 0.99
    recovered = [r["recovered"] for r in d["ranked"]]
    assert recovered == sorted(recovered, reverse=True)
    html = (out_dir / "sensitivity.html").read_text()
    assert html.count('class="bar ') == 4 and CULPRIT in html
    assert "<script" not in html and "http" not in html.replace("http-equiv", "")  # self-contained

    code, out, err = cli("sensitivity", model, "--calib", calib, "--holdout", holdout, *ENTROPY,
                         "-o", out_dir)
    assert code == 0, err
    rows = [ln for ln in out.splitlines() if ln.lstrip("│ ").startswith("1 ")]
    assert rows and CULPRIT in rows[0], out
    # the advice names the region by its nodes, as the table and --overrides do (not its first tensor)
    assert f"keeping {CULPRIT} float recovers" in " ".join(out.split()) and "keeping rb" not in out, out
    assert "wrote" in out


def test_sensitivity_by_default_analyses_what_auto_chose_on_every_calib_sample_and_says_so(case, cli):
    model, calib, _ = case
    code, out, err = cli("sensitivity", model, "--calib", calib, "--metric", "cosine", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["samples"] == 16 and any("16 calibration samples themselves" in n for n in d["notes"])
    (auto,) = [n for n in d["notes"] if n.startswith("auto chose")]
    assert auto.startswith(f"auto chose {d['calibrator']} by cosine ")  # the calibrator quantize would use
    assert (model.parent / "m.sensitivity" / "sensitivity.html").is_file()


def test_sensitivity_cost_is_bounded_most_clipped_first_and_says_what_it_skipped(case, cli):
    model, calib, holdout = case
    code, out, err = cli("sensitivity", model, "--calib", calib, "--holdout", holdout, *ENTROPY,
                         "--max-regions", "1")
    assert code == 0, err
    assert "not scored: 3 region(s) (--max-regions 1)" in out
    d = json.loads((model.parent / "m.sensitivity" / "sensitivity.json").read_text())
    assert [r["nodes"] for r in d["ranked"]] == [[CULPRIT]]  # the most clipped one is the one kept
    (skipped,) = d["skipped"]
    assert skipped["why"] == "--max-regions 1" and sorted(skipped["regions"]) == ["input", "ra", "re"]


def test_ctrl_c_keeps_what_finished_and_says_interrupted(case, cli, monkeypatch):
    model, calib, holdout = case
    real = Scorer.score
    calls = []

    def score(self, exclude=()):  # the real scoring; Ctrl-C arrives during the 4th candidate
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(self, exclude)

    monkeypatch.setattr(Scorer, "score", score)
    code, out, err = cli("sensitivity", model, "--calib", calib, "--holdout", holdout, *ENTROPY)
    assert code == 130 and "interrupted" in err, (out, err)
    d = json.loads((model.parent / "m.sensitivity" / "sensitivity.json").read_text())
    assert d["interrupted"] is True and d["scored"] == 1  # all INT8, then one region (2 runs), then Ctrl-C
    assert sum(len(s["regions"]) for s in d["skipped"] if s["why"] == "interrupted") == 3


def test_max_loss_keeps_the_culprit_float_and_the_override_file_replays_it(case, cli):
    model, calib, _ = case
    d = model.parent
    code, out, err = cli("quantize", model, "--calib", calib, *ENTROPY, "--max-loss", "0.01",
                         "-o", d / "a.onnx")
    assert code == 0, err
    assert f"--max-loss 0.01 reached: 1 region(s) float (1 node(s): {CULPRIT})" in out
    assert "speed cost: unmeasured" in out
    s = json.loads((d / "a.json").read_text())
    ml = s["max_loss"]
    assert ml["reached"] and ml["nodes"] == [CULPRIT]
    assert 1 - ml["before"]["value"] > 0.05 and 1 - ml["after"]["value"] <= 0.01
    assert s["overrides"]["excluded"] == [CULPRIT]  # recorded in the plan as float on purpose
    assert {"tensor": "rb", "rule": "place-override"} in s["float_tensors"]
    written = yaml.safe_load((d / "a.overrides.yaml").read_text())
    assert written == {"version": 1, "exclude": [CULPRIT]}

    code, out, err = cli("quantize", model, "--calib", calib, *ENTROPY,
                         "--overrides", d / "a.overrides.yaml", "-o", d / "b.onnx")
    assert code == 0, err
    replayed = json.loads((d / "b.json").read_text())
    assert replayed["overrides"] == s["overrides"] and replayed["activations"] == s["activations"]
    assert onnx.load(d / "b.onnx").graph == onnx.load(d / "a.onnx").graph


def test_max_loss_tries_a_region_the_first_ranking_hid(tmp_path, cli):
    """Two branches clipped alike, judged by their worse output: floating either alone recovers nothing
    (the other still fails), so both rank at zero; the greedy pass re-checks each with the other float."""
    model = outlier_model(tmp_path / "m.onnx", second=True)
    calib = samples(tmp_path / "calib", 16, 0)
    code, out, err = cli("quantize", model, "--calib", calib, *ENTROPY, "--max-loss", "0.01", "--json")
    assert code == 0, (out, err)
    ml = json.loads(out)["max_loss"]
    assert ml["reached"] and sorted(ml["nodes"]) == ["/c/Conv", "/f/Conv"]
    assert 1 - ml["before"]["value"] > 0.05


def test_max_loss_keeps_the_users_own_overrides_and_adds_nothing_when_already_met(case, cli):
    model, calib, _ = case
    d = model.parent
    own = d / "own.yaml"
    own.write_text("exclude: [/d/*]\n")
    code, out, err = cli("quantize", model, "--calib", calib, *ENTROPY, "--overrides", own,
                         "--max-loss", "0.01", "-o", d / "a.onnx")
    assert code == 0, err
    assert yaml.safe_load((d / "a.overrides.yaml").read_text())["exclude"] == ["/d/*", CULPRIT]
    code, out, err = cli("quantize", model, "--calib", calib, *ENTROPY, "--max-loss", "0.5",
                         "-o", d / "c.onnx")
    assert code == 0 and "no region float" in out, (out, err)
    assert yaml.safe_load((d / "c.overrides.yaml").read_text())["exclude"] == []


def test_the_int8_gate_lists_excluded_nodes_as_intended_float_and_still_fails_other_fallback(tmp_path):
    """On a real TensorRT 8.6 implicit engine (FP16 layers): the nodes the quantize stage excluded are
    excused, credited to the override file; every other FP16 layer still fails the gate."""
    from edgeq.orchestration.deploy import DeployOptions, deploy_policy
    from edgeq.pipeline.rundir import StageRecord
    from edgeq.pipeline.stages import finish_run, gate_policy
    from edgeq.quant.overrides import INTENDED_FLOAT
    from edgeq.remote.targets import target_from_dict

    fixtures = ROOT / "tests" / "fixtures" / "trt86-h200"
    layers = fixtures / "resnet50.implicit.layers.json"
    target = target_from_dict({"host": "127.0.0.1", "user": "me", "use_agent": True}, tmp_path / "t.yaml")
    policy = deploy_policy(DeployOptions(), target)
    before = finish_run(tmp_path, layers, None, None, policy).gate
    fp16 = [v for v in before.violations if v.rule == "int8-compute"]
    assert len(fp16) > 3
    report = finish_run(tmp_path, layers, None, None, policy).report
    by_index = {rl.index: rl for rl in report.layers}
    excluded = [n for v in fp16[:2] for n in by_index[v.layer].onnx_nodes]
    stages = [StageRecord("quantize", "ok", data={"excluded": excluded, "forced": []})]
    after = finish_run(tmp_path, layers, None, None, gate_policy(policy, stages)).gate
    assert not after  # unintended fallback still fails
    assert {v.layer for v in after.allowed} >= {v.layer for v in fp16[:2]}
    assert len(after.violations) == len(before.violations) - len(after.allowed)
    assert f"excused by {INTENDED_FLOAT}" in after.summary()
    skipped = [StageRecord("quantize", "skipped", data={})]
    assert gate_policy(policy, skipped) == policy


def test_speed_cost_sums_the_layers_holding_the_float_nodes_in_a_real_engine():
    """A real TensorRT 8.6 explicit engine and its profile (trt86-h100-placed yolo): the layers whose
    fused ONNX nodes include a float node, and their profiled time out of the whole."""
    from edgeq.report.compare_engine import engine_from_path

    layers = ROOT / "tests" / "fixtures" / "trt86-h100-placed" / "yolo_edgeq.explicit.layers.json"
    report = engine_from_path(layers).report
    assert report is not None and report.timed
    convs = [rl for rl in report.layers if rl.onnx_nodes and rl.time_ms][:3]
    nodes = [rl.onnx_nodes[0] for rl in convs] + ["/not/in/the/engine"]
    cost = speed_cost(layers, None, nodes)
    assert cost is not None and cost.layers >= 3 and cost.nodes_found == 3 and cost.nodes == 4
    holding = [rl for rl in report.layers if set(nodes) & set(rl.onnx_nodes)]
    assert cost.ms == pytest.approx(sum(rl.time_ms for rl in holding))
    assert cost.total_ms == pytest.approx(report.profile_total_ms) and 0 < cost.ms < cost.total_ms
    assert f"{cost.ms:.3f} ms of {cost.total_ms:.3f} ms" in cost.line()
    assert speed_cost(None, None, nodes) is None


def test_quantize_max_loss_prices_the_float_regions_from_an_earlier_engine(case, cli):
    model, calib, _ = case
    layers = ROOT / "tests" / "fixtures" / "trt86-h100-placed" / "yolo_edgeq.explicit.layers.json"
    code, out, err = cli("quantize", model, "--calib", calib, *ENTROPY, "--max-loss", "0.01",
                         "--engine", layers, "--json")
    assert code == 0, err
    speed = json.loads(out)["max_loss"]["speed"]
    assert speed["engine"] == str(layers) and speed["nodes"] == 1 and speed["nodes_found"] == 0
    assert speed["total_ms"] > 0  # another model's engine: none of this model's nodes are in it


def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, cli):
    model, calib, holdout = case
    d = model.parent
    sens = ("sensitivity", model, "--calib", calib)
    _one_line_error(*cli(*sens, "--metric", "nosuchmetric"), "unknown metric 'nosuchmetric'")
    _one_line_error(*cli(*sens, "--metric", "nosuchmodule:f"), "nosuchmodule")
    _one_line_error(*cli(*sens, "--holdout", d / "missing"), "missing", "held-out data not found")
    _one_line_error(*cli(*sens, "--max-regions", "0"), "--max-regions")
    _one_line_error(*cli(*sens, "--budget", "soon"), "--budget soon")
    _one_line_error(*cli(*sens, "--placement", "implicit"), "placement trt or all")
    _one_line_error(*cli("sensitivity", model), "--calib")
    _one_line_error(*cli("sensitivity", d / "nope.onnx", "--calib", calib), "nope.onnx")
    assert not (d / "m.sensitivity").exists()
    q = ("quantize", model, "--calib", calib)
    for x in ("1.5", "-0.1", "1"):
        _one_line_error(*cli(*q, "--max-loss", x), "--max-loss must be in [0, 1)")
    _one_line_error(*cli(*q, "--engine", holdout), "--max-loss")
    _one_line_error(*cli(*q, "--max-loss", "0.1", "--from-engine", holdout), "placement trt or all")
    _one_line_error(*cli(*q, "--max-loss", "0.01", "--engine", d / "no.layers.json"), "no.layers.json")
    assert sorted(p.name for p in d.iterdir()) == ["calib", "holdout", "m.onnx"]


def test_tune_reads_the_same_override_file_and_its_gate_allows_those_nodes(tmp_path, monkeypatch, cli):
    """The file --max-loss writes replays in tune: the rules' start with those nodes float, their Q/DQ and
    weight DQs absent from the tuned model, and the precision gate's allowlist naming them (a stand-in
    trtexec replaying a recorded engine on a ``host: local`` target: orchestration, not TensorRT)."""
    import sys

    from test_tune import _q_tensors
    from trtexec_tune import tune_trtexec

    from edgeq import zoo

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "targets").mkdir()
    model = tmp_path / "net.onnx"
    onnx.save(zoo.resnet_like(layers=(1, 1, 1)), str(model))
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(5)
    for i in range(4):
        np.save(calib / f"s{i}.npy", rng.random((1, 3, 64, 64), dtype=np.float32))
    (tmp_path / "bin").mkdir()
    trtexec = tune_trtexec(tmp_path / "bin", {})
    target = {"host": "local", "work_dir": str(tmp_path / "remote"), "python": sys.executable,
              "tensorrt": "8.6", "backend": "trtexec", "trtexec": str(trtexec),
              "timeouts": {"connect": 10, "command": 60}}  # fmt: skip
    (tmp_path / "targets" / "here.yaml").write_text(yaml.safe_dump(target))
    fc = "/fc/Gemm"
    ov = tmp_path / "net.int8.overrides.yaml"
    ov.write_text(yaml.safe_dump({"version": 1, "exclude": [fc]}))
    code, out, err = cli("tune", model, "--target", "here", "--calib", calib, "--min-cosine", "0.9",
                         "--overrides", ov, "--budget", "1s", "--json")  # fmt: skip
    d = json.loads(out)
    assert "Traceback" not in err and d["start_from"]["placement"] == "rules", err
    assert fc in d["gate"]["precision"]["allowed_wider"]
    tuned = onnx.load(d["files"]["model"])
    gemm = next(n for n in tuned.graph.node if n.name == fc)
    assert gemm.input[1] == "fc.weight" and gemm.input[0] not in _q_tensors(Path(d["files"]["model"]))
    (mark := tmp_path / "o2.yaml").write_text("exclude: [/nothing/*]\n")
    code, out, err = cli("tune", model, "--target", "here", "--calib", calib, "--overrides", mark,
                         "-o", tmp_path / "other")  # fmt: skip
    _one_line_error(code, out, err, "matches no node")
    assert not (tmp_path / "other").exists()


def test_a_written_exclude_names_exactly_its_node_whatever_characters_the_name_holds():
    from edgeq.quant.overrides import Overrides
    from edgeq.quant.sensitivity import exact_pattern

    names = ["/m/cv[1]/Conv", "/m/cv?/Conv*", "re:/m/.*", "/m/cv1/Conv", "re:x", "/m/cvX/Conv"]
    for name in names[:5]:
        excluded, _ = Overrides(exclude=(exact_pattern(name),)).resolve(names)
        assert excluded == {name}, name


def _sure_classifier(path: Path) -> Path:
    """x (2, 4, 8, 8) -> Conv 1x1 -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> (2, 5) logits whose
    class 0 leads by 20: INT8 keeps every label, so the metric loses nothing."""
    rng = np.random.default_rng(3)
    bias = np.zeros(5, np.float32)
    bias[0] = 20.0
    inits = [numpy_helper.from_array(rng.standard_normal((8, 4, 1, 1)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((5, 8)).astype(np.float32), "w2"),
             numpy_helper.from_array(bias, "b2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], name="/conv/Conv"),
             helper.make_node("Relu", ["h"], ["r"], name="/relu/Relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="/pool/GlobalAveragePool"),
             helper.make_node("Flatten", ["p"], ["f"], name="/flatten/Flatten"),
             helper.make_node("Gemm", ["f", "w2", "b2"], ["logits"], name="/fc/Gemm", transB=1)]
    graph = helper.make_graph(nodes, "sure",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 5])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def test_sensitivity_with_nothing_to_recover_stops_at_once_and_says_so(tmp_path, cli, monkeypatch):
    """Every region INT8 already scores as FP32 (every label kept): no region is scored (the issue's run
    scored 20 regions for 161 s, then advised keeping a tensor float for +0.0000), and the output says
    there is nothing to recover."""
    model = _sure_classifier(tmp_path / "m.onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        np.save(calib / f"{i}.npy", rng.standard_normal((2, 4, 8, 8)).astype(np.float32))
    scored: list[object] = []
    real = Scorer.score
    monkeypatch.setattr(Scorer, "score",
                        lambda self, exclude=(): scored.append(exclude) or real(self, exclude))
    code, out, err = cli("sensitivity", model, "--calib", calib, "--metric", "classification", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["metric"] == "classification" and d["loss"] == 0.0 and d["nothing_to_recover"] is True
    assert d["scored"] == 0 and d["ranked"] == [] and not scored
    (skipped,) = d["skipped"]
    assert skipped["why"] == "nothing to recover" and len(skipped["regions"]) == d["regions"] > 0
    assert d["advice"].startswith("nothing to recover: with every region INT8 the model scores as FP32")
    code, out, err = cli("sensitivity", model, "--calib", calib, "-o", tmp_path / "s")
    assert code == 0 and "nothing to recover" in " ".join(out.split()), (out, err)
    assert "keeping" not in out
