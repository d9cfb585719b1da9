"""The cost profile (batchspec.predict.cost) and the schedule replay (batchspec.predict.replay) on constructed costs."""

from __future__ import annotations

import pytest

from batchspec.engine.base import ADMIT_WINDOW, StepCost, admission_order
from batchspec.predict.cost import ARM_KEPT, CostProfile, profile_grid
from batchspec.predict.replay import RowPlan, predict_decode_s


def profile_of(points: list[tuple]) -> CostProfile:
    profile = CostProfile()
    profile.merge([StepCost(*p) for p in points], 1.0)
    return profile


def test_profile_prices_a_forward_by_its_tokens_in_all_and_its_context():
    p = profile_of([("target", "m", 8, 100, 1, 1.0), ("target", "m", 8, 100, 5, 2.0), ("target", "m", 8, 300, 1, 1.5),
                    ("target", "m", 1, 100, 1, 0.5), ("target", "m", 1, 100, 5, 0.5)])
    assert p.target_s(8, 100, 1) == 1.0 and p.target_s(8, 100, 5) == 2.0
    assert p.target_s(8, 100, 3) == pytest.approx(1.5)  # 24 tokens: between 8 (1.0) and 40 (2.0)
    assert p.target_s(8, 200, 5) == pytest.approx(2.0 * 1.25)  # x the context factor
    assert p.target_s(1, 100, 3) == pytest.approx(0.5)
    # rows x tokens, whichever batch measured them: 4 x 5 = 20 tokens, between 8 and 40; 2 x 2 = 4
    # and 4 x 1 between 5 (0.5, one row) and 8 (1.0, eight rows)
    assert p.target_s(4, 100, 5) == pytest.approx(1.0 + (2.0 - 1.0) * 12 / 32)
    assert p.target_s(2, 100, 2) == p.target_s(4, 100, 1) == pytest.approx(0.5)
    assert p.target_s(7, 100, 1) == pytest.approx(0.5 + 0.5 * 2 / 3)
    assert p.target_s(6, 200, 1) == pytest.approx((0.5 + 0.5 * 1 / 3) * 1.25)
    same = profile_of([("target", "m", 4, 100, 1, 1.0), ("target", "m", 4, 100, 2, 2.0), ("target", "m", 2, 100, 2, 3.0)])
    assert same.target_s(4, 100, 1) == pytest.approx(2.0)  # 4 tokens measured twice, 1.0 and 3.0: their mean


def test_a_cost_timed_in_a_quiet_moment_does_not_make_wider_steps_cheaper():
    p = profile_of([("target", "m", 8, 100, 1, 1.0), ("target", "m", 8, 100, 3, 0.7), ("target", "m", 8, 100, 5, 2.0)])
    assert p.target_s(8, 100, 3) == 1.0  # the running maximum, not 0.7


