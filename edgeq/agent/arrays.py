"""Arrays on the target without numpy: the ``.npy``/``.npz`` files the host ships the held-out inputs in
and gets the engine's outputs back in, the TensorRT data types they map to, and trtexec's
``--exportOutput`` JSON.

Why stdlib: the agent runs on the target's Python with TensorRT alone (JetPack has no numpy for every
Python, and trtexec targets may have no TensorRT Python at all). An array is ``Array(descr, shape,
data)``: numpy's dtype string (``"<f4"``), the shape, and the raw C-order bytes, which is exactly what
an ``.npy`` file holds (format: numpy's ``numpy/lib/format.py``, versions 1.0-3.0) and what a TensorRT
binding holds for a linear-format tensor.

Held-out inputs are stacked: one array per input, samples along a new axis 0 (``(N, *input shape)``);
outputs come back the same way, one array per output.
"""

import array as _array
import ast
import re
import struct
import sys
import zipfile

_MAGIC = b"\x93NUMPY"
_NATIVE = "<" if sys.byteorder == "little" else ">"

# TensorRT 8.6 DataType member name -> (numpy descr on this machine, bytes per element). FP8 has no numpy
# type (8.6.1 Python API, ``tensorrt.DataType``: FLOAT, HALF, INT8, INT32, BOOL, UINT8, FP8).
TRT_TYPES = {
    "FLOAT": (_NATIVE + "f4", 4),
    "HALF": (_NATIVE + "f2", 2),
    "INT8": ("|i1", 1),
    "INT32": (_NATIVE + "i4", 4),
    "BOOL": ("|b1", 1),
    "UINT8": ("|u1", 1),
    "FP8": (None, 1),
}

# What TensorRT 8.6 makes of an ONNX input type it has no binding type for: INT64 and DOUBLE inputs
# become INT32 and FLOAT bindings (the 8.6 ONNX parser casts them down: "Your ONNX model has been
# generated with INT64 weights, while TensorRT does not natively support INT64").
_NARROWED = {"i8": ("i4", "q", "i"), "f8": ("f4", "d", "f")}


class ArrayError(ValueError):
    """A file that is not the array it should be; the message names the file and what is wrong."""


