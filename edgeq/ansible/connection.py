"""The ``Runner`` seam (put / run / get) over the connection Ansible opened to a board.

The collection's action plugins run on the machine running Ansible, in one of its worker processes, with
``self._connection`` already pointed at the board by the inventory (host, port, user, key, jump host,
ssh arguments). ``AnsibleRunner`` makes that connection the ``Runner`` edgeq's stages call, so a board
reached through Ansible runs exactly the stages ``deploy`` and ``fleet validate`` run over paramiko:

- ``run``: one quoted argv per command (``edgeq.remote.exec.remote_command``, never a shell parser),
  through ``exec_command`` without a tty (stdout and stderr apart). The command runs on a helper thread;
  the waiting thread ends it on timeout or Ctrl-C by killing its remote process group from a second
  session (the script writes its group id to a file on the board, as Ansible returns output only once a
  command ended).
- ``put``: the same content-addressed cache ``<cache>/<sha256>/<name>`` the native upload fills (either
  engine finds what the other sent): the board hashes its copy; a miss is sent to
  ``incoming/<sha256>.<random>.part``, hashed by the board and renamed only when the hashes agree.
- ``get``: ``fetch_file`` into a temporary file renamed over the destination.

A failure of Ansible's ssh connection is the same typed error (``edgeq.remote.causes``) the native
transport raises, read from OpenSSH's own words: a changed or unknown host key, a refused login, an
unknown name, a refused or dropped connection. So a row reads and exits the same under either engine.
"""

from __future__ import annotations

import re
import shlex
import signal as _signal
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from edgeq.errors import EdgeqError, RemoteError
from edgeq.findings import ProgressFn, no_progress
from edgeq.interrupt import Stop
from edgeq.remote.exec import (
    KILL_GRACE_S,
    CommandFailed,
    CommandResult,
    CommandTimeout,
    _LineStream,
    remote_command,
)
from edgeq.remote.runner import EventFn
from edgeq.remote.targets import Target

# Hash a file on the board with the board's Python (the agent's: always there), print the hex digest.
_SHA256_PY = ("import hashlib,sys\nh=hashlib.sha256()\nf=open(sys.argv[1],'rb')\n"
              "for b in iter(lambda: f.read(1<<22), b''): h.update(b)\nprint(h.hexdigest())\n")  # fmt: skip
# Is <cache>/<sha>/<name> there and whole? Prints "cached|missing <absolute cache dir>".
_LOOKUP_SH = ('mkdir -p -- "$1/incoming" && cd -- "$1" || exit 1; f="$(pwd)/$2/$3"; '
              'if [ -f "$f" ] && [ "$("$4" -c "$5" "$f")" = "$2" ]; then echo "cached $(pwd)"; '
              'else echo "missing $(pwd)"; fi')  # fmt: skip
# Hash the sent .part; rename it to its content address only when it hashes to what was sent.
_PLACE_SH = ('h=$("$4" -c "$5" "$1") || exit 1; if [ "$h" = "$2" ]; then mkdir -p -- "$(dirname "$3")" && '
             'mv -f -- "$1" "$3" && echo placed; else rm -f -- "$1"; echo "corrupt $h"; fi')  # fmt: skip


class FileStop(Stop):
    """Ctrl-C as edgeq's own process saw it, told to Ansible's worker processes by a file
    (``EDGEQ_ANSIBLE_RUN``'s ``stop``): every wait that checks ``requested`` looks for it."""

    def __init__(self, path: Optional[Path]) -> None:
        super().__init__()
        self.path = path

    def _look(self) -> None:
        if self.path is not None and not self._event.is_set() and self.path.exists():
            self._event.set()

    @property
    def was_requested(self) -> bool:
        self._look()
        return super().was_requested

    @property
    def requested(self) -> bool:
        self._look()
        return super().requested


