"""Counterfactual calibration (batchspec.calibrate.counterfactual): every arm predicted from one
plain run on a tiny model, a confirmation where it matters, broken and sampled arms; and real
decisions on the packaged SmolLM2 for copy-heavy vs free prose."""

from __future__ import annotations

import pytest

from batchspec.calibrate import CalibrationSettings, WorkerCalibration, calibrate_counterfactual
from batchspec.calibrate.decision import pick_sample
from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig
from batchspec.shard import ShardInput, run_shard
from tests.data import LENIENT, word_rows


def test_counterfactual_calibration_predicts_every_arm_from_one_plain_run(tiny_engine):
    arms = [SpecConfig("draft_target", k, draft_model="self") for k in (1, 2, 4)] + [SpecConfig("ngram", 3)]
    worker = WorkerCalibration()
    settings = CalibrationSettings(max_tokens=24, sample_size=8, prediction_error=LENIENT)
    d = calibrate_counterfactual(tiny_engine, word_rows(16), arms, 4, settings, shard_id="s0", worker=worker, key="k")
    by = {a.label: a for a in d.arms}
    assert list(by) == ["none"] + [a.label for a in arms]
    for k in (1, 2, 4):  # the target drafting for itself: every draft accepted, exactly
        a = by[f"draft_target:k={k}"]
        assert a.acceptance_exact and a.acceptance_rate == 1.0 and a.predicted_speedup > 0
    assert d.profile and d.profile_s > 0 and worker.profile.points
    assert {p.kind for p in d.profile} == {"target", "draft", "draft_prefill"}
    # the first shard of a key is confirmed by a measured run of the best arm on batch-size other
    # rows of the shard: those rows are kept as output, made by the arm; nothing runs twice
    assert d.confirmed and key_confirmed(worker, "k")
    best = max((a for a in d.arms if a.predicted_speedup), key=lambda a: a.predicted_speedup)
    assert best.measured and best.speedup and by["none"].measured and f"measured {best.speedup:.2f}x" in d.reason
    sample = {f"r{i}" for i in range(0, 16, 2)}  # 8 evenly spaced rows of 16
    plain = {i for i, (_, spec) in d.finished.items() if spec is NO_SPEC}
    confirm = {i: spec.label for i, (_, spec) in d.finished.items() if spec is not NO_SPEC}
    assert plain == sample and len(confirm) == 4 and not set(confirm) & sample
    assert set(confirm.values()) == {best.label} and best.decode_tokens > 0
    assert 0 <= d.overhead_s <= d.calibration_s
    # predicted over measured on the rows it ran (greedy: the arm's own counterfactual on them) is
    # what the method's steps cost over their price: the worker prices them so from now on
    on_rows = float(d.reason.split("predicted ")[-1].split("x on those rows")[0])
    spec = next(a for a in arms if a.label == best.label)
    assert abs(worker.profile.arm_scale(spec.method, spec.draft_model) - on_rows / best.speedup) <= 0.0051 / best.speedup

    # the next shard of the key on this worker: profile reused (it times only the points the first
    # left to it, the smaller batches', where the first's budget did not hold them); confirmed only near the margin
    assert worker.errors["k"]  # the confirmation measured the prediction's error, the key's
    worker.errors["k"], worker.recent = [0.0], [0.0]  # as if the prediction had matched exactly: nothing is near the margin
    owed = {b: list(pts) for b, pts in worker.profile.owed.items()}
    assert all(p[0] < 4 for pts in owed.values() for p in pts) and ("left to the worker's next shard" in d.reason) == bool(owed)
    again = calibrate_counterfactual(tiny_engine, word_rows(16), arms, 4, settings, shard_id="s1", worker=worker, key="k")
    assert (again.profile_s > 0.0) == bool(owed) and not worker.profile.owed
    assert not again.confirmed
    assert all(not a.measured for a in again.arms if a.method != "none")


def test_no_confirmation_of_none_below_the_margin_by_more_than_the_error_or_without_other_rows(tiny_engine):
    """A key's first shard confirms a speculative choice; "none" chosen with the best arm below the
    margin by more than the prediction's error is not (its missed gain, if any, is the drift
    watch's to find), while one within the error is."""
    arms = [SpecConfig("draft_target", 2, draft_model="self")]
    worker = WorkerCalibration(errors={"k": [0.0]})  # a prediction error of 0: anything below the margin is outside it
    # a 10x margin: k=2 commits at most 3 tokens a round, so no timing of the tiny model's forwards
    # (a 2x margin once saw k=2 predicted at 2.7x on a loaded machine) lets it pay
    far = calibrate_counterfactual(tiny_engine, word_rows(16), arms, 4, CalibrationSettings(max_tokens=16, sample_size=8, margin=9.0),
                                   worker=worker, key="k")
    top = far.arms[1]
    assert top.predicted_speedup < 10.0 and not far.confirmed and not top.measured
    # below the margin by more than its error on the width curve alone: the rest of the profile is not measured
    assert "alone, below 10.00x (the 900% margin less the prediction's error): none; the rest of the profile" in far.reason
    assert far.chosen.method == "none" and all(spec.method == "none" for _, spec in far.finished.values())
    near = calibrate_counterfactual(tiny_engine, word_rows(16), arms, 4,
                                    CalibrationSettings(max_tokens=16, sample_size=8, margin=9.0, prediction_error=LENIENT),
                                    worker=WorkerCalibration(), key="k")  # every prediction is near the margin
    assert near.chosen.method == "none" and near.confirmed and near.arms[1].measured
    alone = calibrate_counterfactual(tiny_engine, word_rows(8), arms, 4,
                                     CalibrationSettings(max_tokens=16, sample_size=8, prediction_error=LENIENT))
    assert not alone.confirmed and "not confirmed: no other rows of the shard to confirm on" in alone.reason


