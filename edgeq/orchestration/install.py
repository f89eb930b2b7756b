"""``edgeq release install``, ``release rollback`` and ``fleet status``: a verified bundle onto the boards.

For each board (bounded workers, a failure staying in its row): probe it, pick the bundle's engine
built for its kind (compute capability + TensorRT version, as the manifest records them; a board no
engine fits is refused, naming what it has and what the bundle offers), upload that engine through the
resumable, target-verified upload cache, have the agent check its sha256 against the manifest and
unpack it into ``<work_dir>/releases/<version>/``, load and time it there (agent ``inspect`` and
``profile`` on that versioned file): the board fails if its gate fails or its throughput is below
``min_ratio`` x the bundle's recorded figure. Only a board that passed has ``releases/current``
switched to the new version (atomically, by the agent), so a failing board, or one lost at any point
before the switch, keeps running what it ran. The switch is compare-and-swap: the agent switches only
while ``current`` is still what this install read when it started (``--expect``, under the releases
dir's flock), so of two operators installing on one board at once the later switch is refused and
that board's row fails, naming what ``current`` became; ``rollback`` does the same. ``canary`` boards
go first; if one fails, no other board is touched; ``max_fail``: no board is started once that many
failed (``edgeq.orchestration.pool``, shared with ``fleet validate``). Ctrl-C switches no board after it:
each board's work stops at its next wait, and its row says what the board kept. The board-side steps
are the agent's (``edgeq.agent.releases``), so ``fleet status`` reads what each board runs from the
board itself.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

from edgeq.errors import EdgeqError, RemoteError
from edgeq.interrupt import EXIT_INTERRUPTED, Interrupted
from edgeq.orchestration.fleet_file import MAX_WORKERS, Fleet
from edgeq.orchestration.pool import CANARY, INTERRUPTED, BoardPool
from edgeq.pipeline.stages import ProfileSettings, direct_agent, inspect, probe, profile, report_and_gate
from edgeq.release.bundle import REFUSED, check_gzip, read_bundle, require_intact
from edgeq.release.sign import Signer, check_signed, signature_path
from edgeq.remote.causes import CAUSES, cause_of
from edgeq.remote.protocol import agent_cache_dir
from edgeq.remote.runner import Runner, target_runner
from edgeq.remote.targets import Target
from edgeq.text import plain

RELEASES = "releases"  # under each target's work_dir
# A bundle install will not use exits 2 whatever the reason (not a bundle, damaged, edited, unsigned,
# untrusted, a signature that does not match): it is the operator's input, refused before any board is
# touched, as every bad input is. 1 stays what it means for install: a board tried it and failed.
# (``release verify`` is the check itself: there a problem found is its result, exit 1.) ``release sign``
# refuses the same way (``edgeq.release.bundle.REFUSED``).


@dataclass(frozen=True)
class InstallOptions:
    limit: Optional[str] = None  # Ansible host pattern (edgeq.orchestration.limit)
    canary: int = CANARY  # boards installed (and checked) first; any failure stops the rest
    max_fail: Optional[int] = None  # start no board after this many failures (edgeq.orchestration.pool)
    min_ratio: float = 0.9  # a board's measured qps / the bundle's recorded qps, at least
    accept_new_host_key: bool = False
    workers: Optional[int] = None  # None: the fleet file's
    gate: Optional[str] = None  # --gate over each target's own policy
    profile: ProfileSettings = field(default_factory=ProfileSettings)
    cache_dir: Optional[Path] = None
    engine: str = "native"  # who runs the boards: edgeq's own workers, or "ansible" (edgeq.ansible.engine)


@dataclass
class BoardRow:
    """One board's line; ``status``: pending | running | installed | failed | not run (a canary failed,
    or Ctrl-C came before it started) | skipped (--max-fail) | interrupted (Ctrl-C stopped it) for
    install; ok | failed | not run | skipped | interrupted for rollback and status."""

    target: str
    destination: str
    status: str = "pending"
    stage: str = ""
    kind: Optional[str] = None
    version: Optional[str] = None  # what was installed (install), or current (status, rollback)
    previous: Optional[str] = None  # current before this command
    seen: bool = False  # ``previous`` was read from the board (else what it runs is not known here)
    cause: Optional[str] = None  # why the board could not be used (edgeq.remote.causes), when known
    switched: Optional[bool] = None  # install: current now points at the new version (only once it passed)
    throughput_qps: Optional[float] = None
    recorded_qps: Optional[float] = None
    ratio: Optional[float] = None
    gate: Optional[bool] = None
    gate_summary: str = ""
    uploaded_bytes: Optional[int] = None
    history: list[str] = field(default_factory=list)
    release: Optional[dict[str, Any]] = None  # status: the current release's release.json
    error: Optional[str] = None
    exit_code: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in ("installed", "ok")


@dataclass
class FleetAction:
    """The rows of one install / rollback / status over a fleet."""

    action: str
    rows: list[BoardRow]
    version: Optional[str] = None
    signer: Optional[str] = None
    canary: list[str] = field(default_factory=list)
    stopped: bool = False  # a canary failed: the other boards were not touched
    interrupted: bool = False  # Ctrl-C: no board was started or switched after it

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows) and not self.interrupted

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        return 0 if self.passed else max([1, *(r.exit_code for r in self.rows)])

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "version": self.version, "signer": self.signer, "canary": self.canary,
                "stopped": self.stopped, "interrupted": self.interrupted, "passed": self.passed,
                "rows": [self._row(r) for r in self.rows]}

    def _row(self, r: BoardRow) -> dict[str, Any]:
        """A row as JSON: ``current`` what the board runs now; null only for a board read and found to
        run nothing, ``"unknown"`` (and ``kept`` saying why) for one that was not read. The versions read
        from the board (status's and rollback's ``version``, every ``previous``) say the same."""
        d = {**asdict(r), "kept": kept(r), "current": runs_now(self.action, r)}
        if not r.seen:
            d["previous"] = UNKNOWN
            if self.action != "install":  # install's ``version`` is the bundle's, known either way
                d["version"] = UNKNOWN
        return d


UNKNOWN = "unknown"  # JSON: a version that could not be read from the board (null: read, none there)


def runs_now(action: str, row: BoardRow) -> Optional[str]:
    """The version the board runs after this command (None: it runs none), or ``UNKNOWN``: never read
    (unreachable, not started), or the last step's outcome is not known (a switch or a rollback that
    failed midway)."""
    if row.switched:
        return row.version
    if not row.seen or row.stage in ("switch", "rollback"):
        return UNKNOWN
    return row.previous if action == "install" else row.version


def kept(row: BoardRow) -> str:
    """What a board runs after this command, as far as edgeq knows ("" when its row says it: switched,
    rolled back, or the switch itself failed). Read from the board at the start, so a board that never
    answered is unknown, not "(none)"."""
    if row.ok or row.switched or row.stage in ("switch", "rollback"):
        return ""
    if row.status in ("not run", "skipped"):
        return "not touched"
    if row.seen:
        return f"current left at {row.previous or '(none)'}"
    cause = CAUSES.get(row.cause or "")
    if cause is not None and not cause.answered:  # "unreachable", or how: "connection refused"
        how = "" if cause.name == "unreachable" else f": {cause.name}"
        return f"current unknown (unreachable{how})"
    return f"current unknown ({row.cause or 'not read'})"


RowFn = Callable[[BoardRow], None]
BoardProgress = Callable[[str, str, int, Optional[int]], None]  # (target, task, done, total)


def _no_row(row: BoardRow) -> None:
    """Default sink for row updates."""


def _no_progress(target: str, task: str, done: int, total: Optional[int]) -> None:
    """Default sink for upload progress."""


def release_version(manifest: dict[str, Any]) -> str:
    """The directory name a bundle installs as: source model, creation time, seal prefix
    (``net-20260101T000000Z-1a2b3c4d``): sorts by time, and two bundles never share one."""
    stem = str((manifest.get("source_model") or {}).get("name") or "model").rsplit(".onnx", 1)[0]
    stem = re.sub(r"[^A-Za-z0-9._+-]+", "_", stem).strip("._+-") or "model"
    created = re.sub(r"[^0-9TZ]", "", str(manifest.get("created") or ""))
    return f"{stem[:60]}-{created}-{str(manifest.get('manifest_sha256', ''))[:8]}"


def releases_dir(target: Target) -> str:
    return target.remote_path(RELEASES)


# --------------------------------------------------------------------------------------------------
# The bundle, read and checked once
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    bundle: Path
    manifest: dict[str, Any]
    version: str
    engines: dict[str, Path]  # kind -> the engine, extracted into a temporary directory
    model: Any  # the shipped ONNX (for the gate's explanations), None when it does not load
    signer: Optional[Signer]


def load_bundle(bundle: Path, fleet: Fleet, work: Path) -> Loaded:
    """Verify ``bundle`` (every file against the manifest, then the signature when the fleet names
    ``allowed_signers``: a damaged bundle is said to be damaged, not unsigned) and extract its engines
    into ``work``. Everything is read from one private copy, so the bytes checked are the bytes
    installed even if the original is replaced meanwhile."""
    bundle = Path(bundle)
    if not bundle.is_file():
        read_bundle(bundle)  # its one-line error: no such bundle, or a directory
    copy = work / "bundle" / bundle.name  # its own name: a message about BUNDLE.sig names the user's file
    copy.parent.mkdir()
    shutil.copyfile(bundle, copy)
    if signature_path(bundle).is_file():
        shutil.copyfile(signature_path(bundle), signature_path(copy))
    try:
        check_gzip(copy)  # a model or an engine given by mistake: said as such, signed or not
        data = copy.read_bytes()
        checked = require_intact(copy, "not installed", data)  # damaged or edited: said first
        signer = check_signed(copy, fleet.allowed_signers)
        files = checked.files  # the bytes verified are the bytes installed: not read twice
    except EdgeqError as e:  # said of the user's file, not of the private copy; refused: exit 2
        named = [None if t is None else t.replace(str(copy), str(bundle)) for t in (e.message, e.hint)]
        raise type(e)(named[0] or "", named[1], exit_code=REFUSED) from None
    manifest = checked.manifest
    assert manifest is not None  # require_intact: a bundle that verifies has one
    engines: dict[str, Path] = {}
    for kind, entry in sorted((manifest.get("engines") or {}).items()):
        local = work / re.sub(r"[^A-Za-z0-9._+-]+", "_", kind) / "engine.plan"
        local.parent.mkdir(parents=True)
        local.write_bytes(files[entry["path"]])
        engines[kind] = local
    model = None
    onnx = sorted(p for p in files if p.startswith("model/") and p.endswith(".onnx")
                  and not p.endswith(".fp32.onnx"))  # fmt: skip
    if onnx:
        from edgeq.graph.io import load_model

        path = work / Path(onnx[0]).name
        path.write_bytes(files[onnx[0]])
        try:
            model = load_model(path)
        except EdgeqError:
            model = None  # the report then names layers without their ONNX nodes
    return Loaded(Path(bundle), manifest, release_version(manifest), engines, model, signer)


def pick_engine(loaded: Loaded, target: Target, cc: Optional[str], trt: Optional[str], gpu: Optional[str]
                ) -> str:
    """The kind whose engine loads on this board (same compute capability and TensorRT version)."""
    engines = loaded.manifest.get("engines") or {}
    for kind, e in sorted(engines.items()):
        if cc and trt and e.get("compute_capability") == cc and e.get("tensorrt") == trt:
            return kind
    offers = "; ".join(f"{k} ({e.get('gpu') or '?'}, sm {e.get('compute_capability') or '?'}, TensorRT "
                       f"{e.get('tensorrt') or '?'})" for k, e in sorted(engines.items()))  # fmt: skip
    raise RemoteError(
        f"no engine in the bundle fits {target.name}: it has {gpu or 'an unknown GPU'} sm {cc or '?'}, "
        f"TensorRT {trt or '?'}; the bundle offers {offers or 'no engine'}",
        "validate and release for this kind of board too (edgeq fleet validate with it in the fleet)",
        exit_code=1,
    )


def recorded_qps(manifest: dict[str, Any], kind: str, board: str) -> Optional[float]:
    """The bundle's figure for a board: its own row when the fleet run had it, else the median of
    the rows of its kind."""
    rows = [t for t in manifest.get("targets") or [] if t.get("kind") == kind]
    own = [t for t in rows if t.get("name") == board]
    qps = [float(t["throughput_qps"]) for t in (own or rows)
           if isinstance(t.get("throughput_qps"), (int, float))]  # fmt: skip
    return statistics.median(qps) if qps else None


# --------------------------------------------------------------------------------------------------
# One board
# --------------------------------------------------------------------------------------------------


class _Board:
    """A board's connection, agent and row, for one command."""

    def __init__(self, runner: Runner, target: Target, agent_pyz: Any, row: BoardRow,
                 update: Callable[..., None], pool: BoardPool) -> None:  # fmt: skip
        self.runner, self.target, self.row, self.update = runner, target, row, update
        self.stop = pool.stop
        up = runner.put(agent_pyz.path, target.remote_path("cache"))
        self.call = direct_agent(runner, target, up.remote_path)
        self.root = releases_dir(target)

    def agent(self, command: str, *args: str) -> dict[str, Any]:
        return self.call(command, f"--releasesDir={self.root}", *args, timeout=self.target.timeouts.command)


