"""Counterfactual acceptance of constrained rows (engine/torch/counterfactual.py): computed from a
plain constrained greedy run, the accepted length of every step equals what the torch engine
measures when it runs the arm on the same rows (forced drafts + n-gram lookup, forced drafts
alone, forced drafts + a draft model under the mask), k = 1, 3, 6, batch 1 and 3, row by row and step
by step, with constrained and unconstrained rows mixed; sampled rows as an estimate."""

from __future__ import annotations

import pytest

from batchspec.engine.base import NO_SPEC, SpecConfig, acceptance_rate
from batchspec.engine.torch.engine import TorchEngine
from batchspec.engine.acceptance import PlainRow
from batchspec.engine.torch.counterfactual import draft_acceptance, ngram_acceptance
from tests.engine.torch.test_structured import constrained_requests

DRAFT_LENS = [1, 3, 6]


@pytest.fixture(scope="module")
def plain(tiny_pair):
    target, draft, tokenizer = tiny_pair
    drafts = {"self": target, "far": draft}
    engine = TorchEngine(target, tokenizer, model_name="tiny", draft_loader=lambda name: (drafts[name], tokenizer))
    requests = constrained_requests()
    result = engine.generate(requests, NO_SPEC, 4)
    rows = [PlainRow(engine.encode(r), c.token_ids, r.params.max_tokens) for r, c in zip(requests, result.completions)]
    return engine, requests, result, rows


def predicted_for(engine, requests, rows, method, option):
    grammars = [engine.grammar(r) for r in requests]  # fresh matchers: the counterfactual uses them up
    if method == "ngram":
        return ngram_acceptance(rows, DRAFT_LENS, option, grammars=grammars)
    logits = engine.teacher_forced_logits([(r.prompt_ids, r.output_ids) for r in rows], draft_model=option)
    return draft_acceptance(rows, DRAFT_LENS, logits, grammars=grammars)


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("method,option", [("ngram", 3), ("ngram", 0), ("draft_target", "self"), ("draft_target", "far")])
def test_constrained_counterfactual_equals_what_the_engine_measures(plain, method, option, batch_size):
    engine, requests, result, rows = plain
    predicted = predicted_for(engine, requests, rows, method, option)
    for k in DRAFT_LENS:
        spec = SpecConfig(method, k, draft_model=option, ngram_size=3) if method == "draft_target" else SpecConfig(method, k, ngram_size=option)
        ran = engine.generate(requests, spec, batch_size)
        for r, (c, p) in enumerate(zip(ran.completions, result.completions)):
            assert c.token_ids == p.token_ids, (k, r)  # lossless under the grammar
            assert c.accepted_steps == predicted[k].steps[r], (k, r)
            assert c.draft_tokens == sum(predicted[k].proposed[r]), (k, r)
        assert predicted[k].exact and ran.target_steps == predicted[k].target_steps
        assert predicted[k].accepted_tokens > 0  # forced drafts at least


def test_the_sampled_estimate_stays_within_the_draft_length(plain):
    engine, requests, _, rows = plain
    warm = [PlainRow(r.prompt_ids, r.output_ids, r.max_tokens, temperature=1.0) for r in rows]
    pairs = [(r.prompt_ids, r.output_ids) for r in warm]
    target = engine.teacher_forced_logits(pairs)
    draft = engine.teacher_forced_logits(pairs, draft_model="far")
    for est in (draft_acceptance(warm, [4], draft, target, [engine.grammar(r) for r in requests])[4],
                ngram_acceptance(warm, [4], 3, target, [engine.grammar(r) for r in requests])[4]):
        counts = [n for steps in est.steps for n in steps]
        assert not est.exact and counts and all(0.0 <= n <= 4.0 for n in counts)
        assert 0.0 < acceptance_rate(est.accepted_tokens, est.draft_tokens) <= 1.0
