"""The suffix tree and drafter (batchspec.engine.torch.suffix_tree, .suffix) against a brute-force reference on
random token streams: the longest matching suffix, the most frequent continuation, the draft
length set by the match (max_spec_factor) under the cap and the minimum-probability cut; rows
added, merged, removed and evicted; the memory the trees count against what Python allocates."""

from __future__ import annotations

import dataclasses
import random
import tracemalloc

import numpy as np
import pytest

from batchspec.engine.base import Request, SamplingParams, SpecConfig
from batchspec.engine.torch.engine import TorchEngine
from batchspec.engine.torch.suffix import Lookups, SuffixDrafter, SuffixTrees
from batchspec.engine.torch.suffix_tree import MAX_MATCH, SuffixTree, own_draft
from tests.conftest import tiny_llama, word_tokenizer
from tests.engine.lossless import assert_greedy_lossless
from tests.engine.torch.test_engine import five_word_case, joint_pvalue
from tests.engine.torch.test_suffix_acceptance import shared_structure_requests


def occurrences(rows: list[list[int]], pattern: list[int], own: bool) -> list[tuple[int, int]]:
    """(row, end) of every occurrence of `pattern`; for the row's own context, not the one at its end."""
    m = len(pattern)
    out = []
    for r, row in enumerate(rows):
        last = len(row) - 1 if own else len(row)
        out += [(r, e) for e in range(m - 1, last) if row[e - m + 1 : e + 1] == pattern]
    return out


def reference(rows: list[list[int]], context: list[int], budget: int, factor: float, min_prob: float,
              own: bool = False) -> tuple[list[int], list[float], int]:
    """The rule of the module docstring, by scanning every row at every step."""
    for m in range(min(MAX_MATCH, len(context)), 0, -1):
        occ = occurrences(rows, context[-m:], own)
        if any(e + 1 < len(rows[r]) for r, e in occ):
            break
    else:
        return [], [], 0
    tokens, probs, prob = [], [], 1.0
    limit = min(budget, int(m * factor + 1e-6))
    while len(tokens) < limit and occ:
        follow = [(r, e, rows[r][e + 1]) for r, e in occ if e + 1 < len(rows[r])]
        if not follow:
            break
        counts: dict[int, int] = {}
        latest: dict[int, tuple[int, int]] = {}
        for r, e, t in follow:
            counts[t] = counts.get(t, 0) + 1
            latest[t] = max(latest.get(t, (-1, -1)), (r, e))
        token = max(counts, key=lambda t: (counts[t], latest[t]))
        p = prob * counts[token] / len(occ)
        if p < min_prob:
            break
        prob = p
        tokens.append(token)
        probs.append(prob)
        occ = [(r, e + 1) for r, e, t in follow if t == token]
    return (tokens, probs, m) if tokens else ([], [], 0)


def random_rows(rng: random.Random, n: int, vocab: int, length: tuple[int, int]) -> list[list[int]]:
    """Rows over a small vocabulary, half of them copies of a template with a few tokens changed
    (shared structure, as outputs of one workload), half random."""
    template = [rng.randrange(vocab) for _ in range(length[1])]
    rows = []
    for _ in range(n):
        size = rng.randint(*length)
        if rng.random() < 0.5:
            row = template[:size]
            for _ in range(rng.randint(0, 3)):
                row[rng.randrange(size)] = rng.randrange(vocab)
        else:
            row = [rng.randrange(vocab) for _ in range(size)]
        rows.append(row)
    return rows


SETTINGS = [(8, 1.0, 0.1), (16, 1.0, 0.0), (4, 0.5, 0.3), (8, 2.0, 0.1), (3, 1.0, 0.6)]


@pytest.mark.parametrize("vocab", [2, 4, 16])
def test_the_tree_drafts_what_the_reference_finds(vocab):
    rng = random.Random(vocab)
    rows = random_rows(rng, 40, vocab, (1, 60))
    tree = SuffixTree()
    for i, row in enumerate(rows):
        tree.add(f"r{i}", row, i)
        if i % 7 == 6:  # check as it grows (segments merge as rows arrive)
            for _ in range(10):
                context = [rng.randrange(vocab) for _ in range(rng.randint(1, 50))]
                if rng.random() < 0.5:  # a context that ends inside a stored row
                    source = rows[rng.randrange(i + 1)]
                    context += source[: rng.randint(1, len(source))]
                for budget, factor, min_prob in SETTINGS:
                    got = tree.draft(np.array(context, dtype=np.int32), budget, factor, min_prob)
                    want = reference(rows[: i + 1], context, budget, factor, min_prob)
                    assert (got.tokens, got.match_len) == (want[0], want[2]), (vocab, i, context, budget)
                    assert got.probs == pytest.approx(want[1])
    assert tree.rows == len(rows) and len(tree.segments) <= 2 + int(np.log2(len(rows))) * 2


