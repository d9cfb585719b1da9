"""The worker's step-cost table: profiled forwards, and the ratio of what steps took to them,
learned from every step; borrowed ratios carry more uncertainty."""

from __future__ import annotations

import pytest

from batchspec.engine.base import Step, StepCost
from batchspec.predict.costs import BORROWED_U, NOISE_FLOOR, PRIOR_U, WINDOW_STEPS, CostTable, Price, profile_grid
from batchspec.sim.regimes import REGIMES


def _table(name: str = "cpu", batch: int = 8, context: int = 200) -> CostTable:
    regime = REGIMES[name]
    target, _ = profile_grid(batch, context, [9])
    table = CostTable()
    table.seed([StepCost("target", "m", b, c, w, regime.forward_s(b, w, c)) for b, c, w in target], batch)
    return table


def test_the_profile_is_a_few_forwards_at_the_production_batch():
    target, drafts = profile_grid(8, 300, [9], ["d"])
    assert target == [(1, 300, 1), (8, 300, 1), (8, 300, 5), (8, 300, 9)] and drafts == [("d", 8, 300, 1)]
    assert profile_grid(1, 40, [3])[0] == [(1, 40, 1), (1, 40, 2), (1, 40, 3)]
    # every width an arm verifies at is timed: none is priced between two others
    assert [w for b, _, w in profile_grid(32, 40, [3, 5, 7, 9])[0] if b == 32] == [1, 3, 5, 7, 9]


def test_a_roofline_step_at_every_arms_width_is_priced_as_the_regime_prices_it():
    regime, widths = REGIMES["gpu-roofline"], [3, 5, 7, 9]
    target, _ = profile_grid(32, 300, widths)
    table = CostTable()
    table.seed([StepCost("target", "m", b, c, w, regime.forward_s(b, w, c)) for b, c, w in target], 32)
    for w in [1, *widths]:
        assert table.forward_s(32, w, 300) == pytest.approx(regime.forward_s(32, w, 300), rel=1e-6)


@pytest.mark.parametrize("name", ["cpu", "gpu-roofline", "h200-torch"])
def test_a_forward_between_the_profiles_points_is_priced_by_its_tokens(name):
    regime, table = REGIMES[name], _table(name)
    for width in (2, 3, 4, 6, 7, 8):
        assert table.forward_s(8, width, 200) == pytest.approx(regime.forward_s(8, width, 200), rel=0.15)
    assert not table.needs_profile(8) and table.needs_profile(4)


def test_every_step_teaches_its_cell_the_ratio_of_what_it_took_to_the_profile():
    table = _table()
    base = table.base_s("ngram", 8, 5, 200)
    before = table.price("ngram", 8, 5, 200)
    assert before.seconds == pytest.approx(base) and before.u == PRIOR_U  # nothing run: the profile, unsure
    for _ in range(40):
        table.observe(Step(8, 200, 5, 12, 1.5 * base, "ngram"))
    after = table.price("ngram", 8, 5, 200)
    assert after.seconds == pytest.approx(1.5 * base) and after.u == NOISE_FLOOR
    # another width of the same method borrows the ratio, less sure; plain decoding never ran:
    # the profile's forward, unsure (a drafter's bookkeeping is not plain decoding's)
    other = table.price("ngram", 8, 9, 200)
    assert other.seconds == pytest.approx(1.5 * table.base_s("ngram", 8, 9, 200))
    assert other.u == pytest.approx((NOISE_FLOOR ** 2 + BORROWED_U ** 2) ** 0.5)
    assert table.price("none", 8, 1, 200) == Price(table.base_s("none", 8, 1, 200), PRIOR_U)


def test_without_a_profile_plain_decoding_never_run_is_priced_as_the_nearest_step_run():
    """An engine that times no forward apart (TensorRT-LLM) whose worker has run only an n-gram
    build: plain decoding's step borrows that step's seconds, with the prior's uncertainty."""
    table = CostTable()
    assert table.price("none", 8, 1, 200) == Price(1.0, PRIOR_U)  # nothing observed: no price at all
    for _ in range(10):
        table.observe(Step(8, 200, 5, 12, 0.02, "ngram"))
    plain = table.price("none", 8, 1, 200)
    assert plain.seconds == pytest.approx(0.02) and plain.u == pytest.approx((NOISE_FLOOR ** 2 + PRIOR_U ** 2) ** 0.5)


