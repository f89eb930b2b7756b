"""The edgeq command line: parse arguments, call one library function, render, map to an exit code.

This is the only module that imports typer and rich. Library code raises ``EdgeqError`` for user
problems; they are caught once, in ``run``, and printed as one line (exit 2 unless the error says
otherwise). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from edgeq import __version__
from edgeq.errors import EdgeqError
from edgeq.findings import Finding, Level, ProgressFn

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2

EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 a check failed (lint findings at error level, verification beyond tolerance, "
    "a precision gate violated, a target-side failure); 2 usage or input error (bad file, bad option)."
)

app = typer.Typer(
    name="edgeq",
    help="ONNX -> INT8 TensorRT 8.6 engines for Jetson and desktop GPUs, with Q/DQ placed so TensorRT "
    "fuses, and a report proving what the engine runs.\n\n" + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        out.print(f"edgeq {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More log output (-vv for debug)."),
) -> None:
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


# --------------------------------------------------------------------------------------------------
# Shared rendering
# --------------------------------------------------------------------------------------------------

_LEVEL_STYLE = {Level.ERROR: "bold red", Level.WARNING: "yellow", Level.INFO: "cyan"}


def render_findings(findings: Sequence[Finding], title: str = "Findings") -> None:
    if not findings:
        out.print("[green]no findings[/]")
        return
    t = Table(title=title, show_lines=False, expand=False)
    t.add_column("level")
    t.add_column("rule")
    t.add_column("nodes", overflow="fold", max_width=40)
    t.add_column("problem / fix", overflow="fold")
    t.add_column("source", overflow="fold", max_width=36, style="dim")
    for f in findings:
        nodes = ", ".join(f.nodes[:4]) + (f" (+{len(f.nodes) - 4})" if len(f.nodes) > 4 else "")
        t.add_row(
            f"[{_LEVEL_STYLE[f.level]}]{f.level.value}[/]",
            f.rule,
            nodes,
            f"{f.message}\n[dim]fix:[/] {f.fix}",
            f.source,
        )
    out.print(t)


def print_json(obj: Any) -> None:
    """JSON to stdout, unwrapped, so it pipes into jq."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


@contextmanager
def progress_display(enabled: bool = True) -> Iterator[ProgressFn]:
    """A rich progress display fed by the library's ``ProgressFn`` callbacks (on stderr)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not enabled or not err.is_terminal:
        last: dict[str, int] = {}

        def quiet(task: str, done: int, total: Optional[int]) -> None:
            # Non-interactive: one log line when a task starts and when it ends.
            if task not in last:
                err.print(f"[dim]{task}...[/]")
            last[task] = done
            if total is not None and done >= total:
                err.print(f"[dim]{task}: done ({done}/{total})[/]")

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


def _existing_file(path: Path) -> Path:
    """Typer's own exists-checks print a boxed usage error; keep the one-line style instead."""
    return path


# --------------------------------------------------------------------------------------------------
# edgeq clean  (edgeq.graph)
# --------------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------------
# edgeq lint  (edgeq.graph)
# --------------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------------
# edgeq quantize  (edgeq.quant)
# --------------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------------
# edgeq report  (edgeq.report)
# --------------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------------
# edgeq deploy / targets  (edgeq.remote)
# --------------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------------
# edgeq demo
# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------------


def run(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI and return its exit code; tests call this directly."""
    try:
        rv = app(args=list(argv) if argv is not None else None, prog_name="edgeq", standalone_mode=False)
    except EdgeqError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        err.print("interrupted")
        return 130
    except typer.Exit as e:
        return e.exit_code
    except typer.TyperException as e:
        # Usage errors: one line plus the hint to ask for help.
        msg = e.format_message()  # type: ignore[attr-defined]
        err.print(f"[bold red]error:[/] {escape(msg)}  (see 'edgeq {_subcommand(argv)}--help')", highlight=False)
        code = getattr(e, "exit_code", EXIT_USAGE)
        return EXIT_USAGE if code in (None, 2) else int(code)
    return rv if isinstance(rv, int) else EXIT_OK


def _subcommand(argv: Optional[Sequence[str]]) -> str:
    args = list(argv) if argv is not None else sys.argv[1:]
    names = {c.name for c in app.registered_commands}
    first = next((a for a in args if not a.startswith("-")), None)
    return f"{first} " if first in names else ""


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
