"""Every arm priced from plain rows, for counterfactual calibration (batchspec.calibrate.counterfactual)
and the drift checks (batchspec.calibrate.drift): the rows of a plain run as counterfactual
acceptance replays them, each arm's acceptance on them (one n-gram replay per n-gram size, one
teacher-forced forward per draft model; `RowCounterfactuals` keeps it per row for a sliding
window), and its goodput priced from the worker's cost profile, tied to the machine's present
speed by a measured plain run (`Anchor`); and the steps a run took, priced as they ran
(`anchor_of_steps`, `plain_price_s`, `arm_price_s`, `as_plain`: calibration in flight).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

from batchspec.engine.base import (
    Completion,
    GenerateResult,
    Progress,
    Request,
    SpecConfig,
    Step,
    Timing,
    acceptance_rate,
    mean_accepted_len,
)
from batchspec.predict.acceptance import Acceptance, PlainRow, draft_acceptance, ngram_acceptance
from batchspec.predict.cost import CostProfile
from batchspec.predict.replay import RowPlan, predict_decode_s
from batchspec.stats import ArmResult


def keyed_plain_rows(engine, requests: Sequence[Request], result: GenerateResult) -> list[tuple[str, PlainRow]]:
    """The rows of a plain run that counterfactual acceptance can replay (not errors, not empty),
    each with its request id."""
    return [(r.id, PlainRow(engine.encode(r), c.token_ids, r.params.max_tokens, r.params.temperature, r.params.top_p))
            for r, c in zip(requests, result.completions) if c.finish_reason != "error" and c.token_ids]


def rows_in_flight(engine, requests: Sequence[Request], indices: Sequence[int],
                   p: Progress) -> tuple[list[PlainRow], list[Completion]]:
    """The rows `indices` of a generate call in flight (`p`), for the counterfactual (finished ones
    whole, those in flight up to now: a prefix of a plain output is a plain output, capped), and
    their completions so far (calibrate.inflight's sample)."""
    rows, done = [], []
    for i in indices:
        r, c = requests[i], p.completions[i]
        if c is None:
            c = so_far(r, p.in_flight.get(i, ()))
            budget = c.output_tokens
        else:
            budget = r.params.max_tokens
        done.append(c)
        if c.finish_reason != "error" and c.token_ids:
            rows.append(PlainRow(engine.encode(r), list(c.token_ids), budget, r.params.temperature, r.params.top_p))
    return rows, done


def completions_so_far(requests: Sequence[Request], p: Progress, exclude: Sequence[int]) -> list[Completion]:
    """Every row of a generate call in flight (`p`) not in `exclude` that has tokens so far,
    finished or in flight, as a completion of them."""
    skip = set(exclude)
    out = [c for i, c in enumerate(p.completions) if c is not None and i not in skip]
    out += [so_far(requests[i], t) for i, t in p.in_flight.items() if i not in skip]
    return out


def so_far(request: Request, out) -> Completion:
    """A row still in flight as a completion of its tokens so far (the first from prefill)."""
    out = list(out)
    return Completion(request.id, None, token_ids=out, output_tokens=len(out), target_steps=max(0, len(out) - 1))


def plain_rows(engine, requests: Sequence[Request], result: GenerateResult) -> list[PlainRow]:
    """`keyed_plain_rows` without the ids."""
    return [row for _, row in keyed_plain_rows(engine, requests, result)]


def none_plans(rows: Sequence[PlainRow]) -> list[RowPlan]:
    """`rows` as plain decoding runs them: one token per step."""
    return [RowPlan(len(r.prompt_ids), len(r.output_ids) - 1, [0] * (len(r.output_ids) - 1),
                    [0] * (len(r.output_ids) - 1)) for r in rows]


@dataclass(frozen=True)
class Anchor:
    """What ties the profile's prices to a measured plain run: its scale (measured decode time
    over the replay's price of the same rows, i.e. the machine's present speed) and the engine's
    bookkeeping per row and step beyond the forward. The scale multiplies the whole price, the
    bookkeeping with the forwards, as it was taken (scaling the forwards alone would price the
    anchor's own run off by (scale - 1) x its bookkeeping). `short`: how many of the steps it
    priced ran with fewer rows than the batch size; their prices lean on the profile's points
    below the production batch, which a shard's profile may leave to a later shard where none are
    (profiling.refresh_profile)."""

    scale: float
    other: float
    short: int = 0

    @classmethod
    def of(cls, plain: GenerateResult, rows: Sequence[PlainRow], profile: CostProfile, batch_size: int) -> "Anchor":
        steps = plain.target_steps
        other = plain.timing.other_s / steps if steps else 0.0
        replay = predict_decode_s(none_plans(rows), batch_size, profile, other_per_row_step=other)
        priced, measured = replay.decode_s, plain.timing.decode_s
        return cls(measured / priced if priced > 0 and measured > 0 else 1.0, other, replay.short_steps)


def predict_arms(engine, rows: Sequence[PlainRow], arms: Sequence[SpecConfig], anchor: Anchor,
                 profile: CostProfile, batch_size: int, counterfactual: tuple[dict, float] | None = None,
                 stream: int = 0) -> list[ArmResult]:
    """Every arm's counterfactual acceptance on `rows` (`counterfactual`, where `_counterfactual`
    already computed it on these rows) and its goodput priced from `profile`, scaled to the
    machine's present speed by `anchor` (a measured plain run's).

    `stream`: price `rows` as a generate call of that many rows would run them, the rows taken
    again in turn until there are as many (each arm and plain decoding alike): a sample stands
    for the rows the shard goes on to generate, whose batch stays full while its queue lasts;
    replayed alone, a sample runs as full as its own rows keep it. (`make run`'s prose sample: 7
    of its 8 rows end after their first token, so alone it decoded one row at a time, where
    n-gram k=2 pays 1.05x, and predicted 1.1x for a shard that runs 4 to 8 rows at a time and
    measured 0.5-0.6x.) How the rows are taken again: `streamed`."""
    if not arms:
        return []
    acceptance, lookup_s = counterfactual or _counterfactual(engine, rows, arms)
    none = predict_decode_s(streamed(none_plans(rows), stream), batch_size, profile, other_per_row_step=anchor.other)
    results = []
    for arm in arms:
        acc = acceptance[arm.label]
        plans = [RowPlan(len(r.prompt_ids), len(r.output_ids) - 1, s, p) for r, s, p in zip(rows, acc.steps, acc.proposed)]
        priced = predict_decode_s(streamed(plans, stream), batch_size, profile, arm.method, arm.draft_model, anchor.other, lookup_s)
        results.append(ArmResult(
            arm.method, arm.draft_len,
            predicted_tokens_per_s=priced.decode_tokens / (anchor.scale * priced.decode_s) if priced.decode_s > 0 else None,
            predicted_speedup=none.decode_s / priced.decode_s if priced.decode_s > 0 else None,
            acceptance_rate=acceptance_rate(acc.accepted_tokens, acc.draft_tokens),
            mean_accepted_len=mean_accepted_len(acc.accepted_tokens, acc.target_steps),
            acceptance_exact=acc.exact, target_steps=round(acc.target_steps), draft_tokens=acc.draft_tokens,
            accepted_tokens=round(acc.accepted_tokens),
        ))
    return results


def streamed(plans: Sequence[RowPlan], stream: int) -> list[RowPlan]:
    """`plans` (a sample's rows under one arm) taken again in turns until there are `stream`
    (no fewer than the plans), each turn pairing every row's prompt length with another row's
    steps: in turn t, row i's prompt with row (i + t)'s output. Taken again as they are, the
    copies of a row share its prompt length, the engine's admission order (shortest prompt first
    within a window: `predict_decode_s`) puts them in one batch, and that batch's rows draft and
    accept at the same steps as one: an n-gram arm's steps where that row finds no match run
    plain, where in a batch of distinct rows some row almost always proposes and every step is a
    verify. That priced speculation far cheaper than shards ran it: with the prices held fixed
    (random 64-row held-out shards), a one-batch sample
    alone put 12% of n-gram arms within 10% of the same prices on the whole shard at batch 8 and
    24% at batch 4 (median errors 29% and 23%); paired so, 65% and 44% (7.1% and 11.5%). Each
    batch then holds rows of one prompt length and many rows' steps, as the shard's batches hold
    rows of close lengths and distinct outputs."""
    n = len(plans)
    if stream <= n or not n:
        return list(plans)
    return [replace(plans[(i + t) % n], prompt_len=plans[i].prompt_len)
            for t in range(-(-stream // n)) for i in range(n)][:stream]


def _counterfactual(engine, rows: Sequence[PlainRow], arms: Sequence[SpecConfig], group: int = 4) -> tuple[dict, float]:
    """Acceptance of every arm, by label, from one n-gram replay per n-gram size and one
    teacher-forced draft forward per draft model; and an n-gram lookup's cost per row and step.
    Rows go `group` at a time: their logits ([output length, vocabulary] per row) are large."""
    out: dict = {}
    lookup_s, lookups = 0.0, 0
    arm_groups = [(key, list(g)) for key, g in itertools.groupby(sorted(arms, key=_arm_group), key=_arm_group)]
    for begin in range(0, len(rows), group):
        part = rows[begin : begin + group]
        pairs = [(r.prompt_ids, r.output_ids) for r in part]
        target = engine.teacher_forced_logits(pairs) if any(not r.greedy for r in part) else None
        for (method, size, draft), mine in arm_groups:
            ks = sorted({a.draft_len for a in mine})
            if method == "ngram":
                began = time.perf_counter()
                by_k = ngram_acceptance(part, ks, size, target)
                lookup_s += time.perf_counter() - began
                lookups += sum(max(0, len(r.output_ids) - 1) for r in part) * len(ks)
            else:
                by_k = draft_acceptance(part, ks, engine.teacher_forced_logits(pairs, draft_model=draft), target)
            for a in mine:
                out[a.label] = out[a.label].extend(by_k[a.draft_len]) if a.label in out else by_k[a.draft_len]
    return out, lookup_s / lookups if lookups else 0.0


@dataclass
class RowCounterfactuals:
    """Every arm's counterfactual acceptance per row, each row computed once: the drift watch
    under "none" slides a window over the rows a shard has finished, and a row's n-gram replay
    or draft forward is not repeated each time the window passes over it."""

    engine: object
    rows: dict = field(default_factory=dict)  # row key -> {arm label: (steps, proposed)}
    lookup_s: float = 0.0  # an n-gram lookup's cost per row and step, averaged over what was computed
    _timed: int = 0
    keep: int = 0  # rows kept in all: the rows asked for, then the latest others computed (a key's history)

    def of(self, keys: Sequence[str], rows: Sequence[PlainRow], arms: Sequence[SpecConfig]) -> tuple[dict, float]:
        """What `_counterfactual(engine, rows, arms)` returns, computing only rows (by `keys`) not
        yet computed for every arm. The rows not asked for leave the cache beyond the latest
        `keep` rows in all: a drift window's rows that left it stay for the key's history
        (KeyHistory.then), a history read in part keeps the rest (KeyHistory.beside)."""
        labels = [a.label for a in arms]
        new = [i for i, k in enumerate(keys) if not all(label in self.rows.get(k, {}) for label in labels)]
        if new:
            out, lookup_s = _counterfactual(self.engine, [rows[i] for i in new], arms)
            if any(a.method == "ngram" for a in arms):
                self.lookup_s = (self.lookup_s * self._timed + lookup_s * len(new)) / (self._timed + len(new))
                self._timed += len(new)
            for j, i in enumerate(new):
                self.rows.setdefault(keys[i], {}).update({label: (out[label].steps[j], out[label].proposed[j])
                                                          for label in labels})
        if len(self.rows) > max(self.keep, len(keys)):
            asked = set(keys)
            others = [k for k in self.rows if k not in asked][len(self.rows) - max(self.keep, len(keys)):]
            self.rows = {k: self.rows[k] for k in [*others, *keys]}
        exact = all(r.greedy for r in rows)
        return ({a.label: Acceptance(a.method, a.draft_len, [self.rows[k][a.label][0] for k in keys],
                                     [self.rows[k][a.label][1] for k in keys], exact) for a in arms}, self.lookup_s)

    def kept(self, keys: Sequence[str]) -> "RowCounterfactuals":
        """A cache of these rows alone (those computed so far, all of them kept), the lookup cost with them."""
        out = RowCounterfactuals(self.engine, {k: self.rows[k] for k in keys if k in self.rows}, keep=len(keys))
        if out.rows:
            out.lookup_s, out._timed = self.lookup_s, len(out.rows)
        return out


def anchor_of_steps(timing: Timing, steps: Sequence[Step], profile: CostProfile, batch_size: int | None = None) -> Anchor:
    """The profile tied to a measured plain run by the steps it ran: decode seconds measured over
    the profile's price of exactly those steps (each at its rows, cache length and width), and the
    engine's bookkeeping per row and step; a step ran short with fewer rows than `batch_size`
    (where not given, than the most any step ran). (Anchor.of prices a sample replayed alone; a
    sample decoded inside the shard's batch shared its steps with other rows.)"""
    row_steps = sum(s.rows for s in steps)
    other = timing.other_s / row_steps if row_steps else 0.0
    priced = sum(profile.target_s(s.rows, s.context + 1, s.tokens) for s in steps) + other * row_steps
    measured = timing.decode_s
    full = batch_size or max((s.rows for s in steps), default=0)
    return Anchor(measured / priced if priced > 0 and measured > 0 else 1.0, other, sum(1 for s in steps if s.rows < full))


def as_plain(result: GenerateResult, steps: Sequence[Step], anchor: Anchor, profile: CostProfile) -> GenerateResult:
    """A run under a speculative setting as plain decoding would have run it: the same tokens
    (greedy speculation commits plain decoding's; sampled, tokens from the target's own
    distribution), no drafts, one target step per decode token, and the decode time plain
    decoding would have taken for what `steps` committed (`plain_price_s`), split as a plain run's is."""
    rows = [replace(c, draft_tokens=0, accepted_tokens=0, accepted_at=[], accepted_steps=[],
                    target_steps=max(0, c.output_tokens - 1)) for c in result.completions]
    other = anchor.scale * anchor.other * sum(s.committed for s in steps)
    t = result.timing
    return GenerateResult(rows, Timing(prefill_s=t.prefill_s, verify_s=plain_price_s(steps, anchor, profile) - other,
                                       other_s=other, wall_s=t.wall_s))


def plain_price_s(steps: Sequence[Step], anchor: Anchor, profile: CostProfile) -> float:
    """What plain decoding would have taken to commit the tokens `steps` committed, at their
    shapes: a step of r rows that committed c tokens stands for c / r plain steps of r rows."""
    return sum(anchor.scale * (profile.target_s(s.rows, s.context + 1, 1) * s.committed / s.rows + anchor.other * s.committed)
               for s in steps if s.rows)


def arm_price_s(steps: Sequence[Step], spec: SpecConfig, anchor: Anchor, profile: CostProfile,
                lookup_s: float = 0.0) -> float:
    """The profile's price of `steps` as they ran under `spec`, anchored: each verify at its width,
    a draft model's draft steps (the first as wide as its catch-up can be: two tokens), an n-gram
    lookup per row (`lookup_s`), the bookkeeping per row, all at what the method's steps measured
    over such prices on this worker (`CostProfile.arm_scale`). A draft model's prefills are not
    priced (nor counted where this is compared: Timing.admit_s)."""
    total = 0.0
    for s in steps:
        total += anchor.scale * (profile.target_s(s.rows, s.context + 1, s.tokens) + anchor.other * s.rows)
        if spec.method == "draft_target" and s.tokens > 1:
            model, ctx = spec.draft_model, s.context + 1
            total += anchor.scale * (profile.draft_s(model, s.rows, ctx, 2) + (s.tokens - 2) * profile.draft_s(model, s.rows, ctx))
        elif spec.method == "ngram":
            total += lookup_s * s.rows
    return total * profile.arm_scale(spec.method, spec.draft_model)


HISTORY_ROWS = 64  # a key's last rows on a worker that its next shard predicts on (KeyHistory), at least a drift window


@dataclass
class KeyHistory:
    """A shard key's last finished rows on a worker (HISTORY_ROWS, or a drift window where that is
    more, over its last shards), with each row's counterfactual as its drift checks computed it:
    the key's next shard predicts on them beside its own sample (calibrate.inflight), where the
    sample is one batch. The same workload's rows: a key that changes between shards is what the
    drift watch, on the shard's own rows, catches. How many: with the prices held fixed
    (held-out prompts), a 64-row shard's arms were predicted
    within 10% of their price on the whole shard for 78% of them on a batch-1 sample and the key's
    last 16 rows (the drift window there), 86% on 32, 92% on 64; at batch 4, 83% on 32, 91% on 64."""

    keys: list[str]
    rows: list[PlainRow]
    cache: RowCounterfactuals

    @staticmethod
    def size(window: int) -> int:
        """Rows a key's history keeps: HISTORY_ROWS, or the drift `window` where that is more."""
        return max(window, HISTORY_ROWS)

    def then(self, after: "KeyHistory", kept: int) -> "KeyHistory":
        """The key's last `kept` rows: these, then the rows of its shard that came `after` (their
        counterfactual from either's cache)."""
        keys, rows = [*self.keys, *after.keys][-kept:], [*self.rows, *after.rows][-kept:]
        cache = self.cache.kept(keys)
        cache.rows.update(after.cache.kept(keys).rows)
        if after.cache.rows:
            cache.lookup_s, cache._timed = after.cache.lookup_s, len(cache.rows)
        return KeyHistory(keys, rows, cache)

    def beside(self, rows: list[PlainRow], counter: tuple[dict, float], arms: Sequence[SpecConfig],
               last: int | None = None, before: bool = False) -> tuple[list[PlainRow], tuple[dict, float]]:
        """`rows` (their counterfactual `counter`, as `_counterfactual` returns it) followed by the
        key's `last` rows here (all of them: None), or preceded by them (`before`), with every arm's
        counterfactual on them from the cache, computing only what it lacks and keeping the rows it
        was not asked for (a drift check reads the latest few; the next shard's sample, all).

        Both ways a key's later shard predicts: the sample's prediction on its rows and the key's
        last window (counterfactual.predict_sample), and a drift check on the shard's own rows
        after the latest of the key's, while its own do not fill the window (drift._predict_chunk):
        held-out rewrite rows at batch 4 chose none on 4 sample
        rows and the key's 32, and the first check, 8 rows later, switched on n-gram k=6 from those
        8 rows alone, which ran at 0.79x plain until the next check; the shard made 0.96x plain."""
        n = len(self.rows) if last is None else max(0, min(last, len(self.rows)))
        if not n or not arms:
            return rows, counter
        theirs, _ = self.cache.of(self.keys[-n:], self.rows[-n:], arms)
        if before:
            return [*self.rows[-n:], *rows], ({label: theirs[label].extend(acc) for label, acc in counter[0].items()},
                                               counter[1])
        return [*rows, *self.rows[-n:]], ({label: acc.extend(theirs[label]) for label, acc in counter[0].items()},
                                           counter[1])


def _arm_group(arm: SpecConfig) -> tuple:
    return (arm.method, arm.ngram_size if arm.method == "ngram" else 0, arm.draft_model or "")
