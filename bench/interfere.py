"""Run a command beside bursts of CPU work: a shared machine's interference, made on purpose.

A worker on a shared machine has its steps slowed now and then by other processes. Calibration's
short measurements (a sample of about 24 steps, a confirmation window of about 20, a tenth of a
second each on a fast model) are what such a burst can fool; a quiet hour shows none of it. This
runs `command` while one process (`--procs`) spins for `--burst-ms` at random moments, on the
mean every `--every-ms` (exponential gaps, seeded, so bursts fall on no fixed phase of the
command's loop), and stops it when the command ends. It prints how many bursts ran and their
share of the wall time, and exits with the command's status.

    python bench/interfere.py --burst-ms 150 --every-ms 700 -- \\
        python bench/calibrate.py --input /tmp/held7_2560.parquet --rows 128 ... --out /tmp/noisy
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import subprocess
import sys
import time


def burner(burst_s: float, every_s: float, seed: int, stop, count) -> None:
    """Spin for `burst_s` at exponential gaps of mean `every_s` until `stop` is set; count bursts."""
    rng = random.Random(seed)
    while not stop.wait(rng.expovariate(1.0 / every_s)):
        end = time.perf_counter() + burst_s
        while time.perf_counter() < end:
            pass
        with count.get_lock():
            count.value += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst-ms", type=float, default=150.0, help="how long each burst spins (ms)")
    parser.add_argument("--every-ms", type=float, default=700.0, help="mean time between bursts (ms)")
    parser.add_argument("--procs", type=int, default=1, help="burning processes (each its own bursts)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    if args.burst_ms <= 0 or args.every_ms <= 0 or args.procs < 1:
        parser.error("--burst-ms and --every-ms must be positive, --procs at least 1")
    ctx = mp.get_context("spawn")
    stop, count = ctx.Event(), ctx.Value("i", 0)
    procs = [ctx.Process(target=burner, args=(args.burst_ms / 1e3, args.every_ms / 1e3, args.seed + i, stop, count),
                         daemon=True) for i in range(args.procs)]
    for p in procs:
        p.start()
    began = time.perf_counter()
    try:
        rc = subprocess.call(command)
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=5 + args.burst_ms / 1e3)
            if p.is_alive():
                p.terminate()
    wall = time.perf_counter() - began
    share = count.value * args.burst_ms / 1e3 / wall if wall > 0 else 0.0
    print(f"interfere: {count.value} bursts of {args.burst_ms:.0f} ms (mean gap {args.every_ms:.0f} ms, "
          f"{args.procs} process(es), seed {args.seed}) over {wall:.1f} s: {share:.1%} of the wall per process",
          file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
