"""Loopback fleets for the fleet, release and run tests (and bench/fleet_bench.py).

Each target is its own real OpenSSH sshd on 127.0.0.1 (its own port, host key and client key) whose
"trtexec" is a stand-in replaying the recorded TensorRT 8.6.0 ResNet-50 build and run
(tests/trtexec_replay.py, tests/fixtures/trt86-h200/resnet50_ortfb.explicit.*): they prove the
orchestration (SSH, concurrency, files, matrix), not TensorRT.
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from trtexec_replay import Recorded, replay_trtexec

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "trt86-h200"
ORTFB = "resnet50_ortfb.explicit"


@dataclass
class Member:
    name: str
    server: Any  # sshd.SshdServer
    trtexec: Path
    work_dir: Path

    def target_dict(self, **extra: Any) -> dict[str, Any]:
        return {
            "host": self.server.host,
            "port": self.server.port,
            "user": self.server.user,
            "identity_file": str(self.server.identity_file),
            "known_hosts": str(self.server.known_hosts),
            "work_dir": str(self.work_dir),
            "python": sys.executable,
            "tensorrt": "8.6",
            "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0"},  # the recordings' GPU
            "backend": "trtexec",
            "trtexec": str(self.trtexec),
            "timeouts": {"connect": 10, "command": 60},
            **extra,
        }


def reformat_layer() -> str:
    """The one layer the recorded engine runs against the int8 gate (an interior reformat)."""
    from edgeq.orchestration.deploy import policy_for
    from edgeq.pipeline.stages import report_and_gate
    from edgeq.remote.targets import target_from_dict

    t = target_from_dict({"host": "h", "user": "u", "use_agent": True}, Path("t.yaml"))
    _, gate = report_and_gate(FIXTURES / f"{ORTFB}.layers.json", None, None, policy_for(t))
    (v,) = gate.violations
    return v.layer_name


def make_members(root: Path, servers: list[Any], sleep: float = 0.0, slow: dict[str, float] | None = None
                 ) -> list[Member]:
    members = []
    for i, server in enumerate(servers):
        name = f"board{i + 1}"
        bin_dir = root / f"bin-{name}"
        bin_dir.mkdir(parents=True, exist_ok=True)
        trtexec = replay_trtexec(
            bin_dir, build=Recorded(FIXTURES / f"{ORTFB}.build.log"),
            run=Recorded(FIXTURES / f"{ORTFB}.run.log"),
            layers=FIXTURES / f"{ORTFB}.layers.json", profile=FIXTURES / f"{ORTFB}.profile.json",
            sleep=(slow or {}).get(name, sleep),
        )  # fmt: skip
        members.append(Member(name, server, trtexec, root / f"remote-{name}"))
    return members


def qdq_model(path: Path) -> Path:
    """A small explicit-INT8 model as onnxruntime quantizes it (float biases: TensorRT 8.6 parses it)."""
    from edgeq import zoo

    onnx.save(zoo.qdq_ort(zoo.resnet_like(size=32, width=8), quantize_bias=False), str(path))
    return path


def start_servers(n: int) -> list[Any]:
    """``n`` real sshd instances on 127.0.0.1, each on its own port with its own keys."""
    from sshd import SshdServer

    return [SshdServer().start() for _ in range(n)]


def write_fleet(root: Path, members: list[Member], allow: str) -> Path:
    """targets/<board>.yaml for each member (allowlisting ``allow``) and fleet.yaml listing them by glob."""
    import yaml

    (root / "targets").mkdir(exist_ok=True)
    for m in members:
        text = yaml.safe_dump(m.target_dict(gate={"allow": [allow]}))
        (root / "targets" / f"{m.name}.yaml").write_text(text)
    fleet = root / "fleet.yaml"
    fleet.write_text("workers: 8\ntargets:\n  - targets/board*.yaml\n")
    return fleet


def builds(member: Member) -> int:
    """How many engine builds the board's trtexec stand-in was asked for."""
    from trtexec_replay import calls

    return sum(any(a.startswith("--onnx=") for a in argv) for argv in calls(member.trtexec))


