"""SSH connections to a target: strict host keys, jump hosts, reconnects, SFTP basics (what paramiko
splits into its client and transport).

known_hosts is the authority, as for OpenSSH (``hostkeys``): unknown keys are refused unless the user
asked to accept new ones, changed keys are always refused. The link is lazy (Fabric-style: it
connects on first use), and an idempotent operation reconnects with backoff when it drops. ``exec``
(commands) and ``upload`` (the verified upload cache) build on ``SSHLink``; ``transport.Connection``
is the whole stack. These are the only modules that import paramiko, lazily, so ``edgeq --help``
stays instant.

paramiko's own logger is set to CRITICAL here unless someone set its level first (the CLI sets it to
DEBUG for ``-vv``): its transport thread otherwise prints tracebacks for every dropped connection.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import posixpath
import selectors
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from edgeq.errors import RemoteError
from edgeq.fs import atomic_path
from edgeq.interrupt import Stop
from edgeq.remote.causes import CAUSES
from edgeq.remote.hostkeys import (
    HostKeyChanged,
    HostKeyUnknown,
    KnownHostsPolicy,
    fingerprint,
    known_host_lines,
)
from edgeq.remote.sshconfig import SSHConfig
from edgeq.text import plain

log = logging.getLogger(__name__)
_T = TypeVar("_T")

WINDOW_SIZE = 64 * 1024 * 1024  # our receive window: downloads (get) are not window-bound
# AES-GCM needs no separate HMAC pass: the cheapest cipher paramiko offers; the rest stay as fallbacks.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr")
KEEPALIVE_S = 15  # notice a dead target during a long remote build
POLL_S = 0.1  # how often a wait of our own (TCP connect, the banner) looks for Ctrl-C


# -- errors ---------------------------------------------------------------------------------------------
class AuthenticationFailed(RemoteError):
    """The server refused every key we offered (identity file and/or ssh-agent)."""

    cause = "authentication refused"
    exit_code = CAUSES[cause].exit_code


class ConnectionFailed(RemoteError):
    """Could not reach the target (after retries), or the connection dropped."""

    cause = "unreachable"
    exit_code = CAUSES[cause].exit_code


class UnknownHostName(ConnectionFailed):
    """The target's host name does not resolve (or is no host name at all): the target file's to fix, so
    it is said at once, not retried."""

    cause = "unknown host name"
    exit_code = CAUSES[cause].exit_code


class ConnectionRefused(ConnectionFailed):
    """The target's address answered that nothing listens on the port (no sshd there, or not yet)."""

    cause = "connection refused"
    exit_code = CAUSES[cause].exit_code


class NoBanner(ConnectionFailed):
    """Something accepted the TCP connection but sent no SSH banner in time (a hung sshd, or another
    service on the port). Not retried: each try would wait the whole timeout again."""

    cause = "no SSH banner"
    exit_code = CAUSES[cause].exit_code


class ConnectionDropped(ConnectionFailed):
    """An established connection went away mid-operation (retried for idempotent operations)."""

    cause = "connection dropped"
    exit_code = CAUSES[cause].exit_code

    def __init__(self, message: str, hint: str | None = None, *, destination: str | None = None) -> None:
        super().__init__(message, hint)
        self.destination = destination

    def during(self, stage: str) -> None:
        """Say which stage was running (what a user knows), not the command line it ran."""
        if self.destination is not None:
            self.message = f"connection to {self.destination} dropped during the {stage} stage"


# -- the link (SSHConfig, the value it connects by: edgeq.remote.sshconfig) -----------------------------
def _quiet_paramiko() -> Any:
    import paramiko

    logger = logging.getLogger("paramiko")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.CRITICAL)
    return paramiko


