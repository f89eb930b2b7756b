"""Host-side accuracy check: the FP32 model against its Q/DQ model in onnxruntime, on held-out data.

Why onnxruntime and not the engine: it runs anywhere, before any target is involved. Every model judged
here runs in the one session ``quant.evaluate`` builds: the arithmetic the Q/DQ nodes define, the same
on every host, not onnxruntime's fused integer kernels. A result is a value: true when it passes its
gate, and it names the figure that decided (as Polygraphy's comparator results do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeq.errors import QuantError, first_line
from edgeq.findings import ProgressFn, no_progress
from edgeq.text import plural

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnxruntime as ort

    from edgeq.quant.metrics import Metric, TaskScore


@dataclass(frozen=True)
class OutputAccuracy:
    """One output over the held-out samples.

    ``cosine``: mean over samples of the per-sample cosine similarity; ``min_cosine``: the worst
    sample's; ``top1``: argmax agreement over rows for 2-D (N, classes) outputs, else None.
    """

    name: str
    cosine: float
    min_cosine: float
    max_abs_error: float
    top1: float | None
    worst_sample: int = 0  # index into the held-out set of the sample with ``min_cosine``

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cosine": self.cosine, "min_cosine": self.min_cosine,
                "worst_sample": self.worst_sample, "max_abs_error": self.max_abs_error,
                "top1_agreement": self.top1}


# "Far below FP32": a result under its metric's level here is a wrecked model, a failed check by default
# (exit 1 in quantize, deploy, fleet and pipelines) unless the user gives a bound of their own
# (``--min-metric``, ``--min-cosine``: ``--min-metric 0`` accepts it on purpose). Each level is where the
# task the model is deployed for is plainly gone, not where it is merely worse than it could be (the
# accuracy bench's calibrators range from 72% to 95% of a detector's detections; ``auto`` keeps 86%):
# - classification, top-1 labels as FP32 gives them: under 80% (MobileNetV2 keeping 65 of 120 is
#   wrecked; the bench's classifiers keep 98% and 97.5%);
# - detection, FP32's detections kept: under half (a PicoDet keeping 22.5% of FP32's boxes is wrecked;
#   the bench's YOLOv8n keeps 72-89% under every calibrator);
# - sequence, strings read as FP32 reads them: under half (entropy reading 0 of 65 is wrecked; the bench's
#   recognisers read 74-89%);
# - mask, IoU with FP32's mask: under 0.8 (the bench's text detector: 0.92-0.96);
# - cosine, for outputs no task metric knows (and a user's own metric, whose scale edgeq cannot know):
#   under 0.9 (the PicoDet's 0.515 is wrecked; trained models' working INT8 sits above 0.99).
FAR_BELOW: dict[str, float] = {"classification": 0.80, "detection": 0.50, "sequence": 0.50, "mask": 0.80,
                               "cosine": 0.90}


def far_below_fp32(metric: str | None, task: float | None, cosine: float) -> tuple[str, float, float] | None:
    """(the metric that decided, its figure, its ``FAR_BELOW`` level) when a result is far below FP32,
    else None: the task metric's figure decides when it has a level (``metric``, ``task``), the cosine
    otherwise. The quantize check and deploy's check of TensorRT's outputs both ask here."""
    if metric is not None and task is not None and metric in FAR_BELOW and metric != "cosine":
        figure, level, by = task, FAR_BELOW[metric], metric
    else:
        figure, level, by = cosine, FAR_BELOW["cosine"], "cosine"
    return (by, figure, level) if figure < level else None


@dataclass(frozen=True)
class AccuracyReport:
    """The accuracy check: per-output figures, and the task metric that decides when one is known.

    ``threshold``: ``--min-cosine``; ``min_metric``: ``--min-metric`` on the task metric's headline;
    ``held_out``: where the held-out samples came from (a separate set, or a slice of ``--calib``).
    """

    samples: int
    outputs: tuple[OutputAccuracy, ...]
    threshold: float | None = None  # --min-cosine; None: report only
    task: TaskScore | None = None  # the task metric (or cosine) over the same samples
    min_metric: float | None = None
    held_out: str = ""
    metric_why: str = ""  # why this metric (--metric auto's reading of the outputs)

    @property
    def cosine(self) -> float:
        """The lowest mean cosine over the outputs."""
        return min((o.cosine for o in self.outputs), default=1.0)

    @property
    def worst(self) -> OutputAccuracy | None:
        return min(self.outputs, key=lambda o: o.cosine, default=None)

    @property
    def far_below(self) -> tuple[str, float, float] | None:
        """(metric, figure, level) when the result is far below FP32 (``FAR_BELOW``), judged by the task
        metric when there is one; None otherwise."""
        task = self.task
        return far_below_fp32(task.metric if task is not None else None, task.value if task else None,
                              self.cosine)

    @property
    def wrecked(self) -> bool:
        """Far below FP32 with no bound of the user's: a failed check by default."""
        return self.threshold is None and self.min_metric is None and self.far_below is not None

    def wrecked_text(self) -> str:
        """What is far below, and where: the deciding figure, its level and the worst output."""
        far = self.far_below
        if far is None:
            return ""
        by, figure, level = far
        task = self.task is not None and by == self.task.metric and by != "cosine"
        said = (f"{self.task.text} is far below FP32 ({by} under {level:g})" if task and self.task
                else f"cosine {figure:.4f} is far below FP32 (under {level:g})")
        w = self.worst
        return said + (f"; worst output '{w.name}' (cosine {w.cosine:.4f})" if w is not None else "")

    def __bool__(self) -> bool:
        cos_ok = self.threshold is None or self.cosine >= self.threshold
        metric_ok = self.min_metric is None or self.task is None or self.task.value >= self.min_metric
        return cos_ok and metric_ok

    def __str__(self) -> str:
        w = self.worst
        samples = plural(self.samples, "held-out sample")
        named = w is not None and len(self.outputs) > 1
        cos = f"cosine {self.cosine:.6f}" + (f" on '{w.name}'" if named and w is not None else "")
        if self.task is not None and self.task.metric != "cosine":
            figure = f"{self.task.metric}: {self.task} over {samples}; {cos}"
        else:
            figure = f"{cos} over {samples}"
        gates = []
        if self.threshold is not None:
            gates.append(f"--min-cosine {self.threshold}")
        if self.min_metric is not None:
            gates.append(f"--min-metric {self.min_metric}")
        if not gates:
            return figure
        return f"{figure} {'passes' if self else 'fails'} {' and '.join(gates)}"

    def to_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "held_out": self.held_out, "cosine": self.cosine,
                "min_cosine_gate": self.threshold, "min_metric_gate": self.min_metric,
                "task": self.task.to_dict() if self.task is not None else None,
                "metric_why": self.metric_why, "far_below_fp32": self.far_below is not None,
                "wrecked": self.wrecked,
                "passed": bool(self), "outputs": [o.to_dict() for o in self.outputs]}