def _install_one(board: _Board, loaded: Loaded, options: InstallOptions, progress: BoardProgress,
                 work: Path) -> None:  # fmt: skip
    target, update = board.target, board.update
    update(stage="status")
    seen = board.agent("status").get("current")  # what the switch expects current still to be
    update(previous=seen, seen=True, stage="probe")
    found = probe(board.call, target)
    kind = pick_engine(loaded, target, found.compute_capability, found.tensorrt, found.gpu)
    engine = loaded.engines[kind]
    entry = loaded.manifest["engines"][kind]
    sha = next(f["sha256"] for f in loaded.manifest["files"] if f["path"] == entry["path"])
    update(kind=kind, stage="upload")
    up = board.runner.put(engine, target.remote_path("cache"),
                          progress=lambda task, done, total: progress(target.name, task, done, total))
    update(uploaded_bytes=up.bytes_sent, stage="install")
    recorded = recorded_qps(loaded.manifest, kind, target.name)
    meta = {"bundle": loaded.bundle.name, "manifest_sha256": loaded.manifest.get("manifest_sha256"),
            "kind": kind, "created": loaded.manifest.get("created"), "recorded_qps": recorded,
            "signer": loaded.signer.principal if loaded.signer else None}  # fmt: skip
    board.agent("install", f"--version={loaded.version}", f"--engine={up.remote_path}", f"--sha256={sha}",
                "--meta=" + json.dumps(meta, sort_keys=True))  # fmt: skip
    _check_installed(board, loaded, kind, recorded, options, work)  # a failure leaves current alone
    board.stop.check()  # Ctrl-C came: no switch after it
    update(stage="switch")
    with board.stop.shielded():  # begun before Ctrl-C: milliseconds, atomic on the board, said as done
        switched = board.agent("switch", f"--version={loaded.version}", f"--expect={seen or ''}")
    update(switched=bool(switched.get("changed")))


