"""Calibration on the real clock: each shard run under the calibration controller, set beside its
oracle and plain decoding, side by side in one run.

Per shard key (the bench's four workloads, or `--input PARQUET` grouped by `--key`):
- calibrated: the pipeline's own path (`shard.run_shard`: the controller, one worker's state
  across the run's shards); with `--later-shard` a first shard of other rows of the key runs
  before it on the same worker, unbenched (a key's steady state);
- oracle: every arm over the whole shard, the best taken; plain: the `none` arm.
Each is run twice, in opposite orders (calibrated first, then last), and its goodput is the mean
of the two, so a load that drifts over the run weighs on every arm alike. Goodput is decode tokens
per decode second; the calibrated shard's counts its profile's seconds too. Per arm, the
controller's predicted speedup is set beside the speedup the oracle measured (within 10%?).

Targets (docs/calibration.md): calibrated >= 0.95x the oracle and >= 0.97x plain per shard.

    python bench/calibrate.py [--rows 64] [--batch-size 8] [--max-tokens 64] [--input PARQUET]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import results, workloads  # noqa: E402
from common.measure import choose_threads, load_engine, machine, machine_line  # noqa: E402

from batchspec.calibrate import CalibrationSettings, WorkerState  # noqa: E402
from batchspec.config.candidates import default_candidates_path, load_candidates  # noqa: E402
from batchspec.engine.base import NO_SPEC, Request, SpecConfig  # noqa: E402
from batchspec.shard import ShardInput, run_shard  # noqa: E402


def candidate_arms(draft_model: str | None) -> list[SpecConfig]:
    """The torch engine's default candidates (n-gram), plus draft-model arms with --draft-model."""
    arms = [a for a in load_candidates(default_candidates_path("torch")) if a.method == "ngram"]
    if draft_model:
        arms += [SpecConfig("draft_target", k, draft_model=draft_model) for k in (2, 4)]
    return arms


