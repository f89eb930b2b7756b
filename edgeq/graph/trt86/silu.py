"""SiLU (x * Sigmoid(x)): it stays whole, except that the one feeding a residual Add reads a quantized
convolution output."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeq.findings import Level
from edgeq.graph import fusion
from edgeq.graph.facts import Decisions, Edge, EngineSignature, Hit, LayerView, LintSpec, Match, Pattern, Want
from edgeq.graph.patterns import (
    is_op,
    iter_nodes,
    node_label,
    producer,
    qdq_pair_of,
    silu_input,
    skip_qdq_up,
)
from edgeq.graph.trt86.common import (
    EDGEQ,
    ORT,
    PLACE,
    edge_of,
    float_of,
    pair_names,
    pointwise_layer,
    quantized,
)

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs


def match_silu_whole(graph: gs.Graph) -> list[Match]:
    out = []
    for mul in iter_nodes(graph, subgraphs=False):
        x = silu_input(mul)
        if x is None:
            continue
        s = next(t for t in mul.inputs if float_of(t) is not x)
        sig = producer(float_of(s))
        assert sig is not None  # silu_input found it
        edges = (
            Edge(x.name, mul.name, Want.FLOAT),
            Edge(float_of(s).name, mul.name, Want.FLOAT),
            Edge(x.name, sig.name, Want.FLOAT),
        )
        out.append(Match("silu-whole", mul.name, (sig.name, mul.name), edges))
    return out


def lint_silu_whole(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """Q/DQ inside a SiLU: on the Sigmoid -> Mul edge, or Sigmoid and Mul reading x through different Q/DQ.
    One shared Q/DQ on x itself is the SiLU's input, not inside."""
    out = []
    by_node = {n.name: n for n in graph.nodes}
    for m in matches:
        mul = by_node[m.anchor]
        x = silu_input(mul)
        assert x is not None  # the matcher found it
        paths = [skip_qdq_up(t) for t in mul.inputs]
        sig_i = next(
            i for i, (t, _) in enumerate(paths) if is_op(producer(t), "Sigmoid") and paths[1 - i][0] is x
        )
        sig = producer(paths[sig_i][0])
        assert sig is not None
        to_mul, (_, to_sig), direct = paths[sig_i][1], skip_qdq_up(sig.inputs[0]), paths[1 - sig_i][1]
        split = [p.dq for p in to_sig] != [p.dq for p in direct]
        if not to_mul and not split:
            continue
        inside = list(to_mul) + ([*to_sig, *direct] if split else [])
        out.append(
            Hit(
                f"Q/DQ inside the SiLU '{node_label(sig)}' * '{node_label(mul)}': TensorRT 8.6 can fail to "
                "find any implementation for the quantized PWN(Sigmoid, Mul); keep the SiLU in float and "
                "quantize its output",
                (node_label(sig), node_label(mul), *pair_names(inside)),
            )
        )
    return out


def match_silu_residual(graph: gs.Graph) -> list[Match]:
    out = []
    for add in iter_nodes(graph, subgraphs=False):
        split = fusion.residual_split(add)
        found = fusion.silu_residual(add, split) if split is not None else None
        if found is None or split is None:
            continue
        sig, mul, x, skip = found
        fx = float_of(x)
        edges = (
            Edge(fx.name, sig.name, Want.INT8),
            Edge(fx.name, mul.name, Want.INT8),
            edge_of(skip, add, Want.INT8),
            edge_of(split[0], add, Want.FLOAT),
        )
        conv = fusion.fused_origin(fx, through_activations=False)
        nodes = tuple(n.name for n in (conv, sig, mul, add) if n is not None)
        out.append(Match("silu-residual", add.name, nodes, edges))
    return out


def lint_silu_residual(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """A residual Add whose branch is a SiLU of a float convolution output while the skip is quantized."""
    out = []
    by_node = {n.name: n for n in graph.nodes}
    for m in matches:
        add = by_node[m.anchor]
        found = fusion.silu_residual(add)
        if found is None:
            continue
        sig, mul, x, skip = found
        if qdq_pair_of(x) is not None or not quantized(skip):
            continue
        conv = fusion.fused_origin(x, through_activations=False)
        assert conv is not None  # silu_residual checked it
        out.append(
            Hit(
                f"residual Add '{node_label(add)}' reads the SiLU '{node_label(sig)}' * '{node_label(mul)}' "
                f"of {conv.op} '{node_label(conv)}' in float: TensorRT 8.6 cannot fuse Conv+SiLU+Add, so "
                "PWN(Sigmoid, Mul, Add) runs FP16 behind reformats; quantize the convolution's output (one "
                "Q/DQ read by both the Sigmoid and the Mul)",
                (node_label(conv), node_label(sig), node_label(mul), node_label(add)),
            )
        )
    return out


def _silu_residual_wide(v: LayerView) -> bool:
    return pointwise_layer(v) and {"Sigmoid", "Mul"} <= v.ops and bool({"Add", "Sum"} & v.ops) and not v.gated


PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        "silu-whole",
        "A SiLU (x * Sigmoid(x)) with a Q/DQ inside (between Sigmoid and Mul, or one of them reading a "
        "quantized copy of x) has no INT8 implementation: the build fails. Only its output, or its input as "
        "one Q/DQ read by both (silu-residual), may be quantized.",
        f"{ORT}/yolo_ortfb.explicit.build.log and {EDGEQ}/yolo_edgeq_all.explicit.build.log ('Could not find "
        "any implementation for node PWN(PWN(Sigmoid), PWN(Mul))')",
        match=match_silu_whole,
        lint=LintSpec(
            Level.ERROR,
            "Q/DQ inside a SiLU (Sigmoid * Mul)",
            PLACE + " (keeps the SiLU in float, quantizes its output)",
            lint_silu_whole,
        ),
        aliases=("place-silu-whole", "fuse-silu-qdq"),
        ops=frozenset({"Sigmoid", "Mul"}),
        build_error=r"Could not find any implementation for node PWN\(.*Sigmoid.*Mul",
        precedence=50,
    ),
    Pattern(
        "silu-residual",
        "Conv + SiLU + residual Add do not fuse into one kernel: the SiLU and the Add fuse into one "
        "PointWise layer, which runs INT8 only when the convolution's output (one Q/DQ read by both Sigmoid "
        "and Mul) and the skip are quantized; left float it runs FP16 behind reformats.",
        f"{EDGEQ}/yolo_edgeq.explicit.layers.json (8 FP16 'PWN(PWN(Sigmoid, Mul), Add)') vs "
        "yolo_fix1.explicit.layers.json and yolo_edgeq.implicit.layers.json (the same layers INT8)",
        match=match_silu_residual,
        lint=LintSpec(
            Level.WARNING,
            "SiLU branch of a residual Add reading a float convolution output",
            PLACE + " (quantizes the convolution's output before the SiLU)",
            lint_silu_residual,
        ),
        engine=EngineSignature(
            "PWN(Sigmoid, Mul, Add) of a SiLU before a residual Add runs wider than INT8",
            wide=_silu_residual_wide,
        ),
        tunable=True,
        aliases=("place-silu-residual", "silu-add-not-fused", "fuse-silu-residual"),
        ops=frozenset({"Sigmoid", "Mul", "Add"}),
        precedence=100,
    ),
)
