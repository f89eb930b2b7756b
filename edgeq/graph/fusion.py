"""The walkers the TensorRT 8.6 patterns share: read-only questions about a graph's structure.

"Which convolution's fused chain writes this tensor", "which input of this Add is the convolution
branch", "is this a SiLU", "which Concat is behind this tensor": each answered once here, and asked by the
pattern entries (``edgeq.graph.trt86``), so placement and lint cannot disagree about what a residual
Add's branch or a convolution that reads a Concat means. The walkers see through Q/DQ pairs, so they
answer the same on a float model (before placement) and on a Q/DQ model (what lint reads). The facts
themselves, with their evidence, are the registry's entries.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from edgeq.graph.patterns import (
    ACTIVATION_OPS,
    WEIGHTED_OPS,
    consumers,
    is_constant,
    is_dequantize,
    is_op,
    is_standard,
    preserves_scale,
    producer,
    scale_source,
    silu_input,
    skip_qdq_down,
    skip_qdq_up,
    var_inputs,
)

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

# conv-act-maxpool: activations that fuse between a convolution and a MaxPool (ReLU measured).
POOL_FUSIBLE_ACTIVATIONS = frozenset({"Relu", "Clip", "LeakyRelu"})
# pool-tail: averaging ops that read a convolution chain (GlobalAveragePool measured).
AVERAGING_OPS = frozenset({"GlobalAveragePool", "AveragePool", "ReduceMean"})
# Binary ops with one constant input that fuse into a convolution's epilogue (bias, scale).
_EPILOGUE_BINARY = frozenset({"Add", "Sub", "Mul", "Div"})


# --------------------------------------------------------------------------------------------------
# Walkers (read-only; they see through Q/DQ pairs)
# --------------------------------------------------------------------------------------------------


def has_weight(node: gs.Node) -> bool:
    """A weighted op whose second input is a constant or a DQ of one (a layer with weights, not a
    MatMul of two activations)."""
    if not (node.op in WEIGHTED_OPS and is_standard(node) and len(node.inputs) > 1):
        return False
    w = node.inputs[1]
    if is_constant(w):
        return True
    p = producer(w)
    return is_dequantize(p) and is_constant(p.inputs[0])


def _one_variable_input(node: gs.Node) -> gs.Tensor | None:
    ins = var_inputs(node)
    return ins[0] if len(ins) == 1 else None


def fused_origin(tensor: gs.Tensor, *, through_activations: bool = True) -> gs.Node | None:
    """conv-epilogue: the weighted op whose fused chain (BN, bias/scale, activations, SiLU) writes
    ``tensor``, seeing through Q/DQ pairs; None when ``tensor`` is not the end of such a chain."""
    seen: set[int] = set()
    while True:
        p = producer(skip_qdq_up(tensor)[0])
        if p is None or id(p) in seen:
            return None
        seen.add(id(p))
        if has_weight(p):
            return p
        nxt: gs.Tensor | None = None
        if p.op == "BatchNormalization" or (through_activations and p.op in ACTIVATION_OPS):
            nxt = p.inputs[0]
        elif through_activations and silu_input(p) is not None:
            nxt = silu_input(p)
        elif p.op in _EPILOGUE_BINARY and is_standard(p):
            nxt = _one_variable_input(p)
        if nxt is None:
            return None
        tensor = nxt


def epilogue(node: gs.Node) -> list[gs.Node]:
    """conv-epilogue, residual-add: the nodes after a weighted op that TensorRT runs in the same layer
    (BN, bias/scale, activations, a SiLU, a residual Add whose convolution branch this is, the ReLU after
    it), stopping at a Q/DQ or a second reader. Lint names them with the convolution: they share its
    precision."""
    out: list[gs.Node] = []
    t = node.outputs[0] if node.outputs else None
    while t is not None:
        readers = consumers(t)
        nxt: gs.Node | None = None
        if len(readers) == 1:
            r = readers[0]
            residual = residual_split(r) if is_op(r, "Add") else None
            if (is_op(r, "BatchNormalization", *ACTIVATION_OPS)
                    or (is_op(r, *_EPILOGUE_BINARY) and _one_variable_input(r) is t)
                    or (residual is not None and residual[0] is t)):
                nxt = r
        elif len(readers) == 2:
            mul = next((r for r in readers if is_op(r, "Mul") and silu_input(r) is t), None)
            sig = next((r for r in readers if is_op(r, "Sigmoid")), None)
            if mul is not None and sig is not None:
                out.append(sig)
                nxt = mul
        if nxt is None or nxt in out:
            break
        out.append(nxt)
        t = nxt.outputs[0] if nxt.outputs else None
    return out


def _distances(t: gs.Tensor) -> dict[str, int]:
    """Tensor name -> shortest backward distance (in nodes) from ``t``, over all its ancestors."""
    dist = {t.name: 0}
    q = deque([t])
    while q:
        cur = q.popleft()
        p = producer(cur)
        if p is None:
            continue
        for x in p.inputs:
            if x.name and x.name not in dist and not is_constant(x):
                dist[x.name] = dist[cur.name] + 1
                q.append(x)
    return dist


def residual_split(add: gs.Node) -> tuple[gs.Tensor, gs.Tensor] | None:
    """residual-add: (convolution branch, skip) of a residual Add as the Add reads them, or None.

    NVIDIA ModelOpt's rule (modelopt/onnx/quantization/graph_utils.py build_non_residual_input_map): an
    input whose chain starts at a convolution is the branch TensorRT fuses the Add into; if both are,
    the one with the longer path to the inputs' lowest common ancestor is; a convolution whose output is
    itself the common ancestor (Conv -> x -> Add, Conv -> Add) makes no residual.
    """
    if not is_op(add, "Add") or len(add.inputs) != 2 or any(is_constant(t) for t in add.inputs):
        return None
    a, b = add.inputs
    fa, fb = skip_qdq_up(a)[0], skip_qdq_up(b)[0]
    ba, bb = fused_origin(fa), fused_origin(fb)
    if (ba is None and bb is None) or (ba is not None and ba is bb):
        return None
    da, db = _distances(fa), _distances(fb)
    common = set(da) & set(db)
    lca = min(common, key=lambda k: (da[k] + db[k], k)) if common else None
    la, lb = (da[lca], db[lca]) if lca is not None else (0, 0)
    if ba is not None and bb is not None:
        if la == lb:
            return None  # two parallel branches joining, not a skip around a block
        return (a, b) if la > lb else (b, a)
    conv_branch, skip, bone = (a, b, ba) if ba is not None else (b, a, bb)
    assert bone is not None  # both None returned above
    if lca is not None and lca in {o.name for o in bone.outputs}:
        return None
    return conv_branch, skip


def silu_of(tensor: gs.Tensor) -> tuple[gs.Node, gs.Node, gs.Tensor] | None:
    """``(Sigmoid, Mul, x)`` when ``tensor`` (seen through Q/DQ) is a SiLU's output ``x * Sigmoid(x)``;
    ``x`` is the tensor the Mul reads."""
    mul = producer(skip_qdq_up(tensor)[0])
    if mul is None or silu_input(mul) is None:
        return None
    for i, t in enumerate(mul.inputs):
        sig = producer(skip_qdq_up(t)[0])
        if is_op(sig, "Sigmoid"):
            return sig, mul, mul.inputs[1 - i]  # x as the Mul reads it (a Q/DQ output when quantized)
    return None


def silu_residual(
    add: gs.Node, split: tuple[gs.Tensor, gs.Tensor] | None = None
) -> tuple[gs.Node, gs.Node, gs.Tensor, gs.Tensor] | None:
    """silu-residual: ``(Sigmoid, Mul, x, skip)`` when the residual Add's convolution branch is a
    SiLU of a convolution's output ``x``. ``split``: the Add's ``residual_split``, when already known."""
    split = split if split is not None else residual_split(add)
    if split is None:
        return None
    conv_branch, skip = split
    s = silu_of(conv_branch)
    if s is None or fused_origin(s[2], through_activations=False) is None:
        return None
    return s[0], s[1], s[2], skip


def act_before_pool(pool: gs.Node) -> tuple[gs.Node, gs.Tensor, gs.Node] | None:
    """conv-act-maxpool: ``(activation, its float output, convolution)`` for Conv -> (BN) -> act ->
    (Q/DQ) -> MaxPool where the activation's output is read by the pool alone, through every Q/DQ on the
    way (with more readers no fusion is possible)."""
    if not is_op(pool, "MaxPool") or not pool.inputs:
        return None
    float_t, crossed = skip_qdq_up(pool.inputs[0])
    act = producer(float_t)
    if not is_op(act, *POOL_FUSIBLE_ACTIVATIONS) or len(consumers(float_t)) != 1:
        return None
    if any(len(consumers(p.q.outputs[0])) != 1 or len(consumers(p.dq.outputs[0])) != 1 for p in crossed):
        return None
    origin = fused_origin(act.inputs[0], through_activations=False)
    if origin is None or origin.op not in ("Conv", "ConvTranspose"):
        return None
    return act, float_t, origin


def concat_behind(tensor: gs.Tensor) -> gs.Node | None:
    """concat-conv: the Concat whose output reaches ``tensor`` through data-movement ops
    only (no Q/DQ pair on the way); None otherwise. The tensor a weighted op reads is what to pass."""
    p = scale_source(tensor)
    return p if is_op(p, "Concat") else None


def averaging_tail(pool: gs.Node) -> gs.Node | None:
    """pool-tail: the weighted op whose chain (with a residual Add and its ReLU) an averaging op
    reads, when the pool's result goes on to a weighted op (a classification head); else None."""
    if not is_op(pool, *AVERAGING_OPS) or not pool.inputs or not pool.outputs:
        return None
    t = skip_qdq_up(pool.inputs[0])[0]
    origin = fused_origin(t)
    if origin is None:
        add = residual_behind(t)
        split = residual_split(add) if add is not None else None
        if split is None:
            return None
        origin = fused_origin(split[0])
    if origin is None or not reaches_weighted(pool.outputs[0]):
        return None
    return origin


def residual_behind(tensor: gs.Tensor) -> gs.Node | None:
    """residual-add: the Add that writes ``tensor`` through the activations fused after it (the
    block's output), else None. Whether it is a residual Add is ``residual_split``'s answer."""
    p = producer(skip_qdq_up(tensor)[0])
    while is_op(p, *POOL_FUSIBLE_ACTIVATIONS):
        p = producer(p.inputs[0])
    return p if is_op(p, "Add") else None


def reaches_weighted(tensor: gs.Tensor) -> bool:
    """Does ``tensor`` reach a weighted op's data input through data-movement ops (and Q/DQ pairs)?"""
    stack, seen = [tensor], set()
    while stack:
        t = stack.pop()
        for node, idx, _ in skip_qdq_down(t):
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.op in WEIGHTED_OPS and idx == 0:
                return True
            if preserves_scale(node) and idx == 0:
                stack.extend(node.outputs)
    return False
