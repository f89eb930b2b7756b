"""Calibrator numerics against straightforward numpy references, a real onnxruntime pass, the cache format."""

from __future__ import annotations

import struct

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeq.errors import QuantError
from edgeq.quant.cache import (
    DEFAULT_HEADER,
    parse_calibration_cache,
    read_calibration_cache,
    write_calibration_cache,
)
from edgeq.quant.calibrate import (
    CALIBRATORS,
    CalibOptions,
    TensorHistogram,
    activation_scale,
    amax_entropy,
    amax_mse,
    amax_percentile,
    collect_histograms,
    collect_ranges,
    entropy_divergences,
    weight_scales,
)
from edgeq.quant.data import calibration_set

# ---------------------------------------------------------------------------------------------------
# References: written the slow, literal way, independent of the vectorised code under test
# ---------------------------------------------------------------------------------------------------


def reference_entropy(hist: np.ndarray, hist_max: float, nq: int = 128) -> tuple[float, np.ndarray]:
    """The GTC 2017 "8-bit Inference with TensorRT" pseudo-code, bin by bin."""
    h = hist.astype(np.float64)
    divs = []
    for i in range(nq, len(h)):
        p = h[:i].copy()
        p[i - 1] += h[i:].sum()  # outliers folded into the last bin
        level = (np.arange(i) * nq) // i  # bin j -> level floor(j * nq / i)
        q = np.zeros(i)
        for lv in range(nq):
            members = np.nonzero(level == lv)[0]
            nonempty = members[h[members] > 0]
            if nonempty.size:
                q[nonempty] = h[members].sum() / nonempty.size  # spread over non-empty bins only
        p /= p.sum()
        q /= q.sum()
        kl = 0.0
        for pj, qj in zip(p, q):
            if pj > 0:
                kl = np.inf if qj == 0 else kl + pj * np.log(pj / qj)
        divs.append(kl)
    divs = np.array(divs)
    m = int(np.argmin(divs)) + nq
    return (m + 0.5) * hist_max / len(h), divs


def abs_hist(x: np.ndarray, bins: int = 2048) -> tuple[np.ndarray, float, int]:
    """One-shot histogram of non-zero |x| over [0, max|x|], and the zero count."""
    a = np.abs(x.astype(np.float64).ravel())
    nz = a[a > 0]
    hist, _ = np.histogram(nz, bins=bins, range=(0.0, a.max()))
    return hist.astype(np.float64), float(a.max()), int(a.size - nz.size)


