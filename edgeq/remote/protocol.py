"""The host side of the agent protocol: the argv of an agent command, its reply, and what a reply means.

The agent (``edgeq.agent``) runs on the target and answers every command with one JSON envelope
(``protocol``, ``ok``, ``result`` or ``error``). Every stage that talks to the target goes through
``call_agent`` here, over whatever ``Runner`` (put / run / get) the caller holds.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from edgeq.agent import PROTOCOL as AGENT_PROTOCOL  # the envelope version shipped with this host
from edgeq.errors import RemoteError
from edgeq.remote.runner import EventFn, Runner
from edgeq.remote.targets import Target, version_matches


def agent_argv(target: Target, agent_path: str, command: str, *args: str) -> list[str]:
    """``[python, agent.pyz, command, --backend=..., ...]``. Values ride in ``--flag=value`` form so a
    value starting with '-' (``-CUBLAS``, a file named ``-x.onnx``) is never read as an option."""
    return [
        target.python,
        agent_path,
        command,
        f"--backend={target.backend}",
        f"--trtexec={target.trtexec}",
        *args,
    ]


def parse_agent_reply(
    stdout: str, stderr: str, exit_code: int, what: str, signal: Optional[str] = None
) -> dict[str, Any]:
    """The one JSON object the agent printed, or a RemoteError saying why there is none (``signal``:
    the one that killed it)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "protocol" in obj:
            if obj["protocol"] != AGENT_PROTOCOL:
                raise RemoteError(
                    f"{what}: the agent speaks protocol {obj['protocol']}, edgeq speaks {AGENT_PROTOCOL}",
                    "update edgeq on this host (the agent is shipped from it)",
                    exit_code=1,
                )
            return obj
    tail = [ln for ln in stderr.strip().splitlines() if ln.strip()][-1:] or ["no output"]
    if signal:
        raise RemoteError(
            f"{what}: the agent was killed by signal {signal} on the target: {tail[0][:300]}",
            "see the target's kernel log (dmesg: out of memory?) and deploy.log for what it was doing",
            exit_code=1,
        )
    raise RemoteError(
        f"{what}: the agent gave no answer (exit {exit_code}): {tail[0][:300]}",
        "check the target's 'python' in the target file (Python 3.8+ is needed)",
        exit_code=1,
    )


def call_agent(
    conn: Runner,
    target: Target,
    agent_remote: str,
    command: str,
    *args: str,
    timeout: float,
    on_stderr: Optional[EventFn] = None,
) -> dict[str, Any]:
    """Run one agent command on the target; its reply envelope (``ok`` with ``result`` or ``error``).

    ``check=False``: a non-zero exit still carries the agent's JSON answer, which says more than the
    exit code (the stage that failed, TensorRT's log)."""
    argv = agent_argv(target, agent_remote, command, *args)
    res = conn.run(argv, timeout=timeout, check=False, on_stderr=on_stderr)
    return parse_agent_reply(res.stdout, res.stderr, res.exit_code, f"{command} on {target.name}",
                             res.signal)


def agent_failed(
    command: str, reply: dict[str, Any], target: Target, destination: str, run_dir: Optional[Path] = None
) -> RemoteError:
    """The one-line error for a reply with ``ok`` false: the agent's stage and message, and a hint."""
    err = reply.get("error") or {}
    return RemoteError(
        f"{command} on {target.name} ({destination}) failed at stage "
        f"'{err.get('stage', '?')}': {err.get('message', 'no message')}",
        hint_for(command, err, target, run_dir),
        exit_code=1,
    )


@dataclass(frozen=True)
class DiskSpace:
    """Free disk space where the agent writes its runs (the probe reply's ``disk``): what a build needs
    is checked against it, and a release can record it per board."""

    path: str
    free_bytes: int
    total_bytes: Optional[int] = None

    @property
    def free_mib(self) -> int:
        return self.free_bytes >> 20


