"""``edgeq quantize`` (``edgeq.quant``): a float model to explicit INT8, and the implicit path's cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from edgeq.cli.app import app
from edgeq.cli.options import (
    QUANTIZE,
    Calib,
    Calibrator,
    CalibratorOpt,
    EngineRun,
    Holdout,
    Json,
    MaxLoss,
    MetricOpt,
    MinCosine,
    MinMetric,
    Overrides,
    Percentile,
    Placement,
    PlacementOpt,
    Preprocess,
    Synthetic,
    Weights,
    WeightsOpt,
    quantize_options,
)
from edgeq.cli.output import (
    EXIT_CODES_HELP,
    EXIT_OK,
    code_for,
    err,
    out,
    print_json,
    print_table,
    progress_display,
    render_findings,
)
from edgeq.findings import Level
from edgeq.fs import output_file
from edgeq.text import plural

_HELP = (
    "Quantize a float ONNX model to explicit INT8 (Q/DQ) placed so TensorRT 8.6 fuses, and write the "
    "implicit path's calibration cache from the same statistics.\n\n"
    "Writes <name>.int8.onnx, <name>.int8.cache with <name>.int8.fp32.onnx, and <name>.int8.json; then "
    "checks Q/DQ, computed as the engine computes it, against FP32 by the task's metric on --holdout "
    "(default: --calib). Far below FP32 fails unless --min-metric bounds it. 'edgeq rules' explains the "
    "placement.\n\n" + EXIT_CODES_HELP
)


@app.command("quantize", help=_HELP, short_help="Post-training INT8 quantization placed for TensorRT 8.6.")
def quantize_cmd(
    model: Path = typer.Argument(..., help="The float ONNX model (with its external data beside it)."),
    output: Optional[Path] = typer.Option(
        None, "-o", "--output", metavar="PATH", parser=output_file,
        help="The Q/DQ model \\[default: <name>.int8.onnx]."
    ),
    cache: Optional[Path] = typer.Option(
        None, "--cache", metavar="PATH", parser=output_file,
        help="The calibration cache \\[default: -o's name, .cache]."
    ),
    calib: Calib = None,
    synthetic: Synthetic = None,
    preprocess: Preprocess = None,
    calibrator: CalibratorOpt = Calibrator.auto,
    percentile: Percentile = 99.99,
    weights: WeightsOpt = Weights.auto,
    holdout: Holdout = None,
    metric: MetricOpt = None,  # type: ignore[assignment]  # auto; not printed: --help stays one screen
    min_cosine: MinCosine = None,
    min_metric: MinMetric = None,
    placement: PlacementOpt = Placement.trt,
    overrides: Overrides = None,
    from_engine: Optional[Path] = typer.Option(
        None, "--from-engine", metavar="JSON", rich_help_panel=QUANTIZE,
        help="Place Q/DQ where this implicit engine ran INT8 (its layer JSON).",
    ),
    max_loss: MaxLoss = None,
    engine: EngineRun = None,
    json_out: Json = False,
) -> int:

    from edgeq.errors import QuantError
    from edgeq.quant.quantize import quantize_file

    if (calib is None) == (synthetic is None):
        raise QuantError("give calibration data: --calib DIR or --synthetic N (one of them)")
    options = quantize_options(
        calib, synthetic=synthetic, preprocess=preprocess, calibrator=calibrator, percentile=percentile,
        placement=placement, overrides=overrides, holdout=holdout, metric=metric or "auto",
        min_cosine=min_cosine, min_metric=min_metric, cache=cache, from_engine=from_engine, max_loss=max_loss,
        weights=weights,
    )  # fmt: skip
    with progress_display(enabled=not json_out) as progress:
        result = quantize_file(model, options, output=output, progress=progress, engine=engine)
    code = code_for(result.ok)
    if json_out:
        print_json({**result.to_dict(), "exit_code": code})
        return code
    _render(result)
    return code


def _render(result: Any) -> None:
    d = result.to_dict()
    q = d["quantized"]
    title = f"edgeq quantize ({escape(d['placement'])} placement, {escape(d['calibrator'])} calibrator)"
    t = Table(title=title, expand=False)
    t.add_column("what", style="bold", no_wrap=True)
    t.add_column("count", justify="right", no_wrap=True)
    t.add_column("notes", overflow="fold")
    t.add_row("activation Q/DQ pairs", str(q["activations"]),
              "per-tensor int8, zero-point 0" if q["activations"] else "")
    t.add_row("weights (int8 + DQ)", str(q["weights"]), _weights_note(q["weights_by_axis"]))
    t.add_row("INT8 by commuting", str(q["int8_by_commute"]),
              "data-movement: Q/DQ move across them" if q["int8_by_commute"] else "")
    t.add_row("shared scale groups", str(q["scale_groups_shared"]),
              ", ".join(f"{n} {rule}" for rule, n in q["scale_groups_by_rule"].items()))
    t.add_row("left in float", str(d["float"]["count"]), "see below", end_section=True)
    for rule_id, n in d["float"]["by_rule"].items():
        first = d["rules"].get(rule_id, {}).get("description", "").split(". ")[0]
        t.add_row(f"  {rule_id}", str(n), escape(first))
    print_table(t, drop=("notes",))
    if "mirror" in d:
        _render_mirror(d["mirror"])
    if result.choice is not None and result.choice.auto:
        _render_choice(result.choice)
    if result.rounding_line():
        out.print(escape(result.rounding_line()))
    if result.accuracy is not None:
        _render_accuracy(result.accuracy)
    if result.wrecked:
        said, fix = result.wrecked_message(d["input"])
        err.print(f"[bold red]{escape(said)}[/]")
        err.print(f"fix: {escape(fix)}")
    if result.max_loss is not None:
        style = "green" if result.max_loss.reached else "bold red"
        out.print(f"[{style}]{escape(result.max_loss.summary())}[/]")
        out.print(escape(result.max_loss.speed_line()))
    for note in d["notes"]:
        err.print(f"[yellow]note:[/] {escape(note)}")
    errors = [f for f in result.clean_findings if f.level == Level.ERROR]
    if errors:
        render_findings(errors, title="Cleaned model: still unfit for TensorRT 8.6")
    out.print(f"wrote [bold]{escape(d['output'])}[/], [bold]{escape(d['cache'])}[/] "
              f"({d['cache_tensors']} tensors in the calibration cache), [bold]{escape(d['fp32_model'])}[/] "
              f"(the FP32 model for the cache: trtexec --int8 --calib --onnx) and "
              f"[bold]{escape(d['summary'])}[/]"
              + (f"; the regions kept float: [bold]{escape(d['overrides_file'])}[/] (--overrides "
                 "replays them)" if "overrides_file" in d else ""))


def _weights_note(by_axis: dict[str, int]) -> str:
    """What was done to the weights, as the summary JSON records it (each weight's axis)."""
    if set(by_axis) == {"per-channel"}:
        return "per-channel on the output-channel axis"
    if set(by_axis) == {"per-tensor"}:
        return "per-tensor (8.6 has no output-channel axis for them)"
    return ", ".join(f"{n} {how}" for how, n in by_axis.items())


def _render_mirror(m: dict[str, Any]) -> None:
    out.print(f"mirrored {m['int8_edges']} INT8 edges ({m['float_edges']} read in float) from "
              f"{escape(m['engine'])}: {m['mapped_layers']} of {m['named_layers']} named layers map")
    if m.get("float_entry"):
        from edgeq.graph.trt86.regions import QUANTIZING_REFORMAT

        out.print(f"{m['float_entry_edges']} of the INT8 edges left float: "
                  f"{plural(len(m['float_entry']), 'region')} "
                  f"the engine entered {QUANTIZING_REFORMAT}")
    if m.get("int8_entry"):
        from edgeq.graph.trt86.regions import INT8_BODY

        entries = m["int8_entry"]
        out.print(f"{plural(len(entries), 'entry', 'entries')} the engine quantized by a reformat kept INT8 "
                  f"({escape(', '.join(entries[:3]))}{', ...' if len(entries) > 3 else ''}): {INT8_BODY}")
    from edgeq.quant.mirror import reformatted_note, refused_note

    for entry, edges in m.get("refused", {}).items():
        out.print(escape(refused_note(entry, edges)))
    if m.get("reformatted"):
        out.print(escape(reformatted_note(m["reformatted"])))
    for u in m["unmapped"]:
        err.print(f"[yellow]unmapped:[/] {escape(u['tensor'])} read {u['precision'] or '?'} by "
                  f"'{escape(u['layer'])}': {escape(u['reason'])}")
    for name in m["unmapped_layers"]:
        err.print(f"[yellow]unmapped layer:[/] {escape(name)}")


def _render_choice(choice: Any) -> None:
    t = Table(title="--calibrator auto: each candidate on the held-out set (one statistics pass)")
    for col in ("calibrator", "score", "held-out result", "s"):
        right = col in ("score", "s")
        t.add_column(col, justify="right" if right else "left", no_wrap=col != "held-out result")
    for c in choice.candidates:
        mark = " (kept)" if c is choice.kept else ""
        value = f"{'<= ' if c.stopped is not None else ''}{c.score.rank:.6f}"
        t.add_row(escape(c.label + mark), value, escape(c.text), f"{c.seconds:.1f}")
    print_table(t, drop=("s",))
    out.print(escape(choice.summary()))


def _render_accuracy(acc: Any) -> None:
    from edgeq.text import number

    held = plural(acc.samples, "held-out sample") + (f"; {acc.held_out}" if acc.held_out else "")
    a = Table(title=f"Accuracy: FP32 vs Q/DQ as the engine computes it ({held})")
    cols = ("output", "cosine (mean)", "cosine (worst)", "worst sample", "max abs error", "top-1 agreement")
    for col in cols:
        a.add_column(col, justify="left" if col == "output" else "right", no_wrap=col != "output")
    for o in acc.outputs:
        top1 = f"{o.top1:.1%}" if o.top1 is not None else "-"
        figures = (f"{o.cosine:.6f}", f"{o.min_cosine:.6f}", f"#{o.worst_sample}", number(o.max_abs_error),
                   top1)
        a.add_row(escape(o.name), *figures)
    print_table(a, drop=("cosine (mean)", "top-1 agreement", "max abs error", "worst sample"))
    task = acc.task
    if task is not None and task.metric != "cosine":
        out.print(f"task metric ([bold]{escape(task.metric)}[/]): {escape(str(task))} "
                  f"[dim]({escape(acc.metric_why)})[/]")
    if acc.threshold is not None or acc.min_metric is not None:
        style = "green" if acc else "bold red"
        out.print(f"accuracy gate: [{style}]{escape(str(acc))}[/]")


@app.command("presets", short_help="The image preprocessing presets (--preprocess NAME); print one to copy.")
def presets_cmd(
    name: Optional[str] = typer.Argument(None, metavar="[NAME]", help="A preset, e.g. yolo."),
) -> int:
    """List the image preprocessing presets quantize, deploy and fleet take as --preprocess NAME, each
    with where it comes from; with NAME, print that preset's YAML (comments and all) on stdout, to copy
    and edit: edgeq presets yolo > my-yolo.yaml, then --preprocess my-yolo.yaml."""
    import sys

    from edgeq.quant.data.preprocess import preset_names, preset_text

    if name is not None:
        sys.stdout.write(preset_text(name))
        return EXIT_OK
    t = Table(title="--preprocess NAME", expand=False)
    t.add_column("name", style="bold", no_wrap=True)
    t.add_column("what it reproduces", overflow="fold")
    for preset in preset_names():
        first = preset_text(preset).splitlines()[0]
        t.add_row(preset, escape(first.split(":", 1)[1].strip() if ":" in first else first))
    print_table(t)
    out.print("edgeq presets NAME prints one (to copy and edit: --preprocess FILE.yaml)")
    return EXIT_OK
