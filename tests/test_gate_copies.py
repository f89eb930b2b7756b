"""The int8 gate on engines built from edgeq's own output (tests/fixtures/trt86-h200-edgeq): Concat/Slice
copies that keep precision and layout are reported, not failed; precision or layout changes still fail."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from edgeq.report import POLICIES, apply_gate, build_report, load_layers, load_profile, policy_from_dict

EDGEQ = ROOT / "tests" / "fixtures" / "trt86-h200-edgeq"
INT8 = POLICIES["int8"]


def report_of(stem: str):
    profile = EDGEQ / f"{stem}.profile.json"
    return build_report(load_layers(EDGEQ / f"{stem}.layers.json"), load_profile(profile))


PASSING = [
    "r50b64_edgeq.implicit",
    "r50b8_edgeq.implicit",
    "yolo_edgeq.implicit",
    "yolo_fix2.explicit",
    "r50b64_tailfix.explicit",
]


@pytest.mark.parametrize("stem", PASSING)
def test_engines_without_fallback_pass(cli, stem):
    code, out, _ = cli("report", EDGEQ / f"{stem}.layers.json", "--profile", EDGEQ / f"{stem}.profile.json")
    assert code == 0, out
    assert "gate int8: passed" in out


def test_yolo_concat_copies_are_reported_with_count_and_time():
    for stem in ("yolo_fix2.explicit", "yolo_edgeq.implicit"):
        r = report_of(stem)
        g = apply_gate(r, INT8)
        assert g and len(g.copies) == 19
        assert {v.message for v in g.copies} == {
            "interior copy INT8 NC/32HW32 -> INT8 NC/32HW32 (origin CONCAT)"
        }
        by_index = {rl.index: rl for rl in r.layers}
        assert g.copies_ms == pytest.approx(sum(by_index[v.layer].time_ms for v in g.copies))
        assert g.copies_ms > 0
        assert f"19 same-format copies, {g.copies_ms:.3f} ms reported" in g.summary()
        # the option makes the same copies fail
        strict = apply_gate(r, INT8.replace(forbid_interior_copies=True))
        assert not strict and [v.rule for v in strict.violations] == ["interior-copy"] * 19
        assert strict.copies == ()


def test_forbid_copies_from_config_and_cli(cli):
    p = policy_from_dict({"policy": "int8", "forbid_copies": True})
    assert p.forbid_interior_copies and "interior-copy" in {r.id for r in p.rules}
    assert not INT8.forbid_interior_copies and "interior-copy" not in {r.id for r in INT8.rules}
    code, out, _ = cli("report", EDGEQ / "yolo_fix2.explicit.layers.json", "--forbid-copies", "--json")
    d = json.loads(out)
    assert code == 1 and {v["rule"] for v in d["gate"]["violations"]} == {"interior-copy"}
    assert d["gate"]["policy"]["forbid_interior_copies"] is True


def test_yolo_edgeq_explicit_fails_naming_the_fallback_layers():
    g = apply_gate(report_of("yolo_edgeq.explicit"), INT8)
    rules = g.by_rule()
    compute = rules["int8-compute"]
    assert len(compute) == 17 and g.copies == ()
    assert sum("runs FP16" in v.message for v in compute) == 13
    assert sum("runs FP32" in v.message for v in compute) == 4
    first_nodes = {v.nodes[0] for v in compute}
    # every C2f/SPPF cv2 convolution (it reads a Concat) and every bottleneck's Sigmoid, Mul, Add
    assert {"/stem/stem.2/cv2/cv2.0/Conv", "/p5/p5.2/cv2/cv2.0/Conv", "/h3/cv2/cv2.0/Conv"} <= first_nodes
    pwn = [v for v in compute if v.layer_type == "PointWiseV2"]
    assert len(pwn) == 8 and all(v.nodes[-1].endswith("/Add") for v in pwn)
    # the reformats that fail all change precision or layout
    assert len(rules["interior-reformat"]) == 45
    for v in rules["interior-reformat"]:
        src, dst = v.message.split("interior Reformat ")[1].split(" (origin")[0].split(" -> ")
        assert src != dst


@pytest.mark.parametrize("stem", ["r50b64_edgeq.explicit", "r50b8_edgeq.explicit"])
def test_resnet_edgeq_explicit_fails_on_the_float_tail(cli, stem):
    code, out, _ = cli(
        "report", EDGEQ / f"{stem}.layers.json", "--profile", EDGEQ / f"{stem}.profile.json", "--json"
    )
    d = json.loads(out)
    assert code == 1
    viol = d["gate"]["violations"]
    compute = [v for v in viol if v["rule"] == "int8-compute"]
    assert [v["nodes"] for v in compute] == [
        ["/layer4/layer4.2/conv3/Conv", "/layer4/layer4.2/Add", "/layer4/layer4.2/relu_2/Relu"],
        ["/avgpool/GlobalAveragePool"],
    ]
    assert all("runs FP16" in v["message"] for v in compute)
    assert len([v for v in viol if v["rule"] == "interior-reformat"]) == 3


def test_layout_changing_int8_copy_still_fails():
    """INT8 NC/32HW32 -> INT8 NCHW keeps the precision but changes the layout: not a Concat copy."""
    from conftest import FIXTURES

    g = apply_gate(build_report(load_layers(FIXTURES / "resnet50_ortfb.explicit.layers.json")), INT8)
    assert [(v.rule, v.layer) for v in g.violations] == [("interior-reformat", 167)] and g.copies == ()


def test_policy_sources_cite_documents_or_fixtures_not_issues():
    from edgeq.report.policy import EXEMPTIONS, RULES

    texts = [r.source for r in RULES.values()] + [p.source for p in POLICIES.values()]
    texts += list(EXEMPTIONS.values())
    assert texts and not [t for t in texts if "issue" in t.lower()]
