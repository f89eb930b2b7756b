"""The engine's accuracy on the target: TensorRT's own outputs on the held-out inputs, scored against FP32
with the same metric as the host's check, beside what onnxruntime predicted for the Q/DQ model.

Why on the target: onnxruntime computes the arithmetic the Q/DQ nodes define, but TensorRT's INT8 kernels
are not onnxruntime's (other fusions, rounding, accumulation, FP16 fallbacks), so the figure that counts
is the engine's. The host runs FP32 once (``quant.accuracy.HeldOut``: the reference and the metric, as
the quantize check has them) and the Q/DQ model (the prediction) in onnxruntime, ships the held-out inputs
to the target as one ``.npz`` (samples stacked per input, in one group per shape: ``group_by_shape``), the
agent's ``infer`` runs the engine on each, each group at its own ``--shapes``, and returns its outputs (one
``.npz``, put back in the samples' order), and both candidates are scored with the one metric.

The held-out set is the quantize check's: ``--holdout DIR``, else ``--calib`` (or the slice ``--holdout F``
keeps out of it), narrowed
on the host before any SSH to the samples within the engine's optimization profile (``in_profile``: a
model with dynamic inputs runs only at shapes between its ``--minShapes`` and ``--maxShapes``, which by
default span the calibration and held-out data: ``pipeline.shapes``); the record says how many of how many
ran, and no sample within the profile is a usage error. The stage runs
with ``--holdout DIR`` or when the accuracy gate is asked for. The verdict: ``--min-metric`` bounds
TensorRT's task figure, ``--min-cosine`` its cosine. Without them a result far below FP32
(``quant.accuracy.FAR_BELOW``: the quantize check's wrecked model) fails, gated or not (``--min-metric 0``
accepts it on purpose), and ``--gate accuracy`` also fails one more than ``tolerance``
(``PREDICTION_TOLERANCE``, or one unit of the headline) below onnxruntime's prediction; ungated, that is
a warning.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from edgeq.errors import QuantError, RemoteError
from edgeq.quant.metrics import CosineMetric, Outputs, TaskScore
from edgeq.text import number, plain

if TYPE_CHECKING:
    import onnx

    from edgeq.pipeline.rundir import AgentFn
    from edgeq.pipeline.shapes import Shapes
    from edgeq.quant.quantize import QuantizeOptions
    from edgeq.remote.runner import Runner
    from edgeq.remote.targets import Target

# How far (on the metric's 0..1 scale, FP32 = 1.0) TensorRT may score below onnxruntime's prediction for
# the Q/DQ model before ``--gate accuracy`` fails and an ungated run warns: this, or one whole unit of the
# headline where that is more (``TaskScore.unit``: a label, a detection, a string). Measured on an H100
# (TensorRT 8.6.0, 2026-12-07; tests/fixtures/trt86-h100-arith): TensorRT kept 54 of FP32's 65 detections
# where onnxruntime predicted 55, and 39 of 40 labels where it predicted 38, while onnxruntime's own three
# arithmetics (Q/DQ fused, unfused, literal) each gave TensorRT's answer on 97 of 100 images and 39-40 of
# 40 pages: one unit is the rounding ties two correct INT8 implementations break differently.
PREDICTION_TOLERANCE = 0.01

# TensorRT's outputs against onnxruntime's Q/DQ outputs on the same inputs (cosine, ``EngineAccuracy.
# agreement``): below this, TensorRT did not compute what the Q/DQ graph defines. Both run the graph's
# INT8 arithmetic; TensorRT's other fusions, accumulation order and FP16 fallbacks move its outputs far
# less (an engine that works scores above 0.99). So the cause is the engine or the way it was run (inputs
# fed or outputs read wrongly), not the quantization: the user checks TensorRT alone before recalibrating.
MISMATCH_COSINE = 0.9


@dataclass(frozen=True)
class HeldOutSet:
    """The held-out samples the engine runs on, and where they came from (said in the report)."""

    data: Any  # CalibrationSet
    source: str
    total: int = 0  # held-out samples before ``in_profile`` left some out (0: none left out)
    not_run: str = ""  # "N of M held-out samples within the engine's profile ...; the other ... not run"


def wants_target_check(options: QuantizeOptions, gate: bool) -> bool:
    """The engine is run on the held-out set with ``--holdout DIR``, or when the accuracy gate is asked."""
    return options.holdout_data is not None or gate or options.gated


def holdout_for(model: onnx.ModelProto, options: QuantizeOptions, gate: bool, shapes: Optional[Shapes] = None
                ) -> Optional[HeldOutSet]:  # fmt: skip
    """The quantize check's held-out set for ``model`` (``--holdout DIR``, else the slice of ``--calib``),
    indexed and checked against its inputs before any work, and narrowed to the engine's optimization
    profile when ``shapes`` (the deploy's resolved profile) has one; None when the target check is not wanted.
    A usage error when the accuracy gate is asked for and there is nothing to hold out."""
    held = _holdout(model, options, gate)
    return in_profile(held, shapes) if held is not None and shapes is not None else held


def _holdout(model: onnx.ModelProto, options: QuantizeOptions, gate: bool) -> Optional[HeldOutSet]:
    from edgeq.quant.quantize import calibration_data, held_source, split_data

    if not wants_target_check(options, gate):
        return None
    if options.holdout_data is not None:
        from edgeq.quant.data import calibration_set

        separate = calibration_set(model, options.holdout_data, preprocess=options.preprocess)
        return HeldOutSet(separate, f"--holdout {options.holdout_data}")
    what = "--gate accuracy" if gate else "--min-metric" if options.min_metric is not None else "--min-cosine"
    if not options.has_data:
        raise QuantError(f"{what} needs held-out samples for the engine to run on",
                         hint="give --holdout DIR (or --calib, whose held-out slice is used)")
    _, held, _ = split_data(calibration_data(model, options), options, model)
    if held is None or not len(held):
        raise QuantError(f"{what} needs held-out samples: --calib has too few to hold any out",
                         hint="give --holdout DIR, or at least 2 samples and a --holdout fraction above 0")
    return HeldOutSet(held, held_source(options))


SHAPES_SHOWN = 3  # the left-out samples' shapes a message names, the rest counted


def in_profile(held: HeldOutSet, shapes: Shapes) -> HeldOutSet:
    """``held`` narrowed to the samples whose dynamic inputs lie within the engine's optimization profile
    (every dimension between ``--minShapes`` and ``--maxShapes``; static inputs were checked when the set
    was indexed), with what was left out said in ``not_run``; ``held`` itself when every sample fits or
    the model is static.

    Why: the agent's ``infer`` runs each sample at its own shape (``group_by_shape``), which TensorRT
    takes only inside the profile the engine was built with. Scoring the rest as if they were the whole
    set would mislead; none left is a usage error."""
    from edgeq.agent.shapes import format_shapes, parse_shapes
    from edgeq.pipeline.shapes import within

    lo, hi = dict(parse_shapes(shapes.min, "minShapes")), dict(parse_shapes(shapes.max, "maxShapes"))
    if not hi:
        return held
    keep: list[int] = []
    others: Counter[str] = Counter()
    for i, sample in enumerate(held.data.shapes()):  # array files: their headers, no data read
        got = {name: tuple(int(d) for d in sample[name]) for name in hi}
        if all(within(got[n], lo[n], hi[n]) for n in hi):
            keep.append(i)
        else:
            others[format_shapes(got)] += 1
    total = len(keep) + sum(others.values())
    if not others:
        return held
    theirs = [s for s, _ in others.most_common()]
    seen = ", ".join(theirs[:SHAPES_SHOWN]) + (f" and {len(theirs) - SHAPES_SHOWN} more"
                                               if len(theirs) > SHAPES_SHOWN else "")  # fmt: skip
    where = (f"at the engine's shape {shapes.opt}" if shapes.min == shapes.max
             else f"within the engine's profile (--minShapes {shapes.min}, --maxShapes {shapes.max})")
    if not keep:
        raise QuantError(f"none of the {total} held-out samples ({held.source}) is {where} (from "
                         f"{shapes.source}), the shapes it runs at: theirs are {seen}",
                         hint="give held-out samples within the profile, or leave --minShapes/--maxShapes "
                              "out for one that spans the calibration and held-out data")  # fmt: skip
    said = (f"{len(keep)} of {total} held-out samples {where}; the other {total - len(keep)} (shapes {seen}) "
            "not run")
    return replace(held, data=held.data.subset(keep), total=total, not_run=said)


def group_by_shape(feeds: Sequence[Outputs], names: Sequence[str]) -> list[list[int]]:
    """The samples' indices grouped by the shapes of the inputs ``names`` (the engine's dynamic ones), in
    order of each shape's first sample: one group per shape the engine runs at (one for a static model).
    Why: samples of two shapes cannot be stacked, and the engine is set to a shape once per group."""
    groups: dict[tuple[tuple[int, ...], ...], list[int]] = {}
    for i, feed in enumerate(feeds):
        key = tuple(tuple(int(d) for d in feed[n].shape) for n in names)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def group_shapes(feeds: Sequence[Outputs], groups: Sequence[Sequence[int]], names: Sequence[str]
                 ) -> list[str]:  # fmt: skip
    """Each group's ``--shapes`` (trtexec syntax): its samples' shapes of the dynamic inputs ``names``;
    empty for a static model (no dynamic input to set)."""
    from edgeq.agent.shapes import format_shapes

    if not names:
        return []
    return [format_shapes([(n, feeds[g[0]][n].shape) for n in names]) for g in groups]


Groups = Optional[Sequence[Sequence[int]]]  # held-out sample indices per shape (``group_by_shape``)


def pack_inputs(feeds: Sequence[Outputs], path: Path, groups: Groups = None) -> Path:
    """The held-out inputs as the agent reads them: one ``.npz``, per group (``group_by_shape``; None: all
    samples, one group) one array per input, its samples stacked on a new axis 0 (each sample in the
    model's own input shape, its batch dimension included), named ``<group>/<input>`` when there are
    several groups (``agent.infer.load_groups``). Samples of two shapes in one group are edgeq's bug: a
    RuntimeError, nothing written."""
    import numpy as np

    from edgeq.agent.infer import array_key
    from edgeq.fs import atomic_path

    groups = [list(range(len(feeds)))] if groups is None else [list(g) for g in groups]
    names = list(feeds[0]) if feeds else []
    arrays: dict[str, Any] = {}
    for k, group in enumerate(groups):
        members = [feeds[i] for i in group]
        for n in names:
            found = sorted({tuple(np.shape(f[n])) for f in members})
            if len(found) > 1:
                shown = ", ".join("x".join(map(str, s)) for s in found)
                raise RuntimeError(f"edgeq bug: held-out samples of {len(found)} shapes for input '{n}' "
                                   f"reached one group of the engine's inputs ({shown}); a group runs at one "
                                   "shape; please report it")  # a bug keeps its traceback (graph.verify's)
            arrays[array_key(k, n, len(groups))] = np.stack([np.ascontiguousarray(f[n]) for f in members])
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    return path


def unpack_outputs(path: Path, reference: Sequence[Outputs], groups: Groups = None) -> list[dict[str, Any]]:
    """The engine's outputs per sample, in the held-out set's order (``groups`` as ``pack_inputs`` had
    them), each output in the reference's dtype (trtexec's JSON has none); a missing output or sample
    count is a ``RemoteError`` naming it."""
    import numpy as np

    from edgeq.agent.infer import array_key

    groups = [list(range(len(reference)))] if groups is None else [list(g) for g in groups]
    with np.load(path) as z:
        stacked = {k: z[k] for k in z.files}
    out: list[Optional[dict[str, Any]]] = [None] * len(reference)
    for k, group in enumerate(groups):
        for name in reference[group[0]] if group else ():
            key = array_key(k, name, len(groups))
            if key not in stacked:
                raise RemoteError(f"the engine's outputs have no '{key}' (it returned "
                                  f"{', '.join(sorted(stacked)) or 'none'})", exit_code=1)  # fmt: skip
            if stacked[key].shape[0] != len(group):
                raise RemoteError(f"the engine returned {stacked[key].shape[0]} samples of '{key}' for "
                                  f"{len(group)} held-out inputs", exit_code=1)  # fmt: skip
        for j, i in enumerate(group):
            out[i] = {name: stacked[array_key(k, name, len(groups))][j]
                      .astype(np.asarray(value).dtype, copy=False)
                      for name, value in reference[i].items()}  # fmt: skip
    return [o if o is not None else {} for o in out]


@dataclass(frozen=True)
class EngineAccuracy:
    """TensorRT's outputs and onnxruntime's Q/DQ prediction, each scored against FP32 on the same inputs.

    ``engine`` / ``predicted``: the task metric; ``engine_cosine`` / ``predicted_cosine``: the cosine
    check beside it; ``predicted`` None when there is no Q/DQ model (FP16 or implicit INT8 engines).
    ``agreement``: TensorRT's outputs against onnxruntime's Q/DQ ones directly (cosine), with
    ``max_abs_diff`` between them: how far TensorRT's kernels are from what onnxruntime predicted.
    """

    samples: int
    metric: str
    why: str  # why this metric: "--metric X", or what --metric auto recognised
    engine: TaskScore
    engine_cosine: TaskScore
    predicted: Optional[TaskScore] = None
    predicted_cosine: Optional[TaskScore] = None
    min_metric: Optional[float] = None
    min_cosine: Optional[float] = None
    gated: bool = False
    agreement: Optional[TaskScore] = None
    max_abs_diff: Optional[float] = None
    source: str = ""  # where the held-out samples came from
    total: int = 0  # the held-out set's samples, those outside the engine's profile included (0: all ran)
    not_run: str = ""  # which were not run, said whole (``HeldOutSet.not_run``), or ""
    fp32: str = ""  # what the figures' FP32 is (``AccuracyPlan.fp32``)

    def held_text(self) -> str:
        """The samples the figures are over: "N held-out samples", or N of M and the shapes not run."""
        return self.not_run or f"{self.samples} held-out samples"

    @property
    def shortfall(self) -> Optional[float]:
        """How far TensorRT's figure falls below onnxruntime's prediction (negative: above it)."""
        return None if self.predicted is None else self.predicted.value - self.engine.value

    @property
    def tolerance(self) -> float:
        """How far below the prediction still passes: ``PREDICTION_TOLERANCE`` or one unit of the headline."""
        unit = self.predicted.unit if self.predicted is not None else 0.0
        return max(PREDICTION_TOLERANCE, unit + 1e-9)  # one whole unit, not a rounding hair above it

    @property
    def below_prediction(self) -> bool:
        s = self.shortfall
        return s is not None and s > self.tolerance

    @property
    def far_below_fp32(self) -> bool:
        """The quantize check's "far below FP32" (``FAR_BELOW``), for TensorRT's own figures."""
        return self._far_below() is not None

    def _far_below(self) -> Optional[tuple[str, float, float]]:
        from edgeq.quant.accuracy import far_below_fp32

        return far_below_fp32(self.metric, self.engine.value, self.engine_cosine.value)

    @property
    def mismatch(self) -> bool:
        """TensorRT's outputs are not the Q/DQ model's (``MISMATCH_COSINE``): a fault to look for in the
        engine or its run, not an accuracy loss. Said beside the verdict; the verdict itself is unchanged."""
        return self.agreement is not None and self.agreement.value < MISMATCH_COSINE

    def diagnosis(self) -> Optional[str]:
        """What a mismatch means and how to tell the engine from the run apart (None without one)."""
        if not self.mismatch:
            return None
        assert self.agreement is not None
        return (f"TensorRT's outputs do not follow onnxruntime's Q/DQ prediction: cosine "
                f"{self.agreement.value:.4f} between them on the same inputs "
                f"(under {plain(MISMATCH_COSINE)}; "
                "INT8 kernels that only round differently stay above 0.99), so the engine computed "
                "something else or was fed or read wrongly - not a quantization loss; check TensorRT alone: "
                "polygraphy run <the Q/DQ .onnx the engine was built from> --onnxrt --trt --int8 --fp16")

    @property
    def far_below(self) -> bool:
        """Far below FP32 (a failure without bounds of the user's) or below the prediction (a warning
        ungated, a failure under ``--gate accuracy`` without thresholds)."""
        return self.far_below_fp32 or self.below_prediction

    def problems(self) -> list[str]:
        """Why TensorRT's result is far below, one phrase each (empty when it is not)."""
        out = []
        far = self._far_below()
        if far is not None:
            by, figure, level = far
            out.append(f"TensorRT's {by} {figure:.4f} is far below FP32 (under {plain(level)}; "
                       "--min-metric 0 accepts it)")
        if self.below_prediction:
            assert self.predicted is not None and self.shortfall is not None
            out.append(f"TensorRT's {self.metric} {self.engine.value:.4f} is {self.shortfall:.4f} below "
                       f"onnxruntime's prediction {self.predicted.value:.4f} "
                       f"(tolerance {plain(round(self.tolerance, 4))})")
        return out

    def failures(self) -> list[str]:
        """What fails, one phrase each (empty: passes). A result far below FP32 (``FAR_BELOW``) fails
        unless the user bounds the figures (``--min-metric``, ``--min-cosine``); below the prediction
        fails under ``--gate accuracy`` only."""
        bounded = self.min_metric is not None or self.min_cosine is not None
        if not self.gated:
            far = self._far_below()
            return self.problems()[:1] if far is not None and not bounded else []
        out = []
        if self.min_metric is not None and self.engine.value < self.min_metric:
            out.append(f"TensorRT's {self.metric} {self.engine.value:.4f} is below "
                       f"--min-metric {plain(self.min_metric)}")
        if self.min_cosine is not None and self.engine_cosine.value < self.min_cosine:
            out.append(f"TensorRT's cosine {self.engine_cosine.value:.4f} is below "
                       f"--min-cosine {plain(self.min_cosine)}")
        if self.min_metric is None and self.min_cosine is None:
            out += self.problems()
        return out

    @property
    def passed(self) -> bool:
        return not self.failures()

    def __bool__(self) -> bool:
        return self.passed

    def figures(self) -> str:
        """TensorRT's figures, onnxruntime's prediction beside each."""
        def pair(got: TaskScore, want: Optional[TaskScore]) -> str:
            return got.text + (f" (onnxruntime Q/DQ: {want.text})" if want is not None else "")

        said = [pair(self.engine, self.predicted)]
        if self.metric != "cosine":
            said.append(pair(self.engine_cosine, self.predicted_cosine))
        return "; ".join(said)

    def agreement_text(self) -> str:
        """TensorRT against onnxruntime's Q/DQ outputs directly, at full precision."""
        if self.agreement is None or self.predicted is None:
            return "no Q/DQ model: no onnxruntime prediction"
        return (f"cosine {self.agreement.value:.6f}, max |difference| {number(self.max_abs_diff or 0.0)}; "
                f"{self.metric} {self.engine.value:.6f} vs {self.predicted.value:.6f} predicted")

    def summary(self) -> str:
        """One line: the verdict, TensorRT's figures beside the prediction, the held-out count, and a
        mismatch with the prediction when there is one (``mismatch``)."""
        text = f"{self.figures()} over {self.held_text()}"
        note = ""
        if self.mismatch:
            assert self.agreement is not None
            note = (f" - TensorRT's outputs do not follow onnxruntime's Q/DQ prediction (cosine "
                    f"{self.agreement.value:.4f} between them, under {plain(MISMATCH_COSINE)})")
        fails = self.failures()
        if fails:
            return f"accuracy FAILED: {'; '.join(fails)} ({text}){note}"
        if not self.gated:
            problems = self.problems()
            return f"accuracy: {text}" + (f" - WARNING: {'; '.join(problems)}" if problems else "") + note
        bounds = [f"--min-metric {plain(self.min_metric)}" if self.min_metric is not None else "",
                  f"--min-cosine {plain(self.min_cosine)}" if self.min_cosine is not None else ""]
        within = f"not far below FP32, within {plain(round(self.tolerance, 4))} of onnxruntime's prediction"
        bound = ", ".join(b for b in bounds if b) or within
        return f"accuracy passed ({bound}): {text}{note}"

    def to_dict(self) -> dict[str, Any]:
        def score(s: Optional[TaskScore]) -> Optional[dict[str, Any]]:
            return s.to_dict() if s is not None else None

        return {"samples": self.samples, "held_out": self.source, "metric": self.metric, "why": self.why,
                "held_out_total": self.total or self.samples, "not_run": self.not_run or None,
                "fp32": self.fp32 or None,
                "tensorrt": score(self.engine), "tensorrt_cosine": score(self.engine_cosine),
                "onnxruntime_qdq": score(self.predicted),
                "onnxruntime_qdq_cosine": score(self.predicted_cosine),
                "shortfall": self.shortfall, "tolerance": self.tolerance,
                "tensorrt_vs_onnxruntime_qdq": score(self.agreement), "max_abs_diff": self.max_abs_diff,
                "far_below_fp32": self.far_below_fp32, "mismatch": self.mismatch,
                "mismatch_cosine": MISMATCH_COSINE, "diagnosis": self.diagnosis(),
                "min_metric": self.min_metric, "min_cosine": self.min_cosine, "gated": self.gated,
                "passed": self.passed, "failures": self.failures(), "summary": self.summary()}  # fmt: skip


