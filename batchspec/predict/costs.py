"""The worker's step-cost table: what one decode step costs, learned from the steps it runs.

    price(method, rows, width, context) = forward(rows, width, context) x ratio(method, rows, width)

`forward` is the engine's timed forwards (a short profile, `profile_grid`): linear between the
profile's points in tokens per step (rows x width, the work a forward does), times a context factor
(1 + slope x context) where the profile timed plain forwards at two contexts (else 1: a cell's
exponential average follows the shard's context as it grows). `ratio` is what the decode loop
actually took for such a step over that price: drafting, the accept rule and the loop's own
bookkeeping, which no profile of a forward sees. Every `Step` the worker runs updates the ratio of
its cell (method, rows, width): the mean of its observations, then an exponential average over the
last WINDOW_STEPS, so prices follow the machine as it is now. A cell never observed borrows the
ratio of the nearest observed cell of the same method (the same rows first), else of plain
decoding at those rows, else 1: the profile's forward as timed. Without a profile a ratio is a
step's seconds, and a shape never run is priced between the observed steps that bracket it (a
forward costs more with more rows and more tokens: `_bracketed`), else as the nearest step.

Each price carries a relative uncertainty `u`: an observed cell's spread over its observations
(sqrt(var / n), at least NOISE_FLOOR); a borrowed ratio adds BORROWED_U (another width's or
rows' ratio), a ratio of another method PRIOR_U (its bookkeeping is unknown). A load that slows
every step alike cancels in the ratio of two arms' prices where both are observed under it; the
table is per worker, so a machine's own quirks stay with it.

The machine: a load that comes or goes between shards would leave the price of an arm no longer
run (plain decoding, often) at the load it was last observed under, and every arm compared with
it wrong by the load's factor. So each later shard re-times one forward of the profile's (`retime`:
its shape and context, so only the machine differs) and `machine` = its seconds now over the
profile's scales every forward's price; ratios are learned against the scaled price, so they stay
the step's own overhead. Within MACHINE_BAND of 1 a re-timed forward is noise and `machine` is 1.

No clock here: the engine times steps and forwards; this module only prices them.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Sequence

from batchspec.engine.base import DRAFTED_METHODS, Step, StepCost

WINDOW_STEPS = 64  # a cell's ratio averages its last this many steps (an exponential window)
NOISE_FLOOR = 0.02  # the least relative uncertainty of any price
BORROWED_U = 0.08  # a ratio borrowed from another width or another number of rows of the same method
PRIOR_U = 0.20  # a ratio borrowed from plain decoding for a method never run on this worker
MACHINE_BAND = 1.25  # a re-timed forward within this factor of its profiled seconds: timing noise, not load


def profile_grid(batch_size: int, context: int, widths: Sequence[int], draft_models: Sequence[str] = (),
                 ) -> tuple[list[tuple[int, int, int]], list[tuple[str, int, int, int]]]:
    """The forwards a worker times once per batch size, at the shard's context: one row at width 1
    (a drain's few rows are fewer tokens than any forward of the batch: a CPU pays for each token,
    a memory-bound GPU for none, and only a timed forward tells which); at the production batch,
    the target at width 1, at every width an arm verifies (`widths`) and midway to the widest (a
    forward's cost is near linear in its tokens only piecewise: where it turns from memory- to
    compute-bound a width between two timed ones would be priced high); and one step of each draft
    model. Everything else is learned from the steps the worker runs."""
    widest = max(widths, default=1)
    target = [(batch_size, context, w) for w in sorted({1, *widths, (1 + widest) // 2})]
    target = ([(1, context, 1)] if batch_size > 1 else []) + target
    drafts = [(d, batch_size, context, 1) for d in draft_models]
    return target, drafts


@dataclass
class Cell:
    """The observed ratio of one (method, rows, width): mean and variance, exponentially weighted."""

    mean: float = 1.0
    var: float = 0.0
    n: int = 0

    def add(self, ratio: float) -> None:
        self.n += 1
        w = 1.0 / min(self.n, WINDOW_STEPS)
        delta = ratio - self.mean
        self.mean += w * delta
        self.var = (1 - w) * (self.var + w * delta * delta)

    @property
    def u(self) -> float:
        """Relative uncertainty of the mean (its standard error over the mean, at least the floor)."""
        n_eff = min(self.n, WINDOW_STEPS)
        spread = math.sqrt(self.var / max(n_eff, 1)) / self.mean if self.mean > 0 else 1.0
        return max(NOISE_FLOOR, spread if self.n > 1 else PRIOR_U / 2)


@dataclass(frozen=True)
class Price:
    seconds: float
    u: float  # relative uncertainty


@dataclass
class CostTable:
    """One worker's step costs (see the module docstring). `points` are the profile's forwards;
    `cells` the observed ratios, by (method, rows, width)."""

    points: list[StepCost] = field(default_factory=list)
    cells: dict[tuple[str, int, int], Cell] = field(default_factory=dict)
    profiled: set[int] = field(default_factory=set)  # batch sizes whose grid was timed
    machine: float = 1.0  # the machine's seconds now over the profile's, for one forward (`retime`)
    _curves: dict = field(default_factory=dict, init=False, repr=False)

    # -- the profile -------------------------------------------------------------------------------

    def seed(self, points: Sequence[StepCost], batch_size: int) -> None:
        self.points += list(points)
        self.profiled.add(batch_size)
        self._curves.clear()

    def needs_profile(self, batch_size: int) -> bool:
        return batch_size not in self.profiled

    def retime(self, point: StepCost, seconds: float) -> float:
        """A profile `point` timed again, taking `seconds` now: set `machine` (1 within MACHINE_BAND)."""
        factor = seconds / point.seconds if point.seconds > 0 and seconds > 0 else 1.0
        self.machine = factor if max(factor, 1 / factor) > MACHINE_BAND else 1.0
        return self.machine

    def forward_s(self, rows: int, width: int, context: int, kind: str = "target", model: str | None = None) -> float:
        """The profile's price of one forward (`kind` target, or a draft model's), on the machine as
        it runs now (`machine`)."""
        slope, curve = self._curve(kind, model)
        if not curve:
            return 0.0
        tokens = rows * width
        xs = [t for t, _ in curve]
        i = bisect.bisect_left(xs, tokens)
        if i == 0:
            base = curve[0][1]
        elif i == len(curve):
            (t0, s0), (t1, s1) = curve[-2] if len(curve) > 1 else curve[-1], curve[-1]
            base = s1 + (s1 - s0) / (t1 - t0) * (tokens - t1) if t1 > t0 else s1
        else:
            (t0, s0), (t1, s1) = curve[i - 1], curve[i]
            base = s0 + (s1 - s0) * (tokens - t0) / (t1 - t0)
        return max(base, 0.0) * (1 + slope * context) * self.machine

    def _curve(self, kind: str, model: str | None) -> tuple[float, list[tuple[int, float]]]:
        """(context slope, [(tokens, seconds at context 0)] sorted) of a model's points."""
        key = (kind, model if kind != "target" else None)
        if key not in self._curves:
            mine = [p for p in self.points if p.kind == kind and (kind == "target" or p.model == model)]
            slope = _slope([p for p in mine if p.tokens == 1])
            by_tokens: dict[int, list[float]] = {}
            for p in mine:
                by_tokens.setdefault(p.batch * p.tokens, []).append(p.seconds / (1 + slope * p.context))
            self._curves[key] = (slope, sorted((t, min(s)) for t, s in by_tokens.items()))
        return self._curves[key]

    # -- learning from steps ---------------------------------------------------------------------

    def base_s(self, method: str, rows: int, width: int, context: int, draft_model: str | None = None) -> float:
        """The profile's price of a step: the verify forward, and k draft steps of a draft model or head;
        1 without a profile (an engine that times no forwards apart: the ratio is the seconds)."""
        if not self.points:
            return 1.0
        base = self.forward_s(rows, width, context)
        if method in DRAFTED_METHODS and width > 1:
            base += (width - 1) * self.forward_s(rows, 1, context, "draft", draft_model)
        return base

    def observe(self, step: Step, draft_model: str | None = None) -> None:
        base = self.base_s(step.method, step.rows, step.tokens, step.context, draft_model)
        if base > 0 and step.seconds > 0:
            self.cells.setdefault((step.method, step.rows, step.tokens), Cell()).add(step.seconds / base)

    def price(self, method: str, rows: int, width: int, context: int, draft_model: str | None = None) -> Price:
        """What a step of this shape costs now, with its relative uncertainty."""
        ratio, u = self._ratio(method, rows, width)
        return Price(self.base_s(method, rows, width, context, draft_model) * ratio, u)

    def _ratio(self, method: str, rows: int, width: int) -> tuple[float, float]:
        cell = self.cells.get((method, rows, width))
        if cell is not None and cell.n:
            return cell.mean, cell.u
        if not self.points:  # no profile: a ratio is a step's seconds, bracketed by the steps observed
            bracket = _bracketed(self.cells, method, rows, width)
            if bracket is not None:
                return bracket
        same = [(abs(math.log(r / rows)), abs(w - width), c) for (m, r, w), c in self.cells.items() if m == method and c.n]
        if same:
            _, _, near = min(same, key=lambda x: x[:2])
            return near.mean, math.hypot(near.u, BORROWED_U)
        plain = [(abs(math.log(r / rows)), c) for (m, r, w), c in self.cells.items() if m == "none" and c.n]
        if plain:
            near = min(plain, key=lambda x: x[0])[1]
            return near.mean, math.hypot(near.u, PRIOR_U)
        if not self.points:  # no profile: a ratio is a step's seconds, so the nearest step of any method
            other = [(abs(math.log(r / rows)), abs(w - width), c) for (m, r, w), c in self.cells.items() if c.n]
            if other:
                near = min(other, key=lambda x: x[:2])[2]
                return near.mean, math.hypot(near.u, PRIOR_U)
        return 1.0, PRIOR_U


