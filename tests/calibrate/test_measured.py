"""Calibration by running every arm (batchspec.calibrate.measured): on a tiny model, and on a
scripted engine with its own clock, so which arm runs in which round, the pairing, the budget and
what calibration costs are checked exactly."""

from __future__ import annotations

import math

import pytest

from batchspec.calibrate import CalibrationSettings, Decision, calibrate
from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig
from batchspec.predict.probe import expected_tokens_per_step
from tests.data import word_rows


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
