"""The calibration controller, judged on behaviour: on simulated regimes (replayed recordings,
virtual time: deterministic) a shard runs within a few percent of its oracle, stays plain where
nothing pays, switches on where the workload changes, and a key's next shard starts where the last
ended; on the real tiny engine no row is lost or changed."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from batchspec.calibrate import CalibrationSettings, WorkerState
from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig
from batchspec.shard import ShardInput, run_shard
from batchspec.sim.regimes import regime
from batchspec.sim.replay import Recorded, ReplayEngine
from tests.data import word_rows

NGRAM = [SpecConfig("ngram", k) for k in (2, 4, 8)]


def _copy_row(rng: random.Random, n: int = 48) -> tuple[list[int], list[int]]:
    """A prompt holding a passage, and an output that repeats it (n-gram lookup pays)."""
    passage = [rng.randrange(1, 64) for _ in range(n)]
    return [rng.randrange(1, 64) for _ in range(6)] + passage, passage[:-1] + [0]


def _fresh_row(rng: random.Random, n: int = 48) -> tuple[list[int], list[int]]:
    """An output that repeats nothing (n-gram lookup rarely proposes, never for long)."""
    prompt = [rng.randrange(1, 32) for _ in range(12)]
    return prompt, [rng.randrange(32, 64) for _ in range(n - 1)] + [0]


def _shard(kinds: str, seed: int = 0) -> tuple[list[Request], dict[str, Recorded]]:
    rng = random.Random(seed)
    requests, recorded = [], {}
    for i, kind in enumerate(kinds):
        prompt, output = (_copy_row if kind == "c" else _fresh_row)(rng)
        rid = f"{kind}{seed}-{i}"
        requests.append(Request(rid, prompt_token_ids=tuple(prompt), params=SamplingParams(max_tokens=64)))
        recorded[rid] = Recorded(tuple(prompt), tuple(output))
    return requests, recorded


def _goodput(result) -> float:
    return result.decode_tokens / result.timing.decode_s


def _calibrated(stats) -> float:
    """A calibrated shard's goodput, the worker's profile's virtual seconds counted (a fresh worker's)."""
    return (stats.output_tokens - stats.rows + stats.error_rows) / (stats.decode_s + stats.profile_s)


@pytest.mark.parametrize("name", ["gpu-roofline", "h200-torch", "cpu"])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_copy_heavy_shard_runs_within_a_few_percent_of_its_oracle(tiny_engine, name, batch_size):
    requests, recorded = _shard("c" * 128)
    engine = ReplayEngine(tiny_engine, recorded, regime(name))
    oracle = max(_goodput(engine.generate(requests, arm, batch_size)) for arm in [NO_SPEC, *NGRAM])
    ran = run_shard(engine, ShardInput("s0", "copy", requests), NGRAM, True, batch_size, worker=WorkerState())
    assert _calibrated(ran.stats) >= 0.95 * oracle
    assert ran.stats.spec_method == "ngram" and any(e.kind == "switch" for e in ran.stats.events)


@pytest.mark.parametrize("name", ["gpu-roofline", "cpu"])
def test_where_nothing_pays_the_shard_stays_plain(tiny_engine, name):
    requests, recorded = _shard("f" * 128)
    engine = ReplayEngine(tiny_engine, recorded, regime(name))
    plain = _goodput(engine.generate(requests, NO_SPEC, 4))
    ran = run_shard(engine, ShardInput("s0", "prose", requests), NGRAM, True, 4, worker=WorkerState())
    assert ran.stats.spec_method == "none"
    assert _calibrated(ran.stats) >= 0.97 * plain


def test_a_shard_whose_workload_changes_switches_on_after_the_change(tiny_engine):
    requests, recorded = _shard("f" * 32 + "c" * 32)
    engine = ReplayEngine(tiny_engine, recorded, regime("gpu-roofline"))
    ran = run_shard(engine, ShardInput("s0", "mixed", requests), NGRAM, True, 2, worker=WorkerState())
    on = [e for e in ran.stats.events if e.kind in ("switch", "measure") and e.arm != "none" and e.row >= 16]
    assert on and 24 <= on[0].row <= 40  # switched on (or tried and kept) soon after the change, rows finished then
    assert ran.decision.ended.method == "ngram"
    specs = [s.method for s in ran.row_specs]
    assert specs[:16] == ["none"] * 16 and specs[-16:] == ["ngram"] * 16


def test_a_keys_next_shard_starts_under_the_arm_its_last_ended_under(tiny_engine):
    requests, recorded = _shard("c" * 64)
    engine = ReplayEngine(tiny_engine, recorded, regime("gpu-roofline"))
    worker = WorkerState()
    first = run_shard(engine, ShardInput("s0", "copy", requests[:32]), NGRAM, True, 4, worker=worker)
    second = run_shard(engine, ShardInput("s1", "copy", requests[32:]), NGRAM, True, 4, worker=worker)
    assert first.stats.events[0].arm == "none"
    assert second.stats.events[0].kind == "start" and second.stats.events[0].arm == first.decision.ended.label != "none"
    assert second.stats.profile_s == 0 and first.stats.profile_s > 0  # one profile per worker and batch size
    other = run_shard(engine, ShardInput("s2", "other", requests[32:]), NGRAM, True, 4, worker=worker, prior=NGRAM[0])
    assert other.stats.events[0].arm == NGRAM[0].label  # a key new to this worker starts where the driver says


def test_the_workers_profile_is_the_workers_not_its_first_shards(tiny_engine):
    """The cost profile is timed once per worker and batch size, while whichever shard came first
    runs: its seconds are the worker's, shown as such, and counted once in its device-seconds."""
    from batchspec.stats import device_seconds

    requests, recorded = _shard("c" * 32)
    engine = ReplayEngine(tiny_engine, recorded, regime("cpu"))
    worker = WorkerState()
    first = run_shard(engine, ShardInput("s0", "copy", requests), NGRAM, True, 4, worker=worker)
    assert worker.profile_s == first.stats.profile_s > 0
    profile = [e for e in first.stats.events if e.kind == "profile"]
    assert len(profile) == 1 and "the worker's" in profile[0].reason
    s = first.stats
    used = device_seconds(s, 0, 2)["gpu_s"]
    assert used == pytest.approx((s.prefill_s + s.decode_s + s.calibration_s + s.profile_s) * 2)


