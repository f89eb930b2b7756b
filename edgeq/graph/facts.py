"""What one TensorRT 8.6 pattern entry is: the types of the registry (``edgeq.graph.registry``).

A pattern is one fact about TensorRT 8.6 with everything each consumer needs to act on it:

- ``match``: where it occurs in a graph (float or Q/DQ: the walkers see through Q/DQ pairs), as
  ``Match`` values naming the region's nodes and the decision the fact implies for each edge;
- placement reads the edge decisions (``Edge``): which (tensor, consumer) edges TensorRT wants INT8,
  which must stay float, which need a Q/DQ of their own;
- ``lint``: what a Q/DQ model that breaks the fact looks like (findings with nodes and a fix);
- ``engine``: how the fact shows in an engine's layer JSON (a wider layer it explains, a fused form
  one engine has and another lacks), read by the report, the gate's explanations and ``compare``;
- ``tunable``: whether the sites it places are a choice ``edgeq tune`` measures;
- ``floats_nodes``: its regions run float whole (their weights too), not edge by edge.

Types only; no graph code here, so every layer of the package can name them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Callable, Optional, Protocol

from edgeq.findings import Level

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs


class Want(str, Enum):
    """What a pattern decides for one (tensor, consumer) edge."""

    INT8 = "int8"  # the consumer reads INT8: a Q/DQ on the tensor, moved back across data movement
    FLOAT = "float"  # the edge stays float: no Q/DQ here, and none moves across it
    OWN = "own"  # INT8 through a Q/DQ right before the consumer, in the scale group of what is behind


@dataclass(frozen=True)
class Edge:
    tensor: str
    consumer: str  # node name
    want: Want


@dataclass(frozen=True)
class Match:
    """One place a pattern occurs: its anchor node, the region's nodes and the edges it decides."""

    pattern: str
    anchor: str
    nodes: tuple[str, ...]
    edges: tuple[Edge, ...] = ()
    site_rule: Optional[str] = None  # rule id for the sites it creates (default: the pattern's id)

    def wanting(self, want: Want) -> list[Edge]:
        return [e for e in self.edges if e.want == want]


class LayerView(Protocol):
    """One engine layer as a pattern's engine signature reads it (``edgeq.report.explain`` builds it)."""

    @property
    def ops(self) -> frozenset[str]:
        """ONNX op types the layer ran (Q/DQ left out)."""

    @property
    def kind(self) -> str:
        """'compute', 'reformat', 'weights', 'no-op' or 'unknown'."""

    @property
    def pointwise(self) -> bool:
        """A PointWise/ElementWise/Activation layer: no weighted op in it."""

    @property
    def inputs(self) -> int:
        """How many activation inputs it reads."""

    @property
    def gated(self) -> bool:
        """One activation input is 1x1 in space while another is not: a per-channel gate (SE)."""

    @property
    def upstream(self) -> frozenset[str]:
        """Op types of the layers feeding it through copies and reformats ('multi-producer' when several
        layers write one input: a Concat built as copies)."""

    @property
    def downstream(self) -> frozenset[str]:
        """Op types of the next compute layer."""

    @property
    def formats(self) -> str:
        """'INT8 NCHW -> INT8 NC/32HW32' (activations)."""

    @property
    def foreign(self) -> bool:
        """A Myelin layer: type 'Myelin' or a '{ForeignNode[first...last]}' name."""


@dataclass(frozen=True)
class EngineSignature:
    """How a pattern shows in engine layer JSON.

    ``wide``: a compute layer running wider than INT8 for this pattern's reason (first match in
    registry order explains it). ``fused``: the layer is the fused form; an engine that lacks the same
    group of nodes missed the fusion. ``unfused``: the layer is the form TensorRT builds when placement
    broke the fusion. ``reformat``: a reformat layer this pattern's placement causes. ``describe``: one
    line for explanations.
    """

    describe: str
    wide: Optional[Callable[[LayerView], bool]] = None
    fused: Optional[Callable[[LayerView], bool]] = None
    unfused: Optional[Callable[[LayerView], bool]] = None
    reformat: Optional[Callable[[LayerView], bool]] = None


@dataclass(frozen=True)
class Decisions:
    """The registry's decision for each edge, by the last pattern (in registry order) that decided it.

    Placement acts on it; lint reads it so that no check calls wrong what a later pattern asks for
    (a Q/DQ between a convolution and a Sigmoid is wrong in a SiLU, right before an SE gate).
    """

    by_edge: dict[tuple[str, str], tuple[Want, str]] = field(default_factory=dict)

    def want(self, tensor: str, consumer: str) -> Optional[Want]:
        got = self.by_edge.get((tensor, consumer))
        return got[0] if got else None

    def rule(self, tensor: str, consumer: str) -> Optional[str]:
        got = self.by_edge.get((tensor, consumer))
        return got[1] if got else None


@dataclass(frozen=True)
class Hit:
    """One lint hit; the registry turns it into a Finding with the pattern's level, fix and citation."""

    message: str
    nodes: tuple[str, ...] = ()
    level: Optional[Level] = None  # the LintSpec's level when None
    fix: Optional[str] = None  # the LintSpec's fix when None


@dataclass(frozen=True)
class LintSpec:
    """The lint half: ``check`` reads the graph, this pattern's matches and every pattern's decisions."""

    level: Level
    summary: str  # one line, for listings and the rules doc heading
    fix: str
    check: Callable[[gs.Graph, list[Match], Decisions], list[Hit]]


@dataclass(frozen=True)
class Pattern:
    """One TensorRT 8.6 fact, as data with its evidence, and every consumer's half of it."""

    id: str
    fact: str
    evidence: str  # fixture files (tests/fixtures/...) or documentation sections
    verified: bool = True
    match: Optional[Callable[[gs.Graph], list[Match]]] = None
    lint: Optional[LintSpec] = None
    engine: Optional[EngineSignature] = None
    tunable: bool = False
    aliases: tuple[str, ...] = ()  # older ids of the same fact, still accepted where ids are typed
    clean_fix: str = ""  # what `edgeq clean` says when its passes could not make the model fit
    kind: str = "fusion"  # "fusion" (where Q/DQ go) or "qdq" (what the 8.6 parser accepts as Q/DQ)
    precedence: int = 0  # registry order: on an edge two patterns decide, the later one wins
    ops: frozenset[str] = field(default_factory=frozenset)  # op types the fact is about, when a list
    # its matches' nodes run float as a whole (a Myelin region): placement gives them no int8 weights and
    # records them in the plan's float_nodes, which the gates read as float by design
    floats_nodes: bool = False
    # a regex of the TensorRT 8.6 build or parse error this fact explains: a failed build names its region
    # through it (``edgeq.report.runlog.build_failure``); entries may share one, and the model built
    # decides between them (``edgeq.graph.registry.explain_build_error``)
    build_error: str = ""
    # what ``quantize`` says of a graph this entry matches, when the rules' output carries a measured cost
    # the placement does not remove (a build 8.6 fails, Myelin layers slower than implicit); None: nothing
    note: Optional[Callable[[gs.Graph], Optional[str]]] = None


def matches_of(pattern: Pattern, graph: gs.Graph) -> list[Match]:
    return pattern.match(graph) if pattern.match is not None else []


def edge(tensor: gs.Tensor, consumer: gs.Node, want: Want) -> Edge:
    return Edge(tensor.name, consumer.name, want)


def edges(pairs: Iterable[tuple[gs.Tensor, gs.Node]], want: Want) -> tuple[Edge, ...]:
    return tuple(Edge(t.name, n.name, want) for t, n in pairs)
