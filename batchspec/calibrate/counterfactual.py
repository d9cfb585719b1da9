"""Counterfactual acceptance of every arm on rows already decoded: one `Tally` per row and arm.

Greedy rows commit plain decoding's tokens under every arm, whatever arm decoded them, so what
each arm would have accepted at each of its steps follows from the row's prompt and output ids
(batchspec.predict.acceptance): exact for greedy rows (n-gram lookup replayed, a draft model's
teacher-forced proposals). A sampled row gives an expectation along its sampled path (the target's
teacher-forced distribution against the drafter's), an estimate that the stats label as such.

An engine without teacher-forced logits (TensorRT-LLM: `Engine.counterfactual` False) gives only
the arms whose drafts follow from tokens alone: its NGram drafter, whose pool rules are replayed
(predict/trt_ngram.py, exact for greedy rows under a private pool); a model drafter there is
measured by running it (`measured_tallies`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from batchspec.calibrate.estimate import Tally
from batchspec.engine.base import Completion, Engine, Request, SpecConfig
from batchspec.engine.trtllm.translate import spec_options
from batchspec.predict.acceptance import PlainRow, draft_acceptance, ngram_acceptance, proposal_acceptance
from batchspec.predict.constrained import constrained_draft_acceptance, constrained_ngram_acceptance
from batchspec.predict.suffix import SuffixTree, suffix_acceptance
from batchspec.predict.trt_ngram import NGramPoolRules, trt_ngram_acceptance


def tallies(engine: Engine, rows: Sequence[PlainRow], arms: Sequence[SpecConfig], requests: Sequence[Request] = (),
            tree: SuffixTree | None = None, batch_size: int = 1, grow: bool = False) -> tuple[list[dict[str, Tally]], bool]:
    """Per row, every arm's tally ("none" included); and whether all of them are exact (greedy).
    Rows whose `requests` carry a response_format are constrained: every drafter's proposal starts
    with the tokens their grammar forces and is cut where it forbids (predict/constrained.py).
    A suffix arm drafts from `tree`, its key's rows finished before these (predict/suffix.py;
    with `grow` these rows join it, in order, for the next call's)."""
    ends = [end_step(engine, row) for row in rows]
    out: list[dict[str, Tally]] = [{"none": _plain(_tokens(len(row.output_ids), end))} for row, end in zip(rows, ends)]
    if not rows:
        return out, True
    constrained = any(r.response_format is not None for r in requests)
    if not engine.counterfactual:  # from tokens alone: the NGram pool's arms, unconstrained rows
        arms = [a for a in arms if a.method == "ngram" and engine.ngram_pool and not constrained]
        if not arms:
            return out, False

    def grammars() -> list:  # fresh matchers for each replay (a replay uses them up)
        return [engine.grammar(r) for r in requests]

    sampled = [i for i, row in enumerate(rows) if not row.greedy]
    target_logits = None
    if sampled and engine.counterfactual:
        logits = engine.teacher_forced_logits([(rows[i].prompt_ids, rows[i].output_ids) for i in sampled])
        target_logits = [None] * len(rows)
        for i, lg in zip(sampled, logits):
            target_logits[i] = lg
    exact = not sampled
    groups: dict[tuple, list[SpecConfig]] = defaultdict(list)
    for arm in arms:
        if arm.method == "ngram":
            groups[("ngram", pool_rules(arm) if engine.ngram_pool else arm.ngram_size)].append(arm)
        elif arm.method == "draft_target":
            groups[("draft_target", arm.draft_model)].append(arm)
        elif arm.method == "suffix":
            groups[("suffix", (arm.spec_factor, arm.min_token_prob))].append(arm)
    for (method, param), group in groups.items():
        ks = sorted({a.draft_len for a in group})
        if method == "suffix":
            by_k = suffix_acceptance(rows, ks, tree, *param, batch_size=batch_size, target_logits=target_logits, grow=grow)
        elif method == "ngram" and engine.ngram_pool:
            by_k = trt_ngram_acceptance(rows, ks, param, batch_size)
        elif method == "ngram" and constrained:
            by_k = constrained_ngram_acceptance(rows, ks, param, grammars(), target_logits)
        elif method == "ngram":
            by_k = ngram_acceptance(rows, ks, param, target_logits)
        elif sampled or constrained:
            draft_logits = engine.teacher_forced_logits([(r.prompt_ids, r.output_ids) for r in rows], draft_model=param)
            by_k = constrained_draft_acceptance(rows, ks, draft_logits, grammars(), target_logits) if constrained else \
                draft_acceptance(rows, ks, draft_logits, target_logits)
        else:
            proposals = engine.draft_proposals([(r.prompt_ids, r.output_ids) for r in rows], param)
            by_k = proposal_acceptance(rows, ks, proposals)
        exact = exact and all(a.exact for a in by_k.values())
        for arm in group:
            acc = by_k[arm.draft_len]
            for r, (steps, proposed) in enumerate(zip(acc.steps, acc.proposed)):
                out[r][arm.label] = Tally(_tokens(len(rows[r].output_ids), ends[r]), float(len(steps)), float(sum(p == 0 for p in proposed)),
                                          float(sum(proposed)), float(sum(steps)))
    return out, exact


def pool_rules(arm: SpecConfig) -> NGramPoolRules:
    """The NGram pool settings an arm's option file gives TensorRT-LLM (1.2's defaults where unset)."""
    options, default = spec_options(arm), NGramPoolRules()
    return NGramPoolRules(arm.ngram_size, *(bool(options.get(name, getattr(default, name)))
                                            for name in ("is_keep_all", "is_use_oldest", "is_public_pool")))


def scope_of(key: str | None) -> str:
    """The suffix drafter's scope of a shard key's rows (engine.base.Request.draft_scope): the
    key's rows share one tree on a worker; a job without --shard-by is one workload."""
    return "*" if key is None else str(key)


def end_step(engine: Engine, row: PlainRow) -> int:
    """1 where the row ended on an end token its output ids leave out (TensorRT-LLM's; a row
    shorter than max_tokens, as predict/trt_ngram.py tells it): the step that commits it is a step
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
