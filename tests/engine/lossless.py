"""What "lossless" guarantees for greedy speculation, checked exactly.

Greedy speculative output equals greedy plain output token for token, except where the target's
top two logits are within float error of each other: a verify over k+1 tokens, a different batch
or thread count sums in another order, and a near-tie can flip (seen on SmolLM2: 33.835464 vs
33.835461). So a test compares the two outputs row by row; where a row differs, it recomputes the
target's logits at the first differing position with one full forward over prompt + the common
prefix, and fails unless the two tokens' logits are within `tolerance` of each other (and both are
the top two). Anything else (a masking, cache or acceptance bug) fails.
"""

from __future__ import annotations

import torch

FLOAT32_EPS = torch.finfo(torch.float32).eps


def tie_tolerance(logits: torch.Tensor) -> float:
    """Float error of a float32 logit of this size after a few hundred accumulations."""
    return 64 * FLOAT32_EPS * max(1.0, float(logits.abs().max()))


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.no_grad()
def assert_greedy_lossless(engine, requests, spec_completions, plain_completions) -> int:
    """Assert the guarantee above for every row; return how many rows differed at a near-tie."""
    by_id = {r.id: r for r in requests}
    near_ties = 0
    for s, p in zip(spec_completions, plain_completions):
        assert s.id == p.id
        at = first_difference(list(s.token_ids), list(p.token_ids))
        if at is None:
            continue
        assert at < len(s.token_ids) and at < len(p.token_ids), (
            f"row {s.id}: one output is a prefix of the other (lengths {len(s.token_ids)} vs {len(p.token_ids)}): not a near-tie")
        ids = list(engine.encode(by_id[s.id])) + list(p.token_ids[:at])
        logits = engine.model(torch.tensor([ids], device=engine.device)).logits[0, -1].float()
        top2 = torch.topk(logits, 2)
        pair = {int(s.token_ids[at]), int(p.token_ids[at])}
        gap = abs(float(logits[s.token_ids[at]] - logits[p.token_ids[at]]))
        assert pair == set(top2.indices.tolist()), f"row {s.id} position {at}: tokens {pair} are not the target's top two {top2.indices.tolist()}"
        assert gap <= tie_tolerance(logits), f"row {s.id} position {at}: logit gap {gap:.3g} exceeds float error {tie_tolerance(logits):.3g}"
        near_ties += 1
    return near_ties
