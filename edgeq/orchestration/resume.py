"""Resuming a fleet run: a board that passed with the same inputs is not built again.

Each board's run directory gets ``row.json`` when the board finishes: its matrix row and a key over what
the result depends on (the prepared model and calibration cache by content, the target's settings, the
gate and profile options, edgeq's version). A later run of the same fleet and model looks for each board's
latest record, newest run first: a passed row with the same key is reused (its run directory taken over,
the row marked ``reused from <run>``); a failed row, a changed key, or a board directory without
``row.json`` (the run stopped before it finished) runs again. ``--fresh`` skips the lookup.

The key cannot see the board itself: one reflashed to another TensorRT or L4T keeps its target file.
So ``row.json`` also holds the board's probed facts (TensorRT, GPU, sm, L4T), and a board is reused only
when its probe, run again on the run's one connection to it, says the same; otherwise it is rebuilt and
its row says why (``TensorRT 8.6.2 -> 8.6.0: rebuilt``).

``edgeq fleet validate`` looks in the earlier fleet directories of the same fleet file and model (each
says which in ``resume.json``); ``edgeq run`` in its own work directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from edgeq import __version__
from edgeq.pipeline.rundir import slug, write_json
from edgeq.pipeline.stages import Probe, probe_from_facts
from edgeq.release.jetpack import l4t_of
from edgeq.remote.targets import Target

ROW_FILE = "row.json"
RUN_FILE = "resume.json"
PROBE_FILE = "probe.json"  # the probe's facts, in every board directory that got that far
FACTS = (("tensorrt", "TensorRT"), ("gpu", "GPU"), ("compute_capability", "sm"), ("l4t", "L4T"))


@dataclass(frozen=True)
class Prior:
    """A board's latest record: the run it comes from (a fleet directory's name), its directory, its row."""

    run: str
    board_dir: Path
    key: str
    row: Mapping[str, Any]
    facts: Optional[Mapping[str, Optional[str]]] = None  # the board's, when it ran (``board_facts``)

    def reusable(self, key: str) -> bool:
        return self.row.get("status") == "passed" and self.key == key

    def recorded_facts(self, target: Target) -> Optional[dict[str, Optional[str]]]:
        """The facts the row was made with: from ``row.json``, else from its run's ``probe.json``."""
        if self.facts is not None:
            return dict(self.facts)
        try:
            facts = json.loads((self.board_dir / PROBE_FILE).read_text(encoding="utf-8"))
            return board_facts(probe_from_facts(facts, target))
        except (OSError, ValueError, AttributeError, TypeError):
            return None


def board_facts(found: Probe) -> dict[str, Optional[str]]:
    """What a board is, as far as its engine cares: TensorRT, GPU, compute capability, L4T release."""
    return {"tensorrt": found.tensorrt, "gpu": found.gpu, "compute_capability": found.compute_capability,
            "l4t": l4t_of(found.facts)}  # fmt: skip


def changed_facts(before: Optional[Mapping[str, Optional[str]]], now: Mapping[str, Optional[str]]
                  ) -> Optional[str]:  # fmt: skip
    """None when the board is as it was; else what changed, in words (``TensorRT 8.6.2 -> 8.6.0``)."""
    if before is None:
        return "the board's facts were not recorded"
    said = [f"{label} {before.get(k) or 'unknown'} -> {now.get(k) or 'unknown'}"
            for k, label in FACTS if before.get(k) != now.get(k)]  # fmt: skip
    return ", ".join(said) or None


def board_key(target: Target, model_digest: str, settings: Mapping[str, Any]) -> str:
    """What a board's result depends on, hashed: change any of it and the board runs again."""
    data = {"target": asdict(target), "model": model_digest, "settings": settings, "edgeq": __version__}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def board_dir(fleet_dir: Path, name: str) -> Path:
    return fleet_dir / "targets" / slug(name)


def record(board: Path, row: Mapping[str, Any], key: str,
           facts: Optional[Mapping[str, Optional[str]]] = None) -> None:  # fmt: skip
    """The board finished: its row, key and facts, for the next run to resume from."""
    write_json(board / ROW_FILE, {"key": key, "row": dict(row), "facts": dict(facts) if facts else None})


def mark_run(fleet_dir: Path, fleet_file: Path, model: Path) -> None:
    """Say which fleet and model a fleet directory is for, at its start (an unfinished run is one too)."""
    write_json(fleet_dir / RUN_FILE, _identity(fleet_file, model))


def _identity(fleet_file: Path, model: Path) -> dict[str, str]:
    return {"fleet": str(Path(fleet_file).resolve()), "model": str(Path(model).resolve())}


def earlier_runs(fleet_dir: Path, fleet_file: Path, model: Path) -> list[Path]:
    """The other fleet directories beside ``fleet_dir`` for the same fleet file and model, newest first."""
    want = _identity(fleet_file, model)
    found: list[tuple[float, str, Path]] = []
    for d in fleet_dir.parent.iterdir():
        if d == fleet_dir or not (d / RUN_FILE).is_file():
            continue
        try:
            if json.loads((d / RUN_FILE).read_text(encoding="utf-8")) == want:
                found.append((d.stat().st_mtime, d.name, d))
        except (OSError, ValueError):
            continue
    return [d for _, _, d in sorted(found, reverse=True)]


def priors(runs: Sequence[Path], names: Sequence[str]) -> dict[str, Prior]:
    """Each board's latest record in ``runs`` (newest first); a board whose latest directory has no
    ``row.json`` (unfinished) has none, so it runs again."""
    out: dict[str, Prior] = {}
    for name in names:
        for run in runs:
            d = board_dir(run, name)
            if not d.is_dir():
                continue
            try:
                data = json.loads((d / ROW_FILE).read_text(encoding="utf-8"))
                row = data["row"]
                origin = row.get("reused_from") or run.name
                facts = data.get("facts")
                out[name] = Prior(origin, d, str(data["key"]), row, dict(facts) if facts else None)
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                pass
            break
    return out


def take_over(prior: Prior, dest: Path) -> None:
    """The prior run directory into ``dest`` (hard links where the file system allows: engines are large)."""
    if prior.board_dir.resolve() == dest.resolve():
        return
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)

    def link(src: str, dst: str) -> Any:
        try:
            os.link(src, dst)
            return dst
        except OSError:
            return shutil.copy2(src, dst)

    shutil.copytree(prior.board_dir, tmp, copy_function=link)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def moved(value: Optional[str], old: Path, new: Path) -> Optional[str]:
    """A path in a prior row, moved with its run directory."""
    if not value:
        return value
    try:
        return str(new / Path(value).resolve().relative_to(old.resolve()))
    except ValueError:
        return value
