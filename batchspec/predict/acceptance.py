"""Counterfactual acceptance: from a row decoded under "none", the accepted length of every step
an arm would have taken, for every draft length at once. No clock here (the engine measures).

A row decoded under "none" gives its prompt ids and output ids. Under greedy decoding every arm
commits exactly those output tokens (the engine is lossless); only how many tokens each target
step commits differs. So the accepted length of every step follows from the plain row:
- n-gram lookup: at output position t the drafter sees prompt + output[:t] and proposes what
  followed the latest earlier match (`drafters.NgramIndex`, the engine's own drafter's). Its
  proposal at draft length k is the first k tokens of its proposal at any longer length, so
  one lookup per position serves every k.
- draft model: the draft's greedy proposal j at a step starting at t only matters if proposals
  0..j-1 matched output[t..t+j-1], in which case the draft saw exactly prompt + output[:t+j].
  So one teacher-forced forward of the draft over prompt + output gives the proposal g[s] it
  would make at every position s, and a step at t accepts the stretch s = t, t+1, ... with
  g[s] == output[s].
A step at t with budget b = min(k, max_tokens - t - 1) (the engine's cap) accepts
n = min(run[t], b) drafts (fewer if the row ends inside them) and the next step starts at
t + n + 1. Greedy and float32: exact (tests/predict/test_acceptance.py checks step-by-step
equality with the engine running the arm). Sampling (temperature > 0) has no single
counterfactual: along the sampled path position s passes with sum_v min(p_s(v), q_s(v)) (p the
target's, q the draft's distribution; q one-hot on the proposal for n-gram lookup), and a step's
expected accepted length is sum_j prod_{i<=j} a_i: an estimate (`Acceptance.exact` False),
because after a rejection the real run leaves the sampled path.

Both drafters share one per-row loop (`_acceptance`): a drafter only says, per row, how far its
proposals agree with the plain output (greedy) or how likely each draft passes (sampled).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from batchspec.engine.sampling import argmax, probs_from_logits
from batchspec.engine.torch.drafters import NgramIndex


@dataclass(frozen=True)
class PlainRow:
    """One row as plain decoding produced it. Its ids are kept as 4-byte ints (`array('i')`), one
    type whatever the caller passed (a request's tuple, a completion's list), and compact: a Python
    list of token ids takes about 36 bytes a token (a pointer and an int object above 256), and a
    call may hold many rows of long prompts."""

    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        for name in ("prompt_ids", "output_ids"):
            ids = getattr(self, name)
            if not isinstance(ids, array):
                object.__setattr__(self, name, array("i", ids))

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Acceptance:
    """Counterfactual steps of one arm (method, draft length) on a list of rows.

    `steps[r]` holds, for each target step row r would have taken, the drafts accepted (expected,
    a float, when `exact` is False); `proposed[r]` the drafts proposed at each step. Its rates are
    engine.base's `acceptance_rate(accepted_tokens, draft_tokens)` and
    `mean_accepted_len(accepted_tokens, target_steps)`, as for every record that reports them."""

    method: str
    draft_len: int
    steps: list[list[float]] = field(default_factory=list)
    proposed: list[list[int]] = field(default_factory=list)
    exact: bool = True

    def extend(self, other: "Acceptance") -> "Acceptance":
        """These rows followed by `other`'s (the same arm); returns self."""
        self.steps += other.steps
        self.proposed += other.proposed
        self.exact = self.exact and other.exact
        return self

    @property
    def target_steps(self) -> float:
        return float(sum(len(s) for s in self.steps))

    @property
    def accepted_tokens(self) -> float:
        return float(sum(sum(s) for s in self.steps))

    @property
    def draft_tokens(self) -> int:
        return sum(sum(p) for p in self.proposed)



# -- runs: how far each position's proposal agrees with the plain output --------------------------


