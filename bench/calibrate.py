"""Calibration benchmark (issue 3): per-shard calibrated choice vs the oracle vs plain decoding.

Four workload shards (code, extraction, copy-heavy edit, free prose; shard-by workload). For each
shard, side by side in one run:
- calibrated: the pipeline's own decision (`shard.decide`: on the torch engine, counterfactual
  acceptance from a plain run of a sample, priced from the worker's cost profile, confirmed by a
  measured run where it matters), then the chosen arm on the whole shard;
- oracle: every arm (plain and each candidate) run on the whole shard, interleaved chunk by chunk,
  the best taken;
- plain: the "none" arm.
The chosen arm's figure comes from that same interleaved run (a separate whole-shard run at
another moment measured the machine's load, not the choice: 0.5x-0.7x swings were seen).
Targets (issue 12): calibrated >= 0.95x oracle on every shard, never below 0.97x plain,
calibration overhead <= 2% of the shard's wall time (for shards of 128 prompts). The worker's cost
profile is a cost per worker, paid on its first shard (and again only when a shard leaves what it
measured): the table shows the overhead with it and without it.

tokens/s here is goodput (committed tokens per second of decode time, calibration's own measure:
prefill is the same for every arm). The shard's wall time is the pipeline's: calibration, then the
rows calibration did not finish, at the chosen arm's rate. Calibration's cost is the part of its
time whose work was not kept (`Decision.overhead_s`: sample rows generated to their end are kept
as outputs, so only repeated work costs); all calibration time is reported beside it, and so is
the shard end to end against plain decoding of the whole shard. Per arm, the predicted speedup
(from the sample) is set beside the speedup the interleaved whole-shard run measured (target:
within 10%), with that measurement's own 90% interval (the oracle's chunks drawn again with
replacement), and so is the prediction from the whole shard's acceptance (the plain arm's
outputs) priced on the oracle's own chunks, which leaves the sample out: its error is the cost
model's, whole and chunk by chunk (median and quartiles). One `WorkerCalibration`
serves every shard, as one worker's would. Arms come from
trt_configs/candidates/torch_default.yaml (draft-model arms only with --draft-model). Writes
OUT/calibrate.json and OUT/calibrate.md.

With --in-flight --later-shard, each benched shard is its key's second on the worker: a first
shard of other rows of the workload runs before it, unbenched, and the benched shard's sample
decodes under the setting that one ended under (calibrate.inflight `InFlight._start`). That is
the steady state of a job with many shards per key; a key's first shard on a worker decodes its
sample plainly, and the oracle gap of a paying workload is then the sample's share (bench/HISTORY.md).

With --ended-under ARM each key's first shard is taken to have ended under ARM whatever it chose:
the benched shard starts under that arm (the probe's case: a later shard started under a losing arm).

    python bench/calibrate.py [--quick] [--rows 128] [--model smollm2-135m] [--draft-model NAME]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import results, workloads  # noqa: E402
from common.measure import (  # noqa: E402
    RESULTS,
    choose_threads,
    command,
    fmt,
    interleaved,
    load_engine,
    machine,
    machine_line,
    write,
)

from batchspec.calibrate import CalibrationSettings, WorkerCalibration, plain_rows, predict_arms  # noqa: E402
from batchspec.calibrate.pricing import Anchor, anchor_of_steps, arm_price_s, none_plans  # noqa: E402
from batchspec.config.candidates import default_candidates_path, load_candidates  # noqa: E402
from batchspec.engine.base import NO_SPEC, GenerateResult, Request, SpecConfig, Timing  # noqa: E402
from batchspec.errors import BatchspecError  # noqa: E402
from batchspec.predict.replay import predict_decode_s  # noqa: E402
from batchspec.shard import ShardInput, decide, run_shard  # noqa: E402


def candidate_arms(draft_model: str | None) -> list[SpecConfig]:
    """The shipped default arms for the torch engine; draft-model arms only when a draft is given."""
    arms = []
    for arm in load_candidates(default_candidates_path("torch")):
        if arm.method == "draft_target":
            if draft_model is None:
                continue
            arm = dataclasses.replace(arm, draft_model=draft_model)
        arms.append(arm)
    return arms


def oracle_chunk_rows(batch_size: int, asked: int | None = None) -> int:
    """Rows per generate call of the oracle's interleaved runs: `asked` (--oracle-chunk), else two
    batches' worth, at least 8."""
    return asked or max(2 * batch_size, 8)


