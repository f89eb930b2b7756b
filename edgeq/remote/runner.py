"""The ``Runner`` seam: what the target-side stages need from a machine (put / run / get).

A module of its own, below everything that speaks of a Runner: ``edgeq.remote.protocol`` and
``edgeq.pipeline.rundir`` call the agent over one, ``edgeq.pipeline.stages`` composes the target stages
over one and holds the implementations (``SSHRunner``, ``LocalRunner``). Defined in ``pipeline`` it made
both of those import it back, a cycle only ``TYPE_CHECKING`` hid.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from edgeq.findings import ProgressFn, no_progress

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
