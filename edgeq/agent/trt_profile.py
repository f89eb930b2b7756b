"""``profile`` for backend ``python``: end-to-end latency of ``execute_async_v3`` on device buffers,
then per-layer times from an IProfiler, written in the shape of ``trtexec --exportProfile``.

Split from ``trt_engine`` (loading, inspecting) because timing brings in CUDA buffers and the profiler.
"""

import json
import time

from .arrays import TRT_TYPES
from .common import AgentError, percentiles
from .shapes import parse_shapes
from .trt_common import first_error, load_tensorrt, make_logger, write_atomic
from .trt_cuda import open_cuda
from .trt_engine import create_context, load_engine


def type_name(dtype):
    """A ``tensorrt.DataType``'s member name ("FLOAT"), the key of ``arrays.TRT_TYPES``."""
    return getattr(dtype, "name", None) or str(dtype).rsplit(".", 1)[-1]


def _itemsize(dtype):
    size = getattr(dtype, "itemsize", None)  # DataType.itemsize (8.6.1 Python API)
    if isinstance(size, int) and size > 0:
        return size
    name = type_name(dtype)
    if name not in TRT_TYPES:  # bytes per element, for bindings whose DataType lacks ``itemsize``
        raise AgentError("profile", "unknown TensorRT data type %s" % (dtype,))
    return TRT_TYPES[name][1]


