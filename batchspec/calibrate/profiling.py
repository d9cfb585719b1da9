"""When and what a worker profiles, for counterfactual calibration (batchspec.calibrate.counterfactual):
the shape a shard needs the cost profile to cover, the points still missing (a context probe, or a
whole grid), whether speculation could repay them on the sample's evidence, and the measuring
itself, which stops at the production batch's width curve where no arm can pay on it. The
profile and its prices are batchspec.predict.cost's; the engine times the points.
"""

from __future__ import annotations

import time
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
    slots. Until 2026-12-03 it was the longest row's context, and steps past it were priced by
    extending the slope of the last two plain points: on a 64-row code shard at batch 8 (prompts
    66-81 tokens, 24 out) the steps read 80-279 slots, the profile timed 66..105, and its 5-wide
    steps were priced at 240 ms on average where they took 177 ms (bench/step_prices.py): every
    n-gram arm predicted 30-40% slow on that machine, the cost model alone."""
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
    show the profile does not cover the shard."""
    if profile.covers(*shape):
        return None
    probe = profile.context_probe(*shape)
    return (probe, []) if probe else profile_grid(*shape)


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
    The cost is bounded below: two tries of every target probe at the production batch size,
    each at least a plain step (the sample's mean). Only a loss certain on the sample's evidence
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
    forwards = 2 * sum(1 for b, *_ in grid[0] if b == batch_size)  # draft steps may cost less than a target's: not counted
    cost = forwards * plain.timing.decode_s / steps
    if saving >= cost:
        return None
    return (f"speculation cannot repay a cost profile on this shard: the rest of its plain decode time "
            f"(~{rest:.1f} s, from the sample) would shrink by at most {saving:.1f} s (the best arm, {label}, "
            f"would have saved {saved:.0%} of the sample's target steps), and profiling takes at least {cost:.1f} s "
            f"({forwards} forwards at the sample's step time); none, not profiled")


def refresh_profile(engine, profile: CostProfile, grid: tuple[list, list], temperature: float, shape: tuple,
                    cannot_pay: Callable[[CostProfile], tuple[str | None, list]] | None = None) -> tuple[float, tuple | None]:
    """Measure `grid` (from `grid_needed`) on the engine: a context probe first where that is
    what it is, then, if the profile still does not cover `shape` (`shape_of`), the whole grid for
    it, less the points the profile holds. Of a whole grid the production batch's width curve
    goes first, with its widest verify at the shortest context (how a verify's price moves with
    context): where `cannot_pay(profile)` then says why no arm can pay (the arms priced on it),
    the rest is not measured (on `make run`'s edit shard, where a verify of k + 1 tokens at batch
    8 costs nearly k + 1 plain steps, 5 of the grid's 11 points; a draft model's points go with
    the curve). A curve cut short earlier that reaches this shard is asked first, with nothing
    measured. Returns the seconds spent and (why, arms) where it stopped there, else None."""
    began = time.perf_counter()
    whole = profile_grid(*shape)
    if (list(grid[0]), list(grid[1])) != (list(whole[0]), list(whole[1])):  # a context probe
        _measure(engine, profile, grid, temperature)
        if profile.covers(*shape):
            return time.perf_counter() - began, None
    held = {p.key[2:] for p in profile.points if p.kind == "target"}
    targets = [p for p in whole[0] if p not in held]
    batch, lo, hi = shape[:3]
    drafts = whole[1]
    if cannot_pay is not None and profile.covers(*shape, cut_too=True):  # a curve cut short that reaches this shard
        why, arms = cannot_pay(profile)
        if why is not None:
            return time.perf_counter() - began, (why, arms)
    if cannot_pay is not None:
        curve = [p for p in targets if p[0] == batch and (p[1] == (lo + hi) // 2 or p[1] == lo and p[2] > 1)]  # with its context factor's
        if curve or drafts:
            _measure(engine, profile, (curve, drafts), temperature)  # the draft's points too: an arm's price needs them
        why, arms = cannot_pay(profile)
        if why is not None:
            profile.cut.add(batch)
            return time.perf_counter() - began, (why, arms)
        targets, drafts = [p for p in targets if p not in curve], []
    _measure(engine, profile, (targets, drafts), temperature)
    profile.cut.discard(batch)
    return time.perf_counter() - began, None


RETIME_SHARE = 0.02  # of a worker's decode time, the most its width curves' re-timing may take (`retime_curve`)


def retime_curve(engine, profile: CostProfile, shape: tuple, temperature: float, budget_s: float,
                 last_s: float | None = None) -> tuple[float, int]:
    """Time the production batch's width curve that prices a shard of `shape` (`shape_of`) again,
    as the profile timed it first (the fastest of two tries or more), where that fits `budget_s`
    (the worker's RETIME_SHARE of its decode time, less what re-timing took so far): each point's
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


def _measure(engine, profile: CostProfile, grid: tuple[list, list], temperature: float) -> None:
    began = time.perf_counter()
    profile.merge(engine.profile(*grid, temperature=temperature), time.perf_counter() - began)
