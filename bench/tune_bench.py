"""``edgeq tune`` on this machine's GPU: tuned explicit against implicit INT8, same machine, same lease.

Writes the benchmark models (``zoo.resnet50`` at batch 8 and 64, ``zoo.yolo_like`` at batch 8: the fixtures'
architectures and sizes; or torchvision models by name, as ``zoo_bench`` exports them) with seeded
calibration data, a ``host: local`` target file for the trtexec given,
then runs ``edgeq tune`` on each and prints one line per model (implicit qps, start qps, tuned qps, ratio,
cosine, decisions kept / tried, gates) and the paths of the tuning reports:

    LD_LIBRARY_PATH=/opt/trt86/lib:/opt/trt86/stubs \\
        python bench/tune_bench.py --trtexec /opt/trt86/bin/trtexec --out /tmp/tune --budget 8m

Needs a GPU and TensorRT 8.6's trtexec; nothing here runs in the tests.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MODELS = {
    "r50b8": ("resnet50", {"batch": 8, "size": 224}),
    "r50b64": ("resnet50", {"batch": 64, "size": 224}),
    "yolob8": ("yolo_like", {"batch": 8, "size": 640, "width": 64}),
}
# --min-cosine per model unless given: random weights and inputs put the YOLO-like net's INT8 output at
# cosine 0.978 against FP32 already at the rules' placement (H100 runs, tests/fixtures/trt86-h100-tune),
# so 0.99 would refuse every candidate; the bound is set under that, not fitted to a result.
MIN_COSINE = {"r50b8": "0.99", "r50b64": "0.99", "yolob8": "0.97"}
TACTICS = ["-CUBLAS", "-CUBLAS_LT", "-CUDNN"]  # the fixtures' tactic sources (fixtures README)


def _write_inputs(out: Path, name: str, samples: int) -> tuple[Path, Path]:
    import numpy as np
    import onnx

    from edgeq import zoo

    path = out / f"{name}.onnx"
    if name in MODELS:
        factory, kwargs = MODELS[name]
        onnx.save(getattr(zoo, factory)(**kwargs), str(path))
    else:  # a torchvision model, exported as bench/zoo_bench.py does (batch 32, seed 0, opset 17)
        import torch
        import torchvision

        if not callable(getattr(torchvision.models, name, None)):
            raise SystemExit(f"{name}: not one of {list(MODELS)} nor a torchvision model")
        torch.manual_seed(0)
        net = getattr(torchvision.models, name)(weights=None).eval()
        torch.onnx.export(net, (torch.randn(32, 3, 224, 224),), str(path), opset_version=17, dynamo=False,
                          input_names=["input"], output_names=["output"])
    model = onnx.load(str(path), load_external_data=False)
    calib = out / f"{name}.calib"
    calib.mkdir(exist_ok=True)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    for i in range(samples):
        np.save(calib / f"s{i}.npy", rng.standard_normal(shape).astype(np.float32))
    return path, calib


def main() -> int:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trtexec", required=True)
    ap.add_argument("--out", type=Path, default=Path("tune-bench"))
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated: {list(MODELS)} or torchvision model names (batch 32)")
    ap.add_argument("--budget", default="10m")
    ap.add_argument("--min-cosine", help="accuracy bound (default: per model, MIN_COSINE)")
    ap.add_argument("--rounds", default="3", help="paired re-timing rounds (edgeq tune --rounds)")
    ap.add_argument("--samples", type=int, default=5, help="calibration samples (one in five held out)")
    ap.add_argument("--placement", choices=("implicit", "trt"),
                    help="tune's start (edgeq tune --placement; default: the mirror, else the rules)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / "local-gpu.yaml"
    target.write_text(yaml.safe_dump({
        "host": "local", "work_dir": str((args.out / "work").resolve()), "python": sys.executable,
        "tensorrt": "8.6", "backend": "trtexec", "trtexec": args.trtexec,
        "build": {"fp16": True, "timing_cache": True, "tactic_sources": TACTICS},
        "timeouts": {"build": 1200, "profile": 600, "command": 300},
    }))  # fmt: skip
    for name in args.models.split(","):
        model, calib = _write_inputs(args.out, name, args.samples)
        t0 = time.monotonic()
        edgeq = str(Path(sys.executable).with_name("edgeq"))
        argv = [edgeq, "tune", str(model), "--target", str(target), "--calib", str(calib),
                "--budget", args.budget, "--min-cosine", args.min_cosine or MIN_COSINE.get(name, "0.99"),
                "--rounds", args.rounds, "--json",
                "-o", str(args.out / f"{name}.tune")]  # fmt: skip
        argv += ["--placement", args.placement] if args.placement else []
        done = subprocess.run(argv, capture_output=True, text=True)
        secs = time.monotonic() - t0
        if not done.stdout.strip().startswith("{"):
            print(f"{name}: failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
            continue
        d = json.loads(done.stdout)
        kept = sum(e["kept"] for e in d["decisions"])
        tried = sum(e["candidate"] is not None for e in d["decisions"])
        gates = {k: g.get("passed") for k, g in d["gate"].items()}
        paired = d.get("paired_vs_implicit") or {}
        medians = "/".join(f"{q:.0f}" for q in paired.get("median_qps") or [])
        began = (d.get("start_from") or {}).get("placement", "rules")
        print(f"{name}: implicit {d['implicit']['qps']} qps, start ({began}) {d['start']['qps']}, tuned "
              f"{d['best']['qps']} (single timings); paired implicit/tuned {medians} qps = "
              f"{d['speedup_vs_implicit']}x over {paired.get('rounds')} rounds, "
              f"cosine {d['best']['cosine']}, "
              f"{kept}/{tried} decisions kept of {len(d['decisions'])}, gates {gates}, {secs:.0f} s; "
              f"{d['files']['json']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
