"""The passes that change no values: constant folding, no-op removal, duplicate initializers merged,
dead nodes dropped, nodes sorted topologically, placeholder dimension names told apart."""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

from edgeq.graph.passes.base import (
    Change,
    CleanOptions,
    bypass,
    const,
    node_name,
    onnx_dtype,
    opt_input,
    prune_disconnected,
    quiet_graphsurgeon,
)
from edgeq.graph.patterns import producer

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

log = logging.getLogger(__name__)


def fold_constants(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Fold constant subgraphs and static shape computations into initializers (graphsurgeon).

    TensorRT 8.6 casts INT64 weights down with a warning and handles shape arithmetic poorly;
    folding beforehand avoids most of both (edgeq/docs/trt86-rules.md#parsing). graphsurgeon never folds
    Q/DQ nodes, so quantized weights stay int8 + DequantizeLinear as TensorRT needs them.
    """
    import onnx_graphsurgeon as gs

    fold_shapes = True
    risky = _cast_elision_hazards(graph)
    changes: list[Change] = []
    if risky:
        # graphsurgeon's shape-cast elision casts float constants to int (0.5 -> 0): skip shape folding.
        fold_shapes = False
        changes.append(
            Change(
                "fold_constants",
                "shape folding skipped: graphsurgeon's shape-cast elision would truncate fractional "
                "constants feeding these nodes",
                tuple(node_name(n) for n in risky),
            )
        )
    before = [(n, list(n.outputs)) for n in graph.nodes]
    with quiet_graphsurgeon():
        try:
            graph.fold_constants(fold_shapes=fold_shapes, error_ok=False)
        except Exception as e:  # onnxruntime failures surface as many types; retry per partition
            log.info("constant folding failed as a whole (%s); retrying per partition", e)
            graph.fold_constants(fold_shapes=fold_shapes, partitioning="recursive", error_ok=True)
    # graphsurgeon turns a folded node's outputs into Constants in place (and may detach them).
    done = [n for n, outs in before if outs and all(isinstance(t, gs.Constant) for t in outs)]
    folded = [n for n in done if n.op != "Constant"]
    lowered = [n for n in done if n.op == "Constant"]
    for n in folded + lowered:
        n.outputs.clear()
        n.inputs.clear()
    prune_disconnected(graph)
    if folded:
        ops = sorted({n.op for n in folded})
        changes.append(
            Change(
                "fold_constants",
                f"folded {len(folded)} constant nodes ({', '.join(ops)}) into initializers",
                tuple(node_name(n) for n in folded),
            )
        )
    if lowered:
        changes.append(
            Change(
                "fold_constants",
                f"turned {len(lowered)} Constant nodes into initializers",
                tuple(node_name(n) for n in lowered),
            )
        )
    return changes


_ELISION_OPS = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Greater", "Less", "Concat"}


def _cast_elision_hazards(graph: gs.Graph) -> list[gs.Node]:
    """Nodes graphsurgeon's shape-cast elision would rewrite with a fractional float constant."""
    import numpy as np
    import onnx

    out = []
    for n in graph.nodes:
        if n.op not in _ELISION_OPS:
            continue
        ins = [producer(t) for t in n.inputs]
        if not any(
            p is not None and p.op == "Cast" and p.attrs.get("to") == onnx.TensorProto.FLOAT for p in ins
        ):
            continue
        consts = [c for c in (const(t) for t in n.inputs) if c is not None]
        if any(c.dtype.kind == "f" and not np.all(np.mod(c, 1) == 0) for c in consts):
            out.append(n)
    return out


def _is_noop(graph: gs.Graph, node: gs.Node) -> str | None:
    if len(node.inputs) == 0 or len(node.outputs) == 0 or node.inputs[0].is_empty():
        return None
    if node.op == "Identity":
        return "Identity"
    if node.op == "Dropout":
        training = opt_input(node, 2)
        if training is not None:
            v = const(training)
            if v is None or bool(v.any()):
                return None
        if (
            len(node.outputs) > 1
            and not node.outputs[1].is_empty()
            and (node.outputs[1].outputs or node.outputs[1] in graph.outputs)
        ):
            return None  # the mask is used
        return "Dropout (inference)"
    if node.op == "Cast":
        prod = producer(node.inputs[0])
        if prod is not None and prod.op == "QuantizeLinear":
            return None  # Q -> Cast -> DQ is qdq_remove_casts' job
        src = onnx_dtype(node.inputs[0].dtype)
        if src is not None and src == node.attrs.get("to"):
            return "Cast to its own type"
    return None


def remove_noops(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Remove Identity, inference-mode Dropout and Casts to a tensor's own type.

    They compute nothing, but sit between Q/DQ and the ops TensorRT fuses them with, hiding
    patterns from both the 8.6 fusion passes and our own Q/DQ passes
    (edgeq/docs/trt86-rules.md#what-fuses). A Dropout whose mask is used is kept.
    """
    removed: dict[str, list[str]] = {}
    for node in list(graph.nodes):
        kind = _is_noop(graph, node)
        if kind is None:
            continue
        name = node_name(node)
        while len(node.outputs) > 1:  # Dropout's unused mask
            node.outputs.pop()
        if bypass(graph, node):
            removed.setdefault(kind, []).append(name)
    prune_disconnected(graph)
    return [Change("remove_noops", f"removed {len(v)} {k}", tuple(v)) for k, v in removed.items()]


def dedupe_initializers(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Merge initializers with identical type, shape and bytes into one.

    Exporters (and folding) repeat the same constants: Q/DQ scales and zero-points, shape vectors,
    weights. The TensorRT 8.6 parser makes one weights object per initializer, so duplicates cost
    engine weight memory (shared with the CPU on Jetson) and parse time; one copy also makes equal
    Q/DQ scales visibly shared (edgeq/docs/trt86-rules.md#concat-scale).
    Values are unchanged.
    """
    import onnx_graphsurgeon as gs

    seen: dict[tuple[Any, ...], gs.Constant] = {}
    merged: dict[str, list[str]] = {}
    users: dict[str, set[str]] = {}
    protected = {id(t) for t in list(graph.inputs) + list(graph.outputs)}
    for node in graph.nodes:
        for i, t in enumerate(node.inputs):
            if not isinstance(t, gs.Constant) or id(t) in protected:
                continue
            v = t.values
            key = (str(v.dtype), v.shape, str(t.export_dtype), hashlib.sha256(v.tobytes()).digest())
            kept = seen.setdefault(key, t)
            if kept is t:
                continue
            node.inputs[i] = kept
            merged.setdefault(kept.name, [])
            if t.name not in merged[kept.name]:
                merged[kept.name].append(t.name)
            users.setdefault(kept.name, set()).add(node_name(node))
    if not merged:
        return []
    n = sum(len(v) for v in merged.values())
    examples = ", ".join(f"{k} <- {v[0]}{'...' if len(v) > 1 else ''}" for k, v in list(merged.items())[:2])
    nodes = sorted(set().union(*users.values()))
    return [
        Change(
            "dedupe_initializers",
            f"merged {n} duplicate initializers into {len(merged)} ({examples})",
            tuple(nodes),
        )
    ]


def remove_unused(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Drop nodes that feed no graph output, their initializers, and node outputs nobody reads.

    The TensorRT 8.6 parser imports every node, dead or not: a dead branch holding an op outside the
    8.6 operator table (edgeq/graph/data/trt86-onnx-operators.csv) fails the whole parse. Initializers that no
    node reads at all are dropped when the graph is imported; ``clean_model`` reports those here too.
    """
    import onnx_graphsurgeon as gs

    before = list(graph.nodes)
    consts_before = {t.name for t in graph.tensors().values() if isinstance(t, gs.Constant)}
    outs_before = {id(n): len(n.outputs) for n in before}
    graph.cleanup(remove_unused_node_outputs=True)
    kept = {id(n) for n in graph.nodes}
    dead = [node_name(n) for n in before if id(n) not in kept]
    consts_after = {t.name for t in graph.tensors().values() if isinstance(t, gs.Constant)}
    trimmed = [node_name(n) for n in graph.nodes if len(n.outputs) < outs_before.get(id(n), 0)]
    changes = []
    if dead:
        changes.append(Change("remove_unused", f"removed {len(dead)} nodes that feed no output", tuple(dead)))
    gone = sorted(consts_before - consts_after)
    if gone:
        changes.append(
            Change("remove_unused", f"dropped {len(gone)} unused initializers ({', '.join(gone[:4])})")
        )
    if trimmed:
        changes.append(
            Change("remove_unused", f"dropped unread outputs of {len(trimmed)} nodes", tuple(trimmed))
        )
    return changes


def toposort(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Sort nodes topologically: the ONNX spec requires it, and so do onnxruntime and the checker.

    TensorRT 8.6's parser sorts on its own, but the same file also goes through onnxruntime (--verify,
    calibration) and graphsurgeon's folding, which need file order = data order. A graph already in a
    valid order is left as it is (graphsurgeon would pick another one).
    """
    produced = {t.name for t in graph.inputs} | {
        t.name for n in graph.nodes for t in n.inputs if not t.inputs
    }
    in_order = True
    for n in graph.nodes:
        if any(t.name not in produced for t in n.inputs if not t.is_empty()):
            in_order = False
            break
        produced.update(t.name for t in n.outputs)
    if in_order:
        return []
    before = [id(n) for n in graph.nodes]
    graph.toposort()
    moved = sum(1 for a, n in zip(before, graph.nodes) if a != id(n))
    if not moved:
        return []
    return [Change("toposort", f"reordered nodes into topological order ({moved} positions changed)")]


def name_dims_apart(graph: gs.Graph, options: CleanOptions) -> list[Change]:
    """Give input dimensions that share a placeholder name ('?') a name each: ``<input>_dim<axis>``.

    TensorRT 8.6 takes dimensions of one name as one size, so paddle2onnx's ``[-1, 3, '?', '?']`` fails
    every build with a non-square input (edgeq/docs/trt86-rules.md#dim-name-shared). The dimensions stay
    dynamic; only the false tie goes.
    """
    from edgeq.graph.rules import placeholder_dims

    shared = placeholder_dims(graph)
    if not shared:
        return []
    by_name = {t.name: t for t in graph.inputs}
    changes = []
    for name, where in shared.items():
        new = []
        for tensor, axis in where:
            t = by_name[tensor]
            label = "".join(c if c.isalnum() else "_" for c in tensor)
            t.shape[axis] = f"{label}_dim{axis}"
            new.append(f"{tensor} axis {axis} -> {t.shape[axis]}")
        changes.append(Change("name_dims_apart", f"dimensions named {name!r} named apart ("
                              + ", ".join(new) + "): TensorRT 8.6 takes one name as one size", ()))
    return changes