def laplace_with_outliers(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.laplace(0.0, 1.0, n).astype(np.float32)
    x[rng.choice(n, 20, replace=False)] = rng.uniform(30, 60, 20).astype(np.float32)  # rare outliers
    return x


# ---------------------------------------------------------------------------------------------------
# Calibrators vs references
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dist", ["laplace_outliers", "normal", "relu_normal"])
def test_entropy_matches_literal_tensorrt_algorithm(dist: str) -> None:
    rng = np.random.default_rng(1)
    if dist == "laplace_outliers":
        x = laplace_with_outliers(200_000, 1)
    elif dist == "normal":
        x = rng.standard_normal(200_000).astype(np.float32)
    else:
        x = np.maximum(rng.standard_normal(200_000), 0).astype(np.float32)
    hist, hmax, _ = abs_hist(x)
    ref_amax, ref_divs = reference_entropy(hist, hmax)
    divs = entropy_divergences(hist)
    finite = np.isfinite(ref_divs)
    assert np.array_equal(finite, np.isfinite(divs))
    np.testing.assert_allclose(divs[finite], ref_divs[finite], rtol=1e-7, atol=1e-10)
    assert amax_entropy(hist, hmax) == pytest.approx(ref_amax, rel=1e-12)
    # end to end, the streaming histogram fed in batches (re-binned as the range grows): the KL minimum is
    # flat, so the tolerance is on divergence: the streamed threshold, scored on the one-shot
    # histogram, is within 5% of the reference's minimum KL
    streamed = TensorHistogram()
    for part in np.array_split(x, 5):
        streamed.update(part)
    got = streamed.compute_amax(CalibOptions(method="entropy"))
    m = round(got / (hmax / 2048) - 0.5)
    assert ref_divs[m - 128] <= 1.05 * ref_divs[finite].min() + 1e-12
    # the KL threshold clips: below the max, and above the bulk of the distribution
    assert np.quantile(np.abs(x), 0.99) < ref_amax < hmax or dist == "normal"
    if dist == "laplace_outliers":
        assert ref_amax < 0.5 * hmax  # the outliers do not stretch the range


def test_entropy_candidate_with_empty_last_bin_is_rejected() -> None:
    hist = np.zeros(2048)
    hist[:100] = 1000.0
    hist[2000] = 5.0  # outliers far away: candidates whose last bin is empty have Q = 0 < P there
    divs = entropy_divergences(hist)
    i = np.arange(128, 2048)
    assert np.isinf(divs[(i > 100) & (i <= 2000)]).all()  # bin i-1 empty, outliers beyond it
    assert np.isfinite(divs[i > 2000]).all()
    assert amax_entropy(hist, 1.0) >= 2001 / 2048  # the threshold keeps the isolated outliers


def test_max_on_uniform_is_exact_running_max() -> None:
    rng = np.random.default_rng(2)
    h = TensorHistogram()
    batches = [rng.uniform(-s, s, 5000).astype(np.float32) for s in (1.0, 0.5, 3.0, 2.0)]
    for b in batches:
        h.update(b)
    assert h.compute_amax(CalibOptions(method="max")) == float(np.abs(np.concatenate(batches)).max())


def test_percentile_on_normal_matches_np_percentile() -> None:
    rng = np.random.default_rng(3)
    batches = [rng.normal(0, s, 50_000).astype(np.float32) for s in (0.5, 1.0, 2.0, 1.5)]
    h = TensorHistogram()
    for b in batches:
        h.update(b)
    a = np.abs(np.concatenate(batches))
    srt = np.sort(a)
    for p in (50.0, 99.0, 99.9, 99.99):
        got = h.compute_amax(CalibOptions(method="percentile", percentile=p))
        want = float(np.percentile(a, p))
        # stated tolerance: within 3 samples in rank of np.percentile's answer, plus 0.1% of the range
        # (in the tail the samples are sparser than the histogram's resolution)
        k = int(np.searchsorted(srt, want))
        slack = 1e-3 * a.max()
        assert srt[k - 3] - slack <= got <= srt[min(k + 3, srt.size - 1)] + slack, (p, got, want)


def test_percentile_counts_zeros() -> None:
    x = np.concatenate([np.zeros(900, np.float32), np.linspace(0.01, 1, 100, dtype=np.float32)])
    hist, hmax, zeros = abs_hist(x)
    assert amax_percentile(hist, hmax, 50.0, zeros=zeros) == 0.0  # the median of |x| is 0
    assert amax_percentile(hist, hmax, 95.0, zeros=zeros) == pytest.approx(
        np.percentile(x, 95.0), abs=2 * hmax / 2048)


def test_mse_matches_brute_force_search() -> None:
    x = laplace_with_outliers(100_000, 4)
    hist, hmax, zeros = abs_hist(x)
    got = amax_mse(hist, hmax, zeros=zeros)
    a = np.abs(x).astype(np.float64)

    def mse(amax: float) -> float:
        s = amax / 127
        return float(np.mean((np.minimum(np.round(a / s), 127) * s - a) ** 2))

    candidates = np.arange(128, 2049) * hmax / 2048
    brute = np.array([mse(c) for c in candidates[::4]])
    best = candidates[::4][int(np.argmin(brute))]
    assert mse(got) <= brute.min() * 1.01
    assert got == pytest.approx(best, rel=0.05)
    # without outliers, MSE clips the long Laplacian tail (rounding error outweighs clipping error)
    y = np.random.default_rng(4).laplace(0, 1, 100_000).astype(np.float32)
    hist, hmax, zeros = abs_hist(y)
    assert amax_mse(hist, hmax, zeros=zeros) < 0.8 * hmax


def test_streaming_rebinning_agrees_with_one_shot_histogram() -> None:
    rng = np.random.default_rng(5)
    # growing scales force a re-bin at almost every batch: the worst case for the approximation
    batches = [rng.laplace(0, 0.2 * (k + 1), 20_000).astype(np.float32) for k in range(20)]
    h = TensorHistogram()
    for b in batches:
        h.update(b)
    x = np.concatenate(batches)
    ref, hmax, zeros = abs_hist(x)
    assert h.amax == hmax
    assert h.zeros == zeros and h.count == x.size
    got = h.bins()
    assert got.sum() == pytest.approx(ref.sum(), rel=1e-12)  # re-binning conserves counts
    # stated tolerance: total variation distance between the two histograms under 1%
    tvd = 0.5 * np.abs(got - ref).sum() / ref.sum()
    assert tvd < 0.01, tvd
    # and the calibrators built on it move by less than 1% of the range
    for method in ("entropy", "mse", "percentile"):
        opts = CalibOptions(method=method)
        one_shot = TensorHistogram()
        one_shot.update(x)
        assert h.compute_amax(opts) == pytest.approx(one_shot.compute_amax(opts), abs=0.01 * hmax), method


def test_histogram_merge_equals_single_stream() -> None:
    rng = np.random.default_rng(6)
    a, b = rng.normal(0, 1, 30_000), rng.normal(0, 3, 30_000)
    h1, h2, both = TensorHistogram(), TensorHistogram(), TensorHistogram()
    h1.update(a)
    h2.update(b)
    both.update(np.concatenate([a, b]))
    h1.merge(h2)
    assert h1.amax == both.amax and h1.count == both.count
    assert 0.5 * np.abs(h1.bins() - both.bins()).sum() / both.bins().sum() < 0.01


def test_weight_scales_per_channel_axis_and_zero_channel() -> None:
    w = np.random.default_rng(7).standard_normal((4, 3, 2, 2)).astype(np.float32)
    w[2] = 0.0
    s0 = weight_scales(w, 0)
    assert s0.dtype == np.float32 and s0.shape == (4,)
    for c in (0, 1, 3):
        assert s0[c] == np.float32(np.abs(w[c]).max()) / np.float32(127)
    assert s0[2] > 0  # zero-safe: TensorRT rejects scale 0
    s1 = weight_scales(w, 1)  # ConvTranspose weights are (Cin, Cout/g, kH, kW): channels on axis 1
    assert s1.shape == (3,)
    assert s1[1] == np.float32(np.abs(w[:, 1]).max()) / np.float32(127)


def test_options_reject_unknown_method() -> None:
    assert CALIBRATORS == ("max", "percentile", "entropy", "mse")
    with pytest.raises(QuantError, match="unknown calibrator 'kl'"):
        CalibOptions(method="kl")


# ---------------------------------------------------------------------------------------------------
# A real onnxruntime pass
# ---------------------------------------------------------------------------------------------------


def tiny_model() -> onnx.ModelProto:
    """x -> Mul(3) -> Relu -> Conv 3x3 -> Relu -> y; small enough to check by hand."""
    rng = np.random.default_rng(8)
    w = numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    three = numpy_helper.from_array(np.array(3.0, np.float32), "three")
    nodes = [
        helper.make_node("Mul", ["x", "three"], ["scaled"], name="mul"),
        helper.make_node("Relu", ["scaled"], ["act"], name="relu0"),
        helper.make_node("Conv", ["act", "w"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["y"], name="relu1"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])
    g = helper.make_graph(nodes, "tiny", [x], [y], [w, three])
    return helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def tiny_data(tmp_path):
    rng = np.random.default_rng(9)
    xs = [rng.standard_normal((1, 2, 8, 8)).astype(np.float32) for _ in range(6)]
    for i, x in enumerate(xs):
        np.save(tmp_path / f"{i}.npy", x)
    return tmp_path, xs


def test_collect_ranges_max_is_exact_on_real_session(tiny_data) -> None:
    d, xs = tiny_data
    model = tiny_model()
    before = model.SerializeToString()
    calls = []
    ranges = collect_ranges(model, ["x", "act", "conv"], calibration_set(model, d),
                            CalibOptions(method="max"),
                            progress=lambda task, done, total: calls.append((done, total)))
    assert model.SerializeToString() == before  # the caller's model is not modified
    assert ranges["x"] == float(max(np.abs(x).max() for x in xs))
    assert ranges["act"] == float(max(np.maximum(x * np.float32(3), 0).max() for x in xs))
    # the conv output straight from a plain session exposing it
    ref = tiny_model()
    ref.graph.output.append(helper.make_tensor_value_info("conv", TensorProto.FLOAT, None))
    s = ort.InferenceSession(ref.SerializeToString(), providers=["CPUExecutionProvider"])
    conv_max = max(float(np.abs(s.run(["conv"], {"x": x})[0]).max()) for x in xs)
    assert ranges["conv"] == pytest.approx(conv_max, rel=1e-6)
    assert calls[0] == (0, 6) and calls[-1] == (6, 6)


def test_collect_ranges_all_methods_clip_within_max(tiny_data) -> None:
    d, _ = tiny_data
    model = tiny_model()
    data = calibration_set(model, d)
    hists = collect_histograms(model, ["act", "conv"], data, CalibOptions())
    for method in CALIBRATORS:
        r = collect_ranges(model, ["act", "conv"], data, CalibOptions(method=method))
        for t in ("act", "conv"):
            assert 0 < r[t] <= hists[t].amax + 1e-9, (method, t)
            assert r[t] == hists[t].compute_amax(CalibOptions(method=method))


def test_collect_ranges_unknown_tensor(tiny_data) -> None:
    model = tiny_model()
    with pytest.raises(QuantError, match="not in the model: nope"):
        collect_ranges(model, ["nope"], calibration_set(model, tiny_data[0]))


def test_collect_ranges_names_a_tensor_that_overflows(tmp_path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Log", ["x"], ["logx"]), helper.make_node("Relu", ["logx"], ["y"])]
    g = helper.make_graph(nodes, "log", [x], [y])
    model = helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    np.save(tmp_path / "a.npy", np.ones((1, 4), np.float32))
    np.save(tmp_path / "b.npy", np.array([[1, 2, 0, 3]], np.float32))  # log(0) = -inf
    with pytest.raises(QuantError, match="tensor 'logx' is NaN or Inf on calibration sample 2"):
        collect_ranges(model, ["logx"], calibration_set(model, tmp_path))


def test_collect_ranges_batches_dynamic_batch_models(tiny_data) -> None:
    d, _ = tiny_data
    model = tiny_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    r1 = collect_ranges(model, ["act"], calibration_set(model, d), CalibOptions(method="max"))
    r4 = collect_ranges(model, ["act"], calibration_set(model, d), CalibOptions(method="max", batch_size=4))
    assert r1 == r4


def test_models_past_the_protobuf_limit_run_from_a_file(tiny_data, monkeypatch) -> None:
    # Calibration and the accuracy check share one session loader; a limit of 0 sends every model
    # through the external-data file route that >2 GB models take.
    from edgeq.graph import io
    from edgeq.quant.accuracy import compare_accuracy

    d, _ = tiny_data
    model = tiny_model()
    data = calibration_set(model, d)
    in_memory = collect_ranges(model, ["x", "act", "conv"], data, CalibOptions(method="max"))
    saved = []
    real_save = io.save_model
    monkeypatch.setattr(io, "EXTERNAL_DATA_THRESHOLD", 0)
    monkeypatch.setattr(io, "save_model", lambda m, p, **kw: saved.append(kw) or real_save(m, p, **kw))
    assert collect_ranges(model, ["x", "act", "conv"], data, CalibOptions(method="max")) == in_memory
    report = compare_accuracy(model, tiny_model(), data)
    assert saved == [{"external_data": True}] * 3  # calibration session, then both accuracy sessions
    assert report.samples == 6 and report.cosine == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------------
# Calibration cache
# ---------------------------------------------------------------------------------------------------


def test_cache_round_trip_bit_for_bit(tmp_path) -> None:
    amax = {"input": 2.6400001, "/layer1/conv/Conv_output_0": 127.0, "odd: name with: colons": 0.0137,
            "zero": 0.0}
    path = tmp_path / "model.cache"
    write_calibration_cache(path, amax)
    lines = path.read_text().splitlines()
    assert lines[0] == DEFAULT_HEADER == "TRT-8600-EntropyCalibration2"
    assert lines[2] == "/layer1/conv/Conv_output_0: 3f800000"  # amax 127 -> scale 1.0
    for line in lines[1:]:
        name, _, hexval = line.rpartition(": ")
        assert len(hexval) == 8 and int(hexval, 16) >= 0
    header, scales = read_calibration_cache(path)
    assert header == DEFAULT_HEADER and list(scales) == list(amax)
    for name, a in amax.items():
        want = struct.pack(">f", activation_scale(a))
        assert struct.pack(">f", scales[name]) == want, name
    assert scales["zero"] > 0  # an all-zero tensor still gets a usable scale


def test_cache_scale_is_amax_over_127_as_big_endian_float32() -> None:
    _, scales = parse_calibration_cache("TRT-8600-EntropyCalibration2\ninput: 3c010204\n")
    assert scales == {"input": float(np.float32(1.0) / np.float32(127.0))}


@pytest.mark.parametrize("text,match", [
    ("", "empty calibration cache"),
    ("not a header\nx: 3c010204\n", ":1: header"),
    ("TRT-8600-EntropyCalibration2\nx 3c010204\n", ":2: expected '<tensor>: <8 hex digits>'"),
    ("TRT-8600-EntropyCalibration2\nx: 3c0102\n", ":2: expected"),
    ("TRT-8600-EntropyCalibration2\nx: 3c010204\nx: 3c010204\n", ":3: tensor 'x' appears twice"),
])
def test_cache_malformed_lines(tmp_path, text: str, match: str) -> None:
    p = tmp_path / "bad.cache"
    p.write_text(text)
    with pytest.raises(QuantError, match=match):
        read_calibration_cache(p)


def test_cache_write_is_atomic_and_refuses_bad_names(tmp_path) -> None:
    p = tmp_path / "m.cache"
    write_calibration_cache(p, {"a": 1.0})
    before = p.read_bytes()
    with pytest.raises(QuantError, match="cannot be written"):
        write_calibration_cache(p, {"a": 1.0, "bad\nname": 1.0})
    assert p.read_bytes() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.cache"]
