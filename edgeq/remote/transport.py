"""SSH transport to a target: strict host keys, quoted commands, a verified content-addressed upload cache.

Layered as paramiko layers itself: ``ssh`` (connect, jump hosts, reconnects) with ``hostkeys``
(known_hosts as OpenSSH reads it), ``exec`` (quoted commands, streaming, remote process-group kill)
and ``upload`` (lock, resume, verify, the cache protocol). ``Connection`` is the whole stack, the seam
deploy calls (put / run / get); every name here stays importable from this module.
"""

from __future__ import annotations

from edgeq.remote.exec import (
    KILL_GRACE_S,
    CommandFailed,
    CommandResult,
    CommandTimeout,
    remote_command,
    remote_path,
)
from edgeq.remote.hostkeys import (
    HostKeyChanged,
    HostKeyUnknown,
    add_known_host,
    fingerprint,
    known_host_lines,
)
from edgeq.remote.ssh import (
    KEEPALIVE_S,
    PREFERRED_CIPHERS,
    WINDOW_SIZE,
    AuthenticationFailed,
    ConnectionDropped,
    ConnectionFailed,
)
from edgeq.remote.sshconfig import SSHConfig
from edgeq.remote.upload import (
    QUICK_KEY_SPAN,
    READ_CHUNK,
    SFTP_WRITE_SIZE,
    Upload,
    Uploader,
    UploadVerifyFailed,
    quick_key,
    sha256_file,
)

__all__ = [
    "KEEPALIVE_S",
    "KILL_GRACE_S",
    "PREFERRED_CIPHERS",
    "QUICK_KEY_SPAN",
    "READ_CHUNK",
    "SFTP_WRITE_SIZE",
    "WINDOW_SIZE",
    "AuthenticationFailed",
    "CommandFailed",
    "CommandResult",
    "CommandTimeout",
    "Connection",
    "ConnectionDropped",
    "ConnectionFailed",
    "HostKeyChanged",
    "HostKeyUnknown",
    "SSHConfig",
    "Upload",
    "UploadVerifyFailed",
    "add_known_host",
    "fingerprint",
    "known_host_lines",
    "quick_key",
    "remote_command",
    "remote_path",
    "sha256_file",
]


class Connection(Uploader):
    """A lazy SSH connection to one target (connects on first use): ``run``, ``put_cached``, ``get``,
    ``exists``; use as a context manager."""