def _check_installed(board: _Board, loaded: Loaded, kind: str, recorded: Optional[float],
                     options: InstallOptions, work: Path) -> None:  # fmt: skip
    """Load and time the engine in its versioned directory, before ``current`` points at it: gate and
    throughput, or an error (and the board keeps its ``current``)."""
    from edgeq.orchestration.deploy import policy_for

    target, update = board.target, board.update
    engine = f"{board.root}/{loaded.version}/engine.plan"
    layers_remote = target.remote_path("runs", f"install-{loaded.version}", "layers.json")
    update(stage="inspect")
    inspect(board.call, target, engine, layers_remote, options.profile.shapes.run_args())
    layers = work / f"layers-{re.sub(r'[^A-Za-z0-9._-]+', '_', target.name)}.json"
    board.runner.get(layers_remote, layers)
    _, gate = report_and_gate(layers, None, loaded.model, policy_for(target, options.gate))
    update(gate=bool(gate), gate_summary=gate.summary(), stage="profile")
    prof = profile(board.call, target, engine, None, options.profile)
    qps = prof.get("throughput_qps")
    ratio = round(qps / recorded, 3) if isinstance(qps, (int, float)) and recorded else None
    update(throughput_qps=qps, recorded_qps=recorded, ratio=ratio)
    if not gate:
        raise RemoteError(f"the gate failed on the installed engine: {gate.summary()}",
                          "the release does not run here as it did when validated", exit_code=1)  # fmt: skip
    if ratio is not None and ratio < options.min_ratio:
        raise RemoteError(f"below --min-ratio {plain(options.min_ratio)}",  # the row says the figures, once
                          "is the board throttled (nvpmodel, jetson_clocks) or busy?",
                          exit_code=1)  # fmt: skip
    if ratio is None and recorded:
        raise RemoteError("the installed engine was timed, but no throughput came back",
                          exit_code=1)  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Fleet-wide
