"""Insert the Q/DQ nodes a ``Plan`` decided into a graphsurgeon graph.

Activations: ``QuantizeLinear -> DequantizeLinear`` pairs, per-tensor symmetric int8 (zero-point 0,
scale = amax / 127 from ``calibrate.activation_scale``, the same float32 the calibration cache holds).

Weights: stored as int8 initializers behind a ``DequantizeLinear`` with per-channel scales on the
plan's axis and int8 zero-points 0. Why int8 rather than float weights behind Q/DQ (which the 8.x
Developer Guide's 'Quantized Weights' section also allows): TensorRT 8.6's ONNX parser reads it and
builds all-INT8 convolutions from it (measured: ``tests/fixtures/trt86-h200/resnet50_ortfb.explicit.*``
is exactly this form), the file is 4x smaller, and the rounding is done once, here, where onnxruntime's
accuracy check sees the very values TensorRT will use. Biases stay float (an int32 bias behind a DQ
fails to parse: ``resnet50_ortqdq.explicit.build.log``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgeq.errors import QuantError

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnx_graphsurgeon as gs

    from edgeq.quant.plan import Plan

# QuantizeLinear/DequantizeLinear with an ``axis`` attribute (per-channel) need opset 13.
MIN_OPSET = 13


@dataclass(frozen=True)
class Inserted:
    activation_pairs: int
    weight_dqs: int
    scales: dict[str, float]  # activation tensor -> the scale written into its Q/DQ


def quantize_weight(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weight, float32 scale) with symmetric per-channel (or per-tensor) scales.

    Round half to even, as TensorRT quantizes weights (Developer Guide 'INT8 Rounding Modes').
    """
    import numpy as np

    from edgeq.quant.calibrate import weight_scales

    w = np.asarray(w, dtype=np.float32)
    if axis is None:
        scale = weight_scales(w.reshape(1, -1), 0)[0:1].reshape(())
        q = np.clip(np.rint(w / scale), -128, 127).astype(np.int8)
        return q, np.asarray(scale, dtype=np.float32)
    scale = weight_scales(w, axis)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -128, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def _learned(name: str, w: np.ndarray, nearest: np.ndarray, scale: np.ndarray, axis: int | None,
             learned: np.ndarray) -> np.ndarray:
    """``learned`` checked against the weight: its shape, and each value floor or ceil of ``w / scale``
    (a mismatch is a bug in the rounding, not the user's)."""
    import numpy as np

    learned = np.asarray(learned)
    if learned.shape != nearest.shape or learned.dtype != np.int8:
        raise RuntimeError(f"edgeq bug: learned rounding of '{name}' is {learned.dtype}"
                           f"{list(learned.shape)}, the weight int8{list(nearest.shape)}")
    from edgeq.quant.rounding import bounds

    lo, hi = bounds(w, scale, axis)
    if not ((learned == lo) | (learned == hi)).all():
        raise RuntimeError(f"edgeq bug: learned rounding of '{name}' is not floor or ceil of w / scale")
    return learned


class _Names:
    def __init__(self, graph: gs.Graph) -> None:
        self.used = set(graph.tensors()) | {n.name for n in graph.nodes}

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name = f"{base}_{k}"
            k += 1
        self.used.add(name)
        return name


