"""Commands on a target: one quoted argv per command, output streamed line by line, and a timeout or
Ctrl-C that kills the remote process group (paramiko's channel layer, as edgeq uses it).

Every piece of user data is a separate ``shlex.quote``d word behind ``sh -c '...' edgeq``; the script
reports its process group first, so ``kill -TERM -<pgid>`` (then KILL) stops everything it started.
"""

from __future__ import annotations

import codecs
import logging
import select
import shlex
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

from edgeq.errors import RemoteError
from edgeq.remote.ssh import ConnectionDropped, SSHLink, remote_path
from edgeq.text import plain

log = logging.getLogger(__name__)

KILL_GRACE_S = 2.0  # SIGTERM to SIGKILL for a timed-out or interrupted remote command

_PGID_MARK = "__edgeq_pgid__"


class CommandFailed(RemoteError):
    """A remote command exited non-zero; ``result`` holds its full output."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None, *, result: CommandResult) -> None:
        super().__init__(message, hint)
        self.result = result


class CommandTimeout(RemoteError):
    """A remote command ran past its timeout; its process group on the target was killed."""

    exit_code = 1


@dataclass(frozen=True)
class CommandResult:
    """``exit_code`` is 128 + the signal's number when ``signal`` (its name, "KILL") ended the command."""

    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    signal: Optional[str] = None

    @property
    def status(self) -> str:
        """``exited with 3`` / ``was killed by signal KILL``."""
        return f"was killed by signal {self.signal}" if self.signal else f"exited with {self.exit_code}"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def __bool__(self) -> bool:
        return self.ok


def remote_command(
    argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
    pgid_file: str | None = None,
) -> str:
    """The one string sent to the remote login shell for ``argv``.

    ``sh -c SCRIPT edgeq ARGV...``: every piece of user data is a separate ``shlex.quote``d word, the
    script ends in ``exec "$@"`` so the arguments never meet a shell parser. The script first reports
    its process group (sshd puts each session in its own) as the first stdout line (stripped again by
    ``run``), so a timeout or Ctrl-C can kill
    the whole remote process tree rather than leave a build running on the target.

    ``pgid_file``: the process group is also written to that file on the target, for a runner that sees
    the output only once the command ended (``edgeq.ansible.connection``: it kills from a second session);
    the script then waits for the command and removes the file (its exit status kept).
    """
    if not argv:
        raise ValueError("empty argv")
    lines = [
        'g=""; read -r _ _ _ _ g _ 2>/dev/null </proc/$$/stat',
        '[ -n "$g" ] || g=$(ps -o pgid= -p $$ 2>/dev/null) || g=$$',
        f'printf "{_PGID_MARK} %s\\n" $g',
    ]
    if cwd:
        lines.append(f"cd {shlex.quote(remote_path(cwd))} || exit 1")
    for key, value in (env or {}).items():
        if not key.isidentifier() or not key.isascii():
            raise ValueError(f"not an environment variable name: {key!r}")
        lines.append(f"export {key}={shlex.quote(str(value))}")
    if pgid_file:
        f = shlex.quote(pgid_file)
        lines.append(f'mkdir -p "$(dirname {f})" && printf "%s\\n" $g >{f} || exit 1')
        lines.append(f'"$@"; rc=$?; rm -f {f}; exit $rc')
    else:
        lines.append('exec "$@"')
    script = "\n".join(lines)
    return " ".join(["sh", "-c", shlex.quote(script), "edgeq", *(shlex.quote(str(a)) for a in argv)])


class _LineStream:
    """Incremental UTF-8 decoding and line splitting for one output stream."""

    def __init__(self, sink: Callable[[str], None] | None, want_pgid: bool = False) -> None:
        self.sink = sink
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.partial = ""
        self.parts: list[str] = []  # complete lines keep their "\n": text() is the output verbatim
        self.want_pgid = want_pgid
        self.pgid: int | None = None

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self.partial + self.decoder.decode(data, final)
        *lines, self.partial = text.split("\n")
        for line in lines:
            self._emit(line, "\n")
        if final and self.partial:
            self._emit(self.partial, "")
            self.partial = ""

    def _emit(self, line: str, end: str) -> None:
        if self.want_pgid and line.startswith(_PGID_MARK):
            self.want_pgid = False
            value = line[len(_PGID_MARK) :].strip()
            self.pgid = int(value) if value.isdigit() and int(value) > 1 else None
            return
        self.parts.append(line + end)
        if self.sink is not None:
            self.sink(line)

    def text(self) -> str:
        return "".join(self.parts)

    def tail(self, n: int = 5) -> str:
        return " | ".join([ln.strip() for ln in self.parts if ln.strip()][-n:])


