"""A shard whose workload changes half-way (issue 12): free prose first, then copy-heavy edits.

The shard runs as the pipeline runs it (`shard.run_shard`: calibration on an evenly spaced sample,
then generation in chunks with the drift watch both ways: switch on under "none" when a chunk's
counterfactual says an arm pays, fall back when the running arm's counterfactual on its own chunk
says it lost), against plain decoding of the same rows, side by side in one run, the order
alternating per repetition. Each repetition of the calibrated shard starts a fresh worker (it pays
its cost profile, as a worker's first shard does). Target: >= 1.15x plain over the shard at batch
1, wall time end to end (calibration, prefill and the checks included). Writes OUT/switch.json and
OUT/switch.md.

    python bench/switch.py [--rows 24] [--max-tokens 32] [--batch-size 1] [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workloads  # noqa: E402
from calibrate import candidate_arms  # noqa: E402
from engine import RESULTS, choose_threads, command, fmt, load_engine, machine, machine_line, write  # noqa: E402

from batchspec.calibrate import CalibrationSettings, WorkerCalibration  # noqa: E402
from batchspec.engine.base import NO_SPEC, Request  # noqa: E402
from batchspec.shard import ShardInput, run_shard  # noqa: E402

TARGET = 1.15


def shard_rows(rows: int, max_tokens: int) -> list[Request]:
    """`rows` free-prose requests, then `rows` copy-heavy edits (ids keep the order)."""
    prose = workloads.requests("prose", rows, max_tokens)
    edit = workloads.requests("edit", rows, max_tokens)
    return prose + edit


def run_plain(engine, requests: Sequence[Request], batch_size: int) -> dict:
    started = time.perf_counter()
    result = engine.generate(list(requests), NO_SPEC, batch_size)
    return {"wall_s": time.perf_counter() - started, "output_tokens": result.output_tokens,
            "token_ids": [c.token_ids for c in result.completions]}


def run_calibrated(engine, requests: Sequence[Request], arms, batch_size: int, settings: CalibrationSettings) -> dict:
    started = time.perf_counter()
    shard = run_shard(engine, ShardInput("switch", "switch", list(requests)), arms, True, batch_size, settings,
                      worker=WorkerCalibration())
    wall = time.perf_counter() - started
    st = shard.stats
    labels = [s.label for s in shard.row_specs]
    half = len(requests) // 2
    return {"wall_s": wall, "output_tokens": st.output_tokens, "decision": st.spec_method if not st.draft_len else f"{st.spec_method}:k={st.draft_len}",
            "reason": st.decision_reason, "calibration_s": st.calibration_s, "profile_s": st.profile_s,
            "switch_row": st.drift_switch_row, "switch_arm": st.drift_switch_arm,
            "switch_predicted": st.drift_switch_predicted, "fallback_row": st.drift_fallback_row,
            "prose_rows_speculated": sum(label != "none" for label in labels[:half]),
            "edit_rows_speculated": sum(label != "none" for label in labels[half:]),
            "row_settings": labels, "token_ids": [c.token_ids for c in shard.completions]}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, default=24, help="rows of each half")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)

    threads = choose_threads(args.threads)
    info = machine(threads, args.dtype)
    print(f"machine: {info}", flush=True)
    engine = load_engine(args.model, args.dtype)
    arms = candidate_arms(None)
    requests = shard_rows(args.rows, args.max_tokens)
    settings = CalibrationSettings(min_rows=min(16, 2 * args.rows))  # the pipeline's default, or calibrate a small test shard
    runs = []
    for rep in range(args.repeats):
        pair = {}
        for name in (("plain", "calibrated") if rep % 2 == 0 else ("calibrated", "plain")):
            pair[name] = run_plain(engine, requests, args.batch_size) if name == "plain" else \
                run_calibrated(engine, requests, arms, args.batch_size, settings)
        cal, plain = pair["calibrated"], pair["plain"]
        same = sum(a == b for a, b in zip(cal.pop("token_ids"), plain.pop("token_ids")))
        runs.append({"repeat": rep, "plain": plain, "calibrated": cal, "speedup": plain["wall_s"] / cal["wall_s"],
                     "identical_rows": same})
        print(f"repeat {rep}: plain {plain['wall_s']:.1f} s, calibrated {cal['wall_s']:.1f} s -> {runs[-1]['speedup']:.2f}x; "
              f"decision {cal['decision']}, switch row {cal['switch_row']} ({cal['switch_arm']}), fallback row {cal['fallback_row']}, "
              f"speculated prose {cal['prose_rows_speculated']}/{args.rows}, edit {cal['edit_rows_speculated']}/{args.rows}", flush=True)
    total = sum(r["plain"]["wall_s"] for r in runs) / sum(r["calibrated"]["wall_s"] for r in runs)
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    lines = ["| repeat | plain s | calibrated s | speedup (target >= 1.15x) | decision | switched on at row (arm) | fell back at row "
             "| prose rows speculated | edit rows speculated | calibration s (profile s) | rows identical to plain |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        c = r["calibrated"]
        lines.append(f"| {r['repeat']} | {r['plain']['wall_s']:.1f} | {c['wall_s']:.1f} | {r['speedup']:.2f}x | {c['decision']} "
                     f"| {fmt(c['switch_row'], 'd')} ({c['switch_arm'] or '-'}) | {fmt(c['fallback_row'], 'd')} "
                     f"| {c['prose_rows_speculated']}/{args.rows} | {c['edit_rows_speculated']}/{args.rows} "
                     f"| {c['calibration_s']:.1f} ({c['profile_s']:.1f}) | {r['identical_rows']}/{2 * args.rows} |")
    lines.append(f"| all | {sum(r['plain']['wall_s'] for r in runs):.1f} | {sum(r['calibrated']['wall_s'] for r in runs):.1f} "
                 f"| {total:.2f}x | | | | | | | |")
    table = "\n".join(lines)
    md = (f"# A shard that changes workload half-way\n\n`{command('bench/switch.py', argv)}`, {info['date_utc']}: {args.model}, "
          f"{args.dtype}, batch {args.batch_size}, {args.rows} free-prose rows then {args.rows} copy-heavy edits, max_tokens "
          f"{args.max_tokens}, arms none + {', '.join(a.label for a in arms)}; {machine_line(info)}. Wall seconds of the whole shard (calibration "
          f"included) against plain decoding of the same rows, alternating order.\n\n{table}")
    data = {"benchmark": "switch", "model": args.model, "rows_per_half": args.rows, "max_tokens": args.max_tokens,
            "batch_size": args.batch_size, "arms": [a.label for a in arms], "machine": info, "runs": runs,
            "speedup": total, "met": total >= TARGET}
    write(Path(args.out), "switch", data, md, table)
    return data


if __name__ == "__main__":
    main()
