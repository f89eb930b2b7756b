"""Bad inputs and hostile outputs through the real CLI: one clear line, exit 2, no traceback, the input
untouched, no partial outputs (a red-team pass found each of these)."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from edgeq import zoo


def _errors(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("error:")]


def _relu(shape: list[int]) -> onnx.ModelProto:
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "y")]
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [vi[0]], [vi[1]])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _files(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


# -- an input that announces a huge shape ------------------------------------------------------------
@pytest.mark.parametrize("command", [("clean",), ("quantize", "--synthetic", "2")])
def test_huge_announced_shape_is_one_line_naming_input_and_size(tmp_path: Path, cli, command) -> None:
    src = tmp_path / "huge.onnx"
    src.write_bytes(_relu([1_000_000_000, 3, 224, 224]).SerializeToString())
    before = src.read_bytes()
    code, out, err = cli(*command, src)
    (line,) = _errors(err)
    assert code == 2 and "Traceback" not in out + err
    assert "input 'x'" in line and "1000000000x3x224x224" in line and "TiB" in line
    assert "make_dynamic_shape_fixed --input_name x" in line  # how to give it a real shape
    assert src.read_bytes() == before and _files(tmp_path) == {"huge.onnx"}


def test_real_sized_input_still_verifies(tmp_path: Path, cli) -> None:
    """The limit is on made-up data, not on models: a real-sized input (64 MiB) is verified as before."""
    src = tmp_path / "big.onnx"
    src.write_bytes(_relu([16, 4, 512, 512]).SerializeToString())
    code, _, err = cli("clean", src)
    assert code == 0, err
    assert (tmp_path / "big.clean.onnx").exists()


# -- report on deeply nested JSON ----------------------------------------------------------------------
def test_report_on_deeply_nested_json_is_one_line(tmp_path: Path, cli) -> None:
    deep = tmp_path / "layers.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    code, out, err = cli("report", deep)
    (line,) = _errors(err)
    assert code == 2 and "Traceback" not in out + err
    assert str(deep) in line and "nested too deeply" in line


# -- -o naming something that is not a regular file ----------------------------------------------------
def _special_files(tmp_path: Path) -> list[Path]:
    fifo = tmp_path / "fifo.onnx"
    os.mkfifo(fifo)
    made = [fifo]
    if os.geteuid() == 0:  # a device node of our own (/dev/null's numbers): never touch /dev itself
        node = tmp_path / "null.onnx"
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        made.append(node)
    return made


@pytest.mark.parametrize(
    "command",
    [("clean", "-o"), ("quantize", "--synthetic", "2", "-o"), ("report", "--html")],
    ids=["clean", "quantize", "report-html"],
)
def test_output_that_is_a_fifo_or_device_is_refused_before_any_work(tmp_path: Path, cli, command) -> None:
    src = tmp_path / "m.onnx"
    src.write_bytes(_relu([1, 4]).SerializeToString())
    if command[0] == "report":
        src = Path(__file__).parent / "fixtures" / "trt86-h200" / "r50b64.implicit.layers.json"
        assert src.is_file()
    for special in _special_files(tmp_path):
        kind = stat.S_IFMT(special.lstat().st_mode)
        before = _files(tmp_path)
        code, out, err = cli(command[0], src, *command[1:], special)
        (line,) = _errors(err)
        assert code == 2 and "Traceback" not in out + err
        assert str(special) in line and "only new or regular files" in line
        assert stat.S_IFMT(special.lstat().st_mode) == kind  # still the FIFO / device node
        assert _files(tmp_path) == before  # nothing written beside it


# -- a full disk in the middle of quantize: all outputs or none -------------------------------------
def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                           capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


@pytest.mark.parametrize("disk", ["tmpfs", "injected"])
def test_quantize_on_a_full_disk_leaves_no_output(tmp_path: Path, cli, monkeypatch, disk) -> None:
    """A 108 KiB tmpfs takes the cache and the FP32 model (~92 KiB) but not the INT8 model after them.
    Where this machine cannot mount (CI without the rights), ENOSPC is raised by the model writer
    instead, on the same write."""
    src = tmp_path / "r.onnx"
    onnx.save(zoo.build("resnet"), str(src))
    full = tmp_path / "full"
    if disk == "tmpfs":
        if not _mount_tmpfs(full, "108k"):
            pytest.skip("cannot mount a tmpfs here (the injected variant covers the same path)")
    else:
        full.mkdir()
        from edgeq.graph import io

        real, calls = io._save, []

        def enospc_on_second(model, path, **kw):
            calls.append(path)
            if len(calls) == 2:  # the FP32 model is written, the INT8 model is not
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            return real(model, path, **kw)

        monkeypatch.setattr(io, "_save", enospc_on_second)
    try:
        code, out, err = cli("quantize", src, "--synthetic", "4", "-o", full / "r.int8.onnx")
        (line,) = _errors(err)
        assert code == 2 and "Traceback" not in out + err and "No space left on device" in line
        assert _files(full) == set()  # no .cache, no .fp32.onnx, no staging directory
        assert _files(tmp_path) == {"r.onnx", "full"}
        code, _, err = cli("quantize", src, "--synthetic", "4", "-o", tmp_path / "ok" / "r.int8.onnx")
        assert code == 0, err  # the same run where there is room: all four
        assert _files(tmp_path / "ok") == {"r.int8.onnx", "r.int8.cache", "r.int8.fp32.onnx", "r.int8.json"}
    finally:
        if disk == "tmpfs":
            subprocess.run(["umount", str(full)], capture_output=True, timeout=20)


# -- an output that names a directory: refused before any work ----------------------------------------
@pytest.mark.parametrize("command", [("clean",), ("quantize", "--synthetic", "2")], ids=["clean", "quantize"])
@pytest.mark.parametrize("existing", [True, False], ids=["existing-dir", "new-dir"])
def test_output_naming_a_directory_is_refused_before_any_work(tmp_path: Path, cli, command, existing) -> None:
    """``-o out/`` names a directory, whether or not it exists yet: one line, exit 2, before the clean
    runs (no stage finished), and never a file called ``out`` (Path drops the slash)."""
    src = tmp_path / "m.onnx"
    src.write_bytes(_relu([1, 4]).SerializeToString())
    if existing:
        (tmp_path / "out").mkdir()
    before = _files(tmp_path)
    code, out, err = cli(*command, src, "-o", f"{tmp_path / 'out'}{os.sep}")
    (line,) = _errors(err)
    assert code == 2 and "Traceback" not in out + err
    assert "directory" in line and "out" in line
    assert "done" not in err  # no stage ran: the output was checked first
    assert _files(tmp_path) == before and (not existing or _files(tmp_path / "out") == set())


# -- every output of every command: one check, before any work (issue 43.1) --------------------------------
def _output_case(tmp_path: Path, case: str) -> list[str]:
    """The command line of ``case``, its one output naming the directory ``newdir/`` (``newdir`` for a
    directory output), with what it reads made here. Its board (a fleet's, a pipeline's) is a 127.0.0.1
    port nothing listens on: a command that got as far as connecting has done its work."""
    import yaml
    from fleet_helpers import FIXTURES, make_bundle, qdq_model

    model = qdq_model(tmp_path / "m.onnx")
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "b1.yaml").write_text(yaml.safe_dump({
        "host": "127.0.0.1", "port": _closed_port(), "user": "me", "use_agent": True,
        "known_hosts": str(tmp_path / "kh"), "tensorrt": "8.6", "backend": "trtexec"}))  # fmt: skip
    (tmp_path / "fleet.yaml").write_text("targets: [targets/b1.yaml]\n")
    layers = [str(FIXTURES / f"{e}.layers.json") for e in ("resnet50.implicit", "resnet50_ortfb.explicit")]
    if case == "release -o":
        make_bundle(tmp_path, "v1", created="2026-01-01T00:00:00Z", engine_mib=1)
        return ["release", "--from", str(tmp_path / "fleet-v1"), "-o", "newdir/"]
    if case == "fleet validate --junit":
        return ["fleet", "validate", str(model), "--fleet", "fleet.yaml", "--junit", "newdir/"]
    if case == "fleet validate --runs-dir":
        return ["fleet", "validate", str(model), "--fleet", "fleet.yaml", "--runs-dir", "newdir"]
    if case == "report --html":
        return ["report", layers[0], "--html", "newdir/"]
    if case == "compare --html":
        return ["compare", "--engines", *layers, "--html", "newdir/"]
    if case == "quantize --cache":
        onnx.save(zoo.resnet_like(size=32, width=8), str(tmp_path / "f.onnx"))
        return ["quantize", str(tmp_path / "f.onnx"), "--synthetic", "2", "--cache", "newdir/"]
    assert case == "run: release output"
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"model": str(model), "fleet": "fleet.yaml",
                                                     "release": {"output": "newdir/"}}))
    return ["run", "p.yaml"]


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


OUTPUT_CASES = ["release -o", "fleet validate --junit", "fleet validate --runs-dir", "report --html",
                "compare --html", "quantize --cache", "run: release output"]


@pytest.mark.parametrize("case", OUTPUT_CASES)
def test_every_output_is_checked_before_any_work(tmp_path: Path, cli, monkeypatch, no_backoff, case) -> None:
    """A trailing '/' was refused by clean and quantize -o only: release -o nd2/ "wrote nd2", fleet validate
    --junit newdir/ ran the whole fleet and then overwrote the file newdir. Every output goes through the
    one check (edgeq.fs.output_file / output_dir) as the command line is read: one line, exit 2, nothing
    run, nothing written, the file already called newdir untouched."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    argv = _output_case(tmp_path, case)
    (tmp_path / "newdir").write_bytes(b"an earlier bundle")
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    code, out, err = cli(*argv)
    (line,) = _errors(err)
    assert code == 2 and "Traceback" not in out + err, (out, err)
    assert "newdir" in line and "directory" in line, line
    assert "done" not in err and "wrote" not in out  # no stage ran, nothing was written
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before
    assert (tmp_path / "newdir").read_bytes() == b"an earlier bundle"


