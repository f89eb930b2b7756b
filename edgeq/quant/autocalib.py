"""``--calibrator auto``: every calibrator tried on the same statistics, the best kept by the task metric.

Why measure instead of picking one: no calibrator is best on trained models. Measured on four models
shipped as ONNX by packages on the index (a YOLOv8n detector, PP-OCRv4's text detector and recogniser,
a direction classifier): entropy kept 65% of the detector's FP32 detections where max kept 82%, and left
the recogniser reading nothing at all where percentile read 15 of 20 strings; percentile was the text
detector's best. Which one wins depends on the model's activation distributions, so the held-out task
metric decides.

Bounded cost: the histograms are collected once (the expensive pass, every activation of every
calibration sample) and each calibrator's ranges come from them for free (``ranges_from_histograms``);
the FP32 reference runs once on the held-out set; each candidate costs one Q/DQ model and one held-out
pass, cut short once it cannot win: with the built-in metrics, FP32's own outputs are the best any
candidate can give on a sample, so a candidate's figure with FP32's outputs standing in for the samples
it has not run yet bounds its final figure; once that bound is no better than the best so far (within
``TIE``) the rest of its samples are not run (the bound is checked after each of the first samples,
then after every quarter more: ``CHECK_EVERY``). Exact: the candidate kept is the one full scoring keeps.
The samples the best so far got least right run first (its per-sample figures, worst first): a
candidate that cannot win mostly loses there, so it is stopped after a few samples, not near the end.
Candidates are scored in ``AUTO_CANDIDATES``' order, the ones that won most often first (a high early
best cuts the rest short); a tie keeps the earlier one.

What the candidates are compared by: the metric's rank (``TaskScore.rank``), which folds in the metric's
dense form (label margin, boxes below the display threshold, per-step symbol probabilities:
``quant.metrics``), so on a few dozen samples the choice does not rest on one detection or one string.
Without ``--holdout`` the samples are the calibration samples themselves (``quantize.split_data``).
Where the samples cannot tell the kept one from the runner-up (``evidence``), the choice says so, with
how many samples would.

Per tensor where it pays (the hybrids): entropy's ranges except where a rule says clipping costs more
than it saves. ``ends``: the graph inputs and the inputs of the last quantized layer on each path to a
graph output keep max's range (``end_tensors``). Why: a graph input's range is set by preprocessing
(entropy clipped 7.5% of a detector's normalised pixels), and past the last quantized layer nothing
renormalises a clipped value: there the rare large activations are the answer (a detection's class
evidence, a confident logit), not noise in a histogram dominated by background. The same reason makes
low-bit work keep the first and last layers wider (DoReFa-Net, LSQ).
Measured (held-out task metric, 2 CPU cores; the bench's earlier, smaller sets): on nudenet's YOLOv8n
entropy clips the class-logit conv's input (amax 6.0 against max 16.5) and keeps 65% of FP32's
detections, max 82%, ``entropy+ends`` 88%; on PP-OCRv4's recogniser entropy reads nothing,
``entropy+ends+max16`` (ends plus the 16 tensors entropy clips hardest) reads 16 of 20 strings as FP32
does at CER 1.7%, the same count as INT8 weights with every activation float. On the larger sets that
replaced them (100 detector images, 65 lines) auto keeps 86% and reads 80% (docs/benchmarks.md's table).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeq.findings import ProgressFn, no_progress
from edgeq.quant.rounding import ADAROUND, NEAREST

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from edgeq.quant.calibrate import CalibOptions, TensorHistogram
    from edgeq.quant.metrics import Metric, TaskScore
    from edgeq.quant.plan import Plan
    from edgeq.quant.rounding import Rounding

    # a candidate's (score, held-out outputs, samples run when stopped) / the scorer, given the figure
    # to beat (None: run every sample) and the order to run the held-out samples in (None: as they are)
    Scored = tuple[TaskScore, list[dict[str, np.ndarray]] | None, int | None]
    Score = Callable[[onnx.ModelProto, float | None, Sequence[int] | None], Scored]

AUTO = "auto"


@dataclass(frozen=True)
class Hybrid:
    """Per tensor where it pays: ``base``'s ranges, ``kept``'s (no clipping) on the ends (``end_tensors``)
    when ``ends`` and on the ``top`` tensors ``base`` clips hardest (largest max |x| / ``base`` amax)."""

    base: str
    kept: str
    ends: bool
    top: int = 0


# The 16 hardest-clipped: PP-OCRv4's recogniser reads nothing under entropy because two of its tensors
# are clipped 3-10x (an Add, an SE-gated Mul); fewer than 16 misses one of them there (8: 1 of 20
# strings), more starts to cost resolution (24: 15 of 20, CER 2.3%, against 16 of 20, CER 1.7%).
HYBRID_TOP = 16
ENDS = "entropy+ends"
HYBRID = f"{ENDS}+max{HYBRID_TOP}"
HYBRIDS = {ENDS: Hybrid("entropy", "max", ends=True), HYBRID: Hybrid("entropy", "max", True, HYBRID_TOP)}
# What auto scores, in order: the winners first, since the first sets the figure the others must beat and
# runs every held-out sample while a later loser stops after a few (the order changes the cost, never
# the choice, except that a tie keeps the earlier). On the bench's seven trained models (2026-11-27):
# entropy+ends+max16 won the YOLOv8n detector and the PP-OCRv4 recogniser, percentile the ddddocr
# recogniser and the YOLOX detector (the classifier is a tie, kept by the first), mse the text detector
# (mask IoU 0.959 against percentile's 0.952) and the orientation classifier (39 of 40 against 38).
# Evaluated as the engine computes and ranked with the dense forms (2026-12-07): the same, except mse
# for the ddddocr recogniser (48 of 55 against percentile's 47) and entropy+ends+max16 for the classifier.
# Then entropy+ends, the hedge where max on the 16 costs resolution (it won the detector on the bench's
# earlier sets). Not entropy alone: it won none of the seven and read nothing on the recogniser; it is
# still the fallback below and ``--calibrator entropy``. Not max: it ranked below a hybrid or percentile
# on all seven (it keeps the detectors' detections by inventing more: 58 of 65 with 19 new, against
# auto's 56 with 13). Each candidate costs a held-out pass, cut short once it cannot win: auto took
# 1.06-1.79x one calibrator's wall time (the bench's ``auto's cost``, 2026-11-27), 1.6-2.8x on
# 2026-12-07 (single runs on a shared machine; not isolated: the dense forms may stop a loser later).
AUTO_CANDIDATES = (HYBRID, "percentile", "mse", ENDS)
# Without held-out samples nothing is scored: TensorRT's own calibrator.
AUTO_FALLBACK = "entropy"
# A candidate's bound is checked after each of its first samples, then once per this fraction of the
# samples run so far: each check scores the whole held-out set (O(n) per check, O(n^2) if every sample
# were checked: 3.4 s per candidate on 100 detector images, as much as running them), and a candidate
# that cannot win runs at most this fraction more samples than it needed.
CHECK_EVERY = 0.25
# A later candidate must beat the best so far by more than this to be kept: below it the difference is
# float noise (cosines agreeing to 1e-7), not a better calibration, and the earlier one stays.
TIE = 1e-4


def label(method: str, weights: str) -> str:
    """A candidate's name: the calibrator, and the weights' rounding where it is learned."""
    return method if weights == NEAREST else f"{method} + {weights} weights"


@dataclass(frozen=True)
class Candidate:
    """One calibrator's Q/DQ model scored on the held-out set."""

    method: str
    score: TaskScore  # stopped: the bound (FP32's outputs standing in for the samples not run)
    seconds: float  # building and scoring this candidate (the shared statistics pass not included)
    stopped: int | None = None  # samples run before it could no longer win; None: all of them
    weights: str = NEAREST  # the weights' rounding: nearest, or adaround (learned, edgeq.quant.rounding)

    @property
    def label(self) -> str:
        return label(self.method, self.weights)

    @property
    def text(self) -> str:
        if self.stopped is None:
            return self.score.text
        return (f"stopped after {self.stopped} held-out samples: at most {self.score.rank:.4f}, "
                "not above the best so far")

    def to_dict(self) -> dict[str, Any]:
        return {"calibrator": self.method, "weights": self.weights, "value": self.score.value,
                "rank": self.score.rank, "text": self.text, "seconds": round(self.seconds, 3),
                "stopped_after": self.stopped}


