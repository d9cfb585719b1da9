"""Suffix drafting (SuffixDecoding, Oliaro et al., arXiv 2411.04975): drafts from the outputs of
rows already finished on this worker for the same scope (a shard key, `Request.draft_scope`), and
from the row's own prompt and output so far. The rule and the tree are in suffix_tree.py; this
module holds one worker's trees (`SuffixTrees`, owned by its engine) and the drafter over them.

The drafter is deterministic (no draft distribution): the accept rule treats it as n-gram lookup's,
so greedy output is plain decoding's and sampled output follows the target's distribution. On a
row with a grammar (structured output) it drafts as NgramDrafter does (drafters.py): the tokens
the grammar forces first, then the draft over the context followed by them, the whole proposal cut
at the first token the grammar forbids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from batchspec.engine.base import MIN_TOKEN_PROB_DEFAULT, SPEC_FACTOR_DEFAULT
from batchspec.engine.torch.drafters import Drafts
from batchspec.engine.torch.suffix_tree import Draft, SuffixTree, own_draft


# -- one worker's trees, and the drafter over them ------------------------------------------------


EVICT_TO = 0.9  # past the cap, the oldest rows go until the trees hold this share of it


class SuffixTrees:
    """The trees of one worker (its engine owns them), one per scope, kept across generate calls
    and capped in memory together: past `cap_bytes` the oldest rows (of any scope) are evicted
    until EVICT_TO of the cap is held."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self.trees: dict[str, SuffixTree] = {}
        self.serial = 0  # rows added so far: orders rows across scopes, oldest first
        self.evicted = 0  # rows evicted so far

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.trees.values())

    def usage(self, scope: str | None) -> tuple[int, int]:
        """(bytes, rows) of one scope's tree."""
        tree = self.trees.get(scope) if scope is not None else None
        return (tree.nbytes, tree.rows) if tree is not None else (0, 0)

    def copy_of(self, scope: str) -> SuffixTree:
        """A copy of one scope's tree (an empty tree where it has none): what a counterfactual
        replays from and grows, leaving the worker's own untouched."""
        tree = self.trees.get(scope)
        return tree.copy() if tree is not None else SuffixTree()

    def add(self, scope: str, row_id: str, tokens: Sequence[int]) -> None:
        """A finished row's output joins its scope's tree (then the cap is enforced)."""
        if not len(tokens):
            return
        self.trees.setdefault(scope, SuffixTree()).add(row_id, tokens, self.serial)
        self.serial += 1
        if self.nbytes > self.cap_bytes:
            self._evict(int(self.cap_bytes * EVICT_TO))

    def forget(self, scope: str, ids: set[str]) -> None:
        """Remove rows about to run again from their scope's tree."""
        tree = self.trees.get(scope)
        if tree is not None:
            tree.remove(ids)

    def _evict(self, target: int) -> None:
        """Evict the oldest rows of any scope, first in first out, until `target` bytes are held:
        the rows are chosen first (at each tree's bytes a row) and each tree rebuilt once."""
        while self.trees and self.nbytes > target:
            excess = self.nbytes - target
            rows = sorted((serial, scope) for scope, tree in self.trees.items() for serial in tree.serials())
            size = {scope: tree.nbytes / tree.rows for scope, tree in self.trees.items()}
            count: dict[str, int] = {}
            for _, scope in rows:
                count[scope] = count.get(scope, 0) + 1
                excess -= size[scope]
                if excess <= 0:
                    break
            for scope, n in count.items():
                self.trees[scope].evict_oldest(n)
                self.evicted += n
            self.trees = {k: t for k, t in self.trees.items() if t.rows}


@dataclass
class Lookups:
    """Per request index: the suffix drafter's lookups and those the shared tree answered."""

    lookups: dict[int, int] = field(default_factory=dict)
    tree_drafts: dict[int, int] = field(default_factory=dict)


class SuffixDrafter:
    """Follows the engine's target batch (drafters.py's interface); proposes `Draft`s from the row's
    scope's tree and the row's own context. `scopes[i]` is request i's scope (None: no tree)."""

    def __init__(self, trees: SuffixTrees, scopes: Sequence[str | None], lookups: Lookups,
                 max_spec_factor: float = SPEC_FACTOR_DEFAULT, min_token_prob: float = MIN_TOKEN_PROB_DEFAULT) -> None:
        self.trees, self.scopes, self.counts = trees, scopes, lookups
        self.max_spec_factor, self.min_token_prob = max_spec_factor, min_token_prob

    def admit(self, rows: list, device: torch.device) -> None:
        pass

    def propose(self, rows: list, budgets: list[int], vocab: int, ahead: list[list[int]] | None = None) -> Drafts:
        """Per row: the tokens its grammar forces (`ahead`), then the draft over its context
        followed by them, within its budget; on a constrained row the whole proposal is cut at the
        first token the grammar forbids (as NgramDrafter's)."""
        out = []
        for b, (r, k) in enumerate(zip(rows, budgets)):
            forced = ahead[b] if ahead else []
            context = r.context + forced if forced else r.context
            proposal = forced + self.draft(r.index, context, k - len(forced)).tokens
            if r.grammar is not None:
                proposal = proposal[: r.grammar.valid_prefix(proposal)]
            out.append(proposal)
        return Drafts(out, None)

    def draft(self, index: int, context: Sequence[int], budget: int) -> Draft:
        """The draft for request `index` at `context` (prompt + output so far), counted."""
        if budget <= 0:
            return Draft()
        ctx = np.asarray(context, dtype=np.int32)
        own = own_draft(ctx, budget, self.max_spec_factor, self.min_token_prob)
        scope = self.scopes[index]
        tree = self.trees.trees.get(scope) if scope is not None else None
        shared = tree.draft(ctx, budget, self.max_spec_factor, self.min_token_prob) if tree is not None else Draft()
        best = shared if shared.score > own.score else own
        self.counts.lookups[index] = self.counts.lookups.get(index, 0) + 1
        if best.source == "tree":
            self.counts.tree_drafts[index] = self.counts.tree_drafts.get(index, 0) + 1
        return best

    def commit(self, num_accepted: torch.Tensor, drafts: Drafts, next_tokens: list[int]) -> None:
        pass

    def select(self, keep: list[int]) -> None:
        pass

    def compact(self) -> None:
        pass
