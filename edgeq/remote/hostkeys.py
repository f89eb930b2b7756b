"""known_hosts as OpenSSH reads it: exact, hashed (``|1|``) and wildcard entries, markers, and the
policy paramiko calls for a key it did not find (paramiko's own ``HostKeys`` matches exact and hashed
names only). Unknown keys are refused unless the user asked to accept new ones; a changed or revoked
key is always refused."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeq.errors import RemoteError
from edgeq.fs import atomic_path
from edgeq.remote.causes import CAUSES
from edgeq.remote.sshconfig import SSHConfig

log = logging.getLogger(__name__)


class HostKeyUnknown(RemoteError):
    """The target's host key is not in known_hosts and the user did not ask to accept new keys."""

    cause = "host key unknown"
    exit_code = CAUSES[cause].exit_code


class HostKeyChanged(RemoteError):
    """known_hosts holds a different key for the target: possibly an attack; never accepted."""

    cause = "host key changed"
    exit_code = CAUSES[cause].exit_code


# -- pieces that need no connection (tested alone) ------------------------------------------------------
def fingerprint(key: Any) -> str:
    """OpenSSH's ``SHA256:...`` form, as ``ssh-keygen -lf`` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


@dataclass(frozen=True)
class KnownHost:
    """One known_hosts entry that applies to a host: where it is, its marker, key type and key."""

    line: int
    marker: str  # "", "@revoked" or "@cert-authority"
    kind: str
    key: str  # base64, as in the file


def _pattern_matches(pattern: str, name: str) -> bool:
    """OpenSSH's ``match_pattern``: ``*`` and ``?`` are wildcards, everything else (``[``, ``]``) is
    literal; case-insensitive, as ssh lowercases the host name."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.fullmatch(rx, name.lower()) is not None


def host_matches(field: str, name: str) -> bool:
    """Does known_hosts' host field (comma-separated patterns, ``!`` negation, ``|1|`` hashes) cover
    ``name`` (``host`` or ``[host]:port``)? As OpenSSH's ``match_hostname``: a negated match excludes
    the entry whatever else matches."""
    from paramiko.hostkeys import HostKeys

    matched = False
    for pattern in field.split(","):
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        if pattern.startswith("|1|"):
            hit = HostKeys.hash_host(name, pattern) == pattern
        else:
            hit = _pattern_matches(pattern, name)
        if hit and negated:
            return False
        matched = matched or hit
    return matched


def known_host_entries(path: Path, name: str) -> list[KnownHost]:
    """Every known_hosts entry that applies to ``name``: exact, hashed and wildcard ones (paramiko
    looks up exact and hashed names only; OpenSSH honours patterns, and so must a changed-key check)."""
    found: list[KnownHost] = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return found
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = fields.pop(0) if fields[0].startswith("@") else ""
        if len(fields) >= 2 and host_matches(fields[0], name):
            found.append(KnownHost(number, marker, fields[1], fields[2] if len(fields) > 2 else ""))
    return found


def known_host_lines(path: Path, name: str) -> list[tuple[int, str]]:
    """(line number, key type) of every known_hosts entry for ``name``, hashed and wildcard ones included."""
    return [(e.line, e.kind) for e in known_host_entries(path, name)]


def add_known_host(path: Path, name: str, key: Any) -> None:
    """Append ``name keytype base64`` to known_hosts atomically, keeping the file's mode."""
    old = path.read_text() if path.exists() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o600
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
    with atomic_path(path) as tmp:
        tmp.write_text(f"{old}{name} {key.get_name()} {key.get_base64()}\n")
        os.chmod(tmp, mode)


class KnownHostsPolicy:
    """paramiko's missing-host-key hook: refuse (RejectPolicy), or add when the user said so."""

    def __init__(self, config: SSHConfig) -> None:
        self.config = config

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        cfg = self.config
        path = cfg.known_hosts_path
        what = f"{key.get_name()} {fingerprint(key)}"
        if self._known_by_pattern(hostname, key):
            return
        if not cfg.accept_new_host_key:
            raise HostKeyUnknown(
                f"host key for {hostname} ({what}) is not in {path}",
                f"verify the fingerprint, then add it: ssh-keyscan -p {cfg.port} {cfg.host} >> {path} "
                "(or pass --accept-new-host-key to trust it on first use)",
            )
        add_known_host(path, hostname, key)
        log.warning("added host key for %s (%s) to %s", hostname, what, path)

    def _known_by_pattern(self, hostname: str, key: Any) -> bool:
        """Entries paramiko did not look up (wildcards): True when one holds this key; a revoked key, or
        another key of the same type, is refused as OpenSSH refuses it. Only key types known_hosts
        holds nothing of for this host are new."""
        path = self.config.known_hosts_path
        entries = [e for e in known_host_entries(path, hostname) if e.marker != "@cert-authority"]
        kind, blob = key.get_name(), key.get_base64()
        if any(e.marker == "@revoked" and e.kind == kind and e.key == blob for e in entries):
            raise HostKeyChanged(
                f"host key for {hostname} ({kind} {fingerprint(key)}) is marked @revoked in {path}",
                "the target's key was revoked: verify the target before removing the @revoked line",
            )
        same_type = [e for e in entries if not e.marker and e.kind == kind]
        if any(e.key == blob for e in same_type):
            return True
        if same_type:
            where = ", ".join(f"line {e.line}" for e in same_type)
            raise HostKeyChanged(
                f"host key for {hostname} has CHANGED: the server offers {kind} {fingerprint(key)}, {path} "
                f"{where} holds another {kind} key for a pattern that covers it",
                f"if the target was re-installed, verify the new key out of band and fix {where} of {path} "
                "(never accepted automatically, not even with --accept-new-host-key)",
            )
        return False
