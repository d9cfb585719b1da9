"""The greedy pick over the vocabulary: torch's argmax against the engine's blocked one
(`batchspec.engine.sampling.argmax`), side by side in one run.

Two parts:
- the pick alone, over the shapes a step asks it (rows x positions x vocabulary, float32 and
  bfloat16): milliseconds each way, and whether the indices are equal;
- whole decodes of the same rows (plain and n-gram arms, batch `--batch-size`) with the engine's
  pick and with torch's put back in every place the engine picks (the accept rule, the first
  token after prefill, a draft model's proposals, the profile's probes, the counterfactual),
  alternating, `--rounds` times: decode seconds each way, their ratio, and whether every row's
  tokens are the same.

    python bench/argmax.py --input /tmp/held7_2560.parquet --workload summarize --model /tmp/fast_model
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import command, machine_line, ngram_arm, result_options, start_workload, workload_options, write  # noqa: E402

import torch  # noqa: E402

from batchspec.engine import sampling  # noqa: E402
from batchspec.engine.base import NO_SPEC  # noqa: E402
from batchspec.engine.torch import decode, drafters, measure  # noqa: E402
from batchspec.predict import acceptance  # noqa: E402

PICKERS = (sampling, decode, drafters, measure, acceptance)  # every module that picks through `argmax`


def torch_argmax(x: torch.Tensor) -> torch.Tensor:
    """The pick as it was until 2026-12-05: torch's argmax over the logits widened to float32."""
    return x.float().argmax(-1)


@contextlib.contextmanager
def picking(pick) -> Iterator[None]:
    """The engine picks greedy tokens with `pick` while open."""
    held = [m.argmax for m in PICKERS]
    for m in PICKERS:
        m.argmax = pick
    try:
        yield
    finally:
        for m, f in zip(PICKERS, held):
            m.argmax = f


def time_pick(pick, x: torch.Tensor, reps: int) -> float:
    """The median milliseconds of `reps` picks over `x`, after one untimed."""
    pick(x)
    seconds = []
    for _ in range(reps):
        began = time.perf_counter()
        pick(x)
        seconds.append(time.perf_counter() - began)
    return 1000 * statistics.median(seconds)


def picks(vocab: int, reps: int) -> list[dict]:
    out = []
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for rows, positions in ((1, 1), (1, 9), (8, 1), (8, 3), (8, 9)):
            x = torch.randn(rows, positions, vocab, generator=gen).to(dtype)
            before, after = time_pick(torch_argmax, x, reps), time_pick(sampling.argmax, x, reps)
            out.append({"dtype": str(dtype).removeprefix("torch."), "rows": rows, "positions": positions, "vocab": vocab,
                        "torch_ms": before, "blocked_ms": after, "ratio": before / after,
                        "equal": bool(torch.equal(torch_argmax(x), sampling.argmax(x)))})
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_options(parser, "summarize", 128)
    parser.add_argument("--k", default="2,8", help="n-gram draft lengths to run beside plain decoding")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=30, help="timings of each pick over each shape")
    result_options(parser, "argmax")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.rows < 1:
        parser.error("--rounds and --rows must be at least 1")

    info, engine, requests = start_workload(args, parser)
    arms = [NO_SPEC] + [ngram_arm(int(k)) for k in args.k.split(",")]
    shapes = picks(engine.vocab, args.reps)
    runs: dict = {(a.label, way): [] for a in arms for way in ("torch", "blocked")}
    same = {a.label: True for a in arms}
    with torch.inference_mode():
        engine.generate(requests[: args.batch_size], NO_SPEC, args.batch_size)  # warm
        for r in range(args.rounds):
            for arm in arms:
                tokens = {}
                ways = ("torch", "blocked") if r % 2 == 0 else ("blocked", "torch")
                for way in ways:
                    with picking(torch_argmax if way == "torch" else sampling.argmax):
                        result = engine.generate(requests, arm, args.batch_size)
                    runs[(arm.label, way)].append(result.timing.decode_s)
                    tokens[way] = [c.token_ids for c in result.completions]
                same[arm.label] &= tokens["torch"] == tokens["blocked"]
    decodes = [{"arm": a.label, "torch_s": runs[(a.label, "torch")], "blocked_s": runs[(a.label, "blocked")],
                "ratio": sum(runs[(a.label, "torch")]) / sum(runs[(a.label, "blocked")]), "same_tokens": same[a.label]}
               for a in arms]
    plain = decodes[0]
    for d in decodes:  # each arm's speedup over plain decoding, with either pick
        d["vs_plain_torch"] = sum(plain["torch_s"]) / sum(d["torch_s"])
        d["vs_plain_blocked"] = sum(plain["blocked_s"]) / sum(d["blocked_s"])
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"benchmark": "argmax", "model": args.model, "input": args.input, "workload": args.workload, "rows": len(requests),
            "max_tokens": args.max_tokens, "batch_size": args.batch_size, "rounds": args.rounds, "machine": info,
            "picks": shapes, "decodes": decodes}
    table = picks_table(shapes) + "\n\n" + decodes_table(decodes)
    md = (f"# The greedy pick: torch's argmax against the engine's blocked one\n\n`{command('bench/argmax.py', argv)}`, "
          f"{info['date_utc']}: {args.model}, {args.dtype}, batch {args.batch_size}, {len(requests)} {args.workload} rows, "
          f"max_tokens {args.max_tokens}, {args.rounds} rounds alternating; {machine_line(info)}.\n\n{table}\n")
    write(Path(args.out), args.name, data, md, table)
    return data


def picks_table(shapes: Sequence[dict]) -> str:
    lines = ["| logits | torch ms | blocked ms | ratio | same indices |", "|---|---|---|---|---|"]
    for s in shapes:
        lines.append(f"| {s['rows']} x {s['positions']} x {s['vocab']}, {s['dtype']} | {s['torch_ms']:.3f} | "
                     f"{s['blocked_ms']:.3f} | {s['ratio']:.1f}x | {'yes' if s['equal'] else 'NO'} |")
    return "\n".join(lines)


def decodes_table(decodes: Sequence[dict]) -> str:
    lines = ["| arm | decode s, torch's pick | decode s, blocked | torch / blocked | vs plain, torch's pick | vs plain, blocked "
             "| same tokens |", "|---|---|---|---|---|---|---|"]
    for d in decodes:
        lines.append(f"| {d['arm']} | {', '.join(f'{x:.2f}' for x in d['torch_s'])} | {', '.join(f'{x:.2f}' for x in d['blocked_s'])} "
                     f"| {d['ratio']:.2f}x | {d['vs_plain_torch']:.2f}x | {d['vs_plain_blocked']:.2f}x | {'yes' if d['same_tokens'] else 'NO'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
