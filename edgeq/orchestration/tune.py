"""``edgeq tune``: Q/DQ placement decided by the target's own timings.

Calibrate once; build the implicit INT8 engine on the target (TensorRT's own per-layer precision
choice); start from its mirror (``edgeq.quant.mirror``: a Q/DQ on every edge it read INT8) with decisions
both ways: a mirror site a tunable rule also places tried float, a site the rules place where implicit
kept float tried INT8 (``edgeq.quant.decisions``; an INT8 region the rules and the mirror leave float by
``float-entry`` tried as one decision, all its sites and weights); then a greedy local search: each
decision toggled
against the current best, built and profiled on the target through deploy
(``edgeq.orchestration.variants``), kept only when faster and within ``--min-cosine`` on held-out data
(checked on the host first: a candidate that fails it is never built). The time budget stops the search
before a build that would overrun it.

"Faster" is decided by paired re-timing (``edgeq.orchestration.retime``), not by one timing each: single
trtexec timings of one engine design spread by a few percent, more than most decisions are worth. A
candidate whose one timing is clearly slower (``CLEARLY_SLOWER``) is refused at once; any other is timed
against the best in ``--rounds`` alternating rounds and kept only when its median paired ratio reaches
``MIN_GAIN`` and no round has it slower. The tuned engine and the implicit one are timed the same way
at the end: that paired ratio is the figure the report and the relative gate use. Re-timings leave
out the host<->device copies of the bindings (``--noDataTransfers``): every candidate copies the same
tensors, and the copies' time belongs to the bus, not to the placement.

Every measurement lands in ``tune.state.json`` as soon as it is taken, keyed by the candidate's sites,
so an interrupted run started again with the same output directory rebuilds nothing it measured (the
calibration ranges are kept there too). The target's timing cache (``build.timing_cache``) is shared by
every build. Outputs: ``<stem>.tuned.onnx``, ``<stem>.tuned.cache`` (implicit-path calibration cache from
the same statistics), ``tune.json`` and ``tune.html`` (every decision: candidates, measured times,
accuracy, what chose it).

``--placement trt`` starts from the rules instead, with the implicit engine's FP16 choices mirrored
(``edgeq.quant.decisions.decision_points``: sites whose consumers implicit ran FP16 start float). The default
(no ``--placement``: ``TuneOptions.fallback``) takes that start when the implicit engine does not mirror
onto the model, and any run does when the mirror's start is unusable (accuracy, build); ``start_from`` in
``tune.json`` says which start and why. Under ``--placement auto`` (the CLI's default) the start is the
placement cache's decision for the key when it kept the explicit engine; on a miss tune starts from the mirror
and, that start measured, decides and caches it as deploy does (``_record_start``). From the mirror the gate
allowlists the nodes implicit itself ran
in FP16/FP32 (``edgeq.orchestration.implicit``). ``--overrides`` (e.g. the file ``quantize --max-loss``
writes) starts from the rules with those nodes float, and the precision gate allowlists them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from edgeq.errors import EdgeqError, QuantError
from edgeq.findings import ProgressFn, no_progress
from edgeq.pipeline.shapes import Shapes
from edgeq.quant.decisions import IMPLICIT_FP16, Decision, candidate_key, candidate_plan, decision_points
from edgeq.quant.quantize import QuantizeOptions
from edgeq.remote.targets import Target
from edgeq.text import plain

STATE = "tune.state.json"
STATE_VERSION = 1
# Below this fraction of the best's single timing a candidate is slower beyond the spread one engine
# design shows (0.97x-1.03x for identical engines, tests/fixtures/trt86-h100-placed): refused untimed.
CLEARLY_SLOWER = 0.95
# A candidate is kept when its paired median is at least this much faster than the best and every round
# has it faster: ties keep the placement the rules chose. Paired rounds of engines with the same layers
# spread 0.983x-1.002x (tests/fixtures/trt86-h100-tune/paired/yolob8.tune.json, tuned against implicit);
# a median of 1.011x with one round at 0.996x was kept before the every-round condition, and is noise.
MIN_GAIN = 1.01


def parse_budget(text: str) -> float:
    """``20m`` / ``90s`` / ``1h`` / ``1h30m`` / a plain number of seconds -> seconds."""
    s = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return float(s)
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", s)
    if not s or parts is None:
        raise QuantError(f"--budget {text}: not a duration", "e.g. 20m, 90s, 1h30m or seconds")
    h, m, sec = (int(x or 0) for x in parts.groups())
    return float(h * 3600 + m * 60 + sec)


MIRRORED = ("mirror", "cache")  # starts that mirror an implicit engine (a cached one was a mirror too)
# The accuracy bound a candidate must keep against FP32 on held-out data when none is given.
MIN_COSINE = 0.99


@dataclass(frozen=True)
class TuneOptions:
    # The one calibration (``calib``, calibrator, holdout) and the accuracy bound (``min_cosine``).
    quantize: QuantizeOptions
    out_dir: Optional[Path] = None  # default: <model stem>.tune/ beside the model
    budget_s: float = 20 * 60
    accept_new_host_key: bool = False
    rounds: int = 3  # paired re-timing rounds per decision (0: decide on single timings)
    # With placement "implicit": start from the rules (and say why) when the implicit engine does not
    # mirror onto the model; False (``--placement implicit`` given) stops with the error instead.
    fallback: bool = False
    shapes: Shapes = field(default_factory=Shapes)  # a model with dynamic inputs: --minShapes/... as given
    # --placement auto (``auto.AutoOptions``; the CLI's default): start from the placement cache's decision
    # for this model, data, TensorRT and GPU when it kept an explicit placement, else as ``implicit``
    auto: Optional[Any] = None

    @property
    def min_cosine(self) -> float:
        bound = self.quantize.min_cosine
        return MIN_COSINE if bound is None else bound


@dataclass
class Measured:
    """One engine measured on the target (or a candidate refused on the host for its accuracy)."""

    key: str
    qps: Optional[float] = None
    latency_ms: Optional[float] = None
    cosine: Optional[float] = None
    accuracy_ok: bool = True
    run_dir: Optional[str] = None
    error: Optional[str] = None
    build_s: float = 0.0

    @property
    def usable(self) -> bool:
        return self.accuracy_ok and self.error is None and self.qps is not None


@dataclass
class TuneResult:
    out_dir: Path
    implicit: Measured
    start: Measured
    best: Measured
    decisions: list[dict[str, Any]]
    state: dict[str, bool]
    stopped: Optional[str] = None  # why the search ended early (budget)
    files: dict[str, str] = field(default_factory=dict)
    gate: dict[str, Any] = field(default_factory=dict)
    built: int = 0  # engines built by this invocation
    reused: int = 0  # measurements taken from the state file
    final: Optional[dict[str, Any]] = None  # implicit and tuned timed in alternation (Paired.to_dict)
    # where the search started: {"placement": "mirror" | "cache" | "rules", "not_mirror": why not, when
    # asked, "cache": what the placement cache said under --placement auto}
    start_from: dict[str, Any] = field(default_factory=dict)

    @property
    def started(self) -> str:
        """Where the search started, as people read it (the CLI's line, the HTML report's head)."""
        cache = self.start_from.get("cache")
        if self.start_from.get("placement") == "cache":
            return f"the placement --placement auto decided on this kind of target ({cache})"
        if self.start_from.get("placement") == "mirror":
            return "the mirror of the implicit engine" + (f" ({cache})" if cache else "")
        why = self.start_from.get("not_mirror")
        return "edgeq's rules" + (f" ({why})" if why else "")

    @property
    def speedup(self) -> Optional[float]:
        """Tuned over implicit throughput: the paired median when there is one, else single timings."""
        return self.final["ratio"] if self.final else _ratio(self.best, self.implicit)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"implicit": asdict(self.implicit), "start": asdict(self.start), "best": asdict(self.best),
                "start_from": self.start_from,
                "speedup_vs_implicit": self.speedup, "paired_vs_implicit": self.final,
                "decisions": self.decisions, "final_state": self.state, "stopped": self.stopped,
                "builds": {"this_run": self.built, "reused": self.reused}, "files": self.files,
                "gate": self.gate}  # fmt: skip


def _ratio(a: Measured, b: Measured) -> Optional[float]:
    return round(a.qps / b.qps, 4) if a.qps and b.qps else None


def _fingerprints(model: Path, calib: Path, target: Target, options: TuneOptions) -> dict[str, str]:
    """What a state file's measurements depend on: the model, the data, the target and the settings; one
    per start (``--placement`` trt or implicit), to tell a run of the other start when resuming."""
    from edgeq.fs import sha256_file
    from edgeq.orchestration.placement_cache import hash_data_files

    h = hashlib.sha256(sha256_file(model).encode())
    hash_data_files(h, Path(calib))
    q = options.quantize
    settings: list[Any] = [target.name, target.host, target.trtexec, q.calibrator, q.holdout,
                           options.min_cosine]
    settings += [q.percentile] if q.calibrator == "percentile" else []  # what only that calibrator reads
    ov = q.read_overrides()
    settings += [list(ov.exclude), list(ov.force)] if ov is not None else []  # --overrides
    out = {}
    for start in ("trt", "implicit"):
        each = h.copy()
        extra = ["placement implicit"] if start == "implicit" else []  # another start, other candidates
        each.update(json.dumps(settings + extra).encode())
        out[start] = each.hexdigest()[:24]
    return out


class _State:
    """``tune.state.json``: calibration ranges and every measurement, rewritten after each one."""

    def __init__(self, path: Path, fingerprint: str, others: Optional[dict[str, str]] = None) -> None:
        """``others``: the fingerprint of this run with another ``--placement`` each, to say which one an
        earlier run in ``path`` used."""
        self.path = path
        self.data: dict[str, Any] = {"version": STATE_VERSION, "fingerprint": fingerprint, "amax": None,
                                     "measured": {}, "paired": {}}  # fmt: skip
        if path.is_file():
            old = json.loads(path.read_text())
            started = [k for k, f in (others or {}).items() if old.get("fingerprint") == f]
            if started and old.get("version") == STATE_VERSION:
                raise QuantError(f"{path.parent}: holds a tuning run of this model started with --placement "
                                 f"{started[0]}", f"add --placement {started[0]} to resume it")  # fmt: skip
            if old.get("fingerprint") != fingerprint or old.get("version") != STATE_VERSION:
                raise QuantError(
                    f"{path.parent}: holds a tuning run of another model, data, target or settings",
                    "give another --output directory, or remove that one to start over",
                )
            self.data = old
            self.data.setdefault("paired", {})  # a state written before paired re-timing

    def save(self) -> None:
        from edgeq.fs import atomic_write_text

        self.path.parent.mkdir(parents=True, exist_ok=True)  # first write: after the data was read
        atomic_write_text(self.path, json.dumps(self.data, indent=1) + "\n")

    def get(self, key: str) -> Optional[Measured]:
        m = self.data["measured"].get(key)
        return Measured(**m) if m is not None else None

    def put(self, m: Measured) -> None:
        from dataclasses import asdict

        self.data["measured"][m.key] = asdict(m)
        self.save()

    def paired(self, key: str) -> Optional[dict[str, Any]]:
        got: Optional[dict[str, Any]] = self.data["paired"].get(key)
        return got

    def put_paired(self, key: str, figures: dict[str, Any]) -> None:
        self.data["paired"][key] = figures
        self.save()


class _Tuner:
    def __init__(self, target: Target, options: TuneOptions, out: Path, progress: ProgressFn):
        self.target, self.options, self.out, self.progress = target, options, out, progress
        self.built = self.reused = 0
        self.step_times: list[float] = []  # each build, each re-timing
        self.started = time.monotonic()

    def deploy(self, name: str, model_file: Path, cache: Optional[Path]) -> tuple[Any, float]:
        from edgeq.orchestration.variants import Variant, VariantOptions, deploy_one, variant_engine

        opts = VariantOptions(accept_new_host_key=self.options.accept_new_host_key,
                              shapes=self.options.shapes)  # fmt: skip
        t0 = time.monotonic()
        variant = Variant(name, model_file, cache)
        result = deploy_one(variant, self.target, opts, self.out / "runs", self.progress)
        took = time.monotonic() - t0
        self.built += 1
        self.step_times.append(took)
        return (variant_engine(variant, result), getattr(result, "run_dir", None)), took

    def paired(self, state: _State, a: Measured, b: Measured, rounds: int) -> dict[str, Any]:
        """``a`` and ``b`` timed in alternation (kept in the state: a resumed run does not re-time)."""
        from edgeq.orchestration.retime import retime
        from edgeq.pipeline.stages import ProfileSettings

        key = f"{a.key}|{b.key}|{rounds}"
        got = state.paired(key)
        if got is not None:
            return got
        t0 = time.monotonic()
        engines = [(m.key, Path(str(m.run_dir)) / "engine.plan") for m in (a, b)]
        accept = self.options.accept_new_host_key
        figures = retime(self.target, engines, rounds=rounds, accept_new_host_key=accept,
                         settings=ProfileSettings(shapes=self.options.shapes),
                         progress=self.progress).to_dict()  # fmt: skip
        self.step_times.append(time.monotonic() - t0)
        state.put_paired(key, figures)
        return figures

    def over_budget(self) -> bool:
        """True when one more build and its re-timing (as long as the slowest so far) would end past the
        budget."""
        elapsed = time.monotonic() - self.started
        steps = sorted(self.step_times)[-2:]
        return elapsed + sum(steps) > self.options.budget_s


def tune(
    model: Path, target: Target, options: TuneOptions, *, progress: ProgressFn = no_progress
) -> TuneResult:
    """See the module doc. Raises ``EdgeqError`` on bad input or a target failure (state kept)."""
    from edgeq.graph.io import graph_from_model, load_model, model_from_graph, save_model
    from edgeq.pipeline.stages import has_qdq
    from edgeq.quant.accuracy import compare_accuracy
    from edgeq.quant.cache import write_calibration_cache
    from edgeq.quant.placement import plan_placement
    from edgeq.quant.qdq import insert_qdq
    from edgeq.quant.quantize import cache_ranges, calibrate, calibration_data, prepare_model, split_data
    from edgeq.quant.regions import float_entry_regions

    q = options.quantize
    model = Path(model)
    if not model.is_file():
        what = "not a file" if model.exists() else "no such file"
        raise QuantError(f"{model}: {what}", "check the model path")
    if q.calib is None:
        raise QuantError("tune needs calibration data (--calib)", "give calibration data")
    if options.auto is not None and q.placement != "implicit":
        raise QuantError("tune --placement auto starts as implicit where nothing is cached",
                         "give quantize placement implicit with auto")  # fmt: skip
    if q.placement not in ("trt", "implicit"):
        raise QuantError(f"tune --placement {q.placement}: tune starts from trt (the rules) or implicit "
                         "(the mirror of the implicit engine)", "use --placement trt or implicit")
    calib = Path(q.calib)
    if not calib.exists():
        raise QuantError(f"--calib {calib}: no such file or directory", "give calibration data")
    q.check_inputs()  # the override file (and preprocessing spec): the user's, said before any work
    if q.holdout is not None and not 0.0 < q.holdout < 1.0:
        raise QuantError(f"--holdout must be in (0, 1) for tune's accuracy bound, got {q.holdout}")
    float_model = load_model(model)
    if has_qdq(float_model):
        raise QuantError(f"{model}: already has Q/DQ nodes; tune starts from the float model",
                         "give the FP32 model")  # fmt: skip
    from edgeq.pipeline.shapes import resolve_shapes

    options = replace(options, shapes=resolve_shapes(model, options.shapes, q))  # one profile, every build
    if not target.is_local:
        target.ssh_config(options.accept_new_host_key)  # key files checked before any work
    stem = model.name[: -len(".onnx")] if model.name.endswith(".onnx") else model.name
    out = Path(options.out_dir) if options.out_dir is not None else model.with_name(f"{stem}.tune")
    if out.exists() and not out.is_dir():
        raise QuantError(f"{out}: exists and is not a directory", "give --output a directory")
    prints = _fingerprints(model, calib, target, options)
    state = _State(out / STATE, prints.pop(q.placement), prints)
    tuner = _Tuner(target, options, out, progress)

    # 1. calibrate once (ranges kept in the state: a resumed run does not recalibrate)
    reference, _, _ = prepare_model(float_model)
    data = calibration_data(reference, q)
    if len(data) < 2:
        raise QuantError("tune's accuracy bound needs held-out samples", "give at least 2 samples")
    cal, held, _ = split_data(data, q, reference)
    assert held is not None  # two samples or more: a holdout in (0, 1), or every sample (no --holdout)
    # The rules without the float-entry rule: its regions are decisions (float at the start, tried INT8)
    graph = graph_from_model(reference)
    plan = plan_placement(graph, "trt", q.read_overrides(), float_entry=False)
    regions = float_entry_regions(graph, plan)
    if state.data["amax"] is None:
        state.data["amax"] = calibrate(reference, plan, cal, q, progress, held)
        state.save()
    amax: dict[str, float] = state.data["amax"]
    cache = cache_ranges(plan, amax, q)
    fp32 = out / f"{stem}.implicit.fp32.onnx"
    implicit_cache = out / f"{stem}.implicit.cache"
    if not fp32.is_file() or not implicit_cache.is_file():
        write_calibration_cache(implicit_cache, cache)
        save_model(reference, fp32)

    # 2. the implicit engine: the baseline, and TensorRT's own precision per layer
    implicit = state.get("implicit")
    if implicit is None:
        (engine, run_dir), took = tuner.deploy("implicit", fp32, implicit_cache)
        implicit = _measured("implicit", engine, run_dir, took)
        if implicit.error is not None:
            raise EdgeqError(f"the implicit INT8 engine did not build on {target.name}: {implicit.error}",
                             "tune needs the implicit engine as its baseline", exit_code=1)  # fmt: skip
        state.put(implicit)
    else:
        tuner.reused += 1
    fp16 = _fp16_nodes(Path(str(implicit.run_dir)), reference)
    rules = plan
    decisions = decision_points(rules, fp16, regions)
    allow: list[str] = []
    started, why = "rules", None  # where the search starts, and why not from the mirror asked for
    cached = _cached_start(model, target, options, progress) if options.auto is not None else None
    mirrored: Any = None  # the mirror's report, when the search starts from it
    if cached is not None and cached.plan is not None:  # the placement auto decided here: no mirror to make
        from edgeq.quant.decisions import mirror_decisions

        plan, decisions = mirror_decisions(cached.plan, rules, regions)
        started, allow = "cache", fp16
    elif q.placement == "implicit":  # start from the mirror; implicit's own float nodes are its intent
        try:
            plan, decisions, mirrored = _mirror_start(Path(str(implicit.run_dir)), reference, rules, regions)
            started, allow = "mirror", fp16
        except QuantError as e:
            if not options.fallback:
                raise QuantError(f"tune --placement implicit: {e.message}",
                                 "--placement trt starts from the rules") from e  # fmt: skip
            why = f"the implicit engine did not mirror onto the model: {e.message}"
    shared = plan.scale_amax(amax)
    progress("tuning", 0, len(decisions))

    def measure(st: dict[str, bool]) -> Measured:
        cplan = candidate_plan(plan, decisions, st)
        key = candidate_key(cplan)
        got = state.get(key)
        if got is not None:
            tuner.reused += 1
            return got
        graph = graph_from_model(reference)
        insert_qdq(graph, cplan, {t: shared[t] for t in cplan.tensors})
        qdq = model_from_graph(graph, like=reference)
        acc = compare_accuracy(reference, qdq, held, threshold=options.min_cosine)
        path = save_model(qdq, out / "candidates" / f"{stem}.{key}.onnx")
        if not acc:
            m = Measured(key, cosine=acc.cosine, accuracy_ok=False)
        else:
            (engine, run_dir), took = tuner.deploy(key, Path(path), None)
            m = _measured(key, engine, run_dir, took)
            m.cosine = acc.cosine
        state.put(m)
        return m

    # 3. start (the mirror, or the rules with implicit's FP16 mirrored), then one toggle at a time
    current = {d.id: d.start for d in decisions}
    start = measure(current)
    said = cached.said if cached is not None else None
    if started == "mirror" and cached is not None and cached.misses:  # tune decided: cache it as deploy does
        start_plan = candidate_plan(plan, decisions, current)
        said = _record_start(tuner, state, cached, implicit, start, start_plan, shared, implicit_cache,
                             reference, mirrored)  # fmt: skip
    if not start.usable and started in MIRRORED:  # the mirror cost accuracy or failed: start from the rules
        why = f"the mirror's start was not usable: {_unusable(start)}"
        plan, decisions, allow, started = rules, decision_points(rules, fp16, regions), [], "rules"
        shared = plan.scale_amax(amax)
        current = {d.id: d.start for d in decisions}
        start = measure(current)
    best = start
    if not start.usable:  # implicit's FP16 mirrored can cost accuracy: fall back to the rules alone
        current = {d.id: d.start or d.rule == IMPLICIT_FP16 for d in decisions}
        best = start = measure(current)
    start_from = {"placement": started, "not_mirror": why, "cache": said}
    log: list[dict[str, Any]] = []
    stopped = None
    for i, d in enumerate(decisions):
        progress("tuning", i, len(decisions))
        if stopped is None and tuner.over_budget() and state.get(candidate_key(
                candidate_plan(plan, decisions, {**current, d.id: not current[d.id]}))) is None:
            stopped = f"budget {plain(options.budget_s)} s spent"
        if stopped is not None:
            log.append(_entry(d, current, None, best, "not tried: " + stopped))
            continue
        trial = {**current, d.id: not current[d.id]}
        m = measure(trial)
        pair = functools.partial(tuner.paired, state, best, m, options.rounds)
        faster, why, paired = _judge(m, best, pair, options.rounds)
        log.append(_entry(d, current, m, best, why, kept=faster, paired=paired))
        if faster:
            current, best = trial, m
    # 4. outputs
    final_plan = candidate_plan(plan, decisions, current)
    graph = graph_from_model(reference)
    insert_qdq(graph, final_plan, {t: shared[t] for t in final_plan.tensors})
    tuned = save_model(model_from_graph(graph, like=reference), out / f"{stem}.tuned.onnx")
    tuned_cache = out / f"{stem}.tuned.cache"
    write_calibration_cache(tuned_cache, cache)
    dropped = [c for d in decisions if not current[d.id] for c in d.consumers]
    final = tuner.paired(state, implicit, best, options.rounds) if options.rounds and best.usable else None
    result = TuneResult(out, implicit, start, best, log, current, stopped, built=tuner.built,
                        reused=tuner.reused, final=final, start_from=start_from)  # fmt: skip
    dropped += list(rules.excluded)  # --overrides: float on purpose
    result.gate = _gates(implicit, best, reference, [*dropped, *allow], target, final,
                         relax_reformats=started in MIRRORED)  # fmt: skip
    result.files = {"model": str(tuned), "cache": str(tuned_cache), "json": str(out / "tune.json"),
                    "html": str(out / "tune.html"), "state": str(state.path)}  # fmt: skip
    _write_report(result, decisions)
    return result


@dataclass(frozen=True)
class _Cached:
    """What the placement cache said to tune --placement auto: the plan to start from (a decision that
    kept the explicit engine), else None; the words; and the key and lookup, for writing a decision."""

    plan: Optional[Any]
    said: str
    auto: Any  # auto.AutoOptions
    key: Optional[Any] = None  # placement_cache.PlacementKey
    lookup: Optional[Any] = None  # placement_cache.Lookup

    @property
    def misses(self) -> bool:
        """No usable entry for a key there is: tune's own decision is to be written."""
        return self.key is not None and self.lookup is not None and self.lookup.decision is None