@dataclass(frozen=True)
class Choice:
    """The calibrator used, its ranges, the Q/DQ model built from them and (scored) its held-out outputs."""

    method: str
    amax: dict[str, float]
    model: onnx.ModelProto
    outputs: list[dict[str, np.ndarray]] | None  # held-out outputs of ``model``; None when not scored
    candidates: tuple[Candidate, ...] = ()  # every candidate tried (auto), in AUTO_CANDIDATES' order
    untried: tuple[str, ...] = ()  # not scored: an earlier one already agreed with FP32 everywhere
    observed: Mapping[str, float] = field(default_factory=dict)  # max |x| per tensor seen in calibration
    evidence: str = ""  # auto: why the samples cannot tell the kept one from the runner-up ("": they can)
    weights: str = NEAREST  # the weights' rounding in ``model``
    rounding: Rounding | None = None  # the learned rounding, also when scored and not kept (--weights auto)

    @property
    def auto(self) -> bool:
        return len(self.candidates) + len(self.untried) > 1

    @property
    def learned(self) -> dict[str, np.ndarray] | None:
        """The learned int8 weights ``model`` holds (``build_qdq``'s ``rounding``), None for nearest."""
        return self.rounding.values if self.weights == ADAROUND and self.rounding is not None else None

    @property
    def kept(self) -> Candidate:
        return next(c for c in self.candidates if c.method == self.method and c.weights == self.weights)

    def summary(self) -> str:
        """What was tried, by which metric, what won and by how much: one line."""
        if not self.auto:
            weights = f", {self.weights} weights" if self.weights != NEAREST else ""
            return f"calibrator {self.method}{weights}"
        best = self.kept
        tried = ", ".join(f"{c.label} {'<= ' if c.stopped is not None else ''}{c.score.rank:.4f}"
                          for c in self.candidates)
        if len(self.candidates) == 1:
            return (f"auto chose {best.label} by {best.score.metric} ({best.score.text}): it agrees with "
                    f"FP32 on every held-out sample, so {', '.join(self.untried)} were not scored")
        runner_up = max((c for c in self.candidates if c is not best), key=lambda c: c.score.rank)
        margin = best.score.rank - runner_up.score.rank
        by = f"by at least {margin:+.4f}" if runner_up.stopped is not None else f"by {margin:+.4f}"
        if margin <= TIE and runner_up.stopped is not None:
            by = f"at least level with {runner_up.label} (stopped once it could do no better)"
        elif margin <= TIE:  # level: kept for coming first, not for a better figure
            by = f"level with {runner_up.label} (a tie keeps the one scored first)"
        else:
            by += f" over {runner_up.label}"
        return (f"auto chose {best.label} by {best.score.metric} ({best.score.text}) {by}; "
                f"{best.score.metric} rank per candidate: {tried}")

    def to_dict(self) -> dict[str, Any]:
        best = self.kept if self.candidates else None
        return {"chosen": self.method, "weights": self.weights,
                "metric": best.score.metric if best is not None else None,
                "candidates": [c.to_dict() for c in self.candidates], "not_scored": list(self.untried),
                "thin_evidence": self.evidence or None}