class AnsibleRunner:
    """A board's Ansible connection as a ``Runner``; ``stop``: Ctrl-C ends its commands."""

    def __init__(self, connection: Any, target: Target, stop: Optional[Stop] = None) -> None:
        self.connection = connection
        self.target = target
        self.stop = stop
        self.destination = f"{target.user}@{target.host}:{target.port}"

    # -- run ------------------------------------------------------------------------------------------
    def run(self, argv: Sequence[str], *, timeout: Optional[float] = None, check: bool = True,
            on_stderr: Optional[EventFn] = None) -> CommandResult:  # fmt: skip
        """Run ``argv`` on the board (never through a shell parser); its stderr lines go to ``on_stderr``
        once it ended (Ansible returns output whole)."""
        if isinstance(argv, (str, bytes)):
            raise TypeError("run() takes an argument list, not a command string")
        args = tuple(str(a) for a in argv)
        timeout = self.target.timeouts.command if timeout is None else timeout
        pgid_file = self.target.remote_path("tmp", f"pgid-{uuid.uuid4().hex}")
        command = remote_command(args, pgid_file=pgid_file)
        done: dict[str, Any] = {}

        def work() -> None:
            try:
                done["reply"] = self.connection.exec_command(command, sudoable=False)
            except BaseException as e:  # handed to the waiting thread, raised there
                done["error"] = e

        worker = threading.Thread(target=work, name="edgeq-ansible-exec", daemon=True)
        worker.start()
        deadline = time.monotonic() + timeout
        while worker.is_alive():
            worker.join(0.05)
            if not worker.is_alive():
                break
            if time.monotonic() > deadline:
                self._kill_group(pgid_file, worker)
                raise CommandTimeout(f"{shlex.join(args)[:200]} ran longer than {timeout:g}s on "
                                     f"{self.destination}; its remote process group was killed",
                                     "raise the timeout (command_timeout in the target file)")  # fmt: skip
            if self.stop is not None and self.stop.requested:  # Ctrl-C: not left running on the board
                self._kill_group(pgid_file, worker)
                self.stop.check()
        if "error" in done:
            raise self._translated(done["error"], args)
        code, out_b, err_b = done["reply"]
        out, err = _LineStream(None, want_pgid=True), _LineStream(on_stderr)
        out.feed(_bytes(out_b), final=True)
        err.feed(_bytes(err_b), final=True)
        killed_by = _signal_of(int(code))
        result = CommandResult(args, int(code), out.text(), err.text(), killed_by)
        if check and not result.ok:
            raise CommandFailed(f"{shlex.join(args)[:200]} {result.status} on {self.destination}: "
                                f"{err.tail() or 'no stderr'}", result=result)  # fmt: skip
        return result

    def _kill_group(self, pgid_file: str, worker: threading.Thread) -> None:
        """TERM the command's process group on the board, then KILL once it ended or after 2 s (as the
        native runner does). Best effort: the connection may be what failed."""
        f = shlex.quote(pgid_file)
        for sig in ("TERM", "KILL"):
            script = f'g=$(cat {f} 2>/dev/null) && [ -n "$g" ] && kill -{sig} -"$g" 2>/dev/null; exit 0'
            if sig == "KILL":
                script += f"; rm -f {f}"
            try:
                self.connection.exec_command(f"sh -c {shlex.quote(script)}", sudoable=False)
            except Exception:
                return
            if sig == "TERM":
                worker.join(KILL_GRACE_S)

    def _translated(self, error: BaseException, args: tuple[str, ...]) -> BaseException:
        """Ansible's connection failure as edgeq's typed error (its cause); anything else as it was."""
        if not _is_connection_failure(error):
            return error
        return connection_error(str(error), self.target, running=args[0] if args else None)

    # -- put / get ------------------------------------------------------------------------------------
    def put(self, local: Path, remote_dir: str, *, progress: ProgressFn = no_progress) -> Any:
        """Into the board's content-addressed cache, unless it holds the file already (hashed there)."""
        from edgeq.fs import sha256_file
        from edgeq.remote.upload import Upload, UploadVerifyFailed

        local = Path(local)
        if not local.is_file():
            raise RemoteError(f"{local}: no such file", "check the path")
        digest, size = sha256_file(local), local.stat().st_size
        py = self.target.python
        found = self.run(["sh", "-c", _LOOKUP_SH, "edgeq-cache", remote_dir, digest, local.name, py,
                          _SHA256_PY])  # fmt: skip
        state, _, cache = found.stdout.strip().partition(" ")
        final = f"{cache}/{digest}/{local.name}"
        if state == "cached":
            return Upload(final, digest, 0, 0, True)
        if state != "missing" or not cache.startswith("/"):
            raise RemoteError(f"cannot use the cache {remote_dir} on {self.destination}: "
                              f"{found.stdout.strip()[:200] or found.stderr.strip()[:200]}",
                              "check the target's work_dir and its permissions", exit_code=1)  # fmt: skip
        part = f"{cache}/incoming/{digest}.{uuid.uuid4().hex[:8]}.part"
        task = f"upload {local.name}"
        progress(task, 0, size)
        if self.stop is not None:
            self.stop.check()
        try:
            self.connection.put_file(str(local), part)
        except Exception as e:
            raise self._translated(e, ("put",)) from None
        progress(task, size, size)
        placed = self.run(["sh", "-c", _PLACE_SH, "edgeq-place", part, digest, final, py, _SHA256_PY])
        if placed.stdout.strip() != "placed":
            raise UploadVerifyFailed(f"{local.name} arrived corrupted on {self.destination} "
                                     f"({placed.stdout.strip()[:100]} != sha256 {digest})",
                                     "run again; if it repeats, check the target's disk")  # fmt: skip
        return Upload(final, digest, size, 0, False)

    def get(self, remote: str, local: Path) -> None:
        from edgeq.fs import atomic_path

        with atomic_path(local) as tmp:
            try:
                self.connection.fetch_file(remote, str(tmp))
            except Exception as e:
                raise self._translated(e, ("get",)) from None


