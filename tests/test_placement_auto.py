"""``edgeq deploy --placement auto`` (the default with a float model and --calib): the target decides the
placement once per (model, calibration, TensorRT version, GPU) and the placement cache remembers it.

Whole deploys over a real OpenSSH sshd on 127.0.0.1 (or ``host: local`` where the transport is not the
point), with the trtexec stand-in of tests/trtexec_tune.py answering with real TensorRT 8.6 recordings
(ResNet-50, tests/fixtures/trt86-h100-placed: implicit and edgeq's explicit engine, the same 57 layers).
The stand-in writes which ONNX each build received, so the tests see which engines were built. A failed
explicit build replays a real failing TensorRT 8.6.0 build log (tests/fixtures/trt86-h200). Orchestration,
cache and fallbacks, not TensorRT.
"""

from __future__ import annotations

import json
import re
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from trtexec_tune import builds, tune_trtexec

from edgeq import zoo
from edgeq.fs import sha256_file

H200 = Path(__file__).parent / "fixtures" / "trt86-h200"
SKIP2 = "/layer2/layer2.0/downsample/downsample.0/Conv_output_0"  # a residual skip of ResNet-50
H100 = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
ORIN = {"name": "Orin", "compute_capability": "8.7"}


def _workspace(root: Path, trtexec: Path, sshd=None, gpu=H100) -> str:
    """A target file for the stand-in (over ``sshd`` when given, else ``host: local``)."""
    t = {"work_dir": str(root / "remote"), "python": sys.executable, "tensorrt": "8.6", "backend": "trtexec",
         "trtexec": str(trtexec), "gpu": gpu, "timeouts": {"connect": 10, "command": 60}}  # fmt: skip
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
    (tmp_path / "bin").mkdir()
    model = zoo.resnet50(size=32, width=8)  # ResNet-50's graph, whose engines the stand-in replays
    onnx.save(model, str(tmp_path / "net.onnx"))
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(5)
    for i in range(3):
        np.save(calib / f"s{i}.npy", rng.random((1, 3, 32, 32), dtype=np.float32))
    return tmp_path


def _deploy(cli, root: Path, *more) -> tuple[int, dict, str]:
    code, out, err = cli("deploy", root / "net.onnx", "--target", "board", "--calib", root / "calib",
                         "--iterations", "1", "--duration", "0", *more, "--json")  # fmt: skip
    return code, (json.loads(out) if out.strip() else {}), err


def _implicit_builds(trtexec: Path) -> int:
    return sum(any(a.startswith("--calib=") for a in b) for b in builds(trtexec))


def _shipped(trtexec: Path, i: int) -> onnx.ModelProto:
    argv = builds(trtexec)[i]
    return onnx.load(next(a.split("=", 1)[1] for a in argv if a.startswith("--onnx=")))


def _qdq(model: onnx.ModelProto) -> dict[str, float]:
    """Activation tensor -> the scale of its QuantizeLinear (the Q/DQ model's placement and scales)."""
    init = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    return {n.input[0]: float(init[n.input[1]]) for n in model.graph.node
            if n.op_type == "QuantizeLinear" and n.input[0] not in init}  # fmt: skip


def _entries(root: Path) -> list[Path]:
    return sorted((root / "cache" / "edgeq" / "placement").glob("*.json"))


