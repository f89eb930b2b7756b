"""Data movement and Concat: Q/DQ commute across data movement, one scale across a Concat, and the
convolution that reads a Concat needs its own Q/DQ."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeq.findings import Level
from edgeq.graph import fusion
from edgeq.graph.facts import Decisions, Edge, EngineSignature, Hit, LayerView, LintSpec, Match, Pattern, Want
from edgeq.graph.patterns import (
    SCALE_PRESERVING_OPS,
    WEIGHTED_OPS,
    consumers,
    is_constant,
    is_dequantize,
    is_op,
    is_quantize,
    is_standard,
    iter_nodes,
    node_label,
    preserves_scale,
    qparams,
    same_scale,
    upstream_dq,
)
from edgeq.graph.trt86.common import (
    EDGEQ,
    ORT,
    PLACE,
    WEIGHTED,
    data_inputs,
    quantized,
)
from edgeq.text import number

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs


def lint_dangling_dq_q(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """An activation DQ whose value reaches a Q with another scale through data movement only: TensorRT
    keeps a separate requantizing Scale layer (DQ -> Q with the same scale is an identity it removes)."""
    out = []
    for dq in iter_nodes(graph):
        if not is_dequantize(dq) or is_constant(dq.inputs[0]) or not dq.outputs:
            continue
        s_in = qparams(dq).scale
        stack: list[tuple[gs.Tensor, tuple[str, ...]]] = [(dq.outputs[0], ())]
        seen: set[int] = set()
        while stack:
            t, via = stack.pop()
            for n in consumers(t):
                if id(n) in seen:
                    continue
                seen.add(id(n))
                if is_quantize(n) and n.inputs[0] is t:
                    s_out = qparams(n).scale
                    if s_in is not None and s_out is not None and not same_scale(s_in, s_out):
                        path = " -> ".join(("DQ", *via, "Q"))
                        out.append(
                            Hit(
                                f"DequantizeLinear '{node_label(dq)}' feeds QuantizeLinear '{node_label(n)}' "
                                f"with a different scale through data movement only ({path}); TensorRT keeps "
                                "a separate requantizing Scale layer; give both one scale or drop the inner "
                                "pair",
                                (node_label(dq), *via, node_label(n)),
                            )
                        )
                elif preserves_scale(n) and n.inputs and n.inputs[0] is t:
                    stack.extend((o, (*via, node_label(n))) for o in n.outputs)
    return out


def lint_concat_scales(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """Concat inputs quantized with different scales: TensorRT requantizes with copy layers."""
    out = []
    for cat in iter_nodes(graph):
        if not is_op(cat, "Concat"):
            continue
        dqs = [d for d in (upstream_dq(t) for t in cat.inputs) if d is not None]
        scales = [s for s in (qparams(d).scale for d in dqs) if s is not None]
        if len(dqs) < 2 or len(scales) != len(dqs) or all(same_scale(scales[0], s) for s in scales[1:]):
            continue
        shown = ", ".join(f"{number(float(s.ravel()[0]), 8)}" for s in scales if s.size == 1)
        n_scales = len({float(s.ravel()[0]) for s in scales})
        out.append(
            Hit(
                f"Concat '{node_label(cat)}' joins inputs quantized with {n_scales} different scales "
                f"({shown}); TensorRT inserts requantizing copies; give its inputs one shared scale",
                (node_label(cat), *(node_label(d) for d in dqs)),
            )
        )
    return out


def match_concat_conv(graph: gs.Graph) -> list[Match]:
    outputs = {t.name for t in graph.outputs}
    out = []
    for n in iter_nodes(graph, subgraphs=False):
        if n.op not in WEIGHTED_OPS or not is_standard(n):
            continue
        for t in data_inputs(n):
            cat = fusion.concat_behind(t)
            if cat is not None and t.name not in outputs:
                out.append(
                    Match("concat-conv", n.name, (cat.name, n.name), (Edge(t.name, n.name, Want.OWN),))
                )
    return out


def lint_concat_conv(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """A weighted op reading a Concat whose inputs are quantized, with no Q/DQ of its own on that input."""
    out = []
    by_node = {n.name: n for n in graph.nodes}
    for m in matches:
        node = by_node[m.anchor]
        if not fusion.has_weight(node) or not node.inputs:
            continue
        t = node.inputs[0]
        cat = fusion.concat_behind(t)
        if cat is None or not any(quantized(x) for x in cat.inputs if not is_constant(x)):
            continue
        out.append(
            Hit(
                f"{node.op} '{node_label(node)}' reads Concat '{node_label(cat)}' whose inputs are quantized "
                "but has no Q/DQ of its own: TensorRT 8.6 concatenates in FP16 and runs it in FP16/FP32; "
                "add a Q/DQ on the Concat's output (the Concat's scale) right before it",
                (node_label(node), *(node_label(n) for n in fusion.epilogue(node)), node_label(cat)),
            )
        )
    return out


def _concat_wide(v: LayerView) -> bool:
    return bool(WEIGHTED & v.ops) and bool({"Concat", "multi-producer"} & v.upstream)


PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        "data-movement",
        "MaxPool, nearest Resize, Split/Slice, reshapes and transposes move Q/DQ: a weighted op reading "
        "their output gets INT8 from a Q/DQ on their input, they run INT8 themselves and carry one scale "
        "through; a DQ -> data movement -> Q with another scale leaves a requantizing Scale layer.",
        f"{EDGEQ}/yolo_edgeq.explicit.layers.json (bottleneck convolutions reading a Split output, SPPF "
        f"MaxPools and Resize INT8); {ORT}/resnet50_placed.explicit.layers.json; the Scale layer: "
        "NVIDIA/TensorRT GitHub thread #3861 (unverified in our fixtures)",
        lint=LintSpec(
            Level.WARNING,
            "DQ -> (data movement) -> Q with a different scale between convolutions",
            PLACE + " (one scale through Split/Slice, no inner Q/DQ pair)",
            lint_dangling_dq_q,
        ),
        aliases=("place-commute", "data-movement-commutes", "fuse-dangling-dq-q"),
        ops=SCALE_PRESERVING_OPS | {"Concat"},
        precedence=30,
    ),
    Pattern(
        "concat-scale",
        "A Concat whose inputs carry one scale runs as INT8 copies into its output buffer (same precision, "
        "same format); different scales add requantizing layers. Every input of an INT8 Concat (and the "
        "data movement feeding it) shares the largest amax of the group.",
        f"{EDGEQ}/yolo_edgeq.implicit.layers.json and yolo_fix2.explicit.layers.json (19 INT8->INT8 "
        f"same-format Concat copies in both); {ORT}/yolo.implicit.build.log (27 interior Reformat copies)",
        lint=LintSpec(
            Level.WARNING,
            "Concat inputs quantized with different scales",
            PLACE + " (one shared scale across a Concat's inputs)",
            lint_concat_scales,
        ),
        aliases=("place-concat-shared-scale", "concat-shared-scale", "fuse-concat-scales"),
        tunable=True,
        ops=frozenset({"Concat"}),
        precedence=40,
    ),
    Pattern(
        "concat-conv",
        "TensorRT 8.6 does not carry a DQ on a Concat's inputs forward to a weighted op reading the Concat: "
        "it clones the DQ per input, concatenates in FP16 and runs the convolution FP16/FP32. The weighted "
        "op needs its own Q/DQ right before it, on the Concat's output, in the Concat's scale group.",
        f"{EDGEQ}/yolo_edgeq.explicit.layers.json (every C2f/SPPF cv2 convolution FP16/FP32 behind "
        "'..._DequantizeLinear_clone_N' reformats) vs yolo_fix2.explicit.layers.json (49/49 INT8, the "
        "implicit engine's 69 layers, 981 vs 980 qps)",
        match=match_concat_conv,
        lint=LintSpec(
            Level.WARNING,
            "convolution reading a quantized Concat without a Q/DQ of its own",
            PLACE + " (a Q/DQ on the Concat's output before each convolution that reads it)",
            lint_concat_conv,
        ),
        engine=EngineSignature("a convolution reading a Concat runs wider than INT8", wide=_concat_wide),
        tunable=True,
        aliases=("place-concat-conv", "concat-dq-not-forwarded", "fuse-concat-conv"),
        ops=frozenset({"Concat"}),
        precedence=80,
    ),
)
