"""Calibration data: layouts that work, and bad data that fails with one clear line naming the file."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_upper_case_suffixes_read_as_their_format(tmp_path) -> None:
    # Files are picked by suffix case-insensitively (cameras and Windows tools write .NPZ/.NPY).
    stack, one = rand(2, 3, 8, 8, seed=1), rand(1, 3, 8, 8, seed=2)
    np.savez(tmp_path / "A.NPZ", images=stack)
    np.save(tmp_path / "B.NPY", one)
    feeds = list(calibration_set(IMG, tmp_path))
    assert len(feeds) == 3
    np.testing.assert_array_equal(feeds[1]["images"], stack[1:2])
    np.testing.assert_array_equal(feeds[2]["images"], one)


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
    with pytest.raises(QuantError, match="images need preprocessing, and nothing in the model says which"):
        calibration_set(IMG, tmp_path)
    spec = tmp_path / "pre.yaml"
    spec.write_text("layout: NCWH\n")
    with pytest.raises(ConfigError, match="'layout' must be NCHW or NHWC"):
        load_preprocess(spec)
    spec.write_text("mean: [0.5]\nsdt: [1]\n")
    with pytest.raises(ConfigError, match=r"unknown key 'sdt' \(did you mean 'std'\?\)"):
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


# ---------------------------------------------------------------------------------------------------
# Real image files through Pillow: JPEG, PNG and friends, checked against numpy
# ---------------------------------------------------------------------------------------------------

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)
IMAGENET_LIKE = "mean: [0.485, 0.456, 0.406]\nstd: [0.229, 0.224, 0.225]\nscale: 1/255\n"


def smooth_rgb(h: int = 30, w: int = 40, seed: int = 0) -> np.ndarray:
    """Gradients plus a low-frequency wave: JPEG keeps such an image within a few grey levels."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    phase = np.random.default_rng(seed).uniform(0, 6)
    img = np.stack([xx * 255 / w, yy * 255 / h, 128 + 60 * np.sin(xx / 6 + yy / 5 + phase)], -1)
    return img.clip(0, 255).astype(np.uint8)


def noisy_rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3)).astype(np.uint8)


def save_image(path, img: np.ndarray, **kw) -> None:
    from PIL import Image

    Image.fromarray(img).save(path, **kw)


def spec_file(tmp_path, text: str):
    p = tmp_path / "pre.yaml"
    p.write_text(text)
    return p


def normalise_nchw(hwc: np.ndarray) -> np.ndarray:
    """The numpy side of the same preprocessing: /255, ImageNet mean/std, HWC -> NCHW with batch."""
    return ((hwc.astype(np.float32) / 255 - MEAN) / STD).transpose(2, 0, 1)[None]


def bilinear_reference(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Plain half-pixel bilinear (cv2.INTER_LINEAR), written as gathers: independent of edgeq's matrices."""
    x = img.astype(np.float64)
    ih, iw = x.shape[:2]

    def axis(n_in: int, n_out: int):
        pos = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
        lo = np.floor(pos).astype(int)
        return lo, np.minimum(lo + 1, n_in - 1), pos - lo

    y0, y1, fy = axis(ih, h)
    x0, x1, fx = axis(iw, w)
    rows = x[y0] * (1 - fy)[:, None, None] + x[y1] * fy[:, None, None]
    return rows[:, x0] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]


def only_feed(model, path, spec) -> np.ndarray:
    (feed,) = list(calibration_set(model, path, preprocess=spec))
    (x,) = feed.values()
    return x


def test_png_crop_and_normalise_exact(tmp_path) -> None:
    """40x30 PNG, resize_shorter equal to its short side (no resampling) + center_crop: bit-exact numpy."""
    img = noisy_rgb(30, 40, seed=1)
    save_image(tmp_path / "a.png", img)
    m = model_with_inputs(("x", [1, 3, 24, 32], TensorProto.FLOAT))
    spec = spec_file(tmp_path, IMAGENET_LIKE + "resize_shorter: 30\ncenter_crop: [24, 32]\n")
    x = only_feed(m, tmp_path / "a.png", spec)
    # torchvision CenterCrop offsets: round((30-24)/2) = 3, round((40-32)/2) = 4
    np.testing.assert_allclose(x, normalise_nchw(img[3:27, 4:36]), rtol=1e-6, atol=1e-6)
    # NHWC and BGR: the same pixels, channels reversed and last
    m2 = model_with_inputs(("x", [1, 24, 32, 3], TensorProto.FLOAT))
    spec = spec_file(tmp_path, "scale: 1\nresize_shorter: 30\ncenter_crop: [24, 32]\nlayout: NHWC\n"
                               "channels: BGR\n")
    np.testing.assert_array_equal(only_feed(m2, tmp_path / "a.png", spec)[0], img[3:27, 4:36, ::-1])


