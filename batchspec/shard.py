"""One shard, start to finish on one engine: decide the speculative setting, generate, account.

Where the engine switches settings between decode steps (the torch engine), a calibrated shard is
one generate call whose control (batchspec.calibrate.inflight) decodes the sample in the shard's
batch, decides, confirms and watches for drift inside it. Elsewhere:

    decision = calibrate (or reuse, or the fixed setting)
    generate in chunks, watching for drift both ways after each chunk, and record the first row
    where each change happened:
        speculating, the running arm predicted to lose to plain decoding on the chunk it just
        generated (greedy rows: its counterfactual on their outputs, which are plain decoding's),
        or else acceptance far below what calibration saw -> plain decoding; another arm predicted
        faster than the running one by the margin on that chunk -> that arm;
        under "none", counterfactual acceptance of a finished chunk says an arm now beats plain
        decoding by the margin -> that arm
    (switching on needs the margin, falling back only a predicted loss: no flapping at the edge)
    stats = one row for OUTPUT/stats (stats.ShardStats)

This module knows nothing about Parquet, storage or Ray; the pipeline's workers call `run_shard`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

from batchspec.calibrate import (
    CalibrationSettings,
    Decision,
    WorkerCalibration,
    arms_are_builds,
    build_cost,
    calibrate,
    calibrate_counterfactual,
    counterfactual_ready,
    fixed_decision,
    plan_builds,
    speculation_unmeasured,
)
from batchspec.calibrate.drift import Drift, DriftWatch
from batchspec.calibrate.inflight import InFlight
from batchspec.engine.base import (
    NO_SPEC,
    Completion,
    Engine,
    GenerateResult,
    Request,
    SpecConfig,
    Timing,
)
from batchspec.stats import ShardStats


@dataclass
class ShardInput:
    shard_id: str
    shard_key: str | None
    requests: list[Request]


@dataclass
class ShardResult:
    completions: list[Completion]  # one per request, in order
    row_specs: list[SpecConfig]  # the setting each row ran under
    stats: ShardStats
    decision: Decision


def decide(engine: Engine, shard: ShardInput, arms: Sequence[SpecConfig], calibrate_arms: bool, batch_size: int,
           settings: CalibrationSettings, prior: Decision | None, worker: WorkerCalibration | None = None) -> Decision:
    """Calibrate when asked and the shard is big enough (from counterfactual acceptance where the
    engine and arms allow it, else by running every arm); otherwise reuse or run fixed."""
    spec_arms = [a for a in arms if a.method != "none"]
    if not calibrate_arms or not spec_arms:
        chosen = spec_arms[0] if spec_arms and not calibrate_arms else NO_SPEC
        return fixed_decision(chosen, "speculation off (--spec none)" if chosen is NO_SPEC else f"fixed by config: {chosen.label}")
    if len(shard.requests) < settings.min_rows:
        if prior is not None:
            return prior.reused_by(shard.shard_id)
        return Decision(NO_SPEC, source="too_small",
                        reason=f"shard has {len(shard.requests)} rows (< {settings.min_rows}) and no earlier decision for its key; ran none")
    if arms_are_builds(engine):
        return _decide_by_builds(engine, shard, spec_arms, batch_size, settings, prior)
    if counterfactual_ready(engine, spec_arms):
        return calibrate_counterfactual(engine, shard.requests, spec_arms, batch_size, settings, shard_id=shard.shard_id,
                                        worker=worker, key=shard.shard_key)
    return calibrate(engine, shard.requests, spec_arms, batch_size, settings, shard_id=shard.shard_id)


def _in_flight(engine: Engine, shard: ShardInput, arms: Sequence[SpecConfig], calibrate_arms: bool, batch_size: int,
               settings: CalibrationSettings, worker: WorkerCalibration) -> InFlight | None:
    """The in-flight control that calibrates this shard inside its own batch, where that is how it
    calibrates: arms to calibrate, a shard big enough and with rows beyond its sample (a shard
    that is all sample runs the same either way), an engine that switches between decode steps,
    every arm's acceptance computable, and `calibration: in_flight` on; else None."""
    rows = len(shard.requests)
    if not (calibrate_arms and arms and settings.in_flight and rows >= settings.min_rows):
        return None
    if rows <= settings.sample_rows(batch_size, counterfactual=True):
        return None
    if not getattr(engine, "in_flight_control", False) or arms_are_builds(engine) or not counterfactual_ready(engine, arms):
        return None
    return InFlight(engine, shard.requests, list(arms), batch_size, settings, worker, shard.shard_key, shard.shard_id,
                    clock=getattr(engine, "clock", time.perf_counter))


