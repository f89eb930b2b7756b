"""The documentation: README as a front door, the MkDocs site's generated pages (CLI reference from the
commands' own --help, the rules page from the shipped rules file), and nothing cited that a user cannot
open. ``tests/run.sh`` builds the site with ``mkdocs build --strict`` (links, anchors, nav) before pytest."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generated", DOCS / "_hooks" / "generated.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    heads = re.findall(r"(?m)^## (.+)$", text)
    assert heads[:3] == ["Set up (fresh machine, Python ≥ 3.9)", "Quick start", "Commands"]
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "```console\n" in quick
    # one line per command: every command edgeq has is named in the Commands list
    from edgeq.cli.app import app

    commands = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    for name in [c.name for c in app.registered_commands] + [g.name for g in app.registered_groups]:
        assert f"`edgeq {name}" in commands, name
    # every link into the docs points at a page that exists
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), link


def test_the_quick_start_page_includes_the_readmes_block_itself():
    page = (DOCS / "quickstart.md").read_text(encoding="utf-8")
    assert '--8<-- "README.md:quickstart"' in page
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("[start:quickstart]", 1)[1].split("[end:quickstart]", 1)[0]
    assert "```console\n" in section and "edgeq deploy" in section


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [p for item in nav for p in pages(item)]
        if isinstance(nav, dict):
            return [p for v in nav.values() for p in pages(v)]
        return []

    in_nav = set(pages(config["nav"]))
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "_hooks" not in p.parts}
    assert in_nav == on_disk


def test_the_cli_reference_is_every_commands_own_help():
    gen = hook()
    paths = gen.command_paths()
    from edgeq.cli.app import app

    groups = {g.name: g.typer_instance for g in app.registered_groups if g.typer_instance is not None}
    expected = [[c.name] for c in app.registered_commands if not c.hidden]
    expected += [[g, c.name] for g, inst in groups.items() for c in inst.registered_commands if not c.hidden]
    assert {tuple(p) for p in expected} <= {tuple(p) for p in paths}
    text = gen.cli_reference()
    for words in paths:
        assert f"Usage: edgeq {' '.join(words)} " in text, words
    # the text is what the command prints, not a copy: an option's help line shows up verbatim
    assert gen.help_text(["deploy"]) in text and "--accept-new-host-key" in gen.help_text(["deploy"])
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert gen.CLI_MARKER in page and "Usage:" not in page  # generated at build time, never committed


def test_the_rules_page_is_the_shipped_rules_file_anchored_by_id():
    from edgeq.docs import sections

    text = hook().rules_reference()
    for sid, body in sections().items():
        assert re.search(rf"(?m)^## .*\{{#{re.escape(sid)}\}}$", text), sid
        assert body.splitlines()[1:] and body.splitlines()[-1] in text


def test_the_docs_cite_no_file_a_user_cannot_open():
    texts = {p: p.read_text(encoding="utf-8") for p in [*DOCS.rglob("*.md"), ROOT / "README.md"]}
    for path, text in texts.items():
        assert "../shared" not in text and "/work/" not in text, path
        # a source file named in backticks exists in the repository (targets/ and pipelines/ also name
        # files the user writes: targets/orin.yaml)
        for ref in re.findall(r"`((?:edgeq|bench|tests|docs)/[\w./-]+\.(?:py|md|yaml|png|json|csv))`",
                              text):  # fmt: skip
            assert (ROOT / ref).exists(), f"{path.name}: {ref}"
