"""The accept/reject rule and sampling, alone: literal greedy cases, exact counts, and a
statistical test that the emitted tokens follow the target distribution (and a wrong rule fails)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from batchspec.engine.sampling import ARGMAX_BLOCKS, accept_reject, argmax, greedy_accept, probs_from_logits, sample_from


def one_hot(tokens: list[list[int]], vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()


def test_greedy_accepts_the_matching_prefix_then_recovers_the_argmax():
    # target argmaxes per position: row 0 -> 3 5 7 | 9, row 1 -> 1 1 1 | 2
    target = one_hot([[3, 5, 7, 9], [1, 1, 1, 2]], 10)
    drafts = torch.tensor([[3, 5, 0], [1, 4, 1]])
    n, nxt = accept_reject(drafts, None, torch.tensor([3, 3]), target, torch.rand(2, 3), torch.rand(2))
    assert n.tolist() == [2, 1]
    assert nxt.tolist() == [7, 1]  # the target's own token at the first mismatch


def test_all_accepted_gives_the_bonus_token():
    target = one_hot([[3, 5, 7, 9]], 10)
    n, nxt = accept_reject(torch.tensor([[3, 5, 7]]), None, torch.tensor([3]), target, torch.rand(1, 3), torch.rand(1))
    assert (n.item(), nxt.item()) == (3, 9)


def test_padding_drafts_are_never_accepted():
    # row proposes only 1 real draft; the padding equals the target's argmax but must not count
    target = one_hot([[3, 5, 7, 9]], 10)
    n, nxt = accept_reject(torch.tensor([[3, 5, 7]]), None, torch.tensor([1]), target, torch.rand(1, 3), torch.rand(1))
    assert (n.item(), nxt.item()) == (1, 5)


def test_no_drafts_is_plain_sampling():
    target = one_hot([[4]], 6)
    n, nxt = accept_reject(torch.zeros(1, 0, dtype=torch.long), None, torch.tensor([0]), target,
                           torch.zeros(1, 0), torch.rand(1))
    assert (n.item(), nxt.item()) == (0, 4)


def test_deterministic_drafter_is_accepted_with_the_target_probability():
    # n-gram drafts are a one-hot q: accepted iff u < p(draft)
    target = torch.tensor([[[0.3, 0.7, 0.0], [0.2, 0.2, 0.6]]])
    drafts = torch.tensor([[1]])
    accept, _ = accept_reject(drafts, None, torch.tensor([1]), target, torch.tensor([[0.69]]), torch.tensor([0.5]))
    reject, recovered = accept_reject(drafts, None, torch.tensor([1]), target, torch.tensor([[0.71]]), torch.tensor([0.99]))
    assert accept.item() == 1 and reject.item() == 0
    assert recovered.item() == 0  # residual is p with the draft removed: only token 0 remains


def test_sample_from_one_hot_ignores_the_uniform():
    probs = one_hot([[2], [0]], 4).squeeze(1)
    for u in (0.0, 0.5, 0.999999):
        assert sample_from(probs, torch.tensor([u, u])).tolist() == [2, 0]


def test_probs_from_logits_greedy_rows_are_one_hot_and_top_p_truncates():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [1.0, 3.0, 2.0, 0.0]])
    probs = probs_from_logits(logits, torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.7]))
    assert probs[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    full = torch.softmax(logits[1], -1)
    assert full[1] < 0.7  # so top_p 0.7 needs tokens 1 and 2, and no more
    assert probs[1, 0] == 0 and probs[1, 3] == 0
    assert torch.allclose(probs[1, [1, 2]], full[[1, 2]] / full[[1, 2]].sum())


def wrong_rule(draft_tokens, draft_probs, num_drafts, target_probs, u_accept, u_sample):
    """A plausible bug: on rejection, resample from p instead of the residual max(0, p - q)."""
    n, _ = accept_reject(draft_tokens, draft_probs, num_drafts, target_probs, u_accept, u_sample)
    rows = torch.arange(draft_tokens.shape[0])
    return n, sample_from(target_probs[rows, n], u_sample)


def emitted_first_tokens(rule, p: torch.Tensor, q: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """The first token each of n rows commits, with drafts sampled from q (K positions)."""
    K, V = q.shape
    drafts = torch.stack([torch.multinomial(q[k], n, replacement=True, generator=gen) for k in range(K)], 1)
    nacc, nxt = rule(drafts, q.expand(n, K, V), torch.full((n,), K), p.expand(n, K + 1, V),
                     torch.rand(n, K, generator=gen), torch.rand(n, generator=gen))
    return torch.where(nacc > 0, drafts[:, 0], nxt)


@pytest.mark.parametrize("rule,should_match", [(accept_reject, True), (wrong_rule, False)])
def test_committed_tokens_follow_the_target_distribution(rule, should_match):
    gen = torch.Generator().manual_seed(1234)
    V, K, n = 6, 3, 40_000
    p = torch.softmax(torch.randn(K + 1, V, generator=gen) * 1.5, -1)
    q = torch.softmax(torch.randn(K, V, generator=gen) * 1.5, -1)
    first = emitted_first_tokens(rule, p, q, n, gen)
    observed = torch.bincount(first, minlength=V).double()
    expected = p[0].double() / p[0].double().sum() * n
    pvalue = chisquare(observed.numpy(), expected.numpy()).pvalue
    if should_match:
        assert pvalue > 1e-3, (observed, expected)
    else:
        assert pvalue < 1e-6, (observed, expected)


def test_greedy_accept_on_logits_equals_the_rule_on_one_hot_probabilities():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        B, K, V = 4, 3, 7
        logits = torch.randn(B, K + 1, V, generator=gen)
        best = logits.argmax(-1)
        drafts = torch.where(torch.rand(B, K, generator=gen) < 0.6, best[:, :K], torch.randint(0, V, (B, K), generator=gen))
        num = torch.randint(0, K + 1, (B,), generator=gen)
        probs = probs_from_logits(logits.view(-1, V), torch.zeros(B * (K + 1)), torch.ones(B * (K + 1))).view(B, K + 1, V)
        expected = accept_reject(drafts, None, num, probs, torch.rand(B, K, generator=gen), torch.rand(B, generator=gen))
        got = greedy_accept(drafts, num, logits)
        assert [t.tolist() for t in got] == [t.tolist() for t in expected]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_argmax_is_torchs_index_for_index(dtype):
    """The blocked argmax every greedy token goes through picks torch.argmax's index: the first of
    equal maxima (ties within a block and across blocks), NaN as the largest, all -inf, signed
    zeros, views that are not contiguous, vocabularies no block divides (torch's own then)."""
    gen = torch.Generator().manual_seed(1)
    blocked = 0
    for trial in range(240):
        v = (49152, 1024, 4 * ARGMAX_BLOCKS[-1], 1000, 151936 // 8)[trial % 5]
        shape = ((3, v), (2, 5, v), (v,))[trial % 3]
        x = torch.randn(*shape, generator=gen).to(dtype)
        case = trial % 7
        if case == 1:
            x = (x * 2).round()  # many ties
        elif case == 2:
            x = torch.full(shape, float("-inf"), dtype=dtype)
        elif case == 3:
            x.view(-1)[torch.randint(0, x.numel(), (4,), generator=gen)] = float("nan")
        elif case == 4:
            x = torch.zeros(shape, dtype=dtype)
            x.view(-1)[torch.randint(0, x.numel(), (7,), generator=gen)] = -0.0
        elif case == 5:  # the maximum repeated in a later block than its first occurrence
            x.view(-1, v)[:, 3] = 100.0
            x.view(-1, v)[:, v - 2] = 100.0
        elif case == 6 and x.dim() > 1:
            x = torch.randn(v, *shape[:-1], generator=gen).to(dtype).movedim(0, -1)  # not contiguous
        blocked += any(v % b == 0 and v >= 4 * b for b in ARGMAX_BLOCKS)
        assert torch.equal(argmax(x), x.argmax(-1)), (shape, dtype, case)
    assert blocked == 240 * 3 // 5  # three vocabularies of the five take the blocked path
