"""The suffix arm's counterfactual acceptance (engine/torch/counterfactual.py) against the engine running
the arm: computed from a plain greedy run (rows in the order they finished, from the key's tree as
the worker held it before), every step of every row at batch 1 equals what the engine measures,
k = 1..8; at batch 8 and for sampled rows it is an estimate and says so."""

from __future__ import annotations

import torch

from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig
from batchspec.engine.torch.engine import TorchEngine
from batchspec.engine.acceptance import PlainRow
from batchspec.engine.torch.counterfactual import suffix_acceptance

DRAFT_LENS = list(range(1, 9))


class FinishOrder:
    """An in-flight control that only records the order rows finish in."""

    def __init__(self) -> None:
        self.done: list[int] = []

    def __call__(self, progress):
        self.done += progress.done
        return None


def shared_structure_requests(n: int, scope: str = "key", prefix: str = "r", temperature: float = 0.0) -> list[Request]:
    """Rows that share structure: a few prompt templates, each repeated with small changes (so the
    target writes outputs that repeat across rows), of different lengths and caps."""
    gen = torch.Generator().manual_seed(11)
    templates = [[f"w{int(x)}" for x in torch.randint(1, 64, (8,), generator=gen)] for _ in range(3)]
    out = []
    for i in range(n):
        words = list(templates[i % 3])
        if i % 2:
            words[int(torch.randint(0, 8, (1,), generator=gen))] = f"w{int(torch.randint(1, 64, (1,), generator=gen))}"
        params = SamplingParams(max_tokens=16 + 3 * (i % 4), temperature=temperature, seed=i)
        out.append(Request(f"{prefix}{i}", " ".join(words), params=params, draft_scope=scope))
    return out


def engine_of(word_models) -> TorchEngine:
    target, _, tokenizer = word_models
    return TorchEngine(target, tokenizer, model_name="tiny")


def run_plain(engine: TorchEngine, requests: list[Request], batch_size: int):
    order = FinishOrder()
    result = engine.generate(requests, NO_SPEC, batch_size, control=order)
    rows = [PlainRow(engine.encode(requests[i]), result.completions[i].token_ids, requests[i].params.max_tokens)
            for i in order.done]
    return result, order.done, rows


def test_counterfactual_equals_what_the_engine_measures_at_batch_1(word_models):
    engine = engine_of(word_models)
    engine.generate(shared_structure_requests(6, prefix="earlier"), NO_SPEC, 2)  # a shard of the key before
    prior = engine.trees.trees["key"].copy()
    requests = shared_structure_requests(12)
    plain, finished, rows = run_plain(engine, requests, 1)
    predicted = suffix_acceptance(rows, DRAFT_LENS, prior)
    from_tree = 0
    for k in DRAFT_LENS:
        ran = engine.generate(requests, SpecConfig("suffix", k), 1)  # the rows' own last run leaves the tree first
        assert [c.token_ids for c in ran.completions] == [c.token_ids for c in plain.completions]
        for r, i in enumerate(finished):
            assert ran.completions[i].accepted_steps == predicted[k].steps[r], (k, r)
            assert ran.completions[i].draft_tokens == sum(predicted[k].proposed[r]), (k, r)
        assert predicted[k].exact
        from_tree += sum(c.tree_drafts for c in ran.completions)
    assert predicted[8].accepted_tokens > 0 and from_tree > 0  # the shared tree really drafted


def test_without_the_prior_tree_the_counterfactual_differs_where_the_tree_drafted(word_models):
    engine = engine_of(word_models)
    engine.generate(shared_structure_requests(6, prefix="earlier"), NO_SPEC, 2)
    prior = engine.trees.trees["key"].copy()
    _, _, rows = run_plain(engine, shared_structure_requests(12), 1)
    assert suffix_acceptance(rows, [8], prior)[8].accepted_tokens > suffix_acceptance(rows, [8])[8].accepted_tokens


def test_at_batch_8_and_sampled_it_is_an_estimate(word_models):
    engine = engine_of(word_models)
    requests = shared_structure_requests(12)
    plain, _, rows = run_plain(engine, requests, 8)
    estimate = suffix_acceptance(rows, [4], batch_size=8)[4]
    assert not estimate.exact and estimate.target_steps == sum(len(s) for s in estimate.steps) > 0
    ran = engine.generate(requests, SpecConfig("suffix", 4), 8)
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in plain.completions]
    warm = [PlainRow(r.prompt_ids, r.output_ids, r.max_tokens, temperature=1.0) for r in rows]
    logits = engine.teacher_forced_logits([(r.prompt_ids, r.output_ids) for r in warm])
    sampled = suffix_acceptance(warm, [4], target_logits=logits)[4]
    counts = [n for steps in sampled.steps for n in steps]
    assert not sampled.exact and counts and all(0.0 <= n <= 4.0 for n in counts)
