"""INT8 regions that TensorRT 8.6 can enter only through a QuantizeLinear of its own: run them float.

Why: the implicit engine quantizes float data movement in the reformat into a convolution's INT8
NC/32HW32 (one copy). An explicit network cannot say that: a Q whose input is float data movement
(a Slice, a channel shuffle's Reshape) runs as its own layer into INT8 row-major or NC/4HW4, then a
second reformat to NC/32HW32, or TensorRT 8.6 moves it back through the data movement, which then runs
INT8 row-major (`edgeq rules float-entry`). When every way into an INT8 region is such a Q, the region
is cheaper float, as the implicit engine itself ran most of them. ``float_entry_regions`` finds these
regions in a plan; ``drop_regions`` leaves them float.

Only a branch: a region whose INT8 ends, float, at the data movement that closes it (ShuffleNet's branch
between a Slice and the Concat before the shuffle, where the gain was measured). A region that runs INT8
through data movement of its own (a C2f's Split and Concat, SPPF's pools, an upsample) is the network's
INT8 body entered once: a QuantizeLinear of its own costs a layer and a reformat of one tensor there,
running it float costs every layer in it (a real YOLOv8n engine entered its whole body so), so it stays
INT8.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from edgeq.graph.patterns import moves_data, producer, var_inputs
from edgeq.graph.trt86.regions import q_layer_at
from edgeq.quant.plan import FloatTensor, Plan
from edgeq.quant.rules import WEIGHTED_OPS

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

RULE = "float-entry"


@dataclass(frozen=True)
class Region:
    """Nodes that would run INT8 only behind ``entries`` (site tensors whose Q cannot fuse)."""

    entries: tuple[str, ...]
    nodes: tuple[str, ...]
    sites: tuple[str, ...]  # every Q/DQ site inside (entries included)
    commuted: tuple[str, ...]  # tensors INT8 by commuting inside the region
    through: tuple[str, ...] = ()  # data movement inside that runs INT8: not a branch, stays INT8

    @property
    def branch(self) -> bool:
        """Where the float-entry evidence applies: no data movement runs INT8 inside."""
        return not self.through


def float_entries(graph: gs.Graph, plan: Plan) -> list[str]:
    """Site tensors whose Q no layer can write: float data movement that goes back to a fork
    (``edgeq.graph.trt86.regions.q_layer_at``, which lint reads too)."""
    return _entries(graph.tensors(), plan)


def _entries(tensors: Mapping[str, gs.Tensor], plan: Plan) -> list[str]:
    int8 = {s.tensor for s in plan.sites} | set(plan.commuted)
    return [s.tensor for s in plan.sites if s.tensor in tensors
            and q_layer_at(tensors[s.tensor], lambda t: t.name in int8) is not None]


def float_entry_regions(graph: gs.Graph, plan: Plan) -> list[Region]:
    """The branches (``Region.branch``) of ``entry_regions``: the regions that run float."""
    return [r for r in entry_regions(graph, plan) if r.branch]


def entry_regions(graph: gs.Graph, plan: Plan) -> list[Region]:
    """The INT8 regions entered only through float entries. A region grows from an entry over INT8
    tensors (sites and commuted tensors): their readers and, for a tensor that is not an entry, its
    producer join it, with the pointwise ops behind each member's float outputs (its epilogue). One that
    reaches the graph input's Q/DQ is left INT8: that way in is a fused input reformat."""
    grow = _Grower(graph, plan)
    seen: set[str] = set()
    regions = []
    for start in (s.tensor for s in plan.sites if s.tensor in grow.entries):
        if start in seen:
            continue
        region = grow.region(start)
        seen |= set(region.sites) if region is not None else {start}
        if region is not None:
            regions.append(region)
    return regions


class _Grower:
    def __init__(self, graph: gs.Graph, plan: Plan) -> None:
        self.tensors = graph.tensors()
        self.sites = {s.tensor: s for s in plan.sites}
        self.int8 = set(self.sites) | set(plan.commuted)
        self.entries = set(_entries(self.tensors, plan))
        self.by_name = {n.name: n for n in graph.nodes}

    def region(self, start: str) -> Region | None:
        nodes: set[str] = set()
        members: set[str] = set()
        todo = [start]
        while todo:
            t = todo.pop()
            if t in members:
                continue
            members.add(t)
            tensor = self.tensors.get(t)
            if tensor is None:
                return None
            if t not in self.entries:
                p = producer(tensor)
                if p is None:  # the graph input's Q
                    return None
                todo += self._join(p, nodes)
            readers = ([self.by_name[c] for c in self.sites[t].consumers if c in self.by_name]
                       if t in self.sites else list(tensor.outputs))
            for n in readers:
                todo += self._join(n, nodes)
        through = tuple(sorted(n for n in nodes if moves_data(self.by_name[n])))
        return Region(tuple(sorted(members & self.entries)), tuple(sorted(nodes)),
                      tuple(sorted(members & set(self.sites))), tuple(sorted(members - set(self.sites))),
                      through)

    def _join(self, n: gs.Node, nodes: set[str]) -> list[str]:
        """Add ``n`` and the pointwise ops its float outputs feed; the INT8 tensors they touch."""
        found: list[str] = []
        stack = [n]
        while stack:
            m = stack.pop()
            if m.name in nodes:
                continue
            nodes.add(m.name)
            found += [t.name for t in (*var_inputs(m), *m.outputs) if t.name in self.int8]
            stack += [r for o in m.outputs if o.name not in self.int8 for r in o.outputs
                      if r.op not in WEIGHTED_OPS and not moves_data(r)]
        return found


def drop_regions(plan: Plan, regions: Iterable[Region], rule: str = RULE, *, float_weights: bool = True
                 ) -> Plan:
    """``plan`` with each region float: its Q/DQ sites and commuted tensors gone, each site recorded as
    left float by ``rule`` (``float-entry``), its nodes in ``float_nodes`` (the gates read them as float
    by design, not as a fallback) and, with ``float_weights`` (a region that runs float whole), their
    weights float; without it they keep their DQ (an entry that floats edges, not nodes: ``floats_nodes``)."""
    regions = list(regions)
    off = {t for r in regions for t in r.sites}
    off_commuted = {t for r in regions for t in r.commuted}
    off_nodes = {n for r in regions for n in r.nodes}
    weight_nodes = off_nodes if float_weights else set()
    if not off and not off_commuted:
        return plan
    gone = off | off_commuted
    groups = {gid: tuple(m for m in members if m not in gone) for gid, members in plan.groups.items()}
    groups = {gid: m for gid, m in groups.items() if m}
    return replace(
        plan,
        sites=tuple(s for s in plan.sites if s.tensor not in off),
        weights=tuple(w for w in plan.weights if w.node not in weight_nodes),
        commuted=tuple(t for t in plan.commuted if t not in off_commuted),
        floats=plan.floats + tuple(FloatTensor(t, rule) for t in sorted(gone)),
        groups=groups,
        group_ids={t: g for t, g in plan.group_ids.items() if t not in gone and g in groups},
        float_nodes=tuple(dict.fromkeys((*plan.float_nodes, *sorted(off_nodes)))),
    )


def float_entry(graph: gs.Graph, plan: Plan, keep: Collection[str] = ()) -> tuple[Plan, list[Region]]:
    """``plan`` with its float-entry regions float, and those regions; a region holding a node in
    ``keep`` (forced by the override file) stays as placed."""
    regions = [r for r in float_entry_regions(graph, plan) if not set(r.nodes) & set(keep)]
    return drop_regions(plan, regions), regions
