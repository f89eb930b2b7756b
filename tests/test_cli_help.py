"""Every command's --help fits one screen (at most 40 lines at 100 columns) and shows every option whole:
rule text lives in 'edgeq rules' and edgeq/docs/trt86-rules.md, not in the help."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer

from edgeq.cli import app

WIDTH, SCREEN = 100, 40


def _commands() -> list[tuple[list[str], Any]]:
    """Every command path under the root, groups included (``[]`` is the root itself)."""
    found: list[tuple[list[str], Any]] = []

    def walk(path: list[str], cmd: Any) -> None:
        found.append((path, cmd))
        for name, sub in getattr(cmd, "commands", {}).items():  # a group's commands
            walk([*path, name], sub)

    walk([], typer.main.get_command(app))
    return found


COMMANDS = _commands()


def test_every_command_is_checked() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"clean", "lint", "quantize", "report", "compare", "deploy", "tune", "targets check",
            "fleet validate", "release create", "run", "rules", "demo"} <= names  # fmt: skip


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=[" ".join(p) or "edgeq" for p, _ in COMMANDS])
def test_help_fits_a_screen_and_shows_every_option_whole(path: list[str], cli, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    monkeypatch.delenv("TERMINAL_WIDTH", raising=False)
    code, out, err = cli(*path, "--help")
    assert code == 0, err
    lines = out.rstrip("\n").splitlines()
    assert max(len(line) for line in lines) <= WIDTH  # rendered at the width asked for
    assert len(lines) <= SCREEN, f"edgeq {' '.join(path)} --help is {len(lines)} lines:\n{out}"
    assert "…" not in out, out  # nothing cut short
    cmd = dict((tuple(p), c) for p, c in COMMANDS)[tuple(path)]
    for param in cmd.params:
        for name in (*param.opts, *param.secondary_opts):
            if name.startswith("--"):
                assert name in out, f"{name} missing from 'edgeq {' '.join(path)} --help'"


# Options of one name that mean a different thing per command: each command's own output, compare's
# extra FP16 build beside deploy's FP16 fallback, the relative gate's ratio (candidate / baseline)
# beside release install's (a board's measured qps / the bundle's recorded qps), and quantize's engine
# (an earlier deploy's, as evidence) beside the fleet commands' (who runs the boards: native or ansible).
OWN_MEANING = {"--output", "--fp16", "--min-ratio", "--engine"}


def test_an_option_many_commands_take_is_declared_once() -> None:
    """--calibrator, --calib, --target, --gate ...: one declaration (flag, type, help) everywhere. The panel
    may differ only where a command moves a shared option with ``options.in_panel`` to fit one screen."""
    seen: dict[str, set[tuple[str, str]]] = {}
    for _, cmd in COMMANDS:
        for param in getattr(cmd, "params", []):
            for name in param.opts:
                if name.startswith("--") and name != "--help":
                    kind = param.bare_type()
                    seen.setdefault(name, set()).add((param.help or "", kind))
    shared = {n: d for n, d in seen.items() if n not in OWN_MEANING}
    assert {"--calibrator", "--calib", "--target", "--gate", "--json"} <= set(shared)
    assert {n: d for n, d in shared.items() if len(d) > 1} == {}


# typer's type labels and Python's type names: what a help must not show a TensorRT user
TYPE_NAMES = re.compile(
    r"<(?:int|integer|float|str|text|path|bool|boolean|list|tuple|dict|choice|file|filename|uuid)\b[^>]*>"
    r"|\b(?:list|tuple|dict|Optional|Union)\[|\bPath\]",
    re.IGNORECASE,
)


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=[" ".join(p) or "edgeq" for p, _ in COMMANDS])
def test_help_shows_no_python_type_names(path: list[str], cli, monkeypatch) -> None:
    """``--verbose -v <int>``, ``PATH... <list[Path]>``, ``--atol <float>``: every command's help, walked."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    code, out, err = cli(*path, "--help")
    assert code == 0, err
    assert TYPE_NAMES.findall(out) == [], out


def test_verbose_is_a_count(cli, monkeypatch) -> None:
    """-v, -vv: a flag repeated, as its help says; no number after it."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    _, out, _ = cli("--help")
    (line,) = [ln for ln in out.splitlines() if "--verbose" in ln]
    assert "-vv" in line and "<" not in line and "[default" not in line
    code, _, err = cli("-vv", "rules", "qdq-uint8")
    assert code == 0, err
    code, _, err = cli("-v", "2", "rules")  # a number after it: the usage error says what -v is
    assert code == 2 and "-v takes no number" in err and "-vv debug" in err


def test_verbose_may_follow_the_command_name(tmp_path, cli, monkeypatch) -> None:
    """Issue 43.10: ``edgeq lint -v MODEL`` was refused ("No such option: -v") while ``edgeq -v lint`` worked:
    -v/-vv/--verbose mean the same wherever they stand (before a ``--``)."""
    import logging

    import onnx
    from onnx import TensorProto, helper

    paramiko_log = logging.getLogger("paramiko")
    monkeypatch.setattr(paramiko_log, "level", paramiko_log.level)  # -vv turns it up: put back after

    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("x", "y")]
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [vi[0]], [vi[1]])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(model))
    quiet = cli("lint", model)
    assert quiet[0] == 0, quiet
    for argv in (("lint", "-v", model), ("lint", model, "-vv"), ("lint", "--verbose", model),
                 ("-v", "lint", model), ("rules", "gate", "-v")):  # fmt: skip
        code, out, err = cli(*argv)
        assert code == 0 and "No such option" not in err, (argv, err)
        if argv[0] != "rules":
            assert out == quiet[1], argv
