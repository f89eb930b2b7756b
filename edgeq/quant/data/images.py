"""Reading calibration images: the header opened when the set is built, pixels decoded upright when a
sample is read; preprocessing is :mod:`edgeq.quant.data.preprocess`'s."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeq.errors import QuantError

if TYPE_CHECKING:
    import numpy as np

    from edgeq.quant.data.inputs import InputSpec
    from edgeq.quant.data.preprocess import Preprocess

NATIVE_IMAGE_SUFFIXES = (".ppm", ".pgm", ".pnm")
# A fixed list rather than everything Pillow registers: indexing must not pick up .pdf/.eps/.h5 files
# lying in a data directory. Each is decoded by Pillow (a dependency).
PIL_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".dib", ".webp", ".tif", ".tiff",
                      ".gif")
IMAGE_SUFFIXES = NATIVE_IMAGE_SUFFIXES + PIL_IMAGE_SUFFIXES


class ImageFile:
    """One image, decoded and preprocessed when read."""

    count = 1

    def __init__(self, path: Path, pre: Preprocess, spec: InputSpec) -> None:
        self.path, self.pre, self.spec = path, pre, spec
        self._shape: tuple[int, ...] | None = None  # once read: its preprocessed shape
        if path.suffix.lower() in PIL_IMAGE_SUFFIXES:
            _check_image_header(path)

    def read(self, k: int, cache: dict[str, Any]) -> dict[str, np.ndarray]:
        img = _decode_image(self.path)
        x = self.pre.apply(img, self.spec, self.path)
        self._shape = tuple(x.shape)
        return {self.spec.name: x}

    def sample_shapes(self, k: int) -> dict[str, tuple[int, ...]]:
        """The preprocessed shape (a dynamic model's profile is made from it): decoded once, remembered."""
        if self._shape is None:
            self.read(k, {})
        assert self._shape is not None
        return {self.spec.name: self._shape}


def _pil_error(path: Path, e: BaseException) -> QuantError:
    msg = (str(e).splitlines() or [type(e).__name__])[0].replace(f"'{path}'", "").strip()
    return QuantError(f"{path}: not a readable image ({msg or type(e).__name__})",
                      hint="re-export the file or remove it from the calibration directory")


def _check_image_header(path: Path) -> None:
    """Open the header only (no pixel decoding), so a non-image fails when the set is built."""
    import PIL.Image

    try:
        with PIL.Image.open(path):
            pass
    except Exception as e:  # Pillow raises many types for a bad file (OSError, SyntaxError, ValueError...)
        raise _pil_error(path, e) from None


def _decode_image(path: Path) -> np.ndarray:
    """Upright HWC RGB (or HW gray) array of 0..255 values: what the file shows in an image viewer."""
    if path.suffix.lower() in NATIVE_IMAGE_SUFFIXES:
        return _read_pnm(path)
    import PIL.Image

    try:
        with PIL.Image.open(path) as im:
            im.load()  # decode here: a truncated file raises now, inside this try
            return _array_from_pil(im)
    except QuantError:
        raise
    except Exception as e:  # Pillow raises many types for a bad file
        raise _pil_error(path, e) from None


def _array_from_pil(im: Any) -> np.ndarray:
    """EXIF orientation applied, then RGB or gray; 16-bit gray scaled to 0..255 as ``_read_pnm`` does."""
    import numpy as np
    import PIL.ImageOps

    im = PIL.ImageOps.exif_transpose(im)  # phone photos: stored sideways, Orientation tag 6/8
    mode = im.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):  # 16-bit PNG/TIFF gray
        return np.asarray(im).astype(np.float32) * np.float32(255.0 / 65535.0)
    if mode == "F":
        return np.asarray(im, dtype=np.float32)
    if mode in ("1", "L", "LA", "La"):
        return np.asarray(im.convert("L"))
    return np.asarray(im.convert("RGB"))  # palette looked up; alpha dropped as torchvision's loader does


def _read_pnm(path: Path) -> np.ndarray:
    """Binary PGM (P5) / PPM (P6), 8 or 16 bit: enough for calibration sets without Pillow."""
    import numpy as np

    data = path.read_bytes()
    tokens: list[bytes] = []
    pos = 0
    while len(tokens) < 4:
        m = re.compile(rb"\s*(#[^\n]*\n\s*)*(\S+)").match(data, pos)
        if not m:
            raise QuantError(f"{path}: truncated PNM header")
        tokens.append(m.group(2))
        pos = m.end()
    magic = tokens[0]
    if magic not in (b"P5", b"P6"):
        raise QuantError(f"{path}: only binary PGM/PPM (P5/P6) are read natively, found {magic!r}")
    try:
        w, h, maxval = (int(t) for t in tokens[1:])
    except ValueError:
        raise QuantError(f"{path}: malformed PNM header") from None
    pos += 1  # one whitespace byte after maxval
    c = 3 if magic == b"P6" else 1
    dt = np.dtype(">u2") if maxval > 255 else np.dtype("u1")
    n = w * h * c
    if len(data) - pos < n * dt.itemsize:
        raise QuantError(f"{path}: truncated image data ({w}x{h}x{c} expected)")
    img = np.frombuffer(data, dt, n, pos).reshape(h, w, c) if c == 3 else \
        np.frombuffer(data, dt, n, pos).reshape(h, w)
    if maxval != 255:
        img = (img.astype(np.float32) * (255.0 / maxval))
    return img
