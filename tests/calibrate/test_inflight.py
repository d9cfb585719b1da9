"""Calibration in flight (batchspec.calibrate.inflight): a shard is one generate call; its sample
decodes plainly in the shard's own batch, the decision switches the rows in flight, the
confirmation is measured on the arm's own steps, and the drift checks run on chunks of finished
rows, all without a row generated twice or a greedy token changed."""

from __future__ import annotations

import pytest

from batchspec.calibrate import CalibrationSettings, WorkerCalibration
from batchspec.calibrate.pricing import Anchor
from batchspec.calibrate.confirm import confirmed_speedup, sandwiched
from batchspec.calibrate.inflight import InFlight
from batchspec.calibrate.pricing import anchor_of_steps, arm_price_s, as_plain, plain_price_s
from batchspec.engine.base import (
    NO_SPEC,
    Completion,
    GenerateResult,
    Progress,
    Request,
    SamplingParams,
    SpecConfig,
    Step,
    StepCost,
    Timing,
)
from batchspec.predict.cost import CostProfile
from batchspec.shard import ShardInput, run_shard
from tests.data import LENIENT, word_rows

SELF = [SpecConfig("draft_target", k, draft_model="self") for k in (1, 2, 4)] + [SpecConfig("ngram", 3)]


def test_a_shard_calibrates_inside_its_own_batch(tiny_engine):
    """One generate call: the sample (8 evenly spaced rows) goes first and decodes plainly; every
    arm is predicted from it; the key's first shard confirms the best arm on its own steps in the
    batch; the outputs are plain greedy's; the profile is the worker's for the next shard."""
    worker = WorkerCalibration()
    rows = word_rows(32)
    settings = CalibrationSettings(max_tokens=24, sample_size=8, prediction_error=LENIENT)
    shard = run_shard(tiny_engine, ShardInput("s0", "k", rows), SELF, True, 4, settings, worker=worker)
    st, d = shard.stats, shard.decision
    plain = tiny_engine.generate(rows, NO_SPEC, 4)
    assert [c.token_ids for c in shard.completions] == [c.token_ids for c in plain.completions]
    assert [c.id for c in shard.completions] == [r.id for r in rows]
    by = {a.label: a for a in d.arms}
    assert list(by) == ["none"] + [a.label for a in SELF]
    for k in (1, 2, 4):  # the target drafting for itself: every draft accepted, exactly
        assert by[f"draft_target:k={k}"].acceptance_rate == 1.0 and by[f"draft_target:k={k}"].acceptance_exact
    assert "the sample decoded in the shard's batch (8 rows done, 24 to go)" in d.reason
    sample = [0, 4, 8, 12, 16, 20, 24, 28]
    assert all(shard.row_specs[i] is NO_SPEC for i in sample)  # all finished (24 tokens < the cap) before the decision
    assert st.calibration_rows_kept == 8 and d.finished == {}  # nothing generated apart, nothing kept apart
    # confirmed: the best arm ran on from the decision, measured on its own steps
    best = max((a for a in d.arms if a.predicted_speedup), key=lambda a: a.predicted_speedup)
    assert d.confirmed and "k" in worker.confirmed_keys and worker.errors["k"]
    assert best.measured and best.speedup and f"confirmed (first shard of its key on this worker): {best.label} " \
        f"at {best.speedup:.2f}x plain decoding: its " in d.reason
    assert any(s.label == best.label for s in shard.row_specs)  # rows finished under it
    # what its steps took over their price is how the worker prices the method's steps from now on
    took = float(d.reason.split("x the profile's price")[0].rsplit(" took ", 1)[1])
    spec = next(a for a in SELF if a.label == best.label)
    assert worker.profile.arm_ratios and abs(worker.profile.arm_scale(spec.method, spec.draft_model) - took) <= 0.005
    assert d.profile_s > 0 and worker.profile.points and st.profile_s == d.profile_s
    # what calibration costs is the control's own time, all of it not kept as output
    assert 0 < st.calibration_s == st.calibration_overhead_s < st.wall_s
    # the next shard of the key: the profile is reused, and no confirmation unless near the margin
    worker.errors["k"], worker.recent = [0.0], [0.0]  # as if every prediction had matched exactly
    settled = worker.settled["k"]  # what the first shard's last rows ran under: its sample's setting next
    owed = bool(worker.profile.owed)  # the smaller batches' points, where the first shard's budget did not hold them
    assert owed == ("left to the worker's next shard at batch 4" in d.reason)
    again = run_shard(tiny_engine, ShardInput("s1", "k", rows), SELF, True, 4,
                      CalibrationSettings(max_tokens=24, sample_size=8, margin=9.0), worker=worker)
    assert (again.decision.profile_s > 0.0) == owed and not worker.profile.owed and not again.decision.confirmed
    assert "speculative steps priced at what confirmations measured them at on this worker: " in again.decision.reason
    assert again.stats.spec_method == "none"  # no arm commits 10 tokens a round: none can beat 10x
    assert all(again.row_specs[i] == settled for i in sample) and worker.settled["k"] is NO_SPEC
    assert [c.token_ids for c in again.completions] == [c.token_ids for c in plain.completions]


def flat_profile(batch_size: int, draft: str = "self") -> WorkerCalibration:
    """A worker whose made-up profile makes every forward cost 1 s at any width (a GPU's flat
    verify, exaggerated) and a draft step 0.1 s, covering these tests' shards: predictions that do
    not depend on the machine's load."""
    worker = WorkerCalibration()
    worker.profile.merge([StepCost("target", "tiny", b, c, w, 1.0) for b in {1, batch_size // 2 or 1, batch_size}
                          for c in (4, 8, 16, 32, 64, 128) for w in (1, 9)]
                         + [StepCost("draft", draft, b, c, t, 0.1) for b in {1, batch_size} for c in (4, 16, 64, 128)
                            for t in (1, 2)], 0.0)
    return worker


def test_the_decision_comes_when_the_sample_reaches_the_cap_and_its_rows_go_on(tiny_engine):
    """Sample rows whose budget is longer than the calibration cap are predicted from their first
    `max_tokens` tokens (a prefix of plain output is plain output) while they are still in flight;
    they finish under the decision, token for token as plain decoding would."""
    rows = [Request(r.id, r.prompt, params=SamplingParams(max_tokens=40)) for r in word_rows(16)]
    arm = SpecConfig("draft_target", 3, draft_model="self")
    control = InFlight(tiny_engine, rows, [arm], 4, CalibrationSettings(max_tokens=8, sample_size=4, confirm=False),
                       flat_profile(4), key="k")
    ran = tiny_engine.generate(rows, NO_SPEC, 4, control=control)
    decision, specs = control.close(ran)
    assert decision.chosen == arm and decision.profile_s == 0.0  # every draft accepted, a flat verify: it pays
    assert "the sample decoded in the shard's batch (0 rows done, 16 to go)" in decision.reason  # decided at the cap
    assert all(specs[i] == arm for i in control.first)  # ... and the sample finished under the arm
    assert all(ran.completions[i].draft_tokens > 0 for i in control.first)
    assert control.ran and all(s == arm for s, _, _ in control.ran)  # the arm's stretches, measured ...
    # ... against the made-up profile's price at the sample's anchor: it prices a draft step (here the
    # target itself) at a tenth of a forward and a 4-wide verify as a plain step, so the arm's steps
    # took far longer than priced (about 3x on a quiet machine; 1.36x once beside another test process,
    # whose load slowed the sample's plain steps, the anchor, more than the arm's)
    assert control.watch.ratio > 1.0
    plain = tiny_engine.generate(rows, NO_SPEC, 4)
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in plain.completions]