@pytest.mark.sshd
def test_first_deploy_decides_and_caches_the_second_builds_only_the_explicit_engine(root, cli, sshd):
    trtexec = tune_trtexec(root / "bin", {})
    _workspace(root, trtexec, sshd)
    code, d, err = _deploy(cli, root)
    assert code == 0, err
    auto = d["placement"]
    # decided on the target: implicit (the FP32 model with the calibration cache), then its mirror
    assert [any(a.startswith("--calib=") for a in b) for b in builds(trtexec)] == [True, False]
    assert auto["kept"] == "explicit" and not auto["from_cache"] and not auto["cache"]["hit"]
    assert d["relative_gate"]["passed"] and auto["evidence"]["ratio"] >= 0.98
    assert isinstance(auto["implicit_build_seconds"], float)  # the decision's cost, said
    # one cache entry, keyed by the four things, in the user cache
    (entry,) = _entries(root)
    e = json.loads(entry.read_text())
    assert e["key"] == {"model_sha256": sha256_file(root / "net.onnx"), "calibration_sha256":
                        auto["key"]["calibration_sha256"], "tensorrt": "8.6.0", "gpu": H100["name"],
                        "compute_capability": "9.0"}  # fmt: skip
    assert auto["cache"]["path"] == str(entry) and e["kept"] == "explicit"
    first = _qdq(_shipped(trtexec, 1))
    int8 = {t: v for t, v in e["tensors"].items() if v["precision"] == "int8" and v["qdq"]}
    assert set(int8) == set(first) and len(first) == 55  # tensors (71 edges: some read twice)
    assert all(int8[t]["scale"] == pytest.approx(s, rel=1e-6) for t, s in first.items())
    # the evidence: both engines' layer JSON and the ratio
    layers = e["evidence"]["layers"]
    assert Path(layers["implicit"]).is_file() and Path(layers["explicit"]).is_file()
    assert e["evidence"]["ratio"] == auto["evidence"]["ratio"] and e["evidence"]["relative_gate"]["passed"]

    # the second deploy of the same model to the same kind of target: the explicit engine only
    code, out, err = cli("deploy", root / "net.onnx", "--target", "board", "--calib", root / "calib",
                         "--iterations", "1", "--duration", "0")  # fmt: skip
    assert code == 0, err
    assert len(builds(trtexec)) == 3 and _implicit_builds(trtexec) == 1
    text = " ".join(out.split())
    assert "placement from cache" in text and "no implicit engine built" in text
    assert "placement cache hit" in text
    assert _qdq(_shipped(trtexec, 2)) == first  # the same Q/DQ model: the cached placement and scales
    assert _entries(root) == [entry]


def test_another_gpu_or_tensorrt_version_misses_the_cache(root, cli):
    """The entry of one GPU is not another's: changing the GPU decides again, into a second entry; the
    key of another TensorRT version (same model, data and GPU) is another entry's path too."""
    from edgeq.orchestration.placement_cache import PlacementCache, PlacementKey

    trtexec = tune_trtexec(root / "bin", {})
    _workspace(root, trtexec, gpu=H100)
    code, d, err = _deploy(cli, root, "--placement-cache", root / "pc")
    assert code == 0, err
    (h100,) = sorted((root / "pc").glob("*.json"))
    _workspace(root, trtexec, gpu=ORIN)
    code, d, err = _deploy(cli, root, "--placement-cache", root / "pc")
    assert code == 0 and not d["placement"]["from_cache"], err
    assert _implicit_builds(trtexec) == 2  # decided again
    assert d["placement"]["key"]["gpu"] == "Orin" and d["placement"]["key"]["compute_capability"] == "8.7"
    assert len(sorted((root / "pc").glob("*.json"))) == 2 and h100.is_file()
    key = PlacementKey(**d["placement"]["key"])
    cache = PlacementCache(root / "pc")
    assert cache.get(key).hit
    other = PlacementKey(**{**d["placement"]["key"], "tensorrt": "8.6.1"})
    assert not cache.get(other).hit and cache.get(other).warning is None


def _failing_explicit(bin_dir: Path, trtexec: Path, log: Path, implicit: bool = False) -> Path:
    """A trtexec whose explicit builds (``--onnx=`` without ``--calib=``; ``implicit``: the implicit ones,
    with it) replay a real failing TensorRT 8.6.0 build (its log, exit 1); everything else is the
    stand-in's. Calls go to the same calls file."""
    script = bin_dir / "trtexec-failing"
    script.write_text(
        f"#!{sys.executable}\nimport json, os, sys\nargv = sys.argv\n"
        "if any(a.startswith('--onnx=') for a in argv) and "
        f"any(a.startswith('--calib=') for a in argv) == {implicit}:\n"
        f"    open({str(trtexec) + '.calls.jsonl'!r}, 'a').write(json.dumps(argv) + '\\n')\n"
        f"    sys.stdout.write(open({str(log)!r}).read())\n    sys.exit(1)\n"
        f"os.execv({str(trtexec)!r}, [{str(trtexec)!r}, *argv[1:]])\n"
    )
    script.chmod(0o755)
    return script


