"""Read TensorRT engine-inspector layer JSON and per-layer profiles, once, into frozen values.

Everything downstream (classification, the gate, rendering) works on these values and never looks
at raw JSON again, so a malformed file fails here with the missing key named, not later with a
``KeyError`` deep in a report.

Accepted layer files (one schema, several producers):

* ``trtexec --exportLayerInfo=FILE --profilingVerbosity=detailed``: trtexec writes exactly what
  ``IEngineInspector::getEngineInformation(LayerInformationFormat::kJSON)`` returns
  (TensorRT samples/common/sampleInference.cpp, ``printLayerInfo``), i.e.
  ``{"Layers": [{...}, ...], "Bindings": ["input", ...]}``. Our fixtures in
  ``tests/fixtures/trt86-h200/*.layers.json`` are this form.
* The Python API, ``engine.create_engine_inspector().get_engine_information(
  trt.LayerInformationFormat.JSON)``: the same JSON, but handed over as a ``str`` (pass it to
  :func:`load_layers` directly). Differences that matter, and how they are handled:
    - built with ``ProfilingVerbosity.LAYER_NAMES_ONLY`` (the builder's default) the ``"Layers"``
      entries are plain strings (TensorRT Python API docs, ``EngineInspector``; trex
      ``parser.py`` rejects that form for the same reason) -> a names-only ``EngineLayers`` with
      ``detailed=False``: it can be listed but not gated;
    - without ``inspector.execution_context`` set, "format information will not be shown" for
      shape-dependent tensors (C++ API docs, ``IEngineInspector::setExecutionContext``) -> a tensor
      without ``"Format/Datatype"`` gets ``format=None`` (precision unknown), which the gate treats
      as unproven;
    - TensorRT before 8.6 wrote no ``"Bindings"`` (trex ``parser.py``: "Older TRT didn't include
      bindings") -> network inputs/outputs are then inferred from the layer graph.
* Layer names and ``Metadata`` can hold raw control characters (8.6 joins the ONNX node names of a
  fused layer with U+001E in ``Metadata``; trex ``fix_unicode`` / NVIDIA/TensorRT#2779), so JSON is
  read with ``strict=False`` and the characters are kept as they are.

Accepted profile files:

* ``trtexec --exportProfile=FILE``: a JSON list whose first element is ``{"count": N}`` (timed
  iterations) followed by ``{"name", "timeMs", "averageMs", "medianMs", "percentage"}`` records.
* edgeq's own agent profile (what ``edgeq/agent`` ``profile`` emits)::

      {
        "format": "edgeq-profile",       # optional tag
        "version": 1,                    # optional
        "iterations": 200,               # optional: timed iterations
        "layers": [                      # required, in engine execution order
          {"name": "<engine layer name>", "averageMs": 0.0123,   # both required
           "medianMs": 0.012, "timeMs": 2.46, "percentage": 1.1}  # optional
        ],
        ...                              # anything else (latency percentiles etc.) is ignored here
      }

  ``name`` must be the engine layer name as ``IEngineInspector`` prints it (an ``IProfiler``
  ``report_layer_time`` callback receives exactly that name).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from edgeq.errors import ReportError

LAYERS_HINT = (
    "export it with 'trtexec --exportLayerInfo=FILE --profilingVerbosity=detailed' or "
    "IEngineInspector.get_engine_information(trt.LayerInformationFormat.JSON)"
)
PROFILE_HINT = "export it with 'trtexec --exportProfile=FILE' or the edgeq agent's 'profile' command"

Source = Union[str, bytes, os.PathLike, Mapping, Sequence]

# --------------------------------------------------------------------------------------------------
# Tensor formats ("Format/Datatype" strings)
# --------------------------------------------------------------------------------------------------

# What TensorRT 8.6.0's inspector printed as every format of an engine with dynamic inputs, its context
# without input shapes (trt86-h200-more/rec.rules.layers.json.gz, an H200) and with them set but not
# inferred (trt86-h100-int8-writes/rec.rules.layers.json.gz, an H100, the python backend; the agent has the
# context infer them since: trt86-h100-paired/dyn.*)
NO_SHAPES_FORMAT = "N/A due to dynamic shapes"

# Data type words as TensorRT 8.6 spells them inside format descriptions. Order matters: longer
# words first so "BFloat16" is not read as "FP16"-ish and "UInt8" not as "Int8".
# Source: the strings in tests/fixtures/trt86-h200/*.layers.json and the list of format strings
# that NVIDIA's trt-engine-explorer knows (tools/experimental/trt-engine-explorer/trex/activations.py).
_DTYPE_WORDS: tuple[tuple[str, str], ...] = (
    ("bfloat16", "BF16"),
    ("uint8", "UINT8"),
    ("int8", "INT8"),
    ("int32", "INT32"),
    ("int64", "INT64"),
    ("fp32", "FP32"),
    ("fp16", "FP16"),
    ("fp8", "FP8"),
    ("bool", "BOOL"),
    ("half", "FP16"),
    ("float", "FP32"),
)
_WIDTH_WORDS = {"two": 2, "four": 4, "eight": 8, "sixteen": 16, "thirty-two": 32}
_VECTORIZED = re.compile(r"^(?P<w>[a-z-]+) wide channel vectorized")
_CHANNEL_MOD = re.compile(r"channel\s*%\s*(?P<n>\d+)\s*==\s*0")
_CHANNEL_EQ = re.compile(r"channel\s*==\s*(?P<n>\d+)")

# The float data types an engine's layer JSON prints (``_DTYPE_WORDS``): what a Q reads and a DQ writes.
# Not ``edgeq.graph.trt86.common.FLOAT_PRECISIONS`` (what 8.6 runs a layer in, no BF16), on purpose.
FLOAT_DTYPES = ("FP32", "FP16", "BF16")

# Widths for "which float is widest" decisions (a layer touching FP32 and INT8 data runs FP32).
PRECISION_RANK = {
    "INT8": 1,
    "UINT8": 1,
    "FP8": 1,
    "FP16": 2,
    "BF16": 2,
    "INT32": 3,
    "FP32": 3,
    "INT64": 4,
    "BOOL": 0,
}


@dataclass(frozen=True)
class TensorFormat:
    """A parsed ``Format/Datatype`` string: what the data type is and how it is laid out in memory."""

    raw: str
    precision: Optional[str]  # "INT8", "FP16", "FP32", ... or None when the string names none
    layout: str  # "linear" (NCHW), "vectorized" (NC/xHWx), "channel-last" (NHWC[x]) or "unknown"
    vector: int = 1  # channel vector width (32 for NC/32HW32) or channel alignment (8 for HWC8)
    spatial_dims: int = 2

    @property
    def short(self) -> str:
        """TensorRT's own shorthand (kLINEAR = NCHW, kCHW32 = NC/32HW32, kHWC8 = NHWC8)."""
        p = self.precision or "?"
        d = "D" if self.spatial_dims == 3 else ""
        if self.layout == "linear":
            return f"{p} NC{d}HW"
        if self.layout == "vectorized":
            return f"{p} NC/{self.vector}{d}HW{self.vector}"
        if self.layout == "channel-last":
            return f"{p} N{d}HWC{self.vector if self.vector > 1 else ''}"
        return f"{p} {self.raw}"


