"""Calibration: the decision rule and the draft-length prediction on constructed measurements, the
calibration loop on a tiny model, and real decisions on SmolLM2 for copy-heavy vs free prose."""

from __future__ import annotations

import math

import pytest

from batchspec.calibrate import CalibrationSettings, Decision, calibrate, choose
from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig
from batchspec.predict import (
    acceptance_from_mean_len,
    expected_tokens_per_step,
    predict_tokens_per_s,
    tokens_per_step,
)
from batchspec.shard import ShardInput, run_shard
from batchspec.stats import ArmResult

NGRAM = [SpecConfig("ngram", k) for k in (2, 4, 6)]


def arm(method: str, k: int, tps: float | None, **kw) -> ArmResult:
    return ArmResult(method, k, tokens_per_s=tps, measured=tps is not None, **kw)


def test_speculation_is_chosen_only_above_the_margin():
    spec, reason = choose([arm("none", 0, 100.0), arm("ngram", 4, 104.0)], NGRAM, margin=0.05)
    assert spec is NO_SPEC and "not above the 5% margin" in reason
    spec, reason = choose([arm("none", 0, 100.0), arm("ngram", 4, 106.0)], NGRAM, margin=0.05)
    assert spec.label == "ngram:k=4" and "1.06x" in reason


def test_slower_speculation_is_never_chosen():
    spec, _ = choose([arm("none", 0, 100.0), arm("ngram", 2, 60.0), arm("ngram", 4, 90.0)], NGRAM, 0.0)
    assert spec is NO_SPEC


def test_ties_go_to_the_shorter_draft_and_to_none():
    spec, _ = choose([arm("none", 0, 100.0), arm("ngram", 6, 150.0), arm("ngram", 2, 150.0)], NGRAM, 0.05)
    assert spec.label == "ngram:k=2"
    spec, _ = choose([arm("none", 0, 100.0), arm("ngram", 4, 100.0)], NGRAM, 0.0)
    assert spec is NO_SPEC  # equal to plain is not better than plain


def test_errored_and_predicted_only_arms_never_win():
    results = [
        arm("none", 0, 100.0),
        arm("ngram", 2, 500.0, error="draft model failed to load"),
        ArmResult("ngram", 6, predicted_tokens_per_s=900.0),  # predicted, never measured
        arm("ngram", 4, 120.0),
    ]
    spec, _ = choose(results, NGRAM, 0.05)
    assert spec.label == "ngram:k=4"


def test_no_measured_baseline_means_none():
    spec, reason = choose([arm("ngram", 4, 120.0)], NGRAM, 0.05)
    assert spec is NO_SPEC and "plain decoding could not be measured" in reason


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


# -- the calibration loop on a tiny model ------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_engine(word_models):
    from batchspec.engine.torch.engine import TorchEngine

    target, drafts, tokenizer = word_models

    def loader(name):
        if name not in drafts:
            raise RuntimeError(f"no draft called {name}")
        return drafts[name], tokenizer

    return TorchEngine(target, tokenizer, model_name="tiny", draft_loader=loader)


def word_rows(n: int) -> list[Request]:
    return [Request(f"r{i}", " ".join(f"w{(i * 7 + j) % 11 + 1}" for j in range(6 + i % 5)),
                    params=SamplingParams(max_tokens=24)) for i in range(n)]


def test_calibration_records_every_arm_and_predicts_the_unmeasured(tiny_engine):
    arms = [SpecConfig("draft_target", k, draft_model="self") for k in (1, 2, 4)]
    d = calibrate(tiny_engine, word_rows(12), arms, 4, CalibrationSettings(max_fraction=100.0, max_tokens=16))
    labels = [a.label for a in d.arms]
    assert labels == ["none", "draft_target:k=1", "draft_target:k=2", "draft_target:k=4"]
    probe = next(a for a in d.arms if a.draft_len == 1)  # the shortest candidate is measured first
    assert probe.measured and probe.acceptance_rate == 1.0  # the target drafting for itself
    assert all(a.predicted_tokens_per_s for a in d.arms if a.method != "none")
    assert all(a.speedup and a.speedup > 0 for a in d.arms if a.measured and a.method != "none")
    assert d.baseline_tokens_per_s == d.arms[0].tokens_per_s and d.calibration_s > 0
    assert 0 <= d.overhead_s <= d.calibration_s
    assert not d.capped