def _decide_by_builds(engine: Engine, shard: ShardInput, arms: Sequence[SpecConfig], batch_size: int,
                      settings: CalibrationSettings, prior: Decision | None) -> Decision:
    """Engines whose arms are builds (TensorRT-LLM): a key is calibrated once and later shards of
    it reuse the decision (under the drift watch), so its builds are paid once and amortized over
    the key's shards; calibration builds each arm once (batchspec.calibrate.plan_builds), within
    the worker's build cap."""
    if prior is not None and prior.source in ("calibrated", "reused"):
        return replace(prior.reused_by(shard.shard_id), reason=f"arms are builds: reused the decision of {prior.shard_id}")
    kept, one_round, note = plan_builds(engine, arms, settings)
    if not kept:
        return Decision(NO_SPEC, source="capped", reason=note or "no arm could be built", shard_id=shard.shard_id)
    clock = getattr(engine, "clock", time.perf_counter)
    decision = calibrate(engine, shard.requests, kept, batch_size, one_round, shard_id=shard.shard_id, clock=clock)
    if note:
        decision.reason += f"; {note}"
    return decision


def run_shard(engine: Engine, shard: ShardInput, arms: Sequence[SpecConfig], calibrate: bool, batch_size: int,
              settings: CalibrationSettings = CalibrationSettings(), prior: Decision | None = None,
              worker: WorkerCalibration | None = None) -> ShardResult:
    """`worker` carries what calibration keeps across one worker's shards (its cost profile, the
    keys it confirmed); None calibrates as a fresh worker would."""
    clock = getattr(engine, "clock", time.perf_counter)  # an engine that times itself (and its builds)
    start = clock()
    builds_before = len(getattr(engine, "builds", ()))
    worker = worker if worker is not None else WorkerCalibration()
    spec_arms = [a for a in arms if a.method != "none"]
    caveats: dict[str, str] = {}
    control = _in_flight(engine, shard, spec_arms, calibrate, batch_size, settings, worker)
    if control is not None:  # one generate call; calibration rides in it (batchspec.calibrate.inflight)
        ran = engine.generate(shard.requests, control.start, batch_size, control=control)
        caveats.update(ran.caveats)
        decision, row_specs = control.close(ran)
        completions, timing, drift = ran.completions, ran.timing, control.drift
        timing.other_s += control.watch_s  # the drift checks are decode-time work of this shard, as in _watch
        kept = len(control.first)
    else:
        decision = decide(engine, shard, arms, calibrate, batch_size, settings, prior, worker)
        watch = DriftWatch(engine, spec_arms, worker, batch_size, settings.margin) \
            if calibrate and counterfactual_ready(engine, spec_arms) and worker.profile.points else None
        completions, row_specs, timing, drift = generate_watching(engine, shard.requests, decision, batch_size, settings,
                                                                  caveats, watch)
        kept = sum(r.id in decision.finished for r in shard.requests)
    builds = build_cost(engine, builds_before)
    result = GenerateResult(completions, timing)
    generated = GenerateResult([c for c in completions if c.id not in decision.finished], timing)
    tokens_per_s = generated.goodput if generated.completions else (decision.chosen_arm.tokens_per_s or 0.0)
    spec = decision.chosen
    stats = ShardStats(
        shard_id=shard.shard_id,
        shard_key=None if shard.shard_key is None else str(shard.shard_key),
        rows=len(completions),
        error_rows=sum(c.finish_reason == "error" for c in completions),
        spec_method=spec.method,
        draft_len=spec.draft_len,
        acceptance_rate=result.acceptance_rate,
        mean_accepted_len=result.mean_accepted_len,
        output_tokens=result.output_tokens,
        draft_tokens=result.draft_tokens,
        accepted_tokens=result.accepted_tokens,
        target_steps=result.target_steps,
        decode_s=timing.decode_s,
        prefill_s=timing.prefill_s,
        draft_s=None if "draft_s" in caveats else timing.draft_s,  # not measured: no split claimed
        verify_s=None if "draft_s" in caveats else timing.verify_s,
        other_s=timing.other_s,
        tokens_per_s=tokens_per_s,
        baseline_tokens_per_s=decision.baseline_tokens_per_s,
        speedup=_measured_speedup(decision),
        calibration_s=decision.calibration_s,
        calibration_overhead_s=decision.overhead_s,
        calibration_capped=decision.capped,
        calibration_rows_kept=kept,
        decision_source=decision.source,
        decision_reason=decision.reason,
        drift_fallback_row=drift.fallback_row,
        wall_s=clock() - start,
        engine=engine.name,
        model=engine.model_name,
        draft_model=spec.draft_model,
        batch_size=batch_size,
        candidates=list(decision.arms),
        builds=builds.builds,
        build_s=builds.seconds,
        speculation_unmeasured=speculation_unmeasured(decision),
        caveats="; ".join(f"{k}: {v}" for k, v in sorted(caveats.items())) or None,
        predicted_speedup=decision.chosen_arm.predicted_speedup if decision.chosen_arm else None,
        calibration_confirmed=decision.confirmed,
        profile_s=decision.profile_s,
        drift_switch_row=drift.switch_row,
        drift_switch_arm=drift.switch_arm,
        drift_switch_predicted=drift.switch_predicted,
        cost_profile=decision.profile,
        constrained_rows=sum(r.response_format is not None for r in shard.requests),
        forced_tokens=sum(c.forced_tokens for c in completions),
    )
    return ShardResult(completions, row_specs, stats, decision)


