"""Calibration in the shard's own batch against a sample decoded apart, side by side (issue 12:
all calibration time <= 10% of `make run`, overhead <= 5%).

`make run`'s shards (examples/prompts.parquet, one per task, 64 rows, batch 8) go through
`run_shard` on one engine twice each, once with `calibration: in_flight` on (the sample decodes
in the shard's batch; batchspec.calibrate.inflight) and once off (the sample a generate call of
its own, then the confirmation, then the chunks), the order alternating by shard so a change of
load hits both alike; with `--rounds 2` (the default) every shard runs both ways twice, the
second time in the other order. Each way keeps its own worker (its own cost profile), as two runs would.
Reported per shard and in all: wall seconds, calibration seconds and share, overhead, profile
seconds, decode and prefill seconds, the decision, and whether both ways gave the same tokens
(greedy: they must). Ratios are in-flight over apart.

With `--source workloads` the shards are bench/workloads.py's generated chat prompts of the same
four tasks instead (any `--rows`: the examples hold 64 per task), for the 128-row target
(calibration overhead <= 2% of shard wall).

    python bench/inflight.py [--batch-size 8] [--rows 64] [--max-tokens 24] [--tasks code,edit,extract,prose]
        [--source examples|workloads] [--rounds 2] [--threads 2] [--dtype float32] [--name inflight]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workloads  # noqa: E402
from engine import command, machine_line, result_options, start, write  # noqa: E402

from batchspec.calibrate import CalibrationSettings, WorkerCalibration  # noqa: E402
from batchspec.config.candidates import load_candidates  # noqa: E402
from batchspec.shard import ShardInput, run_shard  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("code", "edit", "extract", "prose")  # make run's shard keys, in plan order
FIELDS = ("wall_s", "calibration_s", "calibration_overhead_s", "profile_s", "decode_s", "prefill_s")


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", default=str(ROOT / "examples" / "prompts.parquet"))
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=24)  # pipelines/local.yaml's
    parser.add_argument("--tasks", default=",".join(TASKS), help="the shard keys to run, comma-separated")
    parser.add_argument("--source", choices=("examples", "workloads"), default="examples",
                        help="examples/prompts.parquet's rows of each task, or bench/workloads.py's generated prompts")
    parser.add_argument("--rounds", type=int, default=2, help="each shard both ways this many times, the order flipped each time")
    result_options(parser, "inflight")
    args = parser.parse_args(argv)
    info, engine = start(args, args.model)
    arms = [a for a in load_candidates(str(ROOT / "pipelines" / "candidates" / "torch_ngram.yaml")) if a.method != "none"]
    workers = {True: WorkerCalibration(), False: WorkerCalibration()}
    shards = []
    tasks = args.tasks.split(",")
    for n, task in enumerate(t for _ in range(args.rounds) for t in tasks):
        rows = (workloads.from_parquet(args.input, task, args.rows, args.max_tokens) if args.source == "examples"
                else workloads.requests(task, args.rows, args.max_tokens))
        if len(rows) < args.rows:
            parser.error(f"--rows {args.rows}: {args.input} has {len(rows)} rows of task {task!r} (--source workloads has any number)")
        ran = {}
        for way in ((True, False) if (n + n // len(tasks)) % 2 == 0 else (False, True)):
            shard = run_shard(engine, ShardInput(task, task, rows), arms, True, args.batch_size,
                              CalibrationSettings(in_flight=way), worker=workers[way])
            ran[way] = shard
            st = shard.stats
            print(f"{task:8s} in_flight={way!s:5s} wall {st.wall_s:6.1f}s calibration {st.calibration_s:5.2f}s "
                  f"overhead {st.calibration_overhead_s:5.2f}s -> {st.spec_method}:{st.draft_len}", flush=True)
        same = [c.token_ids for c in ran[True].completions] == [c.token_ids for c in ran[False].completions]
        shards.append({"task": task, "rows": len(rows), "same_tokens": same,
                       **{("in_flight" if way else "apart"): _figures(ran[way].stats) for way in (True, False)}})
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    total = {way: {f: sum(s[way][f] for s in shards) for f in FIELDS} for way in ("in_flight", "apart")}
    result = {"machine": info, "model": args.model, "batch_size": args.batch_size, "rows": args.rows, "rounds": args.rounds,
              "source": args.source, "max_tokens": args.max_tokens,
              "arms": [a.label for a in arms], "shards": shards, "total": total,
              "wall_ratio": total["in_flight"]["wall_s"] / total["apart"]["wall_s"]}
    table = _table(shards, total)
    markdown = (f"# Calibration in the shard's batch vs a sample apart\n\n`{command('bench/inflight.py', argv)}`\n\n"
                f"{machine_line(info)}\n\n{table}\n")
    write(Path(args.out), args.name, result, markdown, table)
    return result


def _figures(st) -> dict:
    out = {f: getattr(st, f) or 0.0 for f in FIELDS}
    out.update(decision=f"{st.spec_method}:{st.draft_len}" if st.spec_method != "none" else "none",
               confirmed=bool(st.calibration_confirmed), reason=st.decision_reason)
    return out


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _table(shards: Sequence[dict], total: dict) -> str:
    lines = ["| shard | way | wall s | calibration s (share) | overhead s (share) | profile s | decode s | prefill s | decision | same tokens |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in [*shards, {"task": "all", **total, "same_tokens": all(x["same_tokens"] for x in shards)}]:
        for way in ("in_flight", "apart"):
            f = s[way]
            lines.append(f"| {s['task']} | {way} | {f['wall_s']:.1f} | {f['calibration_s']:.2f} ({_share(f['calibration_s'], f['wall_s'])}) "
                         f"| {f['calibration_overhead_s']:.2f} ({_share(f['calibration_overhead_s'], f['wall_s'])}) "
                         f"| {f['profile_s']:.2f} | {f['decode_s']:.1f} | {f['prefill_s']:.1f} | {f.get('decision', '')} "
                         f"| {'yes' if s['same_tokens'] else 'NO'} |")
    ratio = total["in_flight"]["wall_s"] / total["apart"]["wall_s"]
    lines.append(f"\nwall, in flight over apart: {ratio:.3f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