def parse_format(raw: str) -> TensorFormat:
    """Turn e.g. "Thirty-two wide channel vectorized row major Int8 format" into INT8 NC/32HW32."""
    text = raw.strip().rstrip(".")
    low = text.lower()
    precision = None
    for word, name in _DTYPE_WORDS:
        if re.search(rf"(?<![a-z]){word}(?![a-z])", low):
            precision = name
            break
    spatial = 3 if "3 spatial dimensions" in low else 2
    m = _VECTORIZED.match(low)
    if m and m.group("w") in _WIDTH_WORDS:
        return TensorFormat(raw, precision, "vectorized", _WIDTH_WORDS[m.group("w")], spatial)
    if low.startswith("channel major"):
        mm = _CHANNEL_MOD.search(low) or _CHANNEL_EQ.search(low)
        return TensorFormat(raw, precision, "channel-last", int(mm.group("n")) if mm else 1, spatial)
    if low.startswith("row major"):
        return TensorFormat(raw, precision, "linear", 1, spatial)
    return TensorFormat(raw, precision, "unknown", 1, spatial)


# --------------------------------------------------------------------------------------------------
# Engine layers
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    """One input or output of an engine layer."""

    name: str
    format: Optional[TensorFormat]  # None: the inspector printed no format (no execution context)
    dims: tuple[int, ...] = ()
    location: str = ""

    @property
    def precision(self) -> Optional[str]:
        return self.format.precision if self.format else None