@pytest.mark.parametrize("vocab", [2, 3, 8])
def test_a_rows_own_context_drafts_what_the_reference_finds(vocab):
    rng = random.Random(100 + vocab)
    for _ in range(300):
        context = [rng.randrange(vocab) for _ in range(rng.randint(1, 80))]
        for budget, factor, min_prob in SETTINGS:
            got = own_draft(context, budget, factor, min_prob)
            want = reference([context], context, budget, factor, min_prob, own=True)
            assert (got.tokens, got.match_len) == (want[0], want[2]), (context, budget)
            assert got.probs == pytest.approx(want[1])


def test_a_match_is_the_longest_that_continues_and_counts_the_rows_that_end_there():
    tree = SuffixTree()
    tree.add("a", [1, 2, 3, 4, 5], 0)
    tree.add("b", [9, 2, 3, 4, 6], 1)
    tree.add("c", [7, 7, 3, 4], 2)  # ends after "3 4": counted, with no continuation
    # "2 3 4" occurs twice, followed by 5 and 6: a tie, the most recent (row b) wins at 1/2
    d = tree.draft(np.array([0, 2, 3, 4]), 8, 1.0, 0.1)
    assert (d.tokens, d.probs, d.match_len, d.source) == ([6], [0.5], 3, "tree")
    # "1 2 3 4" only in row a: its continuation alone; the match of 4 allows 4 tokens, the row has 1
    assert tree.draft(np.array([1, 2, 3, 4]), 8, 1.0, 0.1).tokens == [5]
    # "3 4" alone: three occurrences, one ends: 5 or 6 at 1/3 each (below 0.5: nothing)
    assert tree.draft(np.array([8, 3, 4]), 8, 1.0, 0.5).tokens == []
    # a factor of 0.5: a match of 3 drafts one token
    assert tree.draft(np.array([9, 2, 3]), 8, 0.5, 0.1).tokens == [4]


def test_removed_and_evicted_rows_are_gone_and_the_rest_still_drafts():
    rng = random.Random(5)
    rows = random_rows(rng, 30, 3, (5, 40))
    tree = SuffixTree()
    for i, row in enumerate(rows):
        tree.add(f"r{i}", row, i)
    tree.remove({"r3", "r17", "r29"})
    tree.evict_oldest(5)
    kept = [row for i, row in enumerate(rows) if i >= 6 and i not in (17, 29)]  # r3 removed, then r0-r2, r4, r5
    assert tree.rows == len(kept) and tree.oldest == 6
    for _ in range(200):
        context = [rng.randrange(3) for _ in range(rng.randint(1, 30))]
        got = tree.draft(np.array(context), 8, 1.0, 0.1)
        assert (got.tokens, got.match_len) == reference(kept, context, 8, 1.0, 0.1)[::2]


def test_the_cap_holds_and_the_oldest_rows_of_any_scope_go_first():
    rng = np.random.default_rng(0)
    trees = SuffixTrees(cap_bytes=200_000)
    for i in range(400):
        trees.add("ab"[i % 2], f"r{i}", rng.integers(0, 50_000, 200))
        assert trees.nbytes <= trees.cap_bytes
    assert trees.evicted > 0
    oldest = [t.oldest for t in trees.trees.values()]
    assert min(oldest) >= trees.evicted - 1 and max(oldest) <= trees.evicted + 1  # first in, first out
    assert sum(t.rows for t in trees.trees.values()) == 400 - trees.evicted


