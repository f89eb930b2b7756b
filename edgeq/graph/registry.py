"""The TensorRT 8.6 pattern registry: every fact once, iterated by every consumer.

Placement (``edgeq.quant.placement``) acts on the edge decisions of all patterns; lint
(``edgeq.graph.rules``) and ``edgeq clean`` run their lint checks; the report, the gate's explanations and
``compare`` read their engine signatures (``edgeq.report.explain``); ``edgeq tune`` toggles the sites of
the tunable ones. The entries live in ``edgeq.graph.trt86``, one module per family; their order is
precedence. Modelled on NVIDIA ModelOpt's fusible patterns as data
walked by shared walkers, and on TREx's one linter per concern.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Optional

from edgeq.docs import cite
from edgeq.findings import Finding
from edgeq.graph.facts import Decisions, LayerView, Match, Pattern, Want, matches_of
from edgeq.graph.patterns import WEIGHTED_OPS, is_constant, is_float, is_standard, iter_nodes
from edgeq.graph.trt86 import PATTERNS
from edgeq.text import plural

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

REGISTRY: tuple[Pattern, ...] = PATTERNS


@cache
def _by_id(patterns: tuple[Pattern, ...]) -> dict[str, Pattern]:
    out: dict[str, Pattern] = {}
    for p in patterns:
        for i in (p.id, *p.aliases):
            if i in out:
                raise AssertionError(f"pattern id {i} is given twice")  # a bug in the registry
            out[i] = p
    return out


def get(pattern_id: str) -> Optional[Pattern]:
    """The pattern with this id or one of its older ids; None when unknown."""
    return _by_id(REGISTRY).get(pattern_id) or _by_id(PATTERNS).get(pattern_id)


def pattern(pattern_id: str) -> Pattern:
    """The pattern with this id (aliases accepted); a KeyError is a bug (code naming an unknown id)."""
    p = get(pattern_id)
    if p is None:
        raise KeyError(pattern_id)
    return p


def canonical(pattern_id: str) -> str:
    """An id as the registry spells it now (older ids map to their fact's id); unknown ids unchanged."""
    p = get(pattern_id)
    return p.id if p is not None else pattern_id


def ids(kind: Optional[str] = None) -> tuple[str, ...]:
    return tuple(p.id for p in REGISTRY if kind is None or p.kind == kind)


def aliases() -> dict[str, str]:
    """Older id -> today's id."""
    return {a: p.id for p in REGISTRY for a in p.aliases}


def tunable() -> tuple[str, ...]:
    """Ids whose sites are a choice between two legal placements (``edgeq tune`` measures them)."""
    return tuple(p.id for p in REGISTRY if p.tunable)


# --------------------------------------------------------------------------------------------------
# Graph side
# --------------------------------------------------------------------------------------------------


def all_matches(graph: gs.Graph) -> dict[str, list[Match]]:
    """Pattern id -> its matches, for every fusion pattern with a matcher."""
    return {p.id: matches_of(p, graph) for p in REGISTRY if p.match is not None}


def decide(matches: dict[str, list[Match]]) -> Decisions:
    """Each edge's decision by the last pattern (registry order) that decided it."""
    by_edge: dict[tuple[str, str], tuple[Want, str]] = {}
    for p in REGISTRY:
        for m in matches.get(p.id, ()):
            for e in m.edges:
                by_edge[(e.tensor, e.consumer)] = (e.want, m.site_rule or p.id)
    return Decisions(by_edge)


def lint(graph: gs.Graph, selected: Optional[Iterable[str]] = None) -> list[Finding]:
    """Findings of every pattern's lint check (or of the ``selected`` ids), in registry order."""
    wanted = None if selected is None else {canonical(i) for i in selected}
    matches = all_matches(graph)
    decisions = decide(matches)
    out: list[Finding] = []
    for p in REGISTRY:
        if p.lint is None or (wanted is not None and p.id not in wanted):
            continue
        for hit in p.lint.check(graph, matches.get(p.id, []), decisions):
            out.append(
                Finding(
                    level=hit.level or p.lint.level,
                    rule=p.id,
                    message=hit.message,
                    fix=hit.fix or p.lint.fix,
                    source=cite(p.id),
                    nodes=tuple(hit.nodes),
                )
            )
    return out


# --------------------------------------------------------------------------------------------------
# Coverage: where no entry has a word to say
# --------------------------------------------------------------------------------------------------

UNMEASURED = "placement here is unmeasured: deploy with a target"
# Ops no placement decision is about: Q/DQ themselves, ops that read only a tensor's shape, and Dropout
# (an identity at inference, removed by `edgeq clean`).
_NEUTRAL_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "Shape", "Size", "Dropout"})


