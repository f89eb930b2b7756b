"""Convolution-centred patterns: a weighted op's inputs, its epilogue, the stem's Conv+ReLU+MaxPool, the
residual Add, the pooling tail before a classifier."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from edgeq.findings import Level
from edgeq.graph import fusion
from edgeq.graph.facts import Decisions, Edge, EngineSignature, Hit, LayerView, LintSpec, Match, Pattern, Want
from edgeq.graph.fusion import has_weight
from edgeq.graph.patterns import (
    ACTIVATION_OPS,
    WEIGHTED_OPS,
    consumers,
    is_constant,
    is_op,
    is_standard,
    is_weight_dq,
    iter_nodes,
    node_label,
    producer,
    qdq_pair_of,
    silu_input,
    skip_qdq_up,
)
from edgeq.graph.trt86.common import (
    EDGEQ,
    GUIDE,
    ORT,
    PLACE,
    WEIGHTED,
    data_inputs,
    edge_of,
    pair_names,
    pointwise_layer,
    quantized,
)
from edgeq.graph.trt86.regions import se_squeezes
from edgeq.text import plural

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs


WEIGHTED_INPUTS = "weighted-inputs"


def match_weighted_inputs(graph: gs.Graph) -> list[Match]:
    out = []
    for n in iter_nodes(graph, subgraphs=False):
        if n.op in WEIGHTED_OPS and is_standard(n):
            ins = data_inputs(n)
            if ins:
                out.append(
                    Match(WEIGHTED_INPUTS, n.name, (n.name,), tuple(edge_of(t, n, Want.INT8) for t in ins))
                )
    return out


def lint_weighted_inputs(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """A weighted op with int8 weights reading a float activation: no INT8 kernel takes that pair, so the
    op runs FP32/FP16 with its weights dequantized at run time. Only edges this entry decides: where a
    later entry decided the edge, it speaks for it (a Concat's output is concat-conv's; an Inception
    block's merged outputs are float on purpose, their readers' FP32 weights having failed the build)."""
    by_node = {n.name: n for n in graph.nodes}
    hits: list[tuple[gs.Node, gs.Tensor]] = []
    for m in matches:
        n = by_node.get(m.anchor)
        if n is None or not any(is_weight_dq(producer(t)) for t in n.inputs[1:2] if producer(t) is not None):
            continue
        ins = [t for i, t in enumerate(n.inputs) if t.name and not is_constant(t) and i != 1
               and not (i == 2 and has_weight(n)) and not is_weight_dq(producer(t))]
        ours = (None, WEIGHTED_INPUTS)
        floats = [t for t in ins if not quantized(t) and decisions.rule(t.name, n.name) in ours]
        if floats:
            hits.append((n, floats[0]))
    if not hits:
        return []
    n, t = hits[0]
    return [Hit(
        f"{plural(len(hits), 'weighted op')} with int8 weights reading a float activation ('{node_label(n)}' "
        f"reads '{t.name}'): TensorRT 8.6 runs {'it' if len(hits) == 1 else 'them'} FP32/FP16, the weights "
        "dequantized at run time",
        tuple(node_label(h) for h, _ in hits))]


def lint_conv_output(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """Conv (or residual Add) -> Q/DQ -> activation (ReLU, SiLU, ...): the Q/DQ keeps the activation out
    of the convolution. Only exclusive chains (otherwise no fusion was possible anyway), and not where a
    later pattern wants the activation's input INT8 (a SiLU before a residual Add, an SE gate's Sigmoid).
    ConvTranspose is left out: unverified on 8.6 which placement fuses."""
    out = []
    for acts, t in _activations(graph):
        if qdq_pair_of(t) is None:
            continue
        float_t, crossed = skip_qdq_up(t)
        if len(consumers(float_t)) != 1 or {id(n) for n in consumers(t)} != {id(n) for n in acts}:
            continue
        if any(len(consumers(p.q.outputs[0])) != 1 for p in crossed) or any(
            len(consumers(p.dq.outputs[0])) != 1 for p in crossed[1:]
        ):
            continue
        p = producer(float_t)
        while p is not None and is_op(p, "BatchNormalization") and len(consumers(p.inputs[0])) == 1:
            p = producer(p.inputs[0])
        residual = is_op(p, "Add") and len(p.inputs) == 2 and not any(is_constant(x) for x in p.inputs)
        if p is None or not ((p.op in WEIGHTED_OPS and p.op != "ConvTranspose") or residual):
            continue
        if decisions.want(float_t.name, acts[0].name) == Want.INT8:
            continue
        kind = "residual Add" if residual else p.op
        act = "SiLU" if len(acts) == 2 else acts[0].op
        out.append(
            Hit(
                f"Q/DQ between {kind} '{node_label(p)}' and {act} '{node_label(acts[-1])}' keeps the {act} "
                f"from fusing into the {kind}; quantize after the activation",
                (node_label(p), *pair_names(crossed), *(node_label(n) for n in acts)),
            )
        )
    return out


def _activations(graph: gs.Graph) -> Iterable[tuple[tuple[gs.Node, ...], gs.Tensor]]:
    """``(activation nodes, the tensor they read)``: single-input activations, and SiLUs whose Sigmoid and
    Mul read one tensor (a SiLU split by Q/DQ inside is silu-whole's business)."""
    for n in iter_nodes(graph):
        if not n.inputs or not is_standard(n):
            continue
        if n.op in ACTIVATION_OPS:
            if n.op == "Sigmoid" and any(silu_input(m) is not None for m in consumers(n.outputs[0])):
                continue
            yield (n,), n.inputs[0]
        elif silu_input(n) is not None:
            for i in (0, 1):
                sig = producer(n.inputs[i])
                if is_op(sig, "Sigmoid") and sig.inputs[0] is n.inputs[1 - i]:
                    yield (sig, n), n.inputs[1 - i]


def match_conv_act_maxpool(graph: gs.Graph) -> list[Match]:
    out = []
    for pool in iter_nodes(graph, subgraphs=False):
        found = fusion.act_before_pool(pool)
        if found is not None:
            act, float_t, conv = found
            out.append(
                Match(
                    "conv-act-maxpool",
                    pool.name,
                    (conv.name, act.name, pool.name),
                    (Edge(float_t.name, pool.name, Want.FLOAT),),
                )
            )
    return out


def lint_relu_maxpool(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """Conv -> ReLU -> Q/DQ -> MaxPool: the Q/DQ stops Conv+ReLU+MaxPool fusing as CaskConvActPool."""
    out = []
    by_node = {n.name: n for n in graph.nodes}
    for m in matches:
        pool = by_node[m.anchor]
        if qdq_pair_of(pool.inputs[0]) is None:
            continue
        conv, act = m.nodes[0], m.nodes[1]
        _, crossed = skip_qdq_up(pool.inputs[0])
        out.append(
            Hit(
                f"Q/DQ between '{act}' and MaxPool '{node_label(pool)}' after convolution '{conv}' stops "
                f"Conv+{by_node[act].op}+MaxPool fusing (CaskConvActPool); quantize after the pool instead",
                (act, *pair_names(crossed), node_label(pool)),
            )
        )
    return out


def match_residual_add(graph: gs.Graph) -> list[Match]:
    out = []
    for add in iter_nodes(graph, subgraphs=False):
        split = fusion.residual_split(add)
        if split is None:
            continue
        branch, skip = split
        origin = fusion.fused_origin(branch)
        nodes = tuple(n for n in ((origin.name if origin else None), add.name) if n)
        out.append(
            Match(
                "residual-add",
                add.name,
                nodes,
                (edge_of(branch, add, Want.FLOAT), edge_of(skip, add, Want.INT8)),
            )
        )
    return out


def lint_residual_add(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """Residual Add with Q/DQ on both inputs while one comes straight from a convolution: it cannot fuse."""
    out = []
    for add in iter_nodes(graph):
        if not is_op(add, "Add") or len(add.inputs) != 2 or any(is_constant(t) for t in add.inputs):
            continue
        a, b = add.inputs
        if not (qdq_pair_of(a) and qdq_pair_of(b)):
            continue
        conv_sides = [(t, c) for t in (a, b) if (c := fusion.fused_origin(t)) is not None]
        if not conv_sides:
            continue
        pairs = [qdq_pair_of(t) for t, _ in conv_sides]
        convs = " or ".join(f"{c.op} '{node_label(c)}'" for _, c in conv_sides)
        which = (
            "both inputs come from weighted layers; keep the Q/DQ on one (the skip branch) only"
            if len(conv_sides) == 2
            else "remove the Q/DQ on the input from it"
        )
        out.append(
            Hit(
                f"residual Add '{node_label(add)}' has Q/DQ on both inputs, so it cannot fuse into {convs} "
                f"and runs as a separate PointWise layer: {which}",
                (node_label(add), *pair_names(p for p in pairs if p is not None)),
            )
        )
    return out


def match_pool_tail(graph: gs.Graph) -> list[Match]:
    squeezes = se_squeezes(graph)
    out = []
    for pool in iter_nodes(graph, subgraphs=False):
        conv = fusion.averaging_tail(pool)
        if conv is not None and pool.name not in squeezes:
            out.append(
                Match(
                    "pool-tail",
                    pool.name,
                    (conv.name, pool.name),
                    (edge_of(pool.inputs[0], pool, Want.INT8),),
                )
            )
    return out


def lint_pool_tail(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """An averaging op reading a quantized convolution chain with its own input float."""
    out = []
    by_node = {n.name: n for n in graph.nodes}
    for m in matches:
        pool = by_node[m.anchor]
        conv = by_node[m.nodes[0]]
        if qdq_pair_of(pool.inputs[0]) is not None or not quantized(conv.inputs[0]):
            continue
        out.append(
            Hit(
                f"{pool.op} '{node_label(pool)}' reads the chain of {conv.op} '{node_label(conv)}' in float: "
                "that convolution ends FP16 and the pool runs FP16; quantize the pool's input",
                (node_label(conv), *(node_label(n) for n in fusion.epilogue(conv)), node_label(pool)),
            )
        )
    return out


def _residual_unfused(v: LayerView) -> bool:
    return pointwise_layer(v) and bool({"Add", "Sum"} & v.ops) and not (WEIGHTED & v.ops) and v.inputs >= 2


def _pool_wide(v: LayerView) -> bool:
    return bool(fusion.AVERAGING_OPS & v.ops) or bool(fusion.AVERAGING_OPS & v.downstream)


def _maxpool_fused(v: LayerView) -> bool:
    return "MaxPool" in v.ops and bool(fusion.POOL_FUSIBLE_ACTIVATIONS & v.ops) and bool(WEIGHTED & v.ops)


CORPUS = "tests/fixtures/trt86-h100-corpus"
STEM_CHANNELS = 4  # a convolution reading at most this many channels is a stem (an image's 3)


def _unfused_hardswish_conv(conv: gs.Node) -> bool:
    """A depthwise/grouped convolution, or a stem reading <= STEM_CHANNELS channels: TensorRT 8.6 runs
    the HardSwish after these as a layer of its own (the dense 1x1 ones fuse it)."""
    if not (is_op(conv, "Conv") and has_weight(conv)):
        return False
    if int(conv.attrs.get("group", 1)) > 1:
        return True
    w = conv.inputs[1]
    dq = producer(w)
    if not is_constant(w) and dq is not None:  # a Q/DQ model: the int8 weight behind its DequantizeLinear
        w = dq.inputs[0]
    shape = getattr(w, "shape", None)
    return shape is not None and len(shape) == 4 and int(shape[1]) <= STEM_CHANNELS


def match_hardswish_unfused(graph: gs.Graph) -> list[Match]:
    out = []
    for n in iter_nodes(graph, subgraphs=False):
        if not is_op(n, "HardSwish") or not n.inputs:
            continue
        x = skip_qdq_up(n.inputs[0])[0]
        conv = producer(x)
        if conv is None or not _unfused_hardswish_conv(conv) or len(consumers(x)) != 1:
            continue
        edge = Edge(x.name, n.name, Want.INT8)
        out.append(Match("hardswish-unfused", n.name, (conv.name, n.name), (edge,)))
    return out


PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        WEIGHTED_INPUTS,
        "A weighted op (Conv, ConvTranspose, Gemm, MatMul) runs INT8 when every activation input is "
        "quantized (per-tensor int8, zero-point 0) and its weight is int8 behind a per-channel "
        "DequantizeLinear on the output-channel axis; bias stays float.",
        f"{GUIDE} (quantize all inputs of weighted operations); 'Per-Tensor and Per-Channel Quantization'; "
        f"{ORT}/resnet50_ortfb.explicit.build.log (int8 weights behind DQ build, every convolution INT8) and "
        f"{ORT}/resnet50_ortqdq.explicit.build.log (int32 bias DQ fails: bias stays float); int8 weights "
        "behind a float activation run FP32/FP16, their weights dequantized by 'Scale' layers: "
        f"{CORPUS}/mobilenet_v3_small.static.layers.json.gz (depthwise convolutions), "
        "tests/fixtures/trt86-h100-corpus2/googlenet.mirror.layers.json.gz (25 FP32 convolutions, 18 Scale "
        "layers) and tests/fixtures/trt86-h100-more/dddet.rules.layers.json.gz (the 8 convolutions reading "
        "YOLOX's CSP outputs, an H100, 2026-11-27)",
        match=match_weighted_inputs,
        lint=LintSpec(
            Level.WARNING,
            "a weighted op with int8 weights reading a float activation runs FP32/FP16",
            PLACE + " (quantizes its input), or keep its weights float too",
            lint_weighted_inputs,
        ),
        aliases=("place-weighted-inputs",),
        ops=WEIGHTED_OPS,
        precedence=10,
    ),
    Pattern(
        "conv-epilogue",
        "A weighted op fuses the BatchNormalization, bias Add, constant Mul and activation (ReLU, SiLU, "
        "...) after it when no Q/DQ sits between them; a Q/DQ after the chain is its INT8 output, so "
        "outputs of weighted ops stay float unless a reader needs INT8.",
        f"{ORT}/resnet50_placed.explicit.layers.json (every Conv fused with its ReLU, INT8); "
        f"{EDGEQ}/yolo_edgeq.implicit.layers.json ('Conv + PWN(PWN(Sigmoid), Mul)'); {GUIDE} (do not "
        "quantize the outputs of weighted operations)",
        lint=LintSpec(
            Level.WARNING,
            "Q/DQ between a convolution (or residual Add) and its activation",
            PLACE + " (does not quantize weighted ops' outputs)",
            lint_conv_output,
        ),
        aliases=("place-no-output-q", "fuse-conv-output-quantized"),
        ops=ACTIVATION_OPS | {"BatchNormalization"},
        precedence=20,
    ),
    Pattern(
        "conv-act-maxpool",
        "Conv -> (BN) -> ReLU -> MaxPool with the ReLU read by the pool alone fuses as one CaskConvActPool "
        "when no Q/DQ sits between the ReLU and the pool: quantize after the pool. Clip and LeakyRelu are "
        "expected to behave like ReLU (unverified).",
        f"{ORT}/resnet50.implicit.layers.json and resnet50_placed.explicit.layers.json ('/conv1/Conv + "
        "/relu/Relu + /maxpool/MaxPool') vs resnet50_ortfb (separate layers); Clip/LeakyRelu unverified",
        match=match_conv_act_maxpool,
        lint=LintSpec(
            Level.WARNING,
            "Q/DQ between a convolution's ReLU and the MaxPool after it",
            PLACE + " (quantizes after the pool)",
            lint_relu_maxpool,
        ),
        engine=EngineSignature(
            "the baseline fuses Conv + activation + MaxPool into one layer; the candidate does not",
            fused=_maxpool_fused,
        ),
        aliases=("place-no-qdq-relu-maxpool", "fuse-relu-maxpool"),
        ops=fusion.POOL_FUSIBLE_ACTIVATIONS,
        precedence=60,
    ),
    Pattern(
        "residual-add",
        "A residual Add (and a ReLU after it) fuses into the convolution of its convolution branch when "
        "that branch is float and the skip is quantized: quantize the skip only. The branch with the longer "
        "path back to the inputs' common ancestor is the convolution branch.",
        f"{ORT}/resnet50_placed.explicit.layers.json (16 Adds fused) vs resnet50_ortfb.explicit.layers.json "
        "(Q/DQ on both inputs: 16 separate PointWiseV2, 0.73x implicit); NVIDIA ModelOpt graph_utils.py "
        "build_non_residual_input_map (longest path to the lowest common ancestor)",
        match=match_residual_add,
        lint=LintSpec(
            Level.WARNING,
            "Q/DQ on both inputs of a residual Add fed by a convolution",
            PLACE + " (quantizes only the skip branch)",
            lint_residual_add,
        ),
        engine=EngineSignature(
            "the residual Add runs as its own PointWise layer; the baseline fuses it into the convolution",
            unfused=_residual_unfused,
            fused=lambda v: bool({"Add", "Sum"} & v.ops) and bool(WEIGHTED & v.ops),
        ),
        tunable=True,
        aliases=("place-residual-skip-only", "conv-add-relu", "fuse-add-both-quantized"),
        ops=frozenset({"Add"}),
        precedence=70,
    ),
    Pattern(
        "pool-tail",
        "An averaging op (GlobalAveragePool) reading a convolution chain, whose result goes on to a "
        "weighted op (a classifier head), needs a Q/DQ on its input: left float, that convolution (with its "
        "Add and ReLU) ends FP16 and the pool runs FP16. AveragePool and ReduceMean are expected to behave "
        "the same (unverified). An SE block's squeeze is se-gate's.",
        f"{EDGEQ}/r50b64_edgeq.explicit.layers.json (last 'conv3 + Add + Relu' and GlobalAveragePool FP16) "
        "vs r50b64_tailfix.explicit.layers.json (55/55 INT8); AveragePool and ReduceMean unverified",
        match=match_pool_tail,
        lint=LintSpec(
            Level.WARNING,
            "averaging pool reading a quantized convolution chain in float",
            PLACE + " (quantizes the pool's input)",
            lint_pool_tail,
        ),
        engine=EngineSignature(
            "an averaging pool (or the convolution before it) runs wider than INT8", wide=_pool_wide
        ),
        tunable=True,
        aliases=("place-pool-tail", "pool-input-float", "fuse-pool-input-float"),
        ops=fusion.AVERAGING_OPS,
        precedence=90,
    ),
    Pattern(
        "hardswish-unfused",
        "TensorRT 8.6 does not fuse a HardSwish into a depthwise (grouped) convolution or a stem "
        "convolution (<= 4 input channels): the convolution ends in INT8 and the HardSwish runs as its own "
        "INT8 PointWise layer. Quantize the convolution's output (the HardSwish's input); left float, the "
        "convolution runs FP32/FP16 with its weights dequantized by a Scale layer and reformats around it.",
        f"{CORPUS}/mobilenet_v3_small.implicit.layers.json.gz and mobilenet_v3_large.implicit.layers.json.gz "
        "(an H100: all 17 depthwise convolutions and both stems INT8 with 'PWN(HardSwish)' a layer of its "
        "own; the 19 dense convolutions fuse it, 'Conv + PWN(HardSwish)') vs "
        "mobilenet_v3_small.static.layers.json.gz and mobilenet_v3_large.static.layers.json.gz (the output "
        "float: 8 and 9 depthwise convolutions FP32/FP16 behind reformats, their weights dequantized by "
        "'Scale' layers; 0.65x and 0.71x implicit by the profiles' sums); built with this entry: "
        "mobilenet_v3_small.hardswish-unfused.layers.json.gz (no FP16/FP32 compute layer, no reformat; "
        "0.92x that lease's implicit engine by the profiles' sums; not timed in paired rounds)",
        match=match_hardswish_unfused,
        ops=frozenset({"HardSwish"}),
        precedence=95,
    ),
)
