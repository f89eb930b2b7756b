"""A FusionReport (and its gate verdict) as a JSON-ready dict and as one self-contained HTML page.

The HTML has no external assets (no scripts, fonts, stylesheets or images from anywhere), so it can
be attached to a CI run or mailed. Every name is escaped: engine layer names and metadata carry raw
control characters (U+001E between fused ONNX node names in 8.6) and arbitrary ONNX node names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from edgeq.report.fusion import FusionReport, LayerKind, ReportLayer
from edgeq.report.gate import GateResult
from edgeq.report.parse import Tensor
from edgeq.report.policy import EXEMPTIONS
from edgeq.report.views import (
    VIEW_CSS,
    breakdown,
    color_of,
    engine_strip,
    esc,
    legend,
    stacked_bar,
)
from edgeq.text import noun, plural

SCHEMA = "edgeq-report/1"


# --------------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------------


def _tensor_dict(t: Tensor) -> dict[str, Any]:
    return {
        "name": t.name,
        "format": t.format.raw if t.format else None,
        "short": t.format.short if t.format else None,
        "precision": t.precision,
        "dims": list(t.dims),
    }


def _layer_dict(rl: ReportLayer) -> dict[str, Any]:
    lay = rl.layer
    return {
        "index": rl.index,
        "name": rl.name,
        "layer_type": lay.layer_type,
        "parameter_type": lay.parameter_type,
        "kind": rl.kind.value,
        "kind_rule": rl.kind_rule,
        "precision": rl.precision,
        "in_precisions": list(rl.in_precisions),
        "out_precisions": list(rl.out_precisions),
        "formats": rl.formats,
        "inputs": [_tensor_dict(t) for t in lay.inputs],
        "outputs": [_tensor_dict(t) for t in lay.outputs],
        "weight_inputs": list(rl.weight_inputs),
        "onnx_nodes": list(rl.onnx_nodes),
        "onnx_ops": list(rl.onnx_ops),
        "related_nodes": list(rl.related_nodes),
        "boundary": rl.boundary,
        "boundary_reason": rl.boundary_reason,
        "region": rl.region,
        "past_int8": rl.past_int8,
        "time_ms": rl.time_ms,
        "origin": lay.origin,
        "tactic": lay.tactic,
        "metadata": lay.metadata,
    }


def report_to_dict(report: FusionReport, gate: Optional[GateResult] = None) -> dict[str, Any]:
    """Plain JSON types only (lists, not tuples), so ``json.loads(json.dumps(d)) == d``."""
    d: dict[str, Any] = {
        "schema": SCHEMA,
        "source": report.source,
        "detailed": report.detailed,
        "mode": report.mode,
        "bindings": list(report.bindings),
        "network_inputs": list(report.network_inputs),
        "network_outputs": list(report.network_outputs),
        "summary": {
            "layers": len(report.layers),
            "kinds": report.kind_counts(),
            "compute_precisions": report.compute_precisions(),
            "boundary_reformats": [rl.index for rl in report.boundary_reformats()],
            "interior_reformats": [rl.index for rl in report.interior_reformats()],
            "unfused_residuals": len(report.unfused_residuals),
        },
        "layers": [_layer_dict(rl) for rl in report.layers],
        "unfused_residuals": [
            {"add_layer": u.add_layer, "activation_layer": u.activation_layer, "nodes": list(u.nodes)}
            for u in report.unfused_residuals
        ],
        "profile": None,
        "onnx": None,
        "notes": list(report.notes),
        "gate": gate.to_dict() if gate is not None else None,
    }
    if report.timed:
        d["profile"] = {
            "source": report.profile_source,
            "total_ms": report.profile_total_ms,
            "iterations": report.profile_iterations,
            "unmatched": list(report.unmatched_profile),
        }
    if report.onnx is not None:
        m = report.onnx
        d["onnx"] = {
            "model": m.model,
            "by_precision": m.by_precision(),
            "in_reformats": m.in_kind(LayerKind.REFORMAT),
            "in_noops": m.in_kind(LayerKind.NOOP),
            "not_found": [{"name": n, "op_type": op} for n, op in m.not_found],
            "unknown": list(m.unknown),
            "nodes": [
                {
                    "name": n.name,
                    "op_type": n.op_type,
                    "layers": list(n.layers),
                    "kind": n.kind,
                    "precision": n.precision,
                }
                for n in m.nodes
            ],
        }
    return d


# --------------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------------


def _badge(precision: Optional[str]) -> str:
    color = color_of(precision)
    return f'<span class="badge" style="background:{color}">{esc(precision or "?")}</span>'


REPORT_CSS = """
body{font:13px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:20px;color:#212121}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 8px}
.muted{color:#757575} .ctl{color:#b71c1c;background:#ffebee;font-family:monospace;font-size:11px}
.verdict{padding:10px 14px;border-radius:6px;margin:12px 0;font-weight:600}
.pass{background:#e8f5e9;border:1px solid #2e7d32;color:#1b5e20}
.fail{background:#ffebee;border:1px solid #c62828;color:#b71c1c}
.info{background:#eceff1;border:1px solid #90a4ae;color:#37474f}
.tiles{display:flex;flex-wrap:wrap;gap:10px}
.tile{border:1px solid #e0e0e0;border-radius:6px;padding:8px 12px}
.tile b{font-size:18px;display:block}
table{border-collapse:collapse;width:100%} th,td{border-bottom:1px solid #eee;padding:3px 6px;text-align:left;
vertical-align:top} th{background:#fafafa;position:sticky;top:0}
td.name{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-all;max-width:520px}
.nodes{color:#546e7a;font-size:11px}
.badge{color:#fff;border-radius:3px;padding:0 5px;font-size:11px;font-weight:600}
.bar{background:#1565c0;height:10px;border-radius:2px;display:inline-block;vertical-align:middle}
.time{white-space:nowrap;min-width:160px} .nowrap{white-space:nowrap}
tr.viol{background:#fff3f3} tr.allowed{background:#fffde7}
tr.weights td,tr.no-op td{color:#9e9e9e}
.tag{font-size:11px;border:1px solid #bdbdbd;border-radius:3px;padding:0 4px}
.tag.v{border-color:#c62828;color:#c62828} .tag.b{border-color:#1565c0;color:#1565c0}
ul.viol li{margin:2px 0;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
"""


def _precision_cell(rl: ReportLayer) -> str:
    if rl.kind == LayerKind.NOOP:
        return ""
    if rl.kind == LayerKind.REFORMAT:  # a copy converts: show both ends
        first_in = rl.in_precisions[0] if rl.in_precisions else None
        first_out = rl.out_precisions[0] if rl.out_precisions else None
        return f"{_badge(first_in)}&rarr;{_badge(first_out)}"
    return _badge(rl.precision)


def _layer_row(rl: ReportLayer, max_ms: float, flagged: dict[int, list[str]], allowed: dict[int, str]) -> str:
    classes = [rl.kind.value]
    tags = []
    if rl.index in flagged:
        classes.append("viol")
        tags += [f'<span class="tag v">{esc(r)}</span>' for r in flagged[rl.index]]
    elif rl.index in allowed:
        classes.append("allowed")
        tags.append(f'<span class="tag">allowed: {esc(allowed[rl.index])}</span>')
    if rl.boundary:
        tags.append(
            f'<span class="tag b" title="{esc(rl.boundary_reason)}">{esc(rl.boundary)} boundary</span>'
        )
    if rl.region != "inside":
        tags.append(f'<span class="tag">{esc(rl.region)} INT8 region</span>')
    elif rl.past_int8:
        tags.append('<span class="tag">after the last INT8 layer</span>')
    nodes = ""
    if rl.onnx_nodes:
        nodes = (
            '<div class="nodes">ONNX: '
            + ", ".join(f"{esc(n)} <i>{esc(op)}</i>" for n, op in zip(rl.onnx_nodes, rl.onnx_ops))
            + "</div>"
        )
    elif rl.related_nodes:
        nodes = '<div class="nodes">copy for: ' + ", ".join(esc(n) for n in rl.related_nodes) + "</div>"
    if rl.time_ms is None:
        time_cell = '<span class="muted">-</span>'
    else:
        width = 0.0 if max_ms <= 0 else 100.0 * rl.time_ms / max_ms
        time_cell = (
            f'<span class="bar" style="width:{width * 1.2:.1f}px"></span> {rl.time_ms * 1000:.1f}&nbsp;µs'
        )
    return (
        f'<tr class="{" ".join(classes)}"><td>{rl.index}</td><td>{esc(rl.kind.value)}</td>'
        f'<td>{esc(rl.layer_type)}</td><td class="name">{esc(rl.name)}{nodes}</td>'
        f"<td>{esc(rl.formats)}</td><td>{_precision_cell(rl)}</td>"
        f'<td class="time">{time_cell}</td><td>{" ".join(tags)}</td></tr>'
    )


def _picture(report: FusionReport, gate: Optional[GateResult]) -> str:
    """The first screen: the engine as a strip, where the time goes by precision, violations by region."""
    from edgeq.report.explain import group_violations

    flagged = [v.layer for v in gate.violations] if gate is not None else []
    timed = ("width = share of the time its activation layers take (weight copies: below)" if report.timed
             else "equal widths: no profile given")
    parts = [f"<h2>The engine, layer by layer ({timed})</h2>", engine_strip(report, flagged), legend()]
    rows = breakdown(report)
    total_ms = sum(ms or 0.0 for _, _, ms, _ in rows)
    weights = [(label, (ms if report.timed else n) or 0.0, c) for label, n, ms, c in rows]
    cells = "".join(
        f'<tr><td><span class="badge" style="background:{c}">&nbsp;</span> {esc(label)}</td><td>{n}</td>'
        + (
            f"<td>{ms * 1000:.1f} µs</td><td>{100 * ms / total_ms:.1f}%</td>"
            if ms is not None and total_ms
            else ""
        )
        + "</tr>"
        for label, n, ms, c in rows
    )
    parts.append(
        f"<h2>Where the {'time' if report.timed else 'layers'} go{'es' if report.timed else ''}</h2>"
        + stacked_bar(weights)
        + f'<table style="width:auto">{cells}</table>'
    )
    if gate is not None and gate.violations:
        groups = group_violations(report, gate.violations)
        trs = []
        for g in groups:
            counts = ", ".join(f"{n} {rule}" for rule, n in g.counts().items())
            rules = (
                " ".join(f'<span class="tag v">{esc(r)}</span>' for r in g.rules)
                or '<span class="muted">-</span>'
            )
            nodes = ", ".join(esc(n) for n in g.nodes[:6]) + (
                f" &hellip; +{len(g.nodes) - 6}" if len(g.nodes) > 6 else ""
            )
            t = f"{g.time_ms * 1000:.1f} µs" if g.time_ms is not None else "-"
            trs.append(
                f'<tr class="viol"><td class="name">{esc(g.scope)}</td><td>{esc(counts)}</td><td>{rules}</td>'
                f'<td class="nowrap">{t}</td><td class="name nodes">{nodes}</td></tr>'
            )
        parts.append(
            f"<h2>Violations by region ({len(gate.violations)} in {plural(len(groups), 'region')})</h2>"
            "<table><tr><th>region</th><th>violations</th><th>placement rule that explains it</th>"
            "<th>time</th><th>ONNX nodes</th></tr>" + "".join(trs) + "</table>"
        )
    return "\n".join(parts)


_KIND_WORD = {"weights": "weight"}  # "94 weight layers", not "94 weights layers"


def _all_violations(n: int) -> str:
    return "The violation" if n == 1 else f"All {n} violations"


def render_html(report: FusionReport, gate: Optional[GateResult] = None, sections: Sequence[str] = ()) -> str:
    """One self-contained HTML page: verdict, summary, layers with precision colours and time bars;
    ``sections``: more HTML after the verdict (the engine's accuracy on the target)."""
    flagged: dict[int, list[str]] = {}
    allowed: dict[int, str] = {}
    if gate is not None:
        for v in gate.violations:
            flagged.setdefault(v.layer, []).append(v.rule)
        for v in gate.allowed:
            allowed.setdefault(v.layer, v.allowed_by or "")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>edgeq report: {esc(report.source)}</title>",
        f"<style>{REPORT_CSS}{VIEW_CSS}</style></head><body>",
        f'<h1>Engine fusion report</h1><div class="muted">{esc(report.source)} &middot; {esc(report.mode)} '
        f"quantization &middot; {len(report.layers)} engine layers</div>",
    ]
    if gate is not None:
        cls = "info" if not gate.policy.checks_anything else ("pass" if gate.passed else "fail")
        parts.append(f'<div class="verdict {cls}">{esc(gate.summary())}</div>')
    if report.detailed:
        parts.append(_picture(report, gate))
    if gate is not None:
        if gate.violations:
            parts.append(
                f"<details><summary>{_all_violations(len(gate.violations))}, in engine order</summary>"
                '<ul class="viol">'
                + "".join(f"<li>{esc(v)}</li>" for v in gate.violations)
                + "</ul></details>"
            )
        parts.append(
            f'<div class="muted">Policy {esc(gate.policy.name)}: {esc(gate.policy.description)} '
            f"(source: {esc(gate.policy.source)})</div>"
        )
    for note in report.notes:
        parts.append(f'<div class="verdict info">{esc(note)}</div>')
    parts.extend(sections)

    tiles = [(str(n), noun(n, f"{_KIND_WORD.get(k, k)} layer")) for k, n in report.kind_counts().items()]
    tiles += [(str(n), f"{p} compute") for p, n in sorted(report.compute_precisions().items())]
    tiles.append((str(len(report.boundary_reformats())), "boundary reformats"))
    tiles.append((str(len(report.interior_reformats())), "interior reformats"))
    tiles.append((str(len(report.unfused_residuals)), "unfused residual Adds"))
    if report.timed:
        it = f", {report.profile_iterations} iterations" if report.profile_iterations else ""
        tiles.append((f"{report.profile_total_ms:.3f} ms", f"sum of layer times{it}"))
    parts.append(
        '<h2>Summary</h2><div class="tiles">'
        + "".join(f'<div class="tile"><b>{esc(v)}</b>{esc(label)}</div>' for v, label in tiles)
        + "</div>"
    )

    if report.unfused_residuals:
        by_index = {rl.index: rl for rl in report.layers}
        items = "".join(
            f"<li>#{u.add_layer} {esc(by_index[u.add_layer].name)}"
            + (
                f" + #{u.activation_layer} {esc(by_index[u.activation_layer].name)}"
                if u.activation_layer is not None
                else ""
            )
            + "</li>"
            for u in report.unfused_residuals
        )
        parts.append(
            f"<h2>Residual Adds not fused into a convolution ({len(report.unfused_residuals)})</h2>"
            f'<ul class="viol">{items}</ul>'
        )

    timed = [rl.time_ms for rl in report.layers if rl.time_ms is not None]
    max_ms = max(timed) if timed else 0.0
    header = (
        "<tr><th>#</th><th>kind</th><th>type</th><th>layer / ONNX nodes</th><th>formats (in -&gt; out)"
        "</th><th>precision</th><th>time</th><th>gate</th></tr>"
    )
    main_rows = [rl for rl in report.layers if rl.kind not in (LayerKind.WEIGHTS,)]
    weight_rows = [rl for rl in report.layers if rl.kind == LayerKind.WEIGHTS]
    below = plural(len(weight_rows), "weight layer")
    parts.append(f"<h2>Layers ({len(main_rows)} shown, {below} below)</h2>")
    parts.append(
        "<table>"
        + header
        + "".join(_layer_row(rl, max_ms, flagged, allowed) for rl in main_rows)
        + "</table>"
    )
    if weight_rows:
        parts.append(
            f"<details><summary>{plural(len(weight_rows), 'weight layer')} (not gated: "
            f"{esc(EXEMPTIONS['weights'])})</summary><table>"
            + header
            + "".join(_layer_row(rl, max_ms, flagged, allowed) for rl in weight_rows)
            + "</table></details>"
        )

    if report.onnx is not None:
        m = report.onnx
        parts.append(f"<h2>ONNX nodes ({esc(m.model)})</h2>")
        rows = []
        for p, names in sorted(m.by_precision().items()):
            rows.append((f"ran {p}", names))
        rows.append(("in reformat layers", m.in_kind(LayerKind.REFORMAT)))
        rows.append(("in no-op layers", m.in_kind(LayerKind.NOOP)))
        rows.append(
            ("not found in any layer (fused Q/DQ, eliminated)", [f"{n} ({op})" for n, op in m.not_found])
        )
        if m.unknown:
            rows.append(("named by the engine, missing from the model", list(m.unknown)))
        for label, names in rows:
            parts.append(
                f"<details><summary>{len(names)} {esc(label)}</summary>"
                f'<div class="nodes">{", ".join(esc(n) for n in names)}</div></details>'
            )
    parts.append(
        '<h2>Legend</h2><div class="muted">'
        + " ".join(f"{_badge(p)}" for p in ("INT8", "FP16", "FP32", "INT32", None))
        + " precision the layer computes in "
        "(widest activation input; weights excluded). Time bars: per-layer average from the profile.</div>"
    )
    parts.append("</body></html>\n")
    return "\n".join(parts)
