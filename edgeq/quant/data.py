"""Calibration data: what the model is run on to collect activation statistics.

A :class:`CalibrationSet` is an index of samples, not the samples: iterating it reads one sample at a
time from disk, so a 10,000-image calibration set costs the memory of one image (a stacked ``.npz``
is the exception: it is loaded whole, one file at a time, as zip members cannot be read by rows).
Everything that can be checked without reading the data (names, shapes, dtypes) is checked when the
set is built, so a bad file fails before the model has run; NaN/Inf can only be seen when a sample
is read and fail then, naming the file (``CalibrationSet.check_values`` reads everything up front).

Sources (``calibration_set``):

- a directory of ``.npy``/``.npz`` files. Each array is either one sample (the model's input shape,
  with or without the batch dimension) or a stack of samples along dim 0. ``.npz`` files are keyed
  by input name (required for models with several inputs; a single-input model also accepts
  ``np.savez``'s default key ``arr_0``).
- a directory of images (JPEG, PNG, BMP, WebP, TIFF, GIF through Pillow; binary ``.ppm``/``.pgm``
  read natively) with a YAML preprocessing spec (see :class:`Preprocess` and
  ``pipelines/preprocess-imagenet.yaml``). Headers are opened when the set is built, so a file that
  is not an image fails up front; a truncated or corrupt one fails when read, naming the file.
- ``synthetic=N``: seeded random samples for demos; statistics from them are not meaningful for
  accuracy.

dtype policy: float64 data for a float32 input is cast to float32 (numpy's default dtype is float64,
and float32 holds calibration data to far better than int8 resolution); the cast is recorded in
``CalibrationSet.notes``. Any other mismatch (integers for a float input, float for an integer input,
float16 <-> float32) is refused: it usually means missing preprocessing, and guessing would calibrate
on the wrong value range.
"""

from __future__ import annotations

import math
import re
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from edgeq.errors import QuantError, first_line
from edgeq.findings import ProgressFn, no_progress

if TYPE_CHECKING:
    import numpy as np
    import onnx

ARRAY_SUFFIXES = (".npy", ".npz")
NATIVE_IMAGE_SUFFIXES = (".ppm", ".pgm", ".pnm")
# A fixed list rather than everything Pillow registers: indexing must not pick up .pdf/.eps/.h5 files
# lying in a data directory. Each is decoded by Pillow (a dependency).
PIL_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".dib", ".webp", ".tif", ".tiff",
                      ".gif")
IMAGE_SUFFIXES = NATIVE_IMAGE_SUFFIXES + PIL_IMAGE_SUFFIXES

Feed = dict  # {input name: np.ndarray with the model's batch dimension}