def test_a_failed_explicit_build_ships_the_implicit_engine_and_says_so(root, cli):
    """The mirror's build fails with a TensorRT internal error (a recorded 8.6.0 log): the deploy does not
    fail; it keeps the implicit engine, names the build log's first error, and caches that decision, so
    the next deploy builds the implicit engine alone and tries no explicit build."""
    trtexec = tune_trtexec(root / "bin", {})
    log = H200 / "yolo_ortfb.explicit.build.log"
    _workspace(root, _failing_explicit(root / "bin", trtexec, log))
    code, d, err = _deploy(cli, root)
    assert code == 0, err
    auto = d["placement"]
    assert [any(a.startswith("--calib=") for a in b) for b in builds(trtexec)] == [True, False]
    assert auto["kept"] == "implicit" and auto["evidence"]["ratio"] is None
    first = "Could not find any implementation for node PWN(PWN(/stem/stem.0/stem.0.2/Sigmoid)"
    assert auto["reason"].startswith("the explicit build failed on board: " + first)
    assert auto["evidence"]["explicit_build_error"].startswith(first)
    assert Path(d["run_dir"]) == Path(auto["evidence"]["runs"]["implicit"])  # the shipped run: implicit
    assert any(n.startswith("kept implicit: the explicit build failed") for n in auto["notes"])
    (entry,) = _entries(root)
    assert json.loads(entry.read_text())["kept"] == "implicit"

    code, out, err = cli("deploy", root / "net.onnx", "--target", "board", "--calib", root / "calib",
                         "--iterations", "1", "--duration", "0")  # fmt: skip
    assert code == 0, err
    assert [any(a.startswith("--calib=") for a in b) for b in builds(trtexec)] == [True, False, True]
    text = " ".join(out.split())
    assert "placement from cache" in text and "kept implicit: the explicit build failed on board" in text


def test_a_failed_implicit_build_ships_the_rules_qdq_model_and_says_so(root, cli):
    """The implicit build itself fails (a recorded 8.6.0 failing build log): nothing to mirror or time
    against, so the deploy does not fail: it ships the rules' Q/DQ model (as --placement trt), says so in
    one line naming the failure, and caches nothing (the next deploy tries to decide again)."""
    trtexec = tune_trtexec(root / "bin", {})
    log = H200 / "yolo_ortfb.explicit.build.log"
    _workspace(root, _failing_explicit(root / "bin", trtexec, log, implicit=True))
    code, d, err = _deploy(cli, root)
    assert code == 0, err
    auto = d["placement"]
    assert [any(a.startswith("--calib=") for a in b) for b in builds(trtexec)] == [True, False]
    first = "Could not find any implementation for node PWN(PWN(/stem/stem.0/stem.0.2/Sigmoid)"
    assert auto["kept"] == "rules" and auto["evidence"]["implicit_build_error"].find(first) >= 0
    said = [n for n in auto["notes"] if "implicit build failed" in n]
    assert len(said) == 1 and said[0].startswith("kept the rules' placement (--placement trt): the implicit "
                                                 "build failed on board: ") and first in said[0]  # fmt: skip
    # the shipped model is the rules' Q/DQ model, the one quantize writes with --placement trt
    shipped = _shipped(trtexec, 1)
    assert _qdq(shipped) and _qdq(shipped) == _qdq(onnx.load(auto["files"]["model"]))
    code, _, err = cli("quantize", root / "net.onnx", "--calib", root / "calib", "-o", root / "trt.onnx")
    assert code == 0, err
    assert set(_qdq(shipped)) == set(_qdq(onnx.load(str(root / "trt.onnx"))))
    assert _entries(root) == [] and "not written" in " ".join(auto["notes"])

    code, d, err = _deploy(cli, root)  # not cached: decided again (and the rules shipped again)
    assert code == 0 and d["placement"]["kept"] == "rules", err
    assert [any(a.startswith("--calib=") for a in b) for b in builds(trtexec)] == [True, False, True, False]


