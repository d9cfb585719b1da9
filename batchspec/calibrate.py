"""Per-shard calibration: find out on the shard's own prompts whether speculation pays, then choose.

The rule (DESIGN.md, from the seed documents): speculate only when

    (draft time + verify time + coordination time) / committed tokens  <  baseline time per token

by a margin (default 5%). Goodput is committed output tokens per second of decode time, measured
at the shard's production batch size, so batching effects are in the measurement, not guessed.

How it works where acceptance can be computed (the torch engine; n-gram and draft-model arms):
`calibrate_counterfactual`.
1. A sample of the shard's rows is decoded under "none"; its rows are outputs, kept, not repeated.
2. From each sample row's prompt and plain tokens, predict.py computes the accepted length at
   every step each candidate arm would have had, every draft length at once (exact for greedy).
3. The worker's cost profile (target forwards at the production batch size for 1..k+1 tokens per
   row across the shard's contexts, a draft step; measured once per worker, again only when a
   shard leaves its range) prices every arm by replaying the sample's schedule. The best predicted
   speedup wins if it beats "none" by the margin.
4. A measured run confirms only on a key's first shard on a worker, or when the prediction is
   within its own measured error of the margin: the best arm runs the same sample rows, and its
   goodput is compared with their plain run from step 1 (same rows; not back to back, so a change
   of load between the two biases it). The measured figure then decides; the plain rows are kept.
5. While a shard runs under "none", `switch_on` does the same on each finished chunk (drift in
   the other direction: shard.py switches to an arm that would now pay).

Where it cannot (TensorRT-LLM's Eagle3/MTP, or an engine without teacher-forced logits and a
profile), every arm is measured by running, `calibrate`:
1. A sample of the shard's rows (evenly spaced), split into rounds of about one production batch;
   generation capped at a few tokens per row.
2. Round 0 runs "none" and one draft length per method (the shortest candidate: the cheapest
   probe, and the likeliest to pay where speculation is marginal), in a rotating order.
3. From each measured arm, fit the per-token acceptance a (mean accepted length
   (1 - a^(k+1)) / (1 - a), Leviathan et al.) and the per-step draft and verify costs, and
   predict goodput at every candidate draft length. Each later round runs "none" and the
   predicted best draft length per method (the confirmation); a method whose best prediction is
   clearly below plain decoding leaves the running.
4. Every arm is compared with "none" on the rounds both ran in (paired: same rows, back to back).
   The best measured speedup wins; "none" unless it beats plain decoding by the margin. Every
   arm, measured or predicted, is recorded.
5. Sample rows generated to their end are kept as outputs, whichever arm made them: the engine is
   lossless, so each is a correct output (greedy: the same tokens), and the row records its arm.
   Calibration's cost is what is not kept (repeated work). A budget caps that cost at a fraction
   of the shard's expected time: round 0 always runs; a confirmation that would exceed the
   budget is skipped, and the decision says so.

Decisions are plain data (`Decision`), reused for small shards of the same key by `shard.py`.
The acceptance and cost models live in predict.py; the arm record in stats.py.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from batchspec.engine.base import NO_SPEC, Completion, Engine, GenerateResult, Request, SpecConfig
from batchspec.errors import one_line
from batchspec.predict import (
    CostProfile,
    PlainRow,
    RowPlan,
    draft_acceptance,
    ngram_acceptance,
    predict_decode_s,
    predict_tokens_per_s,
    profile_grid,
)
from batchspec.stats import ArmResult, chosen_arm


@dataclass(frozen=True)
class CalibrationSettings:
    """The pipeline file's `calibration:` section. Each field declares its range in `metadata`
    (min / max inclusive, above exclusive); batchspec.config checks every key against the type
    and range at load, before any worker starts, so a new field needs only its declaration here."""

    sample_size: int = field(default=0, metadata={"min": 0})  # rows measured per arm; 0 = twice the batch size, within [8, 64]
    max_tokens: int = field(default=128, metadata={"min": 1})  # generation cap per row while calibrating: rows that fit are finished (and kept)
    rounds: int = field(default=2, metadata={"min": 1})  # interleaving rounds; the sample is split across them
    margin: float = field(default=0.05, metadata={"min": 0, "max": 1})  # speculation must beat "none" by this fraction
    max_fraction: float = field(default=0.10, metadata={"min": 0, "max": 1})  # calibration budget, as a fraction of the shard's expected time
    min_rows: int = field(default=16, metadata={"min": 0})  # smaller shards reuse the last decision of their shard key
    confirm: bool = True  # measure the predicted best draft length
    drift_ratio: float = field(default=0.5, metadata={"min": 0, "max": 1})  # fall back to "none" when acceptance drops below this x calibrated
    drift_chunk: int = field(default=0, metadata={"min": 0})  # rows per drift check; 0 = max(8 x batch size, 16)
    max_builds_per_worker: int = field(default=6, metadata={"min": 2})  # engines whose arms are builds (TensorRT-LLM): builds calibration may cause per worker (none and one arm at least)
    prediction_error: float = field(default=0.10, metadata={"min": 0})  # assumed error of a predicted speedup until confirmations measure it

    def sample_rows(self, batch_size: int) -> int:
        return self.sample_size or min(64, max(8, 2 * batch_size))


@dataclass
class Decision:
    """What a shard runs with, and the evidence."""

    chosen: SpecConfig
    arms: list[ArmResult] = field(default_factory=list)
    baseline_tokens_per_s: float | None = None
    calibration_s: float = 0.0
    overhead_s: float = 0.0  # calibration time whose work was not kept as output
    capped: bool = False
    source: str = "calibrated"  # calibrated | reused | fixed | too_small
    reason: str = ""
    shard_id: str | None = None  # the shard that was calibrated
    # Sample rows calibration generated to their end, by request id, with the arm that made each:
    # the shard keeps them instead of generating them again (calibration work is not thrown away).
    finished: dict[str, tuple[Completion, SpecConfig]] = field(default_factory=dict, repr=False)
    profile_s: float = 0.0  # seconds spent measuring the worker's cost profile for this shard
    confirmed: bool = False  # a paired measured run checked the prediction
    profile: list = field(default_factory=list, repr=False)  # the cost profile used (StepCost structs)

    @property
    def chosen_arm(self) -> ArmResult | None:
        return chosen_arm(self.arms, self.chosen)

    def reused_by(self, shard_id: str) -> "Decision":
        return replace(self, source="reused", calibration_s=0.0, overhead_s=0.0, capped=False, finished={},
                       profile_s=0.0, confirmed=False,
                       reason=f"shard too small to calibrate; reused the decision of {self.shard_id}")


def fixed_decision(spec: SpecConfig, reason: str) -> Decision:
    return Decision(spec, source="fixed", reason=reason)


def calibrate(engine: Engine, requests: Sequence[Request], arms: Sequence[SpecConfig], batch_size: int,
              settings: CalibrationSettings = CalibrationSettings(), shard_id: str | None = None,
              expected_rows: int | None = None, clock: Callable[[], float] = time.perf_counter) -> Decision:
    """Measure "none" and the candidate `arms` on a sample of `requests`; return the decision.

    Round 0 runs "none" and one probe per method on the first part of the sample; each later round
    runs "none" and, per method still in the running, the draft length the cost model predicts best
    (the confirmation), on the next part. Every arm is compared with "none" on the rounds it ran
    in (paired: same rows, back to back), so neither row content nor machine load between rounds
    biases the comparison.

    `expected_rows` (default: all requests) sizes the budget. Calibration's cost is the time whose
    work is not kept: sample rows generated to their end are outputs whichever arm made them (the
    engine is lossless), so only repeated work counts. Round 0 always runs; a later run starts only
    when its projected cost stays within `max_fraction` of the shard's predicted plain-decoding time.
    `clock` times the runs (tests pass a scripted one)."""
    start = clock()
    sample = pick_sample(requests, settings.sample_rows(batch_size), settings.max_tokens)
    # rounds of at least one production batch each, or arms would be measured at a smaller batch
    rounds = _split(sample, min(settings.rounds, max(1, len(sample) // max(1, batch_size))))
    by_method: dict[str, list[SpecConfig]] = {}
    for arm in arms:
        if arm.method != "none":
            by_method.setdefault(arm.method, []).append(arm)
    full_budget = {r.id: r.params.max_tokens for r in requests}
    results: dict[str, ArmResult] = {}
    runs: list[_Run] = []
    complete: dict[str, dict[str, Completion]] = {}  # label -> request id -> row generated to its end
    budget = float("inf")
    capped = False
    next_arm: dict[str, SpecConfig | None] = {m: _probe(c) for m, c in by_method.items()}

    for r, chunk in enumerate(rounds):
        specs = [NO_SPEC] + [s for s in next_arm.values() if s is not None]
        if r > 0 and len(specs) == 1:
            break  # no method left worth confirming: the rest of the shard is production work
        if r > 0:  # a round runs whole (so its arms are paired with "none") or not at all
            if not runs:
                break
            guess = max(x.seconds for x in runs)
            while len(specs) > 1 and _overhead(runs + [_Run(s.label, r, guess, runs[0].complete_share) for s in specs]) > budget:
                specs.pop()
                capped = True
            if len(specs) == 1:
                break
        for spec in specs[r % len(specs):] + specs[: r % len(specs)]:
            arm = results.setdefault(spec.label, ArmResult(spec.method, spec.draft_len))
            if arm.error:
                continue
            began = clock()
            try:
                result = engine.generate(chunk, spec, batch_size)
            except Exception as exc:  # an arm that fails is skipped and recorded
                arm.error = one_line(exc)
                continue
            arm.add(result)
            alone = ArmResult(spec.method, spec.draft_len)
            alone.add(result)
            done = {c.id: c for c in result.completions if _complete(c, full_budget[c.id])}
            complete.setdefault(spec.label, {}).update(done)
            tokens = {c.id: c.output_tokens for c in result.completions}
            runs.append(_Run(spec.label, r, clock() - began,
                             sum(tokens[i] for i in done) / max(1, sum(tokens.values())), tokens, alone))
            if spec is NO_SPEC and r == 0:
                budget = _budget(runs[-1], sample, requests, expected_rows, settings)
        _pair(results, runs)
        for method, cands in by_method.items():
            next_arm[method] = _next_arm(cands, results, settings)

    chosen, reason = choose(list(results.values()), arms, settings.margin)
    if capped:
        reason += "; calibration budget reached, confirmation skipped"
    order = {label: i for i, label in enumerate(["none"] + [a.label for a in arms])}
    kept = _kept(complete, chosen, order, {s.label: s for s in [NO_SPEC, *arms]})
    seconds = clock() - start
    return Decision(
        chosen=chosen,
        arms=sorted(results.values(), key=lambda a: order.get(a.label, len(order))),
        baseline_tokens_per_s=results["none"].tokens_per_s,
        calibration_s=seconds,
        overhead_s=max(0.0, seconds - _credit(kept, runs)),
        capped=capped,
        reason=reason,
        shard_id=shard_id,
        finished=kept,
    )


@dataclass
class _Run:
    """One generate call of calibration: an arm on one round's rows."""

    label: str
    round: int
    seconds: float
    complete_share: float  # share of its output tokens in rows generated to their production end
    tokens: dict[str, int] = field(default_factory=dict)  # request id -> output tokens
    arm: ArmResult | None = None  # what this run alone measured (None for a projected run)


