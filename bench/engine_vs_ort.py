"""Which arithmetic TensorRT 8.6's explicit engine matches: its outputs against onnxruntime's, per output
and per held-out sample.

    # on the host: the accuracy bench's sets, each model quantized by edgeq, into STAGE (< 50 MiB)
    python bench/engine_vs_ort.py stage STAGE --models det,cls
    # on a machine with TensorRT 8.6 (the device): build each Q/DQ model's engine, run every sample
    python bench/engine_vs_ort.py device STAGE/det STAGE/cls --out "$OUT"
    # on the host: read what came back, run onnxruntime every way, print one table
    python bench/engine_vs_ort.py host STAGE/det STAGE/cls --engine-outputs FILES_DIR

A model directory (the stage mode writes them) holds ``model.int8.onnx`` (edgeq's Q/DQ model),
``holdout/*.npz`` (one sample each, keyed by the input name, as ``edgeq quantize --holdout`` reads
them, compressed), ``metric.txt`` (the task metric) and, for the host mode, ``model.onnx`` (FP32).

Stage mode: ``bench/accuracy_bench.py``'s sets of each model (built into its cache when missing), the
model quantized by ``edgeq quantize --calib calib --holdout holdout --metric M`` (edgeq's default
placement and ``--calibrator auto``, scored on the bench's held-out set; ``--min-metric 0`` so a poor
result is still written), and the first ``--samples`` held-out samples (det: 60 of 100, so the whole
stage stays under 50 MiB and each model's outputs come back in one file).

Device mode: each engine is built as the fixtures' were (INT8 and FP16, tactic sources without cuBLAS,
cuBLASLt and cuDNN; for dynamic inputs one profile from the smallest to the largest sample) by edgeq's
agent (``python -m edgeq.agent build``, backend python: TensorRT's Python API, no pycuda needed), run
on every sample by the agent's ``infer`` (samples grouped by shape), and its outputs saved per model
as ``<model>.trt.npz`` (compressed; ``.partN`` when over 15 MiB) under ``--out``, with the engine's
layer JSON (``<model>.layers.json``: which layers ran INT8) and ``device.json`` (the agent's replies).
Needs TensorRT 8.6 importable and numpy; onnx, onnxruntime and edgeq's other dependencies are not used.

Host mode: the same samples through onnxruntime three ways (``edgeq.quant.evaluate.Arithmetic``): fused
(onnxruntime's defaults, edgeq's evaluation before issue 46), unfused (Q/DQ fusions off, edgeq's
evaluation now) and literal (every optimization off: each node as written, the reference the other
two are held to; a numpy reference of a whole trained model is not feasible, see
``tests/qdq_reference.py`` for the small one), and FP32. Printed per model and output, against
TensorRT: max |difference| and cosine (mean and worst sample), the samples where each is closest to
TensorRT, and the task metric's per-sample agreement with TensorRT's outputs (samples where its answer
is TensorRT's); then each one's task figure against FP32 beside TensorRT's (what ``deploy --holdout``
prints: TensorRT's figure and the Q/DQ prediction).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TACTICS = "-CUBLAS,-CUBLAS_LT,-CUDNN"
PART_BYTES = 15 << 20  # each file back under 16 MiB


def load_samples(d: Path) -> list[dict[str, np.ndarray]]:
    out = []
    for p in sorted((d / "holdout").glob("*.npz")):
        with np.load(p) as z:
            out.append({k: np.asarray(z[k]) for k in z.files})
    if not out:
        raise SystemExit(f"{d}/holdout: no .npz samples")
    return out


def shape_text(shapes: dict[str, tuple[int, ...]]) -> str:
    """trtexec's syntax: ``'x':1x3x48x320,'y':...``."""
    return ",".join(f"'{n}':{'x'.join(str(int(v)) for v in s)}" for n, s in shapes.items())


def groups_by_shape(samples: list[dict[str, np.ndarray]]) -> list[list[int]]:
    found: dict[tuple[tuple[int, ...], ...], list[int]] = {}
    for i, s in enumerate(samples):
        found.setdefault(tuple(tuple(a.shape) for a in s.values()), []).append(i)
    return list(found.values())


