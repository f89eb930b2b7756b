"""Learned weight rounding (``--weights adaround``, ``edgeq.quant.rounding``) on the accuracy bench's models.

    python bench/rounding_bench.py                        # det and rec: every figure below
    python bench/rounding_bench.py --models det --skip full --repeat 3
    python bench/rounding_bench.py --solvers --models det # also AdaRound's own search on some layers

Uses ``accuracy_bench``'s sets (``--cache``, built there when missing: ``accuracy_bench.py --prepare-only``).
Every model is run on the held-out set as edgeq evaluates it (``run_outputs``: onnxruntime's CPU provider
with its Q/DQ fusions off, ``edgeq.quant.evaluate``: the Q/DQ arithmetic as written, the same on every host)
and scored against FP32 with edgeq's task metric. Prints two tables:

- ``weights``: every activation float, only the weights changed: INT8 with nearest rounding (today's),
  FP16 (the floor any rounding of the weights leaves: FP16's rounding error is ~256x smaller), and the
  learned rounding (with every activation float each layer's input is FP32's, as quantize learns it
  there). "gap closed" = (learned - nearest) / (FP16 - nearest).
- ``full``: full INT8 from ``quantize_model`` (``--calibrator auto``) with ``--weights nearest``,
  ``adaround`` and ``auto`` (the default: the learned rounding kept where the held-out metric says it
  helps), each one's wall time (the fastest of ``--repeat`` interleaved runs) and its ratio to nearest's.

``--solvers``: the layer error (relative, on the calibration activations) and time of the coordinate
descent edgeq uses against AdaRound's own search (rectified sigmoid, regulariser annealed, Adam) on the
same objective, over the first ``--solver-layers`` layers.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy_bench as ab

MODELS = ("det", "rec")


def outputs(model: Any, data: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Every sample's float outputs, as edgeq evaluates a Q/DQ model (``run_outputs``: onnxruntime's CPU
    provider with its Q/DQ fusions off, ``edgeq.quant.evaluate``)."""
    from edgeq.quant.accuracy import run_outputs

    return run_outputs(model, data)


def fp16_weights(reference: Any, plan: Any) -> Any:
    """``reference`` with every weight the plan quantizes rounded to float16 (and back to float32)."""
    import onnx
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(reference)
    names = {w.tensor for w in plan.weights}
    for init in m.graph.initializer:
        if init.name in names:
            a = numpy_helper.to_array(init).astype(np.float16).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(a, init.name))
    return m


class Case:
    """One model's set: the cleaned FP32 model, its plan, the data, the FP32 outputs and the metric."""

    def __init__(self, d: Path) -> None:
        import onnx

        from edgeq.graph.io import graph_from_model
        from edgeq.quant.data import calibration_set
        from edgeq.quant.metrics import metric_from_spec
        from edgeq.quant.placement import plan_placement
        from edgeq.quant.quantize import prepare_model

        self.dir = d
        self.metric_name = (d / "metric.txt").read_text().strip()
        self.metric = metric_from_spec(self.metric_name)
        self.model = onnx.load(str(d / "model.onnx"))
        self.reference, _, _ = prepare_model(self.model)
        self.plan = plan_placement(graph_from_model(self.reference), "trt")
        self.weights_only = replace(self.plan, sites=(), groups={}, group_ids={})
        self.calib = calibration_set(self.reference, d / "calib")
        self.held = ab.load_set(d / "holdout")
        self.fp32 = outputs(self.reference, self.held)

    def score(self, model: Any) -> Any:
        return self.metric.score(self.fp32, outputs(model, self.held))


def weights_rows(case: Case) -> list[tuple[str, Any, float]]:
    from edgeq.quant.quantize import build_qdq
    from edgeq.quant.rounding import learn_rounding

    nearest = build_qdq(case.reference, case.weights_only, {})
    rows = [("INT8 nearest", case.score(nearest), 0.0), ("FP16", case.score(fp16_weights(case.reference,
                                                                                        case.plan)), 0.0)]
    t0 = time.perf_counter()
    r = learn_rounding(case.reference, case.weights_only, case.calib)
    took = time.perf_counter() - t0
    rows.append(("learned", case.score(build_qdq(case.reference, case.weights_only, {}, r.values)), took))
    print(f"  {r.summary()}", flush=True)
    return rows


