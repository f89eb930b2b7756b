"""A real OpenSSH sshd on 127.0.0.1 for transport and deploy tests (and bench/transfer_bench.py).

Why a real server: paramiko's own test server would prove only that paramiko talks to paramiko; the
targets run OpenSSH. Everything lives in a temporary directory (host key, client key, authorized_keys,
known_hosts, config, log), the port is a random free one, and only 127.0.0.1 is ever used.

    with SshdServer() as sshd:
        sshd.host, sshd.port, sshd.user, sshd.identity_file, sshd.known_hosts
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
HOST = "127.0.0.1"  # never anything else


def sshd_available() -> str | None:
    """None when a server can be started, else the reason it cannot (for pytest.skip)."""
    if not SSHD.exists():
        return f"{SSHD} not found: install openssh-server (tests/run.sh does this as root)"
    if not Path(SSH_KEYGEN).exists():
        return "ssh-keygen not found: install openssh-client"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def keygen(path: Path, kind: str = "ed25519") -> Path:
    """Write an unencrypted key pair at ``path`` / ``path.pub``."""
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", kind, "-N", "", "-C", "edgeq-test", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    return path


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM sshd if the test process dies without tearing it down."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (Linux)


def _descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children first), from /proc: only processes we started."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class SshdServer:
    """One sshd process with its own keys; ``stop()``/``start()`` keep the port and keys."""

    def __init__(self, workdir: Path | None = None, *, env: dict[str, str] | None = None,
                 config: tuple[str, ...] = ()) -> None:
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="edgeq-sshd-"))
        self.host = HOST
        self.port = 0
        self.user = getpass.getuser()
        self.env = env  # sshd's own environment (None: the test's), e.g. nss_wrapper's (board_user)
        self.config = config  # extra sshd_config lines (SetEnv PATH=... for a board's own tools)
        self.host_key = keygen(self.dir / "ssh_host_ed25519_key")
        self.identity_file = str(keygen(self.dir / "id_ed25519"))
        self.authorized_keys = self.dir / "authorized_keys"
        self.authorized_keys.write_text(Path(self.identity_file + ".pub").read_text())
        self.known_hosts = str(self.dir / "known_hosts")
        self.log_file = self.dir / "sshd.log"
        self.config_file = self.dir / "sshd_config"
        self.proc: subprocess.Popen[bytes] | None = None
        atexit.register(self.close)  # a test run that ends without teardown still removes keys and dir

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> SshdServer:
        if self.proc is not None and self.proc.poll() is None:
            return self
        if os.geteuid() == 0:
            # sshd refuses to start without its privilege-separation directory (made by the init script).
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        last_error = ""
        for _ in range(5):  # another process may grab the free port between probe and bind
            port = self.port or _free_port()
            self._write_config(port)
            self.proc = subprocess.Popen(
                [str(SSHD), "-D", "-f", str(self.config_file), "-E", str(self.log_file)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                preexec_fn=_die_with_parent,
                env=self.env,
            )
            if self._wait_listening(port):
                self.port = port
                self.known_hosts_line()  # (re)write known_hosts for this port
                return self
            last_error = self._reap()
        raise RuntimeError(f"sshd did not start: {last_error}\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop the listener and every session it spawned."""
        if self.proc is None:
            return
        self.kill_sessions()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None

    def restart(self) -> SshdServer:
        self.stop()
        return self.start()

    def ensure_running(self) -> SshdServer:
        return self.start()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SshdServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers for tests ----------------------------------------------------------------------------
    def kill_sessions(self) -> int:
        """SIGKILL every per-connection sshd (and what runs under it): a dropped connection, for real."""
        if self.proc is None:
            return 0
        victims = _descendants(self.proc.pid)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(victims)

    def known_hosts_line(self) -> str:
        """``[127.0.0.1]:PORT ssh-ed25519 AAAA...`` and write it as the only line of ``known_hosts``."""
        kind, blob = (self.dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        line = f"[{self.host}]:{self.port} {kind} {blob}"
        Path(self.known_hosts).write_text(line + "\n")
        return line

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def ssh_config(self, **overrides: Any) -> Any:
        """An ``edgeq.remote.transport.SSHConfig`` for this server (no agent, quick retries)."""
        from edgeq.remote.transport import SSHConfig

        fields: dict[str, Any] = dict(
            host=self.host,
            port=self.port,
            user=self.user,
            identity_file=self.identity_file,
            known_hosts=self.known_hosts,
            use_agent=False,
            connect_timeout=10.0,
            retries=1,
            backoff=0.1,
        )
        fields.update(overrides)
        return SSHConfig(**fields)

    def ssh_options(self) -> list[str]:
        """Options for OpenSSH's own clients (ssh, sftp, scp) matching this server."""
        return [
            "-o", f"Port={self.port}",
            "-o", f"User={self.user}",
            "-o", f"IdentityFile={self.identity_file}",
            "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes",
        ]  # fmt: skip

    # -- internals ------------------------------------------------------------------------------------
    def _write_config(self, port: int) -> None:
        sftp = Path("/usr/lib/openssh/sftp-server")
        self.config_file.write_text(
            "\n".join(
                [
                    f"ListenAddress {HOST}:{port}",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.dir / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.authorized_keys}",
                    "AuthenticationMethods publickey",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    # CI runs as root: keys only.
                    "PermitRootLogin prohibit-password",
                    "StrictModes no",
                    "UsePAM no",
                    "AllowTcpForwarding yes",  # the jump-host tests go through this server to itself
                    "MaxStartups 64",
                    "MaxSessions 64",
                    "LogLevel VERBOSE",
                    # Bash sources ~/.bashrc for ssh commands only when SHLVL starts below 2: keep the
                    # developer's rc files (e.g. `pyenv init`, which takes a global lock) out of tests.
                    "SetEnv SHLVL=1",
                    f"Subsystem sftp {sftp if sftp.exists() else 'internal-sftp'}",
                    *self.config,
                    "",
                ]
            )
        )

    def _wait_listening(self, port: int, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection((HOST, port), timeout=1.0) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return True
            except OSError:
                time.sleep(0.05)
        return False

    def _reap(self) -> str:
        if self.proc is None:
            return ""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5)
        err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None
        return err.strip()


if __name__ == "__main__":  # manual poking: python tests/sshd.py
    with SshdServer() as server:
        print(f"sshd on {server.host}:{server.port}; ssh {' '.join(server.ssh_options())} {server.host}")
        with contextlib.suppress(KeyboardInterrupt):
            server.proc.wait()  # type: ignore[union-attr]
