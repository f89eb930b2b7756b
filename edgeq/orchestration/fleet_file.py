"""Fleet files: which targets a model is validated on, as edgeq's own list or an Ansible inventory.

edgeq's form (``targets/fleet.yaml``)::

    workers: 4                    # targets deployed to at once (default: all, at most 8)
    targets:
      - orin-agx                  # a target name (targets/orin-agx.yaml) or a path
      - targets/xavier-*.yaml     # a glob (relative to the current directory)
      - target: orin-nano         # per-target overrides, merged into the target file's keys
        overrides: {build: {fp16: false}, gate: {allow: [/head/*]}}
    groups:                       # named subsets for --limit (Ansible's host patterns): group -> targets
      orins: [orin-agx, orin-nano]
    allowed_signers: keys/allowed_signers   # release install: only bundles these keys signed

An Ansible inventory (YAML or INI, as ``ansible-inventory`` reads them) works as it is, so a fleet is
the inventory users already keep: every host of every group becomes a target named after the host
(its groups, for ``--limit``, the inventory's);
``ansible_host``, ``ansible_port``, ``ansible_user`` and ``ansible_ssh_private_key_file`` give the SSH
access; any other target-file key is an ``edgeq_<key>`` variable (host, group or ``all`` vars, the host's
winning), e.g. ``edgeq_known_hosts``, ``edgeq_python``, ``edgeq_backend``, ``edgeq_build`` (a mapping);
``edgeq_allowed_signers`` is the fleet's ``allowed_signers`` (one value for every host).
"""

from __future__ import annotations

import glob
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from edgeq import config
from edgeq.errors import ConfigError
from edgeq.remote.targets import (
    NULLABLE,
    SECTIONS,
    TOP,
    Target,
    resolve_target,
    target_from_dict,
    target_path,
)

MAX_WORKERS = 8
# Ansible's connection variables (and their pre-2.0 ansible_ssh_* spellings, still read by Ansible).
_ANSIBLE = {"ansible_host": "host", "ansible_port": "port", "ansible_user": "user",
            "ansible_ssh_private_key_file": "identity_file", "ansible_ssh_host": "host",
            "ansible_ssh_port": "port", "ansible_ssh_user": "user"}  # fmt: skip


@dataclass(frozen=True)
class Fleet:
    path: Path
    targets: tuple[Target, ...]
    workers: int
    kind: str  # "edgeq" or "ansible"
    groups: Mapping[str, frozenset[str]] = field(default_factory=dict)  # target name -> its groups
    # ssh-keygen allowed-signers file: ``release install`` then installs only bundles signed by its keys
    allowed_signers: Optional[Path] = None

    def limited(self, pattern: Optional[str]) -> Fleet:
        """The fleet cut to the targets ``pattern`` selects (``--limit``, Ansible's host patterns); None:
        the whole fleet. An empty pattern (an unset shell variable) is refused, never read as "all"."""
        if pattern is None:
            return self
        from edgeq.orchestration.limit import select

        names = set(select({t.name: set(self.groups.get(t.name, ())) for t in self.targets}, pattern))
        return replace(self, targets=tuple(t for t in self.targets if t.name in names))


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _entry_targets(path: Path, entry: Any, i: int) -> list[Target]:
    where = f"{path}: 'targets' entry {i + 1}"
    if isinstance(entry, str):
        if any(c in entry for c in "*?["):
            hits = sorted(glob.glob(entry))
            if not hits:
                raise ConfigError(f"{where}: glob '{entry}' matches no target file")
            return [resolve_target(h) for h in hits]
        return [resolve_target(entry)]
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: a target name, a glob, or a mapping with 'target' (and 'overrides')")
    v = config.check_mapping(where, entry, {"target": config.string, "overrides": _mapping,
                                            "name": config.string})  # fmt: skip
    if "target" not in v:
        raise ConfigError(f"{where}: missing 'target'")
    spec = v["target"]
    base = resolve_target(spec)  # the file exists and is valid on its own
    overrides = v.get("overrides") or {}
    # the overrides are this file's: checked here, so their errors name this file and entry
    config.check_mapping(where, overrides, TOP, "overrides.", SECTIONS, NULLABLE)
    data = config.read_yaml(target_path(spec))
    merged = _merge(config.require_mapping(base.path, data, "host: ..."), overrides)
    try:
        return [target_from_dict(merged, base.path, v.get("name", base.name))]
    except ConfigError as e:  # valid alone, not together with the target file
        raise ConfigError(f"{where}: {e.message} (with the overrides of this entry)", e.hint) from None


