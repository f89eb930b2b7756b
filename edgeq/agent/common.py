"""Pieces shared by the agent's commands and backends: the structured error, the log buffer, running
tools without hanging, the watchdog for in-process TensorRT work, and finding libcudart (stdlib only)."""

import collections
import contextlib
import errno
import os
import signal
import subprocess
import sys
import threading
import time

LOG_TAIL = 200  # log lines returned inside a structured error (the full log streams on stderr)


class AgentError(Exception):
    """A failure on the target, reported as data: which stage, what happened, the tool's log lines."""

    def __init__(self, stage, message, log=None, details=None):
        Exception.__init__(self, message)
        self.stage = stage
        self.message = message
        self.log = list(log or [])[-LOG_TAIL:]
        self.details = details or {}

    def to_dict(self):
        d = {"stage": self.stage, "message": self.message, "log": self.log}
        if self.details:
            d["details"] = self.details
        return d


# A full disk, as the C library says it (``[Errno 28] No space left on device`` from Python, the same
# text from trtexec's or TensorRT's own write errors), and what counts as full when nothing said so.
NO_SPACE = os.strerror(errno.ENOSPC)
FULL_BELOW_BYTES = 1 << 20


def disk_space(path):
    """Free space for this user on the filesystem holding ``path`` (its nearest existing directory):
    ``{"path", "free_bytes", "total_bytes"}``, or None where statvfs cannot say."""
    where = os.path.abspath(path)
    while not os.path.isdir(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    try:
        st = os.statvfs(where)
    except (OSError, AttributeError):  # no statvfs off POSIX
        return None
    return {"path": where, "free_bytes": st.f_bavail * st.f_frsize, "total_bytes": st.f_blocks * st.f_frsize}


def disk_full(error, paths):
    """``error`` said as what it is when the disk it wrote to is full: a log line with ENOSPC's text, or
    an output's filesystem with (almost) nothing free. The tool's own failure stays after it."""
    said = next((ln.strip() for ln in reversed(error.log) if NO_SPACE in ln), None)
    spaces = [d for d in (disk_space(p) for p in paths if p) if d is not None]
    full = [d for d in spaces if d["free_bytes"] < FULL_BELOW_BYTES]
    if said is None and not full:
        return error
    where = (full or spaces or [None])[0]
    room = " (%s: %d MiB free)" % (where["path"], where["free_bytes"] >> 20) if where else ""
    error.message = "no space left on the target's disk%s: %s; %s" % (room, said or NO_SPACE, error.message)
    if where:
        error.details = dict(error.details, disk=where)
    return error


class LogBuffer:
    """Streams log lines to stderr (the host shows them live) and keeps the recent ones for errors."""

    def __init__(self, stream=None, keep=2000):
        self.stream = stream if stream is not None else sys.stderr
        self.lines = collections.deque(maxlen=keep)
        self.written = 0  # lines written so far; ``mark()`` / ``errors(since=)`` count in these
        self._lock = threading.Lock()

    def write(self, line):
        line = line.rstrip("\r\n")
        with self._lock:
            self.lines.append(line)
            self.written += 1
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # the host went away: keep going, the result still lands in the run's files

    def tail(self, n=LOG_TAIL, timeout=-1):
        """The last ``n`` lines. With ``timeout`` (seconds) a writer stuck on a full stderr pipe cannot
        block the caller: it gets a best-effort copy instead."""
        if self._lock.acquire(timeout=timeout):
            try:
                return list(self.lines)[-n:]
            finally:
                self._lock.release()
        try:
            return list(self.lines)[-n:]
        except RuntimeError:  # deque mutated during the copy
            return []

    def mark(self):
        """A position in the log: ``errors(since=mark)`` then ignores what was logged before it."""
        with self._lock:
            return self.written

    def errors(self, since=0):
        """Error lines: ``[E]`` from trtexec, ``[ERROR]``/``[INTERNAL_ERROR]`` from TensorRT's logger.

        ``since`` (a ``mark()``) skips earlier ones: TensorRT logs errors it recovers from (a timing
        cache it cannot read: "Error Code 1: Serialization ... The timing cache will not be used!",
        NVIDIA/TensorRT#3566), which must not pass for the reason a later step failed.
        """
        with self._lock:
            first = self.written - len(self.lines)
            return [
                ln
                for i, ln in enumerate(self.lines, first)
                if i >= since and ("[E]" in ln or ln.startswith(("[ERROR]", "[INTERNAL_ERROR]")))
            ]


def run_tool(argv, log, timeout):
    """Run a tool (trtexec, nvidia-smi) with its output streamed into ``log``; never hangs.

    The child runs in its own process group, so a timeout kills it and anything it started (a shell
    wrapper's children included). When the host gives up instead, the transport TERMs the agent's
    group; ``install_signal_handlers`` then takes the tools' groups down too. Returns (exit code,
    lines); exit code None means it timed out and was killed.
    """
    lines = []

    def pump():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if log is not None:
                log.write(line)

    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            universal_newlines=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as e:
        raise AgentError("launch", "cannot run %s: %s" % (argv[0], e)) from None
    code = None
    try:
        # First thing: a SIGTERM from now on kills the tool too (it may already be running: a signal
        # between Popen and here would otherwise leave it behind).
        _ACTIVE.add(proc)
        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout
        code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill(proc)
        code = None
    except BaseException:
        _kill(proc)
        raise
    finally:
        _ACTIVE.discard(proc)
    reader.join(timeout=5)
    return code, lines


_ACTIVE = set()  # type: set[subprocess.Popen]  # tools running now, so a signal handler can stop them


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        with contextlib.suppress(OSError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def kill_active_tools():
    for proc in list(_ACTIVE):
        _kill(proc)


class Interrupted(KeyboardInterrupt):
    """SIGTERM/SIGHUP seen by the main thread; ``signum`` goes into the reply."""

    def __init__(self, signum):
        KeyboardInterrupt.__init__(self, "signal %d" % signum)
        self.signum = signum


def interrupted_message(signum=None):
    """The reply's message for an interruption: the same words whichever thread answers."""
    return "interrupted (signal %d)" % signum if signum else "interrupted"


def install_signal_handlers():
    """On SIGTERM/SIGHUP (the host stopping us): kill running tools' process groups, then stop."""

    def stop(signum, frame):
        kill_active_tools()
        raise Interrupted(signum)

    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            with contextlib.suppress(ValueError, OSError):  # not the main thread / not allowed
                signal.signal(sig, stop)


class Watchdog:
    """Ends in-process TensorRT work that cannot be interrupted from Python, with a reply.

    trtexec runs as a child that ``run_tool`` can kill; TensorRT's Python API runs in this process, in
    C++ calls that release the GIL (``build_serialized_network``, ``deserialize_cuda_engine``,
    ``execute_async_v3``: pyCore.cpp ``gil_scoped_release``). A Python signal handler only runs between
    bytecodes of the main thread, and a ``KeyboardInterrupt`` raised inside a TensorRT callback (the
    logger, the profiler) is swallowed by the 8.5+ bindings (pyCore.cpp, ``PyLogger``). So a thread
    sends the structured reply and exits the process: ``emergency(stage, message, exit_code)`` (which
    must not return) when ``timeout`` seconds pass, or on SIGTERM/SIGHUP, which reach it through
    ``signal.set_wakeup_fd`` even while the main thread is inside C++.

    A signal reaches both threads when the main thread is running Python: it then unwinds and replies
    itself, so the watchdog waits ``SIGNAL_GRACE_S`` first, and ``emergency`` replies only if the main
    thread has not (one reply, the same message either way).
    """

    SIGNAL_GRACE_S = 0.5

    def __init__(self, timeout, emergency, what="command"):
        self.timeout = timeout
        self.emergency = emergency
        self.what = what
        self._timer = None
        self._pipe = None
        self._old_wakeup = None

    def start(self):
        if self.timeout and self.timeout > 0:
            self._timer = threading.Timer(self.timeout, self._expired)
            self._timer.daemon = True
            self._timer.start()
        r, w = os.pipe()
        try:
            os.set_blocking(w, False)
            self._old_wakeup = signal.set_wakeup_fd(w)  # main thread only; needs Python-level handlers
        except (ValueError, OSError, AttributeError):  # not the main thread: the timeout still works
            for fd in (r, w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            return self
        self._pipe = (r, w)
        threading.Thread(target=self._watch, args=(r,), daemon=True).start()
        return self

    def stop(self):
        if self._timer is not None:
            self._timer.cancel()
        if self._pipe is not None:
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(self._old_wakeup if self._old_wakeup is not None else -1)
            with contextlib.suppress(OSError):
                os.close(self._pipe[1])  # the watcher's read returns b"" and it ends
            self._pipe = None

    def _expired(self):
        kill_active_tools()
        self.emergency(self.what, "%s timed out after %g s" % (self.what, self.timeout), 1)

    def _watch(self, r):
        try:
            data = os.read(r, 16)
        except OSError:
            data = b""
        finally:
            with contextlib.suppress(OSError):
                os.close(r)
        if data:
            kill_active_tools()
            time.sleep(self.SIGNAL_GRACE_S)  # a responsive main thread replies meanwhile
            self.emergency("interrupted", interrupted_message(data[0]), 130)


# Where JetPack / the CUDA toolkit put the CUDA runtime when ``ctypes.util.find_library`` cannot see it.
CUDART_NAMES = (
    "libcudart.so",
    "libcudart.so.12",
    "libcudart.so.11.0",
    "/usr/local/cuda/lib64/libcudart.so",
    "/usr/local/cuda/lib64/libcudart.so.12",
)


def load_libcudart():
    """The CUDA runtime library through ctypes (stdlib), or ImportError. Loading it creates no context."""
    import ctypes
    import ctypes.util

    errors = []
    for name in (ctypes.util.find_library("cudart"), *CUDART_NAMES):
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
    raise ImportError("libcudart not found (%s)" % (errors[-1] if errors else "no candidates"))


def percentiles(samples_ms):
    """Latency summary with the percentiles trtexec reports (90/95/99), nearest-rank like trtexec."""
    xs = sorted(samples_ms)
    if not xs:
        return {}
    n = len(xs)

    def pct(p):
        # nearest rank: the smallest sample with at least p% of the samples at or below it
        k = max(0, min(n - 1, int(-(-n * p // 100)) - 1))
        return xs[k]

    return {
        "min": xs[0],
        "max": xs[-1],
        "mean": sum(xs) / n,
        "median": xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2.0,
        "p90": pct(90),
        "p95": pct(95),
        "p99": pct(99),
    }
