"""Every forward shape against its price (issue 12: predicted goodput within 10%).

Times one target forward of every batch 1..B x tokens per row 1..W at one context (the engine's
own probe, `engine.profile`: fastest of its tries, `--repeats` passes), then prices each shape from
only the points calibration's profile measures (`profile_grid(B, context, context, W)`) two ways:
- by the tokens the forward computes in all, rows x tokens per row, through every measured point
  (batchspec.predict.cost, since commit e42a354);
- linear in tokens per row along each measured batch's width curve and linear in rows between
  batch 1 and B (the rule before).
A draining or partly filled batch runs the shapes between the measured ones; this says how well
each rule prices them. The table holds, per shape, measured ms / measured over each price.

    python bench/shapes.py [--model smollm2-135m] [--context 40] [--batch-size 8] [--widths 9]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import command, machine_line, result_options, start, write  # noqa: E402

from batchspec.engine.base import StepCost  # noqa: E402
from batchspec.predict.cost import CostProfile, _lerp, _rising, profile_grid  # noqa: E402


def rows_rule(truth: dict, grid: Sequence[tuple[int, int, int]], batch_size: int, b: int, w: int) -> float:
    """The rule before: linear in tokens per row along batch 1's and batch B's width curves, linear
    in rows between them."""
    def along(batch: int) -> float:
        pts = sorted((w2, truth[(b2, w2)]) for b2, _, w2 in grid if b2 == batch)
        return _lerp([x for x, _ in pts], _rising([y for _, y in pts]), w)
    return along(1) if batch_size == 1 else _lerp([1, batch_size], [along(1), along(batch_size)], b)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--context", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--widths", type=int, default=9, help="tokens per row up to this (1 + the longest draft)")
    parser.add_argument("--repeats", type=int, default=2)
    result_options(parser, "shapes")
    args = parser.parse_args(argv)

    info, engine = start(args, args.model)
    B, W, ctx = args.batch_size, args.widths, args.context
    shapes = [(b, ctx, w) for b in range(1, B + 1) for w in range(1, W + 1)]
    tries: dict[tuple[int, int], list[float]] = {}
    for _ in range(args.repeats):
        for p in engine.profile(shapes, []):
            tries.setdefault((p.batch, p.tokens), []).append(p.seconds)
    truth = {k: min(v) for k, v in tries.items()}
    grid, _ = profile_grid(B, ctx, ctx, W)
    profile = CostProfile()
    profile.merge([StepCost("target", args.model, b, c, w, truth[(b, w)]) for b, c, w in grid], 0.0)
    cells, errors = [], {"tokens": [], "rows": []}
    for b in range(1, B + 1):
        for w in range(1, W + 1):
            t = truth[(b, w)]
            by_tokens, by_rows = t / profile.target_s(b, ctx, w), t / rows_rule(truth, grid, B, b, w)
            errors["tokens"].append(abs(by_tokens - 1))
            errors["rows"].append(abs(by_rows - 1))
            cells.append({"batch": b, "tokens": w, "ms": 1000 * t, "over_tokens_price": by_tokens, "over_rows_price": by_rows,
                          "measured_point": (b, ctx, w) in grid})
    summary = {rule: {"mean_abs_error": statistics.mean(e), "max_abs_error": max(e)} for rule, e in errors.items()}
    info["load_avg_end"] = [round(x, 2) for x in __import__("os").getloadavg()]
    header = "| rows \\ tokens per row | " + " | ".join(str(w) for w in range(1, W + 1)) + " |"
    lines = [header, "|---" * (W + 1) + "|"]
    for b in range(1, B + 1):
        row = [c for c in cells if c["batch"] == b]
        lines.append(f"| {b} | " + " | ".join(f"{c['ms']:.0f} / {c['over_tokens_price']:.2f} / {c['over_rows_price']:.2f}"
                                               f"{'*' if c['measured_point'] else ''}" for c in row) + " |")
    table = "\n".join(lines)
    verdict = (f"mean |measured / price - 1|: by tokens in all {summary['tokens']['mean_abs_error']:.1%} "
               f"(at most {summary['tokens']['max_abs_error']:.0%}), linear in rows {summary['rows']['mean_abs_error']:.1%} "
               f"(at most {summary['rows']['max_abs_error']:.0%})")
    md = (f"# Every forward shape against its price\n\n`{command('bench/shapes.py', argv)}`, {info['date_utc']}: {args.model}, "
          f"{args.dtype}, context {ctx}; {machine_line(info)}. Each cell: measured ms / measured over the price by tokens "
          f"in all / measured over the price linear in rows; * a point the profile measures.\n\n{table}\n\n{verdict}")
    data = {"benchmark": "shapes", "model": args.model, "context": ctx, "batch_size": B, "widths": W,
            "machine": info, "cells": cells, "summary": summary}
    write(Path(args.out), args.name, data, md, table + "\n\n" + verdict)
    return data


if __name__ == "__main__":
    main()
