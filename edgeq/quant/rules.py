"""Why each placement decision was made, as data: the registry's fusion patterns plus the few reasons
that are not TensorRT facts (no INT8 consumer, --placement all, the override file).

``placement.py`` tags every decision (a Q/DQ pair placed, a tensor left in float) with one of these ids,
so the ``edgeq quantize`` summary can say why each tensor is what it is. The facts themselves, with their
matchers and evidence, live once in ``edgeq.graph.trt86``.

Sources are cited by section title. The TensorRT 8.6 Developer Guide sections were read in the
8.x guide's text ("Explicit Quantization": 'TensorRT Processing Of Q/DQ Networks', 'Q/DQ
Layer-Placement Recommendations', 'Q/DQ Limitations'); fixtures are the measured TensorRT 8.6.0 engines
in ``tests/fixtures/trt86-h200`` (see its README).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeq.graph import patterns as _patterns
from edgeq.graph import registry
from edgeq.graph.trt86 import PATTERNS

TRT86_GUIDE = "TensorRT 8.6 Developer Guide, Working with INT8 > Explicit Quantization"


@dataclass(frozen=True)
class PlacementRule:
    id: str
    description: str
    source: str


# Reasons a placement decision can have that are not a TensorRT fact (the facts are the registry's
# fusion patterns, edgeq.graph.trt86: every site they place carries the pattern's id).
_REASONS = (
    PlacementRule(
        "place-not-int8-consumer",
        "No consumer of this tensor runs INT8 under the patterns: a Q/DQ pair here would add a layer "
        "TensorRT cannot fuse, so it stays float.",
        f"{TRT86_GUIDE} > 'Q/DQ Layer-Placement Recommendations' (\"if TensorRT cannot fuse the operations "
        "with the surrounding Q/DQ layers, performance may be reduced; be conservative\")",
    ),
    PlacementRule(
        "place-all",
        "--placement all: every float tensor an onnxruntime QDQ quantizer would quantize (inputs and "
        "outputs of its quantizable ops) gets its own Q/DQ pair and scale. For comparison only: this "
        "is the placement the fixtures show failing to fuse.",
        "onnxruntime/quantization/registry.py (QLinearOpsRegistry and QDQRegistry, onnxruntime 1.31); "
        "fixtures resnet50_ortfb.explicit.* and yolo_ortfb.explicit.build.log",
    ),
    PlacementRule(
        "place-override",
        "The per-model override file forced this node's inputs to be quantized, or excluded the node "
        "(its inputs and weights stay float).",
        "user override file (edgeq quantize --overrides)",
    ),
    PlacementRule(
        "mirror-int8",
        "--from-engine: the implicit engine read this tensor in INT8 between layers (directly or through "
        "a quantizing reformat): one Q/DQ pair feeding exactly the nodes whose layer read it INT8; tensors "
        "joined by INT8 data movement or a Concat share one scale. Weights of the layers it ran INT8 get "
        "their per-channel DequantizeLinear.",
        "the implicit engine's own layer JSON (trtexec --exportLayerInfo --profilingVerbosity=detailed: "
        "each layer input's ONNX tensor name and Format/Datatype); edgeq/docs/trt86-rules.md#mirror-int8; "
        "fixtures trt86-h100-zoo/*.implicit.layers.json.gz (SE gates and channel shuffles)",
    ),
    PlacementRule(
        "mirror-float",
        "--from-engine: the implicit engine carried this tensor in FP32/FP16 between layers, so it "
        "stays float (no Q/DQ).",
        "the implicit engine's own layer JSON; edgeq/docs/trt86-rules.md#mirror-float",
    ),
    PlacementRule(
        "mirror-inside-layer",
        "--from-engine: no boundary between engine layers carries this tensor (it lives inside one fused "
        "layer, or TensorRT folded its op away), so it gets no Q/DQ.",
        "the implicit engine's own layer JSON; edgeq/docs/trt86-rules.md#mirror-inside-layer",
    ),
)


def _from_patterns() -> tuple[PlacementRule, ...]:
    return tuple(PlacementRule(p.id, p.fact, p.evidence) for p in PATTERNS if p.kind == "fusion")


RULES: dict[str, PlacementRule] = {r.id: r for r in (*_from_patterns(), *_REASONS)}

# Weighted ops: their inputs are quantized (weighted-inputs). One definition, shared with lint.
WEIGHTED_OPS = _patterns.WEIGHTED_OPS

# --placement all: onnxruntime's quantizable ops (QLinearOpsRegistry | QDQRegistry, onnxruntime 1.31).
ORT_QUANTIZABLE_OPS = frozenset({
    "ArgMax", "AveragePool", "BatchNormalization", "Clip", "Concat", "Conv", "ConvTranspose", "CumSum",
    "Flatten", "Gather", "GatherElements", "Gemm", "GlobalAveragePool", "InstanceNormalization",
    "LayerNormalization", "LeakyRelu", "MatMul", "MaxPool", "Mul", "Add", "Pad", "Relu", "Reshape",
    "Resize", "Sigmoid", "Slice", "Softmax", "Split", "Squeeze", "TopK", "Transpose", "Unsqueeze", "Where",
})


def rule(rule_id: str) -> PlacementRule:
    """The rule with this id (a pattern's older id accepted); a KeyError is a bug (an unknown id)."""
    if rule_id in RULES:
        return RULES[rule_id]
    p = registry.pattern(rule_id)
    return RULES.get(p.id) or PlacementRule(p.id, p.fact, p.evidence)
