"""Counterfactual acceptance of every arm on rows already decoded: one `Tally` per row and arm.

Greedy rows commit plain decoding's tokens under every arm, whatever arm decoded them, so what
each arm would have accepted at each of its steps follows from the row's prompt and output ids:
the engine replays its own drafters over them (`Engine.acceptance`; engine/acceptance.py), exact
for greedy rows. A sampled row gives an expectation along its sampled path (the target's
teacher-forced distribution against the drafter's), an estimate that the stats label as such.

An engine without teacher-forced logits (TensorRT-LLM: `Engine.counterfactual` False) replays only
the arms whose drafts follow from tokens alone (its NGram pool); a model drafter there is measured
by running it (`measured_tallies`).
"""

from __future__ import annotations

from typing import Sequence

from batchspec.calibrate.estimate import Tally
from batchspec.engine.acceptance import PlainRow
from batchspec.engine.base import Completion, Engine, Request, SpecConfig


def tallies(engine: Engine, rows: Sequence[PlainRow], arms: Sequence[SpecConfig], requests: Sequence[Request] = (),
            tree=None, batch_size: int = 1, grow: bool = False) -> tuple[list[dict[str, Tally]], bool]:
    """Per row, every arm's tally the engine can replay ("none" included); and whether all of them
    are exact (greedy). `requests` are the rows' (their grammars); a suffix arm drafts from `tree`,
    its key's rows finished before these (with `grow` these rows join it, in order, for the next
    call's)."""
    ends = [end_step(engine, row) for row in rows]
    out: list[dict[str, Tally]] = [{"none": _plain(_tokens(len(row.output_ids), end))} for row, end in zip(rows, ends)]
    if not rows:
        return out, True
    by_label, exact = engine.acceptance(rows, arms, requests, tree, batch_size, grow)
    for label, acc in by_label.items():
        for r, (steps, proposed) in enumerate(zip(acc.steps, acc.proposed)):
            out[r][label] = Tally(_tokens(len(rows[r].output_ids), ends[r]), float(len(steps)),
                                  float(sum(p == 0 for p in proposed)), float(sum(proposed)), float(sum(steps)))
    return out, exact


def scope_of(key: str | None) -> str:
    """The suffix drafter's scope of a shard key's rows (engine.base.Request.draft_scope): the
    key's rows share one tree on a worker; a job without --shard-by is one workload."""
    return "*" if key is None else str(key)


def end_step(engine: Engine, row: PlainRow) -> int:
    """1 where the row ended on an end token its output ids leave out (TensorRT-LLM's; a row
    shorter than max_tokens, as engine/trtllm/ngram_pool.py tells it): the step that commits it is a step
    of every arm, plain decoding's too, and the token is counted with the row's."""
    return int(not engine.end_token_in_output and len(row.output_ids) < row.max_tokens)


def _tokens(output_len: int, end: int = 0) -> float:
    """A row's decode tokens: its output but the first (prefill's), and the end token `end_step` counts."""
    return float(max(output_len - 1 + end, 0))


def _plain(tokens: float) -> Tally:
    """Plain decoding's tally of a row of `tokens` decode tokens: a step each, nothing drafted."""
    return Tally(tokens, tokens, tokens, 0.0, 0.0)


def measured_tallies(completion: Completion, ran: SpecConfig, arms: Sequence[SpecConfig],
                     end: int = 0) -> dict[str, Tally]:
    """One row's tallies where acceptance cannot be computed (engines without teacher-forced
    logits, EAGLE-3 and MTP heads): plain decoding's and the running arm's as measured, and for a
    shorter draft of the same method (a chain draft: each step's accepted drafts are a run of
    agreement) a step that accepted a drafts at length k takes a // (k' + 1) + 1 steps at k' < k.
    An estimate: the steps begin elsewhere, so a drafter may propose otherwise. Other arms are
    unknown until they run. `end`: 1 where the row ended on an end token its output leaves out
    (`end_step`), counted as its target steps count it."""
    tokens = _tokens(completion.output_tokens, end)
    out = {"none": _plain(tokens)}
    if ran.method == "none":
        return out
    out[ran.label] = Tally(tokens, float(completion.target_steps), 0.0, float(completion.draft_tokens),
                           float(completion.accepted_tokens))
    if completion.accepted_steps:
        for arm in arms:
            if arm.method == ran.method and arm.draft_len < ran.draft_len and arm.draft_model == ran.draft_model:
                steps = float(sum(a // (arm.draft_len + 1) + 1 for a in completion.accepted_steps))
                out[arm.label] = Tally(tokens, steps, 0.0, steps * arm.draft_len, tokens - steps)
    return out