def _mapping(v: Any) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise config.Bad("a mapping of target-file keys (checked with the target file's schema)")
    return v


def _groups(v: Any) -> Mapping[str, list[str]]:
    if not isinstance(v, Mapping) or not all(
        isinstance(m, list) and all(isinstance(x, str) for x in m) for m in v.values()
    ):
        raise config.Bad("a mapping of group name -> list of target names (or globs)")
    return v


def _members(path: Path, groups: Mapping[str, list[str]], names: list[str]) -> dict[str, set[str]]:
    """A fleet file's ``groups:`` as target -> groups; a member naming no target is an error."""
    import fnmatch

    out: dict[str, set[str]] = {}
    for group, members in groups.items():
        for m in members:
            hits = [n for n in names if fnmatch.fnmatchcase(n, m)]
            if not hits:
                raise ConfigError(f"{path}: 'groups': '{group}' lists '{m}', no target of this fleet",
                                  f"targets: {', '.join(names[:8])}")
            for n in hits:
                out.setdefault(n, set()).add(str(group))
    return out


def _entries(v: Any) -> list[Any]:
    if not isinstance(v, list):
        raise config.Bad("a list of target names, globs or mappings")
    return v


def _ansible_hosts(path: Path, group: Mapping[str, Any], inherited: dict[str, Any],
                   out: dict[str, dict[str, Any]], member: dict[str, set[str]],
                   names: tuple[str, ...]) -> None:
    """Walk a YAML inventory group: vars flow down to children and hosts, the nearest winning; a host
    is a member of its group and of the groups above it (``names``), as in Ansible."""
    own = _merge(inherited, group.get("vars") or {})
    for name, hvars in (group.get("hosts") or {}).items():
        out[str(name)] = _merge(out.get(str(name), own), hvars or {})
        member.setdefault(str(name), set()).update(names)
    for cname, child in (group.get("children") or {}).items():
        _ansible_hosts(path, child or {}, own, out, member, (*names, str(cname)))


# Ansible's boolean words (ansible.module_utils.parsing.convert_bool), for an unquoted INI value.
_BOOLEANS = {"yes": True, "on": True, "true": True, "y": True, "t": True,
             "no": False, "off": False, "false": False, "n": False, "f": False}  # fmt: skip


def _scalar(text: str) -> Any:
    """An INI inventory value as Ansible's ini plugin reads it: Python's literal syntax (``"8.6"`` the
    string 8.6, ``{"fp16": False}`` a dict, ``True``), else the text; an unquoted boolean word (yes, true,
    off) is a bool, as Ansible's boolean options take it. A number keeps its text: the target schema says
    which keys are numbers, and a version 8.10 must not become the float 8.1."""
    import ast

    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _BOOLEANS.get(text.lower(), text)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return text
    return value


def _ini_inventory(path: Path, text: str, member: dict[str, set[str]]) -> dict[str, dict[str, Any]]:
    """The INI inventory form: ``[group]`` host lines with ``key=value`` vars, ``[group:vars]``,
    ``[group:children]``."""
    import shlex

    groups: dict[str, list[tuple[str, dict[str, str]]]] = {}
    gvars: dict[str, dict[str, str]] = {}
    children: dict[str, list[str]] = {}
    section, kind = "ungrouped", "hosts"
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith(";") else ""
        if not line:
            continue
        if line.startswith("["):
            name = line.strip("[]")
            section, _, kind = name.partition(":")
            kind = kind or "hosts"
            continue
        words = shlex.split(line)
        pairs = {k: _scalar(v) for k, _, v in (w.partition("=") for w in words[1:] if "=" in w)}
        if kind == "vars":
            k, _, val = line.partition("=")
            gvars.setdefault(section, {})[k.strip()] = _scalar(val.strip())
        elif kind == "children":
            children.setdefault(section, []).append(words[0])
        else:
            groups.setdefault(section, []).append((words[0], pairs))
    out: dict[str, dict[str, Any]] = {}

    def walk(group: str, inherited: dict[str, Any], names: tuple[str, ...]) -> None:
        own = _merge(inherited, gvars.get(group, {}))
        for host, hv in groups.get(group, []):
            out[host] = _merge(out.get(host, own), hv)
            member.setdefault(host, set()).update(names)
        for child in children.get(group, []):
            walk(child, own, (*names, child))

    walk("all", {}, ("all",))
    for g in {**groups, **children}:  # a group with only [g:children] is a group of their hosts too
        walk(g, gvars.get("all", {}), (g,))
    return out


