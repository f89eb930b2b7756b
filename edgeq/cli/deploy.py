"""``edgeq deploy`` and ``edgeq targets`` (``edgeq.orchestration.deploy``): one model built and proved on
one target, and the target files themselves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from edgeq.cli.app import app
from edgeq.cli.options import (
    GATE,
    QUANTIZE,
    AcceptNewHostKey,
    Calib,
    Calibrator,
    CalibratorOpt,
    Duration,
    Fp16,
    Gate,
    Holdout,
    Iterations,
    Json,
    MaxShapes,
    MetricOpt,
    MinCosine,
    MinMetric,
    MinShapes,
    OptShapes,
    Overrides,
    Percentile,
    Placement,
    PlacementOpt,
    Preprocess,
    RunsDir,
    TargetName,
    profile_settings,
    quantize_options,
    shapes_given,
)
from edgeq.cli.output import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    err,
    out,
    print_json,
    print_table,
    print_verdict,
    progress_display,
)
from edgeq.errors import EdgeqError
from edgeq.findings import ProgressFn

# One screen (tests/test_cli_help.py) leaves no room for text: what deploy does (its stages and run
# directory, --holdout and --gate accuracy, the exit codes) is in the README ("A typical session",
# "Accuracy on the target") and in `edgeq --help`'s line (short_help).
_DEPLOY_HELP = ""


def _split_gate(gate: Optional[str]) -> tuple[Optional[str], bool]:
    """--gate NAME[,accuracy]: (the precision gate's policy name or None, whether accuracy gates)."""
    if gate is None:
        return None, False
    names = [n.strip() for n in gate.split(",") if n.strip()]
    policies = [n for n in names if n != "accuracy"]
    if len(policies) > 1:
        raise typer.BadParameter(f"one precision gate at most, got {', '.join(policies)}",
                                 param_hint="--gate")
    return (policies[0] if policies else None), "accuracy" in names


def _stage_table(stages: Sequence[Any]) -> Table:
    style = {"ok": "green", "failed": "bold red", "skipped": "dim", "not run": "dim", "pending": "dim"}
    t = Table(title="deploy", show_lines=False, expand=False)
    t.add_column("stage", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("s", justify="right", no_wrap=True)
    t.add_column("summary", overflow="fold")
    for s in stages:
        t.add_row(s.name, f"[{style.get(s.status, '')}]{s.status}[/]", f"{s.seconds:.2f}", escape(s.summary))
    return t


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
    from edgeq.orchestration.variants import VariantOptions, engine_of_run, implicit_baseline
    from edgeq.report.compare import diff_pair
    from edgeq.report.compare_gate import relative_gate

    if result.finished is None:
        return None
    opts = VariantOptions(accept_new_host_key=accept_new_host_key)
    base = implicit_baseline(result, target, opts, progress)
    if not base.built:  # a target-side failure: exit 1, as any other stage's
        raise EdgeqError(f"--baseline implicit: the implicit engine did not build: {base.error}", exit_code=1)
    return relative_gate(diff_pair(base, engine_of_run(result)))


@app.command("deploy", help=_DEPLOY_HELP,
             short_help="Build, profile and gate an engine on a target; --holdout: its accuracy there.")
def deploy_cmd(
    model: Path = typer.Argument(..., help="The ONNX model: Q/DQ (explicit INT8) or float."),
    target: TargetName = ...,  # type: ignore[assignment]
    accept_new_host_key: AcceptNewHostKey = False,
    runs_dir: RunsDir = Path("runs"),
    calib: Calib = None,
    preprocess: Preprocess = None,
    calibrator: CalibratorOpt = Calibrator.auto,
    percentile: Percentile = 99.99,
    placement: PlacementOpt = Placement.auto,
    placement_cache: Optional[Path] = typer.Option(
        None, "--placement-cache", metavar="DIR", rich_help_panel=QUANTIZE,
        help="auto's cache \\[default: ~/.cache/edgeq/placement].",
    ),
    overrides: Overrides = None,
    gate: Gate = None,
    baseline: Optional[str] = typer.Option(
        None, "--baseline", metavar="implicit", rich_help_panel=GATE,
        help="Also build implicit; --gate relative judges by it.",
    ),
    pipeline: Optional[Path] = typer.Option(
        None, "--pipeline", metavar="YAML", rich_help_panel=GATE, help="A pipeline file: its gate allowlist."
    ),
    # None: quantize's defaults (0.2, auto), not printed, so each option stays on one line of --help
    holdout: Holdout = None,
    metric: MetricOpt = None,  # type: ignore[assignment]
    min_cosine: MinCosine = None,
    min_metric: MinMetric = None,
    fp16: Fp16 = None,
    iterations: Iterations = 10,
    duration: Duration = 3.0,
    min_shapes: MinShapes = "",
    opt_shapes: OptShapes = "",
    max_shapes: MaxShapes = "",
    json_out: Json = False,
) -> int:
    from edgeq.orchestration.deploy import DeployOptions, deploy
    from edgeq.orchestration.run import load_pipeline
    from edgeq.remote.targets import resolve_target

    gate, accuracy_gate = _split_gate(gate)
    if placement == Placement.implicit and calib is None:
        raise typer.BadParameter("--placement implicit needs a float model and --calib (the implicit engine "
                                 "and its mirror come from one calibration)", param_hint="--calib")
    tgt = resolve_target(target or "")
    if placement == Placement.auto and (calib is None or overrides is not None or baseline is not None):
        # nothing to decide without data; overrides edit the rules' placement; --baseline implicit judges
        # the rules' against implicit (auto judges its own)
        placement = Placement.trt
    allow: tuple[str, ...] = ()
    require_fusion: Optional[bool] = None
    if pipeline is not None:
        pl = load_pipeline(pipeline)
        if pl.gate is not None:
            allow, require_fusion = pl.gate.allow, pl.gate.require_fusion
    auto = placement == Placement.auto
    options = DeployOptions(
        quantize=quantize_options(calib, preprocess=preprocess, calibrator=calibrator, percentile=percentile,
                                  placement=Placement.trt if auto else placement, overrides=overrides,
                                  holdout=holdout, metric=metric or "auto",
                                  min_cosine=min_cosine, min_metric=min_metric),
        accept_new_host_key=accept_new_host_key, gate_allow=allow,
        gate=_baseline_gate(gate, "implicit" if placement == Placement.implicit else baseline, calib),
        gate_require_fusion=require_fusion, runs_dir=runs_dir,
        profile=profile_settings(fp16, iterations, duration,
                                 shapes_given(min_shapes, opt_shapes, max_shapes)),
        accuracy_gate=accuracy_gate,
    )  # fmt: skip

    def event(line: str) -> None:
        if line.endswith(": started") or ": failed - " in line:
            return  # a failure is printed once, as the error line
        err.print(f"[dim]{escape(line)}[/]", highlight=False)

    mirrored = decided = None
    with progress_display(enabled=not json_out) as progress:
        if auto:
            from edgeq.orchestration.auto import AutoOptions, auto_applies, deploy_auto

            auto = auto_applies(model, options.quantize)  # a Q/DQ model is deployed as given
        if auto:
            decided = deploy_auto(model, tgt, options, AutoOptions(cache_dir=placement_cache),
                                  progress=progress, on_event=event)  # fmt: skip
            result, relative = decided.result, decided.relative  # type: Any, Any
        elif placement == Placement.implicit:
            from edgeq.orchestration.implicit import deploy_implicit

            mirrored = deploy_implicit(model, tgt, options, progress=progress, on_event=event)
            result, relative = mirrored.explicit, mirrored.relative
        else:
            result = deploy(model, tgt, options, progress=progress, on_event=event)
            relative = _relative_to_baseline(result, tgt, accept_new_host_key, progress) if baseline else None
    code = EXIT_OK if result.gate_passed and (relative is None or relative) else EXIT_CHECK_FAILED
    gate_result = result.finished.gate if result.finished is not None else None
    accuracy = result.finished.accuracy if result.finished is not None else None
    if json_out:
        print_json(
            {
                "run_dir": str(result.run_dir),
                "stages": [vars(s) for s in result.stages],
                "timings": result.timings,
                "gate": gate_result.to_dict() if gate_result is not None else None,
                "accuracy": accuracy.to_dict() if accuracy is not None else None,
                "relative_gate": relative.to_dict() if relative is not None else None,
                **({"implicit": mirrored.to_dict()} if mirrored is not None else {}),
                **({"placement": decided.to_dict()} if decided is not None else {}),
                "exit_code": code,
            }
        )
        return code
    print_table(_stage_table(result.stages), drop=("s",))
    if result.finished is not None:
        out.print(f"report: [bold]{escape(str(result.finished.report_html))}[/]")
    for note in mirrored.notes() if mirrored is not None else ():
        out.print(f"[cyan]implicit:[/] {escape(note)}", highlight=False)
    for note in decided.notes() if decided is not None else ():
        out.print(f"[cyan]auto:[/] {escape(note)}", highlight=False)
    if gate_result is not None:
        print_verdict(gate_result)
    if accuracy is not None:
        _print_accuracy(accuracy)
    if relative is not None:
        print_verdict(relative)
    out.print(f"run directory: [bold]{escape(str(result.run_dir))}[/]")
    return code


def _print_accuracy(acc: Any) -> None:
    """The accuracy section: the verdict line (green; red when it fails: a gate, or TensorRT far below
    FP32 with no bound of the user's; a yellow warning when TensorRT is below onnxruntime's prediction or
    does not follow it and no gate says so), then TensorRT's figures beside the prediction, and what a
    mismatch with the prediction means."""
    if not acc.passed:
        style, head = "bold red", "accuracy FAILED"
    elif acc.far_below or acc.mismatch:
        style, head = "bold yellow", "accuracy WARNING"
    else:
        style, head = ("green", "accuracy passed") if acc.gated else ("default", "accuracy")
    out.print(f"[{style}]{escape(head)}[/]: {escape(acc.held_text())} ({escape(acc.source)}), metric "
              f"{escape(acc.metric)} ({escape(acc.why)})", highlight=False)
    pairs = [(acc.engine, acc.predicted)] + ([] if acc.metric == "cosine" else [(acc.engine_cosine,
                                                                                 acc.predicted_cosine)])
    for got, want in pairs:
        beside = f"   onnxruntime Q/DQ: {escape(str(want))}" if want is not None else ""
        out.print(f"  TensorRT: {escape(str(got))}{beside}", highlight=False)
    if acc.agreement is not None:
        out.print(f"  TensorRT vs onnxruntime Q/DQ: {escape(acc.agreement_text())}", highlight=False)
    failures = acc.failures()
    for line in failures or acc.problems():
        out.print(f"  [{'bold red' if failures else 'bold yellow'}]{escape(line)}[/]", highlight=False)
    diagnosis = acc.diagnosis()
    if diagnosis is not None:
        out.print(f"  [{'bold red' if failures else 'bold yellow'}]{escape(diagnosis)}[/]", highlight=False)


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
    print_table(t, drop=("backend", "sm", "TensorRT"))
    for p in problems:
        out.print(f"[bold red]invalid:[/] {escape(p)}")
    return EXIT_CHECK_FAILED if problems else EXIT_OK


@targets_app.command(
    "check",
    help="Connect to a target (host key checked against its known_hosts), ship the edgeq agent, probe it "
    "(TensorRT version, GPU, compute capability, DLA cores, free memory and disk, Python) and compare with "
    "the file's 'tensorrt' and 'gpu.compute_capability'.\n\nExit codes: 0 the target is ready; 1 "
    "unreachable, no TensorRT or not what the file expects; 2 the target file is invalid, its host name "
    "does not resolve (not retried), or the host key or the login is refused (unknown/changed key, wrong "
    "identity file).",
)
def targets_check_cmd(
    name: str = typer.Argument(..., help="Target name (targets/NAME.yaml) or a YAML path."),
    accept_new_host_key: AcceptNewHostKey = False,
    json_out: Json = False,
) -> int:
    from edgeq.orchestration.deploy import check_target
    from edgeq.pipeline.stages import probe_from_facts
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
