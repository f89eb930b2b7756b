"""`edgeq compare` on real TensorRT 8.6 engine pairs (tests/fixtures/trt86-h200 and trt86-h200-edgeq): the
fusions, precisions and time one engine has and the other lacks, the rule that explains each, and the
relative gate."""

from __future__ import annotations

import gzip
import json
import os
import re
from functools import cache
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT

from edgeq.errors import ReportError
from edgeq.quant.rules import RULES as PLACEMENT_RULES
from edgeq.report.compare import compare_engines
from edgeq.report.compare_engine import engine_from_path
from edgeq.report.compare_gate import RELATIVE_RULES, relative_gate

EDGEQ = ROOT / "tests" / "fixtures" / "trt86-h200-edgeq"


def engine_dir(tmp: Path, src: Path, stem: str, run_log: str | None = None) -> Path:
    """A directory as a user would have it: one engine's files (linked from the fixtures)."""
    d = tmp / stem
    d.mkdir()
    for suffix in ("layers.json", "profile.json"):
        if (src / f"{stem}.{suffix}").exists():
            os.symlink(src / f"{stem}.{suffix}", d / f"{stem}.{suffix}")
    log = src / (run_log or f"{stem}.run.log")
    if log.exists():
        os.symlink(log, d / f"{stem}.run.log")
    return d


@cache
def diff_of(base: str, cand: str, src: Path = EDGEQ):
    c = compare_engines(
        [engine_from_path(src / f"{base}.layers.json"), engine_from_path(src / f"{cand}.layers.json")]
    )
    return c.diffs[0]


def test_resnet50_ortfb_names_the_missing_stem_fusion_the_16_residuals_and_the_ratio(tmp_path, cli):
    base = engine_dir(tmp_path, FIXTURES, "resnet50.implicit")
    cand = engine_dir(tmp_path, FIXTURES, "resnet50_ortfb.explicit")
    code, out, _ = cli("compare", "--engines", base, cand, "--json")
    assert code == 0
    d = json.loads(out)["diffs"][0]
    assert d["ratio"]["source"] == "run logs"
    assert round(d["ratio"]["throughput"], 2) == 0.73  # 1233.99 / 1687.06 qps
    assert "/conv1/Conv + /relu/Relu + /maxpool/MaxPool" in d["missing_groups"]
    assert "/conv1/Conv + /relu/Relu" in d["extra_groups"]
    separate = [g for g in d["extra_groups"] if g.endswith("/Add + " + g.split(" + ")[-1]) and "Relu" in g]
    assert len(separate) == 16 and all(" + " in g and "Conv" not in g for g in separate)
    stats = {e["name"]: e["stats"] for e in json.loads(out)["engines"]}
    assert stats["resnet50_ortfb.explicit"]["unfused_residuals"] == 16
    assert stats["resnet50.implicit"]["unfused_residuals"] == 0
    # the regions that explain them carry the placement rule ids
    rules = {r["nodes"][0]: [e["rule"] for e in r["explanations"]] for r in d["regions"]}
    assert rules["/conv1/Conv"] == ["conv-act-maxpool"]
    residual = [n for n, r in rules.items() if "residual-add" in r]
    assert len(residual) == 16
    # terminal: the same facts, readable
    code, out, _ = cli("compare", "--engines", base, cand)
    assert "0.73x" in out and "/conv1/Conv + /relu/Relu + /maxpool/MaxPool" in out
    assert "17 fused only in the baseline" in out
    assert "16 residual Add layers not fused into a convolution (baseline 0)" in out


