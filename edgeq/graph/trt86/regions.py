"""Regions decided as a whole: a PointWise region between weighted layers, the Squeeze-and-Excitation
gate, the channel shuffle's data movement, an INT8 region entered only by quantizing float data movement."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from edgeq.findings import Level
from edgeq.graph import fusion
from edgeq.graph.facts import Decisions, Edge, EngineSignature, Hit, LayerView, LintSpec, Match, Pattern, Want
from edgeq.graph.patterns import (
    ACTIVATION_OPS,
    WEIGHTED_OPS,
    consumers,
    is_constant,
    is_dequantize,
    is_op,
    is_quantize,
    iter_nodes,
    moved_inputs,
    moves_data,
    node_label,
    preserves_scale,
    producer,
    qdq_pair_of,
    silu_input,
    skip_qdq_down,
)
from edgeq.graph.trt86.common import (
    EDGEQ,
    FLOAT_PRECISIONS,
    PLACE,
    ZOO,
    edge_of,
    float_of,
    pair_names,
    pointwise_layer,
    quantized,
    readers_inputs,
    reads,
    tensor_named,
)
from edgeq.text import plural

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

# Elementwise ops TensorRT 8.6 fuses into one PointWise layer (and into a convolution's epilogue when
# the region reads that convolution alone).
POINTWISE_OPS = ACTIVATION_OPS | frozenset(
    {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Sqrt", "Exp", "Log", "Neg", "Abs", "Erf", "Reciprocal"}
)


def se_squeezes(graph: gs.Graph) -> set[str]:
    """The averaging ops that are an SE block's squeeze (se-gate's, not a classifier's pool-tail)."""
    return {m.nodes[0] for m in match_se_gate(graph)}