def test_a_default_output_directory_is_checked_only_where_it_is_used(tmp_path: Path, cli, monkeypatch):
    """The one check runs on what the user typed: a file called ``runs`` where the default ``--runs-dir``
    would go does not stop ``compare --engines``, which never writes there; typed, it is refused."""
    from fleet_helpers import FIXTURES

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("not a directory")
    layers = [FIXTURES / f"{e}.layers.json" for e in ("resnet50.implicit", "resnet50_ortfb.explicit")]
    assert cli("compare", "--engines", *layers)[0] == 0
    code, _, err = cli("compare", "--engines", *layers, "--runs-dir", "runs")
    (line,) = _errors(err)
    assert code == 2 and "runs: is a file, not a directory" in line


# -- Ctrl-C: one "interrupted" line, exit 130, no outputs -------------------------------------------------
def test_ctrl_c_during_quantize_says_interrupted(tmp_path: Path) -> None:
    """A real SIGINT to a real ``edgeq quantize`` while it calibrates: typer alone exits 130 silently."""
    import signal
    import sys

    src = tmp_path / "r.onnx"
    onnx.save(zoo.build("resnet"), str(src))
    argv = [sys.executable, "-c", "from edgeq.cli import main; main()", "quantize", str(src),
            "--synthetic", "100000", "-o", str(tmp_path / "r.int8.onnx")]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr is not None
        first = p.stderr.readline()  # "clean: done": the model is cleaned, calibration has begun
        assert "clean: done" in first, first
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, (out, err)
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err
    assert _files(tmp_path) == {"r.onnx"}  # nothing written, no staging left