def make_bundle(root: Path, name: str, *, created: str, qps: dict[str, float] | None = None,
                engine_mib: int = 6, cc: str = "9.0", trt: str = "8.6.0", gpu: str = "NVIDIA H200"
                ) -> tuple[Path, str]:
    """``edgeq release --from`` (``build_bundle``) a fleet directory written here: one kind, three boards,
    each row's recorded qps from ``qps`` (default 1200), the engine ``engine_mib`` MiB of seeded random
    bytes (the loopback boards' trtexec replays the recorded run whatever it loads). Returns the bundle's
    path and the version it installs as."""
    fleet = root / f"fleet-{name}"
    (fleet / "host").mkdir(parents=True)
    model = qdq_model(fleet / "host" / "net.int8.onnx")
    src = root / "net.onnx"
    if not src.exists():
        src.write_bytes(model.read_bytes())
    kind = f"sm{cc}-trt{trt}"
    rows = []
    for i, board in enumerate(("board1", "board2", "board3")):
        d = fleet / "targets" / board
        d.mkdir(parents=True)
        engine = random.Random(f"{name}-{board}").randbytes(engine_mib << 20)
        (d / "engine.plan").write_bytes(engine)
        (d / "probe.json").write_text(json.dumps({"tensorrt": {"version": trt},
                                                  "gpus": [{"name": gpu, "compute_capability": cc}]}))
        rows.append({"target": board, "status": "passed", "kind": kind, "build": "ok" if i == 0 else "reused",
                     "gate": True, "gpu": gpu, "compute_capability": cc, "latency_p50_ms": 1.0,
                     "latency_p99_ms": 2.0, "throughput_qps": (qps or {}).get(board, 1200.0)})  # fmt: skip
    (fleet / "fleet.json").write_text(json.dumps({
        "passed": True, "created": created, "edgeq": "0.1.0", "model": str(src), "source_sha256": "ab" * 32,
        "model_file": "host/net.int8.onnx", "cache_file": None, "targets": rows,
    }))  # fmt: skip
    out = root / f"{name}.tar.gz"
    from edgeq.orchestration.install import release_version
    from edgeq.release.bundle import build_bundle

    return out, release_version(build_bundle(fleet, out))


class SilentPeer:
    """A board that is there but never speaks SSH: a TCP listener on 127.0.0.1 (never another address).

    ``banner`` (the default): every connection is accepted and held open, and nothing is ever sent, as by
    a hung sshd; ``accepted`` is set once edgeq's connection is in (it waits for the SSH banner then).
    ``syn``: the listen queue is kept full (backlog 0, filled by a connection of our own that is never
    accepted), so the kernel drops edgeq's SYNs and its TCP connect waits; ``connecting()`` says when it
    does (a SYN_SENT socket to the port, from /proc/net/tcp)."""

    def __init__(self, mode: str = "banner") -> None:
        import socket
        import threading

        self.mode = mode
        self.accepted = threading.Event()
        self._held: list[Any] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        if mode == "syn":
            self._sock.listen(0)
            filler = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            self._held.append(filler)
        else:
            self._sock.listen(16)
            threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            self._held.append(conn)
            self.accepted.set()

    def connecting(self) -> bool:
        """A socket of this machine in SYN_SENT to our port: a TCP connect waiting on the full queue."""
        want = f"0100007F:{self.port:04X}"
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[2] == want and fields[3] == "02":  # rem_address, st (02: SYN_SENT)
                return True
        return False

    def target_dict(self, root: Path, connect: float) -> dict[str, Any]:
        """A target file for this peer (a client key of its own under ``root``: the key file is checked
        before any connection), with a ``connect`` timeout of its own."""
        from sshd import keygen

        key = root / "id_silent"
        if not key.exists():
            keygen(key)
        return {"host": "127.0.0.1", "port": self.port, "user": "nobody", "identity_file": str(key),
                "known_hosts": str(root / "known_hosts_silent"), "work_dir": str(root / "remote-silent"),
                "python": sys.executable, "tensorrt": "8.6", "backend": "trtexec",
                "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0"},
                "timeouts": {"connect": connect, "command": 60}}  # fmt: skip

    def close(self) -> None:
        for s in (*self._held, self._sock):
            with contextlib.suppress(OSError):
                s.close()
