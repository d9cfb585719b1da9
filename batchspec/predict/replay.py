"""The replay that prices an arm from the worker's cost profile (batchspec.predict.cost). No
clock here.

`predict_decode_s` replays a sample's schedule as the engine runs it (continuous batching, the engine's
admission order, every step as wide as its widest row) with each row's counterfactual steps
(batchspec.predict.acceptance) and prices every step. Plain decoding is priced by the same
replay, so a predicted speedup is a ratio of two predictions of one model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from batchspec.engine.base import admission_order
from batchspec.predict.cost import CostProfile


def slots_reach(longest: int) -> int:
    """The most cache slots a step of a batch reads while its longest row holds `longest` tokens:
    rows keep the slots another row of the batch accepted, and a row admitted mid-batch is padded
    to the batch's length, until kv.Batch.compact squeezes the holes out past 2 x longest + 64
    (its `slack` and pad). A batch of one row has no holes: it reads its own context."""
    return 2 * longest + 64


@dataclass
class RowPlan:
    """One row as the engine would run it under an arm."""

    prompt_len: int
    decode_tokens: int  # output tokens after the first (which prefill commits)
    steps: Sequence[float]  # drafts accepted per step (0 for plain decoding)
    proposed: Sequence[int]  # drafts proposed per step


@dataclass
class Predicted:
    """An arm's decode time on a sample, priced from the profile."""

    decode_s: float
    verify_s: float
    draft_s: float
    other_s: float
    target_steps: int  # row-steps, as the engine counts them
    decode_tokens: float
    short_steps: int = 0  # steps run with fewer rows than the batch size (a batch draining or not yet full)

    @property
    def tokens_per_s(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else None


def predict_decode_s(rows: Sequence[RowPlan], batch_size: int, profile: CostProfile, method: str = "none",
                     draft_model: str | None = None, other_per_row_step: float = 0.0,
                     lookup_per_row_step: float = 0.0) -> Predicted:
    """Replay continuous batching over `rows` and price every step.

    A target step is priced at the batch's cache length as kv.Batch keeps it, holes included: a
    row that rejects drafts keeps the slots another row of its batch accepted, so speculation
    lengthens the cache attention reads faster than the rows' contexts grow (until compaction).

    Rows are admitted in the engine's order (`admission_order`: shortest prompt first within
    windows of the input, decode.Decoder.run), so the replay batches together the rows the
    engine does.

    A draft model runs k steps to propose k drafts; the first feeds each row what its cache has
    not seen: the target's last token, and also the row's last draft where the target accepted
    every draft of the step before (drafters.ModelDrafter.commit), so that step is two tokens
    wide whenever one row of the batch accepted all.

    `other_per_row_step` is the engine's bookkeeping per row and step beyond the forward and the
    accept rule (from the measured plain run); `lookup_per_row_step` an n-gram lookup's cost. A
    speculative arm's price is then taken at what its steps measured on this worker over such
    prices (`CostProfile.arm_scale`: 1.0 until a confirmation measured one)."""
    queue = admission_order([r.prompt_len for r in rows], batch_size)
    active: list[list[int | float]] = []  # [row index, next step, context, tokens the draft's cache lags by]
    verify = draft = other = prefills = 0.0
    steps = short = 0
    slots = 0  # the batch's cache length, holes included (kv.Batch), which attention reads
    while queue or active:
        while queue and len(active) < batch_size:
            i = queue.pop(0)
            if method == "draft_target":
                prefills += profile.draft_prefill_s(draft_model, rows[i].prompt_len)
            if rows[i].steps:
                active.append([i, 0, rows[i].prompt_len + 1, 1])  # the draft prefilled the prompt, not the first token
                slots = max(slots, rows[i].prompt_len)  # a new row's cache is padded to the batch's, or the batch's to it
        if not active:
            continue
        width = 1 + max(rows[i].proposed[s] for i, s, *_ in active)
        context = slots + 1  # the step's pending token, then its drafts
        b = len(active)
        verify += profile.target_s(b, context, width)
        if method == "draft_target" and width > 1:
            reach = int(max(c for _, _, c, _ in active))
            feed = max(lag for *_, lag in active)
            draft += profile.draft_s(draft_model, b, reach, feed) + (width - 2) * profile.draft_s(draft_model, b, reach)
        elif method == "ngram":
            draft += lookup_per_row_step * b
        other += other_per_row_step * b
        steps += b
        short += b < batch_size
        kept = 0
        for slot in active:
            n = rows[slot[0]].steps[slot[1]]
            slot[1] += 1
            slot[2] += n + 1
            slot[3] = 2 if width > 1 and round(n) == width - 1 else 1  # every draft accepted: the last was never fed
            kept = max(kept, round(n) + 1)
        slots += kept  # every row appends `width` slots; those no row keeps are cut off the end (kv.Batch.keep)
        active = [slot for slot in active if slot[1] < len(rows[slot[0]].steps)]
        longest = int(max((c for _, _, c, _ in active), default=0)) - 1
        if not active:
            slots = 0  # the engine starts a fresh batch
        elif slots > slots_reach(longest):
            slots = longest  # kv.Batch.compact squeezes the holes out
    scale = profile.arm_scale(method, draft_model)  # a speculative step's own measured cost on this worker
    verify, draft, other = scale * verify, scale * draft + prefills, scale * other  # (a confirmation times no prefill)
    tokens = float(sum(r.decode_tokens for r in rows))
    return Predicted(verify + draft + other, verify, draft, other, steps, tokens, short)
