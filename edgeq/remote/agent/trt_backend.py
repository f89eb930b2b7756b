"""Backend ``python``: the only module that imports TensorRT (8.6) and a CUDA binding.

Every TensorRT call here follows the TensorRT 8.6 Python API reference (Builder, OnnxParser,
IBuilderConfig, IInt8EntropyCalibrator2, Runtime, EngineInspector, IExecutionContext, IProfiler).
Imports are lazy: ``load_tensorrt`` turns a missing or broken installation into a structured
``AgentError(stage="import")`` so ``probe`` reports it as data.

Engines are built for static input shapes (``edgeq lint`` flags dynamic shapes without a profile).
"""

import json
import os
import time

from .common import AgentError, percentiles

# Bytes per element for TensorRT 8.6 DataType members (no numpy on the target).
_ITEMSIZE = {"FLOAT": 4, "HALF": 2, "INT8": 1, "INT32": 4, "BOOL": 1, "UINT8": 1, "FP8": 1}


def load_tensorrt():
    try:
        import tensorrt as trt
    except Exception as e:  # ImportError, or a library load failure (libnvinfer.so missing) raised as OSError
        raise AgentError(
            "import",
            "TensorRT not available: %s" % (e,),
            details={
                "hint": "install JetPack's python3-libnvinfer (or the tensorrt 8.6 wheel) for this Python, "
                "or use backend: trtexec"
            },
        ) from None
    return trt


def _logger(trt, log, verbose=False):
    """An ILogger that streams TensorRT's messages into the agent log (and the error's log lines)."""
    limit = trt.ILogger.Severity.VERBOSE if verbose else trt.ILogger.Severity.INFO

    class _Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            if int(severity) <= int(limit):
                log.write("[%s] %s" % (getattr(severity, "name", str(severity)), msg))

    return _Logger()


def _first_error(log, default):
    errors = log.errors()
    return errors[0].split("] ", 1)[-1] if errors else default


def probe(log):
    trt = load_tensorrt()
    facts = {"version": trt.__version__}
    logger = _logger(trt, log)  # referenced for the builder's lifetime (TensorRT keeps a pointer)
    try:
        builder = trt.Builder(logger)
    except Exception as e:  # no GPU / driver mismatch: Builder creation initialises CUDA
        raise AgentError(
            "cuda",
            "TensorRT %s is installed but cannot create a Builder: %s" % (trt.__version__, e),
            log=log.tail(),
            details={"tensorrt": facts},
        ) from None
    facts["num_DLA_cores"] = builder.num_DLA_cores
    facts["platform_has_fast_int8"] = builder.platform_has_fast_int8
    facts["platform_has_fast_fp16"] = builder.platform_has_fast_fp16
    return facts


# ---------------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------------


def _cache_calibrator(trt, cache_path):
    """An entropy calibrator 2 that only replays a calibration cache (implicit INT8 without data).

    TensorRT reads the cache first; when its header matches (``TRT-8600-EntropyCalibration2``) it never
    asks for batches. ``get_batch`` returning None makes a mismatched cache fail loudly instead of
    calibrating on nothing.
    """

    class CacheCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self):
            trt.IInt8EntropyCalibrator2.__init__(self)
            with open(cache_path, "rb") as f:
                self._cache = f.read()

        def get_batch_size(self):
            return 1

        def get_batch(self, names):
            return None

        def read_calibration_cache(self):
            return self._cache

        def write_calibration_cache(self, cache):
            return None

    return CacheCalibrator()


def _tactic_mask(trt, current, entries):
    mask = int(current)
    for entry in entries:
        bit = 1 << int(getattr(trt.TacticSource, entry[1:]))
        mask = (mask | bit) if entry[0] == "+" else (mask & ~bit)
    return mask


def _write_atomic(path, data):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _parser_error(err):
    """An IParserError as one line: its description and the failing node's index."""
    try:
        return "%s (ONNX node %d, %s)" % (err.desc(), err.node(), err.code())
    except Exception:
        return str(err)