def _calibration_passes(monkeypatch) -> list[int]:
    """One entry per calibration pass over the data (counted on edgeq's one calibration function)."""
    from edgeq.quant import quantize

    passes: list[int] = []
    real = quantize.calibrate_and_choose

    def counted(*args, **kwargs):
        passes.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(quantize, "calibrate_and_choose", counted)
    return passes


def test_compare_where_the_implicit_build_fails_calibrates_for_the_rules_and_the_rows_once_each(root, cli,
                                                                                                monkeypatch):
    """The implicit build fails under ``compare --target`` (a recorded 8.6.0 failing log): the decision
    ships the rules' model; the compare's rows reuse the calibration the failed decision made, so the data
    is calibrated twice (the decision's, the rules' deploy), not a third time for the rows, and the failed
    implicit engine is the baseline row, not built a second time."""
    passes = _calibration_passes(monkeypatch)
    trtexec = tune_trtexec(root / "bin", {})
    _workspace(root, _failing_explicit(root / "bin", trtexec, H200 / "yolo_ortfb.explicit.build.log",
                                       implicit=True))
    code, _, err = cli("compare", root / "net.onnx", "--target", "board", "--calib", root / "calib")
    assert len(passes) == 2, err
    # the implicit engine tried once (the decision's), then the rules' model the decision shipped and the
    # compare's explicit-trt and explicit-all rows; the baseline row is the decision's failure
    assert [any(a.startswith("--calib=") for a in b) for b in builds(trtexec)] == [True, False, False, False]
    # the target's failure, said as one (exit 1), not compare --engines' usage error
    assert code == 1 and "the baseline 'implicit' did not build on board" in err, err
    assert "Could not find any implementation" in err and "put a built engine first" not in err


def test_compare_on_a_target_shows_the_decided_engine_and_a_second_compare_reads_the_cache(root, cli,
                                                                                            monkeypatch):
    """``compare --target --calib`` decides by default (``--placement auto``): the decided engine is the
    gated ``explicit`` row beside the implicit baseline (the one the decision built), the rules and
    --placement all, all from one calibration pass over the data (the decision's; counted on edgeq's one
    calibration function). The next compare reads the placement cache: the cached placement's engine, no
    mirror, the baseline built as always (one calibration), and it says "placement from cache"."""
    passes = _calibration_passes(monkeypatch)
    trtexec = tune_trtexec(root / "bin", {})
    _workspace(root, trtexec)
    args = ["compare", root / "net.onnx", "--target", "board", "--calib", root / "calib", "--gate",
            "relative"]  # fmt: skip
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert [e["name"] for e in d["engines"]] == ["implicit", "explicit", "explicit-trt", "explicit-all"]
    assert [g["candidate"] for g in d["gates"]] == ["explicit"] and d["placement"]["kept"] == "explicit"
    assert [any(a.startswith("--calib=") for a in b) for b in builds(trtexec)] == [True, False, False, False]
    first = _qdq(_shipped(trtexec, 1))  # the mirror the target judged
    (entry,) = _entries(root)
    assert len(passes) == 1  # the decision's calibration, reused by the rules' rows
    (compared,) = (root / "runs").glob("compare-net-board-*")
    cache = json.loads(entry.read_text())["calibration_cache"]
    assert (compared / "net.implicit.cache").read_text() == cache  # the baseline row's: the same ranges

    code, out, err = cli(*args)
    assert code == 0, err
    assert len(passes) == 2  # a hit: one calibration, for the baseline and the rules
    text = " ".join(out.split())
    assert "placement from cache" in text and "no implicit engine built" in text
    # the cached placement's engine first (no calibration, no mirror), then the baseline and the rules
    assert [any(a.startswith("--calib=") for a in b) for b in builds(trtexec)][4:] == [False, True, False,
                                                                                       False]  # fmt: skip
    assert _qdq(_shipped(trtexec, 4)) == first and _entries(root) == [entry]


