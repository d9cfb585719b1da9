"""Counterfactual acceptance of TensorRT-LLM's NGram drafter, from rows decoded under "none"
(`TrtllmEngine.acceptance`; engine/acceptance.py has the records).

TensorRT-LLM's NGram drafter is not the torch engine's n-gram lookup (drafters.NgramIndex): it
keeps a pool of pattern -> candidate drafts that it fills as it drafts, and what it proposes
depends on the pool's rules and on the prefix lengths it was asked at. This module replays those
rules over a plain row's prompt and output, draft length by draft length, so calibration can price
every NGram draft length from the plain run without building one LLM per length.

The rules, read in tensorrt_llm/_torch/speculative/ngram.py (`NGramPoolManager.get_draft_tokens`,
`NGramDrafter.prepare_draft_tokens`; docs/engines/trtllm.md cites the copy and offsets):

- Each generation step of a request, before its verify forward, the drafter is asked with the
  request's tokens so far (prompt + output). With budget = prompt + max_tokens - 1 - len(tokens),
  a budget <= 0 proposes nothing and touches neither the pool nor the request's scan start.
- The pool is updated from tokens[start:]: for n from min(max_matching_ngram_size, len - 1) down
  to 1 and every position l, pattern = the n tokens at l, match = up to K (max_draft_len) tokens
  after it. A pattern not in the pool, or (is_keep_all false) a match longer than the one kept,
  replaces the pattern's entry; otherwise a new match first drops the kept matches shorter than it
  (iterating the OrderedSet while removing from it, which skips the match after each one removed)
  and is then appended.
- The proposal: the longest suffix pattern (n from the largest down) found in the pool; its oldest
  match (is_use_oldest) or newest, cut to the budget. Then start = max(0, len - (K + n_max - 1)).
- is_public_pool: one pool for every request of the LLM (never emptied); else one per request.

A step accepts the leading drafts equal to the output (greedy: the target commits exactly the
plain output) and commits them plus one token. A row that ended before max_tokens ended on its
end token, which is not among its output ids: the step that yields it is replayed too (it drafts,
and fills a public pool, like any other), with nothing proposed equal to it. (A row cut by a stop
string has no such step; the replay cannot tell it from one that ended on the end token.)
Greedy rows under a private pool are exact; a
public pool holds every earlier request of the LLM, which the replay cannot see, so it is an
estimate (`Acceptance.exact` False), as are sampled rows (their own tokens stand for the target's).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from batchspec.engine.acceptance import Acceptance, PlainRow, agree
from batchspec.engine.base import SpecConfig
from batchspec.engine.trtllm.translate import spec_options


@dataclass(frozen=True)
class NGramPoolRules:
    """NGramDecodingConfig's pool settings, defaults as in TensorRT-LLM 1.2's llm_args.py."""

    max_matching_ngram_size: int = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True


class NGramPool:
    """One NGramPoolManager's pools at draft length `k` (`max_total_draft_tokens`)."""

    def __init__(self, rules: NGramPoolRules, k: int) -> None:
        self.rules, self.k = rules, k
        self.pools: dict[int | None, dict[tuple[int, ...], list[tuple[int, ...]]]] = {}
        self.start: dict[int, int] = {}

    def draft(self, request: int, tokens: Sequence[int], max_sequence_length: int) -> list[int]:
        """What the drafter proposes for `request` whose tokens so far are `tokens`."""
        budget = max_sequence_length - 1 - len(tokens)
        if budget <= 0:
            return []
        pool = self.pools.setdefault(None if self.rules.is_public_pool else request, {})
        start = self.start.setdefault(request, 0)
        top = min(self.rules.max_matching_ngram_size, len(tokens) - 1)
        window = tokens[start:]
        for n in range(top, 0, -1):
            for at in range(len(window) - n):
                self._add(pool, tuple(window[at:at + n]), tuple(window[at + n:min(at + n + self.k, len(window))]))
        proposal: list[int] = []
        for n in range(top, 0, -1):
            matches = pool.get(tuple(tokens[len(tokens) - n:]))
            if matches:
                proposal = list(matches[0 if self.rules.is_use_oldest else -1])[:budget]
                break
        self.start[request] = max(0, len(tokens) - (self.k + self.rules.max_matching_ngram_size - 1))
        return proposal

    def _add(self, pool: dict, pattern: tuple[int, ...], match: tuple[int, ...]) -> None:
        kept = pool.get(pattern)
        if kept is None or (not self.rules.is_keep_all and len(match) > len(kept[0])):
            pool[pattern] = [match]
        elif match not in kept:
            i = 0  # removing while iterating: the match after each removed one is not looked at
            while i < len(kept):
                if len(kept[i]) < len(match):
                    del kept[i]
                i += 1
            kept.append(match)


