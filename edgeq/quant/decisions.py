"""The decision points ``edgeq tune`` measures: groups of Q/DQ sites where two placements are legal.

Static rules say what TensorRT 8.6 can fuse; they cannot say which of two legal placements is faster
on one GPU at one batch size. A decision is one group of plan sites, by the rule that placed them
(each residual block's skip, each Concat's own Q/DQ, the pool tail, a SiLU feeding a residual Add,
a Concat's shared-scale inputs) or by the implicit engine's measurement (sites whose consumers the
implicit engine ran in FP16: mirrored, i.e. left float, at the start). A candidate placement is the
plan with some decisions switched off: their sites (and the weight DQs they bring) removed, every other
site, scale and weight kept. From the mirror of the implicit engine the decisions go both ways: a mirror
site a tunable rule places too can be tried float, and a site the rules place where the engine kept float
can be tried INT8 (``mirror_decisions``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from edgeq.graph import registry
from edgeq.quant.plan import Plan, QdqSite, WeightSite
from edgeq.quant.regions import RULE as FLOAT_ENTRY
from edgeq.quant.regions import Region

# Sites whose pattern is a choice between two legal placements (the registry's tunable entries).
TUNABLE_RULES = registry.tunable()
IMPLICIT_FP16 = "implicit-fp16"  # a decision the implicit engine's layer precisions made
RULES_INT8 = "rules-int8"  # from the mirror: a site the rules place where the implicit engine kept float


@dataclass(frozen=True)
class Decision:
    """One toggle: its ``sites`` (and ``weights``, the DQs of the weights its consumers then read INT8) are
    in the placement when on. ``start``: its state in the start placement (off for an implicit-FP16 mirror
    and for a rules site the implicit engine kept float)."""

    id: str
    rule: str
    sites: tuple[str, ...]
    consumers: tuple[str, ...]
    start: bool = True
    weights: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "rule": self.rule, "sites": list(self.sites), "weights": list(self.weights),
                "consumers": list(self.consumers), "start": self.start}  # fmt: skip


def decision_points(plan: Plan, fp16_nodes: Collection[str] = (), regions: Sequence[Region] = ()
                    ) -> list[Decision]:
    """The plan's decisions, in graph order: a site whose consumers implicit ran all in FP16 joins its
    group's mirror decision (start off); other sites of a tunable rule join their (rule, group) one.
    ``plan`` placed without the float-entry rule: each of its ``regions`` is one decision, off at the
    start (the rules leave it float), tried INT8 with its weights (``float_entry_decisions``)."""
    fp16 = set(fp16_nodes)
    in_region = {t for r in regions for t in r.sites}
    groups: dict[tuple[str, str], list[int]] = {}
    for i, s in enumerate(plan.sites):
        if s.tensor in in_region:
            continue
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
    return out + float_entry_decisions(plan, regions)


def float_entry_decisions(plan: Plan, regions: Sequence[Region]) -> list[Decision]:
    """One decision per float-entry region: its sites and its weighted nodes' weight DQs, together (a
    branch is INT8 or float as a whole: one site alone adds a QuantizeLinear layer and gains nothing)."""
    weight_of = {w.node: w.tensor for w in plan.weights}
    consumers = {s.tensor: s.consumers for s in plan.sites}
    return [Decision(f"{FLOAT_ENTRY}:{r.entries[0]}", FLOAT_ENTRY, r.sites,
                     tuple(dict.fromkeys(c for t in r.sites for c in consumers.get(t, ()))), start=False,
                     weights=tuple(weight_of[n] for n in r.nodes if n in weight_of))
            for r in regions]


def candidate_plan(plan: Plan, decisions: list[Decision], state: Mapping[str, bool]) -> Plan:
    """``plan`` without the sites and weight DQs of every decision ``state`` switches off."""
    off_decisions = [d for d in decisions if not state.get(d.id, d.start)]
    off = {t for d in off_decisions for t in d.sites}
    off_weights = {w for d in off_decisions for w in d.weights}
    return replace(plan, sites=tuple(s for s in plan.sites if s.tensor not in off),
                   weights=tuple(w for w in plan.weights if w.tensor not in off_weights))  # fmt: skip


def candidate_key(plan: Plan) -> str:
    """A candidate's identity: the sites it keeps (what a build and a measurement depend on)."""
    text = "\n".join(sorted(s.tensor for s in plan.sites))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def mirror_decisions(mirror: Plan, rules: Plan, regions: Sequence[Region] = ()
                     ) -> tuple[Plan, list[Decision]]:
    """``edgeq tune``'s start from the mirror of the implicit engine: (the plan decisions toggle, the
    decisions). Both ways: every mirror site that the rules place by a tunable pattern joins that
    pattern's (rule, group) decision, on at the start (implicit carried it INT8), tried float; every site
    the rules place where the engine kept float joins a ``rules-int8`` decision per (rule, group), off at
    the start (the plan is the mirror exactly), tried INT8 together with the per-channel weight DQs of its
    weighted consumers that the mirror left float. Such added sites keep the rules' scale groups among
    themselves: a mirror site's scale never changes by what a candidate adds. ``rules`` placed without
    the float-entry rule: the added sites of one of its ``regions`` are one decision, with the weight DQs
    of every weighted node of the region."""
    by_tensor = {s.tensor: (s.rule, s.group) for s in rules.sites if s.rule in TUNABLE_RULES}
    groups: dict[tuple[str, str], list[int]] = {}
    for i, s in enumerate(mirror.sites):
        if s.tensor in by_tensor:
            groups.setdefault(by_tensor[s.tensor], []).append(i)
    decisions = [Decision(f"{rule}:{group}", rule, tuple(mirror.sites[i].tensor for i in idx),
                          tuple(dict.fromkeys(c for i in idx for c in mirror.sites[i].consumers)))
                 for (rule, group), idx in groups.items()]  # fmt: skip
    # Sites the rules add: not a mirror site, not data movement the mirror already runs INT8.
    taken = {s.tensor for s in mirror.sites} | set(mirror.commuted)
    added = [s for s in rules.sites if s.tensor not in taken]
    weighted = {w.node for w in mirror.weights}
    new_weights = {w.node: w for w in rules.weights if w.node not in weighted}
    region_of = {t: r.entries[0] for r in regions for t in r.sites}
    region_nodes = {r.entries[0]: r.nodes for r in regions}
    scale_groups: dict[tuple[str, str], list[QdqSite]] = {}  # the rules' groups among the added sites
    toggles: dict[tuple[str, str], list[QdqSite]] = {}  # one decision each: a region, else a rules group
    for s in added:
        scale_groups.setdefault((s.rule, s.group), []).append(s)
        toggle = (FLOAT_ENTRY, region_of[s.tensor]) if s.tensor in region_of else (s.rule, s.group)
        toggles.setdefault(toggle, []).append(s)
    group_ids = dict(mirror.group_ids)
    plan_groups = dict(mirror.groups)
    for members in scale_groups.values():
        gid = members[0].tensor  # not a mirror group id: those are mirror site tensors
        plan_groups[gid] = tuple(s.tensor for s in members)
        group_ids.update({s.tensor: gid for s in members})
    extra_sites = [replace(s, group=group_ids[s.tensor]) for s in added]
    extra_weights: list[WeightSite] = []
    for (rule, key), members in toggles.items():
        consumers = tuple(dict.fromkeys(c for s in members for c in s.consumers))
        nodes = region_nodes[key] if rule == FLOAT_ENTRY else consumers
        weights = [new_weights.pop(c) for c in nodes if c in new_weights]
        extra_weights += weights
        decisions.append(Decision(f"{RULES_INT8}:{rule}:{members[0].tensor}", RULES_INT8,
                                  tuple(s.tensor for s in members), consumers, start=False,
                                  weights=tuple(w.tensor for w in weights)))
    plan = replace(mirror, sites=(*mirror.sites, *extra_sites), weights=(*mirror.weights, *extra_weights),
                   groups=plan_groups, group_ids=group_ids)  # fmt: skip
    return plan, decisions
