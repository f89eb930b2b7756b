"""Fold a BatchNormalization into the convolution before it, float or int8 behind a DequantizeLinear.

Why a pass of its own: TensorRT 8.6 computes wrong outputs for an explicit (Q/DQ) convolution followed
by a BatchNormalization it has to fold itself (registry entry ``qdq-conv-batchnorm``, measured on the
PP-OCR direction classifier that paddle2onnx exports with 35 of them). Exporters that fold BN
(torch.onnx in eval mode, ultralytics) never meet it; paddle2onnx and tf2onnx exports do. Folded here
first, the same model's engine matches FP32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeq.graph.passes.base import Change, CleanOptions, const, node_name, opt_input, prune_disconnected
from edgeq.graph.patterns import consumers, is_dequantize, producer

if TYPE_CHECKING:
    import numpy as np
    import onnx_graphsurgeon as gs


def _bn_factors(bn: gs.Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(per-channel factor, shift): y = x * factor + shift, or None when BN's parameters are not constant."""
    import numpy as np

    params = [const(t) for t in bn.inputs[1:5]]
    if len(params) != 4 or any(p is None for p in params):
        return None
    scale, beta, mean, var = (np.asarray(p, dtype=np.float64) for p in params)  # type: ignore[arg-type]
    factor = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    return factor, beta - mean * factor


def _folded_int8(dq: gs.Node, factor: np.ndarray, name: str) -> gs.Node | str:
    """A new DequantizeLinear for int8 weights times ``factor`` per output channel, or why there is none.

    Exact: per output channel c, (q * s) * f = (q * sign f) * (s * |f|). A channel with f = 0 computes 0:
    its weights become 0 at the old scale (TensorRT refuses a zero scale)."""
    import numpy as np
    import onnx_graphsurgeon as gs

    q, scale = const(dq.inputs[0]), const(dq.inputs[1]) if len(dq.inputs) > 1 else None
    zp = const(dq.inputs[2]) if opt_input(dq, 2) is not None else None
    if q is None or scale is None or q.dtype != np.int8:
        return "its weight is not an int8 constant behind the DequantizeLinear"
    if zp is not None and np.any(zp != 0):
        return "its weight's zero-point is not 0"
    channels = q.shape[0]
    if scale.size == 1:
        s = np.full(channels, float(scale.reshape(-1)[0]), dtype=np.float64)
    elif int(dq.attrs.get("axis", 1)) % q.ndim == 0 and scale.size == channels:
        s = scale.astype(np.float64)
    else:
        return "its weight is quantized on an axis other than the output channels"
    shape = (-1,) + (1,) * (q.ndim - 1)
    negative = (factor < 0).reshape(shape)
    if np.any(negative & (q == -128)):
        return "a negative BatchNormalization scale meets an int8 weight of -128 (+128 does not fit int8)"
    zero = (factor == 0).reshape(shape)
    q_new = np.where(zero, 0, np.where(negative, -q.astype(np.int16), q)).astype(np.int8)
    s_new = np.where(factor == 0, s, s * np.abs(factor)).astype(np.float32)
    out = gs.Variable(f"{name}_dequantized", dtype=np.float32, shape=list(q.shape))
    return gs.Node("DequantizeLinear", f"{name}_DequantizeLinear", attrs={"axis": 0},
                   inputs=[gs.Constant(f"{name}_int8", q_new), gs.Constant(f"{name}_scale", s_new),
                           gs.Constant(f"{name}_zero_point", np.zeros(channels, dtype=np.int8))],
                   outputs=[out])


def fold_batchnorm(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Fold each BatchNormalization whose input only a Conv writes and only it reads into that Conv.

    TensorRT 8.6 gets it wrong behind Q/DQ (edgeq/docs/trt86-rules.md#qdq-conv-batchnorm). Float weights
    are folded in float32 (a rounding, within ``--verify``'s tolerance); int8 weights
    behind a DequantizeLinear exactly (``_folded_int8``). A BatchNormalization left unfolded in a Q/DQ
    model is what lint's ``qdq-conv-batchnorm`` names, with the reason here."""
    import numpy as np
    import onnx_graphsurgeon as gs

    folded, exact, left = [], 0, []
    for bn in list(graph.nodes):
        if bn.op != "BatchNormalization" or len(bn.outputs) != 1 or not bn.inputs:
            continue
        x = bn.inputs[0]
        conv = producer(x)
        if conv is None or conv.op != "Conv" or len(consumers(x)) != 1 or x in graph.outputs:
            continue
        factors = _bn_factors(bn)
        if factors is None:
            continue
        factor, shift = factors
        w_t = conv.inputs[1]
        w, dq = const(w_t), producer(w_t)
        name = f"{node_name(conv)}_bn_folded"
        b_t = opt_input(conv, 2)
        b = const(b_t) if b_t is not None else np.zeros(factor.size, dtype=np.float32)
        if b is None:
            left.append(f"{node_name(bn)}: the convolution's bias is not a constant")
            continue
        if w is not None and w.shape[0] == factor.size:
            shape = (-1,) + (1,) * (w.ndim - 1)
            conv.inputs[1] = gs.Constant(f"{name}_weight",
                                         (w.astype(np.float64) * factor.reshape(shape)).astype(np.float32))
        elif is_dequantize(dq) and getattr(const(dq.inputs[0]), "shape", (0,))[0] == factor.size:
            new_dq = _folded_int8(dq, factor, name)
            if isinstance(new_dq, str):
                left.append(f"{node_name(bn)}: {new_dq}")
                continue
            graph.nodes.append(new_dq)
            conv.inputs[1] = new_dq.outputs[0]
            exact += 1
        else:
            continue
        bias = gs.Constant(f"{name}_bias", (b.astype(np.float64) * factor + shift).astype(np.float32))
        if len(conv.inputs) > 2:
            conv.inputs[2] = bias
        else:
            conv.inputs.append(bias)
        y = bn.outputs[0]
        bn.outputs.clear()
        bn.inputs.clear()
        conv.outputs.clear()
        conv.outputs.append(y)
        folded.append(node_name(bn))
    prune_disconnected(graph)
    changes = []
    if folded:
        how = f" ({exact} into int8 weights, exactly)" if exact else ""
        changes.append(Change("fold_batchnorm", f"folded {len(folded)} BatchNormalization into the "
                              f"convolution before each{how}", tuple(folded)))
    if left:
        changes.append(Change("fold_batchnorm", f"left {len(left)} BatchNormalization after a quantized "
                              f"convolution: {'; '.join(left[:3])}", tuple(s.split(':')[0] for s in left)))
    return changes
