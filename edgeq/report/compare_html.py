"""A comparison as one self-contained HTML page: every engine as a strip (its length is its time), then
per candidate the regions that differ most and both layer sequences aligned, differing regions
highlighted, each layer a block as wide as its time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from edgeq.report.compare import Comparison, PairDiff
from edgeq.report.compare_engine import Engine
from edgeq.report.compare_regions import Region, Side
from edgeq.report.fusion import FusionReport
from edgeq.report.render import REPORT_CSS
from edgeq.report.views import VIEW_CSS, color_of, engine_strip, esc, layer_block, legend

_PAGE_CSS = """
.eng td{vertical-align:middle} .strips{min-width:420px}
.align td{vertical-align:middle;padding:2px 6px} .align tr.diff{background:#fff3e0}
.align tr.same td{opacity:.55} .cell{display:flex;gap:1px;align-items:center;height:18px}
.cell .blk{height:18px;border-radius:2px} .lbl{font-family:ui-monospace,Menlo,monospace;font-size:11px;
max-width:420px;word-break:break-all} .rule{font-size:11px;border:1px solid #6a1b9a;color:#6a1b9a;
border-radius:3px;padding:0 4px;margin-right:3px;white-space:nowrap}
.delta.pos{color:#b71c1c;font-weight:600} .delta.neg{color:#1b5e20}
"""
BLOCK_PX = 150.0  # the slowest layer of the page is this wide


def _rule_title(rule: str) -> str:
    """A placement pattern's fact (the registry's, as ``edgeq quantize`` cites it); other ids unchanged."""
    from edgeq.graph import registry

    p = registry.get(rule)
    return p.fact if p is not None and p.id == rule and p.kind == "fusion" else rule


def _rules(region: Region) -> str:
    return "".join(
        f'<span class="rule" title="{esc(_rule_title(e.rule))}: {esc(e.why)}">{esc(e.rule)}</span>'
        for e in region.explanations
    ) or ('<span class="muted">-</span>' if region.differs else "")


def _cell(report: FusionReport, side: Side, scale: float) -> str:
    blocks = []
    for i in side.layers:
        rl = report.layers[i]
        px = 12.0 if rl.time_ms is None or scale <= 0 else max(2.0, rl.time_ms * scale)
        blocks.append(layer_block(rl, px))
    return f'<div class="cell">{"".join(blocks)}</div>'


def _delta(r: Region) -> str:
    d = r.delta_ms
    if d is None:
        return '<span class="muted">-</span>'
    cls = "pos" if d > 0.0005 else ("neg" if d < -0.0005 else "")
    return f'<span class="delta {cls}">{d * 1000:+.1f}&nbsp;µs</span>'


def _engines_table(comparison: Comparison) -> str:
    diffs = {d.candidate: d for d in comparison.diffs}
    totals = [e.report.profile_total_ms or 0.0 for e in comparison.engines if e.report is not None]
    longest = max(totals) if totals else 0.0
    rows = []
    for e in comparison.engines:
        if e.report is None:
            rows.append(
                f'<tr><td><b>{esc(e.name)}</b></td><td colspan="6" class="fail">build failed: '
                f"{esc(e.error or '')}</td></tr>"
            )
            continue
        s = e.stats
        width = 100.0 * (s.total_ms or 0.0) / longest if longest > 0 else 100.0
        strip = f'<div style="width:{width:.1f}%">{engine_strip(e.report)}</div>'
        comp = " ".join(
            f'<span class="badge" style="background:{color_of(p)}">{n} {esc(p)}</span>'
            for p, n in sorted(s.precisions.items())
        )
        d = diffs.get(e.name)
        ratio = "baseline" if e is comparison.baseline else "-"
        if d is not None and d.ratio.throughput is not None:
            src = esc(d.ratio.source)
            ratio = f"<b>{d.ratio.throughput:.2f}x</b> throughput<br><span class='muted'>{src}</span>"
        qps = f"{e.run.throughput_qps:.0f} qps" if e.run and e.run.throughput_qps else ""
        ms = f"{s.total_ms:.3f} ms" if s.total_ms is not None else "untimed"
        rows.append(
            f"<tr><td><b>{esc(e.name)}</b><div class='muted'>{esc(e.report.mode)}, {s.layers} layers"
            f"</div></td><td class='strips'>{strip}</td><td>{comp}</td>"
            f"<td>{s.reformats} reformats<br>{s.copies} copies</td>"
            f"<td>{ms}<br>{qps}</td><td>{ratio}</td></tr>"
        )
    return (
        '<table class="eng"><tr><th>engine</th><th>layers (strip length = summed layer time)</th>'
        "<th>compute</th><th>interior</th><th>time</th><th>vs baseline</th></tr>" + "".join(rows) + "</table>"
    )


def _diff_section(base: Engine, cand: Engine, d: PairDiff, gate: Optional[Any], top: int) -> str:
    assert base.report is not None and cand.report is not None
    parts = [f"<h2>{esc(d.candidate)} vs {esc(d.baseline)}</h2>"]
    if gate is not None:
        cls = "pass" if gate else "fail"
        items = "".join(f"<li>[{esc(r)}] {esc(m)}</li>" for r, m in gate.failures)
        parts.append(f'<div class="verdict {cls}">{esc(gate.summary())}</div>')
        if items:
            parts.append(
                f"<details><summary>{len(gate.failures)} failures</summary>"
                f'<ul class="viol">{items}</ul></details>'
            )
    r = d.ratio
    if r.throughput is not None:
        lat = f", latency {r.latency:.2f}x" if r.latency is not None else ""
        parts.append(
            f"<p>throughput <b>{r.throughput:.2f}x</b>{lat} the baseline's (from {esc(r.source)})</p>"
        )
    times = [
        rep.layers[i].time_ms or 0.0
        for rep, side in ((base.report, "base"), (cand.report, "cand"))
        for reg in d.regions
        for i in getattr(reg, side).layers
    ]
    scale = BLOCK_PX / max(times) if times and max(times) > 0 else 0.0
    head = (
        "<tr><th>baseline layers</th><th>region (ONNX nodes)</th><th>candidate layers</th>"
        "<th>Δ time</th><th>rule</th></tr>"
    )
    b_report, c_report = base.report, cand.report

    def row(reg: Region) -> str:
        cls = "diff" if reg.differs else "same"
        what = ", ".join(reg.differences)
        return (
            f'<tr class="{cls}"><td>{_cell(b_report, reg.base, scale)}</td>'
            f'<td class="lbl" title="{esc(", ".join(reg.nodes))}">{esc(reg.label())}'
            f"{f'<div class=muted>{esc(what)}</div>' if what else ''}</td>"
            f"<td>{_cell(c_report, reg.cand, scale)}</td><td>{_delta(reg)}</td><td>{_rules(reg)}</td></tr>"
        )

    group_parts: list[str] = []
    b_res, c_res = d.base_stats.unfused_residuals, d.cand_stats.unfused_residuals
    if c_res != b_res:
        unfused = f"{c_res} residual Add layers not fused into a convolution (baseline {b_res})"
        group_parts.append(f"<p>{unfused}</p>")
    for label, groups in (
        ("Fused in the baseline only", d.missing_groups),
        ("Fused in the candidate only", d.extra_groups),
    ):
        if groups:
            lis = "".join(f"<li>{esc(g)}</li>" for g in groups)
            group_parts.append(
                f"<details{' open' if len(groups) <= 6 else ''}><summary>{label} ({len(groups)})</summary>"
                f'<ul class="viol">{lis}</ul></details>'
            )
    top_regions = d.top(top)
    n_diff = sum(reg.differs for reg in d.regions)
    if top_regions:
        parts.append(f"<h3>Where the time goes: top {len(top_regions)} of {n_diff} differing regions</h3>")
        parts.append('<table class="align">' + head + "".join(row(reg) for reg in top_regions) + "</table>")
    else:
        parts.append(
            '<div class="verdict pass">No region differs: same fusion, precisions and reformats.</div>'
        )
    parts.extend(group_parts)
    parts.append(
        f"<details{' open' if n_diff else ''}><summary>Both engines aligned, region by region "
        f"({len(d.regions)} regions, {n_diff} differ)</summary>"
        '<table class="align">' + head + "".join(row(reg) for reg in d.regions) + "</table></details>"
    )
    return "\n".join(parts)


def render_compare_html(comparison: Comparison, gates: Sequence[Any] = (), top: int = 10) -> str:
    """One self-contained page; ``gates`` (relative gate results) in the order of ``comparison.diffs``."""
    by_name = {e.name: e for e in comparison.engines}
    gate_of = {g.candidate: g for g in gates}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>edgeq compare: {esc(comparison.baseline.name)}</title>",
        f"<style>{REPORT_CSS}{VIEW_CSS}{_PAGE_CSS}</style></head><body>",
        f'<h1>Engine comparison</h1><div class="muted">baseline {esc(comparison.baseline.name)} &middot; '
        f"{len(comparison.engines)} engines</div>",
        legend(),
        _engines_table(comparison),
    ]
    for note in comparison.notes:
        parts.append(f'<div class="verdict info">{esc(note)}</div>')
    for d in comparison.diffs:
        parts.append(
            _diff_section(comparison.baseline, by_name[d.candidate], d, gate_of.get(d.candidate), top)
        )
    built = {d.candidate for d in comparison.diffs}
    for g in gates:  # a candidate that did not build has no section, only its verdict
        if g.candidate not in built:
            parts.append(f'<div class="verdict fail">{esc(str(g))}</div>')
    parts.append("</body></html>\n")
    return "\n".join(parts)