@dataclass(frozen=True)
class AccuracyPlan:
    """What the accuracy stage runs: the held-out set, the FP32 reference model, the Q/DQ model whose
    onnxruntime outputs are the prediction (None: no Q/DQ model), the metric and the verdict's bounds."""

    held: HeldOutSet
    reference: Any  # onnx.ModelProto, FP32
    predicted: Any  # onnx.ModelProto with Q/DQ, or None
    metric: str = "auto"
    min_metric: Optional[float] = None
    min_cosine: Optional[float] = None
    gate: bool = False  # --gate accuracy
    providers: Optional[tuple[str, ...]] = None
    fp32: str = ""  # what ``reference`` is, for the record (the float model, or a Q/DQ model's float graph)

    @property
    def gated(self) -> bool:
        return self.gate or self.min_metric is not None or self.min_cosine is not None


def plan_for(prepared: Any, holdout: HeldOutSet, options: QuantizeOptions, gate: bool) -> AccuracyPlan:
    """The accuracy stage's plan for the engine ``prepared`` (``pipeline.stages.Prepared``) builds: a model
    quantized here is scored against the cleaned float model it came from; a Q/DQ model handed in against
    its float graph (``without_qdq``); a float model (FP16 or implicit INT8 engine) against itself, with no
    onnxruntime prediction (there is no Q/DQ model to run)."""
    if prepared.reference is not None:
        reference, fp32 = prepared.reference, "the float model the Q/DQ model was quantized from"
    elif prepared.qdq:
        from edgeq.graph.verify import without_qdq

        reference = without_qdq(prepared.model)
        fp32 = "the Q/DQ model's float graph (activation Q/DQ removed, weights dequantized)"
    else:
        reference, fp32 = prepared.model, "the float model itself"
    return AccuracyPlan(holdout, reference, prepared.model if prepared.qdq else None, metric=options.metric,
                        min_metric=options.min_metric, min_cosine=options.min_cosine, gate=gate,
                        providers=options.providers, fp32=fp32)  # fmt: skip