def _tune(cli, root: Path, out: str) -> tuple[int, dict, str]:
    code, text, err = cli("tune", root / "net.onnx", "--target", "board", "--calib", root / "calib",
                          "--min-cosine", "0", "--budget", "1s", "--rounds", "0", "--json", "-o",
                          root / out)  # fmt: skip
    return code, (json.loads(text) if text.strip() else {}), err


def test_tune_starts_from_the_cached_placement_where_auto_decided_it(root, cli):
    """tune's start under its default ``--placement auto``: after a deploy decided the explicit engine for
    this model, data and GPU, it starts from that placement, says "placement from cache" and writes no
    entry of its own."""
    trtexec = tune_trtexec(root / "bin", {})
    _workspace(root, trtexec)
    code, d, err = _deploy(cli, root)
    assert code == 0 and d["placement"]["kept"] == "explicit", err
    deployed = _qdq(_shipped(trtexec, len(builds(trtexec)) - 1))
    (entry,) = _entries(root)
    written = entry.read_text()
    code, t, err = _tune(cli, root, "t2")
    assert code in (0, 1), err
    start = t["start_from"]
    assert start["placement"] == "cache" and start["cache"].startswith("placement from cache (decided ")
    assert "kept explicit): tuning starts from it" in start["cache"]
    # the start candidate is the cached placement: the same tensors carry Q/DQ as in the deployed engine
    assert set(_qdq(_shipped(trtexec, len(builds(trtexec)) - 1))) == set(deployed)
    assert _implicit_builds(trtexec) == 2  # deploy's decision, tune's baseline
    assert _entries(root) == [entry] and entry.read_text() == written


def test_tune_records_the_placement_it_decides_and_deploy_reads_it_from_the_cache(root, cli):
    """tune on a miss builds the implicit engine and its mirror (its start) on the target, so it decides as
    deploy does and writes the entry through deploy's writer: the next deploy of the model to that kind of
    target builds no implicit engine, says "placement from cache" and ships the placement and scales tune
    started from; the next tune starts from the cache too."""
    trtexec = tune_trtexec(root / "bin", {})
    _workspace(root, trtexec)
    code, t, err = _tune(cli, root, "t1")
    assert code in (0, 1), err
    start = t["start_from"]
    assert start["placement"] == "mirror" and start["cache"].startswith("placement cache miss")
    (entry,) = _entries(root)
    assert "decided here: kept explicit (1.01" in start["cache"] and start["cache"].endswith(
        f"written to {entry}")  # fmt: skip
    e = json.loads(entry.read_text())
    assert e["kept"] == "explicit" and e["evidence"]["target"] == "board" and e["evidence"]["ratio"] >= 0.98
    assert e["evidence"]["relative_gate"]["passed"] and isinstance(e["evidence"]["implicit_build_seconds"],
                                                                    float)  # fmt: skip
    assert Path(e["evidence"]["layers"]["implicit"]).parent.parent == root / "t1" / "runs"
    assert e["calibration_cache"] == next((root / "t1").glob("*.implicit.cache")).read_text()
    assert [any(a.startswith("--calib=") for a in b) for b in builds(trtexec)] == [True, False]
    # tune ran with --rounds 0; what it cached was judged on auto's 3 paired rounds, as deploy judges
    paired = json.loads((root / "t1" / "tune.state.json").read_text())["paired"]
    assert [k.rsplit("|", 1)[1] for k in paired] == ["3"]
    started = _qdq(_shipped(trtexec, 1))  # tune's start: the mirror of its implicit engine
    assert len(started) == 55

    code, d, err = _deploy(cli, root)
    assert code == 0, err
    auto = d["placement"]
    assert auto["from_cache"] and auto["kept"] == "explicit" and auto["cache"]["path"] == str(entry)
    assert any(n.startswith("placement from cache (decided ") and "no implicit engine built" in n
               for n in auto["notes"])  # fmt: skip
    assert _implicit_builds(trtexec) == 1 and len(builds(trtexec)) == 3
    assert _qdq(_shipped(trtexec, 2)) == started  # the same Q/DQ tensors and scales

    code, t, err = _tune(cli, root, "t2")
    assert code in (0, 1), err
    assert t["start_from"]["placement"] == "cache" and _entries(root) == [entry]