class CommandRunner(SSHLink):
    """``run(argv)`` on the target over an ``SSHLink``."""

    # -- commands -------------------------------------------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: Callable[[str], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
        stdin: bytes | None = None,
        check: bool = True,
    ) -> CommandResult:
        """Run ``argv`` on the target (never through a shell parser), streaming output lines live."""
        args, chan, out, err = self._start(argv, cwd=cwd, env=env, on_stdout=on_stdout, on_stderr=on_stderr)
        timeout = timeout if timeout is not None else self.config.command_timeout
        try:
            code = self._pump(chan, out, err, stdin, timeout, args)
        except KeyboardInterrupt:
            self._kill_group(out.pgid, chan)
            raise
        finally:
            chan.close()
        killed_by = getattr(chan, "exit_signal", None) if code < 0 else None
        if code < 0 and killed_by is None and not self._still_connected():
            raise ConnectionDropped(
                f"connection to {self.config.destination} dropped while running {args[0]}",
                "the command may still be running on the target",
                destination=self.config.destination,
            )
        if code < 0:  # the connection is up: the command ended without an exit status
            killed_by = str(killed_by or "unknown")
            code = 128 + int(getattr(signal, f"SIG{killed_by}", 127))
        result = CommandResult(args, code, out.text(), err.text(), killed_by)
        if check and code != 0:
            raise CommandFailed(
                f"{shlex.join(args)[:200]} {result.status} on {self.config.destination}: "
                f"{err.tail() or 'no stderr'}",
                result=result,
            )
        return result

    def _start(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        on_stdout: Callable[[str], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
    ) -> tuple[tuple[str, ...], Any, _LineStream, _LineStream]:
        if isinstance(argv, (str, bytes)):
            raise TypeError("run() takes an argument list, not a command string")
        args = tuple(str(a) for a in argv)
        command = remote_command(args, cwd=cwd, env=env)
        log.debug("run on %s: %s", self.config.destination, shlex.join(args))
        chan = self._open_session()
        try:
            chan.exec_command(command)
        except BaseException:
            chan.close()
            raise
        return args, chan, _LineStream(on_stdout, want_pgid=True), _LineStream(on_stderr)

    def _pump(
        self,
        chan: Any,
        out: _LineStream,
        err: _LineStream,
        stdin: bytes | None,
        timeout: float | None,
        args: tuple[str, ...],
    ) -> int:
        deadline = time.monotonic() + timeout if timeout is not None else None
        pending = memoryview(stdin or b"")
        if not pending:
            chan.shutdown_write()
        while True:
            busy = False
            if chan.recv_ready():
                out.feed(chan.recv(1 << 16))
                busy = True
            if chan.recv_stderr_ready():
                err.feed(chan.recv_stderr(1 << 16))
                busy = True
            if pending and chan.send_ready():
                n = chan.send(bytes(pending[: 1 << 15]))
                pending = pending[n:]
                if not pending:
                    chan.shutdown_write()
                busy = True
            drained = not busy and not chan.recv_ready() and not chan.recv_stderr_ready()
            if drained and (chan.closed or (chan.eof_received and chan.exit_status_ready())):
                break
            if deadline is not None and time.monotonic() > deadline:
                self._kill_group(out.pgid, chan)
                raise CommandTimeout(
                    f"{shlex.join(args)[:200]} ran longer than {plain(timeout)}s on "
                    f"{self.config.destination}; "
                    "its remote process group was killed",
                    "raise the timeout (command_timeout in the target file)",
                )
            if self.stop is not None and self.stop.requested:  # Ctrl-C (edgeq.interrupt): not left running
                self._kill_group(out.pgid, chan)
                self.check_stop()
            if not busy:
                select.select([chan], [], [], 0.05)
        out.feed(b"", final=True)
        err.feed(b"", final=True)
        return chan.recv_exit_status() if chan.exit_status_ready() else -1

    def _kill_group(self, pgid: int | None, chan: Any) -> None:
        """TERM the remote process group; KILL it once the command exited or after 2 s (a child that
        ignores TERM, or one left behind in the background). Best effort: the link may be gone."""
        if pgid is None or not self._alive():
            return
        g = int(pgid)
        try:
            self._signal_group(g, "TERM")
            deadline = time.monotonic() + KILL_GRACE_S
            while not chan.exit_status_ready() and not chan.closed and time.monotonic() < deadline:
                chan.status_event.wait(0.05)
            self._signal_group(g, "KILL")
        except Exception as exc:  # the connection is what failed; nothing more we can do from here
            log.warning("could not stop remote process group %d: %s", g, exc)

    def _signal_group(self, pgid: int, signal: str) -> None:
        killer = self._client.get_transport().open_session(timeout=5)
        try:
            killer.settimeout(10)
            killer.exec_command(f"kill -{signal} -{int(pgid)} 2>/dev/null; exit 0")
            killer.recv_exit_status()
        finally:
            killer.close()