def test_png_resize_matches_numpy_bilinear_and_pil(tmp_path) -> None:
    from PIL import Image

    img = noisy_rgb(30, 40, seed=2)
    save_image(tmp_path / "a.png", img)
    m = model_with_inputs(("x", [1, 3, 12, 12], TensorProto.FLOAT))
    # antialias: false is plain bilinear (cv2.INTER_LINEAR): equal to the gather reference
    spec = spec_file(tmp_path, IMAGENET_LIKE + "resize: [12, 16]\ncenter_crop: 12\nantialias: false\n")
    want = normalise_nchw(bilinear_reference(img, 12, 16)[:, 2:14])
    np.testing.assert_allclose(only_feed(m, tmp_path / "a.png", spec), want, rtol=1e-5, atol=2e-5)
    # the default (antialias) is what torchvision's Resize does on a PIL image: PIL BILINEAR, which
    # rounds to uint8 after each of its two passes, hence 1 grey level of tolerance
    spec = spec_file(tmp_path, IMAGENET_LIKE + "resize: [12, 16]\ncenter_crop: 12\n")
    pil = np.asarray(Image.fromarray(img).resize((16, 12), Image.BILINEAR, reducing_gap=None))
    got = only_feed(m, tmp_path / "a.png", spec)
    np.testing.assert_allclose(got, normalise_nchw(pil[:, 2:14]), atol=1.01 / 255 / STD.min())
    # and differs from plain bilinear when shrinking 2.5x (aliasing is the point of the option)
    assert np.abs(got - want).max() > 10 / 255 / STD.max()


def test_jpeg_within_tolerance(tmp_path) -> None:
    img = smooth_rgb(30, 40, seed=3)
    save_image(tmp_path / "a.jpg", img, quality=95, subsampling=0)
    m = model_with_inputs(("x", [1, 3, 30, 40], TensorProto.FLOAT))
    x = only_feed(m, tmp_path / "a.jpg", spec_file(tmp_path, IMAGENET_LIKE))
    err = np.abs(x - normalise_nchw(img)) * STD[None, :, None, None] * 255  # in grey levels
    assert err.max() <= 10 and err.mean() <= 2, (err.max(), err.mean())  # measured: 6 and 0.8


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "P", "P-transparent", "I;16"])
def test_image_modes_become_the_models_channels(tmp_path, mode: str) -> None:
    from PIL import Image

    rgb = noisy_rgb(30, 40, seed=4)
    gray = rgb[:, :, 0]
    if mode == "L":
        im, want_rgb = Image.fromarray(gray), np.repeat(gray[:, :, None], 3, 2)
    elif mode == "LA":
        im = Image.merge("LA", [Image.fromarray(gray), Image.fromarray(255 - gray)])
        want_rgb = np.repeat(gray[:, :, None], 3, 2)
    elif mode == "RGBA":  # alpha dropped, as torchvision's loader (img.convert("RGB")) does
        im = Image.merge("RGBA", [Image.fromarray(c) for c in (*rgb.transpose(2, 0, 1), 255 - gray)])
        want_rgb = rgb
    elif mode.startswith("P"):
        palette = np.random.default_rng(5).integers(0, 256, (256, 3)).astype(np.uint8)
        idx = gray
        im = Image.fromarray(idx)
        im.putpalette(palette.tobytes())  # an L image given a palette becomes mode P
        if mode == "P-transparent":
            im.info["transparency"] = 0
        want_rgb = palette[idx]
    else:  # 16-bit grey PNG: scaled to 0..255 as 16-bit PGM is
        wide = (gray.astype(np.uint16) * 257)  # 0..65535
        im = Image.fromarray(wide)
        want_rgb = np.repeat((wide.astype(np.float32) * (255 / 65535))[:, :, None], 3, 2)
    im.save(tmp_path / "a.png")
    with Image.open(tmp_path / "a.png") as saved:
        assert saved.mode == mode.split("-")[0]  # the file really holds that mode
    spec = spec_file(tmp_path, "scale: 1\n")
    x3 = only_feed(model_with_inputs(("x", [1, 3, 30, 40], TensorProto.FLOAT)), tmp_path / "a.png", spec)
    np.testing.assert_allclose(x3[0], want_rgb.astype(np.float32).transpose(2, 0, 1), atol=1e-3)
    # a one-channel model gets luma (ITU-R 601) of the same RGB
    x1 = only_feed(model_with_inputs(("x", [1, 1, 30, 40], TensorProto.FLOAT)), tmp_path / "a.png", spec)
    luma = want_rgb.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    np.testing.assert_allclose(x1[0, 0], luma, atol=1e-3)


