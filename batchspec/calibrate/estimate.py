"""Each arm's speedup, with its uncertainty, from finished rows and the worker's cost table.

For a window of rows decoded under any arm (greedy rows commit plain decoding's tokens under
every arm), `Tally` counts what each arm would have done on each row (counterfactual acceptance,
engine/acceptance.py): its target steps, those with nothing proposed, drafts proposed and
accepted. Then, at the rows in flight B and context x:

    L_a        = tokens / steps_a                           committed tokens per row-step
    step_a     = q_a c_a(B, 1, x) + (1 - q_a) c_a(B, k+1, x),  q_a = p0_a^B
                 (p0_a: a row's share of steps with nothing proposed; a batch step is narrow only
                 when no row proposes)
    speedup_a  = L_a c_none(B, 1, x) / step_a              goodput over plain decoding's
    gain_a     = speedup_a / speedup_R                      over the running arm R

The gain's relative uncertainty u_a joins, in quadrature, the two prices' (predict/costs.py) and
the acceptance ratio's: the standard error of the ratio estimator sum(steps_R) / sum(steps_a) over
the window's rows (at least ROW_CV / sqrt(rows) while the rows are few). docs/calibration.md
gives each concept and why.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from batchspec.engine.base import SpecConfig
from batchspec.predict.costs import CostTable

_Z = [i / 8 for i in range(-32, 33)]  # standard normal points from -4 to 4, for Estimate.expected_saving
_Z_WEIGHTS = [math.exp(-z * z / 2) for z in _Z]
ROW_CV = 0.3  # a row's steps vary this much from the window's mean until enough rows measure it
FEW_ROWS = 4  # below this many rows the window's own spread is not trusted alone


@dataclass
class Tally:
    """One row under one arm: decode tokens, target steps, steps with nothing proposed, drafts
    proposed and accepted (floats: a sampled row's counts are expectations)."""

    tokens: float = 0.0
    steps: float = 0.0
    empty: float = 0.0
    drafted: float = 0.0
    accepted: float = 0.0

    def __iadd__(self, other: "Tally") -> "Tally":
        self.tokens += other.tokens
        self.steps += other.steps
        self.empty += other.empty
        self.drafted += other.drafted
        self.accepted += other.accepted
        return self

    @property
    def accepted_len(self) -> float:
        return self.tokens / self.steps if self.steps else 1.0


# One row's tallies by arm label ("none" included).
RowTallies = Mapping[str, Tally]


class Window:
    """The rows the rule judges on: for each arm, the last `size` rows that have its tally. Where
    acceptance is computed every row has every arm's, so this is the last `size` rows; where it is
    measured, an arm keeps the rows it ran on however long ago, until it runs again."""

    def __init__(self, size: int, rows: Sequence[RowTallies] = ()) -> None:
        self.size = size
        self.rows: list[RowTallies] = []
        for row in rows:
            self.add(row)

    def add(self, row: RowTallies) -> None:
        self.rows.append(row)
        kept, seen = set(), {}
        for i in range(len(self.rows) - 1, -1, -1):
            for label in self.rows[i]:
                if seen.get(label, 0) < self.size:
                    seen[label] = seen.get(label, 0) + 1
                    kept.add(i)
        self.rows = [r for i, r in enumerate(self.rows) if i in kept]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)


@dataclass(frozen=True)
class Estimate:
    """One arm on a window of rows: its speedup over plain decoding, its gain over the running
    arm and that gain's relative uncertainty (`cost_u` the prices' part, `accept_u` the rows')."""

    arm: SpecConfig
    speedup: float
    gain: float
    cost_u: float
    accept_u: float
    accepted_len: float
    acceptance_rate: float | None
    rows: int

    @property
    def u(self) -> float:
        return math.hypot(self.cost_u, self.accept_u)

    @property
    def low(self) -> float:
        return self.gain * (1 - self.u)

    @property
    def high(self) -> float:
        return self.gain * (1 + self.u)

    @property
    def expected_saving(self) -> float:
        """E[max(0, 1 - 1/G)], G ~ normal(gain, gain x u): the share of the running arm's time this
        arm is expected to save, counting only where it is faster (a measurement that finds it
        slower goes back). Positive wherever the interval reaches above 1, so a build is measured
        where its chance of paying, not its mean, repays it."""
        sd = self.gain * self.u
        saved = [max(0.0, 1 - 1 / (self.gain + sd * z)) if self.gain + sd * z > 0 else 0.0 for z in _Z]
        return sum(w * s for w, s in zip(_Z_WEIGHTS, saved)) / sum(_Z_WEIGHTS)


def step_price(costs: CostTable, arm: SpecConfig, total: Tally, rows: int, context: int) -> tuple[float, float]:
    """(seconds, relative uncertainty) of one batch step of `arm` with `rows` rows in flight."""
    if arm.method == "none" or total.steps == 0:
        p = costs.price("none", rows, 1, context)
        return p.seconds, p.u
    narrow = (total.empty / total.steps) ** rows
    width = arm.draft_len + 1
    if rows == 1 and total.steps > total.empty:  # one row: a verify is as wide as its draft
        width = min(width, 1 + math.ceil(total.drafted / (total.steps - total.empty)))
    wide = costs.price(arm.method, rows, width, context, arm.draft_model)
    thin = costs.price(arm.method, rows, 1, context, arm.draft_model) if narrow > 0 else wide
    seconds = narrow * thin.seconds + (1 - narrow) * wide.seconds
    return seconds, (thin.u if narrow > 0.5 else wide.u)


