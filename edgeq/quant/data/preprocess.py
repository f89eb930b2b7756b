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
        if self.resize is not None:
            x = resize_image(x, *self.resize, antialias=self.antialias)
        elif self.resize_shorter is not None:
            x = resize_image(x, *shorter_side_size(h, w, self.resize_shorter), antialias=self.antialias)
        elif self.center_crop is None:
            size = (spec.shape[h_ax], spec.shape[w_ax])
            if size[0] is None or size[1] is None:
                raise QuantError(f"input '{spec.name}' has dynamic spatial size; the spec needs 'resize'")
            x = resize_image(x, int(size[0]), int(size[1]), antialias=self.antialias)
        if self.center_crop is not None:
            x = center_crop(x, *self.center_crop, path=path)
        mean, std = np.asarray(self.mean, np.float32), np.asarray(self.std, np.float32)
        x = (x * np.float32(self.scale) - mean) / std
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
        fixed = self.center_crop or (self.resize if self.resize_shorter is None else None)
        h_ax, w_ax = (2, 3) if self.layout == "NCHW" else (1, 2)
        want = (spec.shape[h_ax], spec.shape[w_ax])
        if fixed is not None and not dims_match(fixed, want):
            key = "center_crop" if self.center_crop else "resize"
            raise QuantError(
                f"{where}: the preprocessing gives {fixed[0]}x{fixed[1]} (HxW, '{key}'), input "
                f"'{spec.name}' is {spec.describe()} ({self.layout}): {want[0]}x{want[1]} expected",
                hint="make the last resize/center_crop the model's input size (and check 'layout')")


_PRE_KEYS = {"resize", "resize_shorter", "center_crop", "antialias", "mean", "std", "scale", "layout",
             "channels", "channel_order"}


def load_preprocess(path: str | Path) -> Preprocess:
    """Read and validate a YAML preprocessing spec; unknown keys are errors, not silently ignored."""
    import yaml

    from edgeq.errors import ConfigError

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
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
    return Preprocess(resize, floats("mean", (0.0,)), floats("std", (1.0,)), scale, layout, channels,
                      resize_shorter=shorter, center_crop=crop, antialias=antialias)


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
