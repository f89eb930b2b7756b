"""Task metrics: each one fails where the task's answer changes and passes where it does not, on outputs
built here in the shapes the real models give (YOLOv8 (1, 4+nc, anchors), DB maps, CTC softmax)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from edgeq.errors import QuantError
from edgeq.quant.metrics import (
    DENSE_WEIGHT,
    METRICS,
    ClassificationMetric,
    CosineMetric,
    DetectionMetric,
    MaskMetric,
    SequenceMetric,
    ctc_greedy,
    edit_distance,
    guess_metric,
    label_margins,
    metric_from_spec,
    step_agreement,
)

# --- helpers: outputs as the real models give them --------------------------------------------------


def yolo(boxes: list[tuple[float, float, float, float, int, float]], classes: int = 3, anchors: int = 64,
         noise: float = 0.1, seed: int = 0) -> np.ndarray:
    """(1, 4 + classes, anchors) like YOLOv8's decoded head: (cx, cy, w, h, class, score) at the first
    anchors, every other anchor a small random box with class scores below ``noise``."""
    rng = np.random.default_rng(seed)
    out = np.zeros((1, 4 + classes, anchors), np.float32)
    out[0, :2] = rng.uniform(0, 320, (2, anchors))
    out[0, 2:4] = rng.uniform(4, 40, (2, anchors))
    out[0, 4:] = rng.uniform(0, noise, (classes, anchors))
    for k, (cx, cy, w, h, c, s) in enumerate(boxes):
        out[0, :4, k] = (cx, cy, w, h)
        out[0, 4:, k] = 0.01
        out[0, 4 + c, k] = s
    return out


def ctc(path: list[int], classes: int = 12, steps: int = 16) -> np.ndarray:
    """(1, steps, classes) softmax rows whose argmax follows ``path`` (padded with blanks, index 0)."""
    idx = (path + [0] * steps)[:steps]
    logits = np.zeros((steps, classes), np.float32)
    logits[np.arange(steps), idx] = 6.0
    e = np.exp(logits)
    return (e / e.sum(axis=1, keepdims=True))[None]


def samples(name: str, *arrays: np.ndarray) -> list[dict[str, np.ndarray]]:
    return [{name: a} for a in arrays]


# --- classification ------------------------------------------------------------------------------------


def test_classification_counts_top1_flips_and_top5_ranks():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(4, 10)).astype(np.float32)
    got = ref.copy()
    order = np.argsort(-ref[1])
    got[1, order[1]] = ref[1, order[0]] + 1.0  # row 1: second-best class wins, FP32's is now 2nd
    got[2, np.argsort(-ref[2])[0]] = ref[2].min() - 1.0  # row 2: FP32's class last
    score = ClassificationMetric().score(samples("p", ref), samples("p", got))
    assert score.value == pytest.approx(0.5)  # rows 0 and 3 agree
    assert score.figures["top5"] == pytest.approx(0.75)  # row 1 still has it in its top 5, row 2 not
    assert "top-1 agreement 50% (2 of 4)" in score.text
    assert ClassificationMetric().score(samples("p", ref), samples("p", ref)).value == 1.0


def test_classification_two_classes_reports_no_top5():
    ref = np.array([[0.9, 0.1]], np.float32)
    score = ClassificationMetric().score(samples("p", ref, ref), samples("p", ref, ref[:, ::-1].copy()))
    assert score.value == 0.5 and "top5" not in score.figures and "top-5" not in score.text
    assert score.worst == (1, 0.0)


# --- detection -----------------------------------------------------------------------------------------

BOXES = [(100.0, 100.0, 40.0, 40.0, 0, 0.8), (200.0, 150.0, 60.0, 30.0, 2, 0.6)]


def test_detection_box_moved_beyond_iou_half_is_lost():
    ref = yolo(BOXES)
    near = yolo([(108.0, 100.0, 40.0, 40.0, 0, 0.8), BOXES[1]])  # IoU 32/48 = 0.67: kept
    far = yolo([(130.0, 100.0, 40.0, 40.0, 0, 0.8), BOXES[1]])  # IoU 10/70 = 0.14: lost
    metric = DetectionMetric()
    assert metric.score(samples("o", ref), samples("o", near)).value == 1.0
    lost = metric.score(samples("o", ref), samples("o", far))
    assert lost.value == 0.5 and lost.figures["kept"] == 1 and lost.figures["fp32_detections"] == 2
    assert lost.text.startswith("50% of FP32 detections kept (1 of 2)")
    assert lost.figures["extra"] == 1 and lost.per_sample == (0.5,)  # the moved box is a new detection


def test_detection_class_change_or_score_below_threshold_is_lost():
    ref = yolo(BOXES)
    other_class = yolo([(100.0, 100.0, 40.0, 40.0, 1, 0.8), BOXES[1]])
    faded = yolo([(100.0, 100.0, 40.0, 40.0, 0, 0.2), BOXES[1]])  # below score 0.25
    assert DetectionMetric().score(samples("o", ref), samples("o", other_class)).value == 0.5
    assert DetectionMetric().score(samples("o", ref), samples("o", faded)).value == 0.5
    # the score threshold is an option: at 0.15 the faded box still counts
    assert METRICS["detection"]({"score": 0.15}).score(samples("o", ref), samples("o", faded)).value == 1.0


def test_detection_low_score_changes_do_not_matter():
    ref = yolo(BOXES, noise=0.1, seed=0)
    got = yolo(BOXES, noise=0.2, seed=1)  # every background anchor changed, all below 0.25
    got[0, :4, :2] += 1.0  # and the real boxes moved a pixel
    score = DetectionMetric().score(samples("o", ref), samples("o", got))
    assert score.value == 1.0 and score.figures["extra"] == 0
    assert CosineMetric().score(samples("o", ref), samples("o", got)).value < 0.9  # cosine sees noise


def test_detection_says_how_many_lost_detections_fp32_itself_barely_made():
    """A loss at FP32's own margin (scored 0.3, threshold 0.25) is told apart from a confident one."""
    faint = (300.0, 300.0, 30.0, 30.0, 1, 0.3)
    ref = yolo([*BOXES, faint])
    marginal = DetectionMetric().score(samples("o", ref), samples("o", yolo(BOXES)))
    assert marginal.figures["lost_near_threshold"] == 1
    assert "; 1 of the 1 lost scored under 0.35 by FP32 itself;" in marginal.text
    # the 0.8 box lost, the faint one kept
    confident = DetectionMetric().score(samples("o", ref), samples("o", yolo([*BOXES[1:], faint])))
    assert confident.figures["lost_near_threshold"] == 0 and "lost scored" not in confident.text
    assert confident.value == pytest.approx(2 / 3)


