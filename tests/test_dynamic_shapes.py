"""Models with dynamic input dimensions (a batch of ``N``, a free height and width, as real exports have
them): built with one optimization profile, trtexec's ``--minShapes``/``--optShapes``/``--maxShapes``,
from the flags or else the calibration data's shape, and timed at ``--shapes``.

TensorRT 8.6 refuses to build such a network without a profile ("Network has dynamic or shape inputs, but
no optimization profile has been defined"). Whole deploys run over a real OpenSSH sshd on 127.0.0.1 with
the trtexec stand-in of tests/trtexec_tune.py (recorded TensorRT 8.6 runs; it reads the ONNX it is given),
so what is checked is what reaches trtexec; the Python backend's profile is checked through the same
parser it runs on the target (``edgeq.agent.shapes.profile_shapes``) and through the zipapp itself.
"""

from __future__ import annotations

import html
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from test_agent import agent, run_agent  # noqa: F401 - fixture
from test_deploy import _stages, ssh_server, tiny_model, trtexec_target  # noqa: F401 - fixtures
from test_target_accuracy import SAMPLES, _data
from trtexec_tune import builds, timings, tune_trtexec

from edgeq import zoo
from edgeq.agent import trtexec_backend as tb
from edgeq.agent.shapes import format_shapes, parse_shapes, profile_shapes
from edgeq.errors import EdgeqError
from edgeq.pipeline.shapes import Shapes, resolve_shapes
from edgeq.quant.quantize import QuantizeOptions

H100 = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}


def dynamic_resnet(path: Path, dims: tuple = ("N", 3, "H", "W")) -> Path:
    """The zoo's ResNet-50 at 32x32, exported as real detectors are: symbolic batch, height and width.
    Its graph at width 8 (the recorded engines map onto its names, not its weights)."""
    model = zoo.resnet50(size=32, width=8)
    for d, v in zip(model.graph.input[0].type.tensor_type.shape.dim, dims):
        if isinstance(v, str):
            d.dim_param = v
        else:
            d.dim_value = v
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.save(model, str(path))
    return path


def _calib(root: Path, shape=(1, 3, 32, 32)) -> Path:
    calib = root / "calib"
    calib.mkdir()
    rng = np.random.default_rng(5)
    for i in range(3):
        np.save(calib / f"s{i}.npy", rng.random(shape, dtype=np.float32))
    return calib


def _flag(argv: list[str], flag: str) -> str | None:
    found = [a.split("=", 1)[1] for a in argv if a.startswith(flag + "=")]
    return found[0] if found else None


# -- the syntax and the agent's two backends ---------------------------------------------------------------


def test_trtexec_shape_syntax_reads_back_what_it_writes():
    shapes = [("images", (1, 3, 640, 640)), ("input:0", (2, 10))]
    text = format_shapes(shapes)
    assert text == "images:1x3x640x640,'input:0':2x10"  # a name with ':' is quoted, as trtexec reads it
    assert parse_shapes(text) == shapes
    for bad, why in (("images", "expected name:DxDx"), ("x:1x0", "at least 1"), ("x:1xa", "whole numbers"),
                     ("x:1,x:2", "twice")):  # fmt: skip
        with pytest.raises(ValueError, match=why):
            parse_shapes(bad, "optShapes")


def test_trtexec_build_gets_all_three_shape_flags_and_the_run_gets_shapes():
    argv = tb.build_argv("trtexec", "m.onnx", "m.plan", int8=True, min_shapes="x:1x3x8x8",
                         opt_shapes="x:4x3x8x8", max_shapes="x:8x3x8x8")  # fmt: skip
    given = [a for a in argv if "Shapes=" in a]
    assert given == ["--minShapes=x:1x3x8x8", "--optShapes=x:4x3x8x8", "--maxShapes=x:8x3x8x8"]
    assert not [a for a in tb.build_argv("trtexec", "m.onnx", "m.plan") if "hapes" in a]  # static: none
    with pytest.raises(ValueError, match="--optShapes without --minShapes/--maxShapes"):
        tb.build_argv("trtexec", "m.onnx", "m.plan", opt_shapes="x:1x3x8x8")
    prof = tb.profile_argv("trtexec", "m.plan", None, shapes="x:4x3x8x8")
    assert "--shapes=x:4x3x8x8" in prof and not [a for a in tb.profile_argv("t", "m", None) if "shapes" in a]
    infer = tb.infer_argv("trtexec", "m.plan", [("x", "x.bin")], "out.json", shapes="x:4x3x8x8")
    assert "--shapes=x:4x3x8x8" in infer  # the held-out samples run at the same shape
    assert not [a for a in tb.infer_argv("trtexec", "m.plan", [("x", "x.bin")], "o.json") if "shapes" in a]


