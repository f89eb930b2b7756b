"""Build the target agent into one zipapp: deterministic bytes, version-stamped by its sources.

The archive holds ``edgeq_agent/`` (the sources of ``edgeq.agent``, which imports only
relatively) plus a ``_stamp.py`` with the version, and a top-level ``__main__.py``. Entries are
sorted, dated 1980-01-01 and compressed with a fixed level, so the same sources always give the same
bytes: the content-addressed upload cache on the target then reuses the agent until it changes.
"""

from __future__ import annotations

import hashlib
import io
import zipapp
import zipfile
from dataclasses import dataclass
from pathlib import Path

from edgeq.fs import publish_bytes

AGENT_DIR = Path(__file__).resolve().parent.parent / "agent"
PACKAGE = "edgeq_agent"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip entry can carry
_MAIN = (
    "# edgeq agent zipapp entry point (generated)\n"
    "import sys\n\n"
    f"from {PACKAGE}.__main__ import main\n\n"
    "sys.exit(main())\n"
)


@dataclass(frozen=True)
class AgentBundle:
    """A built agent zipapp: where it is, its content hash, and the version it reports."""

    path: Path
    sha256: str
    version: str


def agent_sources(agent_dir: Path = AGENT_DIR) -> dict[str, bytes]:
    """The agent's ``.py`` files by archive name (sorted), the only inputs to the version stamp."""
    files = sorted(p for p in agent_dir.glob("*.py") if p.name != "_stamp.py")
    return {f"{PACKAGE}/{p.name}": p.read_bytes() for p in files}


def agent_version(sources: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(sources):
        h.update(name.encode() + b"\0" + hashlib.sha256(sources[name]).digest())
    return h.hexdigest()[:16]


def agent_zip_bytes(agent_dir: Path = AGENT_DIR) -> tuple[bytes, str]:
    """(zipapp bytes, version). Pure: same sources -> same bytes."""
    sources = agent_sources(agent_dir)
    if f"{PACKAGE}/__main__.py" not in sources:
        raise FileNotFoundError(f"agent sources missing: {agent_dir}/__main__.py")
    version = agent_version(sources)
    entries = dict(sources)
    entries[f"{PACKAGE}/_stamp.py"] = f'VERSION = "{version}"\n'.encode()
    entries["__main__.py"] = _MAIN.encode()
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as zf:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            info.create_system = 3  # unix, whatever the host OS
            zf.writestr(info, entries[name], compresslevel=9)
    # zipapp copies an existing archive verbatim; no interpreter line: the target's python is named
    # explicitly in the command (``[python, agent.pyz, "probe"]``).
    out = io.BytesIO()
    raw.seek(0)
    zipapp.create_archive(raw, out, interpreter=None)
    return out.getvalue(), version


def build_agent(dest_dir: Path) -> AgentBundle:
    """Write ``edgeq-agent-<version>.pyz`` into ``dest_dir`` (once: left alone when it holds these bytes)."""
    data, version = agent_zip_bytes()
    path = Path(dest_dir) / f"edgeq-agent-{version}.pyz"
    publish_bytes(path, data)  # never rewritten while another deploy may be uploading it
    return AgentBundle(path=path, sha256=hashlib.sha256(data).hexdigest(), version=version)