def test_detection_nms_is_per_class_and_counts_each_object_once():
    dup = [(100.0, 100.0, 40.0, 40.0, 0, 0.8), (102.0, 100.0, 40.0, 40.0, 0, 0.7),  # same class: one
           (101.0, 100.0, 40.0, 40.0, 1, 0.5)]  # another class on the same place: its own detection
    ref = yolo(dup)
    score = DetectionMetric().score(samples("o", ref), samples("o", ref))
    assert score.figures["fp32_detections"] == 2 and score.value == 1.0
    only_first = yolo(dup[:1])
    assert DetectionMetric().score(samples("o", ref), samples("o", only_first)).value == 0.5


def test_detection_sums_over_samples_and_names_the_worst():
    ref = [yolo(BOXES), yolo(BOXES[:1])]
    got = [yolo(BOXES), yolo([])]
    score = DetectionMetric().score(samples("o", *ref), samples("o", *got))
    assert score.value == pytest.approx(2 / 3) and score.worst == (1, 0.0)


def test_detection_decodes_each_output_array_once_while_it_lives(monkeypatch):
    """--calibrator auto scores the same FP32 and candidate outputs at every bound check: each array is
    decoded once per threshold (the display one and the dense one; the same figures as decoding afresh),
    and its decodes are forgotten with it."""
    import gc

    from edgeq.quant import metrics

    calls: list[int] = []
    real = metrics.yolo_detections

    def counted(pred, *args):  # type: ignore[no-untyped-def]
        calls.append(id(pred))
        return real(pred, *args)

    monkeypatch.setattr(metrics, "yolo_detections", counted)
    ref = samples("o", yolo(BOXES), yolo(BOXES[:1], seed=1))
    got = samples("o", yolo(BOXES[:2], seed=2), yolo([], seed=3))
    first = DetectionMetric().score(ref, got)
    again = DetectionMetric().score(ref, got)
    assert len(calls) == 8 and again == first
    other = DetectionMetric(score_threshold=0.7).score(ref, got)  # another threshold: decoded afresh
    assert len(calls) == 12 and other.figures["fp32_detections"] < first.figures["fp32_detections"]
    keys = {id(s["o"]) for s in (*ref, *got)}
    assert keys <= set(metrics._DECODED)
    del ref, got
    gc.collect()
    assert not keys & set(metrics._DECODED)