def _measured_speedup(decision: Decision) -> float | None:
    """The chosen arm's goodput over plain decoding's, both measured in calibration on the same
    rows, back to back. (The shard's own tokens_per_s is not compared with the calibration
    baseline: a short calibration sample drains its batch as rows finish, so its absolute figures
    run lower than a continuously refilled production batch.)"""
    arm = decision.chosen_arm
    return arm.vs_none(decision.baseline_tokens_per_s) if arm is not None else None


def generate_watching(engine: Engine, requests: Sequence[Request], decision: Decision, batch_size: int,
                      settings: CalibrationSettings, caveats: dict[str, str] | None = None, switch=None,
                      ) -> tuple[list[Completion], list[SpecConfig], Timing, Drift]:
    """Generate under the decision in chunks, watching for drift both ways.

    Speculating, a chunk on which the arm is predicted to lose to plain decoding (`switch.speculating`,
    from the chunk's own greedy outputs), or, where that cannot tell, whose acceptance falls below
    `drift_ratio` x calibration's, sends what follows to plain decoding (or to an arm predicted to
    pay by the margin); one on which another arm is predicted faster than the running one by the
    margin sends it to that arm (a draft length the sample misjudged). Under "none" with a
    `switch` check (counterfactual acceptance of the chunk just generated), a chunk where an arm
    would have beaten plain decoding by the margin sends what follows to that arm. Both can
    happen more than once; the first row of each is recorded (each row's setting is in
    `row_specs`). Rows that calibration already generated to their end are kept as they are
    (their time was counted as calibration); only the rest are generated here. The engine's
    caveats (figures it estimated or did not measure) are gathered into `caveats`."""
    caveats = {} if caveats is None else caveats
    spec = decision.chosen
    todo = [r for r in requests if r.id not in decision.finished]
    calibrated = decision.chosen_arm.acceptance_rate if decision.chosen_arm else None
    if switch is None and (spec.method == "none" or calibrated is None):  # nothing to watch with
        result = engine.generate(todo, spec, batch_size)
        caveats.update(result.caveats)
        done, specs, timing, drift = result.completions, [spec] * len(todo), result.timing, Drift()
    else:
        done, specs, timing, drift = _watch(engine, todo, spec, calibrated, batch_size, settings, caveats, switch)
    by_id = {c.id: (c, s) for c, s in zip(done, specs)}
    merged = [by_id.get(r.id) or decision.finished[r.id] for r in requests]
    return [c for c, _ in merged], [s for _, s in merged], timing, drift


def _watch(engine: Engine, requests: Sequence[Request], spec: SpecConfig, calibrated: float | None, batch_size: int,
           settings: CalibrationSettings, caveats: dict[str, str], switch) -> tuple[list[Completion], list[SpecConfig], Timing, Drift]:
    chunk = settings.drift_chunk or 8 * batch_size
    completions: list[Completion] = []
    specs: list[SpecConfig] = []
    timing = Timing()
    drift = Drift()
    for begin in range(0, len(requests), chunk):
        part = requests[begin : begin + chunk]
        result = engine.generate(part, spec, batch_size)
        caveats.update(result.caveats)
        completions += result.completions
        specs += [spec] * len(part)
        timing = timing + result.timing
        if begin + len(part) >= len(requests):
            break
        row = begin + len(part)
        began = time.perf_counter()
        spec, calibrated = drift.after_chunk(row, spec, calibrated, part, result, switch, settings.drift_ratio)
        timing.other_s += time.perf_counter() - began  # the checks are decode-time work of this shard
    return completions, specs, timing, drift
