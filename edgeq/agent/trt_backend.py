"""Backend ``python``: the only module that imports TensorRT (8.6) and a CUDA binding (cuda-python or
pycuda when installed, else libcudart through ctypes, which JetPack always has).

Every TensorRT call here is checked against the TensorRT 8.5/8.6 Python bindings
(NVIDIA/TensorRT ``python/src/infer/pyCore.cpp``, ``pyInt8.cpp``, ``parsers/pyOnnx.cpp``) and the
8.6 Python API reference; the comment next to a call names what it relies on. Only the I/O tensor API
of 8.5+ is used (``num_io_tensors``, ``get_tensor_*``, ``set_tensor_address``,
``execute_async_v3``): the binding-index API (``get_binding_shape``, ``get_binding_dtype``, ...) is
deprecated since 8.5 (pyCore.cpp wraps it in ``utils::deprecateMember``), ``execute_async_v2`` is gone
in TensorRT 10, and a tensor bound by name cannot land in the wrong slot of a bindings list.

Imports are lazy: ``load_tensorrt`` turns a missing or broken installation into a structured
``AgentError(stage="import")`` so ``probe`` reports it as data. numpy is never needed: buffer sizes
come from ``DataType.itemsize`` (8.6 Python API, ``tensorrt.DataType``).

Engines are built for static input shapes (``edgeq lint`` flags dynamic shapes without a profile).
"""

import contextlib
import json
import os
import re
import time

from .common import AgentError, load_libcudart, percentiles

# ILogger.Severity values (pyCore.cpp binds kINTERNAL_ERROR..kVERBOSE as 0..4, py::arithmetic), named
# here so log lines read "[ERROR] ..." whatever pybind11 version built the bindings (``.name`` on an
# enum member only exists from pybind11 2.6).
_SEVERITY = {0: "INTERNAL_ERROR", 1: "ERROR", 2: "WARNING", 3: "INFO", 4: "VERBOSE"}

# Bytes per element by DataType member name, for bindings whose DataType lacks ``itemsize``.
# 8.6 members: FLOAT, HALF, INT8, INT32, BOOL, UINT8, FP8 (8.6.1 Python API, ``tensorrt.DataType``).
_ITEMSIZE = {"FLOAT": 4, "HALF": 2, "INT8": 1, "INT32": 4, "BOOL": 1, "UINT8": 1, "FP8": 1}

# Calibration cache header ``TRT-<version>-<algorithm>`` (edgeq/quant/cache.py writes it): the
# calibrator class must match the algorithm, or TensorRT ignores the cache and asks for batches.
_CACHE_HEADER = re.compile(r"^TRT-(\d+)-([A-Za-z0-9]+)$")
_CALIBRATORS = {
    "EntropyCalibration2": "IInt8EntropyCalibrator2",
    "EntropyCalibration": "IInt8EntropyCalibrator",
    "MinMaxCalibration": "IInt8MinMaxCalibrator",
}


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


def version_number(version):
    """``"8.6.2.3"`` -> 8602, TensorRT's NV_TENSORRT_VERSION form (major*1000 + minor*100 + patch),
    the number in trtexec's ``[TensorRT v8602]`` banner and in calibration cache headers."""
    parts = [int(p) for p in re.findall(r"\d+", str(version))[:3]]
    parts += [0] * (3 - len(parts))
    return parts[0] * 1000 + parts[1] * 100 + parts[2]


def severity_name(severity):
    try:
        return _SEVERITY.get(int(severity), str(severity))
    except (TypeError, ValueError):
        return str(severity)


def _logger(trt, log, verbose=False):
    """An ILogger that streams TensorRT's messages into the agent log (and the error's log lines).

    ``log`` must not raise: the 8.5+ bindings catch an exception thrown by a Python ``log`` and only
    print "[ERROR] Exception caught in log()" (pyCore.cpp, ``PyLogger``), so it would be lost.
    """
    limit = 4 if verbose else 3  # VERBOSE or INFO

    class _Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)  # required for a Python ILogger (Python API, ILogger)

        def log(self, severity, msg):
            try:
                level = int(severity)
            except (TypeError, ValueError):
                level = 0
            if level <= limit:
                log.write("[%s] %s" % (severity_name(severity), msg))

    return _Logger()


def _first_error(log, default, since=0):
    """The first TensorRT error logged since ``since`` (a ``log.mark()``), without its "[ERROR] "."""
    errors = log.errors(since)
    return errors[0].split("] ", 1)[-1] if errors else default


