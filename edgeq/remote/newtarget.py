"""``edgeq targets add``: a target file from a host name, reached as ``ssh`` would reach it.

The file says only what ssh cannot know (the board's user when the command line and ``~/.ssh/config``
give none, the key, edgeq's own settings); where the host goes (HostName, Port, ProxyJump,
UserKnownHostsFile) stays ``~/.ssh/config``'s, read when edgeq connects (``Target.ssh_config``), as
OpenSSH reads it. Nothing connects here: the host key is looked up in known_hosts, offline, and
``edgeq targets check`` is the first connection (``--accept-new-host-key`` records an unknown key).
"""

from __future__ import annotations

import getpass
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from edgeq.errors import ConfigError
from edgeq.remote.targets import TARGETS_DIR, Target, target_from_dict

# OpenSSH's default identities (ssh_config(5), IdentityFile), in the order ssh tries them; the security-key
# and DSA ones are left out (edgeq authenticates with paramiko, which reads neither).
DEFAULT_KEYS = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ed25519")


@dataclass(frozen=True)
class NewTarget:
    """What ``add_target`` wrote and found: the file, the target it reads as, how ssh reaches the host,
    where the key came from, and the host key's known_hosts entry ("" when it has none yet)."""

    path: Path
    target: Target
    reached: str  # "127.0.0.1:2222 (~/.ssh/config)" where ~/.ssh/config redirects it, else ""
    key: str  # "~/.ssh/id_ed25519 (OpenSSH's default)", "ssh-agent", ...
    known_hosts: Path
    known_as: str  # the name known_hosts is read under: "orin.local", "[127.0.0.1]:2222"
    host_key: str  # "ssh-ed25519 (line 3)" or ""


def add_target(name: str, host: str, *, port: Optional[int] = None, key: Optional[str] = None,
               cwd: Optional[Path] = None) -> NewTarget:  # fmt: skip
    """Write ``targets/NAME.yaml`` (under ``cwd``) for ``[USER@]HOST``; refuses an existing file, a bad
    name, host or port, and a missing key, before anything is written (``ConfigError``, exit 2)."""
    from edgeq.fs import create_text
    from edgeq.remote.hostkeys import known_host_entries
    from edgeq.remote.sshconfig import openssh_config

    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", name):
        raise ConfigError(f"target name {name!r}: letters, digits, '.', '_' and '-' only",
                          hint="e.g. orin, orin-nano-2")
    dest = (Path(cwd) if cwd is not None else Path.cwd()) / TARGETS_DIR / f"{name}.yaml"
    shown = f"{TARGETS_DIR}/{name}.yaml"
    if dest.exists():
        raise ConfigError(f"{shown} exists; edgeq targets add never overwrites a target file",
                          hint=f"edit it or remove it first, or choose another name (edgeq targets check "
                               f"{name} checks it)")
    user, _, hostname = host.rpartition("@")
    said = openssh_config(hostname) if hostname else {}
    user = user or str(said.get("user") or getpass.getuser())
    data: dict[str, Any] = {"host": hostname, "user": user}
    if port is not None:
        data["port"] = port
    credential, where = _key(key, said, f"{user}@{hostname}")
    data.update(credential)
    target = target_from_dict({**data, **_EDGEQ_DEFAULTS}, dest, name)  # every value checked
    ssh = target.ssh_config()
    reached = ""
    if (ssh.host, ssh.port) != (hostname, port or 22):
        reached = f"{ssh.host}:{ssh.port} (~/.ssh/config)"
    create_text(dest, _yaml(name, host, data))
    entries = [e for e in known_host_entries(ssh.known_hosts_path, ssh.known_hosts_name) if not e.marker]
    found = f"{entries[0].kind} (line {entries[0].line})" if entries else ""
    return NewTarget(dest, target, reached, where, ssh.known_hosts_path, ssh.known_hosts_name, found)


# edgeq's own settings for a new board: the agent's work dir and interpreter, the TensorRT it must report,
# and trtexec as the backend (JetPack installs it with TensorRT, where the Python bindings may be missing)
_EDGEQ_DEFAULTS: dict[str, Any] = {"work_dir": "edgeq", "python": "python3", "tensorrt": "8.6",
                                   "backend": "trtexec"}


def _key(key: Optional[str], said: dict[str, Any], dest: str) -> tuple[dict[str, Any], str]:
    """The credential: ``--identity-file``, else ~/.ssh/config's IdentityFile, else OpenSSH's default
    key files, else a running ssh-agent; ({key: value} for the file, where it came from)."""
    if key is not None:
        path = Path(key).expanduser()
        if not path.is_file():
            raise ConfigError(f"--identity-file {key}: no such file",
                              hint="give the private key ssh logs in with")
        if path.suffix == ".pub":
            raise ConfigError(f"--identity-file {key}: a public key",
                              hint=f"give the private key: {path.with_suffix('')}")
        return {"identity_file": _home_relative(path)}, f"{_home_relative(path)} (--identity-file)"
    for given in said.get("identityfile", []):
        if Path(given).is_file():
            shown = _home_relative(Path(given))
            return {"identity_file": shown}, f"{shown} (~/.ssh/config)"
    for default in DEFAULT_KEYS:
        if Path(default).expanduser().is_file():
            return {"identity_file": default}, f"{default} (OpenSSH's default)"
    if os.environ.get("SSH_AUTH_SOCK"):
        return {"use_agent": True}, "the running ssh-agent"
    raise ConfigError(f"no SSH key for {dest}: no --identity-file, no IdentityFile in ~/.ssh/config, none of "
                      f"{', '.join(DEFAULT_KEYS)} and no ssh-agent",
                      hint="make one and install it on the board: ssh-keygen -t ed25519 && ssh-copy-id "
                           f"{dest}")


def _home_relative(path: Path) -> str:
    """``~/.ssh/id_ed25519`` for a path under the home directory (the file stays valid for the user)."""
    home = Path("~").expanduser()
    path = path.absolute()
    return f"~/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)


def _yaml(name: str, host: str, data: dict[str, Any]) -> str:
    """The target file, each key with what it is for (values JSON-quoted where they are strings: valid
    YAML, whatever a path holds)."""
    notes = {
        "host": "as ssh resolves it: ~/.ssh/config's HostName, Port and ProxyJump apply",
        "user": "the board's login",
        "port": "the board's sshd",
        "identity_file": "key authentication only (no passwords)",
        "use_agent": "the keys of the running ssh-agent",
        "work_dir": "on the board, under the login home: uploads, engines, runs",
        "python": "runs the edgeq agent (Python 3.8+, standard library only)",
        "tensorrt": "the version the board must report (targets check, deploy)",
        "backend": "JetPack's trtexec (/usr/src/tensorrt/bin/trtexec, else trtexec on the PATH)",
    }
    lines = [f"# Written by `edgeq targets add {name} --host {host}`; edit freely. `edgeq targets check "
             f"{name}` connects to it (host key checked against known_hosts)."]
    for k, v in {**data, **_EDGEQ_DEFAULTS}.items():
        value = json.dumps(v) if isinstance(v, str) else ("true" if v is True else str(v))
        lines.append(f"{k}: {value}".ljust(34) + f"  # {notes[k]}")
    return "\n".join(lines) + "\n"