def _cached_start(model: Path, target: Target, options: TuneOptions, progress: ProgressFn) -> _Cached:
    """tune --placement auto: the placement cache's plan for this model, data, TensorRT and GPU when the
    decision kept the explicit engine (``auto.cached_placement``, the lookup deploy makes), else None;
    and what the cache said, in words ("placement from cache ..." or why the mirror starts)."""
    from edgeq.orchestration.auto import AutoOptions, cached_placement

    auto = options.auto if isinstance(options.auto, AutoOptions) else AutoOptions()
    key, lookup, uncached = cached_placement(model, target, options.quantize, auto,
                                             accept_new_host_key=options.accept_new_host_key,
                                             progress=progress, shapes=options.shapes)  # fmt: skip
    decision = lookup.decision if lookup is not None else None
    if key is None or lookup is None:
        return _Cached(None, f"placement cache not used: {uncached}; starting from the mirror", auto)
    if decision is None:
        warned = f"{lookup.warning}; " if lookup.warning else ""
        return _Cached(None, f"{warned}placement cache miss ({key.describe()}); starting from the mirror",
                       auto, key, lookup)  # fmt: skip
    ev = decision.evidence
    said = (f"placement from cache (decided {ev.get('created', '?')} on {ev.get('target', '?')}: kept "
            f"{decision.kept})")  # fmt: skip
    if decision.kept != "explicit":
        return _Cached(None, f"{said}; no explicit placement to start from: starting from the mirror", auto,
                       key, lookup)  # fmt: skip
    return _Cached(decision.to_plan(), f"{said}: tuning starts from it", auto, key, lookup)


