"""What edgeq's own engine and the collection's action plugins say to each other during one run.

The plugins run in Ansible's worker processes, one a board, spawned by ansible-playbook, spawned by
ansible-runner: no shared memory with the edgeq process that started the run. So they share one
directory, named to them by ``EDGEQ_ANSIBLE_RUN``:

- ``run.json``: the run's settings the modules' options do not carry (``--max-fail``, the bundle the
  command already verified and unpacked);
- ``stop``: Ctrl-C came (edgeq writes it; every board's waits look for it, ``connection.FileStop``);
- ``failed/<board>``: a board failed, so a board about to start sees ``--max-fail`` reached, as the
  native pool's count does;
- ``live/<board>.json``: the board's row as it goes (status, stage), for the live table.

A playbook of the user's own has no such directory: no max-fail of edgeq's, Ctrl-C is Ansible's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from edgeq.ansible.connection import FileStop
from edgeq.fs import atomic_write_text
from edgeq.pipeline.rundir import slug

ENV = "EDGEQ_ANSIBLE_RUN"


@dataclass(frozen=True)
class RunControl:
    root: Optional[Path] = None  # None: a playbook of the user's, not one of edgeq's runs
    settings: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def create(cls, root: Path, settings: Mapping[str, Any]) -> RunControl:
        for sub in ("failed", "live"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        atomic_write_text(root / "run.json", json.dumps(dict(settings), default=str))
        return cls(root, dict(settings))

    @classmethod
    def from_env(cls) -> RunControl:
        value = os.environ.get(ENV)
        if not value:
            return cls()
        root = Path(value)
        try:
            settings = json.loads((root / "run.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            settings = {}
        return cls(root, settings)

    @property
    def max_fail(self) -> Optional[int]:
        value = self.settings.get("max_fail")
        return int(value) if isinstance(value, int) else None

    def stop(self) -> FileStop:
        return FileStop(self.root / "stop" if self.root is not None else None)

    def request_stop(self) -> None:
        if self.root is not None:
            (self.root / "stop").touch()

    def failures(self) -> int:
        if self.root is None:
            return 0
        try:
            return len(os.listdir(self.root / "failed"))
        except OSError:
            return 0

    def record_failure(self, name: str) -> None:
        if self.root is not None:
            (self.root / "failed" / slug(name)).touch()

    def live(self, row: Any) -> None:
        """The board's row (a ``fleet.Row`` or ``install.BoardRow``) as it goes."""
        if self.root is None:
            return
        cells = asdict(row)
        atomic_write_text(self.root / "live" / f"{slug(row.target)}.json", json.dumps(cells, default=str))

    def read_live(self) -> dict[str, dict[str, Any]]:
        """Every board's latest live cells, by the board's slug."""
        out: dict[str, dict[str, Any]] = {}
        if self.root is None:
            return out
        for path in (self.root / "live").glob("*.json"):
            try:
                out[path.stem] = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # being replaced right now: read next time
        return out
