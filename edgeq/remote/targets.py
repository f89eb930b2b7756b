"""Target files: where a model is deployed and how the engine is built there.

A target is a small YAML file (``targets/orin-agx.yaml``): SSH access (host, port, user, key or
ssh-agent, known_hosts, optional jump host), the remote work dir and Python, what the target is
expected to be (TensorRT version, compute capability), build options named as trtexec names them,
the backend (TensorRT Python API or trtexec) and an optional precision-gate allowlist. ``host: local``
is this machine's GPU: no SSH keys, the agent runs as a subprocess (``edgeq.remote.runner.LocalRunner``).

``--target NAME`` resolves to ``./targets/NAME.yaml``; anything that looks like a path (has a slash or
ends in .yaml/.yml) is read as a path. No targets are bundled inside the package: a target names
real machines and keys, so an example silently picked up from site-packages would point a deploy at
somebody else's address. The examples live in the repository's ``targets/`` directory instead.

Validation is strict and names the file, the key and what was expected; unknown keys are refused
with a did-you-mean, because a misspelt ``dla_core`` silently ignored builds the wrong engine.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from edgeq.config import SECTION, Bad, Checker, check_mapping, read_yaml
from edgeq.config import string as _str
from edgeq.errors import ConfigError

if TYPE_CHECKING:
    from edgeq.remote.transport import SSHConfig

DEFAULT_TRTEXEC = "/usr/src/tensorrt/bin/trtexec"  # where JetPack installs it
TARGETS_DIR = "targets"
BACKENDS = ("python", "trtexec")
# trtexec 8.6 --tacticSources library names (samples/common/sampleOptions.cpp, release/8.6).
TACTIC_SOURCES = ("CUBLAS", "CUBLAS_LT", "CUDNN", "EDGE_MASK_CONVOLUTIONS", "JIT_CONVOLUTIONS")
# ``host: local``: the GPU of the machine edgeq runs on (a workstation), reached without SSH.
LOCAL_HOST = "local"


@dataclass(frozen=True)
class BuildOptions:
    """Engine build settings; each maps to one trtexec flag / IBuilderConfig call."""

    workspace: Optional[int] = None  # MiB: --memPoolSize=workspace:N / set_memory_pool_limit(WORKSPACE)
    fp16: bool = True  # --fp16 / BuilderFlag.FP16: let layers without a fast INT8 kernel run FP16
    tactic_sources: tuple[str, ...] = ()  # --tacticSources=-CUBLAS,... / set_tactic_sources
    timing_cache: bool = True  # --timingCacheFile on the target, reused across builds
    dla_core: Optional[int] = None  # --useDLACore / default_device_type=DLA, DLA_core
    allow_gpu_fallback: bool = True  # --allowGPUFallback / BuilderFlag.GPU_FALLBACK (DLA only)


@dataclass(frozen=True)
class Timeouts:
    """Seconds. ``build`` is long: an explicit ResNet-50 took 303 s on an H200 (fixtures), more on Orin."""

    connect: float = 15.0
    command: float = 120.0
    build: float = 3600.0
    profile: float = 900.0


@dataclass(frozen=True)
class GateConfig:
    """A target's or pipeline's ``gate:`` section, as ``gate_from_dict`` reads both (one schema);
    ``edgeq.orchestration.deploy.policy_for`` turns it into a Policy."""

    policy: Optional[str] = None  # None: a pipeline leaves the target's policy, a target file's is int8
    allow: tuple[str, ...] = ()
    require_fusion: Optional[bool] = None


@dataclass(frozen=True)
class Target:
    name: str
    path: Path
    host: str
    user: str
    port: int = 22
    identity_file: Optional[Path] = None
    use_agent: bool = False
    known_hosts: Path = field(default_factory=lambda: Path("~/.ssh/known_hosts").expanduser())
    jump_host: Optional[str] = None  # "user@host:port"
    work_dir: str = "edgeq"  # relative to the remote home, or absolute
    python: str = "python3"
    tensorrt: Optional[str] = None  # expected TensorRT version prefix, e.g. "8.6"
    gpu_name: Optional[str] = None
    compute_capability: Optional[str] = None  # e.g. "8.7" (Orin), "7.2" (Xavier)
    build: BuildOptions = field(default_factory=BuildOptions)
    backend: str = "python"
    trtexec: str = DEFAULT_TRTEXEC
    timeouts: Timeouts = field(default_factory=Timeouts)
    gate: Optional[GateConfig] = None
    keys: tuple[str, ...] = ()  # the keys the file set: where it says nothing, ~/.ssh/config may
    example: bool = False  # ``example: true``: a template from the repository, no real board behind it

    @property
    def is_local(self) -> bool:
        """``host: local``: a GPU on this machine, without SSH (``edgeq.remote.runner.LocalRunner``)."""
        return self.host == LOCAL_HOST

    def remote_path(self, *parts: str) -> str:
        """A path under the work dir, POSIX-joined (the target is Linux whatever the host is)."""
        return "/".join([self.work_dir.rstrip("/"), *parts])

    def ssh_config(self, accept_new_host_key: bool = False) -> SSHConfig:
        """The transport's settings for this target (paramiko stays inside ``transport``)."""
        from edgeq.remote.transport import SSHConfig

        if self.is_local:
            raise ConfigError(f"{self.path}: 'host: local' is reached without SSH",
                              "run it through edgeq.remote.runner.target_runner")  # fmt: skip

        if self.identity_file is not None and not self.identity_file.is_file():
            raise ConfigError(
                f"{self.path}: 'identity_file' {self.identity_file} does not exist",
                "point it at your private key, or set 'use_agent: true' to use the running ssh-agent",
            )
        # ~/.ssh/config, as ssh reads it, where the file says nothing: HostName (the address known_hosts
        # is checked under, as OpenSSH checks it), Port, UserKnownHostsFile, ProxyJump
        from edgeq.remote.sshconfig import openssh_config

        said = openssh_config(self.host)
        known_hosts = self.known_hosts
        if "known_hosts" not in self.keys and said.get("userknownhostsfile"):
            known_hosts = Path(said["userknownhostsfile"])
        common: dict[str, Any] = {
            "identity_file": str(self.identity_file) if self.identity_file else None,
            "known_hosts": str(known_hosts),
            "use_agent": self.use_agent,
            "accept_new_host_key": accept_new_host_key,
            "connect_timeout": self.timeouts.connect,
        }
        jump = None
        jump_host = self.jump_host or (said.get("proxyjump", "").split(",")[0] or None)
        if jump_host and jump_host != "none":
            juser, jhost, jport = split_hostspec(jump_host)
            jump = SSHConfig(host=jhost, port=jport, user=juser or self.user, **common)
        port = self.port if "port" in self.keys else int(said.get("port", self.port))
        return SSHConfig(
            host=str(said.get("hostname", self.host)),
            port=port,
            user=self.user,
            jump=jump,
            command_timeout=self.timeouts.command,
            **common,
        )


