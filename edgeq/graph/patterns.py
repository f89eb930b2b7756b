"""Small, read-only graph-matching helpers on onnx-graphsurgeon graphs.

Lint rules and the Q/DQ placement engine ask the same questions of a graph: who produces this tensor,
who reads it, is it quantized (does it come out of a QuantizeLinear -> DequantizeLinear pair), what is
behind that pair, which scale does it carry. They live here, once, so that "quantized" means the same
thing to the rule that flags a placement and to the engine that makes one.

Vocabulary used throughout:

- a *Q/DQ pair* is ``QuantizeLinear -> DequantizeLinear`` with the Q's output read by the DQ;
- a tensor is *Q/DQ'd* when a DQ that belongs to a Q/DQ pair produces it (an activation fake-quant);
- a *weight DQ* is a DequantizeLinear whose input is a constant (pre-quantized weights or bias);
- *walking through* Q/DQ pairs means following the float tensor as if the pairs were not there.

Nothing here modifies the graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import onnx_graphsurgeon as gs
    from typing_extensions import TypeGuard  # typing.TypeGuard is 3.10+; only read by type checkers

QUANTIZE = "QuantizeLinear"
DEQUANTIZE = "DequantizeLinear"

# Operators whose INT8 input TensorRT uses directly: quantize their inputs (Developer Guide 8.6, "Q/DQ
# Layer-Placement Recommendations": quantize all inputs of weighted operations).
WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})

# Operators that only move or select data: a Q/DQ commutes through them, so the scale on their input is
# the scale on their output (TensorRT moves Q/DQ across them; Resize only in nearest mode, see
# ``preserves_scale``).
SCALE_PRESERVING_OPS = frozenset(
    {
        "MaxPool",
        "GlobalMaxPool",
        "Reshape",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Transpose",
        "Slice",
        "Split",
        "Identity",
        "Resize",
        "Upsample",
        "DepthToSpace",
        "SpaceToDepth",
        "Gather",
    }
)

# Pointwise activations TensorRT fuses into the convolution before them.
ACTIVATION_OPS = frozenset(
    {"Relu", "LeakyRelu", "Clip", "Elu", "Selu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Softplus"}
)


# --------------------------------------------------------------------------------------------------
# Producers, consumers, constants
# --------------------------------------------------------------------------------------------------


def producer(tensor: gs.Tensor) -> gs.Node | None:
    """The node that writes ``tensor``; None for graph inputs and initializers."""
    return tensor.inputs[0] if tensor.inputs else None


def consumers(tensor: gs.Tensor) -> list[gs.Node]:
    """Nodes that read ``tensor``, each once even if it reads it on several inputs."""
    seen: set[int] = set()
    out = []
    for n in tensor.outputs:
        if id(n) not in seen:
            seen.add(id(n))
            out.append(n)
    return out


def input_indices(node: gs.Node, tensor: gs.Tensor) -> list[int]:
    """Which inputs of ``node`` are ``tensor`` (a node may read one tensor twice: ``Mul(x, x)``)."""
    return [i for i, t in enumerate(node.inputs) if t is tensor]


def is_op(node: gs.Node | None, *ops: str) -> TypeGuard[gs.Node]:
    return node is not None and node.op in ops and is_standard(node)


def is_standard(node: gs.Node) -> bool:
    """Is ``node`` in the default ONNX domain (graphsurgeon leaves ``domain`` None there)?"""
    return node.domain in (None, "", "ai.onnx")


def is_quantize(node: gs.Node | None) -> TypeGuard[gs.Node]:
    return is_op(node, QUANTIZE)


def is_dequantize(node: gs.Node | None) -> TypeGuard[gs.Node]:
    return is_op(node, DEQUANTIZE)


def constant_value(tensor: gs.Tensor | None) -> np.ndarray | None:
    """The value of an initializer or a ``Constant`` node's output; None for computed tensors.

    Only call it for small tensors (scales, zero-points, shapes): it materialises the array.
    """
    import numpy as np
    import onnx_graphsurgeon as gs

    if tensor is None or (isinstance(tensor, gs.Variable) and tensor.name == "" and not tensor.inputs):
        return None
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    p = producer(tensor)
    if (
        p is not None
        and p.op == "Constant"
        and "value" in p.attrs
        and isinstance(p.attrs["value"], gs.Constant)
    ):
        return np.asarray(p.attrs["value"].values)
    return None


def is_constant(tensor: gs.Tensor | None) -> bool:
    """True for initializers and ``Constant`` outputs, without reading their values."""
    import onnx_graphsurgeon as gs

    if tensor is None:
        return False
    if isinstance(tensor, gs.Constant):
        return True
    p = producer(tensor)
    return p is not None and p.op == "Constant"


def constant_dtype(tensor: gs.Tensor) -> Any:
    """The element type of a tensor (numpy dtype or onnx enum), a constant's without reading its values.

    A ``Constant`` node's output Variable may carry no dtype of its own; its value does.
    """
    import onnx_graphsurgeon as gs

    if isinstance(tensor, gs.Constant):
        return tensor.dtype
    p = producer(tensor)
    if p is not None and p.op == "Constant" and isinstance(p.attrs.get("value"), gs.Constant):
        return p.attrs["value"].dtype
    return getattr(tensor, "dtype", None)


def dtype_name(dtype: Any) -> str | None:
    """A dtype as numpy spells it (``float32``, ``int8``); onnx-only types by their onnx name."""
    import numpy as np

    if dtype is None:
        return None
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        import onnx

        try:
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype)).name
        except (KeyError, TypeError, ValueError):
            return onnx.TensorProto.DataType.Name(dtype).lower()
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype).lower()


def iter_nodes(graph: gs.Graph, *, subgraphs: bool = True) -> Iterator[gs.Node]:
    """Every node, including those in If/Loop/Scan bodies when ``subgraphs``."""
    import onnx_graphsurgeon as gs

    for n in graph.nodes:
        yield n
        if not subgraphs:
            continue
        for v in n.attrs.values():
            for body in v if isinstance(v, list) else [v]:
                if isinstance(body, gs.Graph):
                    yield from iter_nodes(body, subgraphs=True)


def node_label(node: gs.Node) -> str:
    """A node's name, or ``Op(first output)`` when the exporter left it unnamed."""
    if node.name:
        return node.name
    first = node.outputs[0].name if node.outputs else "?"
    return f"{node.op}({first})"