def test_the_python_backends_profile_covers_every_dynamic_input_and_checks_the_shapes():
    """What ``trt_build`` hands ``IOptimizationProfile.set_shape`` for the network's parsed inputs."""
    inputs = [("images", (-1, 3, -1, -1)), ("scale", (1, 2))]
    got = profile_shapes(inputs, "images:1x3x32x32", "images:4x3x64x64", "images:8x3x64x64")
    assert got == [("images", (1, 3, 32, 32), (4, 3, 64, 64), (8, 3, 64, 64))]
    cases = [
        (("", "images:1x3x8x8", "images:1x3x8x8"), "no --minShapes for it"),
        (("images:1x3x8x8",) * 2 + ("images:1x3x8",), "does not fit the input's shape"),
        (("images:1x4x8x8",) * 3, "does not fit"),  # 4 channels where the network has 3
        (("images:2x3x8x8", "images:1x3x8x8", "images:2x3x8x8"), "must grow"),
        (("images:1x3x8x8,scale:1x2",) * 3, "whose shape is static"),
        (("images:1x3x8x8,other:1",) * 3, "not an input of the network"),
    ]
    for (lo, mid, hi), why in cases:
        with pytest.raises(ValueError, match=why):
            profile_shapes(inputs, lo, mid, hi)
    assert profile_shapes([("x", (1, 3))], None, None, None) == []  # a static network: no profile


