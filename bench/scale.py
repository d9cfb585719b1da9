"""Scale benchmark: plan + group time, driver peak memory and bytes read by workers vs row count.

For each row count it writes a synthetic input (several Parquet files, keys interleaved row by row,
prompts of about 1 KB with a unique tail so no two rows are equal), then runs batchspec's plan and
group steps (what `batchspec run --plan-only` does: Ray Data key scan, duplicate-id check, shard
assignment, the shuffle that writes OUTPUT/_shards/) in a fresh driver process, and reads every
shard back the way a worker does. Measured, per row count:

- plan_s / group_s: wall seconds of the two steps in the driver (Ray already started);
- driver_peak_mb: the driver process's peak RSS (VmHWM) over the whole plan + group, Ray start
  and imports included (also recorded before and after the plan step); Ray's worker processes and object store are not the driver;
- worker_read_bytes: bytes that `batchspec.group.read_shard_input` (a worker's only read) fetches
  from storage for every shard, counted where fsspec returns them, over the input's size on disk.

    python bench/scale.py --rows 100000 1000000 5000000 [--out FILE] [--record]

Nothing here is simulated: every figure is measured on this machine in this run. Per row count,
plan + group seconds, the driver's peak memory and the workers' bytes read over the input's are
the figures --record appends to bench/results.jsonl; --out FILE writes every detail as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
WORDS = ("the of and to in is for on with as by at from that this be are or an it not which can has have "
         "data model token batch shard prompt output input write code test value result method system time "
         "return function class object string number list table file read query user server error case").split()


def make_input(folder: Path, rows: int, files: int, keys: int, prompt_bytes: int, seed: int = 0) -> None:
    """`files` Parquet files of about `prompt_bytes`-byte prompts; the key cycles row by row."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    # A pool of distinct ~1 KB paragraphs; each row takes one and appends its own id, so rows differ.
    pool = []
    for _ in range(4096):
        words, size = [], 0
        while size < prompt_bytes - 24:
            w = WORDS[rng.integers(len(WORDS))]
            words.append(w)
            size += len(w) + 1
        pool.append(" ".join(words))
    pool_arr = pa.array(pool)
    per_file = -(-rows // files)
    for f in range(files):
        start, stop = f * per_file, min(rows, (f + 1) * per_file)
        if start >= stop:
            break
        idx = np.arange(start, stop)
        ids = pc.binary_join_element_wise("r", pa.array(np.char.zfill(idx.astype(str), 9)), "")
        prompts = pc.binary_join_element_wise(pool_arr.take(pa.array(rng.integers(0, len(pool), stop - start))), ids, " #")
        table = pa.table({
            "id": ids,
            "task": pa.array([f"task{k}" for k in range(keys)]).take(pa.array(idx % keys)),
            "prompt": prompts,
            "source": pa.array(idx % 1000, pa.int64()),
        })
        pq.write_table(table, folder / f"part-{f:03d}.parquet", row_group_size=65536)


def driver(input_dir: str, output_dir: str, shard_size: int, num_cpus: int, shuffle: str = "batchspec") -> dict:
    """One plan + group in this process (run as a fresh subprocess per row count)."""
    import ray

    from batchspec import group as group_module
    from batchspec import plan as plan_module
    from batchspec.group import PARTITION_BYTES, group_shards, group_sorts
    from batchspec.plan import make_plan, plan_locally, plan_sorts
    from batchspec.read import chunk_items, open_input
    from batchspec.write import Output

    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    if shuffle != "batchspec":
        plan_module.SORT_SHUFFLE_ROWS = group_module.SORT_SHUFFLE_BYTES = float("inf") if shuffle == "sort" else -1
    source = open_input(input_dir, {}, "task")
    group_bytes = sum(i["bytes"] for i in chunk_items(source, PARTITION_BYTES))  # what group_shards' shuffle moves
    output = Output(output_dir)
    t0 = time.perf_counter()
    before_mb = _peak_mb()
    plan = make_plan(source, "task", shard_size)
    t1 = time.perf_counter()
    plan_mb = _peak_mb()
    group_shards(source, plan, output)
    t2 = time.perf_counter()
    output.put(output.path("_plan.json"), plan.to_json().encode())
    peak_mb = _peak_mb()
    read_bytes = _read_all_shards(output, plan)
    ray.shutdown()
    return {"plan_s": t1 - t0, "group_s": t2 - t1, "group_shuffled_mb": round(group_bytes / 2**20),
            "plan_shuffle": "in-process" if plan_locally(source) else "sort" if plan_sorts(source.rows) else "default",
            "group_shuffle": "in-process" if plan_locally(source) else "sort" if group_sorts(group_bytes) else "default", "driver_peak_mb": peak_mb, "driver_peak_mb_before_plan": before_mb,
            "driver_peak_mb_after_plan": plan_mb, "shards": len(plan.shards),
            "plan_json_bytes": len(plan.to_json()), "worker_read_bytes": read_bytes}


def _peak_mb() -> float:
    """This process's peak RSS so far (VmHWM). Not ru_maxrss: Linux carries that over fork + exec,
    so a driver started by this script would report the generator's memory as its own."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def _read_all_shards(output, plan) -> int:
    """Every shard read back by `read_shard_input`, the worker's own read, in Ray tasks; returns the
    bytes it fetched from storage (counted where fsspec returns them; any other open would fail)."""
    import ray

    from batchspec.group import read_shard_input

    @ray.remote(num_cpus=1)
    def read_some(shards):
        fs_type = type(output.fs)
        fetched, inside = [], [False]
        plain_cat, plain_open = fs_type.cat_file, fs_type._open

        def counting_cat(self, path, *a, **k):
            inside[0] = True
            try:
                data = plain_cat(self, path, *a, **k)
            finally:
                inside[0] = False
            fetched.append(len(data))
            return data

        def only_inside_cat(self, path, *a, **k):
            assert inside[0], f"a worker opened {path} outside the one whole-file fetch"
            return plain_open(self, path, *a, **k)

        fs_type.cat_file, fs_type._open = counting_cat, only_inside_cat
        for s in shards:
            read_shard_input(output, s)
        return sum(fetched)

    step = max(1, len(plan.shards) // 16)
    parts = [plan.shards[i : i + step] for i in range(0, len(plan.shards), step)]
    return sum(ray.get([read_some.remote(p) for p in parts]))


def main(argv: Sequence[str] | None = None) -> dict:
    from common import results

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000, 5_000_000])
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--keys", type=int, default=4)
    ap.add_argument("--prompt-bytes", type=int, default=1000)
    ap.add_argument("--shard-size", type=int, default=1024)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--work", default="/tmp/batchspec-scale")
    ap.add_argument("--out", default=None, metavar="FILE", help="write every detail to FILE (JSON)")
    ap.add_argument("--shuffle", choices=("batchspec", "sort", "default"), default="batchspec",
                    help="batchspec: its choice by size (plan.shuffle_for); sort: the pull-based sort shuffle for every job; "
                    "default: Ray Data's default strategy for every job")
    ap.add_argument("--driver", nargs=2, help=argparse.SUPPRESS)
    results.add_options(ap)
    args = ap.parse_args(argv)
    if args.driver:
        print(json.dumps(driver(args.driver[0], args.driver[1], args.shard_size, args.num_cpus, args.shuffle)))
        return {}
    rows_measured = []
    for rows in args.rows:
        work = Path(args.work) / str(rows)
        shutil.rmtree(work, ignore_errors=True)
        t = time.perf_counter()
        make_input(work / "in", rows, args.files, args.keys, args.prompt_bytes)
        gen_s = time.perf_counter() - t
        input_bytes = sum(p.stat().st_size for p in (work / "in").glob("*.parquet"))
        cmd = [sys.executable, __file__, "--driver", str(work / "in"), str(work / "out"),
               "--shard-size", str(args.shard_size), "--num-cpus", str(args.num_cpus), "--shuffle", args.shuffle]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this tree's batchspec, in the driver and Ray's workers
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        if done.returncode:
            sys.exit(f"driver failed for {rows} rows:\n{done.stderr[-3000:]}")
        m = json.loads(done.stdout.strip().splitlines()[-1])
        row = {"rows": rows, "shuffle": args.shuffle, "files": args.files, "keys": args.keys, "prompt_bytes": args.prompt_bytes,
               "shard_size": args.shard_size, "input_bytes": input_bytes, "generate_input_s": round(gen_s, 1),
               **{k: round(v, 2) if isinstance(v, float) else v for k, v in m.items()},
               "plan_group_s": round(m["plan_s"] + m["group_s"], 1),
               "worker_read_over_input": round(m["worker_read_bytes"] / input_bytes, 3)}
        print(json.dumps(row), flush=True)
        rows_measured.append(row)
        shutil.rmtree(work, ignore_errors=True)
    metrics = {}
    for row in rows_measured:
        n = row["rows"]
        metrics.update({f"plan_group_s@{n}": row["plan_group_s"], f"driver_peak_mb@{n}": round(row["driver_peak_mb"]),
                        f"worker_read_over_input@{n}": row["worker_read_over_input"]})
    doc = {"bench": "scale", "results": rows_measured,
           "record": results.record("scale", "bench/scale.py", args, argv, metrics)}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    main()
