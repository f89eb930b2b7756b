"""What every command prints with: the two consoles, exit codes, JSON, findings, verdicts, progress.

stdout carries results (tables, ``--json``); stderr carries progress, notes and the one-line errors.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Optional

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from edgeq.findings import Finding, Level, ProgressFn

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2

EXIT_CODES_HELP = "Exit codes: 0 ok; 1 a check, a gate or the target failed; 2 a usage or input error."

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

_LEVEL_STYLE = {Level.ERROR: "bold red", Level.WARNING: "yellow", Level.INFO: "cyan"}
_PRECISION_STYLE = {"INT8": "green", "FP16": "yellow", "BF16": "yellow", "FP32": "red", "INT32": "magenta"}


def code_for(ok: Any) -> int:
    """0 when ``ok`` (a verdict, a result that tests as a boolean), else 1: a check failed."""
    return EXIT_OK if ok else EXIT_CHECK_FAILED


def print_json(obj: Any) -> None:
    """JSON to stdout, unwrapped, so it pipes into jq."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def visible(text: str) -> str:
    """Engine names carry raw control characters; never send them to a terminal."""
    return escape(re.sub(r"[\x00-\x1f\x7f-\x9f]", lambda m: f"\\x{ord(m.group()):02x}", text))


def print_verdict(gate: Any) -> None:
    """A gate's verdict line (green or red), then the violations it lists."""
    lines = str(gate).splitlines()
    out.print(f"[{'green' if gate else 'bold red'}]{visible(lines[0])}[/]")
    for line in lines[1:]:
        out.print(visible(line))


def precision_cell(p: Optional[str]) -> str:
    return f"[{_PRECISION_STYLE.get(p or '', 'dim')}]{p or '?'}[/]"


def render_findings(findings: Sequence[Finding], title: str = "Findings", max_per_rule: int = 5) -> None:
    """One row per finding, at most ``max_per_rule`` per rule (a model with 60 SiLUs gives 60 alike
    rows); each rule's source once, below the table, so rows stay short."""
    if not findings:
        out.print("[green]no findings[/]")
        return
    t = Table(title=title, show_lines=True, expand=False)
    t.add_column("level")
    t.add_column("rule", no_wrap=True)
    t.add_column("nodes", overflow="fold", max_width=48)
    t.add_column("problem / fix", overflow="fold", min_width=30)
    sources: dict[str, str] = {}
    per_rule: dict[str, int] = {}
    for f in findings:
        per_rule[f.rule] = per_rule.get(f.rule, 0) + 1
        if per_rule[f.rule] > max_per_rule > 0:
            continue
        shown = [escape(n) for n in f.nodes[:3]]
        nodes = "\n".join(shown) + (f"\n[dim](+{len(f.nodes) - 3} more)[/]" if len(f.nodes) > 3 else "")
        t.add_row(
            f"[{_LEVEL_STYLE[f.level]}]{f.level.value}[/]",
            f.rule,
            nodes,
            f"{escape(f.message)}\n[dim]fix:[/] {escape(f.fix)}",
        )
        sources.setdefault(f.rule, f.source)
    out.print(t)
    hidden = {r: n - max_per_rule for r, n in per_rule.items() if n > max_per_rule > 0}
    if hidden:
        more = ", ".join(f"{n} {r}" for r, n in hidden.items())
        out.print(f"[dim]not shown: {more} (--json lists every finding)[/]")
    out.print("[dim]sources:[/]")
    for rule, source in sources.items():
        out.print(f"  [dim]{rule}: {escape(source)}[/]")


@contextmanager
def progress_display(enabled: bool = True) -> Iterator[ProgressFn]:
    """A rich progress display fed by the library's ``ProgressFn`` callbacks (on stderr)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not enabled or not err.is_terminal:
        last: dict[str, int] = {}

        def quiet(task: str, done: int, total: Optional[int]) -> None:
            # Non-interactive: one log line when a task starts and when it ends.
            before = last.get(task)
            if before is None or done < before:  # a task starting (again)
                err.print(f"[dim]{escape(task)}...[/]")
                before = -1
            last[task] = done
            if total is not None and done >= total > before:
                err.print(f"[dim]{escape(task)}: done ({done}/{total})[/]")

        yield quiet
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err,
        transient=True,
    ) as p:
        tasks: dict[str, Any] = {}

        def update(task: str, done: int, total: Optional[int]) -> None:
            if task not in tasks:
                tasks[task] = p.add_task(task, total=total)
            p.update(tasks[task], completed=done, total=total)

        yield update