def test_exif_orientation_is_applied(tmp_path) -> None:
    """A phone photo stored 40 wide x 30 high with Orientation 6 shows (and must feed) 30 wide x 40 high."""
    from PIL import Image

    img = noisy_rgb(30, 40, seed=6)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    save_image(tmp_path / "a.png", img, exif=exif)
    m = model_with_inputs(("x", [1, 3, 40, 30], TensorProto.FLOAT))
    spec = spec_file(tmp_path, "scale: 1\ncenter_crop: [40, 30]\n")  # no resize: a wrong turn fails
    x = only_feed(m, tmp_path / "a.png", spec)
    np.testing.assert_array_equal(x[0], np.rot90(img, k=-1).astype(np.float32).transpose(2, 0, 1))


def test_mixed_sizes_and_formats_all_reach_the_input_shape(tmp_path) -> None:
    d = tmp_path / "imgs"
    (d / "sub").mkdir(parents=True)
    sizes = {"a.png": (30, 40), "b.jpg": (40, 30), "sub/c.bmp": (64, 48), "d.webp": (17, 23),
             "e.tif": (32, 32), "f.PNG": (100, 20)}
    for name, (h, w) in sizes.items():
        save_image(d / name, smooth_rgb(h, w, seed=h))
    (d / "README.txt").write_text("not an image, ignored")
    m = model_with_inputs(("x", [1, 3, 16, 16], TensorProto.FLOAT))
    spec = spec_file(tmp_path, IMAGENET_LIKE + "resize_shorter: 18\ncenter_crop: 16\n")
    data = calibration_set(m, d, preprocess=spec)
    feeds = list(data)
    assert len(feeds) == len(sizes)
    assert all(f["x"].shape == (1, 3, 16, 16) and f["x"].dtype == np.float32 for f in feeds)
    # torchvision's Resize(18) on 100x20 (HxW): width 18, height int(18 * 100 / 20) = 90; crop the middle
    from edgeq.quant.data.preprocess import shorter_side_size

    assert shorter_side_size(100, 20, 18) == (90, 18) and shorter_side_size(30, 40, 18) == (18, 24)
    assert shorter_side_size(30, 40, 17) == (17, 22) and shorter_side_size(40, 30, 17) == (22, 17)  # int()
    # a crop larger than the resized image is an error naming the file (torchvision would pad zeros)
    spec = spec_file(tmp_path, IMAGENET_LIKE + "resize_shorter: 12\ncenter_crop: 16\n")
    with pytest.raises(QuantError, match=r"a\.png: center_crop 16x16 \(HxW\) is larger than the resized "
                                         r"image 12x16"):
        list(calibration_set(m, d, preprocess=spec))
    # without crop the resized image must already fit: the message names the size before resizing
    spec = spec_file(tmp_path, IMAGENET_LIKE + "resize_shorter: 16\n")
    with pytest.raises(QuantError, match=r"a\.png: preprocessed image has shape \(1, 3, 16, 21\).*"
                                         r"image 30x40 \(HxW\)"):
        list(calibration_set(m, d, preprocess=spec))
    # a fixed output size that cannot fit fails up front, naming the spec, before any decoding
    spec = spec_file(tmp_path, IMAGENET_LIKE + "resize_shorter: 256\ncenter_crop: 224\n")
    with pytest.raises(QuantError, match=r"pre\.yaml: the preprocessing gives 224x224 \(HxW, "
                                         r"'center_crop'\), input 'x' is \(1, 3, 16, 16\) \(NCHW\): 16x16"):
        calibration_set(m, d, preprocess=spec)
    with pytest.raises(QuantError, match=r"gives 16x20 \(HxW, 'resize'\)"):
        calibration_set(m, d, preprocess=spec_file(tmp_path, "resize: [16, 20]\n"))