def ngram_runs(row: PlainRow, max_ngram: int, k_max: int) -> tuple[list[int], list[int]]:
    """(run, offered) per output position t >= 1: how many leading tokens of the n-gram proposal
    made at t equal output[t:], and how many tokens it offered (the lookup may find fewer)."""
    out = list(row.output_ids)
    runs, offered = [0], [0]
    for t, proposal in enumerate(_ngram_proposals(row, max_ngram, k_max), 1):
        runs.append(_agree(proposal, out[t : t + k_max]))  # a proposal holds at most k_max tokens
        offered.append(len(proposal))
    return runs, offered


def _ngram_proposals(row: PlainRow, max_ngram: int, k_max: int):
    """The n-gram lookup's proposal at every output position t >= 1 of a plain row, over its
    prompt and output[:t] (`NgramIndex`, the engine drafter's: the sequence indexed once)."""
    out = list(row.output_ids)
    index = NgramIndex(max_ngram, row.prompt_ids)
    for t in range(1, len(out)):
        index.extend(out[t - 1 : t])
        yield index.propose(k_max)


def greedy_runs(proposals: Sequence[int], output: Sequence[int]) -> list[int]:
    """run[t] = length of the stretch s = t, t+1, ... where proposals[s] == output[s]."""
    runs = [0] * (len(output) + 1)
    for s in range(len(output) - 1, -1, -1):
        runs[s] = runs[s + 1] + 1 if proposals[s] == output[s] else 0
    return runs[: len(output)]


def _agree(proposal: Sequence[int], truth: Sequence[int]) -> int:
    n = 0
    for a, b in zip(proposal, truth):
        if a != b:
            break
        n += 1
    return n


# -- steps: walk a row with one draft length -----------------------------------------------------


def walk(row: PlainRow, runs: Sequence[int], offered: Sequence[int] | None, k: int) -> tuple[list[int], list[int]]:
    """The accepted and proposed counts of every step row would take with draft length k.

    `offered[t]` caps what a drafter proposes at t (None: a draft model always proposes the budget)."""
    accepted, proposed = [], []
    out_len = len(row.output_ids)
    t = 1  # prefill commits the first token
    while t < out_len:
        budget = max(0, min(k, row.max_tokens - t - 1))
        size = budget if offered is None else min(budget, offered[t])
        n = min(runs[t], size, out_len - t)
        accepted.append(n)
        proposed.append(size)
        t += n + 1
    return accepted, proposed


def expected_walk(row: PlainRow, accept: np.ndarray, offered: Sequence[int] | None, k: int) -> tuple[list[float], list[int]]:
    """Sampling estimate: accept[t, j] is the probability that draft j of a step at t passes given
    drafts before it passed; a step's expected accepted length is sum_j prod_{i<=j} accept[t, i].
    The walk advances by the expected committed tokens (positions rounded down)."""
    expected, proposed = [], []
    out_len = len(row.output_ids)
    t = 1.0
    while t < out_len:
        i = int(t)
        budget = max(0, min(k, row.max_tokens - i - 1))
        size = budget if offered is None else min(budget, offered[i])
        n = float(np.cumprod(accept[i, :size]).sum()) if size else 0.0
        n = min(n, out_len - i)
        expected.append(n)
        proposed.append(size)
        t += n + 1.0
    return expected, proposed


def _probs(logits: torch.Tensor, row: PlainRow) -> torch.Tensor:
    n = logits.shape[0]
    return probs_from_logits(logits, torch.full((n,), row.temperature), torch.full((n,), row.top_p))


# -- the entry points: one per drafter, over one shared per-row loop --------------------------------

# What a drafter says about one row: (runs, offered) for a greedy row (`walk`), or (accept, offered)
# for a sampled one (`expected_walk`); `p` is the target's distribution along the row's path
# (None for a greedy row), `offered` None when the drafter always proposes the budget.
RowModel = Callable[[int, PlainRow, "torch.Tensor | None"], tuple]


