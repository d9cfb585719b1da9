"""The torch engine's drafters replayed over plain rows (`TorchEngine.acceptance`): what each arm
would have accepted at each of its steps, every draft length at once (engine/acceptance.py gives
the walk and the records; docs/calibration.md, "Tally", the concept).

At a step starting at output position t each drafter proposes, within the step's budget, after
the tokens a row's grammar forces there (F, structured output; none on an unconstrained row):
- n-gram lookup (drafters.NgramDrafter): the lookup over prompt + output[:t] + F, the whole
  proposal cut at the first token the grammar forbids. Its proposal at draft length k is the first
  k tokens of its proposal at any longer length, so one lookup per position serves every k; run[t]
  = how far it agrees with output[t:], offered[t] its length. Exact for greedy rows.
- draft model (drafters.ModelDrafter): its greedy proposal j at a step starting at t only matters
  if proposals 0..j-1 matched, in which case the draft saw exactly prompt + output[:t+j]. So one
  teacher-forced forward of the draft over prompt + output (its logits masked by the grammar's
  state at each position) gives every proposal it would make; run[t] = f + the masked run at
  t + f where F (f tokens) agrees with the output, else how far F agrees. Exact for greedy rows.
- suffix (suffix.SuffixDrafter): the rows are walked in the order plain decoding finished them,
  from the key's tree as the worker holds it (a copy); at every position both sources' drafts
  are computed once at the largest budget, a smaller budget b takes the first b tokens of each,
  and the source with the larger score over them is proposed. Each row joins the tree when done.
  Exact for greedy rows at batch 1; at batch > 1 rows in flight together finish in another order
  under the arm, and a row is let see every row plain decoding finished before it from its first
  step (an estimate that leans optimistic).
- EAGLE-3 head (eagle3.py; `head_acceptance`): its chain at a step starting at t drafts from the
  target's hidden states up to t and feeds its own output on; draft j only matters if drafts
  0..j-1 matched, so one unrolled pass of the head over prompt + output with the true tokens fed
  (eagle3.depth_logits) gives every chain it would draft; run[t] = how far the chain at t agrees
  with output[t:]. The hidden states come from one teacher-forced target forward over each row
  (eagle3_states.record): the plain run's own are not kept. Exact for greedy unconstrained rows; on a
  constrained row the unmasked chain is a lower bound (an estimate).
Sampled rows (temperature > 0): the target's (and a draft model's) distributions along the sampled
path, masked by the grammar there, give each draft's chance to pass (`expected_walk`): an
estimate. Greedy constrained output is what every arm commits (the engine is lossless under the
mask), so constrained rows walk as unconstrained ones do.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence

import numpy as np
import torch

from batchspec.engine.acceptance import Acceptance, PlainRow, accept_probs, agree, expected_walk, greedy_runs, walk
from batchspec.engine.base import MIN_TOKEN_PROB_DEFAULT, SPEC_FACTOR_DEFAULT, Request, SpecConfig
from batchspec.engine.sampling import argmax, probs_from_logits
from batchspec.engine.torch.drafters import NgramIndex
from batchspec.engine.torch.eagle3 import Eagle3Head
from batchspec.engine.torch.eagle3_chains import depth_logits
from batchspec.engine.torch.eagle3_states import Recorded
from batchspec.engine.torch.suffix_tree import Draft, SuffixTree, own_draft


def acceptance(engine, rows: Sequence[PlainRow], arms: Sequence[SpecConfig], requests: Sequence[Request] = (),
               tree: SuffixTree | None = None, batch_size: int = 1, grow: bool = False) -> tuple[dict[str, Acceptance], bool]:
    """Every arm's acceptance on `rows` (base.Engine.acceptance), by label, and whether all are
    exact. `engine` is the TorchEngine whose drafters these are (its grammars, teacher-forced
    logits, a draft model's proposals and a head's chains: on greedy unconstrained rows, where
    they are exact, an engine that replays recordings gives them from its recording)."""
    constrained = any(r.response_format is not None for r in requests)
    sampled = [i for i, row in enumerate(rows) if not row.greedy]
    target_logits = None
    if sampled:
        logits = engine.teacher_forced_logits([(rows[i].prompt_ids, rows[i].output_ids) for i in sampled])
        target_logits = [None] * len(rows)
        for i, lg in zip(sampled, logits):
            target_logits[i] = lg

    def grammars() -> list | None:  # fresh matchers for each replay (a replay uses them up)
        return [engine.grammar(r) for r in requests] if constrained else None

    groups: dict[tuple, list[SpecConfig]] = defaultdict(list)
    for arm in arms:
        param = {"ngram": arm.ngram_size, "draft_target": arm.draft_model, "eagle3": arm.draft_model,
                 "suffix": (arm.spec_factor, arm.min_token_prob)}.get(arm.method)
        if param is not None:
            groups[(arm.method, param)].append(arm)
    out, exact = {}, not sampled
    for (method, param), group in groups.items():
        ks = sorted({a.draft_len for a in group})
        if method == "suffix":
            by_k = suffix_acceptance(rows, ks, tree, *param, batch_size=batch_size, target_logits=target_logits, grow=grow)
        elif method == "ngram":
            by_k = ngram_acceptance(rows, ks, param, target_logits, grammars())
        elif method == "eagle3" and not (sampled or constrained):
            by_k = chain_acceptance(rows, ks, engine.head_chains([(r.prompt_ids, r.output_ids) for r in rows], param, max(ks)))
        elif method == "eagle3":
            recorded = engine.head_states([(r.prompt_ids, r.output_ids) for r in rows], param)
            by_k = head_acceptance(rows, ks, engine.head(param), recorded, target_logits, constrained)
        elif sampled or constrained:
            draft_logits = engine.teacher_forced_logits([(r.prompt_ids, r.output_ids) for r in rows], draft_model=param)
            by_k = draft_acceptance(rows, ks, draft_logits, target_logits, grammars())
        else:
            by_k = proposal_acceptance(rows, ks, engine.draft_proposals([(r.prompt_ids, r.output_ids) for r in rows], param))
        exact = exact and all(a.exact for a in by_k.values())
        out.update((arm.label, by_k[arm.draft_len]) for arm in group)
    return out, exact


# -- one entry point per drafter, over one shared per-row loop ------------------------------------

# What a drafter says about one row: (runs, offered) for a greedy row (`walk`), or (accept, offered)
# for a sampled one (`expected_walk`); `p` is the target's distribution along the row's path
# (None for a greedy row), `offered` None when the drafter always proposes the budget.
RowModel = Callable[[int, PlainRow, "torch.Tensor | None"], tuple]


def ngram_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int], max_ngram: int,
                     target_logits: Sequence[torch.Tensor] | None = None,
                     grammars: Sequence[object | None] | None = None) -> dict[int, Acceptance]:
    """Counterfactual steps of n-gram lookup (after a grammar's forced tokens, where a row has one:
    `grammars`, fresh matchers, used up here; max_ngram 0: forced drafts alone) at every draft
    length in `draft_lens`. Sampled rows need `target_logits` (teacher-forced): draft j of the
    proposal at t passes with p_{t+j}(draft)."""
    k_max = max(draft_lens)
    grammars = grammars or [None] * len(rows)
    masked = _masked_logits(rows, grammars, target_logits)

    def row_model(r: int, row: PlainRow, p: torch.Tensor | None) -> tuple:
        out = list(row.output_ids)
        proposals = _ngram_proposals(row, max_ngram, k_max, grammars[r])
        offered = [len(q) for q in proposals]
        if p is None:
            return [agree(q, out[t:]) for t, q in enumerate(proposals)], offered
        return accept_probs(proposals, p, k_max), offered

    return _acceptance("ngram", rows, draft_lens, row_model, masked)


def draft_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int], draft_logits: Sequence[torch.Tensor],
                     target_logits: Sequence[torch.Tensor] | None = None,
                     grammars: Sequence[object | None] | None = None) -> dict[int, Acceptance]:
    """Counterfactual steps of a draft model (drafting under a row's grammar after its forced
    tokens, where it has one) at every draft length, from its teacher-forced logits. Sampled rows
    need the target's logits too: position s passes with sum_v min(p_s(v), q_s(v))."""
    k_max = max(draft_lens)
    grammars = grammars or [None] * len(rows)
    masked = _masked_logits(rows, grammars, target_logits)

    def row_model(r: int, row: PlainRow, p: torch.Tensor | None) -> tuple:
        logits = draft_logits[r]
        out = list(row.output_ids)
        forced = [[] for _ in out]
        if grammars[r] is not None:
            allowed, forced = _path(row, grammars[r])
            logits = logits.masked_fill(~allowed, float("-inf"))
        if p is None:
            model_runs = greedy_runs(argmax(logits).tolist(), out) + [0]
            runs = []
            for t, f in enumerate(forced):
                n = agree(f, out[t:])
                runs.append(n + model_runs[min(t + len(f), len(out))] if n == len(f) else n)
            return runs, None
        overlap = torch.minimum(p, _probs(logits, row)).sum(-1).numpy()
        n = len(out)
        accept = np.zeros((max(n, 1), k_max))
        for t, f in enumerate(forced):  # draft j of a step at t sits at position t + j
            for j in range(min(k_max, n - t)):
                accept[t, j] = float(p[t + j, f[j]]) if j < len(f) else overlap[t + j]
        return accept, None

    return _acceptance("draft_target", rows, draft_lens, row_model, masked)


