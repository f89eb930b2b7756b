"""``edgeq quantize``: clean -> place -> calibrate -> insert Q/DQ -> calibration cache -> accuracy check.

One pass of statistics serves both TensorRT paths: the Q/DQ scales of the explicit model and the
calibration cache of the implicit one are written from the same histograms.

Decision on what the cache covers: every float activation tensor of the cleaned FP32 model, not only
the ones the plan quantizes. TensorRT's implicit path decides after fusion which layers run INT8 and
then needs a range for each of their inputs and outputs (Developer Guide 'Setting Dynamic Range': "all
floating-point inputs and outputs of an operation that will execute in INT8"); a tensor missing from the
cache keeps that layer out of INT8. Tensors in one scale group get the group's shared amax there too, so
the implicit engine sees the equal Concat scales the explicit one has. The names are those of the
cleaned model (cleaning folds, removes and renames tensors), so ``quantize_file`` saves that model beside
the cache as ``<name>.int8.fp32.onnx``: build the implicit engine from it, not from the original.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeq.errors import QuantError, first_line
from edgeq.findings import Finding, ProgressFn, no_progress
from edgeq.quant.accuracy import AccuracyReport, HeldOut
from edgeq.quant.overrides import Overrides
from edgeq.quant.placement import PLACEMENTS
from edgeq.quant.plan import Plan
from edgeq.quant.rules import RULES

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import numpy as np
    import onnx
    import onnx_graphsurgeon as gs

    from edgeq.quant.autocalib import Choice
    from edgeq.quant.calibrate import CalibOptions, TensorHistogram
    from edgeq.quant.data import CalibrationSet
    from edgeq.quant.mirror import MirrorReport
    from edgeq.quant.rounding import Rounding
    from edgeq.quant.sensitivity import KeptFloat, QdqRegion

log = logging.getLogger(__name__)
IMPLICIT = "implicit"  # --placement implicit: the implicit engine built on a target, mirrored
OFFLINE_IMPLICIT = ("--placement implicit builds the implicit engine on a target: use deploy, compare "
                    "--target or tune with it, or quantize --from-engine LAYERS.json")


@dataclass(frozen=True)
class QuantizeOptions:
    """One quantization's settings, files by path: ``edgeq quantize``'s flags, and the quantize step of
    deploy, fleet, run, compare, tune and demo. Names follow the CLI flags (trtexec/Polygraphy where they
    match)."""

    calib: Path | None = None  # calibration data: a directory or one file (.npy/.npz, images)
    synthetic: int | None = None  # or N random samples (demos)
    preprocess: Path | None = None  # images: the preprocessing spec (YAML)
    calibrator: str = "auto"  # auto (each scored on the held-out set, the best kept) | entropy | max | ...
    percentile: float = 99.99
    placement: str = "trt"  # trt | all | implicit (a target's implicit engine mirrored, or --from-engine's)
    overrides: Path | Overrides | None = None  # the override file (YAML), or overrides already read
    # without holdout_data: the fraction of the data kept out of calibration; None (the default): none
    # kept out, every sample calibrates and is scored (``split_data``)
    holdout: float | None = None
    holdout_data: Path | None = None  # --holdout DIR: a separate held-out set (all of --calib calibrates)
    metric: str = "auto"  # the accuracy check's task metric (edgeq.quant.metrics), auto: read from outputs
    min_cosine: float | None = None  # accuracy gate
    min_metric: float | None = None  # accuracy gate on the task metric's headline figure
    cache_path: Path | None = None  # write the TensorRT calibration cache here
    cache_all_tensors: bool = True  # cache every activation tensor (implicit path), not just the plan's
    providers: tuple[str, ...] | None = None  # onnxruntime providers; None: CUDA when present, else CPU
    from_engine: Path | None = None  # mirror this implicit engine's layer JSON instead of the rules
    max_loss: float | None = None  # keep the worst regions float until 1 - metric <= this (sensitivity)
    # the weights' int8 rounding: nearest (TensorRT's own), adaround (learned from the calibration data's
    # activations, edgeq.quant.rounding), or auto: adaround where --calibrator auto's held-out scoring
    # says it helps, nearest otherwise
    weights: str = "auto"

    def __post_init__(self) -> None:
        if self.placement not in (*PLACEMENTS, IMPLICIT):
            raise QuantError(f"unknown placement '{self.placement}'", hint="use trt, all or implicit")
        if self.placement == IMPLICIT and self.overrides is not None:
            raise QuantError("--placement implicit places every Q/DQ where the implicit engine ran INT8: "
                             "--overrides does not apply", hint="leave out --overrides, or use placement trt")
        if self.from_engine is not None and (self.placement == "all" or self.overrides is not None):
            raise QuantError("--from-engine places every Q/DQ where the engine ran INT8",
                             hint="leave out --placement all and --overrides with it")
        if self.holdout is not None and not 0.0 <= self.holdout < 1.0:
            raise QuantError(f"--holdout must be in [0, 1), got {self.holdout}")
        if self.min_cosine is not None and not -1.0 <= self.min_cosine <= 1.0:
            raise QuantError(f"--min-cosine must be in [-1, 1], got {self.min_cosine}")
        if self.holdout_data is not None and not Path(self.holdout_data).exists():
            raise QuantError(f"{self.holdout_data}: held-out data not found", hint="--holdout takes a "
                             "directory (or file) of held-out samples, or a fraction of --calib")
        if self.metric != "auto":
            from edgeq.quant.metrics import metric_from_spec

            metric_from_spec(self.metric)  # an unknown name or unloadable module:function: said first
        if self.max_loss is not None and not 0.0 <= self.max_loss < 1.0:
            raise QuantError(f"--max-loss must be in [0, 1) (1 - the metric; FP32 scores 1), "
                             f"got {self.max_loss}")
        from edgeq.quant.rounding import WEIGHTS

        if self.weights not in WEIGHTS:
            raise QuantError(f"unknown --weights '{self.weights}'", hint=f"use {', '.join(WEIGHTS)}")
        if self.max_loss is not None and (self.placement == IMPLICIT or self.from_engine is not None):
            raise QuantError("--max-loss keeps regions float as --overrides does: placement trt or all",
                             hint="leave out --placement implicit and --from-engine")
        self.calibration()  # the calibrator and its percentile

    @property
    def has_data(self) -> bool:
        return self.calib is not None or self.synthetic is not None

    def calibration(self) -> CalibOptions:
        """How ranges are computed (``collect_ranges``'s options); an unknown calibrator is refused here."""
        from edgeq.quant.autocalib import AUTO, AUTO_FALLBACK
        from edgeq.quant.calibrate import CalibOptions

        method = AUTO_FALLBACK if self.calibrator == AUTO else self.calibrator
        return CalibOptions(method=method, percentile=self.percentile, providers=self.providers)

    @property
    def gated(self) -> bool:
        return self.min_cosine is not None or self.min_metric is not None

    def read_overrides(self) -> Overrides | None:
        if self.overrides is None or isinstance(self.overrides, Overrides):
            return self.overrides
        from edgeq.quant.overrides import load_overrides

        return load_overrides(self.overrides)

    def check_inputs(self) -> None:
        """The option files a quantization reads (overrides, image preprocessing), checked before any
        work: a bad file is the user's, said before a run directory exists."""
        self.read_overrides()
        if self.preprocess is not None:
            from edgeq.quant.data import load_preprocess

            load_preprocess(self.preprocess)


def holdout_option(value: str | float | Path | None) -> tuple[float | None, Path | None]:
    """``--holdout`` (and a pipeline's ``holdout:``): a fraction of ``--calib`` (a number), or a separate
    held-out set (a path): (fraction, path or None); not given: (None, None), every sample scored."""
    if value is None:
        return None, None
    if isinstance(value, (int, float)):
        return float(value), None
    text = str(value).strip()
    try:
        return float(text), None
    except ValueError:
        pass
    if not text:
        raise QuantError("--holdout is empty", hint="give a directory of held-out samples or a fraction")
    return QuantizeOptions.holdout, Path(text)


@dataclass(frozen=True)
class QuantizeResult:
    model: onnx.ModelProto  # the Q/DQ model
    reference: onnx.ModelProto  # the cleaned FP32 model (accuracy reference, implicit path)
    plan: Plan
    amax: dict[str, float]  # calibrated amax per tensor, before scale sharing
    scales: dict[str, float]  # activation tensor -> Q/DQ scale in the model
    cache: dict[str, float]  # tensor -> amax written to the calibration cache
    accuracy: AccuracyReport | None
    options: QuantizeOptions
    calibration_samples: int
    holdout_samples: int
    clean_changes: tuple[str, ...] = ()
    clean_findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    paths: dict[str, str] = field(default_factory=dict)
    mirror: MirrorReport | None = None  # --from-engine: how the engine mapped onto the model
    choice: Choice | None = None  # the calibrator used (auto: every one tried, with its score)
    max_loss: KeptFloat | None = None  # --max-loss: the regions kept float, the metric before and after
    # each dynamic input's shapes in the calibration and held-out data, first seen first, with how many
    # samples had each: what deploy builds the optimization profile from (edgeq.pipeline.shapes)
    input_shapes: dict[str, list[tuple[tuple[int, ...], int]]] = field(default_factory=dict)

    blame: tuple[tuple[QdqRegion, float], ...] = ()  # wrecked: what a quick sensitivity pass blames

    @property
    def ok(self) -> bool:
        """False when the accuracy gate (--min-cosine, --min-metric) failed, the result is far below FP32
        with no bound of the user's (a wrecked model) or --max-loss was not reached."""
        reached = self.max_loss is None or self.max_loss.reached
        return reached and (self.accuracy is None or bool(self.accuracy)) and not self.wrecked

    @property
    def wrecked(self) -> bool:
        """Far below FP32 with no bound of the user's, on real data (``--synthetic`` random inputs say
        nothing of the task: there it is a note)."""
        return self.accuracy is not None and self.accuracy.wrecked and self.options.synthetic is None

    def wrecked_message(self, model: str | Path) -> tuple[str, str]:
        """(the failure, the fix) of a wrecked model, as one line each: what is far below and where, the
        regions a quick sensitivity pass blames, the ``--max-loss`` command that would recover it and
        how to accept it; ``model``: the path the user quantized."""
        assert self.accuracy is not None
        said = f"accuracy far below FP32: {self.accuracy.wrecked_text()}"
        if self.blame:
            said += "; a quick sensitivity pass blames " + ", ".join(
                f"{_nodes_text(r.nodes)} ({gain:+.4f} kept float)" for r, gain in self.blame)
        fix = (f"keep the worst regions float: {max_loss_command(model, self.options)} (then give deploy "
               "the override file it writes with --overrides); or accept this result with --min-metric 0")
        return said, fix

    def summary_line(self) -> str:
        """One line for logs and the demo: what was quantized, what stayed float and why, accuracy."""
        plan = self.plan
        why = ", ".join(f"{r} {n}" for r, n in sorted(plan.float_by_rule().items(), key=lambda kv: -kv[1]))
        line = (f"{len(plan.sites)} activation Q/DQ pairs, {len(plan.weights)} int8 weights, "
                f"{len(plan.commuted)} INT8 by commuting, {len(plan.floats)} left float"
                + (f" ({why})" if why else ""))
        line += f"; {self.mirror.summary_line()}" if self.mirror is not None else ""
        line += f"; {self.choice.summary()}" if self.choice is not None and self.choice.auto else ""
        line += f"; {self.rounding_line()}" if self.rounding_line() else ""
        return line + (f"; {self.accuracy}" if self.accuracy is not None else "")

    def rounding_line(self) -> str:
        """What the learned rounding did and whether the model holds it ('' when none was learned)."""
        from edgeq.quant.rounding import ADAROUND

        choice = self.choice
        if choice is None or choice.rounding is None:
            return ""
        if choice.weights == ADAROUND:
            return choice.rounding.summary()
        return f"{choice.rounding.summary()}; not kept: nearest rounding scored as well or better on held-out"

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan
        used = sorted({s.rule for s in plan.sites} | {f.rule for f in plan.floats}
                      | ({"data-movement"} if plan.commuted else set())
                      | {w.rule for w in plan.weights})
        shared = {g: m for g, m in plan.groups.items() if len(m) > 1 or plan.commuted_in(g)}
        return {
            **self.paths,
            "placement": plan.mode,
            "calibrator": self.choice.method if self.choice is not None else self.options.calibrator,
            "calibrators": self.choice.to_dict()["candidates"] if self.choice is not None else [],
            "weight_rounding": self.choice.weights if self.choice is not None else "nearest",
            "rounding": (self.choice.rounding.to_dict() if self.choice is not None and self.choice.rounding
                         is not None else None),
            "thin_evidence": self.choice.evidence or None if self.choice is not None else None,
            "samples": {"calibration": self.calibration_samples, "holdout": self.holdout_samples},
            "quantized": {
                "activations": len(plan.sites),
                "weights": len(plan.weights),
                "weights_by_axis": plan.weights_by_axis(),
                "int8_by_commute": len(plan.commuted),
                "scale_groups_shared": len(shared),
                "scale_groups_by_rule": plan.shared_groups_by_rule(),
            },
            "float": {"count": len(plan.floats), "by_rule": plan.float_by_rule()},
            "activations": [
                {"tensor": s.tensor, "rule": s.rule, "scale": self.scales.get(s.tensor), "group": s.group,
                 "consumers": list(s.consumers)}
                for s in plan.sites
            ],
            "weights": [{"tensor": w.tensor, "node": w.node, "axis": w.axis} for w in plan.weights],
            "commuted": [{"tensor": t, "rule": "data-movement", "group": plan.group_of(t)}
                         for t in plan.commuted],
            "float_tensors": [{"tensor": f.tensor, "rule": f.rule} for f in plan.floats],
            "overrides": {"excluded": list(plan.excluded), "forced": list(plan.forced)},
            "rules": {r: {"description": RULES[r].description, "source": RULES[r].source} for r in used},
            "cache_tensors": len(self.cache),
            "accuracy": self.accuracy.to_dict() if self.accuracy is not None else None,
            "clean": {"changes": list(self.clean_changes),
                      "findings": [f.to_dict() for f in self.clean_findings]},
            "notes": list(self.notes),
            "wrecked": ({"blame": [{**r.to_dict(), "recovered": gain} for r, gain in self.blame]}
                        if self.wrecked else None),
            **({"mirror": self.mirror.to_dict()} if self.mirror is not None else {}),
            **({"max_loss": self.max_loss.to_dict()} if self.max_loss is not None else {}),
            **({"input_shapes": {name: [{"shape": list(shape), "samples": n} for shape, n in seen]
                                 for name, seen in self.input_shapes.items()}} if self.input_shapes else {}),
            "ok": self.ok,
        }


def prepare_model(model: onnx.ModelProto, progress: ProgressFn = no_progress, *, cleaned: bool = False
                  ) -> tuple[onnx.ModelProto, tuple[str, ...], tuple[Finding, ...]]:
    """Clean (no verify), refuse an already-quantized model, raise opset to 13, name nodes, infer shapes.

    ``cleaned``: the model is ``clean_model``'s output already (deploy's clean stage ran): not cleaned
    a second time."""
    from edgeq.graph.clean import clean_model
    from edgeq.graph.io import half_types, infer_shapes, opset_of
    from edgeq.graph.passes.base import CleanOptions
    from edgeq.quant.placement import ensure_node_names

    quantized = [n.name or n.op_type for n in model.graph.node
                 if n.op_type in ("QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul")]
    if quantized:
        raise QuantError(
            f"the model is already quantized ({len(quantized)} Q/DQ nodes, e.g. '{quantized[0]}')",
            hint="edgeq quantize takes a float model; use 'edgeq clean' and 'edgeq lint' on Q/DQ models")
    # Q/DQ of float16 needs opset 19 and 8.6's scales are float32: an FP16 export would calibrate, then
    # fail in onnxruntime with an opaque type error. TensorRT picks FP16 itself (--fp16).
    halfs = half_types()
    half = [t.name for t in model.graph.initializer if t.data_type in halfs] + [
        i.name for i in model.graph.input if i.type.tensor_type.elem_type in halfs]
    if half:
        raise QuantError(f"the model is float16/bfloat16 ({len(half)} tensors, e.g. '{half[0]}'); "
                         "edgeq quantize needs an FP32 model", hint="export it in FP32")
    changes: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()
    if cleaned:
        work = type(model)()
        work.CopyFrom(model)  # names are given in place below; the caller's model stays as it is
    else:
        result = clean_model(model, CleanOptions(verify=False), progress)
        work, findings = result.model, tuple(result.findings)
        changes = tuple(f"{c.pass_name}: {c.message}" for c in result.changes)
    if opset_of(work) < 13:
        from onnx import version_converter

        try:
            work = version_converter.convert_version(work, 13)
        except Exception as e:  # the converter raises plain RuntimeErrors/ValueErrors from C++
            raise QuantError(f"cannot raise opset {opset_of(work)} to 13 for per-channel Q/DQ: "
                             f"{first_line(e)}") from None
        changes += ("opset: raised to 13 (per-channel DequantizeLinear needs its axis attribute)",)
    ensure_node_names(work)
    return infer_shapes(work), changes, findings


def calibration_data(model: onnx.ModelProto, options: QuantizeOptions) -> CalibrationSet:
    """``options.calib`` (or ``synthetic`` random samples) indexed and checked against the model's inputs."""
    from edgeq.quant.data import calibration_set

    return calibration_set(model, options.calib, synthetic=options.synthetic, preprocess=options.preprocess)


def data_shapes(model: onnx.ModelProto, sets: Sequence[CalibrationSet]
                ) -> dict[str, list[tuple[tuple[int, ...], int]]]:  # fmt: skip
    """Each dynamic input's shapes over ``sets`` (the calibration data, its held-out part included, and
    ``--holdout DIR``'s), first seen first, with their sample counts (``QuantizeResult.input_shapes``).
    Images are not decoded again: each remembers its shape from the runs that read it."""
    from edgeq.graph.shapes import dynamic_inputs

    dynamic = [name for name, _ in dynamic_inputs(model)]
    if not dynamic:
        return {}
    counts: dict[str, dict[tuple[int, ...], int]] = {name: {} for name in dynamic}
    for d in sets:
        for shapes in d.shapes():
            for name in dynamic:
                if name in shapes:
                    shape = tuple(int(x) for x in shapes[name])
                    counts[name][shape] = counts[name].get(shape, 0) + 1
    return {name: list(seen.items()) for name, seen in counts.items() if seen}


def quantize_model(
    model: onnx.ModelProto,
    data: CalibrationSet,
    options: QuantizeOptions = QuantizeOptions(),
    progress: ProgressFn = no_progress,
    *,
    cleaned: bool = False,
) -> QuantizeResult:
    """Quantize a float model for TensorRT 8.6; ``model`` is not modified.

    Writes the calibration cache when ``options.cache_path`` is set; returns everything else in memory.
    ``cleaned``: ``model`` is ``clean_model``'s output already (see ``prepare_model``). Built from
    ``prepare_model``, ``plan_for``, ``split_data``, ``calibrate`` and ``cache_ranges``, which
    ``compare --target`` and ``tune`` call for their own placements from the same statistics.
    """
    from edgeq.graph.io import graph_from_model
    from edgeq.quant.cache import write_calibration_cache

    reference, changes, findings = prepare_model(model, progress, cleaned=cleaned)
    graph = graph_from_model(reference)
    plan, mirror = plan_for(graph, options)
    calib, held, notes = split_data(data, options, reference)
    if mirror is None:  # the rules placed it: say where they have no measured word
        from edgeq.graph import registry

        notes = (*registry.notes(graph), *notes)
    if options.gated and held is None:
        raise QuantError("the accuracy gate needs held-out samples",
                         hint="give --holdout DIR, or at least 2 samples and a --holdout fraction above 0")
    choice, held_out, notes = calibrate_and_choose(reference, plan, calib, held, options, notes, progress)
    kept = None
    if options.max_loss is not None:  # the worst regions excluded, as --overrides would
        from edgeq.quant.sensitivity import apply_max_loss

        plan, choice, kept = apply_max_loss(reference, choice, held_out, options, progress)
    accuracy = None
    if held_out is not None and choice.outputs is not None:
        accuracy = held_out.report(choice.outputs, threshold=options.min_cosine,
                                   min_metric=options.min_metric)
    blame: tuple[tuple[QdqRegion, float], ...] = ()
    if accuracy is not None and accuracy.wrecked and options.synthetic is not None:
        notes = (*notes, f"far below FP32 on --synthetic data ({accuracy.wrecked_text()}): random inputs say "
                         "nothing of the task; check with --calib")
    elif accuracy is not None and accuracy.wrecked and held_out is not None and kept is None and \
            options.placement in ("trt", "all") and options.from_engine is None:
        from edgeq.quant.sensitivity import quick_blame

        blame = tuple(quick_blame(reference, choice, held_out, options, progress=progress))

    # Written last: bad held-out data (NaN) raises above and must not leave a cache behind.
    cache = cache_ranges(plan, choice.amax, options)
    if options.cache_path is not None:
        write_calibration_cache(options.cache_path, cache)
    return QuantizeResult(
        model=choice.model, reference=reference, plan=plan, amax=choice.amax,
        scales=qdq_scales(plan, choice.amax), cache=cache, accuracy=accuracy, options=options,
        calibration_samples=len(calib), holdout_samples=len(held) if held is not None else 0,
        clean_changes=changes, clean_findings=findings, notes=notes, mirror=mirror, choice=choice,
        max_loss=kept, blame=blame,
        input_shapes=data_shapes(model, [data, held] if held is not None and held is not data
                                 and options.holdout_data is not None else [data]),
    )


def build_qdq(reference: onnx.ModelProto, plan: Plan, amax: dict[str, float],
              rounding: Mapping[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """The Q/DQ model of ``plan`` with scales from ``amax`` (shared within scale groups); ``reference``
    is not modified, so each calibrator's candidate is built from the same float model. ``rounding``:
    learned int8 weights (``edgeq.quant.rounding``) in place of nearest rounding's."""
    from edgeq.graph.io import check_model, graph_from_model, model_from_graph
    from edgeq.quant.qdq import insert_qdq

    graph = graph_from_model(reference)
    insert_qdq(graph, plan, plan.scale_amax(amax), rounding)
    qdq = model_from_graph(graph, like=reference)
    check_model(qdq, name="quantized model")
    return qdq


def qdq_scales(plan: Plan, amax: dict[str, float]) -> dict[str, float]:
    """Activation tensor -> the Q/DQ scale ``build_qdq`` gives it (the shared amax's ``activation_scale``)."""
    from edgeq.quant.calibrate import activation_scale

    return {t: activation_scale(a) for t, a in plan.scale_amax(amax).items()}


def calibrate_and_choose(
    reference: onnx.ModelProto, plan: Plan, calib: CalibrationSet, held: CalibrationSet | None,
    options: QuantizeOptions, notes: tuple[str, ...] = (), progress: ProgressFn = no_progress,
) -> tuple[Choice, HeldOut | None, tuple[str, ...]]:
    """One statistics pass over ``calib``, the FP32 reference run once on ``held``, then the calibrator:
    ``--calibrator auto`` scores each on the held-out task metric and keeps the best (``autocalib``)."""
    from edgeq.quant.calibrate import collect_histograms

    hists = collect_histograms(reference, calibrated_tensors(plan, options), calib, options.calibration(),
                               progress)
    return choose(reference, plan, hists, held, options, notes, progress, calib=calib)


def choose(
    reference: onnx.ModelProto, plan: Plan, hists: Mapping[str, TensorHistogram], held: CalibrationSet | None,
    options: QuantizeOptions, notes: tuple[str, ...] = (), progress: ProgressFn = no_progress, *,
    calib: CalibrationSet | None = None,
) -> tuple[Choice, HeldOut | None, tuple[str, ...]]:
    """The calibrator from collected histograms (``calibrate_and_choose``'s second half; ``edgeq
    sensitivity`` keeps the histograms to rank regions by how much they clip), and the weights'
    rounding (``--weights``; learned from ``calib``'s activations)."""
    from edgeq.quant.accuracy import held_out_reference
    from edgeq.quant.autocalib import (
        AUTO,
        AUTO_CANDIDATES,
        choose_calibrator,
        end_tensors,
        scorer,
    )
    from edgeq.quant.metrics import METRICS, bounded

    calib_opts = options.calibration()
    held_out = None
    if held is not None and len(held):
        held_out = held_out_reference(reference, held, metric=options.metric, source=held_source(options),
                                      providers=options.providers, progress=progress)
    methods: tuple[str, ...] = (calib_opts.method,)
    extra: list[str] = []
    if options.calibrator == AUTO:
        if held_out is None:
            extra.append(f"--calibrator auto needs held-out samples to score: used {calib_opts.method}")
        elif options.synthetic is not None:
            extra.append(f"--calibrator auto on synthetic data scores nothing real: used {calib_opts.method}")
        else:
            methods = AUTO_CANDIDATES
    score = None
    perfect = None  # what FP32's own outputs score (1.0 built in): a candidate reaching it cannot be beaten
    if held_out is not None and bounded(held_out.metric):
        perfect = 1.0 if held_out.metric.name in METRICS else held_out.metric.score(
            held_out.outputs, held_out.outputs).rank
    if held_out is not None:
        score = scorer(held_out.metric, held_out.outputs, held_out.data, options.providers, progress,
                       bounded=perfect is not None)
    from edgeq.quant.rounding import ADAROUND, NEAREST
    from edgeq.quant.rounding import AUTO as WEIGHTS_AUTO

    weights: tuple[str, ...] = (NEAREST,)
    if options.weights == ADAROUND:
        weights = (ADAROUND,)
    elif options.weights == WEIGHTS_AUTO and len(methods) > 1 and plan.weights:  # scored: where it helps
        if held is calib:  # no --holdout: the samples score what was fitted on them
            extra.append(IN_SAMPLE_ROUNDING)
        else:
            weights = (NEAREST, ADAROUND)
    learned: list[Rounding] = []  # learned on the first candidate that needs it

    def build(amax: dict[str, float], rounding: str) -> onnx.ModelProto:
        if rounding == NEAREST:
            return build_qdq(reference, plan, amax)
        if not learned:
            if calib is None:
                raise QuantError("the learned weight rounding needs the calibration data")  # a caller's bug
            from edgeq.quant.rounding import learn_rounding

            learned.append(learn_rounding(reference, plan, calib, providers=options.providers,
                                          progress=progress))
        return build_qdq(reference, plan, amax, learned[0].values)

    choice = choose_calibrator(methods, hists, calib_opts, build, score, progress, needed=plan.tensors,
                               perfect=perfect, ends=end_tensors(reference, plan) if len(methods) > 1 else (),
                               weights=weights)
    if learned:
        choice = replace(choice, rounding=learned[0])
    return choice, held_out, (*notes, *extra, *([choice.evidence] if choice.evidence else []))


# --weights auto without held-out samples: the learned rounding chooses ~10% of the weights' roundings
# from 16 of the samples, so scored on those samples it would win by fitting them (a calibrator fits one
# range a tensor: ``split_data`` scores those in-sample).
IN_SAMPLE_ROUNDING = ("nearest weight rounding: --weights auto scores the learned rounding only on samples "
                      "it was not learned from (--holdout DIR, or a fraction of --calib)")


# The loss a wrecked model's advice asks ``--max-loss`` for: within 5% of FP32 by the task metric.
MAX_LOSS_ADVICE = 0.05


def max_loss_command(model: str | Path, options: QuantizeOptions, max_loss: float = MAX_LOSS_ADVICE) -> str:
    """The ``edgeq quantize`` command line that reruns ``options`` on ``model`` with ``--max-loss``."""
    import shlex

    argv = ["edgeq", "quantize", str(model)]
    if options.calib is not None:
        argv += ["--calib", str(options.calib)]
    elif options.synthetic is not None:
        argv += ["--synthetic", str(options.synthetic)]
    if options.preprocess is not None:
        argv += ["--preprocess", str(options.preprocess)]
    if options.holdout_data is not None:
        argv += ["--holdout", str(options.holdout_data)]
    elif options.holdout is not None:
        argv += ["--holdout", f"{options.holdout:g}"]
    if options.metric != "auto":
        argv += ["--metric", options.metric]
    if options.calibrator != "auto":
        argv += ["--calibrator", options.calibrator]
        if options.calibrator == "percentile" and options.percentile != QuantizeOptions.percentile:
            argv += ["--percentile", f"{options.percentile:g}"]
    if options.weights != QuantizeOptions.weights:
        argv += ["--weights", options.weights]
    if options.placement != "trt":
        argv += ["--placement", options.placement]
    if isinstance(options.overrides, (str, Path)):
        argv += ["--overrides", str(options.overrides)]
    return shlex.join([*argv, "--max-loss", f"{max_loss:g}"])


def _nodes_text(nodes: tuple[str, ...], shown: int = 2) -> str:
    more = len(nodes) - shown
    return ", ".join(nodes[:shown]) + (f" and {more} more" if more > 0 else "")


def plan_for(graph: gs.Graph, options: QuantizeOptions) -> tuple[Plan, MirrorReport | None]:
    """Where the Q/DQ go: the placement rules (``--placement``, ``--overrides``), or the implicit engine's
    INT8 edges (``--from-engine``) with how the engine mapped onto the model."""
    from edgeq.quant.placement import describe, plan_placement

    mirror = None
    if options.placement == IMPLICIT and options.from_engine is None:
        raise QuantError(OFFLINE_IMPLICIT)
    if options.from_engine is not None:
        from edgeq.quant.mirror import load_engine, plan_from_engine

        plan, mirror = plan_from_engine(graph, load_engine(options.from_engine))
    else:
        plan = plan_placement(graph, options.placement, options.read_overrides())
    if log.isEnabledFor(logging.DEBUG):
        for line in describe(plan):
            log.debug(line)
    return plan, mirror


SELF_SCORED = "the calibration samples themselves (give --holdout DIR for a separate set)"


def held_source(options: QuantizeOptions) -> str:
    """Where the held-out samples come from, as the accuracy check says it."""
    if options.holdout_data is not None:
        return f"--holdout {options.holdout_data}"
    if options.holdout is None:
        return SELF_SCORED
    return f"{options.holdout:.0%} of --calib (give --holdout DIR for a separate set)"


def split_data(data: CalibrationSet, options: QuantizeOptions, model: onnx.ModelProto | None = None
               ) -> tuple[CalibrationSet, CalibrationSet | None, tuple[str, ...]]:
    """(the calibration part, the held-out part for the accuracy check or None, notes).

    ``--holdout DIR`` (``options.holdout_data``): that separate set, read for ``model``'s inputs, and all
    of ``data`` calibrates. No ``--holdout`` (``options.holdout`` None, the default): every sample
    calibrates and is scored. Why: a first-time user has a few dozen samples and no held-out set; a fifth
    of them kept out left ``--calibrator auto`` deciding on 5-7 samples ("1 of 1" detection), while a
    calibrator fits ranges, not labels, so scoring it on the samples it was fitted on risks little (the
    accuracy bench's figures: the docs). ``--holdout F``: that fraction kept out, when there are two
    samples or more (a slice of the calibration data, said so).
    """
    notes = list(data.notes)
    if options.holdout_data is not None:
        from edgeq.quant.data import calibration_set

        if model is None:
            raise QuantError("--holdout DIR needs the model to read the held-out set for")  # a caller's bug
        held = calibration_set(model, options.holdout_data, preprocess=options.preprocess)
        return data, held, tuple(notes)
    if options.holdout is None:
        notes.append(f"scored on the {len(data)} calibration samples themselves (they calibrate too); "
                     "--holdout DIR checks on a separate set")
        return data, data, tuple(notes)
    if options.holdout > 0 and len(data) >= 2:
        calib, held = data.split(options.holdout)
        notes.append(f"held-out samples: {len(held)} of --calib's {len(data)}, not calibrated on; "
                     "--holdout DIR checks on a separate set")
        return calib, held, tuple(notes)
    if options.holdout > 0:
        notes.append("one calibration sample: nothing held out, no accuracy check")
    return data, None, tuple(notes)


def calibrated_tensors(plan: Plan, options: QuantizeOptions) -> list[str]:
    """Every float activation (the implicit path needs them all), or only the plan's Q/DQ tensors."""
    return list(plan.activations) if options.cache_all_tensors else plan.tensors


def calibrate(reference: onnx.ModelProto, plan: Plan, data: CalibrationSet, options: QuantizeOptions,
              progress: ProgressFn = no_progress, held: CalibrationSet | None = None) -> dict[str, float]:
    """amax per tensor (before scale sharing) by ``--calibrator``, in one pass over ``data``: the Q/DQ
    scales of any placement of ``reference`` and the implicit calibration cache all come from it.
    ``held``: the held-out samples ``--calibrator auto`` scores on (without them auto is entropy).
    The ranges alone: the calibrators are scored with nearest rounding, which is what the callers (tune,
    compare --target) build their Q/DQ models with."""
    nearest = replace(options, weights="nearest")
    return calibrate_and_choose(reference, plan, data, held, nearest, (), progress)[0].amax


def cache_ranges(plan: Plan, amax: dict[str, float], options: QuantizeOptions) -> dict[str, float]:
    """The calibration cache's ranges: every calibrated tensor, with its scale group's shared amax so the
    implicit engine sees the equal Concat scales the explicit one has."""
    shared = plan.scale_amax(amax)
    return {t: shared.get(t, amax[t]) for t in calibrated_tensors(plan, options) if t in amax}


def implicit_model_path(cache_path: str | Path) -> Path:
    """``model.int8.cache`` -> ``model.int8.fp32.onnx`` beside it: the FP32 model the cache is for.

    Named after the cache, not the input: the two files are a pair (``trtexec --int8
    --calib=model.int8.cache --onnx=model.int8.fp32.onnx``), so they share a prefix and sit side by
    side, also with ``--cache`` elsewhere. Not ``<name>.clean.onnx``: that is ``edgeq clean``'s output,
    a different file (verified, opset kept), which this must not overwrite.
    """
    p = Path(cache_path)
    stem = p.name[: -len(p.suffix)] if p.suffix and p.suffix != p.name else p.name
    return p.with_name(f"{stem}.fp32.onnx")


def quantize_file(
    path: str | Path,
    options: QuantizeOptions = QuantizeOptions(),
    *,
    output: str | Path | None = None,
    progress: ProgressFn = no_progress,
    engine: str | Path | None = None,
) -> QuantizeResult:
    """The whole command on files: read, quantize, write ``<name>.int8.onnx`` (explicit path),
    ``<name>.int8.cache`` with ``<name>.int8.fp32.onnx`` (implicit path: the cleaned FP32 model whose
    tensor names the cache uses) and the summary ``<output stem>.json`` (what ``--json`` prints).
    The calibration data is ``options.calib`` (or ``synthetic``, with ``preprocess`` for images).
    With ``max_loss``, also ``<output stem>.overrides.yaml``: the regions kept float, as an override
    file (``--overrides`` replays it); ``engine`` (an earlier deploy's layer JSON and profile) prices them.

    The input is never written; the outputs appear together or not at all (``fs.staged_outputs``).
    """
    import json

    from edgeq.fs import atomic_write_text, check_writable, staged_outputs
    from edgeq.graph.io import default_output, load_model, save_model
    from edgeq.quant.cache import write_calibration_cache

    options.check_inputs()
    if options.placement == IMPLICIT and options.from_engine is None:
        raise QuantError(OFFLINE_IMPLICIT)  # before any output path is checked or data read
    src = Path(path)
    out = Path(output) if output is not None else default_output(src, "int8")
    if out.is_dir():  # first: the names below derive from it ('-o ""' is '.')
        raise QuantError(f"{out}: is a directory, not a file to write the model to", "give -o a file path")
    stem = out.name[: -len(".onnx")] if out.name.endswith(".onnx") else out.name
    summary = out.with_name(f"{stem}.json")
    kept_float = out.with_name(f"{stem}.overrides.yaml") if options.max_loss is not None else None
    # Named after -o, beside it (<name>.int8.cache by default): two runs into one directory with
    # different -o must not overwrite each other's cache, and the input's directory stays untouched.
    cache = options.cache_path or out.with_name(f"{stem}.cache")
    fp32 = implicit_model_path(cache)
    for what, p in (("output", out), ("cache", cache), ("FP32 model", fp32)):
        if src.exists() and Path(p).exists() and Path(p).resolve() == src.resolve():
            raise QuantError(f"the {what} path {p} is the input model", hint="choose another -o/--cache path")
    roles = (("output", out), ("cache", Path(cache)), ("FP32 model", fp32), ("summary", summary),
             *((("override file", kept_float),) if kept_float is not None else ()))
    for i, (what, p) in enumerate(roles):  # one file each: a later write would replace an earlier one
        for other, q in roles[:i]:
            if p.resolve() == q.resolve():
                raise QuantError(f"the {other} and the {what} would both be {q}",
                                 hint="choose another -o/--cache path")
    from edgeq.quant.data.preprocess import is_preset

    spec = None if options.preprocess is None or is_preset(options.preprocess) else options.preprocess
    given = (src, options.calib, spec, options.from_engine, engine, options.holdout_data,
             options.overrides if isinstance(options.overrides, (str, Path)) else None)
    inputs = tuple(i for i in given if i is not None)
    for p in (out, cache, fp32, summary, *([kept_float] if kept_float else [])):  # before any work
        check_writable(p, inputs=inputs)
    if options.from_engine is not None:  # a bad layer JSON fails before the model and data are read
        from edgeq.quant.mirror import load_engine

        load_engine(options.from_engine)
    if engine is not None:  # nor a bad --engine
        from edgeq.report.compare_engine import engine_from_path

        if options.max_loss is None:
            raise QuantError("--engine prices the regions --max-loss keeps float", "add --max-loss X")
        engine_from_path(engine)
    read: list[Path] = []
    model = load_model(src, sources=read)
    for p in (out, cache, fp32, summary):  # nor onto the input's external data
        check_writable(p, inputs=tuple(read))
    data = calibration_data(model, options)
    result = quantize_model(model, data, replace(options, cache_path=None), progress)
    result = replace(result, options=replace(result.options, cache_path=Path(cache)),
                     paths={"input": str(src), "output": str(out), "cache": str(cache),
                            "fp32_model": str(fp32), "summary": str(summary)})
    if result.max_loss is not None and kept_float is not None:
        from edgeq.quant.sensitivity import overrides_text, speed_cost

        priced = replace(result.max_loss, speed=speed_cost(engine, result.reference, result.max_loss.nodes))
        result = replace(result, max_loss=priced, paths={**result.paths, "overrides_file": str(kept_float)})
    with staged_outputs() as staged:  # all or none: a full disk midway leaves nothing behind
        if result.max_loss is not None and kept_float is not None:
            text = overrides_text(options.read_overrides(), result.max_loss, f"edgeq quantize {src.name}")
            atomic_write_text(staged.path(kept_float), text)
        write_calibration_cache(staged.path(cache), result.cache)
        save_model(result.reference, staged.path(fp32))
        save_model(result.model, staged.path(out))
        atomic_write_text(staged.path(summary), json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    return result