def choose_calibrator(
    methods: Sequence[str],
    hists: Mapping[str, TensorHistogram],
    options: CalibOptions,
    build: Callable[[dict[str, float], str], onnx.ModelProto],
    score: Score | None,
    progress: ProgressFn = no_progress,
    needed: Collection[str] | None = None,
    perfect: float | None = None,
    ends: Collection[str] = (),
    weights: Sequence[str] = (NEAREST,),
) -> Choice:
    """Ranges for each of ``methods`` from the same histograms, each turned into a model by ``build``
    (given the ranges and the weights' rounding) and scored by ``score`` (its held-out task metric and
    outputs, or where it stopped because it could not beat the best so far); the highest score wins.

    ``weights``: the roundings each method is scored with, every method with the first, then every
    method with the next (``--weights auto``: nearest, then the learned rounding, which ``build`` learns
    on its first call: never, when a nearest candidate already agrees with FP32 everywhere). Which
    rounding helps depends on the ranges (on the bench's recogniser the learned rounding read 2 more
    strings than nearest under percentile and mse, 7-10 fewer under entropy+ends+max16), so each pair is
    a candidate of its own.

    ``needed``: the tensors ``build`` reads (the plan's Q/DQ sites). Candidates compute ranges for those
    only; the winner's are completed for every histogram (the implicit cache covers all activations),
    so each extra candidate costs its range searches over the Q/DQ tensors, not over every activation.
    With one method, or no ``score`` (nothing held out), the first method is used unscored.
    ``perfect``: the score of a candidate that agrees with FP32 on every held-out sample (1.0 for the
    built-in metrics); once one reaches it no later one can beat it, and the rest are not scored.
    ``ends``: the tensors the hybrids with ``ends`` never clip (``end_tensors`` of the plan).
    """
    from dataclasses import replace

    from edgeq.quant.calibrate import ranges_from_histograms

    part = hists if needed is None else {t: h for t, h in hists.items() if t in set(needed)}
    computed: dict[str, dict[str, float]] = {}

    def ranges(spec: str) -> dict[str, float]:
        """A candidate's ranges over ``part``: a calibrator's, or a hybrid's (``HYBRIDS``)."""
        if spec not in computed:
            if spec in HYBRIDS:
                h = HYBRIDS[spec]
                lo, hi = ranges(h.base), ranges(h.kept)
                clipped = sorted(lo, key=lambda t: -(hi[t] / lo[t] if lo[t] > 0 else 0.0))[:h.top]
                kept = {*clipped, *(t for t in ends if t in lo)} if h.ends else set(clipped)
                computed[spec] = {**lo, **{t: hi[t] for t in kept}}
            else:
                computed[spec] = ranges_from_histograms(part, replace(options, method=spec))
        return computed[spec]

    def complete(amax: dict[str, float], spec: str) -> dict[str, float]:
        """Ranges for every histogram (the cache's other activations by the spec's base calibrator)."""
        rest = {t: h for t, h in hists.items() if t not in amax}
        base = HYBRIDS[spec].base if spec in HYBRIDS else spec
        return {**amax, **ranges_from_histograms(rest, replace(options, method=base))} if rest else amax

    observed = {t: float(h.amax) for t, h in hists.items()}
    pairs = [(m, w) for w in weights for m in methods]
    if score is None or len(pairs) == 1:
        method, rounding = pairs[0]
        amax = complete(ranges(method), method)
        model = build(amax, rounding)
        outputs = score(model, None, None)[1] if score is not None else None
        return Choice(method, amax, model, outputs, observed=observed, weights=rounding)
    best: tuple[Candidate, dict[str, float], onnx.ModelProto, list[dict[str, np.ndarray]]] | None = None
    tried: list[Candidate] = []
    order: list[int] | None = None
    progress("auto: scoring calibrators", 0, len(pairs))
    for i, (method, rounding) in enumerate(pairs):
        t0 = time.perf_counter()
        amax = ranges(method)
        model = build(amax, rounding)
        beat = None if best is None else best[0].score.rank + TIE
        result, outputs, stopped = score(model, beat, order)
        cand = Candidate(method, result, time.perf_counter() - t0, stopped, rounding)
        tried.append(cand)
        if outputs is not None and (best is None or result.rank > best[0].score.rank + TIE):
            best = (cand, amax, model, outputs)
            ps = result.per_sample  # the samples it got least right run first for the next candidates
            order = sorted(range(len(ps)), key=ps.__getitem__) if len(ps) == len(outputs) else None
        progress("auto: scoring calibrators", i + 1, len(pairs))
        if perfect is not None and result.rank >= perfect:
            break
    assert best is not None
    untried = tuple(label(m, w) for m, w in pairs[len(tried):])
    return Choice(best[0].method, complete(best[1], best[0].method), best[2], best[3], tuple(tried), untried,
                  observed, evidence(best[0], tried), best[0].weights)


