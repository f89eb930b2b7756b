"""Paired re-timing: engines already built, timed in alternation on one target.

One trtexec timing of an engine moves by a few percent from process to process on the same GPU: the
explicit and implicit engines of tests/fixtures/trt86-h100-placed have the same layers and precisions,
yet their single timings differ by 0.99x-1.03x, and edgeq tune's R50 b8 record
(tests/fixtures/trt86-h100-tune/single/r50b8.tune.json) saw 2032-2139 qps for engines of one design. A search
that keeps whatever timed faster once follows that noise. Timed in alternation (A B, B A, A B ...) in
one session, each round's ratio sees the same clocks and temperature, and the median over the rounds
is a figure a decision can rest on. Only the latency run: no per-layer profile (``--exportProfile``
left out), which would double the time and tell a decision nothing; and by default no host<->device
copies (``--noDataTransfers``): two engines of one model copy the same bindings, and at batch 8 those
copies (39 MB of input for a 640x640 YOLO) take longer than the engine and move with the PCIe bus, not
with the placement (tests/fixtures/trt86-h100-placed: YOLO's GPU compute 0.87 ms, its end-to-end
throughput 807-925 qps, i.e. 1.1-1.2 ms a query, for engines with the same layers).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from edgeq.errors import RemoteError
from edgeq.findings import ProgressFn, no_progress
from edgeq.pipeline.stages import ProfileSettings, direct_agent, profile
from edgeq.remote.runner import target_runner
from edgeq.remote.targets import Target

if TYPE_CHECKING:
    from edgeq.report.compare import PairDiff


@dataclass(frozen=True)
class Paired:
    """Throughput of each engine in each round (``qps[engine][round]``), timed alternately."""

    names: tuple[str, ...]
    qps: tuple[tuple[float, ...], ...]
    data_transfers: bool = False  # whether the timings include the bindings' host<->device copies

    def median(self, i: int) -> float:
        return statistics.median(self.qps[i])

    def ratio(self, i: int = 1, j: int = 0) -> float:
        """Median over rounds of engine ``i``'s throughput over engine ``j``'s in the same round."""
        return statistics.median(a / b for a, b in zip(self.qps[i], self.qps[j]))

    def to_dict(self) -> dict[str, object]:
        return {"names": list(self.names), "qps": [list(q) for q in self.qps], "rounds": len(self.qps[0]),
                "median_qps": [round(self.median(i), 3) for i in range(len(self.names))],
                "ratio": round(self.ratio(), 4) if len(self.names) == 2 else None,
                "data_transfers": self.data_transfers}  # fmt: skip


def judged_by_rounds(diff: PairDiff, paired: Optional[dict[str, object]]) -> PairDiff:
    """``diff`` with the throughput ratio of ``paired`` (``Paired.to_dict()`` of its two engines): the
    median over the rounds of each round's ratio, the figure the output prints and a decision rests on;
    not the ratio of the two engines' median throughputs, which pairs one round's candidate with another
    round's baseline (YOLOv8n on an H100, tests/fixtures/trt86-h100-paired: rounds 1.166, 0.978 and
    0.973, their median 0.978, where the medians' ratio read 1.051 after a slow first baseline round).
    Unchanged without a paired ratio."""
    import dataclasses

    from edgeq.report.compare import Ratio

    ratio = None if paired is None else paired.get("ratio")
    if paired is None or not isinstance(ratio, (int, float)):
        return diff
    source = f"median of {paired['rounds']} paired rounds"
    return dataclasses.replace(diff, ratio=Ratio(float(ratio), None, source))


def order(engines: int, rounds: int) -> list[int]:
    """Which engine each timing is of: forwards in even rounds, backwards in odd ones (A B B A A B ...),
    so that a drift over the session (a GPU warming up) favours no engine."""
    out: list[int] = []
    for r in range(rounds):
        out += list(range(engines)) if r % 2 == 0 else list(reversed(range(engines)))
    return out


def retime(
    target: Target,
    engines: Sequence[tuple[str, Path]],
    *,
    rounds: int = 3,
    settings: Optional[ProfileSettings] = None,
    data_transfers: bool = False,
    accept_new_host_key: bool = False,
    cache_dir: Optional[Path] = None,
    progress: ProgressFn = no_progress,
) -> Paired:
    """Upload each local engine file (content-addressed: an engine already there is not sent again) and
    time them ``rounds`` times each, alternately. Raises ``RemoteError`` when a timing fails."""
    from edgeq.remote.protocol import agent_cache_dir
    from edgeq.remote.zipapp import build_agent

    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    settings = settings or ProfileSettings()
    times: list[list[float]] = [[] for _ in engines]
    with target_runner(target, accept_new_host_key) as runner:
        cache = target.remote_path("cache")
        agent = direct_agent(runner, target, runner.put(build_agent(cache_dir or agent_cache_dir()).path,
                                                        cache).remote_path)  # fmt: skip
        remote = [runner.put(Path(path), cache).remote_path for _, path in engines]
        plan = order(len(engines), rounds)
        for n, i in enumerate(plan):
            progress("re-timing", n, len(plan))
            timed = profile(agent, target, remote[i], None, settings, data_transfers=data_transfers)
            qps = timed.get("throughput_qps")
            if not qps:
                raise RemoteError(f"re-timing {engines[i][0]} on {target.name}: no throughput in the reply",
                                  "see the target's trtexec output")  # fmt: skip
            times[i].append(float(qps))
        progress("re-timing", len(plan), len(plan))
    return Paired(tuple(name for name, _ in engines), tuple(tuple(q) for q in times), data_transfers)