# ---------------------------------------------------------------------------------------------------
# Model inputs
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputSpec:
    """One model input as calibration sees it: ``None`` in ``shape`` is a dynamic dimension."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str  # numpy dtype name, e.g. "float32"

    @property
    def batch(self) -> int:
        """Rows per sample along dim 0: the fixed batch size, or 1 if the batch is dynamic."""
        if not self.shape or self.shape[0] is None:
            return 1
        return self.shape[0]

    def describe(self, shape: Sequence[int | None] | None = None) -> str:
        dims = self.shape if shape is None else shape
        return "(" + ", ".join("?" if d is None else str(d) for d in dims) + ")"


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The model's real inputs (graph inputs that are not initializers), in graph order."""
    import onnx

    inits = {i.name for i in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name
        except (KeyError, TypeError, ValueError):
            raise QuantError(f"model input '{vi.name}' has a non-tensor or unknown element type") from None
        dims: list[int | None] = []
        if tt.HasField("shape"):
            for d in tt.shape.dim:
                dims.append(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None)
        specs.append(InputSpec(vi.name, tuple(dims), dtype))
    if not specs:
        raise QuantError("the model has no inputs to feed calibration data to")
    return specs


# ---------------------------------------------------------------------------------------------------
# Sources: each knows how many samples it holds and how to read sample k
# ---------------------------------------------------------------------------------------------------


def _accepts_dtype(found: str, expected: str) -> bool:
    return found == expected or (found == "float64" and expected == "float32")


def _rows_for(spec: InputSpec, shape: tuple[int, ...], dtype: str, where: str) -> tuple[int, bool]:
    """(samples in an array of ``shape``, whether it lacks the batch dim); raises on a mismatch."""
    if not _accepts_dtype(dtype, spec.dtype):
        raise QuantError(
            f"{where}: input '{spec.name}' expects dtype {spec.dtype}, found {dtype}",
            hint="convert the data (or use an image directory with a preprocessing spec)",
        )
    rank = len(spec.shape)
    expect = f"{spec.describe()} or {spec.describe(spec.shape[1:])} or a stack (N, ...)"
    if len(shape) == rank - 1 and rank >= 1:
        if spec.batch != 1 or not _dims_match(shape, spec.shape[1:]):
            raise QuantError(f"{where}: input '{spec.name}' expects shape {expect}, found {tuple(shape)}")
        return 1, True
    if len(shape) == rank and rank >= 1 and _dims_match(shape[1:], spec.shape[1:]):
        n = shape[0]
        if n == 0 or n % spec.batch:
            raise QuantError(
                f"{where}: input '{spec.name}' has {n} rows along dim 0, not a (non-zero) multiple of "
                f"the model's batch size {spec.batch}"
            )
        return n // spec.batch, False
    raise QuantError(f"{where}: input '{spec.name}' expects shape {expect}, found {tuple(shape)}")


def _dims_match(found: Sequence[int], expected: Sequence[int | None]) -> bool:
    return len(found) == len(expected) and all(e is None or f == e for f, e in zip(found, expected))


class _ArrayFile:
    """One ``.npy`` or ``.npz`` file: header checked up front, rows read lazily."""

    def __init__(self, path: Path, specs: list[InputSpec]) -> None:
        self.path = path
        self.specs = specs
        self.npz = path.suffix.lower() == ".npz"  # as calibration_set matched it: 'X.NPZ' too
        headers = _npz_headers(path) if self.npz else {"": _npy_header(path)}
        self.keys = self._match_keys(headers)  # input name -> key in the file
        counts: dict[str, int] = {}
        self.unbatched: dict[str, bool] = {}
        for spec in specs:
            shape, dtype = headers[self.keys[spec.name]]
            counts[spec.name], self.unbatched[spec.name] = _rows_for(spec, shape, dtype, str(path))
        self.float64 = any(headers[k][1] == "float64" for k in self.keys.values())  # cast when read
        if len(set(counts.values())) > 1:
            raise QuantError(f"{path}: inputs hold different numbers of samples: {counts}")
        self.count = next(iter(counts.values()))

    def _match_keys(self, headers: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, str]:
        names = [s.name for s in self.specs]
        if "" in headers:  # a .npy file holds exactly one array
            if len(names) > 1:
                raise QuantError(
                    f"{self.path}: the model has {len(names)} inputs {names}; a .npy file holds one array",
                    hint="save each sample as .npz keyed by input name (np.savez(f, **{name: array}))",
                )
            return {names[0]: ""}
        keys = set(headers)
        if len(names) == 1 and keys == {"arr_0"}:
            return {names[0]: "arr_0"}
        missing = [n for n in names if n not in keys]
        unknown = sorted(keys - set(names))
        if missing or unknown:
            what = []
            if missing:
                what.append(f"missing input {', '.join(repr(m) for m in missing)}")
            if unknown:
                what.append(f"unknown key {', '.join(repr(u) for u in unknown)}")
            raise QuantError(f"{self.path}: {'; '.join(what)} (model inputs: {names})",
                             hint="key .npz arrays by the model's input names")
        return {n: n for n in names}

    def read(self, k: int, cache: dict[str, Any]) -> dict[str, np.ndarray]:
        import numpy as np

        if not self.npz:
            spec = self.specs[0]
            if self.unbatched[spec.name]:
                x = _read_npy_rows(self.path, 0, None)[None]
            else:
                x = _read_npy_rows(self.path, k * spec.batch, spec.batch)
            return {spec.name: np.ascontiguousarray(x, dtype=spec.dtype)}
        arrays = cache.get(str(self.path))
        if arrays is None:
            cache.clear()  # one .npz in memory at a time: memory stays one file, not the dataset
            arrays = cache[str(self.path)] = self._open_npz()
        feed = {}
        for spec in self.specs:
            a = arrays[self.keys[spec.name]]
            if self.unbatched[spec.name]:
                x = np.asarray(a)[None]
            else:
                b = spec.batch
                x = a[k * b:(k + 1) * b]
            feed[spec.name] = np.ascontiguousarray(x, dtype=spec.dtype)
        return feed

    def _open_npz(self) -> dict[str, Any]:
        import numpy as np

        try:
            with np.load(self.path, allow_pickle=False) as z:
                return {key: z[key] for key in set(self.keys.values())}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            raise QuantError(f"{self.path}: cannot read ({e})") from None


def _read_npy_rows(path: Path, start: int, rows: int | None) -> np.ndarray:
    """Rows ``[start, start + rows)`` along dim 0 of a .npy; ``rows=None``: the whole array.

    Plain reads rather than a memory map: mapped pages of a big stacked file stay resident after use
    and the peak memory would grow with the dataset after all.
    """
    import numpy as np

    try:
        with open(path, "rb") as f:
            shape, fortran, dtype = _npy_layout(f, np)
            offset = f.tell()
            whole = rows is None
            if rows is None:  # the whole array counts as one row
                start, n_rows, out_shape = 0, 1, shape
                per_row = int(np.prod(shape, dtype=np.int64))
            else:
                n_rows, out_shape = rows, (rows, *shape[1:])
                per_row = int(np.prod(shape[1:], dtype=np.int64))
            if fortran:  # rare; column-major rows are not contiguous, so map and copy the slice
                a = np.load(path, mmap_mode="r", allow_pickle=False)
                return np.array(a if whole else a[start:start + n_rows])
            count = per_row * n_rows
            f.seek(offset + start * per_row * dtype.itemsize)
            x = np.fromfile(f, dtype=dtype, count=count)
    except (OSError, ValueError, EOFError) as e:
        raise QuantError(f"{path}: cannot read ({e})") from None
    if x.size != count:
        raise QuantError(f"{path}: cannot read (file truncated: {x.size} of {count} values at row {start})")
    return x.reshape(out_shape)


def _npy_header(path: Path) -> tuple[tuple[int, ...], str]:
    import numpy as np

    try:
        with open(path, "rb") as f:
            return _read_npy_header(f, np)
    except (OSError, ValueError, EOFError) as e:
        raise QuantError(f"{path}: not a readable .npy file ({e})") from None


def _read_npy_header(f: Any, np: Any) -> tuple[tuple[int, ...], str]:
    shape, _, dtype = _npy_layout(f, np)
    return shape, dtype.name


def _npy_layout(f: Any, np: Any) -> tuple[tuple[int, ...], bool, Any]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version in ((2, 0), (3, 0)):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"unsupported .npy version {version}")
    if dtype.hasobject:
        raise ValueError("object arrays are not calibration data")
    return tuple(shape), bool(fortran), dtype