def test_profile_coverage_and_grid():
    target, drafts = profile_grid(8, 100, 300, 9, ["d"])
    assert (8, 200, 9) in target and (8, 100, 1) in target and (8, 300, 1) in target and (1, 200, 9) in target
    assert (4, 200, 1) in target and (4, 200, 9) in target  # half the batch: the steps of a batch not full
    assert {b for b, _, _ in profile_grid(2, 100, 300, 9)[0]} == {1, 2} and {b for b, _, _ in profile_grid(1, 100, 300, 9)[0]} == {1}
    assert {d for d, *_ in drafts} == {"d"} and ("d", 8, 200, 2) in drafts  # a step that feeds two tokens
    p = profile_of([("target", "m", *t, 1.0) for t in target] + [("draft", "d", b, c, w, 0.1) for _, b, c, w in drafts])
    assert p.covers(8, 100, 300, 9, ["d"]) and p.covers(8, 60, 360, 5)
    one_wide = profile_of([("target", "m", *t, 1.0) for t in target] + [("draft", "d", b, c, 1, 0.1) for _, b, c, _ in drafts])
    assert not one_wide.covers(8, 100, 300, 9, ["d"])  # measured before the two-token step was: measured again
    assert not p.covers(3, 100, 300, 9) and not p.covers(8, 100, 300, 10) and not p.covers(8, 100, 300, 9, ["other"])
    assert p.covers(4, 100, 300, 9)  # half the batch was measured at every width it needs
    # the width curve sits at the middle context, 200: it prices shards whose middle is within 2x of
    # it; within 4x too where a plain step at the shard's lo and hi, timed, costs about the same
    assert p.covers(8, 10, 790, 9) and p.covers(8, 50, 150, 9)  # middle 400 and 100: 2x
    assert p.context_probe(8, 10, 790, 9) == []  # covered: nothing to time
    assert not p.covers(8, 1600, 1800, 9) and p.context_probe(8, 1600, 1800, 9) == []  # 8.5x: a new grid
    assert not p.covers(8, 20, 40, 9) and p.context_probe(8, 20, 40, 9) == []  # 6.7x
    assert not p.covers(8, 100, 710, 9) and not p.covers(8, 50, 140, 9)  # middle 405 and 95: lo or hi never timed
    assert p.context_probe(8, 100, 710, 9) == [(8, 710, 1)] and p.context_probe(8, 50, 140, 9) == [(8, 50, 1)]
    p.merge([StepCost("target", "m", 8, 710, 1, 1.1), StepCost("target", "m", 8, 50, 1, 0.9)], 0.1)  # timed: flat
    assert p.covers(8, 100, 710, 9) and p.covers(8, 50, 140, 9)
    steep = profile_of([("target", "m", *t, 1.0 + (t[1] - 100) / 200) for t in target])  # a plain step: 1.0 at 100, 2.0 at 300
    assert steep.covers(8, 100, 300, 9) and steep.covers(8, 200, 600, 9)  # middle 400: 2x
    assert steep.context_probe(8, 400, 600, 9) == [(8, 400, 1), (8, 600, 1)]
    steep.merge([StepCost("target", "m", 8, c, 1, 1.0 + (c - 100) / 200) for c in (400, 600)], 0.1)
    assert not steep.covers(8, 400, 600, 9) and steep.context_probe(8, 400, 600, 9) == []  # timed: 2.5x, 3.5x the curve's


def test_a_second_width_curve_prices_the_contexts_nearer_it():
    near = [("target", "m", 8, 100, 1, 1.0), ("target", "m", 8, 100, 5, 2.0)]
    p = profile_of(near)
    assert p.target_s(8, 800, 5) == pytest.approx(2.0)  # one curve, flat past its one context
    p = profile_of(near + [("target", "m", 8, 800, 1, 3.0), ("target", "m", 8, 800, 5, 9.0)])
    assert p.target_s(8, 800, 5) == pytest.approx(9.0) and p.target_s(8, 100, 5) == pytest.approx(2.0)
    # nearer 800: its curve, x the context factor, a wide step's on the line through the widest
    # points (2.0 at 100, 9.0 at 800: 8.0 at 700), a plain step's through the plain ones
    assert p.target_s(8, 700, 5) == pytest.approx(9.0 * 8.0 / 9.0)
    assert p.target_s(8, 700, 1) == pytest.approx(3.0 * (1.0 + 2.0 * 600 / 700) / 3.0)
    assert p.target_s(8, 200, 5) == pytest.approx(2.0 * 3.0 / 2.0)  # nearer 100
    assert p.covers(8, 600, 1000, 5) and p.covers(8, 50, 150, 5) and not p.covers(8, 1700, 1900, 5)