def test_a_failing_arm_is_skipped_and_recorded(tiny_engine):
    arms = [SpecConfig("draft_target", 2, draft_model="missing"), SpecConfig("ngram", 2)]
    d = calibrate(tiny_engine, word_rows(8), arms, 4, CalibrationSettings(max_fraction=100.0, max_tokens=8))
    broken = next(a for a in d.arms if a.method == "draft_target")
    assert "no draft called missing" in broken.error and d.chosen.method != "draft_target"


class ScriptedEngine:
    """A stand-in engine with a scripted cost model and its own clock, so the calibration loop's
    logic (which arm runs in which round, pairing, the budget, what it costs) is tested exactly,
    without timing noise. Every row generates its max_tokens; a target step costs `verify_s` plus
    `per_draft_s` per drafted token, and commits (1 - a^(k+1)) / (1 - a) tokens per row."""

    name = model_name = "scripted"

    def __init__(self, acceptance: float, verify_s: float = 0.010, per_draft_s: float = 0.001):
        self.acceptance, self.verify_s, self.per_draft_s = acceptance, verify_s, per_draft_s
        self.now = 0.0
        self.calls: list[tuple[str, list[str]]] = []

    def clock(self) -> float:
        return self.now

    def check(self, spec: SpecConfig) -> None:
        pass

    def close(self) -> None:
        pass

    def generate(self, requests, spec, batch_size):
        from batchspec.engine.base import Completion, GenerateResult, Timing

        self.calls.append((spec.label, [r.id for r in requests]))
        k = spec.draft_len
        per_row_step = expected_tokens_per_step(self.acceptance, k) if k else 1.0
        completions = []
        for r in requests:
            n = r.params.max_tokens
            steps = math.ceil((n - 1) / per_row_step)
            completions.append(Completion(r.id, "x", token_ids=[1] * n, output_tokens=n, finish_reason="length",
                                          draft_tokens=steps * k, accepted_tokens=(n - 1) - steps if k else 0,
                                          target_steps=steps))
        steps = math.ceil(len(requests) / batch_size) * max(c.target_steps for c in completions)
        timing = Timing(prefill_s=0.001, verify_s=steps * (self.verify_s + self.per_draft_s * k), other_s=0.0)
        timing.wall_s = timing.prefill_s + timing.verify_s
        self.now += timing.wall_s
        return GenerateResult(completions, timing)


def scripted(acceptance: float, rows: int = 64, batch_size: int = 4, **settings) -> tuple[ScriptedEngine, "Decision"]:
    engine = ScriptedEngine(acceptance)
    requests = [Request(f"r{i}", "p", params=SamplingParams(max_tokens=16)) for i in range(rows)]
    arms = [SpecConfig("ngram", k) for k in (2, 4, 6, 8)]
    settings = CalibrationSettings(**{"max_tokens": 16, "max_fraction": 1.0, **settings})
    return engine, calibrate(engine, requests, arms, batch_size, settings, clock=engine.clock)


def test_every_arm_is_measured_at_the_production_batch_size():
    """A sample too small for two full batches is one round, not two half-batches."""
    engine, d = scripted(acceptance=0.9, rows=16, batch_size=16)
    assert [(label, len(ids)) for label, ids in engine.calls] == [("none", 16), ("ngram:k=2", 16)]
    engine, d = scripted(acceptance=0.9, rows=64, batch_size=8)
    assert {len(ids) for _, ids in engine.calls} == {8} and len(engine.calls) == 4


def test_a_method_far_below_plain_leaves_after_its_probe():
    engine, d = scripted(acceptance=0.02)
    assert [label for label, _ in engine.calls] == ["none", "ngram:k=2"]  # round 0 only, no confirmation
    assert d.chosen is NO_SPEC and not d.capped
    assert d.arms[1].speedup < 0.9 and all(a.predicted_tokens_per_s for a in d.arms[1:])


