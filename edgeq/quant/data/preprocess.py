"""Image preprocessing: the YAML spec, and the resize/crop/normalise steps that turn a decoded image into
the model's input, matching torchvision's transforms."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeq.errors import QuantError, first_line
from edgeq.quant.data.inputs import InputSpec, dims_match

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Preprocess:
    """Image preprocessing, as torchvision's classification transforms (and OpenCV pipelines) describe it.

    Order: decode (upright: EXIF orientation applied; RGB, or gray for gray files) -> the model's channel
    count (gray repeated to 3 channels; RGB to 1 channel by ITU-R 601 luma; alpha dropped, as
    torchvision's ``img.convert("RGB")`` does) -> channel order -> resize -> center crop -> ``x * scale``
    -> ``(x - mean) / std`` -> layout (NCHW/NHWC) -> batch dim.

    Resize, one of:

    - ``resize: [H, W]``: straight to that size (aspect ratio not kept);
    - ``resize_shorter: N``: the shorter side to N, the longer to ``int(N * long / short)``, as
      torchvision's ``Resize(N)``;
    - neither: to the model input's H, W, unless ``center_crop`` is given (then no resize).

    then ``center_crop: [H, W]`` (optional) cuts the middle, as torchvision's ``CenterCrop``. The result
    must be the model's input size. Resampling is bilinear with half-pixel centres; ``antialias: true``
    (default) widens the filter when shrinking, as PIL's ``BILINEAR`` and so torchvision's ``Resize`` do;
    ``antialias: false`` is plain 2-tap bilinear, as ``cv2.resize(..., INTER_LINEAR)``. They agree when
    enlarging. Computed in float32, so it matches torchvision's uint8 PIL path to within rounding.
    """

    resize: tuple[int, int] | None = None  # (height, width)
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    scale: float = 1.0 / 255.0
    layout: str = "NCHW"
    channels: str = "RGB"
    resize_shorter: int | None = None
    center_crop: tuple[int, int] | None = None  # (height, width)
    antialias: bool = True
    letterbox: bool = False  # ultralytics' LetterBox: aspect kept, padded to ``size`` (else the input's)
    size: tuple[int, int] | None = None  # (height, width): the letterbox's; None: the model input's
    pad_value: float = 114.0  # the letterbox's border, a pixel value (before ``scale``)
    limit_side_len: int | None = None  # PaddleOCR's DetResizeForTest: the longer (max) or shorter (min)
    limit_type: str = "max"  # side limited to this, then each side rounded to ``size_multiple``
    size_multiple: int | None = None
    resize_height: int | None = None  # a text line: to this height, aspect kept, then padded on the right
    pad_width: int | None = None  # to this width with 0 after normalisation (PaddleOCR's resize_norm_img)
    grow_width: bool = True  # a line wider than pad_width widens the input (True) or is squeezed (False)
    name: str = ""  # the preset's name or the spec's path: what notes and messages call it
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def apply(self, img: np.ndarray, spec: InputSpec, path: Path) -> np.ndarray:
        import numpy as np

        if len(spec.shape) != 4:
            raise QuantError(f"{path}: images feed 4-D inputs; '{spec.name}' is {spec.describe()}")
        h_ax, w_ax, c_ax = (2, 3, 1) if self.layout == "NCHW" else (1, 2, 3)
        want_c = spec.shape[c_ax]
        x = img.astype(np.float32)
        if x.ndim == 2:
            x = x[:, :, None]
        if want_c == 3 and x.shape[2] == 1:
            x = np.repeat(x, 3, axis=2)
        if want_c == 1 and x.shape[2] == 3:
            x = x @ np.array([0.299, 0.587, 0.114], np.float32)[:, None]  # ITU-R 601 luma
        if want_c is not None and x.shape[2] != want_c:
            raise QuantError(f"{path}: image has {x.shape[2]} channels, input '{spec.name}' expects {want_c} "
                             f"({spec.describe()})", hint="check 'layout' in the preprocessing spec")
        if self.channels == "BGR":
            x = x[:, :, ::-1]
        h, w = x.shape[:2]
        model_size = (spec.shape[h_ax], spec.shape[w_ax])
        width = None  # a text line's padded width
        if self.letterbox:
            size = self.size or model_size
            if size[0] is None or size[1] is None:
                raise QuantError(f"input '{spec.name}' has a dynamic spatial size {spec.describe()} and the "
                                 f"letterbox of {self.name or 'the preprocessing'} no 'size'",
                                 hint="give its size in a copy of the spec ('size: [H, W]'; "
                                      "'edgeq presets NAME' prints a preset to copy)")
            x = letterbox(x, int(size[0]), int(size[1]), self.pad_value, antialias=self.antialias)
        elif self.limit_side_len is not None:
            x = resize_image(x, *limited_size(h, w, self.limit_side_len, self.limit_type, self.size_multiple),
                             antialias=self.antialias)
        elif self.resize_height is not None:
            width, inner = line_widths(h, w, self.resize_height, self.pad_width, self.grow_width)
            x = resize_image(x, self.resize_height, inner, antialias=self.antialias)
        elif self.resize is not None:
            x = resize_image(x, *self.resize, antialias=self.antialias)
        elif self.resize_shorter is not None:
            x = resize_image(x, *shorter_side_size(h, w, self.resize_shorter), antialias=self.antialias)
        elif self.center_crop is None:
            if model_size[0] is None or model_size[1] is None:
                raise QuantError(f"input '{spec.name}' has dynamic spatial size; the spec needs 'resize'")
            x = resize_image(x, int(model_size[0]), int(model_size[1]), antialias=self.antialias)
        if self.center_crop is not None:
            x = center_crop(x, *self.center_crop, path=path)
        mean, std = np.asarray(self.mean, np.float32), np.asarray(self.std, np.float32)
        x = (x * np.float32(self.scale) - mean) / std
        if width is not None and width > x.shape[1]:  # PaddleOCR pads the normalised line with 0
            x = np.concatenate([x, np.zeros((x.shape[0], width - x.shape[1], x.shape[2]), x.dtype)], axis=1)
        if self.layout == "NCHW":
            x = x.transpose(2, 0, 1)
        x = np.ascontiguousarray(x[None], dtype=spec.dtype)
        if not dims_match(x.shape, (1, *spec.shape[1:])) or spec.batch != 1:
            raise QuantError(f"{path}: preprocessed image has shape {x.shape}, input '{spec.name}' expects "
                             f"{spec.describe()} (image {h}x{w} (HxW) before resize/crop)",
                             hint="check resize/resize_shorter/center_crop/layout in the preprocessing spec")
        return x

    def check_input(self, spec: InputSpec, where: Path) -> None:
        """Fail before any image is decoded when the spec's fixed output size cannot fit the input."""
        if len(spec.shape) != 4:
            raise QuantError(f"images feed 4-D inputs; '{spec.name}' is {spec.describe()}")
        h_ax, w_ax = (2, 3) if self.layout == "NCHW" else (1, 2)
        want = (spec.shape[h_ax], spec.shape[w_ax])
        fixed: tuple[int | None, int | None] | None
        if self.letterbox:
            fixed, key = self.size, "size"
        elif self.limit_side_len is not None:
            fixed, key = None, ""  # each image's own size (the model's must be dynamic: checked when read)
        elif self.resize_height is not None:
            fixed, key = (self.resize_height, None if self.grow_width else self.pad_width), "resize_height"
        else:
            fixed = self.center_crop or (self.resize if self.resize_shorter is None else None)
            key = "center_crop" if self.center_crop else "resize"
        if fixed is not None and not all(f is None or w is None or f == w for f, w in zip(fixed, want)):
            shown = "x".join("?" if d is None else str(d) for d in fixed)
            raise QuantError(
                f"{where}: the preprocessing gives {shown} (HxW, '{key}'), input "
                f"'{spec.name}' is {spec.describe()} ({self.layout}): {want[0]}x{want[1]} expected",
                hint="make the last resize/center_crop the model's input size (and check 'layout')")


_PRE_KEYS = {"resize", "resize_shorter", "center_crop", "antialias", "mean", "std", "scale", "layout",
             "channels", "channel_order", "letterbox", "size", "pad_value", "limit_side_len", "limit_type",
             "size_multiple", "resize_height", "pad_width", "grow_width"}
# Named presets (``--preprocess yolo``): YAML files shipped in the package, each citing its source.
PRESETS_DIR = "presets"


def preset_names() -> list[str]:
    """The presets shipped with edgeq, by name (``--preprocess NAME``; ``edgeq presets NAME`` prints one)."""
    from importlib.resources import files

    root = files(__package__).joinpath(PRESETS_DIR)
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def is_preset(spec: str | Path) -> bool:
    """``--preprocess yolo`` names a preset; anything with a directory or a .yaml/.yml suffix is a file."""
    text = str(spec)
    return "/" not in text and not text.endswith((".yaml", ".yml"))


def preset_text(name: str) -> str:
    """A preset's YAML, comments and all: what ``edgeq presets NAME`` prints for a user to copy and edit."""
    from importlib.resources import files

    from edgeq.errors import ConfigError

    if name not in preset_names():
        raise ConfigError(f"--preprocess {name}: no such preset",
                          hint=f"presets: {', '.join(preset_names())}; or give a YAML file (path.yaml)")
    return files(__package__).joinpath(PRESETS_DIR).joinpath(f"{name}.yaml").read_text(encoding="utf-8")


def preprocess_bytes(spec: str | Path) -> bytes:
    """The bytes the spec is read from (a preset's shipped file or the user's): what a cache key hashes."""
    return preset_text(str(spec)).encode() if is_preset(spec) else Path(spec).read_bytes()


def load_preprocess(path: str | Path) -> Preprocess:
    """Read and validate a YAML preprocessing spec; unknown keys are errors, not silently ignored."""
    import yaml

    from edgeq.errors import ConfigError

    name = str(path)
    path = Path(f"preset {path}") if is_preset(path) else Path(path)
    try:
        text = preset_text(name) if is_preset(name) else path.read_text(encoding="utf-8")
        raw = yaml.safe_load(text) or {}
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read preprocessing spec ({e})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({first_line(e)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: preprocessing spec must be a mapping")
    unknown = sorted(set(raw) - _PRE_KEYS)
    if unknown:
        from edgeq.config import unknown_key

        raise unknown_key(path, unknown[0], _PRE_KEYS)

    def floats(key: str, default: tuple[float, ...]) -> tuple[float, ...]:
        v = raw.get(key, default)
        v = [v] if isinstance(v, (int, float, str)) else v
        try:
            out = tuple(_number(x) for x in v)
        except (TypeError, ValueError):
            raise ConfigError(f"{path}: '{key}' must be a number or a list of numbers, got {v!r}") from None
        if key == "std" and any(s == 0 for s in out):
            raise ConfigError(f"{path}: 'std' must not contain 0")
        return out

    def size(key: str, square_ok: bool) -> tuple[int, int] | None:
        v = raw.get(key)
        if v is None:
            return None
        if square_ok and _positive_int(v):
            return (v, v)
        if not (isinstance(v, (list, tuple)) and len(v) == 2 and all(_positive_int(r) for r in v)):
            what = "[height, width] or one size" if square_ok else "[height, width]"
            hint = None if square_ok else \
                "for torchvision's Resize(N) (shorter side to N, aspect kept) write resize_shorter: N"
            raise ConfigError(f"{path}: '{key}' must be {what}, got {v!r}", hint=hint)
        return (int(v[0]), int(v[1]))

    # `resize: 256` is refused: torchvision users read it as Resize(256) (shorter side), OpenCV users
    # as a square; either guess would silently calibrate on the wrong pixels.
    resize = size("resize", square_ok=False)
    crop = size("center_crop", square_ok=True)
    shorter = raw.get("resize_shorter")
    if shorter is not None and not _positive_int(shorter):
        raise ConfigError(f"{path}: 'resize_shorter' must be a positive integer, got {shorter!r}")
    if shorter is not None and resize is not None:
        raise ConfigError(f"{path}: give 'resize' or 'resize_shorter', not both")
    antialias = raw.get("antialias", True)
    if not isinstance(antialias, bool):
        raise ConfigError(f"{path}: 'antialias' must be true or false, got {antialias!r}")
    layout = str(raw.get("layout", "NCHW")).upper()
    if layout not in ("NCHW", "NHWC"):
        raise ConfigError(f"{path}: 'layout' must be NCHW or NHWC, got {layout!r}")
    channels = str(raw.get("channels", raw.get("channel_order", "RGB"))).upper()
    if channels not in ("RGB", "BGR"):
        raise ConfigError(f"{path}: 'channels' must be RGB or BGR, got {channels!r}")
    try:
        scale = _number(raw.get("scale", 1.0 / 255.0))
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: 'scale' must be a number such as 1/255, got {raw.get('scale')!r}") \
            from None
    flags = {}
    for key in ("letterbox", "grow_width"):
        if key in raw and not isinstance(raw[key], bool):
            raise ConfigError(f"{path}: '{key}' must be true or false, got {raw[key]!r}")
        flags[key] = raw.get(key, key == "grow_width")
    counts = {}
    for key in ("limit_side_len", "size_multiple", "resize_height", "pad_width"):
        v = raw.get(key)
        if v is not None and not _positive_int(v):
            raise ConfigError(f"{path}: '{key}' must be a positive integer, got {v!r}")
        counts[key] = v
    limit_type = str(raw.get("limit_type", "max"))
    if limit_type not in ("max", "min"):
        raise ConfigError(f"{path}: 'limit_type' must be max or min, got {limit_type!r}")
    resizes = [k for k in ("resize", "resize_shorter", "letterbox", "limit_side_len", "resize_height")
               if raw.get(k) not in (None, False)]
    if len(resizes) > 1:
        raise ConfigError(f"{path}: give one way to resize, not {' and '.join(resizes)}")
    if counts["pad_width"] is not None and counts["resize_height"] is None:
        raise ConfigError(f"{path}: 'pad_width' pads a text line: it needs 'resize_height'")
    try:
        pad_value = _number(raw.get("pad_value", 114))
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: 'pad_value' must be a number, got {raw.get('pad_value')!r}") from None
    return Preprocess(resize, floats("mean", (0.0,)), floats("std", (1.0,)), scale, layout, channels,
                      resize_shorter=shorter, center_crop=crop, antialias=antialias,
                      letterbox=flags["letterbox"], size=size("size", square_ok=True), pad_value=pad_value,
                      limit_side_len=counts["limit_side_len"], limit_type=limit_type,
                      size_multiple=counts["size_multiple"], resize_height=counts["resize_height"],
                      pad_width=counts["pad_width"], grow_width=flags["grow_width"],
                      name=f"the {name} preset" if is_preset(name) else name)


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _number(v: Any) -> float:
    """A float, also from the strings '1/255' and '0.5' that people write in YAML."""
    if isinstance(v, bool):
        raise TypeError("bool")
    if isinstance(v, (int, float)):
        return float(v)
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*/\s*([0-9.eE+-]+)\s*", str(v))
    if m:
        return float(m.group(1)) / float(m.group(2))
    return float(str(v))


def shorter_side_size(h: int, w: int, n: int) -> tuple[int, int]:
    """(height, width) with the shorter side ``n``, exactly as torchvision's ``Resize(n)`` computes it."""
    if w <= h:
        return int(n * h / w), n
    return n, int(n * w / h)


def letterbox(x: np.ndarray, h: int, w: int, pad_value: float, *, antialias: bool = False) -> np.ndarray:
    """ultralytics' ``LetterBox`` (ultralytics/data/augment.py, ``auto=False, center=True``): scaled by
    ``r = min(h / ih, w / iw)`` to ``round(iw * r)`` x ``round(ih * r)``, then centred on an ``h`` x ``w``
    canvas of ``pad_value``, the borders split as it splits them (``round(d / 2 -+ 0.1)``)."""
    import numpy as np

    ih, iw = x.shape[:2]
    r = min(h / ih, w / iw)
    nh, nw = round(ih * r), round(iw * r)
    x = resize_image(x, nh, nw, antialias=antialias)
    dh, dw = (h - nh) / 2, (w - nw) / 2
    top, left = round(dh - 0.1), round(dw - 0.1)
    out = np.full((h, w, x.shape[2]), pad_value, np.float32)
    out[top:top + nh, left:left + nw] = x
    return out


def limited_size(h: int, w: int, limit: int, kind: str, multiple: int | None) -> tuple[int, int]:
    """PaddleOCR's ``DetResizeForTest`` (ppocr/data/imaging/operators.py, ``resize_image_type0``): the
    longer side (``max``) brought down to ``limit``, or the shorter (``min``) up to it, then each side
    rounded to a multiple of ``multiple`` (at least one multiple)."""
    longer, shorter = max(h, w), min(h, w)
    ratio = 1.0
    if kind == "max" and longer > limit:
        ratio = limit / longer
    elif kind == "min" and shorter < limit:
        ratio = limit / shorter
    rh, rw = int(h * ratio), int(w * ratio)
    if multiple:
        rh = max(int(round(rh / multiple) * multiple), multiple)
        rw = max(int(round(rw / multiple) * multiple), multiple)
    return rh, rw


def line_widths(h: int, w: int, height: int, pad_width: int | None, grow: bool) -> tuple[int, int]:
    """(the input's width, the line's width in it) for a text line scaled to ``height``: PaddleOCR's
    ``resize_norm_img`` (tools/infer/predict_rec.py and predict_cls.py): the input is ``pad_width`` wide,
    or ``int(height * w / h)`` when wider and ``grow`` (the recogniser: max_wh_ratio of a one-line batch);
    the line ``min(that, ceil(height * w / h))``, padded on the right."""
    import math

    ratio = w / h
    width = pad_width or math.ceil(height * ratio)
    if grow:
        width = max(width, int(height * ratio))
    return width, max(1, min(width, math.ceil(height * ratio)))


def center_crop(x: np.ndarray, h: int, w: int, *, path: Path | None = None) -> np.ndarray:
    """The middle ``h`` x ``w`` of an HWC image, offsets as torchvision's ``CenterCrop``.

    torchvision pads a too-small image with zeros; here that is an error, as zero borders would enter
    the activation statistics.
    """
    ih, iw = x.shape[:2]
    if h > ih or w > iw:
        raise QuantError(f"{path}: center_crop {h}x{w} (HxW) is larger than the resized image {ih}x{iw}",
                         hint="resize to at least the crop size (resize_shorter >= the crop)")
    top, left = round((ih - h) / 2.0), round((iw - w) / 2.0)  # Python rounds half to even, as torchvision
    return x[top:top + h, left:left + w]


def resize_image(x: np.ndarray, h: int, w: int, *, antialias: bool = True) -> np.ndarray:
    """Bilinear resize of an HWC float image to ``h`` x ``w``; see :class:`Preprocess` for ``antialias``.

    Separable: one resampling matrix per axis, applied with BLAS (``tensordot``), so a 12-megapixel
    photo costs two matrix products, not a Python loop over pixels.
    """
    import numpy as np

    ih, iw = x.shape[:2]
    if (ih, iw) == (h, w):
        return x
    x = np.tensordot(_resample_matrix(ih, h, antialias), x, axes=(1, 0))  # (h, iw, C)
    x = np.tensordot(_resample_matrix(iw, w, antialias), x, axes=(1, 1))  # (w, h, C)
    return np.ascontiguousarray(x.transpose(1, 0, 2))


def _resample_matrix(n_in: int, n_out: int, antialias: bool) -> np.ndarray:
    """(n_out, n_in) weights of a triangle filter, with PIL's window and normalisation
    (``libImaging/Resample.c`` ``precompute_coeffs``): output pixel i is centred at ``(i + 0.5) * scale``
    in input pixels; the window is clipped at the image border and the weights renormalised there."""
    import numpy as np

    scale = n_in / n_out
    width = max(scale, 1.0) if antialias else 1.0  # filter support in input pixels
    m = np.zeros((n_out, n_in), np.float64)
    for i in range(n_out):
        centre = (i + 0.5) * scale
        lo = max(int(centre - width + 0.5), 0)
        hi = min(int(centre + width + 0.5), n_in)
        j = np.arange(lo, hi, dtype=np.float64)
        wts = np.maximum(0.0, 1.0 - np.abs((j + 0.5 - centre) / width))
        total = wts.sum()
        if total > 0:
            m[i, lo:hi] = wts / total
        else:  # cannot happen for a triangle filter of width >= 1; keep the nearest pixel regardless
            m[i, min(int(centre), n_in - 1)] = 1.0
    return m.astype(np.float32)
