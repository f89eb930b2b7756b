"""Why a target could not be used, one table for every command: the cause of a connection failure, the
exit code it gives and whether the target answered on its SSH port.

``targets check`` and ``deploy`` exit with the error's ``exit_code``; ``fleet validate`` and ``run`` keep it
per row and show ``reachable`` from ``answered``; every one of them prints the error's own message. So a
cause reads and exits the same wherever it happens. The error classes (``hostkeys``, ``ssh``) name their
cause here and take their exit code from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Cause:
    name: str  # what a fleet row's "cause" says
    exit_code: int  # 2: the user's to fix (known_hosts, keys, the target file, its host name); 1: the target
    # or its network
    answered: bool  # the target's sshd answered: it is reachable, it refused us (or we refused it)


CAUSES: dict[str, Cause] = {
    c.name: c
    for c in (
        Cause("host key unknown", 2, True),
        Cause("host key changed", 2, True),
        Cause("authentication refused", 2, True),
        Cause("unknown host name", 2, False),  # a typo in the target file: asking again will not fix it
        Cause("connection refused", 1, False),
        Cause("no SSH banner", 1, False),  # TCP accepted, sshd silent (hung): not retried, said at once
        Cause("unreachable", 1, False),
        Cause("connection dropped", 1, True),
    )
}


def cause_of(error: BaseException) -> Optional[Cause]:
    """The cause an error names (its class's ``cause``), None for any other failure."""
    return CAUSES.get(getattr(error, "cause", None) or "")
