"""The decode steps one shard ran, by arm, and what plain decoding would have taken for the same
tokens.

Every step the engine runs teaches the worker's cost table (predict/costs.py), which a short
profile seeds the first time the worker runs a shard at a batch size (a later shard re-times one of
its forwards: the machine's load may have changed since, `CostTable.retime`); at the shard's end its steps
are priced as plain decoding's at the table's prices:

    plain_s   = sum over steps of committed / rows x price(none, rows, 1, context)
    speedup   = plain_s / the steps' seconds        (the shard's goodput over plain decoding's)
    baseline  = committed tokens / plain_s          (plain decoding's goodput, priced)

The calibration controller keeps one for the arms it runs; a shard with a fixed arm keeps one too
(`price_fixed`), so its stats say its speedup wherever the table can price plain decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from batchspec.engine.base import DRAFTED_METHODS, Engine, GenerateResult, SpecConfig, Step
from batchspec.predict.costs import CostTable, profile_grid

PROFILE_TRIES = 1  # the profile times each point once: the steps the worker runs correct its prices


@dataclass
class Ran:
    """What one arm ran in a shard: its steps' seconds and what they committed."""

    seconds: float = 0.0
    committed: int = 0
    steps: list = field(default_factory=list)  # (rows, context, committed) of each step


@dataclass(frozen=True)
class Profiled:
    """A profile the ledger had the engine time: its seconds as the engine counts them, its wall
    seconds (the controller's own time leaves them out) and how many forwards it timed."""

    seconds: float
    wall_s: float
    points: int


@dataclass(frozen=True)
class Retimed:
    """A profile forward the ledger had timed again at a shard's start: the machine's speed against
    the profile's before and after (`CostTable.machine`), and the seconds it took (the shard's
    calibration work)."""

    before: float
    after: float
    seconds: float


class Ledger:
    """One shard's steps by arm label, learned into `costs` as they come (see the module docstring)."""

    def __init__(self, engine: Engine, costs: CostTable, batch_size: int, arms: Sequence[SpecConfig]) -> None:
        self.engine, self.costs, self.batch_size = engine, costs, batch_size
        self.arms = [a for a in arms if a.method != "none"]
        self.ran: dict[str, Ran] = {}
        self.seen = 0  # steps already learned from
        self.profile_s = 0.0

    def learn(self, steps: Sequence[Step], spec: SpecConfig) -> tuple[int, Profiled | None, Retimed | None]:
        """Teach the cost table the steps after those already learned (all run under `spec`),
        profiling first where the worker has no profile at this batch size, else, at the shard's
        first steps, re-timing one of the profile's forwards (`retime`). Returns how many steps
        were new, the profile if one was timed, and the re-timing if one ran."""
        profiled = retimed = None
        if steps and self.costs.needs_profile(self.batch_size):
            profiled = self.profile(steps[-1].context)
        elif steps and not self.seen:
            retimed = self.retime()
        ran = self.ran.setdefault(spec.label, Ran())
        for step in steps[self.seen:]:
            self.costs.observe(step, spec.draft_model)
            ran.seconds += step.seconds
            ran.committed += step.committed
            ran.steps.append((step.rows, step.context, step.committed))
        new, self.seen = len(steps) - self.seen, len(steps)
        return new, profiled, retimed

    def profile(self, context: int) -> Profiled | None:
        """Time the worker's profile at this batch size (`profile_grid`: every arm's verify width);
        None where the engine times no forward apart (its steps alone teach the table)."""
        widths = [1 + a.draft_len for a in self.arms]
        drafts = sorted({a.draft_model for a in self.arms if a.method in DRAFTED_METHODS and a.draft_model})
        target, draft = profile_grid(self.batch_size, max(context, 8), widths, drafts)
        began = time.perf_counter()
        profile = self.engine.profile(target, draft, tries=PROFILE_TRIES)
        wall = time.perf_counter() - began
        self.costs.seed(profile.points, self.batch_size)
        if not profile.points:
            return None
        self.profile_s += profile.seconds
        return Profiled(profile.seconds, wall, len(profile.points))

    def retime(self) -> Retimed | None:
        """Time the profile's plain forward at this batch size again, at its shape and context, and
        scale the table's prices by the machine's speed now (`CostTable.retime`); None where the
        profile has no such forward or the engine times none."""
        mine = [p for p in self.costs.points if p.kind == "target" and p.batch == self.batch_size and p.tokens == 1]
        if not mine:
            return None
        point, before = mine[-1], self.costs.machine
        profile = self.engine.profile([(point.batch, point.context, 1)], (), tries=PROFILE_TRIES)
        if not profile.points:
            return None
        return Retimed(before, self.costs.retime(point, profile.points[0].seconds), profile.seconds)

    def plain(self) -> tuple[float | None, float | None]:
        """(speedup, baseline tokens/s): the steps run against plain decoding's price for the same
        tokens (None where nothing ran or plain decoding has no price)."""
        plain_s = sum(committed / rows * self.costs.price("none", rows, 1, ctx).seconds
                      for r in self.ran.values() for rows, ctx, committed in r.steps)
        spent = sum(r.seconds for r in self.ran.values())
        tokens = sum(r.committed for r in self.ran.values())
        return (plain_s / spent if spent and plain_s else None), (tokens / plain_s if plain_s else None)

    def prices_plain(self) -> bool:
        """Whether the table has plain decoding's price of its own: a profile of the target's
        forwards, or plain steps observed (else a price would be another arm's steps, borrowed)."""
        return bool(self.costs.points) or any(m == "none" and c.n for (m, _, _), c in self.costs.cells.items())