def _builder(trt, logger, log):
    """``trt.Builder(logger)`` initialises CUDA: no GPU or a driver mismatch fails here."""
    try:
        builder = trt.Builder(logger)
    except Exception as e:
        raise AgentError(
            "cuda",
            "TensorRT %s is installed but cannot create a Builder: %s" % (trt.__version__, e),
            log=log.tail(),
        ) from None
    if builder is None:  # createInferBuilder returned nullptr
        raise AgentError("cuda", _first_error(log, "cannot create a TensorRT Builder"), log=log.tail())
    return builder


def probe(log):
    trt = load_tensorrt()
    facts = {"version": trt.__version__}
    logger = _logger(trt, log)  # Builder keeps it alive (pyCore.cpp: py::keep_alive<1, 2>)
    try:
        builder = _builder(trt, logger, log)
    except AgentError as e:
        e.details = dict(e.details, tensorrt=facts)
        raise
    facts["num_DLA_cores"] = builder.num_DLA_cores
    facts["platform_has_fast_int8"] = builder.platform_has_fast_int8
    facts["platform_has_fast_fp16"] = builder.platform_has_fast_fp16
    return facts


# ---------------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------------


def cache_for_tensorrt(data, version):
    """(calibrator class name, cache bytes) for replaying ``data`` on TensorRT ``version``.

    The scales in a cache do not depend on the TensorRT release, but its header names one
    (``TRT-8600-EntropyCalibration2``), and TensorRT skips a cache it finds incompatible (a TensorRT
    maintainer, NVIDIA/TensorRT#1378). edgeq writes 8.6.0 headers; JetPack 6 runs 8.6.2. So the
    version field is set to the running TensorRT, and the calibrator is the class the algorithm names.
    """
    text = data.decode("utf-8", "replace")
    first, sep, rest = text.partition("\n")
    m = _CACHE_HEADER.match(first.strip())
    if not m:
        raise AgentError(
            "input",
            "calibration cache header %r is not TRT-<version>-<algorithm>" % first.strip()[:60],
        )
    algorithm = m.group(2)
    if algorithm not in _CALIBRATORS:
        raise AgentError(
            "input",
            "calibration cache algorithm %r: expected one of %s"
            % (algorithm, ", ".join(sorted(_CALIBRATORS))),
        )
    # UNVERIFIED (8.6): that TensorRT compares the header's version field at all, and that 8.6.2 expects
    # "TRT-8602-..." (the NV_TENSORRT_VERSION number trtexec prints). Matching it is harmless either way.
    header = "TRT-%d-%s" % (version_number(version), algorithm)
    return _CALIBRATORS[algorithm], (header + sep + rest).encode("utf-8")


def _cache_calibrator(trt, class_name, cache):
    """A calibrator that only replays a calibration cache (implicit INT8 without data).

    TensorRT reads the cache first (``read_calibration_cache``: bytes or None, pyInt8.cpp); when it
    accepts it, it never asks for batches. ``get_batch`` returning None (pyInt8.cpp: None -> false,
    "no more batches") makes a rejected cache fail the build loudly instead of calibrating on nothing.
    ``get_batch_size`` is 1: explicit-batch networks take the batch from the input shapes.
    """
    base = getattr(trt, class_name)

    class CacheCalibrator(base):
        def __init__(self):
            base.__init__(self)
            self.asked_for_batches = False

        def get_batch_size(self):
            return 1

        def get_batch(self, names):
            self.asked_for_batches = True
            return None

        def read_calibration_cache(self):
            return cache

        def write_calibration_cache(self, data):
            return None

    return CacheCalibrator()


def _tactic_mask(trt, current, entries):
    """``["-CUBLAS", "+CUDNN"]`` applied to the config's mask: bit ``1 << int(TacticSource.X)``
    (Python API, ``IBuilderConfig.set_tactic_sources``; Polygraphy ``backend/trt/util.py`` reads
    the mask the same way)."""
    mask = int(current)
    for entry in entries:
        bit = 1 << int(getattr(trt.TacticSource, entry[1:]))
        mask = (mask | bit) if entry[0] == "+" else (mask & ~bit)
    return mask


def _write_atomic(path, data):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise AgentError("output", "cannot write %s: %s" % (path, e.strerror or e)) from None


def _parser_error(err):
    """An onnx ``ParserError`` as one line: what failed, where. ``desc()``, ``node()`` (-1 when not
    tied to a node) and ``code()`` are its methods (parsers/pyOnnx.cpp)."""
    try:
        node = int(err.node())
        where = " (ONNX node %d)" % node if node >= 0 else ""
        return "%s: %s%s" % (err.code(), err.desc(), where)
    except Exception:
        return str(err)