def key_confirmed(worker, key) -> bool:
    return key in worker.confirmed_keys


def test_an_arm_that_cannot_load_is_recorded_not_fatal(tiny_engine):
    arms = [SpecConfig("draft_target", 2, draft_model="missing"), SpecConfig("ngram", 2)]
    d = calibrate_counterfactual(tiny_engine, word_rows(8), arms, 4, CalibrationSettings(max_tokens=8))
    broken = next(a for a in d.arms if a.method == "draft_target")
    assert broken.error and "missing" in broken.error and broken.predicted_speedup is None
    assert next(a for a in d.arms if a.method == "ngram").predicted_speedup


def test_sampled_rows_are_predicted_as_an_estimate(tiny_engine):
    rows = [Request(r.id, r.prompt, params=SamplingParams(max_tokens=16, temperature=0.8, seed=1)) for r in word_rows(8)]
    arms = [SpecConfig("draft_target", 2, draft_model="self")]
    d = calibrate_counterfactual(tiny_engine, rows, arms, 4, CalibrationSettings(max_tokens=16))
    arm = d.arms[1]
    assert arm.acceptance_exact is False and "estimated" in d.reason
    assert arm.acceptance_rate == pytest.approx(1.0)  # p == q: every draft passes with probability 1


TEXTS = [
    "The meeting is moved to Thursday at 10am in room 4B. Please bring the quarterly budget report and the hiring plan for the new team.",
    "Alice sent 40 dollars to Bob on Monday, and Bob sent 15 dollars back to Alice on Friday after the trip to the lake.",
    "Our store opens at nine in the morning and closes at six in the evening, every day except Sunday and public holidays.",
    "The package contains two cables, one charger, a short manual in four languages and a warranty card valid for two years.",
]


TOPICS = ["the sea", "autumn", "a cat", "the moon", "rain", "a city at night", "old trees", "winter"]


def chat(i: str, content: str) -> Request:
    return Request(i, messages=({"role": "user", "content": content},), params=SamplingParams(max_tokens=40))


def test_copy_heavy_and_free_prose_shards_get_different_decisions():
    """Real SmolLM2, one worker (one cost profile) calibrating a copy-heavy and a free-prose shard.

    Only what does not depend on the machine's load is asserted exactly: how often the target keeps
    n-gram drafts on each workload (counterfactual, exact for greedy), that every n-gram arm is
    predicted to pay more on copy than on prose (same profile: acceptance decides), and that each
    decision follows its own recorded evidence. The copy shard's win (about 2x) is far from the
    margin; prose's loss (about 0.7x on a quiet machine) is measured, and a loaded machine can move
    a measurement of a loss past the margin, so prose's outcome is checked against its evidence."""
    from batchspec.engine.torch.engine import TorchEngine

    engine = TorchEngine.load("smollm2-135m", dtype="float32", device="cpu")
    copy = [chat(f"c{i}", f"Repeat the following text exactly, word for word:\n\n{t}") for i, t in enumerate(TEXTS)]
    prose = [chat(f"p{i}", f"Write a short poem about {t}.") for i, t in enumerate(TOPICS[:4])]
    settings = CalibrationSettings(max_fraction=1.0, max_tokens=40, min_rows=4)
    arms = [SpecConfig("ngram", k) for k in (2, 4, 6)]
    worker = WorkerCalibration()
    copied = run_shard(engine, ShardInput("copy", "copy", copy), arms, True, 4, settings, worker=worker)
    free = run_shard(engine, ShardInput("prose", "prose", prose), arms, True, 4, settings, worker=worker)
    by_label = {s.stats.shard_key: {a.label: a for a in s.stats.candidates} for s in (copied, free)}
    acc = {key: arms_["ngram:k=2"].acceptance_rate for key, arms_ in by_label.items()}
    assert acc["copy"] > 0.6 and acc["prose"] < 0.35, acc
    for arm in arms:
        assert by_label["copy"][arm.label].predicted_speedup > by_label["prose"][arm.label].predicted_speedup, arm.label
    assert copied.stats.spec_method == "ngram"
    for s in (copied, free):
        assert s.stats.decision_source == "calibrated" and len(s.stats.candidates) == 4
        chosen = by_label[s.stats.shard_key].get(f"{s.stats.spec_method}:k={s.stats.draft_len}")
        spec = [a for a in s.stats.candidates if a.method != "none" and a.predicted_speedup]
        best = max(spec, key=lambda a: (a.predicted_speedup, -a.draft_len))  # the arm calibration backs
        if s.stats.spec_method == "none":  # its decisive figure (measured if confirmed) did not beat the margin
            figure = best.speedup if best.speedup is not None else best.predicted_speedup
            assert figure <= 1 + settings.margin, (best.label, figure)
        else:  # the chosen arm's decisive figure beat it
            figure = chosen.speedup if chosen.speedup is not None else chosen.predicted_speedup
            assert figure > 1 + settings.margin, figure


