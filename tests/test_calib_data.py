"""Calibration data: layouts that work, and bad data that fails with one clear line naming the file."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgeq.errors import ConfigError, QuantError
from edgeq.quant.data import calibration_set, load_preprocess


def model_with_inputs(*inputs: tuple[str, list, int]) -> onnx.ModelProto:
    """Identity per input: enough for data checks, which only look at the model's inputs."""
    vis = [helper.make_tensor_value_info(n, t, s) for n, s, t in inputs]
    outs = [helper.make_tensor_value_info(f"{n}_out", t, s) for n, s, t in inputs]
    nodes = [helper.make_node("Identity", [n], [f"{n}_out"]) for n, _, _ in inputs]
    g = helper.make_graph(nodes, "m", vis, outs)
    return helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


IMG = model_with_inputs(("images", [1, 3, 8, 8], TensorProto.FLOAT))


def rand(*shape: int, seed: int = 0, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------------------------------
# Layouts that work
# ---------------------------------------------------------------------------------------------------


def test_npy_with_and_without_batch_dim_and_stacked(tmp_path) -> None:
    a, b, stack = rand(1, 3, 8, 8, seed=1), rand(3, 8, 8, seed=2), rand(5, 3, 8, 8, seed=3)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    np.save(tmp_path / "c_stack.npy", stack)
    np.save(tmp_path / "d_fortran.npy", np.asfortranarray(stack[:2]))
    data = calibration_set(IMG, tmp_path)
    assert len(data) == 9
    feeds = list(data)
    assert all(set(f) == {"images"} and f["images"].shape == (1, 3, 8, 8) for f in feeds)
    np.testing.assert_array_equal(feeds[0]["images"], a)
    np.testing.assert_array_equal(feeds[1]["images"], b[None])
    for k in range(5):
        np.testing.assert_array_equal(feeds[2 + k]["images"], stack[k:k + 1])
    np.testing.assert_array_equal(feeds[8]["images"], stack[1:2])
    assert [f["images"].sum() for f in data] == [f["images"].sum() for f in feeds]  # re-iterable


def test_fixed_batch_model_takes_rows_in_groups(tmp_path) -> None:
    m = model_with_inputs(("x", [2, 4], TensorProto.FLOAT))
    np.save(tmp_path / "s.npy", rand(6, 4))
    data = calibration_set(m, tmp_path)
    assert len(data) == 3 and all(f["x"].shape == (2, 4) for f in data)
    np.save(tmp_path / "s.npy", rand(5, 4))
    with pytest.raises(QuantError, match=r"s\.npy: input 'x' has 5 rows along dim 0, not a \(non-zero\) "
                                         r"multiple of the model's batch size 2"):
        calibration_set(m, tmp_path)


def test_npz_multi_input_keyed_by_name(tmp_path) -> None:
    m = model_with_inputs(("img", [1, 3, 4, 4], TensorProto.FLOAT), ("ids", [1, 5], TensorProto.INT64))
    for i in range(3):
        ids = np.arange(5, dtype=np.int64)[None] + i
        np.savez(tmp_path / f"{i}.npz", img=rand(1, 3, 4, 4, seed=i), ids=ids)
    data = calibration_set(m, tmp_path)
    feeds = list(data)
    assert len(feeds) == 3
    assert feeds[2]["ids"].dtype == np.int64 and feeds[2]["ids"][0, 0] == 2
    np.testing.assert_array_equal(feeds[1]["img"], rand(1, 3, 4, 4, seed=1))


def test_single_input_npz_default_key_and_dynamic_dims(tmp_path) -> None:
    m = model_with_inputs(("x", ["N", 3, "H", "W"], TensorProto.FLOAT))
    np.savez(tmp_path / "a.npz", rand(2, 3, 5, 7))  # np.savez's default key arr_0; stacked along N
    data = calibration_set(m, tmp_path)
    assert len(data) == 2 and [f["x"].shape for f in data] == [(1, 3, 5, 7)] * 2


def test_float64_is_cast_with_a_note(tmp_path) -> None:
    np.save(tmp_path / "a.npy", rand(1, 3, 8, 8, dtype=np.float64))
    data = calibration_set(IMG, tmp_path)
    (feed,) = list(data)
    assert feed["images"].dtype == np.float32
    assert any("float64" in n for n in data.notes)


def test_limit_and_split(tmp_path) -> None:
    np.save(tmp_path / "stack.npy", rand(10, 3, 8, 8))
    data = calibration_set(IMG, tmp_path, limit=8)
    assert len(data) == 8
    calib, held = data.split(0.25)
    assert (len(calib), len(held)) == (6, 2)
    sums_c = {float(f["images"].sum()) for f in calib}
    sums_h = {float(f["images"].sum()) for f in held}
    assert not sums_c & sums_h and len(sums_c | sums_h) == 8  # disjoint, together the whole set
    assert [len(p) for p in data.split(0.25)] == [6, 2]  # reproducible
    assert data.split(0.25)[1]._index == held._index
    assert [len(p) for p in data.split(0.0)] == [8, 0]


def test_synthetic_is_seeded_and_reiterable() -> None:
    data = calibration_set(IMG, None, synthetic=4, seed=3)
    first = [f["images"].copy() for f in data]
    assert len(first) == 4 and first[0].shape == (1, 3, 8, 8) and first[0].dtype == np.float32
    again = list(calibration_set(IMG, None, synthetic=4, seed=3))
    assert all(np.array_equal(a, b["images"]) for a, b in zip(first, again))
    assert all(np.array_equal(a, b["images"]) for a, b in zip(first, data))
    other = list(calibration_set(IMG, None, synthetic=4, seed=4))
    assert not np.array_equal(first[0], other[0]["images"])
    assert data.notes and "synthetic" in data.notes[0]


def write_ppm(path, img: np.ndarray) -> None:
    h, w, _ = img.shape
    path.write_bytes(b"P6\n# made by a test\n%d %d\n255\n" % (w, h) + img.astype(np.uint8).tobytes())


def test_images_with_preprocessing_spec(tmp_path) -> None:
    img = np.random.default_rng(5).integers(0, 256, (8, 8, 3)).astype(np.uint8)
    (tmp_path / "imgs").mkdir()
    write_ppm(tmp_path / "imgs" / "a.ppm", img)
    spec = tmp_path / "pre.yaml"
    spec.write_text("mean: [0.485, 0.456, 0.406]\nstd: [0.229, 0.224, 0.225]\nscale: 1/255\n"
                    "layout: NCHW\nchannels: BGR\n")
    (feed,) = list(calibration_set(IMG, tmp_path / "imgs", preprocess=spec))
    x = feed["images"]
    want = (img[:, :, ::-1].astype(np.float32) / 255 - np.array([0.485, 0.456, 0.406], np.float32)) \
        / np.array([0.229, 0.224, 0.225], np.float32)
    np.testing.assert_allclose(x[0], want.transpose(2, 0, 1), rtol=1e-5, atol=1e-6)


def test_images_resized_nhwc(tmp_path) -> None:
    m = model_with_inputs(("x", [1, 4, 4, 3], TensorProto.FLOAT))
    img = np.full((16, 12, 3), 200, np.uint8)
    img[:, :, 1] = 100
    write_ppm(tmp_path / "a.ppm", img)
    spec = tmp_path / "pre.yaml"
    spec.write_text("layout: NHWC\nscale: 1\n")
    (feed,) = list(calibration_set(m, tmp_path / "a.ppm", preprocess=spec))
    assert feed["x"].shape == (1, 4, 4, 3)
    np.testing.assert_allclose(feed["x"][0, :, :, 0], 200.0)
    np.testing.assert_allclose(feed["x"][0, :, :, 1], 100.0)


# ---------------------------------------------------------------------------------------------------
# Bad data: QuantError, one line, naming the file and expected vs found
# ---------------------------------------------------------------------------------------------------


def one_line_error(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_wrong_shape(tmp_path) -> None:
    np.save(tmp_path / "bad.npy", rand(1, 3, 16, 16))
    with pytest.raises(QuantError) as e:
        calibration_set(IMG, tmp_path)
    msg = one_line_error(e)
    assert "bad.npy" in msg and "expects shape (1, 3, 8, 8)" in msg and "found (1, 3, 16, 16)" in msg


def test_wrong_dtype(tmp_path) -> None:
    np.save(tmp_path / "u8.npy", np.zeros((1, 3, 8, 8), np.uint8))
    with pytest.raises(QuantError) as e:
        calibration_set(IMG, tmp_path)
    msg = one_line_error(e)
    assert "u8.npy" in msg and "expects dtype float32, found uint8" in msg


def test_empty_dir(tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(QuantError, match=r"no calibration data \(.npy, .npz or images\) \(1 files of other"):
        calibration_set(IMG, tmp_path)
    with pytest.raises(QuantError, match="not found"):
        calibration_set(IMG, tmp_path / "missing")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_fails_when_read_naming_file_and_sample(tmp_path, bad: float) -> None:
    x = rand(4, 3, 8, 8)
    x[2, 1, 0, 0] = bad
    np.save(tmp_path / "stack.npy", x)
    data = calibration_set(IMG, tmp_path)
    it = iter(data)
    next(it), next(it)
    with pytest.raises(QuantError) as e:
        next(it)
    msg = one_line_error(e)
    assert "stack.npy (sample 2)" in msg and ("NaN" if np.isnan(bad) else "Inf") in msg
    with pytest.raises(QuantError, match=r"stack\.npy \(sample 2\)"):
        data.check_values()  # the up-front scan finds it too, without running a model
    calibration_set(IMG, tmp_path, limit=2).check_values()  # the clean part passes


def test_unknown_and_missing_input_names(tmp_path) -> None:
    np.savez(tmp_path / "a.npz", image=rand(1, 3, 8, 8))
    with pytest.raises(QuantError) as e:
        calibration_set(IMG, tmp_path)
    msg = one_line_error(e)
    assert "a.npz" in msg and "missing input 'images'" in msg and "unknown key 'image'" in msg

    m = model_with_inputs(("a", [1, 2], TensorProto.FLOAT), ("b", [1, 2], TensorProto.FLOAT))
    (tmp_path / "a.npz").unlink()
    np.save(tmp_path / "x.npy", rand(1, 2))
    with pytest.raises(QuantError, match=r"x\.npy: the model has 2 inputs \['a', 'b'\]; a \.npy file holds"):
        calibration_set(m, tmp_path)


def test_unreadable_files(tmp_path) -> None:
    (tmp_path / "junk.npy").write_bytes(b"definitely not numpy")
    with pytest.raises(QuantError, match=r"junk\.npy: not a readable \.npy file"):
        calibration_set(IMG, tmp_path)
    (tmp_path / "junk.npy").unlink()
    (tmp_path / "junk.npz").write_bytes(b"PK not a zip")
    with pytest.raises(QuantError, match=r"junk\.npz: not a readable \.npz file"):
        calibration_set(IMG, tmp_path)
    (tmp_path / "junk.npz").unlink()
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(QuantError, match=r"obj\.npy: not a readable \.npy file \(object arrays"):
        calibration_set(IMG, tmp_path)


def test_truncated_npy_fails_on_read(tmp_path) -> None:
    np.save(tmp_path / "t.npy", rand(4, 3, 8, 8))
    raw = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(raw[: len(raw) // 2])
    data = calibration_set(IMG, tmp_path)  # the header is intact
    with pytest.raises(QuantError, match=r"t\.npy: cannot read"):
        list(data)


def test_images_need_spec_and_valid_spec(tmp_path) -> None:
    write_ppm(tmp_path / "a.ppm", np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(QuantError, match="images need a preprocessing spec"):
        calibration_set(IMG, tmp_path)
    spec = tmp_path / "pre.yaml"
    spec.write_text("layout: NCWH\n")
    with pytest.raises(ConfigError, match="'layout' must be NCHW or NHWC"):
        load_preprocess(spec)
    spec.write_text("mean: [0.5]\nsdt: [1]\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['sdt'\]"):
        load_preprocess(spec)
    spec.write_text("std: [0, 1, 1]\n")
    with pytest.raises(ConfigError, match="'std' must not contain 0"):
        load_preprocess(spec)


def test_synthetic_and_source_are_exclusive(tmp_path) -> None:
    with pytest.raises(QuantError, match="not both"):
        calibration_set(IMG, tmp_path, synthetic=2)
    with pytest.raises(QuantError, match="no calibration data"):
        calibration_set(IMG, None)


# ---------------------------------------------------------------------------------------------------
# Through the CLI: exit 2, one line, input untouched, nothing written
# ---------------------------------------------------------------------------------------------------


def conv_model() -> onnx.ModelProto:
    w = onnx.numpy_helper.from_array(rand(4, 3, 3, 3, seed=11), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    return helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("case,expect", [
    ("shape", "bad/a.npy: input 'x' expects shape (1, 3, 8, 8)"),
    ("dtype", "bad/a.npy: input 'x' expects dtype float32, found int32"),
    ("empty", "bad: no calibration data"),
    ("nan", "input 'x' contains NaN"),
])
def test_cli_quantize_bad_calibration_data_exits_2(tmp_path, cli, case: str, expect: str) -> None:
    model_path = tmp_path / "m.onnx"
    onnx.save(conv_model(), model_path)
    before = model_path.read_bytes()
    bad = tmp_path / "bad"
    bad.mkdir()
    if case == "shape":
        np.save(bad / "a.npy", rand(1, 3, 9, 9))
    elif case == "dtype":
        np.save(bad / "a.npy", np.zeros((1, 3, 8, 8), np.int32))
    elif case == "nan":
        for i in range(3):
            x = rand(1, 3, 8, 8, seed=i)
            x[0, 0, 0, 0] = np.nan
            np.save(bad / f"{i}.npy", x)
    code, _, err = cli("quantize", model_path, "--calib", bad, "-o", tmp_path / "out.onnx")
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and expect in lines[0].replace(str(tmp_path) + "/", ""), err
    assert "Traceback" not in err
    assert model_path.read_bytes() == before
    assert not (tmp_path / "out.onnx").exists()


def test_jpeg_without_pillow_says_what_to_install(tmp_path) -> None:
    pytest.importorskip("yaml")
    try:
        import PIL  # noqa: F401
        pytest.skip("Pillow is installed: .jpg images are read")
    except ImportError:
        pass
    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    spec = tmp_path / "pre.yaml"
    spec.write_text("scale: 1/255\n")
    with pytest.raises(QuantError, match=r"a\.jpg: reading \.jpg images needs Pillow \(pip install Pillow"):
        calibration_set(IMG, tmp_path, preprocess=spec)
