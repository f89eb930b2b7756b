"""Backend ``trtexec``: the same build/inspect/profile steps as the Python backend, through trtexec.

JetPack ships trtexec at /usr/src/tensorrt/bin/trtexec even where the TensorRT Python package is
missing. Flag names and syntax are trtexec 8.6's (samples/common/sampleOptions.cpp, release/8.6):
``--memPoolSize=workspace:<MiB>``, ``--tacticSources=-CUBLAS,+CUDNN``, ``--calib=<cache>`` (implicit
INT8 from a calibration cache), ``--useDLACore=N`` with ``--allowGPUFallback``, and
``--skipInference`` (which still writes ``--exportLayerInfo``). The argv builders are pure functions so
the host tests them without TensorRT.
"""

import json
import os
import re
import signal
import time

from .common import AgentError, run_tool
from .shapes import BUILD_FLAGS, parse_shapes

DEFAULT_TRTEXEC = "/usr/src/tensorrt/bin/trtexec"

# trtexec 8.6 --tacticSources library names (sampleOptions.cpp: lib ::= "CUBLAS"|"CUBLAS_LT"|"CUDNN"|
# "EDGE_MASK_CONVOLUTIONS"|"JIT_CONVOLUTIONS"); each entry is +NAME (enable) or -NAME (disable).
TACTIC_SOURCES = ("CUBLAS", "CUBLAS_LT", "CUDNN", "EDGE_MASK_CONVOLUTIONS", "JIT_CONVOLUTIONS")


def check_tactic_sources(entries):
    """Validate ``["-CUBLAS", "+CUDNN"]``-style entries; returns them normalised to upper case."""
    out = []
    for entry in entries or ():
        e = entry.strip()
        if len(e) < 2 or e[0] not in "+-" or e[1:].upper() not in TACTIC_SOURCES:
            raise ValueError(
                "tactic source %r: expected +NAME or -NAME with NAME one of %s"
                % (entry, ", ".join(TACTIC_SOURCES))
            )
        out.append(e[0] + e[1:].upper())
    return out


def build_argv(
    trtexec,
    onnx,
    engine,
    int8=False,
    fp16=False,
    calib=None,
    workspace_mib=None,
    tactic_sources=None,
    timing_cache=None,
    dla_core=None,
    allow_gpu_fallback=False,
    min_shapes=None,
    opt_shapes=None,
    max_shapes=None,
):
    """trtexec argv for ONNX -> engine.

    Explicit quantization (a Q/DQ model): ``--int8`` and no ``--calib``. Implicit quantization: ``--int8
    --calib=<cache>`` with the TensorRT calibration cache ``edgeq quantize`` writes. ``--fp16`` lets
    TensorRT fall back to FP16 where INT8 has no faster kernel. A model with dynamic input dimensions is
    built for one optimization profile: ``--minShapes``/``--optShapes``/``--maxShapes``, all three or none
    (trtexec alone would set every dynamic dimension to 1; the Python backend could not build at all).
    """
    if calib and not int8:
        raise ValueError("a calibration cache (--calib) only means something with --int8")
    if allow_gpu_fallback and dla_core is None:
        raise ValueError("--allowGPUFallback needs a DLA core (--useDLACore)")
    argv = [trtexec, "--onnx=" + onnx, "--saveEngine=" + engine]
    if int8:
        argv.append("--int8")
    if fp16:
        argv.append("--fp16")
    if calib:
        argv.append("--calib=" + calib)
    if workspace_mib is not None:
        if int(workspace_mib) <= 0:
            raise ValueError("workspace must be a positive number of MiB, got %r" % workspace_mib)
        argv.append("--memPoolSize=workspace:%d" % int(workspace_mib))
    sources = check_tactic_sources(tactic_sources)
    if sources:
        argv.append("--tacticSources=" + ",".join(sources))
    if timing_cache:
        argv.append("--timingCacheFile=" + timing_cache)
    argv += _dla_args(dla_core, allow_gpu_fallback)
    argv += shape_args(BUILD_FLAGS, (min_shapes, opt_shapes, max_shapes))
    # DETAILED so the engine inspector (and --exportLayerInfo) can name each layer's fused ONNX nodes.
    argv += ["--profilingVerbosity=detailed", "--skipInference"]
    return argv


