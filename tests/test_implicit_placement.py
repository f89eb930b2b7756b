"""``--placement implicit`` on a target: deploy, compare --target and tune build the implicit engine there,
mirror it (one calibration) and judge the explicit engine against it.

On a ``host: local`` target with the stand-in trtexec of tests/trtexec_tune.py, which answers with real
TensorRT 8.6 recordings: ResNet-50 (tests/fixtures/trt86-h100-placed, r50b8: implicit and edgeq's
explicit with the same layers; built here as ResNet-50's graph at width 8: the engines map onto its
names, not its weights) and the torchvision zoo (tests/fixtures/trt86-h100-zoo: EfficientNet-B0,
whose explicit engine ran its 16 SE gates FP16 where implicit ran them INT8; ShuffleNet, whose implicit
engine kept its channel shuffles FP32 and stage 4 FP16), each on the graph it was built from. The Q/DQ the
explicit build received are checked against an independent reading of the implicit layer JSON (json
only: its Reformatting CopyNode layers followed back, each layer's ``[ONNX Layer: X]`` metadata as readers).
Orchestration and gates, not TensorRT.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from trtexec_tune import builds, timings, tune_trtexec

from edgeq import zoo

FIXTURES = Path(__file__).parent / "fixtures"
PLACED = FIXTURES / "trt86-h100-placed"
ZOO = FIXTURES / "trt86-h100-zoo"
SKIP2 = "/layer2/layer2.0/downsample/downsample.0/Conv_output_0"  # a residual skip of ResNet-50
SKIP1 = "/layer1/layer1.0/downsample/downsample.0/Conv_output_0"  # one implicit kept float


def _r50() -> dict[str, dict[str, str]]:
    return {kind: {what: str(PLACED / f"r50b8_edgeq.{kind}.{ext}")
                   for what, ext in (("build", "build.log"), ("run", "run.log"), ("layers", "layers.json"),
                                     ("profile", "profile.json"))}
            for kind in ("implicit", "explicit")}  # fmt: skip


def _zoo(tmp: Path, implicit: str, explicit: str) -> dict[str, dict[str, str]]:
    """A zoo recording (gzipped) unpacked, each kind from its own engine; the build log is ResNet-50's
    (the zoo recorded the engines' runs, not their builds; a build log says only that it built)."""
    tmp.mkdir(exist_ok=True)

    def unpack(name: str) -> str:
        out = tmp / name.removesuffix(".gz")
        out.write_bytes(gzip.decompress((ZOO / name).read_bytes()))
        return str(out)

    return {kind: {"build": str(PLACED / f"r50b8_edgeq.{kind}.build.log"),
                   "run": unpack(f"{engine}.run.log.gz"), "layers": unpack(f"{engine}.layers.json.gz"),
                   "profile": unpack(f"{engine}.profile.json.gz")}
            for kind, engine in (("implicit", f"{implicit}.implicit"), ("explicit", explicit))}  # fmt: skip


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """(root, calib dir, target(name, trtexec) -> name); models are written by each test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "targets").mkdir()
    (tmp_path / "bin").mkdir()

    def target(trtexec: Path) -> str:
        t = {"host": "local", "work_dir": str(tmp_path / "remote"), "python": sys.executable,
             "tensorrt": "8.6", "backend": "trtexec", "trtexec": str(trtexec),
             "timeouts": {"connect": 10, "command": 60}}  # fmt: skip
        (tmp_path / "targets" / "here.yaml").write_text(yaml.safe_dump(t))
        return "here"

    return tmp_path, target


def _model(root: Path, model: onnx.ModelProto, samples: int = 4) -> tuple[Path, Path]:
    path = root / "net.onnx"
    onnx.save(model, str(path))
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    calib = root / "calib"
    calib.mkdir()
    rng = np.random.default_rng(5)
    for i in range(samples):
        np.save(calib / f"s{i}.npy", rng.random(dims, dtype=np.float32))
    return path, calib


def _shipped(trtexec: Path, i: int) -> onnx.ModelProto:
    """The ONNX model the ``i``-th build received on the target."""
    argv = builds(trtexec)[i]
    return onnx.load(next(a.split("=", 1)[1] for a in argv if a.startswith("--onnx=")))


def qdq_edges(model: onnx.ModelProto) -> set[tuple[str, str]]:
    """(activation tensor, node reading it through a Q -> DQ pair) of a Q/DQ model."""
    consts = {t.name for t in model.graph.initializer}
    q_of = {n.output[0]: n.input[0] for n in model.graph.node
            if n.op_type == "QuantizeLinear" and n.input[0] not in consts}  # fmt: skip
    dq_of = {n.output[0]: q_of[n.input[0]] for n in model.graph.node
             if n.op_type == "DequantizeLinear" and n.input[0] in q_of}  # fmt: skip
    return {(dq_of[i], n.name) for n in model.graph.node for i in n.input if i in dq_of}


def _fp32(root: Path) -> onnx.ModelProto:
    """The cleaned FP32 model the implicit engine was built from (its names are the engine's)."""
    return onnx.load(str(next(root.glob("**/net.implicit.fp32.onnx"))))


Edges = set[tuple[str, str]]


def direct_reads(layers_json: Path, model: onnx.ModelProto) -> tuple[Edges, Edges]:
    """(edges read INT8, edges read float) of the engine, each a (tensor, node) the FP32 model has:
    the tensor a layer input carries (back across Reformatting CopyNode layers) and a node of that layer's
    metadata that reads it in the graph."""
    layers = json.loads(Path(layers_json).read_text(), strict=False)["Layers"]
    reads_of = {n.name: set(n.input) for n in model.graph.node}
    tensors = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    produced = {t["Name"]: lay for lay in layers for t in lay["Outputs"]}
    int8: set[tuple[str, str]] = set()
    wide: set[tuple[str, str]] = set()
    for lay in layers:
        if lay["Name"].startswith("Reformatting CopyNode"):
            continue
        nodes = re.findall(r"\[ONNX Layer: (.*?)\]", lay.get("Metadata", ""))
        for t in lay["Inputs"]:
            name = t["Name"]
            while name not in tensors and produced.get(name, {}).get("Name", "").startswith("Reformatting"):
                name = produced[name]["Inputs"][0]["Name"]
            for n in nodes:
                if name in reads_of.get(n, ()):
                    (int8 if "Int8" in t["Format/Datatype"] else wide).add((name, n))
    return int8, wide


def test_deploy_builds_implicit_then_its_mirror_and_gates_relative_to_it(setup, cli):
    root, target = setup
    model, calib = _model(root, zoo.resnet50(size=64, width=8))
    trtexec = tune_trtexec(root / "bin", {}, recorded=_r50())
    code, out, err = cli("deploy", model, "--target", target(trtexec), "--calib", calib,
                         "--placement", "implicit", "--json")  # fmt: skip
    assert code == 0, err
    d = json.loads(out)
    # implicit first (the FP32 model with the calibration cache), then the mirror: one calibration
    argv = builds(trtexec)
    assert len(argv) == 2
    assert [any(a.startswith("--calib=") for a in b) for b in argv] == [True, False]
    # the explicit model carries a Q/DQ exactly on the edges the implicit engine read INT8
    shipped = _shipped(trtexec, 1)
    got = qdq_edges(shipped)
    int8, wide = direct_reads(PLACED / "r50b8_edgeq.implicit.layers.json", _fp32(root))
    assert int8 and int8 <= got and not (wide & got)
    mirror = d["implicit"]["mirror"]
    assert mirror["int8_edges"] == len(got) == 71 and mirror["unmapped"] == []
    # its scales are the calibrated ranges the implicit cache holds (no second calibration)
    cache = next(root.glob("runs/*/net.implicit.cache")).read_text().splitlines()[1:]
    amax = {line.split(":")[0]: line.split(":")[1].strip() for line in cache}
    assert SKIP2 in amax and any(t == SKIP2 for t, _ in got)
    # gated: the precision gate (nothing implicit kept float to allowlist) and relative to implicit, on
    # three alternating rounds of the two engines
    imp = d["implicit"]
    assert imp["allowlisted"] == [] and d["gate"]["passed"] and d["relative_gate"]["passed"]
    assert imp["paired"]["names"] == ["implicit", "explicit"] and imp["paired"]["rounds"] == 3
    assert len(timings(trtexec)) == 2 * 1 + 6  # each deploy's profile, then 3 rounds of 2
    assert d["relative_gate"]["ratio"]["throughput"] == pytest.approx(imp["paired"]["ratio"], abs=0.01)
    assert Path(imp["files"]["summary"]).is_file() and Path(imp["files"]["mirror_model"]).is_file()


def test_implicit_float_layers_are_allowlisted_and_said_so(setup, cli, tmp_path):
    """ShuffleNet's implicit engine kept its shuffles FP32 and stage 4 FP16. An explicit engine that
    reproduces them (here: the same layers) passes the int8 gate with exactly those nodes allowlisted."""
    root, target = setup
    model, calib = _model(root, zoo.skeleton(ZOO / "skeletons" / "shufflenet_v2_x1_0.skel.onnx"), 3)
    recorded = _zoo(tmp_path / "rec", "shufflenet", "shufflenet.implicit")
    trtexec = tune_trtexec(root / "bin", {}, recorded=recorded)
    code, out, err = cli("deploy", model, "--target", target(trtexec), "--calib", calib,
                         "--placement", "implicit", "--json")  # fmt: skip
    assert code == 0, err
    d = json.loads(out)
    allow = d["implicit"]["allowlisted"]
    op = {n.name: n.op_type for n in _fp32(root).graph.node}
    assert len(allow) == 59 and {"Reshape", "Transpose", "Conv"} <= {op[n] for n in allow}
    excused = d["gate"]["allowed"]
    assert excused and all(v["allowed_by"] in allow for v in excused)
    assert d["gate"]["passed"] and d["relative_gate"]["passed"]
    # the summary says which nodes were excused, and that the reformats are the relative gate's
    notes = " ".join(d["implicit"]["notes"])
    assert "59 ONNX nodes the implicit engine ran in FP16/FP32 allowlisted" in notes
    assert "judged by the relative gate" in notes
    # and so does the table a person reads
    code, out, err = cli("deploy", model, "--target", "here", "--calib", calib, "--placement", "implicit")
    assert code == 0, err
    text = " ".join(out.split())
    assert "59 ONNX nodes the implicit engine ran in FP16/FP32 allowlisted" in text
    assert "gate relative: explicit passed against implicit" in text


def test_other_float_layers_still_fail(setup, cli, tmp_path):
    """EfficientNet-B0: implicit ran every SE gate INT8; an explicit engine that runs them FP16 (edgeq's
    static placement, recorded) fails the precision gate on those nodes (nothing to excuse them) and the
    relative gate as wider than implicit: exit 1."""
    root, target = setup
    model, calib = _model(root, zoo.skeleton(ZOO / "skeletons" / "efficientnet_b0.skel.onnx"), 3)
    trtexec = tune_trtexec(root / "bin", {}, recorded=_zoo(tmp_path / "rec", "effb0", "effb0.explicit"))
    code, out, err = cli("deploy", model, "--target", target(trtexec), "--calib", calib,
                         "--placement", "implicit", "--json")  # fmt: skip
    assert code == 1, err
    d = json.loads(out)
    assert d["implicit"]["allowlisted"] == [] and not d["gate"]["passed"]
    wide = {n for v in d["gate"]["violations"] if v["rule"] == "int8-compute" for n in v["nodes"]}
    assert any(n.endswith("scale_activation/Sigmoid") for n in wide) and d["gate"]["allowed"] == []
    assert "wider-than-baseline" in {f["rule"] for f in d["relative_gate"]["failures"]}


def test_compare_target_builds_the_mirror_as_explicit(setup, cli):
    root, target = setup
    model, calib = _model(root, zoo.resnet50(size=64, width=8))
    trtexec = tune_trtexec(root / "bin", {}, recorded=_r50())
    code, out, err = cli("compare", model, "--target", target(trtexec), "--calib", calib,
                         "--placement", "implicit", "--gate", "relative", "--json")  # fmt: skip
    assert code == 0, err
    d = json.loads(out)
    assert [e["name"] for e in d["engines"]] == ["implicit", "explicit", "explicit-trt", "explicit-all"]
    assert [g["candidate"] for g in d["gates"]] == ["explicit"]  # the mirror is the one judged
    argv = builds(trtexec)
    assert [any(a.startswith("--calib=") for a in b) for b in argv] == [True, False, False, False]
    mirror, rules = qdq_edges(_shipped(trtexec, 1)), qdq_edges(_shipped(trtexec, 2))
    int8, wide = direct_reads(PLACED / "r50b8_edgeq.implicit.layers.json", _fp32(root))
    assert int8 <= mirror and not (wide & mirror) and len(mirror) == 71
    # built beside it: on ResNet-50 edgeq's rules and implicit agree edge for edge (the same 57 layers)
    assert mirror == rules and "net.explicit-trt" in " ".join(argv[2])


def test_tune_starts_from_the_mirror(setup, cli):
    """The default start: the mirror of the implicit engine; decisions both ways (the zoo's ResNet-50, whose
    implicit engine fused layer1.0's residual Add into the other convolution than the rules choose)."""
    root, target = setup
    model, calib = _model(root, zoo.resnet50(size=64, width=8))
    recorded = _zoo(root / "rec", "resnet50", "resnet50.explicit")
    trtexec = tune_trtexec(root / "bin", {SKIP2: 0.2}, recorded=recorded)
    code, out, err = cli("tune", model, "--target", target(trtexec), "--calib", calib, "--min-cosine", "0.5",
                         "--rounds", "1", "-o", root / "t", "--json")  # fmt: skip
    d = json.loads(out)
    assert code == 0, err  # the tuned engine passes both gates against implicit
    cache = d["start_from"].pop("cache")  # the default start is auto's: nothing cached, so the mirror
    assert d["start_from"] == {"placement": "mirror", "not_mirror": None}
    assert "starting from the mirror" in cache
    # the start: the mirror of the implicit engine, every edge it read INT8
    start = qdq_edges(_shipped(trtexec, 1))
    int8, wide = direct_reads(Path(recorded["implicit"]["layers"]), _fp32(root))
    assert int8 <= start and not (wide & start) and len(start) == 71
    # the mirror's tunable sites are tried float: the costly skip was dropped
    decisions = {e["sites"][0]: e for e in d["decisions"]}
    assert SKIP2 in decisions and decisions[SKIP2]["kept"] and decisions[SKIP2]["tried"] == "off"
    assert all(e["rule"] != "implicit-fp16" for e in d["decisions"])
    # the rules' site implicit kept float (layer1.0's residual skip: implicit fused the Add into the other
    # convolution) is tried INT8 on the best so far (SKIP2 dropped); a tie keeps the engine's choice
    (added,) = [e for e in d["decisions"] if e["rule"] == "rules-int8"]
    assert added["tried"] == "on" and not added["kept"] and added["sites"] == [SKIP1]
    i = next(i for i, e in enumerate(d["decisions"]) if e is added)
    tried = qdq_edges(_shipped(trtexec, 2 + i))
    assert {t for t, _ in tried} == {t for t, _ in start} - {SKIP2} | {SKIP1}
    tuned = {t for t, _ in qdq_edges(onnx.load(d["files"]["model"]))}
    assert SKIP2 not in tuned and tuned < {t for t, _ in start}


def test_tune_falls_back_to_the_rules_when_the_mirror_start_is_unusable(setup, cli):
    """A mirror start below --min-cosine is not the search's start: the rules' is tried next, and the
    output says why (here every candidate misses an unreachable bound, so nothing is built after implicit)."""
    root, target = setup
    model, calib = _model(root, zoo.resnet50(size=64, width=8))
    trtexec = tune_trtexec(root / "bin", {}, recorded=_zoo(root / "rec", "resnet50", "resnet50.explicit"))
    code, out, err = cli("tune", model, "--target", target(trtexec), "--calib", calib, "--min-cosine", "1",
                         "--rounds", "1", "-o", root / "t", "--json")  # fmt: skip
    d = json.loads(out)
    assert d["start_from"]["placement"] == "rules", err
    assert d["start_from"]["not_mirror"].startswith("the mirror's start was not usable: cosine")
    assert not d["start"]["accuracy_ok"] and len(builds(trtexec)) == 1  # implicit only
    assert all(e["rule"] != "rules-int8" for e in d["decisions"])  # the rules' decisions, not the mirror's
    assert code == 1  # nothing usable: no tuned engine passes a gate


def test_tune_asked_for_the_mirror_stops_when_the_engine_is_of_another_model(setup, cli):
    """``--placement implicit`` given: an implicit engine that does not map onto the model is an error (the
    default start falls back to the rules instead, tests/test_tune.py)."""
    root, target = setup
    model, calib = _model(root, zoo.resnet_like(layers=(1, 1, 1)))
    trtexec = tune_trtexec(root / "bin", {}, recorded=_r50())  # ResNet-50's engine for another net
    code, _, err = cli("tune", model, "--target", target(trtexec), "--calib", calib, "--min-cosine", "0.5",
                       "--placement", "implicit", "--rounds", "1", "-o", root / "t")  # fmt: skip
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and "Traceback" not in err and len(errors) == 1, err
    assert "--placement implicit" in errors[0] and "is not of this model" in errors[0]
    assert len(builds(trtexec)) == 1  # only the implicit engine was built


def test_bad_combinations_are_one_line_exit_2(setup, cli, tmp_path):
    root, target = setup
    model, calib = _model(root, zoo.resnet_like(layers=(1, 1, 1)), 2)
    name = target(tune_trtexec(root / "bin", {}))
    cases: list[tuple[list[Any], str]] = [
        (["deploy", model, "--target", name, "--placement", "implicit"], "needs a float model and --calib"),
        (["quantize", model, "--calib", calib, "--placement", "implicit"],
         "builds the implicit engine on a target"),
        (["compare", "--engines", root, root, "--placement", "implicit"],
         "--placement implicit builds on a target"),
        (["tune", model, "--target", name, "--calib", calib, "--placement", "all"], "tune starts from trt"),
    ]
    (tmp_path / "x.yaml").write_text("exclude: [x]\n")
    cases.append((["deploy", model, "--target", name, "--calib", calib, "--placement", "implicit",
                   "--overrides", tmp_path / "x.yaml"], "--overrides does not apply"))
    qdq = root / "q.onnx"
    assert cli("quantize", model, "--calib", calib, "-o", qdq)[0] == 0
    before = sorted(p.name for p in root.iterdir())
    cases.append((["deploy", qdq, "--target", name, "--calib", calib, "--placement", "implicit"],
                  "already has Q/DQ nodes"))
    pipeline = root / "p.yaml"
    pipeline.write_text(yaml.safe_dump({"model": str(model), "calib": str(calib), "target": name,
                                        "quantize": {"placement": "implicit"}}))
    cases.append((["run", pipeline], "placement implicit is not supported in pipeline and fleet files"))
    for args, said in cases:
        code, out, err = cli(*args)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2, (args, out, err)
        assert "Traceback" not in err and said in " ".join(err.split()), (args, err)
        assert len(lines) <= 3, (args, err)
    assert sorted(p.name for p in root.iterdir()) == sorted([*before, "p.yaml"])
    assert not builds(root / "bin" / "trtexec") and not (root / "runs").exists()
