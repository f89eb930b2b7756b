"""The shipped rules (edgeq/docs/trt86-rules.md): every citation in code and output resolves to a section
of it, every rule id has one, and the measured evidence it names exists in the fixtures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import edgeq
from edgeq.docs import RULES_DOC, cite, cited_sections, sections

PACKAGE = Path(edgeq.__file__).parent
FIXTURES = Path(__file__).parent / "fixtures"


def _sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}


def test_the_rules_file_ships_in_the_package() -> None:
    from importlib.resources import files

    assert files("edgeq.docs").joinpath("trt86-rules.md").is_file()
    assert {"parsing", "what-fuses", "reading-an-engine", "gate"} <= set(sections())


def test_every_citation_in_the_package_resolves() -> None:
    known = set(sections())
    cited = 0
    for name, text in _sources().items():
        for sid in cited_sections(text):
            assert sid in known, f"{name} cites {RULES_DOC}#{sid}, which does not exist"
            cited += 1
        # every mention of the rules file is a citation of a section of the shipped file
        for m in re.finditer(r"(\S*)trt86-rules\.md", text):
            assert name == "docs/__init__.py" or m.group(1).endswith("edgeq/docs/"), (name, m.group(0))
        assert not re.search(r"\bissue \d", text, re.I), f"{name} cites an issue number"
    assert cited >= 20


def test_every_rule_id_has_a_section() -> None:
    from edgeq.graph.rules import RULES as LINT
    from edgeq.quant.rules import RULES as PLACEMENT
    from edgeq.report.compare_gate import RELATIVE_RULES
    from edgeq.report.layerkinds import KIND_RULES
    from edgeq.report.policy import RULES as GATE

    ids = [r.id for r in LINT] + list(PLACEMENT) + list(GATE) + [r.rule for r in KIND_RULES]
    ids += list(RELATIVE_RULES)  # the relative gate's failures name these ids
    missing = [i for i in ids if i not in sections()]
    assert not missing


def test_findings_cite_their_own_section() -> None:
    from edgeq import zoo
    from edgeq.graph.clean import clean_model
    from edgeq.graph.rules import lint_model

    m = zoo.build("resnet", "torch-qint8")
    found = lint_model(m) + clean_model(m).findings
    assert found
    for f in found:
        assert cited_sections(f.source), (f.rule, f.source)
        assert all(s in sections() for s in cited_sections(f.source))
    assert any(f.source == cite("qdq-torch-qint8") for f in found)


def test_measured_evidence_names_fixture_files_that_exist() -> None:
    text = (PACKAGE / "docs" / "trt86-rules.md").read_text(encoding="utf-8")
    names = set(re.findall(r"`((?:trt86-h[12]00[\w-]*/)?[\w*-]+(?:\.[\w*]+)*\.(?:json|log|gz|\*))`", text))
    assert len(names) > 15
    for name in names:
        pattern = name if "/" in name else f"*/{name}"
        assert list(FIXTURES.glob(pattern)), f"{name} is cited as evidence but not in tests/fixtures"


def test_every_pattern_has_a_section_and_older_ids_find_it(cli) -> None:
    """One id per fact: each registry entry has its section; an id from before the registry (in a user's
    notes or scripts) prints the section of the fact it named."""
    from edgeq.docs import older_ids, section
    from edgeq.graph import registry

    for p in registry.REGISTRY:
        assert p.id in sections(), p.id
        for old in p.aliases:
            assert older_ids().get(old) == p.id, (old, p.id)
            assert section(old) == sections()[p.id]
    code, out, _ = cli("rules", "fuse-silu-residual")
    assert code == 0 and out.startswith("## silu-residual")


@pytest.mark.parametrize("rule_id", ["qdq-torch-qint8", "gate"])
def test_cli_rules_prints_a_section(rule_id: str, cli) -> None:
    code, out, _ = cli("rules", rule_id)
    assert code == 0 and out.startswith(f"## {rule_id}")
    assert out.split() == sections()[rule_id].split()  # every word, rewrapped to the width (issue 43.10)


def test_cli_rules_lists_ids_and_refuses_unknown(cli) -> None:
    code, out, _ = cli("rules")
    assert code == 0 and "qdq-float16" in out
    code, _, err = cli("rules", "no-such-rule")
    assert code == 2 and "edgeq rules" in err


@pytest.mark.parametrize("command", ["clean", "lint", "quantize", "report", "deploy", "rules"])
def test_help_cites_only_what_ships(command: str, cli) -> None:
    code, out, _ = cli(command, "--help")
    assert code == 0
    text = " ".join(out.split())
    assert all(s in sections() for s in cited_sections(text))
    assert not re.search(r"(?<!edgeq/)docs/trt86-rules", text) and not re.search(r"\bissue \d", text, re.I)


@pytest.mark.parametrize("rule_id", ["gate", "parsing", "myelin-region"])
def test_cli_rules_wraps_a_section_to_the_terminal_width(rule_id: str, cli, monkeypatch) -> None:
    """Issue 43.10: ``edgeq rules gate`` printed the file's lines, up to 104 columns, at COLUMNS=80. Each
    paragraph and list item is rewrapped at words to the width; every word is there, a list item keeps
    its dash and indents its continuation."""
    text = sections()[rule_id]
    items = [ln for ln in text.splitlines() if ln.startswith("- ")]
    for columns in (80, 60):
        monkeypatch.setenv("COLUMNS", str(columns))
        code, out, _ = cli("rules", rule_id)
        lines = out.splitlines()
        assert code == 0 and max(len(ln) for ln in lines) <= columns, out
        assert out.split() == text.split()
        assert len([ln for ln in lines if ln.startswith("- ")]) == len(items)
