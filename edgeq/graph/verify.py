"""Numerical check that a rewritten model still computes what the original did (onnxruntime, CPU).

Both models run with onnxruntime's graph optimizations off, so each op runs as the ONNX spec defines
it: the comparison is of the two graphs, not of onnxruntime's fusions (its QDQ fusions pick different
int8 kernels for uint8 and int8 models).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeq.errors import GraphError, first_line

if TYPE_CHECKING:
    import numpy as np
    import onnx


@dataclass(frozen=True)
class Verification:
    """The comparison's result: truthy when every output is within tolerance.

    An element fails when it is beyond both ``atol`` and ``rtol`` (Polygraphy's comparator rule).
    ``outputs`` maps each output to its (max abs, max rel) error; ``worst`` names the deciding output.
    """

    max_abs: float
    max_rel: float
    outputs: dict[str, tuple[float, float]]
    passed: bool
    atol: float = 1e-4
    rtol: float = 1e-3
    worst: str = ""
    failed_elements: int = 0
    total_elements: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        from edgeq.text import number, plain  # figures never in e-notation ("5.22e-08")

        where = f" (output '{self.worst}')" if self.worst else ""
        where += "".join(f"; {n}" for n in self.notes)
        atol, rtol = plain(self.atol), plain(self.rtol)
        if self.passed:
            return (
                f"PASSED: max abs error {number(self.max_abs)} (atol {atol}), max rel error "
                f"{number(self.max_rel)} (rtol {rtol}){where}"
            )
        return (
            f"FAILED: {self.failed_elements} of {self.total_elements} values beyond atol {atol} "
            f"and rtol {rtol}; max abs error {number(self.max_abs)}, "
            f"max rel error {number(self.max_rel)}{where}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "max_abs": _json_float(self.max_abs),
            "max_rel": _json_float(self.max_rel),
            "atol": self.atol,
            "rtol": self.rtol,
            "worst_output": self.worst,
            "failed_elements": self.failed_elements,
            "notes": list(self.notes),
            "outputs": {
                k: {"max_abs": _json_float(a), "max_rel": _json_float(r)}
                for k, (a, r) in self.outputs.items()
            },
        }


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def static_inputs(model: onnx.ModelProto) -> dict[str, tuple[list[int], np.dtype]]:
    """Shape and numpy dtype of each input a caller must feed (not initializers), for made-up inputs:
    dynamic dimensions become 1. (``edgeq.quant.data.inputs.input_specs`` keeps them open for real data.)"""
    import onnx

    inits = {t.name for t in model.graph.initializer}
    specs: dict[str, tuple[list[int], np.dtype]] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or tt.elem_type == 0:
            raise GraphError(f"input '{vi.name}' is not a tensor of known type; cannot make inputs for it")
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tt.shape.dim]
        specs[vi.name] = (shape, onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
    return specs


MADE_UP_INPUT_LIMIT = 1 << 30  # bytes per made-up input: far past any real batch, far under a MemoryError


def oversized_input(name: str, shape: Sequence[int], dtype: Any) -> str | None:
    """Why made-up data for input ``name`` of ``shape`` would not fit in memory, or None when it does.

    A model can announce any shape ([1e9, 3, 224, 224] is 548 TiB of float32); numpy would only fail
    at allocation, with a MemoryError traceback."""
    import numpy as np

    size = math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
    if size <= MADE_UP_INPUT_LIMIT:
        return None
    dims = "x".join(str(int(d)) for d in shape)
    return (f"input '{name}' announces shape {dims} ({_bytes(size)} of {np.dtype(dtype).name}); "
            f"edgeq makes up inputs of at most {_bytes(MADE_UP_INPUT_LIMIT)}")


def shape_hint(name: str) -> str:
    """How to give an input a realistic fixed shape in the model itself."""
    return ("set a real shape in the model: python -m onnxruntime.tools.make_dynamic_shape_fixed "
            f"--input_name {name} --input_shape 1,3,224,224 IN.onnx OUT.onnx")


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def random_inputs(model: onnx.ModelProto, seed: int = 0, shapes: dict[str, tuple[int, ...]] | None = None
                  ) -> dict[str, np.ndarray]:  # fmt: skip
    """Random inputs of the model's shapes: a dynamic input at its shape in ``shapes`` (resolved by
    ``edgeq.graph.shapes``), else with its dynamic dimensions 1.

    Floats are uniform in [0, 1) like normalized images; integers small and non-negative; bools random.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for name, (shape, dtype) in static_inputs(model).items():
        shape = list((shapes or {}).get(name, shape))
        too_big = oversized_input(name, shape, dtype)
        if too_big:
            raise GraphError(too_big, hint=f"--no-verify skips the comparison, or {shape_hint(name)}")
        if dtype.kind == "f":
            feeds[name] = rng.random(shape, dtype=np.float32).astype(dtype)
        elif dtype.kind in "iu":
            feeds[name] = rng.integers(0, 4, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[name] = rng.random(shape) < 0.5
        else:
            raise GraphError(f"input '{name}' has type {dtype}; cannot make random inputs for it",
                             hint="--no-verify skips the comparison")
        # A rank-0 input (an If condition, a scalar) comes out of numpy as a scalar; onnxruntime wants arrays.
        feeds[name] = np.asarray(feeds[name])
    return feeds


def run_model(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], label: str = "the model", hint: str = ""
) -> dict[str, np.ndarray]:
    """Run once on onnxruntime's CPU provider with graph optimizations off. A failure is one line naming
    the input shapes it ran at (``feeds``'), with ``hint`` before the way around it."""
    import onnxruntime as ort

    from edgeq.graph.io import ort_session

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort_session(model, so, ["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, feeds)))
    except Exception as e:  # onnxruntime raises its own exception types (Fail, InvalidGraph, ...)
        at = ",".join(f"{k}:{'x'.join(str(d) for d in v.shape)}" for k, v in feeds.items())
        raise GraphError(f"onnxruntime cannot run {label} at {at or 'no inputs'}: {ort_message(e)}",
                         hint=f"{hint + '; ' if hint else ''}--no-verify skips the comparison") from None


def ort_message(e: Exception) -> str:
    """onnxruntime's first line without its '[ONNXRuntimeError] : 1 : FAIL : file.cc:46 signature' prefix."""
    import re

    msg = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", first_line(e))
    msg = re.sub(r"^\S+\.(?:h|cc|cpp):\d+ [^\n]*?\) ", "", msg)
    # a kernel's status inside: "Status Message: /onnxruntime_src/.../op_kernel.cc:87 virtual OrtValue* ...
    # [ONNXRuntimeError] : 1 : FAIL : Shape mismatch ..." -> "Status Message: Shape mismatch ..."
    msg = re.sub(r"\S*\.(?:h|cc|cpp):\d+ [^\[]*?\[ONNXRuntimeError\] : \d+ : \w+ : ", "", msg)
    return msg if len(msg) <= 300 else msg[:297] + "..."


def compare_models(
    a: onnx.ModelProto,
    b: onnx.ModelProto,
    *,
    atol: float,
    rtol: float,
    seed: int = 0,
    inputs: dict[str, np.ndarray] | None = None,
    widen_half: bool = False,
    shapes: dict[str, tuple[int, ...]] | None = None,
    hint: str = "",
) -> Verification:
    """Run ``a`` (reference) and ``b`` on the same inputs; compare every output ``a`` has.

    ``widen_half``: when ``a`` is a float16/bfloat16 network, compare both with those types widened to
    float32 (``widened_to_float32``), and say so in the result's notes. ``shapes``: the dynamic inputs'
    shapes for the random inputs (``random_inputs``); ``hint``: what to do when the input model does not
    run at them (the shapes to give).
    """
    import numpy as np

    notes: tuple[str, ...] = ()
    if widen_half and inputs is None and _has_half(a):
        a, b = widened_to_float32(a), widened_to_float32(b)
        notes = (
            "float16 network: both models compared with float16 widened to float32 (onnxruntime's CPU "
            "provider runs float16 layers in float32 and drops roundings, so it cannot compare "
            "float16 graphs exactly)",
        )
    feeds = inputs if inputs is not None else random_inputs(a, seed, shapes)
    ref = run_model(a, feeds, "the input model", hint)
    b_inputs = {i.name for i in b.graph.input}
    try:
        got = run_model(b, {k: v for k, v in feeds.items() if k in b_inputs}, "the result")
    except GraphError as e:
        # The input ran and the result passed the ONNX checker: a rewrite of ours broke it.
        raise RuntimeError(f"edgeq bug: {e.message}; please report it with the model") from e
    outputs: dict[str, tuple[float, float]] = {}
    failed = total = 0
    worst, worst_key = "", (-1.0, -1.0)
    max_abs = max_rel = 0.0
    for name, r in ref.items():
        if name not in got:
            raise RuntimeError(f"edgeq bug: the result lost output '{name}'; please report it with the model")
        g = got[name]
        if r.shape != g.shape:
            raise RuntimeError(
                f"edgeq bug: output '{name}' changed shape: {r.shape} -> {g.shape}; please report it"
            )
        r64, g64 = np.asarray(r, dtype=np.float64), np.asarray(g, dtype=np.float64)
        _refuse_nonfinite(name, r64, g64)
        absdiff = np.abs(r64 - g64)
        absdiff = np.where(np.isnan(absdiff), np.inf, absdiff)
        with np.errstate(divide="ignore", invalid="ignore"):
            reldiff = np.where(absdiff == 0, 0.0, absdiff / np.abs(r64))
        bad = (absdiff > atol) & (reldiff > rtol)
        a_max = float(absdiff.max(initial=0.0))
        r_max = float(reldiff.max(initial=0.0))
        outputs[name] = (a_max, r_max)
        failed += int(bad.sum())
        total += int(bad.size)
        key = (float(bad.sum()), a_max)
        if key > worst_key:
            worst, worst_key = name, key
        max_abs, max_rel = max(max_abs, a_max), max(max_rel, r_max)
    return Verification(
        max_abs=max_abs,
        max_rel=max_rel,
        outputs=outputs,
        passed=failed == 0,
        atol=atol,
        rtol=rtol,
        worst=worst,
        failed_elements=failed,
        total_elements=total,
        notes=notes,
    )


def _refuse_nonfinite(name: str, ref: np.ndarray, got: np.ndarray) -> None:
    """NaN or inf in the reference where the result has them too is no agreement: the input itself
    computes nothing to compare (NaN weights, a division by a zero constant), even on plain inputs."""
    import numpy as np

    both = ~np.isfinite(ref) & ~np.isfinite(got)
    n = int(both.sum())
    if n:
        raise GraphError(
            f"the input model computes non-finite values (NaN/inf) in {n} of {ref.size} values of output "
            f"'{name}' on the comparison's inputs: there is nothing to verify the result against",
            hint="check the model's weights and constants for NaN/inf; --no-verify writes it unverified",
        )


def _has_half(model: onnx.ModelProto) -> bool:
    from edgeq.graph.io import half_types

    half = half_types()
    g = model.graph
    return any(v.type.tensor_type.elem_type in half for v in list(g.input) + list(g.output)) or any(
        t.data_type in half for t in g.initializer
    )


def widened_to_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with every float16/bfloat16 tensor, initializer, Constant and Cast made float32.

    The graph's structure and every other value stay as they are, so comparing two widened models checks
    that a rewrite kept the graph's function up to float16 rounding.
    """
    import onnx
    from onnx import numpy_helper

    from edgeq.graph.io import half_types

    half = half_types()
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph

    def widen(t: onnx.TensorProto) -> None:
        if t.data_type in half:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype("float32"), t.name))

    for t in g.initializer:
        widen(t)
    for v in list(g.input) + list(g.output) + list(g.value_info):
        if v.type.tensor_type.elem_type in half:
            v.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    for n in g.node:
        for a in n.attribute:
            if a.name == "to" and a.i in half:
                a.i = onnx.TensorProto.FLOAT
            if a.type == onnx.AttributeProto.TENSOR:
                widen(a.t)
    return out


def without_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """The float graph of a Q/DQ model: each activation Q->DQ pair becomes an Identity, each weight DQ its
    dequantized initializer. The weights stay the rounded ones (the FP32 originals are not in a Q/DQ
    file), so as a deploy's reference it isolates what activation quantization and TensorRT's kernels
    cost, and clean verifies a fold through it (a float reordering flips roundings at activation Q)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    producers = {o: n for n in g.node for o in n.output}
    inits = {i.name: i for i in g.initializer}
    nodes, added = [], []
    for n in g.node:
        if n.op_type == "DequantizeLinear":
            src = producers.get(n.input[0])
            if src is not None and src.op_type == "QuantizeLinear":
                nodes.append(helper.make_node("Identity", [src.input[0]], [n.output[0]], name=n.name))
                continue
            if n.input[0] in inits:
                w = numpy_helper.to_array(inits[n.input[0]]).astype(np.float32)
                scale = numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)
                zp = (numpy_helper.to_array(inits[n.input[2]]).astype(np.float32)
                      if len(n.input) > 2 and n.input[2] in inits else np.zeros_like(scale))  # fmt: skip
                if scale.ndim == 1 and scale.size > 1:
                    axis = next((a.i for a in n.attribute if a.name == "axis"), 1) % w.ndim
                    shape = [1] * w.ndim
                    shape[axis] = scale.size
                    scale, zp = scale.reshape(shape), zp.reshape(shape)
                added.append(numpy_helper.from_array(((w - zp) * scale).astype(np.float32), n.output[0]))
                continue
        nodes.append(n)
    used = {i for n in nodes for i in n.input} | {o.name for o in g.output}
    nodes = [n for n in nodes if n.op_type != "QuantizeLinear" or any(o in used for o in n.output)]
    used = {i for n in nodes for i in n.input} | {o.name for o in g.output}
    kept = [i for i in g.initializer if i.name in used]
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(kept + added)
    return m
