"""The decision points ``edgeq tune`` measures: groups of Q/DQ sites where two placements are legal.

Static rules say what TensorRT 8.6 can fuse; they cannot say which of two legal placements is faster
on one GPU at one batch size. A decision is one group of plan sites, by the rule that placed them
(each residual block's skip, each Concat's own Q/DQ, the pool tail, a SiLU feeding a residual Add,
a Concat's shared-scale inputs) or by the implicit engine's measurement (sites whose consumers the
implicit engine ran in FP16: mirrored, i.e. left float, at the start). A candidate placement is the
plan with some decisions switched off: their sites removed, every other site, scale and weight kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from edgeq.graph import registry
from edgeq.quant.placement import Plan

# Sites whose pattern is a choice between two legal placements (the registry's tunable entries).
TUNABLE_RULES = registry.tunable()
IMPLICIT_FP16 = "implicit-fp16"  # a decision the implicit engine's layer precisions made


@dataclass(frozen=True)
class Decision:
    """One toggle: its ``sites`` are in the placement when on. ``start``: its state in the start
    placement (off for an implicit-FP16 mirror)."""

    id: str
    rule: str
    sites: tuple[str, ...]
    consumers: tuple[str, ...]
    start: bool = True

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "rule": self.rule, "sites": list(self.sites),
                "consumers": list(self.consumers), "start": self.start}  # fmt: skip


def decision_points(plan: Plan, fp16_nodes: Collection[str] = ()) -> list[Decision]:
    """The plan's decisions, in graph order: a site whose consumers implicit ran all in FP16 joins its
    group's mirror decision (start off); other sites of a tunable rule join their (rule, group) one."""
    fp16 = set(fp16_nodes)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, s in enumerate(plan.sites):
        if s.consumers and fp16 and set(s.consumers) <= fp16:
            key = (IMPLICIT_FP16, s.group)
        elif s.rule in TUNABLE_RULES:
            key = (s.rule, s.group)
        else:
            continue
        groups.setdefault(key, []).append(i)
    out = []
    for (rule, group), idx in groups.items():
        sites = tuple(plan.sites[i].tensor for i in idx)
        consumers = tuple(dict.fromkeys(c for i in idx for c in plan.sites[i].consumers))
        out.append(Decision(f"{rule}:{group}", rule, sites, consumers, start=rule != IMPLICIT_FP16))
    return out


def candidate_plan(plan: Plan, decisions: list[Decision], state: Mapping[str, bool]) -> Plan:
    """``plan`` without the sites of every decision ``state`` switches off."""
    off = {t for d in decisions if not state.get(d.id, d.start) for t in d.sites}
    return replace(plan, sites=tuple(s for s in plan.sites if s.tensor not in off))


def candidate_key(plan: Plan) -> str:
    """A candidate's identity: the sites it keeps (what a build and a measurement depend on)."""
    text = "\n".join(sorted(s.tensor for s in plan.sites))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def mirror_decisions(mirror: Plan, rules: Plan) -> list[Decision]:
    """``edgeq tune --placement implicit``'s decisions, on the mirror of the implicit engine: every mirror
    site that the rules place by a tunable pattern joins that pattern's (rule, group) decision, on at the
    start (implicit carried it INT8); toggling one off tries it float. Sites the rules would add and the
    engine kept float are not decisions: the mirror is where implicit's own timing put them."""
    by_tensor = {s.tensor: (s.rule, s.group) for s in rules.sites if s.rule in TUNABLE_RULES}
    groups: dict[tuple[str, str], list[int]] = {}
    for i, s in enumerate(mirror.sites):
        if s.tensor in by_tensor:
            groups.setdefault(by_tensor[s.tensor], []).append(i)
    return [Decision(f"{rule}:{group}", rule, tuple(mirror.sites[i].tensor for i in idx),
                     tuple(dict.fromkeys(c for i in idx for c in mirror.sites[i].consumers)))
            for (rule, group), idx in groups.items()]  # fmt: skip