def test_replay_prices_each_step_as_wide_as_its_widest_row():
    p = profile_of([("target", "m", 2, 10, 1, 1.0), ("target", "m", 2, 10, 3, 2.0),
                    ("target", "m", 1, 10, 1, 0.5), ("target", "m", 1, 10, 3, 1.0)])
    plain = [RowPlan(10, 3, [0, 0, 0], [0, 0, 0]), RowPlan(10, 1, [0], [0])]
    got = predict_decode_s(plain, 2, p)
    assert got.verify_s == pytest.approx(1.0 + 0.5 + 0.5) and got.target_steps == 4 and got.decode_tokens == 4
    spec = [RowPlan(10, 3, [2, 0], [2, 0]), RowPlan(10, 1, [0], [2])]  # step 1 is 3 wide, step 2 has one row left, 1 wide
    got = predict_decode_s(spec, 2, p, "ngram", lookup_per_row_step=0.01)
    assert got.verify_s == pytest.approx(2.0 + 0.5) and got.draft_s == pytest.approx(0.01 * 3)


def test_an_arms_steps_are_priced_at_what_its_confirmations_measured():
    """A speculative method's steps cost on a worker what its confirmations measured them at over
    the points' price (their median, the last ARM_KEPT); plain decoding is priced by the points alone."""
    p = profile_of([("target", "m", 2, 10, 1, 1.0), ("target", "m", 2, 10, 3, 2.0),
                    ("target", "m", 1, 10, 1, 0.5), ("target", "m", 1, 10, 3, 1.0)])
    plain = [RowPlan(10, 3, [0, 0, 0], [0, 0, 0]), RowPlan(10, 1, [0], [0])]
    spec = [RowPlan(10, 3, [2, 0], [2, 0]), RowPlan(10, 1, [0], [2])]
    before, none = predict_decode_s(spec, 2, p, "ngram", None, 0.1, 0.01), predict_decode_s(plain, 2, p, other_per_row_step=0.1)
    assert p.arm_scale("ngram") == 1.0
    p.arm_measured("ngram", None, 1.25)
    assert p.arm_scale("ngram") == 1.25
    after = predict_decode_s(spec, 2, p, "ngram", None, 0.1, 0.01)
    for part in ("decode_s", "verify_s", "draft_s", "other_s"):  # the whole step, as measured
        assert getattr(after, part) == pytest.approx(1.25 * getattr(before, part))
    assert predict_decode_s(plain, 2, p, other_per_row_step=0.1) == none  # plain decoding: the points' price
    # a ratio is measured against the price as it stands (scale included) and kept against the points'
    assert p.arm_measured("ngram", None, 1.0) == 1.0  # as priced now: 1.25 again, and the scale stays
    assert p.arm_measured("ngram", None, 2.0) == 1.0  # 2.5: the median of 1.25, 1.25 and 2.5 stays
    assert p.arm_ratios["ngram"] == pytest.approx([1.25, 1.25, 2.5]) and p.arm_scale("ngram") == pytest.approx(1.25)
    # a prediction made before a ratio moved the scale, as the profile prices it after
    q = profile_of([("target", "m", 2, 10, 1, 1.0)])
    assert q.arm_measured("ngram", None, 1.6) == pytest.approx(1.0 / 1.6)
    assert q.arm_measured("ngram", None, 0.5) == pytest.approx(1.6 / 1.2)  # 0.8: the median of 1.6 and 0.8 is 1.2
    for ratio in (0.0, -1.0, float("nan"), float("inf")):  # nothing measured: nothing kept
        assert p.arm_measured("ngram", None, ratio) == 1.0
    assert p.arm_measured("none", None, 3.0) == 1.0
    assert len(p.arm_ratios["ngram"]) == 3 and p.arm_scale("none") == 1.0 and "none" not in p.arm_ratios
    for _ in range(ARM_KEPT):
        p.arm_measured("ngram", None, 0.5 / p.arm_scale("ngram"))  # 0.5 each, ARM_KEPT times
    assert p.arm_ratios["ngram"] == pytest.approx([0.5] * ARM_KEPT)  # the oldest dropped out
    # a draft model's steps are its own, apart from n-gram lookup's and another draft model's; its
    # prefill of each row is not a step (a confirmation times none) and keeps the points' price
    p.merge([StepCost("draft", "small", b, 10, w, 0.1) for b in (1, 2) for w in (1, 2)]
            + [StepCost("draft_prefill", "small", 1, 0, 10, 0.2)], 0.0)
    plain_draft = predict_decode_s(spec, 2, p, "draft_target", "small", 0.1)
    p.arm_measured("draft_target", "small", 1.5)
    assert p.arm_scale("draft_target", "small") == 1.5 and p.arm_scale("draft_target", "other") == 1.0
    assert p.arm_scale("ngram") == pytest.approx(0.5)
    scaled = predict_decode_s(spec, 2, p, "draft_target", "small", 0.1)
    prefills = 2 * p.draft_prefill_s("small", 10)
    assert prefills > 0 and scaled.draft_s == pytest.approx(1.5 * (plain_draft.draft_s - prefills) + prefills)
    assert scaled.verify_s == pytest.approx(1.5 * plain_draft.verify_s)