@dataclass
class _Row:
    index: int
    row: PlainRow
    t: int = 1  # output tokens committed (the context step commits the first)
    accepted: list[float] = field(default_factory=list)
    proposed: list[int] = field(default_factory=list)

    @property
    def end(self) -> int:
        """Positions the row's steps cover: its output, and its end token if it ended early."""
        n = len(self.row.output_ids)
        return n + 1 if n < self.row.max_tokens else n

    @property
    def done(self) -> bool:
        return self.t >= self.end


def pool_rules(arm: SpecConfig) -> NGramPoolRules:
    """The NGram pool settings an arm's option file gives TensorRT-LLM (1.2's defaults where unset)."""
    options, default = spec_options(arm), NGramPoolRules()
    return NGramPoolRules(arm.ngram_size, *(bool(options.get(name, getattr(default, name)))
                                            for name in ("is_keep_all", "is_use_oldest", "is_public_pool")))


def pool_acceptance(rows: Sequence[PlainRow], arms: Sequence[SpecConfig], batch_size: int = 1,
                    ) -> tuple[dict[str, Acceptance], bool]:
    """The NGram arms among `arms`, each replayed with its option file's pool rules (one replay per
    distinct rules, every draft length at once), by label; and whether all are exact. ({}, False)
    where there is no NGram arm."""
    groups: dict[NGramPoolRules, list[SpecConfig]] = {}
    for arm in arms:
        if arm.method == "ngram":
            groups.setdefault(pool_rules(arm), []).append(arm)
    out: dict[str, Acceptance] = {}
    for rules, group in groups.items():
        by_k = trt_ngram_acceptance(rows, sorted({a.draft_len for a in group}), rules, batch_size)
        out.update((a.label, by_k[a.draft_len]) for a in group)
    return out, bool(out) and all(a.exact for a in out.values())


def trt_ngram_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int], rules: NGramPoolRules = NGramPoolRules(),
                         batch_size: int = 1) -> dict[int, Acceptance]:
    """Counterfactual steps of TensorRT-LLM's NGram drafter at every draft length in `draft_lens`
    (a fresh pool per length: each length is its own LLM). Rows run `batch_size` at a time in
    order, as the executor admits them: a row's first iteration is its context step, and each
    later one drafts for every row in generation, in admission order (which matters to a public
    pool only)."""
    exact = not rules.is_public_pool and all(r.greedy for r in rows)
    return {k: _replay(rows, k, rules, max(1, batch_size), exact) for k in draft_lens}


def _replay(rows: Sequence[PlainRow], k: int, rules: NGramPoolRules, batch_size: int, exact: bool) -> Acceptance:
    pool = NGramPool(rules, k)
    queue = deque(_Row(i, r) for i, r in enumerate(rows))
    active: list[_Row] = []
    finished: list[_Row] = []
    while queue or active:
        generation = [r for r in active if not r.done]
        finished += [r for r in active if r.done]
        active = list(generation)
        while queue and len(active) < batch_size:
            active.append(queue.popleft())  # its context step this iteration: no draft
        for r in generation:
            _step(pool, r)
    finished.sort(key=lambda r: r.index)
    out = Acceptance("ngram", k, exact=exact)
    out.steps = [r.accepted for r in finished]
    out.proposed = [r.proposed for r in finished]
    return out


def _step(pool: NGramPool, r: _Row) -> None:
    prompt, output = r.row.prompt_ids, r.row.output_ids
    tokens = list(prompt) + list(output[:r.t])
    proposal = pool.draft(r.index, tokens, len(prompt) + r.row.max_tokens)
    n = agree(proposal, output[r.t:])  # the end token (past the output) is never proposed
    r.accepted.append(n)
    r.proposed.append(len(proposal))
    r.t += n + 1
