"""Calibration by running every arm, for engines where acceptance cannot be computed from a plain
run (TensorRT-LLM's Eagle3/MTP, or an engine without teacher-forced logits and a cost profile):
`calibrate`.

1. A sample of the shard's rows (evenly spaced), split into rounds of about one production batch;
   generation capped at a few tokens per row.
2. Round 0 runs "none" and one draft length per method (the shortest candidate: the cheapest
   probe, and the likeliest to pay where speculation is marginal), in a rotating order.
3. From each measured arm, fit the per-token acceptance a (mean accepted length
   (1 - a^(k+1)) / (1 - a), Leviathan et al.; batchspec.predict.probe) and the per-step draft and
   verify costs, and predict goodput at every candidate draft length. Each later round runs "none"
   and the predicted best draft length per method (the confirmation); a method whose best
   prediction is clearly below plain decoding leaves the running.
4. Every arm is compared with "none" on the rounds both ran in (paired: same rows, back to back).
   The best measured speedup wins (`decision.choose`); "none" unless it beats plain decoding by
   the margin. Every arm, measured or predicted, is recorded.
5. Sample rows generated to their end are kept as outputs, whichever arm made them: the engine is
   lossless, so each is a correct output (greedy: the same tokens), and the row records its arm.
   Calibration's cost is what is not kept (repeated work). A budget caps that cost at a fraction
   of the shard's expected time: round 0 always runs; a confirmation that would exceed the
   budget is skipped, and the decision says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from batchspec.calibrate.decision import CalibrationSettings, Decision, choose, is_complete, pick_sample
from batchspec.engine.base import NO_SPEC, Completion, Engine, Request, SpecConfig
from batchspec.errors import one_line
from batchspec.predict.probe import predict_tokens_per_s
from batchspec.stats import ArmResult


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
    next_arm: dict[str, SpecConfig | None] = {m: probe_arm(c) for m, c in by_method.items()}

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
            done = {c.id: c for c in result.completions if is_complete(c, full_budget[c.id])}
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


def probe_arm(cands: list[SpecConfig]) -> SpecConfig:
    """The draft length measured first: the shortest candidate. It is the cheapest to measure and
    the likeliest to pay where speculation is marginal (large batches, low acceptance); longer
    drafts are predicted from its acceptance and costs, and the best prediction is confirmed."""
    return min(cands, key=lambda s: s.draft_len)


def _split(items: list, parts: int) -> list[list]:
    parts = max(1, min(parts, len(items)))
    return [items[i::parts] for i in range(parts)] if items else [[]]