def _record_start(tuner: _Tuner, state: _State, cached: _Cached, implicit: Measured, start: Measured,
                  plan: Any, amax: dict[str, float], implicit_cache: Path, reference: Any, mirror: Any
                  ) -> str:  # fmt: skip
    """A cache miss under auto: tune built the implicit engine and its mirror's engine (the start), so it
    decides as deploy does (the relative gate at auto's ratio, on auto's paired rounds or ``--rounds`` if
    more) and writes
    the decision through deploy's one writer: a later deploy or tune of the key reads it. A start that is
    not usable decides nothing: one refused for accuracy met tune's bound, not deploy's; a failed build is
    left to deploy, which names the build log's TensorRT error. Returns what it said."""
    from edgeq.orchestration.auto import Judged, decision_from, record_decision
    from edgeq.orchestration.implicit import implicit_float, relative_to_implicit
    from edgeq.orchestration.placement_cache import PlacementCache
    from edgeq.pipeline.rundir import stage_seconds
    from edgeq.report.compare_engine import engine_from_path

    if not start.usable or implicit.run_dir is None:
        return f"{cached.said}; nothing cached: the mirror's start was not usable ({_unusable(start)})"
    implicit_run, explicit_run = Path(implicit.run_dir), Path(str(start.run_dir))
    base = engine_from_path(str(implicit_run), onnx_model=reference, name="implicit")
    floats = replace(implicit_float(base), by_design=plan.float_nodes)
    # what is cached must be judged as deploy judges it: on auto's paired rounds at least, whatever
    # --rounds tune runs its own comparisons on (0: single timings, too noisy to keep for every deploy)
    figures = tuner.paired(state, implicit, start, max(tuner.options.rounds, cached.auto.rounds))
    qps: tuple[Optional[float], Optional[float]] = (figures["median_qps"][0], figures["median_qps"][1])
    relative = relative_to_implicit(reference, implicit_run, explicit_run, qps, cached.auto.min_ratio,
                                    floats.by_design, figures)  # fmt: skip
    judged = Judged(tuner.target.name, plan, amax, implicit_cache.read_text(), floats, mirror, implicit_run,
                    stage_seconds(implicit_run, "build"), implicit.qps, cached.auto.min_ratio, relative,
                    explicit_run)  # fmt: skip
    decision = decision_from(judged)
    assert cached.key is not None  # a miss has a key
    entry, warning = record_decision(PlacementCache(cached.auto.cache_dir), cached.key, decision)
    ratio = f" ({decision.evidence['ratio']}x implicit)" if decision.evidence.get("ratio") is not None else ""
    where = f"written to {entry}" if entry is not None else f"warning: {warning}"
    return f"{cached.said}; decided here: kept {decision.kept}{ratio}, {where}"