def ngram_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int], max_ngram: int,
                     target_logits: Sequence[torch.Tensor] | None = None) -> dict[int, Acceptance]:
    """Counterfactual steps of n-gram lookup at every draft length in `draft_lens`.

    Greedy rows are exact. Sampled rows need `target_logits` (the engine's teacher-forced logits
    of the target) and give an estimate: draft j of the proposal at t passes with p_{t+j}(draft)."""
    k_max = max(draft_lens)

    def row_model(r: int, row: PlainRow, p: torch.Tensor | None) -> tuple:
        runs, offered = ngram_runs(row, max_ngram, k_max)
        return (runs if p is None else _ngram_accept_probs(row, p, max_ngram, k_max)), offered

    return _acceptance("ngram", rows, draft_lens, row_model, target_logits)


def draft_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int], draft_logits: Sequence[torch.Tensor],
                     target_logits: Sequence[torch.Tensor] | None = None) -> dict[int, Acceptance]:
    """Counterfactual steps of a draft model at every draft length, from its teacher-forced logits.

    Greedy rows are exact: the proposal at s is the draft's argmax there. Sampled rows need the
    target's logits too: position s passes with sum_v min(p_s(v), q_s(v)) (an estimate)."""
    k_max = max(draft_lens)

    def row_model(r: int, row: PlainRow, p: torch.Tensor | None) -> tuple:
        if p is None:
            return greedy_runs(argmax(draft_logits[r]).tolist(), row.output_ids), None
        overlap = torch.minimum(p, _probs(draft_logits[r], row)).sum(-1).numpy()
        n = len(row.output_ids)
        accept = np.zeros((max(n, 1), k_max))
        for j in range(k_max):  # draft j of a step at t sits at position t + j
            accept[: max(0, n - j), j] = overlap[j:n]
        return accept, None

    return _acceptance("draft_target", rows, draft_lens, row_model, target_logits)


def proposal_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int],
                        proposals: Sequence[Sequence[int]]) -> dict[int, Acceptance]:
    """Counterfactual steps of a draft model on greedy rows, from its greedy proposal at every
    output position (`proposals[r][s]`: its argmax after prompt + output[:s]; exact)."""

    def row_model(r: int, row: PlainRow, p: torch.Tensor | None) -> tuple:
        assert p is None, "a sampled row needs the draft's distribution: draft_acceptance"
        return greedy_runs(proposals[r], row.output_ids), None

    return _acceptance("draft_target", rows, draft_lens, row_model, None)


def _acceptance(method: str, rows: Sequence[PlainRow], draft_lens: Sequence[int], row_model: RowModel,
                target_logits: Sequence[torch.Tensor] | None) -> dict[int, Acceptance]:
    """The per-row loop both drafters share: a greedy row walks its exact runs at every draft
    length, a sampled row the expected walk over its pass probabilities (and marks the arm an
    estimate)."""
    out = {k: Acceptance(method, k) for k in draft_lens}
    for r, row in enumerate(rows):
        p = None
        if not row.greedy:
            assert target_logits is not None, "sampled rows need the target's teacher-forced logits"
            p = _probs(target_logits[r], row)
        model, offered = row_model(r, row, p)
        step = walk if row.greedy else expected_walk
        for k in draft_lens:
            accepted, proposed = step(row, model, offered, k)
            out[k].steps.append(accepted)
            out[k].proposed.append(proposed)
            out[k].exact = out[k].exact and row.greedy
    return out


def _ngram_accept_probs(row: PlainRow, p: torch.Tensor, max_ngram: int, k_max: int) -> np.ndarray:
    """accept[t, j] for the n-gram lookup's proposals along the row (path context)."""
    return accept_probs([[], *_ngram_proposals(row, max_ngram, k_max)], p, k_max)


def accept_probs(proposals: Sequence[Sequence[int]], p: torch.Tensor, k: int) -> np.ndarray:
    """accept[t, j] = the target's probability `p` at position t+j of the j-th token proposed at t
    (`proposals[t]`, index 0 unused: prefill commits it), the first k of each: the sampled estimate."""
    n = len(proposals)
    accept = np.zeros((max(n, 1), k))
    for t, proposal in enumerate(proposals):
        for j, d in enumerate(proposal[:k]):
            if t + j < n:
                accept[t, j] = float(p[t + j, d])
    return accept
