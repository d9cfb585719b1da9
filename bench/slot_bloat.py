"""How many cache slots a decode step reads in one long generate call against short calls, and
what squeezing the holes out costs (the engine's KV compaction, issue 12's "where the time goes").

A batch's cache is one block of slots for every row: a row admitted mid-call is padded to the
batch's length, and the slots of rows that finished stay until `kv.Batch.compact` squeezes the
holes out, past 2 x the longest row + 64 slots. Every step's attention reads all of them. Side by
side, `--rounds` times, plain decoding of the same rows in one call (as a shard runs them) and
in calls of `--chunk` rows (each starts a fresh batch: the calibration bench's oracle runs this
way): decode seconds, goodput, and the mean slots a step read (`Step.context`). Then, apart,
what one compaction of a batch of the production size costs (a batch built as the profile builds
its probes, holes at the front of each row, squeezed to the longest row), beside the price of a
plain step at those slots: how many steps of the slots saved a compaction must last to pay.

    python bench/slot_bloat.py --input /tmp/held7.parquet --workload continue --rows 64 \
        --max-tokens 128 --batch-size 8 --threads 2
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import command, machine_line, result_options, start_workload, workload_options, write  # noqa: E402
from probe_fidelity import seed_row  # noqa: E402

import torch  # noqa: E402

from batchspec.engine.base import NO_SPEC  # noqa: E402


def decode(engine, requests, chunk: int, batch_size: int) -> dict:
    """Plain decoding of `requests` in calls of `chunk` rows: decode seconds, goodput, slots read."""
    steps, decode_s, tokens = [], 0.0, 0
    for i in range(0, len(requests), chunk):
        result = engine.generate(requests[i : i + chunk], NO_SPEC, batch_size=batch_size)
        steps += list(engine.last_steps)
        decode_s += result.timing.decode_s
        tokens += result.decode_tokens
    full = [s.context for s in steps if s.rows == batch_size]
    return {"chunk": chunk, "decode_s": decode_s, "goodput": tokens / decode_s if decode_s else None,
            "steps": len(steps), "mean_slots": statistics.mean(s.context for s in steps) if steps else None,
            "mean_slots_full_batch": statistics.mean(full) if full else None}


def compaction(engine, batch_size: int, slots: int, longest: int, tries: int = 5) -> dict:
    """Seconds of one `kv.Batch.compact` of `batch_size` rows from `slots` slots to `longest`
    (the fastest of `tries`, each on a fresh batch), and a plain step's price at both lengths."""
    seed, _ = seed_row(engine, 64)
    with torch.inference_mode():
        seconds = []
        for _ in range(tries):
            batch = seed.repeated(slots).fork(torch.zeros(batch_size, dtype=torch.long, device=engine.device), slots, room=1)
            batch.valid[:, : slots - longest] = False
            batch.positions = torch.full((batch_size,), longest, dtype=torch.long, device=engine.device)
            began = time.perf_counter()
            batch.compact(slack=-math.inf)  # squeezed whatever its length (the engine's rule waits past 64 slots)
            seconds.append(time.perf_counter() - began)
            assert batch.slots == longest
    steps = {p.context: p.seconds for p in engine.profile([(batch_size, slots, 1), (batch_size, longest, 1)], [])}
    saved = steps[slots] - steps[longest]
    return {"slots": slots, "longest": longest, "compact_s": min(seconds), "tries_s": seconds,
            "step_s_at_slots": steps[slots], "step_s_at_longest": steps[longest],
            "steps_to_pay": min(seconds) / saved if saved > 0 else None}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_options(parser, "continue", 64)
    parser.add_argument("--chunk", type=int, default=16, help="rows per call of the chunked runs")
    parser.add_argument("--rounds", type=int, default=2)
    result_options(parser, "slot_bloat")
    args = parser.parse_args(argv)
    if args.chunk < 1 or args.rounds < 1:
        parser.error("--chunk and --rounds take 1 or more")
    info, engine, requests = start_workload(args, parser)
    runs = []
    for r in range(args.rounds):
        for chunk in (len(requests), args.chunk):
            runs.append({"round": r, **decode(engine, requests, chunk, args.batch_size)})
            x = runs[-1]
            print(f"round {r}, {x['chunk']} rows a call: {x['decode_s']:.1f} s decode, {x['goodput']:.1f} tok/s, "
                  f"mean slots {x['mean_slots']:.0f}", flush=True)
    one = [x for x in runs if x["chunk"] == len(requests)]
    short = [x for x in runs if x["chunk"] == args.chunk]
    slots = round(statistics.mean(x["mean_slots"] for x in one))
    longest = round(statistics.mean(x["mean_slots"] for x in short))
    squeeze = compaction(engine, args.batch_size, max(slots, longest + 1), longest)
    ratio = statistics.mean(x["goodput"] for x in one) / statistics.mean(x["goodput"] for x in short)
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"benchmark": "slot_bloat", "input": args.input, "workload": args.workload, "rows": len(requests),
            "max_tokens": args.max_tokens, "batch_size": args.batch_size, "chunk": args.chunk, "machine": info,
            "runs": runs, "one_call_over_chunked_goodput": ratio, "compaction": squeeze}
    lines = ["| round | rows a call | decode s | goodput tok/s | steps | mean slots a step reads | ... at the full batch |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {x['round']} | {x['chunk']} | {x['decode_s']:.1f} | {x['goodput']:.1f} | {x['steps']} | "
              f"{x['mean_slots']:.0f} | {x['mean_slots_full_batch']:.0f} |" for x in runs]
    table = "\n".join(lines)
    table += (f"\n\nOne call's goodput over the chunked calls': {ratio:.3f}. One compaction of {args.batch_size} rows from "
              f"{squeeze['slots']} slots to {squeeze['longest']}: {squeeze['compact_s'] * 1000:.1f} ms (fastest of "
              f"{len(squeeze['tries_s'])}); a plain step {squeeze['step_s_at_slots'] * 1000:.1f} ms at {squeeze['slots']} slots, "
              f"{squeeze['step_s_at_longest'] * 1000:.1f} ms at {squeeze['longest']}: it pays after "
              + (f"{squeeze['steps_to_pay']:.0f} steps." if squeeze["steps_to_pay"] else "no number of steps (no saving measured)."))
    md = (f"# Cache slots a step reads: one call against short calls\n\n`{command('bench/slot_bloat.py', argv)}`, "
          f"{info['date_utc']}: {args.model}, {args.dtype}, batch {args.batch_size}, {len(requests)} {args.workload} rows "
          f"of `{args.input}`, max_tokens {args.max_tokens}, plain decoding; {machine_line(info)}.\n\n{table}")
    write(Path(args.out), args.name, data, md, table)
    return data


if __name__ == "__main__":
    main()