# Two candidates are told apart when the mean of their per-sample differences is at least this many
# standard errors (paired, over the samples scored): about 95% one-sided. Below it, and unless the
# interval (this many standard errors either side) is narrower than ``EVIDENCE_ALIKE`` (then they are
# alike for any purpose: a cosine 1e-4 apart), the choice is said to rest on thin evidence.
EVIDENCE_Z = 2.0
EVIDENCE_ALIKE = 0.01  # a point on the metric's 0..1 scale


def evidence(best: Candidate, tried: Sequence[Candidate]) -> str:
    """Why the samples cannot tell ``best`` from the runner-up (the other candidate ranked highest), and
    how many samples would (tell them apart at the difference seen, or show them alike); "" when they
    can, when they are alike, or when there is no runner-up. Paired over the samples, in the metric's
    rank (``TaskScore.rank_samples``: dense forms included); a candidate stopped early brings its bound's
    figures (FP32's outputs for the samples it did not run: that favours it, so thin evidence is never
    said for too little)."""
    import math

    others = [c for c in tried if c is not best]
    if not others:
        return ""
    runner = max(others, key=lambda c: c.score.rank)
    a, b = best.score.rank_samples, runner.score.rank_samples
    if len(a) != len(b) or len(a) < 2:
        return ""
    diffs = [x - y for x, y in zip(a, b)]
    n = len(diffs)
    mean = sum(diffs) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n)
    if EVIDENCE_Z * se < EVIDENCE_ALIKE or mean >= EVIDENCE_Z * se:
        return ""  # alike for any purpose, or told apart
    if -mean >= EVIDENCE_Z * se:  # the headline (a count over the set) and the samples disagree
        return (f"mixed evidence: {best.label} ranks first over the {n} samples, yet per sample "
                f"{runner.label} scores higher by {-mean:.4f} +- {EVIDENCE_Z * se:.4f} in "
                f"{best.score.metric}'s rank: a few samples decide the headline (--holdout DIR, or more "
                "--calib samples)")
    need = n * (EVIDENCE_Z * se / EVIDENCE_ALIKE) ** 2  # for the interval to show them alike
    if mean > 0:
        need = min(need, n * (EVIDENCE_Z * se / mean) ** 2)  # for the difference seen to stand
    return (f"thin evidence: on {n} samples {best.label} and {runner.label} differ by {mean:+.4f} +- "
            f"{EVIDENCE_Z * se:.4f} per sample in {best.score.metric}'s rank; about {math.ceil(need)} "
            "samples would tell them apart (--holdout DIR, or more --calib samples)")