def _overhead(runs: Sequence[_Run]) -> float:
    """Seconds of calibration work that will not become output: in each round the rows generated to
    their end are kept once (credited at the cheapest run's rate); the rest is repeated work."""
    total = 0.0
    for r in {run.round for run in runs}:
        mine = [run for run in runs if run.round == r]
        cheapest = min(mine, key=lambda run: run.seconds)
        total += sum(run.seconds for run in mine) - cheapest.complete_share * cheapest.seconds
    return total


def _pair(results: dict[str, ArmResult], runs: Sequence[_Run]) -> None:
    """Each speculative arm's speedup over "none" on exactly the rounds both ran in."""
    plain_rounds = {run.round for run in runs if run.label == "none"}
    for label, arm in results.items():
        if label == "none" or not arm.measured:
            continue
        rounds = {run.round for run in runs if run.label == label} & plain_rounds
        paired = [[run.arm for run in runs if run.label == lab and run.round in rounds] for lab in (label, "none")]
        tokens = [sum(a.decode_tokens for a in side) for side in paired]
        seconds = [sum(a.decode_s for a in side) for side in paired]
        if all(tokens) and all(seconds):
            arm.speedup = (tokens[0] / seconds[0]) / (tokens[1] / seconds[1])


def _next_arm(cands: list[SpecConfig], results: dict[str, ArmResult],
              settings: CalibrationSettings) -> SpecConfig | None:
    """Predict every draft length of a method (its candidates `cands`) from its best-measured arm; return the one to measure
    next (the predicted best), or None when the method is out of the running."""
    measured = [results[c.label] for c in cands if c.label in results and results[c.label].measured
                and not results[c.label].error and results[c.label].speedup]
    base = results.get("none")
    if not measured or base is None:
        return None
    probe = max(measured, key=lambda a: a.target_steps)
    at_probe = predict_tokens_per_s(probe, probe.draft_len, base)
    best, best_speedup = None, 0.0
    for cand in sorted(cands, key=lambda s: s.draft_len):
        arm = results.setdefault(cand.label, ArmResult(cand.method, cand.draft_len))
        arm.predicted_tokens_per_s = predict_tokens_per_s(probe, cand.draft_len, base)
        if at_probe and arm.predicted_tokens_per_s:
            predicted = probe.speedup * arm.predicted_tokens_per_s / at_probe
            if predicted > best_speedup:
                best, best_speedup = cand, predicted
    if best is None or best_speedup < 1.0 - _HOPELESS:
        return None  # even its best predicted draft length is clearly slower than plain decoding
    return best if settings.confirm else next(c for c in cands if c.label == probe.label)


