"""Which board an Ansible host is, both ways.

- A host of the user's own inventory: its target is read from its variables as ``load_fleet`` reads an
  inventory (``ansible_host``/``port``/``user``/``ssh_private_key_file`` and ``edgeq_<key>`` target keys:
  ``edgeq_known_hosts``, ``edgeq_python``, ``edgeq_backend``, ...), what Ansible's connection actually
  uses filling in what the inventory leaves out.
- A fleet edgeq already read (``--engine ansible``): the inventory edgeq hands Ansible carries each
  target as edgeq read it (``edgeq_target``: target file, overrides and all), so the board runs with the
  same target, resume key and messages as under the native engine; its connection variables are that
  target's, with OpenSSH told to check host keys as edgeq does (``connection.strict_ssh_args``).
"""

from __future__ import annotations

import getpass
import shlex
from collections.abc import Mapping
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any, Optional

from edgeq.remote.targets import TOP, BuildOptions, GateConfig, Target, Timeouts

TARGET_VAR = "edgeq_target"  # the target as edgeq read it (edgeq's own engine)
PREVIOUS_VAR = "edgeq_previous"  # the board's record of an earlier run, to resume from
GROUP = "edgeq_fleet"  # the group of every board of an edgeq run
_PATHS = ("path", "identity_file", "known_hosts")
_ACCESS = ("ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file", "ansible_ssh_host",
           "ansible_ssh_port", "ansible_ssh_user")  # fmt: skip


def target_record(target: Target) -> dict[str, Any]:
    """A target as plain JSON values (paths as strings), for ``target_from_record``."""
    data = asdict(target)
    for key in _PATHS:
        data[key] = str(data[key]) if data[key] is not None else None
    return data


def target_from_record(data: Mapping[str, Any]) -> Target:
    """The ``Target`` ``target_record`` wrote."""
    d = {f.name: data[f.name] for f in fields(Target) if f.name in data}
    for key in _PATHS:
        d[key] = Path(d[key]) if d.get(key) is not None else None
    if d.get("known_hosts") is None:
        d.pop("known_hosts", None)
    build = dict(d.get("build") or {})
    build["tactic_sources"] = tuple(build.get("tactic_sources") or ())
    d["build"] = BuildOptions(**build)
    d["timeouts"] = Timeouts(**(d.get("timeouts") or {}))
    d["keys"] = tuple(d.get("keys") or ())  # JSON has lists
    gate = d.get("gate")
    d["gate"] = GateConfig(gate.get("policy"), tuple(gate.get("allow") or ()), gate.get("require_fusion")) \
        if gate else None
    return Target(**d)


def target_from_vars(name: str, hostvars: Mapping[str, Any], source: Path,
                     connection: Optional[Mapping[str, Any]] = None) -> Target:  # fmt: skip
    """The target of inventory host ``name`` from its (templated) variables; ``connection``: the values
    Ansible's connection plugin uses (``host``, ``port``, ``remote_user``, ``private_key_file``), for
    what the inventory does not say."""
    from edgeq.orchestration.fleet_file import target_from_host_vars

    record = hostvars.get(TARGET_VAR)
    if isinstance(record, Mapping):
        return target_from_record(record)
    hv: dict[str, Any] = {k: v for k, v in hostvars.items() if k in _ACCESS or _target_key(k)}
    conn = connection or {}
    for var, option in (("ansible_host", "host"), ("ansible_port", "port"), ("ansible_user", "remote_user"),
                        ("ansible_ssh_private_key_file", "private_key_file")):  # fmt: skip
        if var not in hv and conn.get(option) not in (None, ""):
            hv[var] = conn[option]
    hv.setdefault("ansible_user", getpass.getuser())  # what ssh logs in as when nothing says
    if "ansible_ssh_private_key_file" not in hv and "edgeq_use_agent" not in hv:
        hv["edgeq_use_agent"] = True  # Ansible's ssh offers the agent's and the default keys
    return target_from_host_vars(source, name, hv)


def _target_key(var: str) -> bool:
    """``edgeq_<key>`` for a key of the target-file schema (not any variable that starts edgeq_)."""
    return var.startswith("edgeq_") and var[len("edgeq_"):] in TOP


def inventory(targets: tuple[Target, ...], accept_new_host_key: bool = False,
              previous: Optional[Mapping[str, Path]] = None) -> dict[str, Any]:  # fmt: skip
    """The inventory edgeq hands Ansible for a fleet it read: one host a target, in the fleet's order
    (``serial`` batches take the first boards first), in the group ``edgeq_fleet``."""
    from edgeq.ansible.connection import strict_ssh_args

    hosts: dict[str, Any] = {}
    for t in targets:
        t = _absolute(t)  # Ansible runs from its own project directory
        hv: dict[str, Any] = {TARGET_VAR: target_record(t), "ansible_python_interpreter": t.python}
        if t.is_local:
            hv["ansible_connection"] = "local"
        else:
            hv.update(ansible_connection="ssh", ansible_host=t.host, ansible_port=t.port, ansible_user=t.user,
                      ansible_ssh_common_args=shlex.join(strict_ssh_args(t, accept_new_host_key)),
                      ansible_ssh_timeout=max(1, int(t.timeouts.connect)))  # fmt: skip
            if t.identity_file is not None:
                hv["ansible_ssh_private_key_file"] = str(t.identity_file)
        if previous and previous.get(t.name) is not None:
            hv[PREVIOUS_VAR] = str(Path(previous[t.name]).resolve())
        hosts[t.name] = hv
    return {"all": {"children": {GROUP: {"hosts": hosts}}}}


def _absolute(target: Target) -> Target:
    """The target with its local files (key, known_hosts) as absolute paths."""
    key = target.identity_file
    return replace(target, identity_file=Path(key).resolve() if key is not None else None,
                   known_hosts=Path(target.known_hosts).resolve())