def test_replay_prices_a_step_at_the_cache_length_holes_included():
    """Rows of one batch that accept at different steps keep each other's slots (kv.Batch.keep cuts
    only what no row keeps), so the cache attention reads grows faster than either row's context."""
    p = profile_of([("target", "m", 2, 10, 1, 1.0), ("target", "m", 2, 10, 3, 1.0), ("target", "m", 2, 110, 1, 2.0)])
    rows = [RowPlan(10, 5, [2, 0, 0], [2, 2, 2]), RowPlan(10, 5, [0, 2, 0], [2, 2, 2])]
    got = predict_decode_s(rows, 2, p, "ngram")
    # cache 10, 13, 16 slots before the three steps (3 kept each step: 2 drafts + 1 by one row or
    # the other); priced at the pending token's position, cost 1 + (context - 10) / 100
    assert got.verify_s == pytest.approx(1.01 + 1.04 + 1.07)
    assert got.target_steps == 6


def test_replay_admits_the_shortest_prompts_first_as_the_engine_does():
    """decode.Decoder.run admits rows shortest prompt first: of a long row listed first and two
    short ones, the short ones decode together (one step), then the long one alone."""
    p = profile_of([("target", "m", 2, 10, 1, 1.0), ("target", "m", 1, 10, 1, 0.5),
                    ("target", "m", 2, 1010, 1, 11.0), ("target", "m", 1, 1010, 1, 5.5)])
    rows = [RowPlan(1000, 1, [0], [0]), RowPlan(10, 1, [0], [0]), RowPlan(10, 1, [0], [0])]
    got = predict_decode_s(rows, 2, p)
    # the short rows at batch 2, context 11: 1.0 x 1.01; then the long row alone at context 1001:
    # 5.5 x (0.5 + 5.0 x 991 / 1000) / 5.5. In list order the long row would share the first step
    # (10.91 at context 1001) and a short one run alone (0.505): 11.415
    assert got.verify_s == pytest.approx(1.01 + 5.455)


def test_admission_sorts_within_windows_of_the_input_and_puts_first_rows_first():
    """The engine and the replay admit by one rule: the rows named first (shortest first), then
    the rest in windows of ADMIT_WINDOW x batch rows, in input order, each shortest first."""
    lengths = [50, 40, 30, 20, 10, 5, 60, 1, 2, 3]
    # batch 1: windows of 8 over the rows not named first; row 9 named first
    order = admission_order(lengths, 1, first=[9])
    rest = [i for i in range(10) if i != 9]
    assert order == [9, *sorted(rest[:ADMIT_WINDOW], key=lambda i: lengths[i]), rest[ADMIT_WINDOW]]
    assert order == [9, 7, 5, 4, 3, 2, 1, 0, 6, 8]  # row 8 (length 2) waits for its window
    # a batch whose window holds every row: shortest prompt first overall, ties in input order
    assert admission_order([3, 1, 3, 1], 4) == [1, 3, 0, 2]
    assert sorted(admission_order(lengths, 2, first=[0, 0, 99])) == list(range(10))  # each row once


