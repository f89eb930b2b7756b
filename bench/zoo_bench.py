"""The models users bring, on a GPU with TensorRT 8.6: edgeq's explicit engines against the implicit one.

For each model (torchvision names, random weights seed 0, ``torch.onnx.export(opset_version=17)``; or
``yolo``, the zoo's YOLOv8-like net built in code) it writes seeded calibration data, quantizes with the
static placement (``edgeq quantize --calib``), builds the implicit INT8 engine from edgeq's own cache and
FP32 model, mirrors it (``edgeq quantize --calib --from-engine implicit.layers.json``), builds both
explicit engines, times the three in alternating rounds (the engines alone: ``--loadEngine
--noDataTransfers --useCudaGraph``), and compares them (``edgeq compare``'s JSON and HTML). One table:
qps and ratio to implicit per placement, FP16/FP32 compute layers, precision-changing reformats, held-out
cosine against FP32, and how many regions the implicit engine entered by a quantizing reformat (the
mirror's ``float_entry``: Q/DQ cannot say that on 8.6, ``edgeq rules float-entry``).

    LD_LIBRARY_PATH=/opt/trt86/lib:/opt/trt86/stubs \\
        python bench/zoo_bench.py --trtexec /opt/trt86/bin/trtexec --work /tmp/zoo --budget 540 \\
        --models corpus --gpus 4 --out $OUT

``--gpus N`` runs one process per GPU (``CUDA_VISIBLE_DEVICES``), the models dealt out among them, so
a 4-GPU machine builds 4 models at once. Each process does the cheap-to-prove steps first over all of
its models (export, static quantize, implicit and static builds: the corpus fixture and "does it
build"), then the mirror and the timed rounds. Each model's directory also gets ``<name>.skel.onnx``
(the FP32 model the implicit engine was built from, large weights left out: ``edgeq.zoo.skeleton``
refills it), so its engines can be replayed in tests without a GPU.

Resumable: every step leaves its files in ``--work`` and is skipped once they are there, and no step
starts that would overrun ``--budget`` seconds (run it again to go on). CPU steps (export, quantize) run
beside the GPU builds; timings run alone. ``--out DIR`` gets a tarball of the results after each run.
Needs a GPU, TensorRT 8.6's trtexec and (for torchvision models) torch; nothing here runs in the tests.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

DEFAULT_MODELS = "resnet50,mobilenet_v2,efficientnet_b0,regnet_y_400mf,shufflenet_v2_x1_0,yolo"
# The corpus beyond the models above (``--models corpus``): the families the rules were not written from.
CORPUS = ("mobilenet_v3_small,mobilenet_v3_large,regnet_x_400mf,densenet121,efficientnet_v2_s,convnext_tiny,"
          "vit_b_16,swin_t,inception_v3,googlenet,resnext50_32x4d,resnet18,mnasnet1_0,squeezenet1_1,"
          "vgg11_bn,alexnet,deeplabv3_mobilenet_v3_large,fcn_resnet50,regnet_y_800mf,efficientnet_b3,densenet_mini")
SIZES = {"inception_v3": 299, "efficientnet_b3": 300}  # torchvision's input sizes where not 224
# torchvision's own classes at fewer layers, where the named model's implicit build outruns a lease:
# densenet121 (58 dense layers) timed tactics past 16 minutes even at 64x64 on an H100.
SMALLER = {"densenet_mini": ("DenseNet", {"growth_rate": 32, "block_config": (2, 4, 8, 4),
                                          "num_init_features": 64})}
TACTICS = ["-CUBLAS", "-CUBLAS_LT", "-CUDNN"]  # the fixtures' tactic sources (tests/fixtures/README.md)
PLACEMENTS = ("implicit", "static", "mirror")
_EXPORT = threading.Lock()
EDGEQ = [sys.executable, "-c", "import sys; from edgeq.cli import main; sys.exit(main())"]


@dataclass
class Step:
    name: str
    model: str
    kind: str  # "cpu", "gpu" (one at a time), "solo" (the GPU with nothing else running)
    estimate_s: float
    deps: tuple[str, ...]
    done: Callable[[], bool]
    run: Callable[[], None]
    phase: int = 0  # 0 before 1 over all models: every implicit and static engine before any mirror
    after: tuple[str, ...] = ()  # steps tried first (done or failed): timing waits for the static build
    key: str = field(init=False)

    def __post_init__(self) -> None:
        self.key = f"{self.model}:{self.name}"


class _FirstOutput:
    """Wraps a torchvision net so the export has one output (segmentation nets return a dict)."""

    def __new__(cls, net):  # type: ignore[no-untyped-def]
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.net = net

            def forward(self, x):  # type: ignore[no-untyped-def]
                y = self.net(x)
                return y["out"] if isinstance(y, dict) else y

        return Wrapped()


def _fixed(model, batch: int, size: int):  # type: ignore[no-untyped-def]
    """A real export's dynamic input dimensions as (batch, C, size, size); its outputs' left to TensorRT."""
    for inp in model.graph.input:
        dims = inp.type.tensor_type.shape.dim
        for i, d in enumerate(dims):
            if not d.dim_value:
                d.dim_value = batch if i == 0 else size
    for out in model.graph.output:
        for d in out.type.tensor_type.shape.dim:
            d.Clear()
    del model.graph.value_info[:]
    return model


def _has_qdq(path: Path) -> bool:
    import onnx

    from edgeq.pipeline.stages import has_qdq

    return has_qdq(onnx.load(str(path), load_external_data=False))


def _sh(argv: list[str], log: Path, timeout: float) -> int:
    with open(log, "a") as f:
        f.write("$ " + " ".join(shlex.quote(a) for a in argv) + "\n")
        f.flush()
        try:
            return subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            f.write(f"timed out after {timeout:.0f} s\n")
            return 124


class Model:
    """One model's files under ``work/<name>``: the steps that make them, each done once its files exist."""

    placements: tuple[str, ...] = PLACEMENTS  # the engines it builds and times (implicit first)

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        # ``NAME=PATH@SIZE``: a real export (an ONNX file), its dynamic dimensions fixed to the batch and size
        # ``NAME@SIZE``: a torchvision model at another input size (a quicker build of a slow one)
        name, _, src = name.partition("=")
        name, _, size = name.partition("@")
        self.src: Optional[Path] = Path(src.partition("@")[0]).resolve() if src else None
        self.size = int(src.partition("@")[2] or 640) if src else int(size or SIZES.get(name, 224))
        self.name, self.args = name, args
        self.dir = args.work / name
        self.batch = args.yolo_batch if name == "yolo" else args.batch
        self.onnx = self.dir / f"{name}.onnx"
        self.calib = self.dir / "calib"

    def q(self, placement: str) -> Path:
        return self.dir / placement / f"{self.name}.int8.onnx"

    def engine_dir(self, placement: str) -> Path:
        return self.dir / "engines" / placement

    def plan(self, placement: str) -> Path:
        return self.dir / "plans" / f"{placement}.plan"

    def layers(self, placement: str) -> Path:
        return self.engine_dir(placement) / f"{self.name}.{placement}.layers.json"

    # -- steps ------------------------------------------------------------------------------------------
    def export(self) -> None:
        import numpy as np
        import onnx

        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.onnx.with_suffix(".tmp.onnx")
        if self.name == "yolo":
            from edgeq import zoo

            onnx.save(zoo.yolo_like(batch=self.batch, size=640, width=64), str(tmp))
        elif self.src is not None:
            onnx.save(_fixed(onnx.load(str(self.src)), self.batch, self.size), str(tmp))
        else:
            import torch
            import torchvision

            _EXPORT.acquire()  # torch.onnx.export is not re-entrant across threads

            torch.manual_seed(0)
            family = torchvision.models.segmentation if self.name.startswith(("deeplab", "fcn_")) \
                else torchvision.models
            kw = {"aux_loss": False, "weights_backbone": None} if family is not torchvision.models else {}
            if self.name in SMALLER:
                cls, args = SMALLER[self.name]
                net = _FirstOutput(getattr(torchvision.models, cls)(**args)).eval()
            else:
                net = _FirstOutput(getattr(family, self.name)(weights=None, **kw)).eval()
            x = torch.randn(self.batch, 3, self.size, self.size)
            try:
                torch.onnx.export(net, (x,), str(tmp), opset_version=17, dynamo=False,
                                  input_names=["input"], output_names=["output"])
            finally:
                _EXPORT.release()
        shape = [d.dim_value for d in onnx.load(str(tmp), load_external_data=False).graph.input[0].type
                 .tensor_type.shape.dim]
        self.calib.mkdir(exist_ok=True)
        rng = np.random.default_rng(0)
        for i in range(self.args.samples):
            np.save(self.calib / f"s{i}.npy", rng.standard_normal(shape).astype(np.float32))
        tmp.replace(self.onnx)

    def quantize(self, placement: str) -> None:
        out = self.q(placement)
        out.parent.mkdir(parents=True, exist_ok=True)
        argv = [*EDGEQ, "quantize", str(self.onnx), "--calib", str(self.calib), "-o", str(out),
                "--holdout", str(self.args.holdout), "--calibrator", self.args.calibrator]
        if placement == "mirror":
            argv += ["--from-engine", str(self.layers("implicit"))]
        rc = _sh(argv, self.dir / f"quantize.{placement}.log", 1800)
        if rc != 0:
            raise RuntimeError(f"edgeq quantize ({placement}) exited {rc}")
        if placement == "static":
            import onnx

            from edgeq.zoo.skeletons import write_skeleton

            fp32 = onnx.load(str(out.with_name(f"{self.name}.int8.fp32.onnx")))
            write_skeleton(fp32, self.dir / f"{self.name}.skel.onnx")

    def build(self, placement: str) -> None:
        from edgeq.agent.trtexec_backend import build_argv, inspect_argv, profile_argv

        t = self.args.trtexec
        d = self.engine_dir(placement)
        d.mkdir(parents=True, exist_ok=True)
        self.plan(placement).parent.mkdir(parents=True, exist_ok=True)
        stem = d / f"{self.name}.{placement}"
        q = self.q("static")  # quantize writes <name>.int8.cache and its FP32 model <name>.int8.fp32.onnx
        onnx, calib = ((str(q.with_name(f"{self.name}.int8.fp32.onnx")), str(q.with_suffix(".cache")))
                       if placement == "implicit" else (str(self.q(placement)), None))
        plan = self.plan(placement)
        plan.unlink(missing_ok=True)
        # as deploy builds it: a Q/DQ model without a Q/DQ (a mirror of an engine with no INT8 layer) gets no
        # --int8, which would run implicit INT8 on trtexec's placeholder ranges
        int8 = calib is not None or _has_qdq(Path(onnx))
        argv = build_argv(t, onnx, str(plan), int8=int8, fp16=True, calib=calib, tactic_sources=TACTICS,
                          timing_cache=str(self.args.work / f"timing.{self.args.gpu_tag}.cache"))
        t0 = time.perf_counter()
        _sh(argv, Path(f"{stem}.build.log"), 1200)  # 8.6's trtexec can crash at exit: judge the plan
        if not plan.is_file() or plan.stat().st_size == 0:
            raise RuntimeError(f"{placement} build failed: see {stem}.build.log")
        (d / "build_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
        _sh(inspect_argv(t, str(plan), f"{stem}.layers.json.tmp"), Path(f"{stem}.inspect.log"), 300)
        _sh(profile_argv(t, str(plan), f"{stem}.profile.json", iterations=50, duration_s=2,
                         no_data_transfers=True), Path(f"{stem}.run.log"), 300)
        Path(f"{stem}.layers.json.tmp").replace(self.layers(placement))

    def time_rounds(self) -> None:
        """Alternating rounds (implicit, static, mirror, or ``placements``; then the order reversed), the
        engines alone."""
        import re

        built = tuple(p for p in self.placements if self.plan(p).is_file())  # a failed static build: the rest
        figures: dict[str, list[float]] = {p: [] for p in built}
        log = self.dir / "timing.log"
        for r in range(self.args.rounds):
            order = built if r % 2 == 0 else tuple(reversed(built))
            for p in order:
                argv = [self.args.trtexec, f"--loadEngine={self.plan(p)}", "--noDataTransfers",
                        "--useCudaGraph", f"--duration={self.args.duration}", "--warmUp=500"]
                out = subprocess.run(argv, capture_output=True, text=True, timeout=300).stdout
                with open(log, "a") as f:
                    f.write(f"round {r + 1} {p}\n" + out[-4000:])
                m = re.findall(r"\[I\] Throughput: ([0-9.eE+-]+) qps", out)
                if not m:
                    raise RuntimeError(f"no throughput in trtexec's output for {p}: see {log}")
                figures[p].append(float(m[-1]))  # trtexec's qps: inferences (of batch B) per second
        (self.dir / "timing.json").write_text(json.dumps({"batch": self.batch, "qps": figures}, indent=1))

    def compare(self) -> None:
        """``edgeq compare`` of the three engines (implicit the baseline): its JSON and HTML page."""
        html, out = self.dir / "compare.html", self.dir / "compare.json"
        argv = [*EDGEQ, "compare", "--engines", *(str(self.engine_dir(p)) for p in PLACEMENTS), "--json",
                "--html", str(html)]
        with open(out.with_suffix(".tmp"), "w") as f:
            subprocess.run(argv, stdout=f, stderr=subprocess.DEVNULL, timeout=300)
        out.with_suffix(".tmp").replace(out)

    def steps(self) -> list[Step]:
        heavy = 1.6 if self.name in ("yolo", "efficientnet_b0", "regnet_y_400mf") else 1.0
        s = [
            Step("export", self.name, "cpu", 30, (), self.onnx.is_file, self.export),
            Step("quantize-static", self.name, "cpu", 90 * heavy, ("export",), self.q("static").is_file,
                 lambda: self.quantize("static")),
            Step("build-implicit", self.name, "gpu", 180 * heavy, ("quantize-static",),
                 self.layers("implicit").is_file, lambda: self.build("implicit")),
            Step("quantize-mirror", self.name, "cpu", 90 * heavy, ("build-implicit",),
                 self.q("mirror").is_file, lambda: self.quantize("mirror"), phase=1),
            Step("build-static", self.name, "gpu", 60 * heavy, ("quantize-static",),
                 self.layers("static").is_file, lambda: self.build("static")),
            Step("build-mirror", self.name, "gpu", 60 * heavy, ("quantize-mirror",),
                 self.layers("mirror").is_file, lambda: self.build("mirror"), phase=1),
            Step("time", self.name, "solo", self.args.rounds * 3 * (self.args.duration + 4),
                 ("build-implicit", "build-mirror"), (self.dir / "timing.json").is_file,
                 self.time_rounds, phase=1, after=("build-static",)),
            Step("compare", self.name, "cpu", 20, ("time",), (self.dir / "compare.json").is_file,
                 self.compare, phase=1),
        ]
        return s


def schedule(steps: list[Step], budget_s: float, cpu_workers: int, only: Optional[set[str]] = None,
             depth_first: bool = False) -> list[str]:
    """Run what is not done yet: one GPU step at a time beside up to ``cpu_workers`` CPU steps, a 'solo'
    step with nothing beside it, no step started that would overrun the budget. Returns what failed."""
    t0 = time.monotonic()
    by_key = {s.key: s for s in steps}
    done = {s.key for s in steps if s.done()}
    failed: list[str] = []
    running: dict[str, Future[None]] = {}
    pool = ThreadPoolExecutor(max_workers=cpu_workers + 1)

    def settled(key: str) -> bool:  # done, failed, or never to run (a step it needs failed)
        fell = {f.split(": ", 1)[0] for f in failed}
        return key in done or key in fell or any(f"{by_key[key].model}:{d}" in fell for d in by_key[key].deps)

    def ready(s: Step) -> bool:
        return (all(f"{s.model}:{d}" in done for d in s.deps)
                and all(settled(f"{s.model}:{d}") for d in s.after if f"{s.model}:{d}" in by_key))

    def fits(s: Step) -> bool:
        return time.monotonic() - t0 + s.estimate_s <= budget_s

    while True:
        for k, fut in list(running.items()):
            if fut.done():
                del running[k]
                err = fut.exception()
                if err is None and by_key[k].done():
                    done.add(k)
                    print(f"[{time.monotonic() - t0:6.0f} s] done {k}", flush=True)
                else:
                    failed.append(f"{k}: {err}")
                    print(f"[{time.monotonic() - t0:6.0f} s] FAILED {k}: {err}", flush=True)
        blocked = {f.split(":", 2)[0] + ":" + f.split(":", 2)[1] for f in failed}
        todo = [s for s in steps if s.key not in done and s.key not in running and s.key not in blocked
                and not any(f"{s.model}:{d}" in blocked for d in s.deps) and (only is None or s.name in only)]
        if not depth_first:
            todo.sort(key=lambda s: s.phase)  # stable: the models' order within a phase
        kinds = [by_key[k].kind for k in running]
        started = False
        for s in todo:
            if not ready(s) or not fits(s):
                continue
            if s.kind == "solo" and running:
                continue
            if "solo" in kinds or (s.kind == "gpu" and "gpu" in kinds):
                continue
            if s.kind == "cpu" and kinds.count("cpu") >= cpu_workers:
                continue
            if s.kind == "cpu" and any(x.kind == "solo" and x.phase <= s.phase and ready(x) and fits(x)
                                       for x in todo):
                continue  # let a waiting timing run alone first
            print(f"[{time.monotonic() - t0:6.0f} s] start {s.key} (~{s.estimate_s:.0f} s)", flush=True)
            running[s.key] = pool.submit(s.run)
            kinds.append(s.kind)
            started = True
            if s.kind == "solo":
                break
        if not running and not started:
            break
        time.sleep(1)
    pool.shutdown(wait=True)
    left = [s.key for s in steps if s.key not in done and (only is None or s.name in only)]
    if left:
        print(f"not done ({len(left)}): {', '.join(left)} -- run again to go on", flush=True)
    return failed


def table(models: list[Model]) -> tuple[str, list[dict]]:
    from edgeq.orchestration.auto import AUTO_MIN_RATIO
    from edgeq.orchestration.retime import Paired
    from edgeq.report.compare_engine import engine_from_path, engine_stats

    rows, lines = [], []
    head = (f"{'model':20s} {'batch':>5s} {'implicit qps':>12s} {'static qps':>10s} {'ratio':>6s} "
            f"{'mirror qps':>10s} {'ratio':>6s} {'auto':>6s} {'FP16/FP32 i/s/m':>16s} "
            f"{'reformats i/s/m':>16s} "
            f"{'cosine s/m':>14s} {'float-entry':>11s}")
    lines.append(head)
    for m in models:
        row: dict = {"model": m.name, "batch": m.batch}
        tj = m.dir / "timing.json"
        if tj.is_file():
            qps = json.loads(tj.read_text())["qps"]
            med = {p: sorted(v)[len(v) // 2] for p, v in qps.items() if v}
            row["qps"], row["qps_median"] = qps, med
            # each placement against implicit as deploy judges it: the median of the per-round ratios
            # (the rounds alternate every placement), not the ratio of the medians
            row["ratio"] = {p: Paired(("implicit", p), (tuple(qps["implicit"]), tuple(qps[p]))).ratio()
                            for p in ("static", "mirror")
                            if qps.get(p) and len(qps[p]) == len(qps.get("implicit") or ())}
            mirror = row["ratio"].get("mirror")
            # what --placement auto ships: the mirror's engine at >= AUTO_MIN_RATIO, else the implicit one
            if mirror is not None:
                row["auto"] = {"kept": "explicit" if mirror >= AUTO_MIN_RATIO else "implicit",
                               "ratio": mirror if mirror >= AUTO_MIN_RATIO else 1.0}
        wide, reformats = {}, {}
        for p in PLACEMENTS:
            if m.layers(p).is_file():
                st = engine_stats(engine_from_path(m.engine_dir(p)).report)  # type: ignore[arg-type]
                wide[p] = sum(n for k, n in st.precisions.items() if k in ("FP16", "FP32"))
                reformats[p] = st.reformats
            bt = m.engine_dir(p) / "build_s.txt"
            if bt.is_file():
                row.setdefault("build_s", {})[p] = float(bt.read_text())
        row["wide_layers"], row["reformats"] = wide, reformats
        for p in ("static", "mirror"):
            summary = m.q(p).with_suffix(".json")
            if summary.is_file():
                acc = json.loads(summary.read_text()).get("accuracy") or {}
                row.setdefault("cosine", {})[p] = acc.get("cosine", acc.get("min_cosine"))
                if p == "mirror":
                    row["mirror"] = json.loads(summary.read_text()).get("mirror")
        rows.append(row)

        def f(x: Optional[float], w: int, fmt: str = ".0f") -> str:
            return f"{x:{w}{fmt}}" if isinstance(x, (int, float)) else f"{'-':>{w}s}"

        med = row.get("qps_median", {})
        ratio = row.get("ratio", {})
        cos = row.get("cosine", {})
        per = ("/".join(str(d.get(p, "-")) for p in PLACEMENTS) for d in (wide, reformats))
        cosines = "/".join(f"{c:.4f}" if isinstance(c, float) else "-"
                           for c in (cos.get("static"), cos.get("mirror")))
        # regions the implicit engine entered by a quantizing reformat, which Q/DQ cannot say on 8.6
        entries = (row.get("mirror") or {}).get("float_entry")
        n_entries = None if entries is None else len(entries)
        lines.append(
            f"{m.name:20s} {m.batch:5d} {f(med.get('implicit'), 12)} {f(med.get('static'), 10)} "
            f"{f(ratio.get('static'), 6, '.3f')} {f(med.get('mirror'), 10)} "
            f"{f(ratio.get('mirror'), 6, '.3f')} {f((row.get('auto') or {}).get('ratio'), 6, '.3f')} "
            f"{next(per):>16s} {next(per):>16s} {cosines:>14s} {f(n_entries, 11)}"
        )
    return "\n".join(lines), rows


def chart(rows: list[dict], path: Path, title: str = "") -> None:
    """Ratio to implicit per model, static vs auto (what ``--placement auto`` ships), 0.98 and 1.0 marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if (r.get("ratio") or {}).get("static") is not None]
    names = [r.get("label", r["model"]) for r in timed]
    static = [r["ratio"]["static"] for r in timed]
    auto = [(r.get("auto") or {}).get("ratio") or 0.0 for r in timed]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * len(timed) + 2), 3.6))
    xs = range(len(timed))
    ax.bar([x - 0.2 for x in xs], static, 0.4, label="static (the rules)", color="#da3")
    ax.bar([x + 0.2 for x in xs], auto, 0.4, label="auto (the target decides)", color="#4a7")
    ax.axhline(1.0, color="#444", lw=0.8)
    ax.axhline(0.98, color="#c44", lw=0.8, ls="--", label="0.98x: auto's gate")
    ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=7)
    ax.set_ylim(min([*static, *[a for a in auto if a], 0.9]) - 0.02, 1.06)
    ax.set_ylabel("throughput / implicit INT8")
    ax.set_title(title or "Explicit Q/DQ engines against the implicit engine, TensorRT 8.6.0", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def tarball(out: Path, work: Path, models: list[Model], *extra: Path) -> None:
    """``out/results.tar.gz``: every model's files but models, plans, data and caches, and ``extra``."""
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "results.tar.gz", "w:gz") as tar:
        for p in extra:
            tar.add(p, p.name)
        for m in models:
            for p in m.dir.rglob("*"):
                keep = (p.suffix not in (".onnx", ".plan", ".npy", ".cache", ".tmp")
                        or p.name.endswith(".skel.onnx"))
                if p.is_file() and keep and "calib" not in p.parts:
                    tar.add(p, str(p.relative_to(work)))


def _spread(args: argparse.Namespace, names: list[str]) -> int:
    """``--gpus N``: one child per GPU (``CUDA_VISIBLE_DEVICES``), the models dealt out in turn."""
    import os

    children = []
    for g in range(args.gpus):
        mine = names[g::args.gpus]
        if not mine:
            continue
        argv = [sys.executable, __file__, *_passed(args), "--models", ",".join(mine), "--gpus", "1",
                "--gpu-tag", str(g)]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(g)}
        log = open(args.work / f"gpu{g}.log", "a")  # noqa: SIM115 (open until the child exits)
        children.append((g, subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    rc = 0
    for g, child, log in children:
        rc |= child.wait()
        log.close()
        print(f"GPU {g}: exit {child.returncode} ({args.work / f'gpu{g}.log'})", flush=True)
    report(args, [Model(n, args) for n in names], *sorted(args.work.glob("gpu*.log")))
    return rc


def report(args: argparse.Namespace, models: list[Model], *extra: Path) -> None:
    """The table on stdout, ``results.json``, ``--chart`` and ``--out``'s tarball."""
    text, rows = table(models)
    print(text)
    (args.work / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    if args.chart is not None:
        chart(rows, args.chart)
    if args.out is not None:
        tarball(args.out, args.work, models, args.work / "results.json", *extra)


def _passed(args: argparse.Namespace) -> list[str]:
    out = ["--trtexec", args.trtexec, "--work", str(args.work), "--calibrator", args.calibrator]
    if args.only:
        out += ["--only", args.only]
    for k in ("batch", "yolo_batch", "samples", "holdout", "rounds", "duration", "budget", "cpu_workers"):
        out += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    if args.depth_first:
        out.append("--depth-first")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trtexec", help="TensorRT 8.6's trtexec (needed unless --from-results)")
    ap.add_argument("--work", type=Path, default=Path("zoo-bench"))
    ap.add_argument("--out", type=Path, help="where to put results.tar.gz (the results of every model so "
                    "far)")
    ap.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated torchvision model names, "
                    "yolo, corpus (the corpus beyond the default models), NAME@SIZE (a torchvision model at "
                    "another input size) or NAME=PATH@SIZE (a real export)")
    ap.add_argument("--gpus", type=int, default=1, help="one process per GPU, the models dealt out")
    ap.add_argument("--gpu-tag", default="0", help=argparse.SUPPRESS)
    ap.add_argument("--only", help="comma-separated step names to run (e.g. export while TensorRT is "
                    "still being set up); the rest are left for a later run")
    ap.add_argument("--calibrator", default="max", help="edgeq quantize --calibrator (the scales change "
                    "no tactic TensorRT times; max is the quickest)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--yolo-batch", type=int, default=8)
    ap.add_argument("--samples", type=int, default=6, help="seeded standard-normal calibration batches")
    ap.add_argument("--holdout", type=float, default=0.34, help="share of them held out for the cosine")
    ap.add_argument("--rounds", type=int, default=5,
                    help="alternating timing rounds (at least 3; a 1 ms engine spreads ±3%% a round)")
    ap.add_argument("--duration", type=float, default=4, help="seconds per timing run")
    ap.add_argument("--budget", type=float, default=540, help="seconds: no step starts that would overrun it")
    ap.add_argument("--cpu-workers", type=int, default=2)
    ap.add_argument("--depth-first", action="store_true", help="finish each model (timed) before the next "
                    "model's builds: when the budget is short, every finished model is a measured one")
    ap.add_argument("--chart", type=Path, help="also draw the ratios as a PNG (needs matplotlib)")
    ap.add_argument("--from-results", type=Path, help="only draw --chart from a results.json (no GPU)")
    args = ap.parse_args()
    if args.from_results is not None:
        chart(json.loads(args.from_results.read_text()), args.chart or Path("placement.png"))
        return 0
    if not args.trtexec:
        print("--trtexec is needed to build engines", file=sys.stderr)
        return 2
    if args.rounds < 3:
        print("--rounds must be at least 3", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    names = [n for part in args.models.split(",") if part
             for n in (CORPUS.split(",") if part == "corpus" else [part])]
    if args.gpus > 1:
        return _spread(args, names)
    models = [Model(n, args) for n in names]
    steps = [s for m in models for s in m.steps()]
    failed = schedule(steps, args.budget, args.cpu_workers, set(args.only.split(",")) if args.only else None,
                      args.depth_first)
    if args.only:
        return 1 if failed else 0
    report(args, models)
    for f in failed:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
