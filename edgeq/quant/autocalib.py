"""``--calibrator auto``: every calibrator tried on the same statistics, the best kept by the task metric.

Why measure instead of picking one: no calibrator is best on trained models. Measured on four models
shipped as ONNX by packages on the index (a YOLOv8n detector, PP-OCRv4's text detector and recogniser,
a direction classifier): entropy kept 57% of the detector's FP32 detections where mse kept 95%, and left
the recogniser reading nothing at all where percentile read 18 of 20 strings. Which one wins depends on
the model's activation distributions, so the held-out task metric decides.

Bounded cost: the histograms are collected once (the expensive pass, every activation of every
calibration sample) and each calibrator's ranges come from them for free (``ranges_from_histograms``);
the FP32 reference runs once on the held-out set; each candidate costs one Q/DQ model and one held-out
pass. Candidates are scored in ``AUTO_CANDIDATES``' order; a tie (within ``TIE``) keeps the earlier one
(entropy, TensorRT's own calibrator, first).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeq.findings import ProgressFn, no_progress

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from edgeq.quant.calibrate import CalibOptions, TensorHistogram
    from edgeq.quant.metrics import Metric, TaskScore

AUTO = "auto"
AUTO_ORDER = ("entropy", "percentile", "mse", "max")
# Per tensor where it pays: entropy's ranges, except the HYBRID_TOP tensors it clips hardest (largest
# max |x| / entropy amax), which keep their max. Measured on PP-OCRv4's text recogniser (held-out
# strings): entropy 0/20, max 15/20, this 17/20 at CER 1.7%; where it does not pay (the YOLOv8n
# detector: max keeps more), the held-out score says so and it is not kept.
HYBRID_TOP = 16
HYBRID = f"entropy+max{HYBRID_TOP}"
HYBRIDS = {HYBRID: ("entropy", "max", HYBRID_TOP)}  # name -> (base, kept on the clipped tensors, how many)
AUTO_CANDIDATES = (*AUTO_ORDER, HYBRID)
# A later candidate must beat the best so far by more than this to be kept: below it the difference is
# float noise (cosines agreeing to 1e-7), not a better calibration, and the earlier one stays.
TIE = 1e-4


@dataclass(frozen=True)
class Candidate:
    """One calibrator's Q/DQ model scored on the held-out set."""

    method: str
    score: TaskScore
    seconds: float  # building and scoring this candidate (the shared statistics pass not included)

    def to_dict(self) -> dict[str, Any]:
        return {"calibrator": self.method, "value": self.score.value, "text": self.score.text,
                "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class Choice:
    """The calibrator used, its ranges, the Q/DQ model built from them and (scored) its held-out outputs."""

    method: str
    amax: dict[str, float]
    model: onnx.ModelProto
    outputs: list[dict[str, np.ndarray]] | None  # held-out outputs of ``model``; None when not scored
    candidates: tuple[Candidate, ...] = ()  # every candidate tried (auto), in AUTO_CANDIDATES' order
    untried: tuple[str, ...] = ()  # not scored: an earlier one already agreed with FP32 everywhere

    @property
    def auto(self) -> bool:
        return len(self.candidates) + len(self.untried) > 1

    def summary(self) -> str:
        """What was tried, what won and by how much: one line."""
        if not self.auto:
            return f"calibrator {self.method}"
        best = next(c for c in self.candidates if c.method == self.method)
        tried = ", ".join(f"{c.method} {c.score.value:.4f}" for c in self.candidates)
        if len(self.candidates) == 1:
            return (f"auto chose {self.method} ({best.score.text}): it agrees with FP32 on every held-out "
                    f"sample, so {', '.join(self.untried)} were not scored")
        runner_up = max((c for c in self.candidates if c.method != self.method),
                        key=lambda c: c.score.value)
        margin = best.score.value - runner_up.score.value
        return (f"auto chose {self.method} ({best.score.text}) by {margin:+.4f} over {runner_up.method}; "
                f"{best.score.metric} per calibrator: {tried}")

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.method, "candidates": [c.to_dict() for c in self.candidates],
                "not_scored": list(self.untried)}