def test_a_confirmation_on_rows_of_one_token_measures_nothing_and_keeps_them(tiny_engine):
    """Rows that end after their first token leave no decode step: the confirmation cannot
    measure a speedup (make run's code shard divided by a plain time of zero here and failed);
    it says so and keeps the rows the arm made."""
    arms = [SpecConfig("draft_target", 2, draft_model="self")]
    sample = {r.id for r in pick_sample(word_rows(12), 4, 24)}  # decoded to 24 tokens; every other row to 1
    rows = [r if r.id in sample else Request(r.id, r.prompt, params=SamplingParams(max_tokens=1)) for r in word_rows(12)]
    worker = WorkerCalibration()
    d = calibrate_counterfactual(tiny_engine, rows, arms, 4, CalibrationSettings(sample_size=4, prediction_error=LENIENT),
                                 worker=worker, key="k")
    assert not d.confirmed and not worker.errors and "k" not in worker.confirmed_keys  # the prediction's choice stands, unmeasured
    assert "not confirmed: the 4 rows draft_target:k=2 ran on (kept) ended after their first token" in d.reason
    by_spec = sorted(spec.label for _, spec in d.finished.values())
    assert by_spec == ["draft_target:k=2"] * 4 + ["none"] * 4


def test_no_profile_where_speculation_could_not_repay_it(tiny_engine):
    """Rows of two tokens leave one decode step each: even with every draft accepted the rest of
    the shard could save less than the profile's probes would cost, so none, without profiling."""
    arms = [SpecConfig("draft_target", 2, draft_model="self")]
    rows = [Request(r.id, r.prompt, params=SamplingParams(max_tokens=2)) for r in word_rows(12)]
    worker = WorkerCalibration()
    d = calibrate_counterfactual(tiny_engine, rows, arms, 4, CalibrationSettings(sample_size=4), worker=worker, key="k")
    assert d.reason.startswith("speculation cannot repay a cost profile on this shard")
    assert d.chosen.method == "none" and d.profile_s == 0 and not worker.profile.points
    assert len(d.finished) == 4 and [a.label for a in d.arms] == ["none"]


def test_the_profile_is_skipped_where_the_samples_acceptance_could_not_repay_it():
    """The saving that must repay a profile is bounded by the steps the best arm would have saved
    on the sample, not by every draft accepted: the same shard (8 sample rows of 40 tokens, 64
    rows, 12 probes) is worth profiling when an arm would have saved a few steps, and not when
    no arm would have saved one (every draft rejected, or rows too short to draft into)."""
    from batchspec.calibrate.profiling import cannot_repay, rest_s
    from batchspec.engine.base import Completion, GenerateResult, Timing
    from batchspec.predict.acceptance import Acceptance, PlainRow

    rows = [PlainRow([1] * 50, list(range(40)), 40) for _ in range(8)]  # 39 decode steps each, 312 in all
    plain = GenerateResult([Completion(f"r{i}", "", token_ids=list(range(40)), output_tokens=40, target_steps=39)
                            for i in range(8)], Timing(verify_s=3.9))
    grid = ([(8, 100, w) for w in (1, 3, 5, 9)] + [(8, 50, 1), (8, 130, 1), (1, 100, 1), (1, 100, 9)], [])

    def arm(steps_per_row: int) -> Acceptance:
        return Acceptance("ngram", 4, steps=[[0.0] * steps_per_row] * 8, proposed=[[4] * steps_per_row] * 8)

    # the rest of the shard: 3.9 s x 56 / 8 = 27.3 s of plain decoding; the profile >= 12 x 3.9 / 312 = 0.15 s
    assert cannot_repay(plain, rest_s(plain, 8, 64), grid, 8, rows, {"ngram:k=4": arm(38)}) is None  # saves 2.6%: 0.7 s
    why = cannot_repay(plain, rest_s(plain, 8, 64), grid, 8, rows, {"ngram:k=2": arm(39), "ngram:k=4": arm(39)})
    assert why.startswith("speculation cannot repay a cost profile on this shard")
    assert "would shrink by at most 0.0 s (the best arm, ngram:k=2, would have saved 0% of the sample's target steps)" in why
    assert cannot_repay(plain, rest_s(plain, 8, 8), grid, 8, rows, {"ngram:k=4": arm(39)}) is None  # the whole shard was the sample


