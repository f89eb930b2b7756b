"""``inspect`` for backend ``python``: deserializing an engine, creating its execution context, and
the engine inspector's per-layer JSON written in the shape ``trtexec --exportLayerInfo`` writes.

``load_engine`` and ``create_context`` live here and are shared with ``trt_profile``.
"""

import json

from .common import AgentError
from .trt_common import first_error, load_tensorrt, make_logger, write_atomic


def load_engine(trt, logger, log, path, dla_core, stage):
    try:
        runtime = trt.Runtime(logger)
    except Exception as e:
        raise AgentError("cuda", "cannot create a TensorRT Runtime: %s" % (e,), log=log.tail()) from None
    if dla_core is not None:
        runtime.DLA_core = int(dla_core)
    with open(path, "rb") as f:
        data = f.read()
    mark = log.mark()
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        default = "cannot deserialize %s (built by another TensorRT version or GPU?)" % path
        raise AgentError(stage, first_error(log, default, mark), log=log.tail())
    return runtime, engine


def create_context(engine, log, stage):
    mark = log.mark()
    context = engine.create_execution_context()  # None when device memory cannot be allocated
    if context is None:
        raise AgentError(stage, first_error(log, "cannot create an execution context", mark), log=log.tail())
    return context


def layer_info_result(text, path, version):
    """Write the inspector's JSON string to ``path`` (atomically) and summarise it for the reply.

    The text is exactly what ``trtexec --exportLayerInfo`` writes (it prints
    ``getEngineInformation(kJSON)``), so the host reads both with one parser. 8.6 joins fused ONNX node
    names with raw control characters (U+001E), hence ``strict=False``.
    """
    try:
        info = json.loads(text, strict=False)
    except ValueError as e:
        raise AgentError("inspect", "the engine inspector returned no JSON: %s" % e) from None
    layers = info.get("Layers") if isinstance(info, dict) else None
    if not isinstance(layers, list):
        raise AgentError("inspect", 'the engine inspector JSON has no "Layers" list')
    write_atomic(path, text.encode("utf-8", "surrogateescape"))
    return {
        "layers_json": path,
        "layers": len(layers),
        # Names only (strings) when the engine was not built with ProfilingVerbosity.DETAILED.
        "detailed": bool(layers) and all(isinstance(x, dict) for x in layers),
        "tensorrt": version,
    }


def engine_information(trt, engine, log, shapes=None):
    """The inspector's JSON of ``engine``, with an execution context set (C++
    ``IEngineInspector::setExecutionContext``; the Python property is ``execution_context`` in the 8.x
    bindings, pyCore.cpp) at ``shapes`` (``--shapes``) when given: the API's documented condition for a
    range-profile engine's formats. Measured, it is not enough on TensorRT 8.6.0: PP-OCRv4's recogniser
    printed every tensor's "Format/Datatype" as "N/A due to dynamic shapes" without the shapes (an H200)
    and with them set (an H100); the context must also infer every tensor's shape (``infer_shapes``), and
    then the formats print (an H100, a two-convolution engine over a range of widths; a dynamic input
    left without a shape is an error). ``context`` stays referenced until the information has been read
    (the property holds a raw pointer)."""
    inspector = engine.create_engine_inspector()
    context = create_context(engine, log, "inspect")
    if shapes:
        from .trt_profile import set_input_shapes  # trt_profile imports this module

        set_input_shapes(trt, engine, context, shapes)
        # Measured (TensorRT 8.6.0, an H100, a two-convolution engine over a range of widths): formats read
        # "N/A due to dynamic shapes" with the input shapes set and every I/O shape read back, and print
        # once the context has inferred every tensor's shape (IExecutionContext::inferShapes), as
        # trtexec's inference set-up does before it prints the layers.
        missing = context.infer_shapes()
        if missing:
            raise AgentError("inspect", "input shapes not all given: %s" % ", ".join(missing),
                             details={"hint": "give --shapes for every dynamic input"})
    inspector.execution_context = context
    try:
        return inspector.get_engine_information(trt.LayerInformationFormat.JSON)
    except UnicodeDecodeError as e:  # pybind11 decodes the C string as strict UTF-8
        raise AgentError(
            "inspect",
            "the engine inspector's JSON is not UTF-8 (%s)" % e,
            details={"hint": "use backend: trtexec, which writes the bytes as they are"},
        ) from None


def inspect(args, log):
    trt = load_tensorrt()
    logger = make_logger(trt, log, getattr(args, "verbose", False))
    _runtime, engine = load_engine(trt, logger, log, args.loadEngine, args.useDLACore, "inspect")
    text = engine_information(trt, engine, log, getattr(args, "shapes", None))
    return layer_info_result(text, args.exportLayerInfo, trt.__version__)
