"""Installed releases on the target: ``install``, ``switch``, ``rollback`` and ``status`` (stdlib only).

The layout, under the target's work dir (``edgeq release install`` passes ``--releasesDir``)::

    releases/<version>/engine.plan     the engine, its sha256 checked here on the board
    releases/<version>/release.json    what the host said about it (bundle, kind, recorded figures)
    releases/current -> <version>      what runs: a relative symlink, replaced atomically
    releases/history                   JSON list of the versions ``current`` pointed at, oldest first

A version directory is written under a temporary name and renamed into place, and ``current`` is a
new symlink renamed over the old one (rename(2) is atomic), so a board that loses power or its
connection mid-install is left on its previous ``current``, never on half a release. ``rollback``
goes back one entry of ``history`` (Capistrano's and Ansible's deploy_helper's model).

``switch`` and ``rollback`` are compare-and-swap: with ``--expect OLD`` (the ``current`` the host read
when it started; empty for none) they take ``releases/.lock`` (flock), check ``current`` still is OLD,
and only then rename the new link over it, so two operators installing on one board at once cannot
silently overwrite each other's switch: the later one is refused, naming what ``current`` became.
"""

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil

from .common import AgentError

ENGINE = "engine.plan"
META = "release.json"
CURRENT = "current"
HISTORY = "history"
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_RESERVED = (CURRENT, HISTORY)


def add_arguments(sub, common):
    """The four subcommands, on the agent's parser."""
    install = sub.add_parser("install", help="an uploaded engine into releases/<version>/ (sha256 checked)")
    common(install)
    install.add_argument("--releasesDir", required=True)
    install.add_argument("--version", required=True)
    install.add_argument("--engine", required=True, help="the uploaded engine file")
    install.add_argument("--sha256", required=True, help="the sha256 the bundle's manifest gives it")
    install.add_argument("--meta", default="{}", help="JSON written to releases/<version>/release.json")

    switch = sub.add_parser("switch", help="point releases/current at an installed version (atomically)")
    common(switch)
    switch.add_argument("--releasesDir", required=True)
    switch.add_argument("--version", required=True)
    switch.add_argument("--expect", help="only when current is still this version (empty: no current), "
                        "as the host read it when its install started")

    rollback = sub.add_parser("rollback", help="point releases/current back at the version before it")
    common(rollback)
    rollback.add_argument("--releasesDir", required=True)
    rollback.add_argument("--expect", help="only when current is still this version (empty: no current)")
    rollback.add_argument(
        "--allowNone", action="store_true", help="with no earlier version, remove current (a first install)"
    )

    status = sub.add_parser("status", help="the current version, the history and the installed versions")
    common(status)
    status.add_argument("--releasesDir", required=True)


def _check_version(version):
    if not _VERSION.match(version) or version in _RESERVED:
        raise AgentError("usage", "not a release version name: %r" % version)


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def _locked(root):
    """One release operation at a time on a board (two installs racing for ``current``)."""
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _tmp(root, name):
    return os.path.join(root, ".%s.tmp-%d" % (name, os.getpid()))


def _write_json(root, name, obj):
    tmp = _tmp(root, name)
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(root, name))


def _current(root):
    try:
        return os.path.basename(os.readlink(os.path.join(root, CURRENT)).rstrip("/")) or None
    except OSError:
        return None


def _history(root):
    try:
        with open(os.path.join(root, HISTORY)) as f:
            items = json.load(f)
    except (OSError, ValueError):
        items = []
    items = [v for v in items if isinstance(v, str)] if isinstance(items, list) else []
    cur = _current(root)
    if cur and (not items or items[-1] != cur):  # a current set by hand, or a lost history file
        items.append(cur)
    return items


def _point(root, version):
    """``current`` -> ``version``: a new symlink renamed over the old one, or ``current`` removed."""
    link = os.path.join(root, CURRENT)
    if version is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(link)
        return
    tmp = _tmp(root, CURRENT)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(version, tmp)
    os.replace(tmp, link)