def test_the_profile_is_measured_again_only_where_its_width_curve_is_far_from_the_shard():
    """A width curve prices shards whose middle context is within a factor of two of its own (the
    ratio of a wide step to a narrow one moves little with context; the shard's plain run sets the
    level), and up to four where a plain step, timed at the shard's lowest and highest context,
    costs about the same (weights, not attention, set the cost): those two points are timed first,
    and the grid only if they show the cost moves. A shard farther off, a new batch size or a
    longer draft measures a new grid."""
    from batchspec.calibrate.profiling import grid_needed, refresh_profile, shape_of
    from batchspec.engine.base import StepCost
    from batchspec.predict.acceptance import PlainRow
    from batchspec.predict.cost import CostProfile, profile_grid

    def rows(lo, hi):
        return [PlainRow(list(range(n)), [1, 2, 3], 8) for n in (lo, hi)]

    class Timed:
        """An engine whose forwards cost `cost(context)`; it records what it was asked to time."""

        def __init__(self, cost):
            self.cost, self.asked = cost, []

        def profile(self, target, drafts, temperature=0.0):
            self.asked.append(sorted(target))
            return [StepCost("target", "m", b, c, w, self.cost(c)) for b, c, w in target]

    arms = [SpecConfig("ngram", 4)]
    # a shard of contexts 100..300 (prompts up to 292, 8 out): at batch 8 its steps read up to
    # 2 x 300 + 64 slots, the batch's holes included (kv.Batch.compact); one row has none
    assert shape_of(rows(100, 292), arms, 8, 8) == (8, 100, 664, 5, []) and shape_of(rows(100, 292), arms, 1, 8) == (1, 100, 300, 5, [])
    assert grid_needed(CostProfile(), (8, 100, 300, 5, [])) == profile_grid(8, 100, 300, 5)  # middle 200

    def refreshed(cost, lo, hi):
        """What a worker profiled at contexts 100..300 times for a shard of contexts lo..hi."""
        engine, profile = Timed(cost), CostProfile()
        refresh_profile(engine, profile, profile_grid(8, 100, 300, 5), 0.0, (8, 100, 300, 5, []))
        engine.asked.clear()
        shape = (8, lo, hi, 5, [])
        grid = grid_needed(profile, shape)
        if grid is not None:
            refresh_profile(engine, profile, grid, 0.0, shape)
        assert profile.covers(*shape)
        return engine.asked

    def flat(c):
        return 0.1

    def steep(c):
        return 0.1 * (1 + c / 100)  # attention matters

    assert refreshed(flat, 100, 300) == [] and refreshed(steep, 100, 300) == []
    assert refreshed(steep, 300, 500) == []  # middle 400: 2x the curve's
    assert refreshed(flat, 400, 600) == [[(8, 400, 1), (8, 600, 1)]]  # middle 500: timed, flat, covered
    assert refreshed(flat, 60, 80) == [[(8, 60, 1), (8, 80, 1)]]  # middle 70
    assert refreshed(flat, 40, 200) == []  # middle 120: within 2x
    assert refreshed(flat, 40, 120) == [[(8, 40, 1)]]  # middle 80; 120 lies among the contexts timed
    probed = [(8, 400, 1), (8, 600, 1)]  # timed: steep; then the grid, less what the probe timed
    assert refreshed(steep, 400, 600) == [probed, [p for p in profile_grid(8, 400, 600, 5)[0] if p not in probed]]
    assert refreshed(flat, 1000, 1200) == [profile_grid(8, 1000, 1200, 5)[0]]  # middle 1100: 5.5x, a grid at once
    profile = CostProfile()
    profile.merge([StepCost("target", "m", b, c, w, steep(c)) for b, c, w in profile_grid(8, 100, 300, 5)[0]], 1.0)
    assert grid_needed(profile, (3, 100, 300, 5, [])) == profile_grid(3, 100, 300, 5)
    assert grid_needed(profile, shape_of(rows(100, 292), [SpecConfig("ngram", 8)], 8, 8)) == profile_grid(8, 100, 664, 9)