def test_the_bytes_counted_are_the_bytes_python_holds():
    rng = np.random.default_rng(1)
    outputs = [rng.integers(0, 49_152, 200).tolist() for _ in range(500)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    trees = SuffixTrees(cap_bytes=1 << 30)
    for i, out in enumerate(outputs):
        trees.add("k", f"row-{i}", out)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert trees.nbytes == pytest.approx(held, rel=0.25)


def test_the_drafter_counts_its_lookups_and_the_trees_answers():
    trees = SuffixTrees(cap_bytes=1 << 20)
    trees.add("k", "a", [5, 6, 7, 8, 9])
    counts = Lookups()
    drafter = SuffixDrafter(trees, ["k", None], counts)
    assert drafter.draft(0, [1, 5, 6, 7], 4).tokens == [8, 9]  # from the tree (match "5 6 7")
    assert drafter.draft(1, [1, 5, 6, 7], 4).tokens == []  # no scope: its own context has no match
    assert drafter.draft(1, [3, 4, 3, 4, 3], 4).tokens == [4, 3]  # its own: "4 3" after "3 4 3"... twice
    assert counts.lookups == {0: 1, 1: 2} and counts.tree_drafts == {0: 1}


# -- the engine running the arm ---------------------------------------------------------------------


def scoped(requests, scope="key"):
    return [dataclasses.replace(r, draft_scope=scope) for r in requests]


@pytest.mark.parametrize("batch_size", [1, 8])
def test_greedy_suffix_speculation_equals_plain_greedy_with_a_shared_tree(word_models, batch_size):
    """Rows that share structure (templated prompts, some repeated), drafting from each other's
    outputs: every draft length 1..8 gives plain decoding's tokens."""
    target, _, tokenizer = word_models
    engine = TorchEngine(target, tokenizer, model_name="tiny")
    requests = shared_structure_requests(16)
    plain = engine.generate(requests, SpecConfig(), batch_size)
    for k in range(1, 9):
        ran = engine.generate(requests, SpecConfig("suffix", k), batch_size)
        near_ties = assert_greedy_lossless(engine, requests, ran.completions, plain.completions)
        assert near_ties == 0, k
        assert sum(c.tree_drafts for c in ran.completions) > 0 and ran.accepted_tokens > 0, k
        assert all(c.accepted_tokens <= c.draft_tokens <= k * c.target_steps for c in ran.completions)


def test_a_row_whose_prompt_an_earlier_row_had_drafts_its_whole_output_from_the_tree(word_models):
    target, _, tokenizer = word_models
    engine = TorchEngine(target, tokenizer, model_name="tiny")
    first = Request("a", "w3 w9 w27 w4 w4 w51", params=SamplingParams(max_tokens=20), draft_scope="key")
    again = dataclasses.replace(first, id="b")
    done = engine.generate([first, again], SpecConfig("suffix", 8), 1).completions
    assert done[0].token_ids == done[1].token_ids
    # b drafts from a's output at every step; after its first step (where the tree, which holds
    # outputs, not prompts, matches one token) every draft is accepted: 4 steps for 19 tokens
    assert done[1].tree_drafts == done[1].target_steps <= 5
    assert done[1].draft_tokens - 1 <= done[1].accepted_tokens
    assert engine.trees.usage("key")[1] == 2
    again_alone = engine.generate([again], SpecConfig("suffix", 8), 1).completions[0]  # b's own last run left first
    assert again_alone.tree_drafts > 0 and engine.trees.usage("key")[1] == 2


def test_rows_without_a_scope_share_nothing():
    target = tiny_llama(64, 2, seed=3, eos_token_id=0, pad_token_id=0, initializer_range=0.15)
    engine = TorchEngine(target, word_tokenizer(64), model_name="tiny")
    request = Request("a", "w3 w9 w27 w4", params=SamplingParams(max_tokens=12))
    engine.generate([request, dataclasses.replace(request, id="b")], SpecConfig("suffix", 4), 1)
    assert engine.trees.trees == {}


def test_sampled_suffix_speculation_follows_the_target_distribution_with_a_shared_tree():
    """test_engine's chi-square test with the rows drafting from each other's sampled outputs."""
    V, n = 5, 8_000  # half the rows of test_engine's: each finished row joins the tree (2 ms a row here)
    engine, target, prompt, requests = five_word_case(V, n)
    result = engine.generate(scoped(requests), SpecConfig("suffix", 3), 1000)
    assert sum(c.tree_drafts for c in result.completions) > n / 8  # the shared tree drafted (rows after the first 1,000)
    assert joint_pvalue(result, target, prompt, V) > 1e-3
