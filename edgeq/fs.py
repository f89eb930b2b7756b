"""Atomic file writes: a crash or a bad input never leaves a half-written output behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
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


def output_file(value: str | os.PathLike[str]) -> Path:
    """The one check of an output file as the user typed it (every ``-o FILE``, ``--html``, ``--junit``,
    ``--cache``: the CLI parses them with it, so it runs before any work). A path ending in a separator
    names a directory, which ``Path`` would silently turn into a file of that name; a directory, a FIFO
    or a device there, or no writable directory to put it in, is refused too (``check_writable``).
    What it must not overwrite (the command's inputs) each command checks with ``check_writable``."""
    text = os.fspath(value)
    if text.endswith(("/", os.sep)) or os.path.basename(text) in ("", ".", ".."):
        raise EdgeqError(f"{text}: names a directory, not a file to write to",
                         hint="give a file path, e.g. " + os.path.join(text, "NAME"))
    return check_writable(text)


def output_dir(value: str | os.PathLike[str]) -> Path:
    """An output directory as the user typed it (``--runs-dir``, ``-o DIR``, ``--workdir``): created when
    missing, so refused only when something other than a directory is there, or it cannot be created;
    before any work, as ``output_file``. A default (the CLI hands it over as a ``Path``, what is typed
    comes as text) is left to the command that uses it: ``compare --engines`` never writes to the
    default ``runs/``, and must not fail where it cannot."""
    if not isinstance(value, str):
        return Path(value)
    path = Path(value)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise EdgeqError(f"{path}: cannot write ({e.strerror or e})", "choose a writable directory") from None
    if mode is not None and not stat.S_ISDIR(mode):
        raise EdgeqError(f"{path}: is a file, not a directory", "give a directory (created when missing)")
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise EdgeqError(f"{path}: cannot write ({parent} is not a writable directory)",
                         hint="choose a writable directory")
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
    refuse_special(dest)
    parent = dest.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise EdgeqError(f"{dest}: cannot write ({parent} is not a writable directory)")
    return dest


def refuse_special(dest: Path) -> None:
    """An output is a new or a regular file: a rename over a FIFO, a device node (``/dev/full``) or a
    socket would replace it with a regular file, and a directory is no file to write to."""
    try:
        mode = dest.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise EdgeqError(f"{dest}: cannot write ({e.strerror or e})", hint="choose a writable path") from None
    if stat.S_ISDIR(mode):
        raise EdgeqError(f"{dest}: is a directory, not a file to write to", hint="give a file path")
    if not stat.S_ISREG(mode):
        kind = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                stat.S_IFSOCK: "a socket"}.get(stat.S_IFMT(mode), "not a regular file")
        raise EdgeqError(f"{dest}: is {kind}; edgeq writes only new or regular files",
                         hint="give a file path")


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; rename it over ``dest`` only if the block succeeds."""
    dest = Path(dest)
    refuse_special(dest)
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


def publish_bytes(dest: str | os.PathLike[str], data: bytes) -> None:
    """Write a content-addressed file once: an existing file with these bytes is left alone (its mtime
    too), so a second process building the same file cannot change it under a reader that is uploading
    it; a missing file appears whole (``link`` fails rather than replace a racing writer's)."""
    path = Path(dest)
    try:
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
            with contextlib.suppress(FileExistsError):  # another process published it first
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
        if path.read_bytes() == data:
            return
    atomic_write_bytes(path, data)  # a damaged copy: replaced whole


def create_text(dest: str | os.PathLike[str], text: str) -> None:
    """Write a new file whole, or not at all, and never over an existing one (not even one that appears
    while this writes: the finished temporary file is linked into place, which fails if the name exists)."""
    path = Path(dest)
    refuse_special(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise EdgeqError(f"{path}: cannot write ({e.strerror or e})", hint="choose a writable path") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise EdgeqError(f"{path}: exists; edgeq does not overwrite it",
                             hint="edit or remove it first, or choose another name") from None
        except OSError as e:
            raise EdgeqError(f"{path}: cannot write ({e.strerror or e})", hint="choose a writable path") \
                from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


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


class StagedOutputs:
    """Several outputs that appear all together or not at all (a full disk midway leaves none).

    ``path(dest)`` names where to write ``dest``: under its own name in a hidden directory beside it, so
    a file that names its sidecars (ONNX external data ``<name>.data``) names them right. ``commit``
    moves every staged file into place (renames: no new space needed); a failed one takes back those
    already moved. Use through ``staged_outputs()``.
    """

    def __init__(self) -> None:
        self._stages: dict[Path, Path] = {}  # destination directory -> its staging directory

    def path(self, dest: str | os.PathLike[str]) -> Path:
        dest = Path(dest)
        refuse_special(dest)
        parent = dest.parent
        stage = self._stages.get(parent)
        if stage is None:
            try:
                parent.mkdir(parents=True, exist_ok=True)
                stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".stage", dir=parent))
            except OSError as e:
                msg = f"{dest}: cannot write ({e.strerror or e})"
                raise EdgeqError(msg, "choose a writable path") from None
            self._stages[parent] = stage
        return stage / dest.name

    def commit(self) -> None:
        moved: list[Path] = []
        try:
            for parent, stage in self._stages.items():
                for f in sorted(stage.iterdir()):
                    if f.name.startswith("."):  # a writer's own temporary file
                        continue
                    os.replace(f, parent / f.name)
                    moved.append(parent / f.name)
        except OSError as e:
            for m in moved:
                with contextlib.suppress(OSError):
                    m.unlink()
            raise EdgeqError(f"cannot move the outputs into place ({e.strerror or e})",
                             hint="choose a writable path") from None

    def discard(self) -> None:
        for stage in self._stages.values():
            shutil.rmtree(stage, ignore_errors=True)
        self._stages.clear()


@contextlib.contextmanager
def staged_outputs() -> Iterator[StagedOutputs]:
    """``with staged_outputs() as out: save(x, out.path(a)); save(y, out.path(b))``: both or neither."""
    staged = StagedOutputs()
    try:
        yield staged
        staged.commit()
    finally:
        staged.discard()
