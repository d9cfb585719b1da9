"""Counterfactual calibration, where acceptance can be computed (the torch engine; n-gram and
draft-model arms): nothing is repeated but a confirmation where it matters.

1. A sample of the shard's rows is decoded under "none"; its rows are outputs, kept, not repeated.
2. From each sample row's prompt and plain tokens, batchspec.predict.acceptance computes the
   accepted length at every step each candidate arm would have had, every draft length at once
   (exact for greedy).
3. The worker's cost profile (target forwards at the production batch size for 1..k+1 tokens per
   row across the shard's contexts, a draft step; measured once per worker, again only when a
   shard leaves what it covers, e.g. a middle context over twice as long; batchspec.predict.cost)
   prices every arm by replaying the sample's rows as the shard's first chunk would run them
   (taken again in turn to the chunk's size, so the batch is as full as production keeps it;
   `predict_arms`). The best predicted speedup wins if it
   beats "none" by the margin (`decision.choose_predicted`).
4. A measured run confirms a speculative choice on a key's first shard on a worker, and any
   choice whose prediction is within its own measured error of the margin; not a choice of
   "none" predicted below the margin by more than that error (a gain it misses, the drift watch
   under "none" looks for on every chunk: 5. below). It repeats no work: the best arm generates max(batch size, 4) other rows
   of the shard, which are kept as output (greedy speculation is lossless: they are the rows plain
   decoding would give). Their plain decode time is priced from the profile by the same replay,
   scaled by the sample's measured plain run, so the confirmation compares the arm's measured time
   with plain decoding's on the same rows; and the prediction's error is measured on those rows
   too (the arm's counterfactual on their outputs against its measured time). The measured figure
   then decides; only what the arm lost against the chosen setting counts as overhead.
5. While a shard runs under "none", `drift.switch_on` does the same on the rows it finishes (in
   flight, calibrate.inflight: every batch of rows, on a window of the last 8 x batch; with the
   sample apart, shard.py: on each generate call of that many rows), switching to an arm that
   would now pay; while it speculates, `drift.while_speculating` predicts every arm on the rows
   (exact for greedy rows: speculative outputs are plain decoding's) and falls back where both the
   prediction and (in flight) the arm's own measured steps say it loses, or moves to a draft
   length that beats the running one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from batchspec.calibrate.decision import (
    CalibrationSettings,
    Decision,
    best,
    choose_predicted,
    is_complete,
    pays,
    pick_sample,
    predicted_speedups,
    stays,
)
from batchspec.calibrate.profiling import PROFILE_SHARE, cannot_repay, grid_needed, profile_budget, refresh_profile, rest_s, shape_of
from batchspec.calibrate.pricing import Anchor, KeyHistory, _counterfactual, none_plans, plain_rows, predict_arms
from batchspec.calibrate.worker import WorkerCalibration
from batchspec.engine.base import NO_SPEC, Engine, GenerateResult, Request, SpecConfig
from batchspec.errors import one_line
from batchspec.predict.acceptance import PlainRow
from batchspec.predict.cost import CostProfile, arm_key
from batchspec.predict.replay import predict_decode_s
from batchspec.stats import ArmResult

CONFIRM_MIN_ROWS = 4  # at batch 1 a single row is too few to measure an arm on


def counterfactual_ready(engine: Engine, arms: Sequence[SpecConfig]) -> bool:
    """Can every arm's acceptance be computed from a plain run on this engine? It must expose
    tokenization, teacher-forced logits and a cost profile, and every arm be n-gram lookup or a
    draft model (Eagle3/MTP on TensorRT-LLM are measured by running)."""
    return (all(hasattr(engine, n) for n in ("encode", "profile", "teacher_forced_logits"))
            and all(a.method in ("ngram", "draft_target") for a in arms))


def calibrate_counterfactual(engine, requests: Sequence[Request], arms: Sequence[SpecConfig], batch_size: int,
                             settings: CalibrationSettings = CalibrationSettings(), shard_id: str | None = None,
                             worker: WorkerCalibration | None = None, key: str | None = None,
                             clock: Callable[[], float] = time.perf_counter) -> Decision:
    """Decode a sample under "none" (its finished rows are outputs), compute from it every arm's
    accepted length at every step (batchspec.predict), price every arm from the worker's cost
    profile, and choose by predicted speedup. A measured run of the best arm on other rows of the
    shard (kept as output) confirms a speculative choice on the first shard of a key on this
    worker, and any choice whose prediction is within its own measured error of the margin;
    nothing is run twice. (A shard on an engine that switches in flight calibrates inside its
    own batch instead: calibrate.inflight, the same steps.)"""
    worker = worker if worker is not None else WorkerCalibration()
    start = clock()
    budgets = {r.id: r.params.max_tokens for r in requests}
    sample = pick_sample(requests, settings.sample_rows(batch_size, counterfactual=True), settings.max_tokens)
    plain = engine.generate(sample, NO_SPEC, batch_size)
    finished = {c.id: (c, NO_SPEC) for c in plain.completions if is_complete(c, budgets[c.id])}
    kept_s = _share_s(plain, finished)
    rows = plain_rows(engine, sample, plain)
    stream = min(len(requests) - len(sample), settings.drift_chunk or 8 * batch_size)  # shard.py's first chunk
    verdict = predict_sample(engine, rows, plain, rest_s(plain, len(sample), len(requests)), max(budgets.values()), arms,
                             batch_size, settings, worker, key, stream, lambda profile: Anchor.of(plain, rows, profile, batch_size))
    chosen, reason, lost_s, confirmed = verdict.chosen, verdict.reason, 0.0, False
    if verdict.wanted:
        taken = {r.id for r in sample}
        others = [r for r in requests if r.id not in taken]
        spec, arm = verdict.top_spec, verdict.top
        measured, on_rows, ran = _confirm(engine, others, spec, arm, verdict.anchor, worker.profile, batch_size) \
            if others else (None, None, None)
        if ran is not None:  # the rows the arm generated are kept, measured or not
            done = {c.id: (c, spec) for c in ran.completions if is_complete(c, budgets[c.id])}
            finished.update(done)
            kept_s += _share_s(ran, done)
        if ran is None:
            reason += "; not confirmed: no other rows of the shard to confirm on"
        elif measured is None:
            reason += (f"; not confirmed: the {len(ran.completions)} rows {spec.label} ran on (kept) ended after "
                       f"their first token, leaving no decode step to measure")
        else:
            confirmed = True
            chosen, why = settle(verdict, measured, on_rows, worker, key, settings,
                                 f"measured {measured:.2f}x plain decoding on {len(ran.completions)} other rows of the "
                                 f"shard (kept; their plain time priced from the profile; predicted {on_rows:.2f}x on those rows)")
            reason += why
            if chosen is NO_SPEC:  # the rows were kept, but the arm took longer than plain decoding would have
                lost_s = max(0.0, ran.timing.decode_s * (1 - measured))
    seconds = clock() - start
    return Decision(
        chosen=chosen, arms=verdict.arms, baseline_tokens_per_s=verdict.arms[0].tokens_per_s, calibration_s=seconds,
        overhead_s=min(seconds, max(0.0, seconds - kept_s) + lost_s), reason=reason, shard_id=shard_id,
        finished=finished, profile_s=verdict.profile_s, confirmed=confirmed, profile=list(worker.profile.points),
    )


@dataclass
class Verdict:
    """What a sample's plain run says (`predict_sample`): every arm (plain decoding first), the
    choice and why, and whether a measured confirmation of the best arm is wanted."""

    arms: list[ArmResult]
    chosen: SpecConfig
    reason: str
    anchor: Anchor | None = None
    top: ArmResult | None = None  # the best predicted arm, and its setting
    top_spec: SpecConfig | None = None
    wanted: bool = False  # a measured confirmation of `top_spec`
    first: bool = False  # the key's first shard on this worker
    error: float = 0.0  # the prediction's error the rule allows for
    profile_s: float = 0.0
    lookup_s: float = 0.0  # an n-gram lookup's cost per row and step, as the counterfactual timed it
    turned_by: float = 1.0  # the arm scale (`CostProfile.arm_scale`) without which the rule would choose otherwise


def predict_sample(engine, rows: Sequence[PlainRow], plain: GenerateResult, rest: float | None, longest: int,
                   arms: Sequence[SpecConfig], batch_size: int, settings: CalibrationSettings,
                   worker: WorkerCalibration, key: str | None, stream: int,
                   anchor_of: Callable[[CostProfile], Anchor], history: KeyHistory | None = None,
                   running: SpecConfig = NO_SPEC) -> Verdict:
    """Steps 2-4 of this module's list on a plain run of the sample, `plain` (its rows as `rows`;
    `rest`: the plain decode seconds the shard has left, estimated (`rest_s`; None: no bound);
    `longest`: the shard's longest max_tokens): every arm's counterfactual acceptance, the profile measured
    where the shard leaves it and speculation could repay it, every arm priced (`anchor_of(profile)`
    ties the prices to the measured run) as a generate call of `stream` rows runs, the rule's
    choice, and whether to confirm it. One code path for both ways a sample is decoded (alone,
    here; inside the shard's batch, calibrate.inflight). `history`: the key's last rows on this
    worker, predicted on after the sample's (their counterfactual from its cache). `running`: the
    arm the sample decoded under (a key's later shard in flight), which another arm replaces only
    where predicted faster by the margin (`decision.stays`), as the drift watch would."""
    base = ArmResult("none", 0)
    base.add(plain)
    broken = _broken_arms(engine, arms)
    arms = [a for a in arms if a.label not in broken]
    own = len(rows)
    if history is not None and rows and arms:
        rows = [*rows, *history.rows]

    def acceptance() -> tuple[dict, float]:
        mine = _counterfactual(engine, rows[:own], arms)
        return mine if len(rows) == own else history.beside(list(rows[:own]), mine, arms)[1]
    shape = shape_of(rows, arms, batch_size, longest) if rows and arms else None
    grid = grid_needed(worker.profile, shape) if shape else None
    counter = None  # every arm's acceptance on the sample, computed before a profile is paid for
    if not rows or not base.tokens_per_s:
        why_not = "plain decoding of the sample gave nothing to predict from"
    elif grid:
        counter = acceptance()
        why_not = cannot_repay(plain, rest, grid, batch_size, rows, counter[0])
    else:
        why_not = None
    if why_not:
        return Verdict([base, *broken.values()], NO_SPEC, why_not)
    counter = counter or (acceptance() if arms else ({}, 0.0))
    bar = (1 + settings.margin) * (1 - worker.prediction_error(key, settings.prediction_error))

    def priced(profile: CostProfile, anchor: Anchor | None = None) -> list[ArmResult]:
        return predict_arms(engine, rows, arms, anchor_of(profile) if anchor is None else anchor, profile, batch_size,
                            counter, stream)

    def cannot_pay(profile: CostProfile) -> tuple[str | None, list[ArmResult]]:
        """On the production batch's width curve alone: why no arm can pay, with their prices."""
        arms_now = priced(profile)
        top = best(predicted_speedups(arms_now))
        if top is not None and top[1] >= bar:
            return None, arms_now
        return (f"best arm {top[0].label} predicted {top[1]:.2f}x plain decoding on the production batch's width "
                f"curve alone, below {bar:.2f}x (the {settings.margin:.0%} margin less the prediction's error): none; "
                f"the rest of the profile (the context's ends, batch 1 and half the batch) not measured"
                if top is not None else "no arm could be priced"), arms_now

    budget = profile_budget(plain, rest)
    profile_s, stop, once, owed = refresh_profile(engine, worker.profile, grid, rows[0].temperature, shape, cannot_pay,
                                                  budget, lambda profile: anchor_of(profile).short == 0) \
        if grid else (0.0, None, 0, 0)  # a grid implies arms
    timed_once = (f"; {once} points of the cost profile timed once (a second try of each would have passed "
                  f"{PROFILE_SHARE:.0%} of the shard's plain decode time, {budget:.1f} s)" if once else "")
    if owed:
        timed_once += (f"; the profile's {owed} points below the production batch (batch 1, half the batch) left to the "
                       f"worker's next shard at batch {batch_size}: their first tries would have passed "
                       f"{PROFILE_SHARE:.0%} of the shard's plain decode time, and the sample's steps all ran at the "
                       f"batch size (steps of fewer rows priced along the production batch's points meanwhile)")
    if stop is not None:
        why, arms_now = stop
        return Verdict([base, *arms_now, *broken.values()], NO_SPEC, why + timed_once + _estimated(arms_now),
                       profile_s=profile_s, lookup_s=counter[1])
    anchor = anchor_of(worker.profile) if arms else Anchor(1.0, 0.0)
    results = [base] + (priced(worker.profile, anchor) if arms else []) + list(broken.values())
    chosen, reason = choose_predicted(results, arms, settings.margin)
    top = best(predicted_speedups(results))
    kept = stays(results, running, chosen, settings.margin)
    if kept is not None:
        reason += (f"; {running.label}, which the sample decoded under, predicted {kept[1]:.2f}x: {chosen.label} is not "
                   f"faster by the {settings.margin:.0%} margin, so {running.label} stays")
        chosen, top = running, kept
    error = worker.prediction_error(key, settings.prediction_error)
    first = key not in worker.confirmed_keys
    near = top is not None and abs(top[1] - (1 + settings.margin)) <= error * top[1]
    top_spec = next(s for s in arms if s.label == top[0].label) if top is not None else None
    turned_by = _turned_by(worker.profile, top_spec, top[1], settings.margin) if top is not None else 1.0
    wanted = top is not None and settings.confirm and (first and chosen is not NO_SPEC or near or turned_by != 1.0)
    if top is not None and settings.confirm and first and not wanted:
        reason += (f"; not confirmed: {top[0].label} predicted below the margin by more than its error "
                   f"({error:.0%}); under none the drift watch predicts every arm again as rows finish")
    reason += timed_once + _estimated(results) + _arm_scales(worker.profile, arms)
    return Verdict(results, chosen, reason, anchor, top[0] if top else None, top_spec, wanted, first, error, profile_s,
                   counter[1], turned_by)


def _turned_by(profile: CostProfile, spec: SpecConfig, speedup: float, margin: float) -> float:
    """The scale of `spec`'s steps on this worker (`CostProfile.arm_scale`) where the rule's choice
    turns on it: the arm predicted at `speedup` pays and at the points' price would not, or the
    reverse; else 1.0. Such a choice is confirmed, whatever its error: the scale comes from a few
    confirmations of some 20 steps each, and one timed in a fast moment of a shared machine can
    stand for the method on this worker until ARM_KEPT more are taken. At the points' price the
    speedup is `speedup` times the scale: exact for n-gram, whose every part of a step is scaled;
    a draft model's prefills are not, so there it is an approximation."""
    scale = profile.arm_scale(spec.method, spec.draft_model)
    return scale if pays(speedup, margin) != pays(speedup * scale, margin) else 1.0


def _arm_scales(profile: CostProfile, arms: Sequence[SpecConfig]) -> str:
    """The reason's clause where an arm's steps are priced at what they measured on this worker."""
    scales = {arm_key(a.method, a.draft_model): profile.arm_scale(a.method, a.draft_model) for a in arms}
    scales = {key: scale for key, scale in scales.items() if scale != 1.0}
    if not scales:
        return ""
    each = ", ".join(f"{m} {s:.2f}x" for m, s in scales.items())
    return f"; speculative steps priced at what confirmations measured them at on this worker: {each} the profile's price"


def _estimated(arms: Sequence[ArmResult]) -> str:
    """The reason's clause where acceptance is an estimate."""
    if any(a.acceptance_exact is False for a in arms):
        return "; acceptance estimated (sampled rows: sum of min(p, q) along the sampled path)"
    return ""


def settle(verdict: Verdict, measured: float, predicted: float | None, worker: WorkerCalibration, key: str | None,
           settings: CalibrationSettings, what: str) -> tuple[SpecConfig, str]:
    """A confirmation's outcome: the measured speedup of `verdict.top_spec` over plain decoding
    decides (the margin rule), the key counts as confirmed on this worker, and the error of the
    prediction set against it (`predicted`: on the same rows here, the sample's in flight) is kept
    for the next shards' `near` test. Returns the setting and the reason's clause; `what` says
    what was measured, and on what."""
    spec = verdict.top_spec
    worker.confirmed_keys.add(key)
    if predicted:
        worker.record_error(key, abs(predicted / measured - 1))
    chosen = spec if pays(measured, settings.margin) else NO_SPEC
    if verdict.first:
        why = "first shard of its key on this worker"
    elif verdict.turned_by != 1.0:
        why = (f"the choice turns on the {spec.label} steps' measured cost on this worker, {verdict.turned_by:.2f}x the "
               f"profile's price")
    else:
        why = f"prediction within its error ({verdict.error:.0%}) of the margin"
    return chosen, f"; confirmed ({why}): {spec.label} {what} -> {chosen.label}"


def _confirm(engine, others: Sequence[Request], spec: SpecConfig, arm: ArmResult, anchor: Anchor,
             profile: CostProfile, batch_size: int) -> tuple[float | None, float | None, GenerateResult]:
    """Run `spec` on max(batch_size, CONFIRM_MIN_ROWS) rows of `others` (evenly spaced; full budgets,
    so they are kept).
    Returns (measured speedup, speedup predicted on those rows, the run): measured = plain decode
    time of those rows priced from the profile and scaled by the sample's plain run, over the
    arm's measured decode time. Greedy speculation is lossless, so the arm's outputs are the plain
    outputs the pricing replays; the prediction on those rows is the arm's counterfactual from
    their outputs (for sampled rows, whose counterfactual needs the target's logits, the sample's
    prediction stands in). The arm's measured figures are added to `arm`. When the rows ended
    after their first token (no decode step for the arm to shorten) there is nothing to measure:
    (None, None, the run)."""
    picked = pick_sample(others, max(batch_size, CONFIRM_MIN_ROWS), max(r.params.max_tokens for r in others))
    ran = engine.generate(picked, spec, batch_size)
    done = plain_rows(engine, picked, ran)
    plain_s = anchor.scale * predict_decode_s(none_plans(done), batch_size, profile, other_per_row_step=anchor.other).decode_s
    if plain_s <= 0 or ran.timing.decode_s <= 0:
        return None, None, ran
    arm.add(ran)
    measured = arm.speedup = plain_s / ran.timing.decode_s
    on_rows = arm.predicted_speedup
    if all(r.greedy for r in done):
        on_rows = predict_arms(engine, done, [spec], anchor, profile, batch_size)[0].predicted_speedup or on_rows
        if on_rows:  # on the same rows and plain price, predicted over measured is the arm's steps' over their price
            profile.arm_measured(spec.method, spec.draft_model, on_rows / measured)
    return measured, on_rows, ran


def _broken_arms(engine, arms: Sequence[SpecConfig]) -> dict[str, ArmResult]:
    """Arms the engine cannot run (a draft model that does not load), recorded with the reason."""
    broken = {}
    for arm in arms:
        try:
            engine.check(arm)
        except Exception as exc:  # an arm that fails is skipped and recorded, as when measured by running
            broken[arm.label] = ArmResult(arm.method, arm.draft_len, error=one_line(exc))
    return broken


def _share_s(result: GenerateResult, kept: dict) -> float:
    """Seconds of a generate call that produced the rows in `kept`, shared out by output tokens."""
    total = result.output_tokens
    mine = sum(c.output_tokens for c in result.completions if c.id in kept)
    return result.timing.wall_s * mine / total if total else 0.0
