"""batchspec.engine.trtllm.ngram_pool replays TensorRT-LLM's NGram pool rules (ngram.py NGramPoolManager,
cited in the module). Checked two ways: against a brute-force model of the rules on random token
streams (the stand-in's pool, tests/engine/trtllm/fake_tensorrt_llm/_ngram.py, over the real
ordered_set.OrderedSet, driven by an iteration loop written here), and against the stand-in LLM
drafting with that pool, step by step, from its per-request iteration stats."""

from __future__ import annotations

import random

import pytest

from batchspec.engine.acceptance import PlainRow
from batchspec.engine.trtllm.ngram_pool import NGramPoolRules, trt_ngram_acceptance
from tests.engine.trtllm import fake_tensorrt_llm as fake
from tests.engine.trtllm.conftest import TARGET
from tests.engine.trtllm.test_fake_tensorrt_llm import gone
from tests.engine.trtllm.fake_tensorrt_llm import _ngram, llmapi


def brute_force(rows: list[PlainRow], k: int, rules: NGramPoolRules, batch: int) -> tuple[list[list[int]], list[list[int]]]:
    """Iteration by iteration: admit up to `batch` rows (a context step each), then draft for every
    row already past its context step, in admission order, and accept against its output."""
    pool = _ngram.NGramPoolManager(k, rules.max_matching_ngram_size, rules.is_keep_all, rules.is_use_oldest, rules.is_public_pool)
    done_at = {i: 1 for i in range(len(rows))}  # output tokens committed
    # a row shorter than max_tokens ended on its end token: one more position, never proposed
    ends = {i: len(r.output_ids) + (len(r.output_ids) < r.max_tokens) for i, r in enumerate(rows)}
    accepted = {i: [] for i in range(len(rows))}
    proposed = {i: [] for i in range(len(rows))}
    waiting, running = list(range(len(rows))), []
    while waiting or running:
        running = [i for i in running if done_at[i] < ends[i]]
        drafting = list(running)
        while waiting and len(running) < batch:
            running.append(waiting.pop(0))
        for i in drafting:
            row, t = rows[i], done_at[i]
            prefix = list(row.prompt_ids) + list(row.output_ids[:t])
            draft = pool.get_draft_tokens(prefix, i, len(row.prompt_ids) + row.max_tokens)
            n = next((j for j, (d, o) in enumerate(zip(draft, row.output_ids[t:])) if d != o),
                     min(len(draft), len(row.output_ids) - t))
            accepted[i].append(n)
            proposed[i].append(len(draft))
            done_at[i] = t + n + 1
        for i in running:
            if done_at[i] >= ends[i]:
                pool.release(i)
    return [accepted[i] for i in range(len(rows))], [proposed[i] for i in range(len(rows))]


def random_rows(rng: random.Random, n: int) -> list[PlainRow]:
    rows = []
    for _ in range(n):
        vocab = rng.randint(2, 5)  # few symbols: patterns repeat, pools fill, matches of every length
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 14))]
        output = [rng.randrange(vocab) for _ in range(rng.randint(0, 40))]
        if rng.random() < 0.5:  # copied stretches, as in edits and code
            at = rng.randrange(len(prompt))
            output[:0] = prompt[at:at + rng.randint(1, 8)]
        rows.append(PlainRow(prompt, output, max_tokens=len(output) + rng.choice([0, 0, 1, 5])))
    return rows


@pytest.mark.parametrize("seed", range(60))
def test_the_replay_is_the_pool_rules(seed):
    rng = random.Random(seed)
    rows = random_rows(rng, rng.randint(1, 6))
    rules = NGramPoolRules(rng.randint(1, 4), rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.5)
    batch = rng.randint(1, 4)
    lens = sorted(rng.sample(range(1, 8), 3))
    predicted = trt_ngram_acceptance(rows, lens, rules, batch_size=batch)
    for k in lens:
        steps, proposed = brute_force(rows, k, rules, batch)
        assert predicted[k].steps == steps and predicted[k].proposed == proposed, (k, rules, batch)
        assert predicted[k].exact is (not rules.is_public_pool)


def test_each_draft_length_is_its_own_pool():
    # a match kept is at most k long, and cut where the tokens seen so far end: at the first step
    # (prefix 5 6 7 8 9 5 6 7) the pattern 6 7 offers 8 9 5 6 7, five tokens, even at k = 6
    row = PlainRow([5, 6, 7, 8, 9, 5, 6], [7, 8, 9, 5, 6, 7, 8, 9, 1], max_tokens=9)
    steps = trt_ngram_acceptance([row], [1, 3, 6], NGramPoolRules(max_matching_ngram_size=2))
    assert steps[1].steps == [[1, 1, 1, 1]] and steps[6].steps[0][0] == 5 and steps[3].steps[0][0] == 3
    assert sum(steps[3].steps[0]) + len(steps[3].steps[0]) == len(row.output_ids) - 1  # every token committed once


def prompts(rng: random.Random, n: int) -> list[list[int]]:
    """Token-id prompts the stand-in's toy target (bytes + 3) continues."""
    texts = ["abc abc abc", "def fib(n): return fib(n-1)", "the cat sat on the mat, the cat", "zzz", "ab ab ab ab ab"]
    return [[3 + b for b in (texts[i % len(texts)] + f" {rng.randrange(100)}").encode()] for i in range(n)]


@pytest.mark.parametrize("public, batch", [(False, 1), (False, 3), (True, 1), (True, 3)])
def test_the_replay_predicts_the_stand_in_step_by_step(monkeypatch, public, batch):
    fake.install(monkeypatch)
    ids = prompts(random.Random(batch), 6)
    params = fake.SamplingParams(max_tokens=40)
    llm = fake.LLM(TARGET, max_batch_size=batch)
    plain = llm.generate(ids, params)
    gone(llm)
    rows = [PlainRow(p, o.outputs[0].token_ids, max_tokens=40) for p, o in zip(ids, plain)]
    rules = NGramPoolRules(max_matching_ngram_size=3, is_public_pool=public)
    predicted = trt_ngram_acceptance(rows, [2, 5], rules, batch_size=batch)
    for k in (2, 5):
        spec = llmapi.NGramDecodingConfig(max_draft_len=k, max_matching_ngram_size=3, is_public_pool=public)
        llm = fake.LLM(TARGET, max_batch_size=batch, speculative_config=spec, enable_iter_perf_stats=True, enable_iter_req_stats=True)
        outs = llm.generate(ids, params)
        assert [o.outputs[0].token_ids for o in outs] == [list(r.output_ids) for r in rows]  # greedy: lossless
        assert per_request_steps(llm.get_stats(), rows) == predicted[k].steps
        gone(llm)
    assert any(sum(s) for s in predicted[5].steps)  # drafts were accepted: the comparison says something


def per_request_steps(entries: list[dict], rows: list[PlainRow]) -> list[list[int]]:
    """Accepted drafts per generation step of each request, from requestStats' numGeneratedTokens
    (a step commits accepted + 1; the count includes a row's end token: SOURCES.md "End tokens"),
    requests in the order they were submitted."""
    seen: dict[int, list[int]] = {}
    for entry in entries:
        for r in entry["requestStats"]:
            if r["stage"] != "QUEUED":
                seen.setdefault(r["id"], []).append(r["numGeneratedTokens"])
    out = []
    for row, (_, counts) in zip(rows, sorted(seen.items())):
        out.append([b - a - 1 for a, b in zip(counts, counts[1:])])
    return out
