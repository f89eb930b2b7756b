"""Reading ``.npy``/``.npz`` calibration files: headers checked up front, rows read lazily, so a big
stacked file costs the memory of one sample."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeq.errors import QuantError
from edgeq.quant.data.inputs import InputSpec, dims_match

if TYPE_CHECKING:
    import numpy as np

ARRAY_SUFFIXES = (".npy", ".npz")


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
        if spec.batch != 1 or not dims_match(shape, spec.shape[1:]):
            raise QuantError(f"{where}: input '{spec.name}' expects shape {expect}, found {tuple(shape)}")
        return 1, True
    if len(shape) == rank and rank >= 1 and dims_match(shape[1:], spec.shape[1:]):
        n = shape[0]
        if n == 0 or n % spec.batch:
            raise QuantError(
                f"{where}: input '{spec.name}' has {n} rows along dim 0, not a (non-zero) multiple of "
                f"the model's batch size {spec.batch}"
            )
        return n // spec.batch, False
    raise QuantError(f"{where}: input '{spec.name}' expects shape {expect}, found {tuple(shape)}")


class ArrayFile:
    """One ``.npy`` or ``.npz`` file: header checked up front, rows read lazily."""

    def __init__(self, path: Path, specs: list[InputSpec]) -> None:
        self.path = path
        self.specs = specs
        self.npz = path.suffix.lower() == ".npz"  # as calibration_set matched it: 'X.NPZ' too
        headers = _npz_headers(path) if self.npz else {"": _npy_header(path)}
        self.keys = self._match_keys(headers)  # input name -> key in the file
        counts: dict[str, int] = {}
        self.unbatched: dict[str, bool] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}  # each input's whole array, from its header
        for spec in specs:
            shape, dtype = headers[self.keys[spec.name]]
            counts[spec.name], self.unbatched[spec.name] = _rows_for(spec, shape, dtype, str(path))
            self.shapes[spec.name] = tuple(shape)
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

    def sample_shapes(self, k: int) -> dict[str, tuple[int, ...]]:
        """Each input's shape in sample ``k``, as ``read`` would return it, from the headers alone."""
        out = {}
        for spec in self.specs:
            whole = self.shapes[spec.name]
            out[spec.name] = (1, *whole) if self.unbatched[spec.name] else (spec.batch, *whole[1:])
        return out

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