@dataclass(frozen=True)
class EngineLayer:
    """One layer as the engine inspector printed it."""

    index: int
    name: str
    layer_type: str  # "CaskConvolution", "Reformat", "PointWiseV2", ... ("" when names-only)
    parameter_type: str = ""  # "Convolution", "Reformat", "PointWise", ... (may be absent)
    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[Tensor, ...] = ()
    metadata: str = ""  # 8.6: "[ONNX Layer: a]\x1e[ONNX Layer: b]"
    origin: str = ""  # Reformat layers: "QDQ" (a Q/DQ node), "REFORMAT" (inserted copy), "CAST"
    tactic: str = ""  # TacticName (or TacticValue when there is no name)
    params: tuple[tuple[str, str], ...] = ()  # every other key, stringified, for display

    def param(self, key: str, default: str = "") -> str:
        for k, v in self.params:
            if k == key:
                return v
        return default


@dataclass(frozen=True)
class EngineLayers:
    """A whole engine's layer list, validated."""

    layers: tuple[EngineLayer, ...]
    bindings: tuple[str, ...]
    detailed: bool  # False: built with ProfilingVerbosity.LAYER_NAMES_ONLY (names only)
    has_bindings: bool = True
    source: str = "<text>"

    def __len__(self) -> int:
        return len(self.layers)


def _read_json(src: Any, what: str, hint: str) -> tuple[Any, str]:
    """Path, JSON text, bytes or an already-parsed object -> (object, name for messages)."""
    if isinstance(src, (Mapping, list, tuple)):
        return src, "<object>"
    if isinstance(src, bytes):
        src = src.decode("utf-8", errors="replace")
        text, name = src, "<text>"
    elif isinstance(src, str) and src.lstrip()[:1] in ("{", "["):
        text, name = src, "<text>"
    elif isinstance(src, (str, os.PathLike)):
        path = Path(src)
        name = str(path)
        if not path.exists():
            raise ReportError(f"{name}: no such file", hint=hint)
        if not path.is_file():
            raise ReportError(f"{name}: not a file", hint=hint)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise ReportError(f"{name}: cannot read ({e.strerror})") from None
    else:
        raise ReportError(f"cannot read {what} from a {type(src).__name__}")
    if not text.strip():
        raise ReportError(f"{name}: empty file, not {what}", hint=hint)
    try:
        # strict=False: TensorRT writes raw control characters inside strings.
        return json.loads(text, strict=False), name
    except json.JSONDecodeError as e:
        raise ReportError(
            f"{name}: not JSON ({e.msg} at line {e.lineno} column {e.colno})", hint=hint
        ) from None
    except RecursionError:  # the decoder recurses per level; no exporter nests more than a few
        raise ReportError(f"{name}: JSON nested too deeply to be {what}", hint=hint) from None


def _req(d: Mapping, key: str, where: str, name: str) -> Any:
    if key not in d:
        raise ReportError(f'{name}: {where}: missing key "{key}"', hint=LAYERS_HINT)
    return d[key]


def _tensor(d: Any, where: str, name: str) -> Tensor:
    if not isinstance(d, Mapping):
        raise ReportError(f"{name}: {where}: expected an object, got {type(d).__name__}", hint=LAYERS_HINT)
    tname = _req(d, "Name", where, name)
    fmt = d.get("Format/Datatype")
    dims = d.get("Dimensions") or ()
    try:
        dims_t = tuple(int(x) for x in dims)
    except (TypeError, ValueError):
        dims_t = ()
    return Tensor(
        name=str(tname),
        format=parse_format(str(fmt)) if fmt is not None else None,
        dims=dims_t,
        location=str(d.get("Location", "")),
    )