def bench_shard(engine, workload: str, rows: int, max_tokens: int, batch_size: int, arms: Sequence[SpecConfig],
                settings: CalibrationSettings, worker: WorkerCalibration | None = None, in_flight: bool = False,
                requests: Sequence[Request] | None = None, oracle_chunk: int | None = None) -> dict:
    """Calibrate the shard (the pipeline's own `decide`), then run every arm on the whole shard,
    interleaved. The calibrated choice's figure is its arm's from that interleaved run, so noise
    on this shared machine hits it, the oracle and plain alike; its end-to-end figure adds the
    calibration time and leaves out the rows calibration kept.

    With `in_flight` the shard runs as the pipeline runs it on the torch engine (`run_shard`:
    calibration inside the shard's own batch, the drift watch after it) and the decision is that
    run's; the end-to-end figure is that run's own wall time, and the shard's goodput (every
    setting it ran, switches included) is set beside plain decoding's. `requests`: the shard's rows
    (--input); else `rows` of the bench's own `workload`."""
    requests = list(requests) if requests is not None else workloads.requests(workload, rows, max_tokens)
    rows = len(requests)
    ran = None
    before = worker.settled.get(workload) if worker is not None else None  # the key's last setting on the worker
    ran_steps = None
    if in_flight:
        ran = run_shard(engine, ShardInput(workload, workload, requests), arms, True, batch_size, settings, worker=worker)
        decision = ran.decision
        ran_steps = (list(getattr(engine, "last_steps", [])), ran.stats.verify_s)  # the shard's own generate call
    else:
        decision = decide(engine, ShardInput(workload, workload, requests), arms, True, batch_size, settings, None, worker)
    oracle_arms = [("none", NO_SPEC, batch_size)] + [(a.label, a, batch_size) for a in arms]
    chunk = oracle_chunk_rows(batch_size, oracle_chunk)
    measured = interleaved(engine, requests, oracle_arms, chunk=chunk)
    summaries = {label: m.summary() for label, m in measured.items()}
    best = max(summaries.values(), key=lambda a: a["goodput"])
    plain, chosen = summaries["none"], summaries[decision.chosen.label]
    # The shard as the pipeline runs it: calibration, then the rows calibration did not finish, at
    # the chosen arm's whole-shard rate from the interleaved run.
    kept = len(decision.finished)
    shard_wall = decision.calibration_s + chosen["wall_s"] * (rows - kept) / rows
    flight = {}
    if ran is not None:
        kept, shard_wall = ran.stats.calibration_rows_kept, ran.stats.wall_s
        st = ran.stats
        decode_tokens = GenerateResult(ran.completions, Timing()).decode_tokens  # goodput's tokens: not prefill's first
        goodput = decode_tokens / st.decode_s if st.decode_s else None
        flight = {"in_flight": {"wall_s": st.wall_s, "goodput": goodput, "decode_tokens": decode_tokens,
                                "output_tokens": st.output_tokens, "decode_s": st.decode_s,
                                "goodput_vs_plain": goodput / plain["goodput"] if goodput and plain["goodput"] else None,
                                "switch_row": st.drift_switch_row, "switch_arm": st.drift_switch_arm,
                                "switch_predicted": st.drift_switch_predicted,
                                "fallback_row": st.drift_fallback_row, "confirmed": st.calibration_confirmed,
                                "sample_under": before.label if before is not None and
                                "the sample decoded in the shard's batch under " in decision.reason else "none",
                                "rows_by_setting": {label: sum(r.label == label for r in ran.row_specs)
                                                    for label in sorted({r.label for r in ran.row_specs})}}}
    whole, scale = _whole_shard(engine, requests, measured, chunk, arms, worker, batch_size, decision)
    if worker is not None and worker.profile.points:
        flight["prices"] = _prices(measured, worker, ran_steps)
    vs_oracle = chosen["goodput"] / best["goodput"] if best["goodput"] else None
    vs_plain = chosen["goodput"] / plain["goodput"] if plain["goodput"] else None
    decided = {"decision_vs_oracle": vs_oracle, "decision_vs_plain": vs_plain}
    if ran is not None:  # what the shard delivered: every setting it ran, each on its own rows
        mixed = _as_ran(measured, [s.label for s in ran.row_specs], chunk)
        flight["in_flight"]["settings_goodput"] = mixed
        vs_oracle = mixed / best["goodput"] if mixed and best["goodput"] else None
        vs_plain = mixed / plain["goodput"] if mixed and plain["goodput"] else None
    return {**flight, **decided,
        "shard": workload, "rows": rows, "chosen": decision.chosen.label, "reason": decision.reason,
        "calibrated_tokens_per_s": chosen["goodput"], "calibrated_acceptance": chosen["acceptance_rate"],
        "oracle": best["label"], "oracle_tokens_per_s": best["goodput"], "plain_tokens_per_s": plain["goodput"],
        "vs_oracle": vs_oracle, "vs_plain": vs_plain,
        "end_to_end_vs_plain": plain["wall_s"] / shard_wall if shard_wall else None,
        "calibration_s": decision.calibration_s, "calibration_overhead_s": decision.overhead_s,
        "calibration_rows_kept": kept, "shard_wall_s": shard_wall,
        "calibration_share": decision.overhead_s / shard_wall if shard_wall else None,
        "calibration_share_without_profile": (decision.overhead_s - decision.profile_s) / shard_wall if shard_wall else None,
        "calibration_time_share": decision.calibration_s / shard_wall if shard_wall else None,
        "calibration_capped": decision.capped,
        "calibration_arms": [a.to_struct() for a in decision.arms], "oracle_arms": list(summaries.values()),
        "profile_s": decision.profile_s, "confirmed": decision.confirmed,
        "predicted_vs_measured": _predicted_vs_measured(decision, summaries, whole, _spread(measured)),
        "plain_measured_over_profile": scale,
    }


