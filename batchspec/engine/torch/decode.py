"""The decode loop of the torch engine: continuous batching over prepared rows, one step at a time.

Up to `batch_size` rows decode together; a finished row leaves at once and a queued row is
prefilled and joins. Each step is three calls, timed around them by the call's clock (clock.py):

    proposal = propose(rows)                  # the drafter: 0..k drafts per row
    verdict  = target.verify(rows, proposal)  # one forward over [pending token] + drafts per row,
                                              # then the accept rule (sampling.py; greedy its T=0 limit)
    accept(rows, proposal, verdict)           # commit n drafts + next per row; finish on eos,
                                              # stop string or max_tokens

When every row is greedy the rule runs on argmaxes (`greedy_accept`), with no probabilities at
all: the same tokens, without a softmax over the vocabulary per position.

A row with a grammar (structured output, grammar.py) is constrained at every position the target
scores: its drafts start with the tokens the grammar forces (proposed `ahead` of the drafter's),
the grammar's mask sets every forbidden token's logit to -inf at each verified position (so the
rule picks, accepts and samples among allowed tokens only: greedy speculative output is greedy
constrained output, sampled output follows the constrained distribution), and the matcher,
advanced over the drafts to mask them, is rolled back to the committed tokens after the rule.

A drafter that reads the target's hidden states (EAGLE-3's: eagle3_drafter.py) carries a
`capture`; the loop hands it to the target's prefill and verify, which leave each row the hidden
states of the slots it kept (`Row.hidden`): the drafter needs no forward of the target of its own.
A target built with a `recording` (engine.TorchEngine.recording: a trained head's rows) keeps the
same hidden states of every row it admits while the recording has room (`Row.trace`), whatever
the arm: the states of the slots each forward kept, the prompt's and then each committed token's
but the last, taken from the forwards that decode the row, never a forward of their own.

The loop knows rows, a drafter, a tokenizer (for stop strings only) and a target: any object with
`new_batch`, `prefill` and `verify` as `ModelTarget` has them (the model's forward and the accept
rule). It does not know requests, chat templates or how models are loaded (engine.py), nor where
its seconds come from (its clock's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from batchspec.engine.base import SamplingParams, SpecConfig, Step, admission_order
from batchspec.engine.sampling import (
    accept_reject,
    argmax,
    greedy_accept,
    probs_from_logits,
    sample_from,
)
from batchspec.engine.torch.clock import Clock
from batchspec.engine.torch.drafters import Drafts
from batchspec.engine.torch.eagle3_states import HiddenCapture
from batchspec.engine.torch.grammar import Grammar
from batchspec.engine.torch.kv import Batch, prefill, prefill_waste, survivors


@dataclass
class TargetHidden:
    """The target's hidden states (EAGLE-3's [n, 3H]) after a row's tokens start..start+n-1."""

    start: int
    states: torch.Tensor

    def then(self, start: int, states: torch.Tensor) -> "TargetHidden":
        """These states followed by `states` from `start` (replacing them unless they end there)."""
        if start != self.start + len(self.states):
            return TargetHidden(start, states)
        return TargetHidden(self.start, torch.cat((self.states, states)))


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
    hidden: TargetHidden | None = None  # the target's hidden states its drafter has not read (EAGLE-3)
    trace: list[torch.Tensor] | None = None  # with a recording: the target's hidden states after each token so far

    def traced(self) -> torch.Tensor | None:
        """The recorded states after tokens 0..N-2 [N-1, 3H] (N: the row's tokens), None when the
        row was not recorded or its trace does not cover them."""
        if self.trace is None:
            return None
        states = torch.cat(self.trace) if self.trace else None
        need = len(self.context) - 1
        if states is None or len(states) < need:
            return None
        return states[:need]  # drafts kept past the row's end (eos, a stop string) are not its tokens

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
class Proposal:
    """A step's drafts: per row its draft tokens (0..k, the tokens its grammar forced first), those
    forced tokens, and the drafter's `Drafts` (their probabilities; None where no row had a budget);
    and the capture through which the drafter reads the hidden states of the forward that
    verifies them (EAGLE-3's; None for every other drafter)."""

    tokens: list[list[int]]
    forced: list[list[int]]
    drafts: Drafts | None
    capture: HiddenCapture | None = None  # the drafter's: the verify leaves rows the hidden states it takes


@dataclass
class Verdict:
    """The target's verify of a step's drafts: per row the drafts accepted ([B]), the next token
    ([B]: the recovered token on a rejection, the bonus token when every draft passed), and how
    many drafts the row's grammar consumed to mask them (rolled back before the commit)."""

    accepted: torch.Tensor
    next_token: torch.Tensor
    held: list[int]