# --------------------------------------------------------------------------------------------------
# Q/DQ
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QDQPair:
    """A QuantizeLinear and the DequantizeLinear that reads it."""

    q: gs.Node
    dq: gs.Node

    @property
    def names(self) -> tuple[str, str]:
        return node_label(self.q), node_label(self.dq)


@dataclass(frozen=True)
class QParams:
    """Scale, zero-point and axis of a Q or DQ node, as constants (None when computed at run time).

    ``zero_point_dtype`` is the quantized type: the zero-point's dtype, or ``uint8`` when the zero-point
    is absent (the ONNX default), or None when it is not a constant.
    """

    scale: np.ndarray | None
    zero_point: np.ndarray | None
    zero_point_dtype: str | None
    axis: int | None

    @property
    def per_tensor(self) -> bool:
        return self.scale is not None and self.scale.size == 1


def qparams(node: gs.Node) -> QParams:
    """Scale/zero-point/axis of a QuantizeLinear or DequantizeLinear node."""
    scale = constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
    zp_t = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2].name else None
    zp_dtype: str | None
    if zp_t is None:
        zp, zp_dtype = None, "uint8"
        if is_dequantize(node):
            # DQ's quantized type is its input's type; without a zero-point that is what the data says.
            zp_dtype = dtype_name(constant_dtype(node.inputs[0])) or "uint8"
    else:
        zp = constant_value(zp_t)
        zp_dtype = dtype_name(constant_dtype(zp_t))
    axis = node.attrs.get("axis", 1)
    return QParams(scale=scale, zero_point=zp, zero_point_dtype=zp_dtype, axis=axis)


def qdq_pair_of(tensor: gs.Tensor) -> QDQPair | None:
    """The Q/DQ pair that produces ``tensor`` (``x -> Q -> DQ -> tensor``), if any."""
    dq = producer(tensor)
    if not is_dequantize(dq):
        return None
    q = producer(dq.inputs[0])
    return QDQPair(q, dq) if is_quantize(q) else None


def is_qdq(tensor: gs.Tensor) -> bool:
    """Is ``tensor`` the output of an activation Q/DQ pair?"""
    return qdq_pair_of(tensor) is not None


def is_weight_dq(node: gs.Node) -> bool:
    """A DequantizeLinear of a constant: pre-quantized weights or bias."""
    return is_dequantize(node) and is_constant(node.inputs[0])


def skip_qdq_up(tensor: gs.Tensor) -> tuple[gs.Tensor, list[QDQPair]]:
    """Walk back through Q/DQ pairs: the float tensor they quantize, and the pairs crossed (nearest first)."""
    crossed: list[QDQPair] = []
    pair = qdq_pair_of(tensor)
    while pair is not None:
        crossed.append(pair)
        tensor = pair.q.inputs[0]
        pair = qdq_pair_of(tensor)
    return tensor, crossed