def far_shard(tiny_engine):
    """A key's first shard of 32 rows at batch 4 with one arm, a draft that is almost never right,
    near the margin (a lenient error), so that it is confirmed: (rows, the arm, the control, the
    run, the decision, each row's setting)."""
    rows = word_rows(32)
    far = SpecConfig("draft_target", 4, draft_model="far")
    control = InFlight(tiny_engine, rows, [far], 4, CalibrationSettings(max_tokens=24, sample_size=8, prediction_error=LENIENT),
                       flat_profile(4, "far"), key="k")
    ran = tiny_engine.generate(rows, NO_SPEC, 4, control=control)
    d, specs = control.close(ran)
    return rows, far, control, ran, d, specs


def test_a_confirmed_loss_sends_the_shard_back_to_plain_decoding_and_counts_as_overhead(tiny_engine):
    """A draft that is almost never right, near the margin (a lenient error): the confirmation
    measures it losing on its own steps, the rows after it run plainly, and the time it lost
    counts as calibration's."""
    rows, far, control, ran, d, specs = far_shard(tiny_engine)
    arm = d.arms[1]
    assert d.confirmed and arm.measured and arm.speedup < 1.0 and d.chosen is NO_SPEC and d.reason.endswith("-> none")
    assert any(s == far for s in specs)  # the arm ran ...
    assert all(specs[i] is NO_SPEC for i in control.order[-8:])  # ... and the rows that finished last ran plainly
    assert control.lost_s > 0 and d.calibration_s == d.overhead_s >= control.lost_s
    # the drift window prices the arm as the confirmation measured it against the sample's prediction,
    # as the profile now prices the arm: the ratio its steps measured (kept, its first) is in both.
    # Beside other test processes (CI runs them in parallel) plain decoding's steps before and after
    # the window can stand more than DISTURBED apart: then the ratio is not kept (the case
    # test_a_window_whose_plain_prices_disagree_can_lower_the_prediction_not_raise_it forces), and the
    # arm's scale stays 1.0 in both places
    scale = control.worker.profile.arm_scale(far.method, far.draft_model)
    if "the machine moved while the window was measured" in d.reason:
        assert scale == 1.0 and control.worker.profile.arm_ratios == {}
    else:
        assert scale != 1.0 and control.worker.profile.arm_ratios == {f"draft_target:{far.draft_model}": [scale]}
    assert control.watch.discount == {far.label: pytest.approx(arm.speedup / (arm.predicted_speedup / scale))}


def test_plain_decoding_before_and_after_the_arms_steps_prices_them_at_the_faster():
    """`sandwiched`: of the anchors measured on either side of the arm's steps, the one that
    prices plain decoding of them the lower counts, whichever side it was on (a slowed stretch
    never stands for the machine's speed)."""
    profile = CostProfile([StepCost("target", "m", b, c, w, 0.01 * b * w) for b in (1, 4) for c in (10, 100) for w in (1, 3)])
    steps = [Step(4, 30, 3, 10), Step(4, 33, 3, 6)]
    slowed, now = Anchor(1.46, 0.001), Anchor(1.0, 0.001)
    for anchors in ([slowed, now], [now, slowed]):
        anchor, price, prices = sandwiched(steps, anchors, profile)
        assert anchor is now and price == pytest.approx(plain_price_s(steps, now, profile)) == min(prices)
        assert prices == [pytest.approx(plain_price_s(steps, a, profile)) for a in anchors]
    assert sandwiched(steps, [slowed], profile)[0] is slowed


def slow_sample(monkeypatch, factor: float) -> None:
    """Every sample's anchor `factor` times slower than it measured (a slowed sample's)."""
    from batchspec.calibrate import inflight

    real = inflight.predict_sample

    def slowed(*args, **kwargs):
        v = real(*args, **kwargs)
        v.anchor = Anchor(factor * v.anchor.scale, v.anchor.other)
        return v

    monkeypatch.setattr(inflight, "predict_sample", slowed)


def window_prices(reason: str) -> tuple[float, float, int]:
    """A confirmation's two plain prices of its window (before, after, over the window's time) and
    the plain steps after it, as its reason gives them."""
    said = reason.split("plain decoding's steps before them price them at ")[1].split("x: the faster counts")[0]
    return float(said.split("x, its ")[0]), float(said.rsplit(" at ", 1)[1]), int(said.split("x, its ")[1].split(" steps")[0])


def test_an_arm_that_beat_only_a_slowed_sample_is_measured_against_plain_decoding_after_it(tiny_engine, monkeypatch):
    """The Xeon's later continue shard (f3e5e99): the sample's plain steps ran slow (1.46x the
    price), the arm's ran fast, and 19 steps set against the sample alone measured a losing arm
    at 1.15x. Here the sample's anchor is made ten times slower than it measured: against it
    alone a draft that is almost never right would pay; plain decoding after the arm's steps
    prices them at the machine's speed, the faster counts, and the arm loses. Plain decoding's
    rows after the arm's are kept, no token changes, and the worker's anchor is the later one."""
    slow_sample(monkeypatch, 10)
    rows, far, control, ran, d, specs = far_shard(tiny_engine)
    before, after, after_steps = window_prices(d.reason)
    assert before > 1.0 > after  # the slowed side would have paid
    ran_steps = int(d.reason.split("draft_target:k=4 at ")[1].split(" its ")[1].split(" steps")[0])
    assert ran_steps <= after_steps <= ran_steps + 4  # plain decoding after the window: as many steps as it ran
    assert d.confirmed and d.arms[1].speedup <= after + 0.005 and d.chosen is NO_SPEC
    done = [specs[i] for i in control.order]
    assert far in done and NO_SPEC in done[done.index(far):]  # the arm's rows, then plain decoding's
    assert control.worker.anchor is control.watch.anchor and control.worker.anchor.scale < control.verdict.anchor.scale / 2
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in tiny_engine.generate(rows, NO_SPEC, 4).completions]


