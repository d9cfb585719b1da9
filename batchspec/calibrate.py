"""Per-shard calibration: measure on the shard's own prompts whether speculation pays, then choose.

The rule (DESIGN.md, from the seed documents): speculate only when

    (draft time + verify time + coordination time) / committed tokens  <  baseline time per token

by a margin (default 5%). Goodput is committed output tokens per second of decode time, measured
at the shard's production batch size, so batching effects are in the measurement, not guessed.

How it stays cheap and sound:
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

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from batchspec.engine.base import NO_SPEC, Completion, Engine, Request, SpecConfig
from batchspec.errors import one_line
from batchspec.predict import predict_tokens_per_s
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
    drift_chunk: int = field(default=0, metadata={"min": 0})  # rows per drift check; 0 = max(8 x batch size, 64)
    max_builds_per_worker: int = field(default=6, metadata={"min": 2})  # engines whose arms are builds (TensorRT-LLM): builds calibration may cause per worker (none and one arm at least)

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

    @property
    def chosen_arm(self) -> ArmResult | None:
        return chosen_arm(self.arms, self.chosen)

    def reused_by(self, shard_id: str) -> "Decision":
        return replace(self, source="reused", calibration_s=0.0, overhead_s=0.0, capped=False, finished={},
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
    if decision.source != "calibrated" or not tried or any(a.measured and not a.error for a in tried):
        return None
    return "; ".join(f"{a.label}: {a.error or 'not measured'}" for a in tried)[:500]