def shape_args(flags, texts):
    """``--minShapes=...`` and its siblings, checked (trtexec syntax), all of ``flags`` or none."""
    given = [(f, t) for f, t in zip(flags, texts) if t]
    if given and len(given) != len(flags):
        missing = [f for f, t in zip(flags, texts) if not t]
        raise ValueError("--%s without --%s: give all of %s" % (given[0][0], "/--".join(missing),
                                                                 ", ".join("--" + f for f in flags)))
    for flag, text in given:
        parse_shapes(text, flag)
    return ["--%s=%s" % (f, t) for f, t in given]


def inspect_argv(trtexec, engine, layers_out, dla_core=None, shapes=None):
    """trtexec argv that loads an engine and writes the engine inspector's JSON, without timing it.

    With ``shapes`` (an engine with dynamic inputs): one inference at them instead of
    ``--skipInference``, since trtexec 8.6 prints the layer information before inference with no
    execution context, every format then "N/A due to dynamic shapes", and after setting up inference
    with the context at those shapes (trtexec.cpp, ``printLayerInfo``)."""
    run = (["--shapes=" + shapes, "--iterations=1", "--warmUp=0", "--duration=0"] if shapes
           else ["--skipInference"])
    return [
        trtexec,
        "--loadEngine=" + engine,
        *_dla_args(dla_core, False),
        "--profilingVerbosity=detailed",
        "--exportLayerInfo=" + layers_out,
        *run,
    ]


def profile_argv(
    trtexec,
    engine,
    profile_out,
    warmup_ms=200,
    iterations=10,
    duration_s=3,
    dla_core=None,
    times_out=None,
    no_data_transfers=False,
    shapes=None,
):
    """trtexec argv that times an engine: end-to-end latency in one run, per-layer times in a second
    (none without ``profile_out``: a re-timing needs only the first).

    ``--separateProfileRun`` keeps the per-layer profiler out of the latency run (the profiler
    synchronises after every layer and would inflate the latency figures). ``no_data_transfers``
    (``--noDataTransfers``): the engine alone, without the host<->device copies of its bindings.
    ``shapes`` (``--shapes``): the input shapes an engine with dynamic inputs is timed at.
    """
    if iterations is not None and int(iterations) < 1:
        raise ValueError("iterations must be >= 1")
    if duration_s is not None and float(duration_s) < 0:
        raise ValueError("duration must be >= 0 seconds")
    argv = [trtexec, "--loadEngine=" + engine, *_dla_args(dla_core, False)]
    argv += [
        "--warmUp=%d" % int(warmup_ms),
        "--iterations=%d" % int(iterations),
        "--duration=%g" % float(duration_s),
    ]
    argv += shape_args(("shapes",), (shapes,))
    if no_data_transfers:
        argv.append("--noDataTransfers")
    if profile_out:
        argv += ["--separateProfileRun", "--exportProfile=" + profile_out]
    if times_out:
        argv.append("--exportTimes=" + times_out)
    return argv


def infer_argv(trtexec, engine, inputs, output_json, dla_core=None, shapes=None):
    """trtexec argv that runs an engine once on the given input files and writes its outputs as JSON.

    ``inputs``: ``[(binding name, file of raw bytes)]`` for ``--loadInputs`` (8.6 syntax
    ``'name':file,...``: names quoted, so a name with ``:`` is whole; a ``,`` or ``'`` cannot be said
    in it, nor a ``,`` in a path: sampleOptions.cpp splits the list on ``,``). One timed iteration,
    no warm-up: the outputs are the point, not the time.
    """
    specs = []
    for name, path in inputs:
        if "," in name or "'" in name:
            raise ValueError("input %r: trtexec's --loadInputs cannot name a tensor with ',' or \"'\"" % name)
        if "," in path:
            raise ValueError("%s: trtexec's --loadInputs cannot take a path with ','" % path)
        specs.append("'%s':%s" % (name, path))
    return [
        trtexec,
        "--loadEngine=" + engine,
        *_dla_args(dla_core, False),
        "--loadInputs=" + ",".join(specs),
        *shape_args(("shapes",), (shapes,)),
        "--exportOutput=" + output_json,
        "--warmUp=0",
        "--iterations=1",
        "--duration=0",
    ]