def test_the_predicted_best_draft_length_is_confirmed_against_plain_on_the_same_rows():
    engine, d = scripted(acceptance=0.9)
    predicted_best = max(d.arms[1:], key=lambda a: a.predicted_tokens_per_s)
    assert predicted_best.draft_len > 2  # high acceptance, cheap drafts: longer than the probe
    labels = [label for label, _ in engine.calls]
    assert labels == ["none", "ngram:k=2", predicted_best.label, "none"]  # round 1 starts with the other arm
    round0, round1 = engine.calls[0][1], engine.calls[2][1]
    assert engine.calls[1][1] == round0 and engine.calls[3][1] == round1 and not set(round0) & set(round1)
    assert d.chosen.label == predicted_best.label and predicted_best.measured
    # its speedup is paired with round 1's plain run (same rows), not with round 0's
    replay = ScriptedEngine(0.9)
    reqs = [Request(i, "p", params=SamplingParams(max_tokens=16)) for i in round1]
    spec_run, plain_run = replay.generate(reqs, d.chosen, 4), replay.generate(reqs, NO_SPEC, 4)
    assert predicted_best.speedup == pytest.approx(plain_run.timing.decode_s / spec_run.timing.decode_s)


def test_the_budget_skips_the_confirmation_and_says_so():
    engine, d = scripted(acceptance=0.9, max_fraction=0.01)
    assert [label for label, _ in engine.calls] == ["none", "ngram:k=2"]  # round 0 always runs
    assert d.capped and "budget" in d.reason and d.chosen.label == "ngram:k=2"


def test_calibration_costs_only_the_work_it_does_not_keep():
    """Every sample row finished (max_tokens fits the cap): each is kept once, from the chosen arm
    when it ran the row, else from plain decoding; the cost is exactly the repeated runs."""
    engine, d = scripted(acceptance=0.9)
    assert len(d.finished) == CalibrationSettings().sample_rows(4) == 8
    round0, round1 = set(engine.calls[0][1]), set(engine.calls[2][1])
    assert {rid for rid, (_, spec) in d.finished.items() if spec is NO_SPEC} == round0
    assert {rid for rid, (_, spec) in d.finished.items() if spec == d.chosen} == round1 and d.chosen is not NO_SPEC
    walls = []
    replay = ScriptedEngine(0.9)
    for label, ids in engine.calls:
        spec = NO_SPEC if label == "none" else SpecConfig("ngram", int(label.split("=")[1]))
        reqs = [Request(i, "p", params=SamplingParams(max_tokens=16)) for i in ids]
        walls.append(replay.generate(reqs, spec, 4).timing.wall_s)
    assert d.calibration_s == pytest.approx(sum(walls))
    assert d.overhead_s == pytest.approx(walls[1] + walls[3])  # k=2 on round 0, none on round 1


def test_small_shards_reuse_the_decision_of_their_key(tiny_engine):
    arms = [SpecConfig("draft_target", 2, draft_model="self")]
    settings = CalibrationSettings(max_fraction=100.0, max_tokens=8, min_rows=6)
    big = run_shard(tiny_engine, ShardInput("s0", "code", word_rows(8)), arms, True, 4, settings)
    assert big.stats.decision_source == "calibrated" and big.decision.shard_id == "s0"
    small = run_shard(tiny_engine, ShardInput("s1", "code", word_rows(3)), arms, True, 4, settings, prior=big.decision)
    assert small.stats.decision_source == "reused" and "s0" in small.stats.decision_reason
    assert (small.stats.spec_method, small.stats.draft_len) == (big.stats.spec_method, big.stats.draft_len)
    alone = run_shard(tiny_engine, ShardInput("s2", "prose", word_rows(3)), arms, True, 4, settings)
    assert alone.stats.decision_source == "too_small" and alone.stats.spec_method == "none"


def test_drift_falls_back_to_plain_decoding(tiny_engine):
    """Calibrated on rows where the draft is always right, then the workload changes: a draft
    that is never right. The shard must fall back to none and say from which row."""
    from batchspec.calibrate import Decision
    from batchspec.shard import generate_watching

    good = SpecConfig("draft_target", 3, draft_model="far")
    calibrated = Decision(good, arms=[ArmResult("draft_target", 3, tokens_per_s=100.0, acceptance_rate=0.9, measured=True)],
                          baseline_tokens_per_s=50.0)
    rows = word_rows(12)
    completions, specs, _, drift = generate_watching(tiny_engine, rows, calibrated, 2,
                                                     CalibrationSettings(drift_chunk=4, drift_ratio=0.5))
    assert drift.fallback_row == 4 and drift.switch_row is None
    assert specs[:4] == [good] * 4 and specs[4:] == [NO_SPEC] * 8
    assert all(c.draft_tokens == 0 for c in completions[4:])
    assert len(completions) == 12 and [c.id for c in completions] == [r.id for r in rows]


