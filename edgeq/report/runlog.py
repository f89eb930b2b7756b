"""Figures from trtexec logs: throughput and latency from a run log, the error from a failed build, and
the Q/DQ region a failed explicit build broke on.

``trtexec`` prints its summary as ``[I] Throughput: 1687.06 qps`` and ``[I] Latency: min = ..., median =
0.686 ms, ...`` (TensorRT samples/common/sampleReporting.cpp, ``printEpilog``); a failed build prints
``[E] Error[N]: <message>`` lines (fixtures ``trt86-h200-edgeq/yolo_edgeq_all.explicit.build.log``), the
agent's Python backend ``[ERROR] <message>`` / ``[INTERNAL_ERROR] <message>`` lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from edgeq.errors import ReportError

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs




@dataclass(frozen=True)
class RunFigures:
    """One timed run of an engine as trtexec summarised it."""

    source: str
    throughput_qps: Optional[float]
    latency_median_ms: Optional[float] = None
    gpu_compute_median_ms: Optional[float] = None


def _read(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except OSError as e:
        raise ReportError(f"{path}: cannot read ({e.strerror})") from None


def run_figures_from_log(path: Path) -> RunFigures:
    """Throughput and median latencies of a ``trtexec --loadEngine`` run log (its last summary), read by
    the same parser the agent's trtexec backend uses on the target."""
    from edgeq.agent.trtexec_backend import parse_performance_summary

    s = parse_performance_summary(_read(path).splitlines())
    figures = RunFigures(str(path), s.get("throughput_qps"), (s.get("latency_ms") or {}).get("median"),
                         (s.get("gpu_compute_time_ms") or {}).get("median"))
    if figures.throughput_qps is None and figures.latency_median_ms is None:
        raise ReportError(
            f"{path}: no 'Throughput:' or 'Latency:' summary: not a trtexec run log, or the run failed",
            hint="give the log of 'trtexec --loadEngine=... ' that timed the engine",
        )
    return figures


def build_error_from_log(path: Path) -> Optional[str]:
    """The most specific TensorRT error of a build log (``None`` when the log shows none): see
    ``failure_message``."""
    return failure_message(_read(path))


# --------------------------------------------------------------------------------------------------
# A failed explicit build: which Q/DQ region broke it
# --------------------------------------------------------------------------------------------------

_ERROR_LINE = re.compile(r"\[(?:E|ERROR|INTERNAL_ERROR)\]\s*(?:\[TRT\]\s*)?(?P<msg>.+)$")
# trtexec: "Error[10]: msg"; TensorRT's Python logger (the agent's python backend): "10: msg"
_SPECIFIC = re.compile(r"(?:Error\[\d+\]:|^\d+:)\s*(?P<msg>.+)$")
# What separates names in TensorRT's messages: spaces, parentheses of fused names (PWN(a, b)), brackets of
# ForeignNode[a...b], quotes; and the copies TensorRT makes of a node (``_clone_N``).
_NAME_SPLIT = re.compile(r"[\s,()\[\]{}'\"]+|\.\.\.")
_CLONE = re.compile(r"_clone_\d+$")


@dataclass(frozen=True)
class BuildFailure:
    """Why an explicit (Q/DQ) build failed, and where: TensorRT's error, the registry entry that explains
    it, the Q/DQ region involved (one line) with its ONNX nodes, and the plan's Q/DQ sites there."""

    message: str  # TensorRT's error (the most specific line)
    rule: Optional[str] = None  # the registry entry whose build_error this is (``edgeq rules ID``)
    region: Optional[str] = None  # the region, in one line (the entry's lint finding, or the named nodes)
    nodes: tuple[str, ...] = ()  # ONNX nodes of the region, Q/DQ included
    sites: tuple[str, ...] = ()  # the plan's Q/DQ site tensors feeding or leaving those nodes

    def describe(self) -> str:
        """One line: the error, then the region (and the rule that explains it)."""
        out = self.message.rstrip(". ")
        if self.region:
            out += f"; Q/DQ region: {self.region}"
        if self.rule:
            out += f" (edgeq rules {self.rule})"
        return out


def _error_lines(text: str) -> list[str]:
    return [m.group("msg").strip() for line in text.splitlines() if (m := _ERROR_LINE.search(line))]


# Errors TensorRT logs and builds on: a timing cache it cannot read (another build's Myelin entries) is
# dropped, not fatal (tests/fixtures/trt86-h100-corpus/googlenet.static.build-errors.log.gz).
_NON_FATAL = re.compile(r"timing cache will not be used|myelinCache\.h::deserializeFromBuffer")


def failure_message(text: str) -> Optional[str]:
    """The most specific error of a build log (``Error[N]: ...`` first; for a bare "Assertion ... failed"
    the line after it that names TensorRT's function); None when it shows none."""
    errors = [e for e in _error_lines(text) if not _NON_FATAL.search(e)]
    specific = [m.group("msg").strip() for e in errors if (m := _SPECIFIC.search(e))]
    if specific and specific[0].startswith("Assertion"):
        located = [e for e in specific[1:] if "Error Code" in e]
        return located[0] if located else specific[0]
    return specific[0] if specific else (errors[0] if errors else None)


