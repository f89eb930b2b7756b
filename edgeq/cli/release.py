"""``edgeq release sign``, ``release install``, ``release rollback`` and ``edgeq fleet status``
(``edgeq.release.sign``, ``edgeq.orchestration.install``): a bundle signed, installed on the boards,
rolled back, and what each board runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from edgeq.cli.fleet import fleet_app, release_app
from edgeq.cli.options import (
    AcceptNewHostKey,
    Duration,
    Engine,
    EngineOpt,
    Fleet,
    Gate,
    Iterations,
    Json,
    Limit,
    MaxFail,
    Workers,
)
from edgeq.cli.output import EXIT_OK, err, out, print_json
from edgeq.orchestration.pool import CANARY

_STYLE = {"pending": "dim", "running": "cyan", "installed": "green", "ok": "green", "failed": "bold red",
          "not run": "yellow", "skipped": "yellow", "interrupted": "bold yellow"}  # fmt: skip


@release_app.command(
    "sign",
    help="Sign a bundle with your SSH key (OpenSSH 'ssh-keygen -Y sign', namespace edgeq-release): writes "
    "BUNDLE.sig beside it. Check it with 'edgeq release verify BUNDLE --allowed-signers FILE'; a fleet "
    "file's 'allowed_signers:' makes 'release install' refuse bundles its keys did not sign.\n\n"
    "The bundle is verified first (as 'edgeq release verify'): a signature vouches for what it signs, so a "
    "file that is no bundle, or one damaged or edited (failing its manifest), is refused and not signed.\n\n"
    "Exit codes: 0 signed; 2 no such bundle or key, not a bundle, a bundle that fails its manifest, "
    "ssh-keygen missing or refusing the key; 130 Ctrl-C.",
    short_help="Sign a bundle with your SSH key (BUNDLE.sig, ssh-keygen -Y sign).",
)
def release_sign_cmd(
    bundle: Path = typer.Argument(..., help="The bundle (.tar.gz)."),
    key: Path = typer.Option(
        ..., "--key", metavar="KEY", help="Your SSH private key (~/.ssh/id_ed25519), or a .pub in ssh-agent."
    ),
    json_out: Json = False,
) -> int:
    from edgeq.release.sign import sign

    sig = sign(bundle, key)
    if json_out:
        print_json({"bundle": str(bundle), "signature": str(sig)})
    else:
        out.print(f"wrote [bold]{escape(str(sig))}[/]")
    return EXIT_OK


def _line(action: str, r: Any) -> str:
    """One board in words, what it runs now first: the version it was switched to (and from), or what it
    kept (``install.kept``: left at its version, not touched, or unknown and why, in the same words for
    every command), then what was measured on it and why it failed."""
    from edgeq.orchestration.install import kept
    from edgeq.text import qps

    said = [f"[{_STYLE.get(r.status, '')}]{escape(r.status)}[/]"]
    if r.ok and action in ("install", "rollback"):
        was = "unchanged" if r.previous == r.version else f"was {r.previous or '(none)'}"
        said.append(f"current {escape(r.version or '(none)')} ({escape(was)})")
    elif action == "status" and r.seen:
        said.append(f"current {escape(r.version or '(none)')}")
        if r.previous:
            said.append(f"previous {escape(r.previous)}")
        if r.kind:
            said.append(escape(r.kind))
        if r.release and r.release.get("signer"):
            said.append(f"signed by {escape(str(r.release['signer']))}")
    else:
        said.append(escape(kept(r)))
    if action == "install":  # the new version's figures on this board
        if r.throughput_qps is not None:
            ratio = f" = {r.ratio:.2f}x the recorded {qps(r.recorded_qps)}" if r.ratio is not None else ""
            said.append(f"{qps(r.throughput_qps)} qps{ratio}")
        if r.gate is not None:
            said.append("gate " + ("passed" if r.gate else "FAILED"))
    if r.error:
        said.append(escape(r.error))
    return f"{escape(r.target)}: " + ", ".join(x for x in said if x)


def _render(result: Any) -> None:
    for r in result.rows:
        out.print(_line(result.action, r))


def _on_row(json_out: bool) -> Any:
    def show(row: Any) -> None:
        if not json_out and row.status in ("installed", "ok", "failed", "skipped", "interrupted"):
            style = _STYLE.get(row.status, "")  # as fleet validate's progress lines
            why = f", {escape(row.error)}" if row.error else ""
            err.print(f"  {escape(row.target)}: [{style}]{row.status}[/]{why}")

    return show


def _finish(result: Any, json_out: bool) -> int:
    code = result.exit_code
    if json_out:
        print_json({**result.to_dict(), "exit_code": code})
        return code
    _render(result)
    if result.interrupted:  # one line per board above says what it kept
        done = sum(r.status not in ("not run", "interrupted", "pending") for r in result.rows)
        out.print(f"[bold yellow]interrupted[/]: {done}/{len(result.rows)} boards finished; no board was "
                  f"started or switched after Ctrl-C")  # fmt: skip
    return code


@release_app.command(
    "install",
    help="Install a bundle on a fleet's boards. Per board: the engine built for its GPU and TensorRT, "
    "uploaded resumably, sha256-checked, unpacked into <work_dir>/releases/<version>/, loaded and timed "
    "there; only a board whose gate passes and whose qps is at least --min-ratio x the bundle's is "
    "switched to it (releases/current, atomically). A failing or unreachable board keeps its current. "
    "Canary first, by default: one board installs (and is checked) before the others, which start only "
    "if it passed; --canary N makes it the first N boards, --canary 0 installs on every board at once. "
    "--max-fail N starts no board after N failures. Ctrl-C switches no board after it; each board's line "
    "says what it kept. With 'allowed_signers:' in the fleet file only bundles its keys signed are "
    "installed.\n\n"
    "Exit codes: 0 installed on every board; 1 a board failed (or a canary); 2 the bundle refused before "
    "any board (not a .tar.gz bundle, damaged, edited, unsigned, untrusted), bad input, host key, login; "
    "130 interrupted.",
    short_help="Install a bundle on a fleet (canary, checked on each board).",
)
def release_install_cmd(
    bundle: Path = typer.Argument(..., help="The bundle (.tar.gz)."),
    fleet: Fleet = ...,  # type: ignore[assignment]
    limit: Limit = None,
    canary: int = typer.Option(CANARY, "--canary", metavar="N", min=0,
                               help="First N boards first; the rest if all pass (0: all at once)."),
    max_fail: MaxFail = None,
    min_ratio: float = typer.Option(0.9, "--min-ratio", metavar="R", min=0,
                                    help="A board's qps >= R x the bundle's recorded."),
    gate: Gate = None,
    iterations: Iterations = 10,
    duration: Duration = 3.0,
    workers: Workers = None,
    accept_new_host_key: AcceptNewHostKey = False,
    engine: EngineOpt = Engine.native,
    json_out: Json = False,
) -> int:
    from edgeq.orchestration.fleet_file import load_fleet
    from edgeq.orchestration.install import InstallOptions, install
    from edgeq.pipeline.stages import ProfileSettings

    assert fleet is not None  # required
    options = InstallOptions(limit=limit, canary=canary, max_fail=max_fail, min_ratio=min_ratio, gate=gate,
                             workers=workers, accept_new_host_key=accept_new_host_key, engine=engine.value,
                             profile=ProfileSettings(iterations=iterations, duration=duration))  # fmt: skip
    result = install(bundle, load_fleet(fleet), options, on_row=_on_row(json_out))
    code = _finish(result, json_out)
    if json_out or result.interrupted:
        return code
    done = sum(r.ok for r in result.rows)
    if result.stopped:
        from edgeq.text import plural

        failed = ", ".join(r.target for r in result.rows if r.status == "failed")
        out.print(f"[bold red]canary failed on {escape(failed)}: stopped; "
                  f"{plural(len(result.rows) - len(result.canary), 'other board')} "
                  "not touched[/]")  # fmt: skip
    else:
        style = "green" if result.passed else "bold red"
        out.print(f"[{style}]{result.version}: installed on {done}/{len(result.rows)} boards[/]"
                  + (f", signed by {escape(result.signer)}" if result.signer else ""))
    return code


@release_app.command(
    "rollback",
    help="Switch each board's releases/current back to the version it ran before (its history on the "
    "board; repeat to go further back); a board whose current changes meanwhile is left as it is."
    "\n\nExit codes: 0 every board rolled back; 1 a board failed (or has "
    "no earlier version); 2 bad input, host key, login; 130 Ctrl-C.",
    short_help="Switch each board back to the version it ran before.",
)
def release_rollback_cmd(
    fleet: Fleet = ...,  # type: ignore[assignment]
    limit: Limit = None,
    accept_new_host_key: AcceptNewHostKey = False,
    engine: EngineOpt = Engine.native,
    json_out: Json = False,
) -> int:
    from edgeq.orchestration.fleet_file import load_fleet
    from edgeq.orchestration.install import InstallOptions, rollback

    assert fleet is not None  # required
    options = InstallOptions(limit=limit, accept_new_host_key=accept_new_host_key, engine=engine.value)
    return _finish(rollback(load_fleet(fleet), options, on_row=_on_row(json_out)), json_out)


@fleet_app.command(
    "status",
    help="What each board runs: its releases/current version, the version a rollback goes to, and the "
    "installed release's kind and signer, read from the boards (the agent), never from local state.\n\n"
    "Exit codes: 0 every board answered; 1 a board did not; 2 bad input, host key, login; 130 Ctrl-C.",
    short_help="What version each board runs, read from the boards.",
)
def fleet_status_cmd(
    fleet: Fleet = ...,  # type: ignore[assignment]
    limit: Limit = None,
    accept_new_host_key: AcceptNewHostKey = False,
    json_out: Json = False,
) -> int:
    from edgeq.orchestration.fleet_file import load_fleet
    from edgeq.orchestration.install import InstallOptions, status

    assert fleet is not None  # required
    options = InstallOptions(limit=limit, accept_new_host_key=accept_new_host_key)
    return _finish(status(load_fleet(fleet), options), json_out)
