"""``edgeq report`` and ``edgeq compare`` (``edgeq.report``): what engines run, from files or built on a
target."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from edgeq.cli.app import app
from edgeq.cli.options import (
    GATE,
    AcceptNewHostKey,
    Calib,
    Gate,
    Html,
    Json,
    Onnx,
    Placement,
    PlacementOpt,
    RunsDir,
    TargetName,
)
from edgeq.cli.output import (
    EXIT_CODES_HELP,
    code_for,
    fit_table,
    out,
    precision_cell,
    print_json,
    print_table,
    print_verdict,
    print_wrapped,
    progress_display,
    visible,
    width_of,
)
from edgeq.text import plural, qps, short_path

_REPORT_HELP = (
    "Show what a TensorRT engine runs, from its layer information (trtexec --exportLayerInfo "
    "--profilingVerbosity=detailed, or IEngineInspector JSON), and gate it. Works offline on files.\n\n"
    "Every layer classified (compute, weights, reformat, no-op) with its precision, format and the ONNX "
    "nodes fused into it; per-layer times with --profile; the ONNX graph mapped back with --onnx. The "
    "int8 gate (default) fails when a compute layer between the first Q and the last DQ runs FP16/FP32 or "
    "an interior reformat changes precision or layout; same-format copies (TensorRT's Concat) are "
    "reported. 'edgeq rules gate' explains the policies.\n\n" + EXIT_CODES_HELP
)


def _render_report(report: Any, gate: Any, all_layers: bool) -> None:
    from edgeq.report import LayerKind

    kinds = ", ".join(f"{n} {k}" for k, n in report.kind_counts().items())
    precisions = ", ".join(f"{n} {p}" for p, n in sorted(report.compute_precisions().items()))
    title = short_path(report.source, max(24, width_of(out) - 30))  # the first line: a long path, cut
    print_wrapped(
        f"[bold]{visible(title)}[/]: {report.mode} quantization, {len(report.layers)} layers "
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
    t = Table(show_lines=False, expand=False, title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("type", no_wrap=True, max_width=16)
    t.add_column("ONNX nodes / layer", overflow="fold", min_width=30)
    t.add_column("prec", no_wrap=True)
    t.add_column("out format", no_wrap=True)
    if report.timed:
        t.add_column("µs", justify="right", no_wrap=True)
    t.add_column("gate", overflow="fold", max_width=18)
    for rl in rows:
        # Fused compute layers are best named by their ONNX nodes; copies only have a layer name.
        name = visible(", ".join(rl.onnx_nodes)) if rl.onnx_nodes else visible(rl.name)
        kind = "" if rl.kind == LayerKind.COMPUTE else f"\n[dim]{rl.kind.value}[/]"
        tags = [f"[bold red]{r}[/]" for r in flagged.get(rl.index, [])]
        if rl.index in excused:
            tags.append(f"[yellow]allowed ({visible(str(excused[rl.index]))})[/]")
        if rl.boundary:
            tags.append(f"[cyan]{rl.boundary} boundary[/]")
        elif rl.same_format_copy and rl.index not in flagged:
            tags.append("[dim]copy[/]")  # a Concat/Slice copy: reported, not a fallback
        if rl.region != "inside":
            tags.append(f"[dim]{rl.region} region[/]")
        elif rl.past_int8:
            tags.append("[dim]after the last INT8[/]")
        if rl.kind == LayerKind.REFORMAT:
            first_in = rl.in_precisions[0] if rl.in_precisions else None
            first_out = rl.out_precisions[0] if rl.out_precisions else None
            prec = f"{precision_cell(first_in)}->{precision_cell(first_out)}"
        else:
            prec = precision_cell(rl.precision) if rl.kind != LayerKind.NOOP else ""
        layout = ", ".join(o.format.short.split(" ", 1)[-1] if o.format else "?" for o in rl.layer.outputs)
        cells = [str(rl.index), visible(rl.layer_type) + kind, name, prec, visible(layout)]
        if report.timed:
            cells.append("-" if rl.time_ms is None else f"{rl.time_ms * 1000:.1f}")
        cells.append(" ".join(tags))
        t.add_row(*cells, style="on grey15" if rl.index in flagged else None)
    print_table(t, drop=("out format", "type"))
    if report.timed:
        it = f" over {report.profile_iterations} iterations" if report.profile_iterations else ""
        out.print(f"sum of per-layer averages: [bold]{report.profile_total_ms:.4f} ms[/]{it}")
    if report.unfused_residuals:
        fails = gate is not None and gate.policy.require_fusion
        n = len(report.unfused_residuals)
        print_wrapped(
            f"[yellow]{plural(n, 'residual Add layer')} did not fuse into a convolution[/]"
            + ("" if fails else " (--require-fusion fails on them)")
        )
    if report.onnx is not None:
        m = report.onnx
        ran = ", ".join(f"{len(v)} {p}" for p, v in sorted(m.by_precision().items()))
        out.print(
            f"ONNX {visible(m.model)}: {len(m.nodes)} nodes found in the engine "
            f"({ran or 'none in compute'}; "
            f"{len(m.in_kind(LayerKind.REFORMAT))} in reformats), {len(m.not_found)} not found "
            "(fused Q/DQ or eliminated; --json lists them)"
        )
    for note in report.notes:
        print_wrapped(f"[yellow]note:[/] {visible(note)}")


@app.command("report", help=_REPORT_HELP, short_help="An engine's fusion report and precision gate, offline.")
def report_cmd(
    layers: Path = typer.Argument(..., help="Engine layer information JSON (trtexec --exportLayerInfo)."),
    profile: Optional[Path] = typer.Option(
        None, "--profile", metavar="JSON", help="Per-layer times: trtexec --exportProfile or the agent's."
    ),
    onnx_path: Onnx = None,
    gate_name: Gate = "int8",
    require_fusion: bool = typer.Option(
        False, "--require-fusion", rich_help_panel=GATE, help="Also fail on residual Adds not fused."
    ),
    forbid_copies: bool = typer.Option(
        False, "--forbid-copies", rich_help_panel=GATE, help="Also fail on interior same-format copies."
    ),
    allow: Optional[list[str]] = typer.Option(
        None, "--allow", metavar="NAME", rich_help_panel=GATE,
        help="An ONNX node or layer the gate excuses; wildcards allowed (repeatable).",
    ),
    json_out: Json = False,
    html_out: Html = None,
    all_layers: bool = typer.Option(False, "--all-layers", help="List weight and no-op layers too."),
) -> int:
    from edgeq.fs import atomic_write_text, check_writable
    from edgeq.pipeline.stages import report_and_gate
    from edgeq.report import POLICIES, render_html
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
    report, gate = report_and_gate(layers, profile, onnx_path, policy)
    if report.onnx is not None:  # another model's engine: refused, as compare refuses it
        from edgeq.report.layernames import require_model_of

        require_model_of(layers.name, report.onnx, onnx_path.name if onnx_path else None)
    code = code_for(gate)
    if html_out is not None:
        atomic_write_text(html_out, render_html(report, gate))
    if json_out:
        print_json({**to_dict(report, gate), "exit_code": code, "html": str(html_out) if html_out else None})
        return code
    _render_report(report, gate, all_layers)
    if html_out is not None:
        out.print(f"wrote [bold]{escape(str(html_out))}[/]")
    print_verdict(gate)
    return code


# --------------------------------------------------------------------------------------------------
# edgeq compare  (edgeq.report.compare*; edgeq.orchestration.variants builds the engines on a target)
# --------------------------------------------------------------------------------------------------

_COMPARE_HELP = (
    "Why is one engine slower than another? Engines of one model side by side, the first the baseline: "
    "ratios, precisions, reformats, fusions, and the regions that differ most with the rule that explains "
    "each. Offline: --engines DIR DIR ... On a target: MODEL --target T --calib DIR builds implicit INT8 "
    "(the baseline), explicit (--placement auto: decided there or cached; trt: the rules; implicit: the "
    "mirror), the rules and --placement all from one calibration. --gate relative fails a wider node, more "
    "reformats or a ratio under --min-ratio (edgeq rules relative-gate: what a clearly faster engine may "
    "differ by).\n\n"
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
    numeric = {"layers", "reformats", "copies", "ms (sum)", "qps", "thr.", "lat."}
    for col in cols:
        t.add_column(col, no_wrap=col in numeric, justify="right" if col in numeric else "left")
    diffs = {d.candidate: d for d in comparison.diffs}
    failed: list[Any] = []
    for e in comparison.engines:
        if e.report is None:
            t.add_row(visible(e.name), "[bold red]build failed[/]", *[""] * 8)
            failed.append(e)
            continue
        s = e.stats
        comp = ", ".join(f"{n} {precision_cell(p)}" for p, n in sorted(s.precisions.items()))
        d = diffs.get(e.name)
        t.add_row(
            visible(e.name), e.report.mode, str(s.layers), comp, str(s.reformats), str(s.copies),
            f"{s.total_ms:.3f}" if s.total_ms is not None else "-",
            qps(e.run.throughput_qps) if e.run and e.run.throughput_qps else "-",
            _ratio_cell(d.ratio.throughput, True) if d else "1.00x",
            _ratio_cell(d.ratio.latency, False) if d else "1.00x",
        )  # fmt: skip
    print_table(t, drop=("copies", "layers", "ms (sum)", "mode", "reformats"))
    for e in failed:
        out.print(f"[bold red]{visible(e.name)}: build failed:[/] {visible(e.error or '')}")
    for d in comparison.diffs:
        src = f" (from {d.ratio.source})" if d.ratio.throughput is not None else " (no timing)"
        out.print(f"\n[bold]{visible(d.candidate)}[/] vs [bold]{visible(d.baseline)}[/]{src}")
        for label, groups in (("fused only in the baseline", d.missing_groups),
                              ("fused only in the candidate", d.extra_groups)):  # fmt: skip
            if groups:  # a group a line: a fused group is never wrapped in two
                out.print(f"  {len(groups)} {label}:")
                for g in groups[:4]:
                    print_wrapped(f"    {visible(g)}", indent=6)
                if len(groups) > 4:
                    out.print(f"    ... {len(groups) - 4} more")
        b_res, c_res = d.base_stats.unfused_residuals, d.cand_stats.unfused_residuals
        if c_res != b_res:
            adds = plural(c_res, "residual Add layer")
            out.print(f"  {adds} not fused into a convolution (baseline {b_res})")
        if d.wider:
            out.print(f"  [red]{len(d.wider)} ONNX nodes in a wider precision than in the baseline[/]")
        regions = d.top(top)
        if not regions:
            out.print("  [green]no region differs: same fusion, precisions and reformats[/]")
            continue
        width = width_of(out)
        rt = fit_table(_region_table(regions, rule_column=True), width, out, drop=("rule",))
        if "rule" not in {str(c.header) for c in rt.columns}:  # too narrow: each rule under its region
            rt = fit_table(_region_table(regions, rule_column=False), width, out)
        out.print(rt, width=width, soft_wrap=False)
    for note in comparison.notes:
        out.print(f"[yellow]note:[/] {visible(note)}")
    for g in gates:
        print_verdict(g)


def _region_table(regions: Sequence[Any], rule_column: bool) -> Table:
    """The regions that differ, a row each: its ONNX nodes (a name is never cut: it is what a user
    searches for), each side's precision, layers and time, the time it costs, and the rules that explain
    it, in a column of their own or, where that does not fit, on the line under the region's name."""
    rt = Table(box=None, expand=False, pad_edge=False)
    for col in ("region (ONNX nodes)", "baseline", "candidate", "Δ µs", *(("rule",) if rule_column else ())):
        region = col == "region (ONNX nodes)"
        rt.add_column(col, overflow="fold" if region else "ellipsis", no_wrap=col == "Δ µs",
                      justify="right" if col == "Δ µs" else "left")  # fmt: skip

    def side(s: Any) -> str:
        us = f" {s.time_ms * 1000:.1f}µs" if s.time_ms is not None else ""
        extra = f" +{plural(s.reformats, 'reformat')}" if s.reformats else ""
        return f"{precision_cell(s.precision or None)} {plural(len(s.groups), 'layer')}{us}{extra}"

    for r in regions:
        delta = f"{r.delta_ms * 1000:+.1f}" if r.delta_ms is not None else "-"
        rules = visible(", ".join(r.rules))
        if rule_column:
            rt.add_row(visible(r.label(1)), side(r.base), side(r.cand), delta, rules)
        else:
            label = visible(r.label(1)) + (f"\n  [dim]rule:[/] {rules}" if rules else "")
            rt.add_row(label, side(r.base), side(r.cand), delta)
    return rt