# A method leaves calibration when its best prediction is this far below plain decoding.
_HOPELESS = 0.10


def _kept(complete: dict[str, dict[str, Completion]], chosen: SpecConfig, order: dict[str, int],
          specs: dict[str, SpecConfig]) -> dict[str, tuple[Completion, SpecConfig]]:
    """Sample rows to keep as outputs, with the arm that made each: the chosen arm's if it finished
    the row, else plain decoding's, else any arm's. Every arm samples the target's distribution
    (greedy: the same tokens), so each is a correct output; the row records which arm made it."""
    prefer = sorted(complete, key=lambda label: (label != chosen.label, label != "none", order.get(label, 99)))
    kept: dict[str, tuple[Completion, SpecConfig]] = {}
    for label in prefer:
        for rid, c in complete[label].items():
            kept.setdefault(rid, (c, specs[label]))
    return kept


def _credit(kept: dict[str, tuple[Completion, SpecConfig]], runs: Sequence[_Run]) -> float:
    """Seconds of calibration that produced the kept rows: each run's time, shared out by tokens."""
    total = 0.0
    for rid, (_, spec) in kept.items():
        run = next(x for x in runs if x.label == spec.label and rid in x.tokens)
        total += run.seconds * run.tokens[rid] / max(1, sum(run.tokens.values()))
    return total


