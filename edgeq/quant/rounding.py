"""``--weights adaround``: each int8 weight rounded down or up, whichever leaves its layer's output closest
to FP32's on calibration activations (AdaRound-class: Nagel et al., "Up or Down? Adaptive Rounding for
Post-Training Quantization", ICML 2020).

Why: rounding every weight to the nearest int8 value minimises each weight's own error, not the layer's:
the errors of one output channel's weights add up in its output, and a weight rounded the other way can
cancel its neighbours' (the paper: nearest rounding is far from the best on trained networks).

What changes, and what does not: only the int8 values. Each weight stays floor or ceil of ``w / scale``
with the per-channel scale ``quantize_weight`` gives it, and the Q/DQ model has the same nodes, the same
Q/DQ placement and the same scales, so TensorRT 8.6 builds the same layers from it.

How (numpy only): a layer's output error for one output channel is quadratic in that channel's weight
errors ``d``: ``d H d^T``, with ``H = E[x x^T]`` the Gram matrix of the layer's input patches (im2col)
over calibration samples. ``H`` is collected once per layer from the FP32 model's activations on a
bounded subset of the calibration samples (``RoundingOptions.samples``, ``columns`` positions each),
damped toward the identity (``damp``: the nearest rounding's own objective, against overfitting a few
samples), and then every output channel's choice is made against it, all channels at once. The search
starts at nearest rounding and flips one weight at a time (floor <-> ceil) while a flip lowers the
layer's error (coordinate descent, exact gains from ``H``), in sweeps over the weights up to ``sweeps``.
It never ends above nearest rounding's error on those activations. AdaRound's own search (a rectified
sigmoid annealed to 0/1 by a regulariser, Adam) on the same objective is ``bench/rounding_bench.py
--solvers``: no lower errors, many times the time (the docs' table).

Which inputs: FP32's. AdaRound's asymmetric form (each layer's input as the quantized model gives it,
so the rounding also makes up for the quantization before it: ``learn_rounding(quantized=...)``) lost
accuracy on the bench's detector, made up for the wrong thing each time: against the input with the
activations quantized (full INT8, entropy+ends+max16) 16 of 65 detections kept against nearest's 55;
against the input of the nearest-rounded weights (every activation float) 30 of 65 against 61, since
each upstream layer's own learned rounding replaces the error a layer made up for.

Bounded: ``budget_s`` (layers not reached keep nearest rounding, and the result says so), the sweep cap
per layer, and the samples and positions used; progress on the progress channel, one step per layer and
sample.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeq.errors import QuantError, first_line
from edgeq.findings import ProgressFn, no_progress
from edgeq.text import plural

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnx_graphsurgeon as gs

    from edgeq.quant.plan import Plan

NEAREST = "nearest"  # round half to even, as TensorRT quantizes weights (quantize_weight): today's
ADAROUND = "adaround"  # learned from calibration activations (this module)
AUTO = "auto"  # --calibrator auto scores the learned rounding beside nearest and keeps the better
WEIGHTS = (AUTO, NEAREST, ADAROUND)


@dataclass(frozen=True)
class RoundingOptions:
    """The bounds of one learned rounding."""

    samples: int = 16  # calibration samples whose activations the layers see
    columns: int = 4096  # input positions (output pixels, rows) per sample and layer, a random subset
    sweeps: int = 8  # passes over a layer's weights at most
    damp: float = 0.01  # H + damp * mean(diag H) * I: the rounding leans toward nearest
    budget_s: float = 600.0  # the whole search; layers not reached keep nearest rounding
    seed: int = 0
    memory_mb: float = 512.0  # Gram matrices held at once; more layers: another pass over the samples

    def __post_init__(self) -> None:
        if self.samples < 1 or self.columns < 1 or self.sweeps < 0:
            raise QuantError("rounding needs at least 1 sample and 1 column, and 0 sweeps or more")
        if self.budget_s <= 0:
            raise QuantError(f"the rounding budget must be positive, got {self.budget_s:g} s")


@dataclass(frozen=True)
class LayerRounding:
    """One weighted node's result: the layer's output error on the calibration activations (relative:
    ``sum d H d^T / sum w H w^T`` over its output channels) with nearest and with the learned rounding."""

    node: str
    tensor: str
    nearest: float
    learned: float
    flipped: int  # weights rounded the other way than nearest
    weights: int
    sweeps: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "tensor": self.tensor, "error_nearest": self.nearest,
                "error_learned": self.learned, "flipped": self.flipped, "weights": self.weights,
                "sweeps": self.sweeps, "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class Rounding:
    """The learned int8 values per weight tensor (same shape as the weight, floor or ceil of w/scale),
    what each layer gained, and the layers left at nearest rounding with why."""

    values: dict[str, np.ndarray]
    layers: tuple[LayerRounding, ...]
    skipped: tuple[tuple[str, str], ...]  # (node, why nearest)
    samples: int
    seconds: float
    quantized_inputs: bool = False  # each layer's input as the Q/DQ model gives it, not FP32's

    def summary(self) -> str:
        if not self.layers:
            return "weights: nearest rounding (no layer learned" + (
                f": {self.skipped[0][1]})" if self.skipped else ")")
        gain = [1 - r.learned / r.nearest for r in self.layers if r.nearest > 0]
        flipped = sum(r.flipped for r in self.layers)
        total = sum(r.weights for r in self.layers)
        line = (f"weights: learned rounding on {plural(len(self.layers), 'layer')} from "
                f"{plural(self.samples, 'calibration sample')} in {self.seconds:.1f} s: layer output error "
                f"{sum(gain) / max(len(gain), 1):.0%} below nearest on average, {flipped} of {total} "
                "weights rounded the other way")
        return line + (f"; {plural(len(self.skipped), 'layer')} kept nearest ({self.skipped[0][1]}, ...)"
                       if self.skipped else "")

    def to_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "seconds": round(self.seconds, 2),
                "quantized_inputs": self.quantized_inputs,
                "layers": [r.to_dict() for r in self.layers],
                "nearest": [{"node": n, "why": why} for n, why in self.skipped]}


# ---------------------------------------------------------------------------------------------------
# A weighted node as rows (output channels) x K (the inputs each output channel reads)
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    """A weighted node seen as a matrix product per group: output channel ``r`` of group ``g`` is
    ``W.ravel()[index[g, r]] @ patches[g]``; ``index`` is a permutation of the weight's elements."""

    node: str
    op: str
    tensor: str
    input: str
    axis: int | None
    attrs: dict[str, Any]
    weight: np.ndarray  # float32
    index: np.ndarray  # (groups, rows per group, K) into the weight's flat elements

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.weight.shape)

    @property
    def rows(self) -> np.ndarray:
        """(groups, rows, K): the weight as the matrix products' rows."""
        import numpy as np

        return np.asarray(self.weight.ravel()[self.index], np.float32)

    @property
    def groups(self) -> int:
        return int(self.index.shape[0])

    @property
    def k(self) -> int:
        return int(self.index.shape[2])


