"""``edgeq sensitivity`` (``edgeq.quant.sensitivity``): which Q/DQ regions cost the task metric."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from edgeq.cli.app import app
from edgeq.cli.options import (
    Budget,
    Calib,
    Calibrator,
    CalibratorOpt,
    EngineRun,
    Holdout,
    Json,
    MaxLoss,
    MetricOpt,
    Overrides,
    Percentile,
    Placement,
    PlacementOpt,
    Preprocess,
    Weights,
    WeightsOpt,
    quantize_options,
)
from edgeq.cli.output import EXIT_CODES_HELP, err, out, print_json, print_table, progress_display
from edgeq.fs import output_dir

_HELP = (
    "Which Q/DQ regions cost the task metric: calibrate once, run the FP32 model once on the held-out "
    "samples, then quantize one region at a time (only it INT8) and all but one (everything INT8 except "
    "it), score each with --metric and rank the regions by what keeping them float recovers.\n\n"
    "A region is a scale group with the nodes that read it in INT8: its nodes are what an --overrides "
    "file's exclude takes ('edgeq quantize --max-loss X' writes that file for you). Regions are tried "
    "most clipped first (max |x| over the calibrated amax); --max-regions and --budget bound the cost and "
    "the output says what was skipped. Writes sensitivity.json and sensitivity.html into -o "
    "(default <model>.sensitivity/); Ctrl-C keeps what finished.\n\n" + EXIT_CODES_HELP
)


@app.command("sensitivity", help=_HELP, short_help="Rank Q/DQ regions by what they cost the task metric.")
def sensitivity_cmd(
    model: Path = typer.Argument(..., help="The float ONNX model."),
    calib: Calib = None,
    holdout: Holdout = None,
    metric: MetricOpt = "auto",
    preprocess: Preprocess = None,
    calibrator: CalibratorOpt = Calibrator.auto,
    percentile: Percentile = 99.99,
    weights: WeightsOpt = Weights.auto,
    placement: PlacementOpt = Placement.trt,
    overrides: Overrides = None,
    max_regions: int = typer.Option(
        20, "--max-regions", metavar="N", help="Score at most N regions (the most clipped).",
    ),
    budget: Budget = None,
    engine: EngineRun = None,
    max_loss: MaxLoss = None,
    output: Optional[Path] = typer.Option(
        None, "-o", "--output", metavar="DIR", parser=output_dir,
        help="Where to write \\[default: <model>.sensitivity/].",
    ),
    json_out: Json = False,
) -> int:
    from edgeq.errors import QuantError
    from edgeq.orchestration.tune import parse_budget
    from edgeq.quant.sensitivity import SensitivityOptions, sensitivity_file

    if calib is None:
        raise QuantError("sensitivity needs calibration data (--calib DIR)")
    q = quantize_options(calib, preprocess=preprocess, calibrator=calibrator, percentile=percentile,
                         placement=placement, overrides=overrides, holdout=holdout,
                         metric=metric, max_loss=max_loss, weights=weights)  # fmt: skip
    options = SensitivityOptions(q, max_regions=max_regions, engine=engine,
                                 budget_s=parse_budget(budget) if budget is not None else None)  # fmt: skip
    with progress_display(enabled=not json_out) as progress:
        result = sensitivity_file(model, options, output, progress)
    code = 130 if result.interrupted else 0
    if json_out:
        print_json({**result.to_dict(), "exit_code": code})
    else:
        _render(result)
    if result.interrupted:
        err.print("interrupted")
    return code


def _render(result: Any) -> None:
    d = result.to_dict()
    title = (f"edgeq sensitivity: {escape(d['all_int8']['text'])} with every region INT8, loss "
             f"{d['loss']:.4f} ({escape(d['metric'])}, {d['samples']} held-out samples)")
    t = Table(title=title, expand=False)
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("region", overflow="fold")
    t.add_column("nodes", overflow="fold")
    for col in ("alone", "all but one", "recovered"):
        t.add_column(col, justify="right", no_wrap=True)
    for i, r in enumerate(d["ranked"], start=1):
        more = len(r["nodes"]) - 3
        nodes = ", ".join(r["nodes"][:3]) + (f", ... {more} more" if more > 0 else "")
        alone = "-" if r["alone"] is None else f"{r['alone']:.4f}"
        t.add_row(str(i), escape(r["name"]), escape(nodes), alone, f"{r['all_but_one']:.4f}",
                  f"{r['recovered']:+.4f}")
    print_table(t, drop=("region",))
    out.print(f"metric {escape(d['metric'])} ({escape(d['metric_chosen_by'])}); {d['scored']} of "
              f"{d['regions']} regions scored in {d['seconds']:.0f} s")
    for s in d["skipped"]:
        out.print(f"[yellow]not scored:[/] {len(s['regions'])} region(s) ({escape(s['why'])})")
    for note in d["notes"]:
        err.print(f"[yellow]note:[/] {escape(note)}")
    if d["advice"]:
        out.print(escape(d["advice"]))
    engine = d.get("engine")
    if engine is not None:
        how = "measured" if engine["qps_measured"] else "from its profile"
        out.print(f"priced on {escape(engine['path'])} ({engine['qps']:.0f} qps {how}); the page draws "
                  "accuracy against qps")
        if engine.get("budget"):
            b = engine["budget"]
            style = "green" if b["reached"] else "bold red"
            nodes = ", ".join(b["nodes"][:4]) + (" ..." if len(b["nodes"]) > 4 else "")
            out.print(f"[{style}]--max-loss {b['max_loss']:g}: {len(b['regions'])} region(s) float "
                      f"({escape(nodes)}), modelled +{b['cost']['ms'] * 1000:.1f} us; "
                      f"{escape(b['after']['text'])}[/] (deploy --max-loss builds and times it)")
    files = result.files
    if files:
        out.print(f"wrote [bold]{escape(files['json'])}[/] and [bold]{escape(files['html'])}[/]")
