"""calibrate.ledger's price of a shard's decode as plain decoding, with its interval (the stats'
plain_decode_s and plain_decode_u, from which plain_gpu_s is made)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from batchspec.calibrate.ledger import Ledger, PlainPrice, Retimed, plain_price, price_fixed
from batchspec.engine.base import NO_SPEC, Profile, SpecConfig, Step, StepCost
from batchspec.predict.costs import CostTable


def _table() -> CostTable:
    """A profile of plain forwards (2 ms a row-token) and plain steps observed at 4 rows, not at 2."""
    table = CostTable()
    table.seed([StepCost("target", "m", 4, 100, w, 0.002 * 4 * w) for w in (1, 5)], 4)
    for seconds in (0.008, 0.0088, 0.0072, 0.008):
        table.observe(Step(4, 100, 1, 4, seconds, "none"))
    return table


def test_a_shard_that_ran_plain_decoding_throughout_is_its_own_price_with_no_uncertainty():
    steps = [Step(4, 100, 1, 4, 0.01, "none"), Step(2, 120, 1, 2, 0.005, "none")]
    assert plain_price(_table(), steps, decode_s=0.02, speedup=0.97) == PlainPrice(0.02, 0.0)
    assert plain_price(CostTable(), [], decode_s=0.0, speedup=None) == PlainPrice(0.0, 0.0)


def test_speculative_steps_are_priced_at_the_decisions_speedup_within_the_tables_weighted_uncertainty():
    table = _table()
    steps = [Step(4, 100, 5, 12, 0.03, "ngram"), Step(4, 110, 5, 8, 0.03, "ngram"), Step(2, 130, 5, 6, 0.02, "ngram")]
    price = plain_price(table, steps, decode_s=0.09, speedup=1.4)
    assert price.seconds == pytest.approx(0.09 * 1.4)
    prices = [(s.committed / s.rows * table.price("none", s.rows, 1, s.context).seconds, table.price("none", s.rows, 1, s.context).u)
              for s in steps]
    assert price.u == pytest.approx(sum(x * u for x, u in prices) / sum(x for x, _ in prices))
    observed, borrowed = table.price("none", 4, 1, 100).u, table.price("none", 2, 1, 130).u
    assert observed < price.u < borrowed  # the rows never run plain at 2 rows borrow a price, and widen the interval
    assert plain_price(table, steps, decode_s=0.09, speedup=None) is None  # the table priced no plain decoding


class _Machine:
    """An engine whose forwards cost 2 ms a row-token times `load` (the machine's state now)."""

    def __init__(self) -> None:
        self.load = 1.0

    def forward(self, rows: int, width: int) -> float:
        return 0.002 * rows * width * self.load

    def profile(self, target, drafts=(), tries: int = 1) -> Profile:
        points = [StepCost("target", "m", b, c, w, self.forward(b, w)) for b, c, w in target]
        return Profile(points, tries * sum(p.seconds for p in points))


def test_a_load_gone_between_shards_leaves_plain_decodings_price_where_the_machine_is_now():
    """The worker's first shard runs plain decoding on a machine 10x loaded, its profile timed
    under that load; the load is gone when its next shard runs n-gram k=2 (verify 3 tokens a row,
    its steps 10% over the forward, 1.5 tokens a row a step). That shard's speedup over plain
    decoding is what the machine gives now (1.5 / (3 x 1.1) = 0.45x), not 10x that: plain
    decoding's price, last observed under the load, follows the re-timed forward."""
    machine, table, arm = _Machine(), CostTable(), SpecConfig("ngram", 2)
    machine.load = 10.0
    first = Ledger(machine, table, 4, [arm])
    first.learn([Step(4, 100, 1, 4, machine.forward(4, 1), "none") for _ in range(20)], NO_SPEC)
    machine.load = 1.0
    second = Ledger(machine, table, 4, [arm])
    _, _, retimed = second.learn([Step(4, 100, 3, 6, 1.1 * machine.forward(4, 3), "ngram") for _ in range(20)], arm)
    speedup, baseline = second.plain()
    assert speedup == pytest.approx(1.5 / (3 * 1.1), rel=0.02)
    assert baseline == pytest.approx(4 / machine.forward(4, 1), rel=0.02)  # plain decoding's goodput now
    assert retimed == Retimed(1.0, pytest.approx(0.1), pytest.approx(machine.forward(4, 1)))
    # a forward re-timed within MACHINE_BAND of its profiled seconds is noise: the prices keep the profile's machine
    point = table.points[0]
    assert table.retime(point, point.seconds * 1.2) == 1.0 and table.forward_s(1, 1, 100) == pytest.approx(point.seconds)
    assert table.retime(point, point.seconds * 1.3) == pytest.approx(1.3)


def test_a_fixed_arms_later_shard_counts_the_forward_that_re_times_its_price():
    """A shard under a fixed arm is priced as a calibrated one is (`price_fixed`): the worker's
    first such shard pays the profile (the worker's seconds), a later one re-times the profile's
    plain forward, and those seconds are the shard's own, returned beside the profile's (the
    shard's calibration_s), not dropped."""
    machine, table, arm = _Machine(), CostTable(), SpecConfig("ngram", 2)
    ran = SimpleNamespace(steps=[Step(4, 100, 3, 6, 1.1 * machine.forward(4, 3), "ngram") for _ in range(20)], goodput=100.0)
    speedup, _, profile_s, retime_s = price_fixed(machine, table, arm, 4, ran)
    assert profile_s > 0 and retime_s == 0.0  # the first: the profile, nothing to re-time
    assert speedup == pytest.approx(1.5 / (3 * 1.1), rel=0.02)
    machine.load = 2.0
    speedup, _, profile_s, retime_s = price_fixed(machine, table, arm, 4, ran)
    assert profile_s == 0.0 and retime_s == pytest.approx(machine.forward(4, 1))  # one forward of the profile's shape (PROFILE_TRIES)
    assert price_fixed(machine, table, NO_SPEC, 4, ran) == (1.0, 100.0, 0.0, 0.0)  # plain decoding is its own price