def disk_space(facts: dict[str, Any]) -> Optional[DiskSpace]:
    """The probe's ``disk`` (``{"path", "free_bytes", "total_bytes"}``); None where the target cannot say."""
    disk = facts.get("disk")
    if not isinstance(disk, dict) or not isinstance(disk.get("free_bytes"), int):
        return None
    return DiskSpace(str(disk.get("path")), disk["free_bytes"], disk.get("total_bytes"))


def probe_facts(facts: dict[str, Any]) -> tuple[Optional[str], Optional[str]]:
    """(TensorRT version, first GPU's compute capability) from the probe's facts, either may be None."""
    gpus = facts.get("gpus") or []
    return (facts.get("tensorrt") or {}).get("version"), (gpus[0].get("compute_capability") if gpus else None)


def build_args(
    target: Target,
    onnx_remote: str,
    engine_remote: str,
    *,
    int8: bool,
    fp16: bool,
    trt_version: Optional[str] = None,
    cc: Optional[str] = None,
) -> list[str]:
    """The agent's ``build`` options for this target (trtexec names, ``--flag=value`` form).

    ``--int8`` only for a Q/DQ model (explicit quantization); a float model builds FP16/FP32 and the
    INT8 gate reports it. The timing cache is per TensorRT version and GPU: TensorRT refuses a cache
    from another device, so the name carries both.
    """
    b = target.build
    args = [f"--onnx={onnx_remote}", f"--saveEngine={engine_remote}"]
    if int8:
        args.append("--int8")
    if fp16:
        args.append("--fp16")
    if b.workspace:
        args.append(f"--workspace={b.workspace}")
    if b.tactic_sources:
        args.append("--tacticSources=" + ",".join(b.tactic_sources))
    if b.timing_cache:
        name = f"timing-{trt_version or 'trt'}-sm{cc or 'x'}.cache"
        args.append(f"--timingCacheFile={target.remote_path('timing-cache', name)}")
    if b.dla_core is not None:
        args.append(f"--useDLACore={b.dla_core}")
        if b.allow_gpu_fallback:
            args.append("--allowGPUFallback")
    return args


def check_expectations(target: Target, trt_version: Optional[str], cc: Optional[str]) -> None:
    if target.tensorrt and not version_matches(target.tensorrt, trt_version):
        raise RemoteError(
            f"{target.name} runs TensorRT {trt_version}, but {target.path} expects {target.tensorrt}",
            "engines only load on the TensorRT they were built with: fix 'tensorrt' in the target file",
            exit_code=1,
        )
    if target.compute_capability and cc and cc != target.compute_capability:
        raise RemoteError(
            f"{target.name} has a compute capability {cc} GPU, but {target.path} expects "
            f"{target.compute_capability}",
            "is this the right machine? fix 'gpu.compute_capability' in the target file",
            exit_code=1,
        )


def hint_for(command: str, err: dict[str, Any], target: Target, run_dir: Optional[Path]) -> Optional[str]:
    """The fix for a failed agent stage; ``run_dir`` None (``targets check``): no logs to point at."""
    stage = err.get("stage")
    where = f"; logs in {run_dir}" if run_dir is not None else ""
    if str(err.get("message", "")).startswith("no space left"):
        from edgeq.remote.upload import NO_SPACE_HINT

        return NO_SPACE_HINT + where
    if stage == "import" and target.backend == "python":
        return (
            f"install TensorRT 8.6's Python package for {target.python} on the target, or set "
            f"'backend: trtexec' in {target.path}{where}"
        )
    if stage == "import":
        return f"set 'trtexec' in {target.path} to trtexec's path on the target; check it starts there{where}"
    if run_dir is None:
        return None
    if stage in ("parse", "build"):
        return f"the TensorRT log is in {run_dir / 'deploy.log'} and {run_dir / f'agent-{command}.json'}"
    return f"logs in {run_dir}"


def agent_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgeq" / "agent"
