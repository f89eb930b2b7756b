"""Does a standalone Q after data movement cost TensorRT 8.6 a second reformat, and does giving it a
PointWise to fuse into win it back? (ShuffleNetV2's channel shuffles; run after ``zoo_bench.py``.)

The zoo's ShuffleNetV2 engines show it: where a branch convolution reads a Slice of the channel shuffle,
implicit INT8 quantizes in one copy (FP32 linear -> INT8 NC/32HW32), while the explicit engine runs the
QuantizeLinear as its own layer (FP32 -> INT8 linear or NC/4HW4) and then reformats to NC/32HW32. This
builds variants of zoo_bench's static and mirrored models in which each such Q reads an identity
PointWise instead (``Relu`` where the tensor is provably non-negative, or ``Mul`` by 1), checks with
onnxruntime that the outputs are unchanged, builds them beside the engines zoo_bench left in ``--work``,
and times all of them in alternating rounds (the engines alone).

    python bench/standalone_q_bench.py --trtexec /opt/trt86/bin/trtexec --work /tmp/zoo --out $OUT

Answer on an H100 (TensorRT 8.6.0, batch 32, 5 alternating rounds, 2026-11-25): no. The Relu variant of the
static model runs 1271 qps against static's 1364 and implicit's 1500 (tests/fixtures/trt86-h100-zoo2/).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo_bench import TACTICS, _sh

MOVERS = ("Slice", "Reshape", "Transpose", "Concat", "Split")


def variant(src: Path, dst: Path, how: str) -> int:
    """Insert an identity PointWise (``relu`` or ``mul1``) before each QuantizeLinear whose input a
    data-movement node produced. Returns how many were inserted."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(src))
    g = m.graph
    producer = {o: n for n in g.node for o in n.output}
    out: list = []
    n_ins = 0
    if how == "mul1":
        g.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), "edgeq_one"))
    for n in g.node:
        p = producer.get(n.input[0]) if n.op_type == "QuantizeLinear" else None
        if p is not None and p.op_type in MOVERS:
            t = f"{n.input[0]}_edgeq_{how}"
            if how == "relu":
                out.append(helper.make_node("Relu", [n.input[0]], [t], name=f"{n.name}_pre_relu"))
            else:
                out.append(helper.make_node("Mul", [n.input[0], "edgeq_one"], [t], name=f"{n.name}_pre_mul"))
            n.input[0] = t
            n_ins += 1
        out.append(n)
    del g.node[:]
    g.node.extend(out)
    onnx.save(m, str(dst))
    return n_ins


def same_outputs(a: Path, b: Path, calib: Path) -> float:
    import numpy as np
    import onnxruntime as ort

    x = np.load(sorted(calib.glob("*.npy"))[0])
    ra, rb = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (a, b))
    name = ra.get_inputs()[0].name
    ya, yb = ra.run(None, {name: x})[0], rb.run(None, {name: x})[0]
    return float(np.abs(ya - yb).max())


def build(trtexec: str, onnx_path: Path, stem: Path, work: Path) -> float:
    from edgeq.agent.trtexec_backend import build_argv, inspect_argv, profile_argv

    plan = Path(f"{stem}.plan")  # not with_suffix: the stems share "MODEL." and would share one plan
    argv = build_argv(trtexec, str(onnx_path), str(plan), int8=True, fp16=True, calib=None,
                      tactic_sources=TACTICS, timing_cache=str(work / "timing.cache"))
    t0 = time.perf_counter()
    _sh(argv, Path(f"{stem}.build.log"), 900)
    took = time.perf_counter() - t0
    if not plan.is_file():
        raise RuntimeError(f"build failed: {stem}.build.log")
    _sh(inspect_argv(trtexec, str(plan), f"{stem}.layers.json"), Path(f"{stem}.inspect.log"), 300)
    _sh(profile_argv(trtexec, str(plan), f"{stem}.profile.json", iterations=50, duration_s=2,
                     no_data_transfers=True), Path(f"{stem}.run.log"), 300)
    return took


def qps(trtexec: str, plan: Path, duration: float) -> float:
    argv = [trtexec, f"--loadEngine={plan}", "--noDataTransfers", "--useCudaGraph", f"--duration={duration}",
            "--warmUp=500"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300).stdout
    m = re.findall(r"\[I\] Throughput: ([0-9.eE+-]+) qps", out)
    if not m:
        raise RuntimeError(f"no throughput for {plan}:\n{out[-2000:]}")
    return float(m[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trtexec", required=True)
    ap.add_argument("--work", type=Path, default=Path("zoo-bench"))
    ap.add_argument("--model", default="shufflenet_v2_x1_0")
    ap.add_argument("--variants", default="static+relu,mirror+relu,mirror+mul1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=4)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    d = args.work / args.model
    exp = d / "standalone-q"
    exp.mkdir(parents=True, exist_ok=True)
    plans = {p: d / "plans" / f"{p}.plan" for p in ("implicit", "static", "mirror")}
    facts: dict = {"model": args.model, "variants": {}}
    for v in args.variants.split(","):
        base, how = v.split("+")
        src = d / base / f"{args.model}.int8.onnx"
        dst = exp / f"{args.model}.{base}-{how}.onnx"
        n = variant(src, dst, how)
        diff = same_outputs(src, dst, d / "calib")
        stem = exp / f"{args.model}.{base}-{how}"
        took = build(args.trtexec, dst, stem, args.work)
        plans[v] = Path(f"{stem}.plan")
        facts["variants"][v] = {"inserted": n, "max_abs_diff_vs_base": diff, "build_s": round(took, 1)}
        print(f"{v}: {n} inserted, max abs diff {diff:g}, built in {took:.0f} s", flush=True)
    names = list(plans)
    figures: dict[str, list[float]] = {p: [] for p in names}
    for r in range(args.rounds):
        for p in names if r % 2 == 0 else list(reversed(names)):
            figures[p].append(qps(args.trtexec, plans[p], args.duration))
    med = {p: sorted(v)[len(v) // 2] for p, v in figures.items()}
    facts["qps"], facts["qps_median"] = figures, med
    facts["ratio"] = {p: med[p] / med["implicit"] for p in names}
    from edgeq.report.parse import load_layers

    for v in facts["variants"]:
        base, how = v.split("+")
        lay = load_layers(exp / f"{args.model}.{base}-{how}.layers.json")
        facts["variants"][v]["layers"] = len(lay.layers)
        facts["variants"][v]["reformat_layers"] = sum(x.layer_type == "Reformat" for x in lay.layers)
    for p in names:
        print(f"{p:16s} qps {med[p]:8.1f}  ratio {facts['ratio'][p]:.3f}  rounds {figures[p]}")
    (exp / "standalone-q.json").write_text(json.dumps(facts, indent=1) + "\n")
    if args.out is not None:
        import tarfile

        args.out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(args.out / "standalone-q.tar.gz", "w:gz") as tar:
            for p in exp.iterdir():
                if p.suffix in (".json", ".log"):
                    tar.add(p, f"standalone-q/{p.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
