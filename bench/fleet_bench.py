"""Fleet concurrency: ``edgeq fleet validate``'s targets half on 8 loopback targets vs on 1.

    python bench/fleet_bench.py [--targets 8] [--rounds 3]

Starts N throw-away sshd instances on 127.0.0.1 (tests/sshd.py), each a target whose trtexec replays the
recorded TensorRT 8.6.0 ResNet-50 build and run (tests/fleet_helpers.py), prepares a small Q/DQ model
once, then times ``validate_prepared`` (upload, probe, build, inspect, profile, report, gate on every
target, bounded workers) on 1 target and on N. Builds are excluded: the stand-in replays a build log
instead of building, and the build stage's seconds are subtracted (per run, the slowest target's).
Prints seconds per round and the N/1 ratio of the medians (goal <= 1.5); edgeq's own CPU seconds per
board (``time.process_time`` of this process, all its threads: the host's share, which grows with the
fleet on real hardware where the boards build in parallel); and the SSH connections opened per board per
run (counted in the transport, ``edgeq.remote.ssh.connections_opened``; goal: one).
Each round uses fresh remote work dirs, so every upload is a real one. On loopback the N "targets"
share this machine's cores: each agent call starts two Python processes there (agent, trtexec
stand-in), work a real fleet does on N separate boards; read the ratio with the core count beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fleet_helpers import make_members, qdq_model, reformat_layer, start_servers  # noqa: E402
from sshd import sshd_available  # noqa: E402

from edgeq.orchestration.fleet import FleetOptions, validate_prepared  # noqa: E402
from edgeq.orchestration.fleet_file import Fleet  # noqa: E402
from edgeq.pipeline.stages import ProfileSettings, prepare_host  # noqa: E402
from edgeq.quant.quantize import QuantizeOptions  # noqa: E402
from edgeq.remote.ssh import connections_opened  # noqa: E402
from edgeq.remote.targets import target_from_dict  # noqa: E402

HOST_CPU: dict[int, float] = {}  # edgeq's own CPU seconds (all its threads) per fleet size, all rounds
TARGET_CPU: dict[int, float] = {}  # the loopback targets' CPU seconds (sshd sessions, agents), likewise
CONNECTIONS: dict[int, list[int]] = {}  # SSH connections opened per board per run, per fleet size


def _target_cpu(servers: list) -> float:
    """CPU seconds of the sshd listeners and every session they reaped (/proc/PID/stat fields 14-17)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for s in servers:
        fields = Path(f"/proc/{s.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in fields[11:15])
    return total / tick


def _round(
    root: Path, servers: list, n: int, prepared, model: Path, allow: str, tag: str
) -> tuple[float, float]:
    """(wall seconds, the slowest target's build seconds) of one targets half on the first ``n`` servers."""
    members = make_members(root / tag, servers[:n])
    targets = tuple(
        target_from_dict(m.target_dict(gate={"allow": [allow]}), root / f"{m.name}.yaml", m.name)
        for m in members
    )
    fleet_dir = root / tag / "fleet"
    fleet_dir.mkdir(parents=True)
    options = FleetOptions(profile=ProfileSettings(duration=0), cache_dir=root / "agent", workers=n)
    opened = connections_opened()
    started, cpu, remote = time.perf_counter(), time.process_time(), _target_cpu(servers)
    result = validate_prepared(
        model, prepared, Fleet(root / "fleet.yaml", targets, n, "edgeq"), fleet_dir, options
    )
    wall = time.perf_counter() - started
    HOST_CPU[n] = HOST_CPU.get(n, 0.0) + time.process_time() - cpu
    now = connections_opened()
    CONNECTIONS.setdefault(n, []).extend(
        now.get(d, 0) - opened.get(d, 0) for d in (f"{t.user}@{t.host}:{t.port}" for t in targets)
    )
    time.sleep(0.2)  # the last sessions exit and are reaped
    TARGET_CPU[n] = TARGET_CPU.get(n, 0.0) + _target_cpu(servers) - remote
    if not result.passed:
        raise SystemExit(f"round {tag}: not every target passed: {[r.error for r in result.rows]}")
    import json

    builds = [
        next(s["seconds"] for s in json.loads(Path(r.run_dir, "stages.json").read_text())["stages"]
             if s["name"] == "build")
        for r in result.rows
    ]  # fmt: skip
    return wall, max(builds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    reason = sshd_available()
    if reason:
        raise SystemExit(reason)
    servers = start_servers(args.targets)
    try:
        with tempfile.TemporaryDirectory(prefix="edgeq-fleet-bench-") as tmp:
            root = Path(tmp)
            model = qdq_model(root / "net.onnx")
            prepared = prepare_host(model, root / "host", QuantizeOptions())
            allow = reformat_layer()
            one, many = [], []
            for i in range(args.rounds):  # interleaved, so machine load hits both alike
                w1, b1 = _round(root, servers, 1, prepared, model, allow, f"r{i}-1")
                wn, bn = _round(root, servers, args.targets, prepared, model, allow, f"r{i}-n")
                one.append(w1 - b1)
                many.append(wn - bn)
                print(
                    f"round {i + 1}: 1 target {w1:.2f} s (build {b1:.2f} s), "
                    f"{args.targets} targets {wn:.2f} s (build {bn:.2f} s)"
                )
            m1, mn = statistics.median(one), statistics.median(many)
            r, n, cores = args.rounds, args.targets, os.cpu_count() or 1
            host1, hostn, tgt1, tgtn = HOST_CPU[1] / r, HOST_CPU[n] / r, TARGET_CPU[1] / r, TARGET_CPU[n] / r
            print(f"CPU per round, edgeq: 1 target {host1:.2f} s, {n} targets {hostn:.2f} s; per board: "
                  f"{host1:.2f} s at 1, {hostn / n:.2f} s at {n}")
            for size in (1, n):
                per = CONNECTIONS[size]
                print(f"SSH connections per board per run at {size}: min {min(per)}, max {max(per)}, "
                      f"mean {statistics.mean(per):.2f} (goal 1)")
            print(
                f"CPU per round, loopback targets (sshd, agents, trtexec stand-in): 1 target {tgt1:.2f} s,"
                f" {n} targets {tgtn:.2f} s; all on this machine's {cores} cores, so {n} targets cannot take "
                f"less than {(hostn + tgtn) / cores:.2f} s here"
            )
            print(
                f"builds excluded, median: 1 target {m1:.2f} s, {args.targets} targets {mn:.2f} s; "
                f"ratio {mn / m1:.2f} (goal <= 1.5)"
            )
    finally:
        for s in servers:
            s.close()


if __name__ == "__main__":
    main()