def test_the_python_backend_checks_shape_flags_before_tensorrt(agent, tmp_path):  # noqa: F811
    """Like trtexec: all three build flags or none, in trtexec's syntax; a usage error (exit 2) before
    TensorRT is imported. Valid flags get as far as TensorRT (absent here: stage import)."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    base = ["build", f"--onnx={model}", f"--saveEngine={tmp_path / 'e'}", "--int8"]
    code, obj, _ = run_agent(agent, *base, "--optShapes=x:1x3x8x8")
    assert code == 2 and obj["error"]["stage"] == "usage"
    assert "--minShapes/--maxShapes" in obj["error"]["message"]
    code, obj, _ = run_agent(agent, *base, "--minShapes=x:1x3", "--optShapes=x:1x3", "--maxShapes=x:1xq")
    assert code == 2 and "--maxShapes 'x:1xq'" in obj["error"]["message"]
    shapes = [f"--{f}=x:1x3x8x8" for f in ("minShapes", "optShapes", "maxShapes")]
    code, obj, _ = run_agent(agent, *base, *shapes)
    assert code == 1 and obj["error"]["stage"] == "import"
    engine = tmp_path / "e.plan"
    engine.write_bytes(b"x")
    for command in ("profile", "infer"):
        np.savez(tmp_path / "in.npz", x=np.zeros((1, 1, 3, 8, 8), np.float32))
        files = [f"--loadInputs={tmp_path / 'in.npz'}", f"--exportOutput={tmp_path / 'o.npz'}"]
        more = files if command == "infer" else []
        code, obj, _ = run_agent(agent, command, f"--loadEngine={engine}", *more, "--shapes=x:1xq")
        assert code == 2 and obj["error"]["stage"] == "usage", obj
        code, obj, _ = run_agent(agent, command, f"--loadEngine={engine}", *more, "--shapes=x:1x3x8x8")
        assert code == 1 and obj["error"]["stage"] == "import", obj  # taken: on to TensorRT


# -- the host: which shapes ------------------------------------------------------------------------------


def test_shapes_come_from_the_calibration_data_else_the_flags(tmp_path):
    model = dynamic_resnet(tmp_path / "net.onnx")
    calib = _calib(tmp_path)
    got = resolve_shapes(model, Shapes(), QuantizeOptions(calib=calib))
    assert (got.min, got.opt, got.max) == ("input:1x3x32x32",) * 3 and got.source == "calibration data"
    assert got.build_args() == [f"--{f}=input:1x3x32x32" for f in ("minShapes", "optShapes", "maxShapes")]
    assert got.run_args() == ["--shapes=input:1x3x32x32"]
    assert resolve_shapes(model, got, None) is got  # resolved once, kept by every nested build
    # the flags win over the data; only --optShapes: min and max span it and the data (none: that one shape)
    got = resolve_shapes(model, Shapes(opt="input:4x3x64x64"), QuantizeOptions(calib=calib))
    assert (got.min, got.opt, got.max) == ("input:1x3x32x32", "input:4x3x64x64", "input:4x3x64x64")
    assert got.source == "--optShapes; min/max from the calibration data"
    got = resolve_shapes(model, Shapes(opt="input:4x3x64x64"), QuantizeOptions())
    assert (got.min, got.opt, got.max) == ("input:4x3x64x64",) * 3 and got.source == "--optShapes"
    got = resolve_shapes(model, Shapes("input:1x3x32x32", "input:4x3x64x64", "input:8x3x96x96"))
    assert got.build_args()[2] == "--maxShapes=input:8x3x96x96"
    assert got.run_args() == ["--shapes=input:4x3x64x64"]
    # a static model needs nothing, and takes no flags
    static = tmp_path / "static.onnx"
    onnx.save(zoo.resnet50(size=32, width=8), str(static))
    assert not resolve_shapes(static, Shapes(), QuantizeOptions(calib=calib)).build_args()
    with pytest.raises(EdgeqError, match="whose shape is static"):
        resolve_shapes(static, Shapes(opt="input:1x3x32x32"))


def test_opt_is_the_shape_the_data_has_most_often_where_no_flag_gives_it(tmp_path):
    """TensorRT tunes its kernels for --optShapes and edgeq times the engine there: PP-OCRv4's recogniser
    has 12 of its 32 calibration lines and 18 of its 65 held-out lines at width 320, but a first line at
    another. With no --optShapes, opt is the data's most common shape within the profile (calibration and
    held-out data counted together; the first calibration sample's in a tie, as before); given, it wins."""
    model = dynamic_resnet(tmp_path / "net.onnx")
    calib, held = tmp_path / "calib", tmp_path / "held"
    calib.mkdir()
    held.mkdir()
    rng = np.random.default_rng(4)
    for i, w in enumerate([40, 32, 56, 32]):
        np.save(calib / f"c{i}.npy", rng.random((1, 3, 32, w), dtype=np.float32))
    for i, w in enumerate([32, 48]):
        np.save(held / f"h{i}.npy", rng.random((1, 3, 32, w), dtype=np.float32))
    got = resolve_shapes(model, Shapes(), QuantizeOptions(calib=calib, holdout_data=held))
    assert (got.min, got.opt, got.max) == ("input:1x3x32x32", "input:1x3x32x32", "input:1x3x32x56")
    assert got.run_args() == ["--shapes=input:1x3x32x32"]
    assert got.source == ("the calibration and held-out data's most common shape; min/max from the "
                          "calibration and held-out data")
    q = QuantizeOptions(calib=calib, holdout_data=held)
    got = resolve_shapes(model, Shapes(opt="input:1x3x32x48"), q)
    assert got.opt == "input:1x3x32x48" and got.source.startswith("--optShapes")
    # within the profile only: given bounds that leave out width 32, the first calibration line's stays
    got = resolve_shapes(model, Shapes(min="input:1x3x32x40", max="input:1x3x32x64"),
                         QuantizeOptions(calib=calib, holdout_data=held))  # fmt: skip
    assert got.opt == "input:1x3x32x40" and got.source == "calibration data"


