"""The decode loop of the torch engine: continuous batching over prepared rows, one step at a time.

Up to `batch_size` rows decode together; a finished row leaves at once and a queued row is
prefilled and joins. Each step:

    drafts  = drafter.propose(rows)                 # n-gram lookup or draft model, 0..k per row
    logits  = target([pending token] + drafts)      # one forward verifies every row's drafts
    n, next = accept_reject(drafts, q, p, uniforms) # sampling.py; greedy is its T=0 limit
    commit n drafts + next per row; finish on eos, stop string or max_tokens

When every row is greedy the rule runs on argmaxes (`greedy_accept`), with no probabilities at
all: the same tokens, without a softmax over the vocabulary per position.

A row with a grammar (structured output, grammar.py) is constrained at every position the target
scores: its drafts start with the tokens the grammar forces (proposed `ahead` of the drafter's),
the grammar's mask sets every forbidden token's logit to -inf at each verified position (so the
rule picks, accepts and samples among allowed tokens only: greedy speculative output is greedy
constrained output, sampled output follows the constrained distribution), and the matcher,
advanced over the drafts to mask them, is rolled back to the committed tokens after the rule.

The loop knows rows, a drafter and a tokenizer (for stop strings only); the target behind it is a
`ModelTarget` (the model's forward and the accept rule) or, for the simulator, a target that
replays recorded greedy outputs (engine/replay.py): the same schedule either way. Its `Clock`
measures the wall clock, or with a cost regime prices every step instead (engine/regimes.py).
It does not know requests, chat templates or how models are loaded (engine.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from batchspec.engine.base import SamplingParams, SpecConfig, Step, Timing, admission_order
from batchspec.engine.regimes import Regime
from batchspec.engine.sampling import (
    accept_reject,
    argmax,
    greedy_accept,
    probs_from_logits,
    sample_from,
)
from batchspec.engine.torch.grammar import Grammar
from batchspec.engine.torch.kv import Batch, prefill, prefill_waste, survivors


@dataclass
class Row:
    """A request being decoded: its tokens so far, its randomness and its counters."""

    index: int  # position in the request list
    params: SamplingParams
    prompt_len: int
    context: list[int]  # prompt + output so far
    generator: torch.Generator | None
    draft_tokens: int = 0
    accepted_tokens: int = 0
    target_steps: int = 0
    accepted_steps: list[int] = field(default_factory=list)  # see Completion
    finish: str | None = None
    stop_at: int | None = None  # char offset where a stop string begins
    grammar: Grammar | None = None  # the row's structured output, at its committed tokens
    forced_tokens: int = 0  # see Completion
    error: str | None = None  # why a row finished with "error"

    @property
    def output(self) -> list[int]:
        return self.context[self.prompt_len :]

    def uniform(self) -> torch.Tensor:
        return self.uniforms(1)[0]

    def uniforms(self, n: int) -> torch.Tensor:
        """n uniform draws from this row's own generator (greedy rows draw nothing: zeros)."""
        if self.generator is None:
            return torch.zeros(n)
        return torch.rand(n, generator=self.generator)


@dataclass
class Clock:
    """Where a generate call's time goes. Without a `regime` every part is measured on the wall
    clock (`add`); with one, wall time is ignored and each prefill, step and arm switch is priced
    by the regime instead (`priced`): a simulated run, deterministic whatever the machine's load."""

    regime: Regime | None = None
    timing: Timing = field(default_factory=Timing)
    steps: list[Step] = field(default_factory=list)  # every decode step, as it ran

    def add(self, part: str, since: float) -> float:
        """Charge the wall seconds since `since` to `part` (measured clocks only); return now."""
        now = time.perf_counter()
        if self.regime is None:
            setattr(self.timing, part, getattr(self.timing, part) + now - since)
        return now

    def priced(self, part: str, seconds: float) -> None:
        """Charge `seconds` of the regime's to `part` (simulated clocks only)."""
        if self.regime is not None:
            setattr(self.timing, part, getattr(self.timing, part) + seconds)


