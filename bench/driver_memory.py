"""Driver memory against prompt size: `batchspec run --plan-only`'s peak RSS on long and short prompts.

Three inputs of the same row count, written with zstd: prompts of `--long` characters (a short unique
head, then text that repeats, so the file on disk is small however large the prompts are: the case
that once took the driver past 1 GB), the same number of identical long prompts (which Parquet's
dictionary makes small even uncompressed, so the in-process path takes them), and prompts of
`--short` characters. Each is planned and grouped
by `batchspec run INPUT OUTPUT --plan-only` in a fresh process (Ray started there, as a command
does), and that process's own peak RSS (VmHWM, at exit) is the figure: Ray's workers and object
store are other processes. The target: the long prompts' peak within 1.5x the short ones'.

    python bench/driver_memory.py [--rows 2000] [--long 200000] [--out FILE]

Measured on this machine in this run; nothing is simulated.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
# Runs the CLI in this process and prints its peak RSS (kB) on the last line of stdout, whatever the exit.
DRIVER = """
import atexit, sys
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            print("VmHWM_kB", line.split()[1], flush=True)
atexit.register(peak)
from batchspec.cli import cli
cli(sys.argv[1:])
"""


def write_input(path: Path, rows: int, chars: int, same: bool = False) -> int:
    """`rows` prompts of `chars` characters, each unique by its head (or, `same`, all one text: the
    Parquet writer's dictionary then makes them small even uncompressed); returns the file's bytes."""
    filler = ("the quick brown fox jumps over the lazy dog; " * (chars // 45 + 1))
    prompts = [filler[:chars] if same else f"row {i}: " + filler[: max(0, chars - 12)] for i in range(rows)]
    table = pa.table({"id": [f"r{i:06d}" for i in range(rows)], "task": ["a", "b"] * (rows // 2) + ["a"] * (rows % 2),
                      "prompt": prompts})
    pq.write_table(table, path, compression="zstd")
    return path.stat().st_size


def plan_only_peak_mb(input: Path, output: Path) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", DRIVER, "run", str(input), str(output), "--shard-by", "task", "--plan-only"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    peak = [line for line in done.stdout.splitlines() if line.startswith("VmHWM_kB")]
    if done.returncode != 0 or not peak:
        raise SystemExit(f"plan-only failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(peak[-1].split()[1]) / 1024


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--long", type=int, default=200_000, help="characters per long prompt")
    parser.add_argument("--short", type=int, default=50, help="characters per short prompt")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    result = {"rows": args.rows}
    with tempfile.TemporaryDirectory(prefix="bs-drvmem-") as tmp:
        for name, chars, same in (("short", args.short, False), ("long", args.long, False), ("long_same", args.long, True)):
            path = Path(tmp) / f"{name}.parquet"
            size = write_input(path, args.rows, chars, same)
            peak = plan_only_peak_mb(path, Path(tmp) / f"out-{name}")
            result[name] = {"chars": chars, "input_mb": round(args.rows * chars / 2**20, 1), "file_kb": round(size / 1024, 1),
                            "driver_peak_mb": round(peak, 1)}
            print(f"{name}: {args.rows} {'identical ' if same else ''}prompts of {chars} chars ({result[name]['input_mb']} MB as text, "
                  f"{result[name]['file_kb']} KB on disk): driver peak {peak:.0f} MB", flush=True)
    for name in ("long", "long_same"):
        result[f"ratio_{name}"] = round(result[name]["driver_peak_mb"] / result["short"]["driver_peak_mb"], 2)
        print(f"{name} / short driver peak: {result[f'ratio_{name}']}x (target: at most 1.5x)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
