"""The engines ``edgeq compare --target`` compares: one calibration, several builds on one target.

From one set of calibration statistics: (a) implicit INT8 (the FP32 model + the calibration cache, FP16
allowed), (b) explicit INT8 with edgeq's placement, (c) explicit with ``--placement all`` (the
onnxruntime-style baseline), optionally (d) FP16 and (e) a Q/DQ model of the user's. Each is built and
profiled by the same deploy run (one call site: ``deploy_one``); a build that fails is an ``Engine``
with its TensorRT error, not an abort. A failure before any build (connection, host key, probe: no
TensorRT on the target) stops everything at the build stage with that one message.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from edgeq.errors import EdgeqError, QuantError, RemoteError
from edgeq.findings import ProgressFn, no_progress
from edgeq.pipeline.shapes import Shapes
from edgeq.quant.quantize import QuantizeOptions
from edgeq.remote.targets import Target
from edgeq.report.compare_engine import Engine
from edgeq.report.runlog import RunFigures

# Deploy stages whose failure is this variant's own (its TensorRT build or run), not the target's.
BUILD_STAGES = ("build", "inspect", "profile")


@dataclass(frozen=True)
class VariantOptions:
    # The one calibration every variant comes from: its data (``calib``) and calibrator.
    quantize: QuantizeOptions = field(default_factory=QuantizeOptions)
    fp16: bool = False  # also build an FP16 engine
    qdq_model: Optional[Path] = None  # also build this Q/DQ model
    accept_new_host_key: bool = False
    runs_dir: Path = Path("runs")
    shapes: Shapes = field(default_factory=Shapes)  # a model with dynamic inputs: --minShapes/...


def with_variant_shapes(model: Path, options: VariantOptions) -> VariantOptions:
    """Every variant is built with one optimization profile (``edgeq.pipeline.shapes``), resolved before
    any work: the flags, else the calibration data's shape."""
    from edgeq.pipeline.shapes import resolve_shapes

    return replace(options, shapes=resolve_shapes(model, options.shapes, options.quantize))


@dataclass(frozen=True)
class Variant:
    name: str
    model: Path
    calib_cache: Optional[Path] = None  # implicit INT8: built with this TensorRT calibration cache


@dataclass(frozen=True)
class TargetEngines:
    run_dir: Path
    engines: tuple[Engine, ...]
    findings: tuple[Any, ...] = ()  # lint findings of the float model (explain regions)
    gated: tuple[str, ...] = ("explicit",)  # the variants a relative gate judges (not the comparison ones)
    placement: Optional[Any] = None  # compare --placement auto: the decision (``auto.AutoDeploy``)

    def require_baseline(self, target: str) -> None:
        """A baseline (the first row) that did not build on the target is the target's failure (exit 1),
        not a usage error: there is nothing to compare the other rows against."""
        base = self.engines[0] if self.engines else None
        if base is not None and not base.built:
            raise RemoteError(f"compare --target: the baseline '{base.name}' did not build on {target}: "
                              f"{base.error}", f"each build's log is under {self.run_dir}", exit_code=1)


def _stem(model: Path) -> str:
    return model.name[: -len(".onnx")] if model.name.endswith(".onnx") else model.name


@dataclass(frozen=True)
class Calibrated:
    """One calibration of a float model: its cleaned FP32 ``reference``, the rules' plan and the amax of
    every float activation (which covers any placement's Q/DQ tensors and the implicit cache)."""

    reference: Any  # onnx.ModelProto
    plan: Any  # edgeq.quant.placement.Plan: the 8.6 rules' placement
    amax: dict[str, float]
    stem: str


def calibrate_once(model_path: Path, options: QuantizeOptions, *, holdout: bool = False
                   ) -> tuple[Calibrated, Any]:  # fmt: skip
    """(the calibration, the held-out samples or None): all of the data (``holdout``: less
    ``--holdout``), ``options``' calibrator, one pass."""
    from edgeq.graph.io import graph_from_model, load_model
    from edgeq.quant.placement import plan_placement
    from edgeq.quant.quantize import calibrate, calibration_data, prepare_model, split_data

    reference, _, _ = prepare_model(load_model(model_path))
    data = calibration_data(reference, options)
    held = None
    if holdout:
        data, held, _ = split_data(data, options, reference)
    plan = plan_placement(graph_from_model(reference), "trt")
    amax = calibrate(reference, plan, data, options, held=held)
    return Calibrated(reference, plan, amax, _stem(model_path)), held