def test_a_window_whose_plain_prices_disagree_can_lower_the_prediction_not_raise_it(tiny_engine, monkeypatch):
    """Beside bursts of CPU work a window's plain steps were slowed on both sides and its own
    were not: against the faster side a losing arm still measured 2.74x. Here the sample's
    anchor is made 10x slower than it measured and the one after the window 5x: the faster side
    alone would have the never-right draft pay; the two stand 2x apart, more than DISTURBED, so
    the sample's prediction decides (it loses), and neither the arm's ratio nor an error is kept."""
    from batchspec.calibrate import confirm, inflight

    reanchor = inflight.InFlight._reanchor

    def slowed_after(self, delta, steps):
        fresh = reanchor(self, delta, steps)
        return Anchor(5 * fresh.scale, fresh.other)

    slow_sample(monkeypatch, 10)
    monkeypatch.setattr(inflight.InFlight, "_reanchor", slowed_after)
    rows, far, control, ran, d, specs = far_shard(tiny_engine)
    before, after, _ = window_prices(d.reason)
    assert before / after - 1 > confirm.DISTURBED and after > 1.0  # the faster side alone: the arm pays
    assert "apart, more than 25%: the machine moved while the window was measured" in d.reason
    arm = d.arms[1]
    assert arm.predicted_speedup < 1.0 and arm.speedup <= arm.predicted_speedup and d.chosen is NO_SPEC
    assert control.worker.profile.arm_ratios == {} and control.worker.errors.get("k", []) == []
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in tiny_engine.generate(rows, NO_SPEC, 4).completions]


def test_where_the_arm_pays_what_the_plain_stretch_after_its_window_gave_up_counts_as_overhead(tiny_engine, monkeypatch):
    """The plain steps a confirmation runs after the arm's window keep their rows, but where the
    arm pays they took longer than it would have: plain_s x (1 - 1 / speedup) counts as the
    shard's calibration overhead. (The measurement is scripted at 2x: a real paying arm on this
    CPU would make the test hang on the machine's speed. Beside other test processes plain
    decoding's prices on the window's two sides can stand more than DISTURBED apart, and then the
    sample's prediction, a loss, would decide: the scripted measurement is taken as undisturbed.)"""
    from batchspec.calibrate import confirm

    monkeypatch.setattr(confirm, "confirmed_speedup", lambda predicted, ratio, window: (2.0, "scripted at 2.00x"))
    monkeypatch.setattr(confirm, "DISTURBED", float("inf"))
    rows, far, control, ran, d, specs = far_shard(tiny_engine)
    assert d.chosen == far and "scripted at 2.00x" in d.reason and control.plain_s > 0
    assert control.lost_s == pytest.approx(control.plain_s / 2) and d.overhead_s >= control.lost_s
    done = [specs[i] for i in control.order]
    assert NO_SPEC in done[done.index(far):]  # the plain stretch after the window, its rows kept
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in tiny_engine.generate(rows, NO_SPEC, 4).completions]


def test_a_confirmation_in_flight_decides_by_the_lower_of_the_corrected_prediction_and_its_own_steps():
    """The 128-row code shard's case: the sample's 1.30x corrected to 1.20x by the cost model's
    error, while the arm's own 22 steps measured 0.72x: the steps decide, and the arm loses."""
    speedup, why = confirmed_speedup(1.30, 1.08, 0.72)
    assert speedup == 0.72 and "those steps alone measured 0.72x, below the sample's 1.30x corrected (1.20x)" in why
    speedup, why = confirmed_speedup(1.41, 0.85, 1.43)  # the 128-row edit shard's: both pay, the steps' 1.43x is the lower
    assert speedup == 1.43
    speedup, why = confirmed_speedup(1.10, 1.20, 1.05)  # an arm dearer than priced: the corrected prediction is the lower
    assert speedup == pytest.approx(1.10 / 1.20) and why == "the sample's 1.10x corrected (those steps alone measured 1.05x)"


def test_drift_checks_run_on_windows_of_finished_rows_in_flight(tiny_engine):
    """After the decision, every max(batch, 4) finished rows the drift checks decide what the next
    rows run under, on the last `drift_chunk` finished: a scripted watch turns an arm on at its
    second check and off at the next; the Drift record names the rows, and no greedy token changes."""
    arm = SpecConfig("draft_target", 2, draft_model="self")
    rows = word_rows(40)
    control = InFlight(tiny_engine, rows, [arm], 2, CalibrationSettings(max_tokens=24, sample_size=4, drift_chunk=6, margin=100.0),
                       flat_profile(2), key="k")

    class Scripted:
        def __init__(self):
            self.calls = []

        def __call__(self, part, result):
            self.calls.append(("none", len(part)))
            return (arm, 0.9) if len(self.calls) == 2 else (None, None)

        def speculating(self, part, result, spec):
            self.calls.append((spec.label, len(part)))
            return NO_SPEC, None

    control.watch = Scripted()
    ran = tiny_engine.generate(rows, NO_SPEC, 2, control=control)
    decision, specs = control.close(ran)
    assert decision.chosen is NO_SPEC and not decision.confirmed  # a 100x margin: nothing pays, nothing near it
    calls = control.watch.calls
    assert [c[0] for c in calls[:3]] == ["none", "none", arm.label] and all(n >= 6 for _, n in calls)
    d = control.drift
    assert d.switch_arm == arm.label and d.switch_row < d.fallback_row
    assert sum(s == arm for s in specs) >= 4  # the rows that finished between the two checks, at least
    plain = tiny_engine.generate(rows, NO_SPEC, 2)
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in plain.completions]


def test_a_shard_of_rows_that_end_at_prefill_is_decided_at_the_end(tiny_engine):
    """Rows of one token never reach a decode step, so the control is never called: the decision
    is taken when the call ends, from nothing to predict, and says so."""
    rows = [Request(r.id, r.prompt, params=SamplingParams(max_tokens=1)) for r in word_rows(16)]
    control = InFlight(tiny_engine, rows, SELF, 4, CalibrationSettings(), WorkerCalibration())
    ran = tiny_engine.generate(rows, NO_SPEC, 4, control=control)
    decision, specs = control.close(ran)
    assert decision.chosen is NO_SPEC and "gave nothing to predict from" in decision.reason
    assert all(c.output_tokens == 1 for c in ran.completions) and all(s is NO_SPEC for s in specs)


def test_the_anchor_prices_exactly_the_steps_that_ran():
    """A run's measured decode time over the profile's price of its own steps; plain decoding's
    price for what speculative steps committed: c / r plain steps of r rows each."""
    profile = CostProfile([StepCost("target", "m", b, c, w, 0.01 * b * w) for b in (1, 4) for c in (10, 100) for w in (1, 3)])
    steps = [Step(4, 20, 1, 4), Step(4, 21, 1, 4), Step(2, 22, 1, 2)]
    timing = Timing(verify_s=0.2, other_s=0.0)
    anchor = anchor_of_steps(timing, steps, profile)
    assert anchor.scale == pytest.approx(0.2 / (0.04 + 0.04 + 0.02)) and anchor.other == 0.0
    spec_steps = [Step(4, 30, 3, 10)]  # 4 rows, 3 tokens each, 10 committed: 2.5 plain steps of 4 rows
    assert plain_price_s(spec_steps, anchor, profile) == pytest.approx(anchor.scale * 0.04 * 10 / 4)


