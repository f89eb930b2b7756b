"""``--max-loss X`` on a target: the float regions that keep the task metric within X at the least cost.

``quantize --max-loss`` keeps the regions that recover most float, in that order, until the loss is
within X: accuracy alone decides. On a target two regions that recover alike can cost very differently:
one is a convolution TensorRT runs INT8 in 8 us and the other's float copy needs two reformats around a
large tensor. So each region is weighed by what it recovers (``sensitivity``'s all-but-one score: every
other region INT8, exactly what excluding it buys) against what keeping it float costs there
(``edgeq.quant.float_cost``, priced on the full INT8 engine's profile on that target), and the set kept
float is the cheapest that meets X:

1. every region scored all-but-one and priced (one held-out run each); a single region that meets X on
   its own is an exact answer (that run was its set's score), the cheapest of them the one to beat;
2. a small knapsack on the recovered figures as if they added up (they do not: two regions' losses
   overlap or compound): the cheapest set whose estimate meets X, if it undercuts the best single region,
   scored for real, and topped up while it misses, best recovered-per-cost first, each addition
   re-checked on the combined set;
3. when no set of regions that recover something alone gets there, the fewest regions taken in the
   order they recover (cheapest first among equals) that meet X together: two branches judged by the
   worse of them each recover nothing alone; the size found by doubling and halving, a few held-out runs;
4. then, most expensive first, any region the set no longer needs is dropped (re-checked again).

Every set scored is a point of the trade-off (``Point``: accuracy measured on the host, cost modelled),
which the reports draw against the engines measured on the target.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from edgeq.errors import QuantError
from edgeq.findings import ProgressFn, no_progress

if TYPE_CHECKING:
    from edgeq.quant.float_cost import FloatCost
    from edgeq.quant.metrics import TaskScore
    from edgeq.quant.sensitivity import QdqRegion, Scorer

PriceFn = Callable[[Collection[str]], "FloatCost"]
STEPS = 200  # the knapsack's resolution: the recovery needed in this many parts


@dataclass(frozen=True)
class Point:
    """One set of float regions scored on the held-out set, with its modelled cost."""

    regions: tuple[str, ...]  # region names
    score: TaskScore
    cost: FloatCost
    how: str  # "alone" (all but one), "combined" (a set re-checked), "chosen"

    def to_dict(self) -> dict[str, Any]:
        return {"regions": list(self.regions), "score": self.score.value, "text": self.score.text,
                "cost": self.cost.to_dict(), "how": self.how}  # fmt: skip


@dataclass(frozen=True)
class Candidate:
    """A region with what keeping it float alone buys and costs."""

    region: QdqRegion
    score: TaskScore  # every other region INT8
    cost: FloatCost

    def gain(self, before: TaskScore) -> float:
        return self.score.value - before.value

    def to_dict(self, before: TaskScore) -> dict[str, Any]:
        return {**self.region.to_dict(), "score": self.score.value, "recovered": self.gain(before),
                "cost": self.cost.to_dict()}  # fmt: skip


@dataclass(frozen=True)
class BudgetChoice:
    """The regions kept float under ``--max-loss``, and everything scored to choose them."""

    max_loss: float
    before: TaskScore  # every region INT8
    after: TaskScore  # with ``regions`` float
    regions: tuple[QdqRegion, ...]
    cost: FloatCost
    candidates: tuple[Candidate, ...] = ()  # every region scored, most recovered per cost first
    points: tuple[Point, ...] = ()  # every set scored
    runs: int = 0  # held-out runs it took
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def reached(self) -> bool:
        return meets(self.after, self.max_loss)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n for r in self.regions for n in r.nodes)

    def summary(self) -> str:
        nodes = self.nodes
        shown = ", ".join(nodes[:4]) + (f", ... {len(nodes) - 4} more" if len(nodes) > 4 else "")
        went = (f"{len(self.regions)} region(s) float ({len(nodes)} node(s): {shown}), modelled "
                f"+{self.cost.ms * 1000:.1f} us per inference" if self.regions else "no region float")
        verdict = "reached" if self.reached else "NOT reached"
        loss = f"loss {1 - self.before.value:.4f} -> {1 - self.after.value:.4f}"
        return (f"--max-loss {self.max_loss:g} {verdict}: {went}; {self.before.text} -> {self.after.text} "
                f"({loss}; {self.runs} held-out runs, {len(self.candidates)} regions weighed)")

    def to_dict(self) -> dict[str, Any]:
        return {"max_loss": self.max_loss, "reached": self.reached, "before": self.before.to_dict(),
                "after": self.after.to_dict(), "regions": [r.to_dict() for r in self.regions],
                "nodes": list(self.nodes), "cost": self.cost.to_dict(), "runs": self.runs,
                "candidates": [c.to_dict(self.before) for c in self.candidates],
                "points": [p.to_dict() for p in self.points], "notes": list(self.notes)}  # fmt: skip


def meets(score: TaskScore, max_loss: float) -> bool:
    return 1.0 - score.value <= max_loss + 1e-12


def cheapest_cover(items: Sequence[tuple[float, float]], need: float) -> Optional[list[int]]:
    """Indices of the cheapest items whose gains (``(gain, cost)``, gains > 0) add up to ``need``, or None
    when all of them do not: a 0/1 knapsack with the gains in ``STEPS`` parts of ``need`` (rounded up, so
    an estimate never falls short by rounding)."""
    import math

    if need <= 0:
        return []
    unit = need / STEPS
    best: list[Optional[tuple[float, tuple[int, ...]]]] = [None] * (STEPS + 1)
    best[0] = (0.0, ())
    for i, (gain, cost) in enumerate(items):
        parts = min(STEPS, math.ceil(gain / unit - 1e-9))
        for j in range(STEPS, -1, -1):
            cur = best[j]
            if cur is None:
                continue
            k = min(STEPS, j + parts)
            cand = (cur[0] + cost, (*cur[1], i))
            if best[k] is None or cand[0] < best[k][0] - 1e-15:  # type: ignore[index]
                best[k] = cand
    top = best[STEPS]
    return list(top[1]) if top is not None else None


class _Search:
    """The held-out runs of one choice: each set scored once, every set a point."""

    def __init__(self, scorer: Scorer, price: PriceFn, max_loss: float,
                 known: Mapping[str, TaskScore] | None = None) -> None:
        self.scorer, self.price, self.max_loss = scorer, price, max_loss
        self.points: list[Point] = []
        self._seen: dict[frozenset[str], tuple[TaskScore, FloatCost]] = {}
        self._known = dict(known or {})

    def check(self, regions: Sequence[QdqRegion], how: str = "combined") -> tuple[TaskScore, FloatCost]:
        key = frozenset(r.name for r in regions)
        if key not in self._seen:
            nodes = [n for r in regions for n in r.nodes]
            ran = self._known.get(regions[0].name) if len(regions) == 1 else None
            self._seen[key] = (ran if ran is not None else self.scorer.score(nodes), self.price(nodes))
            self.points.append(Point(tuple(r.name for r in regions), *self._seen[key], how))
        return self._seen[key]

    def ok(self, score: TaskScore) -> bool:
        return meets(score, self.max_loss)


def _cost(c: Candidate) -> float:
    return max(0.0, c.cost.ms)


def choose_within(scorer: Scorer, regions: Sequence[QdqRegion], max_loss: float, price: PriceFn,
                  before: TaskScore, progress: ProgressFn = no_progress,
                  known: Mapping[str, TaskScore] | None = None) -> BudgetChoice:
    """The cheapest set of ``regions`` to keep float so that ``1 - score <= max_loss`` (see the module
    doc); ``before``: the all-INT8 score (already run), ``price``: a node set's modelled cost, ``known``:
    regions' all-but-one scores already run (``edgeq sensitivity``'s), by region name."""
    if not 0.0 <= max_loss < 1.0:
        raise QuantError(f"--max-loss must be in [0, 1), got {max_loss}")
    runs0 = scorer.runs
    nothing = price(())
    if meets(before, max_loss):
        return BudgetChoice(max_loss, before, before, (), nothing, runs=0)
    search = _Search(scorer, price, max_loss, known)
    cands = []
    progress("--max-loss: weighing regions", 0, len(regions))
    for i, r in enumerate(regions):
        score, cost = search.check([r], "alone")
        cands.append(Candidate(r, score, cost))
        progress("--max-loss: weighing regions", i + 1, len(regions))
    by_ratio = sorted(cands, key=lambda c: (-c.gain(before) / (_cost(c) + 1e-9), _cost(c)))
    answers: list[tuple[float, list[QdqRegion], TaskScore]] = []  # (cost, regions, score), each meets X
    singles = [c for c in cands if search.ok(c.score)]
    if singles:
        c = min(singles, key=lambda c: (_cost(c), -c.score.value))
        answers.append((_cost(c), [c.region], c.score))
    paying = [c for c in by_ratio if c.gain(before) > 0]
    need = (1.0 - max_loss) - before.value
    picked = cheapest_cover([(c.gain(before), _cost(c)) for c in paying], need)
    if picked is not None and len(picked) > 1:
        chosen = [paying[i] for i in picked]
        if not answers or sum(_cost(c) for c in chosen) < answers[0][0]:
            answers += _top_up(search, chosen, paying)
    if not answers:  # nothing that recovers alone gets there: the fewest regions in the order they recover
        ranked = sorted(cands, key=lambda c: (-c.score.value, _cost(c)))
        found = _smallest_prefix(search, [c.region for c in ranked])
        if found is not None:
            got = search.check(found)
            answers.append((max(0.0, got[1].ms), found, got[0]))
    notes: list[str] = []
    if not answers:
        best = max(search.points, key=lambda p: p.score.value)
        kept = tuple(r for r in regions if r.name in best.regions)
        notes.append(f"no set of the {len(regions)} regions reaches --max-loss {max_loss:g}: the best scored "
                     f"is kept ({best.score.text})")
        return BudgetChoice(max_loss, before, best.score, kept, best.cost, tuple(by_ratio),
                            tuple(search.points), scorer.runs - runs0, tuple(notes))
    _, kept_list, score = min(answers, key=lambda a: (a[0], -a[2].value))
    kept_list, score = _prune(search, kept_list, score)
    final_cost = search.check(kept_list)[1]
    points = [*search.points, Point(tuple(r.name for r in kept_list), score, final_cost, "chosen")]
    return BudgetChoice(max_loss, before, score, tuple(kept_list), final_cost, tuple(by_ratio), tuple(points),
                        scorer.runs - runs0, tuple(notes))


def _top_up(search: _Search, start: list[Candidate], pool: Sequence[Candidate]
            ) -> list[tuple[float, list[QdqRegion], TaskScore]]:
    """``start`` scored as one set, then regions of ``pool`` added one at a time (in its order), each
    re-checked with the set and kept when it raises the score, until the set meets X: [(its cost,
    regions, score)], or [] when it never does."""
    kept = [c.region for c in start]
    score = search.check(kept)[0] if kept else None
    if score is not None and search.ok(score):
        return [(max(0.0, search.check(kept)[1].ms), kept, score)]
    for c in pool:
        if c.region in kept:
            continue
        got = search.check([*kept, c.region])[0]
        if score is None or got.value > score.value:
            kept, score = [*kept, c.region], got
        if search.ok(score):
            return [(max(0.0, search.check(kept)[1].ms), kept, score)]
    return []


def _smallest_prefix(search: _Search, ranked: Sequence[QdqRegion]) -> Optional[list[QdqRegion]]:
    """The shortest prefix of ``ranked`` that meets X, or None when all of it does not: sizes doubled
    until one meets, then halved between the last that missed and it (a handful of held-out runs where
    adding regions one at a time takes one each; a prefix that meets is re-checked as it is)."""
    n = len(ranked)
    if not n:
        return None
    miss, hit = 0, None
    k = 1
    while hit is None:
        if search.ok(search.check(list(ranked[:k]))[0]):
            hit = k
        elif k == n:
            return None
        else:
            miss, k = k, min(2 * k, n)
    while hit - miss > 1:
        mid = (miss + hit) // 2
        if search.ok(search.check(list(ranked[:mid]))[0]):
            hit = mid
        else:
            miss = mid
    return list(ranked[:hit])


def _prune(search: _Search, kept: list[QdqRegion], score: TaskScore) -> tuple[list[QdqRegion], TaskScore]:
    """Drop, most expensive first, each region the set meets X without (re-checked)."""
    if len(kept) < 2:
        return kept, score
    for r in sorted(kept, key=lambda r: -search.check([r])[1].ms):
        rest = [x for x in kept if x is not r]
        got = search.check(rest)[0]
        if search.ok(got):
            kept, score = rest, got
    return kept, score
