"""Placement is what the golden file says, model by model.

The golden file (``tests/placement_golden.py`` wrote it before the pattern registry existed) holds, for
every zoo model the tests quantize and the four torchvision graphs behind the H100 zoo engines, each Q/DQ
site with its consumers, each weight's axis and each shared scale group. Two things are checked:

- the move into the registry changed nothing: with the three patterns added for the zoo (pointwise-region,
  se-gate, channel-shuffle) switched off, every model's placement is the golden one exactly;
- with them on, the only differences are the ones those patterns are for: one Q/DQ on each SE gate's
  excitation output (EfficientNet-B0, RegNetY), and ShuffleNetV2's channel shuffles left float (the Q/DQ
  on the Concat inputs gone, one scale group per shuffle no more) with the branches they feed
  (float-entry: `edgeq.quant.regions`).
"""

from __future__ import annotations

import json

import pytest
from placement_golden import GOLDEN, models, signature

GOLDEN_DATA = json.loads(GOLDEN.read_text())
NEW_PATTERNS = {"pointwise-region", "se-gate", "channel-shuffle"}


def _diff(got: dict, want: dict) -> tuple[list[str], list[str], list[str]]:
    added = sorted(set(got["sites"]) - set(want["sites"]))
    removed = sorted(set(want["sites"]) - set(got["sites"]))
    changed = [t for t in want["sites"] if t in got["sites"] and got["sites"][t] != want["sites"][t]]
    return added, removed, changed


@pytest.fixture
def without_new_patterns(monkeypatch):
    from edgeq.graph import registry
    from edgeq.graph.trt86 import conv
    from edgeq.quant import regions

    monkeypatch.setattr(registry, "REGISTRY", tuple(p for p in registry.REGISTRY if p.id not in NEW_PATTERNS))
    monkeypatch.setattr(conv, "se_squeezes", lambda graph: set())
    monkeypatch.setattr(regions, "float_entry_regions", lambda graph, plan: [])


@pytest.mark.parametrize("name", sorted(models()))
def test_the_registry_moved_no_qdq(name: str, without_new_patterns) -> None:
    got = signature(models()[name]())
    want = GOLDEN_DATA[name]
    assert _diff(got, want) == ([], [], [])
    assert got["weights"] == want["weights"]
    assert got["groups"] == want["groups"]


@pytest.mark.parametrize("name", sorted(models()))
def test_placement_differs_only_where_the_zoo_patterns_say(name: str) -> None:
    got = signature(models()[name]())
    want = GOLDEN_DATA[name]
    added, removed, changed = _diff(got, want)
    assert not changed
    if name != "shufflenet_v2_x1_0":
        assert got["weights"] == want["weights"]
    if name in ("efficientnet_b0", "regnet_y_400mf"):
        assert len(added) == 16 and not removed
        assert all(t.endswith("fc2/Conv_output_0") for t in added)
        gate = {t: t.replace("fc2/Conv_output_0", "scale_activation/Sigmoid") for t in added}
        assert all(got["sites"][t] == [gate[t]] for t in added)
        assert got["groups"] == want["groups"]
    elif name == "shufflenet_v2_x1_0":
        # channel-shuffle: the branches' last ReLU outputs (read by a Concat only) lose their Q/DQ (19);
        # float-entry: every branch a Slice or a shuffle feeds runs float, its Q/DQ and weights gone. What
        # stays INT8 is what the graph input's Q reaches: conv1, the MaxPool, stage 2's first unit.
        concat_inputs = [t for t in removed if want["sites"][t] == [t.split("/branch", 1)[0] + "/Concat"]]
        assert not added and len(concat_inputs) == 19
        kept = ("input", "/maxpool/", "/stage2/stage2.0/")
        assert all(t.startswith(kept) for t in got["sites"]) and len(got["sites"]) == 5
        assert all(t in removed for t in want["sites"] if not t.startswith(kept))
        assert len(got["weights"]) == 6 and set(got["weights"]) < set(want["weights"])
        assert got["groups"] == []  # every Q/DQ its own scale: nothing commutes across the shuffles
    else:
        assert (added, removed) == ([], [])
        assert got["groups"] == want["groups"]


def test_golden_covers_the_torchvision_graphs() -> None:
    assert {"efficientnet_b0", "mobilenet_v2", "regnet_y_400mf", "shufflenet_v2_x1_0"} <= set(GOLDEN_DATA)
    assert set(models()) == set(GOLDEN_DATA)
    assert all(GOLDEN_DATA[m]["sites"] for m in GOLDEN_DATA)