def test_yolo_edgeq_names_the_concat_convolutions_and_the_silu_residuals():
    d = diff_of("yolo_edgeq.implicit", "yolo_edgeq.explicit")
    differing = [r for r in d.regions if r.differs]
    assert len(differing) == 17  # 13 FP16 + 4 FP32 compute layers in the explicit engine
    by_rule: dict[str, list] = {}
    for r in differing:
        assert len(r.rules) == 1, r.nodes
        by_rule.setdefault(r.rules[0], []).append(r)
    assert set(by_rule) == {"concat-conv", "silu-residual"} <= set(PLACEMENT_RULES)
    convs = by_rule["concat-conv"]
    # every C2f/SPPF cv2 (and the head's cv1, which reads the upsample Concat) convolution
    assert sorted(r.nodes[0] for r in convs) == sorted(
        [
            f"/{b}/cv2/cv2.0/Conv"
            for b in ("stem/stem.2", "p3/p3.1", "p4/p4.1", "p5/p5.1", "p5/p5.2", "h3", "h4")
        ]
        + ["/h3/cv1/cv1.0/Conv", "/h4/cv1/cv1.0/Conv"]
    )
    assert {r.cand.precision for r in convs} == {"FP16", "FP32"} and {r.base.precision for r in convs} == {
        "INT8"
    }
    silu = by_rule["silu-residual"]
    assert len(silu) == 8
    assert all(r.nodes[-1].endswith("/Add") and "Sigmoid" in r.nodes[0] for r in silu)
    assert {r.cand.precision for r in silu} == {"FP16", "FP32"}
    # each region's time is the layer and the reformats around it: the explicit side costs more
    assert all(r.delta_ms is not None and r.delta_ms > 0 for r in differing)
    assert [r.nodes[0] for r in d.top(1)] == ["/h4/cv1/cv1.0/Conv"]
    assert d.ratio.source == "run logs" and round(d.ratio.throughput, 2) == 0.55
    assert d.cand_stats.reformats == 45 and d.base_stats.copies == 19 and d.cand_stats.copies == 0


def test_yolo_fix2_matches_implicit_and_passes_the_relative_gate(tmp_path, cli):
    d = diff_of("yolo_edgeq.implicit", "yolo_fix2.explicit")
    assert d.wider == () and not any(r.differs for r in d.regions)
    assert d.base_stats.layers == d.cand_stats.layers == 69
    assert d.missing_groups == d.extra_groups == ()
    # timed on the same machine (the machine2 run log): 1.00x
    base = engine_dir(tmp_path, EDGEQ, "yolo_edgeq.implicit", "yolo_edgeq.implicit.machine2.run.log")
    cand = engine_dir(tmp_path, EDGEQ, "yolo_fix2.explicit")
    code, out, _ = cli("compare", "--engines", base, cand, "--gate", "relative")
    assert code == 0, out
    assert (
        "gate relative: yolo_fix2.explicit passed against yolo_edgeq.implicit (throughput 1.000x (run logs)"
        in out
    )


def test_relative_gate_fails_wider_layers_more_reformats_and_a_low_ratio():
    g = relative_gate(diff_of("yolo_edgeq.implicit", "yolo_edgeq.explicit"))
    assert not g
    rules = [r for r, _ in g.failures]
    assert rules.count("wider-than-baseline") == 17
    assert "more-reformats" in rules and "slower-than-baseline" in rules
    assert "0.553x" in g.summary()
    assert set(rules) <= set(RELATIVE_RULES) and all(r.source for r in RELATIVE_RULES.values())
    # the resnet tail: two wider layers and 3 reformats, explained by the pool rule
    d = diff_of("r50b64_edgeq.implicit", "r50b64_edgeq.explicit")
    g = relative_gate(d, min_ratio=0.9)  # 0.96x passes a 0.9 threshold; precision still fails
    assert [r for r, _ in g.failures] == ["wider-than-baseline", "wider-than-baseline", "more-reformats"]
    tail = [r for r in d.regions if "pool-tail" in r.rules]
    assert sorted(r.nodes[0] for r in tail) == ["/avgpool/GlobalAveragePool", "/layer4/layer4.2/conv3/Conv"]
    assert relative_gate(diff_of("r50b64_edgeq.implicit", "r50b64_tailfix.explicit"), 0.9)


def _det_diff(lease: str, tmp_path: Path):
    """nudenet's YOLOv8n: its implicit engine and its mirror's explicit engine of one ``--placement auto``
    deploy (real layer JSONs), with the paired throughput ratio that deploy measured."""
    import dataclasses
    import gzip

    from edgeq.report.compare import Ratio, diff_pair

    d = FIXTURES.parent / lease
    engines = {}
    for v in ("implicit", "mirror"):
        (tmp_path / lease / v).mkdir(parents=True)
        data = gzip.decompress((d / f"det.{v}.layers.json.gz").read_bytes())
        (tmp_path / lease / v / "layers.json").write_bytes(data)
        engines[v] = engine_from_path(tmp_path / lease / v, name=v)
    ratio = json.loads((d / "det.auto.placement.json").read_text())["evidence"]["ratio"]
    diff = diff_pair(engines["implicit"], engines["mirror"])
    return dataclasses.replace(diff, ratio=Ratio(ratio, None, "paired rounds")), diff


