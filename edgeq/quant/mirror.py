"""Mirror an implicit engine: a Q/DQ exactly where TensorRT carried INT8 between layers, nowhere else.

TensorRT's implicit mode chooses, by timing on the target, which tensors to carry in INT8; its layer JSON
(``trtexec --exportLayerInfo --profilingVerbosity=detailed``) names every layer input and output by the
ONNX tensor it carries, with its ``Format/Datatype``. ``plan_from_engine`` reads that back onto the graph
the engine was built from (edgeq's cleaned ``<name>.int8.fp32.onnx``) and returns a ``Plan``, so the
calibration, Q/DQ insertion, cache and accuracy check of ``edgeq quantize`` stay shared.

How an engine edge becomes a graph edge, in short (``edgeq/docs/trt86-rules.md#mirror-int8``):

* A layer's ONNX nodes come from its ``Metadata`` (``[ONNX Layer: a]``), else from its fused name
  (``A + B``, ``PWN(PWN(A), B)``, ``{ForeignNode[a...b]}``: every node between a and b), ``_clone_N``
  suffixes dropped. Layers that absorbed no node (``Reformatting CopyNode for Input/Output Tensor i to X``,
  unnamed or synthetic copies) are see-through: a reader looks back across them to the ONNX tensor, and
  reads it in the format the last of them wrote.
* The reader is the layer's node that reads that tensor in the graph. Where TensorRT folded a node away
  (a Split or Slice turned into an offset read), the walk goes forward across nodes no layer holds. A
  tensor produced INT8 is quantized once before such data movement (the nodes between commute); one
  produced in float and quantized by the reader's reformat gets its Q/DQ right before the reader.
* A layer that writes straight into a Concat's output buffer feeds that Concat in the precision it wrote;
  a reader of a Concat's buffer that reads one of its inputs in the graph reads that input.
* Tensors joined by INT8 data movement or a Concat share one scale (the largest amax).
* Weights of the layers that ran INT8 (``"Weights": {"Type": "Int8"}``, or an INT8 read) get their
  per-channel DequantizeLinear.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeq.errors import QuantError, ReportError
from edgeq.graph import registry
from edgeq.graph.facts import Want, matches_of
from edgeq.graph.patterns import is_float, moves_data, producer
from edgeq.graph.trt86.common import FLOAT_PRECISIONS
from edgeq.graph.trt86.inception import HEAD_RULE
from edgeq.graph.trt86.inception import RULE as INEXPRESSIBLE
from edgeq.graph.trt86.regions import INT8_BODY, QUANTIZING_REFORMAT
from edgeq.quant.placement import weight_axis
from edgeq.quant.plan import FloatTensor, Plan, QdqSite, WeightSite
from edgeq.quant.regions import Region, drop_regions, entry_regions
from edgeq.quant.rules import WEIGHTED_OPS, rule
from edgeq.text import plural
from edgeq.unionfind import UnionFind

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

    from edgeq.report.parse import EngineLayer, EngineLayers

DETAILED_HINT = ("rebuild the implicit engine with trtexec --int8 --fp16 --calib=<name>.int8.cache "
                 "--onnx=<name>.int8.fp32.onnx --profilingVerbosity=detailed --exportLayerInfo=FILE")
MIN_MAPPED = 0.5  # fewer of the engine's named layers than this map onto the model: another model's engine

_COPY_FOR = re.compile(r"^Reformatting CopyNode for (Input|Output) Tensor \d+ to ", re.S)
_FOREIGN = re.compile(r"^\{ForeignNode\[(?P<a>.*?)\.\.\.(?P<b>.*)\]\}$", re.S)
_CLONE = re.compile(r"_clone_\d+$")


# --------------------------------------------------------------------------------------------------
# What the mirror found
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unmapped:
    """An engine tensor some layer read that the mirror could not put on a graph edge."""

    tensor: str
    layer: str
    precision: str | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "layer": self.layer, "precision": self.precision,
                "reason": self.reason}


@dataclass(frozen=True)
class MirrorReport:
    """How the engine's layers and tensors mapped onto the graph."""

    source: str
    layers: int  # engine layers
    named_layers: int  # layers that name ONNX nodes (metadata or fused name)
    mapped_layers: int  # of those, the ones whose nodes are in the model
    int8_edges: int  # (tensor, node) edges the engine read INT8: each gets a Q/DQ
    float_edges: int  # edges it read FP32/FP16: no Q/DQ
    unmapped: tuple[Unmapped, ...] = ()
    unmapped_layers: tuple[str, ...] = ()  # layers naming nodes the model does not have
    float_entry: tuple[str, ...] = ()  # entries of the INT8 regions left float (edgeq rules float-entry)
    float_entry_edges: int = 0  # INT8 edges inside them: no Q/DQ
    int8_entry: tuple[str, ...] = ()  # entries of such regions kept INT8: not a branch (Region.branch)
    # INT8 edges Q/DQ cannot say on 8.6 (``REFUSED``: a merged 1x1 convolution's output, a merged head
    # pair's input): the tensors, all entries together, and the edges per entry
    inexpressible: tuple[str, ...] = ()
    refused: tuple[tuple[str, int], ...] = ()  # (entry id, INT8 edges it left float)
    # tensors a layer wrote INT8 that a reformat turned float for some reader: quantized for those too
    reformatted: tuple[str, ...] = ()

    @property
    def inexpressible_edges(self) -> int:
        return sum(edges for _, edges in self.refused)

    def summary_line(self) -> str:
        text = (f"mirrored {self.int8_edges} INT8 edges ({self.float_edges} float) from {self.source}: "
                f"{self.mapped_layers} of {self.named_layers} named layers map")
        if self.float_entry:
            text += (f"; {self.float_entry_edges} of the INT8 edges left float in "
                     f"{plural(len(self.float_entry), 'region')} the engine entered {QUANTIZING_REFORMAT}")
        if self.int8_entry:
            text += (f"; {plural(len(self.int8_entry), 'entry', 'entries')} quantized by a reformat kept "
                     f"INT8 ({', '.join(self.int8_entry[:3])}): {INT8_BODY}")
        if self.reformatted:
            text += f"; {reformatted_note(self.reformatted)}"
        for entry, edges in self.refused:
            text += f"; {refused_note(entry, edges)}"
        if self.unmapped:
            names = ", ".join(u.tensor for u in self.unmapped[:3])
            text += f"; {len(self.unmapped)} tensors unmapped ({names})"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.source,
            "layers": self.layers,
            "named_layers": self.named_layers,
            "mapped_layers": self.mapped_layers,
            "int8_edges": self.int8_edges,
            "float_edges": self.float_edges,
            "unmapped": [u.to_dict() for u in self.unmapped],
            "unmapped_layers": list(self.unmapped_layers),
            "float_entry": list(self.float_entry),
            "float_entry_edges": self.float_entry_edges,
            "int8_entry": list(self.int8_entry),
            "inexpressible": list(self.inexpressible),
            "inexpressible_edges": self.inexpressible_edges,
            "refused": {entry: edges for entry, edges in self.refused},
            "reformatted": list(self.reformatted),
        }


