"""Accuracy against speed as a picture: each set of float regions a point, the engines built on the target
as reference points, the chosen one marked (``deploy --max-loss``'s ``budget.html`` and its report page,
``edgeq sensitivity --engine``'s page).

Inline SVG, no script and no external asset, as the other pages: hover a point for what it is (an SVG
``<title>``). Filled marks were measured on the target (qps from paired rounds); hollow ones are sets of
regions scored on the host whose speed is modelled from the full INT8 engine's profile
(``edgeq.quant.float_cost``). An engine whose accuracy was not measured (FP16 without a held-out run on
the target) is a vertical line at its qps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from edgeq.report.views import esc, esc_attr

W, H = 640.0, 360.0
LEFT, RIGHT, TOP, BOTTOM = 64.0, 20.0, 16.0, 44.0
STYLE = {  # kind -> (fill, stroke, shape)
    "modelled": ("#ffffff", "#546e7a", "circle"),
    "full INT8": ("#2e7d32", "#1b5e20", "square"),
    "FP16": ("#ef8f00", "#e65100", "triangle"),
    "implicit INT8": ("#6a1b9a", "#4a148c", "diamond"),
    "chosen": ("#c62828", "#b71c1c", "star"),
}

TRADEOFF_CSS = """
.tradeoff svg{background:#fff;border:1px solid #e0e0e0;border-radius:4px}
.tradeoff .ax{stroke:#90a4ae;stroke-width:1} .tradeoff .grid{stroke:#eceff1;stroke-width:1}
.tradeoff text{font:11px system-ui,-apple-system,Segoe UI,Roboto,sans-serif;fill:#455a64}
.tradeoff .target{stroke:#c62828;stroke-dasharray:5 4;stroke-width:1.2}
.tradeoff .ref{stroke-dasharray:3 3;stroke-width:1.5}
.tradeoff td.fig{font-variant-numeric:tabular-nums;text-align:right;white-space:nowrap}
"""


@dataclass(frozen=True)
class Mark:
    """One point (or, with ``score`` None, a vertical line) of the chart."""

    kind: str  # a key of STYLE
    qps: float
    score: Optional[float]
    title: str  # hover text
    label: str = ""  # drawn beside it


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    import math

    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * step:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _shape(kind: str, x: float, y: float, r: float = 5.0) -> str:
    fill, stroke, shape = STYLE.get(kind, STYLE["modelled"])
    common = f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"'
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r - 1:.1f}" {common}/>'
    if shape == "square":
        return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" {common}/>'
    if shape == "triangle":
        pts = f"{x:.1f},{y - r - 1:.1f} {x - r - 1:.1f},{y + r:.1f} {x + r + 1:.1f},{y + r:.1f}"
        return f'<polygon points="{pts}" {common}/>'
    if shape == "diamond":
        e = r + 1
        pts = f"{x:.1f},{y - e:.1f} {x + e:.1f},{y:.1f} {x:.1f},{y + e:.1f} {x - e:.1f},{y:.1f}"
        return f'<polygon points="{pts}" {common}/>'
    import math  # a five-pointed star, larger: the chosen engine

    big, small = r * 1.9, r * 0.8
    pts = " ".join(f"{x + (big if i % 2 == 0 else small) * math.sin(i * math.pi / 5):.1f},"
                   f"{y - (big if i % 2 == 0 else small) * math.cos(i * math.pi / 5):.1f}" for i in range(10))
    return f'<polygon points="{pts}" {common}/>'


def tradeoff_svg(marks: Sequence[Mark], *, floor: Optional[float] = None, metric: str = "metric") -> str:
    """The chart: qps across, the task metric (FP32 = 1.0) up; ``floor``: 1 - ``--max-loss``, dashed."""
    if not marks:
        return ""
    xs = [m.qps for m in marks]
    ys = [m.score for m in marks if m.score is not None] + ([floor] if floor is not None else []) + [1.0]
    x_lo, x_hi = min(xs), max(xs)
    pad = max((x_hi - x_lo) * 0.08, x_hi * 0.02, 1e-9)
    x_lo, x_hi = x_lo - pad, x_hi + pad
    y_lo, y_hi = min(ys), max(ys)
    ypad = max((y_hi - y_lo) * 0.08, 0.005)
    y_lo, y_hi = y_lo - ypad, y_hi + ypad
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(q: float) -> float:
        return LEFT + (q - x_lo) / (x_hi - x_lo) * pw

    def py(s: float) -> float:
        return TOP + (y_hi - s) / (y_hi - y_lo) * ph

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W:.0f}" height="{H:.0f}" '
             f'viewBox="0 0 {W:.0f} {H:.0f}" role="img" aria-label="{esc(metric)} against qps">']
    for t in _ticks(x_lo, x_hi):
        parts.append(f'<line class="grid" x1="{px(t):.1f}" y1="{TOP}" x2="{px(t):.1f}" y2="{TOP + ph}"/>'
                     f'<text x="{px(t):.1f}" y="{TOP + ph + 14}" text-anchor="middle">{t:g}</text>')
    for t in _ticks(y_lo, y_hi):
        parts.append(f'<line class="grid" x1="{LEFT}" y1="{py(t):.1f}" x2="{LEFT + pw}" y2="{py(t):.1f}"/>'
                     f'<text x="{LEFT - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:.3g}</text>')
    parts.append(f'<line class="ax" x1="{LEFT}" y1="{TOP + ph}" x2="{LEFT + pw}" y2="{TOP + ph}"/>'
                 f'<line class="ax" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + ph}"/>'
                 f'<text x="{LEFT + pw / 2:.1f}" y="{H - 8}" text-anchor="middle">throughput (qps)</text>'
                 f'<text x="14" y="{TOP + ph / 2:.1f}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {TOP + ph / 2:.1f})">{esc(metric)} (FP32 = 1)</text>')
    if floor is not None:
        parts.append(f'<line class="target" x1="{LEFT}" y1="{py(floor):.1f}" x2="{LEFT + pw}" '
                     f'y2="{py(floor):.1f}"><title>--max-loss: at least {floor:.4g}</title></line>'
                     f'<text x="{LEFT + pw - 4}" y="{py(floor) - 4:.1f}" text-anchor="end">'
                     f"1 - max-loss = {floor:.4g}</text>")
    order = sorted(marks, key=lambda m: m.kind == "chosen")  # the chosen one drawn last, on top
    for m in order:
        x = px(m.qps)
        if m.score is None:
            stroke = STYLE.get(m.kind, STYLE["modelled"])[1]
            parts.append(f'<line class="ref" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + ph}" '
                         f'stroke="{stroke}"><title>{esc_attr(m.title)}</title></line>'
                         f'<text x="{x + 4:.1f}" y="{TOP + 12}">{esc(m.label or m.kind)}</text>')
            continue
        y = py(m.score)
        parts.append(f"<g>{_shape(m.kind, x, y)}<title>{esc_attr(m.title)}</title></g>")
        if m.label:
            parts.append(f'<text x="{x + 9:.1f}" y="{y - 7:.1f}">{esc(m.label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


MEASURED = {"modelled": "a set of float regions: accuracy on the host, qps modelled",
            "full INT8": "full INT8 (measured)", "FP16": "FP16 (measured; a line when its accuracy was not)",
            "implicit INT8": "implicit INT8 (measured)", "chosen": "the chosen set (measured)"}
MODELLED = {**MEASURED, "full INT8": "full INT8 (the engine given)",
            "FP16": "FP16 (modelled from the engine's profile)",
            "chosen": "--max-loss's choice (modelled: not built)"}


def legend(kinds: Sequence[str], words: dict[str, str] = MEASURED) -> str:
    items = []
    for k in dict.fromkeys(kinds):
        items.append(f'<span><svg width="16" height="16" viewBox="0 0 16 16">{_shape(k, 8, 8, 4)}</svg> '
                     f"{esc(words.get(k, k))}</span>")
    return f'<div class="legend">{" &nbsp; ".join(items)}</div>'


# --------------------------------------------------------------------------------------------------
# deploy --max-loss: the budget's dict as a section and a page
# --------------------------------------------------------------------------------------------------


def _fig(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def budget_marks(d: dict[str, Any]) -> list[Mark]:
    """The chart's marks from ``BudgetResult.to_dict()``: every scored set (modelled qps), the engines."""
    marks = []
    for p in d.get("points", ()):
        if p.get("qps") is None or p["how"] == "chosen":
            continue
        regions = ", ".join(p["regions"]) or "none"
        marks.append(Mark("modelled", p["qps"], p["score"],
                          f"{len(p['regions'])} region(s) float: {regions}; {p['text']}; modelled "
                          f"{p['qps']:.0f} qps (+{p['cost_us']:.1f} us)"))
    for row in d.get("rows", ()):
        if row.get("qps") is None:
            continue
        score = row.get("host_score") if row.get("host_score") is not None else row.get("target_score")
        kind = "chosen" if row["name"] == "chosen" else row["name"]
        label = "chosen" if kind == "chosen" else ("" if score is not None else row["name"])
        marks.append(Mark(kind if kind in STYLE else "modelled", row["qps"], score,
                          f"{row['name']}: {row.get('accuracy') or 'accuracy not measured'}; "
                          f"{row['qps']:.0f} qps measured", label))
    return marks


def sensitivity_marks(d: dict[str, Any]) -> list[Mark]:
    """``edgeq sensitivity --engine``'s marks: each region float alone (all but one INT8), full INT8 at the
    engine's qps, FP16 modelled from its profile, ``--max-loss``'s choice (modelled: nothing was built)."""
    e = d["engine"]
    how = "measured" if e["qps_measured"] else "from its profile"
    marks = []
    for r in d["ranked"]:
        c = e["regions"].get(r["name"])
        if c is not None:
            marks.append(Mark("modelled", c["qps"], r["all_but_one"],
                              f"{r['name']} float ({', '.join(r['nodes'][:3])}): {r['all_but_one_text']}; "
                              f"modelled {c['qps']:.0f} qps (+{c['ms'] * 1000:.1f} us)"))
    marks.append(Mark("full INT8", e["qps"], d["all_int8"]["value"],
                      f"full INT8: {d['all_int8']['text']}; {e['qps']:.0f} qps ({how})"))
    if e.get("fp16_qps_modelled"):
        fp16 = e["fp16_qps_modelled"]
        marks.append(Mark("FP16", fp16, None, f"FP16, modelled from the profile: {fp16:.0f} qps",
                          "FP16 (modelled)"))
    b = e.get("budget")
    if b and b["regions"]:
        cost = b["cost"]["ms"]
        qps = e["qps"] * e["total_ms"] / (e["total_ms"] + max(0.0, cost))
        names = ", ".join(r["name"] for r in b["regions"])
        marks.append(Mark("chosen", qps, b["after"]["value"],
                          f"--max-loss {b['max_loss']:g}: {names} float; {b['after']['text']}; modelled "
                          f"{qps:.0f} qps (not built)", "chosen (modelled)"))
    return marks


def sensitivity_section(d: dict[str, Any]) -> str:
    """The sensitivity page's picture: accuracy against qps on the engine given with --engine."""
    if not d.get("engine"):
        return ""
    e = d["engine"]
    marks = sensitivity_marks(d)
    b = e.get("budget")
    floor = 1.0 - float(b["max_loss"]) if b else None
    return (f'<div class="tradeoff"><h2>Accuracy against speed on {esc(e["path"])}</h2><p class="muted">'
            "Each region kept float alone (every other one INT8): its score on the held-out set, its qps "
            "modelled from the engine's per-layer profile (its INT8 layers run FP16, reformats at its edges; "
            f"{esc(e['cost_model'])}). Only deploy --max-loss builds and measures a set.</p>"
            f"{tradeoff_svg(marks, floor=floor, metric=d.get('metric', 'metric'))}"
            f"{legend([m.kind for m in marks], MODELLED)}</div>")


def rows_table(d: dict[str, Any]) -> str:
    trs = []
    for row in d.get("rows", ()):
        style = ' style="font-weight:600"' if row["name"] == "chosen" else ""
        trs.append(f"<tr{style}><td>{esc(row['name'])}</td><td>{esc(row.get('what') or '')}</td>"
                   f"<td>{esc(row.get('host') or '-')}</td><td>{esc(row.get('target') or '-')}</td>"
                   f'<td class="fig">{_fig(row.get("qps"), ".0f")}</td>'
                   f'<td class="fig">{_fig(row.get("ratio"), ".3f")}</td></tr>')
    return ("<table><tr><th>engine</th><th>what</th><th>onnxruntime Q/DQ (host)</th>"
            f"<th>TensorRT (target)</th><th>qps</th><th>x full INT8</th></tr>{''.join(trs)}</table>")


def budget_section(d: dict[str, Any]) -> str:
    """The report page's section for ``deploy --max-loss``: the three engines, the chart, the choice."""
    marks = budget_marks(d)
    floor = 1.0 - float(d["max_loss"])
    cls = "pass" if d.get("reached") else "fail"
    timed = d.get("timed") or "single timings"
    notes = "".join(f'<div class="muted">{esc(n)}</div>' for n in d.get("notes", ()))
    return (f'<div class="tradeoff"><h2>Accuracy within --max-loss {d["max_loss"]:g}, at the least speed</h2>'
            f'<div class="verdict {cls}">{esc(d.get("summary", ""))}</div>{rows_table(d)}'
            f'<p class="muted">qps: {esc(timed)}. {esc(d.get("model_note", ""))}</p>'
            f"{tradeoff_svg(marks, floor=floor, metric=d.get('metric', 'metric'))}"
            f"{legend([m.kind for m in marks])}{notes}</div>")


def _cost_cell(cost: dict[str, Any]) -> str:
    """A region's modelled cost in us, or why there is none (no engine layer names its nodes)."""
    return f"{cost['ms'] * 1000:.1f}" if cost.get("nodes_found") else "not in the engine"


def render_budget_html(d: dict[str, Any]) -> str:
    """``budget.html``: the section above, then every region weighed (recovered, modelled cost)."""
    from edgeq.report.render import REPORT_CSS
    from edgeq.report.views import VIEW_CSS

    cands = "".join(
        f"<tr><td class=\"name\">{esc(c['name'])}</td><td class=\"name nodes\">"
        f"{esc(', '.join(c['nodes'][:4]))}{' ...' if len(c['nodes']) > 4 else ''}</td>"
        f"<td class=\"fig\">{c['recovered']:+.4f}</td>"
        f"<td class=\"fig\">{_cost_cell(c['cost'])}</td><td class=\"fig\">{c['cost']['layers']}</td>"
        f"<td class=\"fig\">{c['cost']['reformats']}</td></tr>"
        for c in d.get("candidates", ())
    )
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>edgeq deploy --max-loss: {esc(d.get('model', ''))}</title>",
        f"<style>{REPORT_CSS}{VIEW_CSS}{TRADEOFF_CSS}</style></head><body>",
        f'<h1>The accuracy budget on {esc(d.get("target", ""))}</h1><div class="muted">'
        f"{esc(d.get('model', ''))} &middot; metric {esc(d.get('metric', ''))} &middot; "
        f"{len(d.get('candidates', ()))} regions weighed in {d.get('runs', 0)} held-out runs</div>",
        budget_section(d),
        "<h2>Every region, most recovered per modelled cost first</h2><p class=\"muted\">recovered: the "
        "score with only this region float, less the score with every region INT8; cost: what keeping it "
        "float adds per inference on the full INT8 engine's profile (its INT8 layers run FP16, and the "
        "reformats at its edges).</p><table><tr><th>region</th><th>nodes</th><th>recovered</th>"
        f"<th>cost us</th><th>layers</th><th>reformats</th></tr>{cands}</table></body></html>\n",
    ])
