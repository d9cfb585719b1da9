"""How far a key's few rows can predict a shard's speedup: the acceptance part of calibration's
prediction error, with the prices held fixed.

A later shard's calibration predicts every arm on its sample (one drift check's rows) and the key's
last window of rows on the worker (calibrate.inflight, pricing.KeyHistory). Its error against the
measured speedup has two parts: the cost model's (its prices against the machine: the calibrate
bench's "predicted from the whole shard's acceptance") and the acceptance's (how far those rows'
acceptance stands from the whole shard's). This bench measures the second alone, on prompts the
project did not write: every row of every key decoded plainly once (greedy float32: every arm's
counterfactual on a row is exact), one cost profile measured for the shapes, then for many random
draws of two disjoint shards A (the key's last on the worker) and B (the benched one) of a key,
every arm's speedup on B predicted from B's first `sample` rows and A's last `history` rows, set
against the same price on all of B's rows. The share of arms within ±10% is the ceiling of the
±10% prediction target at that sample and history for a perfect cost model; the calibrate bench's
counts are below it by the cost model's error.

    python bench/acceptance_spread.py --input /tmp/held7.parquet --batch-size 1 4 8 --shard-rows 32 64
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import workloads  # noqa: E402
from engine import choose_threads, command, load_engine, machine, machine_line, result_options, write  # noqa: E402

from batchspec.calibrate.decision import CalibrationSettings, sample_indices  # noqa: E402
from batchspec.calibrate.inflight import drift_chunk, drift_every, drift_window  # noqa: E402
from batchspec.calibrate.pricing import Anchor, KeyHistory, _counterfactual, plain_rows, predict_arms  # noqa: E402
from batchspec.calibrate.profiling import grid_needed, refresh_profile, shape_of  # noqa: E402
from batchspec.engine.base import NO_SPEC, SpecConfig  # noqa: E402
from batchspec.errors import BatchspecError  # noqa: E402
from batchspec.predict.acceptance import Acceptance  # noqa: E402
from batchspec.predict.cost import CostProfile  # noqa: E402

ARMS = [SpecConfig("ngram", k) for k in (2, 4, 6, 8)]


def subset(counter: tuple[dict, float], idx: Sequence[int]) -> tuple[dict, float]:
    """The counterfactual of the rows `idx` of a computed one."""
    acc, lookup = counter
    return ({label: Acceptance(a.method, a.draft_len, [a.steps[i] for i in idx], [a.proposed[i] for i in idx], a.exact)
             for label, a in acc.items()}, lookup)


def speedups(engine, rows, counter, idx: Sequence[int], profile: CostProfile, anchor: Anchor, batch: int,
             stream: int) -> dict[str, float]:
    arms = predict_arms(engine, [rows[i] for i in idx], ARMS, anchor, profile, batch, subset(counter, idx), stream)
    return {a.label: a.predicted_speedup for a in arms if a.predicted_speedup}


def pairs(n: int, size: int, draws: int, rng: random.Random, in_file_order: bool):
    """(the key's earlier rows, the shard's rows) by index: `draws` random disjoint pairs of
    shards of `size` rows, or (`in_file_order`) each block of `size` rows in file order after the
    first, with every row before it, as a job's shards of the key come."""
    if in_file_order:
        for begin in range(size, n - size + 1, size):
            yield list(range(begin)), list(range(begin, begin + size))
        return
    for _ in range(draws):
        order = rng.sample(range(n), 2 * size)
        yield order[:size], order[size:]


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, metavar="PARQUET")
    parser.add_argument("--key", default="task")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--shard-rows", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--history", type=int, nargs="+", default=None,
                        help="the key's last rows predicted on beside the sample (default: the drift window, "
                             "max(16, 8 x batch), and 0, 16, 32, 64)")
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--in-file-order", action="store_true",
                        help="shards as a job makes them: blocks of the key's rows in file order, each after all "
                             "the rows before it (else random disjoint pairs)")
    parser.add_argument("--seed", type=int, default=0)
    result_options(parser, "acceptance_spread")
    args = parser.parse_args(argv)
    info = machine(choose_threads(args.threads), args.dtype)
    try:
        groups, bad = workloads.from_input(args.input, args.key, args.max_tokens)
    except (OSError, ValueError, BatchspecError) as exc:
        parser.error(str(exc).splitlines()[0])
    if bad:
        print(f"{args.input}: {len(bad)} rows cannot run and are left out (first: {bad[0]})", flush=True)
    short = [f"{k} ({len(g)})" for k, g in groups.items() if len(g) < 2 * min(args.shard_rows)]
    if len(short) == len(groups):
        parser.error(f"{args.input}: a key needs two shards of {min(args.shard_rows)} rows; too few: {', '.join(short)}")
    engine = load_engine(args.model, args.dtype)
    data: dict = {"benchmark": "acceptance_spread", "input": args.input, "machine": info, "in_file_order": args.in_file_order, "runs": []}
    decoded = {}
    for key, requests in groups.items():
        began = time.perf_counter()
        result = engine.generate(requests, NO_SPEC, 8)
        rows = plain_rows(engine, requests, result)
        decoded[key] = (rows, _counterfactual(engine, rows, ARMS), result)
        print(f"{key}: {len(rows)} rows decoded and replayed in {time.perf_counter() - began:.0f} s", flush=True)
    profile = CostProfile()
    every = [r for rows, _, _ in decoded.values() for r in rows]
    longest = max(r.params.max_tokens for reqs in groups.values() for r in reqs)
    for batch in args.batch_size:
        shape = shape_of(every, ARMS, batch, longest)
        grid = grid_needed(profile, shape)
        if grid:
            spent, *_ = refresh_profile(engine, profile, grid, 0.0, shape)
            print(f"batch {batch}: profile measured in {spent:.0f} s", flush=True)
    rng = random.Random(args.seed)
    settings = CalibrationSettings()
    lines = []
    for batch in args.batch_size:
        sample = drift_every(settings, batch)  # a key's later shard samples one drift check's rows
        kept = KeyHistory.size(drift_window(settings, batch))  # the key's history the pipeline keeps
        for size in args.shard_rows:
            histories = sorted({h if args.in_file_order else min(h, size) for h in (args.history or [0, 16, 32, 64, kept])})
            stream = min(size, drift_chunk(settings, batch))
            hits = {h: [] for h in histories}
            errs = {h: [] for h in histories}
            for key, (rows, counter, result) in decoded.items():
                if len(rows) < 2 * size:
                    continue
                anchor = Anchor.of(result, rows, profile, 8)
                for a, b in pairs(len(rows), size, args.draws, rng, args.in_file_order):
                    truth = speedups(engine, rows, counter, b, profile, anchor, batch, stream)
                    mine = [b[i] for i in sample_indices(len(b), sample)]  # evenly spaced, as a shard samples
                    for h in histories:
                        got = speedups(engine, rows, counter, mine + a[len(a) - min(h, len(a)):] if h else mine,
                                       profile, anchor, batch, stream)
                        for label, s in truth.items():
                            e = got[label] / s - 1
                            errs[h].append(abs(e))
                            hits[h].append(abs(e) <= 0.10)
            for h in histories:
                if not hits[h]:
                    continue
                run = {"batch": batch, "shard_rows": size, "sample": sample, "history": h,
                       "pipeline": h == (kept if args.in_file_order else min(kept, size)), "within_10pct": sum(hits[h]) / len(hits[h]),
                       "median_abs_error": statistics.median(errs[h]),
                       "p90_abs_error": sorted(errs[h])[int(0.9 * len(errs[h]))], "arms": len(hits[h])}
                data["runs"].append(run)
                lines.append(f"| {batch} | {size} | {sample} | {run['history']}{' (the pipeline)' if run['pipeline'] else ''} "
                             f"| {run['within_10pct']:.0%} | {run['median_abs_error']:.1%} | {run['p90_abs_error']:.1%} |")
                print(lines[-1], flush=True)
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    table = ("| batch | shard rows | sample rows | key's last rows beside it | arms within ±10% | median |error| | 90th percentile |\n"
             "|---|---|---|---|---|---|---|\n" + "\n".join(lines))
    md = (f"# How far a key's few rows predict a shard's speedup\n\n`{command('bench/acceptance_spread.py', argv)}`, {info['date_utc']}: "
          f"{machine_line(info)}; " + ("each block of the key's rows in file order after all the rows before it"
                                      if args.in_file_order else f"{args.draws} draws of two disjoint shards per key and size") +
          ", every n-gram arm "
          f"(k=2, 4, 6, 8) priced from one profile on the sample and the key's last rows against the same "
          f"price on the whole shard (the prices' own error left out).\n\n{table}")
    write(Path(args.out), args.name, data, md, table)
    return data


if __name__ == "__main__":
    main()