def test_replay_keeps_a_later_windows_short_rows_after_the_first_windows_long_ones():
    """At batch 1 the replay admits as the engine does: 8 long rows, then a short one, runs the
    short one last, alone, at its own short context (the long rows' cache is gone by then)."""
    p = profile_of([("target", "m", 1, 10, 1, 1.0), ("target", "m", 1, 1010, 1, 11.0)])
    rows = [RowPlan(1000, 1, [0], [0])] * ADMIT_WINDOW + [RowPlan(10, 1, [0], [0])]
    got = predict_decode_s(rows, 1, p)
    # each long row at context 1001 (1 + 10 x 991 / 1000 = 10.91), the short one at 11 (1.01)
    assert got.verify_s == pytest.approx(ADMIT_WINDOW * 10.91 + 1.01)
    assert got.target_steps == ADMIT_WINDOW + 1


def test_replay_prices_a_draft_models_two_token_catch_up_after_every_draft_was_accepted():
    """drafters.ModelDrafter.commit: a row whose k drafts were all accepted has its last draft
    still to feed, so the draft's first step of the next round feeds it two tokens (the batch's
    step as wide as its widest row); every other draft step feeds one."""
    p = profile_of([("target", "m", 2, 10, 1, 1.0), ("target", "m", 2, 10, 3, 1.0),
                    ("draft", "d", 2, 10, 1, 0.1), ("draft", "d", 2, 10, 2, 0.3)])
    # k = 2, three rounds: row 0 accepts all, then 1, then all; row 1 accepts 0, 0, 2
    rows = [RowPlan(10, 7, [2, 1, 2], [2, 2, 2]), RowPlan(10, 5, [0, 0, 2], [2, 2, 2])]
    got = predict_decode_s(rows, 2, p, "draft_target", "d")
    # round 1: 0.1 + 0.1 (fresh rows: the first token only); round 2: 0.3 + 0.1 (row 0 accepted
    # both); round 3: 0.1 + 0.1 (no row accepted every draft of round 2)
    assert got.draft_s == pytest.approx(0.2 + 0.4 + 0.2)


def test_batches_measured_at_different_contexts_price_together():
    """A worker's profile can hold batches measured for different shards, at contexts the others
    lack: the context factor interpolates rather than looks a context up."""
    p = profile_of([("target", "m", 8, 100, 1, 1.0), ("target", "m", 8, 100, 3, 2.0), ("target", "m", 8, 300, 1, 2.0),
                    ("target", "m", 8, 500, 1, 3.0), ("target", "m", 4, 200, 1, 0.6), ("target", "m", 4, 200, 3, 1.2)])
    assert p.target_s(4, 200, 1) == pytest.approx(0.6)  # its own curve at its own context: factor 1
    assert p.target_s(4, 400, 1) == pytest.approx(0.6 * 2.5 / 1.5)  # batch 8's factor, 2.5 at 400 over 1.5 at 200


def test_the_context_factor_is_a_line_fitted_through_the_plain_steps_timed():
    """A plain step timed at several contexts, one of them in a noisy moment: the factor follows
    the least-squares line through them, not the noisy point. Timed over 66..105 alone (the code
    shard at batch 8 of bench/step_prices.py, 2026-12-03: 72.6, 72.4 and 81.0 ms) any line prices
    a step at 250 slots near 1.45x one at 85, where steps timed at 85..250 cost within 10% of
    one another: what mends that is timing out to the slots the steps read (shape_of,
    slots_reach), and then the noisy point at 105 no longer lifts every context past it, as the
    running maximum through the points did (1.12x). Points that fall give a flat factor: a
    longer context never costs less."""
    curve = [("target", "m", 8, 85, 1, 72.4), ("target", "m", 8, 85, 5, 164.7)]
    p = profile_of(curve + [("target", "m", 8, 66, 1, 72.6), ("target", "m", 8, 105, 1, 81.0)])
    # the line: slope 0.2175 ms per slot through the mean (85.33, 75.33); 72.4 at 85 would be 75.26 on it
    slope = (-19.33 * -2.733 + -0.333 * -2.933 + 19.667 * 5.667) / (19.33 ** 2 + 0.333 ** 2 + 19.667 ** 2)
    on = lambda c: 75.333 + slope * (c - 85.333)  # noqa: E731
    assert p.target_s(8, 250, 5) == pytest.approx(164.7 * on(250) / on(85), rel=1e-3)
    wide = profile_of(curve + [("target", "m", 8, 66, 1, 72.6), ("target", "m", 8, 105, 1, 81.0),
                               ("target", "m", 8, 174, 1, 74.0), ("target", "m", 8, 274, 1, 75.0)])
    assert wide.target_s(8, 250, 5) == pytest.approx(164.7, rel=0.05)  # timed out to 274: about flat, as measured
    falling = profile_of(curve + [("target", "m", 8, 300, 1, 60.0)])
    assert falling.target_s(8, 300, 5) == pytest.approx(164.7) and falling.target_s(8, 30, 5) == pytest.approx(164.7)


