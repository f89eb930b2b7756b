"""What every command prints with: the two consoles, exit codes, JSON, findings, verdicts, progress.

stdout carries results (tables, ``--json``); stderr carries progress, notes and the one-line errors.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Optional

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from edgeq.findings import Finding, Level, ProgressFn

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it

EXIT_CODES_HELP = ("Exit codes: 0 ok; 1 a check, a gate or the target failed; 2 a usage or input error; "
                   "130 Ctrl-C.")


def reader_gone(stream: Any) -> None:
    """The reader of ``stream`` closed it (``edgeq compare ... | head -1``): what is left to print goes
    to /dev/null, quietly, and the command ends with the exit code its result gives. A closed pipe is no
    failed check (rich's own handling exits 1), and no "Exception ignored" when Python flushes at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test's capture): none to move
        pass


class _Console(Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True
        reader_gone(self.file)


out = _Console(highlight=False, soft_wrap=True)
err = _Console(stderr=True, highlight=False, soft_wrap=True)

_LEVEL_STYLE = {Level.ERROR: "bold red", Level.WARNING: "yellow", Level.INFO: "cyan"}
_PRECISION_STYLE = {"INT8": "green", "FP16": "yellow", "BF16": "yellow", "FP32": "red", "INT32": "magenta"}


def width_of(console: Console) -> int:
    """The width output must fit: the terminal's, or when piped $COLUMNS, else 80 (never the width of
    whatever terminal happens to sit on stdin)."""
    if console.is_terminal:
        return console.width
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else 80


def fit_table(table: Table, width: int, console: Optional[Console] = None, drop: Sequence[str] = (),
              one_line: bool = False) -> Table:
    """Make ``table`` (in place, and returned) fit ``width`` columns without splitting a word or a number.

    Columns named in ``drop`` (least important first) are removed while the table cannot fit with every
    word whole; if it still cannot, the widest text column is abbreviated (ellipsis). The widths left are
    set per column so that each gets at least its longest word (rich alone would fold "engine" into
    "engin/e" before it shrinks the widest column enough). ``one_line``: drop columns until every row fits
    on one line (a matrix of short cells, where a row a target reads best)."""
    console = console or out
    options = console.options.update_width(width)
    drops = list(drop)
    # rich's own column measures (Table._measure_column, _extra_width, _get_padding_width; rich is pinned
    # in constraints.txt): the widths rich itself would lay out, so the fit is exact

    def measure() -> list[Measurement]:
        ranges = [table._measure_column(console, options, c) for c in table.columns]
        # a no_wrap column (numbers, verdicts) needs its widest cell whole: its minimum is its maximum
        return [Measurement(r.maximum, r.maximum) if c.no_wrap else r for r, c in zip(ranges, table.columns)]

    while True:
        ranges = measure()
        avail = width - table._extra_width
        if sum(r.maximum if one_line else r.minimum for r in ranges) <= avail:
            break
        present = {str(c.header): c for c in table.columns}
        name = next((d for d in drops if d in present), None)
        if name is None or len(table.columns) <= 1:
            break
        drops.remove(name)
        table.columns.remove(present[name])
        for i, c in enumerate(table.columns):
            c._index = i
    for _ in range(len(table.columns)):  # abbreviate: the widest column that holds words, not numbers
        ranges = measure()
        excess = sum(r.minimum for r in ranges) - (width - table._extra_width)
        if excess <= 0:
            break
        textual = [(r.minimum, i) for i, (r, c) in enumerate(zip(ranges, table.columns))
                   if not c.no_wrap and r.minimum > 8]  # fmt: skip
        if not textual:
            break
        widest, i = max(textual)
        col = table.columns[i]
        col.max_width = max(8, widest - excess - table._get_padding_width(i))
        if col.overflow != "fold":  # names a user copies stay whole, folded; prose is abbreviated
            col.overflow = "ellipsis"
    ranges = measure()
    avail = width - table._extra_width
    mins, maxs = [r.minimum for r in ranges], [r.maximum for r in ranges]
    if sum(maxs) <= avail or sum(mins) > avail:
        return table
    spare = avail - sum(mins)
    need = [b - a for a, b in zip(mins, maxs)]
    total = sum(need) or 1
    widths = [a + (spare * n) // total for a, n in zip(mins, need)]
    left = avail - sum(widths)
    for i in sorted(range(len(widths)), key=lambda j: need[j] - (widths[j] - mins[j]), reverse=True):
        if left <= 0:
            break
        if widths[i] < maxs[i]:
            widths[i] += 1
            left -= 1
    for i, (c, w) in enumerate(zip(table.columns, widths)):
        c.width = max(1, w - table._get_padding_width(i))
    return table


def print_table(table: Table, drop: Sequence[str] = (), console: Optional[Console] = None,
                one_line: bool = False) -> None:
    """Print ``table`` fitted to the terminal (or, piped, $COLUMNS or 80): every command's tables."""
    console = console or out
    width = width_of(console)
    console.print(fit_table(table, width, console, drop, one_line), width=width, soft_wrap=False)


def print_wrapped(text: str, indent: int = 2, console: Optional[Console] = None) -> None:
    """A long line of prose (markup allowed) wrapped at words to the output width, continuation lines
    indented by ``indent``: piped output stays readable at 80 columns too."""
    from rich.text import Text

    console = console or out
    width = width_of(console)
    rich = Text.from_markup(text)
    for i, line in enumerate(rich.divide(_breaks(rich.plain, max(20, width - indent)))):
        line.rstrip()
        console.print(Text(" " * indent) + line if i else line, soft_wrap=True)


def _breaks(plain: str, width: int) -> list[int]:
    """Where to break ``plain`` into lines of at most ``width`` cells, at spaces only: a word longer than
    the line (a path, a layer name) stays whole on a line of its own, never folded (else it
    could not be copied)."""
    from rich.cells import cell_len

    breaks: list[int] = []
    start = used = 0
    for m in re.finditer(r"\S+\s*", plain):
        word = cell_len(m.group().rstrip())
        if used and used + word > width:
            breaks.append(m.start())
            start, used = m.start(), 0
        used = m.end() - start if used else cell_len(m.group())
    return breaks


def code_for(ok: Any) -> int:
    """0 when ``ok`` (a verdict, a result that tests as a boolean), else 1: a check failed."""
    return EXIT_OK if ok else EXIT_CHECK_FAILED


def print_json(obj: Any) -> None:
    """JSON to stdout, unwrapped, so it pipes into jq (``| head`` too: ``reader_gone``)."""
    try:
        sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        reader_gone(sys.stdout)


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
    rows); each rule's source once, below the table, so rows stay short. Nothing when there are none:
    the caller's summary line says so, once. Where a nodes column does not fit (80 columns, piped), each
    finding names its nodes above its message instead: an error always says where it is."""
    if not findings:
        return
    shown: list[Finding] = []
    sources: dict[str, str] = {}
    per_rule: dict[str, int] = {}
    for f in findings:
        per_rule[f.rule] = per_rule.get(f.rule, 0) + 1
        if per_rule[f.rule] > max_per_rule > 0:
            continue
        shown.append(f)
        sources.setdefault(f.rule, f.source)
    width = width_of(out)
    t = fit_table(_findings_table(shown, title, nodes_column=True), width, out, drop=("nodes",))
    if "nodes" not in {str(c.header) for c in t.columns}:
        t = fit_table(_findings_table(shown, title, nodes_column=False), width, out)
    out.print(t, width=width, soft_wrap=False)
    hidden = {r: n - max_per_rule for r, n in per_rule.items() if n > max_per_rule > 0}
    if hidden:
        more = ", ".join(f"{n} {r}" for r, n in hidden.items())
        out.print(f"[dim]not shown: {more} (--json lists every finding)[/]")
    out.print("[dim]sources:[/]")
    for rule, source in sources.items():
        out.print(f"  [dim]{rule}: {escape(source)}[/]")


def _findings_table(findings: Sequence[Finding], title: str, nodes_column: bool) -> Table:
    t = Table(title=title, show_lines=True, expand=False)
    t.add_column("level", no_wrap=True)
    t.add_column("rule", no_wrap=True)
    if nodes_column:
        t.add_column("nodes", overflow="fold", max_width=48)
    t.add_column("problem / fix", overflow="fold", min_width=30)
    for f in findings:
        tag = " (input)" if f.names == "inputs" and nodes_column else ""
        names = [escape(n) + tag for n in f.nodes[:3]]
        more = f"[dim](+{len(f.nodes) - 3} more)[/]" if len(f.nodes) > 3 else ""
        problem = f"{escape(f.message)}\n[dim]fix:[/] {escape(f.fix)}"
        level = f"[{_LEVEL_STYLE[f.level]}]{f.level.value}[/]"
        if nodes_column:
            t.add_row(level, f.rule, "\n".join([*names, more] if more else names), problem)
        else:
            where = f"[dim]{f.names}:[/] {', '.join(names)}{' ' + more if more else ''}\n" if names else ""
            t.add_row(level, f.rule, where + problem)
    return t


@contextmanager
def progress_display(enabled: bool = True) -> Iterator[ProgressFn]:
    """A rich progress display fed by the library's ``ProgressFn`` callbacks (on stderr).

    In a terminal: one bar for the stage running now; a finished stage's bar goes away. Piped: one line
    per stage when it finishes ("clean: done (0.3 s)"), once, however often the stage runs again."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not enabled or not err.is_terminal:
        started: dict[str, float] = {}
        last: dict[str, int] = {}
        reported: set[str] = set()

        def quiet(task: str, done: int, total: Optional[int]) -> None:
            before = last.get(task)
            if before is None or done < before:  # a task starting (again)
                started[task] = time.monotonic()
                before = -1
            last[task] = done
            if total is not None and done >= total > before and task not in reported:
                reported.add(task)
                seconds = time.monotonic() - started.get(task, time.monotonic())
                err.print(f"[dim]{escape(task)}: done ({seconds:.1f} s)[/]", highlight=False)

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
            if total is not None and done >= total:  # finished: its bar goes, none stays stacked
                p.remove_task(tasks.pop(task))

        yield update
