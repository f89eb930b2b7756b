"""Per-model placement overrides: force or exclude nodes by name or pattern (YAML).

Why: placement rules cover the common fusions; a model may still have a layer that must stay float for
accuracy (a detection head) or an op the rules leave float that a user has measured to fuse. The file::

    # edgeq quantize --overrides model.overrides.yaml
    exclude:              # these nodes run in float: no Q/DQ on their inputs, float weights
      - /model/head/*     # fnmatch glob on ONNX node names
    force:                # every float input of these nodes gets a Q/DQ pair, whatever the rules say
      - re:/layer1/.*/Add # 're:' = a Python regular expression (full match)

A pattern that matches no node is an error: a typo must not silently change nothing.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeq.config import Bad, Checker, check_mapping
from edgeq.errors import ConfigError, first_line

# Where the precision gate says an excluded node's float layer comes from: float on purpose, not a fallback.
INTENDED_FLOAT = "--overrides exclude (float on purpose)"


@dataclass(frozen=True)
class Overrides:
    """Node-name patterns; ``resolve`` turns them into node names for one graph."""

    exclude: tuple[str, ...] = ()
    force: tuple[str, ...] = ()
    source: str = "overrides"
    _compiled: dict[str, re.Pattern[str]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for pat in (*self.exclude, *self.force):
            self._compiled[pat] = _compile(pat, self.source)

    def resolve(self, node_names: Iterable[str]) -> tuple[frozenset[str], frozenset[str]]:
        """(excluded, forced) node names; ConfigError if a pattern matches nothing or a node is both."""
        names = list(node_names)
        hits: dict[str, set[str]] = {}
        for pat in (*self.exclude, *self.force):
            rx = self._compiled[pat]
            hits[pat] = {n for n in names if rx.fullmatch(n)}
            if not hits[pat]:
                raise ConfigError(f"{self.source}: pattern '{pat}' matches no node in the model",
                                  hint="check the node names with 'edgeq lint --json' or Netron")
        excluded = set().union(*(hits[p] for p in self.exclude)) if self.exclude else set()
        forced = set().union(*(hits[p] for p in self.force)) if self.force else set()
        both = sorted(excluded & forced)
        if both:
            raise ConfigError(f"{self.source}: node '{both[0]}' is both forced and excluded"
                              + (f" (and {len(both) - 1} more)" if len(both) > 1 else ""))
        return frozenset(excluded), frozenset(forced)


def _compile(pattern: str, source: str) -> re.Pattern[str]:
    if pattern.startswith("re:"):
        try:
            return re.compile(pattern[3:])
        except re.error as e:
            raise ConfigError(f"{source}: bad regular expression '{pattern}': {e}") from None
    return re.compile(fnmatch.translate(pattern), re.DOTALL)


def _patterns(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list):
        raise Bad("a list of node names or patterns")
    for i, item in enumerate(v):
        if not isinstance(item, str) or not item.strip():
            raise Bad(f"a list of non-empty strings (entry {i + 1} is {item!r})")
    return tuple(x.strip() for x in v)


def _version(v: Any) -> int:
    if v != 1:
        raise Bad("1 (the only version so far)")
    return 1


SCHEMA: dict[str, Checker] = {"exclude": _patterns, "force": _patterns, "version": _version}


def overrides_from_dict(data: object, source: str = "overrides") -> Overrides:
    """Validate a parsed override mapping (from YAML or code)."""
    if data is None:
        return Overrides(source=source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with 'exclude' and/or 'force' lists, "
                          f"got {type(data).__name__}")
    v = check_mapping(source, data, SCHEMA, nullable=("exclude", "force"))
    return Overrides(exclude=v.get("exclude") or (), force=v.get("force") or (), source=source)


def load_overrides(path: str | Path) -> Overrides:
    """Read and validate an override YAML file; every problem is a one-line ConfigError."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: " + ("not a file; --overrides takes a YAML file" if p.exists()
                                      else "override file not found"))
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text (YAML) file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or first_line(e)
        raise ConfigError(f"{p}: invalid YAML{where}: {problem}") from None
    return overrides_from_dict(data, source=str(p))