def estimates(window: Sequence[RowTallies], arms: Sequence[SpecConfig], running: SpecConfig, costs: CostTable,
              rows: int, context: int, effective_rows: float | None = None) -> dict[str, Estimate]:
    """Every arm's estimate on `window` (rows' tallies by arm label), the batch at `rows` rows in
    flight and `context` tokens. An arm is judged on the rows that have its tally: every row where
    acceptance is computed; where it is measured, the rows it ran on (and the shorter drafts of
    its method). An arm no row has a tally of is unknown: it must run to be known. Rows in flight,
    counted with their output so far, are weaker evidence than finished ones (their first tokens
    only): `effective_rows` says how many finished rows they are worth, which floors the
    acceptance's uncertainty at ROW_CV / sqrt(effective_rows)."""
    if not window:
        return {}
    by_label = {"none": SpecConfig(), **{a.label: a for a in arms}}
    labels = [x for x in by_label if any(x in row for row in window)]
    priced = {}
    for label in labels:
        t = Tally()
        for row in window:
            if label in row:
                t += row[label]
        seconds, u = step_price(costs, by_label[label], t, rows, context)
        priced[label] = (t, seconds, u)
    plain_s = priced["none"][1]
    speedups = {x: (t.accepted_len * plain_s / s if s > 0 else 0.0) for x, (t, s, _) in priced.items()}
    run = running.label if running.label in priced else "none"
    out = {}
    for label in labels:
        t, _, u = priced[label]
        same = label == run
        out[label] = Estimate(
            arm=by_label[label], speedup=speedups[label],
            gain=speedups[label] / speedups[run] if speedups[run] > 0 else 0.0,
            cost_u=0.0 if same else math.hypot(u, priced[run][2]),
            accept_u=0.0 if same else max(_ratio_u([r for r in window if label in r and run in r], run, label,
                                                   sum(label in r for r in window)),
                                          ROW_CV / math.sqrt(max(effective_rows, 1.0)) if effective_rows else 0.0),
            accepted_len=t.accepted_len, acceptance_rate=t.accepted / t.drafted if t.drafted else None,
            rows=sum(label in r for r in window),
        )
    return out


def shard_speedups(rows: Sequence[RowTallies], arms: Sequence[SpecConfig], costs: CostTable, batch: int,
                   context: int) -> dict[str, float]:
    """Each arm's speedup over plain decoding on a whole shard's rows (in request order, about the
    order the engine admits them), its drain included: each row's steps under the arm run `batch`
    rows at a time, a row taking the first slot free, and every batch step is priced at the rows
    it holds. An arm that commits several tokens a step also shortens the drain, where plain
    decoding's steps run part-empty at nearly a full step's price on a memory-bound GPU;
    `estimates` at the full batch misses that."""
    by_label = {"none": SpecConfig(), **{a.label: a for a in arms}}
    out = {}
    for label, arm in by_label.items():
        both = [r for r in rows if label in r and "none" in r]
        mine = _shard_s(costs, arm, [r[label] for r in both], batch, context) if both else 0.0
        if mine > 0:
            out[label] = _shard_s(costs, by_label["none"], [r["none"] for r in both], batch, context) / mine
    return out


def _shard_s(costs: CostTable, arm: SpecConfig, tallies: Sequence[Tally], batch: int, context: int) -> float:
    total = Tally()
    for t in tallies:
        total += t
    free = [0] * min(batch, len(tallies))  # when each slot is next free, in steps
    change: dict[int, int] = {}
    for t in tallies:
        begin = heapq.heappop(free)
        end = begin + max(1, round(t.steps))
        heapq.heappush(free, end)
        change[begin] = change.get(begin, 0) + 1
        change[end] = change.get(end, 0) - 1
    steps_at: dict[int, int] = {}  # rows in flight -> batch steps
    held, last = 0, 0
    for step in sorted(change):
        if held:
            steps_at[held] = steps_at.get(held, 0) + step - last
        held, last = held + change[step], step
    return sum(n * step_price(costs, arm, total, rows, context)[0] for rows, n in steps_at.items())


def _ratio_u(both: Sequence[RowTallies], run: str, label: str, rows: int) -> float:
    """Relative standard error of sum(steps under `run`) / sum(steps under `label`) over the rows
    that have both (at least ROW_CV / sqrt(rows) while they are fewer than FEW_ROWS; ROW_CV /
    sqrt(rows) where none has both: the two arms ran on different rows)."""
    prior = ROW_CV / math.sqrt(max(rows, 1))
    x = [row[run].steps for row in both]
    y = [row[label].steps for row in both]
    n, sy = len(both), sum(y)
    if n < 2 or sy <= 0:
        return prior
    g = sum(x) / sy
    resid = sum((a - g * b) ** 2 for a, b in zip(x, y)) / (n * (n - 1))
    spread = math.sqrt(resid) / (sy / n) / g if g > 0 else 1.0
    return max(spread, prior) if n < FEW_ROWS else spread