# --------------------------------------------------------------------------------------------------

BoardFn = Callable[[_Board], None]


def _run_boards(targets: Sequence[Target], rows: list[BoardRow], fn: BoardFn, pool: BoardPool, *,
                accept_new_host_key: bool, cache_dir: Optional[Path], on_row: RowFn, ok: str,
                connect: Callable[..., Any] = target_runner) -> None:  # fmt: skip
    """``fn`` on each board at once (``pool``: workers, --max-fail, Ctrl-C); a board's EdgeqError
    fails its row only, Ctrl-C ends it as "interrupted". ``connect``: (target, accept_new_host_key, stop)
    -> the board's ``Runner`` (another engine's connection: edgeq.ansible runs one board per task)."""
    from edgeq.remote.zipapp import build_agent

    agent_pyz = build_agent(cache_dir or agent_cache_dir())

    def one(target: Target, row: BoardRow) -> None:
        def update(**cells: Any) -> None:
            with pool.lock:
                for k, v in cells.items():
                    setattr(row, k, v)
                on_row(row)

        with pool.lock:
            why = pool.not_started()
        if why is not None:  # Ctrl-C or --max-fail came first: this board is not touched
            status = "not run" if why == INTERRUPTED else "skipped"
            update(status=status, error=f"not started: {why}", exit_code=1)
            return
        started = time.monotonic()
        update(status="running", stage="connect")
        try:
            with connect(target, accept_new_host_key, pool.stop) as runner:
                fn(_Board(runner, target, agent_pyz, row, update, pool))
        except Interrupted:
            row.status, row.error = "interrupted", f"stopped during {row.stage}"
            row.exit_code = EXIT_INTERRUPTED
        except EdgeqError as e:
            cause = cause_of(e)
            row.error, row.exit_code = str(e), e.exit_code
            row.cause = cause.name if cause is not None else None
        with pool.lock:
            if row.status != "interrupted":
                row.status = ok if row.error is None else "failed"
            pool.failures += row.status == "failed"
            row.seconds = round(time.monotonic() - started, 3)
            if row.error is None:
                row.stage = ""
            on_row(row)

    pool.run([partial(one, t, r) for t, r in zip(targets, rows)], "edgeq-install")