def test_a_corrupt_cache_entry_is_ignored_with_a_warning(root, cli):
    """An entry that does not read (here: cut short) is no reason to fail: one warning, the placement is
    decided again and the entry replaced by a whole one."""
    from edgeq.orchestration.placement_cache import PlacementCache, PlacementKey, calibration_digest
    from edgeq.quant.quantize import QuantizeOptions

    trtexec = tune_trtexec(root / "bin", {})
    _workspace(root, trtexec)
    calib = calibration_digest(QuantizeOptions(calib=root / "calib"))  # deploy's defaults
    key = PlacementKey(sha256_file(root / "net.onnx"), calib, "8.6.0", H100["name"], "9.0")
    path = PlacementCache(root / "pc").path(key)
    path.parent.mkdir(parents=True)
    path.write_text('{"format": 1, "key": {"model_sha256": "')
    code, d, err = _deploy(cli, root, "--placement-cache", root / "pc")
    assert code == 0 and "Traceback" not in err, err
    auto = d["placement"]
    assert auto["cache"]["path"] == str(path) and not auto["from_cache"]
    assert auto["cache"]["warning"].startswith(f"placement cache: {path}: unreadable entry ignored")
    assert any(n.startswith("warning: placement cache") for n in auto["notes"])
    assert _implicit_builds(trtexec) == 1  # decided again
    assert json.loads(path.read_text())["key"]["model_sha256"] == key.model_sha256
    assert PlacementCache(root / "pc").get(key).hit


def test_an_explicit_engine_below_the_ratio_ships_the_implicit_engine(root, cli):
    """The mirror's engine times 0.91x implicit (the stand-in slows every engine that quantizes a residual
    skip by 10%): the implicit engine is kept, with the relative gate's failure as the reason."""
    trtexec = tune_trtexec(root / "bin", {SKIP2: 0.1})
    _workspace(root, trtexec)
    code, d, err = _deploy(cli, root)
    assert code == 0, err
    auto = d["placement"]
    # the recorded runs: explicit 2114.07 qps, implicit 2087.33 qps; the explicit one slowed by 1.1
    assert auto["kept"] == "implicit"
    assert auto["evidence"]["ratio"] == pytest.approx(2114.07 / 1.1 / 2087.33, abs=0.005)
    assert "relative gate" in auto["reason"] and "[slower-than-baseline]" in auto["reason"]
    ratio = auto["evidence"]["ratio"]
    assert f"explicit engine ({ratio:.3f}x implicit's throughput) failed" in auto["reason"]
    assert auto["evidence"]["relative_gate"]["passed"] is False and d["relative_gate"] is None
    assert Path(d["run_dir"]) == Path(auto["evidence"]["runs"]["implicit"])
    (entry,) = _entries(root)
    assert json.loads(entry.read_text())["kept"] == "implicit"


