"""bench/results.jsonl, the one record of benchmark figures, and the tables made from it: the
current figures of docs/performance.md and the README's "Where it stands".

A bench run is recorded only when asked (`--record`): a figure is recorded when it changes a
decision, a default or a figure in the docs, not for every run, so smoke tests and casual runs
append nothing. Each line is one run:

    utc      when it finished (ISO 8601, seconds)
    commit   the checkout's short hash
    machine  CPU model and cores, and the GPU when CUDA is present (`machine()`)
    bench    engine | calibrate | pipeline | peer | scale | sim
    args     every option that can change the figure (output locations and recording options left out)
    metrics  the bench's headline figures, numbers or short strings
    command  the command line that reproduces it
    prepare  (where the bench read a file it did not make) the command that makes that file

The project's record holds figures of committed code only, every one reproducible as printed:
`record` appends to bench/results.jsonl only from a checkout with no uncommitted change, and only
where no option names a path of this machine (an input outside the repository is given by a
relative path, with `--input-made-by`, the documented command that makes it). `check` says what
breaks these rules; tests/test_bench.py holds every line to it.

`python bench/common/results.py` (`make bench-report`) rewrites the tables between the
`bench-report` markers of docs/performance.md (the latest line per figure: per bench and
identifying args, all but NOT_IDENTIFYING, with its commit and machine) and of the README (STANDS:
the figures a reader weighs first, each from the records it names). Lines whose metrics say
`"source": "README"` were carried over from the README's figures when the per-run result files
were retired, with the machine and commit the README gave them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results.jsonl"
DOC = ROOT / "docs" / "performance.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- bench-report:begin -->", "<!-- bench-report:end -->"
NOT_IDENTIFYING = ("threads",)  # how a run was made, not which figure it gives
BENCHES = ("engine", "calibrate", "pipeline", "peer", "scale", "sim")  # the table's order
# options left out of a recorded command and its args (value count): how it is recorded, and where
# a bench writes its details or work files, change no figure
LEFT_OUT = {"--record": 0, "--results": 1, "--input-made-by": 1, "--out": 1, "--json": 1, "--work": 1}
KEYS = ("utc", "commit", "machine", "bench", "args", "metrics", "command")


def add_options(parser: argparse.ArgumentParser) -> None:
    """--record, --results and --input-made-by, the same in every bench."""
    parser.add_argument("--record", action="store_true",
                        help="append this run's figures to bench/results.jsonl (do it when they change a decision, "
                        "a default or docs/performance.md, from a committed checkout; then `make bench-report`)")
    parser.add_argument("--results", default=str(RESULTS), metavar="FILE", help="where --record appends (default bench/results.jsonl)")
    parser.add_argument("--input-made-by", default=None, metavar="COMMAND",
                        help="with --record and an --input the repository does not hold: the command that makes it "
                        "(recorded, so the figure can be reproduced as printed)")


def _arg_name(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def record(bench: str, script: str, args: argparse.Namespace, argv: Sequence[str] | None, metrics: dict[str, Any]) -> dict:
    """The run's line; appended to `args.results` when `args.record` (to the project's record only
    where `check` finds nothing wrong with it). `argv` is what the bench parsed (None:
    sys.argv[1:]); `script` its path from the repository root."""
    argv = list(sys.argv[1:] if argv is None else argv)
    left_out = {_arg_name(o) for o in LEFT_OUT}
    line = {
        "utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "bench": bench,
        "args": {k: v for k, v in vars(args).items() if k not in left_out},
        "metrics": metrics,
        "command": shlex.join(["python", script, *_without_left_out(argv)]),
    }
    if getattr(args, "input_made_by", None):
        line["prepare"] = args.input_made_by
    if args.record:
        problems = check(line) if Path(args.results).resolve() == RESULTS.resolve() else []
        if problems:
            print(f"not recorded in {args.results}: {'; '.join(problems)}", flush=True)
        else:
            with open(args.results, "a", encoding="utf-8") as f:
                f.write(json.dumps(line, default=str) + "\n")
            print(f"recorded in {args.results}", flush=True)
    return line


def _without_left_out(argv: list[str]) -> list[str]:
    out, skip = [], 0
    for token in argv:
        name = token.split("=", 1)[0]
        if skip:
            skip -= 1
        elif name in LEFT_OUT:
            skip = LEFT_OUT[name] if "=" not in token else 0
        else:
            out.append(token)
    return out


def check(line: dict) -> list[str]:
    """What keeps a line out of the project's record, one phrase each (nothing: it may go in)."""
    problems = [f"no {k}" for k in KEYS if k not in line]
    if problems:
        return problems
    if line["commit"] == "unknown" or line["commit"].endswith("-dirty"):
        problems.append(f"commit {line['commit']}: record from a checkout with every change committed")
    for name, value in line["args"].items():
        for path in value if isinstance(value, list) else [value]:
            if isinstance(path, str) and path.startswith("/"):
                problems.append(f"--{name.replace('_', '-')} {path} is a path of this machine: give a relative path")
            elif isinstance(path, str) and name == "input" and not (ROOT / path).exists() and "prepare" not in line:
                problems.append(f"--input {path} is not in the repository: say how it is made (--input-made-by)")
    return problems