def test_an_anchor_prices_the_run_it_was_taken_from_at_its_measured_time():
    """The scale multiplies the bookkeeping too, as anchor_of_steps takes it: plain decoding's own
    steps, priced at the anchor taken from them, cost what the run measured."""
    profile = CostProfile([StepCost("target", "m", b, c, w, 0.01 * b * w) for b in (1, 4) for c in (10, 100) for w in (1, 3)])
    steps = [Step(4, 20, 1, 4), Step(4, 21, 1, 4), Step(2, 22, 1, 2)]
    timing = Timing(verify_s=0.2, other_s=0.03)
    anchor = anchor_of_steps(timing, steps, profile)
    assert plain_price_s(steps, anchor, profile) == pytest.approx(timing.decode_s)
    assert arm_price_s(steps, NO_SPEC, anchor, profile) == pytest.approx(timing.decode_s)
    # an arm's steps at what its confirmations measured them at on this worker, plain decoding's as they were
    k2 = SpecConfig("ngram", 2)
    unscaled = arm_price_s([Step(4, 30, 3, 10)], k2, anchor, profile, 0.001)
    profile.arm_measured("ngram", None, 1.3)
    assert arm_price_s([Step(4, 30, 3, 10)], k2, anchor, profile, 0.001) == pytest.approx(1.3 * unscaled)
    assert plain_price_s(steps, anchor, profile) == pytest.approx(timing.decode_s)


def test_a_run_under_an_arm_is_priced_as_plain_decoding():
    """A sample decoded under an arm, as plain decoding would have run it: the same tokens, no
    drafts, a target step per decode token, and plain decoding's price for what its steps
    committed at the anchor given (the worker's last plain sample's)."""
    profile = CostProfile([StepCost("target", "m", b, c, w, 0.01 * b * w) for b in (1, 4) for c in (10, 100) for w in (1, 3)])
    steps = [Step(4, 30, 3, 10), Step(4, 33, 3, 6)]
    timing = Timing(draft_s=0.05, verify_s=0.3, other_s=0.04, prefill_s=0.5)
    ngram = Anchor(1.25, 0.001)
    ran = GenerateResult([Completion("a", "x", [1, 2, 3, 4, 5, 6, 7, 8, 9], output_tokens=9, draft_tokens=8,
                                     accepted_tokens=6, target_steps=2, accepted_at=[2, 2], accepted_steps=[3, 3])],
                         timing)
    plain = as_plain(ran, steps, ngram, profile)
    c = plain.completions[0]
    assert c.token_ids == ran.completions[0].token_ids and (c.draft_tokens, c.accepted_tokens, c.target_steps) == (0, 0, 8)
    assert plain.timing.decode_s == pytest.approx(plain_price_s(steps, ngram, profile))
    assert plain.timing.decode_s == pytest.approx(1.25 * (0.04 * 16 / 4 + 0.001 * 16))
    assert plain.timing.other_s == pytest.approx(1.25 * 0.001 * 16) and plain.timing.draft_s == 0.0
    assert plain.timing.prefill_s == 0.5


def test_a_keys_next_shard_decodes_its_sample_under_the_setting_its_last_shard_ended_under(tiny_engine):
    """The key's first shard decodes its sample plainly and ends under the arm it chose; the next
    shard of the key on the worker decodes its sample under that arm: the same tokens (greedy),
    so the same counterfactual acceptance of every arm as a plain sample gives, and the same
    choice; plain decoding's figure is the profile's price, not a measurement, and says so. A key
    that ended under "none", or a worker that never ran a sample plainly, starts under "none"."""
    arm = SpecConfig("draft_target", 3, draft_model="self")
    settings = CalibrationSettings(max_tokens=24, sample_size=4, confirm=False)
    worker = flat_profile(4)
    first = run_shard(tiny_engine, ShardInput("s0", "k", word_rows(16)), [arm], True, 4, settings, worker=worker)
    assert first.decision.chosen == arm and worker.settled["k"] == arm and worker.anchor is not None
    assert "the sample decoded in the shard's batch (" in first.decision.reason
    rows = [Request(f"n{i}", r.prompt + " w3 w5", params=r.params) for i, r in enumerate(word_rows(20))]
    fresh = flat_profile(4)
    fresh.anchor, fresh.history = worker.anchor, dict(worker.history)  # the key's last rows: predicted on alike
    plainly = run_shard(tiny_engine, ShardInput("s1", "k", rows), [arm], True, 4, settings, worker=fresh)
    nxt = InFlight(tiny_engine, rows, [arm], 4, settings, worker, key="k")
    assert nxt.start == arm
    ran = tiny_engine.generate(rows, nxt.start, 4, control=nxt)
    d, specs = nxt.close(ran)
    assert all(specs[i] == arm and ran.completions[i].draft_tokens > 0 for i in nxt.first)
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in plainly.completions] \
        == [c.token_ids for c in tiny_engine.generate(rows, NO_SPEC, 4).completions]
    assert d.chosen == plainly.decision.chosen == arm
    mine, theirs = d.arms[1], plainly.decision.arms[1]
    assert (mine.acceptance_rate, mine.target_steps, mine.draft_tokens, mine.accepted_tokens) == \
        (theirs.acceptance_rate, theirs.target_steps, theirs.draft_tokens, theirs.accepted_tokens)
    base = d.arms[0]
    assert not base.measured and base.tokens_per_s is None and base.predicted_tokens_per_s > 0
    assert d.baseline_tokens_per_s is None and plainly.decision.baseline_tokens_per_s > 0
    assert f"the sample decoded in the shard's batch under {arm.label}, the setting the key's last shard" in d.reason
    # a key the worker has not seen, or one that ended plainly, starts under none
    assert InFlight(tiny_engine, rows, [arm], 4, settings, worker, key="other").start is NO_SPEC
    worker.settled["k"] = NO_SPEC
    assert InFlight(tiny_engine, rows, [arm], 4, settings, worker, key="k").start is NO_SPEC
    worker.settled["k"], worker.anchor = arm, None
    assert InFlight(tiny_engine, rows, [arm], 4, settings, worker, key="k").start is NO_SPEC


def test_a_shard_that_prices_no_arm_still_anchors_its_drift_window_on_its_own_steps(tiny_engine):
    """A draft that is never right on a shard the worker's profile does not cover: the production
    batch's width curve shows no arm can pay, the rest of the profile is not measured, and the
    verdict carries no anchor. The shard's own plain steps
    still tie the worker's profile to this run: the drift window prices with that anchor (not the
    window's rows replayed alone with the time since the last check, which leaves out the
    bookkeeping of the rows that shared their steps), and it is the worker's last plain anchor."""
    far = SpecConfig("draft_target", 4, draft_model="far")
    worker = flat_profile(2, "far")  # batch 1 and 2 only: batch 4 is not covered
    rows = word_rows(32)
    control = InFlight(tiny_engine, rows, [far], 4, CalibrationSettings(max_tokens=24, sample_size=4), worker, key="k")
    ran = tiny_engine.generate(rows, NO_SPEC, 4, control=control)
    d, _ = control.close(ran)
    assert control.verdict.anchor is None and d.chosen is NO_SPEC and "the rest of the profile" in d.reason
    assert control.watch.anchor is not None and control.watch.anchor is worker.anchor
    assert control.watch.anchor.scale > 0 and control.watch.anchor.other >= 0


