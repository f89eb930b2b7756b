"""Pieces shared by the agent's commands and backends: the structured error and the log buffer."""

import collections
import contextlib
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


class LogBuffer:
    """Streams log lines to stderr (the host shows them live) and keeps the recent ones for errors."""

    def __init__(self, stream=None, keep=2000):
        self.stream = stream if stream is not None else sys.stderr
        self.lines = collections.deque(maxlen=keep)
        self._lock = threading.Lock()

    def write(self, line):
        line = line.rstrip("\r\n")
        with self._lock:
            self.lines.append(line)
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # the host went away: keep going, the result still lands in the run's files

    def tail(self, n=LOG_TAIL):
        with self._lock:
            return list(self.lines)[-n:]

    def errors(self):
        """Error lines: ``[E]`` from trtexec, ``[ERROR]``/``[INTERNAL_ERROR]`` from TensorRT's logger."""
        with self._lock:
            return [ln for ln in self.lines if "[E]" in ln or ln.startswith(("[ERROR]", "[INTERNAL_ERROR]"))]


def run_tool(argv, log, timeout):
    """Run a tool (trtexec, nvidia-smi) with its output streamed into ``log``; never hangs.

    The child runs in its own process group, so a timeout kills it and anything it started (a shell
    wrapper's children included). When the host gives up instead, the transport TERMs the agent's
    group; ``install_signal_handlers`` then takes the tools' groups down too. Returns (exit code,
    lines); exit code None means it timed out and was killed.
    """
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
    lines = []

    def pump():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if log is not None:
                log.write(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    _ACTIVE.add(proc)
    deadline = time.monotonic() + timeout
    code = None
    try:
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


_ACTIVE = set()  # tools running now, so a signal handler can stop them


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        with contextlib.suppress(OSError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def install_signal_handlers():
    """On SIGTERM/SIGHUP (the host stopping us): kill running tools' process groups, then stop."""

    def stop(signum, frame):
        for proc in list(_ACTIVE):
            _kill(proc)
        raise KeyboardInterrupt("signal %d" % signum)

    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            with contextlib.suppress(ValueError, OSError):  # not the main thread / not allowed
                signal.signal(sig, stop)


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