def _bytes(data: Any) -> bytes:
    return data if isinstance(data, bytes) else str(data or "").encode()


def _signal_of(code: int) -> Optional[str]:
    """A wrapper shell reports a command a signal ended as 128 + its number: the signal's name."""
    if 128 < code < 128 + 32:
        try:
            return _signal.Signals(code - 128).name.removeprefix("SIG")
        except ValueError:
            return None
    return None


def _is_connection_failure(error: BaseException) -> bool:
    try:
        from ansible.errors import AnsibleConnectionFailure
    except ImportError:  # pragma: no cover - the plugins run inside Ansible
        return False
    return isinstance(error, AnsibleConnectionFailure)


# OpenSSH's words for each cause (ssh(1), sshconnect.c), the first that matches wins.
_SSH_WORDS: tuple[tuple[str, str], ...] = (
    ("host key changed", r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key for .* has changed|"
                         r"is marked as revoked|REVOKED HOST KEY"),
    ("host key unknown", r"No \S+ host key is known for|Host key verification failed"),
    ("authentication refused", r"Permission denied \(|Too many authentication failures|"
                               r"no such identity|Load key .*: (invalid format|bad permissions)"),
    ("unknown host name", r"Could not resolve hostname|Name or service not known"),
    ("connection refused", r"Connection refused"),
    ("connection dropped", r"closed by remote host|Connection reset|Broken pipe|Connection closed by|"
                           r"kex_exchange_identification"),
)  # fmt: skip


def cause_in(text: str) -> str:
    """Which of ``edgeq.remote.causes`` OpenSSH's message says; "unreachable" when none (a timeout, no
    route)."""
    for cause, words in _SSH_WORDS:
        if re.search(words, text):
            return cause
    return "unreachable"


def connection_error(text: str, target: Target, running: Optional[str] = None) -> RemoteError:
    """The typed error (edgeq.remote.ssh, hostkeys) for a failed Ansible ssh connection to ``target``."""
    from edgeq.remote.hostkeys import HostKeyChanged, HostKeyUnknown
    from edgeq.remote.ssh import (
        AuthenticationFailed,
        ConnectionDropped,
        ConnectionFailed,
        ConnectionRefused,
        UnknownHostName,
    )

    dest = f"{target.user}@{target.host}:{target.port}"
    name = target.host if target.port == 22 else f"[{target.host}]:{target.port}"
    said = _ssh_said(text)
    cause = cause_in(text)
    kh = target.known_hosts
    if cause == "host key changed":
        return HostKeyChanged(
            f"host key for {name} has CHANGED: {_changed_key(text) or said}",
            f"if the target was re-installed, verify the new key out of band and remove the old one: "
            f"ssh-keygen -R '{name}' -f {kh} (never accepted automatically, not even with "
            "--accept-new-host-key)")  # fmt: skip
    if cause == "host key unknown":
        return HostKeyUnknown(f"host key for {name} is not in {kh}: {said}",
                              f"verify the fingerprint, then add it: ssh-keygen -R '{name}' -f {kh}; "
                              f"ssh-keyscan -p {target.port} {target.host} >> {kh} (or pass "
                              "--accept-new-host-key to trust it on first use)")  # fmt: skip
    if cause == "authentication refused":
        offered = f"identity file {target.identity_file}" if target.identity_file else "ssh-agent keys"
        return AuthenticationFailed(f"{dest} refused authentication ({offered}): {said}",
                                    "put the public key in the target's ~/.ssh/authorized_keys, or fix "
                                    "identity_file/user (the inventory's ansible_ssh_private_key_file, "
                                    "ansible_user)")  # fmt: skip
    if cause == "unknown host name":
        return UnknownHostName(f"cannot connect to {dest}: {said}",
                               "check the host name in the target file (or the inventory's ansible_host)")
    if cause == "connection refused":
        return ConnectionRefused(f"cannot connect to {dest}: connection refused by "
                                 f"{target.host}:{target.port}", "no sshd listens there: check that the "
                                 "target is up, runs sshd, and the target file's port")  # fmt: skip
    if cause == "connection dropped":
        what = f" while running {running}" if running and running not in ("put", "get") else ""
        return ConnectionDropped(f"connection to {dest} dropped{what}: {said}",
                                 "the command may still be running on the target", destination=dest)
    return ConnectionFailed(f"cannot connect to {dest}: {said}",
                            "check that the target is up, reachable and runs sshd on that port")