@app.command("compare", help=_COMPARE_HELP, short_help="Why one engine is slower than another.")
def compare_cmd(
    paths: Optional[list[Path]] = typer.Argument(
        None, metavar="PATH...", help="Engine directories, the baseline first; or the float model."
    ),
    engines: bool = typer.Option(False, "--engines", help="Compare engines from files (offline)."),
    target: TargetName = None,
    calib: Calib = None,
    placement: PlacementOpt = Placement.auto,
    fp16: bool = typer.Option(False, "--fp16", help="With --target: also build an FP16 engine."),
    qdq_model: Optional[Path] = typer.Option(
        None, "--qdq-model", metavar="MODEL", help="With --target: also build this Q/DQ model of yours."
    ),
    accept_new_host_key: AcceptNewHostKey = False,
    runs_dir: RunsDir = Path("runs"),
    onnx_path: Onnx = None,
    gate_name: Gate = "none",
    min_ratio: float = typer.Option(
        0.97, "--min-ratio", metavar="R", rich_help_panel=GATE,
        help="The relative gate's lowest throughput ratio.",
    ),
    top: int = typer.Option(10, "--top", metavar="N", min=1, help="Differing regions listed per candidate."),
    json_out: Json = False,
    html_out: Html = None,
) -> int:
    from edgeq.fs import atomic_write_text, check_writable
    from edgeq.report.compare import compare_engines
    from edgeq.report.compare_engine import engine_from_path
    from edgeq.report.compare_gate import relative_gates
    from edgeq.report.compare_html import render_compare_html

    if gate_name not in ("relative", "none"):
        raise typer.BadParameter(f"unknown gate {gate_name!r}; one of: relative, none", param_hint="--gate")
    paths = list(paths or [])
    if engines == (target is not None):
        raise typer.BadParameter("give --engines DIR DIR ... (offline) or MODEL --target T (build)")
    if placement == Placement.all:
        raise typer.BadParameter("compare --target builds --placement all already (explicit-all); give trt "
                                 "or implicit", param_hint="--placement")  # fmt: skip
    if placement == Placement.auto and (target is None or calib is None):
        placement = Placement.trt  # offline, or nothing to calibrate: nothing for a target to decide
    if placement == Placement.implicit and target is None:
        raise typer.BadParameter("--placement implicit builds on a target: give MODEL --target T --calib DIR",
                                 param_hint="--placement")  # fmt: skip
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
        if onnx_path is not None:  # as report --onnx: engines of another model are refused
            from edgeq.report.layernames import require_model_of

            for e in found:
                if e.report is not None and e.report.onnx is not None:
                    require_model_of(e.name, e.report.onnx, onnx_path.name)
    else:
        built = _on_target(paths, target or "", calib, fp16, qdq_model, accept_new_host_key, runs_dir,
                           json_out, placement)  # fmt: skip
        found, findings, gated = list(built.engines), list(built.findings), built.gated
    comparison = compare_engines(found, findings)
    gates = relative_gates(comparison, min_ratio, gated) if gate_name == "relative" else []
    code = code_for(all(gates))
    if html_out is not None:
        atomic_write_text(html_out, render_compare_html(comparison, gates))
    placed = built.placement if not engines else None
    if json_out:
        print_json({**comparison.to_dict(top), "gates": [g.to_dict() for g in gates], "exit_code": code,
                    **({"placement": placed.to_dict()} if placed is not None else {})})  # fmt: skip
        return code
    for note in placed.notes() if placed is not None else ():
        out.print(f"[cyan]auto:[/] {escape(note)}", highlight=False)
    _render_comparison(comparison, gates, top)
    if html_out is not None:
        out.print(f"wrote [bold]{escape(str(html_out))}[/]")
    return code


