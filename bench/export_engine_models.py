"""Write the models for the GPU engine benchmarks, and the trtexec script that builds and times them.

The fixtures in tests/fixtures/trt86-h200 came from onnxruntime's Q/DQ placement; this writes the same
three architectures (ResNet-50, YOLOv8-like, UNet-like at the fixtures' batch and sizes) quantized by
edgeq, so a machine with TensorRT 8.6 can build them with the fixtures' exact trtexec flags and the
results compare within one file set:

    python bench/export_engine_models.py --out engines/        # on this machine (no GPU needed)
    cd engines && bash build.sh /usr/src/tensorrt/bin/trtexec   # on the GPU machine

Per model it writes ``<m>.onnx`` (FP32), ``<m>_edgeq.onnx`` (``--placement trt``), ``<m>_edgeq_all.onnx``
(``--placement all``, onnxruntime-style, for comparison), and ``<m>_edgeq.cache`` with
``<m>_edgeq.fp32.onnx`` for the implicit path. Calibration uses seeded random normal inputs, as the
fixtures' onnxruntime models did: scales are for speed, not accuracy. The ResNet-50 is ``zoo.resnet50``:
torchvision's layout and node names (``/layer4/layer4.2/conv3/Conv``), built without PyTorch, so its
engines line up with the torchvision-exported fixtures layer by layer. ``--placements trt`` skips the
onnxruntime-style model (tests/fixtures/trt86-h100-placed was written that way, batch 8 and 64).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

# Same architectures and sizes as the fixtures (reference_models_torch.py): batch 8.
MODELS = {
    "resnet50": ("resnet50", {"size": 224}),
    "yolo": ("yolo_like", {"size": 640, "width": 64}),
    "unet": ("unet_like", {"size": 256, "width": 32}),
}
# The fixtures' build flags (fixtures README): INT8 with FP16 fallback, detailed profiling, and tactic
# sources without cuBLAS/cuDNN.
TACTICS = ["-CUBLAS", "-CUBLAS_LT", "-CUDNN"]


def _commands(trtexec: str, stem: str, calib: str | None) -> list[list[str]]:
    from edgeq.agent.trtexec_backend import build_argv, inspect_argv, profile_argv

    engine = f"{stem}.plan"
    build = build_argv(trtexec, f"{stem}.onnx" if calib is None else calib.replace(".cache", ".fp32.onnx"),
                       engine, int8=True, fp16=True, calib=calib, tactic_sources=TACTICS)
    return [
        build,
        inspect_argv(trtexec, engine, f"{stem}.layers.json"),
        profile_argv(trtexec, engine, f"{stem}.profile.json", iterations=100, duration_s=10),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("engines"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8, help="synthetic calibration batches per model")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {list(MODELS)}")
    ap.add_argument("--placements", default="trt,all",
                    help="comma-separated: trt (edgeq's), all (onnxruntime-style, for comparison)")
    args = ap.parse_args()

    from edgeq import zoo
    from edgeq.graph.io import save_model
    from edgeq.quant.data import calibration_set
    from edgeq.quant.quantize import QuantizeOptions, quantize_model

    args.out.mkdir(parents=True, exist_ok=True)
    script = ["#!/usr/bin/env bash", "# Build, inspect and time every model with TensorRT 8.6's trtexec.",
              "set -u", 'T=${1:-/usr/src/tensorrt/bin/trtexec}', 'cd "$(dirname "$0")"']
    for name in args.models.split(","):
        if name not in MODELS:
            print(f"unknown model {name!r}; choose from {list(MODELS)}", file=sys.stderr)
            return 2
        t0 = time.perf_counter()
        builder, kwargs = MODELS[name]
        fp32 = getattr(zoo, builder)(batch=args.batch, **kwargs)
        save_model(fp32, args.out / f"{name}.onnx")
        data = calibration_set(fp32, None, synthetic=args.samples, seed=0)
        placements = args.placements.split(",")
        for placement, stem in (("trt", f"{name}_edgeq"), ("all", f"{name}_edgeq_all")):
            if placement not in placements:
                continue
            cache = args.out / f"{stem}.cache"
            options = QuantizeOptions(placement=placement, holdout=0, cache_path=cache)
            res = quantize_model(fp32, data, options)
            save_model(res.model, args.out / f"{stem}.onnx")
            if placement == "trt":
                save_model(res.reference, args.out / f"{stem}.fp32.onnx")
            else:
                cache.unlink()  # one implicit cache per model is enough: the trt one
            print(f"{stem}: {res.summary_line()}", flush=True)
        runs = [("explicit", f"{name}_edgeq", None), ("explicit", f"{name}_edgeq_all", None),
                ("implicit", f"{name}_edgeq.implicit", f"{name}_edgeq.cache")]
        runs = [r for r in runs if not r[1].endswith("_all") or "all" in placements]
        for mode, stem, calib in runs:
            script.append(f"echo '== {stem} ({mode})'")
            for i, argv in enumerate(_commands("__T__", stem, calib)):
                log = f"{stem}.{('build', 'inspect', 'run')[i]}.log"
                line = " ".join(shlex.quote(a) for a in argv).replace("__T__", '"$T"')
                script.append(f"{line} > {shlex.quote(log)} 2>&1 || echo 'failed: see {log}'")
        print(f"{name}: written in {time.perf_counter() - t0:.1f} s", flush=True)
    (args.out / "build.sh").write_text("\n".join(script) + "\n")
    print(f"wrote {args.out}/ ; on the GPU machine: bash {args.out}/build.sh [path/to/trtexec]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
