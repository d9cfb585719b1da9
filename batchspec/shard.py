"""One shard, start to finish on one engine: generate under the calibration controller, account.

Calibrated, a shard runs under one `calibrate.Controller` whichever the engine: an engine that
switches arms between decode steps (the torch engine) takes it as the generate call's control; one
whose arms are builds (TensorRT-LLM) streams the shard's rows and calls it after every batch of
finished rows, a switch ending the segment of rows under one arm (`calibrate.run_segments`) and
priced at its build's seconds. Fixed, the shard runs under its one arm, its steps priced against
plain decoding afterwards (`calibrate.ledger.price_fixed`). Either way one `ShardStats` row
records it.

This module knows nothing about Parquet, storage or Ray; the pipeline's workers call `run_shard`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

from batchspec.calibrate import CalibrationSettings, Controller, Decision, WorkerState, fixed_decision, run_segments
from batchspec.calibrate.counterfactual import scope_of
from batchspec.calibrate.ledger import plain_price, price_fixed
from batchspec.calibrate.worker import LAST_SHARD
from batchspec.engine.base import NO_SPEC, Completion, Engine, GenerateResult, Request, SpecConfig
from batchspec.stats import ShardStats, suffix_columns


@dataclass
class ShardInput:
    shard_id: str
    shard_key: str | None
    requests: list[Request]


@dataclass
class ShardResult:
    completions: list[Completion]  # one per request, in order
    row_specs: list[SpecConfig]  # the setting each row finished under
    stats: ShardStats
    decision: Decision


def run_shard(engine: Engine, shard: ShardInput, arms: Sequence[SpecConfig], calibrate: bool, batch_size: int,
              settings: CalibrationSettings = CalibrationSettings(), prior: SpecConfig | None = None,
              worker: WorkerState | None = None, horizon_rows: int = 0,
              prior_why: str = LAST_SHARD) -> ShardResult:
    """`worker` holds what calibration keeps across one worker's shards (its cost table, its keys'
    last arms and rows), None calibrates as a fresh worker would; `prior` is the arm the driver
    starts the key under (the arm its last shard ended under on another worker, or what a prior run
    predicted best for it: `prior_why` says which); `horizon_rows` the key's rows this worker is
    expected to run after this shard (what an engine build can be repaid over)."""
    start = time.perf_counter()
    builds_before = len(engine.builds) if engine.arms_are_builds else 0
    worker = worker if worker is not None else WorkerState()
    spec_arms = [a for a in arms if a.method != "none"]
    suffix = any(a.method == "suffix" for a in spec_arms)
    if suffix:  # the key's rows share the suffix drafter's tree on this worker
        shard = replace(shard, requests=[replace(r, draft_scope=scope_of(shard.shard_key)) for r in shard.requests])
    if calibrate and spec_arms:
        control = Controller(engine, shard.requests, spec_arms, batch_size, settings, worker, shard.shard_key, prior,
                             horizon_rows=horizon_rows, prior_why=prior_why)
        if engine.in_flight_control:
            ran = engine.generate(shard.requests, control.start, batch_size, control=control)
        else:
            ran = run_segments(engine, shard.requests, control, batch_size)
        decision, row_specs = control.close(ran, shard.shard_id)
    else:
        chosen = spec_arms[0] if spec_arms else NO_SPEC
        ran = engine.generate(shard.requests, chosen, batch_size)
        speedup, baseline, profile_s, retime_s = price_fixed(engine, worker.costs, chosen, batch_size, ran)
        decision = replace(fixed_decision(chosen, "speculation off (--spec none)" if chosen is NO_SPEC else f"fixed by config: {chosen.label}"),
                           speedup=speedup, baseline_tokens_per_s=baseline, profile_s=profile_s, calibration_s=retime_s)
        row_specs = [chosen] * len(shard.requests)
    builds = engine.builds[builds_before:] if engine.arms_are_builds else []
    stats = _stats(engine, shard, ran, decision, batch_size, time.perf_counter() - start, builds)
    plain = plain_price(worker.costs, ran.steps, ran.timing.decode_s, decision.speedup)
    stats.plain_decode_s, stats.plain_decode_u = (plain.seconds, plain.u) if plain else (None, None)
    if decision.profile_s:
        stats.cost_profile = list(worker.costs.points)
    if suffix:
        stats = replace(stats, **suffix_columns(ran.completions, engine.trees.usage(scope_of(shard.shard_key))))
    if calibrate and spec_arms and not any(a.predicted_speedup or a.measured for a in decision.arms if a.method != "none"):
        failed = "; ".join(f"{a.label}: {a.error}" for a in decision.arms if a.error)
        stats.speculation_unmeasured = (failed or "no speculative arm could be estimated or run (its acceptance cannot "
                                        "be computed, and the rows left did not repay running it)")[:500]
    return ShardResult(ran.completions, row_specs, stats, decision)


def _stats(engine: Engine, shard: ShardInput, ran: GenerateResult, decision: Decision, batch_size: int, wall_s: float,
           builds: list) -> ShardStats:
    timing, caveats = ran.timing, ran.caveats
    if not decision.exact:
        caveats = {**caveats, "predicted_speedup": "estimate: sampled rows' counterfactual acceptance is an expectation"}
    spec = decision.chosen
    return ShardStats(
        shard_id=shard.shard_id,
        shard_key=None if shard.shard_key is None else str(shard.shard_key),
        rows=len(ran.completions),
        error_rows=sum(c.finish_reason == "error" for c in ran.completions),
        spec_method=spec.method,
        draft_len=spec.draft_len,
        acceptance_rate=ran.acceptance_rate,
        mean_accepted_len=ran.mean_accepted_len,
        output_tokens=ran.output_tokens,
        draft_tokens=ran.draft_tokens,
        accepted_tokens=ran.accepted_tokens,
        target_steps=ran.target_steps,
        decode_s=timing.decode_s,
        prefill_s=timing.prefill_s,
        draft_s=None if "draft_s" in caveats else timing.draft_s,  # not measured: no split claimed
        verify_s=None if "draft_s" in caveats else timing.verify_s,
        other_s=timing.other_s,
        tokens_per_s=ran.goodput if ran.completions else 0.0,
        baseline_tokens_per_s=decision.baseline_tokens_per_s,
        speedup=decision.speedup,
        calibration_s=decision.calibration_s + sum(b.seconds for b in builds if b.label != spec.label),
        decision_source=decision.source,
        decision_reason=decision.reason,
        wall_s=wall_s,
        engine=engine.name,
        model=engine.model_name,
        draft_model=spec.draft_model,
        batch_size=batch_size,
        candidates=list(decision.arms),
        builds=len(builds),
        build_s=sum(b.seconds for b in builds),
        caveats="; ".join(f"{k}: {v}" for k, v in sorted(caveats.items())) or None,
        predicted_speedup=decision.predicted_speedup,
        profile_s=decision.profile_s,
        cost_profile=[],
        events=list(decision.events),
        constrained_rows=sum(r.response_format is not None for r in shard.requests),
        forced_tokens=sum(c.forced_tokens for c in ran.completions),
    )