def _target_from_host(path: Path, name: str, hvars: Mapping[str, Any]) -> Target:
    data: dict[str, Any] = {"host": name}
    for key, value in hvars.items():
        if key == "edgeq_allowed_signers":  # the fleet's, not a target's
            continue
        if key in _ANSIBLE:
            field = _ANSIBLE[key]
            data[field] = int(value) if field == "port" and str(value).isdigit() else value
        elif key.startswith("edgeq_"):
            data[key[len("edgeq_"):]] = value
    return target_from_dict(data, path, name)


def target_from_host_vars(path: Path, name: str, hvars: Mapping[str, Any]) -> Target:
    """A host's target from its inventory variables (``ansible_*`` access, ``edgeq_<key>`` target keys),
    as an inventory fleet reads it; the collection's modules read their host so (edgeq.ansible)."""
    return _target_from_host(path, name, hvars)


def is_ansible(data: Any) -> bool:
    return isinstance(data, Mapping) and "targets" not in data and any(
        isinstance(g, Mapping) and ({"hosts", "children", "vars"} & set(g)) for g in data.values()
    )


def load_fleet(path: Path, workers: Optional[int] = None) -> Fleet:
    """Read a fleet file (edgeq's list or an Ansible inventory); every problem is one ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such fleet file", "give a fleet YAML or an Ansible inventory")
    targets: list[Target] = []
    member: dict[str, set[str]] = {}  # target name -> its groups
    kind = "edgeq"
    signers: Optional[str] = None
    text = path.read_text(encoding="utf-8", errors="replace")
    ini = path.suffix in (".ini", ".cfg") or text.lstrip().startswith("[")
    data = None if ini else config.read_yaml(path)
    if data is None or is_ansible(data):
        kind = "ansible"
        hosts: dict[str, dict[str, Any]] = {}
        if data is None:
            hosts = _ini_inventory(path, text, member)
        else:
            for gname, group in data.items():
                _ansible_hosts(path, group or {}, {}, hosts, member, (str(gname),))
        targets = [_target_from_host(path, n, hv) for n, hv in hosts.items()]
        size = None
        named = {str(hv["edgeq_allowed_signers"]) for hv in hosts.values() if hv.get("edgeq_allowed_signers")}
        if len(named) > 1:
            raise ConfigError(f"{path}: hosts name different edgeq_allowed_signers "
                              f"({', '.join(sorted(named))})", "set it once, in the 'all' group's vars")
        signers = next(iter(named), None)
    else:
        v = config.check_mapping(path, config.require_mapping(path, data, "targets: [...]"),
                                 {"targets": _entries, "workers": config.positive_int,
                                  "description": config.string, "groups": _groups,
                                  "allowed_signers": config.string})  # fmt: skip
        entries = v.get("targets") or []
        for i, entry in enumerate(entries):
            targets += _entry_targets(path, entry, i)
        size = v.get("workers")
        signers = v.get("allowed_signers")
        member = _members(path, v.get("groups") or {}, [t.name for t in targets])
    if not targets:
        raise ConfigError(f"{path}: no targets", "list targets under 'targets:' (or hosts in the inventory)")
    from edgeq.pipeline.rundir import slug

    names = [slug(t.name) for t in targets]  # each target's run directory is named so
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ConfigError(f"{path}: target '{dup}' is listed twice", "give one of them a 'name'")
    return Fleet(path, tuple(targets), workers or size or min(MAX_WORKERS, len(targets)), kind,
                 {n: frozenset(g) for n, g in member.items()}, _allowed_signers(path, signers))


def _allowed_signers(path: Path, value: Optional[str]) -> Optional[Path]:
    """The fleet's allowed-signers file, relative to the fleet file (a key list travels with it)."""
    if not value:
        return None
    allowed = Path(value).expanduser()
    allowed = allowed if allowed.is_absolute() else path.parent / allowed
    if not allowed.is_file():
        raise ConfigError(f"{path}: allowed_signers {allowed} does not exist",
                          "an ssh-keygen allowed-signers file, lines 'PRINCIPAL "
                          "namespaces=\"edgeq-release\" KEY'")
    return allowed