class _Acc:
    def __init__(self) -> None:
        self.cos_sum = 0.0
        self.cos_min = 1.0
        self.worst = 0
        self.n = 0
        self.max_abs = 0.0
        self.top1_hits = 0
        self.top1_rows = 0
        self.classifier = True

    def update(self, ref: np.ndarray, got: np.ndarray) -> None:
        import numpy as np

        r = np.asarray(ref, dtype=np.float64)
        g = np.asarray(got, dtype=np.float64)
        if r.shape != g.shape:
            raise QuantError(f"the Q/DQ model's output shape {g.shape} differs from the float {r.shape}")
        from edgeq.quant.metrics import cosine

        cos = cosine(r, g)
        self.cos_sum += cos
        if cos < self.cos_min:
            self.cos_min, self.worst = cos, self.n
        self.n += 1
        if r.size:
            self.max_abs = max(self.max_abs, float(np.nanmax(np.abs(r - g))))
        if r.ndim == 2 and r.shape[1] > 1:
            self.top1_hits += int((r.argmax(axis=1) == g.argmax(axis=1)).sum())
            self.top1_rows += r.shape[0]
        else:
            self.classifier = False


def run_outputs(
    model: onnx.ModelProto,
    data: Iterable[dict[str, np.ndarray]],
    *,
    providers: tuple[str, ...] | None = None,
    progress: ProgressFn = no_progress,
    what: str = "accuracy check",
    stop: Callable[[list[dict[str, np.ndarray]]], bool] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Every sample's outputs of ``model`` (float ones: an int output such as NMS indices is not
    compared), in ``data``'s order: the FP32 reference is run once and scored against each candidate
    (calibrators, sensitivity regions) with a ``Metric``. ``stop``: asked after each sample with the
    outputs so far; True ends the run there (a candidate that can no longer win)."""
    import numpy as np

    session = _session(model, providers)
    names = [o.name for o in session.get_outputs() if "float" in o.type]
    total = len(data) if isinstance(data, Sized) else None
    outputs: list[dict[str, np.ndarray]] = []
    progress(what, 0, total)
    for feed in data:
        try:
            got = session.run(names, feed)
        except Exception as e:  # onnxruntime raises untyped errors
            raise QuantError(f"onnxruntime failed in the {what}: {first_line(e)}") from None
        outputs.append({n: np.asarray(a) for n, a in zip(names, got)})
        progress(what, len(outputs), total)
        if stop is not None and stop(outputs):
            break
    return outputs


def output_accuracy(reference: list[dict[str, np.ndarray]], candidate: list[dict[str, np.ndarray]]
                    ) -> tuple[OutputAccuracy, ...]:
    """Per output: mean and worst per-sample cosine, max abs error, top-1 agreement for (N, classes)."""
    from edgeq.quant.metrics import check_pairs

    check_pairs(reference, candidate)
    accs: dict[str, _Acc] = {n: _Acc() for n in (reference[0] if reference else {})}
    for r, c in zip(reference, candidate):
        for n, acc in accs.items():
            acc.update(r[n], c[n])
    return tuple(
        OutputAccuracy(
            n,
            a.cos_sum / a.n if a.n else 1.0,
            a.cos_min if a.n else 1.0,
            a.max_abs,
            (a.top1_hits / a.top1_rows) if a.classifier and a.top1_rows else None,
            a.worst,
        )
        for n, a in accs.items()
    )


def compare_accuracy(
    reference: onnx.ModelProto,
    quantized: onnx.ModelProto,
    data: Iterable[dict[str, np.ndarray]],
    *,
    threshold: float | None = None,
    providers: tuple[str, ...] | None = None,
    progress: ProgressFn = no_progress,
) -> AccuracyReport:
    """Run both models on every sample of ``data`` and compare each float output."""
    samples = data if isinstance(data, Sized) else list(data)
    ref = run_outputs(reference, samples, providers=providers, progress=progress)
    got = run_outputs(quantized, samples, providers=providers, progress=progress)
    missing = [n for n in (ref[0] if ref else {}) if got and n not in got[0]]
    if missing:
        raise QuantError(f"the Q/DQ model lost output '{missing[0]}'")
    return AccuracyReport(len(ref), output_accuracy(ref, got), threshold)


def _session(model: onnx.ModelProto, providers: tuple[str, ...] | None) -> ort.InferenceSession:
    """Every model judged here runs as the engine computes it (``quant.evaluate``)."""
    from edgeq.quant.evaluate import evaluation_session

    return evaluation_session(model, providers)


@dataclass(frozen=True)
class HeldOut:
    """The held-out set with its FP32 reference outputs (run once) and the metric that judges candidates:
    shared by the accuracy check, ``--calibrator auto``, ``edgeq sensitivity`` and deploy's check of
    TensorRT's own outputs."""

    data: Any  # the samples (a CalibrationSet or a list of feeds), re-iterable
    outputs: list[dict[str, np.ndarray]]  # FP32 reference outputs, in ``data``'s order
    metric: Metric
    why: str  # why this metric ("--metric detection", or what --metric auto read in the outputs)
    source: str  # where the samples came from

    def score(self, candidate: list[dict[str, np.ndarray]]) -> TaskScore:
        return self.metric.score(self.outputs, candidate)

    def report(self, candidate: list[dict[str, np.ndarray]], *, threshold: float | None = None,
               min_metric: float | None = None) -> AccuracyReport:
        """The accuracy check of ``candidate`` (outputs on the same samples) against the reference."""
        return AccuracyReport(len(self.outputs), output_accuracy(self.outputs, candidate), threshold,
                              self.score(candidate), min_metric, self.source, self.why)


def held_out_reference(reference: onnx.ModelProto, data: Any, *, metric: str = "auto", source: str = "",
                       providers: tuple[str, ...] | None = None, progress: ProgressFn = no_progress
                       ) -> HeldOut:
    """Run the FP32 ``reference`` once on ``data`` and resolve ``metric`` (``auto``: read from its
    outputs, ``guess_metric``)."""
    from edgeq.quant.metrics import guess_metric, metric_from_spec

    outputs = run_outputs(reference, data, providers=providers, progress=progress, what="FP32 reference")
    if not outputs:
        raise QuantError("the held-out set is empty")
    if metric == "auto":
        name, why = guess_metric(outputs[0])
        why = f"--metric auto: {name} ({why})"
    else:
        name, why = metric, f"--metric {metric}"
    return HeldOut(data, outputs, metric_from_spec(name), why, source)