def _bracketed(cells: dict, method: str, rows: int, width: int) -> tuple[float, float] | None:
    """(seconds, u) of a step shape never observed, where no profile prices forwards: a forward
    costs more with more rows and more tokens, so the step lies between the dearest observed step
    of at most its rows and tokens and the cheapest of at least its rows and tokens; priced
    midway, its uncertainty the half-range. Steps of any method bound it, but another method's
    at the same rows only from above (its drafter's work per row is in it). None where either
    side has no step."""
    tokens = rows * width
    below = [c.mean for (m, r, w), c in cells.items()
             if c.n and r <= rows and r * w <= tokens and (m == method or r < rows)]
    above = [c.mean for (m, r, w), c in cells.items() if c.n and r >= rows and r * w >= tokens]
    if not below or not above:
        return None
    lo, hi = sorted((max(below), min(above)))
    return (lo + hi) / 2, max(NOISE_FLOOR, (hi - lo) / (hi + lo))


def _slope(points: Sequence[StepCost]) -> float:
    """Relative cost per token of context, from plain forwards at the same batch and different
    contexts (0 where the profile has none: a single context)."""
    by_batch: dict[int, list[StepCost]] = {}
    for p in points:
        by_batch.setdefault(p.batch, []).append(p)
    slopes = []
    for group in by_batch.values():
        lo, hi = min(group, key=lambda p: p.context), max(group, key=lambda p: p.context)
        if hi.context > lo.context and lo.seconds > 0:
            r = hi.seconds / lo.seconds
            slopes.append(max(0.0, (r - 1) / (hi.context - r * lo.context)) if hi.context > r * lo.context else 0.0)
    return sorted(slopes)[len(slopes) // 2] if slopes else 0.0
