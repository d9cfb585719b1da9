"""Tallies (batchspec.calibrate.counterfactual): what every arm would have done on rows already
decoded equals what the engine counts when it runs the arm, row by row, for n-gram and draft-model
arms, on unconstrained and constrained (structured-output) rows alike; and the controller keeps a
constrained shard's output as plain constrained decoding writes it."""

from __future__ import annotations

import pytest

from batchspec.calibrate import WorkerState
from batchspec.calibrate.counterfactual import measured_tallies, tallies
from batchspec.engine.base import NO_SPEC, SpecConfig
from batchspec.engine.torch.engine import TorchEngine
from batchspec.engine.acceptance import PlainRow
from batchspec.shard import ShardInput, run_shard
from tests.data import word_rows
from tests.engine.torch.test_structured import constrained_requests


def _rows(engine, requests, done):
    return [PlainRow(engine.encode(r), c.token_ids, r.params.max_tokens) for r, c in zip(requests, done)]


def _check(engine, requests, arms):
    plain = engine.generate(requests, NO_SPEC, 3).completions
    counted, exact = tallies(engine, _rows(engine, requests, plain), arms, requests)
    assert exact
    for arm in arms:
        ran = engine.generate(requests, arm, 3).completions
        assert [c.token_ids for c in ran] == [c.token_ids for c in plain]
        assert [(t[arm.label].steps, t[arm.label].drafted, t[arm.label].accepted) for t in counted] == \
               [(c.target_steps, c.draft_tokens, c.accepted_tokens) for c in ran], arm.label
        assert [t["none"].tokens for t in counted] == [t[arm.label].tokens for t in counted]
    return counted


def test_unconstrained_tallies_are_what_the_engine_counts(tiny_engine):
    arms = [SpecConfig("ngram", 3), SpecConfig("ngram", 6), SpecConfig("draft_target", 2, draft_model="close")]
    counted = _check(tiny_engine, word_rows(8), arms)
    assert sum(t["ngram:k=6"].accepted for t in counted) > 0


@pytest.fixture(scope="module")
def schema_engine(tiny_pair):
    target, draft, tokenizer = tiny_pair
    drafts = {"far": draft}
    return TorchEngine(target, tokenizer, model_name="tiny", draft_loader=lambda name: (drafts[name], tokenizer))


def test_constrained_tallies_are_what_the_engine_counts(schema_engine):
    arms = [SpecConfig("ngram", 3), SpecConfig("ngram", 5, ngram_size=0), SpecConfig("draft_target", 2, draft_model="far")]
    counted = _check(schema_engine, constrained_requests(), arms)
    assert sum(t["ngram:k=5"].accepted for t in counted) > 0  # the grammar's forced tokens at least


def test_a_constrained_shard_under_the_controller_writes_what_plain_constrained_decoding_writes(schema_engine):
    requests = constrained_requests()
    ran = run_shard(schema_engine, ShardInput("s0", "json", requests), [SpecConfig("ngram", 4)], True, 2, worker=WorkerState())
    plain = schema_engine.generate(requests, NO_SPEC, 2).completions
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in plain]
    assert ran.stats.constrained_rows == sum(r.response_format is not None for r in requests) > 0
    assert all(c.predicted_speedup for c in ran.stats.candidates)


def test_measured_tallies_estimate_a_shorter_draft_from_a_longer_ones_steps(tiny_engine):
    requests = word_rows(4)
    long, short = SpecConfig("draft_target", 4, draft_model="close"), SpecConfig("draft_target", 1, draft_model="close")
    done = tiny_engine.generate(requests, long, 1).completions
    for c in done:
        t = measured_tallies(c, long, [long, short])
        assert t[long.label].steps == c.target_steps and t[long.label].accepted == c.accepted_tokens
        assert t[short.label].steps >= t[long.label].steps and t[short.label].tokens == t["none"].tokens
    assert set(measured_tallies(done[0], NO_SPEC, [long])) == {"none"}  # what did not run is unknown
