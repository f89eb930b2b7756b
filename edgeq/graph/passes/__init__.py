"""Cleaning passes: each one small, named, testable alone, and reporting what it changed.

A graph pass is ``(graph: gs.Graph, options: CleanOptions) -> list[Change]`` and edits the graphsurgeon
graph in place. Two passes need the ``onnx.ModelProto`` itself (the IR version and the opset import
live outside the graph, and ``onnx.version_converter`` works on models); they have the signature
``(model, options) -> tuple[onnx.ModelProto, list[Change]]``. A pass either makes an exact change or
leaves the graph alone: what it cannot fix exactly is left for ``clean.fit_findings`` to name, or, for
the all-or-nothing model passes, raised as ``Unfit`` (which ``clean_model`` turns into an ERROR finding).

Sources cited in docstrings: ``edgeq/docs/trt86-rules.md`` (the shipped rules, from the TensorRT 8.6
developer guide, the onnx-tensorrt 8.6 importers and the measured logs in ``tests/fixtures/trt86-h200``).

The passes live by family: ``opset`` (IR version and opset lowering), ``qdq`` (the Q/DQ repairs) and
``tidy`` (folding and the value-preserving clean-ups, input dimension names among them), ``batchnorm``
(BatchNormalization folded into the convolution before it, which TensorRT 8.6 gets wrong behind Q/DQ);
``base`` holds what they share.
This module is their order.
"""

from __future__ import annotations

from edgeq.graph.passes.base import Pass
from edgeq.graph.passes.batchnorm import fold_batchnorm
from edgeq.graph.passes.opset import convert_opset, set_ir_version
from edgeq.graph.passes.qdq import fold_bias_dq, qdq_float32, qdq_remove_casts, qdq_to_int8, qdq_torch_qint8
from edgeq.graph.passes.tidy import (
    dedupe_initializers,
    fold_constants,
    name_dims_apart,
    remove_noops,
    remove_unused,
    toposort,
)

__all__ = [
    "PASSES",
    "PASS_NAMES",
    "Pass",
    "convert_opset",
    "dedupe_initializers",
    "fold_batchnorm",
    "fold_bias_dq",
    "fold_constants",
    "name_dims_apart",
    "qdq_float32",
    "qdq_remove_casts",
    "qdq_to_int8",
    "qdq_torch_qint8",
    "remove_noops",
    "remove_unused",
    "set_ir_version",
    "toposort",
]

# The order matters:
# - set_ir_version first: graphsurgeon folds with onnxruntime at the graph's IR version, which must be
#   one onnxruntime knows; convert_opset next, so every graph pass sees opset <= 17 semantics and
#   folding tidies the constants the converter adds; qdq_float32 right after it, because float16 Q/DQ
#   are invalid below opset 19 and every later pass (and onnxruntime folding) needs a valid model.
# - name_dims_apart before folding: graphsurgeon's shape folding reads the input shapes.
# - fold_constants before the Q/DQ passes: it lowers Constant nodes and folds the Casts PyTorch puts on
#   zero-points and scales, so the Q/DQ passes can read their types and values (it never folds Q/DQ).
# - remove_noops before the Q/DQ passes: Identity/Dropout between Q and DQ hide the pairs (it leaves
#   the Q -> Cast -> DQ pattern to qdq_remove_casts, so that change is reported where it belongs).
# - qdq_torch_qint8 (only with --torch-qint8) before qdq_remove_casts: it retargets PyTorch's Casts to
#   INT8, which makes them no-ops that qdq_remove_casts removes.
# - qdq_remove_casts before qdq_to_int8: the int8 conversion needs Q directly feeding DQ.
# - fold_batchnorm after qdq_to_int8 and fold_bias_dq: it folds into int8 weights behind a per-channel
#   DequantizeLinear and into float biases, the forms those passes leave.
# - dedupe, remove_unused, toposort last: earlier passes create duplicates, orphans and reorderings.
PASSES: tuple[Pass, ...] = (
    Pass("set_ir_version", set_ir_version, "model"),
    Pass("convert_opset", convert_opset, "model"),
    Pass("qdq_float32", qdq_float32, "model"),
    Pass("name_dims_apart", name_dims_apart, "graph"),
    Pass("fold_constants", fold_constants, "graph"),
    Pass("remove_noops", remove_noops, "graph"),
    Pass("qdq_torch_qint8", qdq_torch_qint8, "graph"),
    Pass("qdq_remove_casts", qdq_remove_casts, "graph"),
    Pass("qdq_to_int8", qdq_to_int8, "graph"),
    Pass("fold_bias_dq", fold_bias_dq, "graph"),
    Pass("fold_batchnorm", fold_batchnorm, "graph"),
    Pass("dedupe_initializers", dedupe_initializers, "graph"),
    Pass("remove_unused", remove_unused, "graph"),
    Pass("toposort", toposort, "graph"),
)

PASS_NAMES: tuple[str, ...] = tuple(p.name for p in PASSES)
