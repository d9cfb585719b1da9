"""How far one cost profile stands from the machine's mean prices (issue 12: predicted goodput within 10%).

A predicted speedup is a ratio of the profile's prices: a verify of k + 1 tokens per row over a
plain step, at the production batch size. The worker times that profile once, in a few seconds
(`engine.profile`: the fastest of two or three tries per point). This repeats the same profile
`--profiles` times on one loaded engine, `--rounds` tries of every point each time (all kept, in
order), and sets every wide point's ratio to the plain step at its batch and context, as each
estimator reads it from one profile, against the machine's mean ratio over all of them (every
try but each profile's first round, which pays the fresh cache's first touch):
- `as calibration`: the fastest of the first two tries, or of three where a point's two differ by
  more than 20% (`measure.settled`, the rule the profile runs);
- the first try alone (a profile of one try per point), the fastest of all `--rounds`, their
  median, the mean of all but the first;
- the mean of `n` profiles' own `as calibration` figures, timed at `n` moments (pooled over time).
Per estimator and point: the median error of the ratio and its 10th-90th percentile over the
profiles (or groups of `n`). The spread of `as calibration` is what a single profile's prices, and
so every prediction priced on them, carry on this machine before any acceptance error.

    python bench/profile_noise.py [--model smollm2-135m] [--batch-sizes 1,4,8] [--context 574] \\
        [--widths 1,3,5,9] [--profiles 16] [--rounds 5]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import command, machine_line, result_options, start, write  # noqa: E402
from step_prices import recorded_tries  # noqa: E402

from batchspec.engine.torch import measure  # noqa: E402


def as_calibration(group: dict[int, list[float]]) -> dict[int, float]:
    """Each width's figure as `measure.profile` keeps it from a group's tries (width -> seconds in
    the order they ran): the fastest of as many rounds as it takes to be `measure.settled`, at
    most `measure.REPS`."""
    rounds = min(measure.REPS, *(len(ts) for ts in group.values()))
    n = next((i for i in range(2, rounds + 1) if measure.settled({w: ts[:i] for w, ts in group.items()})), rounds)
    return {w: min(ts[:n]) for w, ts in group.items()}


ESTIMATORS: dict[str, Callable[[list[float]], float]] = {
    "the first try alone": lambda ts: ts[0],
    "fastest of all rounds": min,
    "median of all rounds": statistics.median,
    "mean of all but the first round": lambda ts: statistics.mean(ts[1:]) if len(ts) > 1 else ts[0],
}


def percentiles(xs: Sequence[float]) -> tuple[float, float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[len(xs) // 10], xs[(9 * len(xs)) // 10]


def timed_profiles(engine, grid: list[tuple[int, int, int]], profiles: int, rounds: int, pause: float) -> list[dict]:
    """`profiles` runs of `engine.profile(grid)` with `rounds` tries of every point each, every
    try recorded: per run, (batch, context) -> width -> seconds in order."""
    runs = []
    for i in range(profiles):
        with recorded_tries() as tries:
            measure.profile(engine, grid, [], reps=rounds, agree=-1.0)  # never settled: every round runs
        groups: dict = collections.defaultdict(dict)
        for (_, b, c, w), ts in tries.items():
            groups[(b, c)][w] = ts[-rounds:]  # the model's one warm-up forward lands in its first point: not a try
        runs.append(dict(groups))
        print(f"profile {i + 1}/{profiles}", flush=True)
        time.sleep(pause)
    return runs


def analyse(runs: list[dict], pooled: Sequence[int]) -> list[dict]:
    """Per (batch, context, width > 1): the mean ratio to the plain step and every estimator's
    error on it (`percentiles` of estimate / mean - 1 across profiles or groups of them)."""
    report = []
    for (b, c) in sorted(runs[0]):
        widths = sorted(runs[0][(b, c)])
        mean = {w: statistics.mean(t for run in runs for t in run[(b, c)][w][1:]) for w in widths}
        calibrated = [as_calibration(run[(b, c)]) for run in runs]
        for w in widths[1:]:
            truth = mean[w] / mean[widths[0]]
            errors = {"as calibration (one profile)": [e[w] / e[widths[0]] / truth - 1 for e in calibrated]}
            for name, est in ESTIMATORS.items():
                errors[name] = [est(run[(b, c)][w]) / est(run[(b, c)][widths[0]]) / truth - 1 for run in runs]
            for n in pooled:
                groups = [calibrated[i : i + n] for i in range(0, len(calibrated) - n + 1, n)]
                if len(groups) >= 2:
                    errors[f"as calibration, mean of {n} profiles"] = [
                        statistics.mean(e[w] for e in g) / statistics.mean(e[widths[0]] for e in g) / truth - 1 for g in groups]
            report.append({"batch": b, "context": c, "width": w, "plain_ms": 1000 * mean[widths[0]],
                           "mean_ms": 1000 * mean[w], "mean_ratio": truth,
                           "errors": {k: dict(zip(("median", "p10", "p90"), percentiles(v)), n=len(v)) for k, v in errors.items()}})
    return report


def table(report: Sequence[dict]) -> str:
    names = list(report[0]["errors"]) if report else []
    lines = ["| batch | context | tokens per row | mean ms (plain step ms) | mean ratio | "
             + " | ".join(f"{n}: median error [p10, p90]" for n in names) + " |",
             "|---|---|---|---|---|" + "---|" * len(names)]
    for r in report:
        cells = [f"{e['median']:+.1%} [{e['p10']:+.1%}, {e['p90']:+.1%}]" if (e := r["errors"].get(n)) else "-" for n in names]
        lines.append(f"| {r['batch']} | {r['context']} | {r['width']} | {r['mean_ms']:.1f} ({r['plain_ms']:.1f}) "
                     f"| {r['mean_ratio']:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch-sizes", default="1,4,8")
    parser.add_argument("--context", type=int, default=574, help="cache length of every point (held-out chat prompts: 150-450 tokens and 24 out, at batch 8 the slots a step reads reach 574-952)")
    parser.add_argument("--widths", default="1,3,5,9", help="tokens per row; the first is the plain step the others are set against")
    parser.add_argument("--profiles", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pause", type=float, default=2.0, help="seconds between profiles")
    parser.add_argument("--pooled", default="2,4", help="pool this many profiles' figures (mean), as a profile re-timed at that many moments would")
    result_options(parser, "profile_noise")
    args = parser.parse_args(argv)
    widths = sorted(int(w) for w in args.widths.split(","))
    if args.rounds < 3 or len(widths) < 2 or args.profiles < 2:
        parser.error("--rounds at least 3 (the rule may take three), two widths or more, two profiles or more")

    info, engine = start(args, args.model)
    grid = [(int(b), args.context, w) for b in args.batch_sizes.split(",") for w in widths]
    began = time.perf_counter()
    runs = timed_profiles(engine, grid, args.profiles, args.rounds, args.pause)
    seconds = time.perf_counter() - began
    report = analyse(runs, [int(n) for n in args.pooled.split(",") if n])
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"benchmark": "profile_noise", "model": args.model, "context": args.context, "widths": widths,
            "profiles": args.profiles, "rounds": args.rounds, "machine": info, "seconds": seconds, "points": report,
            "tries_ms": [{f"b{b} ctx{c} w{w}": [round(1000 * t, 2) for t in ts] for (b, c), g in run.items() for w, ts in g.items()}
                         for run in runs]}
    md = (f"# One cost profile against the machine's mean prices\n\n`{command('bench/profile_noise.py', argv)}`, "
          f"{info['date_utc']}: {args.model}, {args.dtype}, context {args.context}, {args.profiles} profiles of {args.rounds} "
          f"rounds, {seconds:.0f} s; {machine_line(info)}.\n\nError: a point's ratio to the plain step at its batch "
          f"as the estimator reads it, over the mean ratio of every try but each profile's first round.\n\n{table(report)}\n")
    write(Path(args.out), args.name, data, md, table(report))
    return data


if __name__ == "__main__":
    main()