def _check_expected(root, expect, stage, during, refused):
    """Compare-and-swap's compare, under the lock: ``current`` must still be what the host read
    (``expect``; "" for no current), else nothing is switched and the reason names what it became."""
    cur = _current(root)
    if expect is not None and cur != (expect or None):
        raise AgentError(stage, "current changed to %s during this %s (another install?): not %s"
                         % (cur or "(none)", during, refused))
    return cur


def _installed(root):
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if _VERSION.match(n) and n not in _RESERVED
                  and os.path.isfile(os.path.join(root, n, ENGINE)))


def _previous(root, history, cur):
    """The version a rollback would go to: the last entry before ``cur`` still installed."""
    have = set(_installed(root))
    for v in reversed(history):
        if v != cur and v in have:
            return v
    return None


def install(args):
    _check_version(args.version)
    root = args.releasesDir
    if not os.path.isfile(args.engine):
        raise AgentError("input", "engine not found: %s" % args.engine)
    got = _sha256(args.engine)
    if got != args.sha256:
        raise AgentError("verify", "the engine's sha256 on the board is %s, the manifest says %s"
                         % (got, args.sha256))
    try:
        meta = json.loads(args.meta)
    except ValueError:
        raise AgentError("usage", "--meta is not JSON") from None
    with _locked(root):
        dest = os.path.join(root, args.version)
        if os.path.isdir(dest):
            have = os.path.join(dest, ENGINE)
            if os.path.isfile(have) and _sha256(have) == args.sha256:
                return {"version": args.version, "path": dest, "existing": True, "sha256": got}
            raise AgentError("install", "version %s is already installed with another engine (%s)"
                             % (args.version, dest))
        tmp = _tmp(root, args.version)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        try:
            target = os.path.join(tmp, ENGINE)
            try:
                os.link(args.engine, target)  # the upload cache's verified copy: no second copy on disk
            except OSError:
                shutil.copyfile(args.engine, target)
            if _sha256(target) != args.sha256:
                raise AgentError("verify", "the engine changed while it was installed")
            _write_json(tmp, META, dict(meta, version=args.version, sha256=got))
            os.rename(tmp, dest)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if e.errno == errno.ENOSPC:
                raise AgentError("output", "no space left on device installing %s" % dest) from None
            raise AgentError("install", "cannot install %s: %s" % (dest, e.strerror or e)) from None
        except AgentError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return {"version": args.version, "path": dest, "existing": False, "sha256": got}


def switch(args):
    _check_version(args.version)
    root = args.releasesDir
    with _locked(root):
        if not os.path.isfile(os.path.join(root, args.version, ENGINE)):
            raise AgentError("input", "version %s is not installed in %s" % (args.version, root))
        cur = _current(root)
        if cur == args.version:  # already what was asked (the same release installed twice at once)
            return {"changed": False, "current": cur, "previous": cur}
        _check_expected(root, args.expect, "switch", "install", "switched")
        history = _history(root)
        _write_json(root, HISTORY, [*history, args.version])
        _point(root, args.version)
    return {"changed": True, "current": args.version, "previous": cur}


def rollback(args):
    root = args.releasesDir
    with _locked(root):
        cur = _check_expected(root, args.expect, "rollback", "rollback", "rolled back")
        history = _history(root)
        back = _previous(root, history, cur)
        if back is None and not args.allowNone:
            raise AgentError("rollback", "no earlier version installed to roll back to (current: %s)" % cur)
        if back is None:
            _write_json(root, HISTORY, [])
        else:
            _write_json(root, HISTORY, history[: len(history) - history[::-1].index(back)])
        _point(root, back)
    return {"changed": back != cur, "current": back, "previous": cur}


def status(args):
    root = args.releasesDir
    cur = _current(root)
    history = _history(root)
    meta = None
    if cur is not None:
        try:
            with open(os.path.join(root, cur, META)) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            meta = None
    return {"current": cur, "previous": _previous(root, history, cur), "history": history,
            "installed": _installed(root), "release": meta}


COMMANDS = {"install": install, "switch": switch, "rollback": rollback, "status": status}
