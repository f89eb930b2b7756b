"""Q/DQ evaluation on an AVX2-only CPU, emulated: onnxruntime's fused path against edgeq's evaluation.

    python bench/avx2_emulation.py                  # this host, then qemu-x86_64 -cpu Haswell
    python bench/avx2_emulation.py --cpu Skylake-Client-v4

Why: onnxruntime's fused Q/DQ kernels (QLinearConv, QGemm, ...) multiply u8 x s8 with AVX2's
``vpmaddubsw``, whose int16 pair sums saturate; with VNNI or AVX-512 they do not. The figures of the
default onnxruntime session then depend on the host. ``edgeq.quant.evaluate`` runs the Q/DQ graph as
written (its fusions off), which should give the same figures everywhere. This runs both, and
onnxruntime with every optimization off, on two small Q/DQ models built in code, on this host and
under qemu's user-mode emulation of a Haswell CPU (AVX2 and FMA, no AVX-512, no VNNI; qemu 7.2 or later
emulates AVX2), and prints each against a numpy reference of the Q/DQ arithmetic
(``tests/qdq_reference.py``) and against FP32:

- ``small_net``: Conv, Relu, Conv, Add, GlobalAveragePool, Gemm quantized by edgeq (``--placement all``,
  per-channel weights, max ranges), 6 inputs clear of rounding boundaries; max |difference| from the
  numpy reference (outputs up to about 2.5).
- ``resnet_like``: the zoo's ResNet-like net quantized by onnxruntime's ``quantize_static`` (the fleet
  test's model); cosine against its float graph over 3 inputs, as the fleet test reads it.

Needs ``qemu-x86_64`` (Debian: ``apt-get install qemu-user``); about 30 s under emulation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def worker() -> dict[str, dict[str, float]]:
    """Every arithmetic's figures on both models, in this process (native or emulated)."""
    import onnxruntime as ort
    from qdq_reference import clear_samples, run, small_net

    from edgeq import zoo
    from edgeq.graph.verify import without_qdq
    from edgeq.quant.data import calibration_set
    from edgeq.quant.evaluate import Arithmetic, session_options
    from edgeq.quant.metrics import cosine
    from edgeq.quant.quantize import QuantizeOptions, quantize_model

    def outputs(model, feeds, arithmetic):
        s = ort.InferenceSession(model.SerializeToString(), session_options(arithmetic),
                                 providers=["CPUExecutionProvider"])
        return [s.run(None, f)[0].astype(np.float64) for f in feeds]

    import tempfile

    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as d:
        rng = np.random.default_rng(1)
        for i in range(8):
            np.save(Path(d) / f"{i}.npy", rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
        net = small_net()
        options = QuantizeOptions(calib=Path(d), calibrator="max", placement="all", holdout=0.0)
        qdq = quantize_model(net, calibration_set(net, Path(d)), options).model
    feeds = clear_samples(qdq, 6, seed=5)
    want = [run(qdq, f)[0]["y"] for f in feeds]
    for a in Arithmetic:
        got = outputs(qdq, feeds, a)
        figures.setdefault(a.value, {})["small_net max |diff| vs numpy"] = max(
            float(np.abs(g - w).max()) for g, w in zip(got, want))
    resnet = zoo.qdq_ort(zoo.resnet_like(size=32, width=8), quantize_bias=False)
    x = np.random.default_rng(4).standard_normal((3, 3, 32, 32), np.float32)
    name = resnet.graph.input[0].name
    feeds = [{name: x[i:i + 1]} for i in range(3)]
    fp32 = outputs(without_qdq(resnet), feeds, Arithmetic.LITERAL)
    for a in Arithmetic:
        got = outputs(resnet, feeds, a)
        cos = [cosine(f, g) for f, g in zip(fp32, got)]
        figures[a.value]["resnet_like cosine vs FP32"] = float(np.mean(cos))
    return figures


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "?"
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni")
    return " ".join(f for f in wanted if f in flags) or "none of AVX2/AVX-512/VNNI"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", default="Haswell", help="qemu's CPU model to emulate [Haswell: AVX2, no VNNI]")
    ap.add_argument("--qemu", default="qemu-x86_64")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker()))
        return 0
    runs = {f"this host ({cpu_flags()})": [sys.executable, __file__, "--worker"]}
    qemu = shutil.which(args.qemu)
    if qemu is None:
        print(f"{args.qemu} not found: only this host is measured (apt-get install qemu-user)",
              file=sys.stderr)
    else:
        runs[f"qemu -cpu {args.cpu}"] = [qemu, "-cpu", args.cpu, sys.executable, __file__, "--worker"]
    print(f"{platform.processor() or platform.machine()}; onnxruntime {_ort_version()}")
    rows = []
    for where, argv_ in runs.items():
        p = subprocess.run(argv_, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if p.returncode:
            lines = [ln for ln in p.stderr.splitlines() if ln.strip() and "TCG doesn't support" not in ln]
            print(f"{where}: failed: {lines[-1] if lines else p.returncode}", file=sys.stderr)
            continue
        for arithmetic, figs in json.loads(p.stdout.strip().splitlines()[-1]).items():
            rows.append((where, arithmetic, figs["small_net max |diff| vs numpy"],
                         figs["resnet_like cosine vs FP32"]))
    head = ("where", "arithmetic", "small_net max |diff| vs numpy", "resnet_like cosine vs FP32")
    body = [(w, a, f"{d:.3g}", f"{c:.6f}") for w, a, d, c in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    for line in (head, tuple("-" * w for w in widths), *body):
        print("  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip())
    return 0 if rows else 1


def _ort_version() -> str:
    import onnxruntime as ort

    return str(ort.__version__)


if __name__ == "__main__":
    sys.exit(main())