def settings(options: QuantizeOptions, gate: bool) -> dict[str, Any]:
    """What the accuracy verdict depends on (a fleet board's resume key): empty when no check runs."""
    if not wants_target_check(options, gate):
        return {}
    return {"accuracy": {"holdout": str(options.holdout_data or options.holdout), "metric": options.metric,
                         "min_metric": options.min_metric, "min_cosine": options.min_cosine, "gate": gate}}


def score(held: Any, engine: Sequence[Outputs], predicted: Optional[Sequence[Outputs]], plan: AccuracyPlan
          ) -> EngineAccuracy:
    """TensorRT's outputs (and onnxruntime's Q/DQ ones, when there is a Q/DQ model) scored against the
    FP32 reference of ``held`` (a ``quant.accuracy.HeldOut``) with its metric, and with cosine."""
    import numpy as np

    reference = held.outputs
    cos = CosineMetric()
    diff = None
    if predicted is not None:
        diffs = [float(np.max(np.abs(np.asarray(e[n], np.float64) - np.asarray(p[n], np.float64))))
                 for e, p in zip(engine, predicted) for n in p if np.size(p[n])]  # fmt: skip
        diff = max(diffs, default=0.0)
    return EngineAccuracy(
        samples=len(reference), metric=held.metric.name, why=held.why,
        engine=held.score(list(engine)), engine_cosine=cos.score(reference, engine),
        predicted=held.score(list(predicted)) if predicted is not None else None,
        predicted_cosine=cos.score(reference, predicted) if predicted is not None else None,
        min_metric=plan.min_metric, min_cosine=plan.min_cosine, gated=plan.gated,
        agreement=cos.score(predicted, engine) if predicted is not None else None, max_abs_diff=diff,
        source=held.source, total=plan.held.total, not_run=plan.held.not_run, fp32=plan.fp32,
    )  # fmt: skip