def layer_of(node: gs.Node, axis: int | None) -> Layer | str:
    """The node as a ``Layer``, or why its rounding cannot be learned here (it keeps nearest)."""
    import numpy as np

    w = node.inputs[1]
    values = np.asarray(w.values, np.float32)
    shape = tuple(int(d) for d in values.shape)
    x = node.inputs[0]
    attrs = dict(node.attrs)
    size = int(np.prod(shape))
    flat = np.arange(size).reshape(shape)
    if node.op in ("Conv", "ConvTranspose"):
        if len(shape) < 3:
            return f"{node.op} weight of rank {len(shape)}"
        if str(attrs.get("auto_pad", "NOTSET")) not in ("NOTSET", "VALID") and node.op == "ConvTranspose":
            return "ConvTranspose with auto_pad"
        if node.op == "ConvTranspose" and attrs.get("output_shape"):
            return "ConvTranspose with output_shape"
        g = int(attrs.get("group", 1))
        if node.op == "Conv":  # (Cout, Cin/g, k...): output channel r reads its row
            cout = shape[0]
            if cout % g:
                return f"Conv with {cout} output channels in {g} groups"
            index = flat.reshape(g, cout // g, -1)
        else:  # (Cin, Cout/g, k...): the equivalent convolution's kernel, flipped and transposed per group
            cin, cout_g = shape[0], shape[1]
            if cin % g:
                return f"ConvTranspose with {cin} input channels in {g} groups"
            spatial = tuple(range(2, len(shape)))
            per = flat.reshape(g, cin // g, cout_g, *shape[2:])
            per = np.flip(per, axis=tuple(a + 1 for a in spatial))
            index = np.moveaxis(per, 2, 1).reshape(g, cout_g, -1)
        return Layer(node.name, node.op, w.name, x.name, axis, attrs, values, np.ascontiguousarray(index))
    if node.op in ("Gemm", "MatMul"):
        if len(shape) != 2:
            return f"{node.op} weight of rank {len(shape)}"
        trans_b = node.op == "Gemm" and int(attrs.get("transB", 0))
        rows = flat if trans_b else flat.T  # (N, K): output feature n reads row n
        return Layer(node.name, node.op, w.name, x.name, axis, attrs, values,
                     np.ascontiguousarray(rows)[None])
    return f"{node.op} is not a weighted op rounding knows"


def _pads(attrs: dict[str, Any], spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
          dilations: Sequence[int]) -> list[tuple[int, int]]:
    """(begin, end) padding per spatial axis of a Conv, ``auto_pad`` resolved as ONNX defines it."""
    n = len(spatial)
    auto = str(attrs.get("auto_pad", "NOTSET"))
    if isinstance(attrs.get("auto_pad"), bytes):
        auto = attrs["auto_pad"].decode()
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small = total // 2
            out.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
        return out
    if auto == "VALID":
        return [(0, 0)] * n
    pads = [int(p) for p in attrs.get("pads", [0] * (2 * n))]
    return list(zip(pads[:n], pads[n:]))


def patches(layer: Layer, xs: Sequence[np.ndarray], columns: int, rng: np.random.Generator
            ) -> list[np.ndarray]:
    """For each of ``xs`` (the layer's input in one model or another, all of one shape): (groups, K, n),
    ``n`` <= ``columns`` of its input patches, the same random positions for each, ordered as
    ``Layer.index``'s K."""
    import numpy as np

    if layer.op in ("Gemm", "MatMul"):
        k = layer.k
        trans_a = layer.op == "Gemm" and int(layer.attrs.get("transA", 0))
        rows = [(np.asarray(x, np.float32).T if trans_a else np.asarray(x, np.float32)).reshape(-1, k)
                for x in xs]
        total = rows[0].shape[0]
        pick = np.arange(total) if total <= columns else np.sort(rng.choice(total, columns, replace=False))
        return [np.ascontiguousarray(r[pick].T)[None] for r in rows]
    kernel = layer.shape[2:]
    n = len(kernel)
    dil = [int(d) for d in layer.attrs.get("dilations", [1] * n)]
    strides = [int(s) for s in layer.attrs.get("strides", [1] * n)]
    shape = np.asarray(xs[0]).shape
    if layer.op == "ConvTranspose":  # a stride-1 convolution over the input with zeros between its pixels
        out_pad = [int(p) for p in layer.attrs.get("output_padding", [0] * n)]
        pads = [(d * (k - 1) - b, d * (k - 1) - e + o)
                for (b, e), k, d, o in zip(_pads(layer.attrs, shape[2:], kernel, strides, dil), kernel,
                                           dil, out_pad)]
    else:
        pads = _pads(layer.attrs, shape[2:], kernel, strides, dil)
    views = [_windows(np.asarray(x, np.float32), layer.op, pads, kernel, strides, dil) for x in xs]
    outs = views[0].shape[2:2 + n]
    total = int(np.prod((views[0].shape[0], *outs)))
    pick = np.arange(total) if total <= columns else np.sort(rng.choice(total, columns, replace=False))
    where = np.unravel_index(pick, (views[0].shape[0], *outs))
    at: tuple[Any, ...] = (where[0], slice(None), *where[1:])
    g = layer.groups
    # (n, C, k...) (the advanced indices' axis first) -> (groups, K, n)
    return [np.ascontiguousarray(v[at].reshape(len(pick), g, -1).transpose(1, 2, 0)) for v in views]


def _windows(x: np.ndarray, op: str, pads: Sequence[tuple[int, int]], kernel: Sequence[int],
             strides: Sequence[int], dil: Sequence[int]) -> np.ndarray:
    """(B, C, out..., k...): every output position's input window (a view where no copy is needed)."""
    import numpy as np
    from numpy.lib.stride_tricks import sliding_window_view

    n = len(kernel)
    if op == "ConvTranspose":
        up = np.zeros((*x.shape[:2], *((d - 1) * s + 1 for d, s in zip(x.shape[2:], strides))), np.float32)
        every: tuple[Any, ...] = (slice(None), slice(None), *(slice(None, None, s) for s in strides))
        up[every] = x
        x, strides = up, [1] * n
    crop: tuple[Any, ...] = (slice(None), slice(None), *(slice(max(-b, 0), x.shape[2 + i] - max(-e, 0))
                                                         for i, (b, e) in enumerate(pads)))
    x = np.pad(x[crop], [(0, 0), (0, 0), *((max(b, 0), max(e, 0)) for b, e in pads)])
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    view = sliding_window_view(x, span, axis=tuple(range(2, 2 + n)))
    steps: tuple[Any, ...] = (slice(None), slice(None), *(slice(None, None, s) for s in strides),
                              *(slice(None, None, d) for d in dil))
    return view[steps]


# ---------------------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------------------


@dataclass
class Stats:
    """A layer's input statistics, mean over the positions taken: ``hqq`` = E[x~ x~^T] of the input the
    quantized model gives it (x~), ``hqf`` = E[x~ x^T] with FP32's (x) at the same positions, both
    (groups, K, K); per output channel (groups, rows) ``signal`` = E[(w.x)^2] and ``offset`` =
    E[(w.(x~ - x))^2]. Without a quantized model x~ = x: ``hqf`` is ``hqq`` and ``offset`` 0."""

    hqq: np.ndarray
    hqf: np.ndarray | None
    signal: np.ndarray
    offset: np.ndarray


@dataclass
class Problem:
    """One layer's rounding problem: (groups, rows, K) arrays but ``h`` (groups, K, K). A row's output
    error is ``d H d^T + 2 d.v + c`` in its weights' errors ``d`` (``d = scale * (lo + up) - w``):
    E[(w~.x~ - w.x)^2] with w~ = w + d, so H = E[x~ x~^T], v = (H - E[x~ x^T]) w, c = E[(w.(x~ - x))^2]."""

    w: np.ndarray
    scale: np.ndarray
    lo: np.ndarray
    step: np.ndarray  # scale * (ceil - floor): 0 where w / scale is an integer
    h: np.ndarray
    ridge: np.ndarray  # (groups,): the search's H is h + ridge * I, leaning toward nearest rounding
    v: np.ndarray
    c: float  # summed over rows
    signal: float  # E[(w.x)^2] summed over rows: what errors are relative to

    def errors(self, up: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(d, g): the weights' errors of the choice ``up`` and ``d H + v`` (half the error's gradient)."""
        d = self.scale * self.lo + self.step * up - self.w
        return d, d @ self.h + self.v

    def error(self, up: np.ndarray) -> float:
        """The layer's output error (mean over positions, summed over output channels) relative to its
        output's mean square."""
        import numpy as np

        d, g = self.errors(up)
        return float((np.einsum("grk,grk->", d, g + self.v) + self.c) / (self.signal or 1.0))


def problem(layer: Layer, stats: Stats, damp: float) -> tuple[Problem, np.ndarray]:
    """(the problem, nearest rounding's choice as ``up``) of ``layer``."""
    import numpy as np

    from edgeq.quant.qdq import quantize_weight

    w = layer.weight
    q, scale = quantize_weight(w, layer.axis)
    shape = [1] * w.ndim
    if layer.axis is not None:
        shape[layer.axis] = -1
    s_full = np.broadcast_to(scale.reshape(shape), w.shape)
    lo, hi = bounds(w, scale, layer.axis)
    idx = layer.index
    h = stats.hqq.astype(np.float64)
    w_rows = w.ravel()[idx].astype(np.float64)
    v = (w_rows @ (h - stats.hqf.astype(np.float64)).transpose(0, 2, 1) if stats.hqf is not None
         else np.zeros_like(w_rows))
    ridge = damp * np.einsum("gkk->gk", h).mean(axis=1)
    s_rows = s_full.ravel()[idx].astype(np.float64)
    lo_rows = lo.ravel()[idx].astype(np.float64)
    prob = Problem(w=w_rows, scale=s_rows, lo=lo_rows, step=s_rows * (hi.ravel()[idx] - lo.ravel()[idx]),
                   h=h, ridge=ridge, v=v, c=float(stats.offset.sum()), signal=float(stats.signal.sum()))
    return prob, q.ravel()[idx].astype(np.float64) > lo_rows


def bounds(w: np.ndarray, scale: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(floor, ceil) of ``w / scale`` as ``quantize_weight`` divides (float32, scale on ``axis``), within
    [-127, 127]: the symmetric range nearest rounding keeps (a weight at -amax can divide to
    -127.00001, whose floor -128 nearest rounding never writes)."""
    import numpy as np

    from edgeq.quant.calibrate import INT8_MAX

    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    ratio = np.asarray(w, np.float32) / np.asarray(scale, np.float32).reshape(shape)
    return (np.clip(np.floor(ratio), -INT8_MAX, INT8_MAX), np.clip(np.ceil(ratio), -INT8_MAX, INT8_MAX))


def coordinate_descent(prob: Problem, up: np.ndarray, sweeps: int, deadline: float = float("inf")
                       ) -> tuple[np.ndarray, int]:
    """(the choice, sweeps made): from ``up``, flip single weights while a flip lowers the error.

    The gain of flipping weight k of a row is exact: ``2 delta g_k + delta^2 H_kk`` with ``g = d H + v``,
    and ``g`` is updated by ``delta * H_k`` for the rows that flip; all rows and groups move at once."""
    import numpy as np

    up = up.copy()
    h = prob.h + prob.ridge[:, None, None] * np.eye(prob.h.shape[1])[None]
    d, _ = prob.errors(up)
    g = d @ h + prob.v
    diag = np.einsum("gkk->gk", h)
    made = 0
    for _ in range(sweeps):
        if time.monotonic() > deadline:
            break
        made += 1
        flips = 0
        for k in range(prob.h.shape[1]):
            step = prob.step[:, :, k]
            delta = np.where(up[:, :, k], -step, step)
            quad = delta * delta * diag[:, k, None]
            gain = 2.0 * delta * g[:, :, k] + quad
            take = gain < -1e-9 * quad
            if not take.any():
                continue
            gi, ri = np.nonzero(take)
            up[gi, ri, k] = ~up[gi, ri, k]
            g[gi, ri] += delta[gi, ri, None] * h[gi, k]
            flips += len(gi)
        if not flips:
            break
    return up, made


def values_of(layer: Layer, prob: Problem, up: np.ndarray) -> np.ndarray:
    """The int8 weight (the layer's weight shape) of the choice ``up``."""
    import numpy as np

    q = np.rint(prob.lo + (prob.step > 0) * up).astype(np.int8)
    out = np.empty(int(np.prod(layer.shape)), np.int8)
    out[layer.index.ravel()] = q.ravel()
    return out.reshape(layer.shape)


# ---------------------------------------------------------------------------------------------------
# The model: layers' inputs from the FP32 model (and the quantized one), statistics, a choice per layer
# ---------------------------------------------------------------------------------------------------


def layers_of(graph: gs.Graph, plan: Plan) -> tuple[list[Layer], list[tuple[str, str]]]:
    """The plan's weighted nodes as ``Layer``s (one per weight tensor: a weight read by two nodes keeps
    nearest rounding, its error being two layers'), and the ones that keep nearest with why."""
    import onnx_graphsurgeon as gs

    nodes = {n.name: n for n in graph.nodes}
    readers: dict[str, int] = {}
    for w in plan.weights:
        readers[w.tensor] = readers.get(w.tensor, 0) + 1
    layers: list[Layer] = []
    skipped: list[tuple[str, str]] = []
    for w in plan.weights:
        node = nodes.get(w.node)
        if node is None or len(node.inputs) < 2 or not isinstance(node.inputs[1], gs.Constant):
            skipped.append((w.node, "no constant weight"))
            continue
        if readers[w.tensor] > 1:
            skipped.append((w.node, "a weight shared by several nodes"))
            continue
        if not isinstance(node.inputs[0], gs.Variable):
            skipped.append((w.node, "a constant input"))
            continue
        layer = layer_of(node, w.axis)
        if isinstance(layer, str):
            skipped.append((w.node, layer))
        else:
            layers.append(layer)
    return layers, skipped


def _exposing(model: onnx.ModelProto, tensors: Sequence[str], providers: tuple[str, ...] | None) -> Any:
    """``evaluate.evaluation_session`` of ``model`` with ``tensors`` as extra outputs: a Q/DQ model's
    arithmetic as every accuracy figure computes it (the FP32 model's is plain float)."""
    import onnx

    from edgeq.quant.evaluate import evaluation_session

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    existing = {o.name for o in copy.graph.output}
    copy.graph.output.extend(onnx.ValueInfoProto(name=t) for t in dict.fromkeys(tensors) if t not in existing)
    return evaluation_session(copy, providers, purpose="learning the weights' rounding")


def collect_stats(reference: onnx.ModelProto, layers: Sequence[Layer], data: Iterable[dict[str, np.ndarray]],
                  options: RoundingOptions, quantized: onnx.ModelProto | None = None,
                  providers: tuple[str, ...] | None = None, progress: ProgressFn = no_progress
                  ) -> dict[str, Stats]:
    """Each layer's ``Stats`` from onnxruntime passes over the first ``options.samples`` of ``data``: the
    FP32 ``reference`` gives x; ``quantized`` (a Q/DQ model of it, the same node names) gives x~, the
    input the layer sees there, with every quantization before it (without it, x~ = x)."""
    import numpy as np

    feeds = [f for _, f in zip(range(options.samples), data)]
    inputs = {i.name for i in reference.graph.input}
    names = {layer.node: layer.input for layer in layers}
    ref = _exposing(reference, [t for t in names.values() if t not in inputs], providers)
    q_names: dict[str, str] = {}
    q_session = None
    if quantized is not None:
        in_q = {n.name: n.input[0] for n in quantized.graph.node if n.name in names and n.input}
        missing = [n for n in names if n not in in_q]
        if missing:  # the Q/DQ model is built from the reference: the same node names
            raise RuntimeError(f"edgeq bug: node '{missing[0]}' is not in the quantized model")
        q_names = in_q
        q_inputs = {i.name for i in quantized.graph.input}
        q_session = _exposing(quantized, [t for t in in_q.values() if t not in q_inputs], providers)
    rng = np.random.default_rng(options.seed)
    grams = {layer.node: np.zeros((1 + (quantized is not None), layer.groups, layer.k, layer.k), np.float32)
             for layer in layers}
    rows = {layer.node: np.zeros((2, layer.groups, layer.index.shape[1]), np.float64) for layer in layers}
    counts = dict.fromkeys(grams, 0)
    progress("rounding: layer inputs", 0, len(feeds))
    for i, feed in enumerate(feeds):
        got = _run(ref, feed, len(reference.graph.output))
        got_q = _run(q_session, feed, len(quantized.graph.output)) if quantized and q_session else {}
        for layer in layers:
            x = got[layer.input] if layer.input in got else feed[layer.input]
            xs = [x]
            if q_session is not None:
                t = q_names[layer.node]
                xs.append(got_q[t] if t in got_q else feed[t])
            cols = patches(layer, xs, options.columns, rng)
            xq = cols[-1]
            _gram(grams[layer.node][0], xq, xq)
            w_rows = layer.rows
            rows[layer.node][0] += np.square(w_rows @ cols[0]).sum(axis=2)
            if q_session is not None:
                _gram(grams[layer.node][1], xq, cols[0])
                rows[layer.node][1] += np.square(w_rows @ (xq - cols[0])).sum(axis=2)
            counts[layer.node] += cols[0].shape[2]
        progress("rounding: layer inputs", i + 1, len(feeds))
    out = {}
    for node, g in grams.items():
        n = max(counts[node], 1)
        g /= n
        out[node] = Stats(g[0], g[1] if len(g) > 1 else None, rows[node][0] / n, rows[node][1] / n)
    return out


def _gram(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """acc += a b^T per group (one BLAS product where there is one group: a stacked matmul of one is
    much slower, and ``a @ a.T`` of one array is computed as a symmetric product)."""
    import numpy as np

    if a.shape[0] == 1:
        acc[0] += a[0] @ b[0].T
    else:
        acc += np.matmul(a, b.transpose(0, 2, 1))


def _run(session: Any, feed: dict[str, np.ndarray], own: int) -> dict[str, np.ndarray]:
    """The exposed tensors of one run (the outputs after the model's ``own``)."""
    names = [o.name for o in session.get_outputs()][own:]
    try:
        return dict(zip(names, session.run(names, feed)))
    except Exception as e:  # onnxruntime raises its own untyped failures
        raise QuantError(f"onnxruntime failed on calibration data: {first_line(e)}") from None


def learn_rounding(reference: onnx.ModelProto, plan: Plan, data: Iterable[dict[str, np.ndarray]],
                   options: RoundingOptions = RoundingOptions(), *, quantized: onnx.ModelProto | None = None,
                   providers: tuple[str, ...] | None = None, progress: ProgressFn = no_progress) -> Rounding:
    """The learned rounding of every weight ``plan`` quantizes (``build_qdq(..., rounding=result.values)``
    writes it), from the cleaned FP32 ``reference`` the Q/DQ model is built from, on ``data``
    (calibration samples; the first ``options.samples``), each layer seeing FP32's input. ``quantized``:
    a Q/DQ model of ``reference`` (the same node names) whose input each layer sees instead, so its
    rounding also makes up for the quantization before it (AdaRound's asymmetric reconstruction). quantize
    does not use it: it lost accuracy on the bench's detector (the module's docstring)."""
    from edgeq.graph.io import graph_from_model

    started = time.monotonic()
    deadline = started + options.budget_s
    layers, skipped = layers_of(graph_from_model(reference), plan)
    values: dict[str, np.ndarray] = {}
    done: list[LayerRounding] = []
    for chunk in _chunks(layers, options.memory_mb, 1 + (quantized is not None)):
        if time.monotonic() > deadline:
            skipped += [(layer.node, _spent(options)) for layer in chunk]
            continue
        stats = collect_stats(reference, chunk, data, options, quantized, providers, progress)
        progress("rounding: weights", 0, len(chunk))
        for i, layer in enumerate(chunk):
            if time.monotonic() > deadline:
                skipped += [(rest.node, _spent(options)) for rest in chunk[i:]]
                break
            t0 = time.monotonic()
            prob, nearest = problem(layer, stats.pop(layer.node), options.damp)
            up, made = coordinate_descent(prob, nearest, options.sweeps, deadline)
            values[layer.tensor] = values_of(layer, prob, up)
            done.append(LayerRounding(layer.node, layer.tensor, prob.error(nearest), prob.error(up),
                                      int((up != nearest).sum()), int(prob.w.size), made,
                                      time.monotonic() - t0))
            progress("rounding: weights", i + 1, len(chunk))
    samples = _count(data, options.samples)
    return Rounding(values, tuple(done), tuple(skipped), samples, time.monotonic() - started,
                    quantized is not None)


def _spent(options: RoundingOptions) -> str:
    return f"the rounding budget ({options.budget_s:g} s) spent"


def _count(data: Iterable[Any], cap: int) -> int:
    try:
        return min(len(data), cap)  # type: ignore[arg-type]
    except TypeError:
        return cap


def _chunks(layers: Sequence[Layer], memory_mb: float, grams: int) -> list[list[Layer]]:
    """Layers in graph order, split so one chunk's ``grams`` Gram matrices each (float32) fit
    ``memory_mb``: a chunk more is one more pass over the samples."""
    out: list[list[Layer]] = [[]]
    used = 0.0
    for layer in layers:
        size = grams * layer.groups * layer.k * layer.k * 4 / 1e6
        if out[-1] and used + size > memory_mb:
            out.append([])
            used = 0.0
        out[-1].append(layer)
        used += size
    return [c for c in out if c]
