"""A numpy reference of the arithmetic a Q/DQ graph defines, for small models built in code.

Each node as the ONNX spec defines it, in float64 except where the spec's own steps are float32:
QuantizeLinear divides in float32 (x / scale, as onnxruntime and TensorRT do), rounds half to even and
saturates to int8; DequantizeLinear is (q - zero point) x scale, per channel along ``axis``; every other
operator in float64 on the dequantized values. This is what ``edgeq.quant.evaluate``'s arithmetic must
reproduce (and what TensorRT's INT8 kernels compute up to their accumulation order and FP16 layers).

``boundary_margin``: how close any QuantizeLinear input came to a rounding boundary (in quantization
steps): a test that compares against this reference checks it first, so float rounding of another
library (1e-7 relative) cannot flip a level and the comparison can be tight.

Supported: QuantizeLinear, DequantizeLinear, Conv (group 1), Gemm, MatMul, Add, Mul, Relu,
GlobalAveragePool, Flatten, Reshape. Anything else raises ``NotImplementedError``. ``small_net`` is the
float model the tests (and ``bench/avx2_emulation.py``) quantize and compare with it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _attrs(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _broadcast(param: np.ndarray, x: np.ndarray, axis: int) -> np.ndarray:
    """A per-channel parameter shaped to broadcast along ``axis`` of ``x``; a scalar as is."""
    if param.ndim == 0 or param.size == 1:
        return param.reshape(())
    shape = [1] * x.ndim
    shape[axis % x.ndim] = param.size
    return param.reshape(shape)


def quantize(x: np.ndarray, scale: np.ndarray, zero: np.ndarray, axis: int = 1) -> np.ndarray:
    s = _broadcast(np.asarray(scale, np.float32), x, axis)
    z = _broadcast(np.asarray(zero).astype(np.int32), x, axis)
    q = np.rint(np.asarray(x, np.float32) / s).astype(np.int32) + z  # np.rint: half to even
    info = np.iinfo(np.asarray(zero).dtype)
    return np.clip(q, info.min, info.max)


def dequantize(q: np.ndarray, scale: np.ndarray, zero: np.ndarray, axis: int = 1) -> np.ndarray:
    s = _broadcast(np.asarray(scale, np.float64), q, axis)
    z = _broadcast(np.asarray(zero).astype(np.int64), q, axis)
    return (np.asarray(q).astype(np.int64) - z) * s


def conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict[str, Any]) -> np.ndarray:
    if attrs.get("group", 1) != 1 or any(d != 1 for d in attrs.get("dilations", [1, 1])):
        raise NotImplementedError("Conv with groups or dilations")
    kh, kw = w.shape[2:]
    sh, sw = attrs.get("strides", [1, 1])
    top, left, bottom, right = attrs.get("pads", [0, 0, 0, 0])
    x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
    y = np.einsum("nchwij,ocij->nohw", win, w)
    return y + b.reshape(1, -1, 1, 1) if b is not None else y


def run(model: Any, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """(the graph outputs, in float64; the smallest distance of a QuantizeLinear input from a rounding
    boundary, in steps: 0.5 is the most there can be)."""
    import onnx

    env: dict[str, Any] = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    env.update({k: np.asarray(v) for k, v in feeds.items()})
    margin = 0.5
    for node in model.graph.node:
        a = _attrs(node)
        ins = [env[n] if n else None for n in node.input]
        op = node.op_type
        if op == "QuantizeLinear":
            x, scale, zero = ins[0], ins[1], ins[2] if len(ins) > 2 else np.int8(0)
            steps = np.asarray(x, np.float32) / _broadcast(np.asarray(scale, np.float32), x, a.get("axis", 1))
            margin = min(margin, float(np.min(np.abs(np.abs(steps - np.floor(steps)) - 0.5))) if steps.size
                         else margin)
            out = quantize(x, scale, zero, a.get("axis", 1)).astype(np.asarray(zero).dtype)
        elif op == "DequantizeLinear":
            zero = ins[2] if len(ins) > 2 else np.int8(0)
            out = dequantize(ins[0], ins[1], zero, a.get("axis", 1))
        elif op == "Conv":
            out = conv(np.asarray(ins[0], np.float64), np.asarray(ins[1], np.float64),
                       None if len(ins) < 3 or ins[2] is None else np.asarray(ins[2], np.float64), a)
        elif op == "Gemm":
            x, w = np.asarray(ins[0], np.float64), np.asarray(ins[1], np.float64)
            x, w = (x.T if a.get("transA") else x), (w.T if a.get("transB") else w)
            out = a.get("alpha", 1.0) * (x @ w)
            if len(ins) > 2 and ins[2] is not None:
                out = out + a.get("beta", 1.0) * np.asarray(ins[2], np.float64)
        elif op == "MatMul":
            out = np.asarray(ins[0], np.float64) @ np.asarray(ins[1], np.float64)
        elif op == "Add":
            out = np.asarray(ins[0], np.float64) + np.asarray(ins[1], np.float64)
        elif op == "Mul":
            out = np.asarray(ins[0], np.float64) * np.asarray(ins[1], np.float64)
        elif op == "Relu":
            out = np.maximum(np.asarray(ins[0], np.float64), 0.0)
        elif op == "GlobalAveragePool":
            out = np.asarray(ins[0], np.float64).mean(axis=(2, 3), keepdims=True)
        elif op == "Flatten":
            x = np.asarray(ins[0])
            k = a.get("axis", 1)
            out = x.reshape(int(np.prod(x.shape[:k])), -1)
        elif op == "Reshape":
            out = np.asarray(ins[0]).reshape([int(d) if d else s for d, s in
                                              zip(ins[1], (*np.shape(ins[0]), *[0] * len(ins[1])))])
        else:
            raise NotImplementedError(f"numpy reference: {op}")
        env[node.output[0]] = out
    return {o.name: np.asarray(env[o.name], np.float64) for o in model.graph.output}, margin


def small_net(size: int = 8, width: int = 8, classes: int = 10, seed: int = 0) -> Any:
    """x (1, 3, size, size) -> Conv 3x3 + bias -> Relu -> Conv 3x3 + bias -> Add (the Relu's output) ->
    Relu -> GlobalAveragePool -> Flatten -> Gemm (transB) -> y (1, classes): Conv, Gemm, Add and Relu, each
    weighted layer with ``width`` (or ``classes``) output channels for per-channel weight scales."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def t(name: str, a: np.ndarray) -> Any:
        return numpy_helper.from_array(np.asarray(a, np.float32), name)

    normal = rng.standard_normal
    inits = [t("w1", normal((width, 3, 3, 3)) * 0.4), t("b1", normal(width) * 0.1),
             t("w2", normal((width, width, 3, 3)) * 0.2), t("b2", normal(width) * 0.1),
             t("wf", normal((classes, width)) * 0.5), t("bf", normal(classes) * 0.1)]
    pads = [1, 1, 1, 1]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="/conv1/Conv", pads=pads),
             helper.make_node("Relu", ["c1"], ["r1"], name="/relu1/Relu"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="/conv2/Conv", pads=pads),
             helper.make_node("Add", ["c2", "r1"], ["a"], name="/add/Add"),
             helper.make_node("Relu", ["a"], ["r2"], name="/relu2/Relu"),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="/pool/GlobalAveragePool"),
             helper.make_node("Flatten", ["p"], ["f"], name="/flatten/Flatten"),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="/fc/Gemm", transB=1)]
    graph = helper.make_graph(nodes, "small_net",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, classes])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def clear_samples(model: Any, n: int, seed: int, margin: float = 5e-5, tries: int = 200
                  ) -> list[dict[str, np.ndarray]]:
    """``n`` standard-normal inputs of the Q/DQ ``model`` none of whose QuantizeLinear inputs lies within
    ``margin`` steps of a rounding boundary (by this reference, so the choice is the same on every host):
    float32 rounding elsewhere (about 4e-5 steps at most at 127 steps) then cannot flip a level."""
    rng = np.random.default_rng(seed)
    name = model.graph.input[0].name
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    out: list[dict[str, np.ndarray]] = []
    for _ in range(tries):
        feed = {name: rng.standard_normal(dims).astype(np.float32)}
        if run(model, feed)[1] >= margin:
            out.append(feed)
        if len(out) == n:
            return out
    raise AssertionError(f"{len(out)} of {n} samples clear of rounding boundaries in {tries} tries")