_LAYER_KEYS = {
    "Name",
    "LayerType",
    "ParameterType",
    "Inputs",
    "Outputs",
    "Metadata",
    "Origin",
    "TacticName",
    "TacticValue",
}


def _layer(i: int, d: Mapping, name: str) -> EngineLayer:
    where = f"Layers[{i}]"
    lname = _req(d, "Name", where, name)
    where = f"Layers[{i}] ({str(lname)[:60]!r})"
    ltype = _req(d, "LayerType", where, name)
    ins = _req(d, "Inputs", where, name)
    outs = _req(d, "Outputs", where, name)
    if not isinstance(ins, list) or not isinstance(outs, list):
        raise ReportError(f"{name}: {where}: Inputs/Outputs must be lists", hint=LAYERS_HINT)
    params = tuple(
        (str(k), v if isinstance(v, str) else json.dumps(v)) for k, v in d.items() if k not in _LAYER_KEYS
    )
    return EngineLayer(
        index=i,
        name=str(lname),
        layer_type=str(ltype),
        parameter_type=str(d.get("ParameterType", "")),
        inputs=tuple(_tensor(t, f"{where} Inputs[{j}]", name) for j, t in enumerate(ins)),
        outputs=tuple(_tensor(t, f"{where} Outputs[{j}]", name) for j, t in enumerate(outs)),
        metadata=str(d.get("Metadata", "") or ""),
        origin=str(d.get("Origin", "") or ""),
        tactic=str(d.get("TacticName") or d.get("TacticValue") or ""),
        params=params,
    )


def layers_from_json(obj: Any, name: str = "<object>") -> EngineLayers:
    """Validate parsed inspector JSON (see the module docstring for the accepted forms)."""
    if isinstance(obj, list):
        if obj and isinstance(obj[0], Mapping) and "count" in obj[0]:
            raise ReportError(
                f'{name}: no "Layers" key: this is a per-layer profile (trtexec --exportProfile), '
                "not layer information",
                hint="pass it with --profile and give the --exportLayerInfo file as the argument",
            )
        raise ReportError(
            f'{name}: no "Layers" key: a JSON list is not engine layer information', hint=LAYERS_HINT
        )
    if not isinstance(obj, Mapping):
        raise ReportError(
            f"{name}: not engine layer information (JSON {type(obj).__name__})", hint=LAYERS_HINT
        )
    if "Layers" not in obj:
        keys = ", ".join(sorted(map(str, obj)))[:80]
        raise ReportError(
            f'{name}: missing key "Layers" (top-level keys: {keys or "none"})', hint=LAYERS_HINT
        )
    raw = obj["Layers"]
    if not isinstance(raw, list):
        raise ReportError(f'{name}: "Layers" must be a list, got {type(raw).__name__}', hint=LAYERS_HINT)
    if not raw:
        raise ReportError(
            f'{name}: "Layers" is empty: the engine has no layers, or was built with ProfilingVerbosity.NONE',
            hint=LAYERS_HINT,
        )
    has_bindings = "Bindings" in obj
    bindings_raw = obj.get("Bindings") or []
    if not isinstance(bindings_raw, list):
        raise ReportError(f'{name}: "Bindings" must be a list', hint=LAYERS_HINT)
    bindings = tuple(str(b if not isinstance(b, Mapping) else b.get("Name", "")) for b in bindings_raw)

    if all(isinstance(x, str) for x in raw):
        # ProfilingVerbosity.LAYER_NAMES_ONLY: names and nothing else.
        layers = tuple(EngineLayer(index=i, name=x, layer_type="") for i, x in enumerate(raw))
        return EngineLayers(layers, bindings, detailed=False, has_bindings=has_bindings, source=name)
    bad = next((i for i, x in enumerate(raw) if not isinstance(x, Mapping)), None)
    if bad is not None:
        raise ReportError(
            f"{name}: Layers[{bad}] is a {type(raw[bad]).__name__}, expected an object", hint=LAYERS_HINT
        )
    layers = tuple(_layer(i, d, name) for i, d in enumerate(raw))
    return EngineLayers(layers, bindings, detailed=True, has_bindings=has_bindings, source=name)


