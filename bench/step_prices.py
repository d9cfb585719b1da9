"""The cost model against the engine, forward by forward (issue 12: predicted goodput within 10%).

Measures the worker's cost profile as calibration does (`profile_grid` over the rows' contexts, at
the batch size), then runs plain decoding and each arm on the same rows, `--rounds` times,
alternating, and times every forward the engine runs (target and draft). Side by side, per arm:
- decode seconds predicted (the replay of batchspec.predict over the plain run's counterfactual,
  as calibration predicts; scaled by the plain run's anchor) against measured, split into verify
  and draft;
- the speedup over plain decoding predicted against measured (the measured one: plain's mean
  decode time over the arm's);
- per step shape (rows, tokens per row) the measured target forward over the profile's price of
  the same step (its cache length included), and the draft's forwards by width.
And each profile point's tries: their spread says how quiet the machine was while it was measured
(the profile keeps the fastest try).

    python bench/step_prices.py --model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b \
        --batch-size 4 --rows 8 --dtype float32 --threads 2
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workloads  # noqa: E402
from engine import command, machine_line, result_options, start, write  # noqa: E402

from batchspec.calibrate.pricing import Anchor, _counterfactual, none_plans, plain_rows  # noqa: E402
from batchspec.calibrate.profiling import shape_of  # noqa: E402
from batchspec.engine.base import NO_SPEC, SpecConfig  # noqa: E402
from batchspec.engine.torch import kv, measure  # noqa: E402
from batchspec.predict.cost import CostProfile, profile_grid  # noqa: E402
from batchspec.predict.replay import RowPlan, predict_decode_s  # noqa: E402


class Forwards:
    """Every forward the engine runs while installed: (model kind, rows, tokens per row, cache
    slots before it, seconds); prefills (an empty batch) are left out."""

    def __init__(self, target_model) -> None:
        self.target_model = target_model
        self.log: list[tuple[str, int, int, int, float]] = []
        self._forward = kv.Batch.forward

    def __enter__(self) -> "Forwards":
        forward, log, target = self._forward, self.log, self.target_model

        def timed(batch, model, tokens, pad_id=0, last_only=False):
            slots, began = batch.slots if batch.size else -1, time.perf_counter()
            out = forward(batch, model, tokens, pad_id, last_only)
            if slots >= 0:
                log.append(("target" if model is target else "draft", len(tokens), max(len(t) for t in tokens), slots,
                            time.perf_counter() - began))
            return out

        kv.Batch.forward = timed
        return self

    def __exit__(self, *exc) -> None:
        kv.Batch.forward = self._forward


@contextlib.contextmanager
def recorded_tries() -> Iterator[dict]:
    """Every forward `measure.profile` times while open, in the order it ran them: (kind, batch,
    context, tokens per row) -> seconds of each try (on the engine's first profile of a model that
    has not decoded, its warm-up forward included, first in its first point: measure.profile)."""
    tries: dict = collections.defaultdict(list)
    time_forward = measure.time_forward

    def recorded(batch, model, kind, tokens, b, *rest):
        seconds = time_forward(batch, model, kind, tokens, b, *rest)
        tries[(kind, b, batch.slots, len(tokens))].append(seconds)
        return seconds

    measure.time_forward = recorded
    try:
        yield tries
    finally:
        measure.time_forward = time_forward


def profile_with_tries(engine, grid) -> tuple[CostProfile, dict, float]:
    """The profile as calibration measures it, and every try of every point (ms)."""
    with recorded_tries() as tries:
        began = time.perf_counter()
        profile = CostProfile()
        profile.merge(engine.profile(*grid), 0.0)
        seconds = time.perf_counter() - began
    return profile, {f"{k} b{b} ctx{c} w{w}": [round(1000 * t, 1) for t in ts] for (k, b, c, w), ts in tries.items()}, seconds


def plans_of(rows, acceptance) -> list[RowPlan]:
    return [RowPlan(len(r.prompt_ids), len(r.output_ids) - 1, s, p) for r, s, p in zip(rows, acceptance.steps, acceptance.proposed)]


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--draft-model", default=None, help="add a DraftTarget arm with this draft model")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--k", type=int, default=4, help="draft length of the arms")
    parser.add_argument("--workload", default="code", help=f"one of {', '.join(workloads.WORKLOADS)}, or with --input a task")
    parser.add_argument("--input", default=None, help="rows from this prompt Parquet (a task column; prompt or messages, as batchspec run reads them), e.g. examples/prompts.parquet")
    parser.add_argument("--pick", default="head", choices=["head", "sample", "confirm"],
                        help="with --input: the first rows, or those calibration samples or confirms on at --batch-size")
    parser.add_argument("--rounds", type=int, default=2)
    result_options(parser, "step_prices")
    args = parser.parse_args(argv)

    info, engine = start(args, args.model, args.draft_model)
    b = args.batch_size
    if args.input:
        requests = workloads.from_parquet(args.input, args.workload, args.rows if args.pick == "head" else b,
                                          args.max_tokens, args.pick)
    else:
        requests = workloads.requests(args.workload, args.rows, args.max_tokens)
    engine.generate(requests[:b], NO_SPEC, b)  # warm the target
    arms = [SpecConfig("ngram", args.k)] + ([SpecConfig("draft_target", args.k, draft_model=args.draft_model)]
                                            if args.draft_model else [])
    plain = engine.generate(requests, NO_SPEC, b)
    rows = plain_rows(engine, requests, plain)
    acceptance, lookup_s = _counterfactual(engine, rows, arms)  # warms the draft too, as calibration does
    grid = profile_grid(*shape_of(rows, arms, b, args.max_tokens))  # the contexts calibration times
    profile, tries, profile_s = profile_with_tries(engine, grid)
    anchor = Anchor.of(plain, rows, profile, b)
    none_priced = predict_decode_s(none_plans(rows), b, profile, other_per_row_step=anchor.other)
    priced = {"none": none_priced}
    for arm in arms:
        priced[arm.label] = predict_decode_s(plans_of(rows, acceptance[arm.label]), b, profile, arm.method,
                                             arm.draft_model, anchor.other, lookup_s)
    runs: dict[str, list] = collections.defaultdict(list)
    same: dict[str, list[int]] = collections.defaultdict(list)  # rows identical to the first plain run's (near-ties may flip)
    steps: dict[str, dict] = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0, 0.0]))
    drafts: dict[str, dict] = collections.defaultdict(lambda: collections.defaultdict(list))
    for _ in range(args.rounds):
        for arm in [NO_SPEC, *arms]:
            with Forwards(engine.model) as forwards:
                result = engine.generate(requests, arm, b)
            same[arm.label].append(sum(c.token_ids == p.token_ids for c, p in zip(result.completions, plain.completions)))
            runs[arm.label].append(result.timing)
            for kind, n, width, slots, seconds in forwards.log:
                if kind == "target":
                    cell = steps[arm.label][f"b{n} w{width}"]
                    cell[0] += 1
                    cell[1] += seconds
                    cell[2] += profile.target_s(n, slots + 1, width)
                elif width <= 2:  # a draft step (wider: a draft prefill of joining rows)
                    drafts[arm.label][f"b{n} w{width}"].append(seconds)
    plain_s = statistics.mean(t.decode_s for t in runs["none"])
    report = []
    for label, pred in priced.items():
        measured = runs[label]
        decode = statistics.mean(t.decode_s for t in measured)
        report.append({
            "arm": label,
            "predicted_decode_s": anchor.scale * pred.decode_s, "measured_decode_s": decode,
            "measured_decode_s_each": [round(t.decode_s, 2) for t in measured],
            "predicted_verify_s": anchor.scale * pred.verify_s, "measured_verify_s": statistics.mean(t.verify_s for t in measured),
            "predicted_draft_s": anchor.scale * pred.draft_s, "measured_draft_s": statistics.mean(t.draft_s for t in measured),
            "predicted_speedup": none_priced.decode_s / pred.decode_s if pred.decode_s else None,
            "measured_speedup": plain_s / decode if decode else None,
            "measured_speedup_each": [round(plain_s / t.decode_s, 3) for t in measured],
            "rows_identical_to_plain": same[label],
            "target_steps_measured_over_priced": {k: {"n": v[0], "measured_ms": 1000 * v[1] / v[0], "priced_ms": 1000 * v[2] / v[0],
                                                      "ratio": v[1] / v[2] if v[2] else None}
                                                  for k, v in sorted(steps[label].items())},
            "draft_steps_ms": {k: {"n": len(v), "median": 1000 * statistics.median(v), "min": 1000 * min(v)}
                               for k, v in sorted(drafts[label].items())},
        })
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"benchmark": "step_prices", "model": args.model, "draft_model": args.draft_model, "rows": args.rows,
            "max_tokens": args.max_tokens, "batch_size": b, "k": args.k, "workload": args.workload, "rounds": args.rounds,
            "machine": info, "profile_s": profile_s, "anchor_scale": anchor.scale, "profile_tries_ms": tries,
            "profile_ms": {f"{p.kind} b{p.batch} ctx{p.context} w{p.tokens}": round(1000 * p.seconds, 1) for p in profile.points},
            "arms": report}
    table = arm_table(report) + "\n\n" + step_table(report)
    md = (f"# The cost model, forward by forward\n\n`{command('bench/step_prices.py', argv)}`, {info['date_utc']}: "
          f"{args.model}{' + ' + args.draft_model if args.draft_model else ''}, {args.dtype}, batch {b}, {args.rows} "
          f"{args.workload} rows, max_tokens {args.max_tokens}, {args.rounds} rounds; {machine_line(info)}; profile {profile_s:.1f} s, "
          f"plain run over its price {anchor.scale:.3f}.\n\n{table}\n\nProfile tries (ms; the fastest counts): {tries}\n")
    write(Path(args.out), args.name, data, md, table)
    return data


def arm_table(report: Sequence[dict]) -> str:
    lines = ["| arm | decode s predicted | measured (each round) | verify s pred / meas | draft s pred / meas | speedup predicted | measured (each round) | error |",
             "|---|---|---|---|---|---|---|---|"]
    for a in report:
        error = a["predicted_speedup"] / a["measured_speedup"] - 1 if a["predicted_speedup"] and a["measured_speedup"] else None
        lines.append(f"| {a['arm']} | {a['predicted_decode_s']:.2f} | {a['measured_decode_s']:.2f} ({', '.join(map(str, a['measured_decode_s_each']))}) "
                     f"| {a['predicted_verify_s']:.2f} / {a['measured_verify_s']:.2f} | {a['predicted_draft_s']:.2f} / {a['measured_draft_s']:.2f} "
                     f"| {a['predicted_speedup']:.3f}x | {a['measured_speedup']:.3f}x ({', '.join(map(str, a['measured_speedup_each']))}) "
                     f"| {'-' if error is None else f'{error:+.1%}'} |")
    return "\n".join(lines)


def step_table(report: Sequence[dict]) -> str:
    lines = ["| arm | step (rows, tokens per row) | forwards | measured ms | priced ms | measured / priced |", "|---|---|---|---|---|---|"]
    for a in report:
        for shape, c in a["target_steps_measured_over_priced"].items():
            lines.append(f"| {a['arm']} | target {shape} | {c['n']} | {c['measured_ms']:.0f} | {c['priced_ms']:.0f} | {c['ratio']:.3f} |")
        for shape, c in a["draft_steps_ms"].items():
            lines.append(f"| {a['arm']} | draft {shape} | {c['n']} | {c['median']:.0f} (median; min {c['min']:.0f}) | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