def _complete(c: Completion, max_tokens: int) -> bool:
    """Did calibration generate this row to the end it would have had in production?"""
    return c.finish_reason == "stop" or (c.finish_reason == "length" and c.output_tokens >= max_tokens)


def choose(results: Sequence[ArmResult], arms: Sequence[SpecConfig], margin: float) -> tuple[SpecConfig, str]:
    """The decision rule over measured arms: the best measured speedup over plain decoding wins,
    but speculation only when it beats "none" by more than `margin`. An arm's speedup is its
    paired figure (same rows as "none", back to back) when calibration recorded one, else its
    goodput over the baseline's. Arms with errors or no measurement never win; among equal
    speedups the shorter draft wins (less draft work, less memory)."""
    baseline = next((a for a in results if a.method == "none" and a.measured and a.tokens_per_s), None)
    if baseline is None:
        return NO_SPEC, "plain decoding could not be measured"
    usable = [a for a in results if a.measured and not a.error and a.tokens_per_s and a.method != "none"]
    if not usable:
        return NO_SPEC, "no speculative arm could be measured"
    best = max(usable, key=lambda a: (a.vs_none(baseline.tokens_per_s), -a.draft_len))
    ratio = best.vs_none(baseline.tokens_per_s)
    if ratio > 1 + margin:
        spec = next(s for s in arms if s.label == best.label)
        return spec, f"{best.label} measured {ratio:.2f}x plain decoding"
    return NO_SPEC, f"best arm {best.label} measured {ratio:.2f}x plain decoding, not above the {margin:.0%} margin"