def install_step(loaded: Loaded, options: InstallOptions, work: Path,
                 progress: BoardProgress = _no_progress) -> BoardFn:  # fmt: skip
    """What ``install`` does on one board, for ``run_board``."""
    return partial(_install_one, loaded=loaded, options=options, progress=progress, work=work)


def run_board(fn: BoardFn, target: Target, row: BoardRow, pool: BoardPool, options: InstallOptions, *,
              ok: str, connect: Callable[..., Any] = target_runner, on_row: RowFn = _no_row) -> None:
    """One board of install / rollback / status (``fn``: ``install_step``, ``rollback_one``,
    ``status_one``), as the fleet-wide commands run each: the seam another engine runs boards through
    (``edgeq.ansible``: a task a board, ``connect`` its Ansible connection); ``ok``: the row's status
    when ``fn`` ends without an error."""
    _run_boards([target], [row], fn, pool, ok=ok, accept_new_host_key=options.accept_new_host_key,
                cache_dir=options.cache_dir, on_row=on_row, connect=connect)  # fmt: skip


def _rows(targets: Sequence[Target], on_row: RowFn) -> list[BoardRow]:
    rows = [BoardRow(t.name, f"{t.user}@{t.host}:{t.port}") for t in targets]
    for r in rows:
        on_row(r)
    return rows


def _pool(fleet: Fleet, options: InstallOptions, n: int) -> BoardPool:
    workers = max(1, min(options.workers or fleet.workers or MAX_WORKERS, max(n, 1)))
    return BoardPool(workers, options.max_fail)