# --------------------------------------------------------------------------------------------------
# Reading the engine
# --------------------------------------------------------------------------------------------------


def load_engine(path: str | Path) -> EngineLayers:
    """The implicit engine's layer JSON (``.json``, or gzipped ``.json.gz``), refused unless it can be
    mirrored: detailed (tensor names and formats), and of an implicit engine."""
    from edgeq.report.parse import load_layers

    p = Path(path)
    try:
        if p.name.endswith(".gz") and p.is_file():
            try:
                text = gzip.decompress(p.read_bytes()).decode("utf-8", errors="replace")
            except (OSError, EOFError, gzip.BadGzipFile) as e:
                raise QuantError(f"--from-engine {p}: not gzip data ({e})", hint=DETAILED_HINT) from None
            layers = replace(load_layers(text), source=str(p))
        else:
            layers = load_layers(p)
    except ReportError as e:
        raise QuantError(f"--from-engine {e.message}".replace("<text>", str(p)), hint=DETAILED_HINT) from None
    if not layers.detailed:
        raise QuantError(f"--from-engine {p}: the engine was built with ProfilingVerbosity.LAYER_NAMES_ONLY: "
                         "its layer JSON names no tensors or formats to mirror", hint=DETAILED_HINT)
    qdq = next((lay.name for lay in layers.layers if lay.origin == "QDQ"), None)
    if qdq is not None:
        raise QuantError(f"--from-engine {p}: this is an explicit (Q/DQ) engine's layer JSON "
                         f"(layer '{qdq[:80]}'); mirror the implicit engine", hint=DETAILED_HINT)
    return layers