def goodput(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def bench_key(engine, key: str, rows: list[Request], earlier: list[Request], batch_size: int,
              arms: Sequence[SpecConfig], worker: WorkerState) -> dict:
    runs: dict[str, list[float]] = {}
    calibrated = []
    if earlier:  # the key's earlier shard on this worker, unbenched
        run_shard(engine, ShardInput(f"{key}-earlier", key, earlier), arms, True, batch_size, worker=worker)
    order = [NO_SPEC, *arms]
    for round_ in range(2):
        state = WorkerState(costs=worker.costs, last=dict(worker.last), history=dict(worker.history))
        if round_ == 0:
            calibrated.append(_calibrated(engine, key, rows, arms, batch_size, state))
        for arm in order if round_ == 0 else order[::-1]:
            result = engine.generate(rows, arm, batch_size)
            runs.setdefault(arm.label, []).append(goodput(result.decode_tokens, result.timing.decode_s))
        if round_ == 1:
            calibrated.append(_calibrated(engine, key, rows, arms, batch_size, state))
    measured = {label: statistics.mean(g) for label, g in runs.items()}
    oracle = max(measured, key=measured.get)
    got = statistics.mean(c["goodput"] for c in calibrated)
    last = calibrated[-1]
    return {
        "key": key, "rows": len(rows), "oracle": oracle, "goodput": got, "oracle_goodput": measured[oracle],
        "plain_goodput": measured["none"], "vs_oracle": got / measured[oracle], "vs_plain": got / measured["none"],
        "ran": last["ran"], "overhead": statistics.mean(c["overhead"] for c in calibrated),
        "measured_speedups": {a: g / measured["none"] for a, g in measured.items()},
        "predicted_speedups": last["predicted"], "events": last["events"],
    }


def _calibrated(engine, key: str, rows: list[Request], arms, batch_size: int, worker: WorkerState) -> dict:
    ran = run_shard(engine, ShardInput(key, key, rows), arms, True, batch_size, CalibrationSettings(), worker=worker)
    s = ran.stats
    tokens = sum(max(c.output_tokens - 1, 0) for c in ran.completions)
    counts: dict[str, int] = {}
    for spec in ran.row_specs:
        counts[spec.label] = counts.get(spec.label, 0) + 1
    return {"goodput": goodput(tokens, s.decode_s + s.profile_s), "overhead": (s.calibration_s or 0.0) / s.wall_s,
            "ran": counts, "predicted": {a.label: a.predicted_speedup for a in s.candidates},
            "events": [f"{e.row}:{e.kind}:{e.arm}" for e in s.events]}


def table(shards: Sequence[dict]) -> str:
    lines = ["| shard | ran (rows) | oracle | vs oracle (>= 0.95) | vs plain (>= 0.97) | calibration share | predictions within 10% |",
             "|---|---|---|---|---|---|---|"]
    for s in shards:
        ran = ", ".join(f"{a} {n}" for a, n in s["ran"].items())
        near = [a for a, p in s["predicted_speedups"].items()
                if p and a != "none" and abs(p / s["measured_speedups"][a] - 1) <= 0.10]
        lines.append(f"| {s['key']} | {ran} | {s['oracle']} | {s['vs_oracle']:.2f}x | {s['vs_plain']:.2f}x | "
                     f"{s['overhead']:.1%} | {len(near)} of {len(s['predicted_speedups']) - 1} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--draft-model", default=None, help="add the DraftTarget arms with this draft model")
    parser.add_argument("--rows", type=int, default=64, help="prompts per shard")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workloads", default=None, help=f"the keys to bench (default {','.join(workloads.WORKLOADS)}; "
                        "with --input, every value of --key)")
    parser.add_argument("--input", default=None, metavar="PARQUET", help="prompts the project did not write, a shard per --key value")
    parser.add_argument("--key", default="task")
    parser.add_argument("--later-shard", action="store_true", help="a first shard of other rows of each key runs first, unbenched")
    parser.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    results.add_options(parser)
    args = parser.parse_args(argv)
    threads = choose_threads(args.threads)
    info = machine(threads, args.dtype, args.device)
    engine = load_engine(args.model, args.dtype, args.draft_model, args.device)
    arms = candidate_arms(args.draft_model)
    want = args.rows * (2 if args.later_shard else 1)
    if args.input:
        groups, bad = workloads.from_input(args.input, args.key, args.max_tokens)
        if bad:
            print(f"{len(bad)} rows of {args.input} cannot run and are left out (first: {bad[0]})")
    else:
        groups = {w: workloads.requests(w, want, args.max_tokens) for w in (args.workloads or ",".join(workloads.WORKLOADS)).split(",")}
    keys = [k for k in args.workloads.split(",") if k in groups] if args.workloads else list(groups)
    worker = WorkerState()
    shards = []
    for key in keys:
        rows = groups[key][:want]
        earlier, benched = (rows[: len(rows) // 2], rows[len(rows) // 2:]) if args.later_shard else ([], rows)
        shards.append(bench_key(engine, key, benched, earlier, args.batch_size, arms, worker))
        print(table(shards[-1:]).splitlines()[-1], flush=True)
    info["load_avg_end"] = machine(threads, args.dtype, args.device)["load_avg_start"]
    print(f"\n{machine_line(info)}; batch {args.batch_size}, {args.rows} rows a shard, max_tokens {args.max_tokens}, {args.dtype}")
    print(table(shards))
    metrics = {"min_vs_oracle": min(s["vs_oracle"] for s in shards), "min_vs_plain": min(s["vs_plain"] for s in shards),
               "max_calibration_share": max(s["overhead"] for s in shards)}
    results.record("calibrate", "bench/calibrate.py", args, argv, metrics)
    return {"shards": shards, "metrics": metrics, "machine": info}


if __name__ == "__main__":
    main()
