"""Counterfactual acceptance (engine/acceptance.py, engine/torch/counterfactual.py): literal walks, and the property that
matters: computed from a plain greedy run, the accepted length of every step equals what the torch
engine measures when it runs the arm on the same rows, both drafters, k = 1..8, batch 1 and 8, row
by row and step by step; sampled rows as an estimate."""

from __future__ import annotations

import pytest
import torch

from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig, acceptance_rate
from batchspec.engine.torch.engine import TorchEngine
from batchspec.engine.acceptance import PlainRow, greedy_runs, walk
from batchspec.engine.torch.counterfactual import draft_acceptance, ngram_acceptance


DRAFT_LENS = list(range(1, 9))


def test_greedy_runs_count_agreement_stretches():
    assert greedy_runs([5, 1, 2, 9, 4], [7, 1, 2, 3, 4]) == [0, 2, 1, 0, 1]


def test_a_walk_steps_over_accepted_drafts_and_respects_the_budget():
    row = PlainRow([1, 2], [10, 11, 12, 13, 14, 15, 16], max_tokens=7)
    runs = [0, 3, 2, 1, 0, 2, 1]
    # t=1: 3 accepted of 4 -> t=5: run 2 but budget min(4, 7-5-1)=1 -> 1 accepted -> t=7 done
    assert walk(row, runs, None, 4) == ([3, 1], [4, 1])
    # k=1: t=1 acc 1 -> t=3 acc 1 -> t=5 acc 1 (budget 1) -> t=7
    assert walk(row, runs, None, 1) == ([1, 1, 1], [1, 1, 1])
    # an n-gram lookup that offered nothing at t=1: t=2 accepts 2 -> t=5 budget 1
    assert walk(row, runs, [0, 0, 2, 1, 0, 2, 1], 4) == ([0, 2, 1], [0, 2, 1])


def test_a_row_that_ends_inside_the_drafts_accepts_only_what_it_commits():
    row = PlainRow([1], [10, 11, 12], max_tokens=50)  # 12 is eos
    assert walk(row, [0, 5, 4], None, 8) == ([2], [8])


def pairs(rows: list[PlainRow]) -> list[tuple[list[int], list[int]]]:
    return [(r.prompt_ids, r.output_ids) for r in rows]


def engine_of(word_models) -> TorchEngine:
    target, drafts, tokenizer = word_models
    return TorchEngine(target, tokenizer, model_name="tiny", draft_loader=lambda name: (drafts[name], tokenizer))


def repetitive_requests(n: int, temperature: float = 0.0) -> list[Request]:
    """Prompts that repeat phrases (n-gram lookup finds matches), of different lengths and caps."""
    gen = torch.Generator().manual_seed(7)
    out = []
    for i in range(n):
        phrase = [f"w{int(x)}" for x in torch.randint(1, 20, (3 + i % 4,), generator=gen)]
        noise = [f"w{int(x)}" for x in torch.randint(1, 64, (2 + 3 * i,), generator=gen)]
        words = phrase * (2 + i % 3) + noise + phrase
        params = SamplingParams(max_tokens=12 + 4 * i, temperature=temperature, seed=i)
        out.append(Request(f"r{i}", " ".join(words), params=params))
    return out


@pytest.fixture(scope="module")
def plain(word_models):
    engine = engine_of(word_models)
    requests = repetitive_requests(8)
    result = engine.generate(requests, NO_SPEC, 8)
    rows = [PlainRow(engine.encode(r), c.token_ids, r.params.max_tokens) for r, c in zip(requests, result.completions)]
    return engine, requests, result, rows


