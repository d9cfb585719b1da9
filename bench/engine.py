"""Engine benchmark: plain decoding, n-gram and draft-model speculation, side by side in
one run, as ratios measured in that run.

Three comparisons, each interleaved chunk by chunk (plain and speculative alternate, order
rotating) so machine noise hits both alike:
- plain decoding at batch 8 vs batch 1 (SmolLM2, mixed workloads). Target >= 4x.
- n-gram prompt lookup vs plain at batch 1 on the copy-heavy edit set. Target >= 2x.
- Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B vs plain at batch 1 on code. Target >= 1.6x.

tokens/s is goodput: committed output tokens per second of decode time (prefill, identical for
both arms, left out, as calibration measures it); tokens over the whole wall time of
`engine.generate` (prefill included, model loading excluded) and that ratio are reported beside it.

    python bench/engine.py [--quick] [--threads N] [--dtype bfloat16] [--out DIR] [--record]

The three speedups are the headline figures --record appends to bench/results.jsonl; --out DIR
writes every detail (DIR/engine.json, DIR/engine.md).

    python bench/engine.py --structured [--quick] [--model M] [--record]

runs structured output on an extraction workload instead (bench/common/structured.py), in float32:
constrained against unconstrained plain decoding per output token, grammar-forced drafts with
n-gram lookup against constrained plain (every arm's tokens checked equal to plain decoding's,
which holds exactly in float32 only), and the share of tokens forced.

    python bench/engine.py --suffix [--suffix-rows 128] [--max-tokens 64] [--suffix-k 8] [--record]

runs the suffix arm instead (bench/common/suffix.py): n-gram and suffix drafting side by side on
held-out workloads whose rows share structure and on prose (float32, batch 1), every arm's
counterfactual tokens per step, and the suffix tree's memory.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import results, workloads  # noqa: E402
from common.measure import choose_threads, command, fmt, interleaved, load_engine, machine, machine_line, ngram_arm, write  # noqa: E402

from batchspec.engine.base import NO_SPEC, SpecConfig  # noqa: E402

@dataclass(frozen=True)
class Sizes:
    """How much each comparison generates."""

    batch_prompts: int  # prompts for plain b1 vs b8 (a multiple of 8)
    copy_prompts: int
    code_prompts: int
    max_tokens: int

    @classmethod
    def pick(cls, quick: bool) -> "Sizes":
        return cls(8, 2, 2, 32) if quick else cls(16, 3, 3, 64)


@dataclass
class Comparison:
    """A candidate against a baseline, measured side by side."""

    name: str
    model: str
    workload: str
    baseline: dict
    candidate: dict
    target: float

    @property
    def speedup(self) -> float:
        """Goodput ratio: speculation and batching change decode, not the (identical) prefill."""
        return self.candidate["goodput"] / self.baseline["goodput"] if self.baseline["goodput"] else 0.0

    def to_dict(self) -> dict:
        wall = self.candidate["tokens_per_s"] / self.baseline["tokens_per_s"] if self.baseline["tokens_per_s"] else 0.0
        return {**asdict(self), "speedup": self.speedup, "speedup_wall": wall, "met": self.speedup >= self.target}


def comparison_table(comparisons: Sequence[dict]) -> str:
    lines = ["| comparison | model | workload | batch | baseline tok/s | candidate | tok/s | acceptance | mean accepted len | speedup | target | met | wall tok/s (base / cand) | wall speedup |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in comparisons:
        b, k = c["baseline"], c["candidate"]
        lines.append(f"| {c['name']} | {c['model']} | {c['workload']} | {k['batch_size']} | {fmt(b['goodput'], '.1f')} "
                     f"| {k['label']} | {fmt(k['goodput'], '.1f')} | {fmt(k['acceptance_rate'])} | {fmt(k['mean_accepted_len'])} "
                     f"| {c['speedup']:.2f}x | >= {c['target']}x | {'yes' if c['met'] else 'NO'} "
                     f"| {b['tokens_per_s']:.1f} / {k['tokens_per_s']:.1f} | {c['speedup_wall']:.2f}x |")
    return "\n".join(lines)


# The headline figures, by comparison: each a goodput ratio measured side by side in one run.
KEYS = {"plain batch 8 vs batch 1": "plain_b8_vs_b1", "n-gram vs plain, batch 1": "ngram_vs_plain_b1",
        "draft model vs plain, batch 1": "draft_vs_plain_b1"}


def bench_batching(engine, model: str, sizes: Sizes) -> Comparison:
    per = max(1, sizes.batch_prompts // len(workloads.WORKLOADS))
    requests = [r for w in workloads.WORKLOADS for r in workloads.requests(w, per, sizes.max_tokens)]
    requests = [requests[i] for i in sorted(range(len(requests)), key=lambda i: i % per)]  # mixed chunks
    m = interleaved(engine, requests, [("none b1", NO_SPEC, 1), ("none b8", NO_SPEC, 8)], chunk=8)
    return Comparison("plain batch 8 vs batch 1", model, "mixed", m["none b1"].summary(), m["none b8"].summary(), 4.0)


def bench_speculation(engine, model: str, workload: str, n: int, max_tokens: int, spec: SpecConfig,
                      name: str, target: float) -> tuple[Comparison, dict[str, Measured]]:
    requests = workloads.requests(workload, n, max_tokens)
    m = interleaved(engine, requests, [("none b1", NO_SPEC, 1), (f"{spec.label} b1", spec, 1)], chunk=1)
    return Comparison(name, model, workload, m["none b1"].summary(), m[f"{spec.label} b1"].summary(), target), m


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="model for plain batch 1 vs 8")
    parser.add_argument("--ngram-model", default="qwen2.5-coder-1.5b", help="model for n-gram vs plain on copy-heavy edits")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", help="target of the draft-model comparison")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--ngram-k", type=int, default=6)
    parser.add_argument("--draft-k", type=int, default=4)
    parser.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                        help="the engine comparisons' dtype (default bfloat16); --structured and --suffix run float32, "
                        "where greedy speculative output equals plain output exactly, as they check")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: 2 if the machine is quiet, else 1)")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="few prompts and tokens (minutes, not tens of minutes)")
    parser.add_argument("--out", default=None, metavar="DIR", help="write every detail to DIR/engine.json and DIR/engine.md")
    parser.add_argument("--structured", action="store_true",
                        help="instead: structured output on an extraction workload with --model (bench/common/structured.py)")
    parser.add_argument("--suffix", action="store_true", help="instead: the suffix arm on rows that share structure "
                        "and on prose, --model, batch 1, float32 (bench/common/suffix.py)")
    parser.add_argument("--suffix-rows", type=int, default=128, help="with --suffix: rows per structured workload (prose: a quarter, at least 16; 0: the memory check only)")
    parser.add_argument("--suffix-memory-rows", type=int, default=10_000, help="with --suffix: rows of 200 tokens in the memory check")
    parser.add_argument("--suffix-k", type=int, default=8, help="with --suffix: the suffix arm's draft-length cap")
    parser.add_argument("--suffix-ngram-k", type=int, default=None, help="with --suffix: the n-gram arm's draft length beside it "
                        "(default --suffix-k): the best n-gram length against the best cap")
    parser.add_argument("--suffix-workloads", default=None, help="with --suffix: comma-separated workloads (default all)")
    results.add_options(parser)
    args = parser.parse_args(argv)
    lossless = args.structured or args.suffix  # they check speculative tokens against plain ones
    if lossless and args.dtype == "bfloat16":
        parser.error("--structured and --suffix run in float32: in bfloat16 near-tied logits may pick other tokens "
                     "when scored in one pass, so their equality check would fail for no fault of the engine")
    args.dtype = args.dtype or ("float32" if lossless else "bfloat16")

    threads = choose_threads(args.threads)
    sizes = Sizes.pick(args.quick)
    if args.max_tokens:
        sizes = Sizes(sizes.batch_prompts, sizes.copy_prompts, sizes.code_prompts, args.max_tokens)
    info = machine(threads, args.dtype)
    print(f"machine: {info}", flush=True)
    if args.structured:
        from common import structured

        return structured.main(args, argv, info)
    if args.suffix:
        from common import suffix

        return suffix.main(args, argv, info)
    comparisons: list[Comparison] = []
    engines = {}

    def engine_for(model: str, draft: str | None = None):
        if model not in engines:
            engines[model] = load_engine(model, args.dtype, draft)
        return engines[model]

    comparisons.append(bench_batching(engine_for(args.model), args.model, sizes))
    print(comparison_table([comparisons[-1].to_dict()]), flush=True)
    ngram = ngram_arm(args.ngram_k)
    c, _ = bench_speculation(engine_for(args.ngram_model), args.ngram_model, "edit", sizes.copy_prompts, sizes.max_tokens,
                             ngram, "n-gram vs plain, batch 1", 2.0)
    comparisons.append(c)
    print(comparison_table([c.to_dict()]), flush=True)
    draft = SpecConfig("draft_target", args.draft_k, draft_model=args.draft_model)
    c, _ = bench_speculation(engine_for(args.target, args.draft_model), f"{args.target} <- {args.draft_model}", "code",
                             sizes.code_prompts, sizes.max_tokens, draft, "draft model vs plain, batch 1", 1.6)
    comparisons.append(c)

    rows = [c.to_dict() for c in comparisons]
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"benchmark": "engine", "quick": args.quick, "max_tokens": sizes.max_tokens, "machine": info, "comparisons": rows}
    table = comparison_table(rows)
    md = (f"# Engine benchmark\n\n`{command('bench/engine.py', argv)}`, {info['date_utc']}: "
          f"{machine_line(info)}, {args.dtype}, greedy, max_tokens {sizes.max_tokens}. tok/s = goodput (output tokens / "
          f"decode seconds, prefill excluded); wall tok/s includes prefill; speedups are ratios within this one run.\n\n{table}")
    write(Path(args.out) if args.out else None, "engine", data, md, table)
    data["record"] = results.record("engine", "bench/engine.py", args, argv, {
        KEYS[r["name"]]: round(r["speedup"], 3) for r in rows})
    return data


if __name__ == "__main__":
    main()
