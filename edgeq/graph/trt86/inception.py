"""Merged 1x1 convolutions: Inception's INT8 outputs, and a detection head's INT8 inputs, fail the explicit
build on TensorRT 8.6.

An Inception block's 1x1 convolutions read the block's input side by side, and TensorRT merges them into
one layer (``A || B || C`` in the layer JSON of GoogLeNet's and Inception-v3's implicit engines). The rules'
Q/DQ model, with each of their outputs INT8 at its own scale, failed to build on both networks with the
same internal error; the mirror of each implicit engine, which read those outputs float (the merged layer's
output has no ONNX name, so the mirror could not keep it INT8) and differs from the rules little elsewhere,
built. So this entry keeps the merged convolutions' outputs float: with it the rules' models of both built
(an H200, 2026-11-26, and an H100), but ran 0.40x and 0.44x implicit (an H100, paired rounds): the
convolutions reading those float outputs with INT8 weights run FP32. The Inception
pool branch (a stride-1 pool beside the merged convolutions, a convolution after it) is where the builds
failed; ``quantize`` says so and ``--placement auto`` (a target) decides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from edgeq.findings import Level
from edgeq.graph import fusion
from edgeq.graph.facts import Decisions, Hit, LintSpec, Match, Pattern, Want, edge
from edgeq.graph.patterns import (
    is_op,
    iter_nodes,
    node_label,
    producer,
    silu_input,
    skip_qdq_down,
    skip_qdq_up,
)
from edgeq.graph.trt86.common import float_of
from edgeq.text import plural

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

RULE = "inception-build"
BUILD_ASSERT = "chooseHigherPrecision"
CORPUS = "tests/fixtures/trt86-h100-corpus"
MORE = "tests/fixtures/trt86-h100-more"
MORE_H200 = "tests/fixtures/trt86-h200-more"
H200 = "tests/fixtures/trt86-h200-corpus"
MIRRORS = (
    f"{CORPUS}/googlenet.mirror.layers.json.gz and inception_v3.mirror.layers.json.gz (the mirrors, the "
    "merged convolutions' outputs float, FP16 in the engine: both built, an H100, 2026-11-26; GoogLeNet's "
    "0.78x implicit by its run log)"
)
EVIDENCE = (
    f"measured: {CORPUS}/googlenet.static.build-errors.log.gz and inception_v3.static.build-errors.log.gz "
    "(torchvision GoogLeNet and Inception-v3, the rules' Q/DQ, an H100, 2026-11-26: 'graphOptimizer.cpp::"
    "chooseHigherPrecision ... Assertion dt1 == DataType::kFLOAT || dt1 == DataType::kHALF'; both implicit "
    f"engines build, {CORPUS}/googlenet.implicit.layers.json.gz merges the 1x1 branches into one layer "
    "'... || ...'); tests/fixtures/trt86-h200-i28/inception.main.int8.build.log.gz (the zoo's "
    "inception_like, an H200: the same error) vs inception_b.main.int8.build.log.gz (the reduction block, "
    f"no pool branch beside 1x1 convolutions: builds) vs {MIRRORS}; {H200}/googlenet.mirror.build-errors."
    "log.gz and inception_v3.mirror.build-errors.log.gz (the mirrors with the merged outputs float but their "
    "readers' weights FP32 under an INT8 output, an H200, 2026-11-26: the same error); built with this "
    f"entry: {H200}/googlenet.static.layers.json.gz and inception_v3.static.layers.json.gz (the rules' "
    "models, the same H200 lease; 19 and 23 FP16/FP32 layers, not timed); unverified: that those outputs "
    "are what trips the builder; timed: tests/fixtures/trt86-h100-corpus2/timed.json (GoogLeNet and "
    "Inception-v3, an H100, 2026-11-26, 3 paired rounds: static 0.396x and 0.438x implicit, the mirrors, "
    "built with the readers' INT8 weights kept, 0.397x and 0.436x; googlenet.mirror.layers.json.gz: 18 "
    "Scale layers dequantizing weights at run time, 25 FP32 convolutions)"
)
SILU_EVIDENCE = (
    f"measured on ddddocr's YOLOX detector ({MORE}/dddet.skel.onnx.gz), an H100, TensorRT 8.6.0: "
    "dddet.implicit.layers.json.gz (2026-11-26: the two 1x1 convolutions of each of its 8 CSP layers read "
    "one tensor and meet in a Concat, each with a SiLU; every one runs as its own 'Conv + PWN(Sigmoid, "
    "Mul)' INT8 layer, none merged, while its head's 1x1 pairs without a SiLU merge) vs "
    "dddet.rules.layers.json.gz (2026-11-27: the rules' model with those outputs float as merged ones: 37 "
    "FP32 and 4 FP16 compute layers, 41 interior reformats, the convolutions reading them FP32). "
    "Unverified: the rules' model with those outputs INT8 was not built"
)
_POOLS = ("MaxPool", "AveragePool")


def _stride_one(node: gs.Node) -> bool:
    return all(int(s) == 1 for s in node.attrs.get("strides", [1, 1]))


def pool_branches(graph: gs.Graph) -> list[tuple[gs.Node, list[gs.Node], list[gs.Node]]]:
    """(pool, the convolutions after it, its sibling convolutions) for each Inception pool branch,
    seen through Q/DQ pairs (the same branches in the float and the Q/DQ model)."""
    out = []
    for n in iter_nodes(graph, subgraphs=False):
        if not any(is_op(n, op) for op in _POOLS) or not n.inputs or not n.outputs or not _stride_one(n):
            continue
        x = float_of(n.inputs[0])
        siblings = [r for r, _, _ in skip_qdq_down(x) if is_op(r, "Conv") and r is not n]
        after = [r for r, _, _ in skip_qdq_down(n.outputs[0]) if is_op(r, "Conv")]
        if len(siblings) >= 2 and after:
            out.append((n, after, siblings))
    return out


def _one_by_one(node: gs.Node) -> bool:
    """A plain 1x1 stride-1 convolution without a SiLU after it: what TensorRT merges with its siblings."""
    w = node.inputs[1] if len(node.inputs) > 1 else None
    shape = getattr(w, "shape", None) or ()
    return (is_op(node, "Conv") and _stride_one(node) and int(node.attrs.get("group", 1)) == 1
            and len(shape) == 4 and tuple(shape[2:]) == (1, 1) and not _silu_after(node))


def _silu_after(conv: gs.Node) -> bool:
    """A SiLU reads the convolution's output (after its BN; through a Q/DQ pair too). TensorRT 8.6 runs
    each such convolution fused with its SiLU as a layer of its own instead of merging it with its
    siblings (``SILU_EVIDENCE``: a YOLOX's CSP layers), so its output is an ordinary INT8 one."""
    tail = [conv, *fusion.epilogue(conv)]
    if any(silu_input(n) is not None for n in tail):
        return True
    return any(silu_input(r) is not None for r, _, _ in skip_qdq_down(tail[-1].outputs[0])) \
        if tail[-1].outputs else False


def _below(t: gs.Tensor, depth: int, through: Callable[[gs.Node], bool]) -> tuple[list[gs.Node], bool]:
    """The nodes reading ``t``'s value within ``depth`` steps (through Q/DQ pairs), breadth first, walking
    on past those ``through`` accepts; and whether the walk ended within ``depth``."""
    found: list[gs.Node] = []
    frontier, seen = [t], set()
    for _ in range(depth):
        nxt = []
        for x in frontier:
            for r, _, _ in skip_qdq_down(x):
                if r.name in seen:
                    continue
                seen.add(r.name)
                found.append(r)
                if through(r):
                    nxt += list(r.outputs)
        if not nxt:
            return found, True
        frontier = nxt
    return found, False


def _concats_below(t: gs.Tensor, depth: int = 16) -> set[str]:
    """The Concat nodes reachable from ``t`` within ``depth`` nodes (an Inception branch's end)."""
    return {r.name for r in _below(t, depth, lambda r: not is_op(r, "Concat"))[0] if is_op(r, "Concat")}


def merged_convolutions(graph: gs.Graph) -> list[tuple[gs.Tensor, list[gs.Node]]]:
    """(block input, its 1x1 convolutions) where two or more plain 1x1 convolutions read one tensor and
    their branches meet in one Concat: the convolutions TensorRT merges into one layer."""
    out = []
    seen: set[str] = set()
    for n in iter_nodes(graph, subgraphs=False):
        if not _one_by_one(n) or not n.inputs:
            continue
        x = float_of(n.inputs[0])
        if x.name in seen:
            continue
        seen.add(x.name)
        convs = [r for r, _, _ in skip_qdq_down(x) if _one_by_one(r)]
        if len(convs) < 2:
            continue
        common = set.intersection(*(_concats_below(_output(c)) for c in convs))
        if common:
            out.append((x, convs))
    return out


def _output(conv: gs.Node) -> gs.Tensor:
    """The convolution's output after the epilogue TensorRT fuses into it (BN, ReLU)."""
    tail = fusion.epilogue(conv)
    return (tail[-1] if tail else conv).outputs[0]


def match_pool_branch(graph: gs.Graph) -> list[Match]:
    out = [Match(RULE, pool.name, (pool.name, *(c.name for c in after)))
           for pool, after, _ in pool_branches(graph)]
    for _, convs in merged_convolutions(graph):
        floats = tuple(edge(t, r, Want.FLOAT) for t in map(_output, convs) for r, _, _ in skip_qdq_down(t))
        out.append(Match(RULE, convs[0].name, tuple(c.name for c in convs), floats))
    return out


def lint_pool_branch(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """Merged 1x1 convolutions with INT8 outputs beside a pool branch: the Q/DQ model that failed on 8.6."""
    pools = {x.name for pool, _, _ in pool_branches(graph) for x in (float_of(pool.inputs[0]),)}
    hits = [convs for x, convs in merged_convolutions(graph)  # an output read through a Q/DQ pair: INT8
            if x.name in pools and any(pairs for c in convs for _, _, pairs in skip_qdq_down(_output(c)))]
    if not hits:
        return []
    return [Hit(
        f"{plural(len(hits), 'Inception block', 'Inception blocks')} with the merged 1x1 convolutions' "
        f"outputs INT8 ('{node_label(hits[0][0])}' and its siblings): "
        f"TensorRT 8.6 failed these builds ('{BUILD_ASSERT} ... Assertion dt1 == DataType::kFLOAT || dt1 == "
        "DataType::kHALF')",
        tuple(dict.fromkeys(node_label(c) for convs in hits for c in convs)))]


def known_failure_line(graph: gs.Graph) -> str | None:
    """The one line ``quantize`` prints for a network with Inception pool branches."""
    n = len(pool_branches(graph))
    if not n:
        return None
    return (f"{plural(n, 'Inception pool branch', 'Inception pool branches')}: TensorRT 8.6 failed "
            f"building the rules' Q/DQ of such blocks; the merged 1x1 convolutions' outputs are kept float "
            f"as in the models that built (edgeq rules {RULE}), and on the measured H100 such models ran "
            "0.40x-0.44x the implicit engine's speed (GoogLeNet, Inception-v3): deploy with a target, where "
            "--placement auto decides")


# A detection head's last 1x1 convolutions merged the same way: YOLOX's decoupled head (reg_preds and
# obj_preds read one feature map; "Conv_261 || Conv_262" in its implicit engine, INT8 in, FP32 out). The
# rules' Q/DQ model, those outputs float already, failed with the same assertion; one model per variant
# told the head's merged pairs from the Focus stem, the SPP pools, the Resizes and the class convolutions:
# only the variants with the merged pairs reading float got past graph optimization.
HEAD_RULE = "merged-head"
HEAD_EVIDENCE = (
    f"measured on ddddocr's YOLOX detector (an H100, TensorRT 8.6.0, 2026-11-26): {MORE}/"
    "dddet.static.agent-build.json and dddet.v0.build.log.gz (the rules' Q/DQ: "
    f"'{BUILD_ASSERT}'); dddet.v1/v2/v3/v5/v8 (the Focus slices, the SPP pools, both, the Resizes, the "
    "class convolutions read float: the same failure); dddet.v4, v6 and v7 (the head's convolutions, all "
    "of those, or only its merged pairs read float: past graph optimization, into tactic timing); each "
    "variant's "
    "--overrides file beside its log; dddet.implicit.layers.json.gz ('Conv_261 || Conv_262'). "
    "dddet.rules.build.log.gz: the rules' model with this entry built ('Engine built in 339.444 sec.'); "
    f"{MORE_H200}/dddet.rules.layers.json.gz and dddet.paired.trtexec.txt (an H200, 2026-11-27: built "
    "through deploy, 0.95x-0.97x implicit); its dddet.implicit.layers.json.gz ran the pairs INT8 in too, "
    "and its mirror with Q/DQ there was stopped by lint (dddet.mirror.lint.json): the mirror keeps them "
    "float as the rules do. Unverified: why GoogLeNet's merged convolutions build reading INT8 where these "
    "do not"
)


_WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def _reaches_outputs_only(t: gs.Tensor, graph: gs.Graph, depth: int = 24) -> bool:
    """``t`` flows to the graph's outputs through no weighted op (a head's last convolution): its value
    is an answer, not a feature another layer reads."""
    outputs = {skip_qdq_up(o)[0].name for o in graph.outputs}  # a Q/DQ model's outputs: the float behind
    readers, ended = _below(t, depth, lambda r: r.op not in _WEIGHTED)
    if not ended or any(r.op in _WEIGHTED for r in readers):
        return False
    return t.name in outputs or any(o.name in outputs for r in readers for o in r.outputs)


def merged_heads(graph: gs.Graph) -> list[tuple[gs.Tensor, list[gs.Node]]]:
    """The merged 1x1 convolutions (``merged_convolutions``) whose outputs are all answers."""
    return [(x, convs) for x, convs in merged_convolutions(graph)
            if all(_reaches_outputs_only(_output(c), graph) for c in convs)]


def match_merged_head(graph: gs.Graph) -> list[Match]:
    return [Match(HEAD_RULE, convs[0].name, tuple(c.name for c in convs),
                  tuple(edge(x, c, Want.FLOAT) for c in convs)) for x, convs in merged_heads(graph)]


def lint_merged_head(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """A merged head pair reading INT8 (its input through a Q/DQ pair, or int8 weights): the build that
    failed."""
    hits = []
    for x, convs in merged_heads(graph):
        int8_in = any(pairs for _, _, pairs in skip_qdq_down(x))
        int8_w = any(len(c.inputs) > 1 and is_op(producer(c.inputs[1]), "DequantizeLinear") for c in convs)
        if int8_in or int8_w:
            hits.append(convs)
    if not hits:
        return []
    return [Hit(
        f"{plural(len(hits), 'merged head pair')} reading INT8 ('{node_label(hits[0][0])}' and its sibling, "
        f"merged into one layer): TensorRT 8.6 failed this build ('{BUILD_ASSERT} ... Assertion dt1 == "
        "DataType::kFLOAT || dt1 == DataType::kHALF')",
        tuple(dict.fromkeys(node_label(c) for convs in hits for c in convs)))]


PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        RULE,
        "Two or more plain 1x1 convolutions reading one tensor, their branches meeting in a Concat (an "
        "Inception block), run as one merged layer; with each output INT8 the Q/DQ models of GoogLeNet and "
        f"Inception-v3 failed to build on 8.6 with '{BUILD_ASSERT}', and their mirrors, those outputs float, "
        "built: keep the merged convolutions' outputs float. The convolutions still read INT8, and their "
        "readers keep INT8 weights (mirrors with those FP32 failed the same way). A convolution with a SiLU "
        "after it is not merged (a CSP layer's pair, as in YOLOX): TensorRT fuses each with its SiLU, INT8 "
        "out, so this entry leaves it alone.",
        f"{EVIDENCE}; not merged: {SILU_EVIDENCE}",
        match=match_pool_branch,
        lint=LintSpec(
            Level.ERROR,
            "Inception blocks with the merged 1x1 convolutions' outputs INT8: the TensorRT 8.6 build fails",
            "run `edgeq quantize` on the float model (keeps them float), or deploy with a target",
            lint_pool_branch,
        ),
        ops=frozenset({*_POOLS, "Conv"}),
        build_error=BUILD_ASSERT,
        note=known_failure_line,
        precedence=150,
    ),
    Pattern(
        HEAD_RULE,
        "A detection head's last 1x1 convolutions that read one tensor (YOLOX's box and objectness "
        "predictions) run as one merged layer; reading INT8, the rules' Q/DQ model of a YOLOX failed to "
        f"build on 8.6 with '{BUILD_ASSERT}' though their outputs were float: they read float, with float "
        "weights (FP16 or FP32 in the engine; the implicit engines ran them INT8 in, FP32 out, and a "
        "mirror of one keeps them float as the rules do).",
        HEAD_EVIDENCE,
        match=match_merged_head,
        lint=LintSpec(
            Level.ERROR,
            "a detection head's merged 1x1 convolutions reading INT8: the TensorRT 8.6 build fails",
            "run `edgeq quantize` on the float model (keeps them float), or deploy with a target",
            lint_merged_head,
        ),
        ops=frozenset({"Conv"}),
        floats_nodes=True,
        build_error=BUILD_ASSERT,  # inception-build's too: the model built tells them apart (its lint)
        precedence=155,
    ),
)
