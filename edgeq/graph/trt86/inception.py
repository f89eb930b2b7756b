"""Inception's pool branch: the rules' Q/DQ model of a network with one fails to build on TensorRT 8.6.

The branch: a stride-1 MaxPool or AveragePool reading a block's input that two or more convolutions read
too (Inception's 1x1 branches, which TensorRT merges into one layer), with a convolution after the pool.
Every network that had one failed its explicit build with the same internal error, and the one block
measured without one built; which Q/DQ in it TensorRT trips on is not known yet, so this entry places
nothing: it names the branches, so ``quantize`` and ``lint`` say the build will fail and deploy's failed
build names the block, and ``--placement auto`` (a target) ships the implicit engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeq.findings import Level
from edgeq.graph.facts import Decisions, Hit, LintSpec, Match, Pattern
from edgeq.graph.patterns import is_op, iter_nodes, node_label, skip_qdq_down
from edgeq.graph.trt86.common import float_of, quantized
from edgeq.text import plural

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

RULE = "inception-build"
BUILD_ASSERT = "chooseHigherPrecision"
CORPUS = "tests/fixtures/trt86-h100-corpus"
EVIDENCE = (
    f"measured: {CORPUS}/googlenet.static.build-errors.log.gz and inception_v3.static.build-errors.log.gz "
    "(torchvision GoogLeNet and Inception-v3, the rules' Q/DQ, an H100, 2026-11-26: 'graphOptimizer.cpp::"
    "chooseHigherPrecision ... Assertion dt1 == DataType::kFLOAT || dt1 == DataType::kHALF'; both implicit "
    f"engines build, {CORPUS}/googlenet.implicit.layers.json.gz merges the 1x1 branches into one layer "
    "'... || ...'); tests/fixtures/trt86-h200-i28/inception.main.int8.build.log.gz (the zoo's "
    "inception_like, an H200: the same error) vs inception_b.main.int8.build.log.gz (the reduction block, "
    "no pool branch beside 1x1 convolutions: builds). Unverified: which Q/DQ of the branch trips the builder"
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


def match_pool_branch(graph: gs.Graph) -> list[Match]:
    return [Match(RULE, pool.name, (pool.name, *(c.name for c in after)))
            for pool, after, _ in pool_branches(graph)]


def lint_pool_branch(graph: gs.Graph, matches: list[Match], decisions: Decisions) -> list[Hit]:
    """Quantized pool branches: the Q/DQ model will not build on 8.6 (float ones: no finding)."""
    hits = [(pool, after) for pool, after, siblings in pool_branches(graph)
            if quantized(pool.inputs[0]) or any(quantized(s.inputs[0]) for s in siblings)]
    if not hits:
        return []
    return [Hit(
        f"{plural(len(hits), 'Inception pool branch', 'Inception pool branches')} with Q/DQ "
        f"('{node_label(hits[0][0])}' and its convolutions): "
        f"TensorRT 8.6 fails this build ('{BUILD_ASSERT} ... Assertion dt1 == DataType::kFLOAT || dt1 == "
        "DataType::kHALF')",
        tuple(dict.fromkeys(node_label(x) for pool, after in hits for x in (pool, *after))))]


def known_failure_line(graph: gs.Graph) -> str | None:
    """The one line ``quantize`` prints where the rules' output of ``graph`` is known not to build."""
    n = len(pool_branches(graph))
    if not n:
        return None
    return (f"TensorRT 8.6 is known to fail building this Q/DQ model "
            f"({plural(n, 'Inception pool branch', 'Inception pool branches')}, "
            f"edgeq rules {RULE}): deploy with a target, where --placement auto ships the implicit engine")


PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        RULE,
        "A network with an Inception pool branch (a stride-1 MaxPool or AveragePool reading a block input "
        "that two or more convolutions also read, a convolution after it) fails its Q/DQ build on 8.6 with "
        f"'{BUILD_ASSERT}'; its implicit engine builds. No placement is known to build yet: the entry places "
        "nothing, names the branches, and a target decides.",
        EVIDENCE,
        match=match_pool_branch,
        lint=LintSpec(
            Level.ERROR,
            "Inception pool branches with Q/DQ: the TensorRT 8.6 build fails",
            "deploy with a target (--placement auto, or implicit): the implicit engine builds",
            lint_pool_branch,
        ),
        ops=frozenset(_POOLS),
        build_error=BUILD_ASSERT,
        note=known_failure_line,
        precedence=150,
    ),
)
