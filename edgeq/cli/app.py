"""The ``edgeq`` application: the root command, and ``run``, which maps every outcome to an exit code.

Library code raises ``EdgeqError`` for user problems; they are caught once, here, and printed as one line
(exit 2 unless the error says otherwise). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

from edgeq import __version__
from edgeq.cli.output import EXIT_CODES_HELP, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, err, out
from edgeq.errors import EdgeqError

app = typer.Typer(
    name="edgeq",
    help="ONNX -> INT8 TensorRT 8.6 engines for Jetson and desktop GPUs, with Q/DQ placed so TensorRT "
    "fuses, and a report proving what the engine runs.\n\n"
    "Start with [bold]edgeq demo[/]. The usual path: edgeq lint model.onnx -> edgeq quantize model.onnx "
    "--calib DIR -> edgeq deploy model.int8.onnx --target NAME. Input files are never modified; "
    "'edgeq COMMAND --help' for each, 'edgeq rules' for the TensorRT 8.6 rules behind them.\n\n"
    + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        out.print(f"edgeq {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: int = typer.Option(
        0, "--verbose", "-v", count=True, show_default=False,
        help="More log output: -v info, -vv debug (repeat the flag; it takes no number; after the command "
        "name too).",
    ),
) -> None:
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if verbose >= 2:
        # The transport keeps paramiko quiet unless its level was set: -vv is the user asking for it.
        logging.getLogger("paramiko").setLevel(logging.DEBUG)


class _HelpTable(Table):
    """typer's options table with every column but the help text kept whole: the help text wraps, an
    option's name ("--accept-new-host-key") is never cut to "--accept-new-host-k…"."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        super().add_row(*renderables, **kwargs)
        for column in self.columns[:-1]:
            column.no_wrap = True


@contextmanager
def _whole_option_names() -> Iterator[None]:
    import typer.rich_utils as rich_utils

    saved = rich_utils.Table
    rich_utils.Table = _HelpTable  # type: ignore[misc]  # only while one command's help is printed
    try:
        yield
    finally:
        rich_utils.Table = saved  # type: ignore[misc]


class _Help:
    """edgeq's help, as TensorRT/Ansible/OpenSSH users read help: ``MODEL`` in the usage line (not typer's
    ``{model}``), no Python type names (``_no_type_names``), option names never truncated."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces: list[str] = super().collect_usage_pieces(ctx)  # type: ignore[misc]
        return [_usage_piece(p) for p in pieces]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        for param in self.get_params(ctx):  # type: ignore[attr-defined]
            _no_type_names(param)
        with _whole_option_names():
            super().format_help(ctx, formatter)  # type: ignore[misc]


def _no_type_names(param: Any) -> None:
    """typer 0.29 prints a type beside each parameter (``<int>``, ``<path>``, ``<list[Path]>``): a flag
    or a count (``-v``, ``-vv``) takes no value and shows none; an argument's name already says what it
    is (``PATH...``); an option shows its metavar, its name in capitals where none was declared."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        param.metavar = ""  # typer prints the metavar instead of "<bool>" / "<int>"
    elif param.param_type_name == "argument":
        if param.metavar is None:  # "MODEL", as in the usage line
            param.metavar = (param.name or "arg").upper() + ("..." if param.nargs != 1 else "")
        param.display_type_rich = lambda ctx: None  # its name is what it is
    elif param.metavar is None:
        param.metavar = (param.name or "value").upper()


class _Interrupted(Exception):
    """Ctrl-C inside a command. typer turns a KeyboardInterrupt into a silent exit 130; raised as this
    instead, ``run`` says "interrupted" once, for every command."""


class _SaysInterrupted:
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except KeyboardInterrupt:
            raise _Interrupted from None