def test_a_candidate_faster_beyond_noise_may_run_float_layers_fp32_but_never_an_int8_layer_float(tmp_path):
    """The H100 mirror of YOLOv8n ran 1.107x its implicit engine, every INT8 layer of implicit INT8, with
    13 float nodes FP32 where implicit ran them FP16 and 11 interior reformats against 6: TensorRT's own
    timed choices for a faster engine, tolerated and listed (``auto`` kept implicit over them before).
    Within the noise of two timings (under 1.06x) they fail as before, and so does the H200 mirror of the
    lease before, which ran two groups implicit ran INT8 in FP32: nothing is tolerated there."""
    import dataclasses

    from edgeq.report.compare import Ratio
    from edgeq.report.compare_gate import FASTER_BEYOND_NOISE

    timed, _ = _det_diff("trt86-h100-int8-writes", tmp_path)
    assert timed.ratio.throughput >= FASTER_BEYOND_NOISE
    assert {(w.base_precision, w.cand_precision) for w in timed.wider} == {("FP16", "FP32")}
    g = relative_gate(timed, 0.98)
    assert g, str(g)
    assert g.tolerated == ("13 nodes FP32 where the baseline ran FP16", "11 interior reformats (baseline 6)")
    assert "tolerated" in g.summary() and g.to_dict()["tolerated"] == list(g.tolerated)
    for ratio in (1.0, FASTER_BEYOND_NOISE - 0.001):
        even = relative_gate(dataclasses.replace(timed, ratio=Ratio(ratio, None, "paired rounds")), 0.98)
        assert [r for r, _ in even.failures].count("wider-than-baseline") == 9 and not even.tolerated
        assert "more-reformats" in [r for r, _ in even.failures]
    assert not relative_gate(dataclasses.replace(timed, ratio=Ratio(None, None, "none")), 0.98).tolerated
    h200, _ = _det_diff("trt86-h200-more", tmp_path)
    g = relative_gate(dataclasses.replace(h200, ratio=Ratio(1.107, None, "paired rounds")), 0.98)
    int8 = [m for r, m in g.failures if r == "wider-than-baseline" and "(baseline INT8)" in m]
    fp16 = [m for r, m in g.failures if r == "wider-than-baseline" and "(baseline FP16)" in m]
    assert not g and len(int8) == 2 and fp16 and not g.tolerated


def test_auto_judges_the_median_round_ratio_it_prints_not_the_ratio_of_the_medians(tmp_path):
    """nudenet's YOLOv8n, ``--placement auto`` on an H100 (trt86-h100-paired): implicit and the mirror timed
    in 3 alternating rounds, 1.166x, 0.978x and 0.973x (implicit's first round slow). The output printed
    "paired: explicit 0.9782x" while the gate judged 1.051x, the ratio of the two engines' median qps,
    which pairs one round's mirror with another round's implicit. The gate now judges the figure printed."""
    from edgeq.orchestration.implicit import relative_to_implicit
    from edgeq.orchestration.retime import Paired

    lease = FIXTURES.parent / "trt86-h100-paired"
    summary = json.loads((lease / "det.auto.implicit.json").read_text())
    figures = summary["paired"]
    rounds = Paired(tuple(figures["names"]), tuple(tuple(q) for q in figures["qps"]))
    per_round = [e / i for i, e in zip(*rounds.qps)]
    assert sorted(round(r, 3) for r in per_round) == [0.973, 0.978, 1.166]
    assert rounds.ratio() == pytest.approx(figures["ratio"], abs=1e-4) == pytest.approx(0.9782, abs=1e-4)
    medians = rounds.median(1) / rounds.median(0)
    assert medians == pytest.approx(1.0507, abs=1e-4)  # what the gate judged before, and the decision said
    assert "explicit 1.0507x implicit" in (lease / "det.auto.deploy.txt").read_text()
    runs = {}
    for v in ("implicit", "mirror"):
        runs[v] = tmp_path / v
        runs[v].mkdir()
        data = gzip.decompress((lease / f"det.{v}.layers.json.gz").read_bytes())
        (runs[v] / "layers.json").write_bytes(data)
    qps = (rounds.median(0), rounds.median(1))
    before = relative_to_implicit(None, runs["implicit"], runs["mirror"], qps, 0.98)
    assert before.ratio.throughput == pytest.approx(medians) and before.ratio.source == "run logs"
    g = relative_to_implicit(None, runs["implicit"], runs["mirror"], qps, 0.98, (), figures)
    assert g.ratio.throughput == pytest.approx(rounds.ratio(), abs=1e-4)
    assert g.ratio.source == "median of 3 paired rounds"
    assert "0.978x (median of 3 paired rounds)" in g.summary()
    rules = [r for r, _ in g.failures]
    assert "slower-than-baseline" in rules and "slower-than-baseline" not in [r for r, _ in before.failures]
    # the same four float groups FP32 where implicit ran them FP16 either way: not faster beyond noise
    assert rules.count("wider-than-baseline") == 4 and not g.tolerated and not before.tolerated