def test_the_profile_reads_array_files_headers_not_their_data(tmp_path):
    """The profile needs every sample's shape, not its values: from .npy/.npz files only their headers are
    read (before, every calibration and held-out sample was read a second time for it). A file whose
    data is cut short after a valid header still gives its shapes, while reading its values fails."""
    from edgeq.quant.data.dataset import calibration_set

    model = dynamic_resnet(tmp_path / "net.onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(5)
    np.save(calib / "a.npy", rng.random((1, 3, 32, 40), dtype=np.float32))
    np.save(calib / "b.npy", rng.random((3, 3, 32, 24), dtype=np.float32))  # a stack of three
    np.save(calib / "c.npy", rng.random((3, 40, 56), dtype=np.float32))  # one sample, no batch dim
    np.savez(calib / "d.npz", input=rng.random((2, 3, 24, 32), dtype=np.float32))
    data = calibration_set(onnx.load(str(model)), calib)
    read = [{n: x.shape for n, x in feed.items()} for feed in data]
    assert list(data.shapes()) == read and len(read) == 7
    cut = calib / "b.npy"
    cut.write_bytes(cut.read_bytes()[:200])  # the header and a few values
    data = calibration_set(onnx.load(str(model)), calib)
    assert list(data.shapes()) == read
    with pytest.raises(EdgeqError):
        list(data)
    got = resolve_shapes(model, Shapes(), QuantizeOptions(calib=calib))
    assert (got.min, got.opt, got.max) == ("input:1x3x24x24", "input:1x3x32x24", "input:1x3x40x56")


def test_the_default_profile_spans_ragged_calibration_and_held_out_data(tmp_path):
    """An OCR recogniser's crops each have their own width (ddddocr's: 55 held-out lines, ~45 widths): with
    no --minShapes/--maxShapes the profile spans every calibration and held-out sample's shape, so each can
    run on the engine; --optShapes stays the first calibration sample's. Flags given win, per flag."""
    model = dynamic_resnet(tmp_path / "net.onnx")
    calib, held = tmp_path / "calib", tmp_path / "held"
    calib.mkdir()
    held.mkdir()
    rng = np.random.default_rng(3)
    for i, (h, w) in enumerate([(32, 40), (32, 24), (40, 56)]):
        np.save(calib / f"c{i}.npy", rng.random((1, 3, h, w), dtype=np.float32))
    for i, (h, w) in enumerate([(24, 48), (32, 72)]):
        np.save(held / f"h{i}.npy", rng.random((1, 3, h, w), dtype=np.float32))
    q = QuantizeOptions(calib=calib, holdout_data=held)
    got = resolve_shapes(model, Shapes(), q)
    assert (got.min, got.opt, got.max) == ("input:1x3x24x24", "input:1x3x32x40", "input:1x3x40x72")
    assert got.source == "calibration data; min/max from the calibration and held-out data"
    assert got.describe() == ("optimization profile min input:1x3x24x24, opt input:1x3x32x40, max "
                              "input:1x3x40x72 (calibration data; min/max from the calibration and held-out "
                              "data)")  # fmt: skip
    assert got.run_args() == ["--shapes=input:1x3x32x40"]  # timed at opt, as before
    # without --holdout DIR the held-out slice is part of --calib: the calibration data's span
    got = resolve_shapes(model, Shapes(), QuantizeOptions(calib=calib))
    assert (got.min, got.max) == ("input:1x3x32x24", "input:1x3x40x56")
    assert got.source == "calibration data; min/max from the calibration data"
    # a flag given wins for its bound; the other still spans the data
    got = resolve_shapes(model, Shapes(max="input:1x3x48x64"), q)
    assert (got.min, got.opt, got.max) == ("input:1x3x24x24", "input:1x3x32x40", "input:1x3x48x64")
    given = Shapes("input:1x3x32x32", "input:1x3x32x40", "input:1x3x64x64")
    got = resolve_shapes(model, given, q)
    assert (got.min, got.max, got.source) == ("input:1x3x32x32", "input:1x3x64x64", "--optShapes")
    with pytest.raises(EdgeqError, match="to --optShapes 1x3x32x40 to --maxShapes 1x3x32x32"):
        resolve_shapes(model, Shapes(max="input:1x3x32x32"), q)


def test_held_out_samples_run_within_the_profiles_bounds_and_the_others_are_said(tmp_path):
    """The range check before any SSH: a sample runs when each of its dynamic dimensions lies within
    [--minShapes, --maxShapes] (bounds included); the others are counted and named by shape; none within
    is one line (exit 2) naming the profile and the samples' shapes."""
    from edgeq.pipeline.accuracy import HeldOutSet, in_profile
    from edgeq.quant.data import calibration_set

    model = dynamic_resnet(tmp_path / "net.onnx")
    held = tmp_path / "held"
    held.mkdir()
    rng = np.random.default_rng(2)
    for i, (h, w) in enumerate([(32, 32), (32, 64), (48, 32), (32, 80), (16, 32)]):
        np.save(held / f"h{i}.npy", rng.random((1, 3, h, w), dtype=np.float32))
    data = HeldOutSet(calibration_set(onnx.load(str(model)), held), "--holdout held")
    shapes = Shapes("input:1x3x32x32", "input:1x3x32x48", "input:1x3x48x64", resolved=True, source="--flags")
    got = in_profile(data, shapes)
    assert [f["input"].shape[2:] for f in got.data] == [(32, 32), (32, 64), (48, 32)]  # bounds included
    assert got.total == 5 and got.not_run == (
        "3 of 5 held-out samples within the engine's profile (--minShapes input:1x3x32x32, --maxShapes "
        "input:1x3x48x64); the other 2 (shapes input:1x3x32x80, input:1x3x16x32) not run")
    wide = Shapes("input:1x3x16x32", "input:1x3x32x48", "input:1x3x48x80", resolved=True, source="data")
    assert in_profile(data, wide) is data  # all within: the set as it is
    assert in_profile(data, Shapes(resolved=True, source="static")) is data
    with pytest.raises(EdgeqError) as e:
        in_profile(data, Shapes(*("input:1x3x24x24",) * 3, resolved=True, source="--flags"))
    assert e.value.exit_code == 2 and str(e.value).startswith(
        "none of the 5 held-out samples (--holdout held) is at the engine's shape input:1x3x24x24 (from "
        "--flags), the shapes it runs at: theirs are input:1x3x32x32")


@pytest.mark.parametrize(("given", "why"), [
    (Shapes(), "input 'input' of net.onnx has dynamic dimensions (?, 3, ?, ?) and no --optShapes for it"),
    (Shapes(opt="images:1x3x32x32"), "--optShapes names 'images', which is not an input of net.onnx"),
    (Shapes(opt="input:1x4x32x32"), "does not fit the input's shape (?, 3, ?, ?)"),
    (Shapes(min="input:2x3x32x32", opt="input:1x3x32x32"), "must grow from --minShapes 2x3x32x32"),
    (Shapes(opt="input:1x3"), "does not fit"),
    (Shapes(max="input:1;3"), "whole numbers"),
])  # fmt: skip
def test_shapes_that_cannot_be_used_are_one_line(tmp_path, given, why):
    model = dynamic_resnet(tmp_path / "net.onnx")
    with pytest.raises(EdgeqError) as e:
        resolve_shapes(model, given, QuantizeOptions())
    assert why in str(e.value) and e.value.exit_code == 2


def test_the_host_and_the_target_say_the_same_of_the_same_shapes(tmp_path):
    """One rule, one message: the host's check of the flags against the ONNX model (before any SSH) and the
    agent's Python backend against the network TensorRT parsed from it (-1 where it is dynamic) say the
    same words for the same shapes."""
    model = dynamic_resnet(tmp_path / "net.onnx")
    network = [("input", (-1, 3, -1, -1))]
    cases = [("input:1x4x32x32",) * 3, ("input:1x3",) * 3,
             ("input:2x3x32x32", "input:1x3x32x32", "input:2x3x32x32"), ("input:1x3x32x32,other:1",) * 3,
             ("", "", "")]  # fmt: skip
    said = set()
    for lo, mid, hi in cases:
        with pytest.raises(EdgeqError) as host:
            resolve_shapes(model, Shapes(lo, mid, hi))
        with pytest.raises(ValueError) as target:
            profile_shapes(network, lo, mid, hi, "net.onnx")
        if not mid:  # the host asks for --optShapes (min and max follow it), trtexec's rule for all three
            assert host.value.message == str(target.value).replace("--minShapes/--optShapes/--maxShapes",
                                                                   "--optShapes")  # fmt: skip
        else:
            assert host.value.message == str(target.value) and host.value.exit_code == 2
        said.add(host.value.message)
    assert len(said) == len(cases)


# -- whole deploys ---------------------------------------------------------------------------------------


def _target(root: Path, trtexec: Path, sshd) -> str:
    t = {"host": sshd.host, "port": sshd.port, "user": sshd.user, "identity_file": str(sshd.identity_file),
         "known_hosts": str(sshd.known_hosts), "work_dir": str(root / "remote"), "python": sys.executable,
         "tensorrt": "8.6", "backend": "trtexec", "trtexec": str(trtexec), "gpu": H100,
         "timeouts": {"connect": 10, "command": 60}}  # fmt: skip
    (root / "targets").mkdir(exist_ok=True)
    (root / "targets" / "board.yaml").write_text(yaml.safe_dump(t))
    return "board"


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "bin").mkdir()
    dynamic_resnet(tmp_path / "net.onnx")
    return tmp_path