def test_a_verify_moves_with_context_by_the_widest_verify_timed_at_two_contexts():
    """The grid times the widest verify at the shard's lo too, and a wider step's context factor
    follows the line through it, a plain step's the plain steps': on a CPU at batch 8 a verify at
    half the curve's context costs 0.78-0.83x, a plain step 0.88x, and by the plain steps' line
    verifies below the curve's context were priced 6-12% dear against plain decoding
    (bench/verify_context.py). The pair at lo is no width curve."""
    target, _ = profile_grid(8, 100, 300, 9)
    assert (8, 100, 9) in target and (8, 300, 9) not in target and (8, 100, 5) not in target
    # no width between 1 and the widest: the pair at lo would be a second curve, priced nearer, re-timed never
    assert all({w for b, c, w in profile_grid(8, 100, 300, m)[0] if c == 100} == {1} for m in (1, 2, 3))
    assert {w for b, c, w in profile_grid(8, 100, 300, 4)[0] if c == 100} == {1, 4}
    plain = [("target", "m", 8, c, 1, s) for c, s in ((100, 1.0), (200, 1.2), (300, 1.4))]
    curve = [("target", "m", 8, 200, w, s) for w, s in ((3, 2.0), (5, 2.6), (9, 3.0))]
    p = profile_of(plain + curve + [("target", "m", 8, 100, 9, 2.0)])
    assert p.width_curve(8, 100, 300) == [(8, 200, 1), (8, 200, 3), (8, 200, 5), (8, 200, 9)]
    assert p.covers(8, 100, 300, 9)
    assert p.target_s(8, 100, 9) == pytest.approx(2.0)  # as timed
    assert p.target_s(8, 100, 5) == pytest.approx(2.6 * 2.0 / 3.0)  # the widest's line: 2.0 at 100, 3.0 at 200
    assert p.target_s(8, 100, 1) == pytest.approx(1.0) and p.target_s(8, 300, 1) == pytest.approx(1.4)
    assert p.target_s(8, 300, 5) == pytest.approx(2.6 * 4.0 / 3.0)  # the line goes on past 200
    before = profile_of(plain + curve)  # no verify timed at another context: the plain step's factor
    assert before.target_s(8, 100, 9) == pytest.approx(3.0 / 1.2)