def _as_ran(measured: dict, labels: Sequence[str], chunk: int) -> float | None:
    """The goodput of the settings a shard ran in flight (`labels`: each row's, in request order),
    measured on the interleaved run: each chunk's decode time and tokens as the share of its rows
    each setting ran, at that setting's measured figures on the chunk. The in-flight run's own
    goodput came at another moment of this shared machine; this sets its choices beside the
    oracle and plain decoding under the same noise."""
    seconds = tokens = 0.0
    for i, begin in enumerate(range(0, len(labels), chunk)):
        mine = labels[begin : begin + chunk]
        for label in set(mine):
            share = mine.count(label) / len(mine)
            part = measured[label].parts[i]
            seconds += share * part.timing.decode_s
            tokens += share * part.decode_tokens
    return tokens / seconds if seconds > 0 else None


def _prices(measured: dict, worker: WorkerCalibration, ran: tuple[list, float] | None) -> dict:
    """What decomposes a prediction's error into its parts, per arm of the oracle: the target's
    forwards as measured (verify time: the forward and the accept rule, as the profile times them)
    over the profile's price of the very steps the arm ran (each at its rows, context and width),
    and the bookkeeping and the drafting per row and step. Plain decoding's ratio is the anchor's
    scale for this shard; an arm whose ratio differs from it is priced off by the width curve; the
    anchor the shard's decision used (the worker's, after it) is beside them, and so is the
    pipeline's own run of the shard. (First GPU run, H200: predictions high by 12-50% at batch 4 and
    8 with these parts unrecorded.)"""
    out: dict = {}
    unit = Anchor(1.0, 0.0)
    plain = measured["none"]
    plain_steps = [s for part in plain.steps for s in part]
    anchor = anchor_of_steps(plain.timing, plain_steps, worker.profile) if plain_steps else None
    for label, arm in measured.items():
        steps = [s for part in arm.steps for s in part]
        price = arm_price_s(steps, NO_SPEC, unit, worker.profile)  # the target's forwards alone
        t = arm.timing
        row_steps = sum(s.rows for s in steps)
        # the steps priced as a prediction prices them: forwards from the profile, plain decoding's
        # bookkeeping per row and step (predict_decode_s: the anchor's scale cancels in a speedup)
        priced = price + (anchor.other * row_steps if anchor else 0.0)
        out[label] = {"forward_over_price": t.verify_s / price if price > 0 else None,
                      "decode_over_its_price": (t.verify_s + t.other_s) / priced if priced > 0 else None,
                      "other_us_per_row_step": 1e6 * t.other_s / row_steps if row_steps else None,
                      "draft_us_per_row_step": 1e6 * t.draft_s / row_steps if row_steps else None,
                      "steps": len(steps), "row_steps": row_steps}
    if ran is not None and ran[0] and ran[1]:
        price = arm_price_s(ran[0], NO_SPEC, unit, worker.profile)
        out["in_flight"] = {"forward_over_price": ran[1] / price if price > 0 else None, "steps": len(ran[0])}
    base = out["none"]["decode_over_its_price"]
    for label in measured:  # over plain decoding's: how far the model misprices the arm against plain decoding
        mine = out[label]["decode_over_its_price"]  # given the steps it ran (> 1: its predicted speedup runs high)
        out[label]["cost_vs_plain_over_model"] = mine / base if mine and base else None
    out["plain_anchor"] = {"scale": anchor.scale, "other_us_per_row_step": 1e6 * anchor.other} if anchor else None
    used = worker.anchor
    out["worker_anchor"] = {"scale": used.scale, "other_us_per_row_step": 1e6 * used.other} if used else None
    return out