def _partly_copied(n: int, share: float, seed: int = 5, length: int = 48) -> tuple[list[Request], dict[str, Recorded]]:
    """Rows whose output copies `share` of the prompt's passage, the rest fresh tokens."""
    rng = random.Random(seed)
    requests, recorded = [], {}
    for i in range(n):
        passage = [rng.randrange(1, 64) for _ in range(length)]
        output = [t if rng.random() < share else rng.randrange(64, 96) for t in passage[:-1]] + [0]
        prompt = [rng.randrange(1, 64) for _ in range(6)] + passage
        requests.append(Request(f"p{seed}-{i}", prompt_token_ids=tuple(prompt), params=SamplingParams(max_tokens=64)))
        recorded[f"p{seed}-{i}"] = Recorded(tuple(prompt), tuple(output))
    return requests, recorded


@pytest.mark.parametrize("name,batch_size", [("h200-torch", 32), ("cpu", 8)])
def test_a_keys_next_shard_starts_under_the_arm_that_ran_before_the_drain(tiny_engine, name, batch_size):
    """As the batch drains, fewer rows make a longer draft pay, and the rule switches to it; the key's
    next shard runs a full batch again, so it starts under the arm that ran before the drain."""
    requests, recorded = _partly_copied(96 + 32, {"h200-torch": 0.92, "cpu": 0.85}[name])
    engine = ReplayEngine(tiny_engine, recorded, regime(name))
    worker = WorkerState()
    first = run_shard(engine, ShardInput("s0", "key", requests[:96]), NGRAM, True, batch_size, worker=worker)
    drained = [e for e in first.stats.events if e.kind == "switch" and e.row > 96 - batch_size]
    assert drained, "the drain switched arm: the case this test is about"
    before = [e.arm for e in first.stats.events if e.kind in ("start", "switch") and e.row <= 96 - batch_size]
    assert first.decision.ended.label == before[-1] != drained[-1].arm
    second = run_shard(engine, ShardInput("s1", "key", requests[96:]), NGRAM, True, batch_size, worker=worker)
    assert second.stats.events[0].arm == before[-1]