@pytest.mark.sshd
def test_fleet_validate_decides_once_per_board_kind(boards, servers, root, cli):
    """Three loopback boards, two kinds (two H100s, one Orin by their target files): the first board of each
    kind decides (one implicit build per kind), every board of a kind gets the same Q/DQ model, fleet.json
    holds each kind's decision and the release bundle carries it with its evidence. (A decision read from
    the cache goes through deploy's path, tested above.)"""
    fleet_targets = []
    stand_ins = {}
    for i, (server, gpu) in enumerate(zip(servers, (H100, H100, ORIN)), start=1):
        name = f"board{i}"
        (root / name).mkdir()
        stand_ins[name] = tune_trtexec(root / name, {})
        t = {"host": server.host, "port": server.port, "user": server.user,
             "identity_file": str(server.identity_file), "known_hosts": str(server.known_hosts),
             "work_dir": str(root / f"remote-{name}"), "python": sys.executable, "tensorrt": "8.6",
             "backend": "trtexec", "trtexec": str(stand_ins[name]), "gpu": gpu,
             "timeouts": {"connect": 10, "command": 60}}  # fmt: skip
        (root / "targets").mkdir(exist_ok=True)
        (root / "targets" / f"{name}.yaml").write_text(yaml.safe_dump(t))
        fleet_targets.append(f"targets/{name}.yaml")
    fleet = root / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"workers": 3, "targets": fleet_targets}))
    args = ("fleet", "validate", root / "net.onnx", "--fleet", fleet, "--calib", root / "calib",
            "--duration", "0", "--iterations", "1", "--json")  # fmt: skip
    code, out, err = cli(*args)
    assert code == 0, err
    res = json.loads(out)
    rows = {r["target"]: r for r in res["targets"]}
    assert all(r["status"] == "passed" for r in rows.values()), rows
    implicit = {n: _implicit_builds(t) for n, t in stand_ins.items()}
    assert implicit["board1"] + implicit["board2"] == 1 and implicit["board3"] == 1  # one decision a kind
    h100 = "board1" if implicit["board1"] else "board2"
    assert rows["board1"]["placement"] == rows["board2"]["placement"]
    # what each kind kept, its ratio, where it was decided and what that cost
    assert re.fullmatch(rf"explicit 1\.01\d*x \(decided on {h100}, implicit build [0-9.]+ s\)",
                        rows["board1"]["placement"]), rows["board1"]["placement"]  # fmt: skip
    assert re.fullmatch(r"explicit 1\.01\d*x \(decided on board3, implicit build [0-9.]+ s\)",
                        rows["board3"]["placement"]), rows["board3"]["placement"]  # fmt: skip
    # the boards of one kind were given the same Q/DQ model (each row's build is that board's last)
    shipped = {n: _qdq(_shipped(t, len(builds(t)) - 1)) for n, t in stand_ins.items()}
    assert shipped["board1"] == shipped["board2"] and len(shipped["board1"]) == 55
    fleet_json = json.loads((Path(res["fleet_dir"]) / "fleet.json").read_text())
    kinds = fleet_json["placements"]
    assert sorted(kinds) == ["sm8.7-trt8.6.0", "sm9.0-trt8.6.0"]
    for k in kinds.values():
        assert k["kept"] == "explicit" and not k["from_cache"] and k["evidence"]["ratio"] >= 0.98
        assert Path(k["evidence"]["layers"]["implicit"]).is_file()
        assert (Path(res["fleet_dir"]) / k["model_file"]).is_file()
    assert len(_entries(root)) == 2
    # the release bundle carries each kind's decision and its evidence (both engines' layer JSON, the ratio)
    bundle = root / "net.tar.gz"
    code, _, err = cli("release", "--from", res["fleet_dir"], "-o", bundle)
    assert code == 0, err
    with tarfile.open(bundle) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
        record = json.load(tar.extractfile("placement/sm9.0-trt8.6.0/placement.json"))
        names = set(tar.getnames())
    assert manifest["placements"]["sm9.0-trt8.6.0"]["kept"] == "explicit"
    assert record["decided_on"] == h100 and record["key"]["gpu"] == H100["name"]
    assert record["evidence"]["ratio"] == kinds["sm9.0-trt8.6.0"]["evidence"]["ratio"]
    assert {f"placement/{k}/{e}.layers.json" for k in kinds for e in ("implicit", "explicit")} <= names
    assert str(root) not in json.dumps(record)  # no machine-local path
    # two kinds, two Q/DQ models: the other kind's model travels beside its placement
    assert any(n.startswith("placement/sm8.7-trt8.6.0/") and n.endswith(".onnx") for n in names)