def _whole_shard(engine, requests, measured: dict, chunk: int, arms: Sequence[SpecConfig],
                 worker: WorkerCalibration | None, batch_size: int, decision) -> tuple[dict[str, dict], float | None]:
    """Every arm's speedup predicted as calibration predicts it, but from the whole shard's
    acceptance (the interleaved plain run's outputs; exact for greedy) instead of the sample's,
    and priced on the schedule the oracle ran: chunk by chunk, each chunk a generate call that
    drains its batch (a replay of one 64-row run would price fewer half-empty steps than the
    oracle ran). Set beside the measured speedup, it is the cost model's own error, the sample's
    left out. Per arm also the error chunk by chunk (predicted over measured, each chunk's arms
    run back to back): their median is the cost model's bias, their spread the noise of one
    chunk's measurement. And the plain run's measured decode time over the profile's price of it
    (the anchor's scale: how far the profile's probes are from real plain decoding, the
    machine's drift included). Also per arm (`one_call`, in the JSON) the whole shard's
    acceptance priced as one generate call of all its rows, as the pipeline runs a shard: beside
    the sample's prediction it is the sample's error alone, beside the chunked price the
    schedule's (fast model, held-out, batch 8, 2026-12-05: the chunks priced 2-4% lower, every arm)."""
    if worker is None or not worker.profile.points:
        return {}, None
    broken = {a.label for a in decision.arms if a.error}  # arms calibration found the engine cannot run
    usable = [a for a in arms if a.label not in broken and a.label in measured]
    plain = measured["none"]
    rows = plain_rows(engine, requests, plain.result)
    anchor = Anchor.of(plain.result, rows, worker.profile, batch_size)
    priced = {a.label: 0.0 for a in usable}
    none_s = 0.0
    errors: dict[str, list[float]] = {a.label: [] for a in usable}
    for i, begin in enumerate(range(0, len(requests), chunk)):
        part = plain_rows(engine, requests[begin : begin + chunk], plain.parts[i])
        if not part:
            continue
        none = predict_decode_s(none_plans(part), batch_size, worker.profile, other_per_row_step=anchor.other).decode_s
        none_s += none
        for arm in predict_arms(engine, part, usable, anchor, worker.profile, batch_size):
            if not arm.predicted_speedup:
                continue
            priced[arm.label] += none / arm.predicted_speedup
            ran, base = measured[arm.label].parts[i].goodput, plain.parts[i].goodput
            if ran > 0 and base > 0:
                errors[arm.label].append(arm.predicted_speedup / (ran / base) - 1)
    one_call = {a.label: a.predicted_speedup for a in predict_arms(engine, rows, usable, anchor, worker.profile, batch_size)}
    return ({label: {"speedup": none_s / s if s > 0 else None, "chunk_errors": errors[label],
                     "one_call": one_call.get(label)} for label, s in priced.items()},
            anchor.scale)


