"""predict.py: counterfactual acceptance (literal walks, and the property that matters: computed
from a plain greedy run, the accepted length of every step equals what the torch engine measures
when it runs the arm on the same rows, both drafters, k = 1..8, batch 1 and 8, row by row and step
by step), and the cost profile and schedule replay on constructed costs."""

from __future__ import annotations

import pytest
import torch

from batchspec.predict import (
    CostProfile,
    PlainRow,
    RowPlan,
    draft_acceptance,
    greedy_runs,
    ngram_acceptance,
    predict_decode_s,
    profile_grid,
    walk,
)
from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig, StepCost
from batchspec.engine.torch.engine import TorchEngine

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
        params = SamplingParams(max_tokens=20 + 7 * i, temperature=temperature, seed=i)
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
    assert 0.0 < est.acceptance_rate < 1.0


# -- the cost profile and the replay ------------------------------------------------------------


def profile_of(points: list[tuple]) -> CostProfile:
    profile = CostProfile()
    profile.merge([StepCost(*p) for p in points], 1.0)
    return profile


def test_profile_interpolates_in_tokens_context_and_batch():
    p = profile_of([("target", "m", 8, 100, 1, 1.0), ("target", "m", 8, 100, 5, 2.0), ("target", "m", 8, 300, 1, 1.5),
                    ("target", "m", 1, 100, 1, 0.5), ("target", "m", 1, 100, 5, 0.5)])
    assert p.target_s(8, 100, 1) == 1.0 and p.target_s(8, 100, 5) == 2.0
    assert p.target_s(8, 100, 3) == pytest.approx(1.5)  # linear in tokens per row
    assert p.target_s(8, 200, 5) == pytest.approx(2.0 * 1.25)  # width cost x the context factor
    assert p.target_s(1, 100, 3) == pytest.approx(0.5)
    assert p.target_s(4, 100, 5) == pytest.approx(0.5 + (2.0 - 0.5) * 3 / 7)  # linear in rows between batches


def test_a_cost_timed_in_a_quiet_moment_does_not_make_wider_steps_cheaper():
    p = profile_of([("target", "m", 8, 100, 1, 1.0), ("target", "m", 8, 100, 3, 0.7), ("target", "m", 8, 100, 5, 2.0)])
    assert p.target_s(8, 100, 3) == 1.0  # the running maximum, not 0.7


def test_profile_coverage_and_grid():
    target, drafts = profile_grid(8, 100, 300, 9, ["d"])
    assert (8, 200, 9) in target and (8, 100, 1) in target and (8, 300, 1) in target and (1, 200, 9) in target
    assert {d for d, _, _ in drafts} == {"d"}
    p = profile_of([("target", "m", *t, 1.0) for t in target] + [("draft", "d", b, c, 1, 0.1) for _, b, c in drafts])
    assert p.covers(8, 100, 300, 9, ["d"]) and p.covers(8, 60, 360, 5)
    assert not p.covers(4, 100, 300, 9) and not p.covers(8, 100, 300, 10) and not p.covers(8, 100, 900, 9)
    assert not p.covers(8, 100, 300, 9, ["other"]) and p.covers(8, 10, 900, 9, check_context=False)


def test_replay_prices_each_step_as_wide_as_its_widest_row():
    p = profile_of([("target", "m", 2, 10, 1, 1.0), ("target", "m", 2, 10, 3, 2.0),
                    ("target", "m", 1, 10, 1, 0.5), ("target", "m", 1, 10, 3, 1.0)])
    plain = [RowPlan(10, 3, [0, 0, 0], [0, 0, 0]), RowPlan(10, 1, [0], [0])]
    got = predict_decode_s(plain, 2, p)
    assert got.verify_s == pytest.approx(1.0 + 0.5 + 0.5) and got.target_steps == 4 and got.decode_tokens == 4
    spec = [RowPlan(10, 3, [2, 0], [2, 0]), RowPlan(10, 1, [0], [2])]  # step 1 is 3 wide, step 2 has one row left, 1 wide
    got = predict_decode_s(spec, 2, p, "ngram", lookup_per_row_step=0.01)
    assert got.verify_s == pytest.approx(2.0 + 0.5) and got.draft_s == pytest.approx(0.01 * 3)