def _mirror_start(run_dir: Path, reference: Any, rules: Any, regions: Any
                  ) -> tuple[Any, list[Decision], Any]:  # fmt: skip
    """The mirror of the implicit engine in ``run_dir``, its decisions both ways (``mirror_decisions``) and
    the mirror's report. Raises QuantError when its layer JSON is missing or does not map onto
    ``reference``."""
    from edgeq.graph.io import graph_from_model
    from edgeq.quant.decisions import mirror_decisions
    from edgeq.quant.mirror import load_engine, plan_from_engine

    layers = run_dir / "layers.json"
    if not layers.is_file():
        raise QuantError(f"{layers}: the target wrote no layer JSON for the implicit engine")
    mirror, report = plan_from_engine(graph_from_model(reference), load_engine(layers))
    return (*mirror_decisions(mirror, rules, regions), report)


def _unusable(m: Measured) -> str:
    if not m.accuracy_ok:
        return f"cosine {m.cosine} below the bound"
    return f"build failed: {m.error}" if m.error else "no timing"


def _measured(key: str, engine: Any, run_dir: Any, took: float) -> Measured:
    run = engine.run
    return Measured(key, qps=run.throughput_qps if run else None,
                    latency_ms=run.latency_median_ms if run else None,
                    run_dir=str(run_dir) if run_dir else None, error=engine.error, build_s=round(took, 3))


