"""Side-by-side measuring for the benches: torch threads, what a run was measured on, arms run
interleaved chunk by chunk (so noise on a shared machine hits every arm alike), and writing a
run's details.

Importing this puts the checkout's own batchspec first on sys.path: a bench measures the package
beside it, not another checkout's editable install.
"""

from __future__ import annotations

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
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common.results import cpu_model  # noqa: E402

from batchspec.engine.base import Completion, GenerateResult, Request, SpecConfig, Timing  # noqa: E402

RESULTS = ROOT / "bench" / "results"  # bench/calibrate.py's default --out for its detail files


def ngram_arm(k: int) -> SpecConfig:
    """The shipped trt_configs/ngram.yaml arm (its max_matching_ngram_size) at draft length k."""
    from importlib.resources import files

    from batchspec.config.spec import load_spec_file

    return load_spec_file(str(files("batchspec.data") / "trt_configs" / "ngram.yaml")).spec.with_draft_len(k)


def choose_threads(requested: int | None) -> int:
    """Torch threads: as asked, else 2 on a quiet machine (1-minute load < 1.5) and 1 otherwise,
    because oversubscribed threads on 2 shared cores make runs many times slower."""
    import torch

    threads = requested or (2 if os.getloadavg()[0] < 1.5 else 1)
    torch.set_num_threads(threads)
    return threads


def machine(threads: int, dtype: str, device: str = "cpu") -> dict:
    """What the figures were measured on, in detail (the run's JSON; results.machine() is the short form)."""
    import torch

    gpu = {"gpu": torch.cuda.get_device_name(device)} if device.startswith("cuda") else {}
    return {"cpus": os.cpu_count(), "torch_threads": threads, "load_avg_start": [round(x, 2) for x in os.getloadavg()],
            "dtype": dtype, "device": device, **gpu, "cpu": cpu_model(), "torch": torch.__version__,
            "python": platform.python_version(), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def machine_line(info: dict) -> str:
    """The machine of `info` (machine(), its load_avg_end set) as a report's header names it."""
    on = f"{info['gpu']}, " if info.get("gpu") else ""
    return (f"{on}{info['cpus']} CPU cores ({info['cpu']}), {info['torch_threads']} torch thread(s), "
            f"load average {info['load_avg_start'][0]} / {info['load_avg_end'][0]}")


def load_engine(model: str, dtype: str, draft_model: str | None = None, device: str = "cpu"):
    from batchspec.engine.torch.engine import TorchEngine

    started = time.perf_counter()
    engine = TorchEngine.load(model, draft_model=draft_model, dtype=dtype, device=device)
    print(f"loaded {model}{' + ' + draft_model if draft_model else ''} ({dtype}, {device}) in {time.perf_counter() - started:.1f}s", flush=True)
    return engine


@dataclass
class Measured:
    """One arm of a side-by-side comparison: every generate call it made, merged."""

    label: str
    spec: SpecConfig
    batch_size: int
    completions: list[Completion] = field(default_factory=list)
    timing: Timing = field(default_factory=Timing)
    parts: list[GenerateResult] = field(default_factory=list)  # each generate call (a chunk of `interleaved`)

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
    return measured


def fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def command(script: str, argv: Sequence[str] | None) -> str:
    """The command line that produced a result, for its markdown header."""
    return " ".join(["python", script, *(argv if argv is not None else sys.argv[1:])])


def write(out: Path | None, name: str, data: dict, markdown: str, table: str = "") -> None:
    """Print the table; with `out`, also OUT/<name>.json (every detail) and OUT/<name>.md."""
    print(table, flush=True)
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out / f"{name}.md").write_text(markdown + "\n")
    print(f"-> {out / name}.json", flush=True)
