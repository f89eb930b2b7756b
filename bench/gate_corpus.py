"""The int8 gate over every recorded explicit TensorRT 8.6 engine in tests/fixtures: one line each.

    python bench/gate_corpus.py [--json OUT]
    python bench/gate_corpus.py --tree /path/to/another/checkout --json OLD   # the same with its edgeq

Run it on two checkouts and diff the two JSON files to see which verdicts a change to the report's
regions or the gate moves (2026-12-07: the end of the INT8 region at an INT8 layer's float epilogue moved
38 of the 100 engines it gates, 14 from fail to pass: docs, Benchmarks). No GPU: the engines' layer JSON only.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", type=Path, help="import edgeq from this checkout [default: this one]")
    ap.add_argument("--json", type=Path, help="also write {engine: [passed, violations, checked]} here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(args.tree or FIXTURES.parents[1]))
    from edgeq.report import POLICIES, apply_gate, build_report, load_layers

    out: dict[str, list[object]] = {}
    for f in sorted(FIXTURES.rglob("*layers.json*")):
        raw = gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
        try:
            report = build_report(load_layers(json.loads(raw, strict=False)))
            if report.mode != "explicit":
                continue
            g = apply_gate(report, POLICIES["int8"])
        except Exception as e:  # names only, or formats "N/A due to dynamic shapes": said, not fatal
            print(f"{f.relative_to(FIXTURES)}: not gated ({type(e).__name__})")
            continue
        out[str(f.relative_to(FIXTURES))] = [bool(g), len(g.violations), g.checked]
        print(f"{f.relative_to(FIXTURES)}: {g.summary()}")
    print(f"{len(out)} explicit engines, {sum(1 for v in out.values() if v[0])} pass the int8 gate")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
