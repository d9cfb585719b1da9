"""Each arm's speedup, with its uncertainty, from finished rows and the worker's cost table.

For a window of rows decoded under any arm (greedy rows commit plain decoding's tokens under
every arm), `Tally` counts what each arm would have done on each row (counterfactual acceptance,
batchspec.predict.acceptance): its target steps, those with nothing proposed, drafts proposed and
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

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from batchspec.engine.base import SpecConfig
from batchspec.predict.costs import CostTable

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


def step_price(costs: CostTable, arm: SpecConfig, total: Tally, rows: int, context: int) -> tuple[float, float]:
    """(seconds, relative uncertainty) of one batch step of `arm` with `rows` rows in flight."""
    if arm.method == "none" or total.steps == 0:
        p = costs.price("none", rows, 1, context)
        return p.seconds, p.u
    narrow = (total.empty / total.steps) ** rows
    wide = costs.price(arm.method, rows, arm.draft_len + 1, context, arm.draft_model)
    thin = costs.price(arm.method, rows, 1, context, arm.draft_model) if narrow > 0 else wide
    seconds = narrow * thin.seconds + (1 - narrow) * wide.seconds
    return seconds, (thin.u if narrow > 0.5 else wide.u)


def estimates(window: Sequence[RowTallies], arms: Sequence[SpecConfig], running: SpecConfig, costs: CostTable,
              rows: int, context: int) -> dict[str, Estimate]:
    """Every arm's estimate on `window` (rows' tallies, each with every arm's label), the batch at
    `rows` rows in flight and `context` tokens, for the arms every row has a tally of (the others
    are unknown: they must run to be known). Empty without rows."""
    if not window:
        return {}
    labels = [x for x in ["none", *[a.label for a in arms if a.method != "none"]] if all(x in row for row in window)]
    by_label = {"none": SpecConfig(), **{a.label: a for a in arms}}
    totals = {label: Tally() for label in labels}
    for row in window:
        for label in labels:
            totals[label] += row[label]
    plain_s, plain_u = step_price(costs, by_label["none"], totals["none"], rows, context)
    priced = {}
    for label in labels:
        t = totals[label]
        seconds, u = step_price(costs, by_label[label], t, rows, context)
        priced[label] = (t.accepted_len * plain_s / seconds if seconds > 0 else 0.0, u)
    run = running.label if running.label in priced else "none"
    out = {}
    for label in labels:
        speedup, u = priced[label]
        t = totals[label]
        same = label == run
        gain = speedup / priced[run][0] if priced[run][0] > 0 else 0.0
        out[label] = Estimate(
            arm=by_label[label], speedup=speedup, gain=gain,
            cost_u=0.0 if same else math.hypot(u, priced[run][1]),
            accept_u=0.0 if same else _ratio_u(window, run, label),
            accepted_len=t.accepted_len, acceptance_rate=t.accepted / t.drafted if t.drafted else None,
            rows=len(window),
        )
    return out


def _ratio_u(window: Sequence[RowTallies], run: str, label: str) -> float:
    """Relative standard error of sum(steps under `run`) / sum(steps under `label`) over the rows."""
    x = [row[run].steps for row in window]
    y = [row[label].steps for row in window]
    n, sy = len(window), sum(y)
    if sy <= 0:
        return 1.0
    g = sum(x) / sy
    prior = ROW_CV / math.sqrt(n)
    if n < 2:
        return prior
    mean_y = sy / n
    resid = sum((a - g * b) ** 2 for a, b in zip(x, y)) / (n * (n - 1))
    spread = math.sqrt(resid) / mean_y / g if g > 0 else 1.0
    return max(spread, prior) if n < FEW_ROWS else spread
