"""``edgeq sensitivity`` as one self-contained page: a bar per region, as long as the task metric it
recovers when kept float, beside what it scores alone; the all-INT8 loss as the scale, so a bar reaching
the line is a region that explains the whole loss."""

from __future__ import annotations

from typing import Any

from edgeq.report.render import REPORT_CSS
from edgeq.report.tradeoff_html import TRADEOFF_CSS, sensitivity_section
from edgeq.report.views import VIEW_CSS, esc, esc_attr

_PAGE_CSS = """
.bars td{vertical-align:middle} .bar{height:14px;border-radius:2px;display:inline-block;vertical-align:middle}
.rec{background:#2e7d32} .neg{background:#c62828} .track{position:relative;width:360px;height:14px;
background:#f5f5f5;display:inline-block} .full{position:absolute;top:-2px;bottom:-2px;border-left:2px dashed
#37474f} .nodes{font-family:ui-monospace,Menlo,monospace;font-size:11px;max-width:520px;word-break:break-all}
.fig{font-variant-numeric:tabular-nums;text-align:right;white-space:nowrap}
"""
TRACK_PX = 360.0


def _bar(recovered: float, loss: float) -> str:
    scale = TRACK_PX / (2.0 * loss) if loss > 0 else 0.0  # the all-INT8 loss sits at half the track
    width = min(TRACK_PX, abs(recovered) * scale) if scale else 0.0
    cls = "rec" if recovered >= 0 else "neg"
    line = (f'<span class="full" style="left:{TRACK_PX / 2:.0f}px" title="the whole loss"></span>'
            if scale else "")
    return (f'<span class="track">{line}<span class="bar {cls}" style="width:{width:.1f}px" '
            f'title="recovered {recovered:+.4f}"></span></span>')


def _nodes(nodes: list[str], shown: int = 4) -> str:
    more = len(nodes) - shown
    text = ", ".join(nodes[:shown]) + (f", ... {more} more" if more > 0 else "")
    return f'<span title="{esc_attr(chr(10).join(nodes))}">{esc(text)}</span>'


def _fig(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def render_sensitivity_html(d: dict[str, Any]) -> str:
    """The page for ``SensitivityResult.to_dict()`` (with ``model``)."""
    loss = float(d["loss"])
    rows = "".join(
        f'<tr><td class="fig">{i}</td><td class="nodes">{esc(r["name"])}</td>'
        f'<td class="nodes">{_nodes(r["nodes"])}</td><td class="fig">{r["clip"]:.2f}</td>'
        f'<td class="fig">{_fig(r["alone"])}</td>'
        f'<td class="fig">{r["all_but_one"]:.4f}</td><td class="fig">{r["recovered"]:+.4f}</td>'
        f"<td>{_bar(r['recovered'], loss)}</td></tr>"
        for i, r in enumerate(d["ranked"], start=1)
    )
    head = (f"{esc(d['all_int8']['text'])} with every region INT8 (FP32 scores 1.0): loss {loss:.4f} "
            f"on {d['samples']} held-out samples; metric {esc(d['metric'])} ({esc(d['metric_chosen_by'])}), "
            f"calibrator {esc(d['calibrator'])}")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>edgeq sensitivity: {esc(d.get('model', ''))}</title>",
        f"<style>{REPORT_CSS}{_PAGE_CSS}{VIEW_CSS}{TRADEOFF_CSS}</style></head><body>",
        f'<h1>Which regions cost the task metric</h1><div class="muted">{esc(d.get("model", ""))} &middot; '
        f"{d['scored']} of {d['regions']} regions scored in {d['seconds']:.0f} s</div>",
        f'<div class="verdict info">{head}</div>',
    ]
    if d.get("interrupted"):
        parts.append('<div class="verdict fail">interrupted: the regions below are those that finished</div>')
    for s in d["skipped"]:
        parts.append(f'<div class="verdict info">{len(s["regions"])} region(s) not scored ({esc(s["why"])})'
                     "</div>")
    for note in d.get("notes", ()):
        parts.append(f'<div class="muted">note: {esc(note)}</div>')
    parts.append(sensitivity_section(d))
    parts.append(
        "<h2>Regions, most recovered first</h2><p class=\"muted\">recovered = score with every region INT8 "
        "but this one, minus the score with all INT8: what excluding its nodes (<code>--overrides</code> "
        "exclude) buys. The dashed line is the whole loss. clip = max |x| in calibration over the scale's "
        "amax.</p>"
        '<table class="bars"><tr><th>#</th><th>region</th><th>nodes (exclude these)</th><th>clip</th>'
        "<th>alone</th><th>all but this</th><th>recovered</th><th></th></tr>"
        f"{rows}</table></body></html>\n"
    )
    return "\n".join(parts)