def pointwise_regions(graph: gs.Graph) -> list[tuple[list[gs.Node], list[tuple[gs.Tensor, gs.Node]]]]:
    """Pointwise nodes joined where a tensor is read by pointwise nodes only (TensorRT's PointWise fusion),
    each with its external inputs ``(float tensor, node reading it)``, seen through Q/DQ. Graph order."""
    nodes = [n for n in iter_nodes(graph, subgraphs=False) if is_op(n, *POINTWISE_OPS)]
    ids = {id(n): i for i, n in enumerate(nodes)}
    parent = list(range(len(nodes)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for n in nodes:
        for o in n.outputs:
            readers = [r for r, _, _ in skip_qdq_down(o)]
            if (
                readers
                and all(id(r) in ids for r in readers)
                and o.name not in {t.name for t in graph.outputs}
            ):
                for r in readers:
                    parent[find(ids[id(r)])] = find(ids[id(n)])
    groups: dict[int, list[gs.Node]] = {}
    for n in nodes:
        groups.setdefault(find(ids[id(n)]), []).append(n)
    out = []
    for members in groups.values():
        inside = {id(m) for m in members}
        ext: list[tuple[gs.Tensor, gs.Node]] = []
        for m in members:
            for t in m.inputs:
                if not t.name or is_constant(t):
                    continue
                f = float_of(t)
                p = producer(f)
                if (p is None or id(p) not in inside) and not is_constant(f) and (f, m) not in ext:
                    ext.append((f, m))
        out.append((members, ext))
    return out


def _residual_form(members: list[gs.Node]) -> bool:
    """An Add TensorRT can fuse into a convolution as its residual: one of its inputs comes straight from
    a weighted op's epilogue (no activation between), as in ResNet (residual-add) or two convolutions
    joined by an Add (unverified which one TensorRT picks: left as it was, float)."""
    return any(
        is_op(m, "Add")
        and any(
            fusion.fused_origin(float_of(t), through_activations=False) is not None
            for t in m.inputs
            if t.name and not is_constant(t)
        )
        for m in members
    )


def standalone_regions(graph: gs.Graph) -> list[tuple[list[gs.Node], list[tuple[gs.Tensor, gs.Node]]]]:
    """Pointwise regions TensorRT runs as their own PointWise layer: two or more external input tensors,
    not a residual Add it fuses into a convolution."""
    return [
        (members, ext)
        for members, ext in pointwise_regions(graph)
        if len({id(t) for t, _ in ext}) >= 2 and not _residual_form(members)
    ]


def _region_outputs(members: list[gs.Node]) -> list[gs.Tensor]:
    inside = {id(m) for m in members}
    return [o for m in members for o in m.outputs if not all(id(r) in inside for r, _, _ in skip_qdq_down(o))]


def _region_edges(ext: list[tuple[gs.Tensor, gs.Node]]) -> tuple[Edge, ...]:
    return tuple(Edge(t.name, n.name, Want.INT8) for t, n in ext)


def _region_lint(name: str) -> LintSpec:
    """A standalone PointWise region runs INT8 only when every input arrives INT8: lint names regions
    whose output is quantized while some inputs are and others are not (``name`` says which kind)."""

    def check(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
        out = []
        by_node = {n.name: n for n in graph.nodes}
        for m in matches:
            ext = [(e, by_node[e.consumer]) for e in m.edges if e.want == Want.INT8 and e.consumer in by_node]
            if any(decisions.rule(e.tensor, e.consumer) != m.pattern for e, _ in ext):
                continue  # a later pattern decides these edges
            reads = [(e, [t for t in n.inputs if float_of(t).name == e.tensor]) for e, n in ext]
            quant = [e for e, ts in reads if ts and all(quantized(t) for t in ts)]
            bare = [e for e, ts in reads if ts and not all(quantized(t) for t in ts)]
            if quant and bare:
                out.append(
                    Hit(
                        f"{name} {' * '.join(m.nodes[:3])}{'...' if len(m.nodes) > 3 else ''} reads "
                        f"{', '.join(sorted({e.tensor for e in bare}))} in float and "
                        f"{', '.join(sorted({e.tensor for e in quant}))} in INT8: TensorRT 8.6 runs the "
                        "PointWise layer FP16 behind reformats; quantize every input",
                        m.nodes,
                    )
                )
        return out

    return LintSpec(
        Level.WARNING, f"{name} with some inputs float", PLACE + " (quantizes every input)", check
    )


def match_pointwise_region(graph: gs.Graph) -> list[Match]:
    out = []
    for members, ext in standalone_regions(graph):
        if any(fusion.reaches_weighted(o) for o in _region_outputs(members)):
            out.append(
                Match(
                    "pointwise-region", members[-1].name, tuple(m.name for m in members), _region_edges(ext)
                )
            )
    return out


def se_gate(mul: gs.Node) -> tuple[gs.Node, gs.Tensor, gs.Tensor, gs.Node, gs.Node] | None:
    """Squeeze-and-Excitation ``x * sigmoid(fc2(act(fc1(pool(x)))))``: ``(Sigmoid, its float input (the
    excitation's output), x, the squeeze pool, the excitation's last weighted op)`` for the gate Mul."""
    if not is_op(mul, "Mul") or len(mul.inputs) != 2 or silu_input(mul) is not None:
        return None
    for i, t in enumerate(mul.inputs):
        sig = producer(float_of(t))
        if not is_op(sig, "Sigmoid", "HardSigmoid"):
            continue
        g = float_of(sig.inputs[0])
        fc2 = fusion.fused_origin(g, through_activations=False)
        x = float_of(mul.inputs[1 - i])
        if fc2 is None:
            continue
        pool = _squeeze_of(fc2, x)
        if pool is not None:
            return sig, g, x, pool, fc2
    return None


def _squeeze_of(fc: gs.Node, x: gs.Tensor, hops: int = 4) -> gs.Node | None:
    """The averaging op reading ``x`` at the start of the excitation that ends in ``fc``."""
    node: gs.Node | None = fc
    for _ in range(hops):
        if node is None or not node.inputs:
            return None
        t = float_of(node.inputs[0])
        p = producer(t)
        while p is not None and preserves_scale(p) and p.inputs:  # Flatten/Reshape before a Gemm
            t = float_of(p.inputs[0])
            p = producer(t)
        if is_op(p, *fusion.AVERAGING_OPS):
            return p if p.inputs and float_of(p.inputs[0]) is x else None
        node = fusion.fused_origin(t)
    return None


def match_se_gate(graph: gs.Graph) -> list[Match]:
    out = []
    for mul in iter_nodes(graph, subgraphs=False):
        found = se_gate(mul)
        if found is None:
            continue
        sig, g, x, pool, fc2 = found
        edges = (
            Edge(g.name, sig.name, Want.INT8),
            Edge(x.name, mul.name, Want.INT8),
            Edge(x.name, pool.name, Want.INT8),
        )
        out.append(Match("se-gate", mul.name, (pool.name, fc2.name, sig.name, mul.name), edges))
    return out


def lint_se_gate(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """An SE gate whose output is quantized while its excitation or its feature map arrives float."""
    out = []
    by_node = {n.name: n for n in graph.nodes}
    for m in matches:
        mul = by_node[m.anchor]
        found = se_gate(mul)
        if found is None or not any(quantized(r) for o in mul.outputs for r in readers_inputs(o)):
            continue
        sig, _, _, _, fc2 = found
        bare = [
            e.tensor
            for e in m.edges
            if e.consumer in (sig.name, mul.name)
            and not all(quantized(t) for t in reads(by_node[e.consumer], tensor_named(graph, e.tensor)))
        ]
        if bare:
            out.append(
                Hit(
                    f"Squeeze-and-Excitation gate '{node_label(sig)}' * '{node_label(mul)}' reads "
                    f"{', '.join(bare)} in float: TensorRT 8.6 runs PWN(Sigmoid, Mul) FP16 behind reformats; "
                    f"quantize {fc2.op} '{node_label(fc2)}''s output (the Sigmoid's input) and the feature "
                    "map",
                    m.nodes,
                )
            )
    return out


def _is_shuffle(node: gs.Node) -> bool:
    """Reshape -> Transpose(perm swaps the two group axes) -> Reshape: a channel shuffle."""
    if not is_op(node, "Transpose") or not node.inputs or not node.outputs:
        return False
    perm = list(node.attrs.get("perm", []))
    if len(perm) != 5 or perm[:3] != [0, 2, 1]:
        return False
    before = producer(float_of(node.inputs[0]))
    after = [r for r, _, _ in skip_qdq_down(node.outputs[0])]
    return is_op(before, "Reshape") and bool(after) and all(is_op(r, "Reshape") for r in after)


def shuffle_region(transpose: gs.Node) -> list[gs.Node]:
    """The data movement around one channel shuffle: every Concat, reshape, transpose and Slice/Split
    reached from it through data-movement ops only, both ways (graph order not kept)."""
    region: list[gs.Node] = []
    seen: set[int] = set()
    stack = [transpose]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        region.append(n)
        for t in n.inputs:
            p = producer(float_of(t)) if t.name and not is_constant(t) else None
            if p is not None and (preserves_scale(p) or is_op(p, "Concat")):
                stack.append(p)
        for o in n.outputs:
            for r, _, _ in skip_qdq_down(o):
                if preserves_scale(r) or is_op(r, "Concat"):
                    stack.append(r)
    return region


def match_channel_shuffle(graph: gs.Graph) -> list[Match]:
    out = []
    claimed: set[int] = set()
    for t in iter_nodes(graph, subgraphs=False):
        if id(t) in claimed or not _is_shuffle(t):
            continue
        region = shuffle_region(t)
        claimed.update(id(n) for n in region)
        edges = [
            Edge(float_of(x).name, n.name, Want.FLOAT)
            for n in region
            for x in (n.inputs if n.op == "Concat" else n.inputs[:1])
            if x.name and not is_constant(x)
        ]
        inside = {id(n) for n in region}
        for n in region:  # each weighted reader quantizes right before itself, not back across the region
            for o in n.outputs:
                edges += [
                    edge_of(r.inputs[i], r, Want.INT8)
                    for r, i, _ in skip_qdq_down(o)
                    if id(r) not in inside and r.op in WEIGHTED_OPS and i == 0
                ]
        out.append(Match("channel-shuffle", t.name, tuple(n.name for n in region), tuple(edges)))
    return out


def lint_channel_shuffle(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """Q/DQ inside a channel shuffle's data movement: it then runs INT8 row-major, and every branch
    convolution pays an INT8 linear -> NC/32HW32 reformat."""
    out = []
    by_node = {n.name: n for n in graph.nodes}
    for m in matches:
        inputs = [t for name in m.nodes for t in by_node[name].inputs if t.name]
        pairs = [p for p in (qdq_pair_of(t) for t in inputs) if p is not None]
        if pairs:
            out.append(Hit(
                f"{plural(len(pairs), 'Q/DQ pair')} inside the channel shuffle at '{m.anchor}' (Concat, "
                "Reshape, Transpose, Slice): TensorRT 8.6 runs the shuffle INT8 row-major and reformats "
                "before every branch convolution; keep the shuffle float and quantize right before each "
                "convolution",
                (m.anchor, *pair_names(pairs))))
    return out


def _se_wide(v: LayerView) -> bool:
    return pointwise_layer(v) and "Mul" in v.ops and bool({"Sigmoid", "HardSigmoid"} & v.ops) and v.gated


def _shuffle_reformat(v: LayerView) -> bool:
    return (
        v.kind == "reformat"
        and "Transpose" in v.upstream
        and v.formats.startswith("INT8 NCHW ->")
        and "NC/32HW32" in v.formats
    )


_DATA_MOVEMENT = frozenset({"Reshape", "Transpose", "Slice", "Split", "Concat", "Flatten", "multi-producer"})


def q_layer_at(t: gs.Tensor, int8: Callable[[gs.Tensor], bool]) -> Optional[gs.Tensor]:
    """Where a Q on ``t`` ends up a layer of its own, or None where a layer writes it (fused).

    TensorRT 8.6 moves a Q back through data movement (into every input of a Concat) until a layer that
    can write INT8 takes it; it cannot move it past a tensor that other nodes read too (the fork of a
    channel split), so the Q stays there, a layer of its own. ``int8``: the tensor is INT8 already (a Q/DQ
    meets it: requantized, no new layer)."""
    stack, seen = [t], set()
    while stack:
        y = stack.pop()
        if id(y) in seen or (y is not t and int8(y)):
            continue
        seen.add(id(y))
        p = producer(y)
        if p is None or not moves_data(p):
            continue  # the graph input (its reformat, as the implicit engine) or a layer that writes the Q
        for x in moved_inputs(p):
            if len(consumers(x)) > 1 and not int8(x):
                return x
            stack.append(x)
    return None


# How every message (the mirror's summary, quantize's line, the gates) says why a float-entry region runs
# float: one phrase, next to the fact.
QUANTIZING_REFORMAT = ("by a quantizing reformat, which Q/DQ cannot express on TensorRT 8.6 "
                       "(edgeq rules float-entry)")
# ... and why one such region stays INT8 all the same.
INT8_BODY = ("its region runs INT8 through data movement of its own (not a branch), so it stays INT8 "
             "behind a QuantizeLinear of its own (edgeq rules float-entry)")


def runs_int8_through_data_movement(q: gs.Node, limit: int = 100_000) -> bool:
    """Does the INT8 region behind ``q`` reach data movement that reads INT8 (a DQ's output)? Followed
    forward: the readers of ``q``'s DQs, their epilogues (pointwise ops) to the next Qs, and on. Such a
    region is no branch (``edgeq.quant.regions.Region.branch``): float-entry leaves it INT8."""
    seen: set[int] = set()
    stack = [q]
    while stack and len(seen) < limit:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        dqs = [r for o in n.outputs for r in consumers(o) if is_dequantize(r)]
        for r in (r for dq in dqs for o in dq.outputs for r in consumers(o)):
            if moves_data(r):
                return True
            epilogue = [r]
            while epilogue:
                m = epilogue.pop()
                for x in (x for o in m.outputs for x in consumers(o)):
                    if is_quantize(x):
                        stack.append(x)
                    elif x.op not in WEIGHTED_OPS and not moves_data(x) and id(x) not in seen:
                        seen.add(id(x))
                        epilogue.append(x)
    return False


def lint_float_entry(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """A QuantizeLinear on float data movement that no layer can write (``q_layer_at``): TensorRT 8.6
    runs it as a layer of its own and a reformat (or moves it into the data movement). Not where the
    region behind it runs INT8 through data movement: there that one layer is the cheaper way in."""
    known: dict[int, bool] = {}

    def int8(t: gs.Tensor) -> bool:
        """``quantized`` (a DQ behind scale-preserving data movement), or a Concat of such tensors."""
        if id(t) not in known:
            known[id(t)] = False  # a cycle reads as float
            p = producer(t)
            known[id(t)] = quantized(t) or (is_op(p, "Concat") and bool(moved_inputs(p))
                                            and all(int8(i) for i in moved_inputs(p)))
        return known[id(t)]

    out = []
    for q in iter_nodes(graph, subgraphs=False):
        if not is_op(q, "QuantizeLinear") or not q.inputs or is_constant(q.inputs[0]):
            continue
        at = q_layer_at(q.inputs[0], int8)
        if at is not None and not runs_int8_through_data_movement(q):
            out.append(Hit(
                f"QuantizeLinear '{q.name}' quantizes float data movement that goes back to '{at.name}', "
                "which other nodes read too: TensorRT 8.6 runs it there as a layer of its own and a "
                "reformat before the INT8 convolution (the implicit engine quantizes in that one reformat)",
                (q.name, *(n.name for n in consumers(at)))))
    return out


def _standalone_q_reformat(v: LayerView) -> bool:
    """Float data movement quantized by a layer of its own into INT8 row-major or NC/4HW4 (a second
    reformat to NC/32HW32 follows); the implicit engine's one copy goes straight to NC/32HW32."""
    src, _, dst = v.formats.partition(" -> ")
    return (v.kind == "reformat" and src.startswith(FLOAT_PRECISIONS) and dst.startswith("INT8")
            and "NC/32HW32" not in dst and bool(v.upstream) and v.upstream <= _DATA_MOVEMENT)


PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        "pointwise-region",
        "Elementwise ops TensorRT fuses into one PointWise layer between weighted layers (a region with two "
        "or more inputs that no convolution absorbs) run INT8 only when every input arrives INT8 and the "
        "output is quantized: when the region feeds a weighted op, quantize each of its inputs. Decided per "
        "region, so a new architecture needs no new rule; the SE gate and the SiLU before a residual Add "
        "are the measured cases (unverified on other regions).",
        f"{ZOO}/effb0.implicit.layers.json.gz and regnet.implicit.layers.json.gz (16 INT8 'PWN(Sigmoid, "
        f"Mul)' each, both inputs INT8); {EDGEQ}/yolo_fix1.explicit.layers.json (8 INT8 'PWN(PWN(Sigmoid, "
        "Mul), Add)'); other regions unverified",
        verified=False,
        match=match_pointwise_region,
        lint=_region_lint("PointWise region"),
        engine=EngineSignature(
            "a PointWise region with two or more inputs runs wider than INT8: some inputs arrive float",
            wide=lambda v: pointwise_layer(v) and v.inputs >= 2,
        ),
        tunable=True,
        ops=POINTWISE_OPS,
        precedence=65,
    ),
    Pattern(
        "se-gate",
        "A Squeeze-and-Excitation gate x * sigmoid(fc2(act(fc1(pool(x))))) runs as one PointWise layer "
        "PWN(Sigmoid, Mul) that is INT8 when both its inputs are: quantize fc2's output (the Sigmoid's "
        "input) and the feature map x (read by the squeeze pool and the gate). Left float, fc2's output "
        "makes the gate FP16 behind an INT8->FP16 reformat.",
        f"{ZOO}/effb0.implicit.layers.json.gz and regnet.implicit.layers.json.gz (16 INT8 'PWN(Sigmoid, "
        "Mul)' each, fc2's output and the feature map INT8) vs effb0.explicit.layers.json.gz and "
        "regnet.explicit.layers.json.gz (fc2's output float: 16 FP16 gates, 0.81x and 0.84x implicit)",
        match=match_se_gate,
        lint=LintSpec(
            Level.WARNING,
            "SE gate reading its excitation or feature map in float",
            PLACE + " (quantizes fc2's output and the feature map)",
            lint_se_gate,
        ),
        engine=EngineSignature(
            "a Squeeze-and-Excitation gate PWN(Sigmoid, Mul) runs wider than INT8", wide=_se_wide
        ),
        tunable=True,
        ops=frozenset({"GlobalAveragePool", "ReduceMean", "Sigmoid", "HardSigmoid", "Mul"}),
        precedence=110,
    ),
    Pattern(
        "channel-shuffle",
        "A channel shuffle (Reshape -> Transpose -> Reshape) and the data movement around it (the Concat "
        "before it, the Slice/Split after it) are fastest float: the implicit engine keeps them FP32 "
        "row-major and quantizes once, into each branch convolution (FP32 linear -> INT8 NC/32HW32). Run "
        "INT8 they stay row-major and every branch convolution pays an INT8 linear -> NC/32HW32 reformat. "
        "Keep the region float; each weighted reader gets its own Q/DQ.",
        f"{ZOO}/shufflenet.implicit.layers.json.gz (shuffles, Concat and Slices FP32; 1630 qps) vs "
        "shufflenet.explicit.layers.json.gz (INT8 row-major, 40 reformats, 22 us vs 7.7 us a region; 0.74x)",
        match=match_channel_shuffle,
        lint=LintSpec(
            Level.WARNING,
            "Q/DQ inside a channel shuffle's data movement",
            PLACE + " (keeps the shuffle float, a Q/DQ before each branch convolution)",
            lint_channel_shuffle,
        ),
        engine=EngineSignature(
            "an INT8 row-major reformat to NC/32HW32 after a channel shuffle", reformat=_shuffle_reformat
        ),
        ops=frozenset({"Reshape", "Transpose", "Concat", "Slice", "Split"}),
        precedence=120,
    ),
    Pattern(
        "float-entry",
        "An INT8 region whose only ways in are Q/DQ on float data movement that goes back to a fork (a "
        "channel split's Slices of one tensor) runs float. The implicit engine quantizes such data in the "
        "reformat into the convolution's INT8 NC/32HW32, one copy; an explicit network cannot: TensorRT 8.6 "
        "moves the QuantizeLinear back through the data movement (which then runs INT8 row-major) to the "
        "fork, where it runs as a layer of its own into INT8 NC/4HW4 and a second reformat follows. "
        "Placement leaves the whole region (its Q/DQ and weight DQs) float, the mirror the same where the "
        "implicit engine quantized in such a reformat; tune tries each region INT8 as one decision. Only a "
        "branch: a region that runs INT8 through data movement of its own (a Concat, Split, pool or "
        "upsample inside it) is the network's INT8 body entered once and stays INT8, its entry a Q/DQ.",
        "tests/fixtures/trt86-h100-zoo3/shufflenet.static-nofe.layers.json.gz and "
        "shufflenet.mirror-nofe.layers.json.gz (without the rule: 0.948x and 0.976x implicit's 1448 qps) vs "
        "shufflenet.static.layers.json.gz and shufflenet.mirror.layers.json.gz (with it: 0.985x, 0.986x), "
        "one H100 lease, 3 paired rounds; trt86-h100-zoo2/shufflenet.static.layers.json.gz "
        "('Slice_1_output_0_QuantizeLinear' 7.8 us + an NC/4HW4 -> NC/32HW32 reformat 14.7 us before a "
        "branch's INT8 convolutions); trt86-h100-zoo4/shufflenet.mirror-split.layers.json.gz, "
        "shufflenet.mirror-mul.layers.json.gz and shufflenet.mirror-clip.layers.json.gz (one Q/DQ per "
        "reader, Mul(x, 1) or Clip before each of 12 entry Qs: each still a layer of its own, "
        "0.928x/0.928x/0.876x an implicit engine that ran those regions INT8; the mirror with the rule "
        "0.923x); the bound: tests/fixtures/trt86-h200-yolov8n/yolov8n.implicit.layers.json.gz (a real "
        "YOLOv8n on an H200, batch 1: entered model.2's Concat by quantizing copies of the Split's FP16 "
        "outputs, then INT8 through every later C2f, SPPF and the head; the mirror keeps its 99 INT8 edges, "
        "3 before the bound; that mirror's engine not yet timed)",
        lint=LintSpec(
            Level.WARNING,
            "QuantizeLinear on float data movement (a layer of its own)",
            PLACE + " (leaves such a branch float)",
            lint_float_entry,
        ),
        engine=EngineSignature(
            "a QuantizeLinear of its own on float data movement (a reformat into INT8)",
            reformat=_standalone_q_reformat,
        ),
        ops=frozenset({"Slice", "Split", "Reshape", "Transpose", "Concat"}),
        precedence=130,
    ),
)