def proposal_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int],
                        proposals: Sequence[Sequence[int]]) -> dict[int, Acceptance]:
    """Counterfactual steps of a draft model on greedy unconstrained rows, from its greedy proposal
    at every output position (`proposals[r][s]`: its argmax after prompt + output[:s]; exact)."""

    def row_model(r: int, row: PlainRow, p: torch.Tensor | None) -> tuple:
        assert p is None, "a sampled row needs the draft's distribution: draft_acceptance"
        return greedy_runs(proposals[r], row.output_ids), None

    return _acceptance("draft_target", rows, draft_lens, row_model, None)


def chain_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int], chains: Sequence[Sequence[Sequence[int]]],
                     method: str = "eagle3") -> dict[int, Acceptance]:
    """Counterfactual steps of a drafter that proposes a chain of its whole budget at every step
    (an EAGLE-3 head: eagle3_chains.chains) on greedy unconstrained rows: `chains[r][t]` its drafts for a
    step starting at output position t, draft j as it would propose it once drafts 0..j-1 matched
    (exact)."""

    def row_model(r: int, row: PlainRow, p: torch.Tensor | None) -> tuple:
        assert p is None, "a sampled row needs the head's distribution, which this replay does not take"
        out = list(row.output_ids)
        return [agree(chain, out[t:]) for t, chain in enumerate(chains[r])], None

    return _acceptance(method, rows, draft_lens, row_model, None)