def test_corrupt_images_name_the_file(tmp_path) -> None:
    m = model_with_inputs(("x", [1, 3, 16, 16], TensorProto.FLOAT))
    spec = spec_file(tmp_path, IMAGENET_LIKE)
    d = tmp_path / "imgs"
    d.mkdir()
    save_image(d / "good.png", smooth_rgb())
    (d / "fake.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(QuantError) as e:  # not an image at all: found when the set is built
        calibration_set(m, d, preprocess=spec)
    assert "fake.jpg: not a readable image" in one_line_error(e)
    (d / "fake.jpg").unlink()
    for name, kw in (("cut.jpg", {"quality": 90}), ("cut.png", {})):
        save_image(d / name, noisy_rgb(30, 40), **kw)
        raw = (d / name).read_bytes()
        (d / name).write_bytes(raw[: len(raw) // 2])  # header intact, pixels cut
        data = calibration_set(m, d, preprocess=spec)
        with pytest.raises(QuantError) as e:
            list(data)
        msg = one_line_error(e)
        assert f"{name}: not a readable image" in msg and "truncated" in msg, msg
        (d / name).unlink()


def test_preprocess_spec_resize_keys(tmp_path) -> None:
    spec = spec_file(tmp_path, "resize: 256\n")
    with pytest.raises(ConfigError, match=r"'resize' must be \[height, width\], got 256") as e:
        load_preprocess(spec)
    assert "resize_shorter" in (e.value.hint or "")
    spec = spec_file(tmp_path, "resize: [8, 8]\nresize_shorter: 8\n")
    with pytest.raises(ConfigError, match="'resize' or 'resize_shorter', not both"):
        load_preprocess(spec)
    for bad in ("resize_shorter: 0", "resize_shorter: [8, 8]", "center_crop: [8]", "antialias: maybe"):
        with pytest.raises(ConfigError, match=bad.split(":")[0]):
            load_preprocess(spec_file(tmp_path, bad + "\n"))
    p = load_preprocess(spec_file(tmp_path, "resize_shorter: 20\ncenter_crop: 16\nantialias: false\n"))
    assert (p.resize, p.resize_shorter, p.center_crop, p.antialias) == (None, 20, (16, 16), False)


def test_imagenet_example_spec_is_torchvision(tmp_path) -> None:
    """pipelines/preprocess-imagenet.yaml == Resize(256), CenterCrop(224), ToTensor, Normalize(ImageNet)."""
    from PIL import Image

    example = Path(__file__).resolve().parents[1] / "pipelines" / "preprocess-imagenet.yaml"
    pre = load_preprocess(example)
    assert (pre.resize_shorter, pre.center_crop, pre.layout, pre.channels) == (256, (224, 224), "NCHW", "RGB")
    assert pre.scale == pytest.approx(1 / 255) and pre.antialias
    np.testing.assert_allclose(pre.mean, MEAN, rtol=1e-6)
    np.testing.assert_allclose(pre.std, STD, rtol=1e-6)
    img = noisy_rgb(300, 400, seed=7)
    save_image(tmp_path / "photo.png", img)
    m = model_with_inputs(("x", [1, 3, 224, 224], TensorProto.FLOAT))
    x = only_feed(m, tmp_path / "photo.png", example)
    # torchvision on a PIL image: Resize(256) -> 341x256 (int(256 * 400 / 300)), PIL BILINEAR; crop
    # offsets round((256 - 224) / 2) = 16, round((341 - 224) / 2) = 58 (117 / 2 = 58.5 rounds to even)
    pil = np.asarray(Image.fromarray(img).resize((341, 256), Image.BILINEAR, reducing_gap=None))
    want = normalise_nchw(pil[16:240, 58:282])
    np.testing.assert_allclose(x, want, atol=1.01 / 255 / STD.min())


# ---------------------------------------------------------------------------------------------------
# End to end: edgeq quantize on a folder of JPEG/PNG files
# ---------------------------------------------------------------------------------------------------


def test_cli_quantize_image_folder(tmp_path, cli) -> None:
    from edgeq import zoo

    src = tmp_path / "model.onnx"
    onnx.save(zoo.resnet_like(size=32), src)
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for i, (h, w) in enumerate([(30, 40), (40, 30), (48, 64), (36, 36), (50, 40), (33, 45)]):
        save_image(imgs / (f"{i}.jpg" if i % 2 else f"{i}.png"), smooth_rgb(h, w, seed=i), quality=95)
    spec = spec_file(tmp_path, IMAGENET_LIKE + "resize_shorter: 36\ncenter_crop: 32\n")
    code, out, err = cli("quantize", src, "--calib", imgs, "--preprocess", spec)
    assert code == 0, (out, err)
    for name in ("model.int8.onnx", "model.int8.cache", "model.int8.fp32.onnx", "model.int8.json"):
        assert (tmp_path / name).is_file(), name
    summary = json.loads((tmp_path / "model.int8.json").read_text())
    assert summary["samples"] == {"calibration": 6, "holdout": 6}  # no --holdout: every image, scored too
    assert summary["fp32_model"] == str(tmp_path / "model.int8.fp32.onnx")
    assert "model.int8.fp32.onnx" in out.replace("\n", "")