def commit() -> str:
    """The checkout's short commit, marked -dirty when tracked files differ from it (the results
    file aside: a run recorded before this one is not a change to the code measured)."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--",
                                ".", f":(exclude){RESULTS.relative_to(ROOT)}"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def cpu_model() -> str:
    """The processor as /proc/cpuinfo names it, with its family and model (a cloud 'AMD EPYC' says
    little: the same bench measured plain decoding 1.7x apart on two of them)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    get = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}.get
    return f"{get('model name', '?')} (family {get('cpu family', '?')}, model {get('model', '?')})"


def machine() -> str:
    """A short description of this machine: CPU model and cores, the GPU first when CUDA is present."""
    text = f"{cpu_model()}, {os.cpu_count()} cores"
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)}; {text}"
    return text


# ---- the tables --------------------------------------------------------------------------------


def read(path: Path | str = RESULTS) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def identifying(line: dict) -> dict:
    """The args that can change the line's figure, and how its input was made."""
    args = {k: v for k, v in line["args"].items() if k not in NOT_IDENTIFYING}
    return {**args, **({"prepare": line["prepare"]} if "prepare" in line else {})}


def identity(line: dict) -> tuple[str, str]:
    """(bench, its identifying args): lines with the same identity give the same figure."""
    return line["bench"], json.dumps(identifying(line), sort_keys=True, default=str)


def latest(lines: Sequence[dict]) -> list[dict]:
    """The latest line per identity, in bench order (BENCHES), then oldest first."""
    last: dict[tuple[str, str], dict] = {}
    for line in lines:
        key = identity(line)
        if key not in last or line["utc"] >= last[key]["utc"]:
            last[key] = line
    order = {b: i for i, b in enumerate(BENCHES)}
    return sorted(last.values(), key=lambda line: (order.get(line["bench"], len(order)), line["bench"], line["utc"]))


def reproduce(line: dict) -> str:
    """The line's command as a reader runs it: the input made first where the bench read one."""
    return f"{line['prepare']} && {line['command']}" if "prepare" in line else line["command"]


def where(line: dict) -> str:
    return f"{line['commit']}, {line['machine']}"


def _varying(lines: Sequence[dict]) -> dict[str, set[str]]:
    """Per bench, the identifying args whose values differ between its lines: what tells them apart."""
    values: dict[str, dict[str, set[str]]] = {}
    for line in lines:
        for k, v in identifying(line).items():
            values.setdefault(line["bench"], {}).setdefault(k, set()).add(json.dumps(v, default=str))
    return {b: {k for k, vs in args.items() if len(vs) > 1 and k != "prepare"} for b, args in values.items()}