def insert_qdq(graph: gs.Graph, plan: Plan, amax: Mapping[str, float],
               rounding: Mapping[str, np.ndarray] | None = None) -> Inserted:
    """Mutate ``graph``: one Q/DQ pair per plan site, one weight DQ per plan weight.

    ``amax`` is per site tensor, already shared within scale groups (``Plan.scale_amax``). ``rounding``:
    int8 values to store for some weights instead of nearest rounding (``edgeq.quant.rounding``), each
    floor or ceil of ``w / scale`` with the same scales: only the stored integers differ.
    """
    import numpy as np
    import onnx_graphsurgeon as gs

    from edgeq.quant.calibrate import activation_scale

    tensors = graph.tensors()
    nodes = {n.name: n for n in graph.nodes}
    unique = _Names(graph)
    scales: dict[str, float] = {}
    new_nodes: list[gs.Node] = []

    for site in plan.sites:
        t = tensors.get(site.tensor)
        if t is None:
            raise QuantError(f"planned tensor '{site.tensor}' is not in the graph")
        if site.tensor not in amax:
            raise QuantError(f"no calibration range for tensor '{site.tensor}'")
        scale = activation_scale(amax[site.tensor])
        scales[site.tensor] = scale
        base = site.tensor
        s_c = gs.Constant(unique(f"{base}_scale"), np.array(scale, dtype=np.float32))
        zp_c = gs.Constant(unique(f"{base}_zero_point"), np.array(0, dtype=np.int8))
        q_out = gs.Variable(unique(f"{base}_quantized"), dtype=np.int8, shape=t.shape)
        if site.graph_output:
            # The DequantizeLinear output takes over the graph output's name (onnxruntime does the same).
            out_name = t.name
            t.name = unique(f"{base}_float")
            dq_out = gs.Variable(out_name, dtype=t.dtype, shape=t.shape)
            graph.outputs = [dq_out if o is t else o for o in graph.outputs]
        else:
            dq_out = gs.Variable(unique(f"{base}_dequantized"), dtype=t.dtype, shape=t.shape)
        new_nodes.append(gs.Node("QuantizeLinear", unique(f"{base}_QuantizeLinear"),
                                 inputs=[t, s_c, zp_c], outputs=[q_out]))
        new_nodes.append(gs.Node("DequantizeLinear", unique(f"{base}_DequantizeLinear"),
                                 inputs=[q_out, s_c, zp_c], outputs=[dq_out]))
        for cname in site.consumers:
            c = nodes.get(cname)
            if c is None:
                raise QuantError(f"planned consumer node '{cname}' is not in the graph")
            for i, inp in enumerate(list(c.inputs)):
                if inp is t:
                    c.inputs[i] = dq_out

    done: dict[tuple[str, int | None], gs.Variable] = {}
    for ws in plan.weights:
        w = tensors.get(ws.tensor)
        node = nodes.get(ws.node)
        if not isinstance(w, gs.Constant) or node is None:
            raise QuantError(f"planned weight '{ws.tensor}' of '{ws.node}' is not a constant in the graph")
        key = (ws.tensor, ws.axis)
        if key not in done:
            values = np.asarray(w.values)
            if ws.axis is not None and not -values.ndim <= ws.axis < values.ndim:
                raise QuantError(f"weight '{ws.tensor}' has no axis {ws.axis} (shape {list(values.shape)})")
            q, w_scale = quantize_weight(values, ws.axis)
            if rounding is not None and ws.tensor in rounding:
                q = _learned(ws.tensor, values, q, w_scale, ws.axis, rounding[ws.tensor])
            base = ws.tensor
            q_c = gs.Constant(unique(f"{base}_quantized"), q)
            s_c = gs.Constant(unique(f"{base}_scale"), w_scale)
            zp_c = gs.Constant(unique(f"{base}_zero_point"), np.zeros(w_scale.shape, dtype=np.int8))
            out = gs.Variable(unique(f"{base}_dequantized"), dtype=np.float32, shape=list(values.shape))
            attrs = {"axis": int(ws.axis)} if ws.axis is not None else {}
            new_nodes.append(gs.Node("DequantizeLinear", unique(f"{base}_DequantizeLinear"), attrs=attrs,
                                     inputs=[q_c, s_c, zp_c], outputs=[out]))
            done[key] = out
        if len(node.inputs) > 1 and node.inputs[1] is w:  # input 1: the weight, as placement found it
            node.inputs[1] = done[key]

    graph.nodes.extend(new_nodes)
    graph.cleanup().toposort()
    return Inserted(len(plan.sites), len(done), scales)


def activation_scales(model: onnx.ModelProto) -> dict[str, float]:
    """The per-tensor scale of every activation Q/DQ in a model, keyed by the quantized float tensor.

    For comparing a Q/DQ model with a calibration cache (the cache names the same tensors).
    """
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    out: dict[str, float] = {}
    for n in model.graph.node:
        if n.op_type != "QuantizeLinear" or n.input[0] in inits or len(n.input) < 2:
            continue
        s = inits.get(n.input[1])
        if s is None:
            continue
        arr = numpy_helper.to_array(s)
        if arr.size == 1:
            name = n.input[0]
            if name.endswith("_float") and name[: -len("_float")] in outputs:
                name = name[: -len("_float")]  # a graph output's Q/DQ (see insert_qdq)
            out[name] = float(arr.reshape(()))
    return out
