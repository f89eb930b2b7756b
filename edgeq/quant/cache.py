"""TensorRT calibration cache: the implicit-INT8 path's input, written from the same statistics.

The format is what ``IInt8EntropyCalibrator2::writeCalibrationCache`` produces and what
``trtexec --calib=FILE`` / ``readCalibrationCache`` read back::

    TRT-8600-EntropyCalibration2
    input: 3c010204
    /conv1/Conv_output_0: 3d1a0b3c

The first line is ``TRT-<version>-<algorithm>`` (TensorRT ignores a cache whose header does not match
its version and calibrator, and recalibrates). Each following line is ``<tensor name>: <scale>``, the
scale (``amax / 127``) as the 8 hex digits of its IEEE-754 float32 bits, most significant first
(``struct.pack('>f', scale).hex()``). Tensor names may contain ':' and spaces, so a line splits at its
last ': '.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from pathlib import Path

from edgeq.errors import QuantError

DEFAULT_HEADER = "TRT-8600-EntropyCalibration2"
_HEADER_RE = re.compile(r"TRT-\d+-[A-Za-z0-9]+")
_HEX_RE = re.compile(r"[0-9a-fA-F]{8}")


def scale_to_hex(scale: float) -> str:
    return struct.pack(">f", scale).hex()


def hex_to_scale(text: str) -> float:
    return struct.unpack(">f", bytes.fromhex(text))[0]


def format_calibration_cache(scales: Mapping[str, float], header: str = DEFAULT_HEADER) -> str:
    """Cache text for ready-made float32 scales (names in the given order)."""
    if not _HEADER_RE.fullmatch(header):
        raise QuantError(f"calibration cache header '{header}' is not TRT-<version>-<algorithm>")
    lines = [header]
    for name, scale in scales.items():
        if not name or "\n" in name or "\r" in name:
            raise QuantError(f"tensor name {name!r} cannot be written to a calibration cache")
        if not scale > 0 or scale == float("inf"):
            raise QuantError(f"tensor '{name}': scale {scale} is not a positive finite number")
        lines.append(f"{name}: {scale_to_hex(scale)}")
    return "\n".join(lines) + "\n"


def write_calibration_cache(
    path: str | Path, amax: Mapping[str, float], *, header: str = DEFAULT_HEADER
) -> None:
    """Write ``amax`` as a TensorRT calibration cache (scale = ``activation_scale(amax)``), atomically."""
    from edgeq.fs import atomic_write_text
    from edgeq.quant.calibrate import activation_scale

    text = format_calibration_cache({n: activation_scale(a) for n, a in amax.items()}, header)
    atomic_write_text(path, text)


def parse_calibration_cache(text: str, *, name: str = "calibration cache") -> tuple[str, dict[str, float]]:
    """(header, {tensor: scale}); a malformed line raises ``QuantError`` naming the line."""
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise QuantError(f"{name}: empty calibration cache")
    header = lines[0].strip()
    if not _HEADER_RE.fullmatch(header):
        raise QuantError(f"{name}:1: header '{header[:60]}' is not TRT-<version>-<algorithm>",
                         hint="a TensorRT calibration cache starts with e.g. TRT-8600-EntropyCalibration2")
    scales: dict[str, float] = {}
    for no, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        tensor, sep, value = line.rpartition(": ")
        value = value.strip()
        if not sep or not tensor or not _HEX_RE.fullmatch(value):
            raise QuantError(f"{name}:{no}: expected '<tensor>: <8 hex digits>', found '{line[:80]}'")
        if tensor in scales:
            raise QuantError(f"{name}:{no}: tensor '{tensor}' appears twice")
        scales[tensor] = hex_to_scale(value)
    return header, scales


def read_calibration_cache(path: str | Path) -> tuple[str, dict[str, float]]:
    """Read a TensorRT calibration cache: (header, {tensor name: float32 scale})."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QuantError(f"{path}: no such calibration cache") from None
    except (OSError, UnicodeDecodeError) as e:
        raise QuantError(f"{path}: cannot read calibration cache ({e})") from None
    return parse_calibration_cache(text, name=str(path))
