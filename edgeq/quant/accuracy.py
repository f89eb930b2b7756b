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
from edgeq.text import plural

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
            return f"{figure} over {plural(self.samples, 'held-out sample')}"
        verdict = "passes" if self else "fails"
        over = plural(self.samples, "held-out sample")
        return f"{figure} over {over} {verdict} --min-cosine {self.threshold}"

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
        cos = _cosine(r.ravel(), g.ravel())
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


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    import numpy as np

    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0 or not np.isfinite(na * nb):
        return 0.0
    return float(np.clip(np.dot(a, b) / (na * nb), -1.0, 1.0))


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
    import numpy as np

    ref_s = _session(reference, providers)
    q_s = _session(quantized, providers)
    names = [o.name for o in ref_s.get_outputs() if "float" in o.type]
    q_names = {o.name for o in q_s.get_outputs()}
    missing = [n for n in names if n not in q_names]
    if missing:
        raise QuantError(f"the Q/DQ model lost output '{missing[0]}'")
    accs = {n: _Acc() for n in names}
    total = len(data) if isinstance(data, Sized) else None
    done = 0
    progress("accuracy check", 0, total)
    for feed in data:
        try:
            ref = ref_s.run(names, feed)
            got = q_s.run(names, feed)
        except Exception as e:  # onnxruntime raises untyped errors
            raise QuantError(f"onnxruntime failed in the accuracy check: {first_line(e)}") from None
        for n, r, g in zip(names, ref, got):
            accs[n].update(np.asarray(r), np.asarray(g))
        done += 1
        progress("accuracy check", done, total)
    outputs = tuple(
        OutputAccuracy(
            n,
            a.cos_sum / a.n if a.n else 1.0,
            a.cos_min if a.n else 1.0,
            a.max_abs,
            (a.top1_hits / a.top1_rows) if a.classifier and a.top1_rows else None,
        )
        for n, a in accs.items()
    )
    return AccuracyReport(done, outputs, threshold)


def _session(model: onnx.ModelProto, providers: tuple[str, ...] | None) -> ort.InferenceSession:
    import onnxruntime as ort

    from edgeq.quant.calibrate import inference_session

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return inference_session(model, opts, providers, purpose="the accuracy check")
