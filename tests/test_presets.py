"""Image preprocessing presets (``--preprocess NAME``): each shipped YAML loads, reproduces its
exporter's steps as its source writes them, prints for copying, and is picked unasked only where the
model's metadata names the exporter."""

from __future__ import annotations

import numpy as np
import pytest
from test_exporter import ULTRALYTICS, flattening

from edgeq.errors import ConfigError, QuantError
from edgeq.quant.data import calibration_set
from edgeq.quant.data.inputs import InputSpec
from edgeq.quant.data.preprocess import (
    letterbox,
    limited_size,
    line_widths,
    load_preprocess,
    preset_names,
    preset_text,
)

PRESETS = ["imagenet", "ppocr-cls", "ppocr-det", "ppocr-rec", "yolo"]


def test_every_preset_loads_and_help_lists_each(cli, monkeypatch) -> None:
    assert preset_names() == PRESETS
    for name in PRESETS:
        pre = load_preprocess(name)
        assert pre.name == f"the {name} preset"
        assert "Source:" in preset_text(name) and f"edgeq presets {name}" in preset_text(name)
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = cli("quantize", "--help")
    assert code == 0 and "imagenet, yolo, ppocr-det/-rec/-cls" in " ".join(out.split())
    code, out, _ = cli("presets", "yolo")
    assert code == 0 and out == preset_text("yolo")  # to copy: edgeq presets yolo > my.yaml
    with pytest.raises(ConfigError, match="--preprocess yolov8: no such preset"):
        load_preprocess("yolov8")


def test_a_copied_preset_is_a_spec_file(tmp_path) -> None:
    path = tmp_path / "my.yaml"
    path.write_text(preset_text("yolo").replace("# size: [640, 640]", "size: [64, 64]"))
    pre = load_preprocess(path)
    assert pre.letterbox and pre.size == (64, 64) and pre.name == str(path)


def test_letterbox_splits_the_border_as_ultralytics_does() -> None:
    """ultralytics' LetterBox for a 97x200 image into 320x320: scale 1.6, 155x320, borders 82.5 a side:
    top round(82.4) = 82, bottom round(82.6) = 83 rows of 114."""
    x = np.full((97, 200, 3), 10.0, np.float32)
    out = letterbox(x, 320, 320, 114.0)
    assert out.shape == (320, 320, 3)
    rows = np.where(out[:, 160, 0] != 114.0)[0]
    assert (rows.min(), rows.max()) == (82, 82 + 155 - 1) and 320 - 1 - rows.max() == 83
    assert np.allclose(out[100, :, 0], 10.0)  # no column padded: the width fills the canvas


def test_paddleocr_sizes() -> None:
    assert limited_size(700, 1000, 960, "max", 32) == (672, 960)  # longer side down to 960, x32
    assert limited_size(100, 200, 736, "min", 32) == (736, 1472)  # rapidocr's: shorter side up to 736
    assert limited_size(500, 600, 960, "max", 32) == (512, 608)  # within the limit: only rounded to x32
    assert line_widths(48, 100, 48, 320, True) == (320, 100)  # a short line, padded to 320
    assert line_widths(48, 600, 48, 320, True) == (600, 600)  # a long one widens the recogniser's input
    assert line_widths(48, 600, 48, 192, False) == (192, 192)  # the classifier squeezes it into 192


def test_the_recognisers_preset_pads_a_line_with_normalised_zero(tmp_path) -> None:
    pre = load_preprocess("ppocr-rec")
    spec = InputSpec("x", (None, 3, None, None), "float32")
    line = np.full((24, 50, 3), 255, np.uint8)  # white: 1.0 after (x / 255 - 0.5) / 0.5
    x = pre.apply(line, spec, tmp_path / "line.png")
    assert x.shape == (1, 3, 48, 320)
    assert np.allclose(x[..., :100], 1.0) and np.allclose(x[..., 100:], 0.0)


def write_jpg(path, size=(60, 90)) -> None:
    from PIL import Image

    Image.fromarray(np.full((*size, 3), 128, np.uint8)).save(path)


def test_images_take_the_preset_the_metadata_names(tmp_path) -> None:
    write_jpg(tmp_path / "a.jpg")
    data = calibration_set(flattening(meta=ULTRALYTICS), tmp_path)
    assert any("the yolo preset, from its metadata: author 'Ultralytics'" in n for n in data.notes)
    (feed,) = list(data)
    assert feed["images"].shape == (1, 3, 8, 8)  # letterboxed to its imgsz: its dimensions are dynamic


def test_without_metadata_edgeq_suggests_a_preset_or_says_it_cannot_tell(tmp_path) -> None:
    from onnx import TensorProto, helper

    write_jpg(tmp_path / "a.jpg")
    out = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [-1, 2])]
    paddle = flattening("x", (-1, 3, "?", "?"), out, producer="PaddlePaddle")
    with pytest.raises(QuantError, match=r"a PP-OCR direction classifier .*--preprocess ppocr-cls"):
        calibration_set(paddle, tmp_path)
    with pytest.raises(QuantError, match="nothing in the model says which it was trained with"):
        calibration_set(flattening(), tmp_path)


def test_a_preset_keys_the_placement_cache_by_its_content(tmp_path) -> None:
    """deploy --placement auto caches by the calibration's content: a preset's shipped bytes, as a file's."""
    from pathlib import Path

    from edgeq.orchestration.placement_cache import calibration_digest
    from edgeq.quant.quantize import QuantizeOptions

    data = tmp_path / "images"
    data.mkdir()
    write_jpg(data / "a.jpg")
    digest = {name: calibration_digest(QuantizeOptions(calib=data, preprocess=Path(name)))
              for name in ("yolo", "imagenet")}
    copy = tmp_path / "yolo.yaml"
    copy.write_text(preset_text("yolo"))
    assert digest["yolo"] != digest["imagenet"]
    assert calibration_digest(QuantizeOptions(calib=data, preprocess=copy)) == digest["yolo"]