def split_hostspec(spec: str) -> tuple[Optional[str], str, int]:
    """``"user@host:port"`` -> (user, host, port); user and port optional (port 22)."""
    user, _, rest = spec.rpartition("@")
    host, port = rest, 22
    if rest.startswith("["):  # [ipv6]:port
        host, _, tail = rest[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") else 22
    elif rest.count(":") == 1:
        host, p = rest.split(":")
        port = int(p)
    return (user or None), host, port


# --------------------------------------------------------------------------------------------------
# Schema: one table of keys, each with a checker that returns the value or raises Bad(expected).
# --------------------------------------------------------------------------------------------------


def _host(v: Any) -> str:
    s = _str(v)
    if any(c.isspace() for c in s) or s.startswith("-"):
        raise Bad("a host name or IP address (no spaces, not starting with '-')")
    return s


def _user(v: Any) -> str:
    s = _str(v)
    if not re.fullmatch(r"[A-Za-z0-9._][A-Za-z0-9._-]*", s):
        raise Bad("a user name (letters, digits, '.', '_', '-')")
    return s


def _port(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
        raise Bad("an integer port between 1 and 65535")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise Bad("true or false")
    return v


def _pos_number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise Bad("a positive number of seconds")
    return float(v)


def _version(v: Any) -> str:
    # Floats are refused: YAML reads 8.10 as 8.1, so an unquoted version can silently change meaning.
    s = str(v).strip() if isinstance(v, (str, int)) and not isinstance(v, bool) else ""
    if not re.fullmatch(r"\d+(\.\d+){0,3}", s):
        raise Bad('a quoted version string such as "8.6" or "8.6.2"')
    return s


def _cc(v: Any) -> str:
    s = str(v).strip() if isinstance(v, (str, int, float)) and not isinstance(v, bool) else ""
    if not re.fullmatch(r"\d+\.\d", s):
        raise Bad('a compute capability such as "8.7" (Orin) or "7.2" (Xavier)')
    return s


def _jump(v: Any) -> str:
    s = _str(v)
    if not re.fullmatch(r"(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9.\-_:\[\]]+?(?::\d{1,5})?", s):
        raise Bad('"[user@]host[:port]"')
    return s


def _work_dir(v: Any) -> str:
    s = _str(v)
    if s.startswith("~"):
        raise Bad("a path relative to the remote home (e.g. edgeq) or absolute; '~' is not expanded")
    if "\0" in s or "\n" in s:
        raise Bad("a path without NUL or newline characters")
    return s


def _local_path(v: Any) -> Path:
    return Path(os.path.expandvars(_str(v))).expanduser()


def _backend(v: Any) -> str:
    s = _str(v)
    if s not in BACKENDS:
        raise Bad(f"one of {', '.join(BACKENDS)}")
    return s


def _workspace(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise Bad("a positive integer number of MiB (as trtexec --memPoolSize=workspace:N)")
    return v


def _dla_core(v: Any) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise Bad("null or a DLA core index (0 or 1 on Orin AGX / Xavier)")
    return v


def _tactics(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list):
        raise Bad("a list such as [-CUBLAS, -CUBLAS_LT, -CUDNN]")
    out = []
    for item in v:
        s = str(item).strip()
        if len(s) < 2 or s[0] not in "+-" or s[1:].upper() not in TACTIC_SOURCES:
            raise Bad(f"entries +NAME or -NAME with NAME one of {', '.join(TACTIC_SOURCES)} (got {item!r})")
        out.append(s[0] + s[1:].upper())
    return tuple(out)


def _names(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise Bad("a list of ONNX node names")
    return tuple(v)


def _policy(v: Any) -> str:
    s = _str(v)
    known = _known_policies()
    if s not in known:
        raise Bad(f"one of {', '.join(sorted(known))}")
    return s


def _known_policies() -> set[str]:
    from edgeq.report.policy import POLICIES

    return set(POLICIES)


TOP: dict[str, Checker] = {
    "host": _host,
    "port": _port,
    "user": _user,
    "identity_file": _local_path,
    "use_agent": _bool,
    "known_hosts": _local_path,
    "jump_host": _jump,
    "work_dir": _work_dir,
    "python": _str,
    "tensorrt": _version,
    "gpu": SECTION,  # section
    "build": SECTION,  # section
    "backend": _backend,
    "trtexec": _str,
    "timeouts": SECTION,  # section
    "gate": SECTION,  # section
    "description": _str,
    "example": _bool,  # a file from the edgeq repository naming no real board: targets list says so
}
SECTIONS: dict[str, dict[str, Checker]] = {
    "gpu": {"name": _str, "compute_capability": _cc},
    "build": {
        "workspace": _workspace,
        "fp16": _bool,
        "tactic_sources": _tactics,
        "timing_cache": _bool,
        "dla_core": _dla_core,
        "allow_gpu_fallback": _bool,
    },
    "timeouts": {
        "connect": _pos_number,
        "command": _pos_number,
        "build": _pos_number,
        "profile": _pos_number,
    },
    "gate": {"policy": _policy, "allow": _names, "require_fusion": _bool},
}
REQUIRED = ("host", "user")
NULLABLE = ("jump_host", "identity_file", "tensorrt", "dla_core", "workspace")


def _check_mapping(
    path: Path, data: Mapping[str, Any], table: dict[str, Checker], where: str
) -> dict[str, Any]:
    return check_mapping(path, data, table, where, SECTIONS, NULLABLE)


def gate_from_dict(path: Path, data: Mapping[str, Any]) -> Optional[GateConfig]:
    """The ``gate:`` section of a target or pipeline file: the one reader of that section, so
    ``deploy --pipeline`` and ``edgeq run`` accept and refuse the same gates, with the same messages."""
    v = _check_mapping(path, {k: data[k] for k in ("gate",) if k in data}, {"gate": SECTION}, "")
    gate = v.get("gate")
    return GateConfig(**gate) if gate is not None else None


def target_from_dict(data: Any, path: Path, name: Optional[str] = None) -> Target:
    """Validate a parsed target file; every problem is one ConfigError naming file and key."""
    path = Path(path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: a target file must be a YAML mapping (host: ..., user: ...)")
    v = _check_mapping(path, data, TOP, "")
    if v.get("host") == LOCAL_HOST:  # this machine: no SSH keys, user or jump host
        ssh_only = [k for k in ("user", "port", "identity_file", "use_agent", "known_hosts", "jump_host")
                    if k in v]
        if ssh_only:
            raise ConfigError(f"{path}: '{ssh_only[0]}' has no meaning with 'host: local' (no SSH)",
                              f"remove '{ssh_only[0]}', or give the machine's SSH host name")  # fmt: skip
        v["user"] = "local"
    for key in REQUIRED:
        if key not in v:
            raise ConfigError(f"{path}: missing required key '{key}'", f"add '{key}: ...' to the target file")
    identity = v.get("identity_file")
    use_agent = v.get("use_agent", False)
    if identity is None and not use_agent and v["host"] != LOCAL_HOST:
        raise ConfigError(
            f"{path}: no SSH credentials: set 'identity_file' or 'use_agent: true'",
            "edgeq uses key authentication only (no passwords)",
        )
    build = BuildOptions(**v.get("build", {}))
    gpu = v.get("gpu", {})
    gate = v.get("gate")
    timeouts = Timeouts(**v.get("timeouts", {}))
    kwargs: dict[str, Any] = {
        k: v[k]
        for k in ("host", "user", "port", "jump_host", "work_dir", "python", "tensorrt", "backend", "trtexec",
                  "example")
        if k in v
    }
    if "known_hosts" in v:
        kwargs["known_hosts"] = v["known_hosts"]
    return Target(
        name=name or path.stem,
        path=path,
        identity_file=identity,
        use_agent=use_agent,
        gpu_name=gpu.get("name"),
        compute_capability=gpu.get("compute_capability"),
        build=build,
        timeouts=timeouts,
        gate=GateConfig(**gate) if gate is not None else None,
        keys=tuple(v),
        **kwargs,
    )


def load_target(path: Path, name: Optional[str] = None) -> Target:
    return target_from_dict(read_yaml(path), Path(path), name)


def _is_path_spec(spec: str) -> bool:
    """``--target`` is a path when it has a slash or a YAML suffix, otherwise a name under targets/."""
    return "/" in spec or os.sep in spec or spec.endswith((".yaml", ".yml"))


def target_path(spec: str, cwd: Optional[Path] = None) -> Path:
    """Where ``--target SPEC`` points: a path, or ``targets/SPEC.yaml`` under ``cwd``."""
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    if _is_path_spec(spec):
        p = Path(spec).expanduser()
        return p if p.is_absolute() else cwd / p
    return cwd / TARGETS_DIR / f"{spec}.yaml"


def resolve_target(spec: str, cwd: Optional[Path] = None) -> Target:
    """Load the target ``--target SPEC`` names, or say where it looked and what exists."""
    path = target_path(spec, cwd)
    if not path.is_file():
        names = [p.stem for p in list_target_files(cwd)]
        near = difflib.get_close_matches(spec, names, n=1)
        hint = (
            f"did you mean '{near[0]}'?"
            if near
            else f"available: {', '.join(names)}"
            if names
            else f"create {TARGETS_DIR}/{spec}.yaml (see the examples in the edgeq repository's targets/)"
        )
        raise ConfigError(f"target '{spec}' not found: no file {path}", hint)
    return load_target(path, None if _is_path_spec(spec) else spec)


def list_target_files(cwd: Optional[Path] = None) -> list[Path]:
    d = (Path(cwd) if cwd is not None else Path.cwd()) / TARGETS_DIR
    return sorted(p for p in [*d.glob("*.yaml"), *d.glob("*.yml")] if p.is_file()) if d.is_dir() else []


def version_matches(expected: str, actual: Optional[str]) -> bool:
    """``"8.6"`` matches ``"8.6.2.3"``: compare the components the target file gives."""
    if not actual:
        return False
    want = expected.split(".")
    have = actual.split(".")
    return have[: len(want)] == want
