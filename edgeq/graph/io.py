"""The one ONNX boundary: every model edgeq reads or writes goes through here.

Loading validates what TensorRT's parser would otherwise trip over late (truncated files, missing
external data, cycles, inputs nobody produces) and turns it into a one-line ``GraphError``.
Saving is atomic and switches to external data for models over protobuf's 2 GB limit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeq.errors import GraphError, first_line

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

# protobuf cannot serialize a message of 2 GiB or more; stay clear of the edge.
PROTOBUF_LIMIT = 2**31 - 1
EXTERNAL_DATA_THRESHOLD = PROTOBUF_LIMIT - 64 * 2**20


def serialized_size(model: onnx.ModelProto) -> int:
    """About the bytes ``model`` serializes to (a few bytes per tensor either way), without serializing it.

    protobuf's ``ByteSize`` (upb) encodes the message to measure it, as slow as writing the model, and the
    file-or-memory choice at 2 GB is made before every check, shape inference, save and session: on a
    100 MB model that was a second or more per deploy. Initializers' raw bytes are counted, not encoded.
    """
    g = model.graph
    size = len(g.name) + len(g.doc_string) + len(model.doc_string) + len(model.producer_name) + 64
    for t in g.initializer:
        if t.HasField("raw_data"):
            size += len(t.raw_data) + len(t.name) + len(t.doc_string) + 11 * len(t.dims) + 32
        else:
            size += t.ByteSize() + 8
    for part in (g.node, g.input, g.output, g.value_info, g.sparse_initializer, g.quantization_annotation,
                 model.functions, model.opset_import, model.metadata_props, model.training_info):
        size += sum(p.ByteSize() + 8 for p in part)
    return size


def load_model(
    path: str | os.PathLike[str],
    *,
    load_external_data: bool = True,
    check: bool = True,
    sources: list[Path] | None = None,
) -> onnx.ModelProto:
    """Read an ONNX file, with its external data, and fail early and clearly on a broken one.

    ``sources`` (if given) receives every file read: the model and its external data files, which an
    output path must not overwrite (once loaded, the model no longer says where its data came from).
    """
    import onnx
    from google.protobuf import json_format, text_format
    from google.protobuf.message import DecodeError

    path = Path(path)
    if not path.exists():
        raise GraphError(f"{path}: no such file")
    if not path.is_file():
        raise GraphError(f"{path}: not a file")
    if path.stat().st_size == 0:
        raise GraphError(f"{path}: empty file, not an ONNX model")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except DecodeError as e:
        raise GraphError(f"{path}: not an ONNX model or truncated protobuf ({e})") from None
    except (json_format.Error, text_format.Error) as e:
        # onnx.load picks the format from the suffix: a .json/.txt file is parsed as JSON/text protobuf.
        raise GraphError(
            f"{path}: not an ONNX model ({first_line(e)})", hint="give the binary .onnx file"
        ) from None
    except (ValueError, RuntimeError, OSError) as e:
        raise GraphError(f"{path}: cannot read ONNX model ({e})") from None
    if not model.HasField("graph") or (len(model.graph.node) == 0 and len(model.graph.output) == 0):
        raise GraphError(f"{path}: not an ONNX model (no graph)")
    if sources is not None:
        sources.append(path)
    if load_external_data:
        read = _load_external(model, path)
        if sources is not None:
            sources.extend(read)
    sorted_here = validate_structure(model, name=str(path))
    if check:  # the file as read, unless it was reordered here
        check_model(model, name=str(path), path=None if sorted_here else path)
    return model


def _load_external(model: onnx.ModelProto, path: Path) -> list[Path]:
    from onnx.external_data_helper import load_external_data_for_model, uses_external_data

    base = path.parent
    files: list[Path] = []
    for t in _all_initializers(model):
        if uses_external_data(t):
            loc = next((e.value for e in t.external_data if e.key == "location"), "")
            f = base / loc
            if not loc or not f.is_file():
                raise GraphError(
                    f"{path}: external data file '{loc}' for tensor '{t.name}' is missing",
                    hint=f"put it next to the model in {base}",
                )
            if f not in files:
                files.append(f)
    from onnx.checker import ValidationError

    try:
        load_external_data_for_model(model, str(base))
    except (OSError, ValueError, ValidationError) as e:  # ValidationError: location outside the model's dir
        raise GraphError(f"{path}: cannot read external data ({e})") from None
    return files


def _all_initializers(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    out = list(model.graph.initializer)
    for n in model.graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                out.append(a.t)
    return out


def validate_structure(model: onnx.ModelProto, name: str = "model") -> bool:
    """Refuse dangling inputs and cycles; put an acyclic but unsorted graph into order (returns True
    when it did).

    The ONNX checker reports both as "not topologically sorted"; users need to know which it is.
    """
    g = model.graph
    available = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    producers: dict[str, int] = {}
    for idx, n in enumerate(g.node):
        for o in n.output:
            if o:
                producers[o] = idx
    for n in g.node:
        for i in n.input:
            if i not in available and i not in producers:
                raise GraphError(
                    f"{name}: node '{n.name or n.op_type}' reads tensor '{i}' that no node, input or "
                    "initializer produces"
                )
    for o in g.output:
        if o.name not in available and o.name not in producers:
            raise GraphError(f"{name}: graph output '{o.name}' is produced by nothing")

    order = _topological_order(model)
    if order is None:
        raise GraphError(f"{name}: the graph has a cycle through nodes {', '.join(_cycle_nodes(model))}")
    if order != list(range(len(g.node))):
        nodes = [g.node[i] for i in order]
        copies = [type(n)() for n in nodes]
        for c, n in zip(copies, nodes):
            c.CopyFrom(n)
        del g.node[:]
        g.node.extend(copies)
        return True
    return False


def _topological_order(model: onnx.ModelProto) -> list[int] | None:
    g = model.graph
    producers = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    deps: list[set[int]] = []
    users: list[list[int]] = [[] for _ in g.node]
    for i, n in enumerate(g.node):
        d = {producers[x] for x in _node_inputs(n) if x in producers}
        deps.append(d)
        for p in d:
            users[p].append(i)
    indeg = [len(d) for d in deps]
    ready = deque(i for i, k in enumerate(indeg) if k == 0)
    order: list[int] = []
    while ready:
        i = ready.popleft()
        order.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    return order if len(order) == len(g.node) else None


def _node_inputs(node: onnx.NodeProto) -> list[str]:
    """Inputs of a node including outer-scope names its subgraphs use (If/Loop bodies)."""
    names = [x for x in node.input if x]
    for a in node.attribute:
        subs = ([a.g] if a.HasField("g") else []) + list(a.graphs)
        for sg in subs:
            local = {i.name for i in sg.input} | {t.name for t in sg.initializer}
            local |= {o for n in sg.node for o in n.output}
            for n in sg.node:
                names.extend(x for x in _node_inputs(n) if x not in local)
    return names


def _cycle_nodes(model: onnx.ModelProto) -> list[str]:
    order = _topological_order(model) or []
    done = set(order)
    return [n.name or f"{n.op_type}#{i}" for i, n in enumerate(model.graph.node) if i not in done][:6]


def check_model(model: onnx.ModelProto, name: str = "model", *, full: bool = False,
                path: Path | None = None) -> None:
    """``onnx.checker``; ``full`` adds its strict type and shape inference (``full_check``), which is
    what catches an operator given a type its opset does not define (float16 Q/DQ before opset 19).
    ``path``: the file ``model`` was just read from, which the checker reads itself (no serializing)."""
    import onnx
    from onnx.shape_inference import InferenceError

    try:
        if path is not None:
            onnx.checker.check_model(str(path), full_check=full)
        elif serialized_size(model) > EXTERNAL_DATA_THRESHOLD:
            with tempfile.TemporaryDirectory() as d:
                p = Path(d) / "m.onnx"
                _save(model, p, external=True)
                onnx.checker.check_model(str(p), full_check=full)
        else:
            onnx.checker.check_model(model, full_check=full)
    except (onnx.checker.ValidationError, InferenceError) as e:
        raise GraphError(f"{name}: fails the ONNX checker: {first_line(e)}") from None


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference that also works past the 2 GB protobuf limit (via a file)."""
    import onnx

    try:
        if serialized_size(model) > EXTERNAL_DATA_THRESHOLD:
            with tempfile.TemporaryDirectory() as d:
                src, dst = Path(d) / "in.onnx", Path(d) / "out.onnx"
                _save(model, src, external=True)
                onnx.shape_inference.infer_shapes_path(str(src), str(dst))
                out = onnx.load(str(dst), load_external_data=True)
                return out
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as e:  # onnx raises InferenceError and plain RuntimeErrors from C++
        raise GraphError(f"shape inference failed: {first_line(e)}") from None