def test_ratio_from_summed_layer_times_without_run_logs_says_so(tmp_path, cli):
    base = engine_dir(tmp_path, EDGEQ, "r50b8_edgeq.implicit", "none")
    cand = engine_dir(tmp_path, EDGEQ, "r50b8_edgeq.explicit", "none")
    code, out, _ = cli("compare", "--engines", base, cand, "--json", "--gate", "relative")
    d = json.loads(out)
    r = d["diffs"][0]["ratio"]
    assert r["source"] == "summed layer times" and 0.9 < r["throughput"] < 1.0
    assert code == 1 and d["exit_code"] == 1


def test_a_failed_build_is_a_row_not_an_abort(tmp_path, cli):
    failed = tmp_path / "all"
    failed.mkdir()
    os.symlink(EDGEQ / "yolo_edgeq_all.explicit.build.log", failed / "yolo_edgeq_all.explicit.build.log")
    base = engine_dir(tmp_path, EDGEQ, "yolo_edgeq.implicit")
    code, out, _ = cli(
        "compare", "--engines", base, failed, EDGEQ / "yolo_fix2.explicit.layers.json", "--json"
    )
    assert code == 0
    rows = {e["name"]: e for e in json.loads(out)["engines"]}
    assert rows["all"]["built"] is False
    assert rows["all"]["error"].startswith("Could not find any implementation for node PWN(PWN(")
    assert [d["candidate"] for d in json.loads(out)["diffs"]] == ["yolo_fix2.explicit"]
    code, out, _ = cli("compare", "--engines", base, failed, EDGEQ / "yolo_fix2.explicit.layers.json")
    assert "all: build failed: Could not find any implementation" in out


def test_a_candidate_that_did_not_build_fails_the_relative_gate(tmp_path, cli):
    """Issue 20.1: a failed build passed the relative gate (exit 0, no gate line, "gates": [])."""
    failed = tmp_path / "failed"
    failed.mkdir()
    os.symlink(EDGEQ / "yolo_edgeq_all.explicit.build.log", failed / "yolo_edgeq_all.explicit.build.log")
    base = engine_dir(tmp_path, EDGEQ, "yolo_edgeq.implicit")
    code, out, _ = cli("compare", "--engines", base, failed, "--gate", "relative", "--json")
    assert code == 1
    d = json.loads(out)
    assert d["exit_code"] == 1
    [g] = d["gates"]
    assert g["candidate"] == "failed" and g["passed"] is False
    [f] = g["failures"]
    assert f["rule"] == "not-built" and f["rule"] in RELATIVE_RULES
    assert f["message"].startswith("Could not find any implementation for node PWN(PWN(")
    code, out, _ = cli("compare", "--engines", base, failed, "--gate", "relative")
    assert code == 1
    assert "gate relative: failed FAILED against yolo_edgeq.implicit (not-built" in out
    page = tmp_path / "compare.html"
    assert cli("compare", "--engines", base, failed, "--gate", "relative", "--html", page)[0] == 1
    assert "gate relative: failed FAILED against yolo_edgeq.implicit (not-built" in page.read_text()
    # a built candidate beside it is still judged on its own
    code, out, _ = cli(
        "compare", "--engines", base, failed, EDGEQ / "yolo_fix2.explicit.layers.json", "--gate", "relative",
        "--json",
    )  # fmt: skip
    verdicts = {g["candidate"]: g["passed"] for g in json.loads(out)["gates"]}
    assert code == 1 and verdicts == {"failed": False, "yolo_fix2.explicit": verdicts["yolo_fix2.explicit"]}


