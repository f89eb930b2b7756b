"""One engine to compare, from its files, and its figures: kept apart from the comparison so that
callers that only load an engine (deploy, tune, variants) need not read the diff.

A directory (or a ``*.layers.json`` file and its same-named siblings) becomes an ``Engine``; a failed build
is one too, with its TensorRT error and no report. ``Engine.stats`` is computed once per engine.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

from edgeq.errors import ReportError
from edgeq.report.explain import compute_nodes
from edgeq.report.fusion import FusionReport, LayerKind, ReportLayer
from edgeq.report.fusion_build import build_report
from edgeq.report.parse import PRECISION_RANK, load_layers, load_profile
from edgeq.report.runlog import RunFigures, describe_build_failure, run_figures_from_log

FILES_HINT = (
    "give a directory holding one *.layers.json (trtexec --exportLayerInfo) and optionally one "
    "*.profile.json and one *.run.log, or a *.layers.json file (its siblings are found by name)"
)


# --------------------------------------------------------------------------------------------------
# Engines from files
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Engine:
    """One engine to compare, or one that failed to build (``error`` set, no report)."""

    name: str
    report: Optional[FusionReport]
    run: Optional[RunFigures] = None
    error: Optional[str] = None  # the TensorRT build error of a failed build
    files: tuple[str, ...] = ()

    @property
    def built(self) -> bool:
        return self.report is not None

    @cached_property
    def stats(self) -> EngineStats:
        """The engine's figures, computed once: every diff and every renderer reads these."""
        if self.report is None:
            raise ValueError(f"{self.name}: a failed build has no stats")
        return engine_stats(self.report)


def _one(found: list[Path], what: str, where: Path) -> Optional[Path]:
    if len(found) > 1:
        names = ", ".join(p.name for p in found[:4])
        raise ReportError(f"{where}: {len(found)} {what} files ({names}): which one?", hint=FILES_HINT)
    return found[0] if found else None


def _stem_of(path: Path) -> str:
    name = path.name
    for suffix in (".layers.json", ".build.log"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _model_source(onnx_model: Any) -> Any:
    """The model a failed build's log is read against (a path or a ModelProto), or None."""
    import onnx

    return onnx_model if isinstance(onnx_model, (str, os.PathLike, onnx.ModelProto)) else None


def engine_from_path(
    path: os.PathLike[str] | str, onnx_model: Any = None, name: Optional[str] = None
) -> Engine:
    """An engine from a directory (one ``*.layers.json``, optional ``*.profile.json`` and ``*.run.log``;
    a deploy run directory's ``layers.json``/``profile.json`` too) or from a ``*.layers.json`` file with
    its same-named siblings. A directory with only a ``*.build.log`` is a failed build."""
    p = Path(path)
    if not p.exists():
        raise ReportError(f"{p}: no such file or directory", hint=FILES_HINT)
    if p.is_dir():
        layers = _one(sorted(p.glob("*.layers.json")) or sorted(p.glob("layers.json")), "*.layers.json", p)
        profile = _one(
            sorted(p.glob("*.profile.json")) or sorted(p.glob("profile.json")), "*.profile.json", p
        )
        run_log = _one(sorted(p.glob("*.run.log")), "*.run.log", p)
        build_log = _one(sorted(p.glob("*.build.log")), "*.build.log", p)
        label = name or (_stem_of(layers) if layers and layers.name != "layers.json" else p.name)
    elif p.name.endswith(".layers.json") or p.name.endswith(".build.log"):
        stem = _stem_of(p)
        sib = p.parent / stem
        layers = Path(f"{sib}.layers.json")
        layers = layers if layers.is_file() else None  # a build log alone: a failed build
        profile = Path(f"{sib}.profile.json")
        run_log = Path(f"{sib}.run.log")
        build_log = Path(f"{sib}.build.log")
        profile, run_log, build_log = (f if f.is_file() else None for f in (profile, run_log, build_log))
        label = name or stem
    else:
        raise ReportError(f"{p}: not a directory or a *.layers.json file", hint=FILES_HINT)
    files = tuple(str(f) for f in (layers, profile, run_log, build_log) if f is not None)
    if layers is None:
        error = None if build_log is None else describe_build_failure(build_log, _model_source(onnx_model))
        if build_log is None or error is None:
            raise ReportError(f"{p}: no *.layers.json (and no build log with an error)", hint=FILES_HINT)
        return Engine(label, None, error=error, files=files)
    report = build_report(load_layers(layers), load_profile(profile) if profile else None, onnx_model)
    run = run_figures_from_log(run_log) if run_log is not None else None
    return Engine(label, report, run, files=files)


# --------------------------------------------------------------------------------------------------
# Per-engine figures
# --------------------------------------------------------------------------------------------------


def precision_rank(p: Optional[str]) -> int:
    return PRECISION_RANK.get(p or "", 9)  # unknown counts as widest: it cannot be proven narrower


@dataclass(frozen=True)
class EngineStats:
    layers: int
    compute: int
    precisions: dict[str, int]
    reformats: int  # interior reformats that change precision or layout
    copies: int  # interior same-format copies (Concat/Slice)
    reformat_ms: Optional[float]
    copy_ms: Optional[float]
    total_ms: Optional[float]
    unfused_residuals: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def summed_ms(rls: Sequence[ReportLayer], timed: bool) -> Optional[float]:
    return sum(rl.time_ms or 0.0 for rl in rls) if timed else None


def engine_stats(report: FusionReport) -> EngineStats:
    interior = report.interior_reformats()
    copies = [rl for rl in interior if rl.same_format_copy]
    changing = [rl for rl in interior if not rl.same_format_copy]
    return EngineStats(
        layers=len(report.layers),
        compute=len(report.of_kind(LayerKind.COMPUTE)),
        precisions=report.compute_precisions(),
        reformats=len(changing),
        copies=len(copies),
        reformat_ms=summed_ms(changing, report.timed),
        copy_ms=summed_ms(copies, report.timed),
        total_ms=report.profile_total_ms,
        unfused_residuals=len(report.unfused_residuals),
    )


def fused_groups(report: FusionReport) -> dict[str, int]:
    """' + '-joined ONNX nodes of every compute layer that fused two or more -> its layer index."""
    out: dict[str, int] = {}
    for rl in report.of_kind(LayerKind.COMPUTE):
        nodes = compute_nodes(rl)
        if len(nodes) >= 2:
            out.setdefault(" + ".join(nodes), rl.index)
    return out
