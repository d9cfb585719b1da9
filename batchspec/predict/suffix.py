"""Counterfactual acceptance of the suffix arm: from rows decoded under "none", the accepted length
of every step the suffix drafter would have taken, every draft length at once.

The suffix drafter (engine/torch/suffix.py) proposes from two sources: the row's own prompt and
output so far, and its scope's tree of rows finished before on this worker. So the replay walks
the rows in the order plain decoding finished them, starting from the tree as the worker holds it
for the key (a copy: the worker's tree is not touched), and adds each row's output to the copy
when the row is done, as the engine adds a finished row before the next step drafts.

At every output position t of a row it computes both sources' drafts once at the largest draft
length; the draft at a smaller budget b is the first b tokens of that one (the continuation is the
same greedy path, cut earlier), and the source the drafter picks is the one with the larger score
over those b tokens. Then a greedy row walks its steps as `acceptance.walk` does.

Where this is exact and where an estimate:
- exact: greedy rows at batch 1, from the same prior tree. Each row then decodes after the rows
  before it finished, under any arm, so it sees exactly the tree the replay builds
  (tests/predict/test_suffix_acceptance.py checks step-by-step equality with the engine).
- estimate at batch > 1: rows in flight together finish in another order and at other steps
  under the arm than under "none"; the replay lets a row see every row plain decoding finished
  before it, from its first step (rows finishing while it decodes are seen too early, so it
  leans optimistic).
- estimate for sampled rows (`target_logits` given): draft j of the proposal at t passes with
  p_{t+j}(draft) along the sampled path, as n-gram lookup's estimate.
`Acceptance.exact` is True only where every row is greedy and `batch_size` is 1.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from batchspec.engine.base import MIN_TOKEN_PROB_DEFAULT, SPEC_FACTOR_DEFAULT
from batchspec.engine.torch.suffix_tree import Draft, SuffixTree, own_draft
from batchspec.predict.acceptance import Acceptance, PlainRow, _agree, _probs, accept_probs, expected_walk


def suffix_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int], prior: SuffixTree | None = None,
                      spec_factor: float = SPEC_FACTOR_DEFAULT, min_token_prob: float = MIN_TOKEN_PROB_DEFAULT,
                      batch_size: int = 1, target_logits: Sequence[torch.Tensor] | None = None,
                      grow: bool = False) -> dict[int, Acceptance]:
    """Counterfactual steps of the suffix arm at every draft length in `draft_lens`, for `rows` in
    the order plain decoding finished them, from the key's tree `prior` (the worker's
    `engine.trees.trees.get(key)`, None for an empty one; copied, never changed, unless `grow`:
    then the rows are added to `prior` itself, for a caller that replays a shard's rows batch by
    batch as they finish)."""
    k_max = max(draft_lens)
    tree = prior if grow and prior is not None else (prior.copy() if prior is not None else SuffixTree())
    first = tree.rows
    out = {k: Acceptance("suffix", k) for k in draft_lens}
    for r, row in enumerate(rows):
        drafts = _drafts(row, tree, k_max, spec_factor, min_token_prob)
        p = None
        if not row.greedy:
            assert target_logits is not None, "sampled rows need the target's teacher-forced logits"
            p = _probs(target_logits[r], row)
        for k in draft_lens:
            proposals = [_choose(own, shared, max(0, min(k, row.max_tokens - t - 1))) for t, (own, shared) in enumerate(drafts)]
            if p is None:
                accepted, proposed = _walk(row, proposals, k)
            else:
                accepted, proposed = expected_walk(row, accept_probs(proposals, p, k), [len(x) for x in proposals], k)
            out[k].steps.append(accepted)
            out[k].proposed.append(proposed)
            out[k].exact = out[k].exact and row.greedy and batch_size == 1
        tree.add(f"counterfactual-{first + r}", row.output_ids, serial=first + r)
    return out


def _drafts(row: PlainRow, tree: SuffixTree, k_max: int, spec_factor: float,
            min_token_prob: float) -> list[tuple[Draft, Draft]]:
    """(own, shared) drafts at the largest budget, by output position t (t = 0 unused: prefill)."""
    context = np.concatenate([np.asarray(row.prompt_ids, dtype=np.int32), np.asarray(row.output_ids, dtype=np.int32)])
    start = len(row.prompt_ids)
    out = [(Draft(), Draft())]
    for t in range(1, len(row.output_ids)):
        budget = min(k_max, row.max_tokens - t - 1)
        ctx = context[: start + t]
        out.append((own_draft(ctx, budget, spec_factor, min_token_prob),
                    tree.draft(ctx, budget, spec_factor, min_token_prob)))
    return out


def _choose(own: Draft, shared: Draft, k: int) -> list[int]:
    """What the drafter proposes with budget k (the step's: the draft length, less near the row's
    max_tokens): the source with the larger score over its first k tokens (its own context on a
    tie), cut to k."""
    if sum(shared.probs[:k]) > sum(own.probs[:k]):
        return shared.tokens[:k]
    return own.tokens[:k]


def _walk(row: PlainRow, proposals: list[list[int]], k: int) -> tuple[list[int], list[int]]:
    """`acceptance.walk` over per-position proposals (already cut to k)."""
    accepted, proposed = [], []
    out = list(row.output_ids)
    t = 1
    while t < len(out):
        budget = max(0, min(k, row.max_tokens - t - 1))
        proposal = proposals[t][:budget]
        n = min(_agree(proposal, out[t : t + len(proposal)]), len(out) - t)
        accepted.append(n)
        proposed.append(len(proposal))
        t += n + 1
    return accepted, proposed

