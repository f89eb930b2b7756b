"""``--limit PATTERN``: Ansible's host patterns over a fleet's targets.

The grammar is the one Ansible documents (docs.ansible.com, "Patterns: targeting hosts and groups"), so an
operator's ``--limit`` means the same to edgeq as to ``ansible-playbook``:

- a host name, a group name, ``all`` (or ``*``), ``ungrouped`` (hosts in no other group);
- a glob (``jetson*``, ``orin-?``) over group and host names; ``~REGEX`` a regular expression (``re.match``);
- ``group[i]``, ``group[i:j]`` (inclusive) a host by position in a group, negative from the end;
- terms joined by ``:`` or ``,``: union; ``!term`` excludes, ``&term`` intersects. As in Ansible the
  unions are taken first, then the intersections, then the exclusions, whatever their written order, and a
  pattern of only ``!``/``&`` terms starts from ``all``;
- ``@FILE``: the patterns in a file, one a line (Ansible's retry files; ``#`` starts a comment), as if
  written in the term's place.

Ansible warns and ignores a term that matches nothing; a typo then silently deploys to fewer boards (or,
under ``!``, to more), so here it is an error naming the term.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from pathlib import Path

from edgeq.errors import EdgeqError

_SUBSCRIPT = re.compile(r"\A(?P<base>.+?)\[(?:(?P<one>-?\d+)|(?P<start>-?\d*):(?P<end>-?\d*))\]\Z")
# a term: anything but separators, or a whole bracketed expression (so [0:2] keeps its colon)
_TERM = re.compile(r"(?:[^\s:,\[\]]|\[[^\]]*\])+")


class LimitError(EdgeqError):
    """A ``--limit`` pattern that is malformed or selects nothing (exit 2)."""


def split_pattern(pattern: str) -> list[str]:
    """The terms of a pattern: ``a:b,c[0:1]:!d`` -> ``a``, ``b``, ``c[0:1]``, ``!d``."""
    terms: list[str] = []
    for part in pattern.split(","):
        terms += [t for t in _TERM.findall(part.strip())]
        stray = next((c for c in _TERM.sub("", part) if c in "[]"), None)
        if stray is not None:  # 'board[' read as 'board' would select a host the pattern never named
            raise LimitError(f"--limit '{pattern}': unbalanced '{stray}'",
                             "close the bracket: group[i] or group[i:j] (a host by position), or a glob's "
                             "[12]")
    for t in terms:
        if t.lstrip("!&") == "":
            raise LimitError(f"--limit '{pattern}': '{t}' names no host or group")
    return terms


def _from_file(term: str) -> list[str]:
    """The terms of ``@FILE``'s lines."""
    path = term[1:]
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else "not a text file"
        raise LimitError(f"--limit '{term}': cannot read {path}: {why}") from None
    terms = [t for line in lines for t in split_pattern(line.split("#", 1)[0])]
    if not terms:
        raise LimitError(f"--limit '{term}': {path} names no host or group", "one pattern a line")
    return terms


def _names(candidates: list[str], pattern: str) -> list[str]:
    if pattern.startswith("~"):
        try:
            rx = re.compile(pattern[1:])
        except re.error as e:
            raise LimitError(f"--limit: '{pattern}' is not a regular expression: {e}") from None
        return [c for c in candidates if rx.match(c)]
    return [c for c in candidates if fnmatch.fnmatchcase(c, pattern)]


def _members(hosts: Mapping[str, set[str]]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {"all": list(hosts), "ungrouped": []}
    for name, its in hosts.items():
        for g in sorted(its):
            if g not in ("all", "ungrouped"):
                groups.setdefault(g, []).append(name)
        if not set(its) - {"all", "ungrouped"}:
            groups["ungrouped"].append(name)
    return groups


def _match(hosts: Mapping[str, set[str]], groups: dict[str, list[str]], term: str) -> list[str]:
    """The hosts one term names, as Ansible's inventory manager enumerates them: groups first; host
    names when no group matched or the term is a glob or regex."""
    sub = None if term.startswith("~") else _SUBSCRIPT.match(term)
    base = sub.group("base") if sub else term
    if base == "*":
        base = "all"
    out: list[str] = []
    matched = _names(list(groups), base)
    for g in matched:
        out += [h for h in groups[g] if h not in out]
    if not matched or base.startswith("~") or any(c in base for c in ".?*["):
        out += [h for h in _names(list(hosts), base) if h not in out]
    if sub:
        if sub.group("one") is not None:
            i = int(sub.group("one"))
            out = out[i:i + 1] if i >= 0 else out[len(out) + i:len(out) + i + 1]
        else:
            if sub.group("start") == "" and sub.group("end") == "":
                raise LimitError(f"--limit: '{term}' is not a host range", "write group[i], group[i:j]")
            start = int(sub.group("start") or 0)
            end = int(sub.group("end")) if sub.group("end") else len(out) - 1
            start, end = (start + len(out) if start < 0 else start), (end + len(out) if end < 0 else end)
            out = out[start:end + 1]
    return out


def select(hosts: Mapping[str, set[str]], pattern: str) -> list[str]:
    """The names of ``hosts`` (name -> its group names) that ``pattern`` selects, in ``hosts``' order.

    Raises LimitError (exit 2) naming a term that matches no host, or the pattern when the terms together
    leave none.
    """
    terms = [x for t in split_pattern(pattern) for x in (_from_file(t) if t.startswith("@") else [t])]
    if not terms:
        raise LimitError(f"--limit '{pattern}': the pattern is empty (an unset shell variable?)",
                         "name hosts, groups or globs; leave --limit out for the whole fleet")
    groups = _members(hosts)
    union = [t for t in terms if t[0] not in "!&"]
    inter = [t[1:] for t in terms if t[0] == "&"]
    exclude = [t[1:] for t in terms if t[0] == "!"]
    picked: set[str] = set()
    for t in union or ["all"]:
        hit = _match(hosts, groups, t)
        if not hit:
            raise LimitError(f"--limit: '{t}' matches no target or group",
                             f"targets: {', '.join(list(hosts)[:8])}{' ...' if len(hosts) > 8 else ''}")
        picked |= set(hit)
    for t in inter:
        hit = _match(hosts, groups, t)
        if not hit:
            raise LimitError(f"--limit: '&{t}' matches no target or group")
        picked &= set(hit)
    for t in exclude:
        hit = _match(hosts, groups, t)
        if not hit:
            raise LimitError(f"--limit: '!{t}' matches no target or group")
        picked -= set(hit)
    chosen = [h for h in hosts if h in picked]
    if not chosen:
        raise LimitError(f"--limit '{pattern}' leaves no target")
    return chosen