def _names_in(errors: list[str], known: set[str]) -> list[str]:
    """Node and tensor names of the model that the error lines mention, in order of mention."""
    from edgeq.report.layernames import split_layer_name

    out: list[str] = []
    for e in errors:
        fused = split_layer_name(e.split("node ", 1)[1].rstrip(".)")) if "node " in e else ()
        pieces = [*fused, *_NAME_SPLIT.split(e)]
        for raw in pieces:
            name = _CLONE.sub("", raw.strip().rstrip(".:;"))
            if name in known and name not in out:
                out.append(name)
    return out


ModelSource = Union["onnx.ModelProto", "gs.Graph", str, Path]


def _graph_of(model: ModelSource) -> gs.Graph:
    import onnx_graphsurgeon as gs

    from edgeq.graph.io import load_model, typed_graph_from_model

    if isinstance(model, gs.Graph):
        return model
    return typed_graph_from_model(load_model(Path(model)) if isinstance(model, (str, Path)) else model)


def build_failure(log_text: str, model: Optional[ModelSource] = None, plan: Optional[Any] = None
                  ) -> Optional[BuildFailure]:
    """The Q/DQ region a failed explicit build broke on, from its log (trtexec's or the agent's) and the
    Q/DQ model that was built (a ModelProto, graph or path); None when the log shows no error.

    Where a registry entry's ``build_error`` matches the message (a SiLU with a Q/DQ inside, INT8 weights
    in a Myelin region, an int32 bias), the region is that entry's lint finding on the model, the one
    holding a node the log names when several do; when entries share one assertion, the one whose finding
    the model has (``registry.explain_build_error`` chooses); else the nodes the log names, with the Q/DQ
    around them. ``plan`` (the placement the model was written from, an ``edgeq.quant.plan.Plan``: typed
    ``Any`` because report sits below quant) adds the Q/DQ sites of the region.
    """
    message = failure_message(log_text)
    if message is None:
        return None
    from edgeq.graph import registry

    errors = _error_lines(log_text)
    if model is None:
        entry, _ = registry.explain_build_error([message, *errors])
        return BuildFailure(message, entry.id if entry else None)
    graph = _graph_of(model)
    known = {n.name for n in graph.nodes} | set(graph.tensors())
    named = _names_in(errors, known)
    entry, hit = registry.explain_build_error([message, *errors], graph, named)
    region, nodes = None, tuple(named)
    if hit is not None:
        region, nodes = hit.message.split(": ", 1)[0], hit.nodes
    if region is None and named:
        region = "around " + ", ".join(f"'{n}'" for n in named[:4]) + (" ..." if len(named) > 4 else "")
        nodes = _with_qdq(graph, named)
    return BuildFailure(message, entry.id if entry else None, region, tuple(nodes),
                        _sites_at(graph, nodes, plan) if plan is not None else ())


def _with_qdq(graph: gs.Graph, named: list[str]) -> tuple[str, ...]:
    """The named nodes (a tensor: its producer) and the Q/DQ pairs on their inputs and outputs."""
    from edgeq.graph.patterns import qdq_pair_of, skip_qdq_down

    by_node = {n.name: n for n in graph.nodes}
    tensors = graph.tensors()
    nodes = [by_node[n] for n in named if n in by_node]
    nodes += [p for t in named if t in tensors and t not in by_node for p in tensors[t].inputs[:1]]
    out: list[str] = []
    for n in nodes:
        out.append(n.name)
        pairs = [qdq_pair_of(t) for t in n.inputs if t.name]
        pairs += [pr for o in n.outputs for _, _, crossed in skip_qdq_down(o) for pr in crossed[:1]]
        out += [x for pr in pairs if pr is not None for x in pr.names]
    return tuple(dict.fromkeys(out))


def _sites_at(graph: gs.Graph, nodes: tuple[str, ...], plan: Any) -> tuple[str, ...]:
    """The plan's sites that feed one of ``nodes`` or whose tensor one of them writes or reads."""
    by_node = {n.name: n for n in graph.nodes}
    touched: set[str] = set()
    for name in nodes:
        n = by_node.get(name)
        if n is not None:
            touched |= {t.name for t in (*n.inputs, *n.outputs) if t.name}
    return tuple(s.tensor for s in plan.sites if s.tensor in touched or set(s.consumers) & set(nodes))


def describe_build_failure(log: Path, model: Optional[Any] = None, plan: Optional[Any] = None
                           ) -> Optional[str]:
    """``build_failure(...).describe()`` for a log file (deploy.log, a trtexec build log); None when the
    log shows no error."""
    found = build_failure(_read(log), model, plan)
    return found.describe() if found is not None else None