def test_within_a_shards_budget_every_point_is_timed_once_and_again_only_where_the_budget_allows():
    """profiling.refresh_profile with a budget (profile_budget: PROFILE_SHARE of the shard's plain
    decode seconds): every target point of the grid is timed once, and a second try of a point
    (its price the faster of the two) is taken a group at a time, the production batch's width
    curve first, then its context's ends, then the smaller batches, each where what its first try
    took fits what is left of the budget. Without one (the sample was the whole shard), two tries
    of every point, as engine.profile takes them."""
    from batchspec.calibrate.profiling import PROFILE_SHARE, profile_budget, refresh_profile
    from batchspec.engine.base import GenerateResult, StepCost, Timing
    from batchspec.predict.cost import CostProfile, profile_grid

    class Tried:
        """Forwards that cost 0.01 s per row and token; a point's second try is 10% faster where its
        width is odd-indexed, 10% slower elsewhere. Records (points, least) per call."""

        def __init__(self):
            self.calls, self.seen = [], {}

        def profile(self, target, drafts=(), temperature=0.0, least=2):
            self.calls.append((list(target), least))
            out = []
            for b, c, w in target:
                n = self.seen[(b, c, w)] = self.seen.get((b, c, w), 0) + 1
                scale = 1.0 if n == 1 else (0.9 if w in (3, 9) else 1.1)
                out.append(StepCost("target", "m", b, c, w, 0.01 * b * w * scale))
            return out

    shape = (8, 100, 300, 9, [])
    grid = profile_grid(*shape)
    points = grid[0]

    def refreshed(budget):
        engine, profile = Tried(), CostProfile()
        spent, stop, once, owed = refresh_profile(engine, profile, grid, 0.0, shape, lambda p: (None, []), budget)
        assert stop is None and owed == 0 and profile.covers(*shape)
        return engine, profile, once

    engine, profile, once = refreshed(None)  # no budget: two tries of each, in one call per part
    assert once == 0 and {least for _, least in engine.calls} == {2} and sorted(engine.seen) == sorted(points)
    assert all(n == 1 for n in engine.seen.values())

    engine, profile, once = refreshed(float("inf"))  # every point once, then every point again
    assert once == 0 and all(n == 2 for n in engine.seen.values()) and sorted(engine.seen) == sorted(points)
    assert all(least == 1 for _, least in engine.calls)
    price = {p.key[2:]: p.seconds for p in profile.points}
    assert price[(8, 200, 9)] == pytest.approx(0.01 * 8 * 9 * 0.9)  # the second try was faster
    assert price[(8, 200, 5)] == pytest.approx(0.01 * 8 * 5)  # the first was
    again = [call for call, _ in engine.calls[3:]]  # after the curve's, the production batch's rest and the smaller batches' first tries
    assert again[0] == [(8, 200, 1), (8, 200, 3), (8, 200, 5), (8, 200, 9)]  # the curve first
    assert [c[0][:2] for c in again] == [(8, 200), (8, 100), (8, 300), (4, 200), (1, 200)]

    engine, profile, once = refreshed(0.0)  # no second try at all
    assert once == len(points) and all(n == 1 for n in engine.seen.values())

    curve_s = 0.01 * 8 * (1 + 3 + 5 + 9)  # the curve's first tries: 1.44 s
    # the curve fits (its second tries took 1.39 s); the next group, its low end (0.8 s), does not,
    # the one after, its high end (0.08 s), does; the smaller batches (0.4 s, 0.1 s) do not
    engine, profile, once = refreshed(curve_s + 0.05)
    tried = {p for p, n in engine.seen.items() if n == 2}
    assert tried == {(8, 200, w) for w in (1, 3, 5, 9)} | {(8, 300, 1)} and once == len(points) - 5

    # where no arm can pay on the curve, its second tries go first (they may turn the answer), the
    # answer is asked again, and the rest of the grid is not measured
    engine, profile, asked = Tried(), CostProfile(), []

    def never(p):
        asked.append({q.key[2:]: q.seconds for q in p.points})
        return "no arm pays", []

    spent, stop, once, owed = refresh_profile(engine, profile, grid, 0.0, shape, never, float("inf"))
    curve = {p for p in points if p[0] == 8 and (p[1] == 200 or p[1] == 100 and p[2] == 9)}
    assert stop == ("no arm pays", []) and once == owed == 0 and 8 in profile.cut
    assert set(engine.seen) == curve and all(n == 2 for n in engine.seen.values())  # the rest not measured
    assert len(asked) == 2 and asked[1][(8, 200, 9)] == pytest.approx(0.01 * 8 * 9 * 0.9)  # asked again, on the faster try

    plain = GenerateResult([], Timing(verify_s=3.0))  # the budget: PROFILE_SHARE of the shard's plain decode
    assert profile_budget(plain, 57.0) == pytest.approx(PROFILE_SHARE * 60.0) and profile_budget(plain, None) is None


def test_within_a_budget_the_smaller_batches_points_wait_for_a_later_shard_where_the_anchor_ran_full():
    """profiling.refresh_profile with a budget times the production batch's points first; the
    points below it (batch 1, half the batch) follow only where their first tries, priced from the
    profile as it stands, fit what is left, or where the steps that anchor the profile ran some at
    fewer rows (`full` false). Otherwise they are owed (CostProfile.owed): the profile covers the
    shard without them, the next shard at that batch gets them from grid_needed, alone, and times
    each once within a budget; a timed point is owed no more."""
    from batchspec.calibrate.profiling import grid_needed, refresh_profile
    from batchspec.engine.base import StepCost
    from batchspec.predict.cost import CostProfile, profile_grid

    class Tried:
        def __init__(self):
            self.calls = []

        def profile(self, target, drafts=(), temperature=0.0, least=2):
            self.calls.append((list(target), least))
            return [StepCost("target", "m", b, c, w, 0.01 * b * w) for b, c, w in target]

    shape = (8, 100, 300, 9, [])
    points = profile_grid(*shape)[0]
    smaller = [p for p in points if p[0] < 8]
    assert sorted(smaller) == [(1, 200, 1), (1, 200, 9), (4, 200, 1), (4, 200, 9)]

    def refreshed(budget, full):
        engine, profile = Tried(), CostProfile()
        out = refresh_profile(engine, profile, profile_grid(*shape), 0.0, shape, lambda p: (None, []), budget, full)
        timed = {p for call, _ in engine.calls for p in call}
        return engine, profile, out, timed

    engine, profile, (_, stop, once, owed), timed = refreshed(0.0, lambda p: True)  # no room left, the anchor ran full
    assert stop is None and owed == 4 and timed == set(points) - set(smaller) and once == len(points) - 4
    assert sorted(profile.owed[8]) == sorted(smaller) and profile.covers(*shape)
    assert profile.target_s(1, 200, 1) > 0  # priced along the production batch's points meanwhile
    grid = grid_needed(profile, shape)
    assert grid == (profile.owed[8], [])  # the next shard at batch 8 times them, and nothing else
    engine.calls.clear()
    assert refresh_profile(engine, profile, grid, 0.0, shape, lambda p: (None, []), 0.0, lambda p: True)[1:] == (None, 0, 0)
    assert sorted(p for call, _ in engine.calls for p in call) == sorted(smaller) and {n for _, n in engine.calls} == {1}
    assert profile.owed == {} and grid_needed(profile, shape) is None

    # the anchor's steps ran some at fewer rows: they are timed whatever the budget
    engine, profile, (_, _, _, owed), timed = refreshed(0.0, lambda p: False)
    assert owed == 0 and timed == set(points) and profile.owed == {}
    # room for them: timed (and the budget's second tries go on)
    engine, profile, (_, _, once, owed), timed = refreshed(float("inf"), lambda p: True)
    assert owed == 0 and once == 0 and timed == set(points)
    # no budget (the sample was the whole shard): two tries of every point, none owed
    engine, profile, (_, _, once, owed), timed = refreshed(None, lambda p: True)
    assert owed == once == 0 and timed == set(points) and {n for _, n in engine.calls} == {2}
    # a new grid at the batch (another context) replaces what the last one left
    engine, profile, _, _ = refreshed(0.0, lambda p: True)
    other = (8, 400, 600, 9, [])
    refresh_profile(engine, profile, profile_grid(*other), 0.0, other, lambda p: (None, []), 0.0, lambda p: True)
    assert sorted(profile.owed[8]) == sorted(p for p in profile_grid(*other)[0] if p[0] < 8)


