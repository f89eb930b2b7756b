"""``deploy --max-loss X``: the float regions that keep the task metric within X at the least cost on the
target, built beside full INT8 and FP16 and timed with them (``edgeq.orchestration.budget``).

The model is built in code: two identical branches whose first convolution fires rarely and large on one
channel (``relu(100 x0 - 250)``), summed into one output, so the entropy calibrator clips each branch's
tail (``tests/test_sensitivity.py``'s outlier, twice): with both INT8 the cosine is 0.894, keeping either
branch's second convolution float brings it to 0.991, so both regions meet ``--max-loss 0.05`` alone and
only their cost on the target tells them apart. Their nodes are named after two convolutions of a real
TensorRT 8.6 engine (the zoo ResNet-50 at batch 8 on an H100, tests/fixtures/trt86-h100-placed), which the
target's trtexec (tests/trtexec_replay.py, over a real sshd on 127.0.0.1) replays for every build: the
engine's per-layer profile prices the two regions. Everything else is real: onnxruntime, the placement
rules, the calibrator, the metric, SSH, the agent, the report and the gate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper
from test_sensitivity import samples
from trtexec_replay import Recorded, calls, replay_trtexec

FIXTURES = Path(__file__).parent / "fixtures"
PLACED = FIXTURES / "trt86-h100-placed" / "r50b8_edgeq.explicit"  # every convolution INT8
TAIL = FIXTURES / "trt86-h200-edgeq" / "r50b8_edgeq.explicit"  # layer4.2's conv3 and the pool FP16
# layer1.0's conv1 (7.6 us INT8, its input and output 8x64x56x56) and downsample (14.5 us, writing
# 8x256x56x56): keeping the second float costs more, in its layer and in the reformat of its output
CONV1 = "/layer1/layer1.0/conv1/Conv"
DOWNSAMPLE = "/layer1/layer1.0/downsample/downsample.0/Conv"
CONV3 = "/layer4/layer4.2/conv3/Conv"
CONV3_IN = "/layer4/layer4.1/relu_2/Relu_output_0"  # what the engine's DequantizeLinear reformat reads


def budget_model(path: Path, first: str = CONV1, second: str = DOWNSAMPLE, first_in: str = "rb") -> Path:
    """Two clipped branches summed; ``first``/``second``: the names of the convolutions reading the clipped
    tensors (``first_in``: the first one's input tensor)."""
    rng = np.random.default_rng(1)
    wa = rng.standard_normal((8, 4, 3, 3)) * 0.3
    wd = rng.standard_normal((4, 8, 1, 1)) * 0.5
    wb = rng.standard_normal((8, 4, 1, 1)) * 0.5
    wb[0] = 0.0
    wb[0, 0] = 100.0
    bb = np.zeros(8)
    bb[0] = -250.0  # channel 0: relu(100 * x0 - 250), rare and large
    wc = rng.standard_normal((4, 8, 1, 1)) * 0.5
    wc[:, 0] = 0.3
    weights = {"wa": wa, "ba": np.zeros(8), "wd": wd, "bd": np.zeros(4), "wb": wb, "bb": bb, "wc": wc,
               "bc": np.zeros(4)}  # fmt: skip
    node = helper.make_node
    nodes = [
        node("Conv", ["input", "wa", "ba"], ["ca"], name="/a/Conv", pads=[1, 1, 1, 1]),
        node("Relu", ["ca"], ["ra"], name="/a/Relu"),
        node("Conv", ["ra", "wd", "bd"], ["out_a"], name="/d/Conv"),
        node("Conv", ["input", "wb", "bb"], ["cb"], name="/b/Conv"),
        node("Relu", ["cb"], [first_in], name="/b/Relu"),
        node("Conv", [first_in, "wc", "bc"], ["ob"], name=first),
        node("Conv", ["input", "wb", "bb"], ["cf"], name="/g/Conv"),
        node("Relu", ["cf"], ["rf"], name="/g/Relu"),
        node("Conv", ["rf", "wc", "bc"], ["of"], name=second),
        node("Add", ["ob", "of"], ["out_b"], name="/sum/Add"),
    ]
    graph = helper.make_graph(
        nodes, "budget", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 8, 8]) for n in ("out_a", "out_b")],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def stand_in(bin_dir: Path, recording: Path = PLACED) -> Path:
    """The target's trtexec: every build and run replays ``recording`` (its layers and profile); the
    build log and the run log of the H100 recording (one TensorRT 8.6.0)."""
    bin_dir.mkdir(exist_ok=True)
    return replay_trtexec(bin_dir, build=Recorded(Path(f"{PLACED}.build.log")),
                          run=Recorded(Path(f"{PLACED}.run.log")), layers=Path(f"{recording}.layers.json"),
                          profile=Path(f"{recording}.profile.json"))  # fmt: skip


