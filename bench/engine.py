"""Engine benchmark (issue 2): plain decoding, n-gram and draft-model speculation, side by side in
one run, as ratios measured in that run.

Three comparisons, each interleaved chunk by chunk (plain and speculative alternate, order
rotating) so machine noise hits both alike:
- plain decoding at batch 8 vs batch 1 (SmolLM2, mixed workloads). Target >= 4x.
- n-gram prompt lookup vs plain at batch 1 on the copy-heavy edit set. Target >= 2x.
- Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B vs plain at batch 1 on code. Target >= 1.6x.

tokens/s is goodput: committed output tokens per second of decode time (prefill, identical for
both arms, left out, as calibration measures it); tokens over the whole wall time of
`engine.generate` (prefill included, model loading excluded) and that ratio are reported beside it. Writes
OUT/engine.json and OUT/engine.md.

    python bench/engine.py [--quick] [--out bench/results] [--threads N] [--dtype bfloat16]
    python bench/engine.py --suffix [--suffix-rows 128] [--max-tokens 64] [--suffix-k 8]   # the suffix arm (bench/suffix_bench.py)

This module also holds the measuring helpers the other benchmarks share (`Measured`,
`interleaved`, `machine`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import workloads  # noqa: E402

from batchspec.engine.base import (  # noqa: E402
    NO_SPEC,
    Completion,
    GenerateResult,
    Request,
    SpecConfig,
    Timing,
)

RESULTS = ROOT / "bench" / "results"


def ngram_arm(k: int) -> SpecConfig:
    """The shipped trt_configs/ngram.yaml arm (its max_matching_ngram_size, which the README's
    figures used) at draft length k."""
    from importlib.resources import files

    from batchspec.config.spec import load_spec_file

    return load_spec_file(str(files("batchspec.data") / "trt_configs" / "ngram.yaml")).spec.with_draft_len(k)


# -- shared measuring helpers ------------------------------------------------------------------


def choose_threads(requested: int | None) -> int:
    """Torch threads: as asked, else 2 on a quiet machine (1-minute load < 1.5) and 1 otherwise,
    because oversubscribed threads on 2 shared cores make runs many times slower."""
    import torch

    threads = requested or (2 if os.getloadavg()[0] < 1.5 else 1)
    torch.set_num_threads(threads)
    return threads


def machine(threads: int, dtype: str, device: str = "cpu") -> dict:
    """What the figures were measured on."""
    import torch

    gpu = {"gpu": torch.cuda.get_device_name(device)} if device.startswith("cuda") else {}
    return {"cpus": os.cpu_count(), "torch_threads": threads, "load_avg_start": [round(x, 2) for x in os.getloadavg()],
            "dtype": dtype, "device": device, **gpu, "cpu": cpu_model(), "torch": torch.__version__,
            "python": platform.python_version(), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def cpu_model() -> str:
    """The processor, as /proc/cpuinfo names it (family and model too: a cloud 'AMD EPYC' says little).
    The same bench a session apart measured plain decoding 1.7x apart: a figure names its CPU."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or "unknown"
    get = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}.get
    return f"{get('model name', '?')} (family {get('cpu family', '?')}, model {get('model', '?')}, {get('cpu MHz', '?')} MHz)"


def machine_line(info: dict) -> str:
    """The machine of `info` (machine(), its load_avg_end set) as a report's header names it."""
    on = f"{info['gpu']}, " if info.get("gpu") else ""
    return (f"{on}{info['cpus']} CPU cores ({info['cpu']}), {info['torch_threads']} torch thread(s), "
            f"load average {info['load_avg_start'][0]} / {info['load_avg_end'][0]}")


@dataclass
class Measured:
    """One arm of a side-by-side comparison: every generate call it made, merged."""

    label: str
    spec: SpecConfig
    batch_size: int
    completions: list[Completion] = field(default_factory=list)
    timing: Timing = field(default_factory=Timing)
    parts: list[GenerateResult] = field(default_factory=list)  # each generate call (a chunk of `interleaved`)
    steps: list[list] = field(default_factory=list)  # each call's decode steps (engine.last_steps; [] where an engine keeps none)

    def add(self, result: GenerateResult) -> None:
        self.completions += result.completions
        self.timing = self.timing + result.timing
        self.parts.append(result)

    @property
    def result(self) -> GenerateResult:
        return GenerateResult(self.completions, self.timing)

    @property
    def tokens_per_s(self) -> float:
        return self.result.output_tokens / self.timing.wall_s if self.timing.wall_s > 0 else 0.0

    def summary(self) -> dict:
        r, t = self.result, self.timing
        return {"label": self.label, "method": self.spec.method, "draft_len": self.spec.draft_len,
                "batch_size": self.batch_size, "rows": len(self.completions), "output_tokens": r.output_tokens,
                "tokens_per_s": self.tokens_per_s, "goodput": r.goodput, "acceptance_rate": r.acceptance_rate,
                "mean_accepted_len": r.mean_accepted_len, "target_steps": r.target_steps,
                "draft_tokens": r.draft_tokens, "accepted_tokens": r.accepted_tokens,
                "errors": sum(c.finish_reason == "error" for c in self.completions), **asdict(t)}


