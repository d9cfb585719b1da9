"""A worker's first shard: calibration's overhead as the shard's outputs lengthen (issue 12).

The worker's cost profile is a fixed cost: the forwards it times do not depend on how long the
shard's outputs run. Its share of the shard that pays it does. For each --max-tokens, side by side
on the same prompts (each key's first --rows rows of --input), each key's shard runs as the
pipeline runs it on the torch engine (`run_shard`, calibration in flight) on a fresh worker (a
new `WorkerCalibration`, the engine's probe seed dropped: it times its whole profile, as a
worker's first shard does), and the table gives the shard's wall time, its calibration time, the
part not kept (overhead), the profile's seconds, and their shares of the wall (target: overhead
<= 2% on 128-row shards). No oracle runs here: whether the decisions were right is
bench/calibrate.py's question, at one length.

    python bench/first_shard.py --input /tmp/held7.parquet --workloads continue,extract \
        --rows 128 --max-tokens 24,64,128 --batch-size 8 --dtype float32 --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workloads  # noqa: E402
from calibrate import candidate_arms  # noqa: E402
from engine import RESULTS, choose_threads, command, load_engine, machine, machine_line, write  # noqa: E402

from batchspec.calibrate import CalibrationSettings, WorkerCalibration  # noqa: E402
from batchspec.errors import BatchspecError  # noqa: E402
from batchspec.shard import ShardInput, run_shard  # noqa: E402


def first_shard(engine, key: str, requests, arms, batch_size: int) -> dict:
    """One key's shard on a fresh worker, as the pipeline runs it; its calibration's times."""
    getattr(engine, "probe_seeds", {}).clear()  # a fresh worker's engine has not prefilled the probe's seed row
    worker = WorkerCalibration()
    ran = run_shard(engine, ShardInput(key, key, list(requests)), arms, True, batch_size,
                    CalibrationSettings(min_rows=min(16, len(requests))), worker=worker)
    st, d = ran.stats, ran.decision
    wall = st.wall_s or 0.0
    return {"shard": key, "rows": len(requests), "max_tokens": requests[0].params.max_tokens,
            "output_tokens": st.output_tokens, "wall_s": wall, "prefill_s": st.prefill_s, "decode_s": st.decode_s,
            "calibration_s": d.calibration_s, "calibration_overhead_s": d.overhead_s, "profile_s": d.profile_s,
            "profile_points": len(worker.profile.points), "chosen": d.chosen.label, "confirmed": d.confirmed,
            "rows_by_setting": {label: sum(r.label == label for r in ran.row_specs)
                                for label in sorted({r.label for r in ran.row_specs})},
            "overhead_share": d.overhead_s / wall if wall else None,
            "overhead_share_without_profile": (d.overhead_s - d.profile_s) / wall if wall else None,
            "profile_share": d.profile_s / wall if wall else None,
            "calibration_time_share": d.calibration_s / wall if wall else None, "reason": d.reason}


def table(rows: Sequence[dict]) -> str:
    pct = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
    lines = ["| shard | max_tokens | output tokens | wall s | profile s (points) | calibration s | overhead s "
             "| overhead share (<= 2%) | without the profile | all calibration time | chosen (confirmed) | rows per setting |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        settings = ", ".join(f"{k} {v}" for k, v in r["rows_by_setting"].items())
        lines.append(f"| {r['shard']} | {r['max_tokens']} | {r['output_tokens']} | {r['wall_s']:.1f} | "
                     f"{r['profile_s']:.2f} ({r['profile_points']}) | {r['calibration_s']:.2f} | "
                     f"{r['calibration_overhead_s']:.2f} | {pct(r['overhead_share'])} | "
                     f"{pct(r['overhead_share_without_profile'])} | {pct(r['calibration_time_share'])} | "
                     f"{r['chosen']} ({'yes' if r['confirmed'] else 'no'}) | {settings} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--input", required=True, help="a prompt Parquet with a --key column, e.g. the held-out set")
    parser.add_argument("--key", default="task")
    parser.add_argument("--workloads", default=None, help="values of --key to run (default: every one, in file order)")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--max-tokens", default="24,64,128", help="comma-separated output lengths, run side by side")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="float32")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    try:
        lengths = [int(x) for x in args.max_tokens.split(",")]
    except ValueError:
        parser.error(f"--max-tokens takes comma-separated integers, got {args.max_tokens!r}")
    if not lengths or min(lengths) < 1:
        parser.error("--max-tokens takes integers >= 1")
    threads = choose_threads(args.threads)
    info = machine(threads, args.dtype, args.device)
    print(f"machine: {info}", flush=True)
    by_length = {}
    for n in lengths:
        try:
            groups, bad = workloads.from_input(args.input, args.key, n)
        except (OSError, ValueError, BatchspecError) as exc:
            parser.error(str(exc).splitlines()[0])
        by_length[n] = groups
    keys = args.workloads.split(",") if args.workloads else list(by_length[lengths[0]])
    short = [k for k in keys if len(by_length[lengths[0]].get(k, [])) < args.rows]
    if short:
        parser.error(f"{args.input}: fewer than {args.rows} rows of {args.key} = {', '.join(short)}")
    engine = load_engine(args.model, args.dtype, None, args.device)
    arms = candidate_arms(None)
    rows = []
    for key in keys:
        for n in lengths:
            rows.append(first_shard(engine, key, by_length[n][key][: args.rows], arms, args.batch_size))
            print(table(rows[-1:]), flush=True)
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"benchmark": "first_shard", "input": args.input, "key": args.key, "rows_per_shard": args.rows,
            "max_tokens": lengths, "batch_size": args.batch_size, "model": args.model,
            "arms": [a.label for a in arms], "machine": info, "shards": rows}
    md = (f"# A worker's first shard: calibration overhead by output length\n\n`{command('bench/first_shard.py', argv)}`, "
          f"{info['date_utc']}: {args.model}, {args.dtype}, batch {args.batch_size}, {args.rows} prompts per shard "
          f"(each key's first rows of `{args.input}`), arms none + {', '.join(a.label for a in arms)}; "
          f"{machine_line(info)}. Each shard on a fresh worker: it times the whole cost profile.\n\n{table(rows)}")
    write(Path(args.out), "first_shard", data, md, table(rows))
    return data


if __name__ == "__main__":
    main()
