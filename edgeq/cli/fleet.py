"""``edgeq fleet validate``, ``edgeq release`` and ``edgeq run`` (``edgeq.orchestration.fleet``, ``run``,
``edgeq.release``): one model on many targets, its release bundle, a whole pipeline file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from edgeq.cli.app import app
from edgeq.cli.options import (
    TARGET,
    AcceptNewHostKey,
    BuildOncePerKind,
    Calib,
    Calibrator,
    CalibratorOpt,
    Duration,
    Engine,
    EngineOpt,
    Fleet,
    Fresh,
    Gate,
    Holdout,
    Iterations,
    Json,
    Limit,
    MaxFail,
    MaxLoss,
    MaxShapes,
    MinShapes,
    OptShapes,
    Overrides,
    Placement,
    PlacementOpt,
    Preprocess,
    RunsDir,
    Workers,
    in_panel,
    profile_settings,
    quantize_options,
    shapes_given,
)
from edgeq.cli.output import (
    EXIT_CHECK_FAILED,
    EXIT_CODES_HELP,
    EXIT_OK,
    code_for,
    err,
    fit_table,
    out,
    print_json,
    print_table,
    print_wrapped,
    progress_display,
    width_of,
)
from edgeq.errors import EdgeqError
from edgeq.fs import output_file

fleet_app = typer.Typer(help="Validate a model on a fleet of targets at once (a fleet YAML or an Ansible "
                        "inventory).")
app.add_typer(fleet_app, name="fleet")

_ROW_STYLE = {"pending": "dim", "running": "cyan", "passed": "green", "failed": "bold red",
              "skipped": "yellow", "interrupted": "bold yellow"}


def _live_rows(rows: dict[str, Any]) -> Table:
    t = Table(title="fleet", expand=False)
    for col in ("target", "destination", "status", "stage"):
        t.add_column(col)
    for r in rows.values():
        st = _ROW_STYLE.get(r.status, "")
        t.add_row(escape(r.target), escape(r.destination), f"[{st}]{r.status}[/]", escape(r.stage))
    return t


def _verdict(r: Any) -> str:
    """The matrix's last cell: passed, FAILED and why in a word or two (the cause, or the stage it
    stopped in; the whole reason is printed below the table), or why the board has no verdict (skipped,
    interrupted)."""
    from edgeq.orchestration.fleet import failure

    word = f"FAILED ({failure(r)})" if r.status == "failed" else r.status
    return f"[{_ROW_STYLE.get(r.status, '')}]{escape(word)}[/]"


def _fleet_matrix(result: Any) -> Table:
    """The matrix, a row a target; a failed row says FAILED (a skipped one skipped), its reason goes on
    one line below the table (``_print_matrix``), not folded into a 40-line cell."""
    from edgeq.orchestration.fleet import matrix

    cells = matrix(result)
    t = Table(title=f"fleet: {escape(result.model.name)}", expand=False)
    numeric = {"p50 ms", "p99 ms", "qps"}
    for col in (cells[0].keys() if cells else ()):
        right = col in numeric
        t.add_column(col, no_wrap=right or col == "result", justify="right" if right else "left")
    for row, r in zip(cells, result.rows):
        t.add_row(*(escape(v) for v in list(row.values())[:-1]), _verdict(r))
    return t


# Least important first: what goes when the matrix does not fit the terminal. The descriptive columns go
# first (the report path is in the fleet directory, the GPU and TensorRT version in targets check, p99
# next to p50); what the board did (reachable, build) goes last, and the verdict with its reason never.
_MATRIX_DROP = ("report", "GPU (sm)", "TensorRT", "p99 ms", "build", "reachable")


def _print_matrix(result: Any, already: Any = frozenset()) -> None:
    """The matrix fitted to the terminal, saying which columns did not fit and where to see them, then
    each failed target's whole reason once, on its own line (not again for targets whose line
    ``_row_finished`` already printed); its row says it in a word or two (``_verdict``)."""
    from rich.measure import Measurement

    table = _fleet_matrix(result)
    columns = [str(c.header) for c in table.columns]
    whole = Measurement.get(out, out.options.update_width(1 << 16), _fleet_matrix(result)).maximum
    print_table(table, drop=_MATRIX_DROP, one_line=True)  # drops columns from ``table`` until it fits
    shown = {str(c.header) for c in table.columns}
    left_out = [c for c in columns if c not in shown]
    if left_out:
        print_wrapped(f"[dim]not shown at {width_of(out)} columns: {', '.join(left_out)} (--json has "
                      f"every column; so does a terminal {whole} wide, or COLUMNS={whole} when piped)[/]")
    for r in result.rows:
        if not r.passed and r.target not in already:
            style = _ROW_STYLE.get(r.status, "bold red")
            out.print(f"  [{style}]{escape(r.target)}:[/] {escape(r.error or r.gate_summary or 'failed')}")


_printed: set[str] = set()  # targets whose end ``_row_finished`` printed in this command


def _row_finished(row: Any) -> None:
    """Piped (CI logs): one line per target as it ends; its reason is then not repeated under the matrix."""
    if row.status in ("passed", "failed", "skipped", "interrupted"):
        from edgeq.orchestration.fleet import rerun_note

        style = _ROW_STYLE.get(row.status, "")
        note = ", ".join(x for x in (rerun_note(row), row.error) if x)
        err.print(f"  {escape(row.target)}: [{style}]{row.status}[/]" + (f", {escape(note)}" if note else ""))
        _printed.add(row.target)


def run_fleet(model: Path, fleet_path: Path, options: Any, *, live: bool, limit: Optional[str] = None) -> Any:
    """Load the fleet (cut to ``limit``) and validate, a live row per target on stderr when ``live``."""
    from rich.live import Live

    from edgeq.orchestration.fleet import validate
    from edgeq.orchestration.fleet_file import load_fleet

    fleet = load_fleet(fleet_path).limited(limit)
    _printed.clear()  # a new command (tests run many in one process)
    rows: dict[str, Any] = {}
    if not live:
        return validate(model, fleet, options)
    if not err.is_terminal:  # CI logs: one line per target as it finishes, no redrawn table
        return validate(model, fleet, options, on_row=_row_finished)
    with Live(_live_rows(rows), console=err, transient=True, refresh_per_second=4) as view:

        def on_row(row: Any) -> None:
            rows[row.target] = row
            view.update(fit_table(_live_rows(rows), width_of(err), err, drop=("destination",)))

        return validate(model, fleet, options, on_row=on_row)


def fleet_options(calib: Optional[Path], calibrator: Calibrator, preprocess: Optional[Path],
                  overrides: Optional[Path], gate: Optional[str], runs_dir: Path, accept_new_host_key: bool,
                  build_once_per_kind: bool, workers: Optional[int] = None, iterations: int = 10,
                  duration: float = 3.0, fresh: bool = False, max_fail: Optional[int] = None,
                  placement: Placement = Placement.trt, shapes: Any = None, max_loss: Optional[float] = None,
                  holdout: Optional[str] = None, engine: Engine = Engine.native) -> Any:
    from edgeq.orchestration.auto import AutoOptions
    from edgeq.orchestration.fleet import FleetOptions

    if placement == Placement.implicit:  # as pipeline and fleet files (edgeq.orchestration.run)
        raise typer.BadParameter("implicit is per target (edgeq deploy); a fleet takes auto (each board kind "
                                 "decides), trt or all", param_hint="--placement")  # fmt: skip
    if max_loss is not None and engine == Engine.ansible:
        raise typer.BadParameter("--max-loss weighs regions on each kind's first board, which --engine "
                                 "ansible does not do: leave out --engine ansible", param_hint="--max-loss")
    if max_loss is not None and calib is None:
        raise typer.BadParameter("--max-loss needs a float model and --calib (the first board of each kind "
                                 "weighs the regions on held-out data)", param_hint="--calib")

    quantize = quantize_options(calib, calibrator=calibrator, preprocess=preprocess, overrides=overrides,
                                placement=Placement.trt if placement == Placement.auto else placement,
                                holdout=holdout, max_loss=max_loss)
    # overrides edit the rules' placement; --max-loss weighs the rules' regions on each kind's first board
    auto = calib is not None and (max_loss is not None or (placement == Placement.auto and overrides is None))
    auto = auto and engine == Engine.native  # ansible: quantized once here, with the trt placement
    return FleetOptions(quantize=quantize, gate=gate, runs_dir=runs_dir, auto=AutoOptions() if auto else None,
                        accept_new_host_key=accept_new_host_key, build_once_per_kind=build_once_per_kind,
                        workers=workers, fresh=fresh, max_fail=max_fail, engine=engine.value,
                        profile=profile_settings(None, iterations, duration, shapes))  # fmt: skip


@fleet_app.command(
    "validate",
    help="A row a target; a re-run reuses passed rows. Exit: 0 passed, 1 failed, 2 bad input, 130 Ctrl-C.",
    short_help="One model on every target of a fleet at once.",
)
def fleet_validate_cmd(
    model: Path = typer.Argument(..., help="The ONNX model: Q/DQ (explicit INT8) or float."),
    fleet: Fleet = ...,  # type: ignore[assignment]
    limit: Limit = None,
    max_fail: MaxFail = None,
    fresh: Fresh = False,
    accept_new_host_key: AcceptNewHostKey = False,
    runs_dir: RunsDir = Path("runs"),
    workers: Workers = None,
    calib: Calib = None,
    preprocess: Preprocess = None,
    calibrator: CalibratorOpt = Calibrator.auto,
    overrides: Overrides = None,
    placement: PlacementOpt = Placement.auto,
    holdout: Holdout = None,  # type: ignore[assignment]
    max_loss: MaxLoss = None,
    gate: Gate = None,
    # one screen of --help: the Build and profile panel folds into Target here
    build_once_per_kind: Annotated[bool, in_panel(BuildOncePerKind, TARGET)] = False,
    iterations: Annotated[int, in_panel(Iterations, TARGET)] = 10,
    duration: Annotated[float, in_panel(Duration, TARGET)] = 3.0,
    min_shapes: Annotated[str, in_panel(MinShapes, TARGET)] = "",
    opt_shapes: Annotated[str, in_panel(OptShapes, TARGET)] = "",
    max_shapes: Annotated[str, in_panel(MaxShapes, TARGET)] = "",
    junit: Optional[Path] = typer.Option(
        None, "--junit", metavar="FILE", parser=output_file,
        help="Also write JUnit XML (a testcase a target)."
    ),
    engine: EngineOpt = Engine.native,
    json_out: Json = False,
) -> int:
    from edgeq.fs import atomic_write_text, check_writable
    from edgeq.orchestration.fleet import junit_xml

    assert fleet is not None  # required
    if junit is not None:
        check_writable(junit, inputs=(model, fleet))
    options = fleet_options(calib, calibrator, preprocess, overrides, gate, runs_dir, accept_new_host_key,
                            build_once_per_kind, workers, iterations, duration, fresh, max_fail,
                            placement, shapes_given(min_shapes, opt_shapes, max_shapes), max_loss,
                            holdout, engine)  # fmt: skip
    result = run_fleet(model, fleet, options, live=not json_out, limit=limit)
    code = result.exit_code
    if junit is not None:
        atomic_write_text(junit, junit_xml(result))
    if json_out:
        print_json({**result.to_dict(), "exit_code": code})
        return code
    _print_matrix(result, _printed)
    passed = sum(r.passed for r in result.rows)
    where = f"fleet directory: [bold]{escape(str(result.fleet_dir))}[/]"
    if result.interrupted:  # fleet.json (and --junit) hold the targets that finished
        finished = sum(r.status in ("passed", "failed") for r in result.rows)
        out.print(f"[bold yellow]interrupted[/]: {finished}/{len(result.rows)} targets finished ({passed} "
                  f"passed); {where}")  # fmt: skip
        return code
    style = "green" if result.passed else "bold red"
    out.print(f"[{style}]{passed}/{len(result.rows)} targets passed[/]; {where}")
    return code


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
    "'edgeq release verify' checks a bundle, 'edgeq release inspect' prints its manifest, 'edgeq release "
    "sign' signs it with an SSH key; 'edgeq release install' puts it on a fleet's boards, 'edgeq release "
    "rollback' takes them back a version.",
    short_help="A reproducible bundle of a passed fleet; verify, sign, install and roll back.",
)
app.add_typer(release_app, name="release")


@release_app.command(
    "create",
    help="Validate MODEL on --fleet (as 'edgeq fleet validate', --limit included) and bundle the result, or "
    "bundle an earlier fleet directory (--from). Only a fleet where every target passed is released.\n\n"
    + EXIT_CODES_HELP,
)
def release_create_cmd(
    model: Optional[Path] = typer.Argument(None, help="The ONNX model (with --fleet)."),
    output: Path = typer.Option(..., "-o", "--output", metavar="FILE", parser=output_file,
                                help="The bundle to write (.tar.gz)."),
    fleet: Fleet = None,
    limit: Limit = None,
    from_dir: Optional[Path] = typer.Option(
        None, "--from", metavar="DIR", help="A fleet directory (edgeq fleet validate)."
    ),
    runs_dir: RunsDir = Path("runs"),
    calib: Calib = None,
    preprocess: Preprocess = None,
    calibrator: CalibratorOpt = Calibrator.auto,
    overrides: Overrides = None,
    gate: Gate = None,
    build_once_per_kind: BuildOncePerKind = True,
    json_out: Json = False,
) -> int:
    from edgeq.fs import check_writable
    from edgeq.release.bundle import build_bundle

    if (from_dir is None) == (model is None or fleet is None):
        raise EdgeqError("give MODEL --fleet FILE, or --from FLEET_DIR (one of them)")
    if from_dir is not None and limit is not None:
        raise EdgeqError("--limit picks the boards MODEL --fleet validates; a fleet directory (--from) holds "
                         "the boards its run validated", "validate the boards you mean, then release --from")
    check_writable(output, inputs=tuple(p for p in (model, fleet) if p is not None))
    if from_dir is None:
        assert model is not None and fleet is not None
        options = fleet_options(calib, calibrator, preprocess, overrides, gate, runs_dir, False,
                                build_once_per_kind)  # fmt: skip
        result = run_fleet(model, fleet, options, live=not json_out, limit=limit)
        if not json_out:
            _print_matrix(result, _printed)
        if result.interrupted:
            return int(result.exit_code)
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
    print_table(t, drop=("JetPack", "file", "sm", "built on"))
    files = m.get("files") or []
    out.print(f"{len(files)} files, {sum(int(f.get('size', 0)) for f in files)} bytes; targets: "
              + ", ".join(escape(str(x.get("name"))) for x in m.get("targets") or []))


@release_app.command(
    "verify",
    help="Check a bundle: the manifest's own hash, then every file's sha256 and size, and files the "
    "manifest does not list. Each problem is printed with its kind: \\[manifest] edited manifest, "
    "\\[modified] a file changed, \\[missing] a listed file absent, \\[extra] an unlisted file. With "
    "--allowed-signers, also who signed it: BUNDLE.sig checked with 'ssh-keygen -Y verify' (namespace "
    "edgeq-release) against that file (git's allowed-signers format); \\[signature] when it is unsigned, "
    "untrusted or does not match.\n\n"
    "Exit codes: 0 the bundle is intact (and signed by a listed key); 1 a problem was found (or the archive "
    "is corrupt); 2 no such file, or not a .tar.gz bundle at all; 130 Ctrl-C.",
    short_help="Check a bundle against its manifest (and who signed it, with --allowed-signers).",
)
def release_verify_cmd(
    bundle: Path = typer.Argument(..., help="The bundle (.tar.gz)."),
    allowed_signers: Optional[Path] = typer.Option(
        None, "--allowed-signers", metavar="FILE",
        help="ssh-keygen allowed-signers file: the bundle must be signed by one of its keys."),
    json_out: Json = False,
) -> int:
    from edgeq.release.bundle import verify
    from edgeq.release.sign import SignatureError, verify_signature

    v = verify(bundle)
    signer, unsigned = None, None
    if allowed_signers is not None:
        try:
            signer = verify_signature(bundle, allowed_signers)
        except SignatureError as e:
            unsigned = e
    code = code_for(bool(v) and unsigned is None)
    if json_out:
        print_json({"ok": code == EXIT_OK, "checked": v.checked, "exit_code": code,
                    "problems": [vars(p) for p in v.problems],
                    "signer": vars(signer) if signer else None,
                    "signature_error": str(unsigned) if unsigned else None})  # fmt: skip
        return code
    for p in v.problems:
        out.print(f"[bold red]{escape(str(p))}[/]")
    out.print(("[green]" if v else "[bold red]") + escape(v.summary()) + "[/]")
    if unsigned is not None:
        out.print(f"[bold red]\\[signature] {escape(str(unsigned))}[/]")
    elif signer is not None:
        out.print(f"[green]signed by {escape(signer.principal)}[/] ({escape(signer.detail)})")
    return code


@release_app.command(
    "inspect",
    help="Print a bundle's manifest: versions, engines per kind, files (read, not checked: 'edgeq release "
    "verify' checks).\n\nExit codes: 0 printed; 2 no such file, not a bundle, or no manifest to read (an "
    "archive that does not read back, no manifest.json); 130 Ctrl-C.",
    short_help="Print a bundle's manifest: versions, engines per kind, files.",
)
def release_inspect_cmd(
    bundle: Path = typer.Argument(..., help="The bundle (.tar.gz)."),
    json_out: Json = False,
) -> int:
    from edgeq.release.bundle import inspect

    manifest = inspect(bundle)
    if json_out:
        print_json(manifest)
    else:
        _render_manifest(manifest)
    return EXIT_OK


# --------------------------------------------------------------------------------------------------
# edgeq run  (edgeq.orchestration.run)
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
    short_help="A whole pipeline from one file, resumable stage by stage.",
)
def run_cmd(
    pipeline: Path = typer.Argument(..., help="The pipeline YAML."),
    force: bool = typer.Option(False, "--force", help="Run every stage, changed or not."),
    limit: Limit = None,
    max_fail: MaxFail = None,
    fresh: Fresh = False,
    json_out: Json = False,
) -> int:
    from edgeq.orchestration.run import run_pipeline

    def show(stage: Any) -> None:
        if not json_out:
            style = _OUTCOME_STYLE.get(stage.status, "")
            out.print(f"{stage.name:<8} [{style}]{stage.status:<8}[/] {escape(stage.summary)}")

    def on_row(row: Any) -> None:  # one line per target as it finishes (the progress bar is live)
        if not json_out:
            _row_finished(row)

    _printed.clear()
    with progress_display(enabled=not json_out) as progress:
        result = run_pipeline(pipeline, on_stage=show, on_row=on_row, progress=progress, force=force,
                              fresh=fresh, limit=limit, max_fail=max_fail)
    code = EXIT_OK if result.passed else result.fleet.exit_code if result.fleet else EXIT_CHECK_FAILED
    if json_out:
        print_json({"work_dir": str(result.work_dir), "stages": [vars(s) for s in result.stages],
                    "passed": result.passed, "exit_code": code})  # fmt: skip
        return code
    if result.fleet is not None:
        _print_matrix(result.fleet, _printed)
    out.print(f"work directory: [bold]{escape(str(result.work_dir))}[/]")
    return code
