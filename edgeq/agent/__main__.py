"""Agent command line: ``python edgeq-agent.pyz COMMAND ...``: probe, build, inspect, profile, infer; install,
switch, rollback, status for installed releases (``releases``).

Protocol: every invocation writes exactly ONE JSON object to stdout, nothing else::

    {"protocol": 1, "agent": "<version>", "command": "build", "ok": true, "result": {...}}
    {"protocol": 1, "agent": "<version>", "command": "build", "ok": false,
     "error": {"stage": "parse", "message": "...", "log": ["TensorRT log lines"], "details": {...}}}

Logs (TensorRT's logger, trtexec's output) stream on stderr. While a command runs, file descriptor 1
points at stderr, so no library can corrupt the JSON by printing. Subprocesses run with timeouts.

Exit codes: 0 ok; 1 the command failed on the target (stage names where: import, cuda, launch, parse,
build, inspect, profile, infer, input, output; a ``--timeout`` names the command); 2 usage error (stage
"usage"); 3 an agent bug (stage "internal"); 130 interrupted (stage "interrupted").
Option names are trtexec's where they mean the same thing.

The python backend runs TensorRT in this process, where neither a timeout nor SIGTERM can interrupt a
C++ call: a ``common.Watchdog`` thread then writes the reply itself and exits (still exactly one JSON
object: ``_Reply`` lets only the first writer through).
"""

import argparse
import errno
import json
import os
import sys
import threading
import traceback

