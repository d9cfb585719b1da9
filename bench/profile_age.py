"""A worker's one cost profile against the real steps it prices, over the worker's life (issue 12).

A worker times its cost profile once, on its first shard that needs one, and prices every later
shard's arms on it. `bench/profile_noise.py` sets one profile's probes against the mean of many;
this sets profiles against the decode steps calibration actually prices: the same rows decoded
plainly and under n-gram k, round after round on one loaded engine, each run's verify seconds
(its forwards, as the engine times them) over the price of exactly the steps it ran, by

- `first`: the profile timed once after the worker's first plain run, as a worker's first shard times it;
- `fresh`: a profile timed again just before the round (the production batch's points only);
- `retimed`: the first profile with its width curve timed again each round as a worker's is within
  its budget (calibrate.profiling.retime_curve, `CostProfile.retime`): each point the mean of its
  last four timings (the fresh profile's curve points are those timings: nothing more is timed).

Per round and profile: measured over priced for plain decoding and for the arm, and their ratio,
the arm's "bias": a speedup predicted on that profile is off by 1 / bias from the arm's steps
alone (below 1: the arm's steps ran cheaper than priced, relative to plain decoding's, and the
prediction is pessimistic). A level the machine moves by cancels in the bias; a width it moves
does not. Between rounds the rows decode once more under the arm, untimed, as a worker's other
shards would.

    python bench/profile_age.py --input /tmp/held7.parquet --workload rewrite --rows 16 \\
        --batch-size 8 --k 4 --max-tokens 24 --rounds 8
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workloads  # noqa: E402
from engine import command, machine_line, result_options, start, write  # noqa: E402

from batchspec.calibrate.pricing import Anchor, arm_price_s, plain_rows  # noqa: E402
from batchspec.calibrate.profiling import shape_of  # noqa: E402
from batchspec.engine.base import NO_SPEC, SpecConfig, Step  # noqa: E402
from batchspec.predict.cost import CostProfile, profile_grid  # noqa: E402


class Steps:
    """A generate call's control that only keeps the steps the call ran (engine.base.Control)."""

    first: Sequence[int] = ()

    def __init__(self) -> None:
        self.steps: list[Step] = []

    def __call__(self, progress) -> None:
        self.steps = list(progress.steps)
        return None


PROFILES = ("first", "fresh", "retimed")
UNANCHORED = Anchor(1.0, 0.0)  # the profile's own prices: the machine's level cancels in the bias


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--input", default=None, help="rows from this prompt Parquet (a task column), e.g. one bench/peer_prompts.py wrote")
    parser.add_argument("--workload", default="edit", help=f"one of {', '.join(workloads.WORKLOADS)}, or with --input a task")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--k", type=int, default=4, help="the n-gram arm's draft length")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=8)
    result_options(parser, "profile_age")
    args = parser.parse_args(argv)

    info, engine = start(args, args.model)
    b = args.batch_size
    requests = (workloads.from_parquet(args.input, args.workload, args.rows, args.max_tokens) if args.input
                else workloads.requests(args.workload, args.rows, args.max_tokens))
    arm = SpecConfig("ngram", args.k)
    engine.generate(requests[:b], NO_SPEC, b)  # warm the target
    plain = engine.generate(requests, NO_SPEC, b)  # the worker's first plain run
    grid = profile_grid(*shape_of(plain_rows(engine, requests, plain), [arm], b, args.max_tokens))
    grid = ([p for p in grid[0] if p[0] == b], [])  # the production batch's points: all a full batch's steps read

    def timed() -> CostProfile:
        profile = CostProfile()
        profile.merge(engine.profile(*grid), 0.0)
        return profile

    began = time.perf_counter()
    first = timed()
    retimed = copy.deepcopy(first)
    lo, hi = min(c for _, c, _ in grid[0]), max(c for _, c, _ in grid[0])
    curve = set(first.width_curve(b, lo, hi))
    rounds = []
    for i in range(args.rounds):
        fresh = timed()
        retimed.retime([p for p in fresh.points if p.key[2:] in curve], 0.0)
        row = {"round": i, "at_s": round(time.perf_counter() - began, 1)}
        for spec in (NO_SPEC, arm):
            control = Steps()
            result = engine.generate(requests, spec, b, control=control)
            row[spec.label] = {"verify_s": result.timing.verify_s, "steps": len(control.steps),
                               **{name: result.timing.verify_s / arm_price_s(control.steps, spec, UNANCHORED, p)
                                  for name, p in (("first", first), ("fresh", fresh), ("retimed", retimed))}}
        for name in PROFILES:
            row[f"bias_{name}"] = row[arm.label][name] / row["none"][name]
        rounds.append(row)
        print(f"round {i}: bias on the first profile {row['bias_first']:.3f}, on a fresh one {row['bias_fresh']:.3f}, "
              f"on the retimed one {row['bias_retimed']:.3f}", flush=True)
        engine.generate(requests, arm, b)  # the worker's other work between rounds, untimed
    summary = {name: {"median": statistics.median(r[f"bias_{name}"] for r in rounds),
                      "min": min(r[f"bias_{name}"] for r in rounds), "max": max(r[f"bias_{name}"] for r in rounds)}
               for name in PROFILES}
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"benchmark": "profile_age", "command": command("bench/profile_age.py", argv), "model": args.model, "input": args.input,
            "workload": args.workload, "rows": len(requests), "batch_size": b, "arm": arm.label,
            "max_tokens": args.max_tokens, "grid": grid[0], "machine": info, "rounds": rounds, "bias": summary}
    table = ["| round | at s | plain: measured / first profile's price | arm: measured / first's | bias on the first profile | plain / fresh profile's price | arm / fresh's | bias on a fresh profile | bias on the retimed profile |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rounds:
        table.append(f"| {r['round']} | {r['at_s']} | {r['none']['first']:.3f} | {r[arm.label]['first']:.3f} | {r['bias_first']:.3f} "
                     f"| {r['none']['fresh']:.3f} | {r[arm.label]['fresh']:.3f} | {r['bias_fresh']:.3f} | {r['bias_retimed']:.3f} |")
    for name in PROFILES:
        s = summary[name]
        table.append(f"\nbias on the {name} profile: median {s['median']:.3f} (min {s['min']:.3f}, max {s['max']:.3f})")
    text = "\n".join(table)
    markdown = (f"# A worker's cost profile against the steps it prices\n\n`{data['command']}`, {machine_line(info)}; "
                f"{args.model}, {args.workload} ({args.input or 'bench/workloads.py'}), {len(requests)} rows, batch {b}, "
                f"{arm.label} against plain decoding, max_tokens {args.max_tokens}.\n\n{text}")
    write(Path(args.out), args.name, data, markdown, text)
    return data


if __name__ == "__main__":
    main()