@pytest.mark.sshd
@pytest.mark.parametrize("command", ["deploy", "fleet"])
def test_a_dynamic_model_without_shapes_is_refused_before_any_ssh(root, cli, sshd, command):
    trtexec = tune_trtexec(root / "bin", {})
    _target(root, trtexec, sshd)
    if command == "deploy":
        args = ["deploy", root / "net.onnx", "--target", "board"]
    else:
        (root / "fleet.yaml").write_text(yaml.safe_dump({"targets": [{"target": "board"}]}))
        args = ["fleet", "validate", root / "net.onnx", "--fleet", root / "fleet.yaml"]
    code, out, err = cli(*args, "--runs-dir", root / "runs")
    assert code == 2, (out, err)
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert "input 'input' of net.onnx has dynamic dimensions (?, 3, ?, ?) and no --optShapes for it" in line
    # a fix in numbers, not the export's symbolic names (issue 42: "--optShapes images:batchx3xheightxwidth")
    assert "give --optShapes input:1x3x224x224 with the size the model runs at" in line
    assert "or --calib data" in line
    assert "Traceback" not in out + err
    assert not (root / "runs").exists() and not (root / "remote").exists()  # nothing written, no SSH
    assert not Path(str(trtexec) + ".calls.jsonl").exists()