def tensor_bytes(shape, itemsize, vectorized_dim=-1, components=1):
    """Bytes for one I/O tensor: the volume, with a vectorized dimension padded to whole vectors
    (``get_tensor_vectorized_dim`` / ``get_tensor_components_per_element``; -1 / 1 for linear)."""
    dims = [int(d) for d in shape]
    if vectorized_dim is not None and 0 <= vectorized_dim < len(dims) and components > 1:
        dims[vectorized_dim] = -(-dims[vectorized_dim] // components) * components
    count = 1
    for d in dims:
        count *= d
    return count * itemsize


def set_input_shapes(trt, engine, context, shapes_text):
    """``--shapes`` (trtexec syntax) set on the context: an engine built with dynamic inputs runs at one
    concrete shape (``IExecutionContext.set_input_shape(name, dims) -> bool``, 8.5+ API). A dynamic input
    left out is an error (its buffer size would be unknown), as is a static one named with another shape.
    A static input named with its own shape is fine: TensorRT 8.6 fixes the dimensions of a one-shape
    profile (min = opt = max) in the engine, so a dynamic model built at the calibration data's shape has
    a static engine (measured on an H100: PP-OCR's classifier, x -1x3xHxW built at 1x3x48x192, came
    back as static [1, 3, 48, 192]), and the host asks for that same shape."""
    given = dict(parse_shapes(shapes_text))
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        if engine.get_tensor_mode(name) != trt.TensorIOMode.INPUT:
            continue
        dims = list(engine.get_tensor_shape(name))
        dynamic = any(int(d) < 0 for d in dims)
        if name in given and not dynamic:
            if list(given.pop(name)) == [int(d) for d in dims]:
                continue
            raise AgentError("input", "--shapes names %r, whose shape is static %s in the engine"
                             % (name, dims))
        if dynamic and name not in given:
            raise AgentError("input", "input %r has a dynamic shape %s and --shapes does not name it: the "
                             "engine runs at one concrete shape" % (name, dims))
        if dynamic and not context.set_input_shape(name, given.pop(name)):
            raise AgentError("input", "set_input_shape(%r) failed: the shape is outside the engine's "
                             "optimization profile" % name, log=None)
    if given:
        raise AgentError("input", "--shapes names %r, which is not an input of the engine" % sorted(given)[0])


def _bind_tensors(trt, engine, context, cuda):
    """Allocate every I/O tensor at the context's shapes and bind it with ``set_tensor_address`` (8.5+
    API); inputs with dynamic dimensions were set by ``set_input_shapes`` first."""
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        shape = list(context.get_tensor_shape(name))
        if any(int(d) < 0 for d in shape):
            kind = "input" if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else "output"
            raise AgentError(
                "profile",
                "%s %r has a dynamic shape %s: give its shape with --shapes" % (kind, name, shape),
            )
        nbytes = tensor_bytes(
            shape,
            _itemsize(engine.get_tensor_dtype(name)),
            engine.get_tensor_vectorized_dim(name),
            engine.get_tensor_components_per_element(name),
        )
        if not context.set_tensor_address(name, cuda.alloc(max(1, nbytes))):
            raise AgentError("profile", "set_tensor_address(%r) failed" % name)


def profile(args, log):
    trt = load_tensorrt()
    logger = make_logger(trt, log, getattr(args, "verbose", False))
    cuda = open_cuda()  # before the Runtime: one CUDA context for the engine and the buffers
    _runtime, engine = load_engine(trt, logger, log, args.loadEngine, args.useDLACore, "profile")
    context = create_context(engine, log, "profile")
    set_input_shapes(trt, engine, context, args.shapes)
    _bind_tensors(trt, engine, context, cuda)

    def once():
        mark = log.mark()
        if not context.execute_async_v3(cuda.handle):  # stream handle as an int (pyCore.cpp: size_t)
            raise AgentError("profile", first_error(log, "execute_async_v3 failed", mark), log=log.tail())
        cuda.sync()

    warm_until = time.perf_counter() + args.warmUp / 1000.0
    once()  # at least one run before timing: the first one pays for lazy initialisation
    while time.perf_counter() < warm_until:
        once()
    samples = []
    started = time.perf_counter()
    min_end = started + float(args.duration)
    while len(samples) < args.iterations or time.perf_counter() < min_end:
        t0 = time.perf_counter()
        once()
        samples.append((time.perf_counter() - t0) * 1000.0)
    wall = time.perf_counter() - started
    timed = {
        # Host-side time of one execute_async_v3 + stream sync (no H2D/D2H copies: the buffers stay on
        # the device), i.e. close to trtexec's "GPU Compute Time" plus launch overhead.
        "latency_ms": percentiles(samples),
        "throughput_qps": len(samples) / wall if wall > 0 else None,
        "iterations": len(samples),
        "wall_seconds": round(wall, 3),
        "tensorrt": trt.__version__,
    }
    if not args.exportProfile:  # a re-timing: no per-layer run
        return dict(timed, profile_json=None)

    # Per-layer times in a separate run (as trtexec --separateProfileRun): the profiler synchronises
    # after every layer, so it must not be attached while end-to-end latency is measured. The 8.6
    # IProfiler is called once per layer for each executeV2()/enqueueV2()/enqueueV3() (C++ API,
    # IProfiler); the stream is synchronised after every run so each run's reports are complete.
    # UNVERIFIED (8.6): whether enqueueV3 calls report_layer_time before it returns or after the
    # stream work ends; both are covered (sync per run, ``count`` = reports received, not runs asked).
    layer_times = {}
    order = []

    class _Profiler(trt.IProfiler):
        def __init__(self):
            trt.IProfiler.__init__(self)  # required for a Python IProfiler (Python API, IProfiler)

        def report_layer_time(self, layer_name, ms):
            if layer_name not in layer_times:
                layer_times[layer_name] = []
                order.append(layer_name)
            layer_times[layer_name].append(ms)

    profiler = _Profiler()
    context.profiler = profiler  # the context keeps it alive (pyCore.cpp: py::keep_alive<1, 2>)
    runs = max(1, min(len(samples), 100))
    for _ in range(runs):
        once()
    if not layer_times:
        raise AgentError(
            "profile", "the profiler reported no layer times after %d runs" % runs, log=log.tail()
        )
    records = profile_records(order, layer_times)
    write_atomic(args.exportProfile, json.dumps(records, indent=1).encode("utf-8"))
    return dict(timed, profile_json=args.exportProfile, profile_runs=runs, profiled_layers=len(order))


def profile_records(order, layer_times, runs=None):
    """Per-layer times in trtexec's ``--exportProfile`` shape, so one report parser reads both backends.

    ``count`` is the number of profiled runs: the most reports any layer received (a layer that only
    runs sometimes, inside a conditional, gets fewer), unless ``runs`` says otherwise.
    """
    if runs is None:
        runs = max((len(v) for v in layer_times.values()), default=0)
    total = sum(sum(v) for v in layer_times.values()) or 1.0
    records = [{"count": runs}]
    for name in order:
        times = sorted(layer_times[name])
        records.append(
            {
                "name": name,
                "timeMs": sum(times),
                "averageMs": sum(times) / len(times),
                "medianMs": times[len(times) // 2],
                "percentage": 100.0 * sum(times) / total,
            }
        )
    return records
