"""TensorRT plumbing shared by the python backend's commands: importing TensorRT lazily, its version
number, the logger that streams into the agent log, the first error it logged, the Builder (which
initialises CUDA), and atomic writes of what a command produces.

It exists so ``trt_build``, ``trt_engine`` and ``trt_profile`` share these without importing each
other. TensorRT is imported here only, inside ``load_tensorrt``, which they call.
"""

import contextlib
import os
import re

from .common import AgentError

# ILogger.Severity values (pyCore.cpp binds kINTERNAL_ERROR..kVERBOSE as 0..4, py::arithmetic), named
# here so log lines read "[ERROR] ..." whatever pybind11 version built the bindings (``.name`` on an
# enum member only exists from pybind11 2.6).
_SEVERITY = {0: "INTERNAL_ERROR", 1: "ERROR", 2: "WARNING", 3: "INFO", 4: "VERBOSE"}


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


def make_logger(trt, log, verbose=False):
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


def first_error(log, default, since=0):
    """The first TensorRT error logged since ``since`` (a ``log.mark()``), without its "[ERROR] "."""
    errors = log.errors(since)
    return errors[0].split("] ", 1)[-1] if errors else default


def create_builder(trt, logger, log):
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
        raise AgentError("cuda", first_error(log, "cannot create a TensorRT Builder"), log=log.tail())
    return builder


def write_atomic(path, data):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise AgentError("output", "cannot write %s: %s" % (path, e.strerror or e)) from None
