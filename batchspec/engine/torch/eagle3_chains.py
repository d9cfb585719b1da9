"""EAGLE-3 chain drafts (the head's module: eagle3.py; the target's hidden states it reads:
eagle3_states.py): a growing row's drafts while it decodes (`Chain`, several rows at once:
`draft_rows`), and every position's chain of a recorded row at once (`depth_logits`, `chains`:
the counterfactual's and training's pass, the target's true next tokens fed). It knows nothing
about requests, the decode loop or calibration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from batchspec.engine.torch.eagle3 import Eagle3Head
from batchspec.engine.torch.eagle3_states import Recorded


class Chain:
    """One row's head state while it decodes: the context's keys (from the target's hidden
    states, extended as tokens are committed) and greedy chain drafts from its last position."""

    def __init__(self, head: Eagle3Head) -> None:
        self.head = head
        self.k0 = self.v0 = self.hidden = self.x = None
        self.length = 0  # context positions with keys

    @torch.inference_mode()
    def extend(self, aux: torch.Tensor, next_ids: Sequence[int]) -> None:
        """Add positions: `aux` [n, 3H'] the target's hidden states after the next n committed
        tokens, `next_ids` the n tokens after them (the last one just committed)."""
        ids = torch.tensor([list(next_ids)], dtype=torch.long, device=aux.device)
        hidden, x, k, v = self.head.context(aux[None], ids, start=self.length)
        grow = (lambda old, new: new if old is None else torch.cat((old, new), dim=2))
        self.k0, self.v0 = grow(self.k0, k), grow(self.v0, v)
        self.hidden, self.x = hidden[:, -1:], x[:, -1:]
        self.length += aux.shape[0]

    @torch.inference_mode()
    def draft(self, k: int, pick: Callable[[int, torch.Tensor], int | None] | None = None) -> list[int]:
        """Up to k chain drafts (target ids) after the last committed token. `pick(i, logits)`
        chooses draft i from the head's draft-vocabulary logits [draft vocab] (a target id; None
        ends the chain there); by default the greedy one."""
        head = self.head
        at = torch.tensor([self.length - 1], device=self.k0.device)
        pick = pick or (lambda i, logits: int(head.to_target(logits.argmax(-1))))
        drafts: list[int] = []

        def chosen(logits: torch.Tensor) -> int | None:
            token = pick(len(drafts), logits[0, 0])
            if token is not None:
                drafts.append(token)
            return token

        def own(d: int, logits: torch.Tensor) -> torch.Tensor | None:
            token = chosen(logits)
            return None if token is None else torch.tensor([[token]], device=at.device)

        out = head.deepen(self.k0, self.v0, self.hidden, self.x, at, k, own)
        if len(out) == k:  # the last depth's draft (the others were picked as the next depth's input)
            chosen(out[-1])
        return drafts


@torch.inference_mode()
def draft_rows(chains: Sequence[Chain], ks: Sequence[int], pick: Callable[[int, int, torch.Tensor], int | None]) -> list[list[int]]:
    """Chain drafts of several rows at once, one forward of the head per depth: row b drafts up to
    ks[b] tokens after its last committed one, `pick(b, i, logits)` choosing its draft i from the
    head's draft-vocabulary logits [draft vocab] (a target id; None ends row b's chain). The rows'
    context keys are padded to the longest and masked past each row's own last position, so each
    row's logits are its own chain's (`Chain.draft`), up to float rounding."""
    out: list[list[int]] = [[] for _ in ks]
    live = [b for b, k in enumerate(ks) if k > 0]
    if not live:
        return out
    head = chains[live[0]].head
    longest = max(chains[b].length for b in live)

    def stack(name: str) -> torch.Tensor:
        parts = [getattr(chains[b], name) for b in live]
        if name in ("k0", "v0"):
            parts = [torch.nn.functional.pad(t, (0, 0, 0, longest - t.shape[2])) for t in parts]
        return torch.cat(parts)

    at = torch.tensor([[chains[b].length - 1] for b in live], device=chains[live[0]].k0.device)
    going = [True] * len(live)

    def chosen(logits: torch.Tensor) -> list[int]:
        ids = []
        for i, b in enumerate(live):
            token = None
            if going[i] and len(out[b]) < ks[b]:
                token = pick(b, len(out[b]), logits[i, 0])
            if token is None:
                going[i] = False
            else:
                out[b].append(token)
            ids.append(0 if token is None else token)  # a row that stopped feeds a filler, never read
        return ids

    def own(d: int, logits: torch.Tensor) -> torch.Tensor | None:
        ids = chosen(logits)
        return torch.tensor(ids, device=at.device)[:, None] if any(going) else None

    depth = max(ks[b] for b in live)
    logits = head.deepen(stack("k0"), stack("v0"), stack("hidden"), stack("x"), at, depth, own)
    if len(logits) == depth:  # the last depth's drafts (the others were picked as the next depth's input)
        chosen(logits[-1])
    return out


# -- every position of a recorded row -------------------------------------------------------------


def depth_logits(head: Eagle3Head, row: Recorded, k: int) -> list[torch.Tensor]:
    """Per depth j < k: the head's draft-vocabulary logits [n-1, draft vocab] for draft j of a
    step starting at each output position t = 1..n-1 (the true tokens fed before it: `chains`)."""
    P, N = row.prompt_len, len(row.tokens)
    at = torch.arange(P - 1, N - 2, device=head.fc.weight.device)  # a step at output t drafts from position P + t - 2
    if len(at) == 0:
        return [torch.zeros(0, head.config.draft_vocab_size) for _ in range(k)]
    aux = row.aux[None].to(head.fc.weight.device, head.fc.weight.dtype)
    with torch.inference_mode():
        return [lg[0] for lg in head.unroll(aux, row.tokens[None].to(at.device), k, at)]


def chains(head: Eagle3Head, rows: Sequence[Recorded], k: int) -> list[list[list[int]]]:
    """Per row, per output position t: the head's greedy chain of k drafts for a step starting at
    t (index 0 empty: prefill commits the first output token), each draft j fed the true tokens
    before it, as only a chain whose earlier drafts all matched matters (greedy: exact)."""
    out = []
    for row in rows:
        logits = depth_logits(head, row, k)
        drafts = torch.stack([head.to_target(lg.argmax(-1)) for lg in logits], dim=1)  # [n-1, k]
        out.append([[]] + drafts.tolist())
    return out