@pytest.mark.sshd
def test_auto_builds_implicit_and_explicit_with_the_calibration_shape_and_the_cache_keeps_it(root, cli, sshd):
    """``--placement auto`` on a dynamic model: the implicit engine, its mirror and (second deploy) the
    cached placement's engine all get the profile of the calibration data's shape, and every timing the
    same ``--shapes``. The flags given win (a bound not given spans the data), and another
    profile is another cache key: TensorRT chooses its tactics, so what implicit runs INT8, at that shape."""
    trtexec = tune_trtexec(root / "bin", {})
    _target(root, trtexec, sshd)
    _calib(root)
    base = ["deploy", root / "net.onnx", "--target", "board", "--calib", root / "calib", "--iterations", "1",
            "--duration", "0"]  # fmt: skip
    code, out, err = cli(*base, "--json")
    assert code == 0, err
    assert json.loads(out)["placement"]["kept"] == "explicit"
    code, out, err = cli(*base)
    assert code == 0, err
    assert "placement from cache" in " ".join(out.split())
    built = builds(trtexec)
    assert [_flag(b, "--calib") is not None for b in built] == [True, False, False]  # implicit, mirror, cache
    for b in built:
        shapes = [_flag(b, f"--{f}") for f in ("minShapes", "optShapes", "maxShapes")]
        assert shapes == ["input:1x3x32x32"] * 3
    runs = timings(trtexec)
    assert len(runs) >= 4 and all(_flag(r, "--shapes") == "input:1x3x32x32" for r in runs)

    code, out, err = cli(*base, "--optShapes", "input:2x3x64x64", "--maxShapes", "input:4x3x64x64", "--json")
    assert code == 0, err
    assert not json.loads(out)["placement"]["from_cache"]  # decided again: implicit built at that profile
    again = builds(trtexec)[3:]
    assert [_flag(b, "--calib") is not None for b in again] == [True, False]
    for b in again:
        shapes = [_flag(b, f"--{f}") for f in ("minShapes", "optShapes", "maxShapes")]
        assert shapes == ["input:1x3x32x32", "input:2x3x64x64", "input:4x3x64x64"]  # min: the data's
    assert _flag(timings(trtexec)[-1], "--shapes") == "input:2x3x64x64"
    assert len(list((root / "cache" / "edgeq" / "placement").glob("*.json"))) == 2


@pytest.mark.sshd
def test_the_held_out_samples_run_at_the_profiles_shape(trtexec_target, cli):  # noqa: F811
    """--holdout on a dynamic model (the recorded trtexec 8.6 runs replayed; the outputs computed by
    onnxruntime at the shapes trtexec was given): the build gets the calibration data's profile, and each
    held-out sample runs with ``--shapes`` at it, so the engine's outputs come back and are scored."""
    from trtexec_replay import calls

    root, _, _, trtexec = trtexec_target()
    model = _dynamic_tiny(root)
    calib, holdout = _data(root)
    code, out, err = cli("deploy", model, "--target", "replay", "--runs-dir", root / "runs", "--placement",
                         "trt", "--calib", calib, "--holdout", holdout, "--gate",
                         "none,accuracy")  # fmt: skip
    assert code == 0, (out, err)
    (run_dir,) = (root / "runs").iterdir()
    assert _stages(run_dir)["accuracy"]["status"] == "ok"
    (build,) = [a for a in calls(trtexec) if any(x.startswith("--onnx=") for x in a)]
    assert _flag(build, "--optShapes") == "input:1x3x16x16"
    (inspect,) = [a for a in calls(trtexec) if any(x.startswith("--exportLayerInfo=") for x in a)
                  and any(x.startswith("--loadEngine=") for x in a)]  # fmt: skip
    assert _flag(inspect, "--shapes") == "input:1x3x16x16" and "--skipInference" not in inspect  # formats
    infers = [a for a in calls(trtexec) if any(x.startswith("--exportOutput=") for x in a)]
    assert len(infers) == SAMPLES and all(_flag(a, "--shapes") == "input:1x3x16x16" for a in infers)
    got = np.load(run_dir / "engine-outputs.npz")["output"]
    assert got.shape == (SAMPLES, 1, 8, 16, 16)
    acc = json.loads((run_dir / "accuracy.json").read_text())
    assert acc["samples"] == SAMPLES and acc["passed"]