def test_html_aligns_both_engines_and_is_self_contained(tmp_path, cli):
    page = tmp_path / "compare.html"
    code, _, _ = cli(
        "compare", "--engines", EDGEQ / "yolo_edgeq.implicit.layers.json",
        EDGEQ / "yolo_edgeq.explicit.layers.json", "--html", page, "--gate", "relative",
    )  # fmt: skip
    assert code == 1
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert "http://" not in html and "https://" not in html and "<script" not in html and " src=" not in html
    assert html.count('<tr class="diff">') == 17 + 10  # the aligned list plus the top 10
    assert html.count('<tr class="same">') == 49 - 17
    assert "concat-conv" in html and "silu-residual" in html
    assert "gate relative: yolo_edgeq.explicit FAILED" in html


def test_bad_input_is_one_line_exit_2(tmp_path, cli):
    one = EDGEQ / "yolo_fix2.explicit.layers.json"
    code, _, err = cli("compare", "--engines", one)
    assert code == 2 and "two or more" in err
    code, _, err = cli("compare", "--engines", one, tmp_path / "missing")
    assert code == 2 and "no such file or directory" in err and "Traceback" not in err
    two = tmp_path / "two"
    two.mkdir()
    for stem in ("yolo_fix2.explicit", "yolo_fix1.explicit"):
        os.symlink(EDGEQ / f"{stem}.layers.json", two / f"{stem}.layers.json")
    code, _, err = cli("compare", "--engines", one, two)
    assert code == 2 and "2 *.layers.json files" in err
    code, _, err = cli("compare", "--engines", one, one, "--gate", "int8")
    assert code == 2 and "unknown gate" in err
    code, _, err = cli("compare", one)
    assert code == 2 and "--engines" in err
    bad_log = tmp_path / "bad"
    bad_log.mkdir()
    os.symlink(EDGEQ / "yolo_fix2.explicit.layers.json", bad_log / "x.layers.json")
    (bad_log / "x.run.log").write_text("not a trtexec log\n")
    code, _, err = cli("compare", "--engines", one, bad_log)
    assert code == 2 and "not a trtexec run log" in err
    with pytest.raises(ReportError, match="the baseline did not build"):
        compare_engines(
            [engine_from_path(EDGEQ / "yolo_edgeq_all.explicit.build.log"), engine_from_path(one)]
        )