def full_rows(case: Case, repeat: int) -> list[tuple[str, Any, float, str]]:
    from edgeq.quant.quantize import QuantizeOptions, quantize_model

    opts = QuantizeOptions(calib=case.dir / "calib", holdout_data=case.dir / "holdout",
                           metric=case.metric_name)
    walls: dict[str, list[float]] = {w: [] for w in ("nearest", "adaround", "auto")}
    results: dict[str, Any] = {}
    for _ in range(repeat):  # interleaved: a shared machine's load drifts over minutes
        for w in walls:
            t0 = time.perf_counter()
            results[w] = quantize_model(case.model, case.calib, replace(opts, weights=w))
            walls[w].append(time.perf_counter() - t0)
    rows = []
    for w, res in results.items():
        note = res.choice.summary() if res.choice is not None else ""
        rows.append((f"--weights {w}", case.score(res.model), min(walls[w]), note))
    return rows


def gap(rows: list[tuple[str, Any, float]]) -> str:
    by = {label: s.value for label, s, _ in rows}
    lo, hi = by["INT8 nearest"], by["FP16"]
    if hi <= lo:
        return "FP16 is no better than INT8 nearest: no gap to close"
    return "; ".join(f"{label}: {(by[label] - lo) / (hi - lo):.0%} of the gap closed"
                     for label in by if label.startswith("learned"))


# ---------------------------------------------------------------------------------------------------
# AdaRound's own search, on the same objective, to compare with edgeq's coordinate descent
# ---------------------------------------------------------------------------------------------------


def adaround_search(prob: Any, up: np.ndarray, iterations: int, *, reg: float = 0.01, lr: float = 0.01,
                    warmup: float = 0.2, beta: tuple[float, float] = (20.0, 2.0)) -> np.ndarray:
    """Nagel et al. 2020: h(V) a rectified sigmoid (zeta 1.1, gamma -0.1) initialised at each weight's
    fractional part; the error plus ``reg * sum(1 - |2h - 1|^beta)`` (off for the first ``warmup`` of the
    iterations, then beta annealed 20 -> 2); Adam on V; the choice is h >= 0.5."""
    zeta, gamma = 1.1, -0.1
    h_mat = prob.h + prob.ridge[:, None, None] * np.eye(prob.h.shape[1])[None]
    active = prob.step > 0
    frac = np.where(active, (prob.w - prob.scale * prob.lo) / np.where(active, prob.step, 1.0), 0.5)
    frac = np.clip(frac, 0.01, 0.99)
    v = -np.log((zeta - gamma) / (frac - gamma) - 1.0)
    m, s = np.zeros_like(v), np.zeros_like(v)
    base = prob.scale * prob.lo - prob.w
    start = int(iterations * warmup)
    for t in range(1, iterations + 1):
        sig = 1.0 / (1.0 + np.exp(-v))
        raw = sig * (zeta - gamma) + gamma
        h = np.clip(raw, 0.0, 1.0)
        d = base + prob.step * h
        grad_h = 2.0 * (d @ h_mat + prob.v) * prob.step
        if t > start:
            frac_t = (t - start) / max(iterations - start, 1)
            b = beta[1] + 0.5 * (beta[0] - beta[1]) * (1 + np.cos(np.pi * frac_t))
            c = 2.0 * h - 1.0
            grad_h += reg * -b * np.abs(c) ** (b - 1.0) * np.sign(c) * 2.0
        grad = grad_h * (zeta - gamma) * sig * (1.0 - sig) * ((raw > 0) & (raw < 1)) * active
        m = 0.9 * m + 0.1 * grad
        s = 0.999 * s + 0.001 * grad * grad
        v -= lr * (m / (1 - 0.9 ** t)) / (np.sqrt(s / (1 - 0.999 ** t)) + 1e-8)
    h = np.clip(1.0 / (1.0 + np.exp(-v)) * (zeta - gamma) + gamma, 0.0, 1.0)
    return np.where(active, h >= 0.5, up)