def _dynamic_tiny(root: Path) -> Path:
    """test_deploy's tiny model with a free batch, height and width (onnx.helper dims made symbolic)."""
    model = tiny_model(root / "net.onnx")
    m = onnx.load(str(model))
    for vi, dims in ((m.graph.input[0], ("N", 3, "H", "W")), (m.graph.output[0], ("N", 8, "H", "W"))):
        for d, v in zip(vi.type.tensor_type.shape.dim, dims):
            if isinstance(v, str):
                d.dim_param = v
    onnx.save(m, str(model))
    return model


def _other_shapes(holdout: Path) -> None:
    """Held-out samples the engine built at the calibration data's 1x3x16x16 cannot run: 2 wider, 1 taller
    (as an OCR recogniser's crops each have their own width)."""
    rng = np.random.default_rng(11)
    np.save(holdout / "wide.npy", rng.random((2, 3, 16, 24), dtype=np.float32))
    np.save(holdout / "tall.npy", rng.random((1, 3, 24, 16), dtype=np.float32))


@pytest.mark.sshd
def test_held_out_samples_of_every_shape_run_each_at_its_own_and_the_record_says_all_ran(trtexec_target, cli):  # noqa: F811
    """The first real run of ddddocr's recogniser (input width free, each held-out crop its own width;
    TensorRT 8.6 on an H100) ran 1-3 of its 55 held-out lines: only those at the engine's one shape. Now
    the profile spans the calibration and held-out data, the samples travel grouped by shape, each group
    runs with ``--shapes`` at its own, and every sample is scored: outputs as onnxruntime computes them on
    the Q/DQ model for that sample (the stand-in), in the samples' order."""
    import onnxruntime as ort
    from trtexec_replay import calls

    root, _, _, trtexec = trtexec_target()
    model = _dynamic_tiny(root)
    calib, holdout = _data(root)
    _other_shapes(holdout)  # read in file order: held.npy (5 at 16x16), tall.npy (24x16), wide.npy (16x24)
    code, out, err = cli("deploy", model, "--target", "replay", "--runs-dir", root / "runs", "--placement",
                         "trt", "--calib", calib, "--holdout", holdout, "--gate",
                         "none,accuracy")  # fmt: skip
    assert code == 0, (out, err)
    assert "Traceback" not in out + err
    (run_dir,) = (root / "runs").iterdir()
    (build,) = [a for a in calls(trtexec) if any(x.startswith("--onnx=") for x in a)]
    assert [_flag(build, f"--{f}") for f in ("minShapes", "optShapes", "maxShapes")] == [
        "input:1x3x16x16", "input:1x3x16x16", "input:1x3x24x24"]  # fmt: skip
    infers = [a for a in calls(trtexec) if any(x.startswith("--exportOutput=") for x in a)]
    assert [_flag(a, "--shapes") for a in infers] == (["input:1x3x16x16"] * SAMPLES + ["input:1x3x24x16"]
                                                      + ["input:1x3x16x24"] * 2)  # fmt: skip
    held = [*np.load(holdout / "held.npy")[:, None], *np.load(holdout / "tall.npy")[:, None],
            *np.load(holdout / "wide.npy")[:, None]]  # fmt: skip
    with np.load(run_dir / "holdout-inputs.npz") as z:
        assert sorted(z.files) == ["0/input", "1/input", "2/input"]
        np.testing.assert_array_equal(z["2/input"], np.stack(held[6:]))
    session = ort.InferenceSession(str(run_dir / "net.int8.onnx"), providers=["CPUExecutionProvider"])
    with np.load(run_dir / "engine-outputs.npz") as z:
        got = [*z["0/output"], *z["1/output"], *z["2/output"]]
    for x, y in zip(held, got):
        np.testing.assert_allclose(y, session.run(["output"], {"input": x})[0], rtol=1e-5, atol=1e-6)

    acc = json.loads((run_dir / "accuracy.json").read_text())
    assert acc["samples"] == acc["held_out_total"] == SAMPLES + 3 and acc["not_run"] is None and acc["passed"]
    assert len(acc["tensorrt"]["per_sample"]) == len(acc["onnxruntime_qdq"]["per_sample"]) == SAMPLES + 3
    assert acc["tensorrt"]["value"] == pytest.approx(acc["onnxruntime_qdq"]["value"], abs=1e-5)
    assert f"{SAMPLES + 3} held-out samples" in acc["summary"] and "not run" not in out


