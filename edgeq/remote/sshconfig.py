"""How to reach one target over SSH: ``SSHConfig``, a plain value.

A module of its own because both layers of the connection read it: ``ssh`` connects with it and
``hostkeys`` checks and records the target's key by it. Defined in ``ssh``, it made ``hostkeys`` import
``ssh`` back for the type, a cycle only ``TYPE_CHECKING`` hid. Also ``openssh_config``: what the user's
``~/.ssh/config`` says for a host, which a target's own keys override (paramiko's parser, imported only
when the file exists: it reads ``Host``/``Match`` blocks, first value wins, as OpenSSH does).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from edgeq.errors import ConfigError

OPENSSH_CONFIG = "~/.ssh/config"


@dataclass(frozen=True)
class SSHConfig:
    """How to reach one target. ``known_hosts`` defaults to ``~/.ssh/known_hosts``."""

    host: str
    port: int = 22
    user: Optional[str] = None
    identity_file: Optional[str] = None
    known_hosts: Optional[str] = None
    accept_new_host_key: bool = False
    use_agent: bool = True
    jump: Optional[SSHConfig] = None
    connect_timeout: float = 10.0
    command_timeout: Optional[float] = None
    retries: int = 3
    backoff: float = 1.0

    @property
    def destination(self) -> str:
        user = f"{self.user}@" if self.user else ""
        return f"{user}{self.host}:{self.port}"

    @property
    def known_hosts_path(self) -> Path:
        return Path(os.path.expanduser(self.known_hosts or "~/.ssh/known_hosts"))

    @property
    def known_hosts_name(self) -> str:
        """The name OpenSSH files the key under: ``host`` on port 22, else ``[host]:port``."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


def openssh_config(host: str, path: Optional[Path] = None) -> dict[str, Any]:
    """``~/.ssh/config``'s settings for ``host`` (lower-case keys as ssh_config(5) names them:
    ``hostname``, ``port``, ``user``, ``identityfile`` (a list, ``~`` expanded), ``proxyjump``,
    ``userknownhostsfile``); {} without a file. ``ssh -G host`` prints OpenSSH's own view of the same."""
    path = path or Path(os.path.expanduser(OPENSSH_CONFIG))
    if not path.is_file():
        return {}
    from paramiko.config import SSHConfig as Parser

    try:
        found = dict(Parser.from_path(str(path)).lookup(host))
    except Exception as e:  # paramiko raises ConfigParseError, and KeyError/ValueError on odd lines
        raise ConfigError(f"{path}: cannot read it ({e})", "fix the line, or check it with `ssh -G HOST`") \
            from None
    if "identityfile" in found:
        found["identityfile"] = [os.path.expanduser(p) for p in found["identityfile"]]
    if "userknownhostsfile" in found:
        found["userknownhostsfile"] = os.path.expanduser(str(found["userknownhostsfile"]).split()[0])
    return found
