"""L4T (Jetson Linux) release -> JetPack version: the first thing a Jetson user checks.

A board says its L4T release in ``/etc/nv_tegra_release`` (``# R36 (release), REVISION: 2.0`` is L4T
36.2.0); JetPack is the SDK around it. Source: NVIDIA's JetPack SDK archive
(https://developer.nvidia.com/embedded/jetpack-archive), which lists each JetPack with its Jetson Linux
release. A release not listed maps to its major JetPack only (R36 -> 6), said as such.
"""

from __future__ import annotations

import re
from typing import Any, Optional

JETPACK = {
    "36.4.4": "6.2.1", "36.4.3": "6.2", "36.4.0": "6.1", "36.3.0": "6.0", "36.2.0": "6.0 DP",
    "35.6.0": "5.1.4", "35.5.0": "5.1.3", "35.4.1": "5.1.2", "35.3.1": "5.1.1", "35.2.1": "5.1",
    "35.1.0": "5.0.2", "34.1.1": "5.0.1 DP", "34.1.0": "5.0 DP",
    "32.7.6": "4.6.6", "32.7.5": "4.6.5", "32.7.4": "4.6.4", "32.7.3": "4.6.3", "32.7.2": "4.6.2",
    "32.7.1": "4.6.1", "32.6.1": "4.6", "32.5.2": "4.5.1", "32.5.1": "4.5.1", "32.5.0": "4.5",
    "32.4.4": "4.4.1", "32.4.3": "4.4",
}  # fmt: skip
# L4T major release -> JetPack major (the same archive: R36 = JetPack 6, R35 and R34 = 5, R32 = 4).
JETPACK_MAJOR = {"36": "6", "35": "5", "34": "5", "32": "4"}
_LINE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*(\d+)\.(\d+)")


def l4t_from_line(line: str) -> Optional[str]:
    """``# R36 (release), REVISION: 2.0, ...`` -> ``36.2.0`` (earlier probes sent the line itself)."""
    m = _LINE.search(line or "")
    return f"{m.group(1)}.{m.group(2)}.{m.group(3)}" if m else None


def jetpack_for(l4t: Optional[str]) -> Optional[str]:
    """The JetPack of an L4T release: exact where the archive lists it, else ``6.x`` from its major."""
    if not l4t:
        return None
    if l4t in JETPACK:
        return JETPACK[l4t]
    major = JETPACK_MAJOR.get(l4t.split(".", 1)[0])
    return f"{major}.x" if major else None


def l4t_of(facts: dict[str, Any]) -> Optional[str]:
    """The L4T release in a probe's facts: the agent's ``l4t.release``, or an older probe's line."""
    l4t = facts.get("l4t")
    if isinstance(l4t, dict) and isinstance(l4t.get("release"), str):
        return l4t["release"]
    legacy = ((facts.get("platform") or {}).get("jetson") or {}).get("l4t")
    return l4t_from_line(legacy) if isinstance(legacy, str) else None
