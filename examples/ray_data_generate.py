"""batchspec as a Ray Data stage: completions for a `ray.data.Dataset` you already hold.

    python examples/ray_data_generate.py                      # 2 example prompts of each task, packaged SmolLM2
    python examples/ray_data_generate.py --per-task 8 --max-tokens 32 --out /tmp/completions

The stage calibrates speculative decoding per shard (a batch of at most --shard-size rows of one
`task` value), exactly as `batchspec run` does, and adds the per-row output columns (`text`,
`finish_reason`, `spec_method`, `accepted_tokens`, ...) to the input's other columns. A prompt
goes to the model through its chat template as one user message (`--prompt-format raw`: as is).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow.parquet as pq
import ray
from ray.data.expressions import col

from batchspec.config.run import build_config
from batchspec.ray_data import generate

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", default=str(HERE / "prompts.parquet"))
    ap.add_argument("--per-task", type=int, default=2, help="the first rows of each task value")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--shard-size", type=int, default=8)
    ap.add_argument("--prompt-format", default="chat", help="chat (a prompt through the model's chat template) or raw")
    ap.add_argument("--out", help="write the result here (Parquet) instead of printing it")
    args = ap.parse_args()

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    keep, taken = set(), {}  # the ids of each task's first --per-task rows
    for row in pq.read_table(args.input, columns=["id", "task"]).to_pylist():
        if taken.setdefault(row["task"], 0) < args.per_task:
            keep.add(row["id"])
            taken[row["task"]] += 1
    ds = ray.data.read_parquet(args.input).filter(expr=col("id").is_in(sorted(keep)))
    # The same RunConfig as `batchspec run` (INPUT and OUTPUT are not used by the stage). One worker
    # actor with one CPU leaves the other CPU to Ray Data's read tasks.
    config = build_config("", "", model=args.model, shard_by="task", shard_size=args.shard_size,
                          max_tokens=args.max_tokens, batch_size=4, workers=1, num_cpus=1, prompt_format=args.prompt_format)
    out = generate(ds, config)
    if args.out:
        out.write_parquet(args.out)
        print(f"wrote {args.out}")
    else:
        for row in out.take_all():
            shown = row["error"] if row["finish_reason"] == "error" else row["text"]
            print(f"{row['id']:>10}  {row['task']:<8} {row['spec_method']:<12} {row['finish_reason']:<6} {shown[:60]!r}")
    ray.shutdown()


if __name__ == "__main__":
    main()