def test_a_method_never_run_borrows_plain_decodings_ratio_with_the_priors_uncertainty():
    table = _table()
    for _ in range(10):
        table.observe(Step(8, 200, 1, 8, 2.0 * table.base_s("none", 8, 1, 200), "none"))
    price = table.price("draft_target", 8, 3, 200)
    assert price.seconds == pytest.approx(2.0 * table.base_s("draft_target", 8, 3, 200))
    assert price.u == pytest.approx((NOISE_FLOOR ** 2 + PRIOR_U ** 2) ** 0.5)


def test_a_cell_follows_the_machine_as_it_is_now():
    """An exponential window: steps that took twice as long from some moment on move the price there."""
    table = _table()
    base = table.base_s("none", 8, 1, 200)
    for seconds in [base] * 200 + [2 * base] * (3 * WINDOW_STEPS):
        table.observe(Step(8, 200, 1, 8, seconds, "none"))
    assert table.price("none", 8, 1, 200).seconds == pytest.approx(2 * base, rel=0.05)


def test_noisy_steps_leave_their_spread_in_the_uncertainty():
    table = _table()
    base = table.base_s("none", 8, 1, 200)
    for i in range(WINDOW_STEPS):
        table.observe(Step(8, 200, 1, 8, base * (0.7 if i % 2 else 1.3), "none"))
    assert 0.02 < table.price("none", 8, 1, 200).u < 0.1  # the spread (30%) over the root of the steps


def test_without_a_profile_the_price_is_what_steps_took():
    table = CostTable()
    table.seed([], 4)  # an engine that times no forward apart (TensorRT-LLM)
    for _ in range(5):
        table.observe(Step(4, 0, 3, 6, 0.02, "ngram"))
    assert table.price("ngram", 4, 3, 0).seconds == pytest.approx(0.02)
    assert table.price("ngram", 4, 5, 0).seconds == pytest.approx(0.02)  # borrowed, unsure
    assert table.price("ngram", 4, 5, 0).u > BORROWED_U


def test_without_a_profile_a_shape_never_run_lies_between_the_steps_that_bracket_it():
    """TensorRT-LLM pads every row's drafts, so a worker that ran only n-gram k=8 at batch 32 has
    seen width 9 alone, at 1-32 rows (admission and drain). Plain decoding at 32 rows costs at
    least the step of 3 rows (27 tokens) and at most the step of 32 rows of width 9: priced midway,
    the half-range its uncertainty, which covers the regime's own price of it (the nearest step
    alone, the rule before, priced it 29% dear)."""
    regime, context = REGIMES["trtllm"], 300
    table = CostTable()
    for rows in range(1, 33):
        for _ in range(3):
            table.observe(Step(rows, context, 9, rows * 3, regime.step(rows, 9, context, "ngram").total, "ngram"))
    low, high = regime.step(3, 9, context, "ngram").total, regime.step(32, 9, context, "ngram").total
    plain, true = table.price("none", 32, 1, context), regime.step(32, 1, context).total
    assert plain.seconds == pytest.approx((low + high) / 2) and plain.u == pytest.approx((high - low) / (high + low))
    assert plain.seconds * (1 - plain.u) <= true <= plain.seconds * (1 + plain.u)
    assert abs(plain.seconds / true - 1) < abs(high / true - 1) / 2
    # a width between two run is bracketed by them: k=6's verify at 32 rows, from k=4's and k=8's
    for _ in range(3):
        table.observe(Step(32, context, 5, 64, regime.step(32, 5, context, "ngram").total, "ngram"))
    k6 = table.price("ngram", 32, 7, context)
    assert regime.step(32, 5, context, "ngram").total < k6.seconds < high
    assert k6.seconds == pytest.approx(regime.step(32, 7, context, "ngram").total, rel=k6.u)


@pytest.mark.parametrize("name", ["cpu", "gpu-roofline", "h200-torch"])
@pytest.mark.parametrize("batch", [32, 128])
def test_a_forward_of_fewer_tokens_than_the_batchs_is_priced_from_a_timed_single_row(name, batch):
    """A drain runs fewer rows than the profile's batch: the profile times one row too, so such a
    forward lies between timed ones (a CPU pays for every token, a memory-bound GPU for none), not
    flat at the batch's smallest forward, which made a wide verify of a few rows on a CPU look as
    cheap as a plain step of them, nor on a line through the batch's two smallest, which a GPU's
    batch of 128 past its ridge takes far below its floor."""
    regime, table = REGIMES[name], _table(name, batch=batch)
    for rows, width in ((6, 1), (6, 5), (2, 9), (1, 1), (40, 1)):
        assert table.forward_s(rows, width, 200) == pytest.approx(regime.forward_s(rows, width, 200), rel=0.1)
