"""The edgeq command line: parse arguments, call one library function, render, map to an exit code.

This is the only module that imports typer and rich. Library code raises ``EdgeqError`` for user
problems; they are caught once, in ``run``, and printed as one line (exit 2 unless the error says
otherwise). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from edgeq import __version__
from edgeq.errors import EdgeqError
from edgeq.findings import Finding, Level, ProgressFn

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2

EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 a check failed (lint findings at or above --fail-on, verification beyond tolerance, "
    "a precision gate violated, a target-side failure); 2 usage or input error (bad file, bad option)."
)

app = typer.Typer(
    name="edgeq",
    help="ONNX -> INT8 TensorRT 8.6 engines for Jetson and desktop GPUs, with Q/DQ placed so TensorRT "
    "fuses, and a report proving what the engine runs.\n\n"
    "Start with [bold]edgeq demo[/]. The usual path: edgeq lint model.onnx -> edgeq quantize model.onnx "
    "--calib DIR (cleans first; writes model.int8.onnx) -> edgeq deploy model.int8.onnx --target NAME "
    "(build, profile and gate on the device). edgeq clean fixes a Q/DQ model exported elsewhere; "
    "edgeq report works offline on trtexec layer/profile JSON. Input files are never modified. "
    "'edgeq COMMAND --help' for each.\n\n" + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        out.print(f"edgeq {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More log output (-vv for debug)."),
) -> None:
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if verbose >= 2:
        # The transport keeps paramiko quiet unless its level was set: -vv is the user asking for it.
        logging.getLogger("paramiko").setLevel(logging.DEBUG)


# --------------------------------------------------------------------------------------------------
# Shared rendering
# --------------------------------------------------------------------------------------------------

_LEVEL_STYLE = {Level.ERROR: "bold red", Level.WARNING: "yellow", Level.INFO: "cyan"}


def render_findings(findings: Sequence[Finding], title: str = "Findings", max_per_rule: int = 5) -> None:
    """One row per finding, at most ``max_per_rule`` per rule (a model with 60 SiLUs gives 60 alike
    rows); each rule's source once, below the table, so rows stay short."""
    if not findings:
        out.print("[green]no findings[/]")
        return
    t = Table(title=title, show_lines=True, expand=False)
    t.add_column("level")
    t.add_column("rule", no_wrap=True)
    t.add_column("nodes", overflow="fold", max_width=48)
    t.add_column("problem / fix", overflow="fold", min_width=30)
    sources: dict[str, str] = {}
    per_rule: dict[str, int] = {}
    for f in findings:
        per_rule[f.rule] = per_rule.get(f.rule, 0) + 1
        if per_rule[f.rule] > max_per_rule > 0:
            continue
        shown = [escape(n) for n in f.nodes[:3]]
        nodes = "\n".join(shown) + (f"\n[dim](+{len(f.nodes) - 3} more)[/]" if len(f.nodes) > 3 else "")
        t.add_row(
            f"[{_LEVEL_STYLE[f.level]}]{f.level.value}[/]",
            f.rule,
            nodes,
            f"{escape(f.message)}\n[dim]fix:[/] {escape(f.fix)}",
        )
        sources.setdefault(f.rule, f.source)
    out.print(t)
    hidden = {r: n - max_per_rule for r, n in per_rule.items() if n > max_per_rule > 0}
    if hidden:
        more = ", ".join(f"{n} {r}" for r, n in hidden.items())
        out.print(f"[dim]not shown: {more} (--json lists every finding)[/]")
    out.print("[dim]sources:[/]")
    for rule, source in sources.items():
        out.print(f"  [dim]{rule}: {escape(source)}[/]")


def print_json(obj: Any) -> None:
    """JSON to stdout, unwrapped, so it pipes into jq."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


@contextmanager
def progress_display(enabled: bool = True) -> Iterator[ProgressFn]:
    """A rich progress display fed by the library's ``ProgressFn`` callbacks (on stderr)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not enabled or not err.is_terminal:
        last: dict[str, int] = {}

        def quiet(task: str, done: int, total: Optional[int]) -> None:
            # Non-interactive: one log line when a task starts and when it ends.
            before = last.get(task)
            if before is None or done < before:  # a task starting (again)
                err.print(f"[dim]{escape(task)}...[/]")
                before = -1
            last[task] = done
            if total is not None and done >= total > before:
                err.print(f"[dim]{escape(task)}: done ({done}/{total})[/]")

        yield quiet
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err,
        transient=True,
    ) as p:
        tasks: dict[str, Any] = {}

        def update(task: str, done: int, total: Optional[int]) -> None:
            if task not in tasks:
                tasks[task] = p.add_task(task, total=total)
            p.update(tasks[task], completed=done, total=total)

        yield update


# --------------------------------------------------------------------------------------------------
# edgeq clean  (edgeq.graph)
# --------------------------------------------------------------------------------------------------


def _clean_help() -> str:
    from edgeq.graph.passes import PASSES  # stdlib-only at import time: --help stays instant

    passes = "\n\n".join(f"[bold]{p.name}[/]: {escape(p.summary)}" for p in PASSES)
    return (
        "Make an ONNX model fit TensorRT 8.6's parser: opset <= 17, IR <= 8, int8 symmetric Q/DQ, float "
        "biases, no no-op nodes. The input file is never modified; the result goes to "
        "<name>.clean.onnx unless -o says otherwise. Each pass reports what it changed; what cannot be "
        "fixed exactly is named as an error finding (the model is still written, exit 1). With --verify "
        "(default) both models run in onnxruntime on the same random inputs; beyond tolerance nothing "
        "is written and the exit code is 1.\n\nPasses, in order (skip one with --skip NAME):\n\n"
        f"{passes}\n\n{EXIT_CODES_HELP}"
    )


def _render_changes(changes: Sequence[Any]) -> None:
    from edgeq.graph.passes import PASS_NAMES

    if not changes:
        out.print("[green]nothing to change[/]: the model already fits")
        return
    t = Table(title="Changes", expand=False)
    t.add_column("pass", style="bold")
    t.add_column("changes", overflow="fold")
    t.add_column("nodes", overflow="fold", max_width=48, style="dim")
    for name in PASS_NAMES:
        mine = [c for c in changes if c.pass_name == name]
        for i, c in enumerate(mine):
            nodes = ", ".join(c.nodes[:3]) + (f" (+{len(c.nodes) - 3})" if len(c.nodes) > 3 else "")
            last = i == len(mine) - 1
            t.add_row(name if i == 0 else "", escape(c.message), escape(nodes), end_section=last)
    out.print(t)