def _judge(m: Measured, best: Measured, pair: Callable[[], dict[str, Any]], rounds: int
           ) -> tuple[bool, str, Optional[dict[str, Any]]]:  # fmt: skip
    """(keep?, why, paired figures): refused on accuracy, a failed build or a clearly slower timing
    without re-timing; otherwise kept when the paired median ratio (``pair()``) reaches ``MIN_GAIN`` and
    the candidate is faster in every round."""
    if not m.accuracy_ok:
        return False, "measured: accuracy below bound", None
    if m.error is not None or m.qps is None or best.qps is None:
        return False, f"measured: build failed ({m.error})", None
    if m.qps < best.qps * CLEARLY_SLOWER:
        return False, f"measured: slower ({m.qps / best.qps:.3f}x in one timing)", None
    if not rounds:
        faster = m.qps > best.qps
        return faster, "measured: faster, accuracy within bound" if faster else "measured: not faster", None
    figures = pair()
    ratio, how = figures["ratio"], f"{figures['ratio']:.3f}x in {rounds} paired rounds"
    worst = min(c / b for b, c in zip(*figures["qps"]))
    if ratio >= MIN_GAIN and worst >= 1.0:
        return True, f"measured: faster ({how}), accuracy within bound", figures
    if ratio >= MIN_GAIN:
        return False, f"measured: not faster in every round ({how}, {worst:.3f}x in one)", figures
    return False, f"measured: not faster ({how})", figures


