"""Transformers: a ViT-like encoder (patch embedding, LayerNorm, multi-head attention with Softmax, a GELU
MLP), as ``torch.onnx.export(opset_version=17)`` writes one: the regions TensorRT 8.6 compiles with Myelin
(``edgeq rules myelin-region``)."""

from __future__ import annotations

import numpy as np
import onnx

from edgeq.zoo.net import Net


def attention(net: Net, x: str, scope: str, *, batch: int, tokens: int, dim: int, heads: int) -> str:
    """timm's Attention: one qkv Linear, reshape to (3, B, heads, N, d), q @ k^T * scale, Softmax, @ v,
    back to (B, N, dim), the projection Linear."""
    hd = dim // heads
    qkv = net.linear(x, f"{scope}/qkv", dim, 3 * dim, param=f"{scope.strip('/').replace('/', '.')}.qkv")
    shape = net.const(scope, [batch, tokens, 3, heads, hd], np.int64)
    qkv = net.node("Reshape", scope, [qkv, shape])[0]
    qkv = net.node("Transpose", scope, [qkv], perm=[2, 0, 3, 1, 4])[0]
    q, k, v = (net.node("Gather", scope, [qkv, net.const(scope, i, np.int64)], axis=0)[0] for i in range(3))
    kt = net.node("Transpose", scope, [k], perm=[0, 1, 3, 2])[0]
    att = net.node("MatMul", scope, [q, kt])[0]
    att = net.node("Mul", scope, [att, net.const(scope, hd ** -0.5)])[0]
    att = net.node("Softmax", scope, [att], axis=-1)[0]
    y = net.node("MatMul", scope, [att, v])[0]
    y = net.node("Transpose", scope, [y], perm=[0, 2, 1, 3])[0]
    y = net.node("Reshape", scope, [y, net.const(scope, [batch, tokens, dim], np.int64)])[0]
    return net.linear(y, f"{scope}/proj", dim, dim, param=f"{scope.strip('/').replace('/', '.')}.proj")


def mlp(net: Net, x: str, scope: str, dim: int, hidden: int) -> str:
    """Linear -> GELU (Erf) -> Linear, over the last axis (tokens or NHWC pixels)."""
    p = scope.strip("/").replace("/", ".")
    y = net.linear(x, f"{scope}/fc1", dim, hidden, param=f"{p}.fc1")
    y = net.gelu(y, f"{scope}/act")
    return net.linear(y, f"{scope}/fc2", hidden, dim, param=f"{p}.fc2")


def vit_like(*, batch: int = 1, size: int = 32, patch: int = 8, dim: int = 32, depth: int = 1, heads: int = 2,
             mlp_ratio: int = 2, classes: int = 10, seed: int = 0, layernorm: str = "op") -> onnx.ModelProto:
    """ViT-like: a patch-embedding Conv (the one convolution), class token and position embedding, then
    ``depth`` pre-norm blocks (LayerNorm -> attention -> Add, LayerNorm -> Linear/GELU/Linear -> Add), a final
    LayerNorm, the class token's row to a Gemm head. ``layernorm="decomposed"`` writes each LayerNorm as
    ReduceMean/Sub/Pow/Sqrt/Div (exports below opset 17 and hand-written norms)."""
    if size % patch:
        raise ValueError(f"vit_like needs size % patch == 0, got {size} and {patch}")
    if layernorm not in ("op", "decomposed"):
        raise ValueError(f"layernorm must be 'op' or 'decomposed', got {layernorm!r}")
    dec = layernorm == "decomposed"
    net = Net(seed)
    n = (size // patch) ** 2
    x = net.conv("input", "/conv_proj", 3, dim, patch, patch, 0, param="conv_proj")
    x = net.node("Reshape", "", [x, net.const("", [batch, dim, n], np.int64)])[0]
    x = net.node("Transpose", "", [x], perm=[0, 2, 1])[0]
    cls = net.init("class_token", (0.02 * net.rng.standard_normal((1, 1, dim))).astype(np.float32))
    cls = net.node("Expand", "", [cls, net.const("", [batch, 1, dim], np.int64)])[0]
    x = net.concat([cls, x], "", axis=1)
    pos = net.init("encoder.pos_embedding",
                   (0.02 * net.rng.standard_normal((1, n + 1, dim))).astype(np.float32))
    x = net.add(x, pos, "/encoder")
    for i in range(depth):
        s = f"/encoder/layers/encoder_layer_{i}"
        p = s.strip("/").replace("/", ".")
        y = net.layer_norm(x, f"{s}/ln_1", dim, param=f"{p}.ln_1", decomposed=dec)
        x = net.add(x, attention(net, y, f"{s}/self_attention", batch=batch, tokens=n + 1, dim=dim,
                                 heads=heads), s)
        y = net.layer_norm(x, f"{s}/ln_2", dim, param=f"{p}.ln_2", decomposed=dec)
        x = net.add(x, mlp(net, y, f"{s}/mlp", dim, mlp_ratio * dim), s)
    x = net.layer_norm(x, "/encoder/ln", dim, param="encoder.ln", decomposed=dec)
    x = net.node("Gather", "", [x, net.const("", 0, np.int64)], axis=1)[0]
    w = net.init("heads.head.weight",
                 net.rng.standard_normal((classes, dim)).astype(np.float32) / np.sqrt(dim))
    b = net.init("heads.head.bias", (0.01 * net.rng.standard_normal(classes)).astype(np.float32))
    net.node("Gemm", "/heads/head", [x, w, b], out="output", alpha=1.0, beta=1.0, transB=1)
    return net.model("vit_like", batch, size, [batch, classes], opset=17)