def test_a_shard_under_the_controller_loses_no_row_and_changes_no_token(tiny_engine):
    rows = word_rows(20)
    rows[3] = Request("bad", prompt="", params=SamplingParams(max_tokens=8))  # an error row stays in place
    arms = [SpecConfig("ngram", 3), SpecConfig("draft_target", 2, draft_model="close")]
    ran = run_shard(tiny_engine, ShardInput("s0", "k", rows), arms, True, 2, CalibrationSettings(measure_steps=4),
                    worker=WorkerState())
    plain = tiny_engine.generate(rows, NO_SPEC, 2).completions
    assert [c.id for c in ran.completions] == [r.id for r in rows]
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in plain]
    assert ran.completions[3].finish_reason == "error" and ran.stats.error_rows == 1
    assert len(ran.row_specs) == 20 and ran.stats.events[0].kind == "start"
    assert {c.label for c in ran.stats.candidates} == {"none", "ngram:k=3", "draft_target:k=2"}
    assert all(c.predicted_speedup for c in ran.stats.candidates)


def test_sampled_rows_are_estimates_and_say_so(tiny_engine):
    rows = [Request(f"s{i}", prompt=r.prompt, params=SamplingParams(max_tokens=16, temperature=0.8, seed=i))
            for i, r in enumerate(word_rows(8))]
    ran = run_shard(tiny_engine, ShardInput("s0", "k", rows), [SpecConfig("ngram", 2)], True, 2, worker=WorkerState())
    assert not ran.decision.exact and "estimate" in ran.stats.caveats
    assert ran.stats.rows == 8 and all(c.finish_reason != "error" for c in ran.completions)


def test_a_fixed_arm_runs_without_calibration(tiny_engine):
    rows = word_rows(6)
    ran = run_shard(tiny_engine, ShardInput("s0", None, rows), [SpecConfig("ngram", 2)], False, 2)
    assert ran.stats.decision_source == "fixed" and ran.stats.spec_method == "ngram" and not ran.stats.events
    assert all(s.label == "ngram:k=2" for s in ran.row_specs)
    off = run_shard(tiny_engine, ShardInput("s1", None, rows), [], True, 2)
    assert off.stats.spec_method == "none" and "speculation off" in off.stats.decision_reason


@pytest.mark.parametrize("name", ["cpu", "gpu-roofline"])
def test_a_fixed_arm_says_its_speedup_where_plain_decoding_can_be_priced(tiny_engine, name):
    """A fixed arm's steps are priced against plain decoding as a calibrated shard's are: from the
    worker's cost table, seeded by a profile of the target's forwards. In virtual time the price
    is within a few percent of plain decoding run on the same rows (the profile sees no plain
    step's bookkeeping). Plain decoding fixed is its own baseline."""
    requests, recorded = _shard("c" * 32)
    engine = ReplayEngine(tiny_engine, recorded, regime(name))
    arm = SpecConfig("ngram", 4)
    ran = run_shard(engine, ShardInput("s0", "copy", requests), [arm], False, 4, worker=WorkerState())
    ratio = _goodput(engine.generate(requests, arm, 4)) / _goodput(engine.generate(requests, NO_SPEC, 4))
    assert ran.stats.decision_source == "fixed" and ratio > 1.5
    assert ran.stats.speedup == pytest.approx(ratio, rel=0.05)
    assert ran.stats.baseline_tokens_per_s == pytest.approx(ran.stats.tokens_per_s / ran.stats.speedup)
    assert ran.stats.profile_s > 0 and ran.stats.cost_profile  # the profile the price rests on, in the record
    plain = run_shard(engine, ShardInput("s1", "copy", requests), [], False, 4, worker=WorkerState())
    assert plain.stats.speedup == 1.0 and plain.stats.baseline_tokens_per_s == plain.stats.tokens_per_s