def pick_sample(requests: Sequence[Request], n: int, max_tokens: int) -> list[Request]:
    """Evenly spaced rows (deterministic), with generation capped at `max_tokens`."""
    if len(requests) <= n:
        picked = list(requests)
    else:
        step = len(requests) / n
        picked = [requests[int(i * step)] for i in range(n)]
    return [replace(r, params=replace(r.params, max_tokens=min(r.params.max_tokens, max_tokens))) for r in picked]


def _budget(baseline: _Run, sample: Sequence[Request], shard: Sequence[Request], expected_rows: int | None,
            settings: CalibrationSettings) -> float:
    """Seconds of calibration overhead allowed: max_fraction of the shard's predicted time under
    plain decoding, at the rate (wall seconds per output token) of round 0's plain run.

    A row is predicted to generate what it generated in calibration, or its own max_tokens when
    calibration's cap cut it short."""
    tokens = sum(baseline.tokens.values())
    if not tokens or not baseline.tokens:
        return float("inf")
    full = {r.id: r.params.max_tokens for r in shard}
    capped_rows = sum(full.get(r.id, 0) > r.params.max_tokens for r in sample) / max(1, len(sample))
    tokens_per_row = tokens / len(baseline.tokens)
    mean_cap = sum(full.values()) / max(1, len(full))
    tokens_per_row = (1 - capped_rows) * tokens_per_row + capped_rows * max(tokens_per_row, mean_cap)
    rows = expected_rows if expected_rows is not None else len(shard)
    return settings.max_fraction * rows * tokens_per_row * baseline.seconds / tokens


def _probe(cands: list[SpecConfig]) -> SpecConfig:
    """The draft length measured first: the shortest candidate. It is the cheapest to measure and
    the likeliest to pay where speculation is marginal (large batches, low acceptance); longer
    drafts are predicted from its acceptance and costs, and the best prediction is confirmed."""
    return min(cands, key=lambda s: s.draft_len)


def _split(items: list, parts: int) -> list[list]:
    parts = max(1, min(parts, len(items)))
    return [items[i::parts] for i in range(parts)] if items else [[]]


# ---------------------------------------------------------------------------------------------
# Engines whose arms are builds (TensorRT-LLM): DESIGN.md "Calibration" item 5. Kept apart from
# the calibration rule above: these only decide which arms a worker can afford to build and
# account for what the builds cost.


def arms_are_builds(engine: Engine) -> bool:
    """True for engines where switching arms builds a new model instance (one live per worker)."""
    return bool(getattr(engine, "arms_are_builds", False))