def implicit_variant(cal: Calibrated, out_dir: Path, options: QuantizeOptions) -> Variant:
    """The implicit pair: the cleaned FP32 model and the calibration cache of its tensors."""
    from edgeq.graph.io import save_model
    from edgeq.quant.cache import write_calibration_cache
    from edgeq.quant.quantize import cache_ranges

    fp32 = save_model(cal.reference, out_dir / f"{cal.stem}.implicit.fp32.onnx")
    cache_path = out_dir / f"{cal.stem}.implicit.cache"
    write_calibration_cache(cache_path, cache_ranges(cal.plan, cal.amax, options))
    return Variant("implicit", Path(fp32), cache_path)


def placed_variant(cal: Calibrated, plan: Any, name: str, out_dir: Path) -> Variant:
    """A Q/DQ model of ``cal.reference`` placed by ``plan``, scaled from the one calibration."""
    from edgeq.graph.io import graph_from_model, model_from_graph, save_model
    from edgeq.quant.qdq import insert_qdq

    graph = graph_from_model(cal.reference)
    insert_qdq(graph, plan, plan.scale_amax(cal.amax))
    qdq = model_from_graph(graph, like=cal.reference)
    return Variant(name, Path(save_model(qdq, out_dir / f"{cal.stem}.{name}.onnx")))


def quantize_variants(model_path: Path, out_dir: Path, options: QuantizeOptions) -> list[Variant]:
    """Calibrate once (all of the data, ``options``' calibrator); write the implicit pair (FP32 model +
    cache) and both explicit placements, each from those ranges (``edgeq.quant.quantize``'s steps)."""
    from edgeq.graph.io import graph_from_model
    from edgeq.quant.placement import plan_placement

    cal, _ = calibrate_once(model_path, options)
    every = plan_placement(graph_from_model(cal.reference), "all")
    return [implicit_variant(cal, out_dir, options), placed_variant(cal, cal.plan, "explicit", out_dir),
            placed_variant(cal, every, "explicit-all", out_dir)]  # fmt: skip


def side_variants(options: VariantOptions, fp32_model: Path) -> tuple[list[Variant], list[str]]:
    """The variants every ``compare --target`` adds beside its placements: ``fp16`` (the FP32 model under
    ``--fp16``) and the user's ``--qdq-model``, gated like edgeq's explicit engine: (variants, gated
    names)."""
    variants: list[Variant] = []
    gated: list[str] = []
    if options.fp16:
        variants.append(Variant("fp16", fp32_model))
    if options.qdq_model is not None:
        variants.append(Variant(f"user:{_stem(options.qdq_model)}", Path(options.qdq_model)))
        gated.append(variants[-1].name)
    return variants, gated


def deploy_one(
    variant: Variant, target: Target, options: VariantOptions, runs: Path, progress: ProgressFn
) -> Any:
    """The one place compare calls deploy: build, inspect and profile one variant, no gate."""
    from edgeq.orchestration.deploy import DeployOptions, deploy
    from edgeq.pipeline.stages import ProfileSettings

    failed: list[str] = []

    def on_event(line: str) -> None:
        stage, _, rest = line.partition(": ")
        if rest.startswith("failed"):
            failed.append(stage)

    opts = DeployOptions(
        accept_new_host_key=options.accept_new_host_key,
        gate="none",
        runs_dir=runs,
        # implicit INT8 with FP16 allowed, as trtexec --int8 --fp16; the explicit ones alike
        profile=ProfileSettings(fp16=True, shapes=options.shapes),
        calib_cache=variant.calib_cache,
    )
    try:
        return deploy(variant.model, target, opts, progress=progress, on_event=on_event)
    except EdgeqError as e:
        if failed and failed[-1] in BUILD_STAGES:
            return e  # this variant's own failure: a row
        raise RemoteError(
            f"build stage: cannot build '{variant.name}' on {target.name}: {e.message}",  # its hint once
            e.hint or "see the run directory's stages.json",
            exit_code=e.exit_code,
        ) from None