def test_each_batch_of_finished_rows_is_checked_on_a_window_of_the_last_ones(tiny_engine):
    """The drift check does not wait for a chunk of new rows: every max(batch, 4) finished rows it
    predicts every arm on the last 16 (a chunk, at least 16) finished rows, sample rows included,
    so what the sample's few rows misjudged is seen from the rows that follow it."""
    arm = SpecConfig("draft_target", 2, draft_model="self")
    rows = word_rows(40)
    control = InFlight(tiny_engine, rows, [arm], 2, CalibrationSettings(max_tokens=24, sample_size=4, margin=100.0),
                       flat_profile(2), key="k")
    seen = []

    class Scripted:
        def __call__(self, part, result):
            seen.append((len(control.order), [r.id for r in part]))
            return None, None

    control.watch = Scripted()
    ran = tiny_engine.generate(rows, NO_SPEC, 2, control=control)
    control.close(ran)
    assert len(seen) >= 6
    done = [rows[i].id for i in control.order]
    for (finished, ids), nxt in zip(seen, seen[1:]):
        assert nxt[0] - finished >= 4  # every 4 rows (batch 2, at least 4) ...
        assert ids == done[max(0, finished - 16):finished]  # ... on the last 16 finished
    assert seen[0][0] - 4 < 8  # the first check within a batch's rows of the decision (the sample: 4 rows)


def test_each_rows_counterfactual_is_computed_once_as_the_window_slides(tiny_engine):
    """RowCounterfactuals gives what the counterfactual of the rows gives, computing a row only
    the first time the window holds it, and forgets rows that left the window."""
    from batchspec.calibrate.pricing import RowCounterfactuals, _counterfactual, plain_rows

    rows = word_rows(12)
    plain = tiny_engine.generate(rows, NO_SPEC, 4)
    pr = plain_rows(tiny_engine, rows, plain)
    arms = [SpecConfig("ngram", 2), SpecConfig("ngram", 4), SpecConfig("draft_target", 3, draft_model="self")]
    forwards = []
    real = tiny_engine.teacher_forced_logits

    def counted(pairs, draft_model=None):
        forwards.append(len(pairs))
        return real(pairs, draft_model=draft_model)

    tiny_engine.teacher_forced_logits = counted
    try:
        cache = RowCounterfactuals(tiny_engine)
        keys = [r.id for r in rows]
        first, _ = cache.of(keys[:8], pr[:8], arms)
        second, _ = cache.of(keys[4:12], pr[4:12], arms)
    finally:
        tiny_engine.teacher_forced_logits = real
    assert sum(forwards) == 12  # each row's draft forward once: 8, then the 4 new rows
    want, _ = _counterfactual(tiny_engine, pr[4:12], arms)
    for a in arms:
        assert second[a.label].steps == want[a.label].steps and second[a.label].proposed == want[a.label].proposed
        assert second[a.label].exact
    assert set(cache.rows) == set(keys[4:12])


def test_the_running_arms_recent_steps_are_measured_against_their_price():
    """The drift fallback's second witness (drift.while_speculating's `ratio`): the steps the
    running arm ran since it last took over, up to a window's rows of stretches (a stretch per
    check), measured over the profile's price of them at the window's anchor."""
    profile = CostProfile([StepCost("target", "m", b, c, w, 0.01 * b * w) for b in (1, 4) for c in (10, 100) for w in (1, 5)])
    k4, k2 = SpecConfig("ngram", 4), SpecConfig("ngram", 2)
    worker = WorkerCalibration(profile=profile)
    control = InFlight(None, word_rows(8), [k2, k4], 4, CalibrationSettings(drift_chunk=8), worker, key="k")
    assert control._every() == 4 and control._window() == 8  # two stretches make a window
    control.watch.anchor = Anchor(2.0, 0.0)
    steps, spent = [], 0.0

    def stretch(spec, n, measured_s, width):
        nonlocal spent
        steps.extend([Step(4, 20, width, 8)] * n)
        spent += measured_s
        control._stretch(Progress(spec, [], [], {}, 0, Timing(verify_s=spent), steps))
        control.watched, control.watched_steps = Timing(verify_s=spent), len(steps)

    assert control._ratio(k4) is None  # nothing ran under it
    stretch(k2, 3, 1.0, 3)
    stretch(k4, 5, 0.8, 5)  # priced 5 x 2.0 x 0.01 x 4 x 5 = 2.0 s: measured at 0.4x
    assert control._ratio(k4) == pytest.approx(0.4) and control._ratio(k2) is None  # k2 is not the running arm
    stretch(k4, 5, 3.0, 5)
    stretch(k4, 5, 1.0, 5)  # the last two stretches: a window's rows
    assert control._ratio(k4) == pytest.approx(4.0 / 4.0)
    control.watch.anchor = None
    assert control._ratio(k4) is None  # nothing to price with


