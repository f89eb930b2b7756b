"""``edgeq tune`` on the loopback sshd and on a ``host: local`` target, with a stand-in trtexec whose
timings come from a recorded TensorRT 8.6 engine pair scaled by which Q/DQ sites the candidate has
(tests/trtexec_tune.py): the decisions follow the measured times, the budget stops the search, and an
interrupted run resumes without rebuilding what it measured. Orchestration, not TensorRT."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from test_deploy import ssh_server  # noqa: F401 - fixture
from trtexec_tune import builds, timings, tune_trtexec

from edgeq import zoo

SKIP2 = "/layer2/layer2.0/downsample/downsample.0/Conv_output_0"  # residual skip of block 2
SKIP3 = "/layer3/layer3.0/downsample/downsample.0/Conv_output_0"  # residual skip of block 3
TAIL = "/layer3/layer3.0/relu_1/Relu_output_0"  # the pool tail
# SKIP2's Q/DQ costs 20 %, the pool tail's saves 10 %, SKIP3's changes nothing (ties are not kept).
COSTS = {SKIP2: 0.2, TAIL: -0.1}


@pytest.fixture
def setup(tmp_path, monkeypatch):
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
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def target(name: str, trtexec: Path, sshd=None) -> str:
        t = {"work_dir": str(tmp_path / "remote"), "python": sys.executable, "tensorrt": "8.6",
             "backend": "trtexec", "trtexec": str(trtexec), "timeouts": {"connect": 10, "command": 60}}
        if sshd is None:
            t["host"] = "local"
        else:
            t.update(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(sshd.identity_file),
                     known_hosts=str(sshd.known_hosts))  # fmt: skip
        (tmp_path / "targets" / f"{name}.yaml").write_text(yaml.safe_dump(t))
        return name

    return tmp_path, model, calib, bin_dir, target


def _q_tensors(path: Path) -> set[str]:
    m = onnx.load(str(path))
    consts = {t.name for t in m.graph.initializer}
    return {n.input[0] for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in consts}


@pytest.mark.sshd
def test_tune_over_ssh_keeps_what_the_target_measured_faster(setup, ssh_server, cli):  # noqa: F811
    _, model, calib, bin_dir, target = setup
    trtexec = tune_trtexec(bin_dir, COSTS)
    name = target("loopback", trtexec, ssh_server)
    code, out, err = cli("tune", model, "--target", name, "--calib", calib, "--min-cosine", "0.9", "--json")
    assert code == 0, err
    d = json.loads(out)
    # the default start is the mirror; the stand-in's implicit layer JSON is ResNet-50's, not this net's, so
    # the search starts from the rules and says why
    assert d["start_from"]["placement"] == "rules" and "did not mirror" in d["start_from"]["not_mirror"]
    chosen = {e["decision"].split(":", 1)[0] + ":" + e["sites"][0]: e["kept"] for e in d["decisions"]}
    assert chosen == {f"residual-add:{SKIP2}": True, f"residual-add:{SKIP3}": False,
                      f"pool-tail:{TAIL}": False}  # fmt: skip
    assert [e["chosen_by"] for e in d["decisions"]] == [
        "measured: faster (1.222x in 3 paired rounds), accuracy within bound",
        "measured: not faster (1.000x in 3 paired rounds)",  # a tie keeps the rules' placement
        "measured: slower (0.900x in one timing)"]  # clearly slower: refused without re-timing
    # the start placement has every site (1.1x the recording's time); without SKIP2 it is 0.9x
    start, best, implicit = d["start"]["qps"], d["best"]["qps"], d["implicit"]["qps"]
    assert best == pytest.approx(start * 1.1 / 0.9, rel=1e-3)
    assert d["speedup_vs_implicit"] == pytest.approx(best / implicit, rel=1e-3)
    assert d["paired_vs_implicit"]["names"] == ["implicit", d["best"]["key"]]
    assert d["paired_vs_implicit"]["rounds"] == 3 and d["decisions"][2]["paired"] is None
    assert all(e["candidate"]["cosine"] >= 0.9 for e in d["decisions"])
    # the tuned model is the measured best: SKIP2's Q/DQ gone, the rest of the rules' placement kept
    tuned = _q_tensors(Path(d["files"]["model"]))
    assert SKIP2 not in tuned and {SKIP3, TAIL} <= tuned
    assert Path(d["files"]["cache"]).read_text().startswith("TRT-8600-EntropyCalibration2")
    assert d["gate"]["relative"]["passed"] and d["gate"]["precision"]["passed"]
    html = Path(d["files"]["html"]).read_text()
    assert SKIP2 in html and "measured: faster" in html
    # implicit (with the calibration cache), the start, one build per decision: nothing built twice
    argv = builds(trtexec)
    assert len(argv) == 5 and d["builds"] == {"this_run": 5, "reused": 0}
    assert any(a.startswith("--calib=") for a in argv[0])
    assert not [a for a in argv[1:] if any(x.startswith("--calib=") for x in a)]
    # one timing cache on the target serves every build of the run
    caches = {x for a in argv for x in a if x.startswith("--timingCacheFile=")}
    assert len(caches) == 1 and all(len([x for x in a if x in caches]) == 1 for a in argv)


def test_the_budget_stops_the_search(setup, cli):
    _, model, calib, bin_dir, target = setup
    trtexec = tune_trtexec(bin_dir, COSTS)
    name = target("here", trtexec)
    code, out, err = cli("tune", model, "--target", name, "--calib", calib, "--min-cosine", "0.9",
                         "--budget", "1s", "--json")  # fmt: skip
    d = json.loads(out)
    assert d["stopped"] == "budget 1 s spent"
    assert [e["chosen_by"] for e in d["decisions"]] == ["not tried: budget 1 s spent"] * 3
    assert len(builds(trtexec)) == 2  # implicit and the start placement only
    assert d["best"]["key"] == d["start"]["key"]
    # the start placement measured 1.1x the implicit engine's time: the relative gate says so (exit 1)
    assert code == 1, err
    assert [f[0] for f in d["gate"]["relative"]["failures"]] == ["slower-than-baseline"]
    # as people read it (resumed: the budget is each run's): where the search started, and why not from
    # the mirror (the stand-in's implicit layer JSON is ResNet-50's)
    code, text, err = cli("tune", model, "--target", name, "--calib", calib, "--min-cosine", "0.9",
                          "--budget", "1s", "-o", Path(d["files"]["json"]).parent)  # fmt: skip
    assert "started from edgeq's rules (the implicit engine did not mirror onto the model: the engine" in text
    assert "is not of this model" in text and "Traceback" not in err


def test_an_interrupted_run_resumes_without_rebuilding(setup):
    root, model, calib, bin_dir, target = setup
    name = target("here", tune_trtexec(bin_dir, COSTS, kill_on_build=4))
    edgeq = Path(sys.executable).with_name("edgeq")
    argv = [str(edgeq), "tune", str(model), "--target", name, "--calib", str(calib), "--min-cosine", "0.9",
            "--json", "-o", str(root / "out")]  # fmt: skip
    env = {**os.environ, "XDG_CACHE_HOME": str(root / "cache")}
    first = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == -9, first.stderr  # killed during its 4th build
    state = json.loads((root / "out" / "tune.state.json").read_text())
    assert len(state["measured"]) == 3  # implicit, start, the first toggle: each saved when measured
    assert not (root / "out" / "tune.json").exists()
    assert len(state["paired"]) == 1  # the kept decision's re-timing, saved before the next build
    trtexec = tune_trtexec(bin_dir, COSTS)  # the same target, no longer killing
    done, timed = len(builds(trtexec)), len(timings(trtexec))
    second = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    d = json.loads(second.stdout)
    assert len(builds(trtexec)) - done == 2  # only the two decisions never measured
    assert d["builds"] == {"this_run": 2, "reused": 3}
    assert [e["kept"] for e in d["decisions"]] == [True, False, False]
    # two deploy timings, SKIP3's re-timing and the final ratio's (3 rounds x 2); SKIP2's not again
    assert len(timings(trtexec)) - timed == 2 + 6 + 6
    assert d["decisions"][0]["paired"]["ratio"] == pytest.approx(1.1 / 0.9, rel=1e-3)


def test_a_local_target_takes_no_ssh_keys(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "gpu.yaml").write_text(yaml.safe_dump({"host": "local", "user": "me"}))
    code, _, err = cli("targets", "check", "gpu")
    assert code == 2
    assert "'user' has no meaning with 'host: local'" in err and "Traceback" not in err


def test_a_state_of_another_run_is_refused(setup, cli):
    root, model, calib, bin_dir, target = setup
    name = target("here", tune_trtexec(bin_dir, COSTS))
    (root / "out").mkdir()
    (root / "out" / "tune.state.json").write_text(json.dumps({"version": 1, "fingerprint": "x"}))
    code, _, err = cli("tune", model, "--target", name, "--calib", calib, "-o", root / "out")
    assert code == 2 and "holds a tuning run of another model" in err
    assert not builds(bin_dir / "trtexec")
    # a run of the other start, in the same directory: said, with the flag that resumes it
    args = ("tune", model, "--target", name, "--calib", calib, "-o", root / "trt", "--min-cosine", "0.9")
    code, _, err = cli(*args, "--placement", "trt", "--budget", "1s")
    assert code in (0, 1) and builds(bin_dir / "trtexec")
    code, _, err = cli(*args)
    assert code == 2 and "started with --placement trt" in err and "add --placement trt to resume it" in err


def test_sites_implicit_ran_in_fp16_start_float_and_can_be_toggled_back():
    from edgeq.graph.io import graph_from_model
    from edgeq.quant.decisions import IMPLICIT_FP16, candidate_plan, decision_points
    from edgeq.quant.placement import plan_placement
    from edgeq.quant.quantize import prepare_model

    plan = plan_placement(graph_from_model(prepare_model(zoo.resnet_like(layers=(1, 1, 1)))[0]))
    site = next(s for s in plan.sites if s.rule == "weighted-inputs")
    rules_only = decision_points(plan)
    mirrored = decision_points(plan, fp16_nodes=site.consumers)
    assert IMPLICIT_FP16 not in {d.rule for d in rules_only}
    (fp16,) = [d for d in mirrored if d.rule == IMPLICIT_FP16]
    assert site.tensor in fp16.sites and not fp16.start
    start = candidate_plan(plan, mirrored, {})
    assert site.tensor not in start.tensors and len(start.sites) == len(plan.sites) - len(fp16.sites)
    assert site.tensor in candidate_plan(plan, mirrored, {fp16.id: True}).tensors


@pytest.mark.parametrize("args, message", [
    (["--budget", "soon"], "--budget soon: not a duration"),
    (["--min-cosine", "2"], "must be in [-1, 1]"),
])  # fmt: skip
def test_bad_options_are_one_line_and_build_nothing(setup, cli, args, message):
    root, model, calib, bin_dir, target = setup
    name = target("here", tune_trtexec(bin_dir, COSTS))
    code, _, err = cli("tune", model, "--target", name, "--calib", calib, *args)
    assert code == 2 and message in err and "Traceback" not in err
    assert not builds(bin_dir / "trtexec") and not (root / "net.tune").exists()


def test_budget_durations():
    from edgeq.orchestration.tune import parse_budget

    assert [parse_budget(s) for s in ("20m", "90s", "1h30m", "45", "2.5")] == [1200, 90, 5400, 45, 2.5]


def test_calibration_data_that_does_not_fit_leaves_nothing_behind(setup, cli):
    root, model, _, bin_dir, target = setup
    name = target("here", tune_trtexec(bin_dir, COSTS))
    bad = root / "bad"
    bad.mkdir()
    np.save(bad / "s0.npy", np.zeros((1, 3, 8, 8), np.float32))
    code, _, err = cli("tune", model, "--target", name, "--calib", bad)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
    assert not builds(bin_dir / "trtexec") and not (root / "net.tune").exists()


@pytest.mark.parametrize("rounds, kept", [("3", [True, False, False]), ("0", [True, True, False])])
def test_a_lucky_single_timing_is_not_kept_when_paired(setup, cli, rounds, kept):
    """SKIP3's Q/DQ changes nothing, but the candidate without it times 15 % faster once (run-to-run
    noise): decided on single timings it is kept; timed in alternation against the best it is a tie."""
    _, model, calib, bin_dir, target = setup
    trtexec = tune_trtexec(bin_dir, COSTS, first_run={SKIP3: 0.85})
    name = target("here", trtexec)
    code, out, err = cli("tune", model, "--target", name, "--calib", calib, "--min-cosine", "0.9",
                         "--rounds", rounds, "--json")  # fmt: skip
    assert code == 0, err
    d = json.loads(out)
    assert [e["kept"] for e in d["decisions"]] == kept
    assert (SKIP3 in _q_tensors(Path(d["files"]["model"]))) is (rounds != "0")
    runs = timings(trtexec)
    if rounds == "0":
        assert len(runs) == 5 and d["paired_vs_implicit"] is None  # one timing per build, nothing else
        return
    skip3 = d["decisions"][1]
    assert skip3["chosen_by"] == "measured: not faster (1.000x in 3 paired rounds)"
    assert skip3["candidate"]["qps"] > 1.15 * skip3["best_before"]["qps"]  # its lucky first timing
    assert skip3["paired"]["qps"][0] == skip3["paired"]["qps"][1]  # the same speed, round after round
    # 5 deploy timings + two decisions and the final ratio re-timed: 3 rounds x 2 engines each, with no
    # per-layer profile run, best and candidate in alternation (A B, B A, A B)
    retimed = [a for a in runs if not any(x.startswith("--exportProfile=") for x in a)]
    assert len(runs) == 5 + 18 and len(retimed) == 18
    # the engines alone: same bindings, so their host<->device copies are left out of the comparison
    assert all("--noDataTransfers" in a for a in retimed)
    assert not any("--noDataTransfers" in a for a in runs[:2])
    assert d["paired_vs_implicit"]["data_transfers"] is False
    engines = [next(x for x in a if x.startswith("--loadEngine=")) for a in retimed[6:12]]
    a, b = engines[0], engines[1]
    assert a != b and engines == [a, b, b, a, a, b]
    final = d["paired_vs_implicit"]
    assert final["ratio"] == pytest.approx(d["best"]["qps"] / d["implicit"]["qps"], rel=1e-3)


def test_the_retiming_order_alternates():
    from edgeq.orchestration.retime import Paired, order

    assert order(2, 3) == [0, 1, 1, 0, 0, 1] and order(3, 2) == [0, 1, 2, 2, 1, 0]
    p = Paired(("a", "b"), ((100.0, 90.0, 110.0), (101.0, 99.0, 99.0)))
    assert p.ratio() == pytest.approx(1.01) and p.median(0) == 100.0  # median of per-round ratios