def workspace(root: Path, trtexec: Path, sshd=None) -> str:
    t = {"work_dir": str(root / "remote"), "python": sys.executable, "tensorrt": "8.6", "backend": "trtexec",
         "trtexec": str(trtexec), "gpu": {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"},
         "timeouts": {"connect": 10, "command": 60}}  # fmt: skip
    if sshd is None:
        t["host"] = "local"
    else:
        t.update(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(sshd.identity_file),
                 known_hosts=str(sshd.known_hosts))  # fmt: skip
    (root / "targets").mkdir(exist_ok=True)
    (root / "targets" / "board.yaml").write_text(yaml.safe_dump(t))
    return "board"


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    samples(tmp_path / "calib", 16, 0)
    samples(tmp_path / "holdout", 4, 1)  # 4 are enough: the engine runs on each, once per sample
    return tmp_path


def _deploy(cli, root: Path, model: Path, *more: str) -> tuple[int, str, str]:
    return cli("deploy", model, "--target", "board", "--calib", root / "calib", "--holdout", root / "holdout",
               "--calibrator", "entropy", "--metric", "cosine", "--max-loss", "0.05", "--iterations", "1",
               "--duration", "0", *more)  # fmt: skip


def _builds(trtexec: Path) -> list[str]:
    """The ONNX file of every build the target's trtexec was asked for, in order."""
    return [next(a.split("=", 1)[1] for a in argv if a.startswith("--onnx="))
            for argv in calls(trtexec) if any(a.startswith("--onnx=") for a in argv)]  # fmt: skip


@pytest.mark.sshd
@pytest.mark.slow  # four deploys, each running the engine on the held-out set one sample at a time
def test_the_cheaper_of_two_regions_that_both_meet_x_is_kept_built_beside_full_int8_and_fp16_and_cached(
        root, cli, sshd):
    model = budget_model(root / "net.onnx")
    trtexec = stand_in(root / "bin")
    workspace(root, trtexec, sshd)
    code, out, err = _deploy(cli, root, model)
    assert code == 0, (out, err)
    (budget_json,) = root.glob("runs/*/budget.json")
    d = json.loads(budget_json.read_text())["budget"]
    alone = {c["nodes"][0]: c for c in d["candidates"] if c["nodes"][0] in (CONV1, DOWNSAMPLE)}
    # both meet X alone, with the same score: only the cost tells them apart
    assert alone[CONV1]["score"] == pytest.approx(alone[DOWNSAMPLE]["score"])
    assert 1 - alone[CONV1]["score"] < 0.05
    assert 1 - d["before"]["value"] > 0.05
    assert alone[CONV1]["cost"]["ms"] < alone[DOWNSAMPLE]["cost"]["ms"]
    assert d["chosen"]["nodes"] == [CONV1] and d["reached"]
    # three engines built: full INT8 (every region), the chosen one, FP16 (the float model)
    built = _builds(trtexec)
    assert len(built) == 3
    names = [Path(b).name for b in built]
    shipped = [onnx.load(b) for b in built]
    qdq = [sum(n.op_type == "QuantizeLinear" for n in m.graph.node) for m in shipped]
    assert qdq[0] > qdq[1] > 0 and qdq[2] == 0, names  # full INT8, the chosen set, FP16
    # the three timed in the same paired rounds, and printed: accuracy and qps
    paired = d["paired"]
    assert paired["names"] == ["chosen", "full INT8", "FP16"] and paired["rounds"] == 3
    rows = {r["name"]: r for r in d["rows"]}
    assert set(rows) == {"chosen", "full INT8", "FP16"}
    assert rows["chosen"]["host_score"] == pytest.approx(alone[CONV1]["score"])
    assert rows["full INT8"]["host_score"] == pytest.approx(d["before"]["value"])
    assert all(r["qps"] and r["target"] for r in rows.values())  # TensorRT's figure on the held-out set
    text = " ".join(out.split())
    for name in ("chosen", "full INT8", "FP16"):
        assert any(line.lstrip("│ ").startswith(name) for line in out.splitlines()), out
    assert "--max-loss 0.05 reached: 1 region(s) float" in text and "placement cache miss" in text
    # the gate allows the kept node and the Q/DQ at its edges, credited to --max-loss
    report = json.loads((Path(rows["chosen"]["run_dir"]) / "report.json").read_text())
    allow = report["gate"]["policy"]["allow"]
    assert CONV1 in allow and DOWNSAMPLE not in allow and all(a.startswith(CONV1) or "_" in a for a in allow)
    page = (budget_json.parent / "budget.html").read_text()
    chosen_page = (Path(rows["chosen"]["run_dir"]) / "report.html").read_text()
    for html in (page, chosen_page):
        assert "<svg" in html and "<script" not in html and html.count("<polygon") >= 2

    # the second deploy of the same model, data and X to the same kind of target: the cache's choice
    code, out, err = _deploy(cli, root, model, "--json")
    assert code == 0, err
    again = json.loads(out)["budget"]
    assert again["from_cache"] and again["cache"]["hit"]
    assert len(_builds(trtexec)) == 4  # the chosen engine only
    assert _qdq_scales(_builds(trtexec)[3]) == _qdq_scales(built[1])  # the same model, from the entry
    assert again["budget"]["chosen"]["nodes"] == [CONV1] and again["budget"]["from_cache"]


def _qdq_scales(path: str) -> dict[str, float]:
    m = onnx.load(path)
    init = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    return {n.input[0]: float(init[n.input[1]]) for n in m.graph.node
            if n.op_type == "QuantizeLinear" and n.input[0] not in init}  # fmt: skip


# --------------------------------------------------------------------------------------------------
# The parts, on the host
# --------------------------------------------------------------------------------------------------


def _report(recording: Path, model=None):
    from edgeq.report.compare_engine import engine_from_path

    return engine_from_path(Path(f"{recording}.layers.json"), onnx_model=model).report


def test_a_region_costs_its_int8_layers_run_fp16_and_a_reformat_per_int8_edge_it_cuts():
    """On the recorded H100 engine: layer1.0's conv1 is one INT8 layer (7.6 us) whose input the downsample
    convolution also reads in INT8 and whose output conv2 reads in INT8: two reformats. Kept float together
    with the downsample, their shared input needs none; a layer already FP16 in the engine costs nothing."""
    from edgeq.quant.float_cost import CostModel, elements, load_cost_table

    table = load_cost_table()
    placed = CostModel(_report(PLACED), table)
    conv1, down = placed.price([CONV1]), placed.price([DOWNSAMPLE])
    assert (conv1.layers, conv1.reformats, conv1.nodes_found) == (1, 2, 1)
    assert conv1.int8_ms == pytest.approx(0.0076, abs=5e-5)
    assert conv1.layer_ms == pytest.approx((table.ratio("CaskConvolution") - 1) * conv1.int8_ms)
    assert conv1.reformat_ms == pytest.approx(2 * table.reformat(elements((8, 64, 56, 56))), rel=1e-6)
    assert down.ms > conv1.ms  # more INT8 time, and its 8x256x56x56 output to copy
    both = placed.price([CONV1, DOWNSAMPLE])
    assert both.layers == 2 and both.reformats == conv1.reformats + down.reformats - 2  # the shared input
    assert placed.price(["/not/in/the/engine"]).ms == 0.0
    tail = CostModel(_report(TAIL), table).price([CONV3])
    assert tail.nodes_found == 1 and tail.layers == 0 and tail.ms == 0.0  # FP16 there already


def test_cheapest_cover_takes_two_cheap_regions_over_one_dear_one_and_none_when_they_fall_short():
    from edgeq.quant.budget import cheapest_cover

    assert cheapest_cover([(0.1, 5.0), (0.06, 1.0), (0.05, 1.0)], 0.1) == [1, 2]
    assert cheapest_cover([(0.1, 1.5), (0.06, 1.0), (0.05, 1.0)], 0.1) == [0]
    assert cheapest_cover([(0.04, 1.0), (0.05, 1.0)], 0.1) is None
    assert cheapest_cover([], 0.0) == []


def _setup(model: Path, calib: Path, holdout: Path, metric: str = "cosine"):
    from edgeq.quant.quantize import QuantizeOptions
    from edgeq.quant.sensitivity import SensitivityOptions, prepare

    q = QuantizeOptions(calib=calib, holdout_data=holdout, calibrator="entropy", metric=metric)
    return prepare(onnx.load(model), SensitivityOptions(q, max_regions=None, alone=False))


@pytest.mark.parametrize("first, second", [(CONV1, DOWNSAMPLE), (DOWNSAMPLE, CONV1)])
def test_the_choice_follows_the_cost_on_the_engine_not_the_graph(root, first, second):
    """Named either way round, the region kept float is the one whose engine layer costs less: the choice
    reads the profile, not the order of the graph or of the ranking (both recover the same)."""
    from edgeq.quant.budget import choose_within
    from edgeq.quant.float_cost import CostModel

    setup = _setup(budget_model(root / "net.onnx", first, second), root / "calib", root / "holdout")
    costs = CostModel(_report(PLACED, setup.scorer.reference))
    before = setup.scorer.held.score(setup.choice.outputs)
    choice = choose_within(setup.scorer, setup.regions, 0.05, costs.price, before)
    assert choice.reached and choice.nodes == (CONV1,)
    assert choice.cost.ms == pytest.approx(costs.price([CONV1]).ms)
    assert choice.runs == len(setup.regions)  # each weighed once; a single region meeting X needs no re-check
    assert [p.how for p in choice.points].count("alone") == len(setup.regions)


def test_when_no_region_meets_x_alone_the_set_is_grown_and_rechecked(root):
    """Two clipped branches on two outputs, judged by the worse output (cosine): either region alone
    recovers nothing, both together do; the choice keeps both, each addition re-checked on the set."""
    from test_sensitivity import outlier_model

    from edgeq.quant.budget import choose_within
    from edgeq.quant.float_cost import CostModel

    model = outlier_model(root / "two.onnx", second=True)
    setup = _setup(model, root / "calib", root / "holdout")
    costs = CostModel(_report(PLACED, setup.scorer.reference))
    before = setup.scorer.held.score(setup.choice.outputs)
    choice = choose_within(setup.scorer, setup.regions, 0.05, costs.price, before)
    assert choice.reached and set(choice.nodes) == {"/c/Conv", "/f/Conv"}
    alone = [c for c in choice.candidates if c.region.nodes[0] in ("/c/Conv", "/f/Conv")]
    assert all(not (1 - c.score.value <= 0.05) for c in alone)  # neither meets X alone
    assert any(p.how == "combined" and set(p.regions) >= {"rb", "rf"} for p in choice.points)


class _SpreadLoss:
    """A scorer whose loss only goes when all of ``needed`` is float (no region recovers anything alone):
    the search's run count on 20 regions, whatever onnxruntime would take for each run."""

    def __init__(self, needed: set[str]) -> None:
        self.needed, self.runs = needed, 0

    def score(self, nodes):
        from edgeq.quant.metrics import TaskScore

        self.runs += 1
        value = 1.0 if self.needed <= set(nodes) else 0.8
        return TaskScore("cosine", value, f"cosine {value}")


def test_a_loss_spread_over_regions_is_found_in_a_few_runs_and_pruned_to_what_it_needs():
    import math

    from edgeq.quant.budget import choose_within
    from edgeq.quant.float_cost import FloatCost
    from edgeq.quant.metrics import TaskScore
    from edgeq.quant.sensitivity import QdqRegion

    regions = [QdqRegion(f"r{i}", (), (f"n{i}",)) for i in range(20)]

    def price(nodes):  # cheaper by index: the search takes them in that order among equals
        ms = sum(0.001 * (1 + int(n[1:])) for n in nodes)
        return FloatCost(ms, len(nodes), ms, ms, 0, 0.0, len(nodes), len(nodes))

    scorer = _SpreadLoss({"n3", "n7"})
    choice = choose_within(scorer, regions, 0.05, price, TaskScore("cosine", 0.8, "cosine 0.8"))
    assert choice.reached and set(choice.nodes) == {"n3", "n7"}
    prefix = 2 * math.ceil(math.log2(8))  # 1, 2, 4, 8 meets; then 6 and 7 between 4 and 8
    assert choice.runs <= len(regions) + prefix + 8  # ranking, the prefix search, the prune of 8


def test_the_gate_allowlist_is_the_kept_nodes_and_the_qdq_at_their_edges():
    """A DequantizeLinear feeding a kept node and a QuantizeLinear of its output: TensorRT names their
    reformat layers after them (a ``_clone_N`` per reader, trt86-h200-edgeq r50b8); other Q/DQ are not in."""
    from fnmatch import fnmatchcase

    from edgeq.orchestration.budget import edge_allow

    node = helper.make_node
    nodes = [node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="x_QuantizeLinear"),
             node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="x_DequantizeLinear"),
             node("Relu", ["xd"], ["k"], name="/kept/Relu"),
             node("QuantizeLinear", ["k", "s", "z"], ["kq"], name="k_QuantizeLinear"),
             node("DequantizeLinear", ["kq", "s", "z"], ["kd"], name="k_DequantizeLinear"),
             node("Relu", ["kd"], ["y"], name="/int8/Relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              [numpy_helper.from_array(np.float32(0.1), "s"),
                               numpy_helper.from_array(np.int8(0), "z")])  # fmt: skip
    allow = edge_allow(helper.make_model(graph), ("/kept/Relu",))
    assert allow == ("/kept/Relu", "x_DequantizeLinear*", "k_QuantizeLinear*")
    matches = lambda name: any(name == a or fnmatchcase(name, a) for a in allow)  # noqa: E731
    assert matches("x_DequantizeLinear_clone_1") and matches("k_QuantizeLinear")
    assert not matches("k_DequantizeLinear") and not matches("/int8/Relu")