def build(args, log, tactic_sources):
    trt = load_tensorrt()
    logger = _logger(trt, log)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(args.onnx):
        errors = [_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
        raise AgentError("parse", errors[0] if errors else "the ONNX parser failed", log=errors + log.tail())

    config = builder.create_builder_config()
    if args.workspace:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(args.workspace) << 20)
    # DETAILED: the engine inspector then lists each layer's fused ONNX nodes, formats and precisions.
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED

    has_qdq = any(
        network.get_layer(i).type in (trt.LayerType.QUANTIZE, trt.LayerType.DEQUANTIZE)
        for i in range(network.num_layers)
    )
    mode = "fp32"
    if args.int8:
        config.set_flag(trt.BuilderFlag.INT8)
        if has_qdq:
            mode = "explicit-int8"
        elif args.calib:
            # Keep the calibrator referenced until the build is done: TensorRT holds only a pointer, and
            # a collected Python calibrator crashes the builder.
            calibrator = _cache_calibrator(trt, args.calib)
            config.int8_calibrator = calibrator
            mode = "implicit-int8"
        else:
            raise AgentError(
                "build",
                "implicit INT8 needs a calibration cache: the model has no Q/DQ nodes and no --calib given",
                log=log.tail(),
            )
    if args.fp16:
        config.set_flag(trt.BuilderFlag.FP16)
        if mode == "fp32":
            mode = "fp16"
    if tactic_sources:
        config.set_tactic_sources(_tactic_mask(trt, config.get_tactic_sources(), tactic_sources))
    if args.useDLACore is not None:
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = int(args.useDLACore)
        if args.allowGPUFallback:
            config.set_flag(trt.BuilderFlag.GPU_FALLBACK)

    cache_info = None
    if args.timingCacheFile:
        blob = b""
        if os.path.isfile(args.timingCacheFile):
            with open(args.timingCacheFile, "rb") as f:
                blob = f.read()
        cache = config.create_timing_cache(blob)
        config.set_timing_cache(cache, ignore_mismatch=False)
        cache_info = {"path": args.timingCacheFile, "loaded_bytes": len(blob)}

    started = time.monotonic()
    serialized = builder.build_serialized_network(network, config)
    elapsed = time.monotonic() - started
    if serialized is None:
        raise AgentError(
            "build", _first_error(log, "build_serialized_network returned no engine"), log=log.tail()
        )
    _write_atomic(args.saveEngine, bytes(serialized))
    if cache_info is not None:
        data = bytes(config.get_timing_cache().serialize())
        _write_atomic(args.timingCacheFile, data)
        cache_info["saved_bytes"] = len(data)
    return {
        "engine": args.saveEngine,
        "engine_bytes": os.path.getsize(args.saveEngine),
        "build_seconds": round(elapsed, 3),
        "mode": mode,
        "tensorrt": trt.__version__,
        "timing_cache": cache_info,
    }


# ---------------------------------------------------------------------------------------------------
# inspect / profile
# ---------------------------------------------------------------------------------------------------


def _load_engine(trt, logger, path, dla_core, stage):
    runtime = trt.Runtime(logger)
    if dla_core is not None:
        runtime.DLA_core = int(dla_core)
    with open(path, "rb") as f:
        engine = runtime.deserialize_cuda_engine(f.read())
    if engine is None:
        raise AgentError(stage, "cannot deserialize %s (built by another TensorRT version or GPU?)" % path)
    return runtime, engine


def inspect(args, log):
    trt = load_tensorrt()
    logger = _logger(trt, log)
    _runtime, engine = _load_engine(trt, logger, args.loadEngine, args.useDLACore, "inspect")
    inspector = engine.create_engine_inspector()
    # With an execution context set, the inspector also prints formats of shape-dependent tensors
    # (IEngineInspector::setExecutionContext); the attribute is "context" in 8.x Python.
    context = engine.create_execution_context()
    for attr in ("context", "execution_context") if context is not None else ():
        try:
            setattr(inspector, attr, context)
            break
        except (AttributeError, TypeError):
            continue
    text = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
    _write_atomic(args.exportLayerInfo, text.encode("utf-8", "surrogateescape"))
    info = json.loads(text, strict=False)
    return {
        "layers_json": args.exportLayerInfo,
        "layers": len(info.get("Layers", [])),
        "tensorrt": trt.__version__,
    }