class ModelTarget:
    """The target model behind the decode loop: prefill rows, and verify drafts with one forward
    and the accept rule (sampling.py). Greedy rows run the rule on argmaxes (`greedy_accept`)."""

    def __init__(self, model, pad_id: int, device: torch.device) -> None:
        self.model, self.pad_id, self.device = model, pad_id, device

    def new_batch(self) -> Batch:
        return Batch(self.device)

    def prefill(self, rows: list[Row]) -> tuple[Batch, list[int]]:
        """The rows' cache, and each row's first output token."""
        batch, last = prefill(self.model, [r.context for r in rows], self.pad_id, self.device, prefill_waste(self.device))
        for i, row in enumerate(rows):
            if row.grammar is not None:
                last[i].masked_fill_(~row.grammar.mask().to(last.device), float("-inf"))
        if all(r.params.greedy for r in rows):
            return batch, argmax(last).tolist()
        probs = probs_from_logits(last, *sampling_tensors(rows, self.device))
        return batch, sample_from(probs, torch.stack([r.uniform() for r in rows]).to(self.device)).tolist()

    def verify(self, rows: list[Row], batch: Batch, draft_lists: list[list[int]], drafts
               ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """One forward over each row's pending token and drafts, each row's grammar masking its
        logits; (num_accepted [B], next_token [B], drafts each row's grammar consumed to mask them).
        The cache keeps the pending token and the accepted drafts."""
        logits = batch.forward(self.model, [[r.context[-1]] + d for r, d in zip(rows, draft_lists)], self.pad_id)
        if self.device.type == "cuda":  # the forward runs on after its launch returns: without this its time
            torch.cuda.synchronize(self.device)  # lands in the accept rule's (its .tolist() waits for it)
        held = self.mask(rows, draft_lists, logits)
        K = logits.shape[1] - 1
        num_drafts = torch.tensor([len(d) for d in draft_lists], device=self.device)
        draft_tokens = torch.tensor([d + [0] * (K - len(d)) for d in draft_lists], device=self.device, dtype=torch.long)
        draft_tokens = draft_tokens.view(len(rows), K)
        if all(r.params.greedy for r in rows):
            num_accepted, next_token = greedy_accept(draft_tokens, num_drafts, logits)
        else:
            num_accepted, next_token = self.sampled_accept(rows, logits, drafts, draft_tokens, num_drafts)
        batch.keep(num_accepted + 1)  # the pending token plus the accepted drafts
        return num_accepted, next_token, held

    @staticmethod
    def mask(rows: list[Row], drafts: list[list[int]], logits: torch.Tensor) -> list[int]:
        """Set the logits of tokens a row's grammar forbids to -inf, at each position the verify
        scored (logits [B, K+1, V], in place); return how many drafts each matcher consumed."""
        held = [0] * len(rows)
        for b, (row, d) in enumerate(zip(rows, drafts)):
            if row.grammar is not None:
                allowed, held[b] = row.grammar.masks(d)
                logits[b, : len(d) + 1].masked_fill_(~allowed.to(logits.device), float("-inf"))
        return held

    def sampled_accept(self, rows: list[Row], logits: torch.Tensor, drafts, draft_tokens: torch.Tensor,
                       num_drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The accept rule on probabilities: logits [B, K+1, V], draft_tokens [B, K]."""
        K = logits.shape[1] - 1
        temps, top_ps = sampling_tensors(rows, self.device)
        target_probs = probs_from_logits(
            logits.reshape(-1, logits.shape[-1]), temps.repeat_interleave(K + 1), top_ps.repeat_interleave(K + 1)
        ).view(len(rows), K + 1, -1)
        u = torch.stack([r.uniforms(K + 1) for r in rows]).to(self.device)
        draft_probs = drafts.probs[:, :K] if drafts is not None and drafts.probs is not None else None
        return accept_reject(draft_tokens, draft_probs, num_drafts, target_probs, u[:, :K], u[:, K])


def sampling_tensors(rows: list[Row], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.tensor([r.params.temperature for r in rows], device=device),
        torch.tensor([r.params.top_p for r in rows], device=device),
    )


class Decoder:
    """Runs rows to completion on one target; `new_drafter(spec)` gives a fresh drafter."""

    def __init__(self, target, tokenizer, eos_ids: set[int], vocab: int, device: torch.device,
                 new_drafter: Callable[[SpecConfig], object]) -> None:
        self.target, self.tokenizer = target, tokenizer
        self.eos_ids, self.vocab, self.device = eos_ids, vocab, device
        self.new_drafter = new_drafter

    def run(self, queue: list[Row], spec: SpecConfig, batch_size: int, clock: Clock,
            control: Callable[[list[Row], int], SpecConfig | None] | None = None) -> Iterator[Row]:
        """Yield each row when it finishes; keeps at most batch_size rows in flight. Rows are
        admitted in `admission_order` (completions keep request order): shortest prompt first
        within windows of the input, so rows prefilled together have similar lengths and batched
        prefill pads little, while a shard's workload keeps its place.

        `control(active rows, rows queued)`, called after every decode step once finished rows
        have been yielded, may return another setting: a fresh drafter admits the rows in flight
        from their contexts (a draft model prefills them; its time is draft time) and they, and
        the rows queued, go on under it. The target's cache is untouched, so a switch changes
        no greedy token."""
        order = admission_order([r.prompt_len for r in queue], batch_size)
        queue = [queue[i] for i in order]
        active: list[Row] = []
        batch = self.target.new_batch()
        drafter = self.new_drafter(spec)
        while queue or active:
            if queue and len(active) < batch_size:
                fresh, queue = queue[: batch_size - len(active)], queue[batch_size - len(active) :]
                fresh_batch = self.prefill(fresh, clock)
                t = time.perf_counter()
                drafter.admit(fresh, self.device)
                t = clock.add("draft_s", t)
                batch.extend(fresh_batch)  # joining the batch is part of admitting a row, as its prefill is
                clock.add("prefill_s", t)
                active += fresh
                active, batch, drafter = yield from self.retire(active, batch, drafter, spec)
                continue
            began = time.perf_counter()
            shape = self.step(active, batch, drafter, spec, clock)
            t = time.perf_counter()
            active, batch, drafter = yield from self.retire(active, batch, drafter, spec)
            batch.compact()
            drafter.compact()
            end = clock.add("other_s", t)
            clock.steps.append(self.priced(shape, end - began, spec, clock))
            new = control(active, len(queue)) if control is not None else None
            if new is not None and new != spec:
                t = time.perf_counter()
                spec, drafter = new, self.new_drafter(new)
                if active:
                    drafter.admit(active, self.device)
                clock.add("draft_s", t)
                if clock.regime is not None:
                    clock.priced("draft_s", clock.regime.switch_s(new.method))

    def retire(self, active: list[Row], batch, drafter, spec: SpecConfig):
        done = [r for r in active if r.finish]
        if not done:
            return active, batch, drafter
        for row in done:
            yield row
        keep = survivors([bool(r.finish) for r in active])  # rows from the end fill the places of finished ones
        if not keep:
            return [], self.target.new_batch(), self.new_drafter(spec)
        batch.select(keep)
        drafter.select(keep)
        return [active[i] for i in keep], batch, drafter

    def prefill(self, rows: list[Row], clock: Clock):
        t = time.perf_counter()
        batch, first = self.target.prefill(rows)
        for row, token in zip(rows, first):
            self.commit(row, [token])
        clock.add("prefill_s", t)
        if clock.regime is not None:
            clock.priced("prefill_s", sum(clock.regime.prefill_s(r.prompt_len) for r in rows))
        return batch

    def priced(self, shape: tuple[int, int, int, int], wall_s: float, spec: SpecConfig, clock: Clock) -> Step:
        """The step as it ran: its wall seconds, or the regime's price of its shape."""
        rows, context, tokens, committed = shape
        if clock.regime is None:
            return Step(rows, context, tokens, committed, wall_s, spec.method)
        if clock.regime.pads_drafts and spec.method != "none":  # as TensorRT-LLM's steps are, and report
            tokens = 1 + spec.draft_len
        cost = clock.regime.step(rows, tokens, context, spec.method)
        clock.priced("draft_s", cost.draft_s)
        clock.priced("verify_s", cost.verify_s)
        clock.priced("other_s", cost.other_s)
        return Step(rows, context, tokens, committed, cost.total, spec.method)

    def step(self, rows: list[Row], batch, drafter, spec: SpecConfig, clock: Clock) -> tuple[int, int, int, int]:
        """One decode step of every row in flight; returns its shape (rows, context, tokens per
        row, tokens committed)."""
        t = time.perf_counter()
        budgets = [max(0, min(spec.draft_len, r.params.max_tokens - len(r.output) - 1)) for r in rows]
        forced = [r.grammar.forced()[:k] if r.grammar is not None and k else [] for r, k in zip(rows, budgets)]
        drafts = drafter.propose(rows, budgets, self.vocab, forced) if max(budgets, default=0) > 0 else None
        t = clock.add("draft_s", t)

        draft_lists = drafts.tokens if drafts else [[] for _ in rows]
        context = batch.slots
        width = 1 + max((len(d) for d in draft_lists), default=0)
        num_accepted, next_token, held = self.target.verify(rows, batch, draft_lists, drafts)
        t = clock.add("verify_s", t)

        accepted, nexts = num_accepted.tolist(), next_token.tolist()
        if drafts is not None:
            drafter.commit(num_accepted, drafts, nexts)
        committed = 0
        for row, d, n, nxt, h, f in zip(rows, draft_lists, accepted, nexts, held, forced):
            if h:
                row.grammar.rollback(h)  # back to the committed tokens; commit advances it over the kept ones
            # drafts accepted past the row's end (eos, a stop string) are not output: not counted
            appended = self.commit(row, d[:n] + [nxt])
            committed += appended
            n = min(n, appended)
            row.forced_tokens += min(n, len(f))
            row.target_steps += 1
            row.draft_tokens += len(d)
            row.accepted_tokens += n
            row.accepted_steps.append(n)
        clock.add("other_s", t)
        return len(rows), context, width, committed

    def commit(self, row: Row, tokens: list[int]) -> int:
        """Append committed tokens (`append`) and advance the row's grammar over them; return how
        many were appended. A token the grammar refuses (the mask allowed it: a library fault)
        finishes the row with an error rather than emit output that breaks its schema."""
        appended = self.append(row, tokens)
        if row.grammar is not None and not row.grammar.consume(tokens[:appended]):
            row.finish, row.error = "error", f"the grammar refused a committed token: {row.grammar.error}"
        return appended

    def append(self, row: Row, tokens: list[int]) -> int:
        """Append committed tokens, stopping at eos, max_tokens or a stop string; return how many
        were appended. Stop strings are checked after every token, so a speculative row ends on
        the same token as a plain one."""
        for i, token in enumerate(tokens, 1):
            row.context.append(token)
            if token in self.eos_ids:
                row.finish = "stop"
                return i
            if row.params.stop and self.stopped(row):
                return i
            if len(row.context) - row.prompt_len >= row.params.max_tokens:
                row.finish = "length"
                return i
        return len(tokens)

    def stopped(self, row: Row) -> bool:
        text = self.tokenizer.decode(row.output, skip_special_tokens=True)
        hits = [text.find(s) for s in row.params.stop if s and s in text]
        if hits:
            row.stop_at, row.finish = min(hits), "stop"
        return bool(hits)