def test_a_fixed_arm_has_no_speedup_where_nothing_prices_plain_decoding(tiny_engine):
    """Where an arm is a build the engine times no forward apart (TensorRT-LLM, and its regime): a
    fixed arm's steps alone cannot price plain decoding, so no speedup is claimed."""
    requests, recorded = _shard("c" * 32)
    engine = ReplayEngine(tiny_engine, recorded, regime("trtllm"))
    ran = run_shard(engine, ShardInput("s0", "copy", requests), [SpecConfig("ngram", 4)], False, 4, worker=WorkerState())
    assert ran.stats.speedup is None and ran.stats.baseline_tokens_per_s is None and ran.stats.tokens_per_s


def _shared_row(rng: random.Random, template: list[int]) -> tuple[list[int], list[int]]:
    """A prompt of its own, and an output every row shares (one schema, one template): what the
    shard's earlier rows wrote, the suffix drafter proposes; the row's own prompt does not hold it."""
    return [rng.randrange(1, 32) for _ in range(10)], template + [0]


def test_a_shard_whose_rows_share_their_output_switches_to_the_suffix_arm(tiny_engine):
    rng = random.Random(7)
    template = [rng.randrange(32, 64) for _ in range(40)]
    requests, recorded = [], {}
    for i in range(96):
        prompt, output = _shared_row(rng, template)
        requests.append(Request(f"t{i}", prompt_token_ids=tuple(prompt), params=SamplingParams(max_tokens=64)))
        recorded[f"t{i}"] = Recorded(tuple(prompt), tuple(output))
    arms = [SpecConfig("ngram", 8), SpecConfig("suffix", 8)]
    engine = ReplayEngine(tiny_engine, recorded, regime("gpu-roofline"))
    ran = run_shard(engine, ShardInput("s0", "template", requests), arms, True, 1, worker=WorkerState())
    assert ran.decision.ended.method == "suffix" and ran.stats.tree_rows == 96
    suffix = next(c for c in ran.stats.candidates if c.method == "suffix")
    assert suffix.predicted_speedup > 3 and ran.stats.tree_hit_rate > 0.5
    plain = engine.generate(requests, NO_SPEC, 1)
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in plain.completions]


def test_measurements_build_at_most_the_workers_cap_where_arms_are_builds(tiny_engine):
    """Under the `trtllm` regime an arm switch is a build, so the worker's measurements may cause
    at most `max_builds_per_worker` builds, whichever arm they measure and why. Builds are cheap
    here (10 ms) so that measuring repays, and many arms are unsure: uncapped, the worker's two
    shards measure four times; capped at two, twice."""
    requests, recorded = _partly_copied(256, 0.3, seed=0)
    arms = [SpecConfig("ngram", k) for k in range(1, 9)] + [SpecConfig("suffix", 8)]
    measured = {}
    for cap in (2, 100):
        engine, worker = ReplayEngine(tiny_engine, recorded, replace(regime("trtllm"), build_s=0.01)), WorkerState()
        assert engine.arms_are_builds
        measured[cap] = [e.arm for shard, key in ((requests[:128], "a"), (requests[128:], "b"))
                         for e in run_shard(engine, ShardInput(key, key, shard), arms, True, 4,
                                            CalibrationSettings(max_builds_per_worker=cap), worker=worker,
                                            horizon_rows=64).stats.events if e.kind == "measure"]
        assert worker.measure_builds == len(measured[cap])
    assert len(measured[100]) > 2, measured  # the case this test is about: the cap is what stops the worker
    assert len(measured[2]) == 2 and measured[2] == measured[100][:2]