def test_detection_ranks_a_candidate_that_invents_detections_below_one_that_loses_one():
    """The headline counts FP32's detections kept; what ``--calibrator auto`` compares also counts the
    ones a candidate invents, so keeping everything among many false boxes does not win."""
    ref = yolo(BOXES)
    invented = [(300.0 + 50 * i, 300.0, 30.0, 30.0, 1, 0.7) for i in range(6)]
    noisy = DetectionMetric().score(samples("o", ref), samples("o", yolo(BOXES + invented)))
    lossy = DetectionMetric().score(samples("o", ref), samples("o", yolo(BOXES[:1])))
    assert noisy.value == 1.0 and noisy.figures["extra"] == 6 and "6 new" in noisy.text
    assert lossy.value == 0.5 and lossy.figures["extra"] == 0
    # the rank: kept of FP32's and the new ones, the dense boxes (which the new ones cost as well)
    # counted as DENSE_WEIGHT more detections
    assert noisy.rank == pytest.approx((2 + DENSE_WEIGHT * noisy.figures["dense"]) / (8 + DENSE_WEIGHT))
    assert lossy.rank == pytest.approx((1 + DENSE_WEIGHT * lossy.figures["dense"]) / (2 + DENSE_WEIGHT))
    assert lossy.rank > noisy.rank
    same = DetectionMetric().score(samples("o", ref), samples("o", ref))
    assert same.rank == same.value == 1.0


# --- masks -----------------------------------------------------------------------------------------------


def test_mask_empty_vs_empty_scores_one_where_cosine_lies():
    rng = np.random.default_rng(0)
    ref = rng.uniform(0, 0.05, (1, 1, 32, 32)).astype(np.float32)  # no text: all below 0.3
    got = rng.uniform(0, 0.05, (1, 1, 32, 32)).astype(np.float32)
    got[0, 0, :4] = 0.25  # a faint band, still below the threshold
    assert MaskMetric().score(samples("m", ref), samples("m", got)).value == 1.0
    assert CosineMetric().score(samples("m", ref), samples("m", got)).value < 0.8


def test_mask_iou_of_thresholded_maps_and_its_threshold_option():
    ref = np.zeros((1, 1, 32, 32), np.float32)
    got = np.zeros_like(ref)
    ref[0, 0, 0:10, 0:10] = 0.9
    got[0, 0, 0:10, 5:15] = 0.9  # half overlapping: IoU 50 / 150
    got[0, 0, 20:30, 20:30] = 0.35  # above 0.3, below 0.5
    assert MaskMetric().score(samples("m", ref), samples("m", got)).value == pytest.approx(50 / 250)
    at_half = metric_from_spec("mask", {"threshold": 0.5}).score(samples("m", ref), samples("m", got))
    assert at_half.value == pytest.approx(50 / 150)
    lost = MaskMetric().score(samples("m", ref, ref), samples("m", ref, np.zeros_like(ref)))
    assert lost.value == 0.5 and lost.worst == (1, 0.0)


# --- sequences -------------------------------------------------------------------------------------------


def test_ctc_greedy_collapses_repeats_and_drops_blanks():
    probs = ctc([3, 3, 0, 3, 5, 5, 0, 0, 7])
    assert ctc_greedy(probs)[0].tolist() == [3, 3, 5, 7]
    assert ctc_greedy(probs, blank=3)[0].tolist() == [0, 5, 0, 7, 0]  # the padding's blanks, one run


@pytest.mark.parametrize(("a", "b", "d"), [("kitten", "sitting", 3), ("", "abc", 3), ("abc", "abc", 0),
                                           ("flaw", "lawn", 2), ("abcdef", "azced", 3)])
def test_edit_distance(a, b, d):
    enc = lambda s: np.array([ord(c) for c in s])  # noqa: E731
    assert edit_distance(enc(a), enc(b)) == d


