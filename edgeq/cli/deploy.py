"""``edgeq deploy`` and ``edgeq targets`` (``edgeq.orchestration.deploy``): one model built and proved on
one target, and the target files themselves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from edgeq.cli.app import app
from edgeq.cli.options import (
    GATE,
    QUANTIZE,
    TARGET,
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
    MaxLoss,
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
    Weights,
    WeightsOpt,
    in_panel,
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
from edgeq.text import plural

# One screen (tests/test_cli_help.py) leaves no room for text: what deploy does (its stages and run
# directory, --holdout and --gate accuracy, the exit codes) is in the docs site (docs/deploy.md, and
# docs/accuracy.md "Accuracy on the target") and in `edgeq --help`'s line (short_help).
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
    weights: WeightsOpt = Weights.auto,
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
    max_loss: MaxLoss = None,
    # one screen of --help: the Build and profile panel folds into Target here (--fp16's two names into the
    # general options, where its extra column wraps nothing)
    fp16: Annotated[Optional[bool], in_panel(Fp16, "Options")] = None,
    iterations: Annotated[int, in_panel(Iterations, TARGET)] = 10,
    duration: Annotated[float, in_panel(Duration, TARGET)] = 3.0,
    min_shapes: Annotated[str, in_panel(MinShapes, TARGET)] = "",
    opt_shapes: Annotated[str, in_panel(OptShapes, TARGET)] = "",
    max_shapes: Annotated[str, in_panel(MaxShapes, TARGET)] = "",
    json_out: Json = False,
) -> int:
    from edgeq.orchestration.deploy import DeployOptions, deploy
    from edgeq.orchestration.run import load_pipeline
    from edgeq.remote.targets import resolve_target

    gate, accuracy_gate = _split_gate(gate)
    budget = max_loss is not None
    if budget:
        placement = _budget_placement(placement, calib, gate)
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
    judged_by = "implicit" if placement == Placement.implicit else None if budget else baseline
    options = DeployOptions(
        quantize=quantize_options(calib, preprocess=preprocess, calibrator=calibrator, percentile=percentile,
                                  placement=Placement.trt if auto else placement, overrides=overrides,
                                  holdout=holdout, metric=metric or "auto",
                                  min_cosine=min_cosine, min_metric=min_metric, max_loss=max_loss,
                                  weights=weights),
        accept_new_host_key=accept_new_host_key, gate_allow=allow,
        gate=_baseline_gate(gate, judged_by, calib),
        gate_require_fusion=require_fusion, runs_dir=runs_dir,
        profile=profile_settings(fp16, iterations, duration,
                                 shapes_given(min_shapes, opt_shapes, max_shapes)),
        accuracy_gate=accuracy_gate,
    )  # fmt: skip

    def event(line: str) -> None:
        if line.endswith(": started") or ": failed - " in line:
            return  # a failure is printed once, as the error line
        err.print(f"[dim]{escape(line)}[/]", highlight=False)

    mirrored = None
    decided: Any = None
    with progress_display(enabled=not json_out) as progress:
        if auto:
            from edgeq.orchestration.auto import auto_applies

            auto = auto_applies(model, options.quantize)  # a Q/DQ model is deployed as given
        if budget or auto:
            from edgeq.orchestration.auto import AutoOptions

            cached = AutoOptions(cache_dir=placement_cache)
        if budget:
            from edgeq.orchestration.budget import deploy_budget

            decided = deploy_budget(model, tgt, options, cached, implicit=baseline is not None,
                                    progress=progress, on_event=event)  # fmt: skip
            result, relative = decided.result, None  # type: Any, Any
        elif auto:
            from edgeq.orchestration.auto import deploy_auto

            decided = deploy_auto(model, tgt, options, cached, progress=progress, on_event=event)
            result, relative = decided.result, decided.relative
        elif placement == Placement.implicit:
            from edgeq.orchestration.implicit import deploy_implicit

            mirrored = deploy_implicit(model, tgt, options, progress=progress, on_event=event)
            result, relative = mirrored.explicit, mirrored.relative
        else:
            result = deploy(model, tgt, options, progress=progress, on_event=event)
            relative = _relative_to_baseline(result, tgt, accept_new_host_key, progress) if baseline else None
    reached = not budget or decided.reached
    code = EXIT_OK if result.gate_passed and (relative is None or relative) and reached else EXIT_CHECK_FAILED
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
                **({"budget" if budget else "placement": decided.to_dict()} if decided is not None else {}),
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
        out.print(f"[cyan]{'budget' if budget else 'auto'}:[/] {escape(note)}", highlight=False)
    if budget and decided is not None:
        _print_budget(decided.budget)
    if gate_result is not None:
        print_verdict(gate_result)
    if accuracy is not None:
        _print_accuracy(accuracy)
    if relative is not None:
        print_verdict(relative)
    out.print(f"run directory: [bold]{escape(str(result.run_dir))}[/]")
    return code


def _budget_placement(placement: Placement, calib: Optional[Path], gate: Optional[str]) -> Placement:
    """--max-loss weighs the rules' regions (what --overrides excludes) on the target: placement trt or all
    (auto's default becomes trt), a float model with --calib, and the int8 gate (not --gate relative)."""
    if calib is None:
        raise typer.BadParameter("--max-loss needs a float model and --calib (the regions are weighed on "
                                 "held-out data)", param_hint="--calib")
    if placement == Placement.implicit:
        raise typer.BadParameter("--max-loss weighs the rules' regions: placement trt, all or auto (trt)",
                                 param_hint="--placement")
    if gate == "relative":
        raise typer.BadParameter("--max-loss times its engine beside full INT8 and FP16; use --baseline "
                                 "implicit to add implicit INT8 (no relative gate)", param_hint="--gate")
    return Placement.trt if placement == Placement.auto else placement


def _print_budget(d: dict[str, Any]) -> None:
    """The engines side by side (accuracy and qps), then the verdict line and the files."""
    t = Table(title=f"--max-loss {d['max_loss']:g} on {escape(str(d.get('target', '')))}", expand=False)
    for col, right in (("engine", False), ("what", False), ("onnxruntime (host)", False),
                       ("TensorRT (target)", False), ("qps", True), ("x full INT8", True)):
        t.add_column(col, justify="right" if right else "left", no_wrap=right or col == "engine")
    for r in d["rows"]:
        style = "bold" if r["name"] == "chosen" else ""
        t.add_row(*(f"[{style}]{escape(v)}[/]" if style else escape(v) for v in (
            r["name"], r.get("what") or "", r.get("host") or "-", r.get("target") or "-",
            "-" if r.get("qps") is None else f"{r['qps']:.0f}",
            "-" if r.get("ratio") is None else f"{r['ratio']:.3f}")))
    print_table(t, drop=("what", "TensorRT (target)"))
    out.print(f"[dim]qps: {escape(d.get('timed', ''))}; {escape(d.get('model_note', ''))}[/]",
              highlight=False)
    style = "green" if d.get("reached") else "bold red"
    out.print(f"[{style}]{escape(d['summary'])}[/]", highlight=False)


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


targets_app = typer.Typer(help="Target files (targets/*.yaml): add one for a board, list them, check one "
                          "against its machine.")
app.add_typer(targets_app, name="targets")


@targets_app.command(
    "list",
    help="List targets/*.yaml in the current directory and whether each file is valid (offline: the file is "
    "checked, no board is contacted; 'edgeq targets check NAME' connects). A file marked 'example: true' "
    "(the edgeq repository's templates) is listed as an example, not as a board. Exit 1 when a file is "
    "invalid, naming the key at fault.",
)
def targets_list_cmd() -> int:
    from edgeq.remote.targets import TARGETS_DIR, list_target_files, load_target

    files = list_target_files()
    if not files:
        err.print(f"no target files in ./{TARGETS_DIR}/ (examples: the edgeq repository's targets/)")
        return EXIT_OK
    t = Table(title=f"./{TARGETS_DIR}", expand=False)
    for col in ("name", "host", "backend", "TensorRT", "sm", "file"):
        t.add_column(col, overflow="fold")
    problems: list[str] = []
    examples = 0
    for path in files:
        try:
            tg = load_target(path)
        except EdgeqError as e:
            problems.append(str(e))
            t.add_row(path.stem, "", "", "", "", "[bold red]invalid[/]")
            continue
        where = f"{tg.user}@{tg.host}:{tg.port}" + (f" via {tg.jump_host}" if tg.jump_host else "")
        where = "this machine (no SSH)" if tg.is_local else where
        examples += tg.example
        t.add_row(
            tg.name, escape(where), tg.backend, tg.tensorrt or "-", tg.compute_capability or "-",
            "[yellow]example[/]" if tg.example else "[green]valid[/]",
        )
    print_table(t, drop=("backend", "sm", "TensorRT"))
    for p in problems:
        out.print(f"[bold red]invalid:[/] {escape(p)}")
    err.print("[dim]files checked offline, no board contacted: 'edgeq targets check NAME' connects[/]")
    if examples:
        err.print(f"[dim]{plural(examples, 'example')}: a template naming no real board (example: true); "
                  "copy it, set host, user and identity_file to your board's, drop 'example: true'[/]")
    return EXIT_CHECK_FAILED if problems else EXIT_OK


@targets_app.command(
    "add",
    help="Write targets/NAME.yaml for a board reached over SSH as [USER@]HOST, as ssh reaches it: "
    "~/.ssh/config's HostName, Port, User, IdentityFile and ProxyJump apply. The key: -i FILE, else "
    "~/.ssh/config's, else ~/.ssh/id_rsa, id_ecdsa or id_ed25519, else a running ssh-agent. Nothing "
    "connects: the host key is looked up in known_hosts; 'edgeq targets check NAME' is the first "
    "connection. An existing file is never overwritten.\n\nExit codes: 0 written; 2 the file exists, "
    "the name, host or port is invalid, or no key is found; 130 interrupted.",
)
def targets_add_cmd(
    name: str = typer.Argument(..., help="The target's name: targets/NAME.yaml, --target NAME."),
    host: str = typer.Option(..., "--host", metavar="[USER@]HOST", help="The board, as ssh names it."),
    port: Optional[int] = typer.Option(None, "--port", metavar="N", min=1, max=65535,
                                       help="Its sshd's port \\[default: ~/.ssh/config's, else 22]."),
    key: Optional[str] = typer.Option(None, "--identity-file", "-i", metavar="FILE",
                                      help="The private key to log in with (ssh -i)."),
) -> int:
    from edgeq.remote.newtarget import add_target

    new = add_target(name, host, port=port, key=key)
    t = new.target
    reached = f", reached at {new.reached}" if new.reached else ""
    out.print(f"wrote [bold]targets/{escape(name)}.yaml[/]: {escape(t.user)}@{escape(t.host)}"
              f"{escape(reached)}, key {escape(new.key)}, backend {t.backend}, TensorRT {t.tensorrt}")
    where = _home(new.known_hosts)
    if new.host_key:
        out.print(f"host key: {escape(new.host_key)} in {escape(where)} (as {escape(new.known_as)})")
    else:
        out.print(f"host key: none in {escape(where)} for {escape(new.known_as)} yet: 'edgeq targets check "
                  f"{escape(name)} --accept-new-host-key' records it on first contact (or ssh to it once)")
    out.print(f"next: edgeq targets check {escape(name)}")
    return EXIT_OK


def _home(path: Path) -> str:
    home = Path("~").expanduser()
    return f"~/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)


@targets_app.command(
    "check",
    help="Connect to a target (host key checked against its known_hosts), ship the edgeq agent, probe it "
    "(TensorRT version, GPU, compute capability, DLA cores, free memory and disk, Python) and compare with "
    "the file's 'tensorrt' and 'gpu.compute_capability'.\n\nExit codes: 0 the target is ready; 1 "
    "unreachable, no TensorRT or not what the file expects; 2 the target file is invalid, its host name "
    "does not resolve (not retried), or the host key or the login is refused (unknown/changed key, wrong "
    "identity file); 130 Ctrl-C.",
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
