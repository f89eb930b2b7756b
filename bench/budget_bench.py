"""``edgeq deploy --max-loss`` on the bench's detector and recogniser, on this machine's GPU (TensorRT 8.6).

Issue 45's "done when": the detector (nudenet 320n, a YOLOv8n) keeps >= 95% of FP32's detections and the
recogniser (PP-OCRv4 rec) >= 90% of its strings, with the chosen engine's qps measured beside full INT8
and FP16 in one lease. The sets are ``bench/accuracy_bench.py``'s (made where the package index is
reachable, then staged here)::

    python bench/accuracy_bench.py --models det,rec --prepare-only --export SETS      # SETS/<model>/...

    # on the GPU machine, from the repository root (each call does the steps that fit in --budget, and
    # prints the table once a model is done; call it again to go on):
    PYTHONPATH=<TensorRT 8.6 python dir> LD_LIBRARY_PATH=<TensorRT 8.6 lib dir> \\
        python bench/budget_bench.py --sets SETS --work WORK --models det --backend python \\
        --budget 590 --out $OUT

Steps per model, each an ordinary edgeq command, skipped once its result is in ``WORK``:

1. ``warm-int8``: ``edgeq deploy MODEL --placement trt --gate none`` (the full INT8 engine of the rules'
   placement, the same Q/DQ model the budget builds first), which fills the target's TensorRT timing
   cache; 3-10 minutes cold on an H100 for these models (the fixtures' builds of this detector took 368 s
   and 636 s on a shared 4-GPU host, the recogniser over a range of widths 595 s);
2. ``warm-fp16``: ``edgeq deploy MODEL --fp16`` of the float model: FP16's tactics into the cache; 2-8
   minutes cold;
3. ``budget``: ``edgeq deploy MODEL --max-loss X --holdout SETS/<model>/holdout``: the regions weighed on
   the host (the detector: 51 regions, one held-out run of 100 images each, then 21 runs to find and prune
   the set: 72 runs, 1407 s on a loaded 2-core host, 2026-12-07; expect 1-3 s a run on 16 cores), then
   the three builds with the timing cache warm (about a minute each), TensorRT's accuracy on the held-out
   set for each engine (the python backend runs them in one process; trtexec loads the engine once a
   sample) and 3 alternating timing rounds: 5-9 minutes.

A step killed by a time limit leaves nothing to resume from (a build writes the timing cache when it
ends): give each step its own call when calls are limited to 10 minutes. ``--skip-warm`` runs the budget
step alone, for a TensorRT that refuses its own timing cache (the device harness's 8.6.0 with stand-in
cuDNN/cuBLAS: "Myelin error from unknown graph" on reloading a YOLO-sized model's cache, so each build
starts cold and the warm steps only cost time).

The recogniser is built at one fixed shape (``x:1x3x48x320``, ``--minShapes = --optShapes = --maxShapes``)
to keep its builds short: the host weighs all 65 held-out strings, TensorRT reads the 18 that are 320 wide
(the deploy says how many ran). ``--rec-shapes range`` builds for every width instead (longer builds).

Prints per model the three engines (onnxruntime's and TensorRT's accuracy, median qps of the paired rounds,
ratio to full INT8), the regions kept float and the modelled against measured cost; ``--out DIR`` gets
each model's ``budget.json``, ``budget.html``, the chosen engine's report and every run's ``stages.json``.
Needs a GPU and TensorRT 8.6; no test runs it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

EDGEQ = [sys.executable, "-c", "import sys; from edgeq.cli import main; sys.exit(main())"]
MODELS = ("det", "rec")
REC_FIXED = "x:1x3x48x320"
TACTICS = ["-CUBLAS", "-CUBLAS_LT", "-CUDNN"]  # the fixtures' tactic sources (tests/fixtures/README.md)
# seconds of --budget a step needs left to start (the lower end of the estimates above): with --budget 590
# a call runs one step, sometimes two
NEEDS = {"warm-int8": 300, "warm-fp16": 240, "budget": 360}


def target_file(work: Path, args: argparse.Namespace) -> Path:
    """This machine's GPU as a ``host: local`` target: the agent runs here, no SSH."""
    import yaml

    t = {"host": "local", "work_dir": str(work / "target"), "python": sys.executable, "tensorrt": "8.6",
         "backend": args.backend, "build": {"fp16": True, "timing_cache": True, "tactic_sources": TACTICS},
         "timeouts": {"build": 1800, "profile": 600, "command": 600}}  # fmt: skip
    if args.trtexec:
        t["trtexec"] = str(args.trtexec)
    path = work / "gpu.yaml"
    path.write_text(yaml.safe_dump(t))
    return path


def shapes(model: str, args: argparse.Namespace) -> list[str]:
    if model != "rec" or args.rec_shapes != "fixed":
        return []
    return [f"--minShapes={REC_FIXED}", f"--optShapes={REC_FIXED}", f"--maxShapes={REC_FIXED}"]


def run(argv: list[str], log: Path, timeout: float) -> tuple[int, str]:
    """One edgeq command, its output appended to ``log``; (exit code, stdout)."""
    with open(log, "a") as f:
        f.write("$ " + " ".join(shlex.quote(a) for a in argv) + "\n")
        f.flush()
        try:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=f, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            f.write(f"timed out after {timeout:.0f} s\n")
            return 124, ""
        f.write(p.stdout)
        return p.returncode, p.stdout