from . import PROTOCOL, releases, shapes
from .common import (
    AgentError,
    LogBuffer,
    Watchdog,
    disk_full,
    disk_space,
    install_signal_handlers,
    interrupted_message,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
DEFAULT_TRTEXEC = "/usr/src/tensorrt/bin/trtexec"
COMMANDS = ("probe", "build", "inspect", "profile", "infer", *releases.COMMANDS)


def agent_version():
    """The sha256-derived stamp the zipapp builder writes; "dev" when run from a source tree."""
    try:
        from ._stamp import VERSION
    except ImportError:
        return "dev"
    return VERSION


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and exit(2): keep the protocol instead
        raise UsageError(message)


def make_parser():
    p = _Parser(prog="edgeq-agent", description="edgeq target agent (JSON on stdout, logs on stderr)")
    sub = p.add_subparsers(dest="command")

    def common(sp):
        sp.add_argument("--backend", choices=("python", "trtexec"), default="python")
        sp.add_argument("--trtexec", default=DEFAULT_TRTEXEC, help="trtexec path (backend trtexec)")
        sp.add_argument("--timeout", type=float, default=3600.0, help="seconds before a tool is killed")
        sp.add_argument("--verbose", action="store_true", help="TensorRT VERBOSE log level")

    probe = sub.add_parser("probe", help="report Python, GPU, TensorRT, DLA cores, free memory and disk")
    common(probe)
    probe.add_argument("--workDir", help="where runs are written: its free disk space is reported")

    build = sub.add_parser("build", help="ONNX -> engine")
    common(build)
    build.add_argument("--onnx", required=True)
    build.add_argument("--saveEngine", required=True)
    build.add_argument("--int8", action="store_true")
    build.add_argument("--fp16", action="store_true")
    build.add_argument("--calib", help="TensorRT calibration cache (implicit INT8)")
    build.add_argument("--workspace", type=int, help="workspace memory pool limit, MiB")
    build.add_argument("--tacticSources", help="e.g. -CUBLAS,-CUBLAS_LT,-CUDNN")
    build.add_argument("--timingCacheFile")
    build.add_argument("--useDLACore", type=int)
    build.add_argument("--allowGPUFallback", action="store_true")
    for flag in shapes.BUILD_FLAGS:  # the optimization profile of a model with dynamic input dimensions
        build.add_argument("--" + flag, help="e.g. input:1x3x224x224 (trtexec syntax)")

    inspect = sub.add_parser("inspect", help="engine inspector JSON (as trtexec --exportLayerInfo)")
    common(inspect)
    inspect.add_argument("--loadEngine", required=True)
    inspect.add_argument("--exportLayerInfo", required=True)
    inspect.add_argument("--useDLACore", type=int)
    inspect.add_argument("--shapes", help="input shapes of an engine with dynamic inputs (trtexec syntax), "
                         "the ones it is timed at (TensorRT 8.6 prints its formats only at concrete, "
                         "inferred shapes)")

    profile = sub.add_parser("profile", help="latency percentiles, throughput, per-layer times")
    common(profile)
    profile.add_argument("--loadEngine", required=True)
    profile.add_argument(
        "--exportProfile", help="per-layer times, in a second run; without it the engine is only timed"
    )
    profile.add_argument("--warmUp", type=int, default=200, help="warm-up, milliseconds")
    profile.add_argument("--iterations", type=int, default=10, help="at least N timed iterations")
    profile.add_argument("--duration", type=float, default=3.0, help="at least S seconds of timing")
    profile.add_argument("--useDLACore", type=int)
    profile.add_argument(
        "--noDataTransfers",
        action="store_true",
        help="time the engine without host<->device copies (the Python backend never copies)",
    )
    profile.add_argument("--shapes", help="input shapes of an engine with dynamic inputs (trtexec syntax)")
    infer = sub.add_parser("infer", help="run the engine on held-out inputs (.npz), write its outputs (.npz)")
    common(infer)
    infer.add_argument("--loadEngine", required=True)
    infer.add_argument("--loadInputs", required=True, help=".npz: one array per input, samples on axis 0")
    infer.add_argument("--exportOutput", required=True, help=".npz: one array per output, samples on axis 0")
    infer.add_argument("--useDLACore", type=int)
    infer.add_argument("--shapes", action="append",
                       help="input shapes of an engine with dynamic inputs (trtexec syntax); once per "
                            "group of --loadInputs (arrays <group>/<input>) when samples differ in shape")
    releases.add_arguments(sub, common)  # installed releases: install, switch, rollback, status
    return p


def envelope(command, result=None, error=None):
    obj = {"protocol": PROTOCOL, "agent": agent_version(), "command": command, "ok": error is None}
    if error is None:
        obj["result"] = result if result is not None else {}
    else:
        obj["error"] = error
    return obj


def _check_inputs(args):
    for attr in ("onnx", "calib", "loadEngine", "loadInputs"):
        path = getattr(args, attr, None)
        if path and not os.path.isfile(path):
            raise AgentError("input", "%s not found: %s" % (attr, path))
    # Output directories are created (the timing cache's too: the first build on a target writes it).
    for attr in ("saveEngine", "exportLayerInfo", "exportProfile", "exportOutput", "timingCacheFile"):
        path = getattr(args, attr, None)
        if path:
            parent = os.path.dirname(os.path.abspath(path))
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError as e:
                message = "cannot create %s for %s: %s" % (parent, attr, e.strerror or e)
                raise AgentError("output", message) from None


def resolve_trtexec(path):
    """The target file's trtexec; where that is JetPack's default path (``DEFAULT_TRTEXEC``, the target
    file said none) and nothing is there, the first ``trtexec`` on the board's PATH (TensorRT's tar
    install puts it in ``TensorRT-8.6.x/bin``, containers in ``/usr/local/bin``)."""
    import shutil

    if path == DEFAULT_TRTEXEC and not os.access(path, os.X_OK):
        return shutil.which("trtexec") or path
    return path


def run_command(args, log):
    """Dispatch one command; TensorRT is imported only inside the backend that needs it."""
    from . import probe as sysprobe

    if args.command == "probe":
        facts = sysprobe.system_facts()
        facts["disk"] = disk_space(args.workDir or os.getcwd())
        if args.backend == "trtexec":
            facts["trtexec"] = sysprobe.trtexec_facts(args.trtexec, log)
            if not facts["trtexec"].get("executable"):
                raise AgentError("import", "trtexec not found at %s" % args.trtexec, details=facts)
            if facts["trtexec"].get("version") is None:
                message = "trtexec at %s %s" % (args.trtexec, facts["trtexec"].get("error"))
                raise AgentError("import", message, details=facts)
            facts["tensorrt"] = {"version": facts["trtexec"].get("version"), "via": "trtexec"}
            return facts
        from . import trt_backend

        try:
            facts["tensorrt"] = trt_backend.probe(log)
        except AgentError as e:
            e.details = dict(facts, **e.details)  # keep what we learned about the machine
            raise
        return facts
    if args.command in releases.COMMANDS:
        return releases.COMMANDS[args.command](args)

    _check_inputs(args)
    written = ("saveEngine", "exportLayerInfo", "exportProfile", "exportOutput")
    outputs = [getattr(args, a, None) for a in written]
    try:
        return _run_backend(args, log)
    except AgentError as e:
        raise (e if e.stage == "usage" else disk_full(e, outputs)) from None
    except OSError as e:  # the python backend writing an engine or JSON itself
        if e.errno != errno.ENOSPC:
            raise
        raise disk_full(AgentError("output", "%s: %s" % (args.command, e)), outputs) from None


def _run_backend(args, log):
    if args.backend == "trtexec":
        from . import trtexec_backend as backend

        try:
            return getattr(backend, args.command)(args, log)
        except ValueError as e:
            raise AgentError("usage", str(e)) from None
    from . import trt_backend
    from .trtexec_backend import build_argv, check_tactic_sources

    if args.command == "build":
        sources = [t for t in (args.tacticSources or "").split(",") if t.strip()]
        try:
            # The same option checks as the trtexec backend (--calib needs --int8, --allowGPUFallback
            # needs --useDLACore, workspace > 0, tactic source names), so both backends agree.
            build_argv(
                args.trtexec, args.onnx, args.saveEngine, int8=args.int8, fp16=args.fp16,
                calib=args.calib, workspace_mib=args.workspace, tactic_sources=sources,
                dla_core=args.useDLACore, allow_gpu_fallback=args.allowGPUFallback,
                min_shapes=args.minShapes, opt_shapes=args.optShapes, max_shapes=args.maxShapes,
            )  # fmt: skip
            sources = check_tactic_sources(sources)
        except ValueError as e:
            raise AgentError("usage", str(e)) from None
        return trt_backend.build(args, log, sources)
    if args.command in ("profile", "infer"):
        try:
            for text in args.shapes if isinstance(args.shapes, list) else [args.shapes]:
                shapes.parse_shapes(text)
        except ValueError as e:
            raise AgentError("usage", str(e)) from None
    return getattr(trt_backend, args.command)(args, log)


class _Reply:
    """Writes the one JSON object to the real stdout, once: the main thread or the watchdog, not both."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sent = False

    def claim(self):
        with self._lock:
            if self._sent:
                return False
            self._sent = True
            return True


def _write_fd(fd, data):
    while data:
        n = os.write(fd, data)
        data = data[n:]


def main(argv=None):
    out = sys.stdout
    command = None
    install_signal_handlers()
    log = LogBuffer(sys.stderr)
    # Point fd 1 at stderr while the command runs: TensorRT, CUDA or a stray print() cannot corrupt
    # the one JSON object the host parses.
    out.flush()
    saved_fd = None
    try:
        saved_fd = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        saved_fd = None
    sys.stdout = sys.stderr
    code = EXIT_OK
    reply = _Reply()
    watchdog = None

    def emergency(stage, message, exit_code):
        """Reply and exit from the watchdog thread (the main thread is stuck in TensorRT)."""
        if not reply.claim():
            return  # the main thread is already replying
        obj = envelope(command, error={"stage": stage, "message": message, "log": log.tail(timeout=2)})
        data = (json.dumps(obj, sort_keys=True) + "\n").encode("utf-8")
        try:
            _write_fd(saved_fd if saved_fd is not None else 1, data)
        finally:
            os._exit(exit_code)

    try:
        args = make_parser().parse_args(argv)
        command = args.command
        if getattr(args, "trtexec", None):
            args.trtexec = resolve_trtexec(args.trtexec)
        if command is None:
            raise UsageError("a command is required: probe, build, inspect, profile or infer; for installed "
                             "releases install, switch, rollback or status")
        if args.backend == "python":
            watchdog = Watchdog(args.timeout, emergency, command).start()
        obj = envelope(command, result=run_command(args, log))
    except UsageError as e:
        args_list = list(sys.argv[1:] if argv is None else argv)
        command = next((a for a in args_list if a in COMMANDS), None)
        obj, code = envelope(command, error={"stage": "usage", "message": str(e), "log": []}), EXIT_USAGE
    except AgentError as e:
        if not e.log:
            e.log = log.tail()
        obj = envelope(command, error=e.to_dict())
        code = EXIT_USAGE if e.stage == "usage" else EXIT_FAILED
    except KeyboardInterrupt as e:  # Interrupted (SIGTERM/SIGHUP) or Ctrl-C
        message = interrupted_message(getattr(e, "signum", None))
        obj = envelope(command, error={"stage": "interrupted", "message": message, "log": log.tail()})
        code = 130
    except Exception as e:  # a bug in the agent: still one JSON object, traceback on stderr only
        traceback.print_exc(file=sys.stderr)
        obj = envelope(
            command,
            error={"stage": "internal", "message": "%s: %s" % (type(e).__name__, e), "log": log.tail()},
        )
        code = EXIT_INTERNAL
    finally:
        if watchdog is not None:
            watchdog.stop()
        if not reply.claim():  # the watchdog replied and is ending the process
            threading.Event().wait()
        sys.stdout = out
        sys.stderr.flush()
        if saved_fd is not None:
            os.dup2(saved_fd, 1)
            os.close(saved_fd)
    out.write(json.dumps(obj, sort_keys=True) + "\n")
    out.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