def head_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int], head: Eagle3Head, recorded: Sequence[Recorded],
                    target_logits: Sequence[torch.Tensor] | None = None, constrained: bool = False) -> dict[int, Acceptance]:
    """Counterfactual steps of an EAGLE-3 head at every draft length, from its unrolled pass over
    each row's recorded hidden states (eagle3.depth_logits): a greedy row's runs are its chains'
    (`chain_acceptance`: exact); a sampled row's draft j of a step at t passes with
    sum_v min(p_{t+j}(v), q_{t,j}(v)), q the head's distribution there at the row's temperature
    and top_p. On a constrained row (`constrained`) the head's unmasked chain stands for its
    masked one behind the grammar's forced tokens: a greedy draft the output agrees with is allowed,
    so the masked chain agrees at least as far; the arm is marked an estimate."""
    k_max = max(draft_lens)
    targets = head.target_ids().cpu()

    def row_model(r: int, row: PlainRow, p: torch.Tensor | None) -> tuple:
        logits = [lg.float().cpu() for lg in depth_logits(head, recorded[r], k_max)]
        out = list(row.output_ids)
        if p is None:
            drafts = torch.stack([targets[argmax(lg)] for lg in logits], dim=1).tolist() if len(out) > 1 else []
            return [0] + [agree(chain, out[t:]) for t, chain in enumerate(drafts, 1)], None
        n = len(out)
        accept = np.zeros((max(n, 1), k_max))
        for j, lg in enumerate(logits):  # lg[t - 1]: draft j of a step at t, at output position t + j
            q = _probs(lg, row)
            for t in range(1, n - j):
                accept[t, j] = float(torch.minimum(p[t + j, targets], q[t - 1]).sum())
        return accept, None

    by_k = _acceptance("eagle3", rows, draft_lens, row_model, target_logits)
    for acceptance in by_k.values():
        acceptance.exact = acceptance.exact and not constrained
    return by_k