def _fp16_nodes(run_dir: Path, reference: Any) -> list[str]:
    """ONNX nodes the implicit engine ran in FP16 or FP32 (its inspector layer list)."""
    from edgeq.report.fusion_build import build_report
    from edgeq.report.parse import load_layers

    layers = run_dir / "layers.json"
    if not layers.is_file():
        return []
    report = build_report(load_layers(layers), None, reference)
    by = report.onnx.by_precision() if report.onnx is not None else {}
    return sorted(set(by.get("FP16", [])) | set(by.get("FP32", [])))


def _entry(d: Decision, current: dict[str, bool], m: Optional[Measured], best: Measured, why: str,
           kept: bool = False, paired: Optional[dict[str, Any]] = None) -> dict[str, Any]:  # fmt: skip
    from dataclasses import asdict

    return {"decision": d.id, "rule": d.rule, "sites": list(d.sites), "consumers": list(d.consumers),
            "tried": "off" if current[d.id] else "on", "candidate": asdict(m) if m else None,
            "best_before": {"key": best.key, "qps": best.qps}, "paired": paired, "kept": kept,
            "chosen_by": why}  # fmt: skip


def _gates(implicit: Measured, best: Measured, reference: Any, dropped: list[str], target: Target,
           final: Optional[dict[str, Any]] = None, relax_reformats: bool = False
           ) -> dict[str, Any]:  # fmt: skip
    """The tuned engine against its own intent (no node wider than INT8 except where a decision left it
    float, or implicit did: ``dropped``) and against implicit (``relative_gate``, on the median paired
    round ratio when ``final`` has one). ``relax_reformats``: interior reformats are the relative gate's
    when implicit has some (``edgeq.orchestration.implicit``)."""
    from edgeq.orchestration.deploy import policy_for
    from edgeq.orchestration.retime import judged_by_rounds
    from edgeq.pipeline.stages import report_and_gate
    from edgeq.report.compare import diff_pair
    from edgeq.report.compare_engine import engine_from_path
    from edgeq.report.compare_gate import relative_gate
    from edgeq.report.runlog import RunFigures

    if best.run_dir is None or implicit.run_dir is None:
        return {}
    bdir = Path(best.run_dir)
    policy = policy_for(target, "int8", dropped)
    if relax_reformats:
        from edgeq.orchestration.implicit import implicit_float

        base = engine_from_path(str(implicit.run_dir), onnx_model=reference, name="implicit")
        policy = policy.replace(forbid_interior_reformats=not implicit_float(base).reformats)
    _, verdict = report_and_gate(bdir / "layers.json", bdir / "profile.json", reference, policy)
    engines = []
    for i, (m, name) in enumerate(((implicit, "implicit"), (best, "tuned"))):
        e = engine_from_path(str(m.run_dir), onnx_model=reference, name=name)
        qps = final["median_qps"][i] if final else m.qps
        engines.append(replace(e, run=RunFigures(str(m.run_dir), qps, m.latency_ms, None)))
    rel = relative_gate(judged_by_rounds(diff_pair(engines[0], engines[1]), final))
    return {"precision": {"passed": bool(verdict), "summary": verdict.summary(), "allowed_wider": dropped},
            "relative": {"passed": bool(rel), "failures": [list(f) for f in rel.failures],
                         "throughput_ratio": rel.ratio.throughput, "excused": list(rel.excused),
                         "tolerated": list(rel.tolerated)}}  # fmt: skip