def test_a_retimed_point_is_priced_at_the_mean_of_its_last_timings():
    """CostProfile.retime: each point re-timed is priced at the mean of its last TIMINGS_KEPT
    timings, the first the profile held included, the oldest dropping out; a point measured
    afresh by `merge` starts again from its new timing. `width_curve` names the curve that
    prices a shard's contexts, narrowest first."""
    from batchspec.predict.cost import TIMINGS_KEPT

    def at(profile, w):
        return next(p.seconds for p in profile.points if p.key == ("target", "m", 8, 100, w))

    profile = CostProfile()
    profile.merge([StepCost("target", "m", 8, 100, w, 0.1 * w) for w in (1, 3, 5)]
                  + [StepCost("target", "m", 8, 40, 1, 0.05)], 1.0)
    assert profile.width_curve(8, 60, 140) == [(8, 100, 1), (8, 100, 3), (8, 100, 5)]
    assert profile.width_curve(4, 60, 140) == []
    profile.retime([StepCost("target", "m", 8, 100, 1, 0.3)], 0.5)
    assert at(profile, 1) == pytest.approx(0.2) and at(profile, 3) == pytest.approx(0.3)  # (0.1 + 0.3) / 2; untouched
    assert profile.measured_s == pytest.approx(1.5)
    for t in (0.5, 0.7, 0.9):
        profile.retime([StepCost("target", "m", 8, 100, 1, t)], 0.0)
    assert TIMINGS_KEPT == 4 and at(profile, 1) == pytest.approx((0.3 + 0.5 + 0.7 + 0.9) / 4)  # 0.1 dropped out
    assert len([p for p in profile.points if p.key == ("target", "m", 8, 100, 1)]) == 1
    profile.merge([StepCost("target", "m", 8, 100, 1, 0.2)], 0.0)
    profile.retime([StepCost("target", "m", 8, 100, 1, 0.4)], 0.0)
    assert at(profile, 1) == pytest.approx(0.3)  # the merge's 0.2 and 0.4: the older timings forgotten


def test_a_price_is_worked_out_once_while_the_points_stand():
    """CostProfile._cost keeps each price it works out (a drift check prices every arm over its
    window every few rows); a merge, a re-time or a point added in place prices afresh."""
    profile = profile_of([("target", "m", 8, 100, 1, 1.0), ("target", "m", 8, 100, 5, 2.0), ("target", "m", 8, 300, 1, 1.5)])
    worked = []
    priced = profile._priced
    profile._priced = lambda *key: worked.append(key) or priced(*key)
    first = profile.target_s(8, 200, 5)
    assert profile.target_s(8, 200, 5) == first == pytest.approx(2.5) and len(worked) == 1
    profile.retime([StepCost("target", "m", 8, 100, 5, 4.0)], 0.0)  # priced at (2.0 + 4.0) / 2
    assert profile.target_s(8, 200, 5) == pytest.approx(3.0 * 1.25) and len(worked) == 2
    profile.points.append(StepCost("target", "m", 8, 200, 1, 2.5))  # the plain line through 1.0, 2.5, 1.5
    fresh = CostProfile(list(profile.points))
    assert profile.target_s(8, 200, 1) == fresh.target_s(8, 200, 1) == pytest.approx(1.0 * (5 / 3) / (5 / 3 - 0.25))
    assert len(worked) == 3
    profile.merge([StepCost("target", "m", 8, 100, 5, 2.0)], 0.0)
    assert profile.target_s(8, 100, 5) == pytest.approx(2.0) and len(worked) == 4


def test_a_warm_profile_prices_as_a_cold_one_whatever_it_priced_before():
    """_priced keeps what it reads of the points whatever the context (the curves of each batch
    size, each curve's lines, `_Moved`) and each context's line whatever the batch and width: a profile that has priced many steps, at contexts nearer
    one curve and then the other, prices every step as a profile that priced nothing before."""
    import random

    rng = random.Random(3)
    target, _ = profile_grid(8, 120, 700, 9, [])
    points = [StepCost("target", "m", b, c, w, rng.uniform(0.5, 2.0) * 0.001 * b * w * (1 + c / 400))
              for b, c, w in target]
    points += [StepCost("target", "m", 8, 2400, w, 0.004 * w) for w in (1, 5, 9)]  # a second curve, far off
    warm = CostProfile(list(points))
    asks = [(rng.randint(1, 8), rng.randint(1, 5000), rng.choice([1, 2, 3, 5, 9])) for _ in range(400)]
    # ... and a few contexts again at every batch and width (each context's line is kept, whatever asked it first)
    asks += [(b, c, w) for c in rng.sample([c for _, c, _ in asks], 5) + [120, 700, 2400] for b in range(1, 9) for w in (1, 2, 4, 9)]
    for ask in asks:
        assert warm.target_s(*ask) == CostProfile(list(points)).target_s(*ask), ask