def _transport_factory(sock: Any, **kwargs: Any) -> Any:
    paramiko = _quiet_paramiko()
    if isinstance(sock, socket.socket):  # not a jump host's channel
        # Nagle + delayed ACK held every small request (a session open, an SFTP stat) ~40 ms; OpenSSH
        # sets TCP_NODELAY too.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t = paramiko.Transport(sock, default_window_size=WINDOW_SIZE, **kwargs)
    table = getattr(t, "_channel_handler_table", None)
    if isinstance(table, dict) and paramiko.common.MSG_CHANNEL_REQUEST in table:
        t._channel_handler_table = {**table, paramiko.common.MSG_CHANNEL_REQUEST: _channel_request}
    opts = t.get_security_options()
    available = tuple(opts.ciphers)
    first = tuple(c for c in PREFERRED_CIPHERS if c in available)
    opts.ciphers = first + tuple(c for c in available if c not in first)
    return t


def _channel_request(chan: Any, m: Any) -> None:
    """paramiko ignores ``exit-signal`` (RFC 4254 6.10: a command killed by a signal has no exit
    status): record its name as ``chan.exit_signal`` ("KILL", "SEGV"), then let paramiko handle the
    request as always. Without it a killed command looks like a dropped connection."""
    from paramiko.channel import Channel

    start = m.packet.tell()
    try:
        if m.get_text() == "exit-signal":
            m.get_boolean()  # want reply
            chan.exit_signal = m.get_text()
    except Exception:  # a malformed request: paramiko's own handler decides
        pass
    m.packet.seek(start)
    Channel._handle_request(chan, m)


def _is_drop(exc: BaseException) -> bool:
    import paramiko

    return isinstance(exc, (EOFError, socket.error, paramiko.SSHException, ConnectionDropped))


def remote_path(path: str) -> str:
    """``~/x`` -> ``x``: SFTP and the remote shell both start in the login home, neither expands ``~``
    once the path is quoted."""
    if path in ("~", "~/"):
        return "."
    return path[2:] if path.startswith("~/") else path


_L = TypeVar("_L", bound="SSHLink")
# SSH connections opened so far, per destination (user@host:port): a fleet run's goal is one per board.
_OPENED: collections.Counter[str] = collections.Counter()
_OPENED_LOCK = threading.Lock()


def connections_opened() -> dict[str, int]:
    """SSH connections this process has opened, per destination (bench/fleet_bench.py reads it)."""
    with _OPENED_LOCK:
        return dict(_OPENED)


