"""The fleet matrix as a person reads it (issue 27.14): at 80 columns it cannot hold every column; the ones
left out are named, with where to see them, never dropped silently."""

from __future__ import annotations

import re
from pathlib import Path

from edgeq.orchestration.fleet import FleetResult, Row

HEADERS = ["target", "reachable", "TensorRT", "GPU (sm)", "build", "gate", "p50 ms", "p99 ms", "qps",
           "report", "result"]  # fmt: skip


def _result(tmp_path: Path) -> FleetResult:
    """Three boards as ``fleet validate`` leaves them: two passed (one reused its kind's engine), one
    refused."""
    rows = []
    for i, (status, build) in enumerate((("passed", "ok"), ("passed", "reused"), ("failed", None)), 1):
        run = tmp_path / "runs" / "fleet-m-fleet-20261126T070000Z" / "targets" / f"orin-agx-{i}"
        passed = status == "passed"
        facts = dict(reachable=True, tensorrt="8.6.2", gpu="Orin", compute_capability="8.7", build=build,
                     gate=True, latency_p50_ms=1.24, latency_p99_ms=1.61, throughput_qps=806.3,
                     report=str(run / "report.html")) if passed else dict(
                         error="cannot connect to ops@10.0.0.3:22: no answer", reachable=False,
                         cause="unreachable")  # fmt: skip
        rows.append(Row(f"orin-agx-{i}", f"ops@10.0.0.{i}:22", status, **facts))  # type: ignore[arg-type]
    return FleetResult(tmp_path / "runs" / "fleet-m", Path("m.onnx"), rows, "2026-11-26T07:00:00Z")


def _printed(tmp_path, capsys, monkeypatch, columns: int) -> str:
    from edgeq.cli.fleet import _print_matrix

    monkeypatch.setenv("COLUMNS", str(columns))
    _print_matrix(_result(tmp_path))
    return capsys.readouterr().out


def test_a_narrow_matrix_names_the_columns_it_left_out_and_how_to_see_them(tmp_path, capsys, monkeypatch):
    out = _printed(tmp_path, capsys, monkeypatch, 80)
    assert max(len(line) for line in out.splitlines()) <= 80
    table, note = out.split("\nnot shown at 80 columns: ")
    note = " ".join(note.split())  # wrapped at 80 columns
    left_out = note.split(" (--json")[0].split(", ")
    header = next(line for line in table.splitlines() if "target" in line)
    assert left_out and not [h for h in left_out if h in header], out
    assert [h for h in HEADERS if h not in left_out] == [h for h in HEADERS if h in header], out
    assert "--json has every column" in note
    wide = int(re.search(r"COLUMNS=(\d+)", note).group(1))

    out = _printed(tmp_path, capsys, monkeypatch, wide)  # the width it said: every column, no note
    assert "not shown" not in out and all(h in out for h in HEADERS), out
    assert max(len(line) for line in out.splitlines()) <= wide


def test_a_narrow_matrix_keeps_each_verdict_with_its_reason_and_drops_descriptions_first(
        tmp_path, capsys, monkeypatch):
    """Issue 43.8: at 80 columns the matrix kept "GPU (sm)" ("target file: NVIDIA H200 (9.0)") and dropped
    reachable and build, and a failed board's row read "- (-) ... FAILED" with no reason. The descriptive
    columns go first; the row says why it failed (its cause), the whole reason follows the table."""
    result = _result(tmp_path)
    for r in result.rows[:2]:
        r.sources = {"gpu": "target file", "compute_capability": "target file"}
    monkeypatch.setenv("COLUMNS", "80")
    from edgeq.cli.fleet import _print_matrix

    _print_matrix(result)
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "target" in line)
    assert "GPU (sm)" not in header and "reachable" in header, out
    failed = next(line for line in out.splitlines() if line.startswith("│ orin-agx-3"))
    assert "FAILED (unreachable)" in failed, out
    assert "  orin-agx-3: cannot connect to ops@10.0.0.3:22: no answer" in out, out
