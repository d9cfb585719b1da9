"""Counterfactual acceptance of constrained rows (structured output): what each arm would have
accepted on a row decoded under "none" with its grammar, for every draft length at once. The same
shape as `acceptance.ngram_acceptance` / `draft_acceptance` (rows -> {k: Acceptance}), with each
row's grammar: a fresh matcher at the start of its output (`TorchEngine.grammar(request)`), or
None for an unconstrained row, which is priced exactly as those functions price it.

On a constrained row the engine drafts, at a step starting at output position t, the tokens the
grammar forces from its state after output[:t] (F), then the drafter's proposal after them
(batchspec.engine.torch.drafters), all within the step's budget:
- n-gram lookup: the lookup over prompt + output[:t] + F, and the whole proposal cut at the first
  token the grammar forbids. All of it is a function of the plain row, so the counterfactual
  replays it: proposal P_t = (F + lookup)[:valid], offered[t] = len(P_t), run[t] = how far P_t
  agrees with output[t:]. Exact for greedy rows.
- draft model: it drafts under the grammar's mask, after F, and always proposes its budget. If F
  agrees with the output, its drafts are its masked argmax along the output: one teacher-forced
  forward of the draft, each position's logits masked by the grammar's state there; run[t] =
  f + the masked run at t + f. If F departs from the output at j, run[t] = j. Exact for greedy rows.
Greedy constrained output is what every arm commits (the engine is lossless under the mask), so
`acceptance.walk` steps through the row as for an unconstrained one. Sampled rows: the target's
(and the draft's) distributions are masked along the path, and the estimate is
`acceptance.expected_walk`'s (`Acceptance.exact` False), as for unconstrained rows.

The grammar's matchers are advanced here (each row's is used up): pass fresh ones.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from batchspec.engine.sampling import argmax
from batchspec.engine.torch.drafters import NgramIndex
from batchspec.predict.acceptance import (
    Acceptance,
    PlainRow,
    _acceptance,
    _agree,
    _ngram_accept_probs,
    _probs,
    accept_probs,
    greedy_runs,
    ngram_runs,
)


def constrained_ngram_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int], max_ngram: int,
                                 grammars: Sequence[object | None],
                                 target_logits: Sequence[torch.Tensor] | None = None) -> dict[int, Acceptance]:
    """Counterfactual steps of forced drafts + n-gram lookup (max_ngram 0: forced drafts alone)."""
    k_max = max(draft_lens)
    masked = _masked_logits(rows, grammars, target_logits)

    def row_model(r: int, row: PlainRow, p: torch.Tensor | None) -> tuple:
        grammar = grammars[r]
        if grammar is None:
            runs, offered = ngram_runs(row, max_ngram, k_max)
            return (runs if p is None else _ngram_accept_probs(row, p, max_ngram, k_max)), offered
        out = list(row.output_ids)
        proposals = _constrained_ngram_proposals(row, max_ngram, k_max, grammar)
        offered = [len(q) for q in proposals]
        if p is None:
            return [_agree(q, out[t:]) for t, q in enumerate(proposals)], offered
        return accept_probs(proposals, p, k_max), offered

    return _acceptance("ngram", rows, draft_lens, row_model, masked)


def constrained_draft_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int], draft_logits: Sequence[torch.Tensor],
                                 grammars: Sequence[object | None],
                                 target_logits: Sequence[torch.Tensor] | None = None) -> dict[int, Acceptance]:
    """Counterfactual steps of forced drafts + a draft model drafting under the grammar's mask,
    from the draft's teacher-forced logits (`TorchEngine.teacher_forced_logits`)."""
    k_max = max(draft_lens)
    masked = _masked_logits(rows, grammars, target_logits)

    def row_model(r: int, row: PlainRow, p: torch.Tensor | None) -> tuple:
        grammar, logits = grammars[r], draft_logits[r]
        out = list(row.output_ids)
        forced = [[] for _ in out]
        if grammar is not None:
            allowed, forced = _path(row, grammar)
            logits = logits.masked_fill(~allowed, float("-inf"))
        if p is None:
            model_runs = greedy_runs(argmax(logits).tolist(), out) + [0]
            runs = []
            for t, f in enumerate(forced):
                agree = _agree(f, out[t:])
                runs.append(agree + model_runs[min(t + len(f), len(out))] if agree == len(f) else agree)
            return runs, None
        overlap = torch.minimum(p, _probs(logits, row)).sum(-1).numpy()
        n = len(out)
        accept = np.zeros((max(n, 1), k_max))
        for t, f in enumerate(forced):  # draft j of a step at t sits at position t + j
            for j in range(min(k_max, n - t)):
                accept[t, j] = float(p[t + j, f[j]]) if j < len(f) else overlap[t + j]
        return accept, None

    return _acceptance("draft_target", rows, draft_lens, row_model, masked)


def _constrained_ngram_proposals(row: PlainRow, max_ngram: int, k_max: int, grammar) -> list[list[int]]:
    """The engine's proposal at every output position t (index 0 unused: prefill commits it):
    the grammar's forced tokens, the lookup after them, cut at the first forbidden token."""
    out = list(row.output_ids)
    index = NgramIndex(max_ngram, row.prompt_ids)
    proposals = [[]]
    for t in range(1, len(out)):
        grammar.consume(out[t - 1 : t])
        index.extend(out[t - 1 : t])
        forced = grammar.forced()[:k_max]
        proposal = forced + index.propose(k_max - len(forced), forced)
        proposals.append(proposal[: grammar.valid_prefix(proposal)])
    return proposals


def _path(row: PlainRow, grammar) -> tuple[torch.Tensor, list[list[int]]]:
    """Along a plain constrained row: the tokens its grammar allows at each output position
    [len, V] and the tokens it forces there."""
    out = list(row.output_ids)
    masks, forced = [], []
    for t in range(len(out)):
        masks.append(grammar.mask())
        forced.append(grammar.forced())
        if t + 1 < len(out):
            grammar.consume(out[t : t + 1])
    return (torch.stack(masks) if masks else torch.zeros(0, grammar.vocab, dtype=torch.bool)), forced


def _masked_logits(rows: Sequence[PlainRow], grammars: Sequence[object | None],
                   logits: Sequence[torch.Tensor] | None) -> list[torch.Tensor] | None:
    """The target's teacher-forced logits with each constrained sampled row's mask along its path
    (greedy rows need none: their runs come from the grammar directly). Fresh matchers are used
    up here only for sampled rows, whose row models then do not need them again."""
    if logits is None:
        return None
    out = list(logits)
    for r, (row, grammar) in enumerate(zip(rows, grammars)):
        if grammar is not None and not row.greedy:
            allowed, _ = _path(row, grammar.copy())
            out[r] = out[r].masked_fill(~allowed, float("-inf"))
    return out