def learned_by_adaround(case: Case, iterations: int) -> tuple[Any, float]:
    """Every layer's rounding by ``adaround_search`` instead of the coordinate descent (the same objective,
    the same statistics): (the weights-only Q/DQ model, seconds)."""
    from edgeq.graph.io import graph_from_model
    from edgeq.quant.quantize import build_qdq
    from edgeq.quant.rounding import RoundingOptions, collect_stats, layers_of, problem, values_of

    opts = RoundingOptions()
    t0 = time.perf_counter()
    layers = layers_of(graph_from_model(case.reference), case.weights_only)[0]
    stats = collect_stats(case.reference, layers, case.calib, opts)
    values = {}
    for layer in layers:
        prob, up = problem(layer, stats.pop(layer.node), opts.damp)
        values[layer.tensor] = values_of(layer, prob, adaround_search(prob, up, iterations))
    return build_qdq(case.reference, case.weights_only, {}, values), time.perf_counter() - t0


def solver_rows(case: Case, layers: int, iterations: int) -> list[str]:
    from edgeq.graph.io import graph_from_model
    from edgeq.quant.rounding import RoundingOptions, collect_stats, coordinate_descent, layers_of, problem

    opts = RoundingOptions()
    todo = layers_of(graph_from_model(case.reference), case.weights_only)[0][:layers]
    stats = collect_stats(case.reference, todo, case.calib, opts)
    lines, tot = [], {"cd": 0.0, "ada": 0.0}
    for layer in todo:
        prob, up = problem(layer, stats[layer.node], opts.damp)
        t0 = time.perf_counter()
        cd, _ = coordinate_descent(prob, up, opts.sweeps)
        t1 = time.perf_counter()
        ada = adaround_search(prob, up, iterations)
        t2 = time.perf_counter()
        tot["cd"] += t1 - t0
        tot["ada"] += t2 - t1
        lines.append(f"  {layer.node:40s} nearest {prob.error(up):.3e}  cd {prob.error(cd):.3e} "
                     f"({t1 - t0:.2f} s)  adaround {prob.error(ada):.3e} ({t2 - t1:.2f} s)")
    lines.append(f"  total: cd {tot['cd']:.1f} s, adaround ({iterations} iterations) {tot['ada']:.1f} s")
    model, took = learned_by_adaround(case, iterations)
    lines.append(f"  every activation float, every layer by AdaRound's search: {case.score(model).text} "
                 f"({took:.0f} s)")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "edgeq-bench")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--skip", default="", help="weights and/or full: tables not to measure")
    ap.add_argument("--repeat", type=int, default=1, help="full: interleaved runs, the fastest kept")
    ap.add_argument("--solvers", action="store_true", help="also AdaRound's search against edgeq's")
    ap.add_argument("--solver-layers", type=int, default=12)
    ap.add_argument("--iterations", type=int, default=1000, help="AdaRound's iterations per layer")
    args = ap.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    bad = [n for n in names if n not in ab.CASES]
    if bad:
        print(f"unknown model {bad[0]}; choose from {', '.join(ab.CASES)}", file=sys.stderr)
        return 2
    skip = set(args.skip.split(","))
    cache = args.cache.expanduser()
    for n in names:
        d = cache / "sets" / n
        if not (d / "sets.txt").is_file():
            ab.ensure_deps()
            d = ab.prepare(ab.CASES[n], ab.fetch_packages(cache), cache)
        case = Case(d)
        print(f"{n}: {ab.CASES[n].title} ({len(case.held)} held out, --metric {case.metric_name})",
              flush=True)
        if "weights" not in skip:
            rows = weights_rows(case)
            print(f"{n}, every activation float:")
            for label, s, took in rows:
                print(f"  {label:18s} {s.text}" + (f"  ({took:.1f} s)" if took else ""))
            print(f"  {gap(rows)}", flush=True)
        if "full" not in skip:
            full = full_rows(case, max(1, args.repeat))
            base = next(w for label, _, w, _ in full if label.endswith("nearest"))
            print(f"{n}, full INT8 (quantize, --calibrator auto):")
            for label, s, wall, note in full:
                print(f"  {label:20s} {s.text}  ({wall:.1f} s, {wall / base:.2f}x nearest)")
                print(f"  {'':20s} {note}")
            sys.stdout.flush()
        if args.solvers:
            print(f"{n}, layer error on the calibration activations by search:")
            print("\n".join(solver_rows(case, args.solver_layers, args.iterations)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
