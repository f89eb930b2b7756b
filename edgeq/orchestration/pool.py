"""Many boards at once, for every fleet-wide command (``fleet validate``, ``run``, ``release install``,
``release rollback``, ``fleet status``): one mechanism for the three rules they share.

- At most ``workers`` boards at a time (threads: the work is SSH waits, not CPU).
- ``--max-fail N``: no board is started once N have failed; the ones not started are reported as
  skipped, never as failed (they were not tried).
- Ctrl-C (``edgeq.interrupt``): Python raises it in the main thread, which here waits for the workers;
  it becomes ``stop.request()``, so no board starts after it and the running ones stop at their next wait
  (their remote command killed on the board). ``run`` returns once they have wound down, and the caller
  records what finished and says "interrupted" (exit 130).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

from edgeq.interrupt import Stop

INTERRUPTED = "interrupted"  # why a board was not started: Ctrl-C came first
# ``release install``'s default canary, the safe one (Ansible's ``serial: 1`` before the rest): one board
# installs and is checked first, the others start only if it passed; 0 installs on every board at once.
# Here, not in ``install``, so the CLI's default needs no heavy import.
CANARY = 1


@dataclass
class BoardPool:
    """The boards of one command: its workers, its failures so far and its Ctrl-C. A job holds ``lock``
    while it updates its row and ``failures``, so ``not_started`` sees every failure counted."""

    workers: int
    max_fail: Optional[int] = None
    stop: Stop = field(default_factory=Stop)
    lock: threading.Lock = field(default_factory=threading.Lock)
    failures: int = 0

    @property
    def interrupted(self) -> bool:
        return self.stop.was_requested

    def not_started(self) -> Optional[str]:
        """Why a board about to start must not (the caller holds ``lock``): ``INTERRUPTED``, or
        ``max-fail: N failed``; None: start it."""
        if self.stop.was_requested:
            return INTERRUPTED
        if self.max_fail is not None and self.failures >= self.max_fail:
            return f"max-fail: {self.failures} failed"
        return None

    def run(self, jobs: Sequence[Callable[[], None]], name: str = "edgeq-board") -> None:
        """Each job on a worker thread, ``workers`` at a time, until all have ended. Ctrl-C while waiting
        requests the stop and goes on waiting, for the seconds the jobs take to wind down (a second
        Ctrl-C the same); anything but an EdgeqError inside a job is a bug: its traceback surfaces here."""
        if not jobs:
            return
        with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(jobs))),
                                thread_name_prefix=name) as pool:  # fmt: skip
            pending = [pool.submit(job) for job in jobs]
            while pending:
                try:
                    pending[0].result()
                    pending.pop(0)
                except KeyboardInterrupt:
                    self.stop.request()


__all__: Sequence[str] = ("CANARY", "INTERRUPTED", "BoardPool")
