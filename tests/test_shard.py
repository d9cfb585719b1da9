"""One shard with its calibration (batchspec.shard): small shards reuse their key's decision, drift
in both directions, the stats a calibrated shard records, and sample rows finished in calibration
kept rather than generated again."""

from __future__ import annotations

import pytest

from batchspec.calibrate import CalibrationSettings, Decision, WorkerCalibration
from batchspec.engine.base import NO_SPEC, SpecConfig
from batchspec.shard import ShardInput, generate_watching, run_shard
from batchspec.stats import STATS_FIELDS, ArmResult
from tests.data import word_rows


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
    (the check here is scripted: what it computes is tested in tests/calibrate/test_counterfactual.py
    and tests/predict/test_acceptance.py)."""
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


def test_run_shard_records_prediction_profile_and_confirmation(tiny_engine):
    worker = WorkerCalibration()
    arms = [SpecConfig("ngram", k) for k in (2, 4)]
    shard = run_shard(tiny_engine, ShardInput("s0", "a", word_rows(16)), arms, True, 4,
                      CalibrationSettings(max_tokens=24, sample_size=8), worker=worker)
    st = shard.stats
    assert st.calibration_confirmed and st.profile_s > 0 and st.cost_profile
    assert all(c.predicted_speedup for c in st.candidates if c.method != "none")
    names = {f.name for f in STATS_FIELDS}
    assert {"predicted_speedup", "calibration_confirmed", "profile_s", "drift_switch_row", "cost_profile"} <= names


def test_rows_finished_in_calibration_are_kept_not_regenerated(tiny_engine):
    """Calibration generates its sample rows to their end when their max_tokens fits the cap; the
    shard keeps them, and the rows the confirmation generated with the best arm (identical to
    plain greedy), and generates only the rest."""
    rows = word_rows(16)  # max_tokens 24 each
    arms = [SpecConfig("draft_target", 2, draft_model="self")]
    settings = CalibrationSettings(max_fraction=100.0, max_tokens=24, sample_size=8, rounds=1)
    shard = run_shard(tiny_engine, ShardInput("s0", None, rows), arms, True, 4, settings)
    assert shard.stats.calibration_rows_kept == 8 + 4  # the sample, and batch-size rows of the confirmation
    made_by = {c.id: spec.label for c, spec in zip(shard.completions, shard.row_specs)}
    assert {i for i, label in made_by.items() if label == "draft_target:k=2"} == {
        i for i, (_, spec) in shard.decision.finished.items() if spec.method == "draft_target"} == {"r1", "r5", "r9", "r13"}
    assert shard.stats.rows == 16 and [c.id for c in shard.completions] == [r.id for r in rows]
    plain = tiny_engine.generate(rows, NO_SPEC, 4).completions
    assert [c.token_ids for c in shard.completions] == [c.token_ids for c in plain]
    # only the 4 rows generated after calibration are in the shard's speed figure
    generated_tokens = sum(c.output_tokens - 1 for c in shard.completions if c.id not in shard.decision.finished)
    decode = shard.stats.decode_s
    assert shard.stats.tokens_per_s == pytest.approx(generated_tokens / decode)