def save_model(
    model: onnx.ModelProto, path: str | os.PathLike[str], *, external_data: bool | None = None
) -> Path:
    """Write atomically; ``external_data=None`` picks external data only when the model needs it.

    External data goes to ``<name>.data`` beside the model; both files appear together or not at all.
    """
    path = Path(path)
    if path.is_dir():
        raise GraphError(f"{path}: is a directory, not a file to write the model to")
    external = serialized_size(model) > EXTERNAL_DATA_THRESHOLD if external_data is None else external_data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmpdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as e:  # a user-facing problem (permissions, read-only or missing mount), not a bug
        raise GraphError(f"{path}: cannot write ({e.strerror or e})") from None
    try:
        tmp = tmpdir / path.name
        _save(model, tmp, external=external)
        data_name = f"{path.name}.data"
        if external and (tmpdir / data_name).exists():
            os.replace(tmpdir / data_name, path.parent / data_name)
        os.replace(tmp, path)
    except OSError as e:
        raise GraphError(f"{path}: cannot write ({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return path


def _save(model: onnx.ModelProto, path: Path, *, external: bool) -> None:
    import onnx

    if external:
        # onnx's external-data save moves the tensors' bytes out of the message it is given; save a
        # copy so the caller's model still holds its weights.
        m = type(model)()
        m.CopyFrom(model)
        onnx.save_model(
            m,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=f"{path.name}.data",
            size_threshold=1024,
        )
    else:
        onnx.save_model(model, str(path))


def ort_session(model: onnx.ModelProto, options: Any = None, providers: Sequence[str] | None = None) -> Any:
    """An onnxruntime session for an in-memory model of any size.

    Past protobuf's 2 GB limit the model cannot be serialized to bytes, so it goes through a temporary
    file with external data (onnxruntime has read it once the session exists). onnxruntime's own errors
    propagate: each caller knows what the session was for and words the error for its user.
    """
    import onnxruntime as ort

    quiet_onnxruntime()
    options = options if options is not None else ort.SessionOptions()
    options.log_severity_level = ORT_QUIET  # every session's: see ORT_QUIET
    providers = list(providers or ["CPUExecutionProvider"])
    if serialized_size(model) <= EXTERNAL_DATA_THRESHOLD:
        return ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    with tempfile.TemporaryDirectory(prefix="edgeq-ort-") as d:
        path = save_model(model, Path(d) / "model.onnx", external_data=True)
        return ort.InferenceSession(str(path), options, providers=providers)


# onnxruntime's log severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal. Its C++ logger writes to
# fd 2, in colour, past Python: an error a session's run fails with ("[E:onnxruntime:, sequential_executor.cc
# ... ExecuteKernel] Non-zero status code ...") is written at severity 3 and then raised as the exception
# edgeq words its own line from. So every session logs at fatal only (the session's ``log_severity_level``
# stops what it writes while it is created and run; the default logger's, what it writes before a session
# has its own, and graphsurgeon's constant-folding sessions, which take the default).
ORT_QUIET = 4


def quiet_onnxruntime() -> None:
    """Keep onnxruntime's own log lines off the terminal (``ORT_QUIET``): library code never prints; what
    matters comes back as edgeq's own findings and errors, each with onnxruntime's message."""
    import onnxruntime as ort

    ort.set_default_logger_severity(ORT_QUIET)


def graph_from_model(model: onnx.ModelProto) -> gs.Graph:
    import onnx_graphsurgeon as gs

    return gs.import_onnx(model)


def typed_graph_from_model(model: onnx.ModelProto) -> gs.Graph:
    """The graph of a shape-inferred copy, so passes and rules see tensor types and static shapes.

    A model onnx cannot infer is imported as it is: its tensors then carry no types, which passes and
    rules treat as unknown rather than as an error (TensorRT's parser infers on its own).
    """
    try:
        typed = infer_shapes(model)
    except GraphError:
        typed = model
    return graph_from_model(typed)


def model_from_graph(graph: gs.Graph, like: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """Export a graphsurgeon graph, keeping the original model's IR version and metadata."""
    import onnx
    import onnx_graphsurgeon as gs

    model = gs.export_onnx(graph, do_type_check=False)
    if like is not None:
        model.ir_version = like.ir_version
        if model.ir_version < 4:
            # IR 3 requires every initializer to be a graph input too (IR 4 dropped that rule);
            # graphsurgeon exports initializers as constants only.
            listed = {i.name for i in model.graph.input}
            model.graph.input.extend(
                onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                for t in model.graph.initializer
                if t.name not in listed
            )
        model.producer_name = like.producer_name or model.producer_name
        model.producer_version = like.producer_version or model.producer_version
        del model.metadata_props[:]
        model.metadata_props.extend(like.metadata_props)
    return model


def default_output(path: str | os.PathLike[str], suffix: str) -> Path:
    """``model.onnx`` -> ``model.<suffix>.onnx`` beside it (``clean``, ``int8``)."""
    p = Path(path)
    stem = p.name[: -len(".onnx")] if p.name.endswith(".onnx") else p.name
    return p.with_name(f"{stem}.{suffix}.onnx")


def opset_of(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def half_types() -> frozenset[int]:
    """ONNX's half-precision element types (float16, bfloat16), one set for clean (Q/DQ take them from
    opset 19 only), quantize (which refuses them) and verify (which widens them: onnxruntime's CPU
    provider runs them in float32). A function, so onnx is imported only when asked."""
    import onnx

    return frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})