def test_sequence_one_changed_character_moves_cer_and_agreement():
    ref = [ctc([1, 0, 2, 3, 0, 4]), ctc([5, 6, 7])]
    got = [ctc([1, 0, 2, 9, 0, 4]), ctc([5, 6, 7])]  # one character of 7 read differently
    score = SequenceMetric().score(samples("s", *ref), samples("s", *got))
    assert score.value == 0.5
    assert score.figures["cer"] == pytest.approx(1 / 7)
    assert score.text.startswith("1 of 2 strings as FP32 reads them (50%), CER 14.3%")
    assert score.worst == (0, pytest.approx(0.75))


def test_sequence_empty_decode_is_a_miss():
    ref, blank = ctc([1, 2, 3]), ctc([])
    score = SequenceMetric().score(samples("s", ref, blank), samples("s", blank, blank))
    assert score.value == 0.5 and score.figures["cer"] == 1.0 and score.figures["empty"] == 1
    assert "1 read as empty" in score.text



def test_sequence_reads_a_time_major_logits_output_as_ddddocr_writes_it():
    """ddddocr's recogniser returns (steps, 1, 8210) logits, not (1, steps, C) probabilities: read as
    batch-major, every step would be a one-step string and a changed character would go unseen."""
    def time_major_logits(path: list[int]) -> np.ndarray:
        return np.log(ctc(path))[0][:, None, :] * 3.0  # (steps, 1, classes), logits

    ref = [time_major_logits([1, 0, 2, 3, 0, 4]), time_major_logits([5, 6, 7])]
    got = [time_major_logits([1, 0, 2, 9, 0, 4]), time_major_logits([5, 6, 7])]
    assert ctc_greedy(ref[0])[0].tolist() == [1, 2, 3, 4]
    score = SequenceMetric().score(samples("387", *ref), samples("387", *got))
    assert score.value == 0.5 and score.figures["strings"] == 2
    assert score.figures["cer"] == pytest.approx(1 / 7)

# --- options and guesses -------------------------------------------------------------------------------


def test_unknown_option_is_one_clear_error():
    with pytest.raises(QuantError, match="metric mask has no option 'iou'") as e:
        metric_from_spec("mask", {"iou": 0.5})
    assert e.value.hint == "its options: threshold"


def test_metric_on_a_model_without_the_task_shape_names_the_outputs():
    with pytest.raises(QuantError, match=r"needs an output of shape \(N, 1, H, W\).*'y' \(1, 10\)"):
        MaskMetric().score(samples("y", np.zeros((1, 10))), samples("y", np.zeros((1, 10))))


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_guess_recognises_each_task_from_one_sample():
    rng = np.random.default_rng(0)
    assert guess_metric({"p": _softmax(rng.normal(size=(1, 2)), 1)})[0] == "classification"
    assert guess_metric({"o": yolo(BOXES, classes=18, anchors=2100)})[0] == "detection"
    assert guess_metric({"m": rng.uniform(0, 1, (1, 1, 64, 64))})[0] == "mask"
    assert guess_metric({"s": _softmax(rng.normal(size=(1, 40, 97)), 2)})[0] == "sequence"


def test_guess_reads_time_major_ctc_logits_as_a_sequence_only_where_the_blank_leads():
    """ddddocr's CRNN writes (steps, 1, 8210) logits; its class 0 (the CTC blank) was the best at 67-93%
    of the steps of 55 real lines. Such an output is a sequence, scored as one; features or logits of the
    same shape where no class leads stay cosine, and so does the batch-major layout (token logits)."""
    rng = np.random.default_rng(1)
    steps = rng.normal(size=(30, 1, 8210)).astype(np.float32)
    text = rng.integers(1, 8210, size=30)
    for t in range(30):
        steps[t, 0, 0 if t % 3 else text[t]] += 12.0  # blank at two steps of three, a symbol between
    name, why = guess_metric({"387": steps})
    assert name == "sequence" and "time-major" in why and "67%" in why, why
    assert metric_from_spec(name).score([{"387": steps}], [{"387": steps}]).value == 1.0
    assert guess_metric({"h": rng.normal(size=(30, 1, 512))})[0] == "cosine"  # hidden states
    assert guess_metric({"t": steps.transpose(1, 0, 2).copy()})[0] == "cosine"  # (1, 30, C) logits