def test_a_drain_measures_nothing_but_still_switches_where_the_lower_bound_beats_the_margin():
    """Once no row is queued and fewer than half a batch is in flight, a measurement would learn the
    price of a batch that is gone (a 40-row shard at batch 32 lost 11% to two of them): the rule
    measures nothing there, while a switch whose lower bound beats the margin is still taken."""
    from batchspec.calibrate.controller import Moment, rule
    from batchspec.calibrate.estimate import Estimate

    arm = SpecConfig("ngram", 4)

    def at(drain: bool) -> Moment:
        return Moment(NO_SPEC, True, 0.25 if drain else 1.0, None, (arm,), False, CalibrationSettings(), lambda a: 0.0, 400.0, 20, 0, 0.01)

    def est(gain: float, cost_u: float) -> dict:
        return {"none": Estimate(NO_SPEC, 1.0, 1.0, 0.0, 0.0, 1.0, None, 40),
                arm.label: Estimate(arm, gain, gain, cost_u, 0.02, 2.0, 0.5, 40)}

    unsure = est(1.08, 0.10)  # its interval straddles the margin, its price what is unsure
    assert rule(unsure, at(drain=False)).kind == "measure"
    assert rule(unsure, at(drain=True)).kind == "stay"
    sure = est(1.30, 0.03)
    assert rule(sure, at(drain=True)).kind == rule(sure, at(drain=False)).kind == "switch"


def test_a_short_shard_measures_an_unsure_price_with_a_shorter_trial_not_never():
    """With fewer than PAYBACK x measure_steps steps left (a 40-row shard at batch 8), a trial as
    long as a tenth of the steps left still teaches the arm's price, while the batch is full (rows
    queued: what it learns prices them); too few steps for SHORT_TRIAL, none is run."""
    from batchspec.calibrate.controller import PAYBACK, SHORT_TRIAL, Moment, rule
    from batchspec.calibrate.estimate import Estimate

    arm = SpecConfig("ngram", 2)

    def at(steps_left: float, filled: float = 2.0) -> Moment:
        return Moment(NO_SPEC, True, filled, None, (arm,), False, CalibrationSettings(), lambda a: 0.0, steps_left, 30, 0, 0.01)

    unsure = {"none": Estimate(NO_SPEC, 1.0, 1.0, 0.0, 0.0, 1.0, None, 18),
              arm.label: Estimate(arm, 1.18, 1.18, 0.20, 0.06, 1.9, 0.5, 18)}
    long = rule(unsure, at(400.0))
    assert long.kind == "measure" and long.steps == CalibrationSettings().measure_steps
    short = rule(unsure, at(95.0))
    assert short.kind == "measure" and short.steps == 95 // PAYBACK
    assert rule(unsure, at(PAYBACK * SHORT_TRIAL - 1.0)).kind == "stay"
    assert rule(unsure, at(95.0, filled=0.9)).kind == "stay"  # a short trial only while the batch is full
    assert rule(unsure, at(400.0, filled=0.9)).kind == "measure"  # a whole one until the drain (DRAIN_SHARE)


def test_a_shard_smaller_than_a_batch_remembers_the_arm_its_rule_chose_not_the_one_it_started_under(tiny_engine):
    """Where a shard has fewer rows than a batch (a small key at batch 128) all of them are in flight
    at once: that is its full batch, and the arm the rule switched to there is what the key ended
    under and what the worker's other keys start from (`WorkerState.chosen`), not the start."""
    requests, recorded = _shard("f" * 24)
    engine = ReplayEngine(tiny_engine, recorded, regime("h200-torch"))
    worker = WorkerState()
    ran = run_shard(engine, ShardInput("s0", "fresh", requests), NGRAM, True, 32, worker=worker, prior=NGRAM[-1])
    switched = [e for e in ran.stats.events if e.kind == "switch" and e.row == 0]
    assert ran.stats.events[0].arm == NGRAM[-1].label and switched, "the rule left the start before any row finished"
    assert ran.decision.ended.label == switched[-1].arm != NGRAM[-1].label
    assert worker.start("new", None, NGRAM)[0].label == switched[-1].arm