def _on_target(paths: list[Path], target: str, calib: Optional[Path], fp16: bool, qdq_model: Optional[Path],
               accept_new_host_key: bool, runs_dir: Path, json_out: bool, placement: Placement) -> Any:
    """compare --target: the variants built on the target (``edgeq.orchestration.variants``; ``implicit``:
    ``edgeq.orchestration.implicit``, the mirror of the implicit engine as explicit; ``auto``:
    ``edgeq.orchestration.auto``, the placement the target decided, or the cached one, as explicit)."""
    from edgeq.cli.options import quantize_options
    from edgeq.orchestration.variants import VariantOptions, engines_on_target
    from edgeq.remote.targets import resolve_target

    if len(paths) != 1:
        raise typer.BadParameter("--target takes one float ONNX model")
    options = VariantOptions(quantize=quantize_options(calib), fp16=fp16, qdq_model=qdq_model,
                             accept_new_host_key=accept_new_host_key, runs_dir=runs_dir)  # fmt: skip
    tgt = resolve_target(target)
    with progress_display(enabled=not json_out) as progress:
        if placement == Placement.implicit:
            from edgeq.orchestration.implicit import engines_with_mirror

            built = engines_with_mirror(paths[0], tgt, options, progress=progress)
        elif placement == Placement.auto:
            from edgeq.orchestration.auto import engines_auto

            built = engines_auto(paths[0], tgt, options, progress=progress)
        else:
            built = engines_on_target(paths[0], tgt, options, progress=progress)
    if not json_out:
        out.print(f"run directory: [bold]{escape(str(built.run_dir))}[/]")
    built.require_baseline(tgt.name)
    return built
