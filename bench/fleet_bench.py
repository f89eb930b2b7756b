"""Fleet concurrency: ``edgeq fleet validate``'s targets half, and ``release install`` / ``rollback``, on 8
loopback targets vs on 1.

    python bench/fleet_bench.py [--targets 8] [--rounds 3] [--part all|validate|install] [--engine-mib 8]

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

``--part engines``: ``validate_prepared`` on all ``--targets`` boards with each engine, edgeq's own workers
(``--engine native``) and an Ansible play (``--engine ansible``: ansible-runner, ansible-playbook, one
worker process a board), at each ``--forks`` (the native engine's workers, Ansible's forks): wall seconds,
and the host's CPU seconds per board: this process's for native, this process's plus ansible-playbook's
whole process tree's (its workers, their ssh clients; reaped children, ``RUSAGE_CHILDREN``) for Ansible.
Builds are not excluded here (the stand-in's replay takes milliseconds). The loopback boards' own CPU
(sshd sessions, agents, trtexec stand-ins) is printed apart: on a real fleet it is the boards'.

``--part install``: a bundle made as the tests make it (tests/fleet_helpers.make_bundle: ``build_bundle``
of a fleet directory, an ``--engine-mib`` engine of random bytes), v1 installed on fresh boards (untimed),
then timed: ``install`` of v2 (upload, sha256 on the board, unpack, inspect + profile + gate from
``releases/<version>/``, switch) and ``rollback`` (back to v1), on 1 board and on N; wall seconds,
edgeq's CPU seconds per board and SSH connections per board for each.
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

from fleet_helpers import make_bundle, make_members, qdq_model, reformat_layer, start_servers  # noqa: E402
from sshd import sshd_available  # noqa: E402

from edgeq.orchestration.fleet import FleetOptions, validate_prepared  # noqa: E402
from edgeq.orchestration.fleet_file import Fleet  # noqa: E402
from edgeq.orchestration.install import FleetAction, InstallOptions, install, rollback  # noqa: E402
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


def _fleet(root: Path, servers: list, n: int, allow: str, tag: str) -> Fleet:
    """The first ``n`` servers as a fleet, each with a fresh remote work dir."""
    members = make_members(root / tag, servers[:n])
    targets = tuple(
        target_from_dict(m.target_dict(gate={"allow": [allow]}), root / f"{m.name}.yaml", m.name)
        for m in members
    )
    return Fleet(root / "fleet.yaml", targets, n, "edgeq")


def _timed(fleet: Fleet, options: InstallOptions, bundle: Path | None, servers: list
           ) -> tuple[float, tuple[float, float], list[int], FleetAction]:  # fmt: skip
    """(wall seconds, (edgeq's, the loopback boards') CPU seconds, SSH connections per board, result) of
    ``install`` of ``bundle``, or of ``rollback`` (``bundle`` None)."""
    opened = connections_opened()
    started, cpu, remote = time.perf_counter(), time.process_time(), _target_cpu(servers)
    result = rollback(fleet, options) if bundle is None else install(bundle, fleet, options)
    wall, used = time.perf_counter() - started, time.process_time() - cpu
    time.sleep(0.2)  # the last sessions exit and are reaped
    boards = _target_cpu(servers) - remote
    now = connections_opened()
    conns = [now.get(d, 0) - opened.get(d, 0) for d in (f"{t.user}@{t.host}:{t.port}" for t in fleet.targets)]
    if not result.passed:
        raise SystemExit(f"{result.action}: not every board passed: {[r.error for r in result.rows]}")
    return wall, (used, boards), conns, result


def install_bench(root: Path, servers: list, n: int, rounds: int, engine_mib: int) -> None:
    """``release install`` (v1 -> v2) and ``rollback`` (v2 -> v1) on 1 board and on ``n``."""
    allow = reformat_layer()
    v1, name1 = make_bundle(root, "v1", created="2026-01-01T00:00:00Z", engine_mib=engine_mib)
    v2, name2 = make_bundle(root, "v2", created="2026-02-01T00:00:00Z", engine_mib=engine_mib)
    wall: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], float] = {}
    board_cpu: dict[tuple[str, int], float] = {}
    conns: dict[tuple[str, int], list[int]] = {}
    for i in range(rounds):  # interleaved, so machine load hits both alike
        said = []
        for size in (1, n):
            fleet = _fleet(root, servers, size, allow, f"i{i}-{size}")
            options = InstallOptions(profile=ProfileSettings(duration=0), cache_dir=root / "agent",
                                     workers=size)  # fmt: skip
            _timed(fleet, options, v1, servers)  # what the boards run before: untimed
            for action, bundle in (("install", v2), ("rollback", None)):
                w, (c, b), per, result = _timed(fleet, options, bundle, servers)
                want = name2 if action == "install" else name1
                if any(r.version != want for r in result.rows):
                    raise SystemExit(f"{action}: boards not on {want}: {[r.version for r in result.rows]}")
                wall.setdefault((action, size), []).append(w)
                cpu[(action, size)] = cpu.get((action, size), 0.0) + c
                board_cpu[(action, size)] = board_cpu.get((action, size), 0.0) + b
                conns.setdefault((action, size), []).extend(per)
                said.append(f"{action} on {size}: {w:.2f} s")
        print(f"round {i + 1}: " + ", ".join(said))
    for action in ("install", "rollback"):
        m1, mn = statistics.median(wall[(action, 1)]), statistics.median(wall[(action, n)])
        what = f"v1 -> v2, {engine_mib} MiB engine uploaded, checked and timed on the board" \
            if action == "install" else "v2 -> v1"
        print(f"{action} ({what}), wall median: 1 board {m1:.2f} s, {n} boards {mn:.2f} s; "
              f"ratio {mn / m1:.2f}")
        print(f"  edgeq CPU per board: {cpu[(action, 1)] / rounds:.3f} s at 1, "
              f"{cpu[(action, n)] / rounds / n:.3f} s at {n}; the loopback boards' (sshd, agent, trtexec "
              f"stand-in, on this machine's {os.cpu_count()} cores): {board_cpu[(action, n)] / rounds:.2f} s "
              f"for {n}")
        for size in (1, n):
            per = conns[(action, size)]
            print(f"  SSH connections per board at {size}: min {min(per)}, max {max(per)} (goal 1)")


def _host_cpu() -> float:
    """CPU seconds of this process (all threads) and of every child it reaped (ansible-playbook's tree)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def engines_bench(root: Path, servers: list, n: int, forks: list[int], rounds: int) -> None:
    """``validate_prepared`` on ``n`` boards with each engine at each fork count: wall and host CPU."""
    model = qdq_model(root / "net.onnx")
    prepared = prepare_host(model, root / "host", QuantizeOptions())
    allow = reformat_layer()
    figures: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for i in range(rounds):
        for f in forks:
            for engine in ("native", "ansible"):  # interleaved, so machine load hits both alike
                tag = f"e{i}-{engine}-{f}"
                fleet = _fleet(root, servers, n, allow, tag)
                fleet_dir = root / tag / "fleet"
                fleet_dir.mkdir(parents=True)
                options = FleetOptions(profile=ProfileSettings(duration=0), cache_dir=root / "agent",
                                       workers=f, engine=engine)  # fmt: skip
                started, cpu, remote = time.perf_counter(), _host_cpu(), _target_cpu(servers)
                result = validate_prepared(model, prepared, fleet, fleet_dir, options)
                wall, used = time.perf_counter() - started, _host_cpu() - cpu
                time.sleep(0.2)  # the last sessions exit and are reaped
                boards = _target_cpu(servers) - remote
                if not result.passed:
                    raise SystemExit(f"{tag}: not every board passed: {[r.error for r in result.rows][:3]}")
                figures.setdefault((engine, f), []).append((wall, used, boards))
                print(f"round {i + 1}, {engine}, forks {f}: {wall:.1f} s wall, host CPU {used / n:.3f} s a "
                      f"board, loopback boards' CPU {boards:.1f} s", flush=True)
    cores = os.cpu_count() or 1
    print(f"{n} boards, {cores} cores (the boards' sshd, agents and trtexec stand-ins share them), median of "
          f"{rounds} round(s):")
    for (engine, f), runs in sorted(figures.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        boards = statistics.median(r[2] for r in runs)
        print(f"  {engine:<8} forks {f:>3}: wall {wall:6.1f} s ({wall / n:.2f} s a board), host CPU "
              f"{cpu / n:.3f} s a board ({cpu:.1f} s in all), loopback boards' CPU {boards:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--part", choices=("all", "validate", "install", "engines"), default="all")
    ap.add_argument("--forks", default="16,64", help="engines: the workers / Ansible forks to run at")
    ap.add_argument("--engine-mib", type=int, default=8, help="the bundle's engine size (install)")
    args = ap.parse_args()
    reason = sshd_available()
    if reason:
        raise SystemExit(reason)
    servers = start_servers(args.targets)
    try:
        with tempfile.TemporaryDirectory(prefix="edgeq-fleet-bench-") as tmp:
            root = Path(tmp)
            if args.part == "engines":
                forks = [int(f) for f in args.forks.split(",")]
                engines_bench(root, servers, args.targets, forks, args.rounds)
                return
            if args.part in ("all", "install"):
                install_bench(root, servers, args.targets, args.rounds, args.engine_mib)
            if args.part == "install":
                return
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