def interleaved(engine, requests: Sequence[Request], arms: Sequence[tuple[str, SpecConfig, int]], chunk: int) -> dict[str, Measured]:
    """Run every arm (label, spec, batch size) on every chunk of `requests`, chunk by chunk, the
    arm order rotating each chunk; each arm ends up having generated every request once."""
    measured = {label: Measured(label, spec, batch) for label, spec, batch in arms}
    order = list(measured.values())
    for i, begin in enumerate(range(0, len(requests), chunk)):
        part = list(requests[begin : begin + chunk])
        for arm in order[i % len(order):] + order[: i % len(order)]:
            arm.add(engine.generate(part, arm.spec, arm.batch_size))
            arm.steps.append(list(getattr(engine, "last_steps", [])))
    return measured


@dataclass
class Comparison:
    """A candidate against a baseline, measured side by side."""

    name: str
    model: str
    workload: str
    baseline: dict
    candidate: dict
    target: float

    @property
    def speedup(self) -> float:
        """Goodput ratio: speculation and batching change decode, not the (identical) prefill."""
        return self.candidate["goodput"] / self.baseline["goodput"] if self.baseline["goodput"] else 0.0

    def to_dict(self) -> dict:
        wall = self.candidate["tokens_per_s"] / self.baseline["tokens_per_s"] if self.baseline["tokens_per_s"] else 0.0
        return {**asdict(self), "speedup": self.speedup, "speedup_wall": wall, "met": self.speedup >= self.target}


def fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def comparison_table(comparisons: Sequence[dict]) -> str:
    lines = ["| comparison | model | workload | batch | baseline tok/s | candidate | tok/s | acceptance | mean accepted len | speedup | target | met | wall tok/s (base / cand) | wall speedup |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in comparisons:
        b, k = c["baseline"], c["candidate"]
        lines.append(f"| {c['name']} | {c['model']} | {c['workload']} | {k['batch_size']} | {fmt(b['goodput'], '.1f')} "
                     f"| {k['label']} | {fmt(k['goodput'], '.1f')} | {fmt(k['acceptance_rate'])} | {fmt(k['mean_accepted_len'])} "
                     f"| {c['speedup']:.2f}x | >= {c['target']}x | {'yes' if c['met'] else 'NO'} "
                     f"| {b['tokens_per_s']:.1f} / {k['tokens_per_s']:.1f} | {c['speedup_wall']:.2f}x |")
    return "\n".join(lines)


def command(script: str, argv: Sequence[str] | None) -> str:
    """The command line that produced a result, for its markdown header."""
    return " ".join(["python", script, *(argv if argv is not None else sys.argv[1:])])


def write(out: Path, name: str, data: dict, markdown: str, table: str = "") -> None:
    """OUT/<name>.json and OUT/<name>.md; print the table and where it went."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out / f"{name}.md").write_text(markdown + "\n")
    print(f"{table}\n-> {out / name}.json", flush=True)


def workload_options(parser, workload: str, rows: int) -> None:
    """The options of a bench that runs one task's first rows of a prompt Parquet (the held-out
    set): --model, --input, --workload, --rows, --max-tokens, --batch-size."""
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--input", required=True, help="a prompt Parquet with a task column, e.g. the held-out set")
    parser.add_argument("--workload", default=workload, help="the task whose first --rows rows run")
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=8)


def result_options(parser, name: str) -> None:
    """The options of a bench that writes one named result: --dtype, --threads, --out, --name."""
    parser.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--name", default=name)


def start(args, model: str, draft_model: str | None = None) -> tuple[dict, object]:
    """Threads, the machine's description (printed) and the loaded engine, for `result_options`' args."""
    info = machine(choose_threads(args.threads), args.dtype)
    print(f"machine: {info}", flush=True)
    return info, load_engine(model, args.dtype, draft_model)


def start_workload(args, parser) -> tuple[dict, object, list[Request]]:
    """`start` for `workload_options`' args, and the task's first --rows rows of --input (none:
    the parser exits 2 saying so)."""
    info, engine = start(args, args.model)
    requests = workloads.from_parquet(args.input, args.workload, args.rows, args.max_tokens)
    if not requests:
        parser.error(f"no {args.workload!r} rows in {args.input}")
    return info, engine, requests


def warm_plain(engine, requests: Sequence[Request], batch_size: int) -> GenerateResult:
    """The rows' plain run at `batch_size`, after a batch of them warmed the engine."""
    import torch

    with torch.inference_mode():
        engine.generate(requests[:batch_size], NO_SPEC, batch_size)  # warm
        return engine.generate(requests, NO_SPEC, batch_size)


def load_engine(model: str, dtype: str, draft_model: str | None = None, device: str = "cpu"):
    from batchspec.engine.torch.engine import TorchEngine

    started = time.perf_counter()
    engine = TorchEngine.load(model, draft_model=draft_model, dtype=dtype, device=device)
    print(f"loaded {model}{' + ' + draft_model if draft_model else ''} ({dtype}, {device}) in {time.perf_counter() - started:.1f}s", flush=True)
    return engine


