"""One config layer for the YAML files edgeq reads: targets, fleets, pipelines and overrides are schemas
walked here; preprocessing specs share its unknown-key message. A ``gate:`` section (target and
pipeline files alike) has one schema, read by ``edgeq.remote.targets.gate_from_dict``.

A schema is a table of keys, each with a checker that returns the value or raises ``Bad(expected)``;
sections are nested tables. Every problem is one ``ConfigError`` naming the file, the key (dotted) and
what was expected; an unknown key gets a did-you-mean. Why not pydantic: these are a few dozen flat keys
whose messages must read like the rest of edgeq's, and the host CLI should not pull a compiled
dependency (and its error format) in for that; a checker table is data that one function walks.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Callable, Optional

from edgeq.errors import ConfigError

Checker = Callable[[Any], Any]
SECTION: Checker = dict  # a table value meaning "a nested mapping, checked against SECTIONS[key]"


class Bad(Exception):
    """``expected`` text for the ConfigError; raised by checkers."""


def unknown_key(source: Any, key: Any, known: Iterable[str], where: str = "") -> ConfigError:
    """``<file>: unknown key 'x'`` with the nearest known key, or the list of known keys."""
    known = list(known)
    near = difflib.get_close_matches(str(key), known, n=1)
    hint = f"did you mean '{near[0]}'?" if near else f"known keys: {', '.join(sorted(known))}"
    return ConfigError(f"{source}: unknown key '{where}{key}'", hint)


def check_mapping(
    path: Any,
    data: Mapping[str, Any],
    table: Mapping[str, Checker],
    where: str = "",
    sections: Optional[Mapping[str, Mapping[str, Checker]]] = None,
    nullable: Iterable[str] = (),
) -> dict[str, Any]:
    """Check every key of ``data`` against ``table`` (sections recursively); returns checked values."""
    nullable = set(nullable)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in table:
            raise unknown_key(path, key, table, where)
        checker = table[key]
        if checker is SECTION:
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"{path}: '{where}{key}' must be a mapping of keys", None)
            out[key] = check_mapping(path, value, (sections or {})[key], f"{where}{key}.", sections, nullable)
            continue
        if value is None and key in nullable:
            out[key] = None
            continue
        try:
            out[key] = checker(value)
        except Bad as e:
            raise ConfigError(f"{path}: '{where}{key}' must be {e} (got {value!r})", None) from None
    return out


def require_mapping(path: Any, data: Any, example: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: must be a YAML mapping ({example})")
    return data


def string(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise Bad("a non-empty string")
    return v.strip()


def boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise Bad("true or false")
    return v


def positive_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise Bad("a positive integer")
    return v


def number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Bad("a number")
    return float(v)


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; syntax errors become one ConfigError with the line."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None


def mapping(v: Any) -> dict[str, Any]:
    if not isinstance(v, Mapping):
        raise Bad("a mapping of keys")
    return dict(v)


def items(v: Any) -> list[Any]:
    if not isinstance(v, list):
        raise Bad("a list")
    return v