def choose_calibrator(
    methods: Sequence[str],
    hists: Mapping[str, TensorHistogram],
    options: CalibOptions,
    build: Callable[[dict[str, float]], onnx.ModelProto],
    score: Callable[[onnx.ModelProto], tuple[TaskScore, list[dict[str, np.ndarray]]]] | None,
    progress: ProgressFn = no_progress,
    needed: Collection[str] | None = None,
    perfect: float | None = None,
) -> Choice:
    """Ranges for each of ``methods`` from the same histograms, each turned into a model by ``build``
    and scored by ``score`` (its held-out task metric and outputs); the highest score wins.

    ``needed``: the tensors ``build`` reads (the plan's Q/DQ sites). Candidates compute ranges for those
    only; the winner's are completed for every histogram (the implicit cache covers all activations),
    so each extra candidate costs its range searches over the Q/DQ tensors, not over every activation.
    With one method, or no ``score`` (nothing held out), the first method is used unscored.
    ``perfect``: the score of a candidate that agrees with FP32 on every held-out sample (1.0 for the
    built-in metrics); once one reaches it no later one can beat it, and the rest are not scored.
    """
    from dataclasses import replace

    from edgeq.quant.calibrate import ranges_from_histograms

    part = hists if needed is None else {t: h for t, h in hists.items() if t in set(needed)}
    computed: dict[str, dict[str, float]] = {}

    def ranges(spec: str) -> dict[str, float]:
        """A candidate's ranges over ``part``: a calibrator's, or a hybrid ``BASE+TOPk``'s."""
        if spec not in computed:
            if spec in HYBRIDS:
                base, method, k = HYBRIDS[spec]
                lo, hi = ranges(base), ranges(method)
                clipped = sorted(lo, key=lambda t: -(hi[t] / lo[t] if lo[t] > 0 else 0.0))[:k]
                computed[spec] = {**lo, **{t: hi[t] for t in clipped}}
            else:
                computed[spec] = ranges_from_histograms(part, replace(options, method=spec))
        return computed[spec]

    def complete(amax: dict[str, float], spec: str) -> dict[str, float]:
        """Ranges for every histogram (the cache's other activations by the spec's base calibrator)."""
        rest = {t: h for t, h in hists.items() if t not in amax}
        base = HYBRIDS[spec][0] if spec in HYBRIDS else spec
        return {**amax, **ranges_from_histograms(rest, replace(options, method=base))} if rest else amax

    if score is None or len(methods) == 1:
        amax = complete(ranges(methods[0]), methods[0])
        model = build(amax)
        outputs = score(model)[1] if score is not None else None
        return Choice(methods[0], amax, model, outputs)
    best: tuple[Candidate, dict[str, float], onnx.ModelProto, list[dict[str, np.ndarray]]] | None = None
    tried: list[Candidate] = []
    progress("auto: scoring calibrators", 0, len(methods))
    for i, method in enumerate(methods):
        t0 = time.perf_counter()
        amax = ranges(method)
        model = build(amax)
        result, outputs = score(model)
        cand = Candidate(method, result, time.perf_counter() - t0)
        tried.append(cand)
        if best is None or result.value > best[0].score.value + TIE:
            best = (cand, amax, model, outputs)
        progress("auto: scoring calibrators", i + 1, len(methods))
        if perfect is not None and result.value >= perfect:
            break
    assert best is not None
    untried = tuple(methods[len(tried):])
    return Choice(best[0].method, complete(best[1], best[0].method), best[2], best[3], tuple(tried), untried)


def scorer(metric: Metric, reference_outputs: list[dict[str, np.ndarray]], held: Any,
           providers: tuple[str, ...] | None, progress: ProgressFn = no_progress
           ) -> Callable[[onnx.ModelProto], tuple[TaskScore, list[dict[str, np.ndarray]]]]:
    """A candidate model's (task score, held-out outputs) against the FP32 reference outputs."""
    from edgeq.quant.accuracy import run_outputs

    def score(model: onnx.ModelProto) -> tuple[TaskScore, list[dict[str, np.ndarray]]]:
        outputs = run_outputs(model, held, providers=providers, progress=progress)
        return metric.score(reference_outputs, outputs), outputs

    return score
