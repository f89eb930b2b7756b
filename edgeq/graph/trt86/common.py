"""What the pattern families share: fixture paths, seeing through Q/DQ, edges, INT8 checks on Q/DQ graphs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from edgeq.graph import fusion
from edgeq.graph.facts import Edge, LayerView, Want
from edgeq.graph.patterns import (
    WEIGHTED_OPS,
    QDQPair,
    is_constant,
    is_float,
    skip_qdq_down,
    skip_qdq_up,
    upstream_dq,
)

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

# Evidence: real TensorRT 8.6.0 engines under tests/fixtures (README there says what each shows).
ORT = "tests/fixtures/trt86-h200"
EDGEQ = "tests/fixtures/trt86-h200-edgeq"
ZOO = "tests/fixtures/trt86-h100-zoo"
GUIDE = "TensorRT 8.6 Developer Guide, Explicit Quantization, 'Q/DQ Layer-Placement Recommendations'"
PLACE = "run `edgeq quantize` on the float model"
FLOAT_PRECISIONS = ("FP32", "FP16")  # the float precisions TensorRT 8.6 runs a layer in besides INT8 (the
# layer JSON's data types, BF16 included: edgeq.report.parse.FLOAT_DTYPES)
WEIGHTED = frozenset(WEIGHTED_OPS)


def float_of(t: gs.Tensor) -> gs.Tensor:
    return skip_qdq_up(t)[0]


def data_inputs(node: gs.Node) -> list[gs.Tensor]:
    """Float activation inputs of a weighted op, seen through Q/DQ (not weights or bias)."""
    out = []
    for i, t in enumerate(node.inputs):
        if not t.name or is_constant(t) or (i > 0 and fusion.has_weight(node) and i in (1, 2)):
            continue
        f = float_of(t)
        if not is_constant(f) and is_float(f) and f not in out:
            out.append(f)
    return out


def edge_of(t: gs.Tensor, n: gs.Node, want: Want) -> Edge:
    return Edge(float_of(t).name, n.name, want)


def quantized(tensor: gs.Tensor) -> bool:
    """Does ``tensor`` carry INT8 into its reader: a Q/DQ pair on it, or a DQ behind data movement?"""
    return upstream_dq(tensor) is not None


def pair_names(pairs: Iterable[QDQPair]) -> list[str]:
    out: list[str] = []
    for p in pairs:
        out.extend(n for n in p.names if n not in out)
    return out


def reads(node: gs.Node, f: gs.Tensor) -> list[gs.Tensor]:
    """The inputs of ``node`` that carry the float tensor ``f`` (itself or a Q/DQ of it)."""
    return [t for t in node.inputs if t.name and float_of(t) is f]


def readers_inputs(t: gs.Tensor) -> list[gs.Tensor]:
    """The tensors readers of ``t`` see (``t`` itself or the DQ output after a Q/DQ pair)."""
    out = []
    for r, i, _ in skip_qdq_down(t):
        out.append(r.inputs[i])
    return out


def tensor_named(graph: gs.Graph, name: str) -> gs.Tensor:
    return graph.tensors()[name]


def pointwise_layer(v: LayerView) -> bool:
    return v.kind == "compute" and v.pointwise