class ModelTarget:
    """The target model behind the decode loop: prefill rows, and verify drafts with one forward
    and the accept rule (sampling.py). Greedy rows run the rule on argmaxes (`greedy_accept`).
    Given a drafter's `capture`, it leaves each row the hidden states the capture took from
    those forwards for the slots the row kept (Row.hidden; the EAGLE-3 drafter reads them)."""

    def __init__(self, model, pad_id: int, device: torch.device, recording: "Recording | None" = None) -> None:
        self.model, self.pad_id, self.device = model, pad_id, device
        self.recording = recording

    def capture(self, drafter_capture: HiddenCapture | None) -> HiddenCapture | None:
        """The capture a forward runs under: the drafter's, else the recording's (one object: the
        engine's, hooked once)."""
        if self.recording is None:
            return drafter_capture
        assert drafter_capture is None or drafter_capture is self.recording.capture, "one capture per target"
        return self.recording.capture

    def new_batch(self) -> Batch:
        return Batch(self.device)

    def prefill(self, rows: list[Row], capture: HiddenCapture | None = None) -> tuple[Batch, list[int]]:
        """The rows' cache, and each row's first output token."""
        taking = self.capture(capture)
        with reading(taking):
            batch, last = prefill(self.model, [r.context for r in rows], self.pad_id, self.device, prefill_waste(self.device))
        if taking is not None:  # one forward per group of rows (kv.prefill), rows in order, each right-padded
            states = [part for forward in taking.forwards() for part in forward]
            for row, part in zip(rows, states, strict=True):
                part = part[: len(row.context)]
                if capture is not None:
                    row.hidden = TargetHidden(0, part)
                if self.recording is not None and self.recording.admit(row):
                    row.trace = [part.clone()]
        for i, row in enumerate(rows):
            if row.grammar is not None:
                last[i].masked_fill_(~row.grammar.mask().to(last.device), float("-inf"))
        if all(r.params.greedy for r in rows):
            return batch, argmax(last).tolist()
        probs = probs_from_logits(last, *sampling_tensors(rows, self.device))
        return batch, sample_from(probs, torch.stack([r.uniform() for r in rows]).to(self.device)).tolist()

    def verify(self, rows: list[Row], batch: Batch, proposal: Proposal) -> Verdict:
        """One forward over each row's pending token and drafts, each row's grammar masking its
        logits, and the accept rule on them. The cache keeps the pending token and the accepted drafts."""
        draft_lists = proposal.tokens
        taking = self.capture(proposal.capture)
        with reading(taking):
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
            num_accepted, next_token = self.sampled_accept(rows, logits, proposal.drafts, draft_tokens, num_drafts)
        batch.keep(num_accepted + 1)  # the pending token plus the accepted drafts
        if taking is not None:
            [states] = taking.forwards()  # the verify's one forward
            self.leave_hidden(rows, states, num_accepted + 1, proposal.capture is not None)
        return Verdict(num_accepted, next_token, held)

    @staticmethod
    def leave_hidden(rows: list[Row], states: torch.Tensor, kept: torch.Tensor, drafter: bool = True) -> None:
        """Give each row the verify's hidden states of the slots it kept (the pending token's
        and the accepted drafts'): to its drafter (`drafter`), and to its trace where it has one."""
        for row, part, n in zip(rows, states, kept.tolist()):
            start = len(row.context) - 1  # the pending token's position
            new = part[:n]
            if drafter:
                row.hidden = TargetHidden(start, new) if row.hidden is None else row.hidden.then(start, new)
            if row.trace is not None:
                row.trace.append(new.clone())

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
        u_accept, u_sample = row_uniforms(rows, num_drafts.tolist(), K)
        draft_probs = drafts.probs[:, :K] if drafts is not None and drafts.probs is not None else None
        return accept_reject(draft_tokens, draft_probs, num_drafts, target_probs, u_accept.to(self.device), u_sample.to(self.device))