def install(bundle: Path, fleet: Fleet, options: InstallOptions = InstallOptions(), *,
            on_row: RowFn = _no_row, progress: BoardProgress = _no_progress) -> FleetAction:  # fmt: skip
    """Install ``bundle`` on the fleet (``options.limit`` of it), canary boards first. Ctrl-C: the result
    says ``interrupted`` (no board started or switched after it); the temporary files are removed."""
    if options.min_ratio < 0:
        raise EdgeqError(f"--min-ratio {plain(options.min_ratio)}: must be 0 or more")
    if options.canary < 0:
        raise EdgeqError(f"--canary {options.canary}: must be 0 or more")
    targets = fleet.limited(options.limit).targets
    pool = _pool(fleet, options, len(targets))
    with tempfile.TemporaryDirectory(prefix="edgeq-install-") as tmp:
        work = Path(tmp)
        loaded = load_bundle(Path(bundle), fleet, work)
        rows = _rows(targets, on_row)
        for r in rows:
            r.version = loaded.version
        n = options.canary if options.canary < len(targets) else 0  # canaries of the whole fleet: none
        result = FleetAction("install", rows, loaded.version,
                             loaded.signer.principal if loaded.signer else None,
                             [t.name for t in targets[:n]])  # fmt: skip

        def fn(board: _Board) -> None:
            _install_one(board, loaded, options, progress, work)

        if options.engine == "ansible":  # the same board work, a task each; canary: Ansible's serial
            from edgeq.ansible.engine import install_boards

            install_boards(loaded, work, fleet, targets, rows, result, options, pool, on_row)
            result.interrupted = pool.interrupted
            return result

        def run(ts: Sequence[Target], rs: list[BoardRow]) -> None:
            _run_boards(ts, rs, fn, pool, ok="installed", accept_new_host_key=options.accept_new_host_key,
                        cache_dir=options.cache_dir, on_row=on_row)  # fmt: skip

        if n:
            run(targets[:n], rows[:n])
            if not all(r.ok for r in rows[:n]) or pool.interrupted:
                result.stopped = not pool.interrupted
                why = INTERRUPTED if pool.interrupted else "a canary board failed"
                for r in rows[n:]:
                    r.status, r.error, r.exit_code = "not run", f"not started: {why}", 1
                    on_row(r)
                result.interrupted = pool.interrupted
                return result
        run(targets[n:], rows[n:])
    result.interrupted = pool.interrupted
    return result


def rollback(fleet: Fleet, options: InstallOptions = InstallOptions(), *, on_row: RowFn = _no_row
             ) -> FleetAction:
    """Switch ``current`` back to the version before it on each board."""
    targets = fleet.limited(options.limit).targets
    rows = _rows(targets, on_row)
    pool = _pool(fleet, options, len(targets))
    if options.engine == "ansible":
        from edgeq.ansible.engine import release_boards

        release_boards("rollback", fleet, targets, rows, options, pool, on_row)
    else:
        _run_boards(targets, rows, rollback_one, pool, ok="ok", cache_dir=options.cache_dir, on_row=on_row,
                    accept_new_host_key=options.accept_new_host_key)  # fmt: skip
    return FleetAction("rollback", rows, interrupted=pool.interrupted)


def rollback_one(board: _Board) -> None:
    """``current`` back to the version before it on one board, compare-and-swap."""
    board.update(stage="status")
    seen = board.agent("status").get("current")
    board.update(version=seen, previous=seen, seen=True)  # current until the rollback says otherwise
    board.stop.check()  # Ctrl-C came: no switch after it
    board.update(stage="rollback")
    with board.stop.shielded():
        back = board.agent("rollback", f"--expect={seen or ''}")  # refused if current changed meanwhile
    board.update(previous=back.get("previous"), version=back.get("current"))


def status(fleet: Fleet, options: InstallOptions = InstallOptions(), *, on_row: RowFn = _no_row
           ) -> FleetAction:
    """What each board runs, read from the board (its ``releases/current``), never from local state."""
    targets = fleet.limited(options.limit).targets
    rows = _rows(targets, on_row)
    pool = _pool(fleet, options, len(targets))
    if options.engine == "ansible":
        from edgeq.ansible.engine import release_boards

        release_boards("status", fleet, targets, rows, options, pool, on_row)
    else:
        _run_boards(targets, rows, status_one, pool, ok="ok", accept_new_host_key=options.accept_new_host_key,
                    cache_dir=options.cache_dir, on_row=on_row)  # fmt: skip
    return FleetAction("status", rows, interrupted=pool.interrupted)


def status_one(board: _Board) -> None:
    """What one board runs, read from its ``releases/``."""
    board.update(stage="status")
    got = board.agent("status")
    release = got.get("release") or {}
    board.update(version=got.get("current"), previous=got.get("previous"), kind=release.get("kind"),
                 history=list(got.get("history") or []), release=got.get("release"), seen=True)  # fmt: skip


__all__: Sequence[str] = ("BoardRow", "FleetAction", "InstallOptions", "install", "install_step", "kept",
                          "rollback", "rollback_one", "run_board", "status", "status_one")
