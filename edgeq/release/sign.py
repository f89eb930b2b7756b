"""Signed bundles with the keys SSH users already have: OpenSSH's ``ssh-keygen -Y sign`` / ``-Y verify``.

The manifest's ``manifest_sha256`` only proves the manifest agrees with itself: whoever edits an engine
can recompute its sha256 and the seal. A signature over the whole bundle file, made with a key only the
release owner holds, is what says who built it. ``ssh-keygen -Y`` (OpenSSH 8.1+) signs any file under a
namespace (``edgeq-release`` here, so an edgeq signature is never mistaken for a git commit's or a
file's, and the other way round) and verifies against an allowed-signers file, the format
``git config gpg.ssh.allowedSignersFile`` reads::

    alice@example.com namespaces="edgeq-release" ssh-ed25519 AAAAC3...

The signature is ``BUNDLE.sig`` beside the bundle (armored ``-----BEGIN SSH SIGNATURE-----``).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from edgeq.errors import EdgeqError
from edgeq.fs import atomic_write_bytes, check_writable
from edgeq.text import plain

NAMESPACE = "edgeq-release"
SIG_SUFFIX = ".sig"
TIMEOUT = 120.0  # seconds: a hardware key may wait for a touch


class SignatureError(EdgeqError):
    """A bundle is unsigned, signed by no one trusted, or its signature does not match its bytes."""

    exit_code = 1


@dataclass(frozen=True)
class Signer:
    """Who signed a bundle, as ``ssh-keygen -Y verify`` said it: the principal and the key."""

    principal: str
    detail: str  # ssh-keygen's own line: Good "edgeq-release" signature for P with ED25519 key SHA256:...


def signature_path(bundle: Path) -> Path:
    return Path(str(bundle) + SIG_SUFFIX)


def _ssh_keygen() -> str:
    found = shutil.which("ssh-keygen")
    if found is None:
        raise EdgeqError("ssh-keygen not found: signing and verifying bundles uses OpenSSH's ssh-keygen -Y",
                         "install OpenSSH's client (Debian/Ubuntu: apt install openssh-client; 8.1 or newer)")
    return found


def _run(argv: list[str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise EdgeqError(f"ssh-keygen did not finish in {plain(TIMEOUT)} s",
                         "a key with a passphrase? load it into ssh-agent (ssh-add), give its .pub") from None


def _said(res: subprocess.CompletedProcess[bytes]) -> str:
    text = (res.stderr or b"").decode("utf-8", "replace") + (res.stdout or b"").decode("utf-8", "replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "on standard input" not in ln]
    return lines[-1] if lines else f"exit {res.returncode}"


def _read(path: Path, what: str) -> bytes:
    path = Path(path)
    if path.is_dir():
        raise EdgeqError(f"{path}: is a directory, not {what}")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise EdgeqError(f"{path}: no such {what}") from None
    except OSError as e:
        raise EdgeqError(f"{path}: cannot read {what}: {e.strerror or e}") from None


def sign(bundle: Path, key: Path) -> Path:
    """Sign ``bundle`` with the SSH private key ``key`` (or a public key whose private half ssh-agent
    holds); writes ``BUNDLE.sig`` atomically and returns its path. The bundle is read once, verified
    against its manifest (a signature vouches for what it signs: a damaged or edited bundle, or a file
    that is no bundle, is refused, exit 2) and fed to ssh-keygen on stdin, so the signature is over
    exactly the bytes verified."""
    from edgeq.release.bundle import require_intact

    exe = _ssh_keygen()
    out = check_writable(signature_path(bundle), inputs=(bundle,))  # before any work
    data = _read(bundle, "bundle")
    require_intact(bundle, "not signed", data)
    key = Path(key).expanduser()
    if not key.is_file():
        raise EdgeqError(f"{key}: no such key", "give your SSH private key, e.g. --key ~/.ssh/id_ed25519")
    res = _run([exe, "-Y", "sign", "-f", str(key), "-n", NAMESPACE], data)
    sig = res.stdout or b""
    if res.returncode != 0 or b"BEGIN SSH SIGNATURE" not in sig:
        raise EdgeqError(f"ssh-keygen could not sign with {key}: {_said(res)}",
                         "a passphrase-protected key must be in ssh-agent (ssh-add) to sign without a prompt")
    atomic_write_bytes(out, sig)
    return out


def verify_signature(bundle: Path, allowed_signers: Path) -> Signer:
    """Who signed ``bundle``, checked against ``allowed_signers``; a SignatureError (exit 1) when it is
    unsigned, signed by a key the file does not trust, or its bytes changed since it was signed."""
    exe = _ssh_keygen()
    allowed = Path(allowed_signers).expanduser()
    _read(allowed, "allowed-signers file")
    data = _read(bundle, "bundle")
    sig = signature_path(bundle)
    if not sig.is_file():
        raise SignatureError(f"{bundle}: not signed (no {sig.name} beside it)",
                             f"sign it: edgeq release sign {bundle} --key ~/.ssh/id_ed25519")
    found = _run([exe, "-Y", "find-principals", "-s", str(sig), "-f", str(allowed)], b"")
    principals = [ln.strip() for ln in found.stdout.decode("utf-8", "replace").splitlines() if ln.strip()]
    if found.returncode != 0 or not principals:
        raise SignatureError(f"{bundle}: signed by a key {allowed} does not list (untrusted)",
                             "add the signer's public key to the allowed-signers file if you trust it")
    principal = principals[0]
    res = _run([exe, "-Y", "verify", "-f", str(allowed), "-I", principal, "-n", NAMESPACE, "-s", str(sig)],
               data)  # fmt: skip
    if res.returncode != 0:
        raise SignatureError(
            f"{bundle}: the signature does not match the bundle (signed by {principal}, but the bytes "
            f"changed since, or it is not an {NAMESPACE} signature): {_said(res)}",
            "do not install it; fetch the bundle and its .sig again from the release owner",
        )
    return Signer(principal, _said(res))


def check_signed(bundle: Path, allowed_signers: Optional[Path]) -> Optional[Signer]:
    """For install: with an allowed-signers file, an unsigned or untrusted bundle is refused (exit 2:
    the operator's to fix); without one, nothing is checked (None)."""
    if allowed_signers is None:
        return None
    try:
        return verify_signature(bundle, allowed_signers)
    except SignatureError as e:
        raise EdgeqError(f"refused: {e.message}", e.hint) from None