def row_uniforms(rows: list[Row], drafts: list[int], K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The accept rule's uniforms: per row one for each of its own drafts and one to sample with,
    from its own generator ([B, K] padded with zeros, [B]). A row draws as many as it drafted,
    never the batch's widest: its draws, and so its output, do not depend on the rows beside it."""
    u_accept = torch.zeros(len(rows), K)
    u_sample = torch.zeros(len(rows))
    for b, (row, n) in enumerate(zip(rows, drafts)):
        u = row.uniforms(n + 1)
        u_accept[b, :n], u_sample[b] = u[:n], u[n]
    return u_accept, u_sample


@dataclass
class Recording:
    """A generate call's record of its rows' hidden states, for a head trained on them: rows are
    admitted while `positions` (their prompt and max_tokens, reserved at admission) stay under
    `max_positions`; `rows` collects each finished one (engine.TorchEngine.recording)."""

    capture: HiddenCapture
    max_positions: int
    positions: int = 0
    rows: list = field(default_factory=list)

    def admit(self, row: Row) -> bool:
        need = row.prompt_len + row.params.max_tokens
        if self.positions + need > self.max_positions:
            return False
        self.positions += need
        return True


def reading(capture: HiddenCapture | None):
    """`capture.reading()`, or nothing without one."""
    return nullcontext() if capture is None else capture.reading()


def hidden_capture(drafter) -> HiddenCapture | None:
    """The capture through which `drafter` reads the target's hidden states (EAGLE-3's), if any."""
    return getattr(drafter, "capture", None)


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
        no greedy token. `clock` times every part (clock.py)."""
        order = admission_order([r.prompt_len for r in queue], batch_size)
        queue = [queue[i] for i in order]
        active: list[Row] = []
        batch, drafter = self.target.new_batch(), self.new_drafter(spec)
        while queue or active:
            if queue and len(active) < batch_size:
                fresh, queue = queue[: batch_size - len(active)], queue[batch_size - len(active) :]
                self.admit(fresh, batch, drafter, clock)
                active += fresh
                active, batch, drafter = yield from self.retire(active, batch, drafter, spec)
                continue
            with clock.step(spec) as stepping:
                stepping.step = self.step(active, batch, drafter, spec, clock)
                with clock.part("other_s"):
                    active, batch, drafter = yield from self.retire(active, batch, drafter, spec)
                    batch.compact()
                    drafter.compact()
            new = control(active, len(queue)) if control is not None else None
            if new is not None and new != spec:
                with clock.switch(new):
                    spec, drafter = new, self.new_drafter(new)
                    if active:
                        drafter.admit(active, self.device)

    def admit(self, rows: list[Row], batch, drafter, clock: Clock) -> None:
        """Prefill rows into the batch, and admit them to the drafter."""
        with clock.prefill([r.prompt_len for r in rows]):
            batch.extend(self.prefill(rows, hidden_capture(drafter)))  # joining the batch is part of admitting a row, as its prefill is
        with clock.part("draft_s"):
            drafter.admit(rows, self.device)

    def prefill(self, rows: list[Row], capture: HiddenCapture | None = None):
        """The rows' cache, each row's first token committed (its hidden states kept, with a capture)."""
        fresh, first = self.target.prefill(rows) if capture is None else self.target.prefill(rows, capture)
        for row, token in zip(rows, first):
            self.commit(row, [token])
        return fresh

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

    def step(self, rows: list[Row], batch, drafter, spec: SpecConfig, clock: Clock) -> Step:
        """One decode step of every row in flight: propose, verify, accept. Returns the step as it
        ran (its rows, their cache's length before it, tokens per row, tokens committed), the
        clock adding its seconds."""
        context = batch.slots
        with clock.part("draft_s"):
            proposal = self.propose(rows, drafter, spec)
        with clock.part("verify_s"):
            verdict = self.target.verify(rows, batch, proposal)
        with clock.part("other_s"):
            committed = self.accept(rows, drafter, proposal, verdict)
        return Step(len(rows), context, 1 + max(map(len, proposal.tokens), default=0), committed, method=spec.method)

    def propose(self, rows: list[Row], drafter, spec: SpecConfig) -> Proposal:
        """Each row's drafts within its budget (the arm's k, less than the tokens it has left),
        led by the tokens its grammar forces."""
        budgets = [max(0, min(spec.draft_len, r.params.max_tokens - len(r.output) - 1)) for r in rows]
        forced = [r.grammar.forced()[:k] if r.grammar is not None and k else [] for r, k in zip(rows, budgets)]
        drafts = drafter.propose(rows, budgets, self.vocab, forced) if max(budgets, default=0) > 0 else None
        return Proposal(drafts.tokens if drafts else [[] for _ in rows], forced, drafts, hidden_capture(drafter))

    def accept(self, rows: list[Row], drafter, proposal: Proposal, verdict: Verdict) -> int:
        """Commit each row's accepted drafts and its next token, the drafter following; count
        them on the row. Returns the tokens committed."""
        accepted, nexts = verdict.accepted.tolist(), verdict.next_token.tolist()
        if proposal.drafts is not None:
            drafter.commit(verdict.accepted, proposal.drafts, nexts)
        committed = 0
        for row, d, n, nxt, h, f in zip(rows, proposal.tokens, accepted, nexts, verdict.held, proposal.forced):
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
        return committed

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