INPUTS_NPZ = "holdout-inputs.npz"  # in the run directory: what was shipped
OUTPUTS_NPZ = "engine-outputs.npz"  # in the run directory: what the engine returned
ACCURACY_JSON = "accuracy.json"
INFER_SECONDS_PER_SAMPLE = 30  # the host's allowance per sample (trtexec loads the engine for each)


def measure(
    runner: Runner,
    agent: AgentFn,
    target: Target,
    engine_remote: str,
    remote_run: str,
    plan: AccuracyPlan,
    run_dir: Path,
    extra_args: Sequence[str] = (),
    shapes: Optional[Shapes] = None,
) -> EngineAccuracy:
    """FP32 and the Q/DQ model in onnxruntime, the engine through the agent's ``infer``, all on the same
    held-out inputs, each sample at its own shape (``shapes``: the engine's profile, whose inputs are the
    dynamic ones); the score, also written to ``accuracy.json``."""
    from edgeq.agent.shapes import parse_shapes
    from edgeq.pipeline.rundir import write_json
    from edgeq.quant.accuracy import held_out_reference, run_outputs

    feeds = list(plan.held.data)
    held = held_out_reference(plan.reference, feeds, metric=plan.metric, source=plan.held.source,
                              providers=plan.providers)  # fmt: skip
    predicted = (run_outputs(plan.predicted, feeds, providers=plan.providers,
                             what="the Q/DQ model on the held-out set")
                 if plan.predicted is not None else None)  # fmt: skip
    dynamic = [name for name, _ in parse_shapes(shapes.opt if shapes is not None else "", "optShapes")]
    groups = group_by_shape(feeds, dynamic)
    shipped = pack_inputs(feeds, Path(run_dir) / INPUTS_NPZ, groups)
    up = runner.put(shipped, target.remote_path("cache"))
    out_remote = f"{remote_run}/{OUTPUTS_NPZ}"
    t = target.timeouts
    per_group = [f"--shapes={s}" for s in group_shapes(feeds, groups, dynamic)]
    agent("infer", f"--loadEngine={engine_remote}", f"--loadInputs={up.remote_path}",
          f"--exportOutput={out_remote}", *extra_args, *per_group, f"--timeout={t.profile:g}",
          timeout=t.profile + 60 + INFER_SECONDS_PER_SAMPLE * len(feeds))  # fmt: skip
    runner.get(out_remote, Path(run_dir) / OUTPUTS_NPZ)
    engine = unpack_outputs(Path(run_dir) / OUTPUTS_NPZ, held.outputs, groups)
    result = score(held, engine, predicted, plan)
    write_json(Path(run_dir) / ACCURACY_JSON, result.to_dict())
    return result


