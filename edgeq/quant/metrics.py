"""Task metrics: the Q/DQ model's outputs against FP32's, in the terms of the model's task.

Why not one cosine over whole output tensors: it is dominated by whichever part of a tensor is largest.
On a trained YOLOv8n it read 0.9987 while 43% of the detections vanished (box coordinates outweigh the
class scores), and on a text detector 0.016 for an image with no text while its masks were right. A
user judges a quantized model by its task: the detections it keeps, the strings it reads. Each metric
here compares the candidate's outputs with the FP32 reference's on the same held-out samples, and its
headline figure is higher-is-better with FP32 itself scoring 1.0 (agreement, detections kept, IoU), so
one number ranks calibrators (``--calibrator auto``), regions (``edgeq sensitivity``) and gates
(``--min-metric``) alike.

Dense figures: a headline counts what a user sees (labels, detections at the display threshold, whole
strings), so on a few dozen samples it moves in coarse steps and can rest on one sample ("1 of 1"
detection). Each task metric also computes a dense form of itself that every sample informs: the label
margin kept (classification), box scores and IoU down to ``DENSE_SCORE`` (detection), per-step symbol
probabilities (CTC sequences). ``TaskScore.rank``, what ``--calibrator auto``, ``edgeq sensitivity`` and
``--max-loss`` compare candidates by, folds it in: for classification as the tie-break below one label
(the labels decide, as a user judges a classifier), for detections and strings as ``DENSE_WEIGHT`` more
of them (``blended``): where there are few, the dense form decides; where there are many, the count.
FP32 against itself scores 1.0 in every form.

Built in: ``cosine`` (per output, per sample), and the task metrics registered in ``METRICS``. A user's
own is ``module:function``: ``function(reference, candidate) -> float | TaskScore`` over the lists of
per-sample output dicts, higher is better.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from edgeq.errors import QuantError, first_line
from edgeq.text import plain

if TYPE_CHECKING:
    import numpy as np

Outputs = Mapping[str, "np.ndarray"]  # one sample's outputs by output name, batch axis as the model has it


# The figure that counts a headline's units, per metric (classification's rows, detection's FP32 detections,
# sequence's strings): ``TaskScore.unit``.
UNIT_COUNTS = ("rows", "fp32_detections", "strings")


@dataclass(frozen=True)
class TaskScore:
    """One metric over the held-out samples.

    ``value``: the headline figure, higher is better, FP32 against itself scores 1.0. ``text``: the
    headline as a person reads it. ``figures``: every figure the metric computed (counts, CER, ...).
    ``per_sample``: each sample's figure in the same sense as ``value`` (the worst one is shown).
    ``ranked``: what candidates are compared by where the headline leaves something out (the dense form
    of the metric, the new detections a candidate invents); None: ``value``. ``ranked_per_sample``: each
    sample's figure in the sense of ``ranked`` (their mean is about ``rank``), for the test of whether
    the samples tell two candidates apart (``autocalib.evidence``); empty: ``per_sample``.
    """

    metric: str
    value: float
    text: str
    figures: Mapping[str, float] = field(default_factory=dict)
    per_sample: tuple[float, ...] = ()
    ranked: float | None = None
    ranked_per_sample: tuple[float, ...] = ()

    @property
    def rank(self) -> float:
        """The figure candidates are compared by: higher is better, FP32 against itself 1.0."""
        return self.value if self.ranked is None else self.ranked

    @property
    def rank_samples(self) -> tuple[float, ...]:
        """Per sample in the sense of ``rank``."""
        return self.ranked_per_sample or self.per_sample

    @property
    def unit(self) -> float:
        """One whole unit of the headline (a label of ``rows``, a detection of FP32's, a string): 1/count,
        or 0.0 where the headline counts nothing (a mean IoU, a cosine). Two correct INT8 implementations
        differ by about one: rounding ties break differently (measured, docs: Accuracy on the target)."""
        for key in UNIT_COUNTS:
            n = self.figures.get(key)
            if n:
                return 1.0 / n
        return 0.0

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
        return {"metric": self.metric, "value": self.value, "rank": self.rank, "text": self.text,
                "figures": dict(self.figures),
                "worst_sample": None if w is None else {"index": w[0], "value": w[1]},
                "per_sample": list(self.per_sample)}


class Metric(Protocol):
    """A comparison of candidate outputs with reference outputs, sample by sample (same order)."""

    @property
    def name(self) -> str: ...  # read-only: the frozen dataclasses below implement it

    def score(self, reference: Sequence[Outputs], candidate: Sequence[Outputs]) -> TaskScore: ...


# What the dense form of the detection and sequence metrics weighs in their rank: as much as this many
# detections or strings (``blended``). Why not half and half: the dense forms reward scores close to
# FP32's, and entropy-based calibrators lower the scores of boxes no user sees, so on the bench's YOLOv8n
# (100 held-out images, 65 FP32 detections) half and half preferred mse (53 kept, 17 new) over
# entropy+ends+max16 (55 kept, 14 new; dense 0.52 against 0.63). Why not a tie-break only: on a first
# user's set the counts are few (32 calibration images: 18 FP32 detections) and one of them decided
# (a choice resting on "1 of 1" detection). Weighing ten: both sets keep entropy+ends+max16, and so does
# the recogniser (29 of 32 calibration lines, 51 of 65 held out, as many as the best single calibrator).
DENSE_WEIGHT = 10.0


def blended(count: float, units: float, dense: float, weight: float = DENSE_WEIGHT) -> float:
    """``count`` of ``units`` (detections kept of FP32's and the new ones, strings as FP32 reads them)
    with the dense form (0..1) counted as ``weight`` more units: 1.0 for FP32's own outputs."""
    return (count + weight * dense) / (units + weight)


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


def bounded(metric: Metric) -> bool:
    """Whether FP32's own outputs in place of a candidate's never lower the metric's figure, so that
    ``--calibrator auto`` may stop a candidate once even FP32's outputs on its remaining held-out samples
    could not make it win. True of the built-in metrics; a user's function says so itself with an
    attribute ``bounded = True`` (without it every candidate runs every sample: exact, and slower)."""
    if isinstance(metric, UserMetric):
        return getattr(metric.function, "bounded", False) is True
    return metric.name in METRICS


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


# ---------------------------------------------------------------------------------------------------
# Task metrics: each judges one output (the first float output of the shape its task has), compares
# what the task's user sees (top-1 class, kept detections, mask pixels, read strings), and registers
# a factory in METRICS with its options and a conservative guess in GUESSES.
# ---------------------------------------------------------------------------------------------------


def _options(name: str, given: Mapping[str, float], defaults: Mapping[str, float]) -> dict[str, float]:
    """``defaults`` overridden by ``given``; an option the metric does not take is an input error."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise QuantError(f"metric {name} has no option '{unknown[0]}'",
                         hint=f"its options: {', '.join(sorted(defaults)) or 'none'}")
    out = {k: float(given.get(k, v)) for k, v in defaults.items()}
    return out


def _pick(name: str, sample: Outputs, fits: Callable[[tuple[int, ...]], bool], shape: str) -> str:
    """The output a task metric judges: the first float output whose shape fits the task."""
    import numpy as np

    for n in float_outputs(sample):
        if fits(tuple(np.shape(sample[n]))):
            return n
    found = ", ".join(f"'{n}' {tuple(np.shape(a))}" for n, a in sample.items()) or "none"
    raise QuantError(f"metric {name} needs an output of shape {shape}; the model's outputs: {found}",
                     hint="choose another --metric (cosine fits any model)")


def _pct(x: float) -> str:
    p = 100.0 * x
    return f"{p:.0f}%" if abs(p - round(p)) < 0.05 else f"{p:.1f}%"


def _sole_output(sample: Outputs) -> tuple[str, np.ndarray] | None:
    """The model's only float output, or None: a guess judges single-output models only, so a metric
    never silently ignores a second head."""
    import numpy as np

    names = float_outputs(sample)
    return (names[0], np.asarray(sample[names[0]])) if len(names) == 1 else None


def _softmax_rows(a: np.ndarray, axis: int = -1) -> bool:
    """Probabilities along ``axis``: every value in [0, 1] and every row summing to 1."""
    import numpy as np

    return bool(a.size and np.isfinite(a).all() and a.min() >= 0.0 and a.max() <= 1.0
                and np.allclose(a.sum(axis=axis), 1.0, atol=1e-3))


# Classification --------------------------------------------------------------------------------------


def _is_scores(shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and shape[1] >= 2


def label_margins(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Per row of (rows, classes) scores, how much of FP32's label margin the candidate keeps, in [0, 1]:
    the margin is the score of FP32's top-1 class over the best other class (logits or probabilities
    alike); (1 + candidate margin / FP32's, clipped to [-1, 1]) / 2, so 1.0 is as sure as FP32 (or
    surer), 0.5 a tie, below 0.5 the label lost. A row FP32 itself ties scores 1.0 if the candidate
    keeps FP32's label, else 0.0."""
    import numpy as np

    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    rows = np.arange(len(ref))
    label = ref.argmax(axis=1)

    def margin(a: np.ndarray) -> np.ndarray:
        others = a.copy()
        others[rows, label] = -np.inf
        return np.asarray(a[rows, label] - others.max(axis=1))

    m_ref, m_got = margin(ref), margin(got)
    sure = m_ref > 0
    ratio = np.where(sure, np.clip(m_got / np.where(sure, m_ref, 1.0), -1.0, 1.0),
                     np.where(m_got >= 0, 1.0, -1.0))
    return np.asarray((1.0 + ratio) / 2.0)


@dataclass(frozen=True)
class ClassificationMetric:
    """Top-1 agreement with FP32 over (N, classes) outputs (the headline), and top-k: the FP32 top-1
    class among the candidate's k best. Logits or probabilities alike: only the ranking counts. Dense
    form: the label margin kept (``label_margins``), the tie-break between candidates with as many
    labels (below one label's worth of the headline: the labels decide)."""

    name: str = "classification"
    top_k: int = 5

    def score(self, reference: Sequence[Outputs], candidate: Sequence[Outputs]) -> TaskScore:
        import numpy as np

        check_pairs(reference, candidate)
        if not reference:
            return TaskScore(self.name, 1.0, "no held-out samples")
        out = _pick(self.name, reference[0], _is_scores, "(N, classes)")
        per_sample, margins, hits, hits_k, rows = [], [], 0, 0, 0
        classes = int(np.shape(reference[0][out])[1])
        k = min(self.top_k, classes)
        for r, c in zip(reference, candidate):
            ref, got = np.asarray(r[out]), np.asarray(c[out])
            want = ref.argmax(axis=1)
            top1 = got.argmax(axis=1) == want
            topk = (np.argsort(-got, axis=1, kind="stable")[:, :k] == want[:, None]).any(axis=1)
            hits, hits_k, rows = hits + int(top1.sum()), hits_k + int(topk.sum()), rows + len(want)
            per_sample.append(float(top1.mean()) if len(want) else 1.0)
            margins.append(label_margins(ref, got) if len(want) else np.ones(0))
        top1_rate = hits / rows if rows else 1.0
        kept = float(np.concatenate(margins).mean()) if rows else 1.0
        figures = {"top1": top1_rate, "rows": float(rows), "label_margin": kept}
        text = f"top-1 agreement {_pct(top1_rate)} ({hits} of {rows})"
        if classes > k:  # top-k over k or fewer classes always agrees
            figures[f"top{k}"] = hits_k / rows if rows else 1.0
            text += f", top-{k} {_pct(figures[f'top{k}'])}"
        text += f"; label margin kept {kept:.3f}"
        below = 1.0 / (rows + 1)  # a whole label is worth more than any margin; FP32 itself ranks 1.0

        def rank(top1: float, margin: float) -> float:
            return (top1 + below * margin) / (1.0 + below)

        ranked = tuple(rank(p, float(m.mean()) if m.size else 1.0) for p, m in zip(per_sample, margins))
        return TaskScore(self.name, top1_rate, text, figures, tuple(per_sample),
                         ranked=rank(top1_rate, kept), ranked_per_sample=ranked)


def guess_classification(sample: Outputs) -> str | None:
    """(N, classes): a classifier, logits or probabilities alike (judged by its labels, what a user
    deploys it for). A feature vector of that shape is judged by labels too: ``--metric cosine`` there."""
    sole = _sole_output(sample)
    if sole is None or not _is_scores(sole[1].shape):
        return None
    kind = "probabilities" if _softmax_rows(sole[1]) else "scores"
    return (f"output '{sole[0]}' {sole[1].shape} holds {kind} over {sole[1].shape[1]} classes, judged by "
            "the labels (--metric cosine for a feature vector)")


# Detection (YOLOv8-style) ----------------------------------------------------------------------------


def _is_yolo(shape: tuple[int, ...]) -> bool:
    return len(shape) == 3 and shape[1] >= 5 and shape[2] > shape[1]


def _iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every xyxy box in ``a`` (n, 4) with every one in ``b`` (m, 4)."""
    import numpy as np

    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0.0, None).prod(axis=2)
    area_a = np.clip(a[:, 2:] - a[:, :2], 0.0, None).prod(axis=1)
    area_b = np.clip(b[:, 2:] - b[:, :2], 0.0, None).prod(axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float, max_det: int = 300
        ) -> np.ndarray:
    """Indices kept by per-class non-maximum suppression, best score first (ultralytics' way: boxes of
    different classes are offset apart so one pass suppresses within a class only)."""
    import numpy as np

    if not len(boxes):
        return np.zeros(0, dtype=np.int64)
    offset = boxes + (classes.astype(np.float64) * (float(np.abs(boxes).max()) + 1.0))[:, None]
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    while order.size and len(keep) < max_det:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        order = rest[_iou_matrix(offset[i:i + 1], offset[rest])[0] <= iou]
    return np.asarray(keep, dtype=np.int64)


Detections = tuple["np.ndarray", "np.ndarray", "np.ndarray"]  # one image's (xyxy boxes, scores, classes)


def yolo_detections(pred: np.ndarray, score: float, nms_iou: float, max_det: int = 300
                    ) -> list[Detections]:
    """Per image of a (N, 4 + classes, anchors) output: (xyxy boxes, scores, classes) after the score
    threshold and per-class NMS, as ultralytics decodes YOLOv8 (best class per anchor)."""
    import numpy as np

    out = []
    for p in np.asarray(pred, dtype=np.float64):
        cls_scores = p[4:]
        cls = cls_scores.argmax(axis=0)
        conf = cls_scores[cls, np.arange(cls_scores.shape[1])]
        sel = conf >= score
        cx, cy, w, h = p[:4, sel]
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
        keep = nms(boxes, conf[sel], cls[sel], nms_iou, max_det)
        out.append((boxes[keep], conf[sel][keep], cls[sel][keep]))
    return out


# Decoded outputs by array (its id -> a weak reference to it, its decodes by the decode's parameters): the
# bound checks of ``--calibrator auto`` score the same FP32 and candidate outputs many times (on 100
# detector images the decode was a tenth of auto's time); an entry goes when its array does.
ArrayCache = dict[int, tuple[Any, dict[Any, Any]]]
_DECODED: ArrayCache = {}

T = TypeVar("T")


def per_array(cache: ArrayCache, array: Any, params: Any, compute: Callable[[], T]) -> T:
    """``compute()`` for ``array`` with ``params`` once while the array lives, kept in ``cache`` by its
    identity: outputs are never changed in place once run. An object that takes no weak reference is
    not cached. A user's metric may keep its own decode this way (``bench/yolox_metric.py``)."""
    import weakref

    key = id(array)
    hit = cache.get(key)
    if hit is not None and hit[0]() is array and params in hit[1]:
        return cast(T, hit[1][params])
    found = compute()
    if hit is not None and hit[0]() is array:
        hit[1][params] = found
        return found

    def forget(_: object, k: int = key) -> None:
        cache.pop(k, None)

    try:
        ref = weakref.ref(array, forget)
    except TypeError:  # not weakly referenceable (not an ndarray): not cached
        return found
    cache[key] = (ref, {params: found})
    return found


def decoded(pred: np.ndarray, score: float, nms_iou: float, max_det: int = 300
            ) -> list[Detections]:
    """``yolo_detections`` of an output array, decoded once per array (``per_array``)."""
    return per_array(_DECODED, pred, (score, nms_iou, max_det),
                     lambda: yolo_detections(pred, score, nms_iou, max_det))


def matched_detections(ref: Detections, got: Detections, iou: float) -> list[tuple[int, int, float]]:
    """(reference index, candidate index, IoU) of each match: greedy one-to-one, best reference score
    first, to the unmatched candidate box of the same class with the highest IoU >= ``iou``."""
    import numpy as np

    if not len(ref[0]) or not len(got[0]):
        return []
    m = _iou_matrix(ref[0], got[0])
    m[ref[2][:, None] != got[2][None, :]] = 0.0
    out = []
    for i in np.argsort(-ref[1], kind="stable"):
        j = int(m[i].argmax())
        if m[i, j] >= iou:
            out.append((int(i), j, float(m[i, j])))
            m[:, j] = 0.0
    return out


def kept_detections(ref: Detections, got: Detections, iou: float) -> np.ndarray:
    """Which reference detections the candidate keeps (``matched_detections``)."""
    import numpy as np

    kept = np.zeros(len(ref[0]), dtype=bool)
    for i, _, _ in matched_detections(ref, got, iou):
        kept[i] = True
    return kept


# The dense form of the detection metric reads every box down to this score: what FP32 and a candidate
# find at the display threshold is a few boxes per image (24 calibration images gave a YOLOv8n one of
# them), what they score above 0.05 is most of the scene's evidence, in every image.
DENSE_SCORE = 0.05


def dense_detections(refs: Sequence[Detections], gots: Sequence[Detections], iou: float
                     ) -> tuple[float, float]:
    """(agreement, weight) of one sample's boxes down to ``DENSE_SCORE``: each FP32 box weighs its score;
    a matched one (``matched_detections``) earns its weight x IoU x the smaller of the two scores over the
    larger, and each candidate box left unmatched adds its own score to the weight. Agreement / weight is
    1.0 for FP32's own boxes and falls with every lost, moved, re-scored or invented one."""
    earned = weight = 0.0
    for ref, got in zip(refs, gots):
        weight += float(ref[1].sum())
        matched = set()
        for i, j, overlap in matched_detections(ref, got, iou):
            a, b = float(ref[1][i]), float(got[1][j])
            earned += a * overlap * (min(a, b) / max(a, b) if max(a, b) > 0 else 1.0)
            matched.add(j)
        weight += float(sum(float(got[1][j]) for j in range(len(got[1])) if j not in matched))
    return earned, weight


@dataclass(frozen=True)
class DetectionMetric:
    """YOLOv8-style detections: the share of FP32's detections (score >= ``score`` after per-class NMS at
    ``nms_iou``) that the candidate, decoded the same way, keeps at IoU >= ``iou`` with the same class.
    The candidate meets the same score threshold: a detection that drops below it is lost to the
    user too. A sample's figure is matched / max(FP32's, the candidate's detections), so detections the
    candidate invents count against it there (and in the ``extra`` figure). Dense form: every box down
    to ``DENSE_SCORE`` (``dense_detections``), in the rank as ``DENSE_WEIGHT`` more detections."""

    name: str = "detection"
    score_threshold: float = 0.25
    iou: float = 0.5
    nms_iou: float = 0.7  # ultralytics' predict default; nudenet and YOLOv5 use 0.45
    max_det: int = 300
    # A lost detection FP32 scored less than this above the threshold is one FP32 itself barely made:
    # on nudenet's YOLOv8n 8 of the 9 that INT8 lost were (docs/measurement-log.md, "Accuracy on trained
    # models").
    near: float = 0.1

    def score(self, reference: Sequence[Outputs], candidate: Sequence[Outputs]) -> TaskScore:
        check_pairs(reference, candidate)
        if not reference:
            return TaskScore(self.name, 1.0, "no held-out samples")
        out = _pick(self.name, reference[0], _is_yolo, "(N, 4 + classes, anchors)")
        total = kept = extra = near = 0
        earned = weight = 0.0
        per_sample, per_rank = [], []
        share = DENSE_WEIGHT / len(reference)  # a sample's part of the dense form's weight
        low = min(DENSE_SCORE, self.score_threshold)
        for r, c in zip(reference, candidate):
            refs = decoded(r[out], self.score_threshold, self.nms_iou, self.max_det)
            gots = decoded(c[out], self.score_threshold, self.nms_iou, self.max_det)
            n_ref = sum(len(d[0]) for d in refs)
            n_got = sum(len(d[0]) for d in gots)
            hits = [kept_detections(a, b, self.iou) for a, b in zip(refs, gots)]
            k = sum(int(h.sum()) for h in hits)
            near += sum(int((a[1][~h] < self.score_threshold + self.near).sum()) for a, h in zip(refs, hits))
            total, kept, extra = total + n_ref, kept + k, extra + n_got - k
            per_sample.append(k / max(n_ref, n_got) if max(n_ref, n_got) else 1.0)
            e, w = dense_detections(decoded(r[out], low, self.nms_iou, self.max_det),
                                    decoded(c[out], low, self.nms_iou, self.max_det), self.iou)
            earned, weight = earned + e, weight + w
            per_rank.append(blended(k, n_ref + n_got - k, e / w if w else 1.0, share))
        value = kept / total if total else 1.0
        dense = earned / weight if weight else 1.0
        text = (f"{_pct(value)} of FP32 detections kept ({kept} of {total})" if total
                else "FP32 detects nothing on the held-out set (score >= "
                     f"{plain(self.score_threshold)}): nothing to keep")
        if extra:
            text += f", {extra} new"
        if near:
            text += (f"; {near} of the {total - kept} lost scored under "
                     f"{plain(self.score_threshold + self.near)} by FP32 itself")
        text += f"; boxes down to score {plain(low)} agree {dense:.3f}"
        # ranked: kept over FP32's and the new detections together, so a candidate cannot win by keeping
        # FP32's detections among many it invents (kept/total ignores them), and the dense boxes
        return TaskScore(self.name, value, text,
                         {"kept": float(kept), "fp32_detections": float(total), "extra": float(extra),
                          "lost_near_threshold": float(near), "dense": dense},
                         tuple(per_sample), ranked=blended(kept, total + extra, dense),
                         ranked_per_sample=tuple(per_rank))


def guess_detection(sample: Outputs) -> str | None:
    """(N, 4 + classes, anchors) with class scores in [0, 1] and pixel-sized, non-negative boxes: a
    YOLOv8 export (its decode head applied). A raw head (logits, grid-shaped) is not guessed."""
    import numpy as np

    sole = _sole_output(sample)
    if sole is None or not _is_yolo(sole[1].shape):
        return None
    a = sole[1]
    scores, boxes = a[:, 4:], a[:, :4]
    if not (np.isfinite(a).all() and scores.min() >= 0.0 and scores.max() <= 1.0):
        return None
    if boxes.min() < 0.0 or boxes.max() <= 1.0 or a.shape[2] < 21 or _softmax_rows(scores, axis=1):
        return None
    return (f"output '{sole[0]}' {a.shape} looks like YOLOv8's: 4 box coordinates and {a.shape[1] - 4} "
            f"class scores for {a.shape[2]} anchors")


# Masks -------------------------------------------------------------------------------------------------


def _is_map(shape: tuple[int, ...]) -> bool:
    return len(shape) == 4 and shape[1] == 1 and shape[2] >= 8 and shape[3] >= 8


@dataclass(frozen=True)
class MaskMetric:
    """IoU of the masks FP32 and the candidate give at ``threshold`` (a DB text detector's binarisation:
    0.3), per sample; a sample where both masks are empty scores 1.0 (the answer is the same: nothing
    there), one empty and one not 0.0. The headline is the mean over samples."""

    name: str = "mask"
    threshold: float = 0.3

    def score(self, reference: Sequence[Outputs], candidate: Sequence[Outputs]) -> TaskScore:
        import numpy as np

        check_pairs(reference, candidate)
        if not reference:
            return TaskScore(self.name, 1.0, "no held-out samples")
        out = _pick(self.name, reference[0], _is_map, "(N, 1, H, W)")
        per_sample = []
        for r, c in zip(reference, candidate):
            a, b = np.asarray(r[out]) > self.threshold, np.asarray(c[out]) > self.threshold
            union = int(np.count_nonzero(a | b))
            per_sample.append(np.count_nonzero(a & b) / union if union else 1.0)
        value = float(np.mean(per_sample))
        empty = sum(1 for r in reference if not (np.asarray(r[out]) > self.threshold).any())
        text = f"mask IoU {value:.3f} (min {min(per_sample):.2f}) at {self.threshold:g}"
        return TaskScore(self.name, value, text, {"iou": value, "min_iou": min(per_sample),
                                                  "empty_fp32_masks": float(empty)}, tuple(per_sample))


def guess_mask(sample: Outputs) -> str | None:
    """(N, 1, H, W) probabilities: a segmentation or text-probability map (a sigmoid output). Logit maps
    and multi-class maps are not guessed."""
    sole = _sole_output(sample)
    if sole is None or not _is_map(sole[1].shape):
        return None
    a = sole[1]
    import numpy as np

    if not (np.isfinite(a).all() and a.min() >= 0.0 and a.max() <= 1.0):
        return None
    return f"output '{sole[0]}' {a.shape} is a one-channel probability map"


# Sequences (CTC) ---------------------------------------------------------------------------------------


def _is_sequence(shape: tuple[int, ...]) -> bool:
    return len(shape) == 3 and shape[2] >= 3


def _steps_first(shape: tuple[int, ...]) -> bool:
    """(T, 1, C): a time-major CTC output of one image (CRNN exports with an LSTM, ddddocr's
    ``common.onnx``: (steps, 1, 8210) logits). A batch-major one with a single step reads nothing, so
    (T, 1, C) with T > 1 is taken as time-major, the rule ddddocr's own decoder applies."""
    return len(shape) == 3 and shape[1] == 1 and shape[0] > 1


def ctc_greedy(probs: np.ndarray, blank: int = 0) -> list[np.ndarray]:
    """Greedy CTC decode of (N, T, C) scores, or a time-major (T, 1, C) one: per row, the best class per
    step with repeats collapsed and ``blank`` dropped (PaddleOCR's ``CTCLabelDecode``), as class indices.
    Scores may be probabilities or logits: only each step's best class counts."""
    import numpy as np

    a = np.asarray(probs)
    best = (a.transpose(1, 0, 2) if _steps_first(a.shape) else a).argmax(axis=2)
    new = np.ones(best.shape, dtype=bool)
    new[:, 1:] = best[:, 1:] != best[:, :-1]
    return [row[keep & (row != blank)] for row, keep in zip(best, new)]


def edit_distance(a: np.ndarray, b: np.ndarray) -> int:
    """Levenshtein distance of two index sequences; one numpy row per element of ``a``."""
    import numpy as np

    if not len(a) or not len(b):
        return max(len(a), len(b))
    cols = np.arange(len(b) + 1)
    prev = cols.copy()
    for i, x in enumerate(a, start=1):
        t = np.empty_like(prev)
        t[0] = i
        t[1:] = np.minimum(prev[1:] + 1, prev[:-1] + (b != x))
        prev = np.minimum.accumulate(t - cols) + cols  # insertions: new[j] = min(t[j], new[j-1] + 1)
    return int(prev[-1])


def step_probabilities(scores: np.ndarray) -> np.ndarray:
    """(rows, steps, classes) probabilities of CTC scores (N, T, C) or time-major (T, 1, C): as they are
    when every step already sums to 1, else a softmax over the classes."""
    import numpy as np

    a = np.asarray(scores, np.float64)
    a = a.transpose(1, 0, 2) if _steps_first(a.shape) else a
    if _softmax_rows(a, axis=2):
        return a
    e = np.exp(a - a.max(axis=2, keepdims=True))
    return np.asarray(e / e.sum(axis=2, keepdims=True))


def step_agreement(ref: np.ndarray, got: np.ndarray) -> float:
    """The dense form of the sequence metric for one sample: the mean over its rows and steps of the
    probability mass the candidate's symbol distribution shares with FP32's (1 - total variation
    distance; 1.0 is FP32's own)."""
    import numpy as np

    a, b = step_probabilities(ref), step_probabilities(got)
    return float(np.minimum(a, b).sum(axis=2).mean()) if a.size else 1.0


@dataclass(frozen=True)
class SequenceMetric:
    """CTC greedy decodes of (N, T, classes) outputs (or time-major (T, 1, classes); probabilities or
    logits): the share of strings identical to FP32's (the headline) and the character error rate
    against FP32's strings (figure ``cer``). A candidate that reads nothing where FP32 reads text misses,
    at CER 100% for that string. Dense form: the per-step symbol probabilities (``step_agreement``), in
    the rank as ``DENSE_WEIGHT`` more strings."""

    name: str = "sequence"
    blank: int = 0

    def score(self, reference: Sequence[Outputs], candidate: Sequence[Outputs]) -> TaskScore:
        check_pairs(reference, candidate)
        if not reference:
            return TaskScore(self.name, 1.0, "no held-out samples")
        out = _pick(self.name, reference[0], _is_sequence, "(N, T, classes)")
        same = rows = errors = chars = empty = 0
        per_sample, ranked, dense = [], [], []
        share = DENSE_WEIGHT / len(reference)  # a sample's part of the dense form's weight
        for r, c in zip(reference, candidate):
            sample_err = sample_chars = sample_same = sample_rows = 0
            for a, b in zip(ctc_greedy(r[out], self.blank), ctc_greedy(c[out], self.blank)):
                d = edit_distance(a, b)
                sample_rows += 1
                sample_same += int(d == 0)
                empty += int(len(a) > 0 and len(b) == 0)
                sample_err, sample_chars = sample_err + d, sample_chars + len(a)
            rows, same = rows + sample_rows, same + sample_same
            errors, chars = errors + sample_err, chars + sample_chars
            per_sample.append(max(0.0, 1.0 - sample_err / sample_chars) if sample_chars
                              else float(sample_err == 0))
            dense.append(step_agreement(r[out], c[out]))
            ranked.append(blended(sample_same, sample_rows, dense[-1], share))
        value = same / rows if rows else 1.0
        cer = errors / chars if chars else float(errors > 0)
        steps = sum(dense) / len(dense)
        text = f"{same} of {rows} strings as FP32 reads them ({_pct(value)}), CER {100 * cer:.1f}%"
        if empty:
            text += f", {empty} read as empty"
        text += f"; step probabilities agree {steps:.3f}"
        return TaskScore(self.name, value, text, {"agreement": value, "cer": cer, "strings": float(rows),
                                                  "empty": float(empty), "steps": steps}, tuple(per_sample),
                         ranked=blended(same, rows, steps), ranked_per_sample=tuple(ranked))


CTC_BLANK_SHARE = 1 / 3  # logits: the blank is the best class at this share of steps at least (measured:
# ddddocr's CRNN 0.67-0.93 of its steps over 55 lines, PP-OCRv4's recogniser 0.33-0.9; features: ~1/C)


def guess_sequence(sample: Outputs) -> str | None:
    """(N, T, classes) with softmax over classes at every step and several steps: a CTC recogniser's
    output (PP-OCR, CRNN exports apply the softmax). Logits are taken only time-major, (T, 1, classes)
    as CRNN exports with an LSTM write them (ddddocr), and only when class 0 (the CTC blank) is the best
    at a third of the steps or more: features or other logits of that shape rarely favour one class."""
    import numpy as np

    sole = _sole_output(sample)
    if sole is None or not _is_sequence(sole[1].shape):
        return None
    name, a = sole
    if a.shape[1] >= 2 and _softmax_rows(a, axis=2):
        return (f"output '{name}' {a.shape} holds probabilities over {a.shape[2]} symbols "
                f"for {a.shape[1]} steps (CTC, blank 0)")
    if not _steps_first(a.shape) or not np.isfinite(a).all():
        return None
    blank = float(np.mean(a[:, 0, :].argmax(axis=1) == 0))
    if blank < CTC_BLANK_SHARE:
        return None
    return (f"output '{name}' {a.shape} holds time-major scores over {a.shape[2]} symbols for "
            f"{a.shape[0]} steps, class 0 the best at {100 * blank:.0f}% of them (CTC, blank 0)")


METRICS.update({
    "classification": lambda o: ClassificationMetric(
        top_k=int(_options("classification", o, {"top_k": 5})["top_k"])),
    "detection": lambda o: _detection(_options("detection", o, {"score": 0.25, "iou": 0.5, "nms_iou": 0.7,
                                                                 "max_det": 300})),
    "mask": lambda o: MaskMetric(threshold=_options("mask", o, {"threshold": 0.3})["threshold"]),
    "sequence": lambda o: SequenceMetric(blank=int(_options("sequence", o, {"blank": 0})["blank"])),
})


def _detection(o: Mapping[str, float]) -> DetectionMetric:
    return DetectionMetric(score_threshold=o["score"], iou=o["iou"], nms_iou=o["nms_iou"],
                           max_det=int(o["max_det"]))


# Order matters only where shapes overlap: a (N, T, C) softmax is a sequence, not detections.
GUESSES.extend([("classification", guess_classification), ("sequence", guess_sequence),
                ("detection", guess_detection), ("mask", guess_mask)])
