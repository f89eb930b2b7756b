"""Quantize a ResNet-50-sized model: edgeq vs onnxruntime ``quantize_static``, time and peak memory.

    python bench/quantize_bench.py                  # 16 and 64 samples of 224x224
    python bench/quantize_bench.py --samples 16,64,512 --ort-max 64

One run, same model (``edgeq.zoo.resnet50()``), same data (seeded normal samples written as one
``.npy`` per sample into a temp dir), same calibrator (entropy). Each measurement runs in its own
subprocess, so peaks do not mix; the peak is the child's ``VmHWM`` (peak resident set) read from
``/proc/self/status`` when it finishes. Time is the wall time inside the child from loading the model
to the written output (interpreter start and imports excluded, for both alike).

- edgeq: load, ``calibration_set``, ``edgeq.quant.quantize.quantize_model`` (clean, placement,
  calibration of every activation tensor for the cache, Q/DQ insertion, cache) and save, with
  ``holdout=0`` so all samples calibrate as in ``quantize_static``. If ``quantize_model`` is not
  importable, ``collect_ranges`` over every Conv/Gemm input instead (the output says which).
- onnxruntime: ``quantize_static`` with QDQ, per-channel, symmetric int8 activations and weights,
  ``CalibrationMethod.Entropy`` (its defaults: 128 bins, 128 quantized bins). Its calibrator keeps
  every intermediate output of every sample before building histograms (~110 MB per 224x224 sample
  here), so above ``--ort-max`` samples it is skipped rather than run into swap.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def vm_hwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ---------------------------------------------------------------------------------------------------
# Workers (run in a child process)
# ---------------------------------------------------------------------------------------------------


def worker_edgeq(model_path: str, calib: str, out: str, method: str) -> dict:
    from edgeq.graph.io import load_model, save_model
    from edgeq.quant.data import calibration_set

    t0 = time.perf_counter()
    try:
        from edgeq.quant.quantize import QuantizeOptions, quantize_model
    except ImportError:
        quantize_model = None
    model = load_model(model_path)
    data = calibration_set(model, calib)
    if quantize_model is not None:
        # holdout 0: every sample calibrates, as in quantize_static (which has no accuracy check)
        what = "edgeq quantize_model: clean + place + calibrate + Q/DQ + cache, written"
        opts = QuantizeOptions(calibrator=method, holdout=0.0, cache_path=Path(out + ".cache"))
        result = quantize_model(model, data, opts)
        save_model(result.model, out)
    else:
        from edgeq.quant.calibrate import CalibOptions, collect_ranges

        what = "edgeq collect_ranges over all Conv/Gemm inputs (quantize_model not available yet)"
        tensors = [n.input[0] for n in model.graph.node if n.op_type in ("Conv", "Gemm")]
        ranges = collect_ranges(model, tensors, data, CalibOptions(method=method))
        Path(out).write_text(json.dumps(ranges))
    return {"what": what, "seconds": time.perf_counter() - t0, "peak_mb": vm_hwm_mb()}


def worker_ort(model_path: str, calib: str, out: str, method: str) -> dict:
    import numpy as np
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    t0 = time.perf_counter()
    input_name = onnx.load(model_path, load_external_data=False).graph.input[0].name
    files = sorted(Path(calib).glob("*.npy"))

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(files)

        def get_next(self):
            f = next(self.it, None)
            return None if f is None else {input_name: np.load(f)}

        def __len__(self) -> int:
            return len(files)

    methods = {"entropy": CalibrationMethod.Entropy, "percentile": CalibrationMethod.Percentile,
               "max": CalibrationMethod.MinMax}
    quantize_static(model_path, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    calibrate_method=methods[method],
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
    return {"what": f"onnxruntime quantize_static (QDQ, per-channel, symmetric, {methods[method].name})",
            "seconds": time.perf_counter() - t0, "peak_mb": vm_hwm_mb()}


# ---------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------


def run_child(kind: str, model: Path, calib: Path, out: Path, method: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, "--model", str(model), "--calib", str(calib),
           "--out", str(out), "--method", method]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail), "wall": wall}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["wall"] = wall
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", default="16,64", help="comma-separated sample counts (default 16,64)")
    ap.add_argument("--size", type=int, default=224, help="input height/width (default 224)")
    ap.add_argument("--method", default="entropy", choices=("entropy", "percentile", "max"))
    ap.add_argument("--ort-max", type=int, default=64,
                    help="skip onnxruntime above this many samples (its memory grows ~110 MB/sample)")
    ap.add_argument("--skip-ort", action="store_true", help="measure edgeq only")
    ap.add_argument("--worker", choices=("edgeq", "ort"), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--calib", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        fn = worker_edgeq if args.worker == "edgeq" else worker_ort
        print(json.dumps(fn(args.model, args.calib, args.out, args.method)))
        return 0

    import numpy as np

    from edgeq import zoo
    from edgeq.graph.io import save_model

    counts = sorted({int(s) for s in args.samples.split(",") if s.strip()})
    with tempfile.TemporaryDirectory(prefix="edgeq-qbench-") as tmp:
        tmp_path = Path(tmp)
        model = zoo.resnet50(size=args.size)
        model_path = save_model(model, tmp_path / "resnet50.onnx")
        input_name = model.graph.input[0].name
        shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        params = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
        del model
        all_dir = tmp_path / "all"
        all_dir.mkdir()
        for k in range(max(counts)):
            x = np.random.default_rng(k).standard_normal(shape, dtype=np.float32)
            np.save(all_dir / f"{k:05d}.npy", x)
        print(f"model: edgeq.zoo.resnet50, {params / 1e6:.1f}M parameters, input '{input_name}' {shape}; "
              f"calibrator: {args.method}; {os.cpu_count()} cores")
        rows = []
        for n in counts:
            d = tmp_path / f"calib{n}"
            d.mkdir()
            for k in range(n):
                os.symlink(all_dir / f"{k:05d}.npy", d / f"{k:05d}.npy")
            e = run_child("edgeq", model_path, d, tmp_path / f"edgeq{n}.out", args.method)
            if args.skip_ort:
                o = {"error": "skipped (--skip-ort)"}
            elif n > args.ort_max:
                o = {"error": f"skipped (> --ort-max {args.ort_max}: would need ~{0.11 * n + 0.6:.0f} GB)"}
            else:
                o = run_child("ort", model_path, d, tmp_path / f"ort{n}.onnx", args.method)
            rows.append((n, e, o))
            for label, r in (("edgeq", e), ("onnxruntime", o)):
                if "error" in r:
                    print(f"  {n:4d} samples  {label:12s} {r['error']}")
                else:
                    print(f"  {n:4d} samples  {label:12s} {r['seconds']:7.1f} s  "
                          f"peak {r['peak_mb']:7.0f} MB  ({r['what']})")
            if "error" not in e and "error" not in o:
                print(f"  {n:4d} samples  ratio        {o['seconds'] / e['seconds']:5.1f}x faster, "
                      f"{o['peak_mb'] / e['peak_mb']:5.1f}x less memory")
            sys.stdout.flush()
        ok = [(n, e) for n, e, _ in rows if "error" not in e]
        if len(ok) > 1:
            peaks = [e["peak_mb"] for _, e in ok]
            print(f"edgeq peak from {ok[0][0]} to {ok[-1][0]} samples: {min(peaks):.0f}-{max(peaks):.0f} MB "
                  f"(spread {max(peaks) - min(peaks):.0f} MB); target < 1500 MB and flat")
    return 0


if __name__ == "__main__":
    sys.exit(main())