@pytest.mark.sshd
def test_held_out_samples_outside_a_given_profile_are_left_out_and_the_record_says_so(trtexec_target, cli):  # noqa: F811
    """--maxShapes given (the user's flags win over the data's span): a held-out sample beyond it cannot
    run on the engine. Those within run each at its own shape (the wide ones too), TensorRT, onnxruntime's
    prediction and FP32 on those same ones, and every record of the figure says how many of how many and
    which shapes were not run."""
    from trtexec_replay import calls

    root, _, _, trtexec = trtexec_target()
    model = _dynamic_tiny(root)
    calib, holdout = _data(root)
    _other_shapes(holdout)
    code, out, err = cli("deploy", model, "--target", "replay", "--runs-dir", root / "runs", "--placement",
                         "trt", "--calib", calib, "--holdout", holdout, "--gate", "none,accuracy",
                         "--maxShapes", "input:1x3x16x24")  # fmt: skip
    assert code == 0, (out, err)
    assert "Traceback" not in out + err
    (run_dir,) = (root / "runs").iterdir()
    infers = [a for a in calls(trtexec) if any(x.startswith("--exportOutput=") for x in a)]
    assert [_flag(a, "--shapes") for a in infers] == ["input:1x3x16x16"] * SAMPLES + ["input:1x3x16x24"] * 2
    with np.load(run_dir / "holdout-inputs.npz") as z:
        np.testing.assert_array_equal(z["0/input"], np.load(holdout / "held.npy")[:, None])  # those, in order

    said = (
        "7 of 8 held-out samples within the engine's profile (--minShapes input:1x3x16x16, --maxShapes "
        "input:1x3x16x24); the other 1 (shapes input:1x3x24x16) not run"
    )
    acc = json.loads((run_dir / "accuracy.json").read_text())
    assert acc["samples"] == SAMPLES + 2 and acc["held_out_total"] == SAMPLES + 3 and acc["passed"]
    assert acc["not_run"] == said and said in acc["summary"]
    # the prediction on the same samples as TensorRT (the stand-in computed the Q/DQ model: equal)
    assert len(acc["tensorrt"]["per_sample"]) == len(acc["onnxruntime_qdq"]["per_sample"]) == SAMPLES + 2
    assert acc["tensorrt"]["value"] == pytest.approx(acc["onnxruntime_qdq"]["value"], abs=1e-5)
    assert said in " ".join(out.split())
    assert said in _stages(run_dir)["accuracy"]["summary"]
    assert said in html.unescape((run_dir / "report.html").read_text())
    assert json.loads((run_dir / "report.json").read_text())["accuracy"] == acc


@pytest.mark.sshd
@pytest.mark.parametrize("gate", [[], ["--gate", "none,accuracy"]])
def test_no_held_out_sample_within_a_given_profile_is_refused_before_any_ssh(trtexec_target, cli, gate):  # noqa: F811
    """Not one held-out sample lies within the profile the user pinned: one line naming the engine's
    shape, the samples' own and the fix, exit 2, before a run directory, an SSH session or a build."""
    from trtexec_replay import calls

    root, _, remote, trtexec = trtexec_target()
    model = _dynamic_tiny(root)
    calib, _ = _data(root)
    holdout = root / "other"
    holdout.mkdir()
    _other_shapes(holdout)
    code, out, err = cli("deploy", model, "--target", "replay", "--runs-dir", root / "runs", "--placement",
                         "trt", "--calib", calib, "--holdout", holdout, "--minShapes", "input:1x3x16x16",
                         "--maxShapes", "input:1x3x16x16", *gate)  # fmt: skip
    assert code == 2, (out, err)
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert "none of the 3 held-out samples" in line and "the engine's shape input:1x3x16x16" in line
    assert "input:1x3x16x24" in line and "input:1x3x24x16" in line
    assert "leave --minShapes/--maxShapes out for one that spans the calibration and held-out data" in line
    assert "Traceback" not in out + err
    assert not (root / "runs").exists() and not Path(remote).exists() and calls(trtexec) == []