def end_tensors(model: onnx.ModelProto, plan: Plan) -> frozenset[str]:
    """The plan's Q/DQ tensors at the ends of the network: graph inputs, graph outputs, and the inputs of
    the last quantized layer on each path to a graph output (a node that reads a Q/DQ tensor and reaches
    an output through float nodes only). Found by walking up from the outputs through float nodes; the
    walk stops at each quantized node, so one whose result passes through another quantized layer first
    is not an end (a backbone layer feeding a head), and the order of the nodes does not matter."""
    sites = {s.tensor: set(s.consumers) for s in plan.sites}
    quantized = {c for cs in sites.values() for c in cs}
    producer = {o: n for n in model.graph.node for o in n.output}
    inputs = {i.name for i in model.graph.input}
    ends = {t for t in sites if t in inputs}
    stack = [o.name for o in model.graph.output]
    ends.update(t for t in stack if t in sites)
    seen: set[str] = set()
    while stack:
        node = producer.get(stack.pop())
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.name in quantized:
            ends.update(t for t in node.input if node.name in sites.get(t, ()))
        else:
            stack.extend(t for t in node.input if t)
    return frozenset(ends)


def scorer(metric: Metric, reference_outputs: list[dict[str, np.ndarray]], held: Any,
           providers: tuple[str, ...] | None, progress: ProgressFn = no_progress, *, bounded: bool = False
           ) -> Score:
    """A candidate model's (task score, held-out outputs, None) against the FP32 reference outputs.

    Given ``beat`` and ``bounded`` (the metric scores FP32's own outputs best on every sample: the
    built-in ones), the run stops after the first checked sample where the candidate's figure with
    FP32's outputs standing in for the rest is ``<= beat``: then (that bound, None, samples run); checked
    after every sample at first, then once per ``CHECK_EVERY`` of the samples run so far. ``order``:
    the held-out samples' indices in the order to run them (None: as they are); the outputs come back
    in the held-out set's own order."""
    from edgeq.quant.accuracy import run_outputs

    total = len(reference_outputs)

    def score(model: onnx.ModelProto, beat: float | None, order: Sequence[int] | None) -> Scored:
        seq = list(order) if order is not None and sorted(order) == list(range(total)) else None
        bound: list[TaskScore] = []
        checked = [0]  # samples run at the last check

        def placed(outputs: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
            """The outputs so far at their samples' places, FP32's where not run yet."""
            if seq is None:
                return [*outputs, *reference_outputs[len(outputs):]]
            mixed = list(reference_outputs)
            for i, out in zip(seq, outputs):
                mixed[i] = out
            return mixed

        def stop(outputs: list[dict[str, np.ndarray]]) -> bool:
            n = len(outputs)
            if beat is None or not bounded or n >= total or n - checked[0] < max(1, int(n * CHECK_EVERY)):
                return False
            checked[0] = n
            bound[:] = [metric.score(reference_outputs, placed(outputs))]
            return bound[0].rank <= beat

        data = held if seq is None else reordered(held, seq)
        outputs = run_outputs(model, data, providers=providers, progress=progress, stop=stop)
        if len(outputs) < total:
            return bound[0], None, len(outputs)
        outputs = placed(outputs)
        return metric.score(reference_outputs, outputs), outputs, None

    return score


def reordered(data: Any, order: Sequence[int]) -> Any:
    """The held-out samples in ``order``: a ``CalibrationSet``'s index reordered (samples still read
    lazily), or a list of feeds."""
    if hasattr(data, "subset"):
        return data.subset(order)
    items = list(data)
    return [items[i] for i in order]