def test_a_keys_next_shard_predicts_on_its_sample_and_the_keys_last_rows(tiny_engine):
    """A shard leaves its key's last finished rows on the worker (HISTORY_ROWS, beyond its drift
    window of 8), with the counterfactual its drift checks computed (KeyHistory); the key's next
    shard predicts every arm on its own sample's rows followed by those, exactly as the
    counterfactual of all of them says, and says so, then leaves its rows after them, the key's
    last HISTORY_ROWS in all, each row's counterfactual computed once. Another key's shard does
    not see them."""
    from batchspec.calibrate.pricing import HISTORY_ROWS, _counterfactual, plain_rows

    arm = SpecConfig("ngram", 3)
    settings = CalibrationSettings(max_tokens=24, sample_size=4, drift_chunk=8, confirm=False, drift_share=1.0)
    worker = flat_profile(4)
    first = run_shard(tiny_engine, ShardInput("s0", "k", word_rows(32)), [arm], True, 4, settings, worker=worker)
    assert "the key's last" not in first.decision.reason
    history = worker.history["k"]
    assert len(history.rows) == 32 and set(history.keys) == {r.id for r in word_rows(32)}
    assert len(history.cache.rows) > 8  # rows that left the drift window kept their counterfactual
    rows = [Request(f"n{i}", r.prompt + " w3 w5", params=r.params) for i, r in enumerate(word_rows(20))]
    nxt = InFlight(tiny_engine, rows, [arm], 4, settings, worker, key="k")
    ran = tiny_engine.generate(rows, nxt.start, 4, control=nxt)
    d, _ = nxt.close(ran)
    assert "predicted on its 4 rows and the key's last 32 rows on this worker" in d.reason
    sample = plain_rows(tiny_engine, [rows[i] for i in nxt.first], GenerateResult([ran.completions[i] for i in nxt.first], Timing()))
    want, _ = _counterfactual(tiny_engine, sample + history.rows, [arm])
    got = d.arms[1]
    assert (got.target_steps, got.draft_tokens, got.accepted_tokens) == \
        (round(want[arm.label].target_steps), want[arm.label].draft_tokens, round(want[arm.label].accepted_tokens))
    alone, _ = _counterfactual(tiny_engine, sample, [arm])
    assert got.target_steps != round(alone[arm.label].target_steps)  # the history's rows counted
    after = worker.history["k"]
    assert after.keys[:32] == history.keys and sorted(after.keys[32:]) == sorted(r.id for r in rows)
    assert set(history.keys) <= set(after.cache.rows)  # computed for the prediction, not again
    third = [Request(f"m{i}", r.prompt, params=r.params) for i, r in enumerate(word_rows(20))]
    last = InFlight(tiny_engine, third, [arm], 4, settings, worker, key="k")
    last.close(tiny_engine.generate(third, last.start, 4, control=last))
    now = worker.history["k"].keys  # the oldest 8 rows left
    assert len(now) == HISTORY_ROWS and now[:44] == after.keys[8:] and sorted(now[44:]) == sorted(r.id for r in third)
    other = InFlight(tiny_engine, rows, [arm], 4, settings, worker, key="other")
    d, _ = other.close(tiny_engine.generate(rows, NO_SPEC, 4, control=other))
    assert "the key's last" not in d.reason


class _Scripted:
    """A drift watch whose checks keep the running arm, predicting `running` for it."""

    def __init__(self, running: float, anchor: Anchor | None = None, switch: SpecConfig | None = None):
        self.running, self.anchor, self.switch = running, anchor, switch
        self.discount, self.calls = {}, []

    def __call__(self, part, result):
        self.calls.append("none")
        return (self.switch, 0.9) if self.switch is not None and len(self.calls) == 2 else (None, None)

    def speculating(self, part, result, spec):
        self.calls.append(spec.label)
        return spec, 0.9


def test_where_the_profile_and_the_arms_steps_disagree_plain_decoding_is_measured_afresh():
    """The probe (InFlight._probed): a check that keeps the arm while the profile (1.2x) and the
    arm's own steps at a stale anchor (1.2 / 1.5 = 0.8x) fall on either side of plain decoding
    runs the next batch's worth of rows plainly; their steps anchor the profile afresh and price
    what the arm's steps committed. The same arm's steps lose to plain steps measured at 20 tok/s
    (the rows stay plain, the fallback is recorded at the probe's row, and the window discounts the
    arm) and pay against plain steps at 10 tok/s (the arm resumes, and no probe comes again until
    plain decoding's anchor is a window old)."""
    profile = CostProfile([StepCost("target", "m", b, c, w, 0.01 * b * w) for b in (1, 4) for c in (10, 100) for w in (1, 5)])
    k4 = SpecConfig("ngram", 4)
    rows = word_rows(32)
    comps = [Completion(r.id, None, token_ids=[1, 2], output_tokens=2, target_steps=1) for r in rows]

    arm_steps = [Step(4, 20, 5, 8)] * 10  # priced 10 x 2.0 x 0.01 x 4 x 5 = 4 s; measured 6 s: 8 tokens a 0.6 s step

    def run(plain_s: float):
        control = InFlight(None, rows, [k4], 4, CalibrationSettings(drift_chunk=8), WorkerCalibration(profile=profile), key="k")
        control.phase, control.order = "watch", list(range(8))
        control.watch = _Scripted(1.2, Anchor(2.0, 0.0))
        half = arm_steps[:5]
        assert control._watch(Progress(k4, [], comps, {8: [1]}, 24, Timing(verify_s=3.0), half)) is None
        assert control.probe is None  # one stretch, half a window's rows: too few steps to set against the profile
        control.order += [8, 9, 10, 11]
        assert control._watch(Progress(k4, [], comps, {12: [1]}, 20, Timing(verify_s=6.0), arm_steps)) is NO_SPEC
        assert control.probe[0] == k4 and control.drift.fallback_row is None
        control.order += [12, 13, 14, 15]
        plain_steps = [Step(4, 20, 1, 4)] * 10  # priced 10 x 0.04 s
        return control, control._watch(Progress(NO_SPEC, [], comps, {16: [1]}, 16, Timing(verify_s=6.0 + plain_s),
                                                arm_steps + plain_steps))

    control, spec = run(2.0)  # plain steps at 0.2 s for 4 tokens: 20 tok/s, the arm's 13.3 tok/s is 0.67x
    assert spec is None and control.probe is None
    assert "measured 0.67x plain, so plain decoding goes on" in control.reason
    assert control.drift.fallback_row == 12 and control.watch.anchor.scale == pytest.approx(5.0)
    assert control.watch.discount == {k4.label: pytest.approx(0.667 / 1.2, rel=1e-3)}

    control, spec = run(4.0)  # plain at 10 tok/s: the arm's steps measure 1.33x
    assert spec == k4 and "measured 1.33x plain, so ngram:k=4 resumes" in control.reason
    assert control.drift.fallback_row is None and control.anchored_at == 16
    steps = [Step(4, 20, 5, 8)] * 10 * 3
    control.order += [16, 17, 18, 19]  # the resumed arm's 10 steps took 50 s: its last 15 at 53 / 30 = 1.77x their
    again = Progress(k4, [], comps, {20: [1]}, 12, Timing(verify_s=60.0), steps)  # price, 1.2 / 1.77 < 1.0 again
    assert control._watch(again) is None and control.probe is None  # plain decoding measured 4 rows ago: no probe
    control.order += [20, 21, 22, 23]  # a window (8 rows) after it: the anchor is stale, and a probe starts
    assert control._watch(Progress(k4, [], comps, {24: [1]}, 8, Timing(verify_s=70.0), steps + arm_steps)) is NO_SPEC
    assert control.probe[0] == k4


