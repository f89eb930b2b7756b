"""``edgeq tune`` (``edgeq.orchestration.tune``): placement decided by the target's own timings."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from edgeq.cli.app import app
from edgeq.cli.options import (
    TARGET,
    AcceptNewHostKey,
    Budget,
    Calib,
    Calibrator,
    CalibratorOpt,
    Json,
    MinCosine,
    Overrides,
    Percentile,
    Placement,
    PlacementOpt,
    TargetName,
    quantize_options,
)
from edgeq.cli.output import EXIT_CODES_HELP, code_for, out, print_json, progress_display
from edgeq.fs import output_dir

_HELP = (
    "Placement decided by the target's own timings: calibrate once, build implicit INT8 on the target, "
    "start from what --placement auto decided there (cached), else its mirror (judged and cached as deploy "
    "decides), then toggle one decision "
    "point at a time, each built, profiled and kept only if faster in --rounds alternating timings and "
    "within --min-cosine (trt or --overrides: start from the rules, also the fallback).\n\n"
    "Writes the tuned Q/DQ model, its calibration cache, tune.json and tune.html; run it again with the "
    "same --output to resume. A target file with 'host: local' builds on this machine's GPU.\n\n"
    + EXIT_CODES_HELP
)


@app.command("tune", help=_HELP, short_help="Q/DQ placement decided by the target's own timings.")
def tune_cmd(
    ctx: typer.Context,
    model: Path = typer.Argument(..., help="The float ONNX model."),
    target: TargetName = ...,  # type: ignore[assignment]
    accept_new_host_key: AcceptNewHostKey = False,
    trtexec: Optional[str] = typer.Option(
        None, "--trtexec", metavar="PATH", rich_help_panel=TARGET,
        help="trtexec on the target (overrides the target file; implies backend trtexec).",
    ),
    calib: Calib = ...,  # type: ignore[assignment]
    calibrator: CalibratorOpt = Calibrator.auto,
    percentile: Percentile = 99.99,
    min_cosine: MinCosine = 0.99,
    placement: PlacementOpt = Placement.auto,
    overrides: Overrides = None,
    budget: Budget = "20m",
    rounds: int = typer.Option(
        3, "--rounds", metavar="N", min=0, help="Paired re-timing rounds a decision (0: single timings)."
    ),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", metavar="DIR", parser=output_dir,
        help="Output and resume directory \\[default: <model>.tune/]."
    ),
    json_out: Json = False,
) -> int:
    import dataclasses

    from edgeq.orchestration.auto import AutoOptions
    from edgeq.orchestration.tune import TuneOptions, parse_budget, tune
    from edgeq.remote.targets import resolve_target

    # the default start falls back to the rules when implicit does not mirror; one asked for does not
    source = ctx.get_parameter_source("placement")
    fallback = source is None or source.name == "DEFAULT"
    if placement == Placement.all:
        raise typer.BadParameter("tune starts from trt (the rules) or implicit (the mirror of the implicit "
                                 "engine)", param_hint="--placement")  # fmt: skip
    if overrides is not None and fallback:  # nodes kept float on purpose: the rules' start honours them
        placement = Placement.trt
    auto = placement == Placement.auto  # the placement cache's decision, else the mirror (as implicit)
    placement = Placement.implicit if auto else placement
    quantize = quantize_options(calib, calibrator=calibrator, percentile=percentile, min_cosine=min_cosine,
                                placement=placement, overrides=overrides)  # fmt: skip
    options = TuneOptions(quantize=quantize, out_dir=output, budget_s=parse_budget(budget or "20m"),
                          accept_new_host_key=accept_new_host_key, rounds=rounds,
                          fallback=fallback, auto=AutoOptions() if auto else None)  # fmt: skip
    tgt = resolve_target(target or "")
    if trtexec is not None:
        tgt = dataclasses.replace(tgt, trtexec=trtexec, backend="trtexec")
    with progress_display(enabled=not json_out) as progress:
        result = tune(model, tgt, options, progress=progress)
    code = code_for(all(g.get("passed", False) for g in result.gate.values()) if result.gate else False)
    if json_out:
        print_json({**result.to_dict(), "exit_code": code})
        return code
    for e in result.decisions:
        cand = e["candidate"] or {}
        mark = "[green]kept[/]" if e["kept"] else "[dim]-[/]"
        out.print(f"{escape(e['decision'])}: {e['tried']} -> {cand.get('qps')} qps {mark} "
                  f"({escape(e['chosen_by'])})")  # fmt: skip
    out.print(f"started from {escape(result.started)}")
    stopped = f"; {result.stopped}" if result.stopped else ""
    how = f"{result.speedup}x" + (f" in {result.final['rounds']} paired rounds" if result.final else "")
    out.print(f"implicit {result.implicit.qps} qps, tuned {result.best.qps} qps ({how}); "
              f"{result.built} built, {result.reused} reused{stopped}")  # fmt: skip
    for name, g in result.gate.items():
        out.print(f"{name} gate: {'[green]passed[/]' if g.get('passed') else '[bold red]failed[/]'}")
    for key in ("model", "cache", "html"):
        out.print(f"wrote [bold]{escape(result.files[key])}[/]")
    return code
