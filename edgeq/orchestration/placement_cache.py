"""The placement cache: what ``--placement auto`` decided on a target, kept so that the next deploy of the
same model to the same kind of target builds only the explicit engine.

The decision (build the implicit engine there, mirror it, build and time the explicit engine) costs an
implicit build, minutes on a Jetson; its outcome depends on exactly four things, the entry's key: the
model's content, the calibration's content (the data files and the settings that change the ranges),
the TensorRT version and the GPU (name and compute capability) as the target's probe reports them.
Another GPU or TensorRT version times tactics differently, so it decides again.

Where: ``$XDG_CACHE_HOME/edgeq/placement/`` (``~/.cache/edgeq/placement/``) unless ``--placement-cache
DIR``. One JSON file per key, ``<sha256 of the key>.json``, written atomically (a reader never sees half
an entry; two deploys deciding at once leave one whole entry). An entry that does not read (truncated,
edited, of another format, another key) is ignored with a warning and replaced by the next decision: a
cache is never a reason for a deploy to fail.

An entry holds the key, what was kept (``explicit``: the mirror's Q/DQ model; ``implicit``: the implicit
engine, when the explicit one failed the relative gate or did not build) and why, the placement (per
tensor INT8 with its amax and scale, or float with the rule that kept it; the ``Plan`` to rebuild the
Q/DQ model from), the precision gate's allowlist the decision used, the implicit calibration cache, and the
evidence (the ratio, the relative gate, the implicit build's seconds).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from edgeq.pipeline.stages import Probe
    from edgeq.quant.plan import Plan
    from edgeq.quant.quantize import QuantizeOptions

FORMAT = 1  # the entry's layout; an entry of another format is a miss (with a warning)


def default_cache_dir() -> Path:
    """The user cache (``$XDG_CACHE_HOME/edgeq/placement``), beside the agent zipapp's."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgeq" / "placement"


# --------------------------------------------------------------------------------------------------
# The key
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlacementKey:
    model_sha256: str
    calibration_sha256: str
    tensorrt: str
    gpu: str  # the GPU's name as the probe reports it ("" when only its compute capability is known)
    compute_capability: str  # "" when only the name is known

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()

    def describe(self) -> str:
        sm = f"sm {self.compute_capability}" if self.compute_capability else ""
        gpu = ", ".join(v for v in (self.gpu, sm) if v)
        return f"TensorRT {self.tensorrt}, {gpu}"


def _preprocess_digest(options: QuantizeOptions) -> str | None:
    """The preprocessing spec's sha256: a preset's shipped bytes (``--preprocess yolo``) or the file's."""
    if options.preprocess is None:
        return None
    from edgeq.quant.data.preprocess import preprocess_bytes

    return hashlib.sha256(preprocess_bytes(options.preprocess)).hexdigest()


def calibration_digest(options: QuantizeOptions, profile: str = "") -> str:
    """The calibration's content: every data file (relative name and sha256), the preprocessing spec's
    bytes, and the settings that change the Q/DQ model (calibrator, its percentile, the held-out fraction,
    the weights' rounding);
    for a model with dynamic inputs, the optimization profile its engines are built and timed at
    (``profile``: TensorRT's tactics, so what implicit runs INT8, are chosen at that shape)."""

    h = hashlib.sha256()
    if options.calib is not None:
        hash_data_files(h, Path(options.calib))
    settings: dict[str, Any] = {"synthetic": options.synthetic, "calibrator": options.calibrator,
                                "holdout": options.holdout, "preprocess": _preprocess_digest(options)}
    if options.calibrator == "percentile":
        settings["percentile"] = options.percentile  # what only that calibrator reads
    if options.weights != "auto":
        settings["weights"] = options.weights  # the default: no key, so the keys made before it stay valid
    if profile:
        settings["profile"] = profile  # static models: no key, so their keys are as they were
    if options.max_loss is not None:  # deploy --max-loss's choice rests on these too (other keys as were)
        settings["budget"] = budget_settings(options)
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()


