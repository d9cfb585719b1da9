"""The suffix arm's measurement, run by `python bench/engine.py --suffix`: held-out workloads
whose rows share structure (common/workloads.py SHARED_WORKLOADS) and prose, --model (SmolLM2 by
default) through its chat template, float32, greedy, batch 1.

Per workload:
1. n-gram lookup and suffix drafting at one draft length (--suffix-k; and plain decoding on
   prose), chunk by chunk, their order rotating (side by side), each arm with a tree of its own
   (a draft scope per arm) as a real run of the arm would fill it: measured tokens per target
   step and goodput (committed tokens per decode second), suffix over n-gram (and plain);
2. from the outputs (greedy: every arm's are plain decoding's), every n-gram draft length's and
   every suffix cap's tokens per target step (counterfactual, exact for greedy at batch 1:
   tests/engine/torch/test_*acceptance.py), so the suffix arm is also compared with the best n-gram length.
Then the tree's memory: 10,000 rows of 200 output tokens counted and measured (tracemalloc),
random tokens (the worst case: nothing shared) and rows built from the plain outputs of the
structured workloads; and a cap of 8 MiB (below what they need) held while 10,000 rows arrive.

--record appends the headline figures (`metrics`) to bench/results.jsonl as bench "engine".
"""

from __future__ import annotations

import dataclasses
import os
import time
import tracemalloc
from pathlib import Path
from typing import Sequence

import numpy as np

from common import results as recorded
from common import workloads
from common.measure import command, fmt, load_engine, machine_line, ngram_arm, write  # before batchspec: puts the checkout on sys.path

from batchspec.engine.acceptance import PlainRow
from batchspec.engine.base import NO_SPEC, Request, SpecConfig, admission_order
from batchspec.engine.torch.counterfactual import ngram_acceptance, suffix_acceptance
from batchspec.engine.torch.suffix import SuffixTrees

NGRAM_KS = (2, 4, 6, 8)
SUFFIX_CAPS = (4, 8, 16)


def tokens_per_step(accepted: float, steps: float) -> float:
    return 1.0 + accepted / steps if steps else 1.0


def run_chunks(engine, requests: Sequence[Request], spec: SpecConfig, scope: str, chunk: int) -> list:
    """The rows under `spec` at batch 1, one call per chunk, every row in draft scope `scope`."""
    return [engine.generate([dataclasses.replace(r, draft_scope=scope) for r in requests[b : b + chunk]], spec, 1)
            for b in range(0, len(requests), chunk)]


def finish_order(engine, requests: Sequence[Request], chunk: int) -> list[int]:
    """The order rows finish in at batch 1 (each call admits by `admission_order`)."""
    order = []
    for b in range(0, len(requests), chunk):
        part = requests[b : b + chunk]
        order += [b + i for i in admission_order([len(engine.encode(r)) for r in part], 1)]
    return order


