"""Shared test fixtures: paths to the real TensorRT 8.6 outputs and a CLI runner."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "trt86-h200"


@pytest.fixture
def trt_fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def cli(capsys):
    """Run ``edgeq ARGS`` in-process; returns (exit code, stdout, stderr)."""
    from edgeq.cli import run

    def _run(*args: str) -> tuple[int, str, str]:
        code = run([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


@pytest.fixture
def no_backoff(monkeypatch):
    """Every SSH connection attempt is real; the backoff between them (1, 2, 4 s: 7 s a target no sshd
    answers) is not waited out. The link check's 20 ms polls still sleep (no busy loop)."""
    short = types.SimpleNamespace(sleep=lambda s: time.sleep(min(s, 0.02)), monotonic=time.monotonic)
    monkeypatch.setattr("edgeq.remote.ssh.time", short)


# -- a real OpenSSH sshd on 127.0.0.1 (tests/sshd.py), for transport and deploy tests -------------------
@pytest.fixture(scope="session")
def _sshd_server():
    from sshd import SshdServer, sshd_available

    reason = sshd_available()
    if reason:
        pytest.skip(reason)
    server = SshdServer().start()
    yield server
    server.close()


@pytest.fixture
def sshd(_sshd_server):
    """A running sshd: ``.host`` (127.0.0.1) ``.port .user .identity_file .known_hosts`` (``[127.0.0.1]:PORT``
    line), ``.stop() .start() .restart() .kill_sessions() .log_tail()``, ``.ssh_config(**overrides)`` ->
    ``edgeq.remote.transport.SSHConfig`` for it. Shared by the session; restarted if a test stopped it."""
    server = _sshd_server.ensure_running()
    server.known_hosts_line()  # undo any test that rewrote known_hosts
    return server


# -- three loopback "boards" (one sshd each) for fleet, release and install tests --------------------------
@pytest.fixture(scope="module")
def servers():
    """Three real sshd on 127.0.0.1, shared by one test module (started once: each takes a second)."""
    from fleet_helpers import start_servers
    from sshd import sshd_available

    reason = sshd_available()
    if reason:
        pytest.skip(reason)
    started = start_servers(3)
    yield started
    for s in started:
        s.close()


@pytest.fixture
def boards(servers, tmp_path, monkeypatch):
    """The boards up, with their known_hosts lines, and the test in its own directory and cache."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for s in servers:
        s.ensure_running()
        s.known_hosts_line()
    return tmp_path


# -- edgeq as a user runs it: a subprocess, its whole terminal output (fd 1 and fd 2) checked ----------
# onnxruntime's C++ logger ("\x1b[1;31m2026-... [E:onnxruntime:, sequential_executor.cc ...") and paramiko's
# (its logger names, its tracebacks, the cryptography warnings it triggers): none may reach the terminal
THIRD_PARTY = re.compile(r"\[[VIWEF]:onnxruntime:|paramiko|CryptographyDeprecationWarning")


@pytest.fixture
def edgeq_process():
    """Run ``edgeq ARGS`` as a process (``cwd``, ``env`` optional); returns (exit code, stdout, stderr).
    What C++ libraries write straight to fd 2 is in stderr too, and no third-party log line may be."""

    def _run(*args: object, cwd: Path | None = None, env: dict[str, str] | None = None,
             timeout: float = 600) -> tuple[int, str, str]:  # fmt: skip
        edgeq = str(Path(sys.executable).parent / "edgeq")
        environ = {**os.environ, "COLUMNS": "160", **(env or {})}
        p = subprocess.run([edgeq, *map(str, args)], cwd=cwd, env=environ, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        found = THIRD_PARTY.search(p.stdout + p.stderr)
        assert found is None, f"edgeq {' '.join(map(str, args))}: a third-party log line:\n{p.stderr[-3000:]}"
        return p.returncode, p.stdout, p.stderr

    return _run