def _npz_headers(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    import numpy as np

    try:
        with zipfile.ZipFile(path) as z:
            out = {}
            for info in z.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with z.open(info) as f:
                    out[info.filename[:-4]] = _read_npy_header(f, np)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise QuantError(f"{path}: not a readable .npz file ({e})") from None
    if not out:
        raise QuantError(f"{path}: the .npz file holds no arrays")
    return out


class _ImageFile:
    """One image, decoded and preprocessed when read."""

    count = 1

    def __init__(self, path: Path, pre: Preprocess, spec: InputSpec) -> None:
        self.path, self.pre, self.spec = path, pre, spec
        if path.suffix.lower() in PIL_IMAGE_SUFFIXES:
            _check_image_header(path)

    def read(self, k: int, cache: dict[str, Any]) -> dict[str, np.ndarray]:
        img = _decode_image(self.path)
        return {self.spec.name: self.pre.apply(img, self.spec, self.path)}


class _Synthetic:
    """Seeded random samples; sample k is the same on every pass (the set is re-iterable)."""

    def __init__(self, specs: list[InputSpec], count: int, seed: int) -> None:
        self.specs, self.count, self.seed = specs, count, seed
        self._shapes: list[tuple[int, ...]] = []  # per spec: (batch, *fixed dims)
        for s in specs:
            dims = tuple(d for d in s.shape[1:] if d is not None)
            if len(dims) != len(s.shape[1:]):
                raise QuantError(
                    f"input '{s.name}' has dynamic dimensions {s.describe()}; synthetic data needs fixed "
                    "shapes",
                    hint="give real calibration data with --calib",
                )
            shape = (s.batch, *dims)
            from edgeq.graph.verify import oversized_input, shape_hint

            too_big = oversized_input(s.name, shape, s.dtype)
            if too_big:
                raise QuantError(too_big, hint=shape_hint(s.name))
            self._shapes.append(shape)
        self.path = Path("<synthetic>")

    def read(self, k: int, cache: dict[str, Any]) -> dict[str, np.ndarray]:
        import numpy as np

        rng = np.random.default_rng([self.seed, k])
        feed = {}
        for s, shape in zip(self.specs, self._shapes):
            if np.issubdtype(np.dtype(s.dtype), np.floating):
                feed[s.name] = rng.standard_normal(shape, dtype=np.float32).astype(s.dtype)
            elif s.dtype == "bool":
                feed[s.name] = rng.integers(0, 2, shape).astype(bool)
            else:
                feed[s.name] = rng.integers(0, 10, shape).astype(s.dtype)
        return feed


_Source = Union[_ArrayFile, _ImageFile, _Synthetic]


# ---------------------------------------------------------------------------------------------------
# The set
# ---------------------------------------------------------------------------------------------------


class CalibrationSet:
    """An ordered, re-iterable index of calibration samples; yields one feed dict per sample.

    Samples are read lazily (``.npy`` rows by plain reads, one ``.npz`` in memory at a time), checked
    for NaN/Inf when read, and cast to the input's dtype.
    """

    def __init__(self, specs: list[InputSpec], sources: list[_Source],
                 index: list[tuple[int, int]], notes: tuple[str, ...] = ()) -> None:
        self.specs = specs
        self._sources = sources
        self._index = index  # (source number, sample number within the source)
        self.notes = notes

    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        import numpy as np

        cache: dict[str, Any] = {}
        for src_no, k in self._index:
            src = self._sources[src_no]
            feed = src.read(k, cache)
            for name, x in feed.items():
                if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
                    bad = "NaN" if np.isnan(x).any() else "Inf"
                    where = f"{src.path}" + (f" (sample {k})" if src.count > 1 else "")
                    raise QuantError(f"{where}: input '{name}' contains {bad}",
                                     hint="remove or fix the sample")
            yield feed
        cache.clear()

    def check_values(self, progress: ProgressFn = no_progress) -> None:
        """Read every sample once and fail on NaN/Inf before any model runs.

        Iteration checks too, but only when it reaches the bad sample, possibly after outputs such as a
        calibration cache were written; this costs one read of the data and no inference.
        """
        total = len(self)
        progress("checking calibration data", 0, total)
        for done, _ in enumerate(self, start=1):
            if done % 16 == 0 or done == total:
                progress("checking calibration data", done, total)

    def split(self, holdout: float) -> tuple[CalibrationSet, CalibrationSet]:
        """(calibration part, held-out part): a seeded, reproducible choice of ``holdout`` of the samples.

        Held-out samples are never used for statistics, so the accuracy check is not measured on the
        data the scales were fitted to. At least one sample stays on each side when there are two.
        """
        import numpy as np

        if not 0.0 <= holdout < 1.0:
            raise QuantError(f"holdout fraction must be in [0, 1), got {holdout}")
        n = len(self._index)
        k = min(n - 1, math.ceil(n * holdout)) if holdout > 0 and n >= 2 else 0
        chosen = set(np.random.default_rng(0).permutation(n)[:k].tolist())
        calib = [e for i, e in enumerate(self._index) if i not in chosen]
        held = [e for i, e in enumerate(self._index) if i in chosen]
        return (CalibrationSet(self.specs, self._sources, calib, self.notes),
                CalibrationSet(self.specs, self._sources, held, self.notes))

    def __repr__(self) -> str:
        return f"CalibrationSet({len(self)} samples, inputs={[s.name for s in self.specs]})"


def calibration_set(
    model: onnx.ModelProto,
    source: str | Path | None,
    *,
    synthetic: int | None = None,
    preprocess: str | Path | None = None,
    seed: int = 0,
    limit: int | None = None,
) -> CalibrationSet:
    """Index calibration data for ``model`` and check it against the model's inputs.

    Raises ``QuantError`` (one line naming the file, expected vs found) on anything unusable.
    """
    specs = input_specs(model)
    if limit is not None and limit < 1:
        raise QuantError(f"--limit must be at least 1, got {limit}")
    if synthetic is not None:
        if source is not None:
            raise QuantError("give either a calibration directory or --synthetic, not both")
        if synthetic < 1:
            raise QuantError(f"--synthetic must be at least 1, got {synthetic}")
        src = _Synthetic(specs, synthetic if limit is None else min(synthetic, limit), seed)
        return CalibrationSet(specs, [src], [(0, k) for k in range(src.count)],
                              ("synthetic random data: scales are for demos, not for accuracy",))
    if source is None:
        raise QuantError("no calibration data", hint="pass --calib DIR (or --synthetic N for a demo)")
    root = Path(source)
    if not root.exists():
        raise QuantError(f"{root}: calibration data not found")
    files = [root] if root.is_file() else sorted(
        p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))  # ._x.jpg, .DS_Store
    arrays = [p for p in files if p.suffix.lower() in ARRAY_SUFFIXES]
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    notes: list[str] = []
    if arrays and images:
        raise QuantError(f"{root}: mixes arrays (.npy/.npz) and images; use one kind per directory")
    sources: list[_Source] = []
    if arrays:
        if preprocess is not None:
            notes.append("the preprocessing spec applies to images only; ignored for .npy/.npz data")
        sources = [_ArrayFile(p, specs) for p in arrays]
    elif images:
        if len(specs) != 1:
            raise QuantError(f"images can feed a single-input model; this one has {len(specs)} inputs",
                             hint="save samples as .npz keyed by input name")
        if preprocess is None:
            raise QuantError(f"{root}: images need a preprocessing spec",
                             hint="pass --preprocess spec.yaml (resize, mean, std, scale, layout, channels)")
        pre = load_preprocess(preprocess)
        pre.check_input(specs[0], Path(preprocess))
        sources = [_ImageFile(p, pre, specs[0]) for p in images]
    else:
        skipped = f" ({len(files)} files of other kinds)" if files else ""
        raise QuantError(f"{root}: no calibration data (.npy, .npz or images){skipped}")
    if any(isinstance(s, _ArrayFile) and s.float64 for s in sources):
        notes.append("float64 calibration data cast to float32")
    index = [(i, k) for i, s in enumerate(sources) for k in range(s.count)]
    if limit is not None:
        index = index[:limit]
    return CalibrationSet(specs, sources, index, tuple(notes))


# ---------------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------------


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
        if not _dims_match(x.shape, (1, *spec.shape[1:])) or spec.batch != 1:
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
        if fixed is not None and not _dims_match(fixed, want):
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
