"""Engine layer names -> ONNX nodes: the pieces of a fused layer's name, and 8.6's Metadata."""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Sequence
from typing import Any

from edgeq.report.parse import EngineLayer

REFORMAT_FOR = re.compile(r"^Reformatting CopyNode for (Input|Output) Tensor \d+ to (?P<target>.+)$", re.S)
_FOREIGN = re.compile(r"^\{ForeignNode\[(?P<body>.*)\]\}$", re.S)
# Pieces of fused-layer names that TensorRT or the ONNX parser made up (not ONNX node names).
_SYNTHETIC = re.compile(
    r"^(\(Unnamed Layer\* \d+\)|transpose_before_|unsqueeze_node_after_|squeeze_after_|"
    r"copied_squeeze_after_|reshape_after_|reshape_before_|copied_)|(_quantized|_output)$"
)
_OP_FROM_NAME = re.compile(r"([A-Z][A-Za-z0-9]*?)(?:_\d+)?$")


def _split_top(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside (), [] and {} (fused names nest: PWN(PWN(a), b))."""
    out: list[str] = []
    cur: list[str] = []
    depth, i = 0, 0
    while i < len(text):
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(0, depth - 1)
        if depth == 0 and text.startswith(sep, i):
            out.append("".join(cur))
            cur = []
            i += len(sep)
            continue
        cur.append(c)
        i += 1
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


def split_layer_name(name: str) -> tuple[str, ...]:
    """Candidate ONNX node names inside a fused engine layer name.

    "/conv1/Conv + /relu/Relu + /maxpool/MaxPool" -> 3 names; "PWN(PWN(/a/Sigmoid), /a/Mul)" ->
    2 names; "{ForeignNode[/a/MatMul.../b/Add]}" -> first and last; "Reformatting CopyNode for
    Input Tensor 0 to X" -> () (a copy TensorRT inserted, it absorbed no node).
    """
    if REFORMAT_FOR.match(name):
        return ()
    out: list[str] = []

    def walk(piece: str) -> None:
        piece = piece.strip()
        m = _FOREIGN.match(piece)
        if m:
            for p in m.group("body").split("..."):
                walk(p)
            return
        if piece.startswith("PWN(") and piece.endswith(")"):
            for p in _split_top(piece[4:-1], ","):
                walk(p)
            return
        parts = _split_top(piece, " + ")
        if len(parts) > 1:
            for p in parts:
                walk(p)
            return
        if piece and piece not in out:
            out.append(piece)

    walk(name)
    return tuple(out)


def nodes_from_metadata(metadata: str) -> tuple[str, ...]:
    """8.6 ``Metadata``: "[ONNX Layer: a]\\x1e[ONNX Layer: b]" -> ("a", "b"), duplicates dropped."""
    out: list[str] = []
    for part in metadata.split("\x1e"):
        part = part.strip()
        if part.startswith("[ONNX Layer: ") and part.endswith("]"):
            n = part[len("[ONNX Layer: ") : -1]
            if n and n not in out:
                out.append(n)
    return tuple(out)


def op_from_node_name(name: str) -> str:
    """Best guess of an ONNX op type from a node name when no model is given.

    Exporters name nodes "/scope/OpType" (torch.onnx) or "OpType_12"; onnxruntime's quantizer
    "<tensor>_QuantizeLinear".
    """
    seg = name.rstrip("/").rsplit("/", 1)[-1]
    m = _OP_FROM_NAME.search(seg)
    return m.group(1) if m else seg


def layer_nodes(lay: EngineLayer, onnx_ops: dict[str, str], unknown: list[str]) -> tuple[str, ...]:
    """ONNX nodes of a layer: 8.6 Metadata first, then the pieces of the fused name."""
    meta = nodes_from_metadata(lay.metadata)
    pieces = split_layer_name(lay.name)
    if onnx_ops:
        cands = list(meta) + [p for p in pieces if p in onnx_ops]
        if lay.name in onnx_ops:
            cands.append(lay.name)
        unknown.extend(n for n in meta if n not in onnx_ops)
        return tuple(dict.fromkeys(n for n in cands if n in onnx_ops))
    if meta:
        return meta
    return tuple(p for p in pieces if not _SYNTHETIC.search(p))


def is_qdq_name(n: str) -> bool:
    """A Q/DQ node's name: QuantizeLinear, DequantizeLinear and their _clone_N copies (not compute in
    either mode, and absent from the float model an explicit engine's Q/DQ model came from)."""
    return "quantizelinear" in n.lower()


def foreign_names(names: Iterable[str], known: Container[str]) -> tuple[str, ...]:
    """The ONNX node names an engine carries that ``known`` (a model's nodes, another engine's) lacks,
    each once: what says two files are not of one model."""
    return tuple(dict.fromkeys(n for n in names if n not in known))


def different_model(foreign: Sequence[str], total: int, other: str) -> str:
    """The one sentence for names of another model: ``report --onnx``'s note and ``compare``'s refusal."""
    from edgeq.text import plural

    verb = "is" if len(foreign) == 1 else "are"
    names = plural(total, "ONNX node name")
    return f"{len(foreign)} of {names} in the engine {verb} not in {other} (a different model?)"


def mostly_foreign(foreign: Sequence[str], total: int) -> bool:
    """Most names foreign: a different model, not a placement's extra Q/DQ or copy names. Engines of
    one model share every compute node (the recorded ResNet-50 and YOLO engines: all or none)."""
    return total > 0 and 2 * len(foreign) > total


def require_same_model(what: str, foreign: Sequence[str], total: int, other: str, hint: str) -> None:
    """The one rule for files of two models, ``report --onnx`` and ``compare`` alike: most names foreign is
    refused (ReportError, exit 2; every figure after it would compare unrelated graphs); a few are a
    note (``different_model``)."""
    from edgeq.errors import ReportError

    if mostly_foreign(foreign, total):
        raise ReportError(f"{what}: {different_model(foreign, total, other)}", hint=hint)


def require_model_of(what: str, mapping: Any, model: str | None = None) -> None:
    """``report --onnx``, ``compare --onnx``: the engine's compute node names (Q/DQ left out, as
    ``compare`` leaves them out: the float model of a Q/DQ export has none) against the model's
    (``fusion.OnnxMapping``), by the rule ``compare`` applies to two engines: mostly another model's is
    refused, exit 2."""
    names = [n for n in mapping.engine_names if not is_qdq_name(n)]
    foreign = [n for n in mapping.unknown if not is_qdq_name(n)]
    require_same_model(what, foreign, len(names), model or mapping.model,
                       "give --onnx the model the engine was built from")
