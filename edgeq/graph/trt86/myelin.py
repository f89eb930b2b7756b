"""Regions TensorRT 8.6 compiles with Myelin (one ``{ForeignNode[...]}`` layer): LayerNorm, Linear over
tokens or pixels, attention (MatMul -> Softmax -> MatMul), GELU as Erf, a recurrent op (LSTM, GRU, RNN)
with the Linear after it. Myelin in 8.6 runs no INT8, and an
INT8 weight inside such a region fails the build, so the region stays float.

A region grows from its anchors (``ANCHORS``) over the ops Myelin takes with them (``GROWS``: pointwise
ops, data movement, reductions and global average pools, Softmax, MatMul/Gemm) and stops at
convolutions, windowed pools and Resize, which TensorRT keeps as its own kernels: a ConvNeXt's
depthwise convolution and a ViT's patch embedding stay INT8, each reading its own Q/DQ on the region's
output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple, Optional

from edgeq.findings import Level
from edgeq.graph.facts import Decisions, Edge, EngineSignature, Hit, LayerView, LintSpec, Match, Pattern, Want
from edgeq.graph.patterns import (
    SCALE_PRESERVING_OPS,
    consumers,
    is_constant,
    is_dequantize,
    is_op,
    is_standard,
    iter_nodes,
    node_label,
    producer,
    qdq_pair_of,
    skip_qdq_down,
)
from edgeq.graph.trt86.common import float_of, pair_names
from edgeq.graph.trt86.regions import POINTWISE_OPS
from edgeq.text import plural

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

RULE = "myelin-region"

# The build failures and engines behind this entry (TensorRT 8.6.0, 2026-11-26).
I28 = "tests/fixtures/trt86-h200-i28"
MEASURED = (
    f"measured: {I28}/vit.main.int8.build.log, vit_dec.main.int8.build.log and "
    "convnext.main.int8.build.log (the zoo's vit_like, with LayerNormalization and written out, and "
    "convnext_like, batch 8, quantized with every MatMul's input and weight INT8: "
    "'convertMyelinWeightsToFp32 ... Assertion params.weights.type() != DataType::kINT8' on an H200) vs "
    "vit.int8.build.log and "
    "convnext.int8.build.log (this entry: both build; vit.int8.layers.json: the patch convolution INT8, the "
    "rest one Myelin layer); the same failure on two torchvision networks with LayerNorm + Linear blocks "
    "(H100 and H200), whose implicit engines ran no INT8 layer"
)
BUILD_ASSERT = "convertMyelinWeightsToFp32"

# Data movement Myelin takes along (the channel permutes of a LayerNorm2d, attention's head reshapes); no
# windowed pools or Resize: those are TensorRT's own layers. A global average pool is a reduction, and it
# joins the region it reads: Swin-T's and ConvNeXt-T's implicit engines end in one Myelin layer from the
# last block through LayerNorm, GlobalAveragePool, Flatten and the head's Gemm, and the rules' Q/DQ on
# Swin-T's pooled output (the head's weight INT8) failed the build (GLOBAL_POOL below).
_MOVES = (SCALE_PRESERVING_OPS - {"MaxPool", "GlobalMaxPool", "Resize", "Upsample"}) | {
    "Concat", "Expand", "Tile"}
GROWS = POINTWISE_OPS | _MOVES | frozenset({
    "LayerNormalization", "ReduceMean", "ReduceSum", "ReduceMax", "Softmax", "MatMul", "Gemm", "Erf", "Where",
    "Cast", "Pow", "Sqrt", "GlobalAveragePool",
})
# A recurrent op and the Linear after it are one Myelin layer: ddddocr's CRNN recogniser (Conv -> LSTM ->
# Transpose/Reshape -> Gemm) ran "{ForeignNode[... [LoopOutput] ... Reshape_101]}" FP16/FP32 in its
# implicit engine, and the rules' Q/DQ model, with the Gemm's weight INT8 and a Q/DQ on the LSTM's output,
# failed the build with the same assertion as the LayerNorm + Linear blocks.
RECURRENT = frozenset({"LSTM", "GRU", "RNN"})
MORE = "tests/fixtures/trt86-h100-more"
RECURRENT_SOURCE = (
    f"{MORE}/ddrec.static.agent-build.json ('{BUILD_ASSERT} ... Assertion params.weights.type() != "
    f"DataType::kINT8', an H100, 2026-11-26) and {MORE}/ddrec.implicit.layers.json.gz (the LSTM, "
    "Transpose, Reshape and Gemm one Myelin layer, FP32 out; the convolution before it FP16); with the "
    f"region float the rules' Q/DQ model built: {MORE}/ddrec.myelin.build.log.gz and "
    "ddrec.myelin.layers.json.gz (the same Myelin layer, the convolutions INT8). Unverified: GRU and RNN "
    "(no engine measured)"
)
CORPUS = "tests/fixtures/trt86-h100-corpus"
GLOBAL_POOL = (
    f"{CORPUS}/swin_t.static.build-errors.log.gz (the rules before GlobalAveragePool joined a region: "
    "'convertMyelinWeightsToFp32 ... Assertion params.weights.type() != DataType::kINT8', an H100, "
    f"2026-11-26), swin_t.implicit.layers.json.gz and convnext_tiny.implicit.layers.json.gz (the last "
    "Myelin layer runs to the output); unverified: that Swin-T's static model builds with it"
)


def activation_inputs(node: gs.Node) -> list[gs.Tensor]:
    """The float activations ``node`` reads, seen through Q/DQ: no constants, no weights behind a DQ."""
    out: list[gs.Tensor] = []
    for t in node.inputs:
        if not t.name or is_constant(t):
            continue
        p = producer(t)
        if is_dequantize(p) and p.inputs and is_constant(p.inputs[0]):
            continue  # a weight (int8 behind its DequantizeLinear)
        f = float_of(t)
        if not is_constant(f) and f not in out:
            out.append(f)
    return out


def _reduce_mean_centres(node: gs.Node) -> bool:
    """ReduceMean(x) read by Sub(x, mean): the start of a LayerNorm written out (ReduceMean, Sub, Pow,
    ReduceMean, Add, Sqrt, Div), as opsets below 17 and hand-written norms export it."""
    if not is_op(node, "ReduceMean") or not node.inputs or not node.outputs:
        return False
    x = float_of(node.inputs[0])
    return any(is_op(r, "Sub") and any(float_of(t) is x for t in r.inputs)
               for r, _, _ in skip_qdq_down(node.outputs[0]))


def _linear_over_tokens(node: gs.Node) -> bool:
    """MatMul with a constant weight over a 3-D or 4-D input (rank unknown counts): torch's nn.Linear on
    tokens or NHWC pixels. Over a 2-D input it is a fully connected layer as TensorRT's own kernels run
    it (torch writes Gemm there), not a Myelin anchor."""
    ins = activation_inputs(node)
    if not is_op(node, "MatMul") or len(ins) != 1:
        return False
    shape = ins[0].shape
    return shape is None or len(shape) != 2


class Speed(NamedTuple):
    """What regions of some anchor kinds cost when timed: each timed model's static Q/DQ engine (its
    regions float) against its implicit engine, median qps of paired rounds."""

    ratios: tuple[tuple[str, float], ...]  # (model, static / implicit)

    def span(self) -> str:
        r = sorted(x for _, x in self.ratios)
        return f"{r[0]:.2f}x-{r[-1]:.2f}x" if r[0] != r[-1] else f"{r[0]:.2f}x"

    def models(self) -> str:
        return ", ".join(m for m, _ in self.ratios)


# The corpus's ViT-B/16 and ConvNeXt-T (an H100, 2026-11-26): their regions hold LayerNormalization,
# Linear (MatMul), GELU (Erf) and (ViT) attention, the anchors timed below (tests/test_build_classes.py
# reads both models' anchors and timed.json)
TIMED = Speed((("ViT-B/16", 0.49), ("ConvNeXt-T", 0.59)))
SLOWER = (
    "tests/fixtures/trt86-h100-corpus/vit_b_16.{implicit,static}.profile.json.gz and convnext_tiny's (an "
    "H100, 2026-11-26): with the regions float the Q/DQ models build, but their Myelin layers ran 2.0x "
    "(ViT-B/16) and 1.6x (ConvNeXt-T) the implicit engines' time; ViT's implicit engine ran no INT8 layer. "
    "Paired rounds, a later lease of the same kind (tests/fixtures/trt86-h100-corpus/timed.json): the "
    "static engines ran " + " and ".join(f"{x:.2f}x ({m})" for m, x in TIMED.ratios) + " implicit, the "
    "mirrors 0.999x and 0.653x"
)
# Why a region of these anchors has no figure (RECURRENT_SOURCE: the CRNN's rules' model built,
# ddrec.myelin.build.log.gz; the zoo's ViT with its LayerNorm written out: only its failed build, MEASURED)
UNTIMED_RECURRENT = "ddddocr's CRNN's rules' Q/DQ model built on an H100, no engine of it timed"
UNTIMED_WRITTEN_OUT = "no model with it timed"


class Anchor(NamedTuple):
    """Where a Myelin region starts: its kind (the region's message names the kinds it holds), how it is
    recognized, and what a region of it costs against implicit: ``timed``, or why unmeasured."""

    kind: str
    test: Callable[[gs.Node], bool]
    timed: Optional[Speed] = None
    untimed: str = ""


# MatMul with a constant weight is torch's nn.Linear over a 3-D or 4-D input (Gemm for 2-D); with two
# activation inputs it is attention's q @ k^T or attn @ v.
ANCHORS: tuple[Anchor, ...] = (
    Anchor("LayerNormalization", lambda n: is_op(n, "LayerNormalization"), TIMED),
    Anchor("LayerNorm (ReduceMean/Sub/Pow/Sqrt/Div)", _reduce_mean_centres, untimed=UNTIMED_WRITTEN_OUT),
    Anchor("attention MatMul", lambda n: is_op(n, "MatMul") and len(activation_inputs(n)) >= 2, TIMED),
    Anchor("Linear (MatMul)", _linear_over_tokens, TIMED),
    Anchor("GELU (Erf)", lambda n: is_op(n, "Erf"), TIMED),
    Anchor("recurrent (LSTM/GRU/RNN)", lambda n: n.op in RECURRENT, untimed=UNTIMED_RECURRENT),
)
_ANCHOR = {a.kind: a for a in ANCHORS}


def anchor_kind(node: gs.Node) -> Optional[str]:
    if not is_standard(node):
        return None
    return next((a.kind for a in ANCHORS if a.test(node)), None)


def _neighbours(node: gs.Node) -> Iterable[gs.Node]:
    for t in activation_inputs(node):
        p = producer(t)
        if p is not None:
            yield p
    for o in node.outputs:
        for r, _, _ in skip_qdq_down(o):
            yield r


def myelin_regions(graph: gs.Graph) -> list[tuple[list[gs.Node], list[str]]]:
    """Each region (its nodes in graph order) with the anchor kinds it holds: grown from every anchor
    over ``GROWS`` ops, through Q/DQ pairs (so lint sees the same regions in a Q/DQ model)."""
    order = {id(n): i for i, n in enumerate(iter_nodes(graph, subgraphs=False))}
    seen: set[int] = set()
    out = []
    for start in iter_nodes(graph, subgraphs=False):
        if id(start) in seen or anchor_kind(start) is None:
            continue
        region: list[gs.Node] = []
        stack = [start]
        while stack:
            n = stack.pop()
            if id(n) in seen or id(n) not in order:
                continue
            seen.add(id(n))
            region.append(n)
            stack += [m for m in _neighbours(n) if id(m) not in seen and is_standard(m) and m.op in GROWS]
        region.sort(key=lambda n: order[id(n)])
        kinds = list(dict.fromkeys(k for k in (anchor_kind(n) for n in region) if k is not None))
        out.append((region, kinds))
    return out


def _timed(kinds: list[str]) -> Optional[Speed]:
    """The timing that holds for a region of these anchor kinds: one, when every kind was timed."""
    speeds = {_ANCHOR[k].timed for k in kinds}
    return next(iter(speeds)) if len(speeds) == 1 else None


def known_slow_line(graph: gs.Graph) -> str | None:
    """The one line ``quantize`` prints for a graph with Myelin regions: the figure measured on regions of
    their anchor kinds (slower than implicit), or, where a region holds a kind never timed (a recurrent
    op), that its speed is unmeasured."""
    regions = myelin_regions(graph)
    if not regions:
        return None
    groups: dict[Optional[Speed], list[list[str]]] = {}
    for _, kinds in regions:
        groups.setdefault(_timed(kinds), []).append(kinds)
    parts = []
    for speed, of in groups.items():
        held = list(dict.fromkeys(k for ks in of for k in ks))
        count = f"{len(of)} ({', '.join(held)}): " if len(groups) > 1 else ""
        if speed is not None:
            listed = "" if count else f": {', '.join(held)} regions"
            parts.append(f"{count}on the measured H100 engines such Q/DQ models ran {speed.span()} the "
                         f"implicit engine's speed ({speed.models()}{listed})")
            continue
        why = "; ".join(f"{k}: {_ANCHOR[k].untimed}" for k in held if _ANCHOR[k].timed is None)
        beside = [(k, t) for k in held if (t := _ANCHOR[k].timed) is not None]
        if beside:  # the kinds that were timed, with their figure: what is known of such a region
            t = beside[0][1]
            why += (f"; {t.models()}, whose regions held {', '.join(k for k, _ in beside)} and only timed "
                    f"anchors, ran {t.span()} implicit")
        parts.append(f"{count}{'its' if len(of) == 1 else 'their'} speed against the implicit engine is "
                     f"unmeasured ({why})")
    return (f"{plural(len(regions), 'Myelin region')} left float ({RULE}): " + "; ".join(parts)
            + ": deploy with a target (--placement auto)")


def match_myelin_region(graph: gs.Graph) -> list[Match]:
    out = []
    for region, _ in myelin_regions(graph):
        edges = tuple(Edge(t.name, n.name, Want.FLOAT) for n in region for t in activation_inputs(n))
        out.append(Match(RULE, region[0].name, tuple(n.name for n in region), edges))
    return out


def _describe(region: list[gs.Node], kinds: list[str]) -> str:
    return f"Myelin region '{node_label(region[0])}'...'{node_label(region[-1])}' ({', '.join(kinds)})"


def lint_myelin_region(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """INT8 weights inside a Myelin region (the measured build failure) and activation Q/DQ into its
    nodes (run FP16 anyway, behind reformats: unverified)."""
    out = []
    for region, kinds in myelin_regions(graph):
        inside = {id(n) for n in region}
        weights = [p for n in region for t in n.inputs if t.name and (p := producer(t)) is not None
                   and is_dequantize(p) and p.inputs and is_constant(p.inputs[0])]
        if weights:
            out.append(Hit(
                f"{len(weights)} weighted op(s) in the {_describe(region, kinds)} read int8 weights: "
                f"TensorRT 8.6 fails the build ('{BUILD_ASSERT} ... Assertion params.weights.type() != "
                "DataType::kINT8'); keep the region float",
                tuple(dict.fromkeys([*(node_label(c) for p in weights for c in consumers(p.outputs[0])),
                                     *(node_label(p) for p in weights)]))))
        pairs = [pr for n in region for t in n.inputs if t.name and (pr := qdq_pair_of(t)) is not None
                 and id(producer(pr.q.inputs[0])) in inside]
        if pairs:
            out.append(Hit(
                f"{len(pairs)} Q/DQ pair(s) inside the {_describe(region, kinds)}: Myelin runs no INT8 on "
                "TensorRT 8.6, so they only add reformats (unverified); keep the region float",
                tuple(pair_names(pairs)), level=Level.WARNING))
    return out


_MYELIN_OPS = frozenset({"LayerNormalization", "Softmax", "Erf", "MatMul"})


def _myelin_wide(v: LayerView) -> bool:
    """A Myelin layer, or a layer running LayerNorm, attention's ops or Erf, wider than INT8."""
    return v.kind == "compute" and (v.foreign or (bool(_MYELIN_OPS & v.ops)
                                                  and not ({"Conv", "ConvTranspose"} & v.ops)))


PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        RULE,
        "Regions TensorRT 8.6 compiles with Myelin (LayerNorm, Linear over tokens, attention, GELU as "
        "Erf, LSTM/GRU/RNN) run no INT8, and an INT8 weight there fails the build: they stay float. A "
        "region grows from LayerNormalization (or ReduceMean/Sub/Pow/Sqrt/Div), a MatMul with a constant "
        "weight over a 3-D or 4-D input, a MatMul of two activations (with the Softmax between), Erf and a "
        "recurrent op, over the pointwise ops, "
        "data movement and Gemm joined to them; no Q/DQ on its nodes' inputs, no int8 weights; a convolution "
        "reading it gets its own Q/DQ. Measured: the build failure of LayerNorm + Linear blocks. Unverified: "
        "that Softmax chains and Erf alone make Myelin regions, and where a region ends.",
        f"{MEASURED}. A global average pool joins the region it reads: {GLOBAL_POOL}. A recurrent op "
        f"anchors one: {RECURRENT_SOURCE}. "
        f"Slower than implicit: {SLOWER}. Unverified: that Softmax chains or Erf alone make a "
        "Myelin region, and where a region ends. No Myelin layer in the measured CNN engines, whose "
        "placement it leaves as it was: "
        "tests/fixtures/trt86-h100-zoo/effb0.implicit.layers.json.gz, "
        "trt86-h200-edgeq/yolo_fix2.explicit.layers.json",
        match=match_myelin_region,
        lint=LintSpec(
            Level.ERROR,
            "Q/DQ or int8 weights inside a region TensorRT 8.6 compiles with Myelin",
            "run `edgeq quantize` on the float model (keeps Myelin regions float)",
            lint_myelin_region,
        ),
        engine=EngineSignature(
            "a Myelin layer (LayerNorm, Linear, attention, GELU) runs FP16/FP32: Myelin has no INT8 on 8.6",
            wide=_myelin_wide,
        ),
        ops=GROWS,
        floats_nodes=True,
        build_error=BUILD_ASSERT,
        note=known_slow_line,
        precedence=140,
    ),
)
