"""bench/results.jsonl, the one record of benchmark figures, and the table docs/performance.md
shows from it.

A bench run is recorded only when asked (`--record`): a figure is recorded when it changes a
decision, a default or a figure in the docs, not for every run, so smoke tests and casual runs
append nothing. Each line is one run:

    utc      when it finished (ISO 8601, seconds)
    commit   the checkout's short hash, "-dirty" when tracked files differ from it
    machine  CPU model and cores, and the GPU when CUDA is present (`machine()`)
    bench    engine | calibrate | pipeline | peer | scale | sim
    args     every option of the run (the recording options left out)
    metrics  the bench's headline figures, numbers or short strings
    command  the command line that reproduces it

`python bench/common/results.py` (`make bench-report`) rewrites the table between the
`bench-report` markers of docs/performance.md: the latest line per bench and figure (the args
that identify a figure: all but NOT_IDENTIFYING), with its machine, commit and command. Lines
whose metrics say `"source": "README"` were carried over from the README's figures when the
per-run result files were retired, with the machine and commit the README gave them.
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
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results.jsonl"
DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- bench-report:begin -->", "<!-- bench-report:end -->"
NOT_IDENTIFYING = ("threads", "work")  # how a run was made, not which figure it gives
BENCHES = ("engine", "calibrate", "pipeline", "peer", "scale", "sim")  # the table's order
RECORDING = {"--record": 0, "--results": 1, "--out": 1}  # options left out of a recorded command (value count)


def add_options(parser: argparse.ArgumentParser) -> None:
    """--record and --results, the same in every bench."""
    parser.add_argument("--record", action="store_true",
                        help="append this run's figures to bench/results.jsonl (do it when they change a decision, "
                        "a default or docs/performance.md; then `make bench-report`)")
    parser.add_argument("--results", default=str(RESULTS), metavar="FILE", help="where --record appends (default bench/results.jsonl)")


def record(bench: str, script: str, args: argparse.Namespace, argv: Sequence[str] | None, metrics: dict[str, Any]) -> dict:
    """The run's line; appended to `args.results` when `args.record`. `argv` is what the bench
    parsed (None: sys.argv[1:]); `script` its path from the repository root."""
    argv = list(sys.argv[1:] if argv is None else argv)
    line = {
        "utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "bench": bench,
        "args": {k: v for k, v in vars(args).items() if k not in ("record", "results", "out")},
        "metrics": metrics,
        "command": shlex.join(["python", script, *_without_recording(argv)]),
    }
    if args.record:
        with open(args.results, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, default=str) + "\n")
        print(f"recorded in {args.results}", flush=True)
    return line


def _without_recording(argv: list[str]) -> list[str]:
    out, skip = [], 0
    for token in argv:
        name = token.split("=", 1)[0]
        if skip:
            skip -= 1
        elif name in RECORDING:
            skip = RECORDING[name] if "=" not in token else 0
        else:
            out.append(token)
    return out


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


# ---- the report --------------------------------------------------------------------------------


def read(path: Path | str = RESULTS) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def identity(line: dict) -> tuple[str, str]:
    """(bench, its identifying args): lines with the same identity give the same figure."""
    args = {k: v for k, v in line["args"].items() if k not in NOT_IDENTIFYING}
    return line["bench"], json.dumps(args, sort_keys=True, default=str)


def latest(lines: Sequence[dict]) -> list[dict]:
    """The latest line per identity, in bench order (BENCHES), then oldest first."""
    last: dict[tuple[str, str], dict] = {}
    for line in lines:
        key = identity(line)
        if key not in last or line["utc"] >= last[key]["utc"]:
            last[key] = line
    order = {b: i for i, b in enumerate(BENCHES)}
    return sorted(last.values(), key=lambda line: (order.get(line["bench"], len(order)), line["bench"], line["utc"]))


def table(lines: Sequence[dict]) -> str:
    rows = ["| bench | figures | machine | commit | date (UTC) | command |", "|---|---|---|---|---|---|"]
    for line in latest(lines):
        metrics = dict(line["metrics"])
        seeded = metrics.pop("source", None) == "README"
        figures = "; ".join(f"{k} {_number(v)}" for k, v in metrics.items()) + (" (from the README)" if seeded else "")
        cells = [line["bench"], figures, line["machine"], line["commit"], line["utc"][:10], f"`{line['command']}`"]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def _number(value: Any) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def update_doc(doc: Path | str = DOC, results: Path | str = RESULTS) -> str:
    """Rewrite the table between the markers of `doc` from `results`; return the table."""
    doc = Path(doc)
    text = doc.read_text(encoding="utf-8")
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise SystemExit(f"{doc}: expected one {BEGIN} line before one {END} line")
    made = table(read(results))
    head, rest = text.split(BEGIN)
    doc.write_text(f"{head}{BEGIN}\n{made}\n{END}{rest.split(END, 1)[1]}", encoding="utf-8")
    return made


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate docs/performance.md's table from bench/results.jsonl.")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--doc", default=str(DOC))
    args = parser.parse_args(argv)
    made = update_doc(args.doc, args.results)
    print(f"{args.doc}: {made.count(chr(10)) - 1} figures from {args.results}")


if __name__ == "__main__":
    main()
