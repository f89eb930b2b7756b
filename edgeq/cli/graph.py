"""``edgeq clean`` and ``edgeq lint`` (``edgeq.graph``): the ONNX model itself, before any GPU."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from edgeq.cli.app import app
from edgeq.cli.options import InputShapesOpt, Json
from edgeq.cli.output import (
    EXIT_CHECK_FAILED,
    EXIT_CODES_HELP,
    EXIT_OK,
    code_for,
    out,
    print_json,
    print_table,
    progress_display,
    render_findings,
)
from edgeq.findings import Level
from edgeq.fs import output_file
from edgeq.text import plural


def _clean_help() -> str:
    from edgeq.graph.passes import PASSES  # stdlib-only at import time: --help stays instant

    return (
        "Make an ONNX model fit TensorRT 8.6's parser (opset <= 17, IR <= 8, int8 symmetric Q/DQ, float "
        "biases, no no-op nodes) and check it did no harm.\n\n"
        "Writes <name>.clean.onnx (-o to choose); the input is never modified. What cannot be fixed exactly "
        "is an error finding (the model is still written, exit 1). --verify (default) runs both models in "
        "onnxruntime on the same random inputs (dynamic inputs at --shapes, else at the size the model's "
        "metadata gives); beyond tolerance nothing is written (exit 1).\n\n"
        f"Passes, in order (--skip NAME): {', '.join(p.name for p in PASSES)}.\n\n{EXIT_CODES_HELP}"
    )


def _render_changes(changes: Sequence[Any]) -> None:
    from edgeq.graph.passes import PASS_NAMES

    if not changes:
        out.print("[green]nothing to change[/]: the model already fits")
        return
    t = Table(title="Changes", expand=False)
    t.add_column("pass", style="bold", no_wrap=True)
    t.add_column("changes", overflow="fold")
    t.add_column("nodes", overflow="fold", max_width=48, style="dim")
    for name in PASS_NAMES:
        mine = [c for c in changes if c.pass_name == name]
        for i, c in enumerate(mine):
            nodes = ", ".join(c.nodes[:3]) + (f" (+{len(c.nodes) - 3})" if len(c.nodes) > 3 else "")
            last = i == len(mine) - 1
            t.add_row(name if i == 0 else "", escape(c.message), escape(nodes), end_section=last)
    print_table(t, drop=("nodes",))


@app.command("clean", help=_clean_help(), short_help="Make an ONNX model parse and fuse under TensorRT 8.6.")
def clean_cmd(
    model: Path = typer.Argument(..., help="The ONNX model (with its external data beside it)."),
    output: Optional[Path] = typer.Option(
        None, "-o", "--output", metavar="PATH", parser=output_file,
        help="The cleaned model \\[default: <name>.clean.onnx]."
    ),
    opset: int = typer.Option(
        17, "--opset", metavar="N", help="Highest opset (7-17 for 8.6); higher ones are converted."
    ),
    verify: bool = typer.Option(True, "--verify/--no-verify", help="Compare input and output (onnxruntime)."),
    atol: float = typer.Option(1e-4, "--atol", metavar="TOL", help="Absolute tolerance for --verify."),
    rtol: float = typer.Option(1e-3, "--rtol", metavar="TOL", help="Relative tolerance for --verify."),
    skip: Optional[list[str]] = typer.Option(
        None, "--skip", metavar="PASS", help="Do not run this pass (repeatable; the passes above)."
    ),
    torch_qint8: bool = typer.Option(
        False, "--torch-qint8", help="Repair PyTorch's qint8 export: the uint8 zero-points of its qint8 "
        "tensors read back as int8, what PyTorch computed ('edgeq rules qdq-torch-qint8')."
    ),
    shapes: InputShapesOpt = "",
    json_out: Json = False,
) -> int:
    from edgeq.graph.clean import CleanOptions, clean_file
    from edgeq.graph.io import opset_of

    options = CleanOptions(
        opset=opset, verify=verify, atol=atol, rtol=rtol, skip=tuple(skip or ()), torch_qint8=torch_qint8,
        shapes=shapes,
    )
    with progress_display(enabled=not json_out) as progress:
        result, dest = clean_file(model, options, output=output, progress=progress)
    verified = result.verification is None or bool(result.verification)
    code = code_for(result.ok)
    if json_out:
        written = str(dest) if verified else None
        print_json({"input": str(model), "output": written, "exit_code": code, **result.to_dict()})
        return code
    _render_changes(result.changes)
    if result.findings:
        render_findings(result.findings, title="Still unfit for TensorRT 8.6")
    if result.verification is not None:
        style = "green" if verified else "bold red"
        out.print(f"verify (onnxruntime, same random inputs): [{style}]{escape(str(result.verification))}[/]")
    if verified:
        versions = f"opset {opset_of(result.model)}, IR {result.model.ir_version}"
        out.print(f"wrote [bold]{escape(str(dest))}[/] ({versions})")
    else:
        out.print(
            "[bold red]not written[/]: the cleaned model does not match the input within tolerance "
            "(raise --atol/--rtol, --skip the pass at fault, or --no-verify to write it anyway)"
        )
    return code


class FailOn(str, Enum):
    """The lowest finding level that makes ``edgeq lint`` exit 1."""

    error = "error"
    warning = "warning"
    info = "info"
    never = "never"


_LINT_HELP = (
    "Check an ONNX model against what TensorRT 8.6 parses, builds and fuses, without TensorRT.\n\n"
    "Each finding names the nodes, a one-line fix and the rule's source; 'edgeq rules' lists the rule ids "
    "(for --rule) and 'edgeq rules ID' shows one with its evidence. Levels: error = 8.6 will not parse or "
    "build it; warning = it builds but fuses less or runs slower; info = worth knowing. --fail-on warning "
    "(default) fails on fusion breakers too, as CI should; --fail-on error only on what will not build."
    f"\n\n{EXIT_CODES_HELP}"
)


@app.command("lint", help=_LINT_HELP, short_help="What TensorRT 8.6 will refuse or not fuse, before any GPU.")
def lint_cmd(
    model: Path = typer.Argument(..., help="The ONNX model (with its external data beside it)."),
    trt: str = typer.Option(
        "8.6", "--trt", metavar="VERSION", help="TensorRT version to check against (supported: 8.6)."
    ),
    json_out: Json = False,
    fail_on: FailOn = typer.Option(
        FailOn.warning, "--fail-on", metavar="LEVEL", case_sensitive=False,
        help="Exit 1 on a finding at this level or above: error, warning, info or never."
    ),
    rule: Optional[list[str]] = typer.Option(
        None, "--rule", metavar="ID", help="Run only this rule (repeatable; ids: 'edgeq rules')."
    ),
    shapes: InputShapesOpt = "",
) -> int:
    from edgeq.graph.io import load_model
    from edgeq.graph.rules import lint_model, normalize_trt, select_rules, summarize

    version = normalize_trt(trt)  # usage errors before any work
    select_rules(rule)
    findings = lint_model(load_model(model), trt=version, rules=rule, shapes=shapes)
    threshold = -1 if fail_on is FailOn.never else Level(fail_on.value).rank
    failing = [f for f in findings if f.level.rank <= threshold]
    code = EXIT_CHECK_FAILED if failing else EXIT_OK
    summary = {**summarize(findings), "fail_on": fail_on.value, "failing": len(failing), "exit_code": code}
    if json_out:
        print_json({"model": str(model), "trt": version, "findings": [f.to_dict() for f in findings],
                    "summary": summary})
        return code
    render_findings(findings, title=f"TensorRT {version} lint: {escape(model.name)}")
    counts = ", ".join(plural(n, lv) for lv, n in summary["by_level"].items() if n)
    verdict = "[bold red]fail[/]" if failing else "[green]pass[/]"
    out.print(f"{counts or 'no findings'}; {verdict} (--fail-on {fail_on.value})")
    return code
