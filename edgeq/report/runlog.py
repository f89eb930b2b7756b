"""Figures from trtexec logs: throughput and latency from a run log, the error from a failed build.

``trtexec`` prints its summary as ``[I] Throughput: 1687.06 qps`` and ``[I] Latency: min = ..., median =
0.686 ms, ...`` (TensorRT samples/common/sampleReporting.cpp, ``printEpilog``); a failed build prints
``[E] Error[N]: <message>`` lines (fixtures ``trt86-h200-edgeq/yolo_edgeq_all.explicit.build.log``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from edgeq.errors import ReportError

_ERROR = re.compile(r"\[E\]\s*(?:\[TRT\]\s*)?Error\[\d+\]:\s*(.+)$")
_ANY_ERROR = re.compile(r"\[E\]\s*(.+)$")


@dataclass(frozen=True)
class RunFigures:
    """One timed run of an engine as trtexec summarised it."""

    source: str
    throughput_qps: Optional[float]
    latency_median_ms: Optional[float] = None
    gpu_compute_median_ms: Optional[float] = None


def _read(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except OSError as e:
        raise ReportError(f"{path}: cannot read ({e.strerror})") from None


def run_figures_from_log(path: Path) -> RunFigures:
    """Throughput and median latencies of a ``trtexec --loadEngine`` run log (its last summary), read by
    the same parser the agent's trtexec backend uses on the target."""
    from edgeq.agent.trtexec_backend import parse_performance_summary

    s = parse_performance_summary(_read(path).splitlines())
    figures = RunFigures(str(path), s.get("throughput_qps"), (s.get("latency_ms") or {}).get("median"),
                         (s.get("gpu_compute_time_ms") or {}).get("median"))
    if figures.throughput_qps is None and figures.latency_median_ms is None:
        raise ReportError(
            f"{path}: no 'Throughput:' or 'Latency:' summary: not a trtexec run log, or the run failed",
            hint="give the log of 'trtexec --loadEngine=... ' that timed the engine",
        )
    return figures


def build_error_from_log(path: Path) -> Optional[str]:
    """The first TensorRT error of a build log (``None`` when the log shows none)."""
    text = _read(path)
    first_any = None
    for line in text.splitlines():
        m = _ERROR.search(line)
        if m:
            return m.group(1).strip()
        m = _ANY_ERROR.search(line)
        if m and first_any is None:
            first_any = m.group(1).strip()
    return first_any