# --------------------------------------------------------------------------------------------------
# The graph side
# --------------------------------------------------------------------------------------------------


class _Graph:
    """Name lookups over the graphsurgeon graph (read-only)."""

    def __init__(self, graph: gs.Graph) -> None:
        from edgeq.graph.patterns import is_constant

        self.graph = graph
        self.nodes = {n.name: n for n in graph.nodes}
        self.tensors = graph.tensors()
        self.order = {n.name: i for i, n in enumerate(graph.nodes)}
        inputs = {t.name for t in graph.inputs}
        self.constant = {name for name, t in self.tensors.items() if is_constant(t)}
        self.activations = [name for name, t in self.tensors.items() if name and name not in self.constant
                            and is_float(t) and (t.inputs or name in inputs)]

    def node(self, name: str) -> str | None:
        """A layer-name piece -> the graph's node name (``_clone_N`` dropped), or None."""
        if name in self.nodes:
            return name
        base = _CLONE.sub("", name)
        return base if base in self.nodes else None

    def region_end(self, end: str) -> str | None:
        """One end of a ``{ForeignNode[a...b]}``: a node, or a weight TensorRT named the region by (its
        first reader: ``net.features.3.0.attn.qkv.bias``), or None where TensorRT left it unnamed."""
        for piece in (p.strip() for p in end.split(" + ")):
            if piece.startswith("(Unnamed Layer"):
                continue
            node = self.node(piece)
            t = self.tensors.get(piece)
            if node is None and t is not None and piece in self.constant and t.outputs:
                node = min((n.name for n in t.outputs), key=lambda n: self.order.get(n, 0))
            if node is not None:
                return node
        return None

    def tensor(self, name: str) -> gs.Tensor | None:
        t = self.tensors.get(name) or self.tensors.get(_CLONE.sub("", name))
        return t if t is not None and t.name not in self.constant else None

    def between(self, first: str, last: str) -> list[str]:
        """Nodes on the paths from ``first`` to ``last`` (a Myelin ForeignNode's region), both included."""
        def reach(start: str, forward: bool) -> set[str]:
            seen = {start}
            stack = [self.nodes[start]]
            while stack:
                n = stack.pop()
                ts = n.outputs if forward else n.inputs
                nxt = [c for t in ts for c in (t.outputs if forward else t.inputs)]
                for m in nxt:
                    if m.name not in seen:
                        seen.add(m.name)
                        stack.append(m)
            return seen

        region = reach(first, True) & reach(last, False)
        return sorted(region | {first, last}, key=lambda n: self.order.get(n, 0))


# The entries whose INT8 the 8.6 builder refused in Q/DQ models though implicit engines ran it so: the
# mirror writes there what the rules do, from each entry's own match (the edges it wants float).
REFUSED = (INEXPRESSIBLE, HEAD_RULE)
REFUSED_WHY = {
    INEXPRESSIBLE: "the outputs of merged 1x1 convolutions ('A || B' layers), INT8 in the Q/DQ builds that "
                   "failed, float in those that built",
    HEAD_RULE: "the inputs of a detection head's merged 1x1 convolutions, with their weights, INT8 in the "
               "implicit engine and in the Q/DQ builds that failed",
}


def refused_note(entry: str, edges: int) -> str:
    """What the mirror's summary says of the INT8 edges one ``REFUSED`` entry left float."""
    return f"{edges} of the INT8 edges left float: {REFUSED_WHY[entry]} (edgeq rules {entry})"


def reformatted_note(tensors: Sequence[str]) -> str:
    """What it says of the tensors written INT8 and reformatted to float for a reader."""
    shown = ", ".join(tensors[:3]) + (", ..." if len(tensors) > 3 else "")
    return (f"{plural(len(tensors), 'tensor')} written INT8 and reformatted to float for a float layer "
            f"({shown}): a Q/DQ before that layer too (edgeq rules mirror-int8)")


Refused = tuple[tuple[str, ...], tuple[tuple[str, int], ...]]  # the tensors; (entry, INT8 edges) per entry