def step(name: str, model: str, sets: Path, work: Path, target: Path, args: argparse.Namespace) -> bool:
    """Run one step of ``model`` unless its result is there; True when it is."""
    d = work / model
    d.mkdir(parents=True, exist_ok=True)
    done = d / f"{name}.json"
    if done.is_file():
        return True
    src = sets / model
    metric = (src / "metric.txt").read_text().strip()
    common = ["--target", str(target), "--runs-dir", str(d / "runs"), "--iterations", "10", "--duration",
              "3", *shapes(model, args), "--json"]  # fmt: skip
    if name == "warm-int8":
        argv = ["deploy", str(src / "model.onnx"), "--calib", str(src / "calib"), "--holdout",
                str(src / "holdout"), "--metric", metric, "--placement", "trt", "--gate", "none"]  # fmt: skip
    elif name == "warm-fp16":
        argv = ["deploy", str(src / "model.onnx"), "--fp16", "--gate", "none"]
    else:
        argv = ["deploy", str(src / "model.onnx"), "--calib", str(src / "calib"), "--holdout",
                str(src / "holdout"), "--metric", metric, "--max-loss", str(args.max_loss),
                "--placement-cache", str(work / "placement-cache")]  # fmt: skip
        argv += ["--baseline", "implicit"] if args.implicit else []
    started = time.monotonic()
    code, out = run([*EDGEQ, *argv, *common], d / f"{name}.log", args.step_timeout)
    took = time.monotonic() - started
    print(f"{model} {name}: exit {code} in {took:.0f} s (log {d / f'{name}.log'})", flush=True)
    if code not in (0, 1) or not out.strip():
        return False
    done.write_text(json.dumps({"exit_code": code, "seconds": round(took, 1), "result": json.loads(out)},
                               indent=1))  # fmt: skip
    return True


def table(model: str, work: Path) -> list[str]:
    """The model's budget as lines: the engines, the choice, modelled against measured."""
    d = json.loads((work / model / "budget.json").read_text())
    b = d["result"]["budget"]["budget"]
    lines = [f"{model}: {b['summary']}  [{d['seconds']:.0f} s, exit {d['exit_code']}]"]
    for r in b["rows"]:
        qps = "-" if r.get("qps") is None else f"{r['qps']:.0f}"
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.3f}x"
        lines.append(f"  {r['name']:14s} onnxruntime {r.get('host') or '-'} | TensorRT "
                     f"{r.get('target') or '-'} | {qps} qps, {ratio} full INT8")
    lines.append(f"  {b['model_note']}; {b['timed']}")
    return lines


def collect(model: str, work: Path, out: Path) -> None:
    """budget.json/html, the chosen engine's report, each run's stages.json into ``out/<model>/``."""
    d = json.loads((work / model / "budget.json").read_text())["result"]["budget"]
    dest = out / model
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("summary", "html"):
        p = Path(d["files"][name])
        shutil.copyfile(p, dest / p.name)
    for r in d["budget"]["rows"]:
        run_dir = Path(r["run_dir"])
        for f in ("stages.json", "report.html", "layers.json", "profile.json", "accuracy.json"):
            if (run_dir / f).is_file():
                shutil.copyfile(run_dir / f, dest / f"{r['name'].replace(' ', '-')}.{f}")
    for f in (work / model).glob("*.log"):
        shutil.copyfile(f, dest / f.name)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", type=Path, required=True, help="bench/accuracy_bench.py --export's directory")
    ap.add_argument("--work", type=Path, required=True, help="runs, target work dir, caches (kept: resume)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--max-loss", type=float, default=0.05)
    ap.add_argument("--backend", choices=("python", "trtexec"), default="python")
    ap.add_argument("--trtexec", type=Path, help="trtexec 8.6 (for --backend trtexec)")
    ap.add_argument("--rec-shapes", choices=("fixed", "range"), default="fixed")
    ap.add_argument("--implicit", action="store_true", help="also build and time implicit INT8 (a 4th build)")
    ap.add_argument("--budget", type=float, default=540.0, help="start no step that may not end by then (s)")
    ap.add_argument("--step-timeout", type=float, default=1800.0)
    ap.add_argument("--skip-warm", action="store_true", help="the budget step only (a refused timing cache)")
    ap.add_argument("--out", type=Path, help="copy each finished model's results here")
    args = ap.parse_args(argv)
    started = time.monotonic()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    target = target_file(work, args)
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if not (args.sets / m / "model.onnx").is_file():
            print(f"{args.sets / m}: no model.onnx (bench/accuracy_bench.py --prepare-only --export)",
                  file=sys.stderr)  # fmt: skip
            return 2
    for m in models:
        for name in ("budget",) if args.skip_warm else ("warm-int8", "warm-fp16", "budget"):
            if (work / m / f"{name}.json").is_file():
                continue
            left = args.budget - (time.monotonic() - started)
            if left < NEEDS[name]:
                print(f"{m} {name}: not started ({left:.0f} s left of --budget, it takes up to "
                      f"{NEEDS[name]} s): run again to go on", flush=True)
                return 3
            if not step(name, m, args.sets, work, target, args):
                print(f"{m} {name}: failed, see its log", flush=True)
                return 1
        print("\n".join(table(m, work)), flush=True)
        if args.out is not None:
            collect(m, work, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