def _timing_cache(trt, config, path, log):
    """Load ``path`` into the config's timing cache; a cache TensorRT refuses is replaced, not fatal.

    ``create_timing_cache(bytes)`` and ``set_timing_cache(cache, ignore_mismatch) -> bool``: pyCore.cpp.
    ``ignore_mismatch=False``: a cache from another GPU or TensorRT build must not be used (the C++
    docs: combining caches of different devices "may lead to functional/performance bugs").
    """
    blob = b""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            blob = f.read()
    info = {"path": path, "loaded_bytes": len(blob), "reused": False}
    mark = log.mark()
    cache = config.create_timing_cache(blob) if blob else None
    if cache is not None and config.set_timing_cache(cache, False) and not log.errors(mark):
        info["reused"] = True
        return cache, info
    if blob:
        # 8.6.1 logs "Error Code 1: Serialization (... Magic tag does not match)" and "The timing cache
        # will not be used!" for an unreadable cache and goes on (NVIDIA/TensorRT#3566).
        # UNVERIFIED (8.6): whether create_timing_cache then returns None or a usable empty cache, and
        # whether set_timing_cache returns False for another GPU's cache; all three cases end here.
        log.write("[WARNING] edgeq: timing cache %s was not accepted; starting an empty one" % path)
    cache = config.create_timing_cache(b"")
    if cache is None or not config.set_timing_cache(cache, False):
        raise AgentError("build", _first_error(log, "cannot create an empty timing cache"), log=log.tail())
    return cache, info


