"""Does the cost profile's probe cost what a decode step of the same shape costs? (issue 12)

The profile (`measure.profile`) times a forward on a probe batch: one prefilled row copied to the
batch size and cut to a context, one hole opened. The decode loop's batch holds many holes, rows
admitted at different moments, a cache that grew step by step. This bench runs each arm on the
same rows and, after every target forward of the loop (prefills left out), times:
- the same forward again on the live batch at once (its slots cut off afterwards): what a step
  costs when repeated, so the loop's own moment is set against the next one;
- a probe of the same rows, cache slots and width, built as the profile builds it (fork of one
  prefilled row, one hole, one untimed forward first: a fork's first forward grows its cache
  buffers, which the profile's fastest-try rule leaves out);
and sets the loop's forward against both, and the probe against the profile's price of the step
(`CostProfile.target_s` at its rows, slots + 1 and width; the profile timed once, after a plain
run, as a worker's is), and, from the same profile less the widest verify timed at the context's
low end, the price with a verify's context factor taken from plain steps, as before 2026-12-04.
Each of the three is a forward and the greedy accept rule on its logits (`accept_s`), as every
point of the profile is timed (`measure.time_forward`): the ratios are like against like. (Until
2026-12-05 the forward alone was timed here and set against prices that hold the accept rule: on
a model whose head is most of a step, bench/fast_model.py's, the rule is 15-30% of a step and
more of a wide one, and "probe / price" read low by that much.) The JSON keeps the rule's share.

    python bench/probe_fidelity.py --input /tmp/held7.parquet --workload continue --rows 32 --batch-size 8
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import command, machine_line, result_options, start_workload, warm_plain, workload_options, write  # noqa: E402

import torch  # noqa: E402

from batchspec.calibrate.pricing import plain_rows  # noqa: E402
from batchspec.calibrate.profiling import shape_of  # noqa: E402
from batchspec.engine.base import NO_SPEC, SpecConfig  # noqa: E402
from batchspec.engine.torch import kv, measure  # noqa: E402
from batchspec.predict.cost import CostProfile, profile_grid  # noqa: E402
from batchspec.predict.replay import slots_reach  # noqa: E402


class Shadowed:
    """While open, every target decode forward is timed with the accept rule on its logits
    (`accept_s`), repeated so at once on the live batch, and set against a probe of its shape;
    `log` holds (rows, width, slots, loop s, repeat s, probe s, the accept rule's s in the loop's)."""

    def __init__(self, engine, widest: int) -> None:
        self.engine, self.log = engine, []
        self._forward = kv.Batch.forward
        self.seed, self.filler = seed_row(engine, widest)

    def __enter__(self) -> "Shadowed":
        forward, engine, log = self._forward, self.engine, self.log

        def timed(batch, model, tokens, pad_id=0, last_only=False):
            if batch.size == 0 or model is not engine.model:
                return forward(batch, model, tokens, pad_id, last_only)
            n, width, slots = len(tokens), max(len(t) for t in tokens), batch.slots
            began = time.perf_counter()
            out = forward(batch, model, tokens, pad_id, last_only)
            forward_s = time.perf_counter() - began
            rule_s = accept_s(out, tokens)  # what decode's step does next with them, timed apart
            began = time.perf_counter()  # the same forward again, its slots then cut off
            again = forward(batch, model, tokens, pad_id, last_only)
            repeat_s = time.perf_counter() - began + accept_s(again, tokens)
            batch.keep(torch.zeros(n, dtype=torch.long, device=batch.device))
            batch._appended = width  # the loop's keep() refers to its own forward
            log.append((n, width, slots, forward_s + rule_s, repeat_s, self.probe(n, slots, width), rule_s))
            return out

        kv.Batch.forward = timed
        return self

    def probe(self, n: int, slots: int, width: int) -> float:
        return probe_s(self.engine, self.seed, self.filler, n, slots, width, forward=self._forward)

    def __exit__(self, *exc) -> None:
        kv.Batch.forward = self._forward


def seed_row(engine, length: int) -> tuple[kv.Batch, list[int]]:
    """One prefilled row of `length` filler tokens, to fork probes from (as `measure.profile` does),
    and the filler."""
    filler = [(17 + 31 * i) % engine.vocab for i in range(length)]
    with torch.inference_mode():
        seed = kv.Batch(engine.device)
        seed.forward(engine.model, [filler], engine.pad_id, last_only=True)
        seed.keep(torch.tensor([length], device=engine.device))
    return seed, filler


def accept_s(logits: torch.Tensor, tokens: Sequence[Sequence[int]]) -> float:
    """Seconds of the greedy accept rule on a step's `logits` [B, T, V], each row's tokens after its
    first taken as its drafts: `measure.greedy_rule`, which every point of the profile times."""
    began = time.perf_counter()
    measure.greedy_rule(logits, tokens)
    return time.perf_counter() - began


def probe_s(engine, seed: kv.Batch, filler: list[int], n: int, slots: int, width: int, tries: int = 1,
            forward=None) -> float:
    """The median seconds of `tries` forwards of `width` tokens on `n` rows at `slots` slots and the
    accept rule on their logits (`accept_s`), built as the profile builds its probes (a fork of
    `seed` with room for `width` more slots, one hole where n > 1); a first forward is not timed.
    `forward`: kv.Batch.forward unpatched."""
    forward = forward or kv.Batch.forward
    batch = seed.fork(torch.zeros(n, dtype=torch.long, device=engine.device), slots, room=width)
    if n > 1:
        measure._open_hole(batch)
    tokens, seconds = [filler[:width]] * n, []
    with torch.inference_mode():
        for i in range(tries + 1):
            began = time.perf_counter()
            logits = forward(batch, engine.model, tokens, engine.pad_id)
            spent = time.perf_counter() - began + accept_s(logits, tokens)
            if i:
                seconds.append(spent)
            batch.keep(torch.zeros(n, dtype=torch.long, device=engine.device))
    return statistics.median(seconds)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_options(parser, "continue", 32)
    parser.add_argument("--k", default="2,4,8", help="n-gram draft lengths to run beside plain decoding")
    parser.add_argument("--rounds", type=int, default=2)
    result_options(parser, "probe_fidelity")
    args = parser.parse_args(argv)

    info, engine, requests = start_workload(args, parser)
    b = args.batch_size
    arms = [NO_SPEC] + [SpecConfig("ngram", int(k)) for k in args.k.split(",")]
    plain = warm_plain(engine, requests, b)
    rows = plain_rows(engine, requests, plain)
    shape = shape_of(rows, arms[1:], b, args.max_tokens)
    profile = CostProfile()
    began = time.perf_counter()
    profile.merge(engine.profile(*profile_grid(*shape)), 0.0)
    profile_s = time.perf_counter() - began
    # the same profile less the widest verify timed at the context's low end: verifies priced with
    # the plain step's context factor, as before 2026-12-04 (the grid did not time that point)
    lo, max_width = shape[1], shape[3]
    plain_factor = CostProfile()
    plain_factor.merge([p for p in profile.points if (p.kind, p.batch, p.context, p.tokens) != ("target", b, lo, max_width)], 0.0)
    cells: dict = collections.defaultdict(list)  # (arm, rows, width) -> [(loop, repeat, probe, price, price before, rule)]
    widest = slots_reach(max(len(r.prompt_ids) for r in rows) + args.max_tokens) + max(a.draft_len for a in arms) + 1  # the most slots a step reads
    shadow = Shadowed(engine, widest)
    for _ in range(args.rounds):
        for arm in arms:
            with shadow, torch.inference_mode():
                shadow.log.clear()
                engine.generate(requests, arm, b)
            for n, width, slots, loop_s, repeat_s, probe_s, rule_s in shadow.log:
                cells[(arm.label, n, width)].append((loop_s, repeat_s, probe_s, profile.target_s(n, slots + 1, width),
                                                     plain_factor.target_s(n, slots + 1, width), rule_s))
    report = []
    order = {a.label: i for i, a in enumerate(arms)}
    for (label, n, width), xs in sorted(cells.items(), key=lambda c: (order[c[0][0]], c[0][1:])):
        loop, repeat, probe, price, before, rule = (sum(x[i] for x in xs) for i in range(6))
        report.append({"arm": label, "rows": n, "width": width, "forwards": len(xs), "loop_ms": 1000 * loop / len(xs),
                       "accept_rule_share_of_loop": rule / loop,
                       "loop_over_repeat": loop / repeat, "loop_over_probe": loop / probe, "probe_over_price": probe / price,
                       "probe_over_price_plain_factor": probe / before, "loop_over_price": loop / price,
                       "loop_over_probe_per_forward_median": statistics.median(x[0] / x[2] for x in xs)})
    by_arm = {}
    for arm in arms:
        mine = [x for (label, *_), xs in cells.items() if label == arm.label for x in xs]
        by_arm[arm.label] = {i: sum(x[j] for x in mine) / sum(x[k] for x in mine)
                             for i, j, k in (("loop_over_repeat", 0, 1), ("loop_over_probe", 0, 2),
                                             ("probe_over_price", 2, 3), ("loop_over_price", 0, 3),
                                             ("probe_over_price_plain_factor", 2, 4), ("accept_rule_share_of_loop", 5, 0))}
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"benchmark": "probe_fidelity", "model": args.model, "input": args.input, "workload": args.workload,
            "rows": args.rows, "max_tokens": args.max_tokens, "batch_size": b, "rounds": args.rounds, "machine": info,
            "profile_s": profile_s, "profile_ms": {f"b{p.batch} ctx{p.context} w{p.tokens}": round(1000 * p.seconds, 1)
                                                   for p in profile.points if p.kind == "target"},
            "by_arm": by_arm, "by_shape": report}
    table = arm_table(by_arm) + "\n\n" + shape_table(report)
    md = (f"# The profile's probe against the decode loop's forwards\n\n`{command('bench/probe_fidelity.py', argv)}`, "
          f"{info['date_utc']}: {args.model}, {args.dtype}, batch {b}, {args.rows} {args.workload} rows, max_tokens "
          f"{args.max_tokens}, {args.rounds} rounds; {machine_line(info)}; profile {profile_s:.1f} s.\n\n{table}\n")
    write(Path(args.out), args.name, data, md, table)
    return data


def arm_table(by_arm: dict) -> str:
    lines = ["| arm | loop / its repeat | loop / probe of its shape | probe / the profile's price | loop / price "
             "| probe / price, verifies at the plain step's context factor | the accept rule's share of the loop's |",
             "|---|---|---|---|---|---|---|"]
    for label, r in by_arm.items():
        lines.append(f"| {label} | {r['loop_over_repeat']:.3f} | {r['loop_over_probe']:.3f} | {r['probe_over_price']:.3f} "
                     f"| {r['loop_over_price']:.3f} | {r['probe_over_price_plain_factor']:.3f} | {r['accept_rule_share_of_loop']:.1%} |")
    return "\n".join(lines)


def shape_table(report: Sequence[dict]) -> str:
    lines = ["| arm | rows, tokens per row | forwards | loop ms | loop / repeat | loop / probe (per-forward median) | probe / price "
             "| ... at the plain step's factor |", "|---|---|---|---|---|---|---|---|"]
    for r in report:
        if r["forwards"] >= 4:
            lines.append(f"| {r['arm']} | {r['rows']}, {r['width']} | {r['forwards']} | {r['loop_ms']:.0f} | {r['loop_over_repeat']:.3f} "
                         f"| {r['loop_over_probe']:.3f} ({r['loop_over_probe_per_forward_median']:.3f}) | {r['probe_over_price']:.3f} "
                         f"| {r['probe_over_price_plain_factor']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
