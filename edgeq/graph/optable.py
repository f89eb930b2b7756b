"""The TensorRT 8.6 ONNX parser's operator table, as data.

``data/trt86-onnx-operators.csv`` is the operator support matrix of onnx-tensorrt's ``release/8.6-GA``
branch (``docs/operators.md``: "Operator Support Matrix", columns Operator / Supported / Supported
Types), one row per operator the 8.6 parser imports. An operator missing from the file has no importer
in 8.6: the parser then looks for a plugin of that name and fails if there is none.

Kept as a file, not code, so updating it for another TensorRT release is a data change.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import cache

SOURCE = (
    "onnx-tensorrt release/8.6-GA docs/operators.md (Operator Support Matrix), "
    "edgeq/graph/data/trt86-onnx-operators.csv"
)

# "TensorRT 8.6 supports operators up to Opset 17" (onnx-tensorrt 8.6 docs/operators.md). The parser is
# built against onnx 1.13, whose newest IR version is 8.
MAX_OPSET = 17
MAX_IR_VERSION = 8

# ONNX element types TensorRT 8.6 can hold at all (docs/operators.md: "TensorRT supports the following
# ONNX data types: DOUBLE, FLOAT32, FLOAT16, INT8, and BOOL", with limited INT32/INT64/DOUBLE support:
# INT64 is cast down to INT32 and DOUBLE to FLOAT). UINT8 appears only for Cast.
TRT_TYPE_OF_ONNX = {
    "float32": "FP32",
    "float64": "FP32",  # cast down by the parser
    "float16": "FP16",
    "int8": "INT8",
    "int32": "INT32",
    "int64": "INT32",  # cast down by the parser (see the int64-weights rule)
    "bool": "BOOL",
    "uint8": "UINT8",
}

_CSV = "trt86-onnx-operators.csv"


@dataclass(frozen=True)
class OpSupport:
    """One row of the table: the operator and the TensorRT types its importer accepts."""

    op: str
    supported: bool
    types: frozenset[str]


@cache
def load_optable() -> dict[str, OpSupport]:
    """Operator name -> support row, read once from the package data."""
    from importlib.resources import files

    # One child per step: Traversable.joinpath takes several only from Python 3.11 (3.9's zipfile.Path
    # and MultiplexedPath take one), and host code runs on 3.9.
    text = (files("edgeq.graph") / "data" / _CSV).read_text(encoding="utf-8")
    table: dict[str, OpSupport] = {}
    for row in csv.DictReader(io.StringIO(text)):
        op = (row.get("operator") or "").strip()
        if not op:
            continue
        types = frozenset(t.strip().upper() for t in (row.get("types") or "").split(",") if t.strip())
        table[op] = OpSupport(
            op=op, supported=(row.get("supported") or "").strip().upper() == "Y", types=types
        )
    return table


def op_support(op_type: str) -> OpSupport | None:
    """The row for a standard-domain operator, or None when 8.6 has no importer for it."""
    row = load_optable().get(op_type)
    return row if row is not None and row.supported else None


def is_supported(op_type: str) -> bool:
    return op_support(op_type) is not None
