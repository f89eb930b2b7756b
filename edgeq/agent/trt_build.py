"""``build`` for backend ``python``: an ONNX model parsed and built into a serialized engine with the
TensorRT Python API (precision flags, calibration cache, tactic sources, DLA, timing cache).

Its own module because building shares nothing with loading or timing an engine but the
``trt_common`` plumbing; replaying a calibration cache is in ``trt_calibrator``.
"""

import os
import time

from .common import AgentError
from .shapes import profile_shapes
from .trt_calibrator import cache_calibrator, cache_for_tensorrt
from .trt_common import create_builder, first_error, load_tensorrt, make_logger, write_atomic


def _tactic_mask(trt, current, entries):
    """``["-CUBLAS", "+CUDNN"]`` applied to the config's mask: bit ``1 << int(TacticSource.X)``
    (Python API, ``IBuilderConfig.set_tactic_sources``; Polygraphy ``backend/trt/util.py`` reads
    the mask the same way)."""
    mask = int(current)
    for entry in entries:
        bit = 1 << int(getattr(trt.TacticSource, entry[1:]))
        mask = (mask | bit) if entry[0] == "+" else (mask & ~bit)
    return mask


def _parser_error(err):
    """An onnx ``ParserError`` as one line: what failed, where. ``desc()``, ``node()`` (-1 when not
    tied to a node) and ``code()`` are its methods (parsers/pyOnnx.cpp)."""
    try:
        node = int(err.node())
        where = " (ONNX node %d)" % node if node >= 0 else ""
        return "%s: %s%s" % (err.code(), err.desc(), where)
    except Exception:
        return str(err)


def _optimization_profile(builder, config, network, args, calibrator, log):
    """The one optimization profile of a network with dynamic input dimensions, from ``--minShapes``/
    ``--optShapes``/``--maxShapes`` (``shapes.profile_shapes`` checks them against the parsed inputs);
    without it 8.6 refuses the build ("Network has dynamic or shape inputs, but no optimization profile
    has been defined"). Implicit INT8 calibrates at the same profile (``set_calibration_profile``: a
    replayed cache asks for no batch, but the builder wants the shapes). None for a static network.

    ``create_optimization_profile``, ``IOptimizationProfile.set_shape(name, min, opt, max)``,
    ``add_optimization_profile`` (-1 when the profile is invalid), ``set_calibration_profile``: pyCore.cpp.
    """
    tensors = [network.get_input(i) for i in range(network.num_inputs)]
    inputs = [(t.name, tuple(t.shape)) for t in tensors]
    if not any(d < 0 for _, dims in inputs for d in dims) and not (args.minShapes or args.optShapes):
        return None
    try:
        shapes = profile_shapes(inputs, args.minShapes, args.optShapes, args.maxShapes,
                                os.path.basename(args.onnx))
    except ValueError as e:
        raise AgentError("input", str(e)) from None
    if not shapes:
        return None
    profile = builder.create_optimization_profile()
    for name, lo, mid, hi in shapes:
        profile.set_shape(name, lo, mid, hi)
    if config.add_optimization_profile(profile) < 0:
        message = first_error(log, "TensorRT refused the optimization profile")
        raise AgentError("build", message, log=log.tail())
    if calibrator is not None:
        config.set_calibration_profile(profile)
    return profile


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
        # Measured (8.6.0, an H100, a YOLOX mirror after its implicit build had written the cache): a
        # refused cache logged "Myelin error from unknown graph", then the empty one was refused with the
        # same error. trtexec builds on in that state (its logs in the corpus: "The timing cache will not
        # be used!", then PASSED); so does the agent, with no cache of its own, and saves none.
        log.write("[WARNING] edgeq: TensorRT refused an empty timing cache too; building without one")
        info["disabled"] = True
        return None, info
    return cache, info


def build(args, log, tactic_sources):
    trt = load_tensorrt()
    logger = make_logger(trt, log, getattr(args, "verbose", False))
    builder = create_builder(trt, logger, log)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, logger)
    # parse_from_file (not parse(bytes)): the parser then finds external weight files next to the model.
    if not parser.parse_from_file(args.onnx):
        errors = [_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
        message = errors[0] if errors else first_error(log, "the ONNX parser failed on %s" % args.onnx)
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
            calibrator = cache_calibrator(trt, class_name, cache)
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
            "build", first_error(log, "TensorRT refused tactic sources %s" % ",".join(tactic_sources))
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

    _optimization_profile(builder, config, network, args, calibrator, log)
    cache_info = None
    if args.timingCacheFile:
        _cache, cache_info = _timing_cache(trt, config, args.timingCacheFile, log)

    started = time.monotonic()
    mark = log.mark()
    serialized = builder.build_serialized_network(network, config)  # IHostMemory, or None on failure
    elapsed = time.monotonic() - started
    if serialized is None:
        message = first_error(log, "build_serialized_network returned no engine", mark)
        if calibrator is not None and calibrator.asked_for_batches:
            message += " (TensorRT did not accept the calibration cache %s and asked for data)" % args.calib
        raise AgentError("build", message, log=log.tail())
    write_atomic(args.saveEngine, bytes(serialized))  # IHostMemory has the buffer protocol
    if cache_info is not None and not cache_info.get("disabled"):
        data = bytes(config.get_timing_cache().serialize())
        write_atomic(args.timingCacheFile, data)
        cache_info["saved_bytes"] = len(data)
    return {
        "engine": args.saveEngine,
        "engine_bytes": os.path.getsize(args.saveEngine),
        "build_seconds": round(elapsed, 3),
        "mode": mode,
        "tensorrt": trt.__version__,
        "timing_cache": cache_info,
    }