def _changed_key(text: str) -> Optional[str]:
    """"the server offers ED25519 SHA256:..., FILE:LINE holds another ED25519 key", from OpenSSH's warning."""
    offered = re.search(r"fingerprint for the (\S+) key sent by the remote host is\s+(SHA256:[\w+/=]+)", text)
    offending = re.search(r"Offending (\S+) key in (\S+)", text)
    if offered is None:
        return None
    said = f"the server offers {offered.group(1)} {offered.group(2)}"
    if offending is not None:
        said += f", {offending.group(2)} holds another {offending.group(1)} key"
    return said


def _ssh_said(text: str) -> str:
    """OpenSSH's one line that says why (not Ansible's preamble, not the warning banner)."""
    lines = [ln.strip() for ln in text.replace("Failed to connect to the host via ssh:", "").splitlines()]
    lines = [ln for ln in lines if ln and not set(ln) <= set("@ ")
             and not ln.startswith(("debug", "Warning:"))]  # fmt: skip
    for _, words in _SSH_WORDS:
        hit = next((ln for ln in lines if re.search(words, ln)), None)
        if hit is not None:
            return hit[:300]
    return (lines[-1] if lines else "no answer")[:300]


class HostKeyPolicyError(EdgeqError):
    """Ansible was told not to verify host keys: edgeq's modules refuse to run over such a connection."""


_UNCHECKED = re.compile(r"StrictHostKeyChecking[= ]+(no|off)\b|UserKnownHostsFile[= ]+/dev/null", re.I)


def check_host_key_policy(connection: Any, host: str) -> None:
    """Refuse a connection that would accept any host key (``host_key_checking = False``, or ssh
    arguments turning strict checking off): the board must be the one known_hosts names."""
    options = getattr(connection, "get_option", None)
    if options is None:
        return

    def opt(name: str) -> Any:
        try:
            return options(name)
        except Exception:  # an option this connection plugin does not have
            return None

    if opt("host_key_checking") is False:
        raise HostKeyPolicyError("Ansible's host_key_checking is off for this connection",
                                 "edgeq verifies host keys as OpenSSH does (never auto-added): remove "
                                 "host_key_checking=False / ANSIBLE_HOST_KEY_CHECKING=False")  # fmt: skip
    args = " ".join(str(opt(n) or "") for n in ("ssh_args", "ssh_common_args", "ssh_extra_args"))
    bad = _UNCHECKED.search(args)
    if bad:
        raise HostKeyPolicyError(f"the ssh arguments turn host key checking off ({bad.group(0)})",
                                 "edgeq verifies host keys as OpenSSH does: remove it from "
                                 "ansible_ssh_common_args / ssh_extra_args")  # fmt: skip


def strict_ssh_args(target: Target, accept_new_host_key: bool = False) -> list[str]:
    """The OpenSSH options that make Ansible's ssh check host keys as edgeq's transport does: strict
    (``accept-new`` only when asked), against the target's known_hosts alone, with its key (and only
    that key unless ssh-agent is allowed), through its jump host, within its connect timeout."""
    strict = "accept-new" if accept_new_host_key else "yes"
    args = ["-o", f"StrictHostKeyChecking={strict}", "-o", f"UserKnownHostsFile={target.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={max(1, int(target.timeouts.connect))}"]  # fmt: skip
    if target.identity_file is not None and not target.use_agent:
        args += ["-o", "IdentitiesOnly=yes"]
    if target.jump_host:  # its key checked against the same known_hosts (ProxyJump would not pass -o on)
        from edgeq.remote.targets import split_hostspec

        juser, jhost, jport = split_hostspec(target.jump_host)
        hop = ["ssh", *args, "-W", "%h:%p", "-p", str(jport), "-l", juser or target.user, jhost]
        if target.identity_file is not None:
            hop[1:1] = ["-i", str(target.identity_file)]
        args += ["-o", "ProxyCommand=" + shlex.join(hop)]
    return args