def _refused(graph: gs.Graph, plan: Plan) -> tuple[Plan, Refused]:
    """``plan`` without the INT8 edges Q/DQ cannot say on 8.6 (``REFUSED``), each entry's edges read from
    its own match, the one the rules' placement blocks, so the mirror writes there what the rules do.
    ``inception-build`` floats edges, not nodes (``floats_nodes``): a merged convolution's readers keep the
    weight DQ the engine ran them with, as in the rules' model and the mirrors that built (the mirrors
    that left those weights FP32 under an INT8 output failed to build, ``chooseHigherPrecision``).
    ``merged-head`` floats its pairs whole, weights too: reading INT8 they failed with that assertion
    while implicit engines ran them INT8 in. The nodes go in ``float_nodes``: float by design. Returns the
    plan and (the tensors, (entry, INT8 edges taken off) per entry that took some)."""
    tensors: list[str] = []
    said: list[tuple[str, int]] = []
    for rule_id in REFUSED:
        entry = registry.pattern(rule_id)
        floats = {(e.tensor, e.consumer) for m in matches_of(entry, graph) for e in m.wanting(Want.FLOAT)}
        off = {s.tensor: tuple(c for c in s.consumers if (s.tensor, c) in floats) for s in plan.sites}
        off = {t: cs for t, cs in off.items() if cs}
        if not off:
            continue
        # a site also read on an edge the entry does not float keeps its Q/DQ for that reader alone
        trimmed = tuple(replace(s, consumers=tuple(c for c in s.consumers if c not in off.get(s.tensor, ())))
                        for s in plan.sites)
        gone = tuple(s.tensor for s in trimmed if not s.consumers)
        region = Region(entries=tuple(off), nodes=tuple(c for cs in off.values() for c in cs), sites=gone,
                        commuted=())
        plan = drop_regions(replace(plan, sites=trimmed), [region], rule_id, float_weights=entry.floats_nodes)
        tensors += [t for t in off if t not in tensors]
        said.append((rule_id, sum(map(len, off.values()))))
    return plan, (tuple(tensors), tuple(said))


def layer_nodes(lay: EngineLayer, g: _Graph) -> tuple[tuple[str, ...], bool]:
    """(the graph nodes an engine layer holds, whether its name or metadata names nodes at all)."""
    from edgeq.report.layernames import nodes_from_metadata, split_layer_name

    if _COPY_FOR.match(lay.name) or lay.layer_type == "Constant":
        return (), False
    pieces = list(nodes_from_metadata(lay.metadata))
    if not pieces:
        foreign = _FOREIGN.match(lay.name)
        if foreign:
            a, b = (g.region_end(foreign.group(k)) for k in ("a", "b"))
            if a and b:
                return tuple(g.between(a, b)), True
            ends = tuple(dict.fromkeys(n for n in (a, b) if n))
            if ends:  # one end TensorRT left unnamed (a Transformer's Myelin region): the end it named
                return ends, True
        pieces = [p for p in split_layer_name(lay.name) if not p.startswith("(Unnamed Layer")]
    found = tuple(dict.fromkeys(n for n in (g.node(p) for p in pieces) if n))
    return found, bool(pieces)


# --------------------------------------------------------------------------------------------------
# The mirror
# --------------------------------------------------------------------------------------------------


@dataclass
class _Reads:
    """Every engine read put on a graph edge: (tensor, node) -> precisions it was read in."""

    edges: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    commuted: dict[str, str] = field(default_factory=dict)  # tensor -> the site tensor it commutes from
    unmapped: list[Unmapped] = field(default_factory=list)
    dequantized: set[str] = field(default_factory=set)  # written INT8, reformatted float for a reader

    def add(self, tensor: str, node: str, precision: str) -> None:
        self.edges.setdefault((tensor, node), set()).add(precision)

    def int8(self) -> list[tuple[str, str]]:
        return [e for e, ps in self.edges.items() if "INT8" in ps]