# --------------------------------------------------------------------------------------------------
# Whole deploys
# --------------------------------------------------------------------------------------------------


def test_the_int8_gate_allows_exactly_the_regions_kept_float(root, cli):
    """The chosen engine replays a real 8.6 engine whose layer4.2 conv3 and pool run FP16 (trt86-h200-edgeq):
    the region kept float is the one named conv3 (already float there: it costs nothing), so its layer is
    excused, credited to --max-loss; the pool's FP16 layers and their reformats, not kept float by anyone,
    still fail the gate: exit 1, naming them."""
    model = budget_model(root / "net.onnx", first=CONV3, second=CONV1, first_in=CONV3_IN)
    workspace(root, stand_in(root / "bin", TAIL))
    (root / "mine.yaml").write_text("version: 1\nexclude: [/d/Conv]\n")  # the user's own float node
    code, out, err = cli("deploy", model, "--target", "board", "--calib", root / "calib", "--holdout", "0.25",
                         "--calibrator", "entropy", "--metric", "cosine", "--max-loss", "0.05",
                         "--overrides", root / "mine.yaml", "--iterations", "1", "--duration", "0",
                         "--json")  # fmt: skip
    assert code == 1, err
    d = json.loads(out)
    assert d["budget"]["budget"]["chosen"]["nodes"] == [CONV3] and d["budget"]["budget"]["reached"]
    assert d["budget"]["budget"]["allow"] == [[CONV3, "--max-loss 0.05 (kept float on purpose)"],
                                              ["/d/Conv", "--overrides exclude (float on purpose)"]]
    gate = d["gate"]
    assert gate["policy"]["allow"] == [CONV3, "/d/Conv"]  # nothing else: no Q/DQ at their edges here
    allowed = {v["layer"]: v for v in gate["allowed"]}
    assert [v["nodes"][0] for v in allowed.values()] == [CONV3]
    assert "excused by --max-loss 0.05 (kept float on purpose)" in gate["summary"]
    failed = {n for v in gate["violations"] for n in (*v["nodes"], v["layer_name"])}
    assert any("GlobalAveragePool" in n for n in failed) and CONV3 not in failed


