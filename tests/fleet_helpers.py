"""Loopback fleets for the fleet, release and run tests (and bench/fleet_bench.py).

Each target is its own real OpenSSH sshd on 127.0.0.1 (its own port, host key and client key) whose
"trtexec" is a stand-in replaying the recorded TensorRT 8.6.0 ResNet-50 build and run
(tests/trtexec_replay.py, tests/fixtures/trt86-h200/resnet50_ortfb.explicit.*): they prove the
orchestration (SSH, concurrency, files, matrix), not TensorRT.
"""

from __future__ import annotations

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
