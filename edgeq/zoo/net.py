"""The zoo's graph writer, shared by every family of test model: ``Net`` names nodes, tensors and
parameters the way ``torch.onnx.export`` does, so the models carry the names the TensorRT fixtures hold.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8  # what torch.onnx.export writes with onnx<=1.13 and what the TensorRT 8.6 parser is built on
OPSET = 13


class Net:
    """Collects nodes/initializers; weights come from one seeded generator so models are reproducible."""

    def __init__(self, seed: int, first_param_id: int = 100) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._param_id = first_param_id
        self._used: dict[str, int] = {}

    # -- naming -------------------------------------------------------------------------------------
    def scope(self, scope: str, op: str) -> str:
        """Unique node name ``<scope>/<Op>`` as torch writes it: a module called again gets its scope
        suffixed (``/relu_1/Relu``, ``/pool_1/MaxPool``); a repeated top-level op its name (``/Concat_1``)."""
        base = f"{scope}/{op}"
        n = self._used.get(base, 0)
        self._used[base] = n + 1
        if n == 0:
            return base
        return f"/{op}_{n}" if not scope else f"{scope}_{n}/{op}"

    def _folded_name(self) -> tuple[str, str]:
        # torch's exporter names BN-folded Conv parameters onnx::Conv_<id>, weight and bias consecutive,
        # ids advancing by 3 per convolution (see the resnet50 fixtures: onnx::Conv_501, _504, ...).
        w, b = f"onnx::Conv_{self._param_id}", f"onnx::Conv_{self._param_id + 1}"
        self._param_id += 3
        return w, b

    def next_param_id(self) -> int:
        """The next id of a parameter torch names by its op (``onnx::Split_<id>``, ``onnx::Resize_<id>``);
        each call advances it by one."""
        pid = self._param_id
        self._param_id += 1
        return pid

    # -- parameters ---------------------------------------------------------------------------------
    def init(self, name: str, array: np.ndarray) -> str:
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def _conv_params(self, cin: int, cout: int, k: int, groups: int = 1, gain: float = 1.0,
                     folded: bool = True) -> tuple[np.ndarray, np.ndarray]:
        fan_in = cin // groups * k * k
        w = self.rng.standard_normal((cout, cin // groups, k, k)).astype(np.float32)
        w *= gain * np.sqrt(2.0 / fan_in)
        if folded:
            # A BatchNorm folded into the conv: per-channel gamma/sqrt(var) scale and a shift.
            w *= self.rng.uniform(0.5, 1.5, size=(cout, 1, 1, 1)).astype(np.float32)
            b = (0.1 * self.rng.standard_normal(cout)).astype(np.float32)
        else:
            b = (0.05 * self.rng.standard_normal(cout)).astype(np.float32)
        return w, b

    # -- ops ----------------------------------------------------------------------------------------
    def node(self, op: str, scope: str, inputs: list[str], n_out: int = 1, out: str | None = None,
             **attrs: Any) -> list[str]:
        name = self.scope(scope, op)
        outs = [out] if out is not None else [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs

    def conv(self, x: str, scope: str, cin: int, cout: int, k: int, s: int = 1, p: int | None = None, *,
             param: str | None = None, gain: float = 1.0, out: str | None = None, groups: int = 1) -> str:
        """Conv; ``param`` = the module's parameter prefix for a plain conv, None for BN-folded;
        ``groups=cin`` a depthwise convolution."""
        p = k // 2 if p is None else p
        w, b = self._conv_params(cin, cout, k, groups=groups, gain=gain, folded=param is None)
        wn, bn = (f"{param}.weight", f"{param}.bias") if param else self._folded_name()
        self.init(wn, w)
        self.init(bn, b)
        return self.node("Conv", scope, [x, wn, bn], out=out, dilations=[1, 1], group=groups,
                         kernel_shape=[k, k], pads=[p, p, p, p], strides=[s, s])[0]

    def conv_transpose(self, x: str, scope: str, cin: int, cout: int, k: int, s: int, *, param: str) -> str:
        w = self.rng.standard_normal((cin, cout, k, k)).astype(np.float32) * np.sqrt(2.0 / cin)
        b = (0.05 * self.rng.standard_normal(cout)).astype(np.float32)
        self.init(f"{param}.weight", w)
        self.init(f"{param}.bias", b)
        return self.node("ConvTranspose", scope, [x, f"{param}.weight", f"{param}.bias"], dilations=[1, 1],
                         group=1, kernel_shape=[k, k], pads=[0, 0, 0, 0], strides=[s, s])[0]

    def relu(self, x: str, scope: str) -> str:
        return self.node("Relu", scope, [x])[0]

    def silu(self, x: str, scope: str) -> str:
        # opset 13 has no SiLU: torch writes x * Sigmoid(x).
        sig = self.node("Sigmoid", scope, [x])[0]
        return self.node("Mul", scope, [x, sig])[0]

    def maxpool(self, x: str, scope: str, k: int, s: int, p: int) -> str:
        return self.node("MaxPool", scope, [x], ceil_mode=0, dilations=[1, 1], kernel_shape=[k, k],
                         pads=[p, p, p, p], strides=[s, s])[0]

    def add(self, a: str, b: str, scope: str) -> str:
        return self.node("Add", scope, [a, b])[0]

    def concat(self, xs: list[str], scope: str, axis: int = 1) -> str:
        return self.node("Concat", scope, xs, axis=axis)[0]

    # -- transformer ops, as torch.onnx.export(opset_version=17) writes them ------------------------
    def const(self, scope: str, value: Any, dtype: Any = np.float32) -> str:
        """A scalar or small constant named as torch names its folded constants."""
        name = f"{scope}/Constant_{self.next_param_id()}_output_0"
        # not through ``init``: np.ascontiguousarray makes a 0-d array 1-d, and Gather needs a scalar index
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def linear(self, x: str, scope: str, cin: int, cout: int, *, param: str, out: str | None = None) -> str:
        """nn.Linear on a 3-D or 4-D input: MatMul with the transposed weight, then the bias Add (torch
        writes Gemm only for 2-D inputs)."""
        w = self.rng.standard_normal((cin, cout)).astype(np.float32) / np.sqrt(cin)
        b = (0.02 * self.rng.standard_normal(cout)).astype(np.float32)
        wt = self.init(f"onnx::MatMul_{self.next_param_id()}", w)
        bias = self.init(f"{param}.bias", b)
        y = self.node("MatMul", scope, [x, wt])[0]
        return self.node("Add", scope, [bias, y], out=out)[0]

    def layer_norm(self, x: str, scope: str, dim: int, *, param: str, decomposed: bool = False) -> str:
        """nn.LayerNorm over the last axis: one LayerNormalization (opset 17), or ``decomposed`` as older
        opsets and hand-written norms export it (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul,
        Add)."""
        g = self.init(f"{param}.weight", (1.0 + 0.1 * self.rng.standard_normal(dim)).astype(np.float32))
        b = self.init(f"{param}.bias", (0.02 * self.rng.standard_normal(dim)).astype(np.float32))
        if not decomposed:
            return self.node("LayerNormalization", scope, [x, g, b], axis=-1, epsilon=1e-6)[0]
        # opset 17 ReduceMean takes its axes as an attribute (an input only from opset 18)
        mean = self.node("ReduceMean", scope, [x], axes=[-1], keepdims=1)[0]
        d = self.node("Sub", scope, [x, mean])[0]
        sq = self.node("Pow", scope, [d, self.const(scope, 2.0)])[0]
        var = self.node("ReduceMean", scope, [sq], axes=[-1], keepdims=1)[0]
        std = self.node("Sqrt", scope, [self.node("Add", scope, [var, self.const(scope, 1e-6)])[0]])[0]
        y = self.node("Div", scope, [d, std])[0]
        return self.node("Add", scope, [self.node("Mul", scope, [y, g])[0], b])[0]

    def gelu(self, x: str, scope: str) -> str:
        """nn.GELU (exact) as torch exports it below opset 20: x * 0.5 * (1 + Erf(x / sqrt(2)))."""
        t = self.node("Div", scope, [x, self.const(scope, np.sqrt(2.0))])[0]
        e = self.node("Erf", scope, [t])[0]
        a = self.node("Add", scope, [e, self.const(scope, 1.0)])[0]
        m = self.node("Mul", scope, [x, a])[0]
        return self.node("Mul", scope, [m, self.const(scope, 0.5)])[0]

    def model(self, name: str, batch: int, size: int, out_shape: list[int], opset: int = OPSET,
              channels: int = 3) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, channels, size, size])],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, out_shape)],
            self.inits,
        )
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="edgeq.zoo", producer_version="0")
        m.ir_version = IR_VERSION
        return m