def skip_qdq_down(tensor: gs.Tensor) -> list[tuple[gs.Node, int, list[QDQPair]]]:
    """Readers of ``tensor`` as if Q/DQ pairs were not there: ``(node, input index, pairs crossed)``.

    A Q whose output is read by something other than a DQ is itself returned as a reader.
    """
    out: list[tuple[gs.Node, int, list[QDQPair]]] = []

    def visit(t: gs.Tensor, crossed: list[QDQPair]) -> None:
        for n in consumers(t):
            if is_quantize(n) and n.inputs[0] is t and n.outputs and n.outputs[0].outputs:
                readers = consumers(n.outputs[0])
                if all(is_dequantize(r) for r in readers):
                    for dq in readers:
                        visit(dq.outputs[0], [*crossed, QDQPair(n, dq)])
                    continue
            for i in input_indices(n, t):
                out.append((n, i, crossed))

    visit(tensor, [])
    return out


def real_producer(tensor: gs.Tensor, through: Iterable[str] = ()) -> gs.Node | None:
    """The producer after walking back through Q/DQ pairs and single-input ops in ``through``."""
    through = frozenset(through)
    seen: set[int] = set()
    while True:
        tensor, _ = skip_qdq_up(tensor)
        p = producer(tensor)
        if p is None or p.op not in through or id(p) in seen:
            return p
        seen.add(id(p))
        tensor = p.inputs[0]


def silu_input(mul: gs.Node) -> gs.Tensor | None:
    """For ``Mul(x, Sigmoid(x))`` (SiLU / Swish), the float ``x``; Q/DQ pairs anywhere inside are seen
    through. None when ``mul`` is not a SiLU."""
    if not is_op(mul, "Mul") or len(mul.inputs) != 2:
        return None
    a, b = (skip_qdq_up(t)[0] for t in mul.inputs)
    for sig_out, other in ((a, b), (b, a)):
        sig = producer(sig_out)
        if is_op(sig, "Sigmoid") and skip_qdq_up(sig.inputs[0])[0] is other:
            return other
    return None


def preserves_scale(node: gs.Node) -> bool:
    """Does a Q/DQ commute through ``node`` (same scale in and out)?"""
    if node.op not in SCALE_PRESERVING_OPS:
        return False
    if node.op in ("Resize", "Upsample"):
        return str(_attr_str(node.attrs.get("mode", "nearest"))) == "nearest"
    return True


def moves_data(node: gs.Node) -> bool:
    """Data movement a Q/DQ commutes across: a Concat or a scale-preserving op (the one list placement,
    the mirror, float-entry and lint read)."""
    return node.op == "Concat" or preserves_scale(node)


def is_float(t: gs.Tensor) -> bool:
    """An activation or weight of a floating-point type (unknown dtype: no)."""
    import numpy as np

    try:
        return t.dtype is not None and np.issubdtype(np.dtype(t.dtype), np.floating)
    except TypeError:
        return False


def var_inputs(node: gs.Node) -> list[gs.Tensor]:
    """The inputs of ``node`` that are activations: named, not constants."""
    return [t for t in node.inputs if t.name and not is_constant(t)]


def moved_inputs(node: gs.Node) -> list[gs.Tensor]:
    """The activations data movement moves: every input of a Concat, the first of any other op (the
    rest are shapes, starts, axes)."""
    ins = var_inputs(node)
    return ins if node.op == "Concat" else ins[:1]


def scale_source(tensor: gs.Tensor) -> gs.Node | None:
    """The first producer behind ``tensor`` that is not scale-preserving, looking back through the
    scale-preserving ops on the way (their first input); None at a graph input or initializer, a cycle,
    or a scale-preserving op without inputs. One walk, so ``upstream_dq`` and ``fusion.concat_behind``
    agree on what data movement a scale crosses."""
    seen: set[int] = set()
    while True:
        p = producer(tensor)
        if p is None or id(p) in seen:
            return None
        seen.add(id(p))
        if not preserves_scale(p):
            return p
        if not p.inputs:
            return None
        tensor = p.inputs[0]


def upstream_dq(tensor: gs.Tensor) -> gs.Node | None:
    """The activation DQ whose scale ``tensor`` carries, looking back through scale-preserving ops."""
    p = scale_source(tensor)
    return p if is_dequantize(p) and not is_constant(p.inputs[0]) else None


def same_scale(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Two constant scales equal to float32 precision (None never equals anything)."""
    import numpy as np

    if a is None or b is None or (a.shape != b.shape and a.size != b.size):
        return False
    return bool(
        np.allclose(np.asarray(a, np.float32).ravel(), np.asarray(b, np.float32).ravel(), rtol=1e-6, atol=0)
    )


def _attr_str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
