"""Drafters: who proposes the tokens the target verifies.

- `NgramDrafter` (TensorRT-LLM's `NGram`, a.k.a. prompt lookup): finds the latest earlier
  occurrence of the sequence's last n tokens (n = max_matching_ngram_size down to 1) in the
  prompt and output so far, and proposes what followed it. No model, no probabilities: it is a
  deterministic drafter (draft_probs None in the accept rule).
- `ModelDrafter` (`Draft_Target`): a smaller causal LM with the same tokenizer, run
  autoregressively on its own `kv.Batch`, sampling with the request's own temperature/top_p and
  generator so that its distribution q can be handed to the accept rule.

A drafter keeps per-row state in the same row order as the engine's target batch, and follows
it through `admit` (new rows), `commit` (what the target kept), `select` (finished rows gone) and
`compact` (the batch's cache compacted).

On a row with a grammar (structured output), `propose` gets `ahead`: the tokens the grammar
forces next, which lead the row's drafts; the drafter proposes what follows them. N-gram lookup
looks up after them and its proposal is cut at the first token the grammar forbids; the draft
model drafts under the grammar's mask, so its drafts are allowed up to the output's end (it
always proposes its budget, as without a grammar).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from batchspec.engine.sampling import argmax, probs_from_logits, sample_from
from batchspec.engine.torch.kv import Batch, prefill, prefill_waste


@dataclass
class Drafts:
    tokens: list[list[int]]  # per row, 0..k proposals
    probs: torch.Tensor | None  # [B, K, V] drafter distribution, None for deterministic drafters


KEY_BITS = 32  # bits per token in an n-gram's key (`NgramIndex`)
BULK = 16  # tokens added at once from which `NgramIndex.extend` indexes n by n (`_bulk`)


class NgramIndex:
    """A growing sequence with the latest earlier start of each of its n-grams (n = 1 ..
    max_ngram): `propose(k)` finds what a scan of the whole sequence would (the scan is the tests'
    reference), without the scan, whose cost grows with the context on every decode step
    (docs/engines/torch.md, "Drafters"). The index costs a dict entry per token and n when a
    token is added, keyed by the n-gram's tokens packed into one int (KEY_BITS each:
    exact for any vocabulary under 2^32), and a dict lookup per n to propose. (TensorRT-LLM's
    NGram keeps such a pool per request too, updated as tokens are accepted:
    tensorrt_llm/_torch/speculative/ngram.py, NGramPoolManager.)"""

    __slots__ = ("max_ngram", "tokens", "latest", "owner")

    def __init__(self, max_ngram: int, tokens=(), owner: object = None) -> None:
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self.latest: list[dict[int, int]] = [{} for _ in range(max_ngram + 1)]  # n -> n-gram (its key) -> its latest start
        self.owner = owner  # the row whose context this follows (NgramDrafter)
        self.extend(tokens)

    def extend(self, new) -> None:
        """Append `new`; each n-gram that now lies wholly before the last token becomes findable
        (`propose` matches within the sequence less its last token). Many tokens at once (a
        prompt: the counterfactual indexes one per row, the drafter one per row it admits) go
        n by n (`_bulk`)."""
        if len(new) >= BULK:
            self._bulk(new)
            return
        tokens, latest, top = self.tokens, self.latest, self.max_ngram
        for token in new:
            tokens.append(int(token))
            last, key = len(tokens) - 1, 0
            for n in range(1, top + 1):
                start = last - n
                if start < 0:
                    break
                key |= tokens[start] << (KEY_BITS * (n - 1))  # tokens[start:last], the latest in the low bits
                latest[n][key] = start

    def _bulk(self, new) -> None:
        """`extend`'s result, computed per n over the whole run of n-grams that become findable:
        their keys by list comprehensions, and one dict update each, in order, so the latest
        start wins as token by token. Token by token, indexing a long prompt was most of a row's
        counterfactual acceptance at short outputs (`BULK`; docs/engines/torch.md, "Drafters")."""
        tokens = self.tokens
        first = len(tokens)  # an n-gram starting at s is findable once s + n <= len(tokens) - 1
        tokens.extend(map(int, new))
        end = len(tokens) - 1
        for n in range(1, self.max_ngram + 1):
            lo = max(0, first - n)  # the first start not findable before
            count = end - n - lo + 1
            if count <= 0:
                break
            keys = tokens[lo : lo + count]
            for i in range(1, n):  # tokens[s] in the high bits, tokens[s + n - 1] in the low, as `extend` keys them
                keys = [key << KEY_BITS | t for key, t in zip(keys, tokens[lo + i : lo + i + count])]
            self.latest[n].update(zip(keys, range(lo, lo + count)))

    def propose(self, k: int, extra: Sequence[int] = ()) -> list[int]:
        """Up to k tokens that followed the latest earlier match of the last n tokens (in the
        sequence less its last token), n from max_ngram down. With `extra`, the lookup is that of
        the sequence followed by `extra` (the tokens a grammar forces next), nothing indexed."""
        if extra:
            return self._propose_after(list(extra), k)
        tokens = self.tokens
        if k <= 0:
            return []
        top = min(self.max_ngram, len(tokens) - 1)
        keys, key = [0] * (top + 1), 0
        for n in range(1, top + 1):  # the last n tokens as `extend` keys them
            key |= tokens[-n] << (KEY_BITS * (n - 1))
            keys[n] = key
        for n in range(top, 0, -1):
            start = self.latest[n].get(keys[n])
            if start is not None:
                return tokens[start + n : start + n + k]
        return []

    def _propose_after(self, extra: list[int], k: int) -> list[int]:
        """`propose(k)` over tokens + extra: the starts that extra makes findable are scanned
        (the latest first), the rest come from the index."""
        tokens = self.tokens + extra
        if k <= 0:
            return []
        top = min(self.max_ngram, len(tokens) - 1)
        for n in range(top, 0, -1):
            key = tokens[-n:]
            for start in range(len(tokens) - 1 - n, max(len(self.tokens) - n, 0) - 1, -1):
                if tokens[start : start + n] == key:
                    return tokens[start + n : start + n + k]
            packed = 0
            for i, token in enumerate(reversed(key)):
                packed |= token << (KEY_BITS * i)
            start = self.latest[n].get(packed)
            if start is not None:
                return tokens[start + n : start + n + k]
        return []


class NgramDrafter:
    """Each row's context in an `NgramIndex`, built at the row's first proposal and extended by
    what the row committed since (its draft time; nothing at admission, as before the index)."""

    def __init__(self, max_ngram: int) -> None:
        self.max_ngram = max_ngram
        self.index: dict[int, NgramIndex] = {}  # id(row) -> the index following its context

    def admit(self, rows: list, device: torch.device) -> None:
        pass

    def propose(self, rows: list, budgets: list[int], vocab: int, ahead: list[list[int]] | None = None) -> Drafts:
        held, self.index = self.index, {}
        out = []
        for b, (r, k) in enumerate(zip(rows, budgets)):
            index = held.get(id(r))
            if index is None or index.owner is not r or len(index.tokens) > len(r.context):
                index = NgramIndex(self.max_ngram, owner=r)
            index.extend(r.context[len(index.tokens):])
            self.index[id(r)] = index
            forced = ahead[b] if ahead else []
            proposal = forced + index.propose(k - len(forced), forced)
            if r.grammar is not None:  # cut at the first token the grammar forbids
                proposal = proposal[: r.grammar.valid_prefix(proposal)]
            out.append(proposal)
        return Drafts(out, None)

    def commit(self, num_accepted: torch.Tensor, drafts: Drafts, next_tokens: list[int]) -> None:
        pass

    def select(self, keep: list[int]) -> None:
        pass

    def compact(self) -> None:
        pass


class ModelDrafter:
    """Drafts with a small model. Its cache lags the target's by the tokens in `pending`."""

    def __init__(self, model, pad_id: int) -> None:
        self.model = model
        self.pad_id = pad_id
        self.batch: Batch | None = None
        self.pending: list[list[int]] = []  # per row: committed tokens not yet in the draft cache

    def admit(self, rows: list, device: torch.device) -> None:
        """Prefill the draft model on the new rows' prompts (everything but the first output token)."""
        fresh, _ = prefill(self.model, [r.context[:-1] for r in rows], self.pad_id, device, prefill_waste(device))
        if self.batch is None:
            self.batch = fresh
        else:
            self.batch.extend(fresh)
        self.pending += [[r.context[-1]] for r in rows]

    def propose(self, rows: list, budgets: list[int], vocab: int, ahead: list[list[int]] | None = None) -> Drafts:
        """Up to budgets[b] drafts per row: the row's `ahead` tokens (fed in the first forward, with
        the pending ones), then the model's. Greedy rows take the draft's argmax, and a batch of
        greedy rows keeps no distributions (the accept rule needs none: q is one-hot on the draft);
        an ahead token's q is one-hot on it. A row with a grammar drafts under its mask."""
        ahead = ahead or [[] for _ in rows]
        own = [b - len(a) for b, a in zip(budgets, ahead)]  # the model's drafts per row
        K = max(own)
        B = len(rows)
        device = self.batch.device
        greedy = all(r.params.greedy for r in rows)
        tokens: list[list[int]] = [list(a) for a in ahead]
        probs = None
        if not greedy:
            temps = torch.tensor([r.params.temperature for r in rows], device=device)
            top_ps = torch.tensor([r.params.top_p for r in rows], device=device)
            probs = torch.zeros(B, max(budgets), vocab, device=device)
            for b, a in enumerate(ahead):
                probs[b, torch.arange(len(a)), torch.tensor(a, dtype=torch.long)] = 1.0
        grammars = [r.grammar if r.grammar is not None and r.grammar.consume(a) else None for r, a in zip(rows, ahead)]
        moved = [len(a) if g is not None else 0 for g, a in zip(grammars, ahead)]  # tokens each matcher consumed
        feed = [p + a for p, a in zip(self.pending, ahead)]
        for i in range(K):
            logits = fit_vocab(self.model_logits(feed), vocab)  # [B, V]
            for b, g in enumerate(grammars):
                if g is not None and i < own[b]:
                    logits[b].masked_fill_(~g.mask().to(device), float("-inf"))
            if greedy:
                picked = argmax(logits).tolist()
            else:
                q = probs_from_logits(logits, temps, top_ps)
                picked = sample_from(q, torch.stack([r.uniform() for r in rows]).to(device)).tolist()
            for b in range(B):
                if i < own[b]:
                    tokens[b].append(picked[b])
                    if probs is not None:
                        probs[b, len(ahead[b]) + i] = q[b]
                    if grammars[b] is not None:
                        if grammars[b].advance(picked[b]):
                            moved[b] += 1
                        else:  # past the output's end: the rest drafts unmasked (never output)
                            grammars[b] = None
            # A row past its budget feeds padding, which `commit` drops with the rejected drafts.
            feed = [[picked[b]] if i < own[b] else [self.pad_id] for b in range(B)]
        for r, n in zip(rows, moved):
            if n:
                r.grammar.rollback(n)
        # Tokens of each row in the draft cache after its pending ones: ahead and the drafts fed
        # (all but the last), then padding; none when no forward ran.
        self._fed = [len(a) + min(o, K - 1) for a, o in zip(ahead, own)] if K else None
        self._width = [len(a) + K - 1 for a in ahead]
        return Drafts(tokens, probs)

    def model_logits(self, feed: list[list[int]]) -> torch.Tensor:
        """The draft's logits after each row's last fed token [B, V_draft]."""
        logits = self.batch.forward(self.model, feed, self.pad_id, last_only=True)
        self.batch.keep(torch.tensor([len(f) for f in feed], device=self.batch.device))
        return logits

    def commit(self, num_accepted: torch.Tensor, drafts: Drafts, next_tokens: list[int]) -> None:
        """Keep the drafts the target accepted in the draft cache; queue the rest as pending.

        The draft cache holds pending, then `_width[b]` tokens of row b: its first `_fed[b]`
        drafts, then padding. Row b keeps pending and its first min(n_b, fed_b) drafts; accepted
        drafts that were never fed queue as pending, ahead of the target's next token."""
        n = num_accepted.tolist()
        if self._fed is None:  # nothing was fed: the new tokens queue behind the pending ones
            self.pending = [p + d[:nb] + [nt] for p, d, nb, nt in zip(self.pending, drafts.tokens, n, next_tokens)]
            return
        drop = [w - min(nb, f) for w, f, nb in zip(self._width, self._fed, n)]
        self.batch.drop_last(torch.tensor(drop, device=self.batch.device))
        self.pending = [d[f:nb] + [nt] for d, f, nb, nt in zip(drafts.tokens, self._fed, n, next_tokens)]

    def select(self, keep: list[int]) -> None:
        self.batch.select(keep)
        self.pending = [self.pending[i] for i in keep]

    def compact(self) -> None:
        if self.batch is not None:
            self.batch.compact()


def fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Align the draft's vocabulary to the target's: pad with -inf, or cut ids the target lacks."""
    if logits.shape[-1] >= vocab:
        return logits[..., :vocab]
    return torch.nn.functional.pad(logits, (0, vocab - logits.shape[-1]), value=float("-inf"))