def budget_settings(options: QuantizeOptions) -> dict[str, Any]:
    """What ``--max-loss``'s choice depends on beyond the calibration: X, the metric, the held-out set's
    files, the placement the regions come from and the user's override file."""
    from edgeq.fs import sha256_file

    held = None
    if options.holdout_data is not None:
        h = hashlib.sha256()
        hash_data_files(h, Path(options.holdout_data))
        held = h.hexdigest()
    given = options.overrides
    overrides: Any = None
    if isinstance(given, (str, Path)):
        overrides = sha256_file(given)
    elif given is not None:  # already read
        overrides = {"exclude": list(given.exclude), "force": list(given.force)}
    return {"max_loss": options.max_loss, "metric": options.metric, "holdout_data": held,
            "placement": options.placement, "overrides": overrides}


def hash_data_files(h: Any, calib: Path) -> None:
    """Feed the calibration data's files (each one's relative name and sha256, in order) into ``h``: what
    the placement cache's key and tune's resume fingerprints read of the data."""
    from edgeq.fs import sha256_file

    files = sorted(p for p in calib.rglob("*") if p.is_file()) if calib.is_dir() else [calib]
    for p in files:
        h.update(f"{p.relative_to(calib) if p != calib else p.name}:{sha256_file(p)}".encode())


def key_for(model: Path, options: QuantizeOptions, found: Probe, profile: str = ""
            ) -> tuple[Optional[PlacementKey], str]:  # fmt: skip
    """(the key, "") or (None, why not): a target whose TensorRT version or GPU is unknown never shares
    a decision (its probe found neither and the target file names neither). ``profile``: a dynamic
    model's optimization profile (min|opt|max, trtexec syntax), part of the calibration's digest."""
    from edgeq.fs import sha256_file

    if not found.tensorrt:
        return None, "the probe reported no TensorRT version"
    if not found.gpu and not found.compute_capability:
        return None, "the probe reported no GPU (and the target file names none)"
    calibration = calibration_digest(options, profile)
    return PlacementKey(sha256_file(model), calibration, found.tensorrt, found.gpu or "",
                        found.compute_capability or ""), ""  # fmt: skip


# --------------------------------------------------------------------------------------------------
# The entry
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """One target's decision: what was kept and why, the placement and the evidence."""

    kept: str  # "explicit" (the mirror's Q/DQ model) or "implicit" (the implicit engine)
    reason: str  # in words: why this was kept
    plan: dict[str, Any]  # the mirror's Plan as data (``plan_to_dict``)
    amax: dict[str, float]  # per Q/DQ tensor, after scale sharing: what the Q/DQ model's scales come from
    calibration_cache: str  # the implicit engine's calibration cache (its text)
    allowlisted: tuple[str, ...] = ()  # ONNX nodes implicit ran FP16/FP32: the precision gate's allowlist
    float_entry_nodes: tuple[str, ...] = ()  # nodes the mirror leaves float on purpose
    implicit_reformats: int = 0  # implicit's interior reformats: >0 leaves them to the relative gate
    evidence: dict[str, Any] = field(default_factory=dict)  # ratio, relative gate, build seconds, runs

    def tensors(self) -> dict[str, dict[str, Any]]:
        """Per tensor: INT8 with its amax and scale (``qdq`` False: no Q/DQ of its own, TensorRT carries it
        INT8 across a commuting op), or float with the rule that kept it float."""
        from edgeq.quant.calibrate import activation_scale

        sites = {s["tensor"] for s in self.plan.get("sites", ())}
        out: dict[str, dict[str, Any]] = {
            t: {"precision": "int8", "amax": a, "scale": float(activation_scale(a)), "qdq": t in sites}
            for t, a in sorted(self.amax.items())
        }
        for f in self.plan.get("floats", ()):
            out.setdefault(f["tensor"], {"precision": "float", "rule": f["rule"]})
        return out

    def to_plan(self) -> Plan:
        return plan_from_dict(self.plan)


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    return asdict(plan)


