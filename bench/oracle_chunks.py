"""How the oracle's chunking moves a measured speedup (bench/calibrate.py's `interleaved`).

The calibration bench measures every arm on the whole shard in chunks of rows, each chunk one
generate call per arm, the arms' order rotating: on a shared machine the arms then meet the same
moments. But each call drains its batch at its end, where the pipeline runs a shard as one call
that keeps its batch full while its queue lasts, so a chunked measurement is not the pipeline's
schedule. This runs the same arms on the same rows at several chunk sizes, each size `--repeats`
times in turn, and reports each arm's goodput over plain decoding's at each: how far the chunks
move the figure a prediction is held to. Writes OUT/oracle_chunks.json and .md.

    python bench/oracle_chunks.py --input PARQUET --key-value continue [--rows 128] [--chunks 16,64,128]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workloads  # noqa: E402
from engine import RESULTS, choose_threads, command, interleaved, load_engine, machine, machine_line, ngram_arm, write  # noqa: E402

from batchspec.engine.base import NO_SPEC  # noqa: E402


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, metavar="PARQUET", help="a prompt Parquet, read as the calibration bench reads it")
    parser.add_argument("--key", default="task", help="the column to take one value's rows of (default task)")
    parser.add_argument("--key-value", required=True, help="the value whose first --rows rows are the shard")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--k", default="2,8", help="n-gram draft lengths to measure (default 2,8)")
    parser.add_argument("--chunks", default="16,64,128", help="rows per call to measure at (default 16,64,128)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    try:
        chunks = [int(c) for c in args.chunks.split(",")]
        ks = [int(k) for k in args.k.split(",")]
    except ValueError:
        parser.error("--chunks and --k take comma-separated whole numbers")
    if min(chunks) < 1 or min(ks) < 1 or args.repeats < 1:
        parser.error("--chunks, --k and --repeats take 1 or more")
    info = machine(choose_threads(args.threads), args.dtype)
    print(f"machine: {info}", flush=True)
    groups, _ = workloads.from_input(args.input, args.key, args.max_tokens)
    rows = groups.get(args.key_value, [])[: args.rows]
    if len(rows) < args.rows:
        parser.error(f"{args.input}: {len(rows)} rows with {args.key} = {args.key_value!r}, --rows asks {args.rows}")
    engine = load_engine(args.model, args.dtype)
    arms = [("none", NO_SPEC, args.batch_size)] + [(f"ngram:k={k}", ngram_arm(k), args.batch_size) for k in ks]
    runs = []
    for repeat in range(args.repeats):
        for chunk in chunks:
            measured = interleaved(engine, rows, arms, chunk=chunk)
            goodput = {label: m.summary()["goodput"] for label, m in measured.items()}
            runs.append({"repeat": repeat, "chunk": chunk, "plain_tok_s": goodput["none"],
                         "speedup": {label: g / goodput["none"] for label, g in goodput.items() if label != "none"}})
            print(f"repeat {repeat}, {chunk} rows a call: " + ", ".join(f"{label} {s:.3f}x" for label, s in runs[-1]["speedup"].items()),
                  flush=True)
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    labels = [label for label, *_ in arms[1:]]
    lines = ["| rows a call | " + " | ".join(f"{label} over plain (each repeat)" for label in labels) + " | plain tok/s |",
             "|---|" + "---|" * (len(labels) + 1)]
    for chunk in chunks:
        mine = [r for r in runs if r["chunk"] == chunk]
        cells = [", ".join(f"{r['speedup'][label]:.3f}" for r in mine) for label in labels]
        lines.append(f"| {chunk} | " + " | ".join(cells) + f" | {statistics.mean(r['plain_tok_s'] for r in mine):.0f} |")
    table = "\n".join(lines)
    data = {"benchmark": "oracle_chunks", "input": args.input, "key": args.key, "key_value": args.key_value, "model": args.model,
            "rows": args.rows, "max_tokens": args.max_tokens, "batch_size": args.batch_size, "machine": info, "runs": runs}
    md = (f"# The oracle's chunks\n\n`{command('bench/oracle_chunks.py', argv)}`, {info['date_utc']}: {args.model}, "
          f"{args.dtype}, batch {args.batch_size}, the first {args.rows} rows of {args.key} = {args.key_value}, max_tokens "
          f"{args.max_tokens}; {machine_line(info)}. Each arm's goodput over plain decoding's, the arms interleaved "
          f"call by call, at each number of rows a call.\n\n{table}")
    write(Path(args.out), "oracle_chunks", data, md, table)
    return data


if __name__ == "__main__":
    main()
