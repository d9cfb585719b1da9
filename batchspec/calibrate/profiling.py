"""When and what a worker profiles, for counterfactual calibration (batchspec.calibrate.counterfactual):
the shape a shard needs the cost profile to cover, the points still missing (a context probe, or a
whole grid), whether speculation could repay them on the sample's evidence, and the measuring
itself, which stops at the production batch's width curve where no arm can pay on it. The
profile and its prices are batchspec.predict.cost's; the engine times the points.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Sequence

from batchspec.engine.base import GenerateResult, SpecConfig
from batchspec.predict.acceptance import PlainRow
from batchspec.predict.cost import CostProfile, profile_grid
from batchspec.predict.replay import slots_reach


def shape_of(rows: Sequence[PlainRow], arms: Sequence[SpecConfig], batch_size: int,
             max_tokens: int) -> tuple[int, int, int, int, list[str]]:
    """What a profile must cover for this shard: (batch size, lowest context, highest context,
    widest verify, draft models), the arguments of `CostProfile.covers` and `profile_grid`. The
    highest context is the most cache slots a step reads (`slots_reach`): at batch > 1 the
    batch's holes take steps past any row's context, and the replay prices each step at its
    slots. The longest row's context would fall short of them, and steps past it would be priced
    by extending the slope of the last two plain points: on a 64-row code shard at batch 8 that
    priced every n-gram arm 30-40% slow."""
    lo = min(len(r.prompt_ids) for r in rows)
    hi = max(len(r.prompt_ids) for r in rows) + max_tokens
    hi = slots_reach(hi) if batch_size > 1 else hi
    width = 1 + max(a.draft_len for a in arms)
    drafts = sorted({a.draft_model for a in arms if a.method == "draft_target" and a.draft_model})
    return batch_size, lo, hi, width, drafts


def grid_needed(profile: CostProfile, shape: tuple) -> tuple[list, list] | None:
    """The (target, draft) points to measure if the shard's `shape` (`shape_of`: batch size, draft
    length, draft models, contexts) leaves what the worker's profile covers (`CostProfile.covers`); None
    when it covers them. Where only a plain step's cost at the shard's contexts is unknown, just
    those points (`CostProfile.context_probe`); `refresh_profile` goes on to the grid if they
    show the profile does not cover the shard. The points an earlier shard's profile left to a
    later one at this batch size (`CostProfile.owed`) come with them, or alone where it covers."""
    owed = list(profile.owed.get(shape[0], ()))
    if profile.covers(*shape):
        return (owed, []) if owed else None
    probe = profile.context_probe(*shape)
    return (probe + owed, []) if probe else profile_grid(*shape)


def rest_s(plain: GenerateResult, sampled: int, rows: int) -> float | None:
    """The plain decode seconds a shard of `rows` rows has left after a sample of `sampled` of them
    decoded alone (`plain`): the sample's, per row. None where the sample was the whole shard:
    then nothing bounds what a profile may cost (it serves the worker's later shards)."""
    return plain.timing.decode_s * (rows - sampled) / sampled if rows > sampled else None


def cannot_repay(plain: GenerateResult, rest: float | None, grid: tuple[list, list], batch_size: int,
                 sample_rows: Sequence[PlainRow], acceptance: dict) -> str | None:
    """Why profiling would cost more than speculation could save on this shard, or None. The
    saving is bounded above: the rest of the shard's plain decode time (`rest`, `rest_s`)
    shrinks at most by the share of target steps the best arm would have saved on the sample (its
    counterfactual acceptance, exact for greedy rows; a verify step costs at least a plain one).
    The cost is bounded below: one try of every target probe at the production batch size,
    each at least a plain step (the sample's mean); a profile with a shard to repay it times
    each point once before any second try (`refresh_profile`). Only a loss certain on the sample's evidence
    skips it (short outputs, tiny shards, drafts that would not be accepted); the next shard that
    could repay it measures the profile. (Before the bound used acceptance, it assumed every draft
    accepted, and `make run`'s code shard, whose rows mostly end after a token or two, paid a
    2.6-3.0 s profile for 1-1.4 s of decoding.)"""
    steps = plain.target_steps
    if not steps or rest is None:
        return None
    plain_steps = sum(max(0, len(r.output_ids) - 1) for r in sample_rows)
    label, fewest = min(((label, a.target_steps) for label, a in acceptance.items()), key=lambda x: x[1])
    saved = max(0.0, 1 - fewest / plain_steps) if plain_steps else 0.0
    saving = rest * saved
    forwards = sum(1 for b, *_ in grid[0] if b == batch_size)  # draft steps may cost less than a target's: not counted
    cost = forwards * plain.timing.decode_s / steps
    if saving >= cost:
        return None
    return (f"speculation cannot repay a cost profile on this shard: the rest of its plain decode time "
            f"(~{rest:.1f} s, from the sample) would shrink by at most {saving:.1f} s (the best arm, {label}, "
            f"would have saved {saved:.0%} of the sample's target steps), and profiling takes at least {cost:.1f} s "
            f"({forwards} forwards at the sample's step time); none, not profiled")


PROFILE_SHARE = 0.02  # of a shard's plain decode time: what its profile's second tries (`refresh_profile`) and its
                      # width curve's re-time (`retime_curve`) may take; of a worker's, what its re-times may take in all


def shard_decode_s(plain: GenerateResult, rest: float | None) -> float | None:
    """A shard's plain decode seconds as its sample says: the sample's (`plain`) and the rest's
    (`rest_s`); None where the sample was the whole shard (`rest` None)."""
    return plain.timing.decode_s + rest if rest is not None else None


def profile_budget(plain: GenerateResult, rest: float | None) -> float | None:
    """What a shard's profile may spend on second tries (`refresh_profile`): PROFILE_SHARE of
    the shard's plain decode seconds (`shard_decode_s`); None where the sample was the whole
    shard: nothing bounds what a profile may cost there (it serves the worker's later shards)."""
    shard = shard_decode_s(plain, rest)
    return PROFILE_SHARE * shard if shard is not None else None


def refresh_profile(engine, profile: CostProfile, grid: tuple[list, list], temperature: float, shape: tuple,
                    cannot_pay: Callable[[CostProfile], tuple[str | None, list]] | None = None,
                    budget_s: float | None = None,
                    full: Callable[[CostProfile], bool] | None = None) -> tuple[float, tuple | None, int, int]:
    """Measure `grid` (from `grid_needed`) on the engine: a context probe first where that is
    what it is, then, if the profile still does not cover `shape` (`shape_of`), the whole grid for
    it, less the points the profile holds. Of a whole grid the production batch's width curve
    goes first, with its widest verify at the shortest context (how a verify's price moves with
    context): where `cannot_pay(profile)` then says why no arm can pay (the arms priced on it),
    the rest is not measured (on `make run`'s edit shard, where a verify of k + 1 tokens at batch
    8 costs nearly k + 1 plain steps, 5 of the grid's 11 points; a draft model's points go with
    the curve). A curve cut short earlier that reaches this shard is asked first, with nothing
    measured.

    Within a shard's `budget_s` (`profile_budget`), a whole grid's target points are timed once
    each, and a second try of a point (its price the faster, as engine.profile's own tries) is
    taken only where the budget left allows it (`_again`): the production batch's width curve
    first, then its context's ends, then the smaller batches. Every point once is what prices
    every arm; the second try narrows a point's noise, which a later shard's re-time
    (`retime_curve`, the mean of the point's timings) narrows too, and a speculative choice on a
    key's first shard is measured before it stands (counterfactual.settle). On a worker's first
    shard at batch 8 with 24-token outputs (128 held-out rows, 66 s) two tries of every
    point were 2.7-2.8 s, 4.1-4.3% of the shard; one try of each, 1.6-1.7 s. The price: one
    try's width-over-plain ratio lay within [-12%, +18%] of the machine's mean at the 10th and
    90th percentiles, the fastest of two within [-6%, +9%]. A
    shard whose plain decode time is 50 times the profile's or more keeps two tries of every
    point. A draft model's points keep two tries (their model is small; its seed is a prefill,
    a second pass would repeat it).
    Within a budget, too, the points below the production batch (batch 1 and half the batch,
    which price the steps of a batch draining or not yet full) are timed after the production
    batch's, and only where their first tries fit what is left of the budget (priced from the
    profile as it stands) or the steps that anchor the profile to the machine ran some at fewer
    rows (`full(profile)` false: `Anchor.short`): otherwise they wait for the worker's next shard
    at this batch size (`CostProfile.owed`, `grid_needed`), and steps of fewer rows are priced
    along the production batch's points meanwhile. On a first held-out shard at batch 8 with
    24-token outputs they took 0.3 of its profile's 1.3 s one-try seconds, over the 2% of the
    shard that calibration may cost; without them every arm's predicted speedup moved by 0.2-2.0%
    (continue, extract, rewrite, summarize: a 128-row shard's batch is full for all but its last
    steps), and by up to 3.4% on `make run`'s 64-row shards.
    Without a budget every point has two tries. Returns the seconds spent,
    (why, arms) where it stopped at the curve else None, the points left at one try, and the
    points left to a later shard."""
    began = time.perf_counter()
    whole = profile_grid(*shape)
    least = 1 if budget_s is not None else 2
    if (list(grid[0]), list(grid[1])) != (list(whole[0]), list(whole[1])):  # a context probe, or points owed
        owed = set(profile.owed.get(shape[0], ()))
        probe = [p for p in grid[0] if p not in owed]
        if probe or grid[1]:
            _measure(engine, profile, (probe, grid[1]), temperature)
        if len(probe) < len(grid[0]):  # owed points: one try within a budget, as the grid they were left from
            _measure(engine, profile, ([p for p in grid[0] if p in owed], []), temperature, least)
        if profile.covers(*shape):
            return time.perf_counter() - began, None, 0, 0
    held = {p.key[2:] for p in profile.points if p.kind == "target"}
    targets = [p for p in whole[0] if p not in held]
    profile.owed.pop(shape[0], None)  # a new grid at this batch: what it leaves is owed, not what the last left
    batch, lo, hi = shape[:3]
    drafts = whole[1]
    once: list[tuple[int, int, int]] = []  # target points timed once, in the order a second try goes
    if cannot_pay is not None and profile.covers(*shape, cut_too=True):  # a curve cut short that reaches this shard
        why, arms = cannot_pay(profile)
        if why is not None:
            return time.perf_counter() - began, (why, arms), 0, 0
    if cannot_pay is not None:
        curve = [p for p in targets if p[0] == batch and (p[1] == (lo + hi) // 2 or p[1] == lo and p[2] > 1)]  # with its context factor's
        if curve or drafts:
            _measure(engine, profile, (curve, drafts), temperature, least)  # the draft's points too: an arm's price needs them
            once += curve if least == 1 else []
        why, arms = cannot_pay(profile)
        if why is not None and once:  # the curve's second tries first, where they fit: they may turn the answer
            once = _again(engine, profile, once, temperature, budget_s - (time.perf_counter() - began))
            why, arms = cannot_pay(profile)
        if why is not None:
            profile.cut.add(batch)
            return time.perf_counter() - began, (why, arms), len(once), 0
        targets, drafts = [p for p in targets if p not in curve], []
    smaller = [p for p in targets if p[0] < batch] if least == 1 else []
    targets = [p for p in targets if p not in smaller]
    _measure(engine, profile, (targets, drafts), temperature, least)
    profile.cut.discard(batch)
    owed = []
    if smaller:
        left = budget_s - (time.perf_counter() - began)
        if full is not None and full(profile) and sum(profile.target_s(*p) for p in smaller) > left:
            owed = profile.owed[batch] = smaller
        else:
            _measure(engine, profile, (smaller, []), temperature, least)
            targets += smaller
    if least == 1:
        once = _again(engine, profile, once + targets, temperature, budget_s - (time.perf_counter() - began))
    return time.perf_counter() - began, None, len(once), len(owed)


def _again(engine, profile: CostProfile, points: Sequence[tuple[int, int, int]], temperature: float,
           budget_s: float) -> list[tuple[int, int, int]]:
    """A second try of target `points`, each timed once: a group (a batch size and a context) at a
    time, the largest batch's first and its width curve (the group of most widths) first among
    them, then in `points`' order, each where what its first try took fits what is left of
    `budget_s`; each point priced at the faster of its tries. Returns the points left at one try."""
    spent = 0.0  # what the second tries took: their wall time, at least their forwards' own seconds
    first = {p.key[2:]: p.seconds for p in profile.points if p.kind == "target"}
    groups: dict[tuple[int, int], list] = {}
    for p in points:
        groups.setdefault(p[:2], []).append(p)
    left = []
    for group in sorted(groups.values(), key=lambda g: (-g[0][0], -len(g))):  # stable: `points`' order on a tie
        if spent + sum(first[p] for p in group) > budget_s:
            left += group
            continue
        t = time.perf_counter()
        tried = engine.profile(group, [], temperature=temperature, least=1)
        took = max(time.perf_counter() - t, sum(q.seconds for q in tried))
        spent += took
        profile.merge([q if q.seconds < first[q.key[2:]] else replace(q, seconds=first[q.key[2:]]) for q in tried], took)
    return left


def retime_curve(engine, profile: CostProfile, shape: tuple, temperature: float, budget_s: float,
                 last_s: float | None = None) -> tuple[float, int]:
    """Time the production batch's width curve that prices a shard of `shape` (`shape_of`) again,
    as the profile timed it first (the fastest of two tries or more), where that fits `budget_s`
    (the worker's PROFILE_SHARE of its decode time, less what re-timing took so far): each point's
    price becomes the mean of its last timings (`CostProfile.retime`). A re-time is expected to
    cost `last_s`, the last one's at this batch, else two and a half times the profile's price of
    its forwards. Returns the seconds spent and the points re-timed ((0.0, 0): not due, or no
    curve). The curve sets every arm's price over plain decoding's; a level the machine moves by
    the anchor takes up, a width it moves does not, and one timing of it is noisy and ages."""
    batch, lo, hi = shape[:3]
    curve = profile.width_curve(batch, lo, hi)
    if not curve:
        return 0.0, 0
    cost = last_s if last_s is not None else 2.5 * sum(profile.target_s(*p) for p in curve)
    if cost > budget_s:
        return 0.0, 0
    began = time.perf_counter()
    points = engine.profile(curve, [], temperature=temperature)
    spent = time.perf_counter() - began
    profile.retime(points, spent)
    return spent, len(points)


def _measure(engine, profile: CostProfile, grid: tuple[list, list], temperature: float, least: int = 2) -> None:
    """Time `grid` on the engine and merge it into `profile`: the target points the fastest of
    `least` tries (`measure.profile`), a draft model's of two."""
    began = time.perf_counter()
    if least == 2 or not grid[0]:
        points = engine.profile(*grid, temperature=temperature)
    else:
        points = engine.profile(grid[0], [], temperature=temperature, least=least)
        points += engine.profile([], grid[1], temperature=temperature) if grid[1] else []
    profile.merge(points, time.perf_counter() - began)
