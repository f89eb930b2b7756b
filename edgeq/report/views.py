"""Pictures of an engine as HTML fragments (no scripts, no external assets), shared by the report and
compare pages: a layer as a block (width = time, colour = precision, reformats hatched, copies grey),
an engine as a strip of blocks, a precision/time breakdown as a stacked bar.

TREx (NVIDIA trt-engine-explorer) draws the same things as plots; here they are plain ``div``s so the
page stays one self-contained file.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Optional

from edgeq.report.fusion import FusionReport, LayerKind, ReportLayer
from edgeq.text import number

PRECISION_COLORS = {
    "INT8": "#2e7d32",
    "UINT8": "#2e7d32",
    "FP8": "#00838f",
    "FP16": "#ef8f00",
    "BF16": "#ef6c00",
    "FP32": "#c62828",
    "INT32": "#6a1b9a",
    "INT64": "#6a1b9a",
    "BOOL": "#546e7a",
}
UNKNOWN_COLOR = "#757575"
_CTL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def esc(text: object) -> str:
    """HTML-escape, and show control characters as visible escapes instead of writing them raw."""
    s = html.escape(str(text), quote=True)
    return _CTL.sub(lambda m: f'<span class="ctl">\\x{ord(m.group()):02x}</span>', s)


def esc_attr(text: object) -> str:
    """Escape for an attribute value or an SVG ``<title>``: control characters as ``\\xNN`` text (``esc``'s
    ``<span>`` would end the attribute) and a newline as a line break of the tooltip."""
    s = _CTL.sub(lambda m: "\n" if m.group() == "\n" else f"\\x{ord(m.group()):02x}", str(text))
    return html.escape(s, quote=True).replace("\n", "&#10;")


COPY_COLOR = "#9e9e9e"
WEIGHT_COPY_COLOR = "#cfd8dc"  # weight-copy layers: constants copied on every inference
NOOP_COLOR = "#eeeeee"

VIEW_CSS = """
.strip{display:flex;align-items:stretch;height:34px;border:1px solid #cfd8dc;border-radius:4px;
overflow:hidden;background:#fafafa;margin:6px 0}
.blk{height:100%;box-sizing:border-box;border-right:1px solid rgba(255,255,255,.7);min-width:2px}
.blk.reformat{background-image:repeating-linear-gradient(45deg,rgba(255,255,255,.55) 0 3px,
transparent 3px 6px)}
.blk.copy{background:#9e9e9e!important}
.blk.viol{box-shadow:inset 0 -6px 0 #b71c1c}
.stack{display:flex;height:16px;border-radius:3px;overflow:hidden;min-width:120px}
.stack div{height:100%}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:middle;
margin-right:4px}
"""


def color_of(precision: Optional[str]) -> str:
    return PRECISION_COLORS.get(precision or "", UNKNOWN_COLOR)


def block_precision(rl: ReportLayer) -> Optional[str]:
    """Compute layers by their precision; a reformat by what it writes (its cost lands in that format)."""
    if rl.kind == LayerKind.REFORMAT:
        return rl.out_precisions[0] if rl.out_precisions else None
    return rl.precision


def layer_title(rl: ReportLayer) -> str:
    """Hover text: index, type, precision/formats, time, ONNX nodes."""
    t = f"{rl.time_ms * 1000:.1f} µs" if rl.time_ms is not None else "untimed"
    nodes = ", ".join(rl.onnx_nodes[:4]) or ", ".join(rl.related_nodes[:2])
    kind = "copy" if rl.same_format_copy else rl.kind.value
    return f"#{rl.index} {rl.layer_type} ({kind}) {rl.formats} · {t}" + (f" · {nodes}" if nodes else "")


def layer_block(rl: ReportLayer, width: float, flagged: bool = False) -> str:
    """One layer as a coloured block ``width`` pixels wide (or a percentage when ``width`` < 0)."""
    classes = ["blk"]
    if rl.kind == LayerKind.REFORMAT:
        classes.append("copy" if rl.same_format_copy else "reformat")
    if flagged:
        classes.append("viol")
    size = f"flex:0 0 {-width:.3f}%" if width < 0 else f"flex:0 0 {width:.1f}px"
    return (
        f'<div class="{" ".join(classes)}" style="{size};background-color:{color_of(block_precision(rl))}" '
        f'title="{esc(layer_title(rl))}"></div>'
    )


def strip_layers(report: FusionReport) -> list[ReportLayer]:
    """What the strip shows: layers that run per inference on activations (weights and no-ops left out)."""
    return [rl for rl in report.layers if rl.kind not in (LayerKind.WEIGHTS, LayerKind.NOOP)]


def engine_strip(report: FusionReport, flagged: Sequence[int] = ()) -> str:
    """The engine as a strip: each layer's width its share of the profiled time (equal widths untimed)."""
    rls = strip_layers(report)
    total = sum(rl.time_ms or 0.0 for rl in rls) if report.timed else 0.0
    marks = set(flagged)
    blocks = []
    for rl in rls:
        share = (rl.time_ms or 0.0) / total if total > 0 else 1.0 / max(1, len(rls))
        blocks.append(layer_block(rl, -100.0 * share, rl.index in marks))
    return f'<div class="strip">{"".join(blocks)}</div>'


def breakdown(report: FusionReport) -> list[tuple[str, int, Optional[float], str]]:
    """(label, layers, ms, colour): compute per precision, then reformats and copies. Timed, the
    weight-copy and no-op layers that took time too, so the shares add up to the profiled total
    (weight copies were 20% of one engine's time while the shares of the rest read as 100%)."""
    timed = report.timed
    rows: dict[str, list] = {}
    for rl in report.layers:
        if rl.kind in (LayerKind.WEIGHTS, LayerKind.NOOP):
            if not (timed and rl.time_ms):
                continue  # not on the strip: only the time such a layer takes is shown
            weights = rl.kind == LayerKind.WEIGHTS
            label = "weight copies" if weights else "no-op layers"
            colour = WEIGHT_COPY_COLOR if weights else NOOP_COLOR
        elif rl.kind == LayerKind.REFORMAT:
            label = "same-format copies" if rl.same_format_copy else "reformats"
            colour = COPY_COLOR if rl.same_format_copy else "#5d4037"
        else:
            label = f"{rl.precision or 'unknown'} compute"
            colour = color_of(rl.precision)
        row = rows.setdefault(label, [0, 0.0, colour])
        row[0] += 1
        row[1] += rl.time_ms or 0.0
    order = sorted(rows.items(), key=lambda kv: (not kv[0].endswith("compute"), kv[0]))
    return [(label, n, ms if timed else None, colour) for label, (n, ms, colour) in order]


def stacked_bar(parts: Sequence[tuple[str, float, str]]) -> str:
    """(label, value, colour) parts as one horizontal stacked bar."""
    total = sum(v for _, v, _ in parts) or 1.0
    cells = "".join(
        f'<div style="flex:0 0 {100 * v / total:.3f}%;background:{c}" '
        f'title="{esc(label)}: {number(v)}"></div>'
        for label, v, c in parts
        if v > 0
    )
    return f'<div class="stack">{cells}</div>'


def legend() -> str:
    items = [(p, color_of(p)) for p in ("INT8", "FP16", "FP32")] + [("unknown", UNKNOWN_COLOR)]
    spans = "".join(f'<span><i style="background:{c}"></i>{esc(p)}</span>' for p, c in items)
    spans += (
        f'<span><i style="background:{color_of("FP16")};background-image:repeating-linear-gradient(45deg,'
        'rgba(255,255,255,.55) 0 3px,transparent 3px 6px)"></i>reformat (hatched, colour = what it '
        "writes)</span>"
        f'<span><i style="background:{COPY_COLOR}"></i>same-format copy (Concat)</span>'
        '<span><i style="background:#fff;box-shadow:inset 0 -4px 0 #b71c1c;border:1px solid #ccc"></i>'
        "gate violation</span>"
    )
    return f'<div class="legend">{spans}</div>'