def test_a_provisional_arm_gives_way_to_another_length_of_its_drafter_at_a_sure_gain_without_the_margin():
    """A shard that runs an arm it has not chosen on a batch of its own rows (another key's, or one
    it took on its first rows) gives way to another draft length of the same drafter, judged on the
    same proposals of the same rows, wherever its lower bound beats it, without the margin (a gain
    of 4% never clears 5%); a change of method, and any change once the shard has chosen, still
    needs the margin."""
    from batchspec.calibrate.controller import Moment, rule
    from batchspec.calibrate.estimate import Estimate

    k4, k6, k8 = (SpecConfig("ngram", k) for k in (4, 6, 8))

    def at(running: SpecConfig, provisional: bool) -> Moment:
        return Moment(running, True, 2.0, None, (), False, CalibrationSettings(), lambda a: 0.0, 400.0, 20, 0, 0.01,
                      provisional)

    def est(running: SpecConfig, arm: SpecConfig, gain: float) -> dict:
        return {running.label: Estimate(running, 2.0, 1.0, 0.0, 0.0, 2.0, 0.5, 40),
                arm.label: Estimate(arm, 2.0 * gain, gain, 0.02, 0.01, 2.1, 0.5, 40)}

    sure = est(k6, k8, 1.04)  # at least 1.017x: sure, inside the margin
    took = rule(sure, at(k6, provisional=True))
    assert (took.kind, took.arm) == ("switch", k8) and "not yet the shard's choice" in took.why
    assert rule(sure, at(k6, provisional=False)).kind == "stay"
    assert rule(est(k6, k8, 1.01), at(k6, provisional=True)).kind == "stay"  # at least 0.988x: not sure
    assert rule(est(NO_SPEC, k4, 1.04), at(NO_SPEC, provisional=True)).kind == "stay"  # plain decoding to a drafter
    assert rule(est(k6, SpecConfig("draft_target", 6, draft_model="d"), 1.04), at(k6, provisional=True)).kind == "stay"


def test_an_arm_is_provisional_until_the_shard_chooses_one_on_a_batch_of_its_rows(tiny_engine):
    """Its key's own last arm, or the driver's prior for the key, is the key's; the arm the worker's
    other keys chose is provisional, and so is an arm the shard switches to before a batch of its
    rows has finished (it judged on their first, short ones), until a switch on a batch of finished
    rows (or a trial it keeps); the rule judges a provisional arm without the margin only once a
    batch of the shard's rows has finished."""
    from batchspec.calibrate.controller import Choice, Controller
    from batchspec.engine.base import Progress, Timing

    requests, recorded = _shard("c" * 8)
    engine = ReplayEngine(tiny_engine, recorded, regime("h200-torch"))
    worker = WorkerState()
    worker.remember("other", NGRAM[1], [])

    def course(key: str, prior: SpecConfig | None = None):
        return Controller(engine, requests, NGRAM, 4, CalibrationSettings(), worker, key, prior=prior).course

    assert course("new").provisional and course("new").start == NGRAM[1]
    assert not course("new", prior=NGRAM[2]).provisional
    worker.remember("mine", NGRAM[0], [])
    assert not course("mine").provisional
    control = Controller(engine, requests, NGRAM, 4, CalibrationSettings(), worker, "new")
    progress = Progress(NGRAM[1], [], [None] * len(requests), {0: [1]}, 4, Timing(), [])
    # the first rows to finish are a batch's short ones: no judgement without the margin before a batch has
    assert not control._moment(progress, NGRAM[1], True).provisional
    control.evidence.counted = 4
    assert control._moment(progress, NGRAM[1], True).provisional
    control._apply(Choice("switch", NGRAM[2]), progress)
    assert not control.course.provisional and not control._moment(progress, NGRAM[2], True).provisional
    # a switch before a batch of rows has finished, the key's own start or not, leaves the arm provisional
    early = Controller(engine, requests, NGRAM, 4, CalibrationSettings(), worker, "mine")
    assert not early.course.provisional
    early.evidence.counted = 3
    early._apply(Choice("switch", NGRAM[2]), progress)
    assert early.course.provisional and not early._moment(progress, NGRAM[2], True).provisional
    early.evidence.counted = 4
    assert early._moment(progress, NGRAM[2], True).provisional
    early._apply(Choice("switch", NGRAM[1]), progress)
    assert not early.course.provisional