def _acceptance(method: str, rows: Sequence[PlainRow], draft_lens: Sequence[int], row_model: RowModel,
                target_logits: Sequence[torch.Tensor] | None) -> dict[int, Acceptance]:
    """The per-row loop the drafters share: a greedy row walks its exact runs at every draft
    length, a sampled row the expected walk over its pass probabilities (and marks the arm an
    estimate)."""
    out = {k: Acceptance(method, k) for k in draft_lens}
    for r, row in enumerate(rows):
        p = None
        if not row.greedy:
            assert target_logits is not None, "sampled rows need the target's teacher-forced logits"
            p = _probs(target_logits[r], row)
        model, offered = row_model(r, row, p)
        step = walk if row.greedy else expected_walk
        for k in draft_lens:
            accepted, proposed = step(row, model, offered, k)
            out[k].steps.append(accepted)
            out[k].proposed.append(proposed)
            out[k].exact = out[k].exact and row.greedy
    return out


def _probs(logits: torch.Tensor, row: PlainRow) -> torch.Tensor:
    n = logits.shape[0]
    return probs_from_logits(logits, torch.full((n,), row.temperature), torch.full((n,), row.top_p))


def _ngram_proposals(row: PlainRow, max_ngram: int, k_max: int, grammar=None) -> list[list[int]]:
    """The engine's proposal at every output position t (index 0 unused: prefill commits it): the
    grammar's forced tokens, the lookup after them, cut at the first forbidden token."""
    out = list(row.output_ids)
    index = NgramIndex(max_ngram, row.prompt_ids)
    proposals = [[]]
    for t in range(1, len(out)):
        index.extend(out[t - 1 : t])
        if grammar is None:
            proposals.append(index.propose(k_max))
            continue
        grammar.consume(out[t - 1 : t])
        forced = grammar.forced()[:k_max]
        proposal = forced + index.propose(k_max - len(forced), forced)
        proposals.append(proposal[: grammar.valid_prefix(proposal)])
    return proposals


def _path(row: PlainRow, grammar) -> tuple[torch.Tensor, list[list[int]]]:
    """Along a plain constrained row: the tokens its grammar allows at each output position
    [len, V] and the tokens it forces there."""
    out = list(row.output_ids)
    masks, forced = [], []
    for t in range(len(out)):
        masks.append(grammar.mask())
        forced.append(grammar.forced())
        if t + 1 < len(out):
            grammar.consume(out[t : t + 1])
    return (torch.stack(masks) if masks else torch.zeros(0, grammar.vocab, dtype=torch.bool)), forced


