"""Counterfactual acceptance, the records and the walk every engine's replay shares: from a row
decoded under "none", the accepted length of every step an arm would have taken. No clock here.

A row decoded under "none" gives its prompt ids and output ids. Under greedy decoding every arm
commits exactly those output tokens (the engines are lossless); only how many tokens each target
step commits differs. So the accepted length of every step follows from the plain row and what the
drafter would have proposed at each output position t, which each engine replays for its own
drafters (`Engine.acceptance`: the torch engine's in engine/torch/counterfactual.py, TensorRT-LLM's
NGram pool in engine/trtllm/ngram_pool.py), beside the drafter whose rules it follows.

A step at t with budget b = min(k, max_tokens - t - 1) (the engine's cap) accepts
n = min(run[t], b) drafts (fewer if the row ends inside them), run[t] being how far the proposal
at t agrees with output[t:], and the next step starts at t + n + 1 (`walk`). Greedy and float32:
exact. Sampling (temperature > 0) has no single counterfactual: along the sampled path a draft
passes with the target's probability of it (against the drafter's distribution where it has one),
and a step's expected accepted length is sum_j prod_{i<=j} a_i (`expected_walk`): an estimate
(`Acceptance.exact` False), because after a rejection the real run leaves the sampled path.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


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

    @property
    def target_steps(self) -> float:
        return float(sum(len(s) for s in self.steps))

    @property
    def accepted_tokens(self) -> float:
        return float(sum(sum(s) for s in self.steps))

    @property
    def draft_tokens(self) -> int:
        return sum(sum(p) for p in self.proposed)


def agree(proposal: Sequence[int], truth: Sequence[int]) -> int:
    """How many leading tokens of `proposal` equal `truth`'s."""
    n = 0
    for a, b in zip(proposal, truth):
        if a != b:
            break
        n += 1
    return n


def greedy_runs(proposals: Sequence[int], output: Sequence[int]) -> list[int]:
    """run[t] = length of the stretch s = t, t+1, ... where proposals[s] == output[s] (a draft
    model's: its proposal j at a step starting at t only matters if 0..j-1 matched, in which case
    it saw exactly prompt + output[:t+j], its teacher-forced context)."""
    runs = [0] * (len(output) + 1)
    for s in range(len(output) - 1, -1, -1):
        runs[s] = runs[s + 1] + 1 if proposals[s] == output[s] else 0
    return runs[: len(output)]


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


def accept_probs(proposals: Sequence[Sequence[int]], p, k: int) -> np.ndarray:
    """accept[t, j] = the target's probability `p` ([positions, vocab]) at position t+j of the j-th
    token proposed at t (`proposals[t]`, index 0 unused: prefill commits it), the first k of each:
    the sampled estimate for a drafter without a distribution of its own."""
    n = len(proposals)
    accept = np.zeros((max(n, 1), k))
    for t, proposal in enumerate(proposals):
        for j, d in enumerate(proposal[:k]):
            if t + j < n:
                accept[t, j] = float(p[t + j, d])
    return accept
