"""Float-entry regions on a GPU with TensorRT 8.6: each placement with and without them, against implicit.

``zoo_bench``'s steps for one or more models, with four explicit engines instead of two: the static rules
and the mirror, each as written (``static``, ``mirror``) and with ``edgeq.quant.regions`` switched off
(``static-nofe``, ``mirror-nofe``: the placement before the float-entry rule), all timed in alternating
rounds against the implicit engine of the same lease. Prints one line per engine (median qps, ratio,
FP16/FP32 compute layers, precision-changing reformats)::

    LD_LIBRARY_PATH=/opt/trt86/lib:/opt/trt86/stubs \\
        python bench/region_bench.py --trtexec /opt/trt86/bin/trtexec --work /tmp/rb --budget 540

Resumable like ``zoo_bench`` (run it again to go on). Needs a GPU and TensorRT 8.6; no test runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_bench as zb

VARIANTS = ("implicit", "static", "static-nofe", "mirror", "mirror-nofe")


class Model(zb.Model):
    placements = VARIANTS

    def quantize(self, placement: str) -> None:
        out = self.q(placement)
        out.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, __file__, "--quantize-one", (placement.endswith("-nofe") and "off") or "on",
                "quantize", str(self.onnx), "--calib", str(self.calib), "-o", str(out),
                "--holdout", str(self.args.holdout)]
        if placement.startswith("mirror"):
            argv += ["--from-engine", str(self.layers("implicit"))]
        rc = zb._sh(argv, self.dir / f"quantize.{placement}.log", 1800)
        if rc != 0:
            raise RuntimeError(f"edgeq quantize ({placement}) exited {rc}")

    def steps(self) -> list[zb.Step]:
        return self.placed_steps() + self.engine_steps()

    def placed_steps(self) -> list[zb.Step]:
        """Export, the implicit engine, and the four placements (the rule on and off)."""
        s = [
            zb.Step("export", self.name, "cpu", 30, (), self.onnx.is_file, self.export),
            zb.Step("quantize-static", self.name, "cpu", 90, ("export",), self.q("static").is_file,
                    lambda: self.quantize("static")),
            zb.Step("quantize-static-nofe", self.name, "cpu", 90, ("export",), self.q("static-nofe").is_file,
                    lambda: self.quantize("static-nofe")),
            zb.Step("build-implicit", self.name, "gpu", 180, ("quantize-static",),
                    self.layers("implicit").is_file, lambda: self.build("implicit")),
        ]
        for p in ("mirror", "mirror-nofe"):
            s.append(zb.Step(f"quantize-{p}", self.name, "cpu", 90, ("build-implicit",), self.q(p).is_file,
                             lambda p=p: self.quantize(p)))
        return s

    def engine_steps(self) -> list[zb.Step]:
        """A build of each explicit engine in ``placements``, then their timing rounds."""
        s = [zb.Step(f"build-{p}", self.name, "gpu", 50, (f"quantize-{p}",), self.layers(p).is_file,
                     lambda p=p: self.build(p)) for p in self.placements[1:]]
        timing_s = self.args.rounds * len(self.placements) * (self.args.duration + 4)
        s.append(zb.Step("time", self.name, "solo", timing_s, tuple(f"build-{p}" for p in self.placements),
                         (self.dir / "timing.json").is_file, self.time_rounds))
        return s


def report(models: list[Model], variants: tuple[str, ...] = VARIANTS) -> str:
    from edgeq.report.compare_engine import engine_from_path, engine_stats

    lines = []
    for m in models:
        tj = m.dir / "timing.json"
        qps = json.loads(tj.read_text())["qps"] if tj.is_file() else {}
        med = {p: sorted(v)[len(v) // 2] for p, v in qps.items() if v}
        for p in variants:
            wide = reformats = "-"
            if m.layers(p).is_file():
                st = engine_stats(engine_from_path(m.engine_dir(p)).report)  # type: ignore[arg-type]
                wide = str(sum(n for k, n in st.precisions.items() if k in ("FP16", "FP32")))
                reformats = str(st.reformats)
            ratio = f"{med[p] / med['implicit']:.3f}" if p in med and "implicit" in med else "-"
            cos = "-"
            summary = m.q(p).with_suffix(".json")
            if p != "implicit" and summary.is_file():
                acc = json.loads(summary.read_text()).get("accuracy") or {}
                c = acc.get("cosine", acc.get("min_cosine"))
                cos = f"{c:.4f}" if isinstance(c, float) else "-"
            lines.append(f"{m.name:20s} {p:12s} qps {med.get(p, 0):8.1f} ratio {ratio:>6s} float layers "
                         f"{wide:>4s} reformats {reformats:>4s} cosine {cos} rounds {qps.get(p)}")
    return "\n".join(lines)


def quantize_one(switch: str, argv: list[str]) -> int:
    """``edgeq`` with the float-entry rule as written, or switched off (no region found)."""
    from edgeq.cli import main
    from edgeq.quant import regions

    if switch == "off":
        regions.float_entry_regions = lambda graph, plan: []
    sys.argv = ["edgeq", *argv]
    main()
    return 0


def main(model: type[Model] = Model, variants: tuple[str, ...] = VARIANTS, name: str = "region_bench",
         rounds: int = 3, duration: float = 4) -> int:
    """Parse the bench's flags, run ``model``'s steps for each model, print and save ``variants``' lines
    (``<name>.txt``); ``entry_bench`` runs through here too."""
    if len(sys.argv) > 2 and sys.argv[1] == "--quantize-one":
        return quantize_one(sys.argv[2], sys.argv[3:])
    doc = sys.modules[model.__module__].__doc__ or ""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--trtexec", required=True)
    ap.add_argument("--work", type=Path, default=Path(name.replace("_", "-")))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--models", default="shufflenet_v2_x1_0")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--yolo-batch", type=int, default=8)
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--holdout", type=float, default=0.34)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--duration", type=float, default=duration)
    ap.add_argument("--budget", type=float, default=540)
    ap.add_argument("--cpu-workers", type=int, default=3)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    models = [model(n, args) for n in args.models.split(",") if n]
    t0 = time.monotonic()
    failed = zb.schedule([s for m in models for s in m.steps()], args.budget, args.cpu_workers)
    text = report(models, variants)
    print(text)
    print(f"{time.monotonic() - t0:.0f} s")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{name}.txt").write_text(text + "\n")
        zb.tarball(args.out, args.work, models)  # type: ignore[arg-type]
    for f in failed:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
