"""A shard's speedup with its drain (calibrate.estimate.shard_speedups): each arm's rows scheduled
on the batch's slots, every batch step priced at the rows it holds."""

from __future__ import annotations

import pytest

from batchspec.calibrate.estimate import Tally, estimates, shard_speedups
from batchspec.engine.base import SpecConfig
from batchspec.predict.costs import CostTable

ARM = SpecConfig("ngram", 4)


def row(tokens: int, arm_steps: int) -> dict[str, Tally]:
    return {"none": Tally(tokens, tokens, tokens, 0, 0),
            ARM.label: Tally(tokens, arm_steps, 0, 4 * arm_steps, tokens - arm_steps)}


def test_an_arm_that_shortens_the_drain_gains_its_steps_at_the_full_batch_and_the_drain():
    # a step costs the same at any rows in flight (CostTable with nothing in it: one unit a step),
    # as a memory-bound GPU's nearly does. Batch 2: plain decoding runs rows 0 and 1 together for
    # 10 steps, then row 2 alone for 30 (40 batch steps); the arm 5 steps each, 10 batch steps.
    rows = [row(10, 5), row(10, 5), row(30, 5)]
    assert shard_speedups(rows, [ARM], CostTable(), 2, 0)[ARM.label] == pytest.approx(40 / 10)
    # at the full batch alone the gain is the rows' steps' ratio: the drain is not seen
    total = {label: Tally() for label in rows[0]}
    for r in rows:
        for label, t in r.items():
            total[label] += t
    assert estimates([total], [ARM], SpecConfig(), CostTable(), 2, 0)[ARM.label].speedup == pytest.approx(50 / 15)
    # one slot: no drain, the two agree
    assert shard_speedups(rows, [ARM], CostTable(), 1, 0)[ARM.label] == pytest.approx(50 / 15)


def test_a_measurements_expected_saving_counts_only_where_the_arm_is_faster():
    """E[max(0, 1 - 1/G)], G normal around the gain: the share of time a switch saves when certain,
    something wherever the interval reaches above 1 (a chance to pay), next to nothing where it
    lies below, and more for a wider interval around the same gain."""
    from batchspec.calibrate.estimate import Estimate

    def est(gain: float, u: float) -> Estimate:
        return Estimate(SpecConfig("ngram", 4), 1.0, gain, u, 0.0, 2.0, 0.5, 10)

    assert est(1.25, 0.0001).expected_saving == pytest.approx(1 - 1 / 1.25, rel=1e-3)
    assert est(0.97, 0.10).expected_saving > 0.02  # the mean below 1, a chance to save ~10%
    assert est(0.70, 0.05).expected_saving < 1e-6
    assert est(1.0, 0.2).expected_saving > est(1.0, 0.1).expected_saving > 0
