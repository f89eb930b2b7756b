"""A run directory and its records: ``stages.json`` (each stage's status, seconds, summary),
``deploy.log`` (stage lines plus the target's log stream) and ``timings.json``, on disk after every
change, so a run that fails or is interrupted still says how far it got.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from edgeq.errors import EdgeqError
from edgeq.findings import ProgressFn, no_progress
from edgeq.fs import atomic_write_text, ensure_dir
from edgeq.remote.protocol import agent_failed, call_agent
from edgeq.remote.runner import EventFn, Runner

if TYPE_CHECKING:
    from edgeq.remote.targets import Target

STAGES = ("clean", "quantize", "lint", "upload", "probe", "build", "inspect", "profile", "accuracy", "report",
          "gate")
AgentFn = Callable[..., dict[str, Any]]


def no_event(line: str) -> None:
    """Default sink for stage and remote log lines."""


@dataclass
class StageRecord:
    name: str
    status: str = "pending"  # pending | ok | failed | skipped | not run
    seconds: float = 0.0
    summary: str = ""
    data: dict[str, Any] = field(default_factory=dict)



# --------------------------------------------------------------------------------------------------
# The run directory and its records
# --------------------------------------------------------------------------------------------------


def slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")
    return s or "model"


def model_stem(path: Path) -> str:
    return Path(path).name.rsplit(".onnx", 1)[0]


def new_run_dir(runs_dir: Path, model: Path, target_name: str, now: Optional[_dt.datetime] = None) -> Path:
    """``runs/<model>-<target>-<UTC timestamp>``; a suffix keeps two deploys in one second apart."""
    stamp = (now or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y%m%d-%H%M%S")
    base = f"{slug(model_stem(model))}-{slug(target_name)}-{stamp}"
    ensure_dir(runs_dir)
    for i in range(1, 1000):
        path = runs_dir / (base if i == 1 else f"{base}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise EdgeqError(
                f"{runs_dir}: cannot create a run directory ({e.strerror or e})", "choose another --runs-dir"
            ) from None
    raise EdgeqError(f"{runs_dir}: cannot create a run directory for {base}")


def write_json(path: Path, obj: Any) -> Path:
    """Every JSON artefact of a run, written the one way (atomic, indented, anything else as str)."""
    atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")
    return path


def stage_seconds(run_dir: Path, name: str) -> Optional[float]:
    """One stage's seconds as a finished run's ``stages.json`` has them; None where it has not."""
    try:
        stages = json.loads((Path(run_dir) / "stages.json").read_text())["stages"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    done = [s for s in stages if s.get("name") == name and s.get("status") == "ok"]
    return float(done[0]["seconds"]) if done else None


class RunLog:
    """``stages.json`` and ``deploy.log`` of one run; every change is on disk at once."""

    def __init__(self, run_dir: Path, on_event: EventFn = no_event, stages: Sequence[str] = STAGES) -> None:
        self.run_dir = run_dir
        self.on_event = on_event
        self.stages = [StageRecord(n) for n in stages]
        self._log = open(run_dir / "deploy.log", "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.save()

    def line(self, text: str, *, echo: bool = True) -> None:
        stamp = time.strftime("%H:%M:%S")
        self._log.write(f"{stamp} {text}\n")
        self._log.flush()
        if echo:
            self.on_event(text)

    def remote_line(self, text: str) -> None:
        """A line of the target's stderr (TensorRT / trtexec log): kept in deploy.log, not echoed."""
        self._log.write(f"  | {text}\n")
        self._log.flush()  # a build runs for minutes: ``tail -f deploy.log`` shows TensorRT's progress

    def stage(self, name: str) -> StageRecord:
        return next(s for s in self.stages if s.name == name)

    def save(self) -> None:
        write_json(self.run_dir / "stages.json", {"stages": [asdict(s) for s in self.stages]})

    def close(self) -> None:
        self._log.close()


