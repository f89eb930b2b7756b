"""Upload throughput to a loopback OpenSSH sshd: edgeq's put_cached vs OpenSSH's own sftp and scp.

    python bench/transfer_bench.py [--size-mb 200] [--rounds 3]

Starts a throw-away sshd on 127.0.0.1 (tests/sshd.py), writes a random file, and in each round uploads
it with edgeq (connect + key lookup + SFTP upload, the local sha256 on a helper thread meanwhile + sha256
verified by the target + atomic rename + key record), with
``sftp -b`` and with ``scp`` (same key, same known_hosts, each a fresh connection). Prints MB/s per
tool (best and median of the rounds) and edgeq's ratio to each; the target is >= 0.9. Also times an
unchanged redeploy, which must send 0 bytes. Timings on a shared machine are noisy: rounds interleave
the tools so that load hits all of them alike.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from sshd import SshdServer, sshd_available  # noqa: E402

from edgeq.remote.transport import Connection  # noqa: E402


def _write_random(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 8 << 20)
            f.write(os.urandom(n))
            left -= n


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    reason = sshd_available()
    if reason:
        print(f"skipped: {reason}")
        return 0
    for tool in ("sftp", "scp"):
        if shutil.which(tool) is None:
            print(f"skipped: {tool} not found (openssh-client)")
            return 0

    work = Path(tempfile.mkdtemp(prefix="edgeq-transfer-bench-"))
    try:
        src = work / "model.onnx"
        size = args.size_mb * 1_000_000
        _write_random(src, size)
        src.read_bytes()  # page cache: every tool reads from memory alike
        remote = work / "remote"
        remote.mkdir()
        times: dict[str, list[float]] = {"edgeq": [], "sftp": [], "scp": []}
        with SshdServer() as server:
            opts = server.ssh_options()
            cfg = server.ssh_config(retries=0)

            phase: list[float] = []

            def edgeq_put() -> None:
                marks: list[float] = []

                def progress(task: str, done: int, total: int | None) -> None:
                    if task.startswith("upload"):
                        marks.append(time.perf_counter())

                with Connection(cfg) as conn:
                    up = conn.put_cached(src, str(remote / "cache"), progress=progress)
                assert up.bytes_sent == size and not up.cached, up
                phase.append(marks[-1] - marks[0])  # the SFTP transfer alone, without hashing either end

            def ssh_true() -> None:
                subprocess.run(["ssh", *opts, server.host, "true"], check=True)

            def sftp_put() -> None:
                batch = f'put "{src}" "{remote / "sftp.onnx"}"\n'.encode()
                subprocess.run(["sftp", "-q", "-b", "-", *opts, server.host], input=batch, check=True,
                               stdout=subprocess.DEVNULL)  # fmt: skip

            def scp_put() -> None:
                dest = f"{server.host}:{remote / 'scp.onnx'}"
                subprocess.run(["scp", "-q", *opts, str(src), dest], check=True)

            connect = []
            for r in range(args.rounds):
                connect.append(_timed(ssh_true))
                for name, fn in (("edgeq", edgeq_put), ("sftp", sftp_put), ("scp", scp_put)):
                    shutil.rmtree(remote, ignore_errors=True)
                    remote.mkdir()
                    times[name].append(_timed(fn))
                line = "  ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items())
                print(f"round {r + 1}: {line}", flush=True)

            edgeq_put()  # leave one cached copy, then time the redeploy
            with Connection(cfg) as conn:
                t0 = time.perf_counter()
                again = conn.put_cached(src, str(remote / "cache"))
                redeploy = time.perf_counter() - t0
            with Connection(cfg) as conn:
                conn.connect()
                cipher = conn._client.get_transport().local_cipher
    finally:
        shutil.rmtree(work, ignore_errors=True)

    mb = size / 1e6
    print(f"\nupload of {mb:.0f} MB to sshd on 127.0.0.1, {args.rounds} rounds (edgeq cipher: {cipher}; "
          "OpenSSH clients: their defaults)")  # fmt: skip
    print(f"{'tool':8} {'best MB/s':>10} {'median MB/s':>12}")
    best = {k: mb / min(v) for k, v in times.items()}
    med = {k: mb / statistics.median(v) for k, v in times.items()}
    for k in times:
        print(f"{k:8} {best[k]:10.1f} {med[k]:12.1f}")
    for other in ("sftp", "scp"):
        print(f"ratio edgeq/{other}: best {best['edgeq'] / best[other]:.2f}  "
              f"median {med['edgeq'] / med[other]:.2f}  (target >= 0.9)")  # fmt: skip
    print(f"unchanged redeploy: {again.bytes_sent} bytes sent, {redeploy:.2f}s (cached={again.cached})")
    # Where a gap comes from: edgeq hashes the file locally (on a helper thread, from the start) and
    # the target hashes it again after the transfer (the verification); sftp and scp do neither.
    print(f"edgeq SFTP transfer phase alone: best {mb / min(phase):.1f} MB/s, median "
          f"{mb / statistics.median(phase):.1f} MB/s; an OpenSSH connect+auth (ssh true) takes "
          f"{statistics.median(connect):.2f}s of each sftp/scp run")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
