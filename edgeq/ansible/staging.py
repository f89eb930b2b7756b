"""What every board of a play shares, made once on the machine running Ansible: the prepared model
(clean -> lint, as ``fleet validate``'s host half) and the verified, unpacked release bundle.

Ansible runs each board's task in its own worker process, so "once" is a file lock (``flock``) and a
record on disk: the first board's task prepares or unpacks, the others wait on the lock and read the
record. ``edgeq fleet validate --engine ansible`` and ``release install --engine ansible`` prepare and
verify in edgeq's own process before Ansible starts (a bad model or bundle refused before any board is
touched, exit 2, as under the native engine) and write the same records, which the tasks then read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from edgeq import __version__
from edgeq.errors import EdgeqError
from edgeq.fs import atomic_write_text, sha256_file

PREPARED = "prepared.json"
LOADED = "loaded.json"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (made if missing), held for the block, across processes."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# -- the prepared model ---------------------------------------------------------------------------------
def save_prepared(prepared: Any, host_dir: Path) -> Path:
    """``host_dir/prepared.json``: what ``read_prepared`` needs besides the host stages' records."""
    def rel(p: Optional[Path]) -> Optional[str]:
        return None if p is None else str(Path(p).resolve())

    record = {"model_file": rel(prepared.model_file), "cache_file": rel(prepared.cache_file),
              "implicit_cache": rel(prepared.implicit_cache), "qdq": prepared.qdq}  # fmt: skip
    atomic_write_text(host_dir / PREPARED, json.dumps(record, indent=2) + "\n")
    return host_dir / PREPARED


def read_prepared(host_dir: Path) -> Any:
    """The ``Prepared`` a host half left in ``host_dir`` (its model, its stages' records)."""
    from edgeq.graph.io import load_model
    from edgeq.pipeline.rundir import StageRecord
    from edgeq.pipeline.stages import HOST_STAGES, Prepared

    try:
        record = json.loads((host_dir / PREPARED).read_text(encoding="utf-8"))
        stages = json.loads((host_dir / "stages.json").read_text(encoding="utf-8"))["stages"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise EdgeqError(f"{host_dir}: not a prepared model directory ({e})",
                         "give 'model' (an ONNX file), or a directory edgeq prepared") from None  # fmt: skip
    records = tuple(StageRecord(**s) for s in stages if s.get("name") in HOST_STAGES)

    def path(key: str) -> Optional[Path]:
        return Path(record[key]) if record.get(key) else None

    model_file = path("model_file")
    assert model_file is not None
    return Prepared(load_model(model_file), model_file, bool(record.get("qdq")), path("cache_file"), records,
                    path("implicit_cache"))  # fmt: skip


def prepare_once(model: Path, calib_cache: Optional[Path], root: Path) -> Any:
    """The model cleaned and linted once for every board of a play (``root/<digest>/``), by whichever
    board's task comes first; the others wait for it. Keyed by the model's and cache's content and
    edgeq's version, so a changed model is prepared again and an unchanged one never."""
    from edgeq.pipeline.stages import prepare_host
    from edgeq.quant.quantize import QuantizeOptions

    if not Path(model).is_file():
        raise EdgeqError(f"{model}: no such model",
                         "give the ONNX model's path (relative: to where ansible-playbook runs)")
    digest = hashlib.sha256(":".join([sha256_file(model), sha256_file(calib_cache) if calib_cache else "",
                                      __version__]).encode()).hexdigest()[:16]  # fmt: skip
    host_dir = root / digest
    with locked(root / f"{digest}.lock"):
        if (host_dir / PREPARED).is_file():
            return read_prepared(host_dir)
        shutil.rmtree(host_dir, ignore_errors=True)  # an earlier try that failed half-way
        prepared = prepare_host(Path(model), host_dir, QuantizeOptions(), calib_cache=calib_cache)
        save_prepared(prepared, host_dir)
        return prepared


# -- the release bundle ---------------------------------------------------------------------------------
def save_loaded(loaded: Any, work: Path) -> Path:
    """``work/loaded.json``: the verified bundle ``install.load_bundle`` unpacked into ``work``."""
    models = sorted(work.glob("*.onnx"))
    record = {"bundle": str(loaded.bundle), "manifest": loaded.manifest, "version": loaded.version,
              "engines": {k: str(p) for k, p in loaded.engines.items()},
              "model": str(models[0]) if models and loaded.model is not None else None,
              "signer": {"principal": loaded.signer.principal, "detail": loaded.signer.detail}
              if loaded.signer else None}  # fmt: skip
    atomic_write_text(work / LOADED, json.dumps(record) + "\n")
    return work / LOADED


def read_loaded(work: Path) -> Any:
    from edgeq.orchestration.install import Loaded
    from edgeq.release.sign import Signer

    record = json.loads((work / LOADED).read_text(encoding="utf-8"))
    model = None
    if record.get("model"):
        from edgeq.graph.io import load_model

        model = load_model(Path(record["model"]))
    signer = Signer(**record["signer"]) if record.get("signer") else None
    return Loaded(Path(record["bundle"]), record["manifest"], record["version"],
                  {k: Path(p) for k, p in record["engines"].items()}, model, signer)  # fmt: skip


def stage_bundle(bundle: Path, allowed_signers: Optional[Path], root: Path) -> Any:
    """The bundle verified (its signature too, with ``allowed_signers``) and unpacked once under
    ``root``, by whichever board's task comes first; keyed by the bundle's, its signature's and the
    signers file's content."""
    from edgeq.orchestration.fleet_file import Fleet
    from edgeq.orchestration.install import load_bundle
    from edgeq.release.sign import signature_path

    bundle = Path(bundle)
    if not bundle.is_file():
        raise EdgeqError(f"{bundle}: no such bundle",
                         "give the bundle's path (relative: to where ansible-playbook runs)")
    parts = [sha256_file(bundle)]
    for p in (signature_path(bundle), allowed_signers):
        parts.append(sha256_file(p) if p is not None and p.is_file() else "")
    digest = hashlib.sha256(":".join(parts).encode()).hexdigest()[:16]
    work = root / digest
    with locked(root / f"{digest}.lock"):
        if (work / LOADED).is_file():
            return read_loaded(work)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        fleet = Fleet(bundle, (), 1, "ansible", allowed_signers=allowed_signers)
        loaded = load_bundle(bundle, fleet, work)
        save_loaded(loaded, work)
        return loaded