def _spread(measured: dict, draws: int = 2000, seed: int = 0) -> dict[str, tuple[float, float]]:
    """Per arm: the 5th and 95th percentiles of its measured speedup over plain decoding when the
    oracle's chunks are drawn again with replacement (each chunk's arms ran back to back on the
    same rows): how far the measurement itself could have moved with the rows and moments it
    happened to get. A prediction cannot be held to ±10% of a measurement that moves more."""
    plain = measured["none"].parts
    rng = random.Random(seed)
    out = {}
    for label, arm in measured.items():
        if label == "none" or len(arm.parts) != len(plain) or not plain:
            continue
        parts = [(p.decode_tokens, p.timing.decode_s, a.decode_tokens, a.timing.decode_s) for p, a in zip(plain, arm.parts)]
        ratios = []
        for _ in range(draws):
            pick = [parts[rng.randrange(len(parts))] for _ in parts]
            base_tok, base_s, arm_tok, arm_s = (sum(x[j] for x in pick) for j in range(4))
            if base_s > 0 and arm_s > 0 and base_tok > 0:
                ratios.append((arm_tok / arm_s) / (base_tok / base_s))  # goodput over goodput, as measured_speedup
        ratios.sort()
        if ratios:
            out[label] = (ratios[int(0.05 * (len(ratios) - 1))], ratios[int(0.95 * (len(ratios) - 1))])
    return out


def _predicted_vs_measured(decision, summaries: dict, whole: dict[str, dict] | None = None,
                           spread: dict[str, tuple[float, float]] | None = None) -> list[dict]:
    """Per arm: the speedup calibration predicted (from its sample), the one the interleaved
    whole-shard run measured (the arm's goodput over plain decoding's) with its bootstrap interval
    (`_spread`), and the one predicted from the whole shard's acceptance (`whole`: the cost
    model's error without the sample's), with its error chunk by chunk."""
    plain = summaries["none"]["goodput"]
    whole, spread = whole or {}, spread or {}
    out = []
    for arm in decision.arms:
        if arm.method == "none" or arm.label not in summaries:
            continue
        measured = summaries[arm.label]["goodput"] / plain if plain else None
        mine = whole.get(arm.label, {})
        predicted, from_shard = arm.predicted_speedup, mine.get("speedup")
        chunk_errors = sorted(mine.get("chunk_errors", []))
        out.append({"arm": arm.label, "predicted_speedup": predicted, "measured_speedup": measured,
                    "measured_interval": spread.get(arm.label),
                    "error": predicted / measured - 1 if predicted and measured else None,
                    "predicted_from_whole_shard": from_shard,
                    "predicted_from_whole_shard_one_call": mine.get("one_call"),
                    "error_from_whole_shard": from_shard / measured - 1 if from_shard and measured else None,
                    "chunk_errors": chunk_errors,
                    "chunk_error_median": statistics.median(chunk_errors) if chunk_errors else None,
                    "chunk_error_quartiles": (statistics.quantiles(chunk_errors, n=4)[::2]
                                              if len(chunk_errors) >= 2 else None)})
    return out


