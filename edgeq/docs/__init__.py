"""The rules documentation shipped in the package: ``edgeq/docs/trt86-rules.md``.

One section per rule id (``## qdq-uint8``) plus a few topic sections (``## parsing``). Findings, gate
policies and help text cite a section with ``cite(id)``; ``edgeq rules ID`` prints it, and a test checks
that every cited section exists, so every citation points at something an installed edgeq can show.
"""

from __future__ import annotations

import re
from functools import cache

RULES_DOC = "edgeq/docs/trt86-rules.md"
_FILE = "trt86-rules.md"


def cite(section: str) -> str:
    """The citation of one section: the shipped file and the section id (``edgeq rules <id>`` shows it)."""
    return f"{RULES_DOC}#{section}"


@cache
def sections() -> dict[str, str]:
    """Section id -> its text (heading included), in file order."""
    from importlib.resources import files

    text = files(__package__).joinpath(_FILE).read_text(encoding="utf-8")
    out: dict[str, str] = {}
    parts = re.split(r"(?m)^## ", text)
    for part in parts[1:]:
        head = part.splitlines()[0].strip()
        sid = head.split()[0].strip("`")
        out[sid] = ("## " + part).rstrip() + "\n"
    return out


@cache
def older_ids() -> dict[str, str]:
    """Older id -> the section that holds its fact now (a section's "Older ids:" line), so an id a user
    typed before the pattern registry still finds its rule."""
    out: dict[str, str] = {}
    for sid, text in sections().items():
        m = re.search(r"(?m)^Older ids: (.+)$", text)
        if m:
            out.update({old.strip(): sid for old in m.group(1).split(",")})
    return out


def section(sid: str) -> str | None:
    """One section's text by its id or an older id; None when there is none."""
    return sections().get(sid) or sections().get(older_ids().get(sid, ""))


def cited_sections(text: str) -> list[str]:
    """Every section id ``text`` cites (the file name, a hash sign, the section id)."""
    return re.findall(re.escape(RULES_DOC) + r"#([A-Za-z0-9_-]+)", text)
