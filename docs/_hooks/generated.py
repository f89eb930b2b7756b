"""Pages the docs build generates, so they cannot go stale (an mkdocs hook, mkdocs.yml ``hooks``).

- ``reference/cli.md``: every command's own ``--help``, run in this process through ``edgeq.cli.app.run``
  at a fixed width, in the order ``edgeq --help`` lists them.
- ``reference/rules.md``: the rules file the package ships (``edgeq/docs/trt86-rules.md``, what
  ``edgeq rules ID`` prints), each section anchored by its rule id (``rules.md#qdq-uint8``).

A page asks for one with a marker line; the test suite imports this module to check both.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from typing import Any

CLI_MARKER = "<!-- generated: cli-reference -->"
RULES_MARKER = "<!-- generated: rules -->"
WIDTH = 100  # columns of the --help text, as a terminal 100 wide shows it


def command_paths() -> list[list[str]]:
    """Every command a user can type, as argv words (``["targets", "check"]``), groups before their
    commands, in ``--help``'s order; hidden commands left out."""
    import typer

    from edgeq.cli.app import _use_edgeq_help, app

    _use_edgeq_help(app)
    root = typer.main.get_command(app)
    out: list[list[str]] = []

    def walk(cmd: Any, path: list[str]) -> None:
        for name, sub in getattr(cmd, "commands", {}).items():
            if getattr(sub, "hidden", False):
                continue
            out.append([*path, name])
            walk(sub, [*path, name])

    walk(root, [])
    return out


def help_text(words: list[str]) -> str:
    """What ``edgeq WORDS --help`` prints at WIDTH columns, trailing blanks stripped."""
    from edgeq.cli.app import run

    buf = io.StringIO()
    old = {k: os.environ.get(k) for k in ("COLUMNS", "NO_COLOR", "TERM")}
    os.environ.update(COLUMNS=str(WIDTH), NO_COLOR="1", TERM="dumb")
    try:
        with contextlib.redirect_stdout(buf):
            code = run([*words, "--help"])
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if code != 0:
        raise RuntimeError(f"edgeq {' '.join(words)} --help exited {code}")
    lines = [ln.rstrip() for ln in buf.getvalue().splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    return "\n".join(lines).rstrip() + "\n"


def cli_reference() -> str:
    """The CLI reference's body: ``edgeq --help``, then one section per command."""
    parts = ["## edgeq\n", "```text\n" + help_text([]) + "```\n"]
    for words in command_paths():
        name = " ".join(words)
        anchor = "-".join(words)
        parts.append(f"## edgeq {name} {{#{anchor}}}\n")
        parts.append("```text\n" + help_text(words) + "```\n")
    return "\n".join(parts)


def rules_reference() -> str:
    """The shipped rules file with an ``{#id}`` anchor on each section heading and its own title dropped
    (the page has one)."""
    from importlib.resources import files

    text = files("edgeq.docs").joinpath("trt86-rules.md").read_text(encoding="utf-8")
    text = re.sub(r"\A# [^\n]*\n", "", text)

    def anchor(m: re.Match[str]) -> str:
        sid = m.group(1).strip("`")
        return f"## {m.group(1)}{m.group(2)} {{#{sid}}}"

    return re.sub(r"(?m)^## (\S+)(.*)$", anchor, text)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if RULES_MARKER in markdown:
        markdown = markdown.replace(RULES_MARKER, rules_reference())
    return markdown