@cache
def covered_ops() -> frozenset[str]:
    """Op types some entry is about (its ``ops``), the weighted ops, and ops no decision is about."""
    out: set[str] = set(WEIGHTED_OPS | _NEUTRAL_OPS)
    for p in REGISTRY:
        out |= p.ops
    return frozenset(out)


def uncovered(graph: gs.Graph) -> dict[str, list[str]]:
    """Op type (``domain::op`` for custom ops) -> the nodes that read a float activation and that no entry
    covers. Shape arithmetic (nodes reading only constants or integer tensors) is no placement decision,
    so it does not count; an activation of unknown type is not counted either."""
    covered = covered_ops()
    out: dict[str, list[str]] = {}
    for n in iter_nodes(graph):
        op = n.op if is_standard(n) else f"{n.domain}::{n.op}"
        if op in covered:
            continue
        if any(t.name and not is_constant(t) and is_float(t) for t in n.inputs):
            out.setdefault(op, []).append(n.name or n.op)
    return out


def notes(graph: gs.Graph) -> list[str]:
    """What ``quantize`` says of the rules' placement of ``graph``: where it has no measured word
    (``uncovered``), then each entry's ``note`` (a measured cost the placement does not remove)."""
    lines = [unmeasured_line(uncovered(graph)), *(p.note(graph) for p in REGISTRY if p.note is not None)]
    return [x for x in lines if x]


def unmeasured_line(found: dict[str, list[str]]) -> Optional[str]:
    """The one line ``quantize`` and ``lint`` print for ``uncovered``'s result (None when all is covered)."""
    if not found:
        return None
    ops = sorted(found.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    n = sum(len(v) for v in found.values())
    return (f"{UNMEASURED} ({plural(n, 'node')} of operators no rule covers: "
            + ", ".join(f"{op} {len(v)}" for op, v in ops) + ")")


# --------------------------------------------------------------------------------------------------
# Engine side
# --------------------------------------------------------------------------------------------------


def explain_wide(view: LayerView) -> Optional[Pattern]:
    """The pattern that explains a compute layer running wider than INT8: the most specific (latest in
    precedence) whose signature matches."""
    for p in reversed(REGISTRY):
        if p.engine is not None and p.engine.wide is not None and p.engine.wide(view):
            return p
    return None


def explain_reformat(view: LayerView) -> Optional[Pattern]:
    """The pattern whose placement causes this reformat layer, if one says so."""
    for p in reversed(REGISTRY):
        if p.engine is not None and p.engine.reformat is not None and p.engine.reformat(view):
            return p
    return None


def explain_build_error(messages: Sequence[str], graph: Optional[gs.Graph] = None,
                        named: Collection[str] = ()) -> tuple[Optional[Pattern], Optional[Finding]]:
    """The entry that explains a failed TensorRT build or parse (its error lines, the most specific first)
    and, given the model that was built, its lint finding there: the region the build broke on.

    Several entries can fail with one TensorRT assertion (``inception-build`` and ``merged-head``:
    ``chooseHigherPrecision``), so the model decides among those whose ``build_error`` matches: the entry
    whose finding holds a node the log names (``named``), else the first with a finding, else the first
    match (entries in order of the first line they match, then registry order), as without a model.
    """
    import re

    if isinstance(messages, str):  # one line given as it stands, not its characters
        messages = [messages]
    candidates = list(dict.fromkeys(p for m in messages for p in REGISTRY
                                    if p.build_error and re.search(p.build_error, m)))
    if not candidates:
        return None, None
    findings = [] if graph is None else lint(graph, [p.id for p in candidates if p.lint is not None])
    holding = [f for f in findings if set(f.nodes) & set(named)]
    for pool in (holding, findings):
        for p in candidates:
            found = next((f for f in pool if f.rule == p.id), None)
            if found is not None:
                return p, found
    return candidates[0], None


def with_signature(part: str) -> Sequence[Pattern]:
    """Patterns whose engine signature has ``part`` ('fused', 'unfused', 'wide', 'reformat')."""
    return [p for p in REGISTRY if p.engine is not None and getattr(p.engine, part) is not None]


def is_unfused_residual(view: LayerView) -> bool:
    """The residual-add pattern's unfused form: a residual Add TensorRT ran as its own PointWise layer."""
    sig = pattern("residual-add").engine
    return sig is not None and sig.unfused is not None and sig.unfused(view)
