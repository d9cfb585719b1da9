"""bench/results.jsonl, the one record of benchmark figures, and the tables made from it: the
current figures of docs/performance.md and the README's "Where it stands".

A bench run is recorded only when asked (`--record`): a figure is recorded when it changes a
decision, a default or a figure in the docs, not for every run, so smoke tests and casual runs
append nothing. Each line is one run:

    utc      when it finished (ISO 8601, seconds)
    commit   the checkout's short hash
    machine  CPU model and cores, and the GPU when CUDA is present (`machine()`)
    bench    engine | calibrate | pipeline | peer | scale | sim | eagle3
    args     every option that can change the figure (output locations and recording options left out)
    metrics  the bench's headline figures, numbers or short strings
    command  the command line that reproduces it
    prepare  (where the bench read a file it did not make) the command that makes that file

The project's record holds figures of committed code only, every one reproducible as printed:
`record` appends to bench/results.jsonl only from a checkout with no uncommitted change, and only
where no option names a path of this machine (an input outside the repository is given by a
relative path, with `--input-made-by`, the documented command that makes it). `check` says what
breaks these rules; tests/test_bench.py holds every line to it.

`table` is docs/performance.md's table (the latest line per figure: per bench and identifying
args, all but NOT_IDENTIFYING, with its commit and machine); `make bench-report`
(bench/common/report.py) writes it, and from the same lines the README's "Where it stands" and
docs/calibration.md's simulated grid (bench/common/stands.py). Lines whose metrics say
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
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results.jsonl"
DOC = ROOT / "docs" / "performance.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- bench-report:begin -->", "<!-- bench-report:end -->"
NOT_IDENTIFYING = ("threads",)  # how a run was made, not which figure it gives
# options that change a figure only with another set (option -> that one): left off where it is off,
# so a default recorded since does not split a figure from the lines recorded before the option existed
DEPENDENT = {"eagle3_ks": "eagle3"}
BENCHES = ("engine", "calibrate", "pipeline", "peer", "scale", "sim", "eagle3")  # the table's order
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
    """The args that can change the line's figure, and how its input was made. An option left off
    (False or None) identifies nothing: a line recorded before the option existed ran without it.
    Nor does a DEPENDENT option where the option it depends on is off."""
    given = line["args"]
    args = {k: v for k, v in given.items() if k not in NOT_IDENTIFYING and v is not None and v is not False
            and (k not in DEPENDENT or given.get(DEPENDENT[k]) not in (None, False))}
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
    keys: dict[str, set[str]] = {}
    for line in lines:
        keys.setdefault(line["bench"], set()).update(identifying(line))
    values: dict[str, dict[str, set[str]]] = {}
    for line in lines:
        args = identifying(line)
        for k in keys[line["bench"]]:
            values.setdefault(line["bench"], {}).setdefault(k, set()).add(json.dumps(args.get(k), default=str))
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
        which = ", ".join(f"{k} {_number(args[k]) if k in args else 'off'}" for k in sorted(varying.get(line["bench"], ()))) or "-"
        cells = [line["bench"], which, figures, where(line), f"`{reproduce(line)}`"]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def _number(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(_number(v) for v in value)
    return f"{value:.3f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def rewrite(text: str, made: str, where_: str, begin: str = BEGIN, end: str = END) -> str:
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit(f"{where_}: expected one {begin} line before one {end} line")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{made}\n{end}{rest.split(end, 1)[1]}"


def block(text: str, begin: str = BEGIN, end: str = END) -> str:
    """What stands between a file's markers."""
    return text.split(begin)[1].split(end)[0].strip()