def plan_builds(engine: Engine, arms: Sequence[SpecConfig], settings: CalibrationSettings) -> tuple[list[SpecConfig], CalibrationSettings, str]:
    """The arms a build engine calibrates, the settings it calibrates with, and a note.

    Each arm measured is one build (model load, CUDA-graph capture), and so is every return to
    "none": so one round (none, then one probe per method), no confirmation runs (each would be
    another build), and at most `max_builds_per_worker` builds over the worker's life. Arms that
    do not fit in what is left are dropped, last methods first, and the note says so."""
    one_round = replace(settings, rounds=1, confirm=False)
    left = settings.max_builds_per_worker - len(getattr(engine, "builds", ()))
    probes = [_probe([a for a in arms if a.method == m]) for m in dict.fromkeys(a.method for a in arms)]
    affordable = max(0, left - 1)  # "none" is built too
    kept = probes[:affordable]
    note = ""
    if len(kept) < len(probes):
        dropped = ", ".join(a.label for a in probes[len(kept):])
        note = f"build cap: {len(getattr(engine, 'builds', ()))} of max_builds_per_worker {settings.max_builds_per_worker} builds used on this worker; not calibrated: {dropped}"
    return kept, one_round, note


@dataclass(frozen=True)
class BuildCost:
    """Builds made while a shard ran, and their seconds (calibration cost on a build engine)."""

    builds: int = 0
    seconds: float = 0.0


def build_cost(engine: Engine, since: int) -> BuildCost:
    """The builds `engine` made after its first `since` (engine.builds records, seconds each)."""
    records = list(getattr(engine, "builds", ()))[since:]
    return BuildCost(len(records), sum(r.seconds for r in records))


def speculation_unmeasured(decision: Decision) -> str | None:
    """Why no speculative arm could be measured in a calibration that tried some (None when one
    was measured, or none was tried): the run must say so loudly, not look like "none paid"."""
    tried = [a for a in decision.arms if a.method != "none"]
    if decision.source != "calibrated" or not tried or any((a.measured or a.predicted_speedup) and not a.error for a in tried):
        return None
    return "; ".join(f"{a.label}: {a.error or 'not measured'}" for a in tried)[:500]


# -- counterfactual calibration: nothing repeated but a confirmation where it matters -------------