def _masked_logits(rows: Sequence[PlainRow], grammars: Sequence[object | None],
                   logits: Sequence[torch.Tensor] | None) -> list[torch.Tensor] | None:
    """The target's teacher-forced logits with each constrained sampled row's mask along its path
    (greedy rows need none: their runs come from the grammar directly). Copies of the matchers are
    walked here, so the row models can use the fresh ones."""
    if logits is None:
        return None
    out = list(logits)
    for r, (row, grammar) in enumerate(zip(rows, grammars)):
        if grammar is not None and not row.greedy:
            allowed, _ = _path(row, grammar.copy())
            out[r] = out[r].masked_fill(~allowed, float("-inf"))
    return out


# -- the suffix drafter ---------------------------------------------------------------------------


def suffix_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int], prior: SuffixTree | None = None,
                      spec_factor: float = SPEC_FACTOR_DEFAULT, min_token_prob: float = MIN_TOKEN_PROB_DEFAULT,
                      batch_size: int = 1, target_logits: Sequence[torch.Tensor] | None = None,
                      grow: bool = False) -> dict[int, Acceptance]:
    """Counterfactual steps of the suffix arm at every draft length in `draft_lens`, for `rows` in
    the order plain decoding finished them, from the key's tree `prior` (the worker's
    `engine.trees.trees.get(key)`, None for an empty one; copied, never changed, unless `grow`:
    then the rows are added to `prior` itself, for a caller that replays a shard's rows batch by
    batch as they finish). `Acceptance.exact` only where every row is greedy and `batch_size` 1."""
    k_max = max(draft_lens)
    tree = prior if grow and prior is not None else (prior.copy() if prior is not None else SuffixTree())
    first = tree.rows
    out = {k: Acceptance("suffix", k) for k in draft_lens}
    for r, row in enumerate(rows):
        drafts = _suffix_drafts(row, tree, k_max, spec_factor, min_token_prob)
        p = None
        if not row.greedy:
            assert target_logits is not None, "sampled rows need the target's teacher-forced logits"
            p = _probs(target_logits[r], row)
        output = list(row.output_ids)
        for k in draft_lens:
            proposals = [_choose(own, shared, max(0, min(k, row.max_tokens - t - 1))) for t, (own, shared) in enumerate(drafts)]
            offered = [len(q) for q in proposals]
            if p is None:
                accepted, proposed = walk(row, [agree(q, output[t:]) for t, q in enumerate(proposals)], offered, k)
            else:
                accepted, proposed = expected_walk(row, accept_probs(proposals, p, k), offered, k)
            out[k].steps.append(accepted)
            out[k].proposed.append(proposed)
            out[k].exact = out[k].exact and row.greedy and batch_size == 1
        tree.add(f"counterfactual-{first + r}", row.output_ids, serial=first + r)
    return out


def _suffix_drafts(row: PlainRow, tree: SuffixTree, k_max: int, spec_factor: float,
                   min_token_prob: float) -> list[tuple[Draft, Draft]]:
    """(own, shared) drafts at the largest budget, by output position t (t = 0 unused: prefill)."""
    context = np.concatenate([np.asarray(row.prompt_ids, dtype=np.int32), np.asarray(row.output_ids, dtype=np.int32)])
    start = len(row.prompt_ids)
    out = [(Draft(), Draft())]
    for t in range(1, len(row.output_ids)):
        budget = min(k_max, row.max_tokens - t - 1)
        ctx = context[: start + t]
        out.append((own_draft(ctx, budget, spec_factor, min_token_prob),
                    tree.draft(ctx, budget, spec_factor, min_token_prob)))
    return out


def _choose(own: Draft, shared: Draft, k: int) -> list[int]:
    """What the suffix drafter proposes with budget k: the source with the larger score over its
    first k tokens (its own context on a tie), cut to k."""
    if sum(shared.probs[:k]) > sum(own.probs[:k]):
        return shared.tokens[:k]
    return own.tokens[:k]