def prediction_table(shards: Sequence[dict]) -> str:
    lines = ["| shard | arm | predicted speedup | measured speedup (whole shard) | its 90% interval (chunks redrawn) "
             "| error (target within 10%) | predicted from the whole shard's acceptance | its error (the cost model's) "
             "| per chunk: median error (quartiles) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in shards:
        for a in r["predicted_vs_measured"]:
            lo_hi = a.get("measured_interval")
            quart = a.get("chunk_error_quartiles")
            lines.append(f"| {r['shard']} | {a['arm']} | {fmt(a['predicted_speedup'])}x | {fmt(a['measured_speedup'])}x "
                         f"| {f'{lo_hi[0]:.2f}-{lo_hi[1]:.2f}x' if lo_hi else '-'} "
                         f"| {_pct(a['error'])} | {fmt(a.get('predicted_from_whole_shard'))}x | {_pct(a.get('error_from_whole_shard'))} "
                         f"| {_pct(a.get('chunk_error_median'))}"
                         f"{f' ({_pct(quart[0])} to {_pct(quart[1])})' if quart else ''} |")
    return "\n".join(lines)


def shard_table(shards: Sequence[dict]) -> str:
    in_flight = any(r.get("in_flight") for r in shards)
    first = "| shard | rows | chosen at the sample | its tok/s | oracle (arm) tok/s | plain tok/s | as run in flight: vs oracle (>= 0.95) " \
            "| vs plain (>= 0.97) | the sample's choice alone: vs oracle " if in_flight else \
        "| shard | rows | chosen | calibrated tok/s | oracle (arm) tok/s | plain tok/s | vs oracle (>= 0.95) | vs plain (>= 0.97) "
    lines = [first + 
             "| shard end to end vs plain | calibration s (rows kept) | profile s | calibration overhead: share of shard wall (<= 2%) "
             "| overhead without the worker's profile | all calibration time: share |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if in_flight else "")]
    for r in shards:
        alone = f"{fmt(r.get('decision_vs_oracle'))}x | " if in_flight else ""
        lines.append(f"| {r['shard']} | {r['rows']} | {r['chosen']} | {r['calibrated_tokens_per_s']:.1f} | {r['oracle']}: {r['oracle_tokens_per_s']:.1f} "
                     f"| {r['plain_tokens_per_s']:.1f} | {fmt(r['vs_oracle'])}x | {fmt(r['vs_plain'])}x | {alone}{fmt(r['end_to_end_vs_plain'])}x "
                     f"| {r['calibration_s']:.1f} ({r['calibration_rows_kept']}) | {r['profile_s']:.1f} | {_pct(r['calibration_share'])} "
                     f"| {_pct(r['calibration_share_without_profile'])} | {_pct(r['calibration_time_share'])} |")
    return "\n".join(lines)


def flight_table(shards: Sequence[dict]) -> str:
    """The shards as the pipeline ran them (--in-flight): wall, goodput against plain decoding's in
    the interleaved run, switches, and how many rows ran under each setting."""
    lines = ["| shard | sample decoded under | wall s | goodput tok/s | vs plain (interleaved run) | confirmed "
             "| switched on at row (arm) | fell back at row | rows per setting |", "|---|---|---|---|---|---|---|---|---|"]
    for r in shards:
        f = r.get("in_flight")
        if not f:
            continue
        lines.append(f"| {r['shard']} | {f.get('sample_under', 'none')} | {f['wall_s']:.1f} | {fmt(f['goodput'], '.1f')} | {fmt(f['goodput_vs_plain'])}x "
                     f"| {'yes' if f['confirmed'] else 'no'} | {fmt(f['switch_row'], 'd')} ({f['switch_arm'] or '-'}) "
                     f"| {fmt(f['fallback_row'], 'd')} | {', '.join(f'{k} {v}' for k, v in f['rows_by_setting'].items())} |")
    return "\n".join(lines)


def price_table(shards: Sequence[dict]) -> str:
    """Per shard, each arm's target forwards measured over the profile's price of the steps it ran
    (`_prices`), the pipeline's run of the shard likewise, the anchors' scales (the shard's plain
    run's and the one the decision used), the bookkeeping per row and step, and each arm's steps
    priced as a prediction prices them: measured over that price."""
    shards = [r for r in shards if r.get("prices")]
    if not shards:
        return ""
    labels = [k for k in shards[0]["prices"] if k not in ("in_flight", "worker_anchor", "plain_anchor")]
    lines = ["| shard | " + " | ".join(labels) + " | in flight | anchor scale: the shard's plain run, the decision's "
             "| bookkeeping, µs per row-step | each arm's cost against plain's, measured over the model's (its steps as they ran) |",
             "|---|" + "---|" * (len(labels) + 4)]
    for r in shards:
        p = r["prices"]
        anchors = [(p.get(k) or {}).get("scale") for k in ("plain_anchor", "worker_anchor")]
        lines.append(f"| {r['shard']} | " + " | ".join(fmt(p[k]["forward_over_price"]) for k in labels)
                     + f" | {fmt((p.get('in_flight') or {}).get('forward_over_price'))} | {', '.join(fmt(a) for a in anchors)} | "
                     + ", ".join(fmt(p[k]["other_us_per_row_step"], ".0f") for k in labels) + " | "
                     + ", ".join(fmt(p[k].get("cost_vs_plain_over_model")) for k in labels) + " |")
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return f"{fmt(100 * x if x is not None else None, '.1f')}%"


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--draft-model", default=None, help="add the DraftTarget arms with this draft model")
    parser.add_argument("--rows", type=int, default=None, help="prompts per shard (default 128; 16 with --quick)")
    parser.add_argument("--max-tokens", type=int, default=None, help="default 64; 32 with --quick")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workloads", default=None, help=f"default {','.join(workloads.WORKLOADS)}; with --input, "
                        "every value of the --key column, in file order")
    parser.add_argument("--input", default=None, metavar="PARQUET",
                        help="shards from a prompt Parquet instead of the bench's own workloads (read as `batchspec run` "
                        "reads its input: a prompt or messages column): one shard per value of --key, its first --rows rows "
                        "(with --later-shard the next --rows rows are the key's first shard)")
    parser.add_argument("--key", default="task", help="with --input: the column to shard by (default task)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (a GPU's figures are not a CPU's: name --out apart)")
    parser.add_argument("--in-flight", action="store_true", help="decide as the pipeline does on the torch engine: "
                        "calibration inside the shard's own batch (run_shard), the drift watch after it")
    parser.add_argument("--later-shard", action="store_true", help="with --in-flight: run a shard of each key first "
                        "(other rows of its workload, not benched), so the benched shard is the key's next on the worker, "
                        "its sample decoded under the setting the first ended under")
    parser.add_argument("--earlier", type=int, default=1, metavar="N",
                        help="with --later-shard: how many of the key's shards run before the benched one (default 1; "
                        "with --input, N x --rows rows of the key after the benched rows): a long job's steady state, "
                        "where the key's and the worker's last confirmations were made on the prices as they now stand")
    parser.add_argument("--oracle-chunk", type=int, default=None, metavar="ROWS",
                        help="rows per generate call of the oracle's interleaved runs (default 2 x batch size, at least 8): "
                        "--rows runs each arm on the shard as one call, as the pipeline does, but with no chunks to redraw "
                        "(each chunk's call drains its batch: on the fast model, held-out, batch 8, n-gram k=2 measured "
                        "0.86-0.90x plain in 16-row calls and 0.89-0.95x in one 128-row call, 2026-12-05)")
    parser.add_argument("--ended-under", default=None, metavar="ARM",
                        help="with --later-shard: the setting each key's first shard is taken to have ended under "
                        "(e.g. ngram:k=2), whatever it chose: a later shard started under that arm")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(RESULTS))
    results.add_options(parser)
    args = parser.parse_args(argv)

    rows = args.rows or (16 if args.quick else 128)
    max_tokens = args.max_tokens or (32 if args.quick else 64)
    threads = choose_threads(args.threads)
    info = machine(threads, args.dtype, args.device)
    print(f"machine: {info}", flush=True)
    arms = candidate_arms(args.draft_model)
    forced = next((a for a in arms if a.label == args.ended_under), None)
    if args.earlier < 1:
        parser.error("--earlier takes 1 or more shards")
    if args.oracle_chunk is not None and args.oracle_chunk < 1:
        parser.error("--oracle-chunk takes 1 or more rows")
    if args.ended_under and (forced is None or not args.later_shard):
        parser.error(f"--ended-under needs --later-shard and one of {', '.join(a.label for a in arms)}")
    shard_rows: dict[str, tuple[list[Request], list[Request]]] = {}  # key -> (benched rows, its first shard's)
    if args.input:
        try:
            groups, bad = workloads.from_input(args.input, args.key, max_tokens)
        except (OSError, ValueError, BatchspecError) as exc:
            parser.error(str(exc).splitlines()[0])
        if bad:
            print(f"{args.input}: {len(bad)} rows cannot run and are left out (first: {bad[0]})", flush=True)
        keys = args.workloads.split(",") if args.workloads else list(groups)
        need = rows * (1 + args.earlier if args.later_shard else 1)
        short = [f"{k} ({len(groups.get(k, []))})" for k in keys if len(groups.get(k, [])) < need]
        if short:
            parser.error(f"{args.input}: each shard needs {need} rows of its --key value"
                         f"{f' (--later-shard: {1 + args.earlier} shards)' if args.later_shard else ''}; too few: {', '.join(short)}")
        shard_rows = {k: (groups[k][:rows], groups[k][rows:need]) for k in keys}
    else:
        keys = (args.workloads or ",".join(workloads.WORKLOADS)).split(",")
    engine = load_engine(args.model, args.dtype, args.draft_model, args.device)
    settings = CalibrationSettings(min_rows=min(16, rows))
    worker = WorkerCalibration()
    shards = []
    for workload in keys:
        earlier_shards: list[dict] = []
        mine, before = shard_rows.get(workload, (None, None))
        for n in range(args.earlier if args.later_shard else 0):
            mine_before = before[n * rows : (n + 1) * rows] if before else workloads.requests(workload, rows, max_tokens, seed=1 + n)
            earlier = run_shard(engine, ShardInput(f"{workload}-earlier{n}", workload, mine_before),
                                arms, True, args.batch_size, settings, worker=worker)
            if forced is not None:
                worker.settled[workload] = forced
            earlier_shards.append({"chosen": earlier.decision.chosen.label, "ended_under": worker.settled.get(workload, NO_SPEC).label,  # unset: not run in flight
                     "wall_s": earlier.stats.wall_s, "ended_under_forced": forced is not None, "earlier": n + 1,
                     "confirmed": earlier.decision.confirmed, "reason": earlier.decision.reason,
                     "calibration_share": earlier.stats.calibration_overhead_s / earlier.stats.wall_s if earlier.stats.wall_s else None})
            first = earlier_shards[-1]
            print(f"{workload}: the key's shard {n + 1} of {args.earlier} before the benched one chose {first['chosen']}, "
                  f"ended under {first['ended_under']} ({first['wall_s']:.1f} s, confirmed: {first['confirmed']}, "
                  f"calibration overhead {first['calibration_share']:.1%})", flush=True)
        shards.append(bench_shard(engine, workload, rows, max_tokens, args.batch_size, arms, settings, worker, args.in_flight,
                                  mine, args.oracle_chunk))
        shards[-1]["key_first_shard"] = earlier_shards[-1] if earlier_shards else None  # the last before it
        shards[-1]["key_earlier_shards"] = earlier_shards
        print(shard_table(shards[-1:]), flush=True)
        print(prediction_table(shards[-1:]), flush=True)
        print(price_table(shards[-1:]), flush=True)
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"benchmark": "calibrate", "input": args.input, "key": args.key if args.input else None, "in_flight": args.in_flight, "later_shard": args.later_shard, "earlier": args.earlier if args.later_shard else 0, "oracle_chunk": oracle_chunk_rows(args.batch_size, args.oracle_chunk), "quick": args.quick, "model": args.model, "draft_model": args.draft_model,
            "rows_per_shard": rows, "max_tokens": max_tokens, "batch_size": args.batch_size,
            "arms": [a.label for a in arms], "machine": info, "shards": shards,
            "met": {"vs_oracle": all((r["vs_oracle"] or 0) >= 0.95 for r in shards),
                    "vs_plain": all((r["vs_plain"] or 0) >= 0.97 for r in shards),
                    "calibration_share": all((r["calibration_share"] or 0) <= 0.02 for r in shards),
                    "prediction_within_10pct": all(a["error"] is not None and abs(a["error"]) <= 0.10
                                                   for r in shards for a in r["predicted_vs_measured"])}}
    table = shard_table(shards) + "\n\n" + prediction_table(shards)
    prices = price_table(shards)
    if prices:
        table += "\n\nThe target's forwards measured over the profile's price of the steps each arm ran:\n\n" + prices
    if args.in_flight:
        table += "\n\n" + flight_table(shards)
    md = (f"# Calibration benchmark\n\n`{command('bench/calibrate.py', argv)}`, {info['date_utc']}: "
          f"{args.model}{' + ' + args.draft_model if args.draft_model else ''}, {args.dtype}, batch {args.batch_size}, "
          f"{rows} prompts per shard, max_tokens {max_tokens}, arms none + {', '.join(a.label for a in arms)}; "
          + (f"shards from `{args.input}`, one per value of its `{args.key}` column; " if args.input else "") +
          f"{machine_line(info)}. "
          + (f"Each benched shard is its key's {'second' if args.earlier == 1 else f'shard {args.earlier + 1}'} on this worker: "
             f"{'a first shard' if args.earlier == 1 else f'{args.earlier} shards'} of other rows of the workload "
             "ran before it (not benched), and the benched shard's sample decoded under the setting the last ended under"
             + (f" (taken to be {forced.label} whatever it chose: --ended-under)" if forced is not None else "") + ". "
             if args.later_shard else "") +
          f"tok/s = goodput (output tokens / decode seconds).\n\n{table}")
    write(Path(args.out), "calibrate", data, md, table)
    data["record"] = results.record("calibrate", "bench/calibrate.py", args, argv, {
        "min_vs_oracle": min((r["vs_oracle"] or 0) for r in shards), "min_vs_plain": min((r["vs_plain"] or 0) for r in shards),
        "max_calibration_share": max((r["calibration_share"] or 0) for r in shards),
        "predictions_within_10pct": f"{sum(a['error'] is not None and abs(a['error']) <= 0.10 for r in shards for a in r['predicted_vs_measured'])}"
                                    f" of {sum(len(r['predicted_vs_measured']) for r in shards)}"})
    return data


if __name__ == "__main__":
    main()