def test_a_probe_in_flight_changes_no_token(tiny_engine):
    """A real shard: a scripted window turns an arm on and keeps it, its steps set against the
    profile disagree (the ratio forced to 3.0), so plain decoding runs a batch's worth of rows to
    measure; whichever way the measurement goes, the reason says what it measured, the rows of the
    probe ran plainly, and every token is plain decoding's."""
    arm = SpecConfig("ngram", 3)
    rows = word_rows(40)
    control = InFlight(tiny_engine, rows, [arm], 2, CalibrationSettings(max_tokens=24, sample_size=4, drift_chunk=6, margin=100.0),
                       flat_profile(2), key="k")
    control.watch = _Scripted(1.2, Anchor(1.0, 0.0), switch=arm)
    control._ratio = lambda spec: 3.0
    ran = tiny_engine.generate(rows, NO_SPEC, 2, control=control)
    _, specs = control.close(ran)
    assert "its own steps disagreed: plain decoding ran" in control.reason
    goes_on = "so plain decoding goes on" in control.reason
    assert goes_on or "so ngram:k=3 resumes" in control.reason
    assert (control.drift.fallback_row is not None) == goes_on and (arm.label in control.watch.discount) == goes_on
    done = [specs[i] for i in control.order]
    assert NO_SPEC in done[done.index(arm):]  # the probe's rows
    plain = tiny_engine.generate(rows, NO_SPEC, 2)
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in plain.completions]


def later_shard(tiny_engine, arm: SpecConfig) -> tuple[WorkerCalibration, list[Request]]:
    """A worker whose key "k" ended its first shard under `arm` (decided without a confirmation),
    and 24 rows for the key's next shard on it."""
    worker = flat_profile(4)
    run_shard(tiny_engine, ShardInput("s0", "k", word_rows(16)),
              [arm], True, 4, CalibrationSettings(max_tokens=24, sample_size=4, confirm=False), worker=worker)
    assert worker.settled["k"] == arm
    return worker, [Request(f"n{i}", r.prompt + " w3 w5", params=r.params) for i, r in enumerate(word_rows(24))]


def test_a_later_shard_whose_sample_ran_the_arm_confirms_it_against_plain_decoding_now(tiny_engine):
    """A key's later shard decodes its sample under the arm its last shard ended under; where a
    confirmation is wanted for that same arm, the sample's steps are the arm's measurement, and the
    rows after the decision run plainly to measure against (InFlight.plain_side): plain decoding's
    anchor is this moment's, not another shard's. The measurement is recorded, the worker's anchor
    is the new one, and no token changes."""
    arm = SpecConfig("draft_target", 3, draft_model="self")
    worker, rows = later_shard(tiny_engine, arm)
    assert "k" not in worker.confirmed_keys
    old = worker.anchor
    nxt = InFlight(tiny_engine, rows, [arm], 4, CalibrationSettings(max_tokens=24, sample_size=4), worker, key="k")
    assert nxt.start == arm
    ran = tiny_engine.generate(rows, nxt.start, 4, control=nxt)
    d, specs = nxt.close(ran)
    assert nxt.plain_side and d.confirmed and d.arms[1].measured and d.arms[1].speedup > 0
    assert "steps decoding the sample, set against plain decoding's" in d.reason
    assert worker.anchor is not old and nxt.anchored_at is not None
    after = [specs[i] for i in nxt.order[nxt.mark[2]:]]
    assert NO_SPEC in after  # the rows that measured plain decoding
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in tiny_engine.generate(rows, NO_SPEC, 4).completions]


def test_a_later_shard_whose_sample_ran_another_arm_prices_the_arm_against_plain_decoding_just_before(tiny_engine, monkeypatch):
    """Where the sample ran the key's last arm and the confirmation is for another, no plain step
    of this shard prices it (before 2026-12-04 the worker's anchor did, another shard's: on held-out
    extract rows at batch 1 k=2 was confirmed at 1.29x on a moment 23% faster than the anchor's and
    measured 0.98x on the whole shard). Plain decoding now runs a batch's worth first (InFlight.plain_first),
    its steps the anchor (the worker's too), then the arm is measured against it. No token changes."""
    from batchspec.calibrate import inflight

    a, b = SpecConfig("draft_target", 3, draft_model="self"), SpecConfig("draft_target", 2, draft_model="self")
    worker, rows = later_shard(tiny_engine, a)
    real = inflight.predict_sample

    def top_b(*args, **kwargs):  # the prediction's top arm is b, and a confirmation is wanted
        v = real(*args, **kwargs)
        v.top = next(x for x in v.arms if x.label == b.label)
        v.top_spec, v.wanted = b, True
        return v

    monkeypatch.setattr(inflight, "predict_sample", top_b)
    nxt = InFlight(tiny_engine, rows, [a, b], 4, CalibrationSettings(max_tokens=24, sample_size=4), worker, key="k")
    assert nxt.start == a
    old = worker.anchor
    ran = tiny_engine.generate(rows, nxt.start, 4, control=nxt)
    d, specs = nxt.close(ran)
    assert not nxt.plain_side and nxt.fresh is not None and nxt.fresh is not old and worker.anchor is not old
    assert d.confirmed and next(x for x in d.arms if x.label == b.label).measured
    assert "set against plain decoding's steps just before them" in d.reason
    assert "plain decoding's steps before them price them at " in d.reason  # and those after them (`sandwiched`)
    after = {specs[i].label for i in nxt.order[len(nxt.first):]}
    assert "none" in after and b.label in after  # the rows that measured plain decoding, then the arm's
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in tiny_engine.generate(rows, NO_SPEC, 4).completions]


@pytest.mark.parametrize(("rival", "stays"), [(1.33, True), (1.50, False)])
def test_a_later_shards_sample_arm_gives_way_only_to_an_arm_faster_by_the_margin(tiny_engine, monkeypatch, rival, stays):
    """A key's later shard decodes its sample under the key's last arm; the prediction puts
    another arm ahead of it. As the drift watch rules for a running arm, the other takes over
    only where predicted faster by the margin (1.33x against 1.30x: the sample's arm stays; 1.50x:
    it takes over). No token changes either way."""
    from batchspec.calibrate import counterfactual

    a, b = SpecConfig("draft_target", 3, draft_model="self"), SpecConfig("draft_target", 2, draft_model="self")
    worker, rows = later_shard(tiny_engine, a)
    real = counterfactual.predict_arms

    def scripted(*args, **kwargs):
        out = real(*args, **kwargs)
        for r in out:
            r.predicted_speedup = {a.label: 1.30, b.label: rival}[r.label]
        return out

    monkeypatch.setattr(counterfactual, "predict_arms", scripted)
    nxt = InFlight(tiny_engine, rows, [a, b], 4, CalibrationSettings(max_tokens=24, sample_size=4, margin=0.05), worker, key="k")
    assert nxt.start == a
    ran = tiny_engine.generate(rows, nxt.start, 4, control=nxt)
    d, _ = nxt.close(ran)
    assert nxt.verdict.chosen == (a if stays else b) and nxt.verdict.top_spec == nxt.verdict.chosen
    assert (f"{b.label} is not faster by the 5% margin, so {a.label} stays" in d.reason) == stays
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in tiny_engine.generate(rows, NO_SPEC, 4).completions]


