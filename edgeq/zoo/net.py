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
             param: str | None = None, gain: float = 1.0, out: str | None = None) -> str:
        """Conv; ``param`` = the module's parameter prefix for a plain conv, None for BN-folded."""
        p = k // 2 if p is None else p
        w, b = self._conv_params(cin, cout, k, gain=gain, folded=param is None)
        wn, bn = (f"{param}.weight", f"{param}.bias") if param else self._folded_name()
        self.init(wn, w)
        self.init(bn, b)
        return self.node("Conv", scope, [x, wn, bn], out=out, dilations=[1, 1], group=1,
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

    def concat(self, xs: list[str], scope: str) -> str:
        return self.node("Concat", scope, xs, axis=1)[0]

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
