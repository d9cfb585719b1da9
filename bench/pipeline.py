"""Pipeline overhead: the same prompts through `batchspec run` with one worker and through the
engine alone, side by side. Target: the pipeline reaches at least 0.85x the engine's tokens/s.

The engine runs before and after the pipeline and its mean is the reference. Both sides run the same model, dtype, batch size, sampling and speculative setting (`--spec none`
by default, so only the pipeline's own costs differ: Ray, the key scan, reading shards back,
writing Parquet, commit marks). Reported:
- engine tokens/s: output tokens / seconds inside `engine.generate` (model load excluded);
- pipeline tokens/s (work): output tokens / seconds of the worker step (actor start and model load
  included, Ray start and the key scan excluded);
- pipeline tokens/s (end to end): output tokens / the whole `pipeline.run` call;
- pipeline overhead: seconds of `pipeline.run` spent outside the shards' calibrate + generate
  (the part the pipeline adds; robust to machine noise, unlike the ratio on shared cores).

The ratios and the overhead are the figures --record appends to bench/results.jsonl; --out FILE
writes every detail as JSON.

    python bench/pipeline.py [--rows 240] [--max-tokens 32] [--batch-size 8] [--spec none] [--out FILE] [--record]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import results  # noqa: E402
from common.measure import ROOT  # noqa: E402  (and the checkout's batchspec first on sys.path)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", default=str(ROOT / "examples" / "prompts.parquet"))
    parser.add_argument("--rows", type=int, default=240)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--shard-size", type=int, default=80)
    parser.add_argument("--spec", default="none")
    parser.add_argument("--prompt-format", default="chat", choices=("chat", "raw"), help="how prompts reach the model, both sides")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, metavar="FILE", help="write every detail to FILE (JSON)")
    results.add_options(parser)
    args = parser.parse_args(argv)

    import pyarrow.parquet as pq

    work = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    table = pq.read_table(args.input).slice(0, args.rows)
    pq.write_table(table, work / "prompts.parquet")

    # Engine, pipeline, engine: machine noise (2 shared cores) hits both sides alike.
    before = bench_engine(work, table, args)
    pipe = bench_pipeline(work, args)
    after = bench_engine(work, table, args)
    seconds = before["seconds"] + after["seconds"]
    engine = {"output_tokens": before["output_tokens"], "seconds": seconds / 2,
              "tokens_per_s": (before["output_tokens"] + after["output_tokens"]) / seconds,
              "runs_tokens_per_s": [before["tokens_per_s"], after["tokens_per_s"]]}
    result = {
        "rows": table.num_rows, "model": args.model, "max_tokens": args.max_tokens, "batch_size": args.batch_size,
        "spec": args.spec, "prompt_format": args.prompt_format, "engine": engine, "pipeline": pipe,
        "ratio_work": pipe["tokens_per_s_work"] / engine["tokens_per_s"],
        "ratio_end_to_end": pipe["tokens_per_s_end_to_end"] / engine["tokens_per_s"],
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"-> {args.out}")
    print(f"rows {table.num_rows}, max_tokens {args.max_tokens}, batch {args.batch_size}, spec {args.spec}")
    runs = ", ".join(f"{t:.1f}" for t in engine["runs_tokens_per_s"])
    print(f"engine alone          {engine['output_tokens']:6d} tokens  {engine['tokens_per_s']:7.1f} tok/s  (before/after: {runs})")
    print(f"pipeline (work)       {pipe['output_tokens']:6d} tokens  {pipe['tokens_per_s_work']:7.1f} tok/s  ratio {result['ratio_work']:.2f}x")
    print(f"pipeline (end to end) {pipe['output_tokens']:6d} tokens  {pipe['tokens_per_s_end_to_end']:7.1f} tok/s  ratio {result['ratio_end_to_end']:.2f}x")
    print(f"pipeline overhead     {pipe['overhead_s']:.1f} s of {pipe['wall_s']:.1f} s outside the shards' calibrate+generate")
    result["record"] = results.record("pipeline", "bench/pipeline.py", args, argv, {
        "ratio_work": round(result["ratio_work"], 3), "ratio_end_to_end": round(result["ratio_end_to_end"], 3),
        "overhead_s": round(pipe["overhead_s"], 1), "engine_tokens_per_s": round(engine["tokens_per_s"], 1)})
    return result


def bench_pipeline(work: Path, args) -> dict:
    import ray

    from batchspec.config.run import build_config
    from batchspec.pipeline import run

    config = build_config(
        str(work / "prompts.parquet"), str(work / "out"), model=args.model, spec=args.spec, workers=1,
        batch_size=args.batch_size, max_tokens=args.max_tokens, shard_size=args.shard_size, torch_threads=args.threads,
        prompt_format=args.prompt_format,
    )
    ours = not ray.is_initialized()  # a Ray already running (a test's) is left running
    started = time.perf_counter()
    summary = run(config)
    wall = time.perf_counter() - started
    if ours:
        ray.shutdown()
    assert summary.complete, summary
    import polars as pl

    in_shards = pl.read_parquet(f"{work}/out/stats/*.parquet")["wall_s"].sum()
    return {
        "output_tokens": summary.output_tokens,
        "wall_s": wall,
        "in_shards_s": in_shards,  # inside run_shard (calibrate + generate) on the worker
        "overhead_s": wall - in_shards,  # Ray start, key scan, actor start and model load, reads, writes
        "tokens_per_s_work": summary.tokens_per_s,
        "tokens_per_s_end_to_end": summary.output_tokens / wall,
        "error_rows": summary.error_rows,
    }


def bench_engine(work: Path, table, args) -> dict:
    import torch

    from batchspec.config.candidates import resolve_spec_arg
    from batchspec.engine.base import NO_SPEC
    from batchspec.engine.factory import create_engine
    from batchspec.parse import RowDefaults, parse_rows

    torch.set_num_threads(args.threads)
    choice = resolve_spec_arg(args.spec, None, "torch", None)
    spec = NO_SPEC if choice.calibrate or not choice.arms else choice.arms[0]
    rows = parse_rows(table, table.column("id").to_pylist(), RowDefaults(args.max_tokens, 0.0, 1.0, 0, args.prompt_format))
    engine = create_engine("torch", args.model, dtype="float32")
    started = time.perf_counter()
    result = engine.generate([r.request for r in rows if r.error is None], spec, args.batch_size)
    seconds = time.perf_counter() - started
    engine.close()
    return {"output_tokens": result.output_tokens, "seconds": seconds, "tokens_per_s": result.output_tokens / seconds}


if __name__ == "__main__":
    main()
