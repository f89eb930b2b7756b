"""``--build-once-per-kind`` across Ansible's worker processes: ``KindEngines`` (edgeq.pipeline.stages) as
files, so the first board of a kind builds and the others of that kind wait for its engine and load it.

``on_target`` asks a share for ``lock(kind)`` (held while the kind's engine is looked up or built) and
``engines`` (``get(kind)`` -> (the engine on this machine, the board that built it), and set once built).
Here the lock is an ``flock`` and each kind's record a JSON file, under a directory keyed by the model's
content and the run's settings: a later play with another model never takes an engine built for this one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Optional

from edgeq.ansible.staging import locked
from edgeq.fs import atomic_path, atomic_write_text
from edgeq.pipeline.rundir import slug


class _Engines:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, kind: str) -> Path:
        return self.root / f"{slug(kind)}.json"

    def get(self, kind: str) -> Optional[tuple[Path, str]]:
        try:
            record = json.loads(self._path(kind).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        engine = Path(record["engine"])
        return (engine, str(record["built_on"])) if engine.is_file() else None

    def __setitem__(self, kind: str, value: tuple[Path, str]) -> None:
        """Keep the kind's engine here (a link, else a copy): the board that built it may run again and
        start its run directory afresh."""
        engine, built_on = value
        kept = self.root / f"{slug(kind)}.plan"
        with atomic_path(kept) as tmp:
            tmp.unlink()
            try:
                os.link(engine, tmp)
            except OSError:
                shutil.copyfile(engine, tmp)
        atomic_write_text(self._path(kind), json.dumps({"engine": str(kept.resolve()), "built_on": built_on}))


class KindFiles:
    """Engines built in one play, by kind, shared by the processes that run its boards."""

    def __init__(self, root: Path, model_digest: str, settings: Mapping[str, Any]) -> None:
        key = hashlib.sha256(json.dumps([model_digest, settings], sort_keys=True, default=str).encode())
        self.root = root / key.hexdigest()[:16]
        self.root.mkdir(parents=True, exist_ok=True)
        self.engines = _Engines(self.root)

    def lock(self, kind: str) -> AbstractContextManager[None]:
        return locked(self.root / f"{slug(kind)}.lock")