def test_an_anchor_counts_the_steps_it_priced_with_fewer_rows_than_the_batch():
    """Anchor.short (which says whether the smaller batches' points may wait: profiling.refresh_profile):
    a sample replayed alone (Anchor.of) runs short where its rows end apart; steps in flight
    (anchor_of_steps) count against the batch size."""
    from batchspec.calibrate.pricing import Anchor, anchor_of_steps
    from batchspec.engine.base import GenerateResult, Step, StepCost, Timing
    from batchspec.predict.acceptance import PlainRow
    from batchspec.predict.cost import CostProfile

    profile = CostProfile()
    profile.merge([StepCost("target", "m", 2, c, w, 0.01 * w) for c in (10, 40) for w in (1, 3)], 0.0)
    plain = GenerateResult([], Timing(verify_s=1.0))

    def row(n):
        return PlainRow(list(range(10)), list(range(n)), 24)

    assert Anchor.of(plain, [row(5), row(5)], profile, 2).short == 0
    assert Anchor.of(plain, [row(5), row(3)], profile, 2).short == 2  # the longer row's last two steps alone
    assert Anchor.of(plain, [row(5)], profile, 2).short == 4  # one row: never a full batch
    steps = [Step(2, 10, 1, 2), Step(2, 11, 1, 2), Step(1, 12, 1, 1)]
    assert anchor_of_steps(Timing(verify_s=1.0), steps, profile, 2).short == 1
    assert anchor_of_steps(Timing(verify_s=1.0), steps, profile, 4).short == 3
    assert anchor_of_steps(Timing(verify_s=1.0), steps, profile).short == 1  # the most rows a step ran


def test_a_sample_is_priced_as_the_shard_runs_it_with_its_batch_kept_full():
    """A sample whose rows mostly end after their first token decodes one row at a time; the shard
    it stands for keeps its batch full while its queue lasts. Priced as a stream of the shard's
    first chunk (the rows taken again in turn), the sample's one long row runs as eight would."""
    from batchspec.calibrate.pricing import Anchor, predict_arms
    from batchspec.engine.base import StepCost
    from batchspec.predict.acceptance import PlainRow, ngram_acceptance
    from batchspec.predict.cost import CostProfile

    long = PlainRow([5, 6, 7, 8], [5, 6, 7, 8] * 6, 24)  # copies its prompt: n-gram accepts
    rows = [long] + [PlainRow([9, 10 + i], [3], 24) for i in range(7)]  # seven rows that end at once
    arm = SpecConfig("ngram", 2)
    profile = CostProfile()  # speculation pays at one row in flight, not at eight
    profile.merge([StepCost("target", "m", 1, 40, 1, 1.0), StepCost("target", "m", 1, 40, 3, 1.1),
                   StepCost("target", "m", 8, 40, 1, 1.2), StepCost("target", "m", 8, 40, 3, 3.5)], 0.0)

    def speedup(sample, stream):
        counter = ({arm.label: ngram_acceptance(sample, [2], 2)[2]}, 0.0)
        return predict_arms(None, sample, [arm], Anchor(1.0, 0.0), profile, 8, counter, stream)[0].predicted_speedup

    alone, streamed = speedup(rows, 0), speedup(rows, 64)
    assert alone > 2.0 and streamed < 1.2  # one row in flight against eight
    assert streamed == pytest.approx(speedup([long] * 8, 0))  # 64 rows in turn: the long one 8 times, the rest never decode
    assert speedup(rows, 4) == pytest.approx(alone)  # a stream shorter than the sample prices the sample