class Array:
    """One C-order array: numpy's ``descr``, the ``shape`` and the raw ``data`` bytes."""

    __slots__ = ("data", "descr", "shape")

    def __init__(self, descr, shape, data):
        self.descr = descr
        self.shape = tuple(int(d) for d in shape)
        self.data = data

    @property
    def itemsize(self):
        return int(self.descr[2:])

    @property
    def count(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def samples(self):
        """The per-sample byte strings of a stacked array (axis 0 is the sample)."""
        if not self.shape:
            raise ArrayError("a stacked array needs a sample axis, got a scalar")
        n = self.shape[0]
        per = len(self.data) // n if n else 0
        return [self.data[i * per:(i + 1) * per] for i in range(n)]

    def __repr__(self):
        return "Array(%s, %s)" % (self.descr, self.shape)


def _header(descr, shape):
    shape_text = "(%s)" % "".join("%d, " % d for d in shape) if len(shape) != 1 else "(%d,)" % shape[0]
    text = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    # version 1.0: 6 magic + 2 version + 2 length bytes, then the header padded so data starts 64-aligned
    pad = 64 - (10 + len(text) + 1) % 64
    head = (text + " " * pad + "\n").encode("latin1")
    return _MAGIC + b"\x01\x00" + struct.pack("<H", len(head)) + head


def npy_bytes(arr):
    """An ``.npy`` file's bytes for ``arr``."""
    if len(arr.data) != arr.count * arr.itemsize:
        raise ArrayError("%d bytes do not hold %s of %s" % (len(arr.data), arr.shape, arr.descr))
    return _header(arr.descr, arr.shape) + bytes(arr.data)


def parse_npy(data, what="array"):
    """An ``Array`` from an ``.npy`` file's bytes."""
    if data[:6] != _MAGIC:
        raise ArrayError("%s is not an .npy file" % what)
    major = data[6]
    if major == 1:
        size, start = struct.unpack("<H", data[8:10])[0], 10
    else:
        size, start = struct.unpack("<I", data[8:12])[0], 12
    try:
        header = ast.literal_eval(data[start:start + size].decode("latin1"))
        descr, fortran, shape = header["descr"], header["fortran_order"], tuple(header["shape"])
    except (ValueError, SyntaxError, KeyError, TypeError):
        raise ArrayError("%s has an unreadable .npy header" % what) from None
    if not isinstance(descr, str) or len(descr) < 3 or descr[0] not in "<>|=" or not descr[2:].isdigit():
        raise ArrayError("%s has dtype %r; only plain numeric arrays travel" % (what, descr))
    if fortran:
        raise ArrayError("%s is in Fortran order; save it C-contiguous" % what)
    arr = Array(descr, shape, data[start + size:])
    if len(arr.data) != arr.count * arr.itemsize:
        raise ArrayError("%s holds %d bytes for %s of %s" % (what, len(arr.data), shape, descr))
    if descr[0] in "<>" and descr[0] != _NATIVE and arr.itemsize > 1:
        arr = Array(_NATIVE + descr[1:], shape, _swapped(arr.data, descr[1:]))
    elif descr[0] == "=":
        arr = Array(_NATIVE + descr[1:], shape, arr.data)
    return arr


def _swapped(data, kind):
    codes = {"f2": "H", "f4": "f", "f8": "d", "i2": "h", "i4": "i", "i8": "q", "u2": "H", "u4": "I",
             "u8": "Q"}
    if kind not in codes:
        raise ArrayError("cannot byte-swap %s" % kind)
    a = _array.array(codes[kind])
    a.frombytes(data)
    a.byteswap()
    return a.tobytes()


def read_npz(path):
    """``{name: Array}`` from an ``.npz`` (a zip of ``<name>.npy`` members, as ``numpy.savez`` writes)."""
    out = {}
    try:
        with zipfile.ZipFile(path) as z:
            for member in z.namelist():
                if not member.endswith(".npy"):
                    continue
                name = member[: -len(".npy")]
                out[name] = parse_npy(z.read(member), "%s[%s]" % (path, name))
    except (zipfile.BadZipFile, OSError) as e:
        raise ArrayError("cannot read %s: %s" % (path, e)) from None
    return out


def write_npz(path, arrays):
    """Write ``{name: Array}`` as an ``.npz`` that ``numpy.load`` reads (stored, not compressed)."""
    tmp = "%s.tmp" % path
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for name, arr in arrays.items():
            z.writestr(name + ".npy", npy_bytes(arr))
    import os

    os.replace(tmp, path)
    return path


def for_binding(arr, trt_type, name):
    """``arr`` in the element type of a TensorRT binding: as it is, or narrowed the way TensorRT 8.6
    narrows ONNX INT64/DOUBLE inputs (INT64 values must fit in INT32). ``ArrayError`` otherwise."""
    want, _ = TRT_TYPES.get(trt_type, (None, 0))
    if want is None:
        raise ArrayError("input %r: TensorRT type %s cannot be fed from a file" % (name, trt_type))
    kind = arr.descr[1:]
    if kind == want[1:]:
        return arr
    narrowed = _NARROWED.get(kind)
    if narrowed is None or narrowed[0] != want[1:]:
        raise ArrayError("input %r is %s; the engine takes %s (%s)" % (name, arr.descr, trt_type, want))
    src = _array.array(narrowed[1])
    src.frombytes(arr.data)
    if kind == "i8" and any(v < -(1 << 31) or v >= (1 << 31) for v in src):
        raise ArrayError("input %r holds INT64 values outside INT32, which the engine takes" % name)
    return Array(want, arr.shape, _array.array(narrowed[2], src).tobytes())


def stack(descr, sample_shape, chunks):
    """One stacked ``Array`` from per-sample byte strings."""
    return Array(descr, (len(chunks), *tuple(sample_shape)), b"".join(chunks))


def floats(values, shape):
    """A float64 ``Array`` of ``shape`` from Python numbers."""
    return Array(_NATIVE + "f8", shape, _array.array("d", values).tobytes())


# trtexec 8.6 ``--exportOutput``: samples/common/sampleReporting.cpp ``exportJSONOutput`` writes, per
# output binding, ``{ "name" : "<name>"``, ``, "dimensions" : "<dims>"``, ``, "values" : [ v, v, ... ]``
# and ``}``, in a JSON list. The name is written unescaped; values go through ``operator<<`` (default
# precision: 6 significant digits; ``nan``/``inf`` as the C library spells them, which JSON has not;
# int8 as integers, bool as 0/1, half as float); dims through sampleOptions.h's ``operator<<(Dims)``:
# ``1x1000`` (common.h's ``(1, 1000)`` form is read too). So it is read by its layout, not as JSON.
_OUTPUT = re.compile(
    r'\{ "name" : "(?P<name>.*?)"\s*\n\s*, "dimensions" : "(?P<dims>[^"]*)"\s*\n'
    r'\s*, "values" : \[(?P<values>[^\]]*)\]',
    re.S,
)


def parse_export_output(text, what="--exportOutput"):
    """``[(name, shape, [float, ...])]`` from trtexec's ``--exportOutput`` file, in its order."""
    out = []
    for m in _OUTPUT.finditer(text):
        shape = tuple(int(d) for d in re.findall(r"-?\d+", m.group("dims")))
        raw = [v.strip() for v in m.group("values").split(",")]
        try:
            values = [float(v) for v in raw if v]
        except ValueError as e:
            message = "%s: output %r has a value that is not a number: %s" % (what, m.group("name"), e)
            raise ArrayError(message) from None
        count = 1
        for d in shape:
            count *= d
        if len(values) != count:
            raise ArrayError("%s: output %r has %d values for dimensions %s"
                             % (what, m.group("name"), len(values), m.group("dims")))
        out.append((m.group("name"), shape, values))
    if not out and text.strip() not in ("", "[\n]", "[]"):
        raise ArrayError("%s: no outputs in trtexec's output format" % what)
    return out
