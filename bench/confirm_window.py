"""Where a confirmation measures: an arm's steps right after a mid-shard switch from plain decoding,
against the same arm's later steps and a whole run under it, each over the profile's price.

Calibration in flight decodes its sample plainly (its rows admitted first), then switches the rows
in flight to the arm and measures about 20 of its steps (calibrate.confirm); the ratio they
measure over their price is how every later prediction prices that arm on the worker
(`CostProfile.arm_scale`). This runs the shard three ways, `--rounds` times, the same rows:

- `switched`: plain decoding until the sample's `--sample` rows (evenly spaced, admitted first)
  have finished, then n-gram k=`--k` for the rest, as a confirmation's shard runs;
- `arm`: the whole shard under the arm;
- `plain`: the whole shard plainly;

and reports, over the steps of the production batch size: milliseconds a step (from the engine's
own decode time between steps), the decode time over the profile's price of the forwards, and the
mean cache length (slots, holes included), for the sample's steps, the `--window` arm steps right
after the switch, the switched run's later arm steps, the whole arm run, and the plain run.

    python bench/confirm_window.py --model /tmp/fast_model --input /tmp/held7_2560.parquet --workload summarize
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import command, machine_line, result_options, start_workload, warm_plain, workload_options, write  # noqa: E402

import torch  # noqa: E402

from batchspec.calibrate.decision import sample_indices  # noqa: E402
from batchspec.calibrate.pricing import plain_rows  # noqa: E402
from batchspec.calibrate.profiling import shape_of  # noqa: E402
from batchspec.engine.base import NO_SPEC, SpecConfig  # noqa: E402
from batchspec.predict.cost import CostProfile, profile_grid  # noqa: E402

PARTS = ("sample", "window", "later", "arm", "plain")


class Logged:
    """An in-flight control that logs every step (setting, rows, width, cache length, decode
    seconds since the last step, and of them the forward's and the bookkeeping's) and switches
    to `arm` once `after` rows have finished."""

    def __init__(self, first: Sequence[int], arm: SpecConfig | None, after: int):
        self.first, self.arm, self.after = list(first), arm, after
        self.log: list[tuple[str, int, int, int, float, float, float]] = []
        self.last, self.done, self.switched = (0.0, 0.0, 0.0), 0, False

    def __call__(self, p):
        t = p.timing
        now = (t.decode_s, t.verify_s, t.other_s)
        seconds, verify, other = (a - b for a, b in zip(now, self.last))
        self.last = now
        if p.steps:
            s = p.steps[-1]
            self.log.append((p.spec.label, s.rows, s.tokens, s.context, seconds, verify, other))
        self.done += len(p.done)
        if self.arm is not None and not self.switched and self.done >= self.after:
            self.switched = True
            return self.arm
        return None


def parts_of(switched: list, arm: list, plain: list, label: str, batch: int, window: int) -> dict[str, list]:
    """The steps of the production batch size in each part (`PARTS`)."""
    full = lambda log, which: [x for x in log if x[0] == which and x[1] == batch]  # noqa: E731
    after = full(switched, label)
    return {"sample": full(switched, "none"), "window": after[:window], "later": after[window:],
            "arm": full(arm, label), "plain": full(plain, "none")}


def summary(steps: list, profile: CostProfile) -> dict:
    if not steps:
        return {"steps": 0, "ms": None, "over_price": None, "forward_over_price": None, "other_ms": None, "slots": None}
    priced = sum(profile.target_s(rows, context + 1, width) for _, rows, width, context, *_ in steps)
    measured, forward = sum(x[4] for x in steps), sum(x[5] for x in steps)
    return {"steps": len(steps), "ms": 1e3 * measured / len(steps), "over_price": measured / priced if priced > 0 else None,
            "forward_over_price": forward / priced if priced > 0 else None,
            "other_ms": 1e3 * sum(x[6] for x in steps) / len(steps), "slots": statistics.mean(x[3] for x in steps)}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_options(parser, "summarize", 128)
    parser.add_argument("--k", type=int, default=2, help="the n-gram arm's draft length")
    parser.add_argument("--sample", type=int, default=8, help="rows decoded plainly first (evenly spaced)")
    parser.add_argument("--window", type=int, default=20, help="arm steps after the switch that stand for a confirmation")
    parser.add_argument("--rounds", type=int, default=2)
    result_options(parser, "confirm_window")
    args = parser.parse_args(argv)

    info, engine, requests = start_workload(args, parser)
    b = args.batch_size
    arm = SpecConfig("ngram", args.k)
    first = sample_indices(len(requests), args.sample)  # as calibration picks its sample
    plain = warm_plain(engine, requests, b)
    profile = CostProfile()
    profile.merge(engine.profile(*profile_grid(*shape_of(plain_rows(engine, requests, plain), [arm], b, args.max_tokens))), 0.0)
    rounds = []
    for _ in range(args.rounds):
        logs = {}
        for name, start_spec, switch in (("switched", NO_SPEC, arm), ("arm", arm, None), ("plain", NO_SPEC, None)):
            control = Logged(first, switch, len(first))
            with torch.inference_mode():
                engine.generate(requests, start_spec, b, control=control)
            logs[name] = control.log
        parts = parts_of(logs["switched"], logs["arm"], logs["plain"], arm.label, b, args.window)
        rounds.append({part: summary(steps, profile) for part, steps in parts.items()})
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"benchmark": "confirm_window", "model": args.model, "input": args.input, "workload": args.workload,
            "rows": len(requests), "max_tokens": args.max_tokens, "batch_size": b, "arm": arm.label, "sample": len(first),
            "window": args.window, "machine": info, "rounds": rounds}
    table = rounds_table(rounds)
    md = (f"# Where a confirmation measures\n\n`{command('bench/confirm_window.py', argv)}`, {info['date_utc']}: {args.model}, "
          f"{args.dtype}, batch {b}, {len(requests)} {args.workload} rows, max_tokens {args.max_tokens}, {arm.label}, "
          f"sample {len(first)} rows, window {args.window} steps; {machine_line(info)}. Steps at batch {b} only; "
          f"over price: decode time (forward, accept rule, bookkeeping, drafting) over the profile's price of the forwards."
          f"\n\n{table}\n")
    write(Path(args.out), args.name, data, md, table)
    return data


def rounds_table(rounds: Sequence[dict]) -> str:
    lines = ["| round | part | steps | ms a step | over price | the forward alone over price | bookkeeping ms a step | "
             "mean slots | over price against plain's |", "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rounds):
        for part in PARTS:
            s = r[part]
            base = r["sample"] if part == "window" else r["plain"]
            rel = s["over_price"] / base["over_price"] if s["over_price"] and base["over_price"] else None
            lines.append(f"| {i + 1} | {part} | {s['steps']} | {_f(s['ms'], '.2f')} | {_f(s['over_price'], '.3f')} | "
                         f"{_f(s['forward_over_price'], '.3f')} | {_f(s['other_ms'], '.2f')} | {_f(s['slots'], '.0f')} | "
                         f"{_f(rel, '.3f')} |")
    return "\n".join(lines)


def _f(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


if __name__ == "__main__":
    main()