def test_bad_max_loss_is_one_line_exit_2_before_any_work(root, cli):
    model = budget_model(root / "net.onnx")
    workspace(root, stand_in(root / "bin"))
    qdq = root / "q.onnx"
    from edgeq import zoo

    onnx.save(zoo.qdq_ort(zoo.resnet_like(size=32, width=8), quantize_bias=False), str(qdq))
    base = ("--target", "board", "--calib", root / "calib")
    cases = [
        ((model, *base, "--max-loss", "1.5"), "--max-loss must be in [0, 1)"),
        ((model, *base, "--max-loss", "abc"), "--max-loss"),
        ((model, "--target", "board", "--max-loss", "0.05"), "--max-loss needs a float model and --calib"),
        ((qdq, *base, "--max-loss", "0.05"), "already has Q/DQ nodes"),
        ((model, *base, "--max-loss", "0.05", "--placement", "implicit"), "placement trt, all or auto"),
        ((model, *base, "--max-loss", "0.05", "--gate", "relative"), "--baseline implicit"),
    ]
    for args, words in cases:
        code, _, err = cli("deploy", *args)
        lines = [x for x in err.strip().splitlines() if x.strip()]
        assert code == 2 and len(lines) == 1 and words in lines[0] and "Traceback" not in err, (args, err)
    assert not (root / "runs").exists() and calls(root / "bin" / "trtexec") == []


