"""``edgeq rules`` (``edgeq/docs/trt86-rules.md``): the TensorRT 8.6 rules, each with its evidence; the
place for the rule text that findings, gates and ``--help`` point at."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from edgeq.cli.app import app
from edgeq.cli.output import EXIT_OK, out, print_table, print_wrapped
from edgeq.errors import EdgeqError


@app.command("rules", short_help="The TensorRT 8.6 rules edgeq applies, each with its evidence.")
def rules_cmd(
    rule_id: Optional[str] = typer.Argument(None, metavar="[ID]", help="A rule id, e.g. qdq-uint8."),
) -> int:
    """Show the TensorRT 8.6 rules edgeq applies, with the evidence each rests on.

    Without ID: every section id and its title (lint's rule ids for --rule, placement's, the gate's).
    With ID: that section of edgeq/docs/trt86-rules.md, the file findings, gate reports and --help cite.
    """
    from edgeq.docs import RULES_DOC, section, sections

    found = sections()
    if rule_id is None:
        used = _used_by()
        t = Table(title=RULES_DOC, expand=False)
        t.add_column("id", style="bold", no_wrap=True)
        t.add_column("used by", style="dim")
        t.add_column("title", overflow="fold")
        for sid, text in found.items():
            title = text.splitlines()[0][3:].split(" — ", 1)
            t.add_row(escape(sid), ", ".join(used.get(sid, [])), escape(title[1] if len(title) > 1 else ""))
        print_table(t, drop=("used by",))
        return EXIT_OK
    shown = section(rule_id)
    if shown is None:
        raise EdgeqError(f"no rule '{rule_id}' in {RULES_DOC}", hint="`edgeq rules` lists the ids")
    for block, indent in _blocks(shown):
        if block:
            print_wrapped(escape(block), indent=indent)
        else:
            out.print()
    return EXIT_OK


def _blocks(markdown: str) -> list[tuple[str, int]]:
    """A section's markdown as the units it wraps in: a paragraph or a list item joined into one line
    (with its continuation indent), a heading whole, an empty string between paragraphs. The file is
    wrapped for an editor (about 105 columns); the terminal's width is what the reader has."""
    out: list[tuple[str, int]] = []
    for para in markdown.strip("\n").split("\n\n"):
        if out:
            out.append(("", 0))
        items: list[list[str]] = []
        for line in para.splitlines():
            starts_item = line.lstrip().startswith(("- ", "* ")) and not line.startswith(" ")
            if line.startswith("#") or starts_item or not items:
                items.append([line.strip()])
            else:
                items[-1].append(line.strip())
        out += [(" ".join(words), 2 if words[0].startswith(("- ", "* ")) else 0) for words in items]
    return out


def _used_by() -> dict[str, list[str]]:
    """Rule id -> what applies it: lint (with the finding's level, for --rule), placement, the gate and
    the report's layer kinds."""
    from edgeq.graph.rules import RULES as LINT
    from edgeq.quant.rules import RULES as PLACEMENT
    from edgeq.report.layerkinds import KIND_RULES
    from edgeq.report.policy import RULES as GATE

    used: dict[str, list[str]] = {}
    for r in LINT:
        used.setdefault(r.id, []).append(f"lint ({r.level.value})")
    for rid in PLACEMENT:
        used.setdefault(rid, []).append("placement")
    for rid in GATE:
        used.setdefault(rid, []).append("gate")
    for k in KIND_RULES:
        used.setdefault(k.rule, []).append("report")
    return used