def test_guess_stays_cosine_where_unsure():
    rng = np.random.default_rng(0)
    # (N, classes) logits are a classifier's, judged by the labels (issue 46); a feature vector of that
    # shape takes --metric cosine, and the reason says so
    name, why = guess_metric({"logits": rng.normal(size=(1, 10))})
    assert name == "classification" and "labels" in why and "--metric cosine" in why
    assert guess_metric({"m": rng.normal(size=(1, 1, 64, 64))})[0] == "cosine"  # a logit map
    two = {"p": _softmax(rng.normal(size=(1, 5)), 1), "emb": rng.normal(size=(1, 128))}
    assert guess_metric(two)[0] == "cosine"  # a second head would go unjudged
    raw = yolo(BOXES, classes=18, anchors=2100)
    raw[0, 4:] = rng.normal(size=raw[0, 4:].shape)  # class logits, not sigmoid scores
    assert guess_metric({"o": raw})[0] == "cosine"


@pytest.mark.parametrize("name", ["yolo", "unet"])
def test_guess_is_cosine_for_the_zoo_models(name):
    from edgeq.zoo.exporters import random_inputs
    from edgeq.zoo.registry import ZOO

    model = ZOO[name]()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = sess.run(None, random_inputs(model))
    sample = {o.name: a for o, a in zip(sess.get_outputs(), outs)}
    assert guess_metric(sample) == ("cosine", "no task recognised from the outputs")


# --- dense forms: every sample informs the rank (issue 46) -------------------------------------------------


def test_label_margin_breaks_ties_between_as_many_labels_and_never_outweighs_one():
    ref = np.array([[4.0, 1.0, 0.0], [0.0, 3.0, 2.0]])
    assert label_margins(ref, ref).tolist() == [1.0, 1.0]
    unsure = np.array([[2.5, 1.0, 0.0], [0.0, 2.5, 2.0]])  # the same labels, half the margins or less
    np.testing.assert_allclose(label_margins(ref, unsure), [0.75, 0.75])
    flipped = np.array([[1.0, 4.0, 0.0], [0.0, 3.0, 2.0]])  # the first label lost
    assert label_margins(ref, flipped).tolist() == [0.0, 1.0]
    metric = ClassificationMetric()
    same, worse, lost = (metric.score(samples("p", ref), samples("p", c)) for c in (ref, unsure, flipped))
    assert same.rank == 1.0 and worse.value == same.value == 1.0 and worse.rank < same.rank
    assert lost.rank < worse.rank  # a label lost outweighs any margin kept
    assert "label margin kept 0.750" in worse.text


def test_step_probabilities_rank_strings_read_alike():
    ref = ctc([3, 4, 5])
    flat = ref * 0.7 + 0.3 / ref.shape[2]  # the same argmax at every step, less sure
    assert step_agreement(ref, ref) == pytest.approx(1.0)
    assert 0.7 < step_agreement(ref, flat) < 0.8  # 0.7 of each step's mass kept, a little more shared
    same, unsure = (SequenceMetric().score(samples("s", ref), samples("s", c)) for c in (ref, flat))
    assert same.rank == pytest.approx(1.0) and unsure.value == 1.0 > unsure.rank
    assert unsure.rank == pytest.approx((1 + DENSE_WEIGHT * unsure.figures["steps"]) / (1 + DENSE_WEIGHT))


def test_a_detection_decided_on_one_fp32_box_goes_by_the_boxes_below_the_threshold():
    """The issue's "1 of 1": FP32 finds one detection over the display threshold and several boxes
    under it. A candidate that keeps the one (0.3 -> 0.26) but loses or moves every box under it ranks
    below one that lets the one slip under the threshold (0.24) and keeps the rest as FP32 has them."""
    faint = [(40.0 + 60 * i, 200.0, 30.0, 30.0, i % 3, 0.2 - 0.02 * i) for i in range(5)]
    ref = yolo([(100.0, 100.0, 40.0, 40.0, 0, 0.3), *faint])
    keeps = yolo([(100.0, 100.0, 40.0, 40.0, 0, 0.26)])  # the faint boxes gone
    slips = yolo([(100.0, 100.0, 40.0, 40.0, 0, 0.24), *faint])
    a, b = (DetectionMetric().score(samples("o", ref), samples("o", c)) for c in (keeps, slips))
    assert a.value == 1.0 and b.value == 0.0  # the headline: "1 of 1" against "0 of 1"
    assert b.figures["dense"] > a.figures["dense"] and b.rank > a.rank