@pytest.mark.sshd
def test_fleet_validate_weighs_the_regions_once_per_board_kind(boards, servers, root, cli):
    """Two loopback boards of one kind (H100 by their target files): the first one weighs the regions and
    builds the three engines, both are given the chosen Q/DQ model and gated with exactly its float node;
    the matrix says what the kind kept and where it was decided."""
    model = budget_model(root / "net.onnx")
    stand_ins, names = {}, []
    for i, server in enumerate(servers[:2], start=1):
        name = f"board{i}"
        stand_ins[name] = stand_in(root / name)
        t = {"host": server.host, "port": server.port, "user": server.user,
             "identity_file": str(server.identity_file), "known_hosts": str(server.known_hosts),
             "work_dir": str(root / f"remote-{name}"), "python": sys.executable, "tensorrt": "8.6",
             "backend": "trtexec", "trtexec": str(stand_ins[name]),
             "gpu": {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"},
             "timeouts": {"connect": 10, "command": 60}}  # fmt: skip
        (root / "targets").mkdir(exist_ok=True)
        (root / "targets" / f"{name}.yaml").write_text(yaml.safe_dump(t))
        names.append(f"targets/{name}.yaml")
    fleet = root / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"workers": 2, "targets": names}))
    code, out, err = cli("fleet", "validate", model, "--fleet", fleet, "--calib", root / "calib", "--holdout",
                         "0.25", "--max-loss", "0.05", "--calibrator", "entropy", "--duration", "0",
                         "--iterations", "1", "--json")  # fmt: skip
    assert code == 0, (out, err)
    res = json.loads(out)
    rows = {r["target"]: r for r in res["targets"]}
    assert all(r["status"] == "passed" for r in rows.values()), rows
    built = {n: _builds(t) for n, t in stand_ins.items()}
    decider = max(built, key=lambda n: len(built[n]))
    other = next(n for n in built if n != decider)
    assert len(built[decider]) == 4 and len(built[other]) == 1  # full INT8, chosen, FP16; then its row
    assert _qdq_scales(built[other][0]) == _qdq_scales(built[decider][-1]) == _qdq_scales(built[decider][1])
    cell = f"--max-loss 0.05: 1 region(s) float (decided on {decider})"
    assert rows["board1"]["placement"] == rows["board2"]["placement"] == cell
    for r in rows.values():
        gate = json.loads((Path(r["run_dir"]) / "report.json").read_text())["gate"]
        assert gate["policy"]["allow"] == [CONV1] and gate["passed"]
    kinds = json.loads((Path(res["fleet_dir"]) / "fleet.json").read_text())["placements"]
    assert list(kinds) == ["sm9.0-trt8.6.0"] and kinds["sm9.0-trt8.6.0"]["reason"].startswith(
        "--max-loss 0.05 reached: 1 region(s) float")


