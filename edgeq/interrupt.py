"""Ctrl-C for work that runs in threads (one per board): ``Stop``, the request every board's work watches.

Python delivers SIGINT to the main thread only, as a ``KeyboardInterrupt``; a board's SSH commands and
uploads run in worker threads that never see it, so on their own they run on to the end (and an install
switches the board after the operator pressed Ctrl-C). The main thread, which waits for the workers, turns
the interrupt into ``Stop.request()``; each board's connection checks ``requested`` where it waits (a
remote command is killed on the board, an upload ends between blocks, no retry starts) and raises
``Interrupted``, and no board starts a step after it. A step that must not be cut in half once begun (an
install's switch: milliseconds, atomic on the board) runs ``shielded``: it finishes, and says so.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable

from edgeq.errors import EdgeqError

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command Ctrl-C ended


class Interrupted(EdgeqError):
    """This board's work was stopped by Ctrl-C (between steps, or its remote command killed)."""

    exit_code = EXIT_INTERRUPTED


class Stop:
    """A Ctrl-C request shared by the threads of one command; ``shielded`` is per thread (one board)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._local = threading.local()
        self._wakes: dict[object, Callable[[], None]] = {}
        self._lock = threading.Lock()

    def request(self) -> None:
        self._event.set()
        with self._lock:
            wakes = list(self._wakes.values())
        for wake in wakes:  # from the thread that saw Ctrl-C: each ends a wait its own thread cannot watch
            with contextlib.suppress(Exception):
                wake()

    @property
    def was_requested(self) -> bool:
        """Ctrl-C was pressed (whether or not this thread is shielded from it now)."""
        return self._event.is_set()

    @property
    def requested(self) -> bool:
        """Stop now: Ctrl-C was pressed and this thread is not inside a ``shielded`` step."""
        return self._event.is_set() and not getattr(self._local, "shielded", 0)

    def check(self, during: str = "") -> None:
        """Raise ``Interrupted`` when a stop is requested (at a step boundary)."""
        if self.requested:
            raise Interrupted("interrupted" + (f" during {during}" if during else ""))

    @contextmanager
    def waking(self, wake: Callable[[], None]) -> Iterator[None]:
        """While the block runs, a Ctrl-C request also calls ``wake``: for a wait inside a library that this
        thread cannot interrupt to check ``requested`` (paramiko's SSH handshake and login, which ``wake``
        ends by shutting the socket down). Not inside a ``shielded`` step, whose waits run to their end."""
        if getattr(self._local, "shielded", 0):
            yield
            return
        key = object()
        with self._lock:
            self._wakes[key] = wake
        try:
            if self._event.is_set():  # requested before the block began: its wait ends at once
                wake()
            yield
        finally:
            with self._lock:
                self._wakes.pop(key, None)

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """A step that, once begun, runs to its end in this thread even if Ctrl-C comes meanwhile."""
        self._local.shielded = getattr(self._local, "shielded", 0) + 1
        try:
            yield
        finally:
            self._local.shielded -= 1
