"""Shared test fixtures: paths to the real TensorRT 8.6 outputs and a CLI runner."""

from __future__ import annotations

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
