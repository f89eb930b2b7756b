"""The engines TensorRT 8.6 builds from nearest and from learned weight rounding (``--weights adaround``): the
same layers, fusions and precisions, and the speed within run-to-run noise. Needs a GPU and trtexec 8.6.

    LD_LIBRARY_PATH=/opt/trt86/lib python bench/rounding_engines.py --trtexec /opt/trt86/bin/trtexec \\
        --sets SETS --work /tmp/rounding-engines

``SETS``: ``accuracy_bench.py --models det,rec --prepare-only --export SETS`` (model.onnx, calib/, holdout/
per model; made on a host with the package index, then copied). Per model: ``quantize_model`` with ``--weights
nearest`` and ``--weights adaround`` (``--calibrator auto``: one calibration, so both models have the same
ranges), each built with the fixtures' flags (``--int8 --fp16``, tactic sources without cuBLAS/cuDNN, the
data's optimization profile, one timing cache), inspected and profiled; then ``compare_engines`` on the two
layer JSONs, and both plans timed in alternating rounds. Prints per model: the layer count, whether the
layer names, precisions and fusions are the same, and the two throughputs. About 3 minutes per model on an
H100, an estimate (quantizing on the machine's cores, two builds, six timings): not run on a GPU yet.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from edgeq.pipeline.shapes import Shapes

TACTICS = ["-CUBLAS", "-CUBLAS_LT", "-CUDNN"]  # the fixtures' tactic sources (tests/fixtures/README.md)
WEIGHTS = ("nearest", "adaround")


def _sh(argv: list[str], log: Path, timeout: float) -> int:
    with open(log, "a") as f:
        f.write("$ " + " ".join(shlex.quote(a) for a in argv) + "\n")
        f.flush()
        try:
            return subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            f.write(f"timed out after {timeout:.0f} s\n")
            return 124


def quantize(d: Path, work: Path) -> dict[str, Path]:
    """``<work>/<weights>.int8.onnx`` for each rounding, from one calibration; returns the paths."""
    import onnx

    from edgeq.graph.io import save_model
    from edgeq.quant.data import calibration_set
    from edgeq.quant.quantize import QuantizeOptions, quantize_model

    metric = (d / "metric.txt").read_text().strip()
    opts = QuantizeOptions(calib=d / "calib", holdout_data=d / "holdout", metric=metric)
    model = onnx.load(str(d / "model.onnx"))
    data = calibration_set(model, d / "calib")
    out = {}
    for w in WEIGHTS:
        path = work / f"{w}.int8.onnx"
        if not path.is_file():
            r = quantize_model(model, data, replace(opts, weights=w))
            save_model(r.model, path)
            (work / f"{w}.txt").write_text(r.summary_line() + "\n")
        out[w] = path
    return out


def build(trtexec: str, onnx_path: Path, shapes: Shapes, work: Path) -> Path:
    from edgeq.agent.trtexec_backend import build_argv, inspect_argv, profile_argv

    stem = onnx_path.with_suffix("")
    plan = Path(f"{stem}.plan")
    layers = Path(f"{stem}.layers.json")
    if layers.is_file():
        return layers
    argv = build_argv(trtexec, str(onnx_path), str(plan), int8=True, fp16=True, tactic_sources=TACTICS,
                      timing_cache=str(work.parent / "timing.cache"), min_shapes=shapes.min or None,
                      opt_shapes=shapes.opt or None, max_shapes=shapes.max or None)
    _sh(argv, Path(f"{stem}.build.log"), 1200)  # 8.6's trtexec can crash at exit: judge the plan
    if not plan.is_file() or plan.stat().st_size == 0:
        raise RuntimeError(f"build failed: see {stem}.build.log")
    _sh(inspect_argv(trtexec, str(plan), f"{layers}.tmp"), Path(f"{stem}.inspect.log"), 300)
    _sh(profile_argv(trtexec, str(plan), f"{stem}.profile.json", iterations=50, duration_s=2,
                     no_data_transfers=True), Path(f"{stem}.run.log"), 300)
    Path(f"{layers}.tmp").replace(layers)
    return layers


def rounds(trtexec: str, plans: dict[str, Path], shapes: Shapes, work: Path, n: int = 3
           ) -> dict[str, list[float]]:
    """trtexec's throughput of each plan, in alternating rounds (a, b, b, a, ...)."""
    qps: dict[str, list[float]] = {w: [] for w in plans}
    order = list(plans)
    for i in range(n):
        for w in order if i % 2 == 0 else order[::-1]:
            log = work / f"{w}.round{i}.log"
            argv = [trtexec, f"--loadEngine={plans[w]}", "--noDataTransfers", "--useSpinWait", "--duration=3"]
            argv += [f"--shapes={shapes.opt}"] if shapes.opt else []
            _sh(argv, log, 300)
            m = re.findall(r"Throughput: ([0-9.]+) qps", log.read_text())
            if m:
                qps[w].append(float(m[-1]))
    return qps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trtexec", required=True)
    ap.add_argument("--sets", type=Path, required=True, help="accuracy_bench.py --export's directory")
    ap.add_argument("--work", type=Path, default=Path("/tmp/rounding-engines"))
    ap.add_argument("--models", default="det,rec")
    args = ap.parse_args(argv)
    from edgeq.pipeline.shapes import resolve_shapes
    from edgeq.quant.quantize import QuantizeOptions
    from edgeq.report.compare import compare_engines
    from edgeq.report.compare_engine import engine_from_path

    results = {}
    for name in [m for m in args.models.split(",") if m]:
        d, work = args.sets / name, args.work / name
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        models = quantize(d, work)
        shapes = resolve_shapes(d / "model.onnx", Shapes(), QuantizeOptions(calib=d / "calib",
                                                                            holdout_data=d / "holdout"))
        layers = {w: build(args.trtexec, p, shapes, work) for w, p in models.items()}
        c = compare_engines([engine_from_path(layers["nearest"]), engine_from_path(layers["adaround"])])
        diff = c.diffs[0]
        names = [[(rl.name, rl.precision) for rl in engine_from_path(p).report.layers]  # type: ignore[union-attr]
                 for p in layers.values()]
        qps = rounds(args.trtexec, {w: p.with_suffix("").with_suffix(".plan") for w, p in layers.items()},
                     shapes, work)
        med = {w: sorted(v)[len(v) // 2] if v else None for w, v in qps.items()}
        results[name] = {
            "layers": [diff.base_stats.layers, diff.cand_stats.layers],
            "same_layers_and_precisions": names[0] == names[1],
            "same_fusions": diff.missing_groups == diff.extra_groups == (),
            "precisions": [diff.base_stats.precisions, diff.cand_stats.precisions],
            "qps": qps, "median_qps": med, "seconds": round(time.perf_counter() - t0, 1),
        }
        ratio = f" ({med['adaround'] / med['nearest']:.3f}x)" if med["nearest"] and med["adaround"] else ""
        print(f"{name}: {diff.base_stats.layers} vs {diff.cand_stats.layers} layers; same names and "
              f"precisions: {names[0] == names[1]}; same fusions: {results[name]['same_fusions']}; qps "
              f"nearest {med['nearest']}, adaround {med['adaround']}{ratio}", flush=True)
    (args.work / "rounding_engines.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if all(r["same_layers_and_precisions"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
