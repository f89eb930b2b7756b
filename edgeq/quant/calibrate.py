"""Calibration: activation ranges (amax) from one streaming pass of onnxruntime over the data.

Why not onnxruntime's own calibrators: ``HistogramCalibrater.collect_data`` keeps every intermediate
output of every sample in a list and builds histograms only at the end, so its memory grows with the
dataset (7.7 GB for 64 ResNet-50 samples). Here each sample's outputs are folded into fixed-size
histograms and dropped: memory is ``num_bins`` floats per tensor plus one sample's activations.

The amax methods, all over the histogram of ``|x|`` (symmetric int8, zero-point 0, as TensorRT):

- ``max``: the exact running max of ``|x|``.
- ``percentile``: the ``percentile`` of ``|x|`` (zeros included), interpolated inside a bin.
- ``entropy``: TensorRT's entropy calibrator 2 (NVIDIA, "8-bit Inference with TensorRT", GTC 2017,
  s7310): for each candidate ``i`` in ``[num_quant_bins, num_bins)`` the reference distribution P is the
  first ``i`` bins with everything beyond folded into bin ``i-1``; the candidate Q is those ``i`` bins
  merged into ``num_quant_bins`` levels and expanded back, each level's count spread evenly over its
  non-empty bins (empty bins stay empty); KL(P||Q) is summed over the bins where P > 0 and is infinite
  where Q = 0 < P (no smoothing, as pytorch-quantization's ``_compute_amax_entropy``); bin ``j`` belongs
  to level ``floor(j * num_quant_bins / i)`` (pytorch-quantization's ``np.digitize`` over
  ``linspace(0, i, num_quant_bins + 1)``). The threshold of the minimum is ``(m + 0.5) * bin_width``
  (the slides' formula). Exact zeros (half of every post-ReLU tensor) are left out of the entropy
  histogram: zero is exact on every int8 grid, so it cannot inform the threshold, and counting it in
  bin 0 drags the threshold down (pytorch-quantization works around the same spike with
  ``bins[0] = bins[1]``).
- ``mse``: the candidate upper bin edge (``i`` in ``[num_quant_bins, num_bins]``) minimising the mean
  squared int8 quantization error of the bin centres, weighted by count (pytorch-quantization's
  ``_compute_amax_mse``).

Streaming: each tensor keeps an ``|x|`` histogram over ``[0, running max]`` at ``8 * num_bins``
resolution. When a sample exceeds the range, the existing counts are re-binned into the wider range
by linear interpolation of their cumulative count, i.e. assuming counts are uniform inside an old bin.
That is the one approximation: each count moves by less than one old (fine) bin width, 1/8 of a final
bin, per re-bin; over 20 successive growths the final histogram stays within 1% total variation of a
one-shot histogram (tested). The final ``num_bins`` histogram merges 8 fine bins exactly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgeq.errors import QuantError, first_line
from edgeq.findings import ProgressFn, no_progress
from edgeq.text import noun

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnxruntime as ort

    from edgeq.quant.data import CalibrationSet

CALIBRATORS = ("max", "percentile", "entropy", "mse")
INT8_MAX = 127
OVERSAMPLE = 8  # fine bins per final bin in the streaming histogram
# amax for a tensor that was all zeros during calibration: any positive scale represents it exactly.
ZERO_AMAX = 1.0


@dataclass(frozen=True)
class CalibOptions:
    """How ranges are computed; names follow TensorRT / pytorch-quantization where they exist."""

    method: str = "entropy"
    percentile: float = 99.99
    num_bins: int = 2048
    num_quant_bins: int = 128  # int8 positive levels
    batch_size: int = 1  # samples per onnxruntime run when the model's batch dim is dynamic
    providers: tuple[str, ...] | None = None  # None: CUDA EP when present, else CPU

    def __post_init__(self) -> None:
        if self.method not in CALIBRATORS:
            raise QuantError(f"unknown calibrator '{self.method}'",
                             hint=f"use one of {', '.join(CALIBRATORS)}")
        if not 0.0 < self.percentile <= 100.0:
            raise QuantError(f"percentile must be in (0, 100], got {self.percentile}")
        if self.num_quant_bins < 1 or self.num_bins <= self.num_quant_bins:
            raise QuantError(
                f"need num_bins > num_quant_bins >= 1, got {self.num_bins}, {self.num_quant_bins}")
        if self.batch_size < 1:
            raise QuantError(f"batch size must be at least 1, got {self.batch_size}")


def activation_scale(amax: float) -> float:
    """The float32 int8 scale for ``amax``; the Q/DQ initializers and the cache both use this."""
    import numpy as np

    a = float(amax) if amax > 0 else ZERO_AMAX
    return float(np.float32(a) / np.float32(INT8_MAX))


# ---------------------------------------------------------------------------------------------------
# Streaming histogram
# ---------------------------------------------------------------------------------------------------


class TensorHistogram:
    """Running histogram of ``|x|`` over ``[0, max]`` with an exact max and an exact zero count."""

    def __init__(self, num_bins: int = 2048, oversample: int = OVERSAMPLE) -> None:
        import numpy as np

        self.num_bins = num_bins
        self.oversample = oversample
        self.fine = np.zeros(num_bins * oversample, dtype=np.float64)  # counts of non-zero |x|
        self.range = 0.0  # upper edge of the last fine bin == max |x| seen so far
        self.zeros = 0
        self.count = 0

    @property
    def amax(self) -> float:
        return self.range

    def update(self, x: np.ndarray, *, inplace: bool = False) -> None:
        """Add a batch of values. ``inplace=True`` lets it scribble over ``x`` (saves a copy per tensor)."""
        import numpy as np

        a = np.asarray(x, dtype=np.float32).ravel()
        if a.size == 0:
            return
        if inplace and a.flags.writeable:
            np.abs(a, out=a)
        else:
            a = np.abs(a)
        m = float(a.max())
        if not np.isfinite(m):
            raise QuantError("activation contains NaN or Inf", hint="check the calibration data and model")
        self.count += a.size
        if m == 0.0:
            self.zeros += a.size
            return
        if m > self.range:
            self._grow(m)
        nb = self.fine.size
        scale = nb / self.range
        if scale > 1e30:  # a range near float32's smallest normals: scale would overflow in float32
            a = a.astype(np.float64)
        # ceil, not floor: 0 -> 0 exactly and (k-1, k] * width -> k, so bin 0 of the count is the exact
        # zeros and bins 1..nb are the histogram, in one bincount. |x| == max may round up to nb + 1.
        a *= a.dtype.type(scale)
        np.ceil(a, out=a)
        counts = np.bincount(a.astype(np.intp), minlength=nb + 2)
        self.zeros += int(counts[0])
        self.fine += counts[1:nb + 1]
        self.fine[-1] += counts[nb + 1:].sum()

    def _grow(self, new_range: float) -> None:
        """Re-bin into ``[0, new_range]``: cumulative counts interpolated at the new edges."""
        import numpy as np

        if self.range > 0 and self.fine.any():
            nb = self.fine.size
            old_edges = np.linspace(0.0, self.range, nb + 1)
            cdf = np.concatenate(([0.0], np.cumsum(self.fine)))
            new_edges = np.linspace(0.0, new_range, nb + 1)
            self.fine = np.diff(np.interp(new_edges, old_edges, cdf))
        self.range = new_range

    def merge(self, other: TensorHistogram) -> None:
        """Add another histogram (e.g. from another process); the ranges are reconciled by re-binning."""
        if other.range > self.range:
            self._grow(other.range)
        o = TensorHistogram(other.num_bins, other.oversample)
        o.fine, o.range = other.fine.copy(), other.range
        if o.range < self.range:
            o._grow(self.range)
        self.fine += o.fine
        self.zeros += other.zeros
        self.count += other.count

    def bins(self) -> np.ndarray:
        """The ``num_bins`` histogram of non-zero ``|x|`` over ``[0, amax]`` (exact merge of fine bins)."""
        return self.fine.reshape(self.num_bins, self.oversample).sum(axis=1)

    def compute_amax(self, options: CalibOptions) -> float:
        if self.range <= 0.0:
            return 0.0
        if options.method == "max":
            return self.range
        if options.method == "percentile":
            return amax_percentile(self.fine, self.range, options.percentile, zeros=self.zeros)
        if options.method == "entropy":
            return amax_entropy(self.bins(), self.range, options.num_quant_bins)
        if options.method == "mse":
            return amax_mse(self.bins(), self.range, options.num_quant_bins, zeros=self.zeros)
        raise QuantError(f"unknown calibrator '{options.method}'")


# ---------------------------------------------------------------------------------------------------
# amax from a histogram: ``hist[j]`` counts non-zero |x| in ``(j, j+1] * hist_max / len(hist)``
# ---------------------------------------------------------------------------------------------------


def amax_percentile(hist: np.ndarray, hist_max: float, percentile: float, *, zeros: int = 0) -> float:
    """The ``percentile`` of |x|, linear inside the bin where the cumulative count crosses it."""
    import numpy as np

    hist = np.asarray(hist, dtype=np.float64)
    total = hist.sum() + zeros
    if total <= 0:
        return 0.0
    target = total * percentile / 100.0 - zeros
    if target <= 0:
        return 0.0
    cdf = np.cumsum(hist)
    j = int(np.searchsorted(cdf, target, side="left"))
    j = min(j, hist.size - 1)
    below = cdf[j - 1] if j > 0 else 0.0
    frac = (target - below) / hist[j] if hist[j] > 0 else 1.0
    width = hist_max / hist.size
    return float((j + min(max(frac, 0.0), 1.0)) * width)


def entropy_divergences(hist: np.ndarray, num_quant_bins: int = 128) -> np.ndarray:
    """KL(P||Q) for every candidate ``i`` in ``[num_quant_bins, len(hist))`` (see module docstring).

    Vectorised over candidates: within a level Q is constant on non-empty bins, so
    ``sum_j P_j log Q_j`` is a per-level sum built from prefix sums; O(len(hist) * num_quant_bins).
    """
    import numpy as np

    h = np.asarray(hist, dtype=np.float64)
    nbins, nq = h.size, num_quant_bins
    total = h.sum()
    cand = np.arange(nq, nbins)
    if total <= 0 or cand.size == 0:
        return np.full(cand.size, np.inf)
    hsum = np.concatenate(([0.0], np.cumsum(h)))  # hsum[k] = sum h[:k]
    nz = np.concatenate(([0.0], np.cumsum(h > 0)))
    with np.errstate(divide="ignore", invalid="ignore"):
        hlogh = np.where(h > 0, h * np.log(np.where(h > 0, h, 1.0)), 0.0)
    hlogh_sum = np.concatenate(([0.0], np.cumsum(hlogh)))

    # level l of candidate i covers bins [ceil(l*i/nq), ceil((l+1)*i/nq)): exactly the j with
    # floor(j*nq/i) == l.
    lev = np.arange(nq + 1)
    edges = -((-lev[None, :] * cand[:, None]) // nq)  # ceil division, shape (cand, nq+1)
    lsum = hsum[edges[:, 1:]] - hsum[edges[:, :-1]]  # counts per level
    lnz = nz[edges[:, 1:]] - nz[edges[:, :-1]]  # non-empty bins per level
    with np.errstate(divide="ignore", invalid="ignore"):
        qval = np.where(lnz > 0, lsum / np.where(lnz > 0, lnz, 1.0), 0.0)  # Q on a non-empty bin
        sum_p_log_q = np.where(lsum > 0, lsum * np.log(np.where(qval > 0, qval, 1.0)), 0.0).sum(axis=1)

    outliers = total - hsum[cand]  # folded into P[i-1]
    last = h[cand - 1]
    p_last = last + outliers
    # sum_j P_j log P_j: bins below i-1 unchanged, bin i-1 carries the outliers
    with np.errstate(divide="ignore", invalid="ignore"):
        p_log_p = hlogh_sum[cand - 1] + np.where(p_last > 0, p_last * np.log(np.maximum(p_last, 1e-300)), 0)
        q_last = qval[np.arange(cand.size), nq - 1]  # bin i-1 is in the last level
        log_q_last = np.log(np.where(q_last > 0, q_last, 1))
        sum_p_log_q = sum_p_log_q + np.where(outliers > 0, outliers * log_q_last, 0)
    # KL = sum p log(p/q) with p = P/total, q = Q/S_i, S_i = sum h[:i] (Q keeps each level's count)
    s_i = hsum[cand]
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = (p_log_p - sum_p_log_q) / total - np.log(total) + np.log(np.maximum(s_i, 1e-300))
    kl = np.where((outliers > 0) & (last == 0), np.inf, kl)  # Q = 0 where P > 0
    return kl


def amax_entropy(hist: np.ndarray, hist_max: float, num_quant_bins: int = 128) -> float:
    """TensorRT entropy calibration 2 threshold: ``(m + 0.5) * bin_width`` at the minimum KL."""
    import numpy as np

    kl = entropy_divergences(hist, num_quant_bins)
    if kl.size == 0 or not np.isfinite(kl).any():
        return float(hist_max)
    m = int(np.argmin(kl)) + num_quant_bins
    return float(min((m + 0.5) * hist_max / len(hist), hist_max))


def quantization_mse(hist: np.ndarray, hist_max: float, amaxes: np.ndarray, *, zeros: int = 0) -> np.ndarray:
    """Mean squared int8 error of the bin centres, per candidate amax (symmetric, 127 levels)."""
    import numpy as np

    h = np.asarray(hist, dtype=np.float64)
    width = hist_max / h.size
    centres = (np.arange(h.size) + 0.5) * width
    amaxes = np.atleast_1d(np.asarray(amaxes, dtype=np.float64))
    out = np.empty(amaxes.size)
    total = h.sum() + zeros
    for s in range(0, amaxes.size, 256):  # chunks keep the (candidates x bins) temporary small
        a = amaxes[s:s + 256, None]
        scale = a / INT8_MAX
        q = np.minimum(np.round(centres[None, :] / scale), INT8_MAX) * scale
        out[s:s + 256] = ((q - centres[None, :]) ** 2 * h[None, :]).sum(axis=1) / max(total, 1.0)
    return out


def amax_mse(hist: np.ndarray, hist_max: float, num_quant_bins: int = 128, *, zeros: int = 0) -> float:
    """The upper bin edge in ``[num_quant_bins, len(hist)]`` with the least quantization MSE.

    Coarse to fine: every ``MSE_STEP``-th edge first, then every edge within one step of the best of
    those. The MSE curve over the edges is smooth at this resolution (1/8 of a percent of the range), so
    this finds the exhaustive search's minimum to within 1% of its MSE (tested against brute force) at
    an eighth of the cost: ``--calibrator auto`` computes every calibrator's ranges for every tensor.
    """
    import numpy as np

    nb = len(hist)
    edges = np.arange(num_quant_bins, nb + 1)
    width = hist_max / nb
    coarse = edges[::MSE_STEP]
    best = int(coarse[int(np.argmin(quantization_mse(hist, hist_max, coarse * width, zeros=zeros)))])
    fine = edges[(edges >= best - MSE_STEP) & (edges <= best + MSE_STEP)]
    mse = quantization_mse(hist, hist_max, fine * width, zeros=zeros)
    return float(fine[int(np.argmin(mse))] * width)


MSE_STEP = 8


# ---------------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------------


def weight_scales(w: np.ndarray, axis: int) -> np.ndarray:
    """Per-channel symmetric int8 scales along ``axis``: max |w| over the other axes / 127.

    An all-zero channel gets scale ``ZERO_AMAX / 127`` (TensorRT rejects scale 0; zero is exact anyway).
    """
    import numpy as np

    w = np.asarray(w)
    if w.ndim == 0:
        raise QuantError("weight_scales needs an array with a channel axis, got a scalar")
    axis = axis % w.ndim
    other = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.abs(w.astype(np.float32, copy=False)).max(axis=other) if other else np.abs(w).astype(np.float32)
    if not np.isfinite(amax).all():
        raise QuantError("weights contain NaN or Inf")
    amax = np.where(amax > 0, amax, np.float32(ZERO_AMAX)).astype(np.float32)
    return (amax / np.float32(INT8_MAX)).astype(np.float32)


# ---------------------------------------------------------------------------------------------------
# Collection with onnxruntime
# ---------------------------------------------------------------------------------------------------


def default_providers() -> tuple[str, ...]:
    import onnxruntime as ort

    avail = ort.get_available_providers()
    if "CUDAExecutionProvider" in avail:
        return ("CUDAExecutionProvider", "CPUExecutionProvider")
    return ("CPUExecutionProvider",)


def collect_histograms(
    model: onnx.ModelProto,
    tensors: Sequence[str],
    data: CalibrationSet,
    options: CalibOptions = CalibOptions(),
    progress: ProgressFn = no_progress,
) -> dict[str, TensorHistogram]:
    """One onnxruntime pass over ``data``; returns a streaming histogram per requested tensor."""
    import numpy as np

    tensors = list(dict.fromkeys(tensors))
    graph_inputs = {s.name for s in data.specs}
    inits = {i.name: i for i in model.graph.initializer}
    produced = {o for n in model.graph.node for o in n.output}
    unknown = [t for t in tensors if t not in produced and t not in graph_inputs and t not in inits]
    if unknown:
        raise QuantError(f"{noun(len(unknown), 'tensor')} not in the model: {', '.join(unknown[:5])}")
    hists = {t: TensorHistogram(options.num_bins) for t in tensors}
    for t in tensors:
        if t in inits and t not in produced:
            from onnx import numpy_helper

            hists[t].update(numpy_helper.to_array(inits[t]))
    from_feed = [t for t in tensors if t in graph_inputs]
    outputs = [t for t in tensors if t in produced]
    total = len(data)
    if total == 0:
        raise QuantError("the calibration set is empty")
    session = _session(model, outputs, options)
    feeds_per_run = options.batch_size if all(s.shape and s.shape[0] is None for s in data.specs) else 1
    done = 0
    progress("calibrating", 0, total)
    pending: list[dict[str, np.ndarray]] = []
    # Histogram updates run between inference runs on all cores: numpy's abs/ceil/astype/bincount
    # release the GIL, and each tensor's histogram is touched by one task only.
    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)

    def update(item: tuple[str, np.ndarray]) -> None:
        try:
            hists[item[0]].update(item[1], inplace=True)  # onnxruntime's outputs are ours to overwrite
        except QuantError:
            raise QuantError(f"tensor '{item[0]}' is NaN or Inf on calibration sample {done + 1}",
                             hint="the model overflows on this data (check preprocessing)") from None

    def run(feeds: list[dict[str, np.ndarray]]) -> None:
        feed = feeds[0] if len(feeds) == 1 else {
            k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]}
        for t in from_feed:
            hists[t].update(feed[t])
        if outputs:
            try:
                values = session.run(outputs, feed)
            except Exception as e:  # onnxruntime raises its own untyped failures
                at = ",".join(f"{k}:{'x'.join(str(d) for d in v.shape)}" for k, v in feed.items())
                raise QuantError(f"onnxruntime failed on calibration data at {at}: {_ort_said(e)}",
                                 hint="give samples of the shape the model runs at") from None
            items = sorted(zip(outputs, values), key=lambda tv: -tv[1].size)  # big first: balanced
            del values
            list(pool.map(update, items))

    try:
        for feed in data:
            pending.append(feed)
            if len(pending) == feeds_per_run:
                run(pending)
                done += len(pending)
                pending = []
                progress("calibrating", done, total)
        if pending:
            run(pending)
            done += len(pending)
            progress("calibrating", done, total)
    finally:
        pool.shutdown(wait=True)
    return hists


def collect_ranges(
    model: onnx.ModelProto,
    tensors: Sequence[str],
    data: CalibrationSet,
    options: CalibOptions = CalibOptions(),
    progress: ProgressFn = no_progress,
) -> dict[str, float]:
    """amax per tensor (scale = amax / 127, see ``activation_scale``) with ``options.method``.

    An all-zero tensor gets amax 0.0; ``activation_scale`` turns that into a valid scale.
    """
    hists = collect_histograms(model, tensors, data, options, progress)
    return ranges_from_histograms(hists, options)


def ranges_from_histograms(hists: Mapping[str, TensorHistogram], options: CalibOptions) -> dict[str, float]:
    """amax per tensor from collected histograms, tensors in parallel (numpy releases the GIL in the
    entropy and mse searches): several methods can share one statistics pass."""
    if len(hists) < 8:
        return {t: h.compute_amax(options) for t, h in hists.items()}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        amax = list(pool.map(lambda h: h.compute_amax(options), hists.values()))
    return dict(zip(hists, amax))


def _ort_said(e: Exception) -> str:
    """onnxruntime's failure without its ``[ONNXRuntimeError] : 1 : FAIL :`` prefix (verify's wording)."""
    from edgeq.graph.verify import ort_message

    return ort_message(e)


def inference_session(
    model: onnx.ModelProto, so: ort.SessionOptions, providers: Sequence[str] | None, *, purpose: str
) -> ort.InferenceSession:
    """``io.ort_session`` with calibration's providers, its failures worded as a ``QuantError``."""
    from edgeq.graph.io import ort_session

    try:
        return ort_session(model, so, list(providers or default_providers()))
    except Exception as e:  # onnxruntime raises its own untyped failures
        raise QuantError(f"onnxruntime cannot load the model for {purpose}: {first_line(e)}") from None