def test_a_pipeline_file_takes_max_loss_and_weighs_at_the_targets_stage(root, cli):
    """``quantize: {max_loss: X}`` with targets: the host stage only cleans and lints, the target weighs
    and ships the chosen model; a bad X is the file's, one line naming it, exit 2."""
    from edgeq.orchestration.run import load_spec

    model = budget_model(root / "net.onnx")
    trtexec = stand_in(root / "bin")
    workspace(root, trtexec)
    spec = {"model": str(model), "calib": str(root / "calib"), "target": "board",
            "quantize": {"max_loss": 0.05, "calibrator": "entropy", "metric": "cosine", "holdout": 0.25},
            "profile": {"duration": 0, "iterations": 1}}  # fmt: skip
    pipeline = root / "p.yaml"
    pipeline.write_text(yaml.safe_dump(spec))
    assert load_spec(pipeline).auto and load_spec(pipeline).quantize.max_loss == 0.05
    code, _, err = cli("run", pipeline, "--json")
    assert code == 0, err
    assert len(_builds(trtexec)) == 4  # full INT8, chosen, FP16, then the row's build of the chosen model
    assert _qdq_scales(_builds(trtexec)[3]) == _qdq_scales(_builds(trtexec)[1])
    host = json.loads((root / "runs" / "pipeline-p" / "host" / "stages.json").read_text())
    assert {s["name"]: s["status"] for s in host["stages"]}["quantize"] == "skipped"
    bad = root / "bad.yaml"
    bad.write_text(yaml.safe_dump({**spec, "quantize": {"max_loss": 1.5}}))
    code, _, err = cli("run", bad)
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and "bad.yaml" in lines[0]
    assert "--max-loss must be in [0, 1)" in lines[0]