def summary(results: list) -> dict:
    accepted = sum(r.accepted_tokens for r in results)
    steps = sum(r.target_steps for r in results)
    decode_tokens = sum(r.decode_tokens for r in results)
    decode_s = sum(r.timing.decode_s for r in results)
    return {"tokens_per_step": tokens_per_step(accepted, steps), "goodput": decode_tokens / decode_s if decode_s else 0.0,
            "decode_s": decode_s, "decode_tokens": decode_tokens, "target_steps": steps,
            "draft_tokens": sum(r.draft_tokens for r in results), "accepted_tokens": accepted,
            "tree_hit_rate": _ratio(sum(c.tree_drafts for r in results for c in r.completions),
                                    sum(c.tree_lookups for r in results for c in r.completions))}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def bench_workload(engine, workload: str, rows: int, max_tokens: int, chunk: int, seed: int, k: int,
                   plain: bool, ngram_k: int | None = None) -> tuple[dict, list[list[int]]]:
    """n-gram at draft length `ngram_k` (default `k`) and suffix at cap `k` (and plain decoding
    when `plain`), side by side chunk by chunk, the order rotating; then every n-gram length's and
    suffix cap's counterfactual tokens per step from the outputs (greedy: every arm's are plain
    decoding's)."""
    requests = workloads.requests(workload, rows, max_tokens, seed=seed)
    arms = [(ngram_arm(ngram_k or k), []), (SpecConfig("suffix", k), [])] + ([(NO_SPEC, [])] if plain else [])
    for i, begin in enumerate(range(0, len(requests), chunk)):
        for spec, results in arms[i % len(arms):] + arms[: i % len(arms)]:
            results += run_chunks(engine, requests[begin : begin + chunk], spec, f"{workload}/{spec.label}", chunk)
    outputs = [c for r in arms[0][1] for c in r.completions]
    same = all([c.token_ids for r in res for c in r.completions] == [c.token_ids for c in outputs] for _, res in arms)
    rows_done = [PlainRow(engine.encode(requests[i]), outputs[i].token_ids, max_tokens) for i in finish_order(engine, requests, chunk)]
    started = time.perf_counter()
    ngram_cf = ngram_acceptance(rows_done, NGRAM_KS, max_ngram=ngram_arm(2).ngram_size)
    suffix_cf = suffix_acceptance(rows_done, SUFFIX_CAPS)
    counterfactual_s = time.perf_counter() - started
    cf = {f"ngram:k={k}": tokens_per_step(a.accepted_tokens, a.target_steps) for k, a in ngram_cf.items()}
    cf |= {f"suffix:k={k}": tokens_per_step(a.accepted_tokens, a.target_steps) for k, a in suffix_cf.items()}
    best_ngram = max(cf[f"ngram:k={n}"] for n in NGRAM_KS)
    measured = {spec.label: summary(res) for spec, res in arms}
    n, s = measured[arms[0][0].label], measured[arms[1][0].label]
    p = measured["none"] if plain else {"goodput": None}
    return {"workload": workload, "rows": rows, "max_tokens": max_tokens, "output_tokens": sum(c.output_tokens for c in outputs),
            "counterfactual_tokens_per_step": cf, "counterfactual_s": counterfactual_s,
            "best_ngram": arms[0][0].label, "best_suffix": arms[1][0].label, "plain": p, "measured": measured,
            "suffix_over_ngram_tokens_per_step": s["tokens_per_step"] / n["tokens_per_step"],
            "suffix_over_best_ngram_tokens_per_step": s["tokens_per_step"] / best_ngram,
            "suffix_over_ngram_goodput": _ratio(s["goodput"], n["goodput"]),
            "suffix_over_plain_goodput": _ratio(s["goodput"], p["goodput"]) if plain else None,
            "ngram_over_plain_goodput": _ratio(n["goodput"], p["goodput"]) if plain else None, "lossless": same}, [c.token_ids for c in outputs]


def tree_memory(outputs: list[list[int]], rows: int = 10_000, length: int = 200, vocab: int = 49_152, seed: int = 0,
                cap_mb: float = 8.0) -> dict:
    """The tree of `rows` rows of `length` tokens: random tokens, and (given `outputs`, the structured
    workloads' outputs) rows spliced from them with one token in ten replaced; counted and measured.
    Then the same rows over three keys under a cap of `cap_mb` (below what they need): the peak held."""
    rng = np.random.default_rng(seed)
    pool = np.concatenate([np.asarray(o, dtype=np.int64) for o in outputs if len(o)]) if outputs else None

    def structured() -> np.ndarray:
        start = int(rng.integers(0, max(1, len(pool) - length)))
        row = np.resize(pool[start:], length).copy()
        swap = rng.random(length) < 0.1
        row[swap] = rng.integers(0, vocab, int(swap.sum()))
        return row

    out = {}
    kinds = [("random", lambda: rng.integers(0, vocab, length))] + ([("structured", structured)] if outputs else [])
    for name, make in kinds:
        made = [make() for _ in range(rows)]
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        started = time.perf_counter()
        trees = SuffixTrees(cap_bytes=1 << 40)
        for i, row in enumerate(made):
            trees.add("key", f"{name}-{i:05d}", row)
        held = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        out[name] = {"rows": rows, "tokens": rows * length, "counted_mb": trees.nbytes / 2**20, "measured_mb": held / 2**20,
                     "insert_s": time.perf_counter() - started, "segments": len(trees.trees["key"].segments)}
    capped = SuffixTrees(cap_bytes=int(cap_mb * 2**20))
    peak = 0
    for i in range(rows):
        capped.add("k" + str(i % 3), f"r{i}", rng.integers(0, vocab, length))
        peak = max(peak, capped.nbytes)
    out[f"cap_{cap_mb:g}mb"] = {"peak_mb": peak / 2**20, "held_rows": sum(t.rows for t in capped.trees.values()),
                                "evicted_rows": capped.evicted, "held": peak <= capped.cap_bytes}
    return out


