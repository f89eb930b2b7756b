"""Atomic file writes: a crash or a bad input never leaves a half-written output behind."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from edgeq.errors import EdgeqError


def ensure_dir(path: str | os.PathLike[str]) -> Path:
    """Create a directory and its parents; a file in the way or no permission is the user's to fix."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise EdgeqError(f"{path}: is a file, not a directory", hint="choose another directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise EdgeqError(f"{path}: cannot create directory ({e.strerror or e})",
                         hint="choose a writable directory") from None
    return path


def check_writable(dest: str | os.PathLike[str], *, inputs: tuple[str | os.PathLike[str], ...] = ()) -> Path:
    """Fail before the work, not after it: ``dest`` must be a new or regular file in a writable
    directory, and none of ``inputs`` (edgeq never overwrites what it reads)."""
    dest = Path(dest)
    for i in inputs:
        same = dest.exists() and Path(i).exists() and os.path.samefile(dest, i)
        if same or dest.resolve() == Path(i).resolve():
            raise EdgeqError(f"{dest}: is an input file; edgeq never overwrites its input",
                             hint="choose another output path")
    if dest.is_dir():
        raise EdgeqError(f"{dest}: is a directory, not a file to write to", hint="give a file path")
    parent = dest.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise EdgeqError(f"{dest}: cannot write ({parent} is not a writable directory)")
    return dest


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; rename it over ``dest`` only if the block succeeds."""
    dest = Path(dest)
    if dest.is_dir():
        raise EdgeqError(f"{dest}: is a directory, not a file to write to", hint="give a file path")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    except OSError as e:  # read-only or missing mount, a file where a directory should be
        raise EdgeqError(f"{dest}: cannot write ({e.strerror or e})", hint="choose a writable path") from None
    # mkstemp makes 0600 files; an output should get the permissions any new file gets (or keep the
    # mode of the file it replaces), so a calibration cache is as readable as the model beside it.
    os.fchmod(fd, dest.stat().st_mode & 0o7777 if dest.exists() else 0o666 & ~_umask())
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        try:
            os.replace(tmp_path, dest)
        except OSError as e:
            raise EdgeqError(f"{dest}: cannot write ({e.strerror or e})", "choose a writable path") from None
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write_bytes(dest: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(dest: str | os.PathLike[str], text: str) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")


def sha256_file(path: str | os.PathLike[str]) -> str:
    """A file's sha256 (hex), read in 1 MiB chunks: manifests, stage keys, fleet records."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