@app.command("clean", help=_clean_help())
def clean_cmd(
    model: Path = typer.Argument(..., help="The ONNX model (with its external data beside it)."),
    output: Optional[Path] = typer.Option(
        None, "-o", "--output", help="Where to write the cleaned model \\[default: <name>.clean.onnx]."
    ),
    opset: int = typer.Option(
        17, "--opset", help="Highest opset to allow (7-17 for TensorRT 8.6); higher ones are converted down."
    ),
    verify: bool = typer.Option(
        True, "--verify/--no-verify", help="Compare input and output in onnxruntime on random inputs."
    ),
    atol: float = typer.Option(1e-4, "--atol", help="Absolute tolerance for --verify."),
    rtol: float = typer.Option(1e-3, "--rtol", help="Relative tolerance for --verify."),
    skip: Optional[list[str]] = typer.Option(
        None, "--skip", metavar="PASS", help="Do not run this pass (repeatable; names listed above)."
    ),
    torch_qint8: bool = typer.Option(
        False,
        "--torch-qint8",
        help="The file is PyTorch's export of qint8 tensors: make its uint8 zero-point 0 Q/DQ int8 "
        "zero-point 0, what PyTorch computed (deliberately changes the file's function; verification "
        "then checks everything else). See `edgeq rules qdq-torch-qint8`.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> int:
    from edgeq.fs import check_writable
    from edgeq.graph.clean import CleanOptions, clean_model
    from edgeq.graph.io import default_output, load_model, opset_of, save_model

    dest = output if output is not None else default_output(model, "clean")
    check_writable(dest, inputs=(model,))  # fail before the work, not after it
    options = CleanOptions(
        opset=opset, verify=verify, atol=atol, rtol=rtol, skip=tuple(skip or ()), torch_qint8=torch_qint8
    )
    with progress_display(enabled=not json_out) as progress:
        read: list[Path] = []
        onnx_model = load_model(model, sources=read)
        check_writable(dest, inputs=tuple(read))  # -o onto the input's external data file
        result = clean_model(onnx_model, options, progress)
    verified = result.verification is None or bool(result.verification)
    if verified:
        save_model(result.model, dest)
    errors = [f for f in result.findings if f.level == Level.ERROR]
    code = EXIT_OK if verified and not errors else EXIT_CHECK_FAILED
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


# --------------------------------------------------------------------------------------------------
# edgeq lint  (edgeq.graph)
# --------------------------------------------------------------------------------------------------


class FailOn(str, Enum):
    """The lowest finding level that makes ``edgeq lint`` exit 1."""

    error = "error"
    warning = "warning"
    info = "info"
    never = "never"


def _lint_help() -> str:
    from edgeq.graph.rules import RULES  # stdlib-only at import time: --help stays instant

    rules = "\n\n".join(f"[bold]{r.id}[/] ({r.level.value}): {escape(r.summary)}" for r in RULES)
    return (
        "Check an ONNX model against what TensorRT 8.6 parses, builds and fuses, without TensorRT: "
        "operators and types outside the 8.6 parser's table, opset/IR versions, Q/DQ the parser refuses, "
        "and Q/DQ placements that build but keep layers from fusing. Each finding names the nodes, a "
        "one-line fix and the source of the rule (TensorRT 8.6 documentation, the 8.6 parser, or the "
        "engine fixture that measured it). Levels: error = 8.6 will not parse or build it; warning = "
        "it builds but fuses less or runs slower; info = worth knowing.\n\n"
        "--fail-on sets when the exit code is 1: default [bold]warning[/], because a fusion breaker "
        "costs real speed and CI should see it; use --fail-on error to fail only on what will not build "
        "(e.g. for models with dynamic shapes you give profiles for), or --fail-on never to report only."
        f"\n\nRules (select with --rule ID):\n\n{rules}\n\n{EXIT_CODES_HELP}"
    )


@app.command("lint", help=_lint_help())
def lint_cmd(
    model: Path = typer.Argument(..., help="The ONNX model (with its external data beside it)."),
    trt: str = typer.Option("8.6", "--trt", help="TensorRT version to check against (supported: 8.6)."),
    json_out: bool = typer.Option(False, "--json", help="Print findings and a summary as JSON on stdout."),
    fail_on: FailOn = typer.Option(
        FailOn.warning, "--fail-on", case_sensitive=False, help="Exit 1 on a finding at this level or above."
    ),
    rule: Optional[list[str]] = typer.Option(
        None, "--rule", metavar="ID", help="Run only this rule id (repeatable; ids listed above)."
    ),
) -> int:
    from edgeq.graph.io import load_model
    from edgeq.graph.rules import lint_model, normalize_trt, select_rules, summarize

    version = normalize_trt(trt)  # usage errors before any work
    select_rules(rule)
    findings = lint_model(load_model(model), trt=version, rules=rule)
    threshold = -1 if fail_on is FailOn.never else Level(fail_on.value).rank
    failing = [f for f in findings if f.level.rank <= threshold]
    code = EXIT_CHECK_FAILED if failing else EXIT_OK
    summary = {**summarize(findings), "fail_on": fail_on.value, "failing": len(failing), "exit_code": code}
    if json_out:
        print_json({"model": str(model), "trt": version, "findings": [f.to_dict() for f in findings],
                    "summary": summary})
        return code
    render_findings(findings, title=f"TensorRT {version} lint: {escape(model.name)}")
    counts = ", ".join(f"{n} {lv}" for lv, n in summary["by_level"].items() if n)
    verdict = "[bold red]fail[/]" if failing else "[green]pass[/]"
    out.print(f"{counts or 'no findings'}; {verdict} (--fail-on {fail_on.value})")
    return code


# --------------------------------------------------------------------------------------------------
# edgeq quantize  (edgeq.quant)
# --------------------------------------------------------------------------------------------------


class Calibrator(str, Enum):
    entropy = "entropy"
    max = "max"
    percentile = "percentile"
    mse = "mse"


class Placement(str, Enum):
    trt = "trt"
    all = "all"


def _quantize_help() -> str:
    from edgeq.quant.rules import RULES  # stdlib-only at import time: --help stays instant

    rules = "\n\n".join(f"[bold]{r.id}[/]: {escape(r.description)}" for r in RULES.values())
    return (
        "Quantize a float ONNX model to explicit INT8 (Q/DQ) for TensorRT 8.6, placed so TensorRT fuses, "
        "and write the TensorRT calibration cache (implicit INT8 path) from the same statistics. The "
        "model is cleaned first; the input file is never modified. Writes <name>.int8.onnx and "
        "<name>.int8.cache (with -o X.onnx: X.cache) unless --cache says otherwise, the cleaned FP32 model "
        "the cache's tensor names belong to as <cache name>.fp32.onnx, plus the summary --json prints as "
        "<output name>.json; then checks accuracy: FP32 vs Q/DQ in "
        "onnxruntime on the held-out part of the data (cosine, max abs error, top-1 agreement for "
        "classifiers). --min-cosine makes that a gate (exit 1; the files are still written).\n\n"
        "Explicit engine: trtexec --int8 --onnx=<name>.int8.onnx. Implicit engine: trtexec --int8 "
        "--calib=<name>.int8.cache --onnx=<name>.int8.fp32.onnx (that file, not the original model: "
        "cleaning renames tensors, and the cache is looked up by name).\n\n"
        "Calibration data: --calib DIR of .npy/.npz (one sample per file or stacked) or images "
        "(JPEG, PNG, BMP, WebP, TIFF, PPM/PGM) with --preprocess spec.yaml (resize or resize_shorter + "
        "center_crop, mean/std, scale, layout, channels; see pipelines/preprocess-imagenet.yaml for "
        "torchvision's ImageNet transforms); --synthetic N random samples for demos only.\n\n"
        "--placement trt (default) follows the TensorRT 8.6 rules below; --placement all puts a Q/DQ "
        "on every quantizable tensor as onnxruntime does, for comparison. --overrides FILE.yaml forces "
        "or excludes nodes (keys exclude/force: lists of node names, fnmatch globs or 're:' regexes)."
        f"\n\nPlacement rules (summary shows which rule left each tensor in float):\n\n{rules}"
        f"\n\n{EXIT_CODES_HELP}"
    )


def _render_quantize(result: Any) -> None:
    d = result.to_dict()
    q = d["quantized"]
    title = f"edgeq quantize ({escape(d['placement'])} placement, {escape(d['calibrator'])} calibrator)"
    t = Table(title=title, expand=False)
    t.add_column("what", style="bold")
    t.add_column("count", justify="right")
    t.add_column("notes", overflow="fold")
    t.add_row("activation Q/DQ pairs", str(q["activations"]), "per-tensor int8, zero-point 0")
    t.add_row("weights (int8 + DQ)", str(q["weights"]), "per-channel on the output-channel axis")
    t.add_row("INT8 by commuting", str(q["int8_by_commute"]), "place-commute: Q/DQ move across them")
    t.add_row("shared scale groups", str(q["scale_groups_shared"]), "place-concat-shared-scale")
    t.add_row("left in float", str(d["float"]["count"]), "see below", end_section=True)
    for rule_id, n in d["float"]["by_rule"].items():
        first = d["rules"].get(rule_id, {}).get("description", "").split(". ")[0]
        t.add_row(f"  {rule_id}", str(n), escape(first))
    out.print(t)
    acc = result.accuracy
    if acc is not None:
        a = Table(title=f"Accuracy: FP32 vs Q/DQ in onnxruntime ({acc.samples} held-out samples)")
        for col in ("output", "cosine (mean)", "cosine (worst)", "max abs error", "top-1 agreement"):
            a.add_column(col, justify="left" if col == "output" else "right")
        for o in acc.outputs:
            top1 = f"{o.top1:.1%}" if o.top1 is not None else "-"
            figures = (f"{o.cosine:.6f}", f"{o.min_cosine:.6f}", f"{o.max_abs_error:.4g}", top1)
            a.add_row(escape(o.name), *figures)
        out.print(a)
        if acc.threshold is not None:
            style = "green" if acc else "bold red"
            out.print(f"accuracy gate: [{style}]{escape(str(acc))}[/]")
    for note in d["notes"]:
        err.print(f"[yellow]note:[/] {escape(note)}")
    errors = [f for f in result.clean_findings if f.level == Level.ERROR]
    if errors:
        render_findings(errors, title="Cleaned model: still unfit for TensorRT 8.6")
    out.print(f"wrote [bold]{escape(d['output'])}[/], [bold]{escape(d['cache'])}[/] "
              f"({d['cache_tensors']} tensors in the calibration cache), [bold]{escape(d['fp32_model'])}[/] "
              f"(the FP32 model for the cache: trtexec --int8 --calib --onnx) and "
              f"[bold]{escape(d['summary'])}[/]")


@app.command("quantize", help=_quantize_help())
def quantize_cmd(
    model: Path = typer.Argument(..., help="The float ONNX model (with its external data beside it)."),
    calib: Optional[Path] = typer.Option(None, "--calib", help="Calibration data directory (or one file)."),
    synthetic: Optional[int] = typer.Option(None, "--synthetic", help="Use N random samples (demos only)."),
    output: Optional[Path] = typer.Option(
        None, "-o", "--output", help="Where to write the Q/DQ model \\[default: <name>.int8.onnx]."
    ),
    calibrator: Calibrator = typer.Option(Calibrator.entropy, "--calibrator", case_sensitive=False,
                                          help="How activation ranges are chosen."),
    percentile: float = typer.Option(99.99, "--percentile", help="Percentile for --calibrator percentile."),
    placement: Placement = typer.Option(Placement.trt, "--placement", case_sensitive=False,
                                        help="trt: TensorRT 8.6 rules; all: every quantizable tensor."),
    overrides: Optional[Path] = typer.Option(None, "--overrides", help="YAML file forcing/excluding nodes."),
    preprocess: Optional[Path] = typer.Option(
        None, "--preprocess", help="YAML preprocessing for images (pipelines/preprocess-imagenet.yaml)."
    ),
    cache: Optional[Path] = typer.Option(
        None, "--cache",
        help="Where to write the TensorRT calibration cache \\[default: -o's name with .cache].",
    ),
    holdout: float = typer.Option(0.2, "--holdout", help="Fraction of the data kept for the accuracy check."),
    min_cosine: Optional[float] = typer.Option(
        None, "--min-cosine", help="Fail (exit 1) when FP32 vs Q/DQ cosine similarity is below this."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
) -> int:
    from edgeq.errors import QuantError
    from edgeq.quant.overrides import load_overrides
    from edgeq.quant.quantize import QuantizeOptions, quantize_file

    if (calib is None) == (synthetic is None):
        raise QuantError("give calibration data: --calib DIR or --synthetic N (one of them)")
    options = QuantizeOptions(
        calibrator=calibrator.value, percentile=percentile, placement=placement.value,
        overrides=load_overrides(overrides) if overrides is not None else None,
        holdout=holdout, min_cosine=min_cosine, cache_path=cache,
    )
    with progress_display(enabled=not json_out) as progress:
        result = quantize_file(model, options, calib=calib, synthetic=synthetic, preprocess=preprocess,
                               output=output, progress=progress)
    code = EXIT_OK if result.ok else EXIT_CHECK_FAILED
    if json_out:
        print_json({**result.to_dict(), "exit_code": code})
        return code
    _render_quantize(result)
    return code

# --------------------------------------------------------------------------------------------------
# edgeq report  (edgeq.report)
# --------------------------------------------------------------------------------------------------

_REPORT_HELP = (
    "Show what a TensorRT engine runs, from its layer information (trtexec --exportLayerInfo with "
    "--profilingVerbosity=detailed, or IEngineInspector JSON): every layer classified (compute, weights, "
    "reformat, no-op) with its precision, format and the ONNX nodes fused into it; per-layer times with "
    "--profile (trtexec --exportProfile or the edgeq agent's profile); the ONNX graph mapped back with "
    "--onnx. Then applies a gate: int8 (default) fails when a compute layer between the first Q and the "
    "last DQ runs FP16/FP32 or an interior Reformat changes precision or layout (same-format copies, "
    "TensorRT's Concat, are reported; --forbid-copies fails them too); --require-fusion also fails on "
    "residual Adds left unfused; --gate none only reports. Works offline on files.\n\n" + EXIT_CODES_HELP
)
_PRECISION_STYLE = {"INT8": "green", "FP16": "yellow", "BF16": "yellow", "FP32": "red", "INT32": "magenta"}


def _visible(text: str) -> str:
    """Engine names carry raw control characters; never send them to a terminal."""
    import re  # stdlib, already loaded by typer; ``re`` caches the compiled pattern

    return escape(re.sub(r"[\x00-\x1f\x7f-\x9f]", lambda m: f"\\x{ord(m.group()):02x}", text))


def _print_verdict(gate: Any) -> None:
    """The gate's verdict line (green or red), then the violations it lists."""
    lines = str(gate).splitlines()
    out.print(f"[{'green' if gate else 'bold red'}]{_visible(lines[0])}[/]")
    for line in lines[1:]:
        out.print(_visible(line))


def _precision_cell(p: Optional[str]) -> str:
    return f"[{_PRECISION_STYLE.get(p or '', 'dim')}]{p or '?'}[/]"


def _render_report(report: Any, gate: Any, all_layers: bool) -> None:
    from edgeq.report import LayerKind

    kinds = ", ".join(f"{n} {k}" for k, n in report.kind_counts().items())
    precisions = ", ".join(f"{n} {p}" for p, n in sorted(report.compute_precisions().items()))
    out.print(
        f"[bold]{_visible(report.source)}[/]: {report.mode} quantization, {len(report.layers)} layers "
        f"({kinds}); compute: {precisions or 'n/a'}"
    )
    flagged: dict[int, list[str]] = {}
    for v in gate.violations if gate is not None else ():
        flagged.setdefault(v.layer, []).append(v.rule)
    excused = {v.layer: v.allowed_by for v in gate.allowed} if gate is not None else {}
    hidden = (LayerKind.WEIGHTS, LayerKind.NOOP)
    rows = [rl for rl in report.layers if all_layers or rl.kind not in hidden]
    title = "Engine layers" + (
        "" if all_layers else f" ({len(report.layers) - len(rows)} weight/no-op hidden: --all-layers)"
    )
    from rich import box

    t = Table(show_lines=False, expand=False, title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("#", justify="right")
    t.add_column("type", no_wrap=True, max_width=16)
    t.add_column("ONNX nodes / layer", overflow="fold", min_width=30)
    t.add_column("prec", no_wrap=True)
    t.add_column("out format", no_wrap=True)
    if report.timed:
        t.add_column("µs", justify="right")
    t.add_column("gate", overflow="fold", max_width=18)
    for rl in rows:
        # Fused compute layers are best named by their ONNX nodes; copies only have a layer name.
        name = _visible(", ".join(rl.onnx_nodes)) if rl.onnx_nodes else _visible(rl.name)
        kind = "" if rl.kind == LayerKind.COMPUTE else f"\n[dim]{rl.kind.value}[/]"
        tags = [f"[bold red]{r}[/]" for r in flagged.get(rl.index, [])]
        if rl.index in excused:
            tags.append(f"[yellow]allowed ({_visible(str(excused[rl.index]))})[/]")
        if rl.boundary:
            tags.append(f"[cyan]{rl.boundary} boundary[/]")
        elif rl.same_format_copy and rl.index not in flagged:
            tags.append("[dim]copy[/]")  # a Concat/Slice copy: reported, not a fallback
        if rl.region != "inside":
            tags.append(f"[dim]{rl.region} region[/]")
        if rl.kind == LayerKind.REFORMAT:
            first_in = rl.in_precisions[0] if rl.in_precisions else None
            first_out = rl.out_precisions[0] if rl.out_precisions else None
            prec = f"{_precision_cell(first_in)}->{_precision_cell(first_out)}"
        else:
            prec = _precision_cell(rl.precision) if rl.kind != LayerKind.NOOP else ""
        layout = ", ".join(o.format.short.split(" ", 1)[-1] if o.format else "?" for o in rl.layer.outputs)
        cells = [str(rl.index), _visible(rl.layer_type) + kind, name, prec, _visible(layout)]
        if report.timed:
            cells.append("-" if rl.time_ms is None else f"{rl.time_ms * 1000:.1f}")
        cells.append(" ".join(tags))
        t.add_row(*cells, style="on grey15" if rl.index in flagged else None)
    out.print(t)
    if report.timed:
        it = f" over {report.profile_iterations} iterations" if report.profile_iterations else ""
        out.print(f"sum of per-layer averages: [bold]{report.profile_total_ms:.4f} ms[/]{it}")
    if report.unfused_residuals:
        fails = gate is not None and gate.policy.require_fusion
        out.print(
            f"[yellow]{len(report.unfused_residuals)} residual Add layers did not fuse into a convolution[/]"
            + ("" if fails else " (--require-fusion fails on them)")
        )
    if report.onnx is not None:
        m = report.onnx
        ran = ", ".join(f"{len(v)} {p}" for p, v in sorted(m.by_precision().items()))
        out.print(
            f"ONNX {_visible(m.model)}: {len(m.nodes)} nodes found in the engine "
            f"({ran or 'none in compute'}; "
            f"{len(m.in_kind(LayerKind.REFORMAT))} in reformats), {len(m.not_found)} not found "
            "(fused Q/DQ or eliminated; --json lists them)"
        )
    for note in report.notes:
        out.print(f"[yellow]note:[/] {_visible(note)}")


@app.command("report", help=_REPORT_HELP)
def report_cmd(
    layers: Path = typer.Argument(..., help="Engine layer information JSON (trtexec --exportLayerInfo)."),
    profile: Optional[Path] = typer.Option(
        None, "--profile", help="Per-layer times: trtexec --exportProfile JSON or the edgeq agent's profile."
    ),
    onnx_path: Optional[Path] = typer.Option(
        None, "--onnx", help="The ONNX model the engine was built from: map layers back to its nodes."
    ),
    gate_name: str = typer.Option("int8", "--gate", help="Gate policy: int8 (default), fusion or none."),
    require_fusion: bool = typer.Option(
        False,
        "--require-fusion",
        help="Also fail on residual Add(+Relu) layers not fused into a convolution.",
    ),
    forbid_copies: bool = typer.Option(
        False, "--forbid-copies", help="Also fail on interior copies that keep precision and layout (Concat)."
    ),
    allow: Optional[list[str]] = typer.Option(
        None, "--allow", metavar="NAME",
        help="ONNX node (or layer) name the gate excuses; wildcards allowed (repeatable).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report and verdict as JSON on stdout."),
    html_out: Optional[Path] = typer.Option(
        None, "--html", help="Also write a self-contained HTML report here."
    ),
    all_layers: bool = typer.Option(False, "--all-layers", help="List weight and no-op layers too."),
) -> int:
    from edgeq.fs import atomic_write_text, check_writable
    from edgeq.report import POLICIES, apply_gate, build_report, load_layers, load_profile, render_html
    from edgeq.report import report_to_dict as to_dict

    if gate_name not in POLICIES:
        raise typer.BadParameter(
            f"unknown gate {gate_name!r}; one of: {', '.join(POLICIES)}", param_hint="--gate"
        )
    if html_out is not None:  # before the work, and never over one of the files read
        check_writable(html_out, inputs=tuple(p for p in (layers, profile, onnx_path) if p is not None))
    policy = POLICIES[gate_name].with_allow(list(allow or ()))
    if require_fusion:
        policy = policy.replace(require_fusion=True)
    if forbid_copies:
        policy = policy.replace(forbid_interior_copies=True)
    engine = load_layers(layers)
    prof = load_profile(profile) if profile is not None else None
    report = build_report(engine, prof, onnx_model=onnx_path)
    gate = apply_gate(report, policy)
    code = EXIT_OK if gate else EXIT_CHECK_FAILED
    if html_out is not None:
        atomic_write_text(html_out, render_html(report, gate))
    if json_out:
        print_json({**to_dict(report, gate), "exit_code": code, "html": str(html_out) if html_out else None})
        return code
    _render_report(report, gate, all_layers)
    if html_out is not None:
        out.print(f"wrote [bold]{escape(str(html_out))}[/]")
    _print_verdict(gate)
    return code


# --------------------------------------------------------------------------------------------------
# edgeq deploy / targets  (edgeq.remote)
# --------------------------------------------------------------------------------------------------

_DEPLOY_HELP = (
    "Build and prove an engine on a target: clean -> quantize (float model with --calib) -> lint -> "
    "upload -> probe -> build -> inspect -> profile -> report -> gate.\n\n"
    "Everything lands in runs/<model>-<target>-<timestamp>/: the cleaned (quantized) ONNX, stages.json "
    "(each stage's outcome, also on failure), deploy.log (with the target's TensorRT log), probe.json, "
    "engine.plan, layers.json, profile.json, timings.json, report.json and report.html.\n\n"
    "--target NAME reads targets/NAME.yaml (or give a path). Host keys are checked against the "
    "target's known_hosts; --accept-new-host-key adds an unknown one (a changed key is always refused).\n\n"
    + EXIT_CODES_HELP
)


def _stage_table(stages: Sequence[Any]) -> Table:
    style = {"ok": "green", "failed": "bold red", "skipped": "dim", "not run": "dim", "pending": "dim"}
    t = Table(title="deploy", show_lines=False, expand=False)
    t.add_column("stage")
    t.add_column("status")
    t.add_column("s", justify="right")
    t.add_column("summary", overflow="fold")
    for s in stages:
        t.add_row(s.name, f"[{style.get(s.status, '')}]{s.status}[/]", f"{s.seconds:.2f}", escape(s.summary))
    return t


@app.command("deploy", help=_DEPLOY_HELP)
def deploy_cmd(
    model: Path = typer.Argument(..., help="The ONNX model: Q/DQ (explicit INT8) or float."),
    target: str = typer.Option(
        ..., "--target", "-t", help="Target name (targets/NAME.yaml) or a YAML path."
    ),
    calib: Optional[Path] = typer.Option(
        None, "--calib", help="Calibration data: quantize a float model first."
    ),
    accept_new_host_key: bool = typer.Option(
        False, "--accept-new-host-key", help="Trust and record the target's host key if known_hosts lacks it."
    ),
    gate: Optional[str] = typer.Option(
        None, "--gate", help="Gate policy: int8 or none (or fusion) \\[default: the target's, else int8]; "
        "relative with --baseline implicit."
    ),
    baseline: Optional[str] = typer.Option(
        None, "--baseline", help="implicit: also build the implicit INT8 engine from the same calibration "
        "(float model and --calib) and apply the relative gate against it."
    ),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where run directories are created."),
    fp16: Optional[bool] = typer.Option(
        None, "--fp16/--no-fp16", help="Allow FP16 fallback \\[default: the target's build.fp16]."
    ),
    iterations: int = typer.Option(
        10, "--iterations", min=1, help="Profile at least N runs (trtexec --iterations)."
    ),
    duration: float = typer.Option(
        3.0, "--duration", min=0, help="Profile at least S seconds (trtexec --duration)."
    ),
    pipeline: Optional[Path] = typer.Option(
        None, "--pipeline", help="Pipeline YAML: its gate allowlist is added ('edgeq run' runs a whole one)."
    ),
    calibrator: Calibrator = typer.Option(Calibrator.entropy, "--calibrator", case_sensitive=False,
                                          help="With --calib: how activation ranges are chosen."),
    percentile: float = typer.Option(99.99, "--percentile", help="Percentile for --calibrator percentile."),
    placement: Placement = typer.Option(Placement.trt, "--placement", case_sensitive=False,
                                        help="trt: TensorRT 8.6 rules; all: every quantizable tensor."),
    overrides: Optional[Path] = typer.Option(None, "--overrides", help="YAML file forcing/excluding nodes."),
    preprocess: Optional[Path] = typer.Option(
        None, "--preprocess", help="YAML preprocessing for --calib images (pipelines/preprocess-*.yaml)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the stages, timings and verdict as JSON."),
) -> int:
    from edgeq.pipeline import ProfileSettings, QuantizeSpec
    from edgeq.pipeline_run import load_pipeline
    from edgeq.remote.deploy import DeployOptions, deploy
    from edgeq.remote.targets import resolve_target

    tgt = resolve_target(target)
    allow: tuple[str, ...] = ()
    require_fusion: Optional[bool] = None
    if pipeline is not None:
        pl = load_pipeline(pipeline)
        if pl.gate is not None:
            allow, require_fusion = pl.gate.allow, pl.gate.require_fusion
    deploy_gate = _baseline_gate(gate, baseline, calib)
    spec = QuantizeSpec(calibrator=calibrator.value, percentile=percentile, placement=placement.value,
                        overrides=overrides, preprocess=preprocess)  # fmt: skip
    options = DeployOptions(
        calib=calib, accept_new_host_key=accept_new_host_key, gate=deploy_gate, gate_allow=allow,
        gate_require_fusion=require_fusion, runs_dir=runs_dir, quantize=spec,
        profile=ProfileSettings(fp16=fp16, iterations=iterations, duration=duration),
    )  # fmt: skip

    def event(line: str) -> None:
        if line.endswith(": started") or ": failed - " in line:
            return  # a failure is printed once, as the error line
        err.print(f"[dim]{escape(line)}[/]", highlight=False)

    with progress_display(enabled=not json_out) as progress:
        result = deploy(model, tgt, options, progress=progress, on_event=event)
        relative = _relative_to_baseline(result, tgt, accept_new_host_key, progress) if baseline else None
    code = EXIT_OK if result.gate_passed and relative is not False else EXIT_CHECK_FAILED
    gate_result = result.finished.gate if result.finished is not None else None
    if json_out:
        print_json(
            {
                "run_dir": str(result.run_dir),
                "stages": [vars(s) for s in result.stages],
                "timings": result.timings,
                "gate": gate_result.to_dict() if gate_result is not None else None,
                "relative_gate": relative.to_dict() if relative else None,
                "exit_code": code,
            }
        )
        return code
    out.print(_stage_table(result.stages))
    if result.finished is not None:
        out.print(f"report: [bold]{escape(str(result.finished.report_html))}[/]")
    if gate_result is not None:
        _print_verdict(gate_result)
    if relative is not None:
        _print_verdict(relative)
    out.print(f"run directory: [bold]{escape(str(result.run_dir))}[/]")
    return code


targets_app = typer.Typer(help="Target files (targets/*.yaml): list them, check one against its machine.")
app.add_typer(targets_app, name="targets")


@targets_app.command(
    "list",
    help="List targets/*.yaml in the current directory and whether each is valid (offline: the file is "
    "checked, not the machine). Exit 1 when a file is invalid, naming the key at fault.",
)
def targets_list_cmd() -> int:
    from edgeq.remote.targets import TARGETS_DIR, list_target_files, load_target

    files = list_target_files()
    if not files:
        err.print(f"no target files in ./{TARGETS_DIR}/ (examples: the edgeq repository's targets/)")
        return EXIT_OK
    t = Table(title=f"./{TARGETS_DIR}", expand=False)
    for col in ("name", "host", "backend", "TensorRT", "sm", "status"):
        t.add_column(col, overflow="fold")
    problems: list[str] = []
    for path in files:
        try:
            tg = load_target(path)
        except EdgeqError as e:
            problems.append(str(e))
            t.add_row(path.stem, "", "", "", "", "[bold red]invalid[/]")
            continue
        where = f"{tg.user}@{tg.host}:{tg.port}" + (f" via {tg.jump_host}" if tg.jump_host else "")
        where = "this machine (no SSH)" if tg.is_local else where
        t.add_row(
            tg.name, escape(where), tg.backend, tg.tensorrt or "-", tg.compute_capability or "-",
            "[green]ok[/]",
        )
    out.print(t)
    for p in problems:
        out.print(f"[bold red]invalid:[/] {escape(p)}")
    return EXIT_CHECK_FAILED if problems else EXIT_OK


@targets_app.command(
    "check",
    help="Connect to a target (host key checked against its known_hosts), ship the edgeq agent, probe it "
    "(TensorRT version, GPU, compute capability, DLA cores, free memory and disk, Python) and compare with "
    "the file's 'tensorrt' and 'gpu.compute_capability'.\n\nExit codes: 0 the target is ready; 1 "
    "unreachable, no TensorRT or not what the file expects; 2 the target file is invalid, or the host key "
    "or the login is refused (unknown/changed key, wrong identity file).",
)
def targets_check_cmd(
    name: str = typer.Argument(..., help="Target name (targets/NAME.yaml) or a YAML path."),
    accept_new_host_key: bool = typer.Option(
        False, "--accept-new-host-key", help="Trust and record the target's host key if known_hosts lacks it."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the probe's facts as JSON."),
) -> int:
    from edgeq.pipeline import probe_from_facts
    from edgeq.remote.deploy import check_target
    from edgeq.remote.targets import resolve_target

    tgt = resolve_target(name)
    with progress_display(enabled=not json_out) as progress:
        facts = check_target(tgt, accept_new_host_key=accept_new_host_key, progress=progress)
    if json_out:
        print_json(facts)
        return EXIT_OK
    trt = facts.get("tensorrt") or {}
    gpus = facts.get("gpus") or []
    free = (gpus[0] if gpus else {}).get("memory_free_mib")
    python = (facts.get("python") or {}).get("version")
    said = [probe_from_facts(facts, tgt).describe()]
    said += [f"{free} MiB GPU memory free"] if free is not None else []
    said += [f"DLA cores {trt['num_DLA_cores']}"] if trt.get("num_DLA_cores") is not None else []
    said += [f"Python {python}"] if python else []
    out.print(f"[green]{escape(tgt.name)} ok[/]: {escape(', '.join(said))}")
    return EXIT_OK


# --------------------------------------------------------------------------------------------------
# edgeq compare  (edgeq.report.compare; edgeq.remote.variants builds the engines on a target)
# --------------------------------------------------------------------------------------------------

_COMPARE_HELP = (
    "Why is the explicit engine slower than the implicit one? Engines of one model side by side, the "
    "first the baseline: throughput and latency ratios, layer counts, compute precisions, "
    "precision-changing reformats vs same-format copies, fused groups one engine has and another lacks, "
    "and the regions that differ most in time, each with its ONNX nodes and the placement rule that "
    "explains it.\n\n"
    "Offline: 'edgeq compare --engines A/ B/ [C/ ...]', each a directory with one *.layers.json and "
    "optionally one *.profile.json and *.run.log (or a *.layers.json file, its siblings found by name; a "
    "directory with only a *.build.log is a failed build). Ratios come from the run logs' throughput "
    "where both have one, else from summed per-layer times.\n\n"
    "On a target: 'edgeq compare model.onnx --target T --calib data/' calibrates once and builds implicit "
    "INT8 (the baseline), explicit INT8 with edgeq's placement and with --placement all (plus --fp16 and "
    "--qdq-model), each profiled the same way; a build that fails is a row with its error.\n\n"
    "--gate relative fails (exit 1) when a candidate runs an ONNX node in a wider precision than the "
    "baseline, has more precision-changing reformats, or its throughput ratio is under --min-ratio (on a "
    "target it judges edgeq's explicit engine and --qdq-model, not the comparison builds).\n\n"
    + EXIT_CODES_HELP
)


def _ratio_cell(value: Optional[float], good_above: bool) -> str:
    if value is None:
        return "-"
    good = value >= 0.995 if good_above else value <= 1.005
    return f"[{'green' if good else 'red'}]{value:.2f}x[/]"


def _render_comparison(comparison: Any, gates: Sequence[Any], top: int) -> None:
    t = Table(title="engines (the first is the baseline)", expand=False)
    cols = ("engine", "mode", "layers", "compute", "reformats", "copies", "ms (sum)", "qps", "thr.", "lat.")
    for col in cols:
        t.add_column(col, overflow="fold")
    diffs = {d.candidate: d for d in comparison.diffs}
    failed: list[Any] = []
    for e in comparison.engines:
        if e.report is None:
            t.add_row(_visible(e.name), "[bold red]build failed[/]", *[""] * 8)
            failed.append(e)
            continue
        s = e.stats
        comp = ", ".join(f"{n} {_precision_cell(p)}" for p, n in sorted(s.precisions.items()))
        d = diffs.get(e.name)
        t.add_row(
            _visible(e.name), e.report.mode, str(s.layers), comp, str(s.reformats), str(s.copies),
            f"{s.total_ms:.3f}" if s.total_ms is not None else "-",
            f"{e.run.throughput_qps:.0f}" if e.run and e.run.throughput_qps else "-",
            _ratio_cell(d.ratio.throughput, True) if d else "1.00x",
            _ratio_cell(d.ratio.latency, False) if d else "1.00x",
        )  # fmt: skip
    out.print(t)
    for e in failed:
        out.print(f"[bold red]{_visible(e.name)}: build failed:[/] {_visible(e.error or '')}")
    for d in comparison.diffs:
        src = f" (from {d.ratio.source})" if d.ratio.throughput is not None else " (no timing)"
        out.print(f"\n[bold]{_visible(d.candidate)}[/] vs [bold]{_visible(d.baseline)}[/]{src}")
        for label, groups in (("fused only in the baseline", d.missing_groups),
                              ("fused only in the candidate", d.extra_groups)):  # fmt: skip
            if groups:
                shown = "; ".join(groups[:4]) + (f"; ... {len(groups) - 4} more" if len(groups) > 4 else "")
                out.print(f"  {len(groups)} {label}: {_visible(shown)}")
        b_res, c_res = d.base_stats.unfused_residuals, d.cand_stats.unfused_residuals
        if c_res != b_res:
            out.print(f"  {c_res} residual Add layers not fused into a convolution (baseline {b_res})")
        if d.wider:
            out.print(f"  [red]{len(d.wider)} ONNX nodes in a wider precision than in the baseline[/]")
        regions = d.top(top)
        if not regions:
            out.print("  [green]no region differs: same fusion, precisions and reformats[/]")
            continue
        rt = Table(box=None, expand=False, pad_edge=False)
        for col in ("region (ONNX nodes)", "baseline", "candidate", "Δ µs", "rule"):
            rt.add_column(col, overflow="fold")
        for r in regions:
            def side(s: Any) -> str:
                us = f" {s.time_ms * 1000:.1f}µs" if s.time_ms is not None else ""
                extra = f" +{s.reformats} reformat" if s.reformats else ""
                return f"{_precision_cell(s.precision or None)} {len(s.groups)} layer{us}{extra}"

            delta = f"{r.delta_ms * 1000:+.1f}" if r.delta_ms is not None else "-"
            rt.add_row(_visible(r.label(1)), side(r.base), side(r.cand), delta, _visible(", ".join(r.rules)))
        out.print(rt)
    for note in comparison.notes:
        out.print(f"[yellow]note:[/] {_visible(note)}")
    for g in gates:
        _print_verdict(g)


def _baseline_gate(gate: Optional[str], baseline: Optional[str], calib: Optional[Path]) -> Optional[str]:
    """deploy's own gate policy given --gate/--baseline: 'relative' replaces it (the policy is then none)."""
    if baseline not in (None, "implicit"):
        raise typer.BadParameter(f"unknown baseline {baseline!r}; only: implicit", param_hint="--baseline")
    if gate == "relative" and baseline is None:
        raise typer.BadParameter("--gate relative needs --baseline implicit", param_hint="--gate")
    if baseline is not None and calib is None:
        raise typer.BadParameter("--baseline implicit needs a float model and --calib", param_hint="--calib")
    return "none" if gate == "relative" else gate


def _relative_to_baseline(result: Any, target: Any, accept_new_host_key: bool, progress: ProgressFn) -> Any:
    """deploy --baseline implicit: build the implicit engine of the run, gate the run's engine against it."""
    from edgeq.remote.variants import VariantOptions, engine_of_run, implicit_baseline
    from edgeq.report.compare import diff_pair, relative_gate

    if result.finished is None:
        return None
    opts = VariantOptions(accept_new_host_key=accept_new_host_key)
    base = implicit_baseline(result, target, opts, progress)
    if not base.built:  # a target-side failure: exit 1, as any other stage's
        raise EdgeqError(f"--baseline implicit: the implicit engine did not build: {base.error}", exit_code=1)
    return relative_gate(diff_pair(base, engine_of_run(result)))


@app.command("compare", help=_COMPARE_HELP)
def compare_cmd(
    paths: Optional[list[Path]] = typer.Argument(
        None, help="With --engines: engine directories (or *.layers.json files), the baseline first. "
        "With --target: the float ONNX model."
    ),
    engines: bool = typer.Option(False, "--engines", help="Compare engines from files (offline)."),
    target: Optional[str] = typer.Option(
        None, "--target", "-t", help="Build the variants on this target (targets/NAME.yaml or a path)."
    ),
    calib: Optional[Path] = typer.Option(None, "--calib", help="Calibration data (with --target)."),
    fp16: bool = typer.Option(False, "--fp16", help="Also build an FP16 engine (with --target)."),
    qdq_model: Optional[Path] = typer.Option(
        None, "--qdq-model", help="Also build this Q/DQ model of your own (with --target)."
    ),
    accept_new_host_key: bool = typer.Option(
        False, "--accept-new-host-key", help="Trust and record the target's host key if known_hosts lacks it."
    ),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where run directories are created."),
    onnx_path: Optional[Path] = typer.Option(
        None, "--onnx", help="The Q/DQ model the candidates were built from (offline): its lint findings "
        "are attached to the regions whose nodes they name."
    ),
    gate_name: str = typer.Option(
        "none", "--gate", help="relative: fail a candidate worse than the baseline; none: report only."
    ),
    min_ratio: float = typer.Option(0.97, "--min-ratio", help="Relative gate: lowest throughput ratio."),
    top: int = typer.Option(10, "--top", min=1, help="Differing regions listed per candidate."),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON on stdout."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="Also write a self-contained HTML page."),
) -> int:
    from edgeq.fs import atomic_write_text, check_writable
    from edgeq.report.compare import compare_engines, engine_from_path, relative_gates
    from edgeq.report.compare_html import render_compare_html

    if gate_name not in ("relative", "none"):
        raise typer.BadParameter(f"unknown gate {gate_name!r}; one of: relative, none", param_hint="--gate")
    paths = list(paths or [])
    if engines == (target is not None):
        raise typer.BadParameter("give --engines DIR DIR ... (offline) or MODEL --target T (build)")
    if html_out is not None:
        check_writable(html_out, inputs=tuple(paths))
    findings: list[Any] = []
    gated: Optional[tuple[str, ...]] = None  # None: every candidate
    if engines:
        if len(paths) < 2:
            raise typer.BadParameter("--engines needs two or more directories, the baseline first")
        onnx_model = None
        if onnx_path is not None:
            from edgeq.graph.io import load_model
            from edgeq.graph.rules import lint_model

            onnx_model = load_model(onnx_path)
            findings = lint_model(onnx_model)
        found = [engine_from_path(p, onnx_model) for p in paths]
    else:
        from edgeq.remote.targets import resolve_target
        from edgeq.remote.variants import VariantOptions, engines_on_target

        if len(paths) != 1:
            raise typer.BadParameter("--target takes one float ONNX model")
        options = VariantOptions(
            calib=calib, fp16=fp16, qdq_model=qdq_model, accept_new_host_key=accept_new_host_key,
            runs_dir=runs_dir,
        )  # fmt: skip
        tgt = resolve_target(target or "")
        with progress_display(enabled=not json_out) as progress:
            built = engines_on_target(paths[0], tgt, options, progress=progress)
        found, findings, gated = list(built.engines), list(built.findings), built.gated
        if not json_out:
            out.print(f"run directory: [bold]{escape(str(built.run_dir))}[/]")
    comparison = compare_engines(found, findings)
    gates = relative_gates(comparison, min_ratio, gated) if gate_name == "relative" else []
    code = EXIT_OK if all(gates) else EXIT_CHECK_FAILED
    if html_out is not None:
        atomic_write_text(html_out, render_compare_html(comparison, gates))
    if json_out:
        print_json({**comparison.to_dict(top), "gates": [g.to_dict() for g in gates], "exit_code": code})
        return code
    _render_comparison(comparison, gates, top)
    if html_out is not None:
        out.print(f"wrote [bold]{escape(str(html_out))}[/]")
    return code


# --------------------------------------------------------------------------------------------------
# edgeq tune  (edgeq.tune)
# --------------------------------------------------------------------------------------------------

_TUNE_HELP = (
    "Placement decided by the target's own timings: calibrate once, build implicit INT8 on the target, "
    "start from edgeq's placement with implicit's FP16 layers mirrored, then toggle one decision point "
    "at a time (residual skip, Concat Q/DQ, pool tail, FP16 block), each candidate built and profiled "
    "there and kept only if faster (timed against the best in --rounds alternating rounds: single "
    "timings spread by a few percent) and within --min-cosine. Writes the tuned Q/DQ model, its "
    "calibration cache, tune.json and tune.html; run it again with the same --output to resume. "
    "A target file with 'host: local' builds on this machine's GPU (no SSH)."
)


@app.command("tune", help=_TUNE_HELP)
def tune_cmd(
    model: Path = typer.Argument(..., help="The float ONNX model."),
    target: str = typer.Option(..., "--target", "-t", help="targets/NAME.yaml or a path ('host: local')."),
    calib: Path = typer.Option(..., "--calib", help="Calibration data (.npy/.npz files or a directory)."),
    budget: str = typer.Option("20m", "--budget", help="Time for the search, e.g. 20m, 90s, 1h30m."),
    min_cosine: float = typer.Option(0.99, "--min-cosine", help="Accuracy bound against FP32 (held out)."),
    rounds: int = typer.Option(
        3, "--rounds", min=0, help="Paired re-timing rounds per decision and for the final ratio (0: none)."
    ),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", help="Output and resume directory (default: <model>.tune/ beside it)."
    ),
    trtexec: Optional[str] = typer.Option(
        None, "--trtexec", help="trtexec on the target (overrides the target file; implies backend trtexec)."
    ),
    calibrator: str = typer.Option("entropy", "--calibrator", help="entropy | max | percentile | mse."),
    accept_new_host_key: bool = typer.Option(
        False, "--accept-new-host-key", help="Trust and record the target's host key if known_hosts lacks it."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the tuning report as JSON on stdout."),
) -> int:
    import dataclasses

    from edgeq.remote.targets import resolve_target
    from edgeq.tune import TuneOptions, parse_budget, tune

    if not -1.0 <= min_cosine <= 1.0:
        raise typer.BadParameter(f"must be in [-1, 1], got {min_cosine}", param_hint="--min-cosine")
    options = TuneOptions(calib=calib, out_dir=output, budget_s=parse_budget(budget), min_cosine=min_cosine,
                          calibrator=calibrator, accept_new_host_key=accept_new_host_key,
                          rounds=rounds)  # fmt: skip
    tgt = resolve_target(target)
    if trtexec is not None:
        tgt = dataclasses.replace(tgt, trtexec=trtexec, backend="trtexec")
    with progress_display(enabled=not json_out) as progress:
        result = tune(model, tgt, options, progress=progress)
    gates_ok = all(g.get("passed", False) for g in result.gate.values()) if result.gate else False
    code = EXIT_OK if gates_ok else EXIT_CHECK_FAILED
    if json_out:
        print_json({**result.to_dict(), "exit_code": code})
        return code
    for e in result.decisions:
        cand = e["candidate"] or {}
        mark = "[green]kept[/]" if e["kept"] else "[dim]-[/]"
        out.print(f"{escape(e['decision'])}: {e['tried']} -> {cand.get('qps')} qps {mark} "
                  f"({escape(e['chosen_by'])})")  # fmt: skip
    stopped = f"; {result.stopped}" if result.stopped else ""
    how = f"{result.speedup}x" + (f" in {result.final['rounds']} paired rounds" if result.final else "")
    out.print(f"implicit {result.implicit.qps} qps, tuned {result.best.qps} qps ({how}); "
              f"{result.built} built, {result.reused} reused{stopped}")  # fmt: skip
    for name, g in result.gate.items():
        out.print(f"{name} gate: {'[green]passed[/]' if g.get('passed') else '[bold red]failed[/]'}")
    for key in ("model", "cache", "html"):
        out.print(f"wrote [bold]{escape(result.files[key])}[/]")
    return code


# --------------------------------------------------------------------------------------------------
# edgeq fleet validate  (edgeq.fleet)
# --------------------------------------------------------------------------------------------------

fleet_app = typer.Typer(help="Validate a model on a fleet of targets at once (a fleet YAML or an Ansible "
                        "inventory).")
app.add_typer(fleet_app, name="fleet")

_ROW_STYLE = {"pending": "dim", "running": "cyan", "passed": "green", "failed": "bold red"}


def _live_rows(rows: dict[str, Any]) -> Table:
    t = Table(title="fleet", expand=False)
    for col in ("target", "destination", "status", "stage"):
        t.add_column(col)
    for r in rows.values():
        st = _ROW_STYLE.get(r.status, "")
        t.add_row(escape(r.target), escape(r.destination), f"[{st}]{r.status}[/]", escape(r.stage))
    return t


def _fleet_matrix(result: Any) -> Table:
    from edgeq.fleet import matrix

    cells = matrix(result)
    t = Table(title=f"fleet: {escape(result.model.name)}", expand=False)
    for col in (cells[0].keys() if cells else ()):
        t.add_column(col, overflow="fold")
    for row in cells:
        style = "green" if row["result"] == "passed" else "red"
        t.add_row(*(escape(v) for v in list(row.values())[:-1]), f"[{style}]{escape(row['result'])}[/]")
    return t


def fleet_options_from_cli(calib: Optional[Path], calibrator: Calibrator, preprocess: Optional[Path],
                           overrides: Optional[Path], gate: Optional[str], runs_dir: Path,
                           accept_new_host_key: bool, build_once_per_kind: bool, workers: Optional[int],
                           iterations: int, duration: float) -> Any:
    from edgeq.fleet import FleetOptions
    from edgeq.pipeline import ProfileSettings, QuantizeSpec

    spec = QuantizeSpec(calib=calib, calibrator=calibrator.value, preprocess=preprocess, overrides=overrides)
    return FleetOptions(quantize=spec, gate=gate, runs_dir=runs_dir, accept_new_host_key=accept_new_host_key,
                        build_once_per_kind=build_once_per_kind, workers=workers,
                        profile=ProfileSettings(iterations=iterations, duration=duration))  # fmt: skip


def _row_finished(row: Any) -> None:
    if row.status in ("passed", "failed"):
        style = _ROW_STYLE.get(row.status, "")
        err.print(f"  {escape(row.target)}: [{style}]{row.status}[/] {escape(row.error or '')}")


def run_fleet(model: Path, fleet_path: Path, options: Any, *, live: bool) -> Any:
    """Load the fleet and validate, with one live row per target on stderr when ``live``."""
    from rich.live import Live

    from edgeq.fleet import validate
    from edgeq.fleet_file import load_fleet

    fleet = load_fleet(fleet_path)
    rows: dict[str, Any] = {}
    if not live:
        return validate(model, fleet, options)
    if not err.is_terminal:  # CI logs: one line per target as it finishes, no redrawn table
        return validate(model, fleet, options, on_row=_row_finished)
    with Live(_live_rows(rows), console=err, transient=True, refresh_per_second=4) as view:

        def on_row(row: Any) -> None:
            rows[row.target] = row
            view.update(_live_rows(rows))

        return validate(model, fleet, options, on_row=on_row)


@fleet_app.command(
    "validate",
    help="Deploy one model to every target of a fleet concurrently and print a matrix: target x "
    "(reachable, TensorRT, GPU, build, gate, latency p50/p99, throughput, report). The model is cleaned, "
    "quantized (--calib) and linted once; an unreachable or failing target fails only its row.\n\n"
    "--fleet takes edgeq's fleet YAML (targets: names, globs, per-target overrides) or an Ansible "
    "inventory (YAML or INI: ansible_host/ansible_user/ansible_port/ansible_ssh_private_key_file, other "
    "target keys as edgeq_<key> vars). --build-once-per-kind builds one engine per compute capability + "
    "TensorRT version and loads it on the identical boards.\n\nExit codes: 0 every target passed; 1 a "
    "target failed (unreachable, build, gate); 2 usage or input error, or a target refused for a cause "
    "deploy exits 2 for (host key, login, target file).",
)
def fleet_validate_cmd(
    model: Path = typer.Argument(..., help="The ONNX model: Q/DQ (explicit INT8) or float."),
    fleet: Path = typer.Option(..., "--fleet", "-f", help="Fleet YAML or Ansible inventory."),
    calib: Optional[Path] = typer.Option(None, "--calib", help="Calibration data: quantize a float model."),
    calibrator: Calibrator = typer.Option(Calibrator.entropy, "--calibrator", case_sensitive=False),
    preprocess: Optional[Path] = typer.Option(None, "--preprocess", help="YAML image preprocessing."),
    overrides: Optional[Path] = typer.Option(None, "--overrides", help="YAML file forcing/excluding nodes."),
    gate: Optional[str] = typer.Option(None, "--gate", help="Gate policy (default: the target's, else int8)"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where the fleet directory is created."),
    accept_new_host_key: bool = typer.Option(False, "--accept-new-host-key"),
    build_once_per_kind: bool = typer.Option(
        False, "--build-once-per-kind", help="One engine build per compute capability + TensorRT version."
    ),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Targets at once (default: fleet)"),
    iterations: int = typer.Option(10, "--iterations", min=1, help="trtexec --iterations."),
    duration: float = typer.Option(3.0, "--duration", min=0, help="trtexec --duration."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Write JUnit XML (one testcase per target)."),
    json_out: bool = typer.Option(False, "--json", help="Print the matrix as JSON."),
) -> int:
    from edgeq.fleet import junit_xml
    from edgeq.fs import atomic_write_text, check_writable

    if junit is not None:
        check_writable(junit, inputs=(model, fleet))
    options = fleet_options_from_cli(calib, calibrator, preprocess, overrides, gate, runs_dir,
                                     accept_new_host_key, build_once_per_kind, workers, iterations,
                                     duration)  # fmt: skip
    result = run_fleet(model, fleet, options, live=not json_out)
    code = result.exit_code
    if junit is not None:
        atomic_write_text(junit, junit_xml(result))
    if json_out:
        print_json({**result.to_dict(), "exit_code": code})
        return code
    out.print(_fleet_matrix(result))
    passed = sum(r.passed for r in result.rows)
    style = "green" if result.passed else "bold red"
    out.print(f"[{style}]{passed}/{len(result.rows)} targets passed[/]; fleet directory: "
              f"[bold]{escape(str(result.fleet_dir))}[/]")  # fmt: skip
    return code


# --------------------------------------------------------------------------------------------------
# edgeq rules  (edgeq/docs/trt86-rules.md)
# --------------------------------------------------------------------------------------------------


@app.command("rules")
def rules_cmd(
    rule_id: Optional[str] = typer.Argument(None, metavar="[ID]", help="A rule id, e.g. qdq-uint8."),
) -> int:
    """Show the TensorRT 8.6 rules edgeq applies, with the evidence each rests on.

    Without ID: every section id and its title. With ID: that section of edgeq/docs/trt86-rules.md, the
    file findings, gate reports and --help cite.
    """
    from edgeq.docs import RULES_DOC, sections

    found = sections()
    if rule_id is None:
        t = Table(title=RULES_DOC, expand=False)
        t.add_column("id", style="bold")
        t.add_column("title", overflow="fold")
        for sid, text in found.items():
            title = text.splitlines()[0][3:].split(" — ", 1)
            t.add_row(escape(sid), escape(title[1] if len(title) > 1 else ""))
        out.print(t)
        return EXIT_OK
    if rule_id not in found:
        raise EdgeqError(f"no rule '{rule_id}' in {RULES_DOC}", hint="`edgeq rules` lists the ids")
    out.print(found[rule_id], markup=False, highlight=False)
    return EXIT_OK


# --------------------------------------------------------------------------------------------------
# edgeq release  (edgeq.release)
# --------------------------------------------------------------------------------------------------


class _DefaultCreate(TyperGroup):
    """``edgeq release MODEL ...`` is ``edgeq release create MODEL ...``; verify/inspect stay commands."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["create", *args]
        return super().parse_args(ctx, args)


release_app = typer.Typer(
    cls=_DefaultCreate,
    help="Release bundles: 'edgeq release MODEL --fleet F -o bundle.tar.gz' (or --from a fleet directory) "
    "packs the shipped ONNX, the calibration cache, one engine per target kind, the reports and a manifest "
    "(sha256 and size of every file, versions, source hash, git commit); same inputs give the same bytes. "
    "'edgeq release verify' checks a bundle, 'edgeq release inspect' prints its manifest.",
)
app.add_typer(release_app, name="release")


@release_app.command(
    "create",
    help="Validate MODEL on --fleet (as 'edgeq fleet validate') and bundle the result, or bundle an earlier "
    "fleet directory (--from). Only a fleet where every target passed is released.\n\n" + EXIT_CODES_HELP,
)
def release_create_cmd(
    model: Optional[Path] = typer.Argument(None, help="The ONNX model (with --fleet)."),
    fleet: Optional[Path] = typer.Option(None, "--fleet", "-f", help="Fleet YAML or Ansible inventory."),
    from_dir: Optional[Path] = typer.Option(None, "--from", help="A fleet directory (edgeq fleet validate)."),
    output: Path = typer.Option(..., "-o", "--output", help="The bundle to write (.tar.gz)."),
    calib: Optional[Path] = typer.Option(None, "--calib", help="Calibration data: quantize a float model."),
    calibrator: Calibrator = typer.Option(Calibrator.entropy, "--calibrator", case_sensitive=False),
    preprocess: Optional[Path] = typer.Option(None, "--preprocess", help="YAML image preprocessing."),
    overrides: Optional[Path] = typer.Option(None, "--overrides", help="YAML file forcing/excluding nodes."),
    gate: Optional[str] = typer.Option(None, "--gate", help="Gate policy (default: the target's, else int8)"),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where the fleet directory is created."),
    build_once_per_kind: bool = typer.Option(True, "--build-once-per-kind/--build-each"),
    json_out: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> int:
    from edgeq.fs import check_writable
    from edgeq.release.bundle import build_bundle

    if (from_dir is None) == (model is None or fleet is None):
        raise EdgeqError("give MODEL --fleet FILE, or --from FLEET_DIR (one of them)")
    check_writable(output, inputs=tuple(p for p in (model, fleet) if p is not None))
    if from_dir is None:
        assert model is not None and fleet is not None
        options = fleet_options_from_cli(calib, calibrator, preprocess, overrides, gate, runs_dir, False,
                                         build_once_per_kind, None, 10, 3.0)  # fmt: skip
        result = run_fleet(model, fleet, options, live=not json_out)
        if not json_out:
            out.print(_fleet_matrix(result))
        from_dir = result.fleet_dir
    manifest = build_bundle(from_dir, output)
    if json_out:
        print_json(manifest)
        return EXIT_OK
    _render_manifest(manifest)
    out.print(f"wrote [bold]{escape(str(output))}[/]")
    return EXIT_OK


def _render_manifest(m: dict[str, Any]) -> None:
    src = m.get("source_model") or {}
    out.print(f"{escape(str(m.get('format')))} by edgeq {escape(str(m.get('edgeq')))}, created "
              f"{escape(str(m.get('created')))}, git {escape(str(m.get('git_commit') or '-'))}")  # fmt: skip
    out.print(f"source model {escape(str(src.get('name')))} sha256 {escape(str(src.get('sha256')))}")
    t = Table(title="engines (one per kind)", expand=False)
    for col in ("kind", "TensorRT", "GPU", "sm", "JetPack", "built on", "file"):
        t.add_column(col, overflow="fold")
    for kind, e in sorted((m.get("engines") or {}).items()):
        filed = {k for k, v in (e.get("sources") or {}).items() if v == "target file"}
        gpu, sm = (f"{e.get(k) or '-'}" + (" (target file)" if k in filed else "")
                   for k in ("gpu", "compute_capability"))  # fmt: skip
        t.add_row(*(escape(str(v or "-")) for v in (kind, e.get("tensorrt"), gpu, sm, e.get("jetpack"),
                                                    e.get("built_on"), e.get("path"))))  # fmt: skip
    out.print(t)
    files = m.get("files") or []
    out.print(f"{len(files)} files, {sum(int(f.get('size', 0)) for f in files)} bytes; targets: "
              + ", ".join(escape(str(x.get("name"))) for x in m.get("targets") or []))


@release_app.command(
    "verify",
    help="Check a bundle: the manifest's own hash, then every file's sha256 and size, and files the "
    "manifest does not list. Each problem is printed with its kind: \\[manifest] edited manifest, "
    "\\[modified] a file changed, \\[missing] a listed file absent, \\[extra] an unlisted file.\n\n"
    "Exit codes: 0 the bundle is intact; 1 a problem was found (or the archive is corrupt); 2 no such file.",
)
def release_verify_cmd(
    bundle: Path = typer.Argument(..., help="The bundle (.tar.gz)."),
    json_out: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
) -> int:
    from edgeq.release.bundle import verify

    v = verify(bundle)
    code = EXIT_OK if v else EXIT_CHECK_FAILED
    if json_out:
        print_json({"ok": bool(v), "checked": v.checked, "exit_code": code,
                    "problems": [vars(p) for p in v.problems]})  # fmt: skip
        return code
    for p in v.problems:
        out.print(f"[bold red]{escape(str(p))}[/]")
    out.print(("[green]" if v else "[bold red]") + escape(v.summary()) + "[/]")
    return code


@release_app.command("inspect", help="Print a bundle's manifest: versions, engines per kind, files.")
def release_inspect_cmd(
    bundle: Path = typer.Argument(..., help="The bundle (.tar.gz)."),
    json_out: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> int:
    from edgeq.release.bundle import inspect

    manifest = inspect(bundle)
    if json_out:
        print_json(manifest)
    else:
        _render_manifest(manifest)
    return EXIT_OK


# --------------------------------------------------------------------------------------------------
# edgeq run  (edgeq.pipeline_run)
# --------------------------------------------------------------------------------------------------

_OUTCOME_STYLE = {"ran": "green", "skipped": "dim", "failed": "bold red", "not run": "dim"}


@app.command(
    "run",
    help="Run a whole pipeline file: model (a path, or zoo:resnet|yolo|unet built in code) -> prepare "
    "(clean, quantize with its calibration/preprocessing/overrides, lint) -> targets (a target, a fleet "
    "file or a target list; gate policy) -> release bundle. Stages are resumable: a stage whose inputs "
    "(files by content, settings by value) did not change since its last success is skipped and says so; "
    "--force runs them all. Work files: runs/pipeline-<name>/. Examples: pipelines/*.yaml.\n\n"
    + EXIT_CODES_HELP,
)
def run_cmd(
    pipeline: Path = typer.Argument(..., help="The pipeline YAML."),
    force: bool = typer.Option(False, "--force", help="Run every stage, changed or not."),
    json_out: bool = typer.Option(False, "--json", help="Print the stage outcomes as JSON."),
) -> int:
    from edgeq.pipeline_run import run_pipeline

    def show(stage: Any) -> None:
        if not json_out:
            style = _OUTCOME_STYLE.get(stage.status, "")
            out.print(f"{stage.name:<8} [{style}]{stage.status:<8}[/] {escape(stage.summary)}")

    def on_row(row: Any) -> None:  # one line per target as it finishes (the progress bar is live)
        if not json_out:
            _row_finished(row)

    with progress_display(enabled=not json_out) as progress:
        result = run_pipeline(pipeline, on_stage=show, on_row=on_row, progress=progress, force=force)
    code = EXIT_OK if result.passed else result.fleet.exit_code if result.fleet else EXIT_CHECK_FAILED
    if json_out:
        print_json({"work_dir": str(result.work_dir), "stages": [vars(s) for s in result.stages],
                    "passed": result.passed, "exit_code": code})  # fmt: skip
        return code
    if result.fleet is not None:
        out.print(_fleet_matrix(result.fleet))
    out.print(f"work directory: [bold]{escape(str(result.work_dir))}[/]")
    return code


# --------------------------------------------------------------------------------------------------
# edgeq demo
# --------------------------------------------------------------------------------------------------

_DEMO_STATUS = {"done": "[green]done[/]", "stopped": "[yellow]stopped[/]", "skipped": "[dim]skipped[/]",
                "failed": "[bold red]failed[/]"}


@app.command("demo")
def demo_cmd(
    workdir: Path = typer.Option(
        Path("edgeq-demo"), "--workdir", "-o", help="Where the demo writes its files."
    ),
    samples: int = typer.Option(16, "--samples", min=2, help="Synthetic calibration samples."),
) -> int:
    """Run the pipeline on a ResNet-like model built in code, as far as this machine allows.

    Builds the model and its PyTorch-eager and onnxruntime Q/DQ exports, lints them, cleans one and
    verifies it in onnxruntime, quantizes the FP32 model with TensorRT-aware and with onnxruntime-style
    placement, probes for TensorRT with the target agent, and reports on recorded TensorRT 8.6 engines.
    It says where it stops and why (no GPU/TensorRT here: no engine build).

    Everything goes into --workdir (default ./edgeq-demo/, created; files in it are replaced): the
    test models, the cleaned and quantized ONNX, the calibration caches and the target agent zipapp.

    Exit codes: 0 every step that can run here ran (stopping at the engine build for lack of
    TensorRT is not a failure); 1 a step failed; 2 usage error (e.g. --workdir is a file).
    """
    from edgeq.demo import run_demo

    def show(step: Any) -> None:
        out.print(f"\n[bold]{escape(step.name)}[/]  {_DEMO_STATUS.get(step.status, step.status)}")
        for line in step.summary:
            out.print(f"  {escape(line)}")
        for a in step.artifacts:
            out.print(f"  [dim]-> {escape(str(a))}[/]")

    with progress_display() as progress:
        result = run_demo(workdir, samples=samples, progress=progress, on_step=show)
    stop = result.stopped_at
    out.print()
    if stop is not None:
        out.print(f"[yellow]The demo stopped at '{escape(stop.name)}':[/] {escape(stop.summary[0])}")
    out.print(f"Everything it wrote is in {escape(str(result.workdir))}/")
    return EXIT_OK if result else EXIT_CHECK_FAILED


# --------------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------------


def run(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI and return its exit code; tests call this directly."""
    try:
        rv = app(args=list(argv) if argv is not None else None, prog_name="edgeq", standalone_mode=False)
    except EdgeqError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        err.print("interrupted")
        return 130
    except typer.Exit as e:
        return e.exit_code
    except typer.TyperException as e:
        # Usage errors: one line plus the hint to ask for help.
        msg = e.format_message()
        see = f"edgeq {_subcommand(argv)}--help"
        if msg.strip():  # bare 'edgeq' has printed the help already: no empty error line under it
            err.print(f"[bold red]error:[/] {escape(msg)}  (see '{see}')", highlight=False)
        code = getattr(e, "exit_code", EXIT_USAGE)
        return EXIT_USAGE if code in (None, 2) else int(code)
    return rv if isinstance(rv, int) else EXIT_OK


def _subcommand(argv: Optional[Sequence[str]]) -> str:
    args = list(argv) if argv is not None else sys.argv[1:]
    names = {c.name for c in app.registered_commands}
    words = [a for a in args if not a.startswith("-")]
    first = words[0] if words else None
    groups = {g.name: g.typer_instance for g in app.registered_groups if g.typer_instance is not None}
    sub = {c.name for c in groups[first].registered_commands} if first in groups else set()
    if len(words) > 1 and words[1] in sub:  # 'edgeq targets check --help', not 'edgeq --help'
        return f"{first} {words[1]} "
    return f"{first} " if first in names or first in groups else ""


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
