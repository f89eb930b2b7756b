"""The Q/DQ repairs: float32 Q/DQ below opset 19, PyTorch's qint8 export, Casts inside Q/DQ pairs,
uint8 / asymmetric Q/DQ to int8 symmetric, int32 bias DequantizeLinear folded. Each exact, or on request."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from edgeq.graph.passes.base import (
    Change,
    CleanOptions,
    bypass,
    const,
    node_name,
    onnx_dtype,
    opt_input,
    prune_disconnected,
)
from edgeq.graph.passes.opset import known_types
from edgeq.graph.patterns import constant_value, producer

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnx_graphsurgeon as gs


def _q_type(q: gs.Node) -> int:
    """The integer type a QuantizeLinear produces: its zero-point's type, else output_dtype, else uint8."""
    import onnx

    zp = opt_input(q, 2)
    if zp is not None:
        dt = onnx_dtype(zp.dtype)
        if dt is not None:
            return dt
    return int(q.attrs.get("output_dtype", 0)) or onnx.TensorProto.UINT8


def _broadcast_param(values: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """Shape a per-axis scale/zero-point so it broadcasts against the tensor (ONNX Q/DQ 'axis')."""
    if values.ndim == 0 or values.size == 1:
        return values.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = values.size
    return values.reshape(shape)


def qdq_float32(model: onnx.ModelProto, options: CleanOptions) -> tuple[onnx.ModelProto, list[Change]]:
    """Make float16/bfloat16 Q/DQ float32 below opset 19, where Q/DQ are defined on float32 only.

    NVIDIA ModelOpt's default int8 output is an fp16 network with fp16 Q/DQ scales at opset 19; lowered
    to 17 as it is, the file fails the checker and onnxruntime. TensorRT 8.6 reads float32 Q/DQ
    (edgeq/docs/trt86-rules.md#qdq-float16). Scales become float32 of the same values (exact); a
    QuantizeLinear reads its input through a Cast to float32 (exact), a DequantizeLinear writes float32
    and a Cast takes it back to the network's type (the one rounding, as the fp16 DequantizeLinear did).
    """
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from edgeq.graph.io import half_types, opset_of

    if opset_of(model) >= 19:
        return model, []
    half = half_types()
    g = model.graph
    types = known_types(model)
    inits = {t.name: t for t in g.initializer}
    taken = {o for n in g.node for o in n.output} | set(inits) | {i.name for i in g.input}

    def fresh(base: str) -> str:
        name, i = base, 1
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        taken.add(name)
        return name

    f32: dict[str, str] = {}  # half initializer -> its float32 copy

    def as_float32(t: str, before: list[onnx.NodeProto], label: str) -> str:
        if t in inits:
            if t not in f32:
                f32[t] = fresh(f"{t}_float32")
                values = numpy_helper.to_array(inits[t]).astype(np.float32)
                g.initializer.append(numpy_helper.from_array(values, f32[t]))
            return f32[t]
        out = fresh(f"{t}_float32")
        before.append(helper.make_node("Cast", [t], [out], to=onnx.TensorProto.FLOAT, name=fresh(label)))
        return out

    nodes: list[onnx.NodeProto] = []
    q_casts: list[str] = []
    dq_casts: list[str] = []
    for n in g.node:
        scale_type = types.get(n.input[1], 0) if len(n.input) > 1 else 0
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") or n.domain not in ("", "ai.onnx"):
            nodes.append(n)
            continue
        if scale_type not in half:
            nodes.append(n)
            continue
        label = n.name or n.output[0]
        before: list[onnx.NodeProto] = []
        after: list[onnx.NodeProto] = []
        n.input[1] = as_float32(n.input[1], before, f"{label}_scale_to_float32")
        if n.op_type == "QuantizeLinear":
            n.input[0] = as_float32(n.input[0], before, f"{label}_input_to_float32")
            if before and before[-1].output[0] == n.input[0]:
                q_casts.append(before[-1].name)
        else:
            out = n.output[0]
            n.output[0] = fresh(f"{out}_float32")
            back = fresh(f"{label}_to_half")
            cast = helper.make_node("Cast", [n.output[0]], [out], to=scale_type, name=back)
            after.append(cast)
            dq_casts.append(cast.name)
        nodes.extend([*before, n, *after])
    if not q_casts and not dq_casts and not f32:
        return model, []
    del g.node[:]
    g.node.extend(nodes)
    used = {i for n in g.node for i in n.input}
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    changes = [Change("qdq_float32", f"{len(f32)} float16/bfloat16 Q/DQ scales -> float32 (exact)")]
    if q_casts or dq_casts:
        changes.append(
            Change(
                "qdq_float32",
                f"inserted {len(q_casts)} Cast to float32 before QuantizeLinear and {len(dq_casts)} Cast "
                "back after DequantizeLinear: each converts one tensor elementwise, a layer of its own "
                "in TensorRT 8.6 unless the builder folds it into the Q/DQ (unmeasured)",
                tuple(q_casts + dq_casts),
            )
        )
    return model, changes



def _uint8_pairs(graph: gs.Graph, zero_point: int) -> list[tuple[gs.Node, list[gs.Node]]]:
    """``(q, dqs)``: each QuantizeLinear with a given uint8 zero-point of all ``zero_point`` whose
    readers are all DequantizeLinear with such a zero-point (an absent one reads as 0), none a graph
    output."""
    import numpy as np

    def fits(zp: np.ndarray | None) -> bool:
        return zp is not None and zp.dtype == np.uint8 and bool(np.all(zp == zero_point))

    out = []
    for q in graph.nodes:
        if q.op != "QuantizeLinear" or not q.outputs or opt_input(q, 2) is None or not fits(_zp_values(q)):
            continue
        qout = q.outputs[0]
        dqs = list(qout.outputs)
        ok = qout not in graph.outputs and bool(dqs)
        if ok and all(d.op == "DequantizeLinear" and fits(_zp_values(d)) for d in dqs):
            out.append((q, dqs))
    return out


def _exporter_chains(graph: gs.Graph) -> dict[int, tuple[gs.Node, list[gs.Node]]]:
    """torch.onnx.export's activation chains, by ``id(q)``: ``(q, casts + dqs)`` for each QuantizeLinear
    with a constant uint8/int8 zero-point whose readers are all ``Cast(to=<that type>)``, each read only
    by DequantizeLinear with the same zero-point (the exporter's ``dequantize_helper`` writes one Cast
    and one DQ per reading op), none a graph output."""
    import numpy as np
    import onnx

    to_of = {np.dtype(np.uint8): onnx.TensorProto.UINT8, np.dtype(np.int8): onnx.TensorProto.INT8}
    out: dict[int, tuple[gs.Node, list[gs.Node]]] = {}
    for q in graph.nodes:
        zq = _zp_values(q) if q.op == "QuantizeLinear" and q.outputs and opt_input(q, 2) is not None else None
        if zq is None or zq.dtype not in to_of or q.outputs[0] in graph.outputs:
            continue
        casts = list(q.outputs[0].outputs)
        readers: list[gs.Node] = []
        ok = bool(casts)
        for c in casts:
            dqs = list(c.outputs[0].outputs) if c.outputs else []
            ok = ok and c.op == "Cast" and c.attrs.get("to") == to_of[zq.dtype] and bool(dqs)
            ok = ok and c.outputs[0] not in graph.outputs
            for d in dqs:
                zd = _zp_values(d) if d.op == "DequantizeLinear" and opt_input(d, 2) is not None else None
                ok = ok and zd is not None and zd.dtype == zq.dtype and np.array_equal(zd, zq)
            readers += [c, *dqs]
        if ok:
            out[id(q)] = (q, readers)
    return out


def _upstream_chains(q: gs.Node, chains: dict[int, tuple[gs.Node, list[gs.Node]]]) -> list[int]:
    """The exporter chains whose DequantizeLinear ``q``'s input is computed from (through float ops):
    the quantized tensors the op that ``q`` quantizes read."""
    import onnx_graphsurgeon as gs

    found: list[int] = []
    seen: set[int] = set()
    stack = [q.inputs[0]] if q.inputs else []
    while stack:
        t = stack.pop()
        if id(t) in seen or isinstance(t, gs.Constant):
            continue
        seen.add(id(t))
        p = producer(t)
        if p is None:
            continue
        if p.op == "DequantizeLinear":  # an activation chain's end, or a weight's DQ (no chain)
            src = producer(p.inputs[0]) if p.inputs else None
            src = producer(src.inputs[0]) if src is not None and src.op == "Cast" and src.inputs else src
            if src is not None and id(src) in chains:
                found.append(id(src))
            continue
        stack.extend(p.inputs)
    return found


def torch_qint8_pairs(graph: gs.Graph) -> list[tuple[gs.Node, list[gs.Node]]]:
    """PyTorch qint8 tensors that torch.onnx.export wrote as uint8: ``(q, casts + dqs)`` of each.

    The exporter keeps a tensor's type only at the quantize stub (``quantize_per_tensor``: an int8
    zero-point and ``Cast(to=INT8)`` for qint8); every quantized op's output gets its int64 zero-point
    cast to uint8 (``symbolic_helper.quantize_helper``) and ``Cast(to=UINT8)`` before its DQ, so a qint8
    zero-point z is written as the uint8 z mod 256 (0 stays 0, -128 becomes 128) and the file computes a
    range shifted by 128 (with zero-point 0: negative values clamped to 0). In eager mode an op's output
    has its input's type, so a uint8 chain holds qint8 where the chains it is computed from do, back to
    an int8 stub. A quint8 model (fbgemm's and qnnpack's default qconfigs) has a uint8 stub: its uint8
    chains, zero-point 0 after a ReLU included, are what PyTorch computed and are not listed.
    """
    import numpy as np

    chains = _exporter_chains(graph)
    parents = {k: _upstream_chains(q, chains) for k, (q, _) in chains.items()}
    int8 = {k: _zp_values(q).dtype == np.int8 for k, (q, _) in chains.items()}  # type: ignore[union-attr]
    signed: dict[int, bool] = {}  # the tensor is qint8 in PyTorch
    for start in chains:
        stack, visiting = [start], {start}
        while stack:
            k = stack[-1]
            todo = [p for p in parents[k] if p not in signed and p not in visiting]
            if todo:
                stack.extend(todo)
                visiting.update(todo)
                continue
            stack.pop()
            signed[k] = int8[k] or any(signed.get(p, False) for p in parents[k])
    return [(q, readers) for k, (q, readers) in chains.items() if signed[k] and not int8[k]]


def torch_qint8_nodes(graph: gs.Graph, label: Callable[[gs.Node], str] = node_name) -> set[str]:
    """The Q and DQ nodes of ``torch_qint8_pairs``, by ``label``: what clean and lint report."""
    out: set[str] = set()
    for q, readers in torch_qint8_pairs(graph):
        out.add(label(q))
        out.update(label(r) for r in readers if r.op == "DequantizeLinear")
    return out


def qdq_torch_qint8(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """With --torch-qint8: read the uint8 zero-points of PyTorch's qint8 tensors back as int8 (the same
    bits: 0 stays 0, 128 is -128), what PyTorch computed (``torch_qint8_pairs`` says which).

    Only on request, because it changes the file's function: the file computes a range shifted by 128
    where PyTorch's qint8 tensors did not (edgeq/docs/trt86-rules.md#qdq-torch-qint8). The Casts between
    Q and DQ become Cast(to=INT8), which qdq_remove_casts then removes; verification compares against the
    input with only this repair applied, so everything else clean does is still checked to be exact.
    """
    import numpy as np
    import onnx
    import onnx_graphsurgeon as gs

    if not options.torch_qint8:
        return []
    zps: dict[int, gs.Constant] = {}

    def as_int8(node: gs.Node) -> None:
        old = opt_input(node, 2)
        values = _zp_values(node)
        assert old is not None and values is not None  # torch_qint8_pairs checked it
        if id(old) not in zps:
            zps[id(old)] = gs.Constant(f"{old.name}_int8", np.ascontiguousarray(values).view(np.int8))
        _set_zp(node, zps[id(old)])

    done: list[str] = []
    for q, readers in torch_qint8_pairs(graph):
        as_int8(q)
        q.outputs[0].dtype = np.int8
        done.append(node_name(q))
        for r in readers:
            if r.op == "Cast":
                r.attrs["to"] = onnx.TensorProto.INT8
                r.outputs[0].dtype = np.int8
            else:
                as_int8(r)
                done.append(node_name(r))
    if not done:
        return []
    return [
        Change(
            "qdq_torch_qint8",
            f"{len(done)} Q/DQ nodes of PyTorch qint8 tensors that torch.onnx.export wrote as uint8: their "
            "zero-points read back as int8 (the same bits): deliberately changes the file's function back "
            "to PyTorch's qint8; verification compares against the input with this repair applied",
            tuple(done),
        )
    ]


def qdq_remove_casts(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Remove the Cast PyTorch eager-mode export writes between QuantizeLinear and DequantizeLinear.

    TensorRT 8.6 cannot parse a Cast inside a Q/DQ pair (edgeq/docs/trt86-rules.md#parsing). Only Casts to
    the type the QuantizeLinear already produces are removed (exact); any other is left for the
    findings, since dropping it would change the values.
    """
    removed = []
    for node in list(graph.nodes):
        if node.op != "Cast" or not node.inputs or not node.outputs:
            continue
        q = producer(node.inputs[0])
        if q is None or q.op != "QuantizeLinear":
            continue
        consumers = node.outputs[0].outputs
        if not consumers or any(c.op != "DequantizeLinear" for c in consumers):
            continue
        if node.attrs.get("to") != _q_type(q):
            continue
        name = node_name(node)
        if bypass(graph, node):
            removed.append(name)
    prune_disconnected(graph)
    if not removed:
        return []
    return [Change("qdq_remove_casts", f"removed {len(removed)} Cast nodes between Q and DQ", tuple(removed))]


def _zp_values(node: gs.Node) -> np.ndarray | None:
    """Zero-point values of a Q/DQ node, or None when it is not a constant. Absent means 0.

    An initializer or a ``Constant`` node's output: torch.onnx.export writes the zero-points of its
    eager-mode Q -> Cast -> DQ chains as ``Constant`` nodes, which only fold_constants lowers (and the
    --torch-qint8 verification reference runs no folding)."""
    import numpy as np

    zp = opt_input(node, 2)
    if zp is None:
        return np.zeros((), dtype=np.uint8)
    return constant_value(zp)


def _new_zp(cache: dict[int, gs.Constant], node: gs.Node, shape: tuple[int, ...]) -> gs.Constant:
    """An int8 zero-point of zeros replacing ``node``'s; nodes that shared one share the new one."""
    import numpy as np
    import onnx_graphsurgeon as gs

    old = opt_input(node, 2)
    key = id(old) if old is not None else -len(shape) - 1
    if key not in cache:
        base = old.name if old is not None else node_name(node) + "_zero_point"
        cache[key] = gs.Constant(f"{base}_int8", np.zeros(shape, dtype=np.int8))
    return cache[key]


def _set_zp(node: gs.Node, zp: gs.Constant) -> None:
    if len(node.inputs) > 2:
        node.inputs[2] = zp
    else:
        node.inputs.append(zp)


def qdq_to_int8(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Convert uint8 / asymmetric Q/DQ to int8 symmetric (zero-point 0) where that is exact.

    TensorRT 8.6 only takes signed symmetric int8: a uint8 zero-point is an invalid type and a
    non-zero one "TensorRT only supports symmetric quantization" (onnx-tensorrt 8.6
    builtin_op_importers.cpp; edgeq/docs/trt86-rules.md#qdq-uint8). Exact cases: an activation Q -> DQ
    pair with uint8 zero-point 128 (q_u8 - 128 = q_i8 for every input, clamp bounds included); a constant
    (weight) feeding a DequantizeLinear, with any zero-point, when every w - zp fits int8. Other
    zero-points are not exact and are left for the findings.
    """
    import numpy as np
    import onnx_graphsurgeon as gs

    converted_pairs: list[str] = []
    converted_weights: list[str] = []
    zps: dict[int, gs.Constant] = {}
    rebased: dict[tuple[int, int], gs.Constant] = {}
    for q, dqs in _uint8_pairs(graph, 128):
        zq, dzs = _zp_values(q), [_zp_values(d) for d in dqs]
        assert zq is not None  # _uint8_pairs checked every zero-point
        if any(d.attrs.get("axis", 1) != q.attrs.get("axis", 1) and zq.size > 1 for d in dqs):
            continue
        _set_zp(q, _new_zp(zps, q, zq.shape))
        for d, dz in zip(dqs, dzs):
            assert dz is not None
            _set_zp(d, _new_zp(zps, d, dz.shape))
        q.outputs[0].dtype = np.int8
        converted_pairs.append(node_name(q))
        converted_pairs.extend(node_name(d) for d in dqs)

    for d in list(graph.nodes):
        if d.op != "DequantizeLinear" or not d.inputs:
            continue
        w = const(d.inputs[0])
        z = _zp_values(d)
        if w is None or z is None or w.dtype not in (np.uint8, np.int8):
            continue
        if w.dtype == np.int8 and not np.any(z):
            continue  # already int8 symmetric
        axis = int(d.attrs.get("axis", 1))
        shifted = w.astype(np.int16) - _broadcast_param(z.astype(np.int16), axis, w.ndim)
        if shifted.min(initial=0) < -128 or shifted.max(initial=0) > 127:
            continue
        key = (id(d.inputs[0]), id(opt_input(d, 2)))
        if key not in rebased:
            rebased[key] = gs.Constant(f"{d.inputs[0].name}_int8", shifted.astype(np.int8))
        d.inputs[0] = rebased[key]
        _set_zp(d, _new_zp(zps, d, z.shape))
        converted_weights.append(node_name(d))
    prune_disconnected(graph)
    changes = []
    if converted_pairs:
        changes.append(
            Change(
                "qdq_to_int8",
                f"uint8 zero-point 128 -> int8 zero-point 0 on {len(converted_pairs)} Q/DQ nodes "
                "(exact shift)",
                tuple(converted_pairs),
            )
        )
    if converted_weights:
        changes.append(
            Change(
                "qdq_to_int8",
                f"re-based {len(converted_weights)} constant DQ inputs to int8 zero-point 0 "
                "(exact: w - zp fits int8)",
                tuple(converted_weights),
            )
        )
    return changes


def fold_bias_dq(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Fold a DequantizeLinear of an int32 constant (a quantized bias) into a float initializer.

    onnxruntime's QDQ export quantizes biases to int32 by default; the 8.6 parser refuses it:
    "fc.bias_DequantizeLinear: only activation types allowed as input to this layer"
    (measured: tests/fixtures/trt86-h200/resnet50_ortqdq.explicit.build.log). Computed as
    onnxruntime does, float32((q - zp)) * scale, so the values are bit-identical.
    """
    import numpy as np

    folded = []
    for d in list(graph.nodes):
        if d.op != "DequantizeLinear" or not d.inputs or not d.outputs:
            continue
        q = const(d.inputs[0])
        scale = const(d.inputs[1]) if len(d.inputs) > 1 else None
        z = _zp_values(d)
        if q is None or scale is None or z is None or q.dtype != np.int32:
            continue
        out = d.outputs[0]
        if out in graph.outputs:
            continue
        axis = int(d.attrs.get("axis", 1))
        diff = (q.astype(np.int64) - _broadcast_param(z.astype(np.int64), axis, q.ndim)).astype(np.float32)
        values = (diff * _broadcast_param(scale.astype(np.float32), axis, q.ndim)).astype(scale.dtype)
        name = node_name(d)
        d.outputs.clear()
        d.inputs.clear()
        out.to_constant(values)
        folded.append(name)
    prune_disconnected(graph)
    if not folded:
        return []
    return [
        Change(
            "fold_bias_dq",
            f"folded {len(folded)} int32 bias DequantizeLinear into float initializers",
            tuple(folded),
        )
    ]