def _session(model: onnx.ModelProto, outputs: list[str], options: CalibOptions) -> ort.InferenceSession:
    """A session exposing ``outputs`` as extra graph outputs (appended for the session, then removed again).

    Graph optimizations stay on (``ORT_ENABLE_ALL``): onnxruntime's fusions never remove a node whose
    output is a graph output, so every requested tensor keeps its float value (the tests compare against
    a plain session), and the fused/NCHWc kernels are much faster than ``ORT_ENABLE_BASIC``.
    """
    import onnx
    import onnxruntime as ort

    from edgeq.graph.io import ort_session

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = os.cpu_count() or 1
    # Every requested tensor is a graph output that outlives the run, so a pre-planned arena for all
    # activations only adds to the peak (ResNet-50, 123 outputs: 549 -> 419 MB; same speed).
    so.enable_cpu_mem_arena = False
    so.enable_mem_pattern = False
    # onnxruntime's idle threads spin after a run and would steal the cores the histogram updates use
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    existing = {o.name for o in model.graph.output}
    n_before = len(model.graph.output)
    model.graph.output.extend(onnx.ValueInfoProto(name=t) for t in outputs if t not in existing)
    try:
        sess = ort_session(model, so, list(options.providers or default_providers()))
    except Exception as e:  # onnxruntime's own untyped failures: whose fault is it?
        del model.graph.output[n_before:]
        inference_session(model, so, options.providers, purpose="calibration")  # the model's: QuantError
        raise RuntimeError(
            "edgeq bug: onnxruntime loads the model but not with the tensors calibration exposes "
            f"({first_line(e)}); please report it with the model"
        ) from e
    finally:
        del model.graph.output[n_before:]
    missing = set(outputs) - {o.name for o in sess.get_outputs()}
    if missing:
        raise QuantError(f"onnxruntime does not expose {noun(len(missing), 'tensor')} {sorted(missing)[:5]}")
    return sess