def variant_engine(variant: Variant, result: Any) -> Engine:
    from edgeq.report.compare_engine import engine_from_path

    if isinstance(result, EdgeqError):
        return Engine(variant.name, None, error=str(result), files=(str(variant.model),))
    engine = engine_from_path(result.run_dir, name=variant.name)
    t = result.timings
    qps = t.get("throughput_qps")
    lat = (t.get("latency_ms") or {}).get("median")
    gpu = (t.get("gpu_compute_ms") or {}).get("median")
    if qps is None and lat is None:
        return engine
    run = RunFigures(str(result.run_dir / "timings.json"), qps, lat, gpu)
    return Engine(engine.name, engine.report, run, files=engine.files)


def engines_on_target(
    model: Path,
    target: Target,
    options: VariantOptions,
    *,
    progress: ProgressFn = no_progress,
) -> TargetEngines:
    """Quantize once, build every variant on ``target``, read back each engine (see the module doc)."""
    from edgeq.graph.rules import lint_model

    float_model = check_float_model(model, target, options, "compare --target")
    options = with_variant_shapes(model, options)
    run_dir = compare_dir(model, target, options)
    variants = quantize_variants(model, run_dir, options.quantize)
    side, gated = side_variants(options, variants[0].model)
    variants += side
    gated = ["explicit", *gated]
    runs = run_dir / "runs"
    engines = [variant_engine(v, deploy_one(v, target, options, runs, progress)) for v in variants]
    return TargetEngines(run_dir, tuple(engines), tuple(lint_model(float_model)), tuple(gated))


def check_float_model(model: Path, target: Target, options: VariantOptions, what: str) -> Any:
    """The float model a composition starts from, read; refused (one line) without calibration data or
    with Q/DQ nodes already, and the target's key files checked, before any work."""
    from edgeq.graph.io import load_model
    from edgeq.pipeline.stages import has_qdq

    model = Path(model)
    if not model.is_file():
        raise QuantError(
            f"{model}: {'not a file' if model.exists() else 'no such file'}", "check the model path"
        )
    if options.quantize.calib is None:
        raise QuantError(
            f"{what} needs --calib: the implicit and explicit engines come from one calibration",
            "give calibration data (.npy/.npz files or images)",
        )
    float_model = load_model(model)
    if has_qdq(float_model):
        raise QuantError(
            f"{model}: already has Q/DQ nodes; {what} starts from the float model",
            "give the FP32 model" + (", and your Q/DQ model with --qdq-model" if "compare" in what else ""),
        )
    if not target.is_local:
        target.ssh_config(options.accept_new_host_key)  # key files checked before any work
    return float_model


def compare_dir(model: Path, target: Target, options: VariantOptions) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(options.runs_dir) / f"compare-{_stem(model)}-{target.name}-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=False)
    return run_dir


def implicit_baseline(
    run: Any, target: Target, options: VariantOptions, progress: ProgressFn = no_progress
) -> Engine:
    """``deploy --baseline implicit``: the implicit INT8 engine of a finished deploy run that quantized a
    float model (its cleaned FP32 model and the calibration cache from the same statistics), built and
    profiled the same way, into ``<run>/baseline/``."""
    run_dir = Path(run.run_dir)
    caches = sorted(run_dir.glob("*.int8.cache"))
    models = sorted(run_dir.glob("*.clean.onnx"))
    if len(caches) != 1 or len(models) != 1:
        raise QuantError(
            f"{run_dir}: this run wrote no calibration cache: --baseline implicit needs a float model "
            "and --calib",
            "deploy the float model with --calib (the implicit engine uses the same statistics)",
        )
    variant = Variant("implicit", models[0], caches[0])
    return variant_engine(variant, deploy_one(variant, target, options, run_dir / "baseline", progress))


def engine_of_run(run: Any, name: str = "explicit") -> Engine:
    """A finished deploy run as an ``Engine`` (its layers, profile and timings)."""
    return variant_engine(Variant(name, Path(run.run_dir)), run)