def _write_report(result: TuneResult, decisions: list[Decision]) -> None:
    from edgeq.fs import atomic_write_text
    from edgeq.report.views import esc

    d = result.to_dict()
    d["decision_points"] = [x.to_dict() for x in decisions]
    atomic_write_text(Path(result.files["json"]), json.dumps(d, indent=2, default=str) + "\n")
    rows = "".join(
        f"<tr><td>{esc(e['decision'])}</td><td>{esc(e['rule'])}</td><td>{esc(e['tried'])}</td>"
        f"<td>{esc(str((e['candidate'] or {}).get('qps')))}</td><td>{esc(str(e['best_before']['qps']))}</td>"
        f"<td>{esc(str((e['candidate'] or {}).get('cosine')))}</td><td>{'kept' if e['kept'] else ''}</td>"
        f"<td>{esc(e['chosen_by'])}</td></tr>"
        for e in result.decisions
    )
    head = (f"implicit {result.implicit.qps} qps; start from {result.started}: {result.start.qps} qps; "
            f"tuned {result.best.qps} qps "
            f"({d['speedup_vs_implicit']}x implicit{' in paired rounds' if result.final else ''})")
    head += f"; stopped: {result.stopped}" if result.stopped else ""
    html = ("<!doctype html><meta charset=utf-8><title>edgeq tune</title><h1>edgeq tune</h1>"
            f"<p>{esc(head)}</p><table border=1><tr><th>decision</th><th>rule</th><th>tried</th>"
            "<th>candidate qps</th><th>best qps before</th><th>cosine</th><th></th><th>chosen by</th></tr>"
            f"{rows}</table><pre>{esc(json.dumps(result.gate, indent=1))}</pre>")  # fmt: skip
    atomic_write_text(Path(result.files["html"]), html)
