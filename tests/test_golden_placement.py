"""Placement is what the golden file says, model by model: a refactor of the rules moves no Q/DQ.

The golden file (``tests/placement_golden.py`` writes it) holds, for every zoo model the tests quantize
and the four torchvision graphs behind the H100 zoo engines, each Q/DQ site with its consumers, each
weight's axis and each shared scale group.
"""

from __future__ import annotations

import json

import pytest
from placement_golden import GOLDEN, models, signature

GOLDEN_DATA = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(models()))
def test_placement_matches_golden(name: str) -> None:
    assert name in GOLDEN_DATA, f"{name} has no golden placement: run python tests/placement_golden.py"
    got = signature(models()[name]())
    want = GOLDEN_DATA[name]
    moved = sorted(set(got["sites"]) ^ set(want["sites"]))
    assert not moved, f"{name}: Q/DQ sites added or removed: {moved[:8]}"
    changed = [t for t in want["sites"] if got["sites"][t] != want["sites"][t]]
    assert not changed, f"{name}: sites with other consumers: {changed[:8]}"
    assert got["weights"] == want["weights"]
    assert got["groups"] == want["groups"]


def test_golden_covers_the_torchvision_graphs() -> None:
    assert {"efficientnet_b0", "mobilenet_v2", "regnet_y_400mf", "shufflenet_v2_x1_0"} <= set(GOLDEN_DATA)
    assert all(GOLDEN_DATA[m]["sites"] for m in GOLDEN_DATA)
