"""Host-side accuracy check: the FP32 model against its Q/DQ model in onnxruntime, on held-out data.

Why onnxruntime and not the engine: it runs anywhere, before any target is involved, and computes the
arithmetic the Q/DQ nodes define, which is what an explicit TensorRT engine keeps (TensorRT 8.6
Developer Guide, 'TensorRT Processing Of Q/DQ Networks'). A result is a value: true when it passes its
gate, and it names the figure that decided (as Polygraphy's comparator results do).
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeq.errors import QuantError, first_line
from edgeq.findings import ProgressFn, no_progress

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnxruntime as ort


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

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cosine": self.cosine, "min_cosine": self.min_cosine,
                "max_abs_error": self.max_abs_error, "top1_agreement": self.top1}


@dataclass(frozen=True)
class AccuracyReport:
    samples: int
    outputs: tuple[OutputAccuracy, ...]
    threshold: float | None = None  # --min-cosine; None: report only

    @property
    def cosine(self) -> float:
        """The deciding figure: the lowest mean cosine over the outputs."""
        return min((o.cosine for o in self.outputs), default=1.0)

    @property
    def worst(self) -> OutputAccuracy | None:
        return min(self.outputs, key=lambda o: o.cosine, default=None)

    def __bool__(self) -> bool:
        return self.threshold is None or self.cosine >= self.threshold

    def __str__(self) -> str:
        w = self.worst
        figure = f"cosine {self.cosine:.6f}" + (f" on '{w.name}'" if w is not None else "")
        if self.threshold is None:
            return f"{figure} over {self.samples} held-out samples"
        verdict = "passes" if self else "fails"
        return f"{figure} over {self.samples} held-out samples {verdict} --min-cosine {self.threshold}"

    def to_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "cosine": self.cosine, "min_cosine_gate": self.threshold,
                "passed": bool(self), "outputs": [o.to_dict() for o in self.outputs]}


class _Acc:
    def __init__(self) -> None:
        self.cos_sum = 0.0
        self.cos_min = 1.0
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
        self.cos_min = min(self.cos_min, cos)
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
) -> list[dict[str, np.ndarray]]:
    """Every sample's outputs of ``model`` (float ones: an int output such as NMS indices is not
    compared), in ``data``'s order: the FP32 reference is run once and scored against each candidate
    (calibrators, sensitivity regions) with a ``Metric``."""
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
    import onnxruntime as ort

    from edgeq.quant.calibrate import inference_session

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return inference_session(model, opts, providers, purpose="the accuracy check")