def table(lines: Sequence[dict]) -> str:
    current = latest(lines)
    varying = _varying(current)
    rows = ["| bench | figure | figures | commit, machine | command |", "|---|---|---|---|---|"]
    for line in current:
        metrics = dict(line["metrics"])
        seeded = metrics.pop("source", None) == "README"
        figures = "; ".join(f"{k} {_number(v)}" for k, v in metrics.items()) + (" (from the README)" if seeded else "")
        args = identifying(line)
        which = ", ".join(f"{k} {_number(args[k])}" for k in sorted(varying.get(line["bench"], ())) if k in args) or "-"
        cells = [line["bench"], which, figures, where(line), f"`{reproduce(line)}`"]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def _number(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(_number(v) for v in value)
    return f"{value:.3f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


# ---- the README's "Where it stands" ------------------------------------------------------------


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
    Stand("Predicted speedup against the arm's simulated speedup, greedy, where one arm ran at least 95% of a shard's rows",
          _sim(SIM_REGIMES), _predictions),
    Stand("Calibration against the oracle and plain decoding, real clock, held-out prompts (40, 64 and 128-row shards)",
          tuple(("calibrate", {"batch_size": b}) for b in (1, 4, 8)), _calibrate),
    Stand("Against transformers `generate()` on its own linear layers, 300-600-token chat prompts, wall with prefill: "
          "plain batch 8, n-gram batch 1, draft batch 1",
          (("peer", {"layers": "own"}),),
          lambda ls: ", ".join(_x(ls[0]["metrics"][k]) for k in ("plain_b8_own", "ngram_b1_own", "draft_b1_own"))),
    Stand("Plan + group at 1M and 5M rows; the driver's peak memory", (("scale", {}),),
          lambda ls: (f"{ls[0]['metrics']['plan_group_s@1000000']:.0f} s and {ls[0]['metrics']['plan_group_s@5000000']:.0f} s; "
                      f"{ls[0]['metrics']['driver_peak_mb@1000000']} and {ls[0]['metrics']['driver_peak_mb@5000000']} MB")),
)


def source_line(current: Sequence[dict], bench: str, args: dict) -> dict:
    """The one current line of `bench` whose identifying args include `args` (the latest where several do)."""
    found = [x for x in current if x["bench"] == bench and all(identifying(x).get(k) == v for k, v in args.items())]
    if not found:
        raise SystemExit(f"bench/results.jsonl has no current {bench} line with {args}")
    return max(found, key=lambda x: x["utc"])


def stands_table(lines: Sequence[dict]) -> str:
    current = latest(lines)
    rows = ["| what | figure | commit, machine | reproduce |", "|---|---|---|---|"]
    for stand in STANDS:
        used = [source_line(current, bench, args) for bench, args in stand.sources]
        unique = list({id(x): x for x in used}.values())
        wheres = sorted({where(x) for x in unique})
        commands = list(dict.fromkeys(f"`{reproduce(x)}`" for x in unique))
        cells = [stand.what, stand.figure(used), "; ".join(wheres), "<br>".join(commands)]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


# ---- docs/calibration.md's grid -----------------------------------------------------------------

GRID = ROOT / "docs" / "calibration.md"
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


def rewrite(text: str, made: str, where_: str, begin: str = BEGIN, end: str = END) -> str:
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit(f"{where_}: expected one {begin} line before one {end} line")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{made}\n{end}{rest.split(end, 1)[1]}"


def block(text: str, begin: str = BEGIN, end: str = END) -> str:
    """What stands between a file's markers."""
    return text.split(begin)[1].split(end)[0].strip()


def update_doc(doc: Path | str = DOC, results: Path | str = RESULTS, readme: Path | str | None = None,
               grid: Path | str | None = None) -> str:
    """Rewrite the table between the markers of `doc` (and of `readme`: STANDS; of `grid`: the
    simulated grid) from `results`; return the first."""
    lines = read(results)
    made = table(lines)
    doc = Path(doc)
    doc.write_text(rewrite(doc.read_text(encoding="utf-8"), made, str(doc)), encoding="utf-8")
    if readme is not None:
        readme = Path(readme)
        readme.write_text(rewrite(readme.read_text(encoding="utf-8"), stands_table(lines), str(readme)), encoding="utf-8")
    if grid is not None:
        grid = Path(grid)
        grid.write_text(rewrite(grid.read_text(encoding="utf-8"), grid_table(lines), str(grid), GRID_BEGIN, GRID_END),
                        encoding="utf-8")
    return made


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate docs/performance.md's and the README's tables from bench/results.jsonl.")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--doc", default=str(DOC))
    parser.add_argument("--readme", default=str(README), help="whose 'Where it stands' table to rewrite ('' for none)")
    parser.add_argument("--grid", default=str(GRID), help="whose simulated grid table to rewrite ('' for none)")
    args = parser.parse_args(argv)
    made = update_doc(args.doc, args.results, args.readme or None, args.grid or None)
    print(f"{args.doc}: {made.count(chr(10)) - 1} figures from {args.results}"
          + (f"; {args.readme}: {len(STANDS)} rows" if args.readme else "") + ("; the grid" if args.grid else ""))


if __name__ == "__main__":
    main()