def build(args, log, tactic_sources):
    trt = load_tensorrt()
    logger = _logger(trt, log, getattr(args, "verbose", False))
    builder = _builder(trt, logger, log)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, logger)
    # parse_from_file (not parse(bytes)): the parser then finds external weight files next to the model.
    if not parser.parse_from_file(args.onnx):
        errors = [_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
        message = errors[0] if errors else _first_error(log, "the ONNX parser failed on %s" % args.onnx)
        raise AgentError("parse", message, log=log.tail() + errors)

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
    calibrator = None
    if args.int8:
        config.set_flag(trt.BuilderFlag.INT8)
        if has_qdq:
            mode = "explicit-int8"
            if args.calib:
                log.write("[WARNING] edgeq: the model has Q/DQ nodes (explicit INT8): --calib is ignored")
        elif args.calib:
            with open(args.calib, "rb") as f:
                original = f.read()
            class_name, cache = cache_for_tensorrt(original, trt.__version__)
            before = original.decode("utf-8", "replace").split("\n", 1)[0].strip()
            after = cache.decode("utf-8").split("\n", 1)[0]
            if before != after:
                log.write("[INFO] edgeq: calibration cache %s replayed as %s" % (before, after))
            calibrator = _cache_calibrator(trt, class_name, cache)
            config.int8_calibrator = calibrator  # config keeps it alive (pyCore.cpp: py::keep_alive<1, 2>)
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
    mask = _tactic_mask(trt, config.get_tactic_sources(), tactic_sources) if tactic_sources else None
    if mask is not None and not config.set_tactic_sources(mask):  # returns bool (pyCore.cpp)
        raise AgentError(
            "build", _first_error(log, "TensorRT refused tactic sources %s" % ",".join(tactic_sources))
        )
    if args.useDLACore is not None:
        cores = builder.num_DLA_cores
        if int(args.useDLACore) >= cores:
            raise AgentError(
                "build",
                "DLA core %d requested, but this device has %d DLA core(s)" % (int(args.useDLACore), cores),
                details={"num_DLA_cores": cores},
            )
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = int(args.useDLACore)
        if args.allowGPUFallback:
            config.set_flag(trt.BuilderFlag.GPU_FALLBACK)

    cache_info = None
    if args.timingCacheFile:
        _cache, cache_info = _timing_cache(trt, config, args.timingCacheFile, log)

    started = time.monotonic()
    mark = log.mark()
    serialized = builder.build_serialized_network(network, config)  # IHostMemory, or None on failure
    elapsed = time.monotonic() - started
    if serialized is None:
        message = _first_error(log, "build_serialized_network returned no engine", mark)
        if calibrator is not None and calibrator.asked_for_batches:
            message += " (TensorRT did not accept the calibration cache %s and asked for data)" % args.calib
        raise AgentError("build", message, log=log.tail())
    _write_atomic(args.saveEngine, bytes(serialized))  # IHostMemory has the buffer protocol
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


def _load_engine(trt, logger, log, path, dla_core, stage):
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
        raise AgentError(stage, _first_error(log, default, mark), log=log.tail())
    return runtime, engine


def _context(engine, log, stage):
    mark = log.mark()
    context = engine.create_execution_context()  # None when device memory cannot be allocated
    if context is None:
        raise AgentError(stage, _first_error(log, "cannot create an execution context", mark), log=log.tail())
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
    _write_atomic(path, text.encode("utf-8", "surrogateescape"))
    return {
        "layers_json": path,
        "layers": len(layers),
        # Names only (strings) when the engine was not built with ProfilingVerbosity.DETAILED.
        "detailed": bool(layers) and all(isinstance(x, dict) for x in layers),
        "tensorrt": version,
    }


def inspect(args, log):
    trt = load_tensorrt()
    logger = _logger(trt, log, getattr(args, "verbose", False))
    _runtime, engine = _load_engine(trt, logger, log, args.loadEngine, args.useDLACore, "inspect")
    inspector = engine.create_engine_inspector()
    # With an execution context set, the inspector also prints the formats of shape-dependent tensors
    # (C++ IEngineInspector::setExecutionContext). The Python property is ``execution_context`` in the
    # 8.x bindings (pyCore.cpp), whatever the 8.5 docs page calls it; it holds a raw pointer, so
    # ``context`` stays referenced until the information has been read.
    context = _context(engine, log, "inspect")
    inspector.execution_context = context
    try:
        text = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
    except UnicodeDecodeError as e:  # pybind11 decodes the C string as strict UTF-8
        raise AgentError(
            "inspect",
            "the engine inspector's JSON is not UTF-8 (%s)" % e,
            details={"hint": "use backend: trtexec, which writes the bytes as they are"},
        ) from None
    return layer_info_result(text, args.exportLayerInfo, trt.__version__)


class _CudaPython:
    """cuda-python's runtime API: calls return ``(cudaError_t, value...)`` tuples (TensorRT 8.6
    samples/python/common.py checks ``err != cudart.cudaError_t.cudaSuccess`` the same way)."""

    name = "cuda-python"

    def __init__(self):
        try:
            from cuda import cudart  # cuda-python 11.x/12.x
        except ImportError:
            from cuda.bindings import runtime as cudart  # cuda-python 12.6+ (``cuda.cudart`` gone in 13)
        self._rt = cudart
        try:
            err, self._stream = cudart.cudaStreamCreate()
        except Exception as e:  # a cuda-python built for another CUDA than the driver's
            raise AgentError("cuda", "cuda-python cannot create a stream: %s" % (e,)) from None
        self._check(err, "cudaStreamCreate")
        self.handle = int(self._stream)

    def _check(self, err, what):
        if err != self._rt.cudaError_t.cudaSuccess:
            raise AgentError("cuda", "%s failed: %s" % (what, err))

    def alloc(self, nbytes):
        err, ptr = self._rt.cudaMalloc(nbytes)
        self._check(err, "cudaMalloc(%d)" % nbytes)
        (err,) = self._rt.cudaMemset(ptr, 0, nbytes)
        self._check(err, "cudaMemset")
        return int(ptr)

    def sync(self):
        (err,) = self._rt.cudaStreamSynchronize(self._stream)
        self._check(err, "cudaStreamSynchronize")


class _PyCuda:
    """pycuda's driver API. ``autoprimaryctx`` (pycuda >= 2021.1) retains and pushes the device's
    primary context, the one TensorRT's runtime API uses; older pycuda only has ``autoinit``, which
    pushes a context of its own that TensorRT then uses too (it is current before the Runtime exists)."""

    name = "pycuda"

    def __init__(self):
        try:
            try:
                import pycuda.autoprimaryctx  # retains and pushes the primary context
            except ImportError:
                import pycuda.autoinit  # noqa: F401 - creates and pushes a context of its own
            import pycuda.driver as cuda
        except ImportError:
            raise
        except Exception as e:  # pycuda._driver.Error: cuInit failed, no device
            raise AgentError("cuda", "pycuda cannot initialise CUDA: %s" % (e,)) from None
        self._cuda = cuda
        self._keep = []
        self._stream = cuda.Stream()
        self.handle = int(self._stream.handle)

    def alloc(self, nbytes):
        buf = self._cuda.mem_alloc(nbytes)
        self._cuda.memset_d8(buf, 0, nbytes)
        self._keep.append(buf)  # a DeviceAllocation frees its memory when collected
        return int(buf)

    def sync(self):
        self._stream.synchronize()


class _LibCudart:
    """The CUDA runtime library itself through ctypes: JetPack installs libcudart with TensorRT, but
    neither cuda-python nor pycuda. Signatures: CUDA Runtime API (``cudaMalloc(void**, size_t)``, ...)."""

    name = "libcudart"

    def __init__(self):
        import ctypes

        lib = load_libcudart()
        c_int, c_size_t, c_void_p, ptr_t = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER
        for fn, args in (
            ("cudaStreamCreate", [ptr_t(c_void_p)]),
            ("cudaMalloc", [ptr_t(c_void_p), c_size_t]),
            ("cudaMemset", [c_void_p, c_int, c_size_t]),
            ("cudaStreamSynchronize", [c_void_p]),
        ):
            getattr(lib, fn).argtypes = args
            getattr(lib, fn).restype = c_int
        lib.cudaGetErrorName.argtypes = [c_int]
        lib.cudaGetErrorName.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        self._ct = ctypes
        self._lib = lib
        self._stream = c_void_p()
        self._check(lib.cudaStreamCreate(ctypes.byref(self._stream)), "cudaStreamCreate")
        self.handle = int(self._stream.value or 0)

    def _check(self, err, what):
        if err != 0:  # cudaSuccess
            name = (self._lib.cudaGetErrorName(err) or b"?").decode("ascii", "replace")
            text = (self._lib.cudaGetErrorString(err) or b"").decode("utf-8", "replace")
            raise AgentError("cuda", "%s failed: %s (%s)" % (what, name, text))

    def alloc(self, nbytes):
        ptr = self._ct.c_void_p()
        self._check(self._lib.cudaMalloc(self._ct.byref(ptr), nbytes), "cudaMalloc(%d)" % nbytes)
        self._check(self._lib.cudaMemset(ptr, 0, nbytes), "cudaMemset")
        return int(ptr.value)

    def sync(self):
        self._check(self._lib.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")


def open_cuda():
    """Device buffers and a stream from the first CUDA binding that imports: cuda-python, pycuda, or
    libcudart through ctypes. Call it BEFORE creating the TensorRT Runtime, so the engine and the
    buffers live in one CUDA context (each of the three makes the primary context current, except
    pycuda's ``autoinit``, whose context TensorRT then uses too)."""
    errors = []
    for cls in (_CudaPython, _PyCuda, _LibCudart):
        try:
            return cls()
        except ImportError as e:
            errors.append("%s: %s" % (cls.name, e))
    raise AgentError(
        "import",
        "no CUDA runtime to allocate the engine's buffers (tried cuda-python, pycuda, libcudart)",
        details={"hint": "pip install cuda-python, or use backend: trtexec", "errors": errors},
    )


def _itemsize(dtype):
    size = getattr(dtype, "itemsize", None)  # DataType.itemsize (8.6.1 Python API)
    if isinstance(size, int) and size > 0:
        return size
    name = getattr(dtype, "name", None) or str(dtype).rsplit(".", 1)[-1]
    if name not in _ITEMSIZE:
        raise AgentError("profile", "unknown TensorRT data type %s" % (dtype,))
    return _ITEMSIZE[name]


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


def _bind_tensors(trt, engine, context, cuda):
    """Allocate every I/O tensor and bind it with ``set_tensor_address`` (8.5+ API)."""
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        shape = list(engine.get_tensor_shape(name))
        if any(int(d) < 0 for d in shape):
            kind = "input" if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else "output"
            raise AgentError(
                "profile",
                "%s %r has a dynamic shape %s; export the model with static shapes "
                "or use backend: trtexec with --shapes" % (kind, name, shape),
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
    logger = _logger(trt, log, getattr(args, "verbose", False))
    cuda = open_cuda()  # before the Runtime: one CUDA context for the engine and the buffers
    _runtime, engine = _load_engine(trt, logger, log, args.loadEngine, args.useDLACore, "profile")
    context = _context(engine, log, "profile")
    _bind_tensors(trt, engine, context, cuda)

    def once():
        mark = log.mark()
        if not context.execute_async_v3(cuda.handle):  # stream handle as an int (pyCore.cpp: size_t)
            raise AgentError("profile", _first_error(log, "execute_async_v3 failed", mark), log=log.tail())
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
    _write_atomic(args.exportProfile, json.dumps(records, indent=1).encode("utf-8"))
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