def test_a_keys_later_shard_samples_one_drift_checks_worth(tiny_engine):
    """Where the key's last window of rows on the worker is there to predict on (at least as many
    rows as the sample), a later shard's sample is one drift check's worth of rows (a batch, at
    least CONFIRM_MIN_ROWS), not the whole default sample; a key without history, one whose
    history is shorter than the sample, and a sample size the pipeline file sets keep theirs."""
    from batchspec.calibrate.counterfactual import CONFIRM_MIN_ROWS
    from batchspec.calibrate.pricing import KeyHistory, RowCounterfactuals
    from batchspec.predict.acceptance import PlainRow

    arm = SpecConfig("ngram", 3)
    rows = word_rows(32)
    settings = CalibrationSettings(max_tokens=24)
    worker = flat_profile(1)

    def history(n: int) -> KeyHistory:
        return KeyHistory([f"h{i}" for i in range(n)], [PlainRow([1, 2, 3], [4, 5], 8, 0.0, 1.0)] * n,
                          RowCounterfactuals(tiny_engine))

    default = settings.sample_rows(1, counterfactual=True)
    assert default > CONFIRM_MIN_ROWS
    assert len(InFlight(tiny_engine, rows, [arm], 1, settings, worker, key="k").first) == default
    worker.remember("k", history(default - 1))
    assert len(InFlight(tiny_engine, rows, [arm], 1, settings, worker, key="k").first) == default
    worker.remember("k", history(16))
    assert len(InFlight(tiny_engine, rows, [arm], 1, settings, worker, key="k").first) == CONFIRM_MIN_ROWS
    assert len(InFlight(tiny_engine, rows, [arm], 1, settings, worker, key="other").first) == default
    assert len(InFlight(tiny_engine, rows, [arm], 8, settings, worker, key="k").first) == 8  # a batch
    fixed = CalibrationSettings(max_tokens=24, sample_size=6)
    assert len(InFlight(tiny_engine, rows, [arm], 1, fixed, worker, key="k").first) == 6


def test_the_width_curve_is_timed_again_within_the_workers_budget(tiny_engine):
    """Where the worker's budget for it (profiling.PROFILE_SHARE of the decode time its shards ran,
    less what re-timing took) and PROFILE_SHARE of the shard's own decode time cover a re-time's
    expected cost, a key's later shard whose sample decodes plainly times the production batch's
    width curve again before it predicts, each point then priced at the mean of its timings, and
    says so; the seconds count as the shard's profile time. Without either nothing is timed, nor
    on a key's first shard; every shard's decode time adds to the worker's budget."""
    from batchspec.calibrate.profiling import PROFILE_SHARE

    arm = SpecConfig("ngram", 3)
    settings = CalibrationSettings(max_tokens=24, sample_size=4, drift_chunk=8, confirm=False)
    poor = flat_profile(4)
    for shard in ("s0", "s1"):
        d = run_shard(tiny_engine, ShardInput(shard, "k", word_rows(16)), [arm], True, 4, settings, worker=poor).decision
        assert "timed again" not in d.reason and not poor.profile.timings and poor.retimed_s == 0
    assert poor.decoded_s > 0 and poor.retime_budget() == pytest.approx(PROFILE_SHARE * poor.decoded_s)

    rich = flat_profile(4)
    rich.decoded_s = 1000.0  # a budget of 20 s: a re-time of the flat profile's curve is expected to take 5 s
    before = [p for p in rich.profile.points if p.batch == 4]
    d = run_shard(tiny_engine, ShardInput("s0", "k", word_rows(16)), [arm], True, 4, settings, worker=rich).decision
    assert "timed again" not in d.reason and rich.retimed_s == 0  # the key's first shard on the worker
    settled = rich.settled["k"]
    assert settled.method != "none"  # the key's next sample decodes under it: nothing is re-timed
    under = InFlight(tiny_engine, word_rows(16), [arm], 4, settings, rich, key="k")
    under.close(tiny_engine.generate(word_rows(16), under.start, 4, control=under))
    assert under.start == settled and "timed again" not in under.reason and rich.retimed_s == 0
    rich.settled.pop("k")  # ... and the next one plainly, but a 5 s re-time is not 2% of its decode time
    d = run_shard(tiny_engine, ShardInput("s1", "k", word_rows(16)), [arm], True, 4, settings, worker=rich).decision
    assert "timed again" not in d.reason and rich.retimed_s == 0
    rich.settled.pop("k")
    rich.retime_s[4] = 1e-6  # the last re-time's seconds: what the next is expected to cost
    d = run_shard(tiny_engine, ShardInput("s2", "k", word_rows(16)), [arm], True, 4, settings, worker=rich).decision
    assert "the production batch's width curve timed again first (2 points" in d.reason
    assert rich.retimed_s > 0 and d.profile_s >= rich.retimed_s and rich.retime_s[4] == rich.retimed_s
    assert len(rich.profile.timings) == 2 and all(len(t) == 2 and t[0] == 1.0 for t in rich.profile.timings.values())
    for key, kept in rich.profile.timings.items():  # priced at the mean of the flat 1 s and the engine's own timing
        assert next(p.seconds for p in rich.profile.points if p.key == key) == pytest.approx(sum(kept) / 2)
    assert len(before) == len([p for p in rich.profile.points if p.batch == 4])


def test_a_keys_later_shard_gives_its_drift_checks_the_keys_last_rows(tiny_engine):
    """A key's later shard hands its drift watch the key's last rows on the worker and the window
    they fill (KeyHistory.beside), as its sample's prediction took them in; a first shard none."""
    arm = SpecConfig("ngram", 3)
    settings = CalibrationSettings(max_tokens=24, drift_chunk=8, confirm=False)
    worker = flat_profile(4)
    first = InFlight(tiny_engine, word_rows(16), [arm], 4, settings, worker, key="k")
    first.close(tiny_engine.generate(word_rows(16), first.start, 4, control=first))
    assert first.watch.history is None and len(worker.history["k"].rows) == 16  # every row: HISTORY_ROWS
    history = worker.history["k"]
    later = InFlight(tiny_engine, word_rows(16), [arm], 4, settings, worker, key="k")
    later.close(tiny_engine.generate(word_rows(16), later.start, 4, control=later))
    assert later.watch.history is history and later.watch.window == later._window() == 8


def test_drift_checks_keep_within_their_share_of_the_decode_time(tiny_engine):
    """A drift check waits until the shard has decoded for the worker's mean check cost over
    `drift_share` since the last one (InFlight._affords); a share of 1 checks after every batch's
    worth of rows whatever it costs. A worker whose checks took an hour on the mean checks no more
    at 1%; its checks are counted and timed where they run."""
    arm = SpecConfig("ngram", 3)
    rows = word_rows(32)
    for share, more in ((0.01, False), (1.0, True)):
        worker = flat_profile(4)
        worker.checks, worker.checks_s = 1, 3600.0
        settings = CalibrationSettings(max_tokens=24, sample_size=4, drift_chunk=8, confirm=False, drift_share=share)
        run_shard(tiny_engine, ShardInput("s0", "k", rows), [arm], True, 4, settings, worker=worker)
        assert (worker.checks > 1) is more
        if more:
            assert worker.checks_s > 3600.0 and worker.check_s() < 3600.0
