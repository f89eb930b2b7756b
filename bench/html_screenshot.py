"""The report and compare pages in a real headless browser: render them from the real TensorRT 8.6 engines
(tests/fixtures/trt86-h200-edgeq), screenshot each with Chromium, print where the PNGs are.

    python bench/html_screenshot.py [--out DIR] [--browser chromium] [--width 1400] [--height 1800]
    python bench/html_screenshot.py --page runs/<run>/budget.html   # a page a command wrote, too

Needs a Chromium (Debian: ``apt-get install chromium``); CI does not install one, so this is a bench
script, not a test. Prints per page: render time, HTML size, screenshot time and the PNG's path and size.
Look at the PNGs: the first screen should show the engine strip, where the time goes, and the
violations grouped by region (report), or the engines' strips and the aligned regions (compare).
"""

from __future__ import annotations

import argparse
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EDGEQ = ROOT / "tests" / "fixtures" / "trt86-h200-edgeq"
sys.path.insert(0, str(ROOT))


def pages() -> dict[str, str]:
    """name -> HTML: the report of edgeq's YOLO engine and the implicit/explicit/fix2/all comparison."""
    from edgeq.report import POLICIES, apply_gate, build_report, load_layers, load_profile, render_html
    from edgeq.report.compare import compare_engines
    from edgeq.report.compare_engine import engine_from_path
    from edgeq.report.compare_gate import relative_gate
    from edgeq.report.compare_html import render_compare_html

    stem = EDGEQ / "yolo_edgeq.explicit"
    report = build_report(load_layers(f"{stem}.layers.json"), load_profile(f"{stem}.profile.json"))
    out = {"report-yolo_edgeq.explicit": render_html(report, apply_gate(report, POLICIES["int8"]))}
    names = ["yolo_edgeq.implicit.layers.json", "yolo_edgeq.explicit.layers.json",
             "yolo_fix2.explicit.layers.json", "yolo_edgeq_all.explicit.build.log"]  # fmt: skip
    comparison = compare_engines([engine_from_path(EDGEQ / n) for n in names])
    gates = [relative_gate(d) for d in comparison.diffs]
    out["compare-yolo"] = render_compare_html(comparison, gates)
    return out


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit(f"{path}: not a PNG")
    return struct.unpack(">II", head[16:24])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, default=None, help="where the HTML and PNG files go (default: a temp dir)"
    )
    ap.add_argument("--browser", default=None, help="Chromium executable (default: chromium on PATH)")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1800)
    ap.add_argument("--page", type=Path, action="append", default=[],
                    help="also screenshot this HTML file (a run's budget.html or report.html, ...)")
    args = ap.parse_args()
    browser = args.browser or shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        print(
            "no chromium on PATH (Debian: apt-get install chromium); nothing to screenshot", file=sys.stderr
        )
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="edgeq-html-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rendered = pages()
    render_s = time.perf_counter() - t0
    print(f"rendered {len(rendered)} pages in {render_s:.2f} s (parsing the engines included)")
    for given in args.page:
        rendered[given.stem] = given.read_text(encoding="utf-8")
    for name, html in rendered.items():
        page = out / f"{name}.html"
        png = out / f"{name}.png"
        page.write_text(html, encoding="utf-8")
        t = time.perf_counter()
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--window-size={args.width},{args.height}", f"--screenshot={png}", page.as_uri()]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        shot_s = time.perf_counter() - t
        if proc.returncode != 0 or not png.exists():
            print(f"{name}: {browser} failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
            return 1
        w, h = png_size(png)
        print(f"{name}: HTML {len(html) / 1024:.0f} KiB, screenshot {shot_s:.1f} s, {w}x{h} -> {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
