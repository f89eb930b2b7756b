"""The ``Runner`` seam: what the target-side stages need from a machine (put / run / get), and the two
machines there are: an SSH connection (``SSHRunner``) and this one (``LocalRunner``, ``host: local``).

The bottom of the transport as the stages see it: ``edgeq.remote.protocol`` and ``edgeq.pipeline`` call
the agent over a ``Runner`` and never ask which one; ``target_runner`` picks it from the target file.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from edgeq.findings import ProgressFn, no_progress
from edgeq.text import plain

if TYPE_CHECKING:
    from edgeq.interrupt import Stop
    from edgeq.remote.sshconfig import SSHConfig
    from edgeq.remote.targets import Target

# One line of output for whoever follows along (a target's stderr line, a run's event).
EventFn = Callable[[str], None]


class Runner(Protocol):
    """What the target-side stages need from a machine: put a file, run an argv, get a file."""

    destination: str

    def put(self, local: Path, remote_dir: str, *, progress: ProgressFn = no_progress) -> Any:
        """Upload into a content-addressed cache under ``remote_dir``; returns an ``Upload``."""

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: Optional[float] = None,
        check: bool = True,
        on_stderr: Optional[EventFn] = None,
    ) -> Any:
        """Run ``argv`` (never through a shell parser); returns a ``CommandResult``."""

    def get(self, remote: str, local: Path) -> None:
        """Download ``remote`` to ``local``."""


# --------------------------------------------------------------------------------------------------
# The runners: an SSH connection, or this machine
# --------------------------------------------------------------------------------------------------


class SSHRunner:
    """The SSH connection as a ``Runner`` (paramiko stays inside ``edgeq.remote.transport``)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.destination: str = conn.config.destination

    def put(self, local: Path, remote_dir: str, *, progress: ProgressFn = no_progress) -> Any:
        return self.conn.put_cached(local, remote_dir, progress=progress)

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: Optional[float] = None,
        check: bool = True,
        on_stderr: Optional[EventFn] = None,
    ) -> Any:
        return self.conn.run(argv, timeout=timeout, check=check, on_stderr=on_stderr)

    def get(self, remote: str, local: Path) -> None:
        self.conn.get(remote, local)


@contextmanager
def ssh_runner(config: SSHConfig, stop: Optional[Stop] = None) -> Iterator[SSHRunner]:
    """A lazily connecting SSH ``Runner``, closed at the end of the block; ``stop``: Ctrl-C seen by the
    main thread ends its commands and uploads (edgeq.interrupt)."""
    from edgeq.remote.transport import Connection

    with Connection(config, stop) as conn:
        yield SSHRunner(conn)


class LocalRunner:
    """This machine as a ``Runner`` (a target file with ``host: local``): the agent runs as a
    subprocess, no SSH; ``put`` copies into the same content-addressed cache layout the SSH upload
    uses (``<cache>/<sha256>/<name>``). Relative work dirs are taken from the home directory, as an
    SSH login resolves them."""

    destination = "local"

    def __init__(self, home: Optional[Path] = None, stop: Optional[Stop] = None) -> None:
        self.home = Path(home) if home is not None else Path.home()
        self.stop = stop

    def _path(self, remote: str) -> Path:
        p = Path(remote).expanduser()
        return p if p.is_absolute() else self.home / p

    def put(self, local: Path, remote_dir: str, *, progress: ProgressFn = no_progress) -> Any:
        import shutil

        from edgeq.fs import atomic_path, sha256_file
        from edgeq.remote.upload import Upload

        digest = sha256_file(local)
        dest = self._path(remote_dir) / digest / Path(local).name
        cached = dest.is_file() and sha256_file(dest) == digest
        if not cached:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(dest) as tmp:
                shutil.copyfile(local, tmp)
        return Upload(str(dest), digest, 0 if cached else Path(local).stat().st_size, 0, cached)

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: Optional[float] = None,
        check: bool = True,
        on_stderr: Optional[EventFn] = None,
    ) -> Any:
        import signal as _signal
        import subprocess

        from edgeq.errors import RemoteError
        from edgeq.remote.exec import CommandResult

        try:
            proc = subprocess.Popen(list(argv), cwd=self.home, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, errors="replace")  # fmt: skip
        except OSError as e:  # the program itself: a target file's python that is not there (or not runnable)
            raise RemoteError(f"local: cannot run {argv[0]}: {e.strerror or e}",
                              "set the target file's 'python' to an interpreter on this machine",
                              exit_code=2) from None  # fmt: skip
        err_lines: list[str] = []
        out_parts: list[str] = []

        def pump_err() -> None:  # streamed line by line, as the SSH runner streams the target's stderr
            assert proc.stderr is not None
            for line in proc.stderr:
                err_lines.append(line)
                if on_stderr is not None:
                    on_stderr(line.rstrip("\n"))

        def pump_out() -> None:
            assert proc.stdout is not None
            out_parts.append(proc.stdout.read())

        readers = [threading.Thread(target=f, daemon=True) for f in (pump_err, pump_out)]
        for r in readers:
            r.start()
        try:
            self._wait(proc, timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RemoteError(f"local: {argv[0]} ran past {plain(timeout)} s and was stopped",
                              "raise the target's timeouts") from None  # fmt: skip
        finally:
            for r in readers:
                r.join(5)
        out = "".join(out_parts)
        code, sig = proc.returncode, None
        if code < 0:
            sig, code = _signal.Signals(-code).name.removeprefix("SIG"), 128 - code
        res = CommandResult(tuple(argv), code, out, "".join(err_lines), sig)
        if check and not res.ok:
            raise RemoteError(f"local: {argv[0]} {res.status}", "".join(err_lines[-3:]).strip() or None)
        return res

    def _wait(self, proc: Any, timeout: Optional[float]) -> None:
        """``proc.wait(timeout)``, ended early by Ctrl-C (``stop``): the process is terminated (then
        killed), as the SSH runner kills a remote command's process group."""
        import subprocess
        import time

        from edgeq.remote.exec import KILL_GRACE_S

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(proc.args, timeout or 0)
            try:
                proc.wait(timeout=0.1 if left is None else min(0.1, left))
                return
            except subprocess.TimeoutExpired:
                pass
            if self.stop is not None and self.stop.requested:
                proc.terminate()
                try:
                    proc.wait(timeout=KILL_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                self.stop.check()

    def get(self, remote: str, local: Path) -> None:
        import shutil

        from edgeq.fs import atomic_path

        with atomic_path(local) as tmp:
            shutil.copyfile(self._path(remote), tmp)


@contextmanager
def target_runner(target: Target, accept_new_host_key: bool = False, stop: Optional[Stop] = None
                  ) -> Iterator[Runner]:
    """The ``Runner`` a target file asks for: this machine for ``host: local``, else SSH; ``stop``: a
    Ctrl-C the main thread saw ends its commands (edgeq.interrupt)."""
    if target.is_local:
        yield LocalRunner(stop=stop)
        return
    with ssh_runner(target.ssh_config(accept_new_host_key), stop) as runner:
        yield runner
