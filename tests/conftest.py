"""Shared test fixtures: paths to the real TensorRT 8.6 outputs and a CLI runner."""

from __future__ import annotations

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