def table(results: list[dict]) -> str:
    lines = ["| workload | rows | arms | tokens/step n-gram | tokens/step suffix | ratio (>= 1.3) | vs best n-gram k "
             "| goodput plain | goodput n-gram | goodput suffix | suffix / n-gram (>= 1.2) | suffix / plain | tree hit rate "
             "| counterfactual suffix k=4/8/16 | lossless |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        n, s = r["measured"][r["best_ngram"]], r["measured"][r["best_suffix"]]
        caps = "/".join(f"{r['counterfactual_tokens_per_step'][f'suffix:k={c}']:.2f}" for c in SUFFIX_CAPS)
        lines.append(f"| {r['workload']} | {r['rows']} | {r['best_ngram']}, {r['best_suffix']} | {n['tokens_per_step']:.2f} "
                     f"| {s['tokens_per_step']:.2f} | {r['suffix_over_ngram_tokens_per_step']:.2f}x "
                     f"| {r['suffix_over_best_ngram_tokens_per_step']:.2f}x | {fmt(r['plain']['goodput'], '.1f')} "
                     f"| {n['goodput']:.1f} | {s['goodput']:.1f} | {fmt(r['suffix_over_ngram_goodput'])}x "
                     f"| {fmt(r['suffix_over_plain_goodput'])}x | {fmt(s['tree_hit_rate'])} | {caps} | {r['lossless']} |")
    return "\n".join(lines)


# The headline figures --record appends (bench "engine", its args saying suffix): per workload the
# suffix arm over the n-gram arm beside it (their lengths in the args), tokens per target step and goodput; the tree's
# memory for the memory check's rows, counted and measured, and whether the cap held.
def metrics(data: dict) -> dict:
    out = {}
    for r in data["workloads"]:
        out[f"suffix_vs_ngram_tokens_per_step@{r['workload']}"] = round(r["suffix_over_ngram_tokens_per_step"], 3)
        out[f"suffix_vs_ngram_goodput@{r['workload']}"] = round(r["suffix_over_ngram_goodput"] or 0.0, 3)
    memory = data["memory"]
    for kind in ("random", "structured"):
        if kind in memory:
            out[f"tree_mb_counted@{kind}"] = round(memory[kind]["counted_mb"], 2)
            out[f"tree_mb_measured@{kind}"] = round(memory[kind]["measured_mb"], 2)
    out["cap_8mb_held"] = memory["cap_8mb"]["held"]
    return out


def main(args, argv: Sequence[str] | None, info: dict) -> dict:
    """`bench/engine.py --suffix`: load --model in float32, run every workload and the memory check,
    print the tables; with --out also OUT/engine_suffix.*, with --record its figures in
    bench/results.jsonl."""
    engine = load_engine(args.model, "float32")
    results, structured = [], []
    chosen = args.suffix_workloads.split(",") if args.suffix_workloads else (*workloads.SHARED_WORKLOADS, "prose")
    for workload in chosen if args.suffix_rows > 0 else ():  # 0: memory only
        rows = args.suffix_rows if workload != "prose" else max(16, args.suffix_rows // 4)
        result, outputs = bench_workload(engine, workload, rows, args.max_tokens or 64, chunk=16, seed=57,
                                         k=args.suffix_k, plain=workload == "prose", ngram_k=args.suffix_ngram_k)
        results.append(result)
        structured += outputs if workload != "prose" else []
        print(table(results[-1:]), flush=True)
    memory = tree_memory(structured, rows=args.suffix_memory_rows)
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"benchmark": "engine_suffix", "model": args.model, "machine": info, "workloads": results, "memory": memory}
    mem = "\n".join(f"- {k}: {v}" for k, v in memory.items())
    md = (f"# Suffix drafting\n\n`{command('bench/engine.py', argv)}`, {info['date_utc']}: {machine_line(info)}, "
          f"float32, greedy, batch 1, {args.model} through its chat template. n-gram and suffix at one draft length "
          f"(and plain decoding on prose) side by side, chunk by chunk, order rotating; 'vs best n-gram k': measured "
          f"suffix tokens/step over the best n-gram length's counterfactual (exact: greedy, batch 1).\n\n{table(results)}"
          f"\n\nTree memory:\n{mem}\n")
    write(Path(args.out) if args.out else None, "engine_suffix", data, md, table(results))
    print(f"tree memory: {mem}", flush=True)
    data["record"] = recorded.record("engine", "bench/engine.py", args, argv, metrics(data))
    return data
