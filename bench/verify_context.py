"""A verify's price against a plain step's, at contexts away from the width curve's (issue 12).

A predicted speedup rests on the ratio of a verify's price to a plain step's at the slots the
shard's steps read, mostly fewer than the width curve's context (the middle of the shard's
range, whose top is the most slots a step may read). The cost profile moves each point of the
curve to a step's context by a context factor. This bench times the worker's profile
(`profile_grid` over a shard's rows, as calibration does) `--rounds` times, and after each,
probes of the production batch at a few slot counts and widths (the median of three forwards,
each with the accept rule on its logits, built and timed as the profile's points are:
probe_fidelity.probe_s; until 2026-12-05 the forward alone, against prices that hold the rule), and sets each width's price over a plain step's price
against the probes' same ratio, under two rules on the same profile:
- "verify line": the wide points move by the line through the widest verify timed at the middle
  and at the low end of the context range (the grid since 2026-12-04);
- "plain line": every point moves by the plain steps' line (the same profile less the widest
  verify at the low end: the grid and rule before).
A figure above 1: the rule prices that verify dear against plain decoding, and its speedup low.

    python bench/verify_context.py --input /tmp/held7.parquet --workload continue --batch-size 8 --rounds 6
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import command, machine_line, result_options, start_workload, warm_plain, workload_options, write  # noqa: E402
from probe_fidelity import probe_s, seed_row  # noqa: E402

import torch  # noqa: E402

from batchspec.calibrate.pricing import plain_rows  # noqa: E402
from batchspec.calibrate.profiling import shape_of  # noqa: E402
from batchspec.engine.base import SpecConfig  # noqa: E402
from batchspec.predict.cost import CostProfile, profile_grid  # noqa: E402


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_options(parser, "continue", 32)
    parser.add_argument("--k", type=int, default=8, help="the longest draft: the widest verify is k + 1")
    parser.add_argument("--rounds", type=int, default=6)
    result_options(parser, "verify_context")
    args = parser.parse_args(argv)

    info, engine, requests = start_workload(args, parser)
    b = args.batch_size
    plain = warm_plain(engine, requests, b)
    shape = shape_of(plain_rows(engine, requests, plain), [SpecConfig("ngram", args.k)], b, args.max_tokens)
    grid = profile_grid(*shape)
    lo, hi, widest = shape[1], shape[2], shape[3]
    slots = [lo + (hi - lo) // 6, (lo + hi) // 3, (lo + hi) // 2]
    widths = sorted({w for w in (3, 5) if w < widest} | {widest})
    seed, filler = seed_row(engine, hi + widest)

    def probe(context: int, width: int) -> float:
        return probe_s(engine, seed, filler, b, context, width, tries=3)

    errors: dict[str, dict[str, list[float]]] = {"verify line": {}, "plain line": {}}
    for _ in range(args.rounds):
        with torch.inference_mode():
            profile = CostProfile()
            profile.merge(engine.profile(*grid), 0.0)
            before = CostProfile()
            before.merge([p for p in profile.points if (p.kind, p.batch, p.context, p.tokens) != ("target", b, lo, widest)], 0.0)
            probes = {(s, w): probe(s, w) for s in slots for w in [1, *widths]}
        for rule, priced in (("verify line", profile), ("plain line", before)):
            for s in slots:
                for w in widths:
                    ratio = priced.target_s(b, s + 1, w) / priced.target_s(b, s + 1, 1)
                    errors[rule].setdefault(f"{s} slots, {w} tokens", []).append(ratio / (probes[(s, w)] / probes[(s, 1)]))
    summary = {}
    for rule, cells in errors.items():
        every = [x for xs in cells.values() for x in xs]
        summary[rule] = {"median": statistics.median(every), "mean_abs_log": statistics.mean(abs(math.log(x)) for x in every),
                         "within_10pct": sum(abs(x - 1) <= 0.1 for x in every), "n": len(every),
                         "by_cell_median": {c: statistics.median(xs) for c, xs in cells.items()}}
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"benchmark": "verify_context", "model": args.model, "input": args.input, "workload": args.workload,
            "rows": args.rows, "batch_size": b, "shape": list(shape[:4]), "grid": grid[0], "slots": slots, "widths": widths,
            "rounds": args.rounds, "machine": info, "summary": summary, "errors": errors}
    table = summary_table(summary, widest)
    md = (f"# A verify's price against a plain step's, away from the width curve's context\n\n"
          f"`{command('bench/verify_context.py', argv)}`, {info['date_utc']}: {args.model}, {args.dtype}, batch {b}, "
          f"{args.rows} {args.workload} rows (context {lo}..{hi}: the curve at {(lo + hi) // 2}), {args.rounds} profiles, "
          f"each against probes timed just after it; {machine_line(info)}.\n\n{table}\n")
    write(Path(args.out), args.name, data, md, table)
    return data


def summary_table(summary: dict, widest: int) -> str:
    cells = list(next(iter(summary.values()))["by_cell_median"])
    lines = ["| rule | " + " | ".join(cells) + " | all: median | within 10% |", "|---" * (len(cells) + 3) + "|"]
    for rule, s in summary.items():
        lines.append(f"| {rule} | " + " | ".join(f"{s['by_cell_median'][c]:.3f}" for c in cells)
                     + f" | {s['median']:.3f} | {s['within_10pct']} of {s['n']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
