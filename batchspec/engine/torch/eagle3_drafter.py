"""The EAGLE-3 arm's drafter: a head (eagle3.py) chain-drafting for each row of the decode loop.

The head reads the target's hidden states after every committed token. They come from the
target's own forwards: the decode loop hands the drafter's `capture` to its target, whose prefill
and verify leave each row the states of the slots it kept (decode.Row.hidden:
the prompt's after a prefill, the pending token's and the accepted drafts' after a verify). At
its next proposal the drafter extends the row's `Chain` (the head's keys over the context) by
them, so no second target pass runs while a row decodes under the arm. A row the drafter meets
without them (rows in flight when calibration switches to the arm) is read once by a target
forward over its context (draft time, as a draft model's prefill of such rows is).

Drafts are chains of up to k tokens from the row's last position, drafted for the batch's rows
at once (eagle3_chains.draft_rows: one head forward per depth, contexts padded). A greedy row takes the head's
argmax; in a batch with sampled rows each draft is drawn from the head's distribution over its
draft vocabulary (the row's temperature and top_p, its own generator), and that distribution,
placed on the target ids the draft vocabulary maps to, is the q the accept rule reads
(sampling.accept_reject): output follows the target's distribution whatever the head proposes.
A row with a grammar drafts after the tokens it forces (q one-hot on them), under its mask, as
the draft model does (drafters.ModelDrafter); its matcher is rolled back after.

Like every drafter it follows the rows through admit / propose / commit / select / compact; its
state is keyed by row (as drafters.NgramDrafter's), so only `propose` does anything.
"""

from __future__ import annotations

import torch

from batchspec.engine.sampling import argmax, probs_from_logits, sample_from
from batchspec.engine.torch.drafters import Drafts
from batchspec.engine.torch.eagle3 import Eagle3Head
from batchspec.engine.torch.eagle3_chains import Chain, draft_rows
from batchspec.engine.torch.eagle3_states import HiddenCapture


class Eagle3Drafter:
    def __init__(self, head: Eagle3Head, model, capture: HiddenCapture) -> None:
        self.head, self.model, self.capture = head, model, capture
        self.chains: dict[int, tuple[object, Chain]] = {}  # id(row) -> (the row, its chain)
        self.targets = head.target_ids()

    def admit(self, rows: list, device: torch.device) -> None:
        pass  # a row's chain is built at its first proposal, from the states its prefill left it

    def propose(self, rows: list, budgets: list[int], vocab: int, ahead: list[list[int]] | None = None) -> Drafts:
        held, self.chains = self.chains, {}
        sampled = not all(r.params.greedy for r in rows)
        probs = torch.zeros(len(rows), max(budgets), vocab, device=self.targets.device) if sampled else None
        chains, pickers = [], []
        for b, row in enumerate(rows):
            chains.append(self.follow(row, held.get(id(row))))
            self.chains[id(row)] = (row, chains[-1])
            pickers.append(Picker(self, row, ahead[b] if ahead else [], probs[b] if sampled else None))
        out = draft_rows(chains, budgets, lambda b, i, logits: pickers[b].pick(i, logits))
        for picker in pickers:
            picker.done()
        return Drafts(out, probs)

    def follow(self, row, held: tuple[object, Chain] | None) -> Chain:
        """The row's chain, extended to every committed token but the last (whose hidden state
        the next verify computes): by the states the target left the row, else by a target
        forward over its context."""
        n = len(row.context) - 1
        chain = held[1] if held is not None and held[0] is row and held[1].length <= n else Chain(self.head)
        seen, start = row.hidden, chain.length
        if seen is None or not seen.start <= start or seen.start + len(seen.states) < n:
            chain, start, states = Chain(self.head), 0, self.read(row.context[:n])
        else:
            states = seen.states[start - seen.start : n - seen.start]
        row.hidden = None
        if n > start:
            chain.extend(states, row.context[start + 1 : n + 1])
        return chain

    def read(self, tokens: list[int]) -> torch.Tensor:
        """The target's hidden states after each of `tokens` [len, 3H], from one forward."""
        ids = torch.tensor([tokens], device=self.targets.device)
        with self.capture.reading():
            self.model.get_decoder()(input_ids=ids)
        return self.capture.take()[0]

    def commit(self, num_accepted: torch.Tensor, drafts: Drafts, next_tokens: list[int]) -> None:
        pass  # the target left each row the states of what it kept: `follow` reads them

    def select(self, keep: list[int]) -> None:
        pass

    def compact(self) -> None:
        pass


class Picker:
    """One row's choice of its drafts from the head's logits: `forced` first (q one-hot on them),
    then under the row's grammar mask; the argmax for a greedy row, else a draw from the head's
    distribution (the row's temperature, top_p and generator), written into q [K, V] (sampled
    batches) over the target ids the draft vocabulary maps to. `done` rolls the grammar back."""

    def __init__(self, drafter: Eagle3Drafter, row, forced: list[int], q: torch.Tensor | None) -> None:
        self.targets, self.row, self.forced, self.q = drafter.targets, row, forced, q
        self.grammar, self.moved = row.grammar, 0
        self.temperature = torch.tensor([row.params.temperature], device=self.targets.device)
        self.top_p = torch.tensor([row.params.top_p], device=self.targets.device)

    def pick(self, i: int, logits: torch.Tensor) -> int | None:
        q = self.q
        if i < len(self.forced):
            token = self.forced[i]
            if q is not None:
                q[i, token] = 1.0
        else:
            if self.grammar is not None:
                allowed = self.grammar.mask().to(logits.device)[self.targets]
                if not bool(allowed.any()):  # nothing the head knows is allowed here
                    return None
                logits = logits.masked_fill(~allowed, float("-inf"))
            if q is None:
                token = int(self.targets[argmax(logits)])
            else:
                p = probs_from_logits(logits[None], self.temperature, self.top_p)
                token = int(self.targets[sample_from(p, self.row.uniform()[None].to(p.device))[0]])
                q[i, self.targets] = p[0]
        if self.grammar is not None:
            if self.grammar.advance(token):
                self.moved += 1
            else:  # past the output's end: the rest drafts unmasked (never output)
                self.grammar = None
        return token

    def done(self) -> None:
        if self.moved:
            self.row.grammar.rollback(self.moved)