def test_a_streamed_sample_batches_distinct_rows_as_the_shard_does_not_copies_of_one():
    """Eight sample rows of different prompt lengths, each accepting drafts in a different half
    of its steps: in a batch of them some row proposes at every step, so every step is a verify.
    Streamed to 64 rows, the copies of one row have one prompt length, and the engine's admission
    order (shortest first within a window) would put eight copies of a row in one batch, whose
    steps are verifies only while that row proposes: the stream would price speculation far
    cheaper than the shard runs it (bench/acceptance_spread.py, held-out 64-row shards at batch 8,
    2026-12-05: 12% of arms within 10% on the sample alone, 65% paired). Each turn of the stream
    pairs the sample's prompt lengths with other rows' outputs, so a batch holds every row's
    steps, as the sample's own batch does."""
    from batchspec.calibrate.pricing import Anchor, predict_arms, streamed
    from batchspec.engine.base import StepCost
    from batchspec.predict.acceptance import Acceptance, PlainRow
    from batchspec.predict.cost import CostProfile

    arm = SpecConfig("ngram", 2)
    steps = [[2.0 if (s - r) % 8 < 4 else 0.0 for s in range(8)] for r in range(8)]  # 4 x 3 + 4 x 1 = 16 tokens
    rows = [PlainRow(list(range(10 + r)), list(range(17)), 24) for r in range(8)]
    counter = ({arm.label: Acceptance("ngram", 2, steps, [[2 if n else 0 for n in s] for s in steps])}, 0.0)
    profile = CostProfile()  # a verify of 3 tokens costs two plain steps; context does not matter
    profile.merge([StepCost("target", "m", 8, c, w, t) for c in (10, 60) for w, t in ((1, 1.0), (3, 2.0))], 0.0)

    def speedup(stream: int) -> float:
        return predict_arms(None, rows, [arm], Anchor(1.0, 0.0), profile, 8, counter, stream)[0].predicted_speedup

    assert speedup(0) == pytest.approx(1.0)  # 16 plain steps against 8 verifies at twice the price
    assert speedup(64) == pytest.approx(speedup(0))  # copies of one row together would say 16 / 12 = 1.33x
    assert streamed([], 64) == []  # no rows: nothing to take again


class Priced:
    """The tiny engine with forwards that cost `cost(batch, tokens per row)` seconds: what it is
    asked to time is recorded, the rest is the tiny engine's."""

    def __init__(self, engine, cost):
        self.engine, self.cost, self.asked = engine, cost, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def profile(self, target, drafts=(), temperature=0.0, least=2):
        from batchspec.engine.base import StepCost

        self.asked += list(target)
        return [StepCost("target", "tiny", b, c, w, self.cost(b, w)) for b, c, w in target]


@pytest.mark.parametrize("verify", ["per_token", "flat"])
def test_the_profile_stops_at_the_width_curve_where_no_arm_can_pay_on_it(tiny_engine, verify):
    """Of a whole grid the production batch's width curve is measured first. Where a verify of
    k + 1 tokens costs k + 1 plain steps (this CPU at batch 8, exaggerated), every arm prices below
    the margin on it: the rest of the grid (the context's ends, batch 1 and half the batch) is not
    measured, the reason says so, and the profile, cut short, covers no shard, but the next one it
    reaches is priced on the curve again without a point timed. Where
    a verify costs one plain step whatever its width (a GPU's, exaggerated), the whole grid is."""
    cost = (lambda b, w: 0.01 * b * w) if verify == "per_token" else (lambda b, w: 0.01)
    engine = Priced(tiny_engine, cost)
    arms = [SpecConfig("ngram", k) for k in (2, 4)]
    worker = WorkerCalibration()
    d = calibrate_counterfactual(engine, word_rows(32), arms, 4, CalibrationSettings(max_tokens=24, sample_size=8),
                                 worker=worker, key="k")
    asked = set(engine.asked)
    batch_curve = {p for p in asked if p[0] == 4 and p[2] > 1}
    assert {w for _, _, w in batch_curve} == {3, 5}
    if verify == "per_token":
        assert d.chosen.method == "none" and "the rest of the profile (the context's ends, batch 1 and half the batch) not measured" in d.reason
        # the curve, and its widest verify at the context's low end (how a verify moves with context)
        assert not any(b in (1, 2) for b, _, _ in asked) and len(asked) == 4
        assert len({c for _, c, w in asked if w == 5}) == 2 and len({c for _, c, w in asked if w == 3}) == 1
        assert all(a.predicted_speedup < 1.0 for a in d.arms if a.method != "none")  # priced, and in the stats
        assert d.profile_s > 0 and not d.confirmed
        from batchspec.calibrate.profiling import shape_of
        from batchspec.predict.acceptance import PlainRow

        shard = [PlainRow(engine.encode(r), [1, 2, 3], 24) for r in word_rows(8)]
        assert not worker.profile.covers(*shape_of(shard, arms, 4, 24))  # cut short: covers no shard ...
        timed = len(engine.asked)
        again = calibrate_counterfactual(engine, word_rows(32)[1:], arms, 4, CalibrationSettings(max_tokens=24, sample_size=8),
                                         worker=worker, key="k")
        assert len(engine.asked) == timed  # ... but one it reaches is priced on it, with nothing timed
        assert "on the production batch's width curve alone" in again.reason
    else:
        shape_asked = {(b, w) for b, _, w in asked}
        smaller = {(1, 1), (1, 5), (2, 1), (2, 5)}  # batch 1 and half the batch: measured too, or left to the
        owed = {(b, w) for b, _, w in worker.profile.owed.get(4, ())}  # next shard where the budget did not hold them
        assert smaller <= shape_asked and not owed or (not smaller & shape_asked and owed == smaller
                                                         and "left to the worker's next shard at batch 4" in d.reason)
        assert len({c for b, c, w in asked if b == 4 and w == 1}) == 3  # the context's ends too
        assert len(engine.asked) == len(asked)  # no point timed twice


