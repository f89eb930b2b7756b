"""Time and peak memory of ``edgeq clean`` (with --verify) on a generated ResNet-50-sized model.

    python bench/clean_bench.py [--variant fp32|ort|torch|modelopt|torch-qint8|modelopt-fp16] [--size 224]
                                [--keep DIR]

(``torch-qint8`` is cleaned with --torch-qint8.)

The model is built and saved by this process; the clean runs in a fresh child process, so the peak
RSS it reports (``resource.getrusage``: onnx, graphsurgeon and onnxruntime's native allocations
included, which tracemalloc cannot see) is the clean's own, not the model builder's. Prints one
line per stage and per pass. Timings on a shared 2-core machine are noisy: run it twice.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _rss_mb() -> float:
    """Peak RSS of this process so far, MiB.

    Linux: VmHWM from /proc (per address space, so reset by exec); ru_maxrss elsewhere. ru_maxrss on
    Linux survives fork+exec and would report the parent's peak if that was higher.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


def build(variant: str, size: int, dest: str) -> None:
    """Build and save the model (in its own process, so the bench's parent stays small)."""
    import numpy as np

    from edgeq import zoo
    from edgeq.graph.io import save_model

    t = time.perf_counter()
    fp32 = zoo.resnet50(size=size)
    model = zoo.VARIANTS[variant](fp32)
    save_model(model, dest)
    params = sum(int(np.prod(i.dims)) for i in fp32.graph.initializer)
    print(json.dumps({"params": params, "nodes": len(model.graph.node), "build_s": time.perf_counter() - t}))


def child(model_path: str, out_path: str, torch_qint8: bool = False) -> None:
    """Load, clean with verify, save; print JSON figures on stdout."""
    t0 = time.perf_counter()
    from edgeq.graph.clean import CleanOptions, clean_model
    from edgeq.graph.io import load_model, save_model

    t_import = time.perf_counter()
    model = load_model(model_path)
    t_load = time.perf_counter()
    rss_loaded = _rss_mb()

    marks: list[tuple[str, float]] = []

    def progress(task: str, done: int, total: int | None) -> None:
        marks.append((f"{done}", time.perf_counter()))

    result = clean_model(model, CleanOptions(verify=True, torch_qint8=torch_qint8), progress)
    t_clean = time.perf_counter()
    save_model(result.model, out_path)
    t_save = time.perf_counter()
    names = [*result.passes_run, "verify"]
    per_pass = {}
    for i, name in enumerate(names):
        if i + 1 < len(marks):
            per_pass[name] = marks[i + 1][1] - marks[i][1]
    print(
        json.dumps(
            {
                "import_s": t_import - t0,
                "load_s": t_load - t_import,
                "clean_s": t_clean - t_load,
                "save_s": t_save - t_clean,
                "per_pass_s": per_pass,
                "rss_after_load_mb": rss_loaded,
                "peak_rss_mb": _rss_mb(),
                "verification": str(result.verification),
                "changes": len(result.changes),
                "findings": len(result.findings),
            }
        )
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--variant",
        default="torch",
        help="zoo export pattern: fp32, ort, ortfb, torch, modelopt, torch-qint8, modelopt-fp16",
    )
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--keep", type=Path, help="keep the models in this directory")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--build", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child, torch_qint8=args.variant == "torch-qint8")
        return 0
    if args.build:
        build(args.variant, args.size, args.build)
        return 0

    work = args.keep or Path(tempfile.mkdtemp(prefix="edgeq-clean-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"resnet50_{args.variant}.onnx"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    cmd = [sys.executable, __file__, "--variant", args.variant, "--size", str(args.size), "--build", str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        return proc.returncode
    b = json.loads(proc.stdout.strip().splitlines()[-1])
    params, build_s = b["params"], b["build_s"]
    print(
        f"model: ResNet-50-sized, {params / 1e6:.1f}M parameters, variant '{args.variant}', "
        f"{args.size}x{args.size}, {b['nodes']} nodes, {src.stat().st_size / 2**20:.0f} MiB "
        f"(built in {build_s:.1f} s)"
    )
    out = work / f"resnet50_{args.variant}.clean.onnx"
    proc = subprocess.run(
        [sys.executable, __file__, "--variant", args.variant, "--child", str(src), str(out)],
        capture_output=True, text=True, env=env,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        return proc.returncode
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"clean (with verify): {r['clean_s']:.2f} s   peak RSS {r['peak_rss_mb']:.0f} MiB "
        f"(after load {r['rss_after_load_mb']:.0f} MiB)"
    )
    print(f"  load {r['load_s']:.2f} s, save {r['save_s']:.2f} s, python imports {r['import_s']:.2f} s")
    for name, s in r["per_pass_s"].items():
        print(f"  {name:<22}{s:7.2f} s")
    print(f"  {r['changes']} changes, {r['findings']} findings; verify {r['verification']}")
    if args.keep is None:
        for p in work.iterdir():
            p.unlink()
        work.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
