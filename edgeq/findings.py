"""Findings: what a rule saw, shared by lint, clean, quantize summaries and gates."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Callable, Optional


class Level(str, Enum):
    """Members are declared most severe first; ``rank`` is that order."""

    ERROR = "error"  # TensorRT 8.6 will not parse or build this
    WARNING = "warning"  # it builds, but will not fuse / runs slower or in a wider precision
    INFO = "info"

    @property
    def rank(self) -> int:
        """0 for the most severe: the order findings are listed in and ``--fail-on`` thresholds compare."""
        return list(Level).index(self)


@dataclass(frozen=True)
class Finding:
    """One rule hit. ``source`` names where the rule comes from (doc section or fixture file)."""

    level: Level
    rule: str
    message: str
    fix: str
    source: str
    nodes: tuple[str, ...] = field(default_factory=tuple)
    names: str = "nodes"  # what ``nodes`` names: "nodes", or "inputs" (graph inputs, as dynamic-shape's)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["level"] = self.level.value
        d["nodes"] = list(self.nodes)
        return d


# A progress callback: (task description, units done, total units or None). Library code calls it;
# the CLI renders it. Keeps rich out of the library.
ProgressFn = Callable[[str, int, Optional[int]], None]


def no_progress(task: str, done: int, total: int | None) -> None:
    """Default progress sink."""