def test_a_worker_keeps_the_last_rows_of_its_most_recent_keys_only():
    """WorkerCalibration.remember: a key's history replaces its last, and past HISTORY_KEYS keys the
    one seen longest ago goes (a job keyed by thousands of values does not hold thousands of windows)."""
    from batchspec.calibrate.worker import HISTORY_KEYS

    worker = WorkerCalibration()
    for i in range(HISTORY_KEYS + 3):
        worker.remember(f"k{i}", f"rows of k{i}")
    worker.remember("k3", "new rows of k3")  # seen again: now the most recent
    worker.remember("late", "rows of late")
    assert len(worker.history) == HISTORY_KEYS
    assert "k0" not in worker.history and "k4" not in worker.history and worker.history["k3"] == "new rows of k3"
    assert list(worker.history)[-2:] == ["k3", "late"]


def test_a_keys_prediction_error_is_its_own_and_the_workers_recent_not_the_largest_ever(tiny_engine):
    """WorkerCalibration.prediction_error: the largest of the key's last ERRORS_KEPT confirmations
    and the worker's last ERRORS_KEPT (any key's: the machine's drift); a worker with none, the
    setting's default. The largest error the worker had ever measured once made every key's
    prediction count as near the margin for good (stop 32, batch 1: every later shard confirmed)."""
    from batchspec.calibrate.worker import ERRORS_KEPT

    worker = WorkerCalibration()
    assert worker.prediction_error("k", 0.1) == 0.1
    worker.record_error("noisy", 0.7)
    assert worker.prediction_error("new", 0.1) == 0.7  # no confirmation of its own yet: the worker's recent
    for error in (0.5, 0.01, 0.02, 0.03, 0.04):
        worker.record_error("k", error)
    assert worker.errors["k"] == [0.01, 0.02, 0.03, 0.04][-ERRORS_KEPT:]  # the 0.5 has aged out
    assert worker.recent == [0.01, 0.02, 0.03, 0.04][-ERRORS_KEPT:]  # and so has the noisy key's 0.7
    assert worker.prediction_error("k", 0.1) == 0.04 and worker.prediction_error("new", 0.1) == 0.04
    assert worker.prediction_error("noisy", 0.1) == 0.7  # its own, until it confirms again
    worker.record_error("other", 0.3)  # the machine drifted: every key's next prediction allows it
    assert worker.prediction_error("k", 0.1) == 0.3

    arms = [SpecConfig("draft_target", 2, draft_model="self")]
    settings = CalibrationSettings(max_tokens=16, sample_size=8, margin=9.0)  # nothing pays 10x: none is chosen
    worker = WorkerCalibration(errors={"k": [0.0], "noisy": [LENIENT]}, confirmed_keys={"k", "noisy"})
    mine = calibrate_counterfactual(tiny_engine, word_rows(16), arms, 4, settings, worker=worker, key="k")
    assert mine.chosen.method == "none" and not mine.confirmed and not mine.arms[1].measured  # its own error: far
    noisy = calibrate_counterfactual(tiny_engine, word_rows(16), arms, 4, settings, worker=worker, key="noisy")
    assert noisy.confirmed and noisy.arms[1].measured and "prediction within its error" in noisy.reason
    assert len(worker.errors["noisy"]) == 2 and worker.errors["k"] == [0.0]  # the measurement is the key's


def test_a_choice_that_turns_on_the_arm_scale_is_confirmed(tiny_engine):
    """The arm scale (a method's steps measured over their price, from a few short confirmations)
    may lift an arm over the margin, or drop it under: such a choice is measured, whatever the
    key's error; one the scale does not turn is not."""
    from batchspec.calibrate.counterfactual import _turned_by
    from batchspec.predict.cost import CostProfile

    ngram = SpecConfig("ngram", 2)
    scaled = CostProfile(arm_ratios={"ngram": [0.5]})
    assert _turned_by(scaled, ngram, 1.2, 0.05) == 0.5  # 1.2x pays; at the points' price, 0.6x
    assert _turned_by(scaled, ngram, 3.0, 0.05) == 1.0  # pays either way
    assert _turned_by(scaled, ngram, 0.5, 0.05) == 1.0  # pays neither way
    assert _turned_by(CostProfile(arm_ratios={"ngram": [2.0]}), ngram, 0.9, 0.05) == 2.0  # would pay at the points' price
    assert _turned_by(CostProfile(), ngram, 1.2, 0.05) == 1.0

    arms = [ngram]
    worker = WorkerCalibration(errors={"k": [0.0]}, recent=[0.0], confirmed_keys={"k"})  # no error: nothing is near
    plain = calibrate_counterfactual(tiny_engine, word_rows(16), arms, 4, CalibrationSettings(max_tokens=16, sample_size=8),
                                     worker=worker, key="k")
    unscaled = plain.arms[1].predicted_speedup
    assert not plain.confirmed and unscaled > 0
    # its steps priced at a tenth: the prediction ten times as high, over a margin three times the
    # one at the points' price (a tiny model's timings move between calls, not threefold)
    worker.profile.arm_ratios["ngram"] = [0.1]
    settings = CalibrationSettings(max_tokens=16, sample_size=8, margin=3 * unscaled - 1)
    lifted = calibrate_counterfactual(tiny_engine, word_rows(16), arms, 4, settings, worker=worker, key="k")
    assert lifted.arms[1].measured and lifted.confirmed
    assert "confirmed (the choice turns on the ngram:k=2 steps' measured cost on this worker, 0.10x" in lifted.reason