@dataclass
class WorkerCalibration:
    """What calibration keeps for the life of one worker (one engine): its cost profile, the shard
    keys it has confirmed a decision for, and how far its predictions were from confirmations."""

    profile: CostProfile = field(default_factory=CostProfile)
    confirmed_keys: set = field(default_factory=set)
    errors: list[float] = field(default_factory=list)  # |predicted / measured speedup - 1| per confirmation

    def prediction_error(self, default: float) -> float:
        return max(self.errors) if self.errors else default


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
    profile, and choose by predicted speedup. A paired run (the best arm on the sample's rows,
    against their plain run) confirms only on the first shard of a key on this worker, or when the
    prediction is within its own measured error of the margin; otherwise nothing is run twice."""
    worker = worker if worker is not None else WorkerCalibration()
    start = clock()
    budgets = {r.id: r.params.max_tokens for r in requests}
    sample = pick_sample(requests, settings.sample_rows(batch_size), settings.max_tokens)
    plain = engine.generate(sample, NO_SPEC, batch_size)
    base = ArmResult("none", 0)
    base.add(plain)
    finished = {c.id: (c, NO_SPEC) for c in plain.completions if _complete(c, budgets[c.id])}
    kept_s = _share_s(plain, finished)
    rows = plain_rows(engine, sample, plain)
    if not rows or not base.tokens_per_s:
        seconds = clock() - start
        return Decision(NO_SPEC, [base], base.tokens_per_s, seconds, max(0.0, seconds - kept_s), shard_id=shard_id,
                        reason="plain decoding of the sample gave nothing to predict from", finished=finished)
    broken = _broken_arms(engine, arms)
    arms = [a for a in arms if a.label not in broken]
    profile_s = _refresh_profile(engine, worker.profile, rows, arms, batch_size, max(budgets.values())) if arms else 0.0
    results = [base] + predict_arms(engine, rows, arms, plain, worker.profile, batch_size) + list(broken.values())
    chosen, reason = choose_predicted(results, arms, settings.margin)
    best = max((a for a in results if a.method != "none" and a.predicted_speedup), default=None,
               key=lambda a: (a.predicted_speedup, -a.draft_len))
    error = worker.prediction_error(settings.prediction_error)
    first = key not in worker.confirmed_keys
    near = best is not None and abs(best.predicted_speedup - (1 + settings.margin)) <= error * best.predicted_speedup
    confirmed = False
    if best is not None and settings.confirm and (first or near):
        spec = next(s for s in arms if s.label == best.label)
        ran = engine.generate(sample, spec, batch_size)  # the same rows as the plain run; its outputs are not kept
        best.add(ran)
        if ran.goodput and plain.goodput:
            measured = best.speedup = ran.goodput / plain.goodput
            confirmed = True
            worker.confirmed_keys.add(key)
            worker.errors.append(abs(best.predicted_speedup / measured - 1))
            chosen = spec if measured > 1 + settings.margin else NO_SPEC
            why = "first shard of its key on this worker" if first else f"prediction within its error ({error:.0%}) of the margin"
            reason += (f"; confirmed ({why}): {best.label} measured {measured:.2f}x plain decoding on the same "
                       f"{len(sample)} rows -> {chosen.label}")
    if any(a.acceptance_exact is False for a in results):
        reason += "; acceptance estimated (sampled rows: sum of min(p, q) along the sampled path)"
    seconds = clock() - start
    return Decision(
        chosen=chosen, arms=results, baseline_tokens_per_s=base.tokens_per_s, calibration_s=seconds,
        overhead_s=max(0.0, seconds - kept_s), reason=reason, shard_id=shard_id, finished=finished,
        profile_s=profile_s, confirmed=confirmed, profile=list(worker.profile.points),
    )


def _broken_arms(engine, arms: Sequence[SpecConfig]) -> dict[str, ArmResult]:
    """Arms the engine cannot run (a draft model that does not load), recorded with the reason."""
    broken = {}
    for arm in arms:
        try:
            engine.check(arm)
        except Exception as exc:  # an arm that fails is skipped and recorded, as when measured by running
            broken[arm.label] = ArmResult(arm.method, arm.draft_len, error=one_line(exc))
    return broken


def plain_rows(engine, requests: Sequence[Request], result: GenerateResult) -> list[PlainRow]:
    """The rows of a plain run that counterfactual acceptance can replay (not errors, not empty)."""
    return [PlainRow(engine.encode(r), c.token_ids, r.params.max_tokens, r.params.temperature, r.params.top_p)
            for r, c in zip(requests, result.completions) if c.finish_reason != "error" and c.token_ids]


def _refresh_profile(engine, profile: CostProfile, rows: Sequence[PlainRow], arms: Sequence[SpecConfig],
                     batch_size: int, max_tokens: int) -> float:
    """Measure the worker's step costs if the shard's batch size, context range or draft length
    leaves what was measured; returns the seconds spent (0 when the profile already covers it)."""
    lo = min(len(r.prompt_ids) for r in rows)
    hi = max(len(r.prompt_ids) for r in rows) + max_tokens
    width = 1 + max(a.draft_len for a in arms)
    drafts = sorted({a.draft_model for a in arms if a.method == "draft_target" and a.draft_model})
    if profile.covers(batch_size, lo, hi, width, drafts):
        return 0.0
    began = time.perf_counter()
    target, draft = profile_grid(batch_size, lo, hi, width, drafts)
    if profile.covers(batch_size, lo, hi, width, drafts, check_context=False):  # only the context range is new: its ends, plain width
        target, draft = [(batch_size, c, 1) for c in (lo, hi)], [(d, batch_size, hi) for d in drafts]
    points = engine.profile(target, draft, temperature=rows[0].temperature)
    seconds = time.perf_counter() - began
    profile.merge(points, seconds)
    return seconds


def predict_arms(engine, rows: Sequence[PlainRow], arms: Sequence[SpecConfig], plain: GenerateResult,
                 profile: CostProfile, batch_size: int) -> list[ArmResult]:
    """Every arm's counterfactual acceptance on `rows` and its goodput priced from `profile`,
    scaled to the machine's present speed by the plain run's measured decode time."""
    acceptance, lookup_s = _counterfactual(engine, rows, arms)
    steps = plain.target_steps
    other = plain.timing.other_s / steps if steps else 0.0
    none_plans = [RowPlan(len(r.prompt_ids), len(r.output_ids) - 1, [0] * (len(r.output_ids) - 1),
                          [0] * (len(r.output_ids) - 1)) for r in rows]
    none = predict_decode_s(none_plans, batch_size, profile, other_per_row_step=other)
    scale = plain.timing.decode_s / none.decode_s if none.decode_s > 0 and plain.timing.decode_s > 0 else 1.0
    results = []
    for arm in arms:
        acc = acceptance[arm.label]
        plans = [RowPlan(len(r.prompt_ids), len(r.output_ids) - 1, s, p) for r, s, p in zip(rows, acc.steps, acc.proposed)]
        priced = predict_decode_s(plans, batch_size, profile, arm.method, arm.draft_model, other, lookup_s)
        results.append(ArmResult(
            arm.method, arm.draft_len,
            predicted_tokens_per_s=priced.decode_tokens / (scale * priced.decode_s) if priced.decode_s > 0 else None,
            predicted_speedup=none.decode_s / priced.decode_s if priced.decode_s > 0 else None,
            acceptance_rate=acc.acceptance_rate, mean_accepted_len=acc.mean_accepted_len,
            acceptance_exact=acc.exact, target_steps=round(acc.target_steps), draft_tokens=acc.draft_tokens,
            accepted_tokens=round(acc.accepted_tokens),
        ))
    return results


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


def _arm_group(arm: SpecConfig) -> tuple:
    return (arm.method, arm.ngram_size if arm.method == "ngram" else 0, arm.draft_model or "")


def choose_predicted(results: Sequence[ArmResult], arms: Sequence[SpecConfig], margin: float) -> tuple[SpecConfig, str]:
    """The decision rule over predicted speedups: the best wins if it beats "none" by the margin;
    among equal speedups the shorter draft wins."""
    usable = [a for a in results if a.method != "none" and a.predicted_speedup]
    if not usable:
        return NO_SPEC, "no speculative arm could be predicted"
    best = max(usable, key=lambda a: (a.predicted_speedup, -a.draft_len))
    if best.predicted_speedup > 1 + margin:
        return next(s for s in arms if s.label == best.label), f"{best.label} predicted {best.predicted_speedup:.2f}x plain decoding"
    return NO_SPEC, (f"best arm {best.label} predicted {best.predicted_speedup:.2f}x plain decoding, "
                     f"not above the {margin:.0%} margin")


def _share_s(result: GenerateResult, kept: dict) -> float:
    """Seconds of a generate call that produced the rows in `kept`, shared out by output tokens."""
    total = result.output_tokens
    mine = sum(c.output_tokens for c in result.completions if c.id in kept)
    return result.timing.wall_s * mine / total if total else 0.0


def switch_on(engine, rows_done: Sequence[Request], result: GenerateResult, arms: Sequence[SpecConfig],
              worker: WorkerCalibration, batch_size: int, margin: float) -> tuple[SpecConfig | None, ArmResult | None]:
    """Drift under "none": the counterfactual of the rows just generated plainly. Returns the best
    arm and its prediction if its predicted speedup over them beats plain decoding by the margin,
    else (None, None). Free for n-gram lookup; one teacher-forced forward per draft model."""
    rows = plain_rows(engine, rows_done, result)
    if not rows or not worker.profile.points:
        return None, None
    results = predict_arms(engine, rows, arms, result, worker.profile, batch_size)
    spec, _ = choose_predicted(results, arms, margin)
    if spec is NO_SPEC:
        return None, None
    return spec, next(a for a in results if a.label == spec.label)