def _usage_piece(piece: str) -> str:
    """``{model}`` -> ``MODEL``, ``[path]`` -> ``[PATH]``, ``[PATH...]...`` -> ``[PATH...]``."""
    if piece.startswith("[[") and piece.endswith("]]"):  # a metavar that brackets itself: "[ID]"
        piece = piece[1:-1]
    m = re.fullmatch(r"([{\[])([^}\]]+)[}\]](\.\.\.)?", piece)
    if m is None or piece == "[OPTIONS]":
        return piece
    opening, name, more = m.groups()
    dots = "..." if more and not name.endswith("...") else ""
    name = name.upper() + dots
    return name if opening == "{" else f"[{name}]"


def _with_help(cls: Any, base: type) -> type:
    cls = cls if isinstance(cls, type) else base
    return cls if issubclass(cls, _Help) else type(f"Edgeq{cls.__name__}", (_Help, _SaysInterrupted, cls), {})


def _use_edgeq_help(typer_app: typer.Typer) -> None:
    """Every command and group, those other modules register included, gets edgeq's help (``_Help``) and
    its Ctrl-C line (``_SaysInterrupted``)."""
    typer_app.info.cls = _with_help(typer_app.info.cls, TyperGroup)
    for command in typer_app.registered_commands:
        command.cls = _with_help(command.cls, TyperCommand)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _use_edgeq_help(group.typer_instance)


def run(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI and return its exit code; tests call this directly."""
    _use_edgeq_help(app)
    try:
        args = _verbose_first(list(argv) if argv is not None else sys.argv[1:])
        rv = app(args=args, prog_name="edgeq", standalone_mode=False)
    except EdgeqError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        return e.exit_code
    except (_Interrupted, typer.Abort, KeyboardInterrupt):
        err.print("interrupted")
        return EXIT_INTERRUPTED
    except typer.Exit as e:
        return e.exit_code
    except typer.TyperException as e:
        # Usage errors: one line plus the hint to ask for help.
        msg = e.format_message() + _count_hint(argv)
        see = f"edgeq {_subcommand(argv)}--help"
        if msg.strip():  # bare 'edgeq' has printed the help already: no empty error line under it
            err.print(f"[bold red]error:[/] {escape(msg)}  (see '{see}')", highlight=False)
        code = getattr(e, "exit_code", EXIT_USAGE)
        return EXIT_USAGE if code in (None, 2) else int(code)
    return rv if isinstance(rv, int) else EXIT_OK


_VERBOSE = re.compile(r"-v+|--verbose")


def _verbose_first(args: list[str]) -> list[str]:
    """``-v``/``-vv``/``--verbose`` wherever they are (before a ``--``) given to the root, which owns them:
    ``edgeq lint -v MODEL`` means what ``edgeq -v lint MODEL`` does, as with most tools' -v."""
    end = args.index("--") if "--" in args else len(args)
    flags = [a for a in args[:end] if _VERBOSE.fullmatch(a)]
    return flags + [a for a in args[:end] if not _VERBOSE.fullmatch(a)] + args[end:]


def _count_hint(argv: Optional[Sequence[str]]) -> str:
    """``edgeq -v 2 rules``: the 2 read as a command. -v is a count: say so."""
    args = list(argv) if argv is not None else sys.argv[1:]
    if any(a in ("-v", "--verbose") and b.isdigit() for a, b in zip(args, args[1:])):
        return " (-v takes no number: repeat it, -v info, -vv debug)"
    return ""


def _subcommand(argv: Optional[Sequence[str]]) -> str:
    args = list(argv) if argv is not None else sys.argv[1:]
    names = {c.name for c in app.registered_commands}
    words = [a for a in args if not a.startswith("-")]
    first = words[0] if words else None
    groups = {g.name: g.typer_instance for g in app.registered_groups if g.typer_instance is not None}
    sub = {c.name for c in groups[first].registered_commands} if first in groups else set()
    if len(words) > 1 and words[1] in sub:  # 'edgeq targets check --help', not 'edgeq --help'
        return f"{first} {words[1]} "
    return f"{first} " if first in names or first in groups else ""


def main() -> None:
    sys.exit(run())