def plan_from_engine(graph: gs.Graph, layers: EngineLayers, *, float_entry: bool = True
                     ) -> tuple[Plan, MirrorReport]:
    """The Plan that puts a Q/DQ on every edge the implicit engine read INT8 (read-only on ``graph``),
    except, with ``float_entry``, inside the INT8 branches the engine entered by quantizing float data
    movement in a reformat: Q/DQ cannot say that on 8.6, and those branches run faster float
    (``edgeq.quant.regions``; the report lists them). A region that runs INT8 through data movement of
    its own is no branch: it stays INT8, its entry a QuantizeLinear of its own (``int8_entry``).
    ``float_entry=False``: the engine's edges exactly.

    ``graph`` is the model the engine was built from, prepared as ``edgeq quantize`` prepares it (the
    cleaned ``<name>.int8.fp32.onnx``). Raises QuantError when the engine is not of this model.
    """
    if not layers.detailed:
        raise QuantError("the engine's layer JSON names no tensors (ProfilingVerbosity.LAYER_NAMES_ONLY)",
                         hint=DETAILED_HINT)
    return _Mirror(_Graph(graph), layers).run(float_entry)


class _Mirror:
    def __init__(self, g: _Graph, layers: EngineLayers) -> None:
        self.g = g
        self.layers = layers.layers
        self.source = layers.source
        self.producer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}
        for i, lay in enumerate(self.layers):  # positions, not lay.index: the two agree in parsed JSON
            for t in lay.outputs:
                self.producer.setdefault(t.name, i)
            for t in lay.inputs:
                self.readers.setdefault(t.name, []).append(i)
        # Engine layers come in execution order: a weight chain's producers are classified first.
        self.weight_layer: dict[int, bool] = {}
        for i, lay in enumerate(self.layers):
            self.weight_layer[i] = (lay.layer_type == "Constant" or not lay.inputs
                                    or all(self._weight_name(t.name) for t in lay.inputs))
        held = [layer_nodes(lay, g) for lay in self.layers]
        self.held = [h[0] for h in held]
        self.named = [i for i, h in enumerate(held) if h[1] and not self.weight_layer[i]]
        self.node_layers: dict[str, list[int]] = {}
        for i, nodes in enumerate(self.held):
            for n in nodes:
                self.node_layers.setdefault(n, []).append(i)
        self.reads = _Reads()

    # -- engine side ----------------------------------------------------------------------------------
    def _weight_name(self, name: str) -> bool:
        """An initializer, or a tensor only weight layers (Constant and its copies) lead to."""
        if name in self.g.constant or _CLONE.sub("", name) in self.g.constant:
            return True
        p = self.producer.get(name)
        return p is not None and self.weight_layer.get(p, False)

    def _trace(self, name: str, reader: int, depth: int = 0) -> tuple[str, str]:
        """Look back from an engine tensor across see-through layers: ("tensor", onnx name), ("weight", ""),
        ("internal", "") for a tensor inside one node split over layers, or ("unknown", why)."""
        t = self.g.tensor(name)
        if t is not None:
            return "tensor", t.name
        if self._weight_name(name):
            return "weight", ""
        p = self.producer.get(name)
        if p is None:
            return "unknown", "no layer writes it and the model has no tensor of that name"
        lay = self.layers[p]
        if set(self.held[p]) & set(self.held[reader]):
            return "internal", ""
        if self.held[p]:
            own = self._written_as(p, reader)
            if own is not None:
                return "tensor", own
            return "unknown", f"written by layer '{lay.name[:80]}' under a name the model does not have"
        data = [t for t in lay.inputs if not self._weight_name(t.name)]
        if len(data) != 1 or depth > 32:
            return "unknown", f"behind layer '{lay.name[:80]}', which names no ONNX node"
        return self._trace(data[0].name, reader, depth + 1)

    def _written_as(self, p: int, reader: int) -> str | None:
        """The graph tensor a layer wrote under its own name (a merged ``A || B`` layer, a Gemm + ReLU
        before a classifier): the output of one of its nodes that the reader's nodes read, the first in
        graph order; None when none or the reader holds no node."""
        nodes = set(self.held[reader])
        if not nodes:
            return None
        outs = [o for n in self.held[p] for o in self.g.nodes[n].outputs
                if is_float(o) and not any(c.name in self.held[p] for c in o.outputs)]
        found = [o for o in outs if self._paths(o, nodes)]
        return found[0].name if found else None

    def _precision_used(self, i: int, precision: str | None) -> str | None:
        """The precision layer ``i``'s node computes on: a prologue layer (``reshape_before_X``) hands its
        data, across see-through copies, only to layers of the same node; then theirs is the one."""
        if self.layers[i].layer_type not in ("NoOp", "Shuffle"):
            return precision
        found: list[str | None] = []
        stack = [t.name for t in self.layers[i].outputs]
        while stack:
            name = stack.pop()
            readers = self.readers.get(name, [])
            if not readers:
                return precision
            for j in readers:
                lay = self.layers[j]
                if set(self.held[j]) & set(self.held[i]):
                    found += [t.precision for t in lay.inputs if t.name == name]
                elif self.held[j] or len(found) > 64:
                    return precision  # another node reads it: layer i is the node's compute
                else:
                    stack += [t.name for t in lay.outputs]
        return found[-1] if found else precision

    def _precision_written(self, tensor: str) -> str | None:
        """The precision the layer computing ``tensor`` wrote it in, looking back across see-through
        copies that turned it float (``Reformatting CopyNode for Output Tensor 0 to X`` turning X's INT8
        output into FP16). A copy that quantized it wrote it INT8 itself; a Concat's buffer, written by
        one copy per input, is not any one input's precision: neither is looked through."""
        p, name = self.producer.get(tensor), tensor
        t = self.g.tensor(tensor)
        concat = t is not None and (c := producer(t)) is not None and c.op == "Concat"
        for _ in range(32):
            if p is None:
                return None
            lay = self.layers[p]
            written = next((t.precision for t in lay.outputs if t.name == name), None)
            data = [t for t in lay.inputs if not self._weight_name(t.name)]
            if (concat or written not in FLOAT_PRECISIONS or self.held[p] or len(data) != 1
                    or not _COPY_FOR.match(lay.name)):
                return written
            p, name = self.producer.get(data[0].name), data[0].name
        return None

    # -- graph side -----------------------------------------------------------------------------------
    def _paths(self, t: gs.Tensor, nodes: set[str]) -> list[list[tuple[gs.Tensor, gs.Node]]]:
        """Paths from ``t`` to a node of ``nodes``, across nodes no engine layer holds (folded away)."""
        out: list[list[tuple[gs.Tensor, gs.Node]]] = []
        stack: list[tuple[gs.Tensor, list[tuple[gs.Tensor, gs.Node]]]] = [(t, [])]
        seen: set[str] = set()
        while stack:
            x, path = stack.pop()
            for c in x.outputs:
                edge = [*path, (x, c)]
                if c.name in nodes:
                    out.append(edge)
                elif c.name not in self.node_layers and c.name not in seen and len(edge) < 16:
                    seen.add(c.name)
                    stack.extend((o, edge) for o in c.outputs if is_float(o))
        return out

    def _record(self, path: list[tuple[gs.Tensor, gs.Node]], precision: str, written_int8: bool) -> None:
        """One read along ``path``: quantize before folded data movement when the tensor was written INT8,
        else right before the reader."""
        between = [n for _, n in path[:-1]]
        if len(path) > 1 and precision == "INT8" and written_int8 and all(moves_data(n) for n in between):
            t, n = path[0]
            self.reads.add(t.name, n.name, precision)
            for x, _ in path[1:]:
                self.reads.commuted.setdefault(x.name, t.name)
            return
        t, n = path[-1]
        self.reads.add(t.name, n.name, precision)

    def _read(self, i: int, name: str, precision: str | None) -> None:
        """Layer ``i`` reads engine tensor ``name`` in ``precision``: put it on graph edges."""
        lay = self.layers[i]
        kind, what = self._trace(name, i)
        if kind in ("weight", "internal"):
            return
        if kind == "unknown":
            self.reads.unmapped.append(Unmapped(name, lay.name, precision, what))
            return
        t = self.g.tensors[what]
        nodes = set(self.held[i])
        prec = self._precision_used(i, precision) or "unknown"
        written_int8 = self._precision_written(what) == "INT8"
        dequantized = written_int8 and prec in FLOAT_PRECISIONS
        if dequantized:
            # Written INT8 and reformatted to float for this layer: the DQ before it is that reformat;
            # left float, the writer would write float (edgeq rules mirror-int8). Data movement too:
            # TensorRT moves the DQ past it and runs it INT8 (narrower than implicit's float pools), while
            # without the Q/DQ the writer wrote float and its fused SiLU ran alone in FP16 (the YOLOX's
            # Conv_135 before its SPP pools, tests/fixtures/trt86-h100-paired).
            prec = "INT8"
        paths = self._paths(t, nodes)
        p = producer(t)
        if not paths and p is not None and p.op == "Concat" and p.name not in nodes:
            # A view of a Concat's buffer: the node reads one of the Concat's inputs in the graph.
            for x in p.inputs:
                if x.name not in self.g.constant:
                    paths += self._paths(x, nodes)
        if not paths:
            self.reads.unmapped.append(Unmapped(name, lay.name, precision,
                                                "no node of this layer reads it in the model"))
            return
        for path in paths:
            self._record(path, prec, written_int8)
        if dequantized:
            self.reads.dequantized.add(what)

    def _writes_into(self, i: int, name: str, precision: str | None) -> None:
        """Layer ``i`` writes ``name``, the output of a node another layer holds (a Concat built as copies
        into one buffer): that node reads this layer's output in the precision written."""
        t = self.g.tensor(name)
        c = producer(t) if t is not None else None
        if c is None or c.name in self.held[i] or c.name not in self.node_layers:
            return
        outs = [o for n in self.held[i] for o in self.g.nodes[n].outputs if is_float(o)]
        for o in outs:
            for path in self._paths(o, {c.name}):
                self._record(path, precision or "unknown", precision == "INT8")

    # -- the plan -------------------------------------------------------------------------------------
    def run(self, with_float_entry: bool = True) -> tuple[Plan, MirrorReport]:
        mapped = [i for i in self.named if self.held[i]]
        if not self.named or len(mapped) < MIN_MAPPED * len(self.named):
            missing = [self.layers[i].name for i in self.named if not self.held[i]]
            example = f" (e.g. '{missing[0][:80]}')" if missing else ""
            raise QuantError(
                f"the engine {self.source} is not of this model: {len(mapped)} of {len(self.named)} named "
                f"layers map onto its nodes{example}",
                hint="mirror the implicit engine built from this model's <name>.int8.fp32.onnx")
        for i in mapped:
            for t in self.layers[i].inputs:
                self._read(i, t.name, t.precision)
            for t in self.layers[i].outputs:
                self._writes_into(i, t.name, t.precision)
        engine_plan = self._plan()
        found = entry_regions(self.g.graph, engine_plan) if with_float_entry else []
        regions = [r for r in found if r.branch]
        plan = drop_regions(engine_plan, regions)
        plan, said = _refused(self.g.graph, plan)
        int8_edges = sum(len(s.consumers) for s in engine_plan.sites)
        edges = self.reads.edges
        report = MirrorReport(
            source=self.source,
            layers=len(self.layers),
            named_layers=len(self.named),
            mapped_layers=len(mapped),
            int8_edges=int8_edges,
            float_entry=tuple(t for r in regions for t in r.entries),
            float_entry_edges=int8_edges - sum(len(s.consumers) for s in plan.sites)
            - sum(edges for _, edges in said[1]),
            int8_entry=tuple(t for r in found if not r.branch for t in r.entries),
            float_edges=sum(1 for ps in edges.values() if "INT8" not in ps),
            unmapped=tuple(self.reads.unmapped),
            unmapped_layers=tuple(self.layers[i].name for i in self.named if not self.held[i]),
            inexpressible=said[0],
            refused=said[1],
            reformatted=tuple(sorted(self.reads.dequantized)),
        )
        return plan, report

    def _plan(self) -> Plan:
        g = self.g
        consumers: dict[str, set[str]] = {}
        for t, n in self.reads.int8():
            consumers.setdefault(t, set()).add(n)
        commuted = {t: s for t, s in self.reads.commuted.items() if s in consumers and t not in consumers}
        groups = _scale_groups(g, consumers, commuted)
        pos = {o.name: i for i, n in enumerate(g.graph.nodes) for o in n.outputs}

        def key(name: str) -> tuple[int, str]:
            return (pos.get(name, -1), name)

        site_names = sorted(consumers, key=key)
        members: dict[str, list[str]] = {}
        for s in site_names:
            members.setdefault(groups.find(s), []).append(s)
        gid = {root: ms[0] for root, ms in members.items()}
        group_ids = {t: gid[groups.find(t)] for t in (*site_names, *sorted(commuted, key=key))}
        sites = tuple(QdqSite(s, tuple(sorted(consumers[s], key=lambda n: g.order.get(n, 0))), "mirror-int8",
                              group_ids[s]) for s in site_names)
        # Float where the engine has the tensor between layers (or read it in float); else inside a layer.
        seen = {t.name for lay in self.layers for t in (*lay.inputs, *lay.outputs)}
        seen |= {t for t, _ in self.reads.edges}
        floats = tuple(FloatTensor(t, "mirror-float" if t in seen else "mirror-inside-layer")
                       for t in g.activations if t not in consumers and t not in commuted)
        plan = Plan(
            mode="mirror",
            sites=sites,
            weights=tuple(self._weights()),
            commuted=tuple(sorted(commuted, key=key)),
            floats=floats,
            groups={gid[root]: tuple(ms) for root, ms in members.items()},
            activations=tuple(g.activations),
            group_ids=group_ids,
        )
        decisions: tuple[QdqSite | WeightSite | FloatTensor, ...] = (*plan.sites, *plan.weights, *plan.floats)
        for r in {d.rule for d in decisions}:
            rule(r)  # every decision carries a known rule id
        return plan

    def _weights(self) -> Iterable[WeightSite]:
        """Per-channel DQ for the weights of every weighted node some INT8 layer holds."""
        import onnx_graphsurgeon as gs

        declared: dict[str, bool] = {}  # node -> a layer holding it says its weights are Int8
        reads_int8: set[str] = set()  # nodes of a layer that declares no weights but reads INT8
        for i, nodes in enumerate(self.held):
            lay = self.layers[i]
            weights = lay.param("Weights")
            for n in nodes:
                if weights:
                    declared[n] = declared.get(n, False) or '"Int8"' in weights
                elif any(t.precision == "INT8" for t in lay.inputs):
                    reads_int8.add(n)
        int8_nodes = {n for n, int8 in declared.items() if int8} | (reads_int8 - set(declared))
        for name in sorted(int8_nodes, key=lambda n: self.g.order.get(n, 0)):
            node = self.g.nodes[name]
            if node.op not in WEIGHTED_OPS or len(node.inputs) < 2:
                continue
            w = node.inputs[1]
            if isinstance(w, gs.Constant) and is_float(w):
                yield WeightSite(w.name, name, weight_axis(node), "mirror-int8")


