"""Engines of edgeq's measured placement beside the implicit engines of the same calibration (TensorRT
8.6.0, one H100 lease: tests/fixtures/trt86-h100-placed): the int8 gate passes every one, and compare
finds no layer, fusion or precision difference between explicit and implicit."""

from __future__ import annotations

import pytest
from conftest import ROOT

from edgeq.report.compare import compare_engines
from edgeq.report.compare_engine import engine_from_path
from edgeq.report.compare_gate import relative_gate

PLACED = ROOT / "tests" / "fixtures" / "trt86-h100-placed"
MODELS = ("r50b8_edgeq", "r50b64_edgeq", "yolo_edgeq")


@pytest.mark.parametrize("stem", [f"{m}.{mode}" for m in MODELS for mode in ("explicit", "implicit")])
def test_int8_gate_passes(cli, stem):
    code, out, _ = cli("report", PLACED / f"{stem}.layers.json", "--profile", PLACED / f"{stem}.profile.json")
    assert code == 0, out
    assert "gate int8: passed" in out


@pytest.mark.parametrize("model", MODELS)
def test_explicit_is_the_implicit_engine(model):
    c = compare_engines([engine_from_path(PLACED / f"{model}.implicit.layers.json"),
                         engine_from_path(PLACED / f"{model}.explicit.layers.json")])
    d = c.diffs[0]
    assert d.wider == ()
    assert d.missing_groups == d.extra_groups == ()
    assert d.base_stats.layers == d.cand_stats.layers
    assert d.base_stats.precisions == d.cand_stats.precisions
    assert d.cand_stats.reformats == d.base_stats.reformats
    # the first timing after each build (run logs): within the ±3% run-to-run noise of timings.txt
    assert d.ratio.throughput is not None and d.ratio.throughput >= 0.98, d.ratio
    verdict = relative_gate(d)
    assert verdict, str(verdict)