def price_fixed(engine: Engine, costs: CostTable, spec: SpecConfig, batch_size: int,
                result: GenerateResult) -> tuple[float | None, float | None, float, float]:
    """A fixed arm's shard priced as the controller prices a calibrated one: (speedup, baseline
    tokens/s, profile seconds, re-timing seconds) from the steps `result` ran under `spec`. Plain
    decoding is its own baseline (1.0x); an arm is priced where the table can price plain decoding,
    else (None, None). The re-timing's forward (a later shard's, `Ledger.retime`) is the shard's
    own time, as it is a calibrated shard's; the profile is the worker's."""
    if spec.method == "none":
        return (1.0, result.goodput, 0.0, 0.0) if result.goodput else (None, None, 0.0, 0.0)
    ledger = Ledger(engine, costs, batch_size, [spec])
    _, _, retimed = ledger.learn(result.steps, spec)
    retime_s = retimed.seconds if retimed is not None else 0.0
    if not ledger.prices_plain():
        return None, None, ledger.profile_s, retime_s
    return (*ledger.plain(), ledger.profile_s, retime_s)


# ---- plain decoding's price of a shard's decode, with its interval (the stats' plain_gpu_s) ----


@dataclass(frozen=True)
class PlainPrice:
    """What plain decoding would have taken for the decode a shard ran: `seconds`, within a
    relative `u`. Where plain decoding ran every step, its own seconds (u 0); else the shard's
    decode seconds times its speedup (the price `Ledger.plain` and `price_fixed` set), `u` the
    cost table's uncertainty of those prices weighted by price: one table prices every step, so
    their errors are taken as one (summed, not added in quadrature)."""

    seconds: float
    u: float


def plain_price(costs: CostTable, steps: Sequence[Step], decode_s: float, speedup: float | None) -> PlainPrice | None:
    """`PlainPrice` of a shard whose decode took `decode_s` over `steps` at `speedup` (its
    Decision's); None where the table priced no plain decoding (speedup None)."""
    if all(s.method == "none" for s in steps):
        return PlainPrice(decode_s, 0.0)
    if not speedup:
        return None
    prices = [(s.committed / s.rows * p.seconds, p.u) for s in steps for p in [costs.price("none", s.rows, 1, s.context)]]
    total = sum(x for x, _ in prices)
    return PlainPrice(decode_s * speedup, sum(x * u for x, u in prices) / total if total else 0.0)