def _dla_args(dla_core, allow_gpu_fallback):
    if dla_core is None:
        return []
    if int(dla_core) < 0:
        raise ValueError("DLA core must be >= 0, got %r" % dla_core)
    return ["--useDLACore=%d" % int(dla_core)] + (["--allowGPUFallback"] if allow_gpu_fallback else [])


# ---------------------------------------------------------------------------------------------------
# Reading trtexec's output
# ---------------------------------------------------------------------------------------------------

_BANNER = re.compile(r"\[TensorRT v(\d+)\]")
_SUMMARY = re.compile(r"\[I\] (Latency|GPU Compute Time|Enqueue Time|H2D Latency|D2H Latency): (.*)$")
_FIELD = re.compile(r"(min|max|mean|median|percentile\((\d+(?:\.\d+)?)%\)) = ([0-9.eE+-]+) ms")
_THROUGHPUT = re.compile(r"\[I\] Throughput: ([0-9.eE+-]+) qps")


def version_from_banner(lines):
    """``&&&& RUNNING TensorRT.trtexec [TensorRT v8600]`` -> "8.6.0" (None when absent)."""
    for line in lines:
        m = _BANNER.search(line)
        if m:
            v = int(m.group(1))
            return "%d.%d.%d" % (v // 1000, (v // 100) % 10, v % 100)
    return None


def parse_performance_summary(lines):
    """The ``=== Performance summary ===`` block of a trtexec run, as numbers (milliseconds, qps)."""
    summary = {}
    for line in lines:
        m = _THROUGHPUT.search(line)
        if m:
            summary["throughput_qps"] = float(m.group(1))
            continue
        m = _SUMMARY.search(line)
        if not m:
            continue
        key = m.group(1).lower().replace(" ", "_")
        stats = {}
        for f in _FIELD.finditer(m.group(2)):
            name = "p%g" % float(f.group(2)) if f.group(2) else f.group(1)
            stats[name] = float(f.group(3))
        summary[key + "_ms"] = stats
    return summary


def error_from_log(lines):
    """(stage, message) for a failed trtexec run: the most specific ``[E]`` line wins."""
    errors = [ln.split("[E] ", 1)[1] for ln in lines if "[E] " in ln]
    stage = "parse" if any("Failed to parse onnx file" in e for e in errors) else "build"
    specific = [e for e in errors if e.startswith("Error[")]
    if specific:
        return stage, specific[0]
    if errors:
        return stage, errors[0]
    failed = [ln for ln in lines if ln.startswith("&&&& FAILED")]
    if failed:
        return stage, failed[-1]
    # No trtexec report at all (killed, or it never started): its last words are the reason.
    said = [ln.strip() for ln in lines if ln.strip()]
    return stage, ("trtexec failed: %s" % said[-1] if said else "trtexec failed without output")


# ---------------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------------


def exit_description(code):
    """``exited with 3`` / ``was killed by signal 11 (SIGSEGV)`` for a tool's return code."""
    if code >= 0:
        return "exited with %d" % code
    try:
        name = " (%s)" % signal.Signals(-code).name
    except ValueError:
        name = ""
    return "was killed by signal %d%s" % (-code, name)


def passed(lines):
    """trtexec's own verdict: its last ``&&&&`` report line is PASSED."""
    reports = [ln for ln in lines if ln.startswith("&&&& ")]
    return bool(reports) and reports[-1].startswith("&&&& PASSED")


def passed_then(code):
    """How a run that printed ``&&&& PASSED`` ended anyway: the start of every message about one."""
    return "trtexec printed PASSED, then %s" % exit_description(code)


_LOADED = re.compile(r"Loaded engine size: (\d+) MiB")


def check_passed_engine(trtexec, engine, code, lines, log, timeout):
    """After ``&&&& PASSED`` trtexec died at exit (seen with TensorRT 8.6.0 tearing down CUDA: fixture
    ``trt86-h200-edgeq/agent/build.trtexec.json``): the engine counts only if it is complete (the size
    trtexec logged when it loaded it back, ``size >> 20`` MiB) and deserializes in a fresh trtexec.
    Returns the warning for the reply; raises AgentError saying why the engine does not count."""
    how = passed_then(code)
    if not os.path.isfile(engine):
        raise AgentError("build", "%s without writing %s" % (how, engine), log=lines)
    size = os.path.getsize(engine)
    logged = [int(m.group(1)) for m in map(_LOADED.search, lines) if m]
    if size == 0 or (logged and size >> 20 != logged[-1]):
        want = "%d MiB" % logged[-1] if logged else "more than 0 bytes"
        raise AgentError(
            "build",
            "%s; the engine it left is incomplete (%d bytes, it loaded %s)" % (how, size, want),
            log=lines,
        )
    check = [trtexec, "--loadEngine=" + engine, "--skipInference"]
    code2, lines2 = run_tool(check, log, timeout)
    # PASSED is the verdict: a trtexec that dies at exit after a build may die after loading it too
    if code2 is None or not passed(lines2):
        _, why = error_from_log(lines2) if code2 is not None else ("build", "timed out")
        raise AgentError("build", "%s; the engine it left does not deserialize: %s" % (how, why), log=lines2)
    return "%s; the engine (%d bytes) is complete and deserializes, so the build counts" % (how, size)


def _run(argv, log, timeout, stage, allow_passed=False):
    if not os.path.isfile(argv[0]):
        raise AgentError(
            "import",
            "trtexec not found at %s" % argv[0],
            details={"hint": "set backend.trtexec in the target file to trtexec's path"},
        )
    started = time.monotonic()
    code, lines = run_tool(argv, log, timeout)
    elapsed = time.monotonic() - started
    if code is None:
        raise AgentError(stage, "trtexec timed out after %d s" % timeout, log=lines)
    if code != 0 and not (allow_passed and passed(lines)):
        err_stage, message = error_from_log(lines)
        raise AgentError(err_stage if stage == "build" else stage, message, log=lines)
    return lines, elapsed, code


def _expect_file(path, stage, lines):
    if not os.path.isfile(path):
        raise AgentError(stage, "trtexec exited 0 but did not write %s" % path, log=lines)


def build(args, log):
    argv = build_argv(
        args.trtexec,
        args.onnx,
        args.saveEngine,
        int8=args.int8,
        fp16=args.fp16,
        calib=args.calib,
        workspace_mib=args.workspace,
        tactic_sources=_split(args.tacticSources),
        timing_cache=args.timingCacheFile,
        dla_core=args.useDLACore,
        allow_gpu_fallback=args.allowGPUFallback,
        min_shapes=args.minShapes,
        opt_shapes=args.optShapes,
        max_shapes=args.maxShapes,
    )
    lines, elapsed, code = _run(argv, log, args.timeout, "build", allow_passed=True)
    warnings = []
    if code != 0:
        warnings.append(check_passed_engine(args.trtexec, args.saveEngine, code, lines, log, args.timeout))
    _expect_file(args.saveEngine, "build", lines)
    result = {
        "engine": args.saveEngine,
        "engine_bytes": os.path.getsize(args.saveEngine),
        "build_seconds": round(elapsed, 3),
        "mode": _mode(args),
        "tensorrt": version_from_banner(lines),
        "timing_cache": args.timingCacheFile,
        "argv": argv,
    }
    return _with_warnings(result, warnings)


def check_passed_outputs(stage, code, lines, outputs):
    """After ``&&&& PASSED`` trtexec died at exit (as after a build: ``check_passed_engine``): an inspect
    or a timing counts only when every JSON file it was to write is there and reads whole. Returns the
    warning for the reply; raises AgentError saying which file does not count."""
    how = passed_then(code)
    for path in outputs:
        try:
            _read_json(path)
        except (OSError, ValueError) as e:
            raise AgentError(stage, "%s; %s is not complete: %s" % (how, path, e), log=lines) from None
    return "%s; what it wrote is complete, so the %s counts" % (how, stage)


def _read_json(path):
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        return json.loads(f.read(), strict=False)  # layer names can hold control characters


def _with_warnings(result, warnings):
    if warnings:
        result["warnings"] = warnings
    return result


def inspect(args, log):
    argv = inspect_argv(args.trtexec, args.loadEngine, args.exportLayerInfo, dla_core=args.useDLACore,
                        shapes=getattr(args, "shapes", None))
    lines, _, code = _run(argv, log, args.timeout, "inspect", allow_passed=True)
    warnings = [check_passed_outputs("inspect", code, lines, [args.exportLayerInfo])] if code else []
    _expect_file(args.exportLayerInfo, "inspect", lines)
    info = _read_json(args.exportLayerInfo)
    layers = info.get("Layers", []) if isinstance(info, dict) else []
    return _with_warnings({
        "layers_json": args.exportLayerInfo,
        "layers": len(layers),
        # Names only (strings) when the engine was not built with --profilingVerbosity=detailed.
        "detailed": bool(layers) and all(isinstance(x, dict) for x in layers),
        "tensorrt": version_from_banner(lines),
    }, warnings)


def profile(args, log):
    argv = profile_argv(
        args.trtexec,
        args.loadEngine,
        args.exportProfile,
        warmup_ms=args.warmUp,
        iterations=args.iterations,
        duration_s=args.duration,
        dla_core=args.useDLACore,
        no_data_transfers=args.noDataTransfers,
        shapes=args.shapes,
    )
    lines, elapsed, code = _run(argv, log, args.timeout, "profile", allow_passed=True)
    summary = parse_performance_summary(lines)
    warnings = []
    if code:
        if summary.get("throughput_qps") is None:
            how = passed_then(code)
            raise AgentError("profile", "%s; its log has no performance summary" % how, log=lines)
        outputs = [args.exportProfile] if args.exportProfile else []
        warnings.append(check_passed_outputs("profile", code, lines, outputs))
    if args.exportProfile:
        _expect_file(args.exportProfile, "profile", lines)
    return _with_warnings({
        "profile_json": args.exportProfile,
        "latency_ms": summary.get("latency_ms", {}),
        "gpu_compute_ms": summary.get("gpu_compute_time_ms", {}),
        "throughput_qps": summary.get("throughput_qps"),
        "wall_seconds": round(elapsed, 3),
        "tensorrt": version_from_banner(lines),
    }, warnings)


def infer(args, log):
    """Run the engine on each held-out sample (one trtexec run each: trtexec takes one set of input
    files), each group of samples at its ``--shapes`` (``infer.load_groups``), and stack the outputs it
    exported per group. trtexec's JSON says no data type: outputs come back as float64, which holds
    every value trtexec printed (6 significant digits) exactly."""
    from . import infer as shared

    groups = shared.load_groups(args.loadInputs, args.shapes)
    plans = [(shapes, bindings, shared.samples_for(bindings, inputs))
             for shapes, inputs in groups for bindings in [_input_bindings(inputs)]]  # fmt: skip
    total = sum(len(feeds) for _, _, feeds in plans)
    if not total:
        raise AgentError("input", "%s holds no samples" % args.loadInputs)
    work = args.exportOutput + ".d"
    os.makedirs(work, exist_ok=True)
    started = time.monotonic()
    state = {"done": 0, "warnings": [], "lines": []}
    try:
        outputs = [_infer_group(args, log, shapes, bindings, feeds, work, state, total)
                   for shapes, bindings, feeds in plans]  # fmt: skip
    finally:
        if os.path.isdir(work) and not os.listdir(work):
            os.rmdir(work)
    outputs = shared.grouped(outputs)
    shared.write_outputs(args.exportOutput, outputs)
    seconds = round(time.monotonic() - started, 3)
    reply = shared.result(args.exportOutput, outputs, total, seconds=seconds,
                          tensorrt=version_from_banner(state["lines"]))
    return _with_warnings(reply, state["warnings"])


# The binding types TensorRT 8.6 gives ONNX inputs (INT64 -> INT32, DOUBLE -> FLOAT).
_INPUT_TYPES = {"f4": "FLOAT", "f8": "FLOAT", "f2": "HALF", "i4": "INT32", "i8": "INT32", "i1": "INT8",
                "b1": "BOOL", "u1": "UINT8"}  # fmt: skip


def _input_bindings(inputs):
    """The engine's inputs as the held-out arrays have them (trtexec reports no bindings before a run)."""
    from . import infer as shared

    bindings = []
    for name, arr in inputs.items():
        trt_type = _INPUT_TYPES.get(arr.descr[1:])
        if trt_type is None:
            raise AgentError("input", "input %r: %s has no TensorRT binding type" % (name, arr.descr))
        bindings.append(shared.Binding(name, arr.shape[1:], trt_type, True))
    return bindings


def _infer_group(args, log, shapes, bindings, feeds, work, state, total):
    """One group's samples, one trtexec run each at the group's ``--shapes``; its outputs stacked."""
    from .arrays import FLOAT64, ArrayError, floats, parse_export_output, stack

    files = [(b.name, os.path.join(work, "input%d.bin" % k)) for k, b in enumerate(bindings)]
    out_json = os.path.join(work, "outputs.json")
    exported = []  # per sample: [(name, shape, float64 bytes)] (bytes: 8 per value, not a Python float's 24)
    try:
        for feed in feeds:
            i = state["done"]
            for name, path in files:
                with open(path, "wb") as f:
                    f.write(feed[name])
            if os.path.exists(out_json):
                os.unlink(out_json)
            argv = infer_argv(args.trtexec, args.loadEngine, files, out_json, dla_core=args.useDLACore,
                              shapes=shapes)
            lines, _, code = _run(argv, log, args.timeout, "infer", allow_passed=True)
            state["lines"] = lines
            # trtexec feeds random values to an input --loadInputs did not name (sampleInference.cpp,
            # FillBindingClosure: "Using random values for input <name>"): outputs that mean nothing
            random = [ln.split("Using random values for input ", 1)[1].strip() for ln in lines
                      if "Using random values for input " in ln]  # fmt: skip
            if random:
                raise AgentError("input", "the engine's input %r is not in the held-out data (trtexec fed it "
                                 "random values)" % random[0], log=lines)
            if code and i == 0:
                state["warnings"].append(check_passed_outputs("infer", code, lines, []))  # JSON read next
            _expect_file(out_json, "infer", lines)
            with open(out_json, "r", encoding="utf-8", errors="replace") as f:
                text = f.read()
            try:
                parsed = parse_export_output(text, "trtexec --exportOutput (sample %d)" % i)
                exported.append([(name, shape, floats(values, shape).data) for name, shape, values in parsed])
            except ArrayError as e:
                raise AgentError("infer", str(e), log=lines) from None
            state["done"] = i + 1
            log.write("[I] infer: sample %d/%d done" % (i + 1, total))
    finally:
        for path in [p for _, p in files] + [out_json]:
            if os.path.exists(path):
                os.unlink(path)
    first = [(name, shape) for name, shape, _ in exported[0]] if exported else []
    for k, outs in enumerate(exported):
        if [(name, shape) for name, shape, _ in outs] != first:
            raise AgentError("infer", "sample %d: trtexec exported other outputs than for sample %d"
                             % (state["done"] - len(exported) + k, state["done"] - len(exported)))
    return {name: stack(FLOAT64, shape, [outs[k][2] for outs in exported])
            for k, (name, shape) in enumerate(first)}  # fmt: skip


def _split(text):
    return [t for t in (text or "").split(",") if t.strip()]


def _mode(args):
    if args.int8 and args.calib:
        return "implicit-int8"
    if args.int8:
        return "explicit-int8"
    return "fp16" if args.fp16 else "fp32"