def load_layers(path_or_text: Source) -> EngineLayers:
    """Read engine layer information from a file path, JSON text (the Python inspector's ``str``),
    bytes, or an already-parsed dict."""
    obj, name = _read_json(path_or_text, "engine layer information", LAYERS_HINT)
    return layers_from_json(obj, name)


# --------------------------------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerTime:
    name: str
    average_ms: float
    median_ms: Optional[float] = None
    total_ms: Optional[float] = None
    percentage: Optional[float] = None


@dataclass(frozen=True)
class Profile:
    """Per-layer average times of one engine run."""

    layers: tuple[LayerTime, ...]
    iterations: Optional[int] = None
    source: str = "<object>"
    producer: str = "trtexec"  # "trtexec" or "edgeq"

    @property
    def total_ms(self) -> float:
        """Sum of per-layer averages: the GPU time of one inference as the profiler saw it."""
        return sum(t.average_ms for t in self.layers)


def _num(v: Any, key: str, where: str, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ReportError(f'{name}: {where}: "{key}" must be a number, got {v!r}'[:200], hint=PROFILE_HINT)
    return float(v)


def _layer_time(d: Any, where: str, name: str) -> LayerTime:
    if not isinstance(d, Mapping):
        raise ReportError(f"{name}: {where}: expected an object", hint=PROFILE_HINT)
    for key in ("name", "averageMs"):
        if key not in d:
            raise ReportError(f'{name}: {where}: missing key "{key}"', hint=PROFILE_HINT)
    opt = {
        k: (_num(d[k], k, where, name) if d.get(k) is not None else None)
        for k in ("medianMs", "timeMs", "percentage")
    }
    return LayerTime(
        name=str(d["name"]),
        average_ms=_num(d["averageMs"], "averageMs", where, name),
        median_ms=opt["medianMs"],
        total_ms=opt["timeMs"],
        percentage=opt["percentage"],
    )


def profile_from_json(obj: Any, name: str = "<object>") -> Profile:
    """Validate a parsed profile (trtexec list form or edgeq's ``{"layers": [...]}`` form)."""
    if isinstance(obj, list):
        items = list(obj)
        iterations = None
        if items and isinstance(items[0], Mapping) and "count" in items[0] and "name" not in items[0]:
            iterations = int(_num(items[0]["count"], "count", "[0]", name))
            items = items[1:]
        times = tuple(
            _layer_time(d, f"[{i + (1 if iterations is not None else 0)}]", name) for i, d in enumerate(items)
        )
        return Profile(times, iterations, name, "trtexec")
    if isinstance(obj, Mapping):
        if "layers" not in obj:
            hint = PROFILE_HINT
            if "Layers" in obj:
                hint = "this is layer information (--exportLayerInfo); give it as the first argument"
            raise ReportError(f'{name}: missing key "layers" (not a trtexec or edgeq profile)', hint=hint)
        raw = obj["layers"]
        if not isinstance(raw, list):
            raise ReportError(f'{name}: "layers" must be a list', hint=PROFILE_HINT)
        it = obj.get("iterations", obj.get("count"))
        iterations = int(_num(it, "iterations", "top level", name)) if it is not None else None
        times = tuple(_layer_time(d, f"layers[{i}]", name) for i, d in enumerate(raw))
        return Profile(times, iterations, name, "edgeq")
    raise ReportError(f"{name}: not a profile (JSON {type(obj).__name__})", hint=PROFILE_HINT)


def load_profile(path_or_obj: Source) -> Profile:
    """Read a per-layer profile from a path, JSON text, or an already-parsed list/dict."""
    obj, name = _read_json(path_or_obj, "a profile", PROFILE_HINT)
    return profile_from_json(obj, name)
