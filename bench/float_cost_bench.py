"""What keeping an INT8 layer float costs in TensorRT 8.6.0, measured from the recorded engines.

    python bench/float_cost_bench.py            # print the table and how well it predicts
    python bench/float_cost_bench.py --write    # also write edgeq/graph/data/trt86-float-cost.csv

No GPU: it reads tests/fixtures, TensorRT 8.6.0 engines built and profiled on H100s and H200s (batch 1-64),
each set from one lease. Three figures:

1. FP16 time over INT8 time per engine layer type: a compute layer that holds the same ONNX nodes in two
   engines of one model and one lease, INT8 in one and FP16 in the other because that engine's placement
   left it float (an explicit engine, the rules' or a mirror's, or a plain FP16 build: never an implicit
   engine's own FP16 choice, which TensorRT made because FP16 was faster there). Each (lease, model, layer)
   counts once, the median over the pairs that saw it.
2. One interior INT8<->FP16 reformat: least squares of its profiled time on its elements, over every
   recorded engine's.
3. The check: engines that ran some regions float beside an engine of the same model and lease that ran
   them INT8 (the same nodes by name): the second engine's profile priced by ``edgeq.quant.float_cost``
   with the first one's float nodes, against what the first engine's profile measured.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures"
OUT = ROOT / "edgeq" / "graph" / "data" / "trt86-float-cost.csv"
MIN_N = 8  # a layer type seen fewer times takes the pooled ratio
# pairs of different file stems that are one model in one lease (the plain FP16 build of the YOLO-like net)
CROSS = {("trt86-h200-edgeq", "yolo.fp16", "yolo_fix2.explicit"),
         ("trt86-h200-edgeq", "yolo.fp16", "yolo_edgeq.implicit")}
# (directory, engine with float regions, its INT8 sibling): the check of figure 3
CHECKS = [
    ("trt86-h200-edgeq", "yolo_edgeq.explicit", "yolo_fix2.explicit"),
    ("trt86-h200-edgeq", "r50b8_edgeq.explicit", "r50b8_edgeq.implicit"),
    ("trt86-h200-edgeq", "r50b64_edgeq.explicit", "r50b64_edgeq.implicit"),
    ("trt86-h100-zoo", "effb0.explicit", "effb0.implicit"),
    ("trt86-h100-zoo3", "shufflenet.static", "shufflenet.static-nofe"),
    ("trt86-h100-corpus3", "densenet_mini.mirror", "densenet_mini.implicit"),
    ("trt86-h100-corpus", "mobilenet_v3_large.static", "mobilenet_v3_large.implicit"),
    ("trt86-h200-corpus", "regnet_y_800mf.mirror", "regnet_y_800mf.implicit"),
]


def _read(p: Path) -> str:
    return gzip.decompress(p.read_bytes()).decode() if p.suffix == ".gz" else p.read_text()


def engines(d: Path) -> dict[str, object]:
    """Every engine of a directory with a layer JSON and a profile, as a report."""
    from edgeq.errors import EdgeqError
    from edgeq.report.fusion_build import build_report
    from edgeq.report.parse import load_layers, load_profile

    out = {}
    for lp in sorted(d.glob("*.layers.json*")):
        stem = lp.name.split(".layers.json")[0]
        profiles = sorted(d.glob(stem + ".profile.json*"))
        if not profiles:
            continue
        try:
            out[stem] = build_report(load_layers(_read(lp)), load_profile(_read(profiles[0])))
        except EdgeqError:
            continue
    return out


def _nodes(rl) -> frozenset[str]:
    return frozenset(n for n in rl.onnx_nodes if "QuantizeLinear" not in n and "DequantizeLinear" not in n)


def ratios(all_engines: dict[str, dict[str, object]]) -> dict[str, list[float]]:
    """Layer type -> FP16/INT8 ratios, one per (lease, model, layer)."""
    from edgeq.report.fusion import LayerKind

    seen: dict[tuple[str, str, str, frozenset[str]], list[float]] = defaultdict(list)
    for d, es in all_engines.items():
        for a, b in itertools.permutations(es, 2):
            if a.split(".")[0] != b.split(".")[0] and (d, a, b) not in CROSS:
                continue
            if "implicit" in a.split(".")[1:]:  # TensorRT's own FP16 choice: it was the faster one
                continue
            computes = [rl for rl in es[a].layers if rl.kind == LayerKind.COMPUTE and _nodes(rl)]
            float_side = {_nodes(rl): rl for rl in computes}
            for rl in es[b].layers:
                other = float_side.get(_nodes(rl)) if rl.kind == LayerKind.COMPUTE and _nodes(rl) else None
                if other is None or rl.precision != "INT8" or other.precision != "FP16":
                    continue
                if rl.time_ms and other.time_ms:
                    seen[(d, a.split(".")[0], rl.layer_type, _nodes(rl))].append(other.time_ms / rl.time_ms)
    out: dict[str, list[float]] = defaultdict(list)
    for (_, _, layer_type, _), rs in seen.items():
        out[layer_type].append(statistics.median(rs))
    return out


def reformat_fit(all_engines: dict[str, dict[str, object]]) -> tuple[float, float, int]:
    """(fixed ms, ms per element, n) of interior INT8<->FP16 reformats."""
    import numpy as np

    from edgeq.quant.float_cost import elements
    from edgeq.report.fusion import LayerKind

    pts = []
    for es in all_engines.values():
        for rep in es.values():
            for rl in rep.layers:
                if rl.kind != LayerKind.REFORMAT or rl.same_format_copy or not rl.interior or not rl.time_ms:
                    continue
                pair = {(rl.in_precisions or (None,))[0], (rl.out_precisions or (None,))[0]}
                if pair == {"INT8", "FP16"} and rl.data_inputs:
                    pts.append((elements(rl.data_inputs[0].dims), rl.time_ms))
    n = np.array([x for x, _ in pts], float)
    t = np.array([y for _, y in pts], float)
    (a, b), *_ = np.linalg.lstsq(np.vstack([np.ones_like(n), n]).T, t, rcond=None)
    return float(a), float(b), len(pts)


def _q(v: list[float], f: float) -> float:
    s = sorted(v)
    return s[int(f * (len(s) - 1))]


Row = tuple[str, str, float, int, Optional[float], Optional[float]]


def table_rows(all_engines: dict[str, dict[str, object]]) -> list[Row]:
    by_type = ratios(all_engines)
    pooled = [r for rs in by_type.values() for r in rs]
    rows = [("fp16_over_int8", t, statistics.median(rs), len(rs), _q(rs, .25), _q(rs, .75))
            for t, rs in sorted(by_type.items()) if len(rs) >= MIN_N]
    rows.append(("fp16_over_int8", "*", statistics.median(pooled), len(pooled), _q(pooled, .25),
                 _q(pooled, .75)))
    a, b, n = reformat_fit(all_engines)
    rows += [("reformat", "fixed_ms", a, n, None, None), ("reformat", "ms_per_element", b, n, None, None)]
    return rows


def _g(v: Optional[float]) -> str:
    return "" if v is None else f"{v:.4g}"


def write_csv(rows: list[Row]) -> None:
    from edgeq.fs import atomic_write_text

    head = ("# What keeping an INT8 layer float costs in TensorRT 8.6.0: written by\n"
            "# bench/float_cost_bench.py from the recorded engines of tests/fixtures (H100 80GB HBM3 and\n"
            "# H200, batch 1-64, one lease per set). fp16_over_int8: median FP16 time / INT8 time of one\n"
            "# engine layer type, over layers that ran INT8 in one engine and FP16 in another of the same\n"
            "# model and lease because its placement left them float (n layers; q25/q75 the quartiles).\n"
            "# reformat: one interior INT8<->FP16 reformat = fixed_ms + ms_per_element x its elements\n"
            "# (least squares over n reformats). Read by edgeq.quant.float_cost; a guess on other GPUs\n"
            "# until a build there confirms it.\n")
    body = "fact,key,value,n,q25,q75\n" + "".join(
        f"{f},{k},{v:.6g},{n},{_g(q1)},{_g(q3)}\n" for f, k, v, n, q1, q3 in rows)
    atomic_write_text(OUT, head + body)


def check(all_engines: dict[str, dict[str, object]]) -> list[str]:
    """Figure 3: each CHECKS engine's float nodes priced on its INT8 sibling, against the profiles."""
    from edgeq.quant.float_cost import CostModel
    from edgeq.report.fusion import LayerKind

    lines = []
    for d, floated, int8 in CHECKS:
        es = all_engines.get(d, {})
        if floated not in es or int8 not in es:
            continue
        f, i = es[floated], es[int8]
        nodes = {n for rl in f.layers if rl.kind == LayerKind.COMPUTE and rl.precision in ("FP16", "FP32")
                 for n in rl.onnx_nodes}
        cost = CostModel(i).price(nodes)
        measured = f.profile_total_ms - i.profile_total_ms
        lines.append(f"{d}/{floated} from {int8}: {len(nodes)} float nodes in {cost.layers} INT8 layers of "
                     f"{cost.int8_ms * 1000:.0f} us, {cost.reformats} reformats; modelled +"
                     f"{cost.ms * 1000:.0f} us (layers {cost.layer_ms * 1000:+.0f}, reformats "
                     f"{cost.reformat_ms * 1000:+.0f}), profiles {measured * 1000:+.0f} us "
                     f"({i.profile_total_ms * 1000:.0f} -> {f.profile_total_ms * 1000:.0f} us)")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    args = ap.parse_args()
    all_engines = {d.name: engines(d) for d in sorted(p for p in FIXTURES.iterdir() if p.is_dir())}
    rows = table_rows(all_engines)
    print(f"{'fact':16s} {'key':18s} {'value':>10s} {'n':>5s} {'q25':>6s} {'q75':>6s}")
    for f, k, v, n, q1, q3 in rows:
        print(f"{f:16s} {k:18s} {v:10.4g} {n:5d} {_g(q1):>6s} {_g(q3):>6s}")
    if args.write:
        write_csv(rows)
        print(f"wrote {OUT.relative_to(ROOT)}")
    print("\nmodelled against measured (profile totals, one lease each):")
    for line in check(all_engines):
        print("  " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