class SSHLink:
    """A lazy SSH connection (Fabric-style: connects on first use); use as a context manager."""

    def __init__(self, config: SSHConfig, stop: Stop | None = None) -> None:
        self.config = config
        self.stop = stop  # Ctrl-C seen by the main thread (edgeq.interrupt): wait no longer, retry nothing
        self._client: Any = None
        self._sftp: Any = None
        self._jump: SSHLink | None = None

    # -- lifecycle ------------------------------------------------------------------------------------
    def __enter__(self: _L) -> _L:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._drop()
        if self._jump is not None:
            self._jump.close()
            self._jump = None

    def _drop(self) -> None:
        for thing in (self._sftp, self._client):
            if thing is not None:
                with contextlib.suppress(Exception):
                    thing.close()
        self._sftp = None
        self._client = None

    def _alive(self) -> bool:
        if self._client is None:
            return False
        t = self._client.get_transport()
        return t is not None and t.is_active()

    def check_stop(self) -> None:
        """Raise ``Interrupted`` once Ctrl-C was pressed (edgeq.interrupt), where an operation waits."""
        if self.stop is not None:
            self.stop.check()

    def connect(self) -> None:
        """Connect now (normally implicit): retries with exponential backoff on network errors only."""
        self._transport()

    def _transport(self) -> Any:
        if self._alive():
            return self._client.get_transport()
        self._drop()
        cfg = self.config
        attempts = max(0, cfg.retries) + 1
        last: BaseException | None = None
        for attempt in range(attempts):
            try:
                self._client = self._connect_once()
                return self._client.get_transport()
            except (HostKeyUnknown, HostKeyChanged, AuthenticationFailed):
                raise
            except Exception as exc:
                if _unknown_name(exc):
                    raise UnknownHostName(
                        f"cannot connect to {cfg.destination}: {_describe(exc, cfg)}",
                        "check the host name in the target file (or the inventory's ansible_host)",
                    ) from None
                if not _is_drop(exc):
                    raise
                last = exc
                log.info("connect to %s failed (%s), try %d/%d", cfg.destination, exc, attempt + 1, attempts)
                self.check_stop()
                if attempt + 1 < attempts:
                    time.sleep(cfg.backoff * 2**attempt)
        if _refused(last):
            raise ConnectionRefused(
                f"cannot connect to {cfg.destination}: connection refused by {cfg.host}:{cfg.port} "
                f"({attempts} attempt(s))",
                "no sshd listens there: check that the target is up, runs sshd, and the target file's port",
            )
        raise ConnectionFailed(
            f"cannot connect to {cfg.destination}: {_describe(last, cfg)} ({attempts} attempt(s))",
            "check that the target is up, reachable and runs sshd on that port",
        )

    def _connect_once(self) -> Any:
        """One connection: TCP and the server's banner awaited here (watching for Ctrl-C, the banner
        bounded by ``connect_timeout``), then paramiko's handshake and login on that socket, which a
        Ctrl-C request ends by shutting the socket down (``Stop.waking``)."""
        paramiko = _quiet_paramiko()
        cfg = self.config
        if cfg.identity_file:
            _check_identity_file(paramiko, cfg.identity_file)
        sock = self._jump_channel() if cfg.jump is not None else self._tcp()
        try:
            with self.stop.waking(lambda: _shut(sock)) if self.stop is not None else contextlib.nullcontext():
                if cfg.jump is None:
                    self._await_banner(sock)
                return self._handshake(paramiko, sock)
        except BaseException:
            _shut(sock)
            with contextlib.suppress(Exception):
                sock.close()
            self.check_stop()  # the handshake failed because Ctrl-C shut it: say interrupted, not why
            raise

    def _tcp(self) -> socket.socket:
        """A TCP connection to the target, as paramiko opens one (each address ``getaddrinfo`` gives, in
        turn; all of them refusing is ``NoValidConnectionsError``), in steps that look for Ctrl-C: a
        target whose SYNs are dropped would otherwise hold it for the whole ``connect_timeout``."""
        from paramiko.ssh_exception import NoValidConnectionsError

        cfg = self.config
        deadline = time.monotonic() + cfg.connect_timeout
        infos = socket.getaddrinfo(cfg.host, cfg.port, socket.AF_UNSPEC, socket.SOCK_STREAM)
        errors: dict[Any, OSError] = {}
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                code = sock.connect_ex(addr)
                with selectors.DefaultSelector() as waiting:
                    waiting.register(sock, selectors.EVENT_WRITE)
                    while code in (errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK):
                        self.check_stop()
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise socket.timeout("timed out")
                        if waiting.select(min(POLL_S, left)):
                            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(code, os.strerror(code))
                sock.setblocking(True)
                return sock
            except OSError as e:
                sock.close()
                if e.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH):  # as paramiko: only these wait
                    raise
                errors[addr] = e
            except BaseException:
                sock.close()
                raise
        raise NoValidConnectionsError(errors)

    def _await_banner(self, sock: socket.socket) -> None:
        """The server speaks first (RFC 4253 4.2): wait for its first bytes, looking for Ctrl-C. Nothing
        within ``connect_timeout`` is a hung sshd (or no sshd) behind an open port: said as such, once.
        paramiko then reads the banner itself."""
        cfg = self.config
        deadline = time.monotonic() + cfg.connect_timeout
        with selectors.DefaultSelector() as waiting:
            waiting.register(sock, selectors.EVENT_READ)
            while not waiting.select(min(POLL_S, max(0.0, deadline - time.monotonic()))):
                self.check_stop()
                if time.monotonic() < deadline:
                    continue
                raise NoBanner(
                    f"cannot connect to {cfg.destination}: no SSH banner from {cfg.host}:{cfg.port} within "
                    f"{plain(cfg.connect_timeout)} s",
                    "something accepts connections on that port but does not answer as sshd: restart sshd "
                    "on the target, or check the target file's port",
                )

    def _handshake(self, paramiko: Any, sock: Any) -> Any:
        """paramiko's handshake, host key check and login over ``sock``: the client, connected."""
        cfg = self.config
        client = paramiko.SSHClient()
        kh = cfg.known_hosts_path
        if kh.exists():
            try:
                client.get_host_keys().load(str(kh))
            except (OSError, paramiko.hostkeys.InvalidHostKey) as exc:
                bad = getattr(exc, "line", "")
                raise RemoteError(
                    f"cannot read known_hosts file {kh}: {str(bad)[:80] or exc}",
                    "fix or remove the malformed line (ssh-keygen -R HOST -f FILE rewrites the file)",
                ) from None
        client.set_missing_host_key_policy(KnownHostsPolicy(cfg))
        try:
            client.connect(
                hostname=cfg.host,
                port=cfg.port,
                username=cfg.user,
                key_filename=os.path.expanduser(cfg.identity_file) if cfg.identity_file else None,
                allow_agent=cfg.use_agent,
                look_for_keys=cfg.identity_file is None,
                timeout=cfg.connect_timeout,
                banner_timeout=cfg.connect_timeout,
                auth_timeout=cfg.connect_timeout,
                sock=sock,
                transport_factory=_transport_factory,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            lines = known_host_lines(kh, cfg.known_hosts_name)
            where = ", ".join(f"line {n} ({kind})" for n, kind in lines) or "an entry"
            raise HostKeyChanged(
                f"host key for {cfg.known_hosts_name} has CHANGED: the server offers {exc.key.get_name()} "
                f"{fingerprint(exc.key)}, {kh} {where} holds {fingerprint(exc.expected_key)}",
                "if the target was re-installed, verify the new key out of band and remove the old one: "
                f"ssh-keygen -R '{cfg.known_hosts_name}' -f {kh} (never accepted automatically, "
                "not even with --accept-new-host-key)",
            ) from None
        except paramiko.PasswordRequiredException:
            client.close()
            raise AuthenticationFailed(
                f"identity file {cfg.identity_file} is encrypted",
                "load it into ssh-agent (ssh-add) and keep use_agent on",
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise _auth_failed(cfg, exc) from None
        except paramiko.SSHException as exc:
            client.close()
            if "authentication methods" in str(exc):
                raise _auth_failed(cfg, exc) from None
            if str(exc) == "No existing session":  # the handshake did not finish within the timeout
                raise ConnectionFailed(
                    f"cannot connect to {cfg.destination}: the SSH handshake with {cfg.host}:{cfg.port} did "
                    f"not finish within {plain(cfg.connect_timeout)} s",
                    "the target's sshd answers but stalls: check its load and logs",
                ) from None
            raise
        except BaseException:
            client.close()
            raise
        t = client.get_transport()
        t.set_keepalive(KEEPALIVE_S)
        with _OPENED_LOCK:
            _OPENED[cfg.destination] += 1
        log.debug("connected to %s (%s)", cfg.destination, t.remote_cipher)
        return client

    def _jump_channel(self) -> Any:
        """A direct-tcpip channel through the jump host to the target: OpenSSH's ProxyJump."""
        cfg = self.config
        assert cfg.jump is not None
        if self._jump is None:
            self._jump = SSHLink(cfg.jump, self.stop)
        jt = self._jump._transport()
        return jt.open_channel(
            "direct-tcpip", (cfg.host, cfg.port), ("127.0.0.1", 0), timeout=cfg.connect_timeout
        )

    def _sftp_client(self) -> Any:
        if self._sftp is None or not self._alive():
            t = self._transport()
            paramiko = _quiet_paramiko()
            self._sftp = paramiko.SFTPClient.from_transport(t)
        return self._sftp

    def _open_session(self) -> Any:
        """A fresh channel; reconnects once if the connection died between operations (nothing ran yet)."""
        for attempt in (0, 1):
            t = self._transport()
            try:
                return t.open_session(timeout=self.config.connect_timeout)
            except Exception as exc:
                if attempt or not _is_drop(exc):
                    msg = f"cannot open a session on {self.config.destination}: {exc}"
                    raise ConnectionDropped(msg, destination=self.config.destination) from exc
                self._drop()
        raise AssertionError("unreachable")

    # -- files ----------------------------------------------------------------------------------------
    def exists(self, remote: str) -> bool:
        where = f"stat {remote} on {self.config.destination}"
        return self._idempotent(where, lambda: self._stat_size(remote_path(remote)) is not None)

    def get(self, remote: str, local: Path) -> None:
        """Download ``remote`` to ``local`` atomically (a dropped link never leaves half a file)."""

        def fetch() -> None:
            try:
                with atomic_path(local) as tmp:
                    self._sftp_client().get(remote_path(remote), str(tmp))
            except FileNotFoundError:
                msg = f"{remote}: no such file on {self.config.destination}"
                raise RemoteError(msg, exit_code=1) from None

        self._idempotent(f"download of {remote} on {self.config.destination}", fetch)

    def _idempotent(
        self,
        what: str,
        op: Callable[[], _T],
        *,
        refused_hint: str | None = None,
        dropped_hint: str = "check the target's network and run again",
    ) -> _T:
        """Run an operation that is safe to repeat, reconnecting (with backoff) when the connection drops.

        Every other failure is final: edgeq's own errors as they are, an OSError (the target refusing
        a file operation) as a RemoteError saying ``{what} failed``."""
        cfg = self.config
        attempts = max(0, cfg.retries) + 1
        for attempt in range(attempts):
            try:
                return op()
            except ConnectionDropped as exc:  # e.g. the target's hash command lost its session
                last: BaseException = exc
            except RemoteError:  # host key, login, a failed command, a corrupt upload, no reconnect
                raise
            except Exception as exc:
                if not self._dropped(exc):
                    if isinstance(exc, OSError):
                        raise RemoteError(f"{what} failed: {exc}", refused_hint, exit_code=1) from exc
                    raise
                last = exc
            self._drop()
            log.info("%s interrupted (%s), try %d/%d", what, last, attempt + 1, attempts)
            self.check_stop()
            if attempt + 1 < attempts:
                time.sleep(cfg.backoff * 2**attempt)
        raise ConnectionFailed(f"{what} failed: connection dropped ({attempts} attempt(s))", dropped_hint)

    def _dropped(self, exc: BaseException) -> bool:
        """Did ``exc`` come from the connection going away, rather than from the target refusing a file
        operation? SFTP status errors and a dead socket can both surface as a bare OSError."""
        import paramiko

        lost = (EOFError, paramiko.SSHException, ConnectionDropped, ConnectionError, TimeoutError)
        if isinstance(exc, lost):
            return True
        if not isinstance(exc, OSError) or isinstance(
            exc, (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)
        ):
            return False
        return not self._still_connected()

    def _still_connected(self) -> bool:
        """After a failure that may be the link's: is it up? The transport thread may not have seen the
        EOF of a dead one yet, so give it a second."""
        deadline = time.monotonic() + 1.0
        while self._alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        return self._alive()

    def _absolute(self, path: str) -> str:
        """Relative and ``~/`` paths resolved against the login home, so an Upload's path stays valid
        for commands run with another ``cwd``."""
        path = remote_path(path)
        if path.startswith("/"):
            return posixpath.normpath(path)
        home = self._sftp_client().normalize(".")
        return posixpath.normpath(posixpath.join(home, path))

    def _makedirs(self, path: str) -> None:
        """``mkdir -p`` over SFTP: no remote process to spawn."""
        sftp = self._sftp_client()
        missing: list[str] = []
        p = path.rstrip("/")
        while p not in ("", "/", "."):
            try:
                sftp.stat(p)
                break
            except FileNotFoundError:
                missing.append(p)
                p = posixpath.dirname(p)
        for d in reversed(missing):
            try:
                sftp.mkdir(d)
            except OSError:
                if self._stat_size(d) is None:  # not a lost race with another deploy: a real error
                    raise

    def _stat_size(self, path: str) -> int | None:
        try:
            return int(self._sftp_client().stat(path).st_size)
        except FileNotFoundError:
            return None


def _shut(sock: Any) -> None:
    """End every wait on ``sock`` (a socket, or a jump host's channel): reads see EOF at once."""
    with contextlib.suppress(Exception):
        sock.shutdown(socket.SHUT_RDWR)


def _check_identity_file(paramiko: Any, identity_file: str) -> None:
    """Fail fast (no retries) on a key file that is missing or not a key; an encrypted one is left to
    paramiko, which then tries ssh-agent. The error names the file, never its content."""
    path = Path(os.path.expanduser(identity_file))
    if not path.is_file():
        raise AuthenticationFailed(f"identity file {identity_file} does not exist", "fix identity_file")
    try:
        paramiko.PKey.from_path(str(path))
    except paramiko.PasswordRequiredException:
        return
    except Exception as exc:
        raise AuthenticationFailed(
            f"identity file {identity_file} is not a private key edgeq can read ({type(exc).__name__})",
            "point identity_file at an OpenSSH private key (ed25519, ecdsa or rsa), not the .pub file",
        ) from None


def _auth_failed(cfg: SSHConfig, exc: BaseException) -> AuthenticationFailed:
    offered = []
    if cfg.identity_file:
        offered.append(f"identity file {cfg.identity_file}")
    if cfg.use_agent:
        offered.append("ssh-agent keys")
    if not cfg.identity_file:
        offered.append("~/.ssh/id_* keys")
    return AuthenticationFailed(
        f"{cfg.destination} refused authentication ({', '.join(offered)})",
        "put the public key in the target's ~/.ssh/authorized_keys, or fix identity_file/user",
    )


def _unknown_name(exc: BaseException) -> bool:
    """The resolver answered that the name does not exist (EAI_NONAME, EAI_NODATA), or it is no valid
    host name (Python's IDNA codec refuses "orin..lab"). EAI_AGAIN (no DNS server answered) is the
    network's: retried like any other network error."""
    if isinstance(exc, UnicodeError):
        return True
    names = {getattr(socket, n) for n in ("EAI_NONAME", "EAI_NODATA") if hasattr(socket, n)}
    return isinstance(exc, socket.gaierror) and exc.errno in names


def _refused(exc: BaseException | None) -> bool:
    """Did every address of the target refuse the TCP connection? (paramiko's NoValidConnectionsError
    says "[Errno None] Unable to connect to port N on HOST" for it, keeping each address's error.)"""
    errors = getattr(exc, "errors", None)
    if isinstance(exc, ConnectionRefusedError):
        return True
    return isinstance(errors, dict) and bool(errors) and all(
        isinstance(e, ConnectionRefusedError) for e in errors.values()
    )


def _describe(exc: BaseException | None, cfg: SSHConfig | None = None) -> str:
    """Why a connection could not be made, in words rather than the library's text."""
    if exc is None:
        return "unknown error"
    where = f"{cfg.host}:{cfg.port}" if cfg is not None else "the target"
    if isinstance(exc, socket.gaierror):
        return f"unknown host name {cfg.host if cfg is not None else ''}: {exc.strerror or exc}"
    if isinstance(exc, UnicodeError):
        return f"'{cfg.host if cfg is not None else ''}' is not a valid host name ({exc.__cause__ or exc})"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"no answer from {where}" + (
            f" within {plain(cfg.connect_timeout)} s" if cfg is not None else "")
    errors = getattr(exc, "errors", None)
    if isinstance(errors, dict) and errors:  # NoValidConnectionsError: each address's own error
        exc = next(iter(errors.values()))
        return f"{where}: {getattr(exc, 'strerror', None) or exc}"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]