def test_drift_under_none_switches_on_and_says_from_which_row(tiny_engine):
    """Under "none", a chunk whose counterfactual says an arm now pays sends the rest to that arm
    (the check here is scripted: what the check computes is tested below and in test_predict)."""
    from batchspec.shard import generate_watching

    arm = SpecConfig("draft_target", 3, draft_model="self")
    seen = []

    def switch(part, result):
        seen.append(len(part))
        return (arm, 1.0) if len(seen) == 2 else (None, None)

    rows = word_rows(12)
    completions, specs, _, drift = generate_watching(tiny_engine, rows, Decision(NO_SPEC), 2,
                                                     CalibrationSettings(drift_chunk=4), switch=switch)
    assert (drift.switch_row, drift.switch_arm, drift.fallback_row) == (8, arm.label, None)
    assert specs == [NO_SPEC] * 8 + [arm] * 4 and seen == [4, 4]
    assert all(c.draft_tokens == 0 for c in completions[:8]) and all(c.draft_tokens > 0 for c in completions[8:])


# -- counterfactual calibration (the torch engine) -------------------------------------------------


def test_counterfactual_calibration_predicts_every_arm_from_one_plain_run(tiny_engine):
    from batchspec.calibrate import WorkerCalibration, calibrate_counterfactual

    arms = [SpecConfig("draft_target", k, draft_model="self") for k in (1, 2, 4)] + [SpecConfig("ngram", 3)]
    worker = WorkerCalibration()
    settings = CalibrationSettings(max_tokens=24, sample_size=8)
    d = calibrate_counterfactual(tiny_engine, word_rows(16), arms, 4, settings, shard_id="s0", worker=worker, key="k")
    by = {a.label: a for a in d.arms}
    assert list(by) == ["none"] + [a.label for a in arms]
    for k in (1, 2, 4):  # the target drafting for itself: every draft accepted, exactly
        a = by[f"draft_target:k={k}"]
        assert a.acceptance_exact and a.acceptance_rate == 1.0 and a.predicted_speedup > 0
    assert d.profile and d.profile_s > 0 and worker.profile.points
    assert {p.kind for p in d.profile} == {"target", "draft", "draft_prefill"}
    # the first shard of a key is confirmed by a measured run of the best arm on the same rows
    assert d.confirmed and key_confirmed(worker, "k")
    best = max((a for a in d.arms if a.predicted_speedup), key=lambda a: a.predicted_speedup)
    assert best.measured and best.speedup and by["none"].measured
    assert len(d.finished) == 8 and all(spec is NO_SPEC for _, spec in d.finished.values())
    assert 0 <= d.overhead_s <= d.calibration_s

    # the next shard of the key on this worker: profile reused; confirmed only near the margin
    assert worker.errors  # the confirmation measured the prediction's error
    worker.errors[:] = [0.0]  # as if the prediction had matched exactly: nothing is near the margin
    again = calibrate_counterfactual(tiny_engine, word_rows(16), arms, 4, settings, shard_id="s1", worker=worker, key="k")
    assert again.profile_s == 0.0
    assert not again.confirmed
    assert all(not a.measured for a in again.arms if a.method != "none")


def key_confirmed(worker, key) -> bool:
    return key in worker.confirmed_keys


def test_an_arm_that_cannot_load_is_recorded_not_fatal(tiny_engine):
    from batchspec.calibrate import calibrate_counterfactual

    arms = [SpecConfig("draft_target", 2, draft_model="missing"), SpecConfig("ngram", 2)]
    d = calibrate_counterfactual(tiny_engine, word_rows(8), arms, 4, CalibrationSettings(max_tokens=8))
    broken = next(a for a in d.arms if a.method == "draft_target")
    assert broken.error and "missing" in broken.error and broken.predicted_speedup is None
    assert next(a for a in d.arms if a.method == "ngram").predicted_speedup