def agent(*args: str, timeout: float = 600) -> dict[str, Any]:
    """``python -m edgeq.agent ARGS``: its one JSON reply (it imports nothing from edgeq but itself)."""
    p = subprocess.run([sys.executable, "-m", "edgeq.agent", *args, "--backend", "python"], cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    try:
        reply = json.loads(p.stdout)
    except ValueError:
        why = p.stderr[-2000:]
        raise SystemExit(f"agent {args[0]}: no JSON reply (exit {p.returncode}): {why}") from None
    if not reply.get("ok"):
        raise SystemExit(f"agent {args[0]} failed: {json.dumps(reply.get('error'))[:2000]}")
    return dict(reply["result"])


def stage(dest: Path, models: list[str], samples: int, cache: Path) -> int:
    """Write each model's directory under ``dest`` (see the module doc)."""
    import shutil

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import accuracy_bench as bench

    bench.ensure_deps()
    root = bench.fetch_packages(cache)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        x for x in (str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")) if x)}
    for name in models:
        sets = bench.prepare(bench.CASES[name], root, cache)
        d = dest / name
        shutil.rmtree(d, ignore_errors=True)
        (d / "holdout").mkdir(parents=True)
        shutil.copyfile(sets / "model.onnx", d / "model.onnx")
        metric = (sets / "metric.txt").read_text().strip()
        (d / "metric.txt").write_text(metric + "\n")
        for p in sorted((sets / "holdout").glob("*.npz"))[:samples]:
            with np.load(p) as z:
                np.savez_compressed(d / "holdout" / p.name, **{k: z[k] for k in z.files})
        q = d / "model.int8.onnx"
        argv = [*bench.EDGEQ, "quantize", str(sets / "model.onnx"), "--calib", str(sets / "calib"),
                "--holdout", str(sets / "holdout"), "--metric", metric, "--min-metric", "0", "-o", str(q)]
        p = subprocess.run(argv, capture_output=True, text=True, env=env)
        if p.returncode or not q.is_file():
            raise SystemExit(f"{name}: edgeq quantize failed: {(p.stderr or p.stdout)[-2000:]}")
        for extra in (d / "model.int8.cache", d / "model.int8.fp32.onnx"):  # the implicit path's, not needed
            extra.unlink(missing_ok=True)
        chosen = json.loads((d / "model.int8.json").read_text()).get("calibrator")
        print(f"{name}: {len(list((d / 'holdout').glob('*.npz')))} held-out samples, calibrator {chosen}",
              flush=True)
    total = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"{dest}: {total / 2**20:.1f} MiB")
    return 0


def device(dirs: list[Path], out: Path) -> int:
    """Build and run each model's engine; save its outputs (see the module doc)."""
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "engine_vs_ort"
    work.mkdir(parents=True, exist_ok=True)
    replies: dict[str, Any] = {}
    try:
        replies["probe"] = agent("probe")  # the GPU and TensorRT, for the record
    except SystemExit as e:
        replies["probe"] = {"failed": str(e)}
    for d in dirs:
        name = d.name
        t0 = time.perf_counter()
        samples = load_samples(d)
        groups = groups_by_shape(samples)
        names = list(samples[0])
        shapes = [{n: samples[g[0]][n].shape for n in names} for g in groups]
        dynamic = len(groups) > 1
        engine = work / f"{name}.engine"
        build_args = ["build", f"--onnx={d / 'model.int8.onnx'}", f"--saveEngine={engine}", "--int8",
                      "--fp16", f"--tacticSources={TACTICS}"]
        if dynamic:  # one profile from the smallest to the largest sample, at the most common shape
            lo = {n: tuple(min(s[n][k] for s in shapes) for k in range(len(shapes[0][n]))) for n in names}
            hi = {n: tuple(max(s[n][k] for s in shapes) for k in range(len(shapes[0][n]))) for n in names}
            opt = shapes[max(range(len(groups)), key=lambda k: len(groups[k]))]
            build_args += [f"--minShapes={shape_text(lo)}", f"--optShapes={shape_text(opt)}",
                           f"--maxShapes={shape_text(hi)}"]
        built = agent(*build_args)
        layers = out / f"{name}.layers.json"
        agent("inspect", f"--loadEngine={engine}", f"--exportLayerInfo={layers}",
              *([f"--shapes={shape_text(shapes[0])}"] if dynamic else []))
        packed = work / f"{name}.inputs.npz"
        arrays = {}
        for k, g in enumerate(groups):
            for n in names:
                key = n if len(groups) == 1 else f"{k}/{n}"
                arrays[key] = np.stack([samples[i][n] for i in g])
        np.savez(packed, **arrays)
        got = work / f"{name}.outputs.npz"
        ran = agent("infer", f"--loadEngine={engine}", f"--loadInputs={packed}", f"--exportOutput={got}",
                    *(f"--shapes={shape_text(s)}" for s in (shapes if dynamic else [])))
        per_sample: dict[str, np.ndarray] = {}
        with np.load(got) as z:
            for k, g in enumerate(groups):
                for key in z.files:
                    group, output = key.split("/", 1) if len(groups) > 1 else (str(k), key)
                    if group != str(k):
                        continue
                    for j, i in enumerate(g):
                        per_sample[f"{i:04d}/{output}"] = z[key][j]
        save_parts(out, f"{name}.trt", per_sample)
        replies[name] = {"build": built, "infer": ran, "samples": len(samples), "groups": len(groups),
                         "seconds": round(time.perf_counter() - t0, 1)}
        print(f"{name}: {len(samples)} samples, {len(groups)} shape(s), mode {built.get('mode')}, "
              f"build {built.get('build_seconds')} s, total {replies[name]['seconds']} s", flush=True)
    (out / "device.json").write_text(json.dumps(replies, indent=1, default=str))
    return 0


def save_parts(out: Path, stem: str, arrays: dict[str, np.ndarray]) -> None:
    """``arrays`` as compressed ``.npz`` files of at most ``PART_BYTES`` raw bytes each."""
    part: dict[str, np.ndarray] = {}
    size, k = 0, 0
    items = sorted(arrays.items())
    for i, (key, a) in enumerate(items):
        part[key] = a
        size += a.nbytes
        last = i == len(items) - 1
        if last or size + items[i + 1][1].nbytes > PART_BYTES:
            name = f"{stem}.npz" if last and k == 0 else f"{stem}.part{k}.npz"
            np.savez_compressed(out / name, **part)
            part, size, k = {}, 0, k + 1


def load_parts(where: Path, stem: str) -> dict[str, np.ndarray]:
    files = sorted(where.glob(f"{stem}.npz")) + sorted(where.glob(f"{stem}.part*.npz"))
    if not files:
        raise SystemExit(f"{where}: no {stem}.npz (run the device mode first)")
    out: dict[str, np.ndarray] = {}
    for f in files:
        with np.load(f) as z:
            out.update({k: np.asarray(z[k]) for k in z.files})
    return out


def host(dirs: list[Path], engine_outputs: Path) -> int:
    """Compare TensorRT's outputs with onnxruntime's, every way (see the module doc)."""
    import onnx

    device_json = engine_outputs / "device.json"
    if device_json.is_file():
        probe = json.loads(device_json.read_text()).get("probe", {})
        print(f"device: {json.dumps(probe, default=str)[:400]}")
    for d in dirs:
        samples = load_samples(d)
        flat = load_parts(engine_outputs, f"{d.name}.trt")
        trt: list[dict[str, np.ndarray]] = [{} for _ in samples]
        for key, a in flat.items():
            i, _, output = key.partition("/")
            trt[int(i)][output] = a
        metric = (d / "metric.txt").read_text().strip() if (d / "metric.txt").is_file() else "cosine"
        compare(d.name, samples, onnx.load(str(d / "model.int8.onnx")), onnx.load(str(d / "model.onnx")),
                trt, metric)
    return 0


def from_deploy(run_dir: Path, holdout: Path, fp32: Path, metric: str) -> int:
    """The same comparison from an ``edgeq deploy --holdout`` run directory: the Q/DQ model it shipped,
    ``engine-outputs.npz`` (one group: a model of static input shapes), the held-out ``.npz`` files in the
    order the deploy read them (sorted by name)."""
    import onnx

    from edgeq.pipeline.accuracy import OUTPUTS_NPZ

    def is_qdq(p: Path) -> bool:
        nodes = onnx.load(str(p), load_external_data=False).graph.node
        return any(n.op_type == "QuantizeLinear" for n in nodes)

    shipped = [p for p in sorted(run_dir.glob("*.onnx")) if is_qdq(p)]
    if len(shipped) != 1:
        raise SystemExit(f"{run_dir}: expected one Q/DQ model, found {[p.name for p in shipped]}")
    samples = load_samples(holdout.parent) if holdout.name == "holdout" else load_samples(holdout)
    with np.load(run_dir / OUTPUTS_NPZ) as z:
        stacked = {k: np.asarray(z[k]) for k in z.files}
    if any("/" in k for k in stacked):
        raise SystemExit(f"{run_dir}: outputs in several shape groups; this mode reads one")
    trt = [{k: a[i] for k, a in stacked.items()} for i in range(len(samples))]
    compare(run_dir.name, samples, onnx.load(str(shipped[0])), onnx.load(str(fp32)), trt, metric)
    return 0


def compare(name: str, samples: list[dict[str, np.ndarray]], qdq: Any, fp32_model: Any,
            trt: list[dict[str, np.ndarray]], metric_name: str) -> None:
    """Print, per output, how far each onnxruntime arithmetic is from TensorRT, then each one's task
    figure against FP32 beside TensorRT's."""
    from edgeq.quant.accuracy import run_outputs
    from edgeq.quant.evaluate import Arithmetic, evaluation_session
    from edgeq.quant.metrics import CosineMetric, cosine, metric_from_spec

    Outputs = list[dict[str, np.ndarray]]

    def outputs(model: Any, a: Arithmetic) -> Outputs:
        s = evaluation_session(model, arithmetic=a, purpose="the comparison")
        names = [o.name for o in s.get_outputs() if "float" in o.type]
        return [dict(zip(names, (np.asarray(x) for x in s.run(names, f)))) for f in samples]

    ways = {a.value: outputs(qdq, a) for a in Arithmetic}
    fp32 = run_outputs(fp32_model, samples)
    for i, t in enumerate(trt):
        for output, a in t.items():
            t[output] = a.astype(np.float32).reshape(fp32[i][output].shape)
    if ":" in metric_name:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    metric = metric_from_spec(metric_name)
    print(f"\n{name}: {len(samples)} held-out samples, metric {metric_name}")
    rows = []
    for output in fp32[0]:
        closest: Counter[str] = Counter()
        for i in range(len(samples)):
            diffs = {w: float(np.abs(o[i][output].astype(np.float64) - trt[i][output]).max())
                     for w, o in ways.items()}
            best = min(diffs.values())
            closest.update(w for w, v in diffs.items() if v <= best * (1 + 1e-6) + 1e-12)
        for w, o in ways.items():
            diff = max(float(np.abs(o[i][output].astype(np.float64) - trt[i][output]).max())
                       for i in range(len(samples)))
            cos = [cosine(o[i][output], trt[i][output]) for i in range(len(samples))]
            rows.append((output, w, f"{diff:.4g}", f"{np.mean(cos):.6f}", f"{min(cos):.6f}",
                         f"{closest[w]}/{len(samples)}"))
    table(("output", "onnxruntime", "max |diff| vs TRT", "cosine (mean)", "cosine (worst)",
           "closest to TRT"), rows)
    rows = []
    trt_vs_fp32 = metric.score(fp32, trt)
    for w, o in ways.items():
        agree = metric.score(trt, o)  # TensorRT's outputs as the reference: whose answers are TRT's
        same = sum(1 for v in agree.per_sample if v >= 1.0 - 1e-12) if agree.per_sample else None
        rows.append((w, f"{same}/{len(samples)}" if same is not None else agree.text,
                     metric.score(fp32, o).text, f"{CosineMetric().score(fp32, o).value:.6f}"))
    rows.append(("TensorRT", "-", trt_vs_fp32.text, f"{CosineMetric().score(fp32, trt).value:.6f}"))
    table(("outputs of", f"samples where {metric.name} agrees with TRT", f"{metric.name} vs FP32",
           "cosine vs FP32"), rows)


def table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    for line in (head, tuple("-" * w for w in widths), *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("stage", "device", "host", "from-deploy"))
    ap.add_argument("paths", nargs="+", type=Path,
                    help="stage: the directory to write; device, host: model directories (stage's)")
    ap.add_argument("--models", default="det,cls", help="stage: accuracy bench models [det,cls]")
    ap.add_argument("--samples", type=int, default=60, help="stage: held-out samples per model [60]")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "edgeq-bench",
                    help="stage: the accuracy bench's cache")
    ap.add_argument("--out", type=Path, help="device: where the outputs go [$OUT]")
    ap.add_argument("--engine-outputs", type=Path, help="host: the device mode's files")
    ap.add_argument("--holdout", type=Path, help="from-deploy: the held-out directory the deploy read")
    ap.add_argument("--fp32", type=Path, help="from-deploy: the float model")
    ap.add_argument("--metric", default="cosine", help="from-deploy: the task metric [cosine]")
    args = ap.parse_args(argv)
    if args.mode == "from-deploy":
        if args.holdout is None or args.fp32 is None:
            ap.error("from-deploy needs --holdout DIR and --fp32 MODEL")
        return from_deploy(args.paths[0], args.holdout, args.fp32, args.metric)
    if args.mode == "stage":
        return stage(args.paths[0], [m for m in args.models.split(",") if m], args.samples,
                     args.cache.expanduser())
    args.models = args.paths
    if args.mode == "device":
        out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
        if out is None:
            ap.error("device mode needs --out (or $OUT)")
        return device(args.models, out)
    if args.engine_outputs is None:
        ap.error("host mode needs --engine-outputs DIR")
    return host(args.models, args.engine_outputs)


if __name__ == "__main__":
    sys.exit(main())