def test_engines_of_different_models_are_refused(tmp_path, cli):
    """ResNet-50 against YOLO gave "0.33x" and "49 fused only in the baseline" without a word (and
    --gate relative exit 1): one line naming why, exit 2, in report --onnx's words (a different model?)."""
    resnet = FIXTURES / "resnet50.implicit.layers.json"
    yolo = EDGEQ / "yolo_edgeq.explicit.layers.json"
    for gate in ((), ("--gate", "relative")):
        code, out, err = cli("compare", "--engines", resnet, yolo, *gate)
        (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert code == 2 and out == "" and "Traceback" not in err
        assert "yolo_edgeq.explicit: 119 of 119 ONNX node names" in line and "(a different model?)" in line
        assert "resnet50.implicit" in line
    # one model's engines still compare: implicit against onnxruntime's explicit, and the other way round
    ortfb = FIXTURES / "resnet50_ortfb.explicit.layers.json"
    assert cli("compare", "--engines", resnet, ortfb)[0] == 0
    assert cli("compare", "--engines", ortfb, resnet)[0] == 0


def test_report_html_leads_with_the_engine_strip_and_violations_by_region(tmp_path, cli):
    page = tmp_path / "report.html"
    stem = EDGEQ / "yolo_edgeq.explicit"
    code, _, _ = cli("report", f"{stem}.layers.json", "--profile", f"{stem}.profile.json", "--html", page)
    assert code == 1
    html = page.read_text()
    strip = html.index('<div class="strip">')
    assert (
        strip
        < html.index("Violations by region")
        < html.index("All 62 violations")
        < html.index("<h2>Layers")
    )
    # one block per activation layer (126 layers - 31 weight layers), the 62 violating ones marked
    blocks = re.findall(r'<div class="blk[^"]*"', html[strip : html.index("</div></div>", strip)])
    assert len(blocks) == 95 and sum("viol" in b for b in blocks) == 62
    assert sum("reformat" in b for b in blocks) == 46 and not any("copy" in b for b in blocks)
    # 62 violations in 7 regions (C2f/SPPF blocks and head blocks), each with its placement rule
    assert "Violations by region (62 in 7 regions)" in html
    table = html[html.index("Violations by region") : html.index("All 62 violations")]
    assert table.count('<tr class="viol">') == 7
    assert ">/p5/p5.2</td>" in table and "concat-conv" in table and "silu-residual" in table
    assert "<details><summary>All 62 violations, in engine order</summary>" in html
    # the implicit engine's Concat copies are drawn as copies, and it has no violations to group
    stem = EDGEQ / "yolo_edgeq.implicit"
    cli("report", f"{stem}.layers.json", "--profile", f"{stem}.profile.json", "--html", page)
    html = page.read_text()
    assert html.count('class="blk copy"') == 19 and "Violations by region" not in html


def test_lint_findings_of_the_qdq_model_explain_the_regions_they_name(tmp_path, cli):
    import onnx
    from test_report import resnet50_like

    model = tmp_path / "resnet50.qdq.onnx"
    onnx.save(resnet50_like(qdq=True), str(model))
    base, cand = (FIXTURES / f"{s}.layers.json" for s in ("resnet50.implicit", "resnet50_ortfb.explicit"))
    code, out, _ = cli("compare", "--engines", base, cand, "--onnx", model, "--json")
    assert code == 0
    regions = json.loads(out)["diffs"][0]["regions"]
    residual = [r for r in regions if any(e["rule"] == "residual-add" for e in r["explanations"])]
    assert len(residual) == 16
    for r in residual:
        lint = [e for e in r["explanations"] if e["rule"] == "residual-add"]
        assert len(lint) == 1 and any(n.endswith("/Add") and n in lint[0]["why"] for n in r["nodes"])
    code, _, err = cli("compare", "--engines", base, cand, "--onnx", tmp_path / "missing.onnx")
    assert code == 2 and "no such file" in err


def test_each_engine_stats_are_computed_once_for_every_diff_and_renderer(monkeypatch):
    import edgeq.report.compare_engine as compare_engine
    from edgeq.report.compare_html import render_compare_html

    calls: list[str] = []
    real = compare_engine.engine_stats

    def counted(report):
        calls.append(report.source)
        return real(report)

    monkeypatch.setattr(compare_engine, "engine_stats", counted)
    stems = ("yolo_edgeq.implicit", "yolo_edgeq.explicit", "yolo_fix2.explicit")
    c = compare_engines([engine_from_path(EDGEQ / f"{s}.layers.json") for s in stems])
    c.to_dict()
    render_compare_html(c, [relative_gate(d) for d in c.diffs])
    assert len(calls) == len(set(calls)) == 3  # baseline once, not once per diff and page
    assert c.diffs[0].base_stats is c.diffs[1].base_stats is c.baseline.stats


def test_report_refuses_another_models_engine_by_compares_rule(tmp_path, cli):
    """Issue 43.7: ``report L.json --onnx other.onnx`` noted "121 of 121 ... (a different model?)" and went
    on to gate (exit 1), while ``compare`` refused the same mismatch (exit 2). One rule: most of the
    engine's compute nodes missing from the model is refused, exit 2, in the same words. The engine's own
    model, float (no Q/DQ names) or Q/DQ, is no mismatch."""
    import onnx
    from test_report import resnet50_like

    from edgeq import zoo

    other = tmp_path / "other.onnx"
    onnx.save(zoo.resnet_like(size=32, width=8), str(other))
    implicit = FIXTURES / "resnet50.implicit.layers.json"
    explicit = FIXTURES / "resnet50_ortfb.explicit.layers.json"
    for argv in (("report", explicit, "--onnx", other),
                 ("compare", "--engines", implicit, explicit, "--onnx", other)):  # fmt: skip
        code, out, err = cli(*argv)
        (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert code == 2 and out == "" and "Traceback" not in err, (argv[0], out, err)
        assert "ONNX node names in the engine are not in other.onnx (a different model?)" in line, line
    for qdq in (False, True):
        own = tmp_path / f"resnet50.{qdq}.onnx"
        onnx.save(resnet50_like(qdq=qdq), str(own))
        code, out, err = cli("report", explicit, "--onnx", own)
        assert code == 1 and "a different model" not in out + err, (qdq, err)  # the gate decides, as before


def test_regions_keep_node_names_whole_and_name_the_rule_for_the_placed_resnet50(cli, monkeypatch):
    """Issue 43.10: the region column split node names mid-name even at COLUMNS=200, and the rule column
    was empty on every row of the recorded ResNet-50 placed engine against its implicit one: the implicit
    engine ran those layers FP16, TensorRT's timed choice, where the placed Q/DQ force a slower INT8
    (the mirror's ``mirror-float`` keeps them float). At 80 columns the rule goes under the name."""
    base, cand = (FIXTURES / f"{s}.layers.json" for s in ("resnet50.implicit", "resnet50_placed.explicit"))
    code, out, _ = cli("compare", "--engines", base, cand, "--json", "--top", "100")
    regions = json.loads(out)["diffs"][0]["regions"]
    slower = [r for r in regions if "precision" in r["differences"] and r["delta_ms"] > 0]
    faster = [r for r in regions if "precision" in r["differences"] and r["delta_ms"] < 0]
    assert code == 0 and len(slower) >= 40 and faster  # 54 FP16 layers implicit; INT8 won in a few
    assert all([e["rule"] for e in r["explanations"]] == ["mirror-float"] for r in slower), slower
    assert all("ran it FP16, TensorRT's timed choice" in r["explanations"][0]["why"] for r in slower)
    assert not any(r["explanations"] for r in faster)  # INT8 paid off there: nothing to explain
    for columns in (200, 80):
        monkeypatch.setenv("COLUMNS", str(columns))
        code, out, _ = cli("compare", "--engines", base, cand)
        table = out.split("region (ONNX nodes)", 1)[1]
        assert code == 0 and max(len(line) for line in out.splitlines()) <= columns
        assert "/layer3/layer3.0/downsample/downsample.0/Conv" in table, table  # whole, on one line
        assert table.count("mirror-float") == 10, table  # --top 10: every row says its rule


def test_a_closed_pipe_ends_compare_quietly_with_its_own_exit_code(tmp_path):
    """Issue 43.10: ``compare ... | head -1`` exited 1, as if a check had failed. A reader that goes away
    ends the output quietly; the exit code stays the command's: 0, or 1 when its gate fails."""
    import subprocess
    import sys

    base = str(FIXTURES / "resnet50.implicit.layers.json")
    cand = str(FIXTURES / "resnet50_ortfb.explicit.layers.json")
    for gate, expected in (((), 0), (("--gate", "relative"), 1)):  # ortfb is 0.73x: the gate fails
        for json_out in ((), ("--json",)):
            read, write = os.pipe()
            os.close(read)  # the reader is gone before the first line: every write meets a closed pipe
            proc = subprocess.run([sys.executable, "-c", "from edgeq.cli import main; main()", "compare",
                                   "--engines", base, cand, *gate, *json_out], stdout=write,
                                  stderr=subprocess.PIPE, text=True, timeout=120,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
            os.close(write)
            assert (proc.returncode, proc.stderr) == (expected, ""), (gate, json_out, proc.stderr)


def test_compare_help_names_the_ratio_r_and_every_help_says_130(cli, monkeypatch):
    """Issue 43.10: compare --help showed MIN_RATIO where other commands write R; the top-level and
    compare help left out exit code 130 (Ctrl-C), as did every help but fleet validate's and release
    install's: each help that lists exit codes lists 130."""
    from test_cli_help import COMMANDS

    monkeypatch.setenv("COLUMNS", "100")
    for path, _ in COMMANDS:
        code, out, _ = cli(*path, "--help")
        text = " ".join(out.split())
        assert code == 0 and ("Exit codes" not in text or "130" in text), (path, out)
    for argv in (("--help",), ("compare", "--help")):
        code, out, _ = cli(*argv)
        assert code == 0 and "130 Ctrl-C" in " ".join(out.split()), out
    code, out, _ = cli("compare", "--help")
    assert "MIN_RATIO" not in out and re.search(r"--min-ratio\s+R\s", out), out