class _Cuda:
    """Device buffers and a stream through pycuda, or cuda-python when pycuda is absent."""

    def __init__(self):
        try:
            import pycuda.autoinit  # noqa: F401 - creates the context
            import pycuda.driver as cuda

            self._pycuda = cuda
            self.stream = cuda.Stream()
            self.handle = self.stream.handle
            self._keep = []
            return
        except ImportError:
            self._pycuda = None
        try:
            from cuda import cudart
        except ImportError:
            raise AgentError(
                "import",
                "neither pycuda nor cuda-python is installed (needed to time the engine)",
                details={"hint": "pip install pycuda, or use backend: trtexec"},
            ) from None
        self._cudart = cudart
        err, self.stream = cudart.cudaStreamCreate()
        self._check(err, "cudaStreamCreate")
        self.handle = int(self.stream)
        self._ptrs = []

    def _check(self, err, what):
        if int(err) != 0:
            raise AgentError("profile", "%s failed: %s" % (what, err))

    def alloc(self, nbytes):
        if self._pycuda is not None:
            buf = self._pycuda.mem_alloc(max(1, nbytes))
            self._keep.append(buf)
            return int(buf)
        err, ptr = self._cudart.cudaMalloc(max(1, nbytes))
        self._check(err, "cudaMalloc")
        self._ptrs.append(ptr)
        return int(ptr)

    def sync(self):
        if self._pycuda is not None:
            self.stream.synchronize()
        else:
            (err,) = self._cudart.cudaStreamSynchronize(self.stream)
            self._check(err, "cudaStreamSynchronize")


def _bindings(trt, engine, cuda):
    ptrs = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        shape = list(engine.get_tensor_shape(name))
        if any(d < 0 for d in shape):
            raise AgentError(
                "profile",
                "input %r has a dynamic shape %s; export the model with static shapes "
                "or use backend: trtexec with --shapes" % (name, shape),
            )
        count = 1
        for d in shape:
            count *= d
        dtype = engine.get_tensor_dtype(name)
        ptrs.append(cuda.alloc(count * _ITEMSIZE.get(getattr(dtype, "name", ""), 4)))
    return ptrs


def profile(args, log):
    trt = load_tensorrt()
    logger = _logger(trt, log)
    _runtime, engine = _load_engine(trt, logger, args.loadEngine, args.useDLACore, "profile")
    cuda = _Cuda()
    context = engine.create_execution_context()
    bindings = _bindings(trt, engine, cuda)

    def once():
        if not context.execute_async_v2(bindings=bindings, stream_handle=cuda.handle):
            raise AgentError("profile", _first_error(log, "execute_async_v2 failed"), log=log.tail())
        cuda.sync()

    warm_until = time.perf_counter() + args.warmUp / 1000.0
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

    # Per-layer times in a separate run (as trtexec --separateProfileRun): the profiler synchronises
    # after every layer, so it must not be attached while end-to-end latency is measured.
    layer_times = {}
    order = []

    class _Profiler(trt.IProfiler):
        def __init__(self):
            trt.IProfiler.__init__(self)

        def report_layer_time(self, layer_name, ms):
            if layer_name not in layer_times:
                layer_times[layer_name] = []
                order.append(layer_name)
            layer_times[layer_name].append(ms)

    profiler = _Profiler()  # keep a Python reference: TensorRT holds only a pointer to it
    context.profiler = profiler
    runs = max(1, min(len(samples), 100))
    for _ in range(runs):
        if not context.execute_v2(bindings):
            raise AgentError("profile", _first_error(log, "execute_v2 failed"), log=log.tail())
    _write_atomic(
        args.exportProfile, json.dumps(profile_records(order, layer_times, runs), indent=1).encode()
    )
    return {
        "profile_json": args.exportProfile,
        "latency_ms": percentiles(samples),
        "throughput_qps": len(samples) / wall if wall > 0 else None,
        "iterations": len(samples),
        "wall_seconds": round(wall, 3),
        "profile_runs": runs,
        "tensorrt": trt.__version__,
    }


def profile_records(order, layer_times, runs):
    """Per-layer times in trtexec's ``--exportProfile`` shape, so one report parser reads both backends."""
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
