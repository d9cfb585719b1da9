"""Goodput at other draft lengths from one measured probe (batchspec.predict.probe): the i.i.d.
model of Leviathan et al. and the per-position (bursty) one, on constructed measurements."""

from __future__ import annotations

import pytest

from batchspec.predict.probe import (
    acceptance_from_mean_len,
    expected_tokens_per_step,
    predict_tokens_per_s,
    tokens_per_step,
)
from batchspec.stats import ArmResult


@pytest.mark.parametrize("a,k", [(0.0, 3), (0.5, 4), (0.8, 2), (0.95, 8)])
def test_acceptance_is_recovered_from_the_mean_accepted_length(a, k):
    assert expected_tokens_per_step(a, k) == pytest.approx((1 - a ** (k + 1)) / (1 - a))
    assert acceptance_from_mean_len(expected_tokens_per_step(a, k), k) == pytest.approx(a, abs=1e-6)


def test_prediction_follows_leviathan_with_measured_costs():
    # baseline: 100 steps of 10 ms verify + 1 ms other; probe k=4: verify 14 ms, draft 2 ms (a draft
    # model: linear in k), other 1 ms per step, a = 0.7, one row decoding.
    a, k0 = 0.7, 4
    mean_len = expected_tokens_per_step(a, k0)
    base = ArmResult("none", 0, decode_tokens=100, target_steps=100, verify_s=1.0, other_s=0.1, mean_accepted_len=1.0)
    steps = 100
    probe = ArmResult("draft_target", k0, decode_tokens=round(steps * mean_len), target_steps=steps, verify_s=1.4,
                      draft_s=0.2, other_s=0.1, mean_accepted_len=mean_len)
    for k in (1, 2, 4, 6):
        per_step = (0.010 + (0.014 - 0.010) * k / k0) + 0.002 * k / k0 + 0.001
        rows = probe.decode_tokens / (steps * mean_len)
        expected = rows * expected_tokens_per_step(a, k) / per_step
        assert predict_tokens_per_s(probe, k, base) == pytest.approx(expected, rel=1e-3)
    # the probe's own draft length predicts (close to) what was measured
    measured = probe.decode_tokens / (probe.verify_s + probe.draft_s + probe.other_s)
    assert predict_tokens_per_s(probe, k0, base) == pytest.approx(measured, rel=0.01)


def test_bursty_acceptance_is_extrapolated_with_the_continuation_rate():
    """Copied text: the first draft is accepted on 60% of steps, but an accepted draft is followed by
    another 90% of the time. The per-position counts carry that; the mean length alone cannot."""
    probe = ArmResult("ngram", 2, target_steps=100, accepted_tokens=114, mean_accepted_len=2.14, accepted_at=[60, 54])
    assert tokens_per_step(probe, 2) == pytest.approx(2.14)  # the probe's own length: what was measured
    assert tokens_per_step(probe, 4) == pytest.approx(1 + 0.6 * (1 - 0.9**4) / 0.1)
    iid = expected_tokens_per_step(acceptance_from_mean_len(2.14, 2), 4)
    assert tokens_per_step(probe, 4) > iid + 0.3  # the i.i.d. fit under-predicts long drafts here
    # a position never accepted counts as zero: 50 of 100 first drafts, never a second or third
    assert tokens_per_step(ArmResult("ngram", 4, target_steps=100, mean_accepted_len=1.5, accepted_at=[50]), 8) == pytest.approx(1.5)
    # no per-position counts (an engine that does not report them): the i.i.d. model
    bare = ArmResult("ngram", 2, target_steps=100, mean_accepted_len=2.14)
    assert tokens_per_step(bare, 4) == pytest.approx(iid)


def test_ngram_draft_cost_does_not_scale_with_k():
    base = ArmResult("none", 0, decode_tokens=50, target_steps=50, verify_s=0.5, other_s=0.05, mean_accepted_len=1.0)
    probe = ArmResult("ngram", 4, decode_tokens=100, target_steps=50, verify_s=0.5, draft_s=0.05, other_s=0.05,
                      mean_accepted_len=2.0)
    # flat verify cost and flat lookup cost: longer drafts only add expected tokens
    assert predict_tokens_per_s(probe, 8, base) > predict_tokens_per_s(probe, 4, base) > predict_tokens_per_s(probe, 2, base)