def test_sensitivity_with_an_engine_draws_accuracy_against_qps_and_marks_the_choice(root, cli):
    """``sensitivity --engine`` prices each region on a real engine's profile (its run log's qps) and the
    page draws them; ``--max-loss`` marks the cheapest set that meets it, reusing the ranking's runs;
    without an engine ``--max-loss`` is one line, exit 2."""
    model = budget_model(root / "net.onnx")
    base = ("sensitivity", model, "--calib", root / "calib", "--holdout", root / "holdout", "--calibrator",
            "entropy", "--metric", "cosine", "-o", root / "sens")  # fmt: skip
    code, out, err = cli(*base, "--engine", f"{PLACED}.layers.json", "--max-loss", "0.05", "--json")
    assert code == 0, err
    d = json.loads(out)
    e = d["engine"]
    assert e["qps_measured"] and e["qps"] > 0 and set(e["regions"]) == {r["name"] for r in d["ranked"]}
    by_node = {r["nodes"][0]: e["regions"][r["name"]] for r in d["ranked"]}
    assert by_node[CONV1]["ms"] < by_node[DOWNSAMPLE]["ms"]
    assert by_node[CONV1]["qps"] > by_node[DOWNSAMPLE]["qps"]
    assert e["budget"]["nodes"] == [CONV1] and e["budget"]["reached"]
    assert e["budget"]["runs"] == 0  # every region's all-but-one score was the ranking's
    page = (root / "sens" / "sensitivity.html").read_text()
    assert "<svg" in page and "chosen (modelled)" in page and "<script" not in page
    # a region of three nodes lists them in its tooltip, one a line, inside the attribute
    assert 'title="/a/Conv&#10;/b/Conv&#10;/g/Conv"' in page and '<span class="ctl">' not in page
    code, _, err = cli(*base, "--max-loss", "0.05")
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and "--engine" in lines[0]


def test_when_full_int8_meets_x_nothing_goes_float_and_full_int8_is_the_chosen_engine(root, cli):
    """``--max-loss 0.5`` (every region INT8 loses 0.12): no region is weighed, full INT8 is the chosen
    engine (built once, gated with nothing allowed), still printed beside FP16 from the same rounds."""
    model = budget_model(root / "net.onnx")
    trtexec = stand_in(root / "bin")
    workspace(root, trtexec)
    code, out, err = cli("deploy", model, "--target", "board", "--calib", root / "calib", "--holdout", "0.25",
                         "--calibrator", "entropy", "--metric", "cosine", "--max-loss", "0.5",
                         "--iterations", "1", "--duration", "0")  # fmt: skip
    assert code == 0, err
    assert len(_builds(trtexec)) == 2  # full INT8 and FP16
    (budget_json,) = root.glob("runs/*/budget.json")
    d = json.loads(budget_json.read_text())["budget"]
    assert d["chosen"]["nodes"] == [] and d["runs"] == 0 and d["paired"]["names"] == ["full INT8", "FP16"]
    rows = {r["name"]: r for r in d["rows"]}
    assert rows["chosen"]["run_dir"] == rows["full INT8"]["run_dir"] and rows["chosen"]["ratio"] == 1.0
    report = json.loads((Path(rows["chosen"]["run_dir"]) / "report.json").read_text())
    assert report["gate"]["policy"]["name"] == "int8" and report["gate"]["policy"]["allow"] == []
    assert "no region float" in " ".join(out.split())
    for name in ("chosen", "full INT8", "FP16"):
        assert any(line.lstrip("│ ").startswith(name) for line in out.splitlines()), out
