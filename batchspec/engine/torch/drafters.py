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
"""

from __future__ import annotations

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

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier match of the last n tokens (in the
        sequence less its last token), n from max_ngram down."""
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


class NgramDrafter:
    """Each row's context in an `NgramIndex`, built at the row's first proposal and extended by
    what the row committed since (its draft time; nothing at admission, as before the index)."""

    def __init__(self, max_ngram: int) -> None:
        self.max_ngram = max_ngram
        self.index: dict[int, NgramIndex] = {}  # id(row) -> the index following its context

    def admit(self, rows: list, device: torch.device) -> None:
        pass

    def propose(self, rows: list, budgets: list[int], vocab: int) -> Drafts:
        held, self.index = self.index, {}
        out = []
        for r, k in zip(rows, budgets):
            index = held.get(id(r))
            if index is None or index.owner is not r or len(index.tokens) > len(r.context):
                index = NgramIndex(self.max_ngram, owner=r)
            index.extend(r.context[len(index.tokens):])
            self.index[id(r)] = index
            out.append(index.propose(k))
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

    def propose(self, rows: list, budgets: list[int], vocab: int) -> Drafts:
        """Up to budgets[b] drafts per row. Greedy rows take the draft's argmax, and a batch of
        greedy rows keeps no distributions (the accept rule needs none: q is one-hot on the draft)."""
        K = max(budgets)
        B = len(rows)
        device = self.batch.device
        greedy = all(r.params.greedy for r in rows)
        if not greedy:
            temps = torch.tensor([r.params.temperature for r in rows], device=device)
            top_ps = torch.tensor([r.params.top_p for r in rows], device=device)
            probs = torch.zeros(B, K, vocab, device=device)
        tokens: list[list[int]] = [[] for _ in rows]
        feed = self.pending
        for i in range(K):
            logits = fit_vocab(self.model_logits(feed), vocab)  # [B, V]
            if greedy:
                picked = argmax(logits).tolist()
            else:
                q = probs_from_logits(logits, temps, top_ps)
                picked = sample_from(q, torch.stack([r.uniform() for r in rows]).to(device)).tolist()
                probs[:, i] = q
            for b in range(B):
                if i < budgets[b]:
                    tokens[b].append(picked[b])
            # A row past its budget feeds padding, which `commit` drops with the rejected drafts.
            feed = [[picked[b]] if i < budgets[b] else [self.pad_id] for b in range(B)]
        self._steps = K
        return Drafts(tokens, None if greedy else probs)

    def model_logits(self, feed: list[list[int]]) -> torch.Tensor:
        """The draft's logits after each row's last fed token [B, V_draft]."""
        logits = self.batch.forward(self.model, feed, self.pad_id, last_only=True)
        self.batch.keep(torch.tensor([len(f) for f in feed], device=self.batch.device))
        return logits

    def commit(self, num_accepted: torch.Tensor, drafts: Drafts, next_tokens: list[int]) -> None:
        """Keep the drafts the target accepted in the draft cache; queue the rest as pending.

        The draft cache now holds pending + the first K-1 fed tokens; row b keeps pending and its
        first min(n_b, K-1) drafts. If all K passed, the K-th draft was never fed: it is pending."""
        if self._steps == 0:  # nothing was fed: the new tokens queue behind the pending ones
            self.pending = [p + [nt] for p, nt in zip(self.pending, next_tokens)]
            return
        n = num_accepted.tolist()
        fed_drafts = self._steps - 1
        drop = [fed_drafts - min(nb, fed_drafts) for nb in n]
        self.batch.drop_last(torch.tensor(drop, device=self.batch.device))
        self.pending = [([d[-1]] if nb > fed_drafts else []) + [nt] for d, nb, nt in zip(drafts.tokens, n, next_tokens)]

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
