"""The tables of figures a reader weighs first, written from bench/results.jsonl by `make
bench-report` (bench/common/report.py): the README's "Where it stands" (STANDS: each row a
claim, the records it rests on and how their metrics read) and docs/calibration.md's simulated
grid. A row names the machine of its records (their commits are docs/performance.md's) and the
commands that give them again; a claim whose record is missing stops the report with one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from common.results import identifying, latest

@dataclass(frozen=True)
class Stand:
    """One row of the README's table: what is claimed, the records it rests on (each a bench and
    the identifying args it must have), and how their metrics read as the figure."""

    what: str
    sources: tuple[tuple[str, dict], ...]
    figure: Callable[[list[dict]], str]  # the sources' lines, in order -> the figure's text


def _x(v: float) -> str:
    return f"{v:.2f}x"


def _sim(regimes: Sequence[str]) -> tuple[tuple[str, dict], ...]:
    return tuple(("sim", {"regime": r, "batch_size": b, "input": "grid.parquet"}) for r in regimes for b in (1, 8, 32))


SIM_REGIMES = ("cpu", "h200-torch", "gpu-roofline", "trtllm")


def _grid(lines: list[dict]) -> str:
    by = {(x["args"]["regime"], x["args"]["batch_size"]): x["metrics"] for x in lines}
    parts = []
    for regime in SIM_REGIMES:
        cells = [by[(regime, b)] for b in (1, 8, 32)]
        parts.append(f"`{regime}` worst shard {min(c['min_vs_oracle'] for c in cells):.3f}, means "
                     f"{min(c['mean_vs_oracle'] for c in cells):.3f}-{max(c['mean_vs_oracle'] for c in cells):.3f}")
    overhead = max(m["max_overhead"] for m in by.values())
    return "; ".join(parts) + f"; calibration's overhead at most {overhead:.1%} of a shard"


def _predictions(lines: list[dict]) -> str:
    within = sum(x["metrics"]["predictions_within_5pct"] for x in lines)
    judged = sum(x["metrics"]["predictions_judged"] for x in lines)
    return f"{within} of {judged} shards within ±5%"


def _eagle3(m: dict, w: str) -> str:
    runs = ", ".join(f"b{b} {_x(m[f'{w} b{b} head/plain'])} vs {_x(m[f'{w} b{b} best other/plain'])} "
                     f"({m[f'{w} b{b} best other'].split()[0]})" for b in (1, 8) if f"{w} b{b} head/plain" in m)
    return f"{w}: {runs}, head accepts {m[f'{w} head acc len k=2']:.2f} a step after {m[f'{w} head train s']:.0f} s of training"


def _calibrate(lines: list[dict]) -> str:
    return "; ".join(f"batch {x['args']['batch_size']}: {x['metrics']['min_vs_oracle']:.2f}x the oracle, "
                     f"{x['metrics']['min_vs_plain']:.2f}x plain (worst shard)" for x in lines)


STANDS = (
    Stand("Plain batch 8 over batch 1; n-gram k=6 (1.5B, edits) and draft k=4 (1.5B ← 0.5B, code) over plain at batch 1, bfloat16",
          (("engine", {"suffix": False, "structured": False}),),
          lambda ls: "; ".join(_x(ls[0]["metrics"][k]) for k in ("plain_b8_vs_b1", "ngram_vs_plain_b1", "draft_vs_plain_b1"))),
    Stand("Suffix drafting against n-gram at the same draft length (k=8; templated: the suffix arm's cap 16 against n-gram k=8), "
          "batch 1, 128 held-out rows a kind: schema, boilerplate, templated",
          (("engine", {"suffix": True, "suffix_k": 8}), ("engine", {"suffix": True, "suffix_k": 16})),
          lambda ls: "tokens a step " + ", ".join(_x(m[f"suffix_vs_ngram_tokens_per_step@{w}"]) for m, w in (
              (ls[0]["metrics"], "schema"), (ls[0]["metrics"], "boilerplate"), (ls[1]["metrics"], "templated")))
          + "; goodput " + ", ".join(_x(m[f"suffix_vs_ngram_goodput@{w}"]) for m, w in (
              (ls[0]["metrics"], "schema"), (ls[0]["metrics"], "boilerplate"), (ls[1]["metrics"], "templated")))),
    Stand("Calibration against the oracle (the best single arm over the whole shard), **simulated**: 4 workloads and a "
          "workload change, 256-row shards, batch 1, 8, 32", _sim(SIM_REGIMES), _grid),
    Stand("Predicted speedup against the arm's simulated speedup, greedy, where one speculative arm ran at least 95% of a "
          "shard's rows, **simulated**",
          _sim(SIM_REGIMES), _predictions),
    Stand("Calibration against the oracle and plain decoding, real clock, held-out prompts (40, 64 and 128-row shards)",
          tuple(("calibrate", {"batch_size": b}) for b in (1, 4, 8)), _calibrate),
    Stand("Against transformers `generate()` on its own linear layers, 300-600-token chat prompts, wall with prefill: "
          "plain batch 8, n-gram batch 1, draft batch 1",
          (("peer", {"layers": "own"}),),
          lambda ls: ", ".join(_x(ls[0]["metrics"][k]) for k in ("plain_b8_own", "ngram_b1_own", "draft_b1_own"))),
    Stand("EAGLE-3 head trained for the key on its first 64 rows (their states kept while they decode, as `train_head` "
          "does), on held-out rows, float32, side by side: the head's eagle3 k=2 and the best of n-gram and suffix k=2 over plain",
          (("eagle3", {"workloads": "prose,edit", "recorded": True}), ("eagle3", {"workloads": "code,extract", "recorded": True})),
          lambda ls: "; ".join(_eagle3(x["metrics"], w) for x in ls for w in x["args"]["workloads"].split(","))),
    Stand("Plan + group at 1M and 5M rows; the driver's peak memory", (("scale", {}),),
          lambda ls: (f"{ls[0]['metrics']['plan_group_s@1000000']:.0f} s and {ls[0]['metrics']['plan_group_s@5000000']:.0f} s; "
                      f"{ls[0]['metrics']['driver_peak_mb@1000000']} and {ls[0]['metrics']['driver_peak_mb@5000000']} MB")),
)


def source_line(current: Sequence[dict], bench: str, args: dict) -> dict:
    """The one current line of `bench` whose identifying args include `args` (an arg a line lacks
    reads False: a flag added after it was recorded; the latest where several match)."""
    found = [x for x in current if x["bench"] == bench and all(identifying(x).get(k, False) == v for k, v in args.items())]
    if not found:
        raise SystemExit(f"bench/results.jsonl has no current {bench} line with {args}")
    return max(found, key=lambda x: x["utc"])


def stands_table(lines: Sequence[dict]) -> str:
    current = latest(lines)
    rows = ["| what | figure | machine | reproduce |", "|---|---|---|---|"]  # commits: docs/performance.md
    for stand in STANDS:
        used = [source_line(current, bench, args) for bench, args in stand.sources]
        unique = list({id(x): x for x in used}.values())
        wheres = sorted({x["machine"] for x in unique})
        # each input made once, then each command: every line runs as printed, in order
        commands = list(dict.fromkeys([f"`{x['prepare']}`" for x in unique if "prepare" in x] + [f"`{x['command']}`" for x in unique]))
        cells = [stand.what, stand.figure(used), "; ".join(wheres), "<br>".join(commands)]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


GRID_BEGIN, GRID_END = "<!-- bench-report:grid -->", "<!-- /bench-report:grid -->"


def grid_table(lines: Sequence[dict]) -> str:
    """The simulated grid (STANDS' sim sources), a row per regime and batch, its seeded second pass beside it."""
    current = latest(lines)
    rows = ["| regime | batch | vs oracle: worst / mean | vs static | vs schedule | seeded: worst / mean | predicted within ±5% | overhead |",
            "|---|---|---|---|---|---|---|---|"]
    for regime in SIM_REGIMES:
        for batch in (1, 8, 32):
            m = source_line(current, "sim", {"regime": regime, "batch_size": batch, "input": "grid.parquet"})["metrics"]
            seeded = source_line(current, "sim", {"regime": f"{regime}+prior", "batch_size": batch, "input": "grid.parquet"})["metrics"]
            rows.append(f"| `{regime}` | {batch} | {m['min_vs_oracle']:.3f} / {m['mean_vs_oracle']:.3f} | {m['vs_static']:.3f} | "
                        f"{m['vs_schedule']:.3f} | {seeded['min_vs_oracle']:.3f} / {seeded['mean_vs_oracle']:.3f} | "
                        f"{m['predictions_within_5pct']} of {m['predictions_judged']} | {m['max_overhead']:.1%} |")
    return "\n".join(rows)


HELDOUT_BEGIN, HELDOUT_END = "<!-- bench-report:heldout -->", "<!-- /bench-report:heldout -->"
HELDOUT_MADE_BY = "bench/heldout.py"  # the held-out records: sim runs on the input this script makes
HELDOUT_BATCHES = (1, 8, 32, 128)


def heldout_cells(lines: Sequence[dict]) -> list[dict]:
    """The held-out protocol's records, the newest of each cell (shards, regime, batch): workload
    shards by rows, then the many-keys job; regimes in SIM_REGIMES' order, batches ascending."""
    newest: dict[tuple, dict] = {}
    for x in lines:
        if x["bench"] != "sim" or HELDOUT_MADE_BY not in x.get("prepare", ""):
            continue
        a = x["args"]
        cell = (a["shard_by"] != "workload", a["rows"], a["shard_by"], a["regime"], a["batch_size"])
        if cell not in newest or x["utc"] >= newest[cell]["utc"]:
            newest[cell] = x
    order = {r: i for i, r in enumerate(SIM_REGIMES)}
    return [newest[c] for c in sorted(newest, key=lambda c: (c[0], c[1], c[2], order.get(c[3], len(order)), c[3], c[4]))]


def _shards(line: dict) -> str:
    a, m = line["args"], line["metrics"]
    if a["shard_by"] == "workload":
        return f"workload {a['rows']}"
    return f"{m['shards']} keys, {m['min_rows']}-{m['max_rows']} rows"


def heldout_table(lines: Sequence[dict]) -> str:
    """docs/simulator.md's held-out table: a row per recorded cell of the protocol."""
    rows = ["| shards | regime | batch | shards of >= 2 batches: worst / mean vs oracle | all shards: worst | "
            "job vs oracle (trtllm: vs its oracle that pays builds) | worst drain loss | worst shard (ran; oracle) |",
            "|---|---|---|---|---|---|---|---|"]
    for x in heldout_cells(lines):
        m = x["metrics"]
        large = ("- (none)" if m["min_vs_oracle_2_batches"] is None
                 else f"{m['min_vs_oracle_2_batches']:.3f} / {m['mean_vs_oracle_2_batches']:.3f}")
        job = f"{m['vs_oracle']:.3f}" + (f" ({m['vs_oracle_with_builds']:.3f})" if "vs_oracle_with_builds" in m else "")
        rows.append(f"| {_shards(x)} | `{x['args']['regime']}` | {x['args']['batch_size']} | {large} | {m['min_vs_oracle']:.3f} | "
                    f"{job} | {m['max_drain_loss']:+.1%} | {m['worst_shard']} |")
    return "\n".join(rows)


def heldout_summary(lines: Sequence[dict]) -> str:
    """docs/calibration.md's summary of the held-out table: a row per shards and regime, a column
    per batch; a cell the worst shard of two batches or more (`*`: none has two, the worst of all)
    / the job vs its oracle that pays no build; `-` where no record is."""
    by: dict[tuple[str, str], dict[int, dict]] = {}
    for x in heldout_cells(lines):
        by.setdefault((_shards(x), x["args"]["regime"]), {})[x["args"]["batch_size"]] = x["metrics"]
    rows = ["| shards | regime | " + " | ".join(f"batch {b}" for b in HELDOUT_BATCHES) + " |",
            "|---|---|" + "---|" * len(HELDOUT_BATCHES)]
    for (shards, regime), cells in by.items():
        text = [("-" if b not in cells else
                 (f"{cells[b]['min_vs_oracle']:.3f}*" if cells[b]["min_vs_oracle_2_batches"] is None
                  else f"{cells[b]['min_vs_oracle_2_batches']:.3f}") + f" / {cells[b]['vs_oracle']:.3f}")
                for b in HELDOUT_BATCHES]
        rows.append(f"| {shards} | `{regime}` | " + " | ".join(text) + " |")
    return "\n".join(rows)