@pytest.mark.parametrize("batch_size", [1, 8])
@pytest.mark.parametrize("method,draft", [("ngram", None), ("draft_target", "close"), ("draft_target", "far")])
def test_counterfactual_equals_what_the_engine_measures(plain, word_models, method, draft, batch_size):
    engine, requests, result, rows = plain
    if method == "ngram":
        predicted = ngram_acceptance(rows, DRAFT_LENS, max_ngram=3)
    else:
        logits = engine.teacher_forced_logits(pairs(rows), draft_model=draft)
        predicted = draft_acceptance(rows, DRAFT_LENS, logits)
    accepted_somewhere = False
    for k in DRAFT_LENS:
        spec = SpecConfig(method, k, draft_model=draft, ngram_size=3)
        ran = engine.generate(requests, spec, batch_size)
        for r, (c, p) in enumerate(zip(ran.completions, result.completions)):
            assert c.token_ids == p.token_ids, (k, r)  # lossless: same rows, same tokens
            assert c.accepted_steps == predicted[k].steps[r], (k, r)
            assert c.draft_tokens == sum(predicted[k].proposed[r]), (k, r)
        assert predicted[k].exact
        assert ran.target_steps == predicted[k].target_steps
        accepted_somewhere |= predicted[k].accepted_tokens > 0
    assert accepted_somewhere or draft == "far"


def flat(steps: list[list[float]]) -> list[float]:
    return [n for row in steps for n in row] + [len(row) for row in steps]


def test_sampling_estimate_at_a_vanishing_temperature_is_the_greedy_count(plain, word_models):
    engine, _, _, rows = plain
    cold = [PlainRow(r.prompt_ids, r.output_ids, r.max_tokens, temperature=1e-6) for r in rows]
    target = engine.teacher_forced_logits(pairs(cold))
    draft = engine.teacher_forced_logits(pairs(cold), draft_model="close")
    for k, est in draft_acceptance(cold, [2, 5], draft, target).items():
        assert not est.exact
        exact = draft_acceptance(rows, [k], draft)[k]
        assert flat(est.steps) == pytest.approx(flat(exact.steps))
    for k, est in ngram_acceptance(cold, [3], 3, target).items():
        assert not est.exact
        assert flat(est.steps) == pytest.approx(flat(ngram_acceptance(rows, [k], 3)[k].steps))


def test_sampling_estimate_stays_within_the_draft_length(plain, word_models):
    engine, _, _, rows = plain
    warm = [PlainRow(r.prompt_ids, r.output_ids, r.max_tokens, temperature=1.0) for r in rows]
    target = engine.teacher_forced_logits(pairs(warm))
    draft = engine.teacher_forced_logits(pairs(warm), draft_model="close")
    est = draft_acceptance(warm, [4], draft, target)[4]
    counts = [n for steps in est.steps for n in steps]
    assert counts and all(0.0 <= n <= 4.0 for n in counts)
    assert 0.0 < acceptance_rate(est.accepted_tokens, est.draft_tokens) < 1.0


def test_a_plain_row_keeps_its_ids_in_four_bytes_each_and_replays_the_same():
    """A worker keeps many keys' last rows (KeyHistory): ids as 4-byte ints, not Python int lists.
    The replay reads them as it read lists."""
    prompt, output = [5, 60000, 7, 5, 60000] * 40, [7, 5, 60000, 7]
    row = PlainRow(prompt, output, 8)
    assert row.prompt_ids.itemsize == 4 and list(row.prompt_ids) == prompt and list(row.output_ids) == output
    assert PlainRow(row.prompt_ids, row.output_ids, 8).prompt_ids is row.prompt_ids  # not copied again
    as_lists = PlainRow([], [], 8)
    object.__setattr__(as_lists, "prompt_ids", prompt)  # a row as it was kept before: lists
    object.__setattr__(as_lists, "output_ids", output)
    by_k = ngram_acceptance([row], [2, 4], 3)
    before = ngram_acceptance([as_lists], [2, 4], 3)
    assert all(by_k[k].steps == before[k].steps and by_k[k].proposed == before[k].proposed for k in (2, 4))
    assert sum(by_k[4].proposed[0]) > 0  # the lookup found the repeated phrase