def _scale_groups(g: _Graph, consumers: dict[str, set[str]], commuted: dict[str, str]) -> UnionFind[str]:
    """One scale across INT8 data movement and Concats: their INT8 inputs and outputs share it."""
    uf = UnionFind[str]()
    int8 = set(consumers) | set(commuted)
    for t, site in commuted.items():
        uf.union(site, t)
    for node in g.graph.nodes:
        if not moves_data(node):
            continue
        ins = [x.name for x in node.inputs
               if (x.name in consumers and node.name in consumers[x.name]) or x.name in commuted]
        if not ins:
            continue
        for x in ins[1:]:
            uf.union(ins[0], x)
        for o in node.outputs:
            if o.name in int8:
                uf.union(ins[0], o.name)
    return uf


@dataclass(frozen=True)
class Agreement:
    """How far a rule-based placement matches the mirror of a real engine, per quantized activation
    tensor: the corpus's measure of where the offline rules guess what a GPU would choose."""

    both: tuple[str, ...]  # quantized in both
    rules_only: tuple[str, ...]  # a Q/DQ the engine did not run INT8
    engine_only: tuple[str, ...]  # INT8 in the engine, float under the rules

    @property
    def fraction(self) -> float | None:
        """Share of the tensors either side quantizes that both do; None where neither quantizes any."""
        n = len(self.both) + len(self.rules_only) + len(self.engine_only)
        return len(self.both) / n if n else None


def agreement(rules: Plan, mirror: Plan) -> Agreement:
    a, b = {s.tensor for s in rules.sites}, {s.tensor for s in mirror.sites}
    return Agreement(tuple(sorted(a & b)), tuple(sorted(a - b)), tuple(sorted(b - a)))