def plan_from_dict(d: dict[str, Any]) -> Plan:
    """The inverse of ``plan_to_dict``; a missing or mistyped field raises KeyError/TypeError."""
    from edgeq.quant.plan import FloatTensor, Plan, QdqSite, WeightSite

    return Plan(
        mode=str(d["mode"]),
        sites=tuple(QdqSite(**{**s, "consumers": tuple(s["consumers"])}) for s in d["sites"]),
        weights=tuple(WeightSite(**w) for w in d["weights"]),
        commuted=tuple(d["commuted"]),
        floats=tuple(FloatTensor(**f) for f in d["floats"]),
        groups={str(k): tuple(v) for k, v in d["groups"].items()},
        activations=tuple(d["activations"]),
        excluded=tuple(d["excluded"]),
        forced=tuple(d["forced"]),
        group_ids={str(k): str(v) for k, v in d["group_ids"].items()},
        float_nodes=tuple(d["float_nodes"]),
    )


def _entry_dict(key: PlacementKey, decision: Decision) -> dict[str, Any]:
    from edgeq import __version__

    d = asdict(decision)
    return {"format": FORMAT, "edgeq": __version__, "key": asdict(key), "kept": d.pop("kept"),
            "reason": d.pop("reason"), "tensors": decision.tensors(), **d}  # fmt: skip


def _decision_from(d: dict[str, Any]) -> Decision:
    """An entry's decision; anything missing or mistyped raises (KeyError, TypeError, ValueError)."""
    if d.get("kept") not in ("explicit", "implicit"):
        raise ValueError(f"kept is {d.get('kept')!r}")
    decision = Decision(
        kept=d["kept"], reason=str(d["reason"]), plan=dict(d["plan"]),
        amax={str(k): float(v) for k, v in d["amax"].items()},
        calibration_cache=str(d["calibration_cache"]), allowlisted=tuple(map(str, d["allowlisted"])),
        float_entry_nodes=tuple(map(str, d["float_entry_nodes"])),
        implicit_reformats=int(d["implicit_reformats"]),
        evidence=dict(d.get("evidence") or {}),
    )  # fmt: skip
    decision.to_plan()  # the plan must read too
    return decision


@dataclass(frozen=True)
class Lookup:
    """What the cache answered: the decision (None: a miss), the entry's path, and a warning when an
    entry was there but could not be used."""

    path: Path
    decision: Optional[Decision] = None
    warning: Optional[str] = None

    @property
    def hit(self) -> bool:
        return self.decision is not None


class PlacementCache:
    """The entries under ``root``: ``get`` never raises for a bad entry (a warning instead), ``put``
    writes atomically."""

    def __init__(self, root: Optional[Path] = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()

    def path(self, key: PlacementKey) -> Path:
        return self.root / f"{key.digest()}.json"

    def get(self, key: PlacementKey) -> Lookup:
        path = self.path(key)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return Lookup(path)
        except OSError as e:
            return Lookup(path, warning=f"placement cache: {path}: cannot read ({e.strerror or e}); ignored")
        try:
            d = json.loads(text)
            if not isinstance(d, dict) or d.get("format") != FORMAT:
                raise ValueError(f"format {d.get('format') if isinstance(d, dict) else None!r}, not {FORMAT}")
            if d.get("key") != asdict(key):
                raise ValueError("its key is another model's or target's")
            return Lookup(path, _decision_from(d))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            what = f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)
            return Lookup(path, warning=f"placement cache: {path}: unreadable entry ignored ({what[:120]}); "
                                        "deciding again")  # fmt: skip

    def put(self, key: PlacementKey, decision: Decision) -> Path:
        from edgeq.fs import atomic_write_text

        path = self.path(key)
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(_entry_dict(key, decision), indent=1, sort_keys=False) + "\n")
        return path