def read_accuracy(run_dir: Path) -> Optional[EngineAccuracy]:
    """A run directory's ``accuracy.json`` (None when the run measured none)."""
    import json

    path = Path(run_dir) / ACCURACY_JSON
    if not path.is_file():
        return None
    return accuracy_from_dict(json.loads(path.read_text(encoding="utf-8")))


def accuracy_html(acc: EngineAccuracy) -> str:
    """The report page's section: TensorRT's figures beside onnxruntime's prediction, worst samples."""
    from edgeq.report.render import esc

    cls = "info" if not acc.gated else ("pass" if acc.passed else "fail")
    rows = []
    pairs = [(acc.engine, acc.predicted)] + ([] if acc.metric == "cosine" else
                                             [(acc.engine_cosine, acc.predicted_cosine)])  # fmt: skip
    for got, want in pairs:
        worst = f"#{got.worst[0]}: {got.worst[1]:.4f}" if got.worst is not None else "-"
        rows.append(f"<tr><td>{esc(got.metric)}</td><td>{esc(got.text)}</td>"
                    f"<td>{esc(want.text) if want is not None else '-'}</td><td>{worst}</td></tr>")
    if acc.agreement is not None:
        rows.append("<tr><td>TensorRT vs onnxruntime Q/DQ</td>"
                    f"<td colspan=\"2\">{esc(acc.agreement_text())}</td><td>-</td></tr>")
    return (f"<h2>Accuracy on the target</h2><div class=\"verdict {cls}\">{esc(acc.summary())}</div>"
            f"<div class=\"muted\">{esc(acc.held_text())} ({esc(acc.source)}); metric "
            f"{esc(acc.metric)} ({esc(acc.why)})" + (f"; FP32: {esc(acc.fp32)}" if acc.fp32 else "") +
            "</div><table><tr><th>metric</th><th>TensorRT vs FP32</th><th>onnxruntime Q/DQ vs FP32</th>"
            f"<th>TensorRT's worst sample</th></tr>{''.join(rows)}</table>")


def accuracy_from_dict(d: dict[str, Any]) -> EngineAccuracy:
    """An ``EngineAccuracy`` back from its ``to_dict`` (a run directory's ``accuracy.json``)."""
    def ts(x: Optional[dict[str, Any]]) -> Optional[TaskScore]:
        if x is None:
            return None
        per_sample = tuple(x.get("per_sample") or ())
        return TaskScore(x["metric"], x["value"], x["text"], x.get("figures") or {}, per_sample)

    engine, cosine = ts(d["tensorrt"]), ts(d["tensorrt_cosine"])
    assert engine is not None and cosine is not None
    return EngineAccuracy(d["samples"], d["metric"], d["why"], engine, cosine, ts(d.get("onnxruntime_qdq")),
                          ts(d.get("onnxruntime_qdq_cosine")), d.get("min_metric"), d.get("min_cosine"),
                          bool(d.get("gated")), ts(d.get("tensorrt_vs_onnxruntime_qdq")),
                          d.get("max_abs_diff"), d.get("held_out") or "",
                          (d.get("held_out_total") or 0) if d.get("not_run") else 0,
                          d.get("not_run") or "", d.get("fp32") or "")  # fmt: skip