# -- the engine benchmark ----------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """How much each comparison generates."""

    batch_prompts: int  # prompts for plain b1 vs b8 (a multiple of 8)
    copy_prompts: int
    code_prompts: int
    max_tokens: int

    @classmethod
    def pick(cls, quick: bool) -> "Sizes":
        return cls(8, 2, 2, 32) if quick else cls(16, 3, 3, 64)


def bench_batching(engine, model: str, sizes: Sizes) -> Comparison:
    per = max(1, sizes.batch_prompts // len(workloads.WORKLOADS))
    requests = [r for w in workloads.WORKLOADS for r in workloads.requests(w, per, sizes.max_tokens)]
    requests = [requests[i] for i in sorted(range(len(requests)), key=lambda i: i % per)]  # mixed chunks
    m = interleaved(engine, requests, [("none b1", NO_SPEC, 1), ("none b8", NO_SPEC, 8)], chunk=8)
    return Comparison("plain batch 8 vs batch 1", model, "mixed", m["none b1"].summary(), m["none b8"].summary(), 4.0)


def bench_speculation(engine, model: str, workload: str, n: int, max_tokens: int, spec: SpecConfig,
                      name: str, target: float) -> tuple[Comparison, dict[str, Measured]]:
    requests = workloads.requests(workload, n, max_tokens)
    m = interleaved(engine, requests, [("none b1", NO_SPEC, 1), (f"{spec.label} b1", spec, 1)], chunk=1)
    return Comparison(name, model, workload, m["none b1"].summary(), m[f"{spec.label} b1"].summary(), target), m


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="model for plain batch 1 vs 8")
    parser.add_argument("--ngram-model", default="qwen2.5-coder-1.5b", help="model for n-gram vs plain on copy-heavy edits")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", help="target of the draft-model comparison")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--ngram-k", type=int, default=6)
    parser.add_argument("--draft-k", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: 2 if the machine is quiet, else 1)")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="few prompts and tokens (minutes, not tens of minutes)")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--suffix", action="store_true", help="instead: the suffix arm on rows that share structure "
                        "and on prose, SmolLM2, batch 1, float32 (bench/suffix_bench.py; issue 57)")
    parser.add_argument("--suffix-rows", type=int, default=128, help="with --suffix: rows per structured workload (prose: a quarter, at least 16; 0: the memory check only)")
    parser.add_argument("--suffix-memory-rows", type=int, default=10_000, help="with --suffix: rows of 200 tokens in the memory check")
    parser.add_argument("--suffix-name", default="suffix", help="with --suffix: the result's name under --out")
    parser.add_argument("--suffix-k", type=int, default=8, help="with --suffix: the draft length of both arms")
    args = parser.parse_args(argv)
    if args.suffix:
        import suffix_bench

        return suffix_bench.main(args, argv)

    threads = choose_threads(args.threads)
    sizes = Sizes.pick(args.quick)
    if args.max_tokens:
        sizes = Sizes(sizes.batch_prompts, sizes.copy_prompts, sizes.code_prompts, args.max_tokens)
    info = machine(threads, args.dtype)
    print(f"machine: {info}", flush=True)
    comparisons: list[Comparison] = []
    engines = {}

    def engine_for(model: str, draft: str | None = None):
        if model not in engines:
            engines[model] = load_engine(model, args.dtype, draft)
        return engines[model]

    comparisons.append(bench_batching(engine_for(args.model), args.model, sizes))
    print(comparison_table([comparisons[-1].to_dict()]), flush=True)
    ngram = ngram_arm(args.ngram_k)
    c, _ = bench_speculation(engine_for(args.ngram_model), args.ngram_model, "edit", sizes.copy_prompts, sizes.max_tokens,
                             ngram, "n-gram vs plain, batch 1", 2.0)
    comparisons.append(c)
    print(comparison_table([c.to_dict()]), flush=True)
    draft = SpecConfig("draft_target", args.draft_k, draft_model=args.draft_model)
    c, _ = bench_speculation(engine_for(args.target, args.draft_model), f"{args.target} <- {args.draft_model}", "code",
                             sizes.code_prompts, sizes.max_tokens, draft, "draft model vs plain, batch 1", 1.6)
    comparisons.append(c)

    rows = [c.to_dict() for c in comparisons]
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    data = {"benchmark": "engine", "quick": args.quick, "max_tokens": sizes.max_tokens, "machine": info, "comparisons": rows}
    table = comparison_table(rows)
    md = (f"# Engine benchmark\n\n`{command('bench/engine.py', argv)}`, {info['date_utc']}: "
          f"{machine_line(info)}, {args.dtype}, greedy, max_tokens {sizes.max_tokens}. tok/s = goodput (output tokens / "
          f"decode seconds, prefill excluded); wall tok/s includes prefill; speedups are ratios within this one run.\n\n{table}")
    write(Path(args.out), "engine", data, md, table)
    return data


if __name__ == "__main__":
    main()