class Recorder:
    """Runs stages into one run directory: each stage's outcome, seconds and summary on disk at once."""

    def __init__(
        self,
        run_dir: Path,
        on_event: EventFn = no_event,
        progress: ProgressFn = no_progress,
        stages: Sequence[str] = STAGES,
        task: str = "deploy",
    ) -> None:
        self.run_dir = run_dir
        self.task = task  # the progress display's label
        self.log = RunLog(run_dir, on_event, stages)
        self.progress = progress
        self.timings: dict[str, Any] = {"stages": {}}
        self.done = 0

    @property
    def stages(self) -> list[StageRecord]:
        return self.log.stages

    @contextmanager
    def stage(self, name: str) -> Iterator[StageRecord]:
        rec = self.log.stage(name)
        self.progress(self.task, self.done, len(self.stages))
        self.log.line(f"{name}: started")
        started = time.monotonic()
        try:
            yield rec
        except BaseException as e:
            from edgeq.remote.ssh import ConnectionDropped

            if isinstance(e, ConnectionDropped):  # say which stage was running, not which command line
                e.during(name)
            rec.status = "failed"
            rec.summary = str(e) if isinstance(e, EdgeqError) else f"{type(e).__name__}: {e}"
            raise
        else:
            if rec.status == "pending":
                rec.status = "ok"
        finally:
            rec.seconds = round(time.monotonic() - started, 3)
            self.timings["stages"][name] = rec.seconds
            self.log.line(f"{name}: {rec.status}" + (f" - {rec.summary}" if rec.summary else ""))
            self.log.save()
            self.done += 1
            self.progress(self.task, self.done, len(self.stages))

    def skip(self, name: str, why: str) -> None:
        rec = self.log.stage(name)
        rec.status, rec.summary = "skipped", why
        self.log.line(f"{name}: skipped - {why}")
        self.log.save()
        self.done += 1

    def copy(self, records: Sequence[StageRecord]) -> None:
        """Take over stages that ran elsewhere (a fleet prepares the model once for every target)."""
        for r in records:
            rec = self.log.stage(r.name)
            rec.status, rec.seconds, rec.summary, rec.data = r.status, r.seconds, r.summary, dict(r.data)
            self.done += 1
        self.log.save()

    @contextmanager
    def finishing(self) -> Iterator[None]:
        """On any failure (or Ctrl-C) the run directory still says how far it got; always closes."""
        try:
            yield
        except BaseException as e:
            self.timings["failed"] = str(e) or type(e).__name__
            for s in self.stages:
                if s.status == "pending":
                    s.status = "not run"
            if isinstance(e, EdgeqError) and not e.hint:
                e.hint = f"stage log: {self.run_dir / 'stages.json'}"
            raise
        finally:
            write_json(self.run_dir / "timings.json", self.timings)
            self.log.save()
            self.log.close()

    def agent(self, runner: Runner, target: Target, agent_remote: str) -> AgentFn:
        """``call_agent`` with each reply kept as ``agent-<command>.json`` and its log in deploy.log."""

        def call(command: str, *args: str, timeout: float) -> dict[str, Any]:
            streamed = 0

            def on_stderr(line: str) -> None:
                nonlocal streamed
                streamed += 1
                self.log.remote_line(line)

            reply = call_agent(runner, target, agent_remote, command, *args, timeout=timeout,
                               on_stderr=on_stderr)  # fmt: skip
            write_json(self.run_dir / f"agent-{command}.json", reply)
            if not reply.get("ok"):
                # The reply's log is a tail of the stderr that already streamed into deploy.log; it is
                # the only copy only when nothing streamed.
                if not streamed:
                    for ln in (reply.get("error") or {}).get("log") or []:
                        self.log.remote_line(str(ln))
                raise agent_failed(command, reply, target, runner.destination, self.run_dir)
            return reply.get("result") or {}

        return call
