"""How edgeq evaluates a Q/DQ model: the one onnxruntime session every accuracy figure comes from.

Why one place: the accuracy check, ``--calibrator auto``, ``edgeq sensitivity``, ``--max-loss``, deploy's
"Q/DQ" prediction beside TensorRT's own figure and the fleet's accuracy column all judge a Q/DQ model by
running it on the host. With its default graph optimizations onnxruntime fuses DequantizeLinear -> op ->
QuantizeLinear into its own integer kernels (QLinearConv, QLinearAdd, ...; its QDQ selector/action
transformers), whose results depend on the host's instruction set: on x86 with AVX2 and no VNNI its
u8 x s8 kernels can saturate (onnxruntime's quantization docs), and on any host they requantize in their
own way. The figures then differ from host to host and need not be what TensorRT's engine computes.

``ENGINE_ARITHMETIC`` names the arithmetic every evaluation uses; change it there and nowhere else.
``Arithmetic.UNFUSED`` is onnxruntime with its Q/DQ fusions off (session config
``session.disable_quant_qdq`` = "1"; onnxruntime's ``optimizer/graph_transformer_utils.cc``): no QDQ
selector/action transformer (the fusions into QLinearConv, QGemm, QLinearAdd, ...), no QDQ propagation,
no S8->U8 rewrite, and constant folding then folds each weight's DequantizeLinear into a float
initializer (int8 x scale, exact). Every activation QuantizeLinear -> DequantizeLinear runs as written
(x / scale rounded half to even, saturated to int8, times the scale) and every other operator in float:
the arithmetic the Q/DQ graph defines, which is what TensorRT 8.6's explicit-precision engine is to
keep (Developer Guide 8.6, "Working with INT8": the Q/DQ nodes define the quantization; its INT8
kernels accumulate in 32 bits). One more onnxruntime rewrite changes Q/DQ arithmetic without integer
kernels and is turned off too: ``DoubleQDQPairsRemover`` (Q->DQ->Q->DQ of two scales merged into one
pair of a new scale). ``QDQFinalCleanupTransformer`` at its defaults removes only DQ->Q of equal scale
and zero point (an identity on int8). Float operators keep onnxruntime's float optimizations (Conv+Relu
fusion, NCHWc layouts): they change float rounding (about 1e-7 relative), not the arithmetic.

Measured: on an emulated AVX2 CPU without AVX-512 or VNNI (``bench/avx2_emulation.py``, qemu's Haswell)
the fused path moved a small quantized net's outputs by up to 1.4 (outputs up to 2.5) while this one
matched a numpy reference of the arithmetic to 1e-7, as on the AVX-512 VNNI host. Which arithmetic
TensorRT's engine matches, per output and sample, is what ``bench/engine_vs_ort.py`` measures on the
device (its figures are in the docs).

The float model's calibration (``quant.calibrate``) keeps its own fast session: it has no Q/DQ nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING

from edgeq.errors import QuantError, first_line

if TYPE_CHECKING:
    import onnx
    import onnxruntime as ort


class Arithmetic(str, Enum):
    """How onnxruntime computes a Q/DQ model (``session_options``)."""

    UNFUSED = "unfused"  # Q/DQ fusions off: DequantizeLinear feeds float operators (the graph as written)
    FUSED = "fused"  # onnxruntime's defaults: DQ -> op -> Q fused into its integer kernels (host-dependent)
    LITERAL = "literal"  # no graph optimization at all: every node as written, weight DQs run each time

# The arithmetic every evaluation of a Q/DQ model uses: the one TensorRT 8.6's explicit engine matches
# (bench/engine_vs_ort.py measures it; the docs give the figures). One line to change.
ENGINE_ARITHMETIC = Arithmetic.UNFUSED

# Evaluation runs on onnxruntime's CPU provider unless a caller names providers: its CUDA provider runs
# float convolutions with TF32 and per-GPU cuDNN algorithms, so its figures would again depend on the host.
EVALUATION_PROVIDERS = ("CPUExecutionProvider",)


def session_options(arithmetic: Arithmetic = ENGINE_ARITHMETIC) -> ort.SessionOptions:
    """onnxruntime's session options for ``arithmetic`` (``graph.io.ort_session`` makes them quiet)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if arithmetic == Arithmetic.LITERAL:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    elif arithmetic == Arithmetic.UNFUSED:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.add_session_config_entry("session.disable_quant_qdq", "1")
        so.add_session_config_entry("session.disable_double_qdq_remover", "1")
    else:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return so


def evaluation_session(model: onnx.ModelProto, providers: Sequence[str] | None = None, *,
                       arithmetic: Arithmetic = ENGINE_ARITHMETIC, purpose: str = "the accuracy check"
                       ) -> ort.InferenceSession:
    """The session that evaluates ``model`` (Q/DQ or float) as the engine computes it; a model
    onnxruntime cannot load is a ``QuantError`` naming ``purpose``."""
    from edgeq.graph.io import ort_session

    try:
        return ort_session(model, session_options(arithmetic), list(providers or EVALUATION_PROVIDERS))
    except Exception as e:  # onnxruntime raises its own untyped failures
        raise QuantError(f"onnxruntime cannot load the model for {purpose}: {first_line(e)}") from None