def test_sampled_rows_are_predicted_as_an_estimate(tiny_engine):
    from batchspec.calibrate import calibrate_counterfactual

    rows = [Request(r.id, r.prompt, params=SamplingParams(max_tokens=16, temperature=0.8, seed=1)) for r in word_rows(8)]
    arms = [SpecConfig("draft_target", 2, draft_model="self")]
    d = calibrate_counterfactual(tiny_engine, rows, arms, 4, CalibrationSettings(max_tokens=16))
    arm = d.arms[1]
    assert arm.acceptance_exact is False and "estimated" in d.reason
    assert arm.acceptance_rate == pytest.approx(1.0)  # p == q: every draft passes with probability 1


def test_run_shard_records_prediction_profile_and_confirmation(tiny_engine):
    from batchspec.calibrate import WorkerCalibration
    from batchspec.stats import STATS_FIELDS

    worker = WorkerCalibration()
    arms = [SpecConfig("ngram", k) for k in (2, 4)]
    shard = run_shard(tiny_engine, ShardInput("s0", "a", word_rows(16)), arms, True, 4,
                      CalibrationSettings(max_tokens=24, sample_size=8), worker=worker)
    st = shard.stats
    assert st.calibration_confirmed and st.profile_s > 0 and st.cost_profile
    assert all(c.predicted_speedup for c in st.candidates if c.method != "none")
    names = {f.name for f in STATS_FIELDS}
    assert {"predicted_speedup", "calibration_confirmed", "profile_s", "drift_switch_row", "cost_profile"} <= names


# -- real decisions on the packaged SmolLM2 ----------------------------------------------------------

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
    from batchspec.calibrate import WorkerCalibration
    from batchspec.engine.torch.engine import TorchEngine

    engine = TorchEngine.load("smollm2-135m", dtype="float32", device="cpu")
    copy = [chat(f"c{i}", f"Repeat the following text exactly, word for word:\n\n{t}") for i, t in enumerate(TEXTS * 2)]
    prose = [chat(f"p{i}", f"Write a short poem about {t}.") for i, t in enumerate(TOPICS)]
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


# -- the command ---------------------------------------------------------------------------------------


def test_calibrate_command_prints_the_arm_table_per_key(tmp_path, tiny_model_dir):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from batchspec.cli import cli

    rows = [{"id": f"r{i}", "task": "copy" if i % 2 else "other", "prompt": f"alpha beta gamma {i} alpha beta"} for i in range(12)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    args = ["calibrate", str(tmp_path / "in.parquet"), "--model", str(tiny_model_dir), "--shard-by", "task",
            "--batch-size", "2", "--max-tokens", "6"]
    result = CliRunner().invoke(cli, args + ["--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [d["shard_key"] for d in doc] == ["copy", "other"]
    for d in doc:
        assert d["rows"] == 6 and d["arms"][0]["label"] == "none" and d["arms"][0]["measured"]
        assert d["chosen"] in {a["label"] for a in d["arms"]}
    table = CliRunner().invoke(cli, args)
    assert table.exit_code == 0 and "shard key 'copy'" in table.output and "choice:" in table.output


def test_calibrate_command_errors_are_one_line(tmp_path):
    from click.testing import CliRunner

    from batchspec.cli import cli

    result = CliRunner().invoke(cli, ["calibrate", str(tmp_path / "missing.parquet")])
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.output


def test_rows_finished_in_calibration_are_kept_not_regenerated(tiny_engine):
    """Calibration generates its sample rows to their end when their max_tokens fits the cap; the
    shard keeps the chosen arm's rows (identical to plain greedy) and generates only the rest."""
    rows = word_rows(16)  # max_tokens 24 each
    arms = [SpecConfig("draft_target", 2, draft_model="self")]
    settings = CalibrationSettings(max_fraction=100.0, max_tokens=24, sample_size=8, rounds=1)
    shard = run_shard(tiny_engine, ShardInput("s0", None, rows), arms, True, 4, settings)
    assert shard.stats.calibration_rows_kept == 8
    assert shard.stats.rows == 16 and [c.id for c in shard.completions] == [r.id for r in rows]
    plain = tiny_engine.generate(rows, NO_SPEC, 4).completions
    assert [c.token_ids for c in shard.completions] == [c.token_ids for c in plain]
    # only the 8 rows generated after calibration are in the shard's speed figure
    generated_tokens = sum(c.output_tokens - 1 for c in shard.completions if c.id not in shard.decision.finished)
    decode = shard.stats.decode_s
    assert shard.stats.tokens_per_s == pytest.approx(generated_tokens / decode)
