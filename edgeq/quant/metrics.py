"""Task metrics: the Q/DQ model's outputs against FP32's, in the terms of the model's task.

Why not one cosine over whole output tensors: it is dominated by whichever part of a tensor is largest.
On a trained YOLOv8n it read 0.9987 while 43% of the detections vanished (box coordinates outweigh the
class scores), and on a text detector 0.016 for an image with no text while its masks were right. A
user judges a quantized model by its task: the detections it keeps, the strings it reads. Each metric
here compares the candidate's outputs with the FP32 reference's on the same held-out samples, and its
headline figure is higher-is-better with FP32 itself scoring 1.0 (agreement, detections kept, IoU), so
one number ranks calibrators (``--calibrator auto``), regions (``edgeq sensitivity``) and gates
(``--min-metric``) alike.

Built in: ``cosine`` (per output, per sample), and the task metrics registered in ``METRICS``. A user's
own is ``module:function``: ``function(reference, candidate) -> float | TaskScore`` over the lists of
per-sample output dicts, higher is better.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from edgeq.errors import QuantError, first_line

if TYPE_CHECKING:
    import numpy as np

Outputs = Mapping[str, "np.ndarray"]  # one sample's outputs by output name, batch axis as the model has it


@dataclass(frozen=True)
class TaskScore:
    """One metric over the held-out samples.

    ``value``: the headline figure, higher is better, FP32 against itself scores 1.0. ``text``: the
    headline as a person reads it. ``figures``: every figure the metric computed (counts, CER, ...).
    ``per_sample``: each sample's figure in the same sense as ``value`` (the worst one is shown).
    """

    metric: str
    value: float
    text: str
    figures: Mapping[str, float] = field(default_factory=dict)
    per_sample: tuple[float, ...] = ()

    @property
    def worst(self) -> tuple[int, float] | None:
        """(index into the held-out set, figure) of the worst sample, or None without per-sample figures."""
        if not self.per_sample:
            return None
        i = min(range(len(self.per_sample)), key=self.per_sample.__getitem__)
        return i, self.per_sample[i]

    def __str__(self) -> str:
        w = self.worst
        if w is None or len(self.per_sample) < 2:
            return self.text
        return f"{self.text}; worst sample #{w[0]}: {w[1]:.3f}"

    def to_dict(self) -> dict[str, Any]:
        w = self.worst
        return {"metric": self.metric, "value": self.value, "text": self.text, "figures": dict(self.figures),
                "worst_sample": None if w is None else {"index": w[0], "value": w[1]},
                "per_sample": list(self.per_sample)}


class Metric(Protocol):
    """A comparison of candidate outputs with reference outputs, sample by sample (same order)."""

    @property
    def name(self) -> str: ...

    def score(self, reference: Sequence[Outputs], candidate: Sequence[Outputs]) -> TaskScore: ...


def float_outputs(sample: Outputs) -> list[str]:
    """The output names a metric compares: float arrays (an int output such as NMS indices is not)."""
    import numpy as np

    return [n for n, a in sample.items() if np.issubdtype(np.asarray(a).dtype, np.floating)]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays as vectors; both all-zero is 1.0 (identical), one of them 0.0."""
    import numpy as np

    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0 or not np.isfinite(na * nb):
        return 0.0
    return float(np.clip(np.dot(a, b) / (na * nb), -1.0, 1.0))


@dataclass(frozen=True)
class CosineMetric:
    """The generic check when no task is known: per output, the mean over samples of each sample's
    cosine; the headline is the lowest output's mean, a sample's figure its lowest output's cosine."""

    name: str = "cosine"

    def score(self, reference: Sequence[Outputs], candidate: Sequence[Outputs]) -> TaskScore:
        check_pairs(reference, candidate)
        names = float_outputs(reference[0]) if reference else []
        per_output = {n: [cosine(r[n], c[n]) for r, c in zip(reference, candidate)] for n in names}
        means = {n: sum(v) / len(v) for n, v in per_output.items() if v}
        per_sample = tuple(min(per_output[n][i] for n in names) for i in range(len(reference)) if names)
        value = min(means.values(), default=1.0)
        worst = min(means, key=means.__getitem__) if means else None
        text = f"cosine {value:.4f}" + (f" on '{worst}'" if worst is not None and len(means) > 1 else "")
        return TaskScore(self.name, value, text, {f"cosine:{n}": m for n, m in means.items()}, per_sample)


def check_pairs(reference: Sequence[Outputs], candidate: Sequence[Outputs]) -> None:
    """Same number of samples, and each candidate sample has the reference's outputs in its shapes."""
    import numpy as np

    if len(reference) != len(candidate):
        raise QuantError(f"{len(candidate)} candidate samples for {len(reference)} reference samples")
    for i, (r, c) in enumerate(zip(reference, candidate)):
        for n, a in r.items():
            if n not in c:
                raise QuantError(f"the quantized model lost output '{n}'")
            if np.shape(a) != np.shape(c[n]):
                raise QuantError(f"output '{n}' of sample #{i}: shape {np.shape(c[n])} where FP32 "
                                 f"gives {np.shape(a)}")


# name -> factory(options) for the built-in metrics; the task metrics register themselves below.
MetricFactory = Callable[[Mapping[str, float]], Metric]
METRICS: dict[str, MetricFactory] = {"cosine": lambda _opts: CosineMetric()}


@dataclass(frozen=True)
class UserMetric:
    """``--metric module:function``: the user's own comparison, higher is better."""

    name: str
    function: Callable[[Sequence[Outputs], Sequence[Outputs]], Any]

    def score(self, reference: Sequence[Outputs], candidate: Sequence[Outputs]) -> TaskScore:
        check_pairs(reference, candidate)
        try:
            got = self.function(list(reference), list(candidate))
        except Exception as e:  # the user's code: its error is theirs to see, in one line
            raise QuantError(f"--metric {self.name} raised {type(e).__name__}: {first_line(e)}") from None
        if isinstance(got, TaskScore):
            return got
        try:
            value = float(got)
        except (TypeError, ValueError):
            raise QuantError(f"--metric {self.name} returned {type(got).__name__}, not a number or TaskScore"
                             ) from None
        if math.isnan(value):
            raise QuantError(f"--metric {self.name} returned NaN: it must score every candidate")
        return TaskScore(self.name, value, f"{self.name} {value:.4f}")


def metric_from_spec(spec: str, options: Mapping[str, float] | None = None) -> Metric:
    """``--metric``'s value: a built-in name (``METRICS``) or ``module:function``."""
    opts = dict(options or {})
    if spec in METRICS:
        return METRICS[spec](opts)
    if ":" not in spec:
        raise QuantError(f"unknown metric '{spec}'",
                         hint=f"use one of {', '.join(sorted(METRICS))}, auto, or module:function")
    module, _, func = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), func)
    except Exception as e:  # ImportError, AttributeError, or the module's own import-time error
        raise QuantError(f"--metric {spec}: cannot load {func} from {module}: {first_line(e)}") from None
    if not callable(fn):
        raise QuantError(f"--metric {spec}: {func} is not a function")
    return UserMetric(spec, fn)


# Each task metric's test of whether a reference output looks like its task: returns why, or None.
Guess = Callable[[Outputs], "str | None"]
GUESSES: list[tuple[str, Guess]] = []


def guess_metric(sample: Outputs) -> tuple[str, str]:
    """(metric name, why) for ``--metric auto``, from one FP32 reference sample's outputs; ``cosine``
    when no task metric recognises them."""
    for name, fits in GUESSES:
        why = fits(sample)
        if why:
            return name, why
    return "cosine", "no task recognised from the outputs"
