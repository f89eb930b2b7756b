"""``edgeq run pipelines/x.yaml``: a whole run from one file, resumable stage by stage.

The pipeline file (schema: ``PIPELINE``; paths relative to the current directory)::

    name: resnet-like               # the work directory runs/pipeline-<name>/ (default: the file's stem)
    model: zoo:resnet               # an ONNX path, or a model built in code by edgeq.zoo (resnet, yolo, unet)
    model_options: {size: 64}       # zoo builder options (and variant: fp32 | ort | ortfb | torch | modelopt)
    calib: data/calib               # calibration data, or synthetic: N
    preprocess: pipelines/preprocess-imagenet.yaml
    overrides: model.overrides.yaml
    quantize: {calibrator: auto, placement: trt, holdout: data/held, metric: auto, min_metric: 0.95}
    # or max_loss: 0.05: each board kind's first board keeps the cheapest regions float (deploy --max-loss)
    # and weights: auto | nearest | adaround (--weights: the int8 weights' rounding)
    target: orin-agx                # one target, or fleet: FILE, or targets: [...] (as a fleet file's)
    build_once_per_kind: true
    gate: {policy: int8, allow: [/fc/Gemm]}
    profile: {iterations: 10, duration: 3}
    release: {output: release/resnet-like.tar.gz}

Stages: model -> prepare (clean, quantize, lint) -> targets (the fleet's half) -> release. Each stage's
inputs (file contents by sha256, settings by value) are hashed into a key kept in ``state.json``; a
stage whose key and outputs are unchanged is skipped and says so, as make does for a target whose
prerequisites are older than it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from edgeq import __version__, config
from edgeq.errors import ConfigError, EdgeqError, QuantError
from edgeq.findings import ProgressFn, no_progress
from edgeq.fs import output_dir, output_file, sha256_file
from edgeq.pipeline.rundir import StageRecord, write_json
from edgeq.pipeline.shapes import Shapes
from edgeq.pipeline.stages import HOST_STAGES, Prepared, ProfileSettings, has_qdq, prepare_host
from edgeq.quant.quantize import QuantizeOptions
from edgeq.remote.targets import GateConfig, gate_from_dict

_QUANTIZE: dict[str, config.Checker] = {
    "calibrator": config.string, "percentile": config.number, "placement": config.string,
    "holdout": lambda v: v if isinstance(v, str) and v.strip() else config.number(v),
    "metric": config.string, "min_cosine": config.number, "min_metric": config.number,
    "max_loss": config.number, "weights": config.string,
}  # fmt: skip
PIPELINE: dict[str, config.Checker] = {
    "name": config.string,
    "description": config.string,
    "model": config.string,
    "model_options": config.mapping,
    "calib": config.string,
    "synthetic": config.positive_int,
    "preprocess": config.string,
    "overrides": config.string,
    "quantize": config.SECTION,
    "target": config.string,
    "fleet": config.string,
    "targets": config.items,
    "build_once_per_kind": config.boolean,
    "gate": config.mapping,  # its keys: edgeq.remote.targets.gate_from_dict, a target file's gate schema
    "profile": config.SECTION,
    "release": config.SECTION,
    "runs_dir": config.string,
}
SECTIONS: dict[str, dict[str, config.Checker]] = {
    "quantize": _QUANTIZE,
    "profile": {"iterations": config.positive_int, "duration": config.number,
                "warmup_ms": config.positive_int, "minShapes": config.string, "optShapes": config.string,
                "maxShapes": config.string},  # trtexec's shape flags (a model with dynamic inputs)
    "release": {"output": config.string},
}


@dataclass(frozen=True)
class PipelineSpec:
    path: Path
    name: str
    model: str
    model_options: dict[str, Any]
    quantize: QuantizeOptions
    fleet: Optional[dict[str, Any]]  # a fleet file's content (targets: [...]) or {"file": path}
    build_once_per_kind: bool
    gate: Optional[GateConfig]
    profile: ProfileSettings
    release: Optional[Path]
    runs_dir: Path
    # placement: auto (edgeq.orchestration.auto): with targets, each board kind's first board decides
    auto: bool = False


@dataclass(frozen=True)
class Pipeline:
    """What ``deploy --pipeline`` reads of a pipeline file: the file checked whole, its gate kept."""

    path: Path
    model: Optional[str] = None
    target: Optional[str] = None
    calib: Optional[str] = None
    gate: Optional[GateConfig] = None


def load_pipeline(path: Path) -> Pipeline:
    path = Path(path)
    data = config.read_yaml(path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: a pipeline file must be a YAML mapping (model: ..., gate: ...)")
    v = config.check_mapping(path, data, PIPELINE, "", SECTIONS)
    return Pipeline(path=path, model=v.get("model"), target=v.get("target"), calib=v.get("calib"),
                    gate=gate_from_dict(path, data))


def load_spec(path: Path) -> PipelineSpec:
    """Read and check a pipeline file; every problem is one ConfigError naming the file and key."""
    path = Path(path)
    data = config.require_mapping(path, config.read_yaml(path), "model: ..., target: ...")
    v = config.check_mapping(path, data, PIPELINE, sections=SECTIONS)
    if "model" not in v:
        raise ConfigError(f"{path}: missing required key 'model'", "an ONNX path or zoo:resnet|yolo|unet")
    given = [k for k in ("target", "fleet", "targets") if k in v]
    if len(given) > 1:
        raise ConfigError(f"{path}: give one of 'target', 'fleet', 'targets', not {' and '.join(given)}")
    if "calib" in v and "synthetic" in v:
        raise ConfigError(f"{path}: give 'calib' or 'synthetic', not both")
    gate = gate_from_dict(path, data)  # as deploy --pipeline reads it
    fleet: Optional[dict[str, Any]] = None
    if "target" in v:
        fleet = {"targets": [v["target"]]}
    elif "targets" in v:
        fleet = {"targets": v["targets"]}
    elif "fleet" in v:
        fleet = {"file": v["fleet"]}
    release = (v.get("release") or {}).get("output")
    if release and fleet is None:
        raise ConfigError(f"{path}: 'release' needs targets ('target', 'fleet' or 'targets')")
    q = dict(v.get("quantize") or {})
    # auto is the default with targets and calibration data (synthetic data: the rules, as demos had it)
    q.setdefault("placement", "auto" if "calib" in v else "trt")
    # overrides edit the rules' placement; max_loss weighs the rules' regions on each board kind's first board
    auto = (q.get("placement") == "auto" and "overrides" not in v) or "max_loss" in q
    if q.get("placement") == "auto":
        q.pop("placement")
    opt = lambda k: Path(v[k]) if k in v else None  # noqa: E731
    prof = v.get("profile") or {}
    return PipelineSpec(
        path=path,
        name=v.get("name", path.stem),
        model=v["model"],
        model_options=dict(v.get("model_options") or {}),
        quantize=_quantize_options(path, opt("calib"), v.get("synthetic"), opt("preprocess"),
                                   opt("overrides"), q),
        fleet=fleet,
        build_once_per_kind=v.get("build_once_per_kind", False),
        gate=gate,
        profile=ProfileSettings(None, prof.get("iterations", 10), prof.get("duration", 3.0),
                                prof.get("warmup_ms", 200), Shapes(prof.get("minShapes", ""),
                                                                   prof.get("optShapes", ""),
                                                                   prof.get("maxShapes", ""))),
        release=_output(path, "release: output", release, output_file) if release else None,
        runs_dir=_output(path, "runs_dir", v["runs_dir"], output_dir) if "runs_dir" in v else Path("runs"),
        auto=auto and fleet is not None,
    )  # fmt: skip


def _output(path: Path, key: str, value: str, check: Callable[[str], Path]) -> Path:
    """An output the file names, checked as the command line's (``edgeq.fs.output_file``/``output_dir``)
    when the file is read: before any stage runs."""
    try:
        return check(value)
    except EdgeqError as e:
        raise ConfigError(f"{path}: '{key}': {e.message}", e.hint) from None


def _quantize_options(path: Path, calib: Optional[Path], synthetic: Optional[int], preprocess: Optional[Path],
                      overrides: Optional[Path], section: Mapping[str, Any]) -> QuantizeOptions:
    """The file's quantization settings; a value out of range names the file and its 'quantize' section.
    ``placement: implicit`` is refused: a pipeline prepares one model on the host for every target, before
    any target has built the implicit engine it would mirror. ``placement: auto`` is not: there the first
    board of each kind decides at the targets stage (``load_spec`` takes it out of this section)."""
    if section.get("placement") == "implicit":
        raise ConfigError(f"{path}: 'quantize': placement implicit is not supported in pipeline and fleet "
                          "files (the host prepares one model before any target builds an implicit engine)",
                          "use placement auto (each board kind decides), or 'edgeq deploy --placement "
                          "implicit' per target, or trt")
    from edgeq.quant.quantize import holdout_option

    try:
        values = dict(section)
        if "holdout" in values:
            values["holdout"], values["holdout_data"] = holdout_option(values["holdout"])
        return QuantizeOptions(calib=calib, synthetic=synthetic, preprocess=preprocess, overrides=overrides,
                               **values)  # fmt: skip
    except QuantError as e:
        raise ConfigError(f"{path}: 'quantize': {e.message}", e.hint) from None


# --------------------------------------------------------------------------------------------------
# Stage keys
# --------------------------------------------------------------------------------------------------


def _digest(path: Path) -> Any:
    """A file's sha256, or a directory's sorted (relative path, sha256) list."""
    path = Path(path)
    if path.is_dir():
        return sorted((str(p.relative_to(path)), _digest(p)) for p in path.rglob("*") if p.is_file())
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    return sha256_file(path)


@dataclass(frozen=True)
class Hashed:
    """A file hashed once already: in a key it counts as its ``Path`` would, without a second read."""

    digest: Any  # what ``_digest`` returned


def key(**inputs: Any) -> str:
    """One hash over a stage's inputs: values as JSON, files (``Path``) by content."""

    def norm(x: Any) -> Any:
        if isinstance(x, Hashed):
            return {"file": x.digest}
        if isinstance(x, Path):
            return {"file": _digest(x)}
        if isinstance(x, Mapping):
            return {str(k): norm(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [norm(v) for v in x]
        return x

    return hashlib.sha256(json.dumps(norm(inputs), sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class StageOutcome:
    name: str
    status: str  # ran | skipped | failed | not run
    summary: str = ""


@dataclass
class RunResult:
    work_dir: Path
    stages: list[StageOutcome] = field(default_factory=list)
    passed: bool = True
    fleet: Any = None  # FleetResult when the targets stage ran

    def stage(self, name: str) -> StageOutcome:
        return next(s for s in self.stages if s.name == name)


class _State:
    """``state.json``: each finished stage's key and outputs."""

    def __init__(self, work: Path) -> None:
        self.path = work / "state.json"
        try:
            self.data: dict[str, Any] = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # none yet, or unreadable: every stage runs
            self.data = {}
        if not isinstance(self.data, dict):
            self.data = {}

    def fresh(self, stage: str, k: str) -> bool:
        s = self.data.get(stage)
        if not s or s.get("key") != k:
            return False
        return all(Path(p).exists() for p in s.get("outputs", []))

    def done(self, stage: str, k: str, outputs: list[Path], **extra: Any) -> None:
        self.data[stage] = {"key": k, "outputs": [str(p) for p in outputs], **extra}
        write_json(self.path, self.data)

    def forget(self, *stages: str) -> None:
        for s in stages:
            self.data.pop(s, None)
        write_json(self.path, self.data)


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def _model_stage(spec: PipelineSpec, work: Path) -> tuple[Path, str, Optional[Hashed]]:
    """(the model file, its stage key, its hash): a path by content (hashed here, once for the whole
    run), a zoo model by name, options and version (its file is hashed once it is built)."""
    if not spec.model.startswith("zoo:"):
        src = Path(spec.model)
        source = Hashed(_digest(src))
        return src, key(model=source), source
    from edgeq import zoo

    name = spec.model[len("zoo:"):]
    if name not in zoo.ZOO:
        raise ConfigError(f"{spec.path}: 'model': unknown zoo model '{name}'", f"one of {', '.join(zoo.ZOO)}")
    return work / f"{name}.onnx", key(zoo=name, options=spec.model_options, edgeq=__version__), None


def _build_zoo(spec: PipelineSpec, out: Path) -> None:
    from edgeq import zoo
    from edgeq.graph.io import save_model

    opts = dict(spec.model_options)
    variant = opts.pop("variant", "fp32")
    try:
        model = zoo.build(spec.model[len("zoo:"):], variant, **opts)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{spec.path}: 'model_options': {e}") from None
    save_model(model, out)


def _load_prepared(work: Path, state: dict[str, Any]) -> Prepared:
    from edgeq.graph.io import load_model

    model_file = Path(state["model_file"])
    model = load_model(model_file)
    stages = json.loads((work / "host" / "stages.json").read_text())["stages"]
    records = tuple(StageRecord(**s) for s in stages if s["name"] in HOST_STAGES)
    cache = Path(state["cache_file"]) if state.get("cache_file") else None
    return Prepared(model, model_file, has_qdq(model), cache, records)


def _fleet(spec: PipelineSpec, work: Path) -> Any:
    from edgeq.orchestration.fleet_file import load_fleet

    assert spec.fleet is not None
    if "file" in spec.fleet:
        return load_fleet(Path(spec.fleet["file"]))
    inline = work / "fleet.yaml"
    import yaml

    from edgeq.fs import atomic_write_text

    atomic_write_text(inline, yaml.safe_dump(spec.fleet))
    return load_fleet(inline)


def run_pipeline(path: Path, *, on_stage: Callable[[StageOutcome], None] = lambda s: None,
                 on_row: Optional[Callable[[Any], None]] = None, progress: ProgressFn = no_progress,
                 force: bool = False, fresh: bool = False, limit: Optional[str] = None,
                 max_fail: Optional[int] = None) -> RunResult:
    """Run the pipeline file at ``path``; unchanged stages are skipped (``force``: run them all). The
    targets stage resumes: targets that passed with unchanged inputs are reused (``fresh``: all run
    again); ``limit``: an Ansible host pattern over the targets; ``max_fail``: start no more after N
    failures."""
    from edgeq.fs import ensure_dir
    from edgeq.orchestration.auto import AutoOptions, auto_applies
    from edgeq.orchestration.deploy import with_shapes
    from edgeq.orchestration.fleet import FleetOptions, check_gates, validate_prepared
    from edgeq.pipeline.rundir import slug

    spec = load_spec(path)
    fleet = None
    gate = spec.gate or GateConfig()  # no policy: each target's own
    options = FleetOptions(quantize=spec.quantize, gate=gate.policy, gate_allow=gate.allow,
                           gate_require_fusion=gate.require_fusion,
                           build_once_per_kind=spec.build_once_per_kind, profile=spec.profile,
                           fresh=fresh or force, max_fail=max_fail)  # fmt: skip
    work = ensure_dir(spec.runs_dir / f"pipeline-{slug(spec.name)}")
    if spec.fleet is not None:  # usage errors (targets, gate) before any work
        fleet = _fleet(spec, work).limited(limit)
        check_gates(fleet, options)
    elif limit is not None:
        raise ConfigError(f"{spec.path}: --limit needs targets ('target', 'fleet' or 'targets')")
    state = _State(work)
    result = RunResult(work)

    def outcome(name: str, status: str, summary: str) -> None:
        o = StageOutcome(name, status, summary)
        result.stages.append(o)
        on_stage(o)

    # model
    model_path, k, source = _model_stage(spec, work)
    if not force and state.fresh("model", k):
        outcome("model", "skipped", f"unchanged: {model_path}")
    else:
        if spec.model.startswith("zoo:"):
            _build_zoo(spec, model_path)
        state.done("model", k, [model_path])
        outcome("model", "ran", str(model_path))
    model_key = state.data["model"]["key"]
    source = source or Hashed(_digest(model_path))  # the one hash of the model the stages below use
    if fleet is not None:  # a dynamic input without a shape to build for: before any work on it
        options = with_shapes(model_path, options)

    # prepare: clean -> quantize -> lint (placement auto: clean and lint; each board kind quantizes)
    auto = spec.auto and auto_applies(model_path, spec.quantize)
    host_spec = replace(spec.quantize, calib=None, synthetic=None) if auto else spec.quantize
    options = replace(options, auto=AutoOptions() if auto else None)
    k = key(model=model_key, model_file=source, quantize=vars(spec.quantize), auto=auto, edgeq=__version__)
    if not force and state.fresh("prepare", k):
        outcome("prepare", "skipped", f"unchanged: {state.data['prepare']['model_file']}")
    else:
        state.forget("prepare", "targets", "release")
        host = work / "host"
        shutil.rmtree(host, ignore_errors=True)
        try:
            prepared = prepare_host(model_path, host, host_spec, progress)
        except Exception:
            outcome("prepare", "failed", f"stage log: {host / 'stages.json'}")
            raise
        files = [prepared.model_file] + ([prepared.cache_file] if prepared.cache_file else [])
        state.done("prepare", k, files, model_file=str(prepared.model_file),
                   cache_file=str(prepared.cache_file) if prepared.cache_file else None)  # fmt: skip
        outcome("prepare", "ran", "; ".join(f"{s.name} {s.status}" for s in prepared.stages))
    if fleet is None:
        return result

    # targets
    target_files = sorted({str(t.path) for t in fleet.targets})
    k = key(prepared=Path(state.data["prepare"]["model_file"]), targets=[Path(p) for p in target_files],
            fleet_file=fleet.path, names=[t.name for t in fleet.targets],
            gate=vars(spec.gate) if spec.gate else None, profile=vars(spec.profile),
            once=spec.build_once_per_kind, auto=auto)  # fmt: skip
    if not options.fresh and state.fresh("targets", k) and state.data["targets"].get("passed"):
        outcome("targets", "skipped", f"unchanged: {work / 'fleet.json'}")
    else:
        state.forget("targets", "release")
        if options.fresh:
            shutil.rmtree(work / "targets", ignore_errors=True)
        prepared = _load_prepared(work, state.data["prepare"])
        fr = validate_prepared(model_path, prepared, fleet, work, options, on_row=on_row or (lambda r: None),
                               source_sha256=source.digest, resume_from=[work])  # fmt: skip
        result.fleet = fr
        passed = sum(r.passed for r in fr.rows)
        state.done("targets", k, [work / "fleet.json"], passed=fr.passed)
        said = f"{passed}/{len(fr.rows)} targets passed" + ("; interrupted" if fr.interrupted else "")
        outcome("targets", "ran" if fr.passed else "failed", said)
        if not fr.passed:
            result.passed = False
            if spec.release is not None:
                outcome("release", "not run", "not every target passed")
            return result

    # release
    if spec.release is not None:
        from edgeq.release.bundle import build_bundle

        k = key(fleet=work / "fleet.json", output=str(spec.release))
        if not force and state.fresh("release", k):
            outcome("release", "skipped", f"unchanged: {spec.release}")
        else:
            build_bundle(work, spec.release)
            state.done("release", k, [spec.release])
            outcome("release", "ran", str(spec.release))
    return result