@pytest.mark.parametrize("quantize", [{"placement": "auto"}, {}], ids=["given", "default"])
def test_a_pipeline_file_with_placement_auto_decides_at_the_targets_stage(root, cli, quantize):
    """``placement: auto`` in a pipeline file, its default with targets and ``calib`` (``placement:
    implicit`` stays refused there): the host stage only cleans and lints, the target decides, and the
    release ships the decided Q/DQ model (one kind: it is the bundle's model) with the decision."""
    trtexec = tune_trtexec(root / "bin", {})
    _workspace(root, trtexec)
    pipeline = root / "p.yaml"
    pipeline.write_text(yaml.safe_dump({
        "model": str(root / "net.onnx"), "calib": str(root / "calib"), "target": "board",
        "quantize": quantize, "profile": {"duration": 0, "iterations": 1},
        "release": {"output": str(root / "p.tar.gz")}}))  # fmt: skip
    code, _, err = cli("run", pipeline, "--json")
    assert code == 0, err
    assert [any(a.startswith("--calib=") for a in b) for b in builds(trtexec)] == [True, False, False]
    with tarfile.open(root / "p.tar.gz") as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
        (shipped,) = [n for n in tar.getnames() if n.startswith("model/")]
        model = onnx.load_from_string(tar.extractfile(shipped).read())
    assert manifest["placements"]["sm9.0-trt8.6.0"]["kept"] == "explicit"
    assert _qdq(model) == _qdq(_shipped(trtexec, 2))  # the bundle's model is the one the board built
    host = json.loads((root / "runs" / "pipeline-p" / "host" / "stages.json").read_text())
    assert {s["name"]: s["status"] for s in host["stages"]}["quantize"] == "skipped"


def test_a_cache_that_cannot_be_read_or_written_is_a_warning_not_a_failure(root, cli):
    """--placement-cache naming a file: the lookup and the write each say so once; the deploy goes on
    (here the explicit build fails too, so the implicit engine is shipped, and nothing is cached)."""
    trtexec = tune_trtexec(root / "bin", {})
    _workspace(root, _failing_explicit(root / "bin", trtexec, H200 / "yolo_ortfb.explicit.build.log"))
    blocker = root / "not-a-dir"
    blocker.write_text("x")
    code, d, err = _deploy(cli, root, "--placement-cache", blocker)
    assert code == 0 and "Traceback" not in err, err
    cache = d["placement"]["cache"]
    assert cache["warning"].startswith("placement cache: ") and "ignored" in cache["warning"]
    written = cache["write_warning"]
    assert written.startswith("placement cache: cannot write") and written.endswith("not cached")
    assert blocker.read_text() == "x" and d["placement"]["kept"] == "implicit"


def test_auto_where_nothing_decides_it_is_one_line_exit_2(root, cli):
    """``auto`` needs a target to decide: quantize refuses it in one line, as fleet validate refuses
    ``implicit`` (per target only), before any work."""
    trtexec = tune_trtexec(root / "bin", {})
    _workspace(root, trtexec)
    (root / "fleet.yaml").write_text("targets: [targets/board.yaml]\n")
    model, calib = root / "net.onnx", root / "calib"
    cases = [
        (["quantize", model, "--calib", calib, "--placement", "auto"], "--placement auto"),
        (["fleet", "validate", model, "--fleet", root / "fleet.yaml", "--calib", calib, "--placement",
          "implicit"], "implicit is per target"),
    ]  # fmt: skip
    before = sorted(p.name for p in root.iterdir())
    for args, said in cases:
        code, out, err = cli(*args)
        assert code == 2 and "Traceback" not in err and said in " ".join(err.split()), (args, out, err)
    assert sorted(p.name for p in root.iterdir()) == before and not builds(trtexec)
