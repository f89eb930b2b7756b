"""Q/DQ placement rules for TensorRT 8.6, as data: one id, what it decides, and where it comes from.

``placement.py`` implements each rule as a pattern plus a predicate and tags every decision it makes
(a Q/DQ pair placed, a tensor left in float) with the rule id below, so the ``edgeq quantize`` summary
can say why each tensor is what it is. Changing a rule means changing its entry here and its predicate.

Sources are cited by section title. The TensorRT 8.6 Developer Guide sections were read in the
8.x guide's text ("Explicit Quantization": 'TensorRT Processing Of Q/DQ Networks', 'Q/DQ
Layer-Placement Recommendations', 'Q/DQ Limitations'); fixtures are the measured TensorRT 8.6.0 engines
in ``tests/fixtures/trt86-h200`` (see its README).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeq.graph import patterns as _patterns

TRT86_GUIDE = "TensorRT 8.6 Developer Guide, Working with INT8 > Explicit Quantization"


@dataclass(frozen=True)
class PlacementRule:
    id: str
    description: str
    source: str


_RULES = (
    PlacementRule(
        "place-weighted-inputs",
        "Quantize every activation input of Conv, ConvTranspose, Gemm and MatMul (Q/DQ pair, per-tensor "
        "int8, zero-point 0) and give its weight a per-channel int8 DequantizeLinear on the output-channel "
        "axis (Conv and Gemm transB=1: axis 0; ConvTranspose with group 1: axis 1; Gemm transB=0 and 2-D "
        "MatMul: axis 1; other weights per-tensor). Bias stays float.",
        f"{TRT86_GUIDE} > 'Q/DQ Layer-Placement Recommendations' (\"quantize all inputs of weighted "
        "operations\"; per-tensor activations, per-channel weights); 'Per-Tensor and Per-Channel "
        "Quantization' (output-channel axis; MatMul per-channel only with a constant 2-D second input); "
        "'ONNX Support' warning on Gemm transB (axis K=0 for PyTorch, 1 for TensorFlow layouts); "
        "fixtures resnet50_ortfb.explicit.build.log (int8 weight initializers behind DQ parse and "
        "build, every convolution INT8) and resnet50_ortqdq.explicit.build.log (int32 bias DQ fails: "
        "bias stays float)",
    ),
    PlacementRule(
        "place-no-output-q",
        "Leave the outputs of weighted ops and of the epilogue TensorRT fuses into them (BatchNorm, an "
        f"Add/Sub/Mul/Div with a constant, {'/'.join(sorted(_patterns.ACTIVATION_OPS))}, SiLU) in float "
        "unless a consumer needs INT8; the next weighted op's input Q/DQ then fuses into this op as its "
        "INT8 output.",
        f"{TRT86_GUIDE} > 'Q/DQ Layer-Placement Recommendations' (\"do not quantize the outputs of "
        "weighted operations by default\"; do not simulate BN/ReLU fusion)",
    ),
    PlacementRule(
        "place-residual-skip-only",
        "Residual Add (one input from a convolution's fused chain, the other a skip from further up): "
        "quantize the skip input only and leave the convolution branch in float, so the Add (and a "
        "following ReLU) fuses into that convolution. The branch with the longer path back to the two "
        "inputs' common ancestor is the convolution branch. A SiLU convolution branch is the measured "
        "exception (place-silu-residual).",
        f"{TRT86_GUIDE} > 'Q/DQ Layer-Placement Recommendations' (element-wise addition fused after a "
        "weighted layer); NVIDIA/TensorRT tools/pytorch-quantization/examples/torchvision/models/"
        "classification/resnet.py (residual_quantizer on the identity only); NVIDIA/TensorRT-Model-"
        "Optimizer modelopt/onnx/quantization/graph_utils.py build_non_residual_input_map (longest path to "
        "the lowest common ancestor); fixtures resnet50_placed vs resnet50_ortfb (16 unfused Add+Relu "
        "PointWiseV2 layers with Q/DQ on both inputs, 0.73x implicit)",
    ),
    PlacementRule(
        "place-no-qdq-relu-maxpool",
        "Conv -> (BN) -> Relu -> MaxPool where the Relu output is read by the MaxPool alone: no Q/DQ "
        "between the Relu and the MaxPool; quantize after the pool, so TensorRT can build CaskConvActPool. "
        "(A Relu output with other readers cannot fuse into the pool; it is quantized once for all.)",
        "fixtures resnet50.implicit.layers.json ('/conv1/Conv + /relu/Relu + /maxpool/MaxPool' as "
        "CaskConvActPool) and resnet50_placed.explicit.layers.json (same fusion once that Q/DQ is gone); "
        "NVIDIA/TensorRT-Model-Optimizer graph_utils.py get_fusible_backbone ([MaxPool, Relu, "
        "BatchNormalization, BiasAdd, Conv] is one fusible backbone)",
    ),
    PlacementRule(
        "place-commute",
        "Concat and the ops that only move data (MaxPool, Split, Slice, Reshape, Transpose, Flatten, "
        "Squeeze/Unsqueeze, nearest Resize, ...: edgeq.graph.patterns.SCALE_PRESERVING_OPS, the list lint "
        "reads) commute with Q/DQ: they get no Q/DQ of their own; the Q/DQ a downstream weighted op needs "
        "is placed on their inputs and their outputs run INT8. Measured exception: a weighted op that "
        "reads a Concat also gets its own (place-concat-conv).",
        f"{TRT86_GUIDE} > 'TensorRT Processing Of Q/DQ Networks' (Q/DQ propagation, commute-with-"
        "quantization layers such as Max Pooling); edgeq/docs/trt86-rules.md#what-fuses",
    ),
    PlacementRule(
        "place-concat-shared-scale",
        "All inputs of a Concat that runs INT8 (and the Split or other commuting ops feeding them) share "
        "one scale: the largest amax of the group. Otherwise TensorRT inserts requantizing copies.",
        f"{TRT86_GUIDE} > 'Q/DQ Limitations' (scale-dependent rewrites happen only when the compared "
        "scales are equal); NVIDIA/TensorRT-Model-Optimizer graph_utils.py get_concat_eliminated_tensors; "
        "fixture yolo.implicit.build.log (27 interior Reformat copies around C2f split/concat and SPPF)",
    ),
    PlacementRule(
        "place-silu-whole",
        "SiLU (x * Sigmoid(x)) stays whole: no Q/DQ on the Sigmoid's input or output nor on the Mul's "
        "inputs; only the SiLU's output may be quantized when a consumer needs INT8, and its input when it "
        "feeds a residual Add (place-silu-residual: one Q/DQ read by both the Sigmoid and the Mul).",
        "fixture yolo_ortfb.explicit.build.log ('Could not find any implementation for node "
        f"PWN(PWN(.../Sigmoid), PWN(.../Mul))'); {TRT86_GUIDE} > 'Q/DQ Layer-Placement Recommendations' "
        "(SiLU after a linear op wants a higher-precision input); NVIDIA/TensorRT-Model-Optimizer "
        "get_fusible_backbone ([Mul, Sigmoid, BatchNormalization, Conv])",
    ),
    PlacementRule(
        "place-concat-conv",
        "A weighted op that reads a Concat (directly, or through ops that move data) gets its own Q/DQ "
        "pair right before it, on the Concat's output, in the Concat's scale group. TensorRT 8.6 does not "
        "carry the DQ on the Concat's inputs forward to the convolution: it clones the DQ per Split "
        "output, concatenates in FP16 and runs the convolution in FP16/FP32.",
        "measured: fixtures trt86-h200-edgeq/yolo_edgeq.explicit.layers.json (every C2f/SPPF cv2 "
        "convolution FP16/FP32 behind '..._DequantizeLinear_clone_N' INT8->FP16 reformats) vs "
        "yolo_fix2.explicit.layers.json (one Q/DQ before each such convolution: 49/49 INT8, the implicit "
        "engine's 69 layers, 1.00x implicit)",
    ),
    PlacementRule(
        "place-silu-residual",
        "A SiLU whose output is the convolution branch of a residual Add: quantize the SiLU's input (the "
        "convolution's output, one Q/DQ read by both the Sigmoid and the Mul) and the skip, so the "
        "convolution ends in INT8 and PWN(Sigmoid, Mul, Add) runs INT8. TensorRT 8.6 cannot fuse "
        "Conv+SiLU+Add into one kernel, so ResNet's skip-only placement leaves that PointWise in FP16.",
        "measured: fixtures trt86-h200-edgeq/yolo_edgeq.explicit.layers.json (each bottleneck's "
        "PWN(PWN(Sigmoid, Mul), Add) FP16 behind reformats) vs yolo_fix1.explicit.layers.json (the 8 "
        "PointWise layers INT8) and yolo_edgeq.implicit.layers.json (the same layers)",
    ),
    PlacementRule(
        "place-pool-tail",
        "An averaging op (GlobalAveragePool; AveragePool and ReduceMean by the same reasoning, unverified) "
        "that reads a convolution's fused chain gets a Q/DQ on its input, so the convolution (with its "
        "residual Add and ReLU) ends in INT8 and the pool runs INT8.",
        "measured: fixtures trt86-h200-edgeq/r50b64_edgeq.explicit.layers.json (last 'conv3 + Add + "
        "Relu' and GlobalAveragePool FP16, 3 interior reformats) vs r50b64_tailfix.explicit.layers.json "
        "(one Q/DQ on the pool's input: 55/55 INT8, the implicit engine's layers); AveragePool and "
        "ReduceMean unverified on 8.6",
    ),
    PlacementRule(
        "place-not-int8-consumer",
        "No consumer of this tensor runs INT8 under the rules above: a Q/DQ pair here would add a layer "
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

RULES: dict[str, PlacementRule] = {r.id: r for r in _RULES}

# Weighted ops: their inputs are quantized (place-weighted-inputs). One definition, shared with lint.
WEIGHTED_OPS = _patterns.WEIGHTED_OPS

# --placement all: onnxruntime's quantizable ops (QLinearOpsRegistry | QDQRegistry, onnxruntime 1.31).
ORT_QUANTIZABLE_OPS = frozenset({
    "ArgMax", "AveragePool", "BatchNormalization", "Clip", "Concat", "Conv", "ConvTranspose", "CumSum",
    "Flatten", "Gather", "GatherElements", "Gemm", "GlobalAveragePool", "InstanceNormalization",
    "LayerNormalization", "LeakyRelu", "MatMul", "MaxPool", "Mul", "Add", "Pad", "Relu", "Reshape",
    "Resize", "Sigmoid", "Slice", "Softmax", "Split", "Squeeze", "TopK", "Transpose", "Unsqueeze", "Where",
})


def rule(rule_id: str) -> PlacementRule:
    """The rule with this id; a KeyError here is a bug (a decision tagged with an unknown id)."""
    return RULES[rule_id]
