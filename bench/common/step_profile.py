"""Where one decode step and one prefill of the torch engine spend their time, by part.

The engine is not changed for this: for one `generate` call, the functions that do each part are
wrapped with timers (exclusive time: a part nested in another is subtracted from its parent), and
the rest of the call is Python bookkeeping. Parts:

- forward: the target model's forward (its KV writes excluded), i.e. the matmuls and attention;
- mask, positions, ids: building the attention mask, position ids and input tensors per call;
- KV update / compaction: appending to the cache, keeping accepted slots, dropping finished rows,
  taking in new rows, squeezing holes out;
- sampling: logits to probabilities, the accept rule, sampling;
- drafting: the drafter's proposals and its own cache (none for plain decoding);
- Python bookkeeping: everything else (committing tokens, stop checks, row lists, syncs).

Timers read this thread's CPU clock (`time.thread_time`; the engine runs one torch thread here),
so load from other processes on a shared machine hardly moves the split; wall seconds of the
whole call are reported beside it. On a GPU this would need the wall clock and a synchronize per
part; this is the CPU profile.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager

PARTS = ("forward", "mask, positions, ids", "KV update / compaction", "sampling", "drafting", "Python bookkeeping")


class Timers:
    """Exclusive wall time per (phase, part); phase is prefill while a prefill is on the stack."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.stack: list[list] = []  # [part, started, child seconds]

    def phase(self) -> str:
        return "prefill" if any(frame[0] == "prefill" for frame in self.stack) else "decode"

    def wrap(self, owner, attr: str, part: str):
        original = getattr(owner, attr)

        def timed(*args, **kwargs):
            self.stack.append([part, time.thread_time(), 0.0])
            try:
                return original(*args, **kwargs)
            finally:
                name, started, children = self.stack.pop()
                spent = time.thread_time() - started
                self.seconds[(self.phase() if name != "prefill" else "prefill", name)] += spent - children
                self.calls[name] += 1
                if self.stack:
                    self.stack[-1][2] += spent

        return original, timed


@contextmanager
def patched(timers: Timers, targets):
    """Wrap each (owner, attribute, part) for the duration of the block."""
    with ExitStack() as stack:
        for owner, attr, part in targets:
            original, timed = timers.wrap(owner, attr, part)
            setattr(owner, attr, timed)
            stack.callback(setattr, owner, attr, original)
        yield timers


def targets(engine) -> list[tuple]:
    """What to wrap in the engine: the layout of batchspec.engine.torch (decode.py holds the loop;
    before it was split out, engine.py did)."""
    import importlib

    from batchspec.engine.torch import drafters, kv

    try:
        loop = importlib.import_module("batchspec.engine.torch.decode")
        owner, prefill, step = loop.Decoder, "prefill", "step"
    except ImportError:
        loop = importlib.import_module("batchspec.engine.torch.engine")
        owner, prefill, step = type(engine), "_prefill", "_step"
    found = [(engine.model, "forward", "forward"), (owner, prefill, "prefill"), (owner, step, "step"),
             (kv.Batch, "forward", "mask, positions, ids")]
    found += [(kv.Batch, name, "KV update / compaction") for name in ("keep", "drop_last", "select", "extend", "compact")]
    found += [(kv.SlotLayer, "update", "KV update / compaction")]
    found += [(loop, name, "sampling") for name in ("probs_from_logits", "sample_from", "accept_reject", "greedy_accept")
              if hasattr(loop, name)]
    for cls in (drafters.NgramDrafter, drafters.ModelDrafter):
        found += [(cls, name, "drafting") for name in ("admit", "propose", "commit", "select")]
    return found


def profile(engine, prompts, batch: int, max_tokens: int) -> dict:
    """One plain generate over `batch` held-out prompts at batch size `batch`, by part: prefill
    totals and the mean decode step (decode time / target steps)."""
    from batchspec.engine.base import NO_SPEC, Request, SamplingParams

    requests = [Request(p.id, prompt_token_ids=p.token_ids, params=SamplingParams(max_tokens=max_tokens)) for p in prompts[:batch]]
    engine.generate(requests[:1], NO_SPEC, 1)  # warm-up
    with patched(Timers(), targets(engine)) as timers:
        started, wall = time.thread_time(), time.perf_counter()
        result = engine.generate(requests, NO_SPEC, batch)
        cpu, wall = time.thread_time() - started, time.perf_counter() - wall
    steps = max(1, timers.calls["step"])
    prefill_s = sum(s for (phase, _), s in timers.seconds.items() if phase == "prefill")
    decode_s = cpu - prefill_s
    table = {}
    for phase, total, per in (("prefill", prefill_s, 1), ("decode step", decode_s, steps)):
        key = "prefill" if phase == "prefill" else "decode"
        parts = {p: timers.seconds.get((key, p), 0.0) for p in PARTS[:-1]}
        parts["Python bookkeeping"] = total - sum(parts.values())
        table[phase] = {p: {"ms": 1000 * s / per, "share": s / total if total else 0.0} for p, s in parts.items()}
        table[phase]["total_ms"] = 1000 * total / per
    return {"batch_size": batch, "rows": len(requests), "prompt_tokens": [len(r.prompt_token_ids) for r in requests],
            "max_tokens": max_tokens, "wall_s": wall, "cpu_s": cpu, "target_steps": steps, "prefill_calls": timers.calls["prefill"],
            "output_tokens": result.output_tokens, "parts": table}


def markdown(p: dict) -> str:
    lines = [f"## Profile of the engine at batch {p['batch_size']} (plain decoding)\n",
             f"{p['rows']} held-out prompts of {min(p['prompt_tokens'])}-{max(p['prompt_tokens'])} tokens, max_tokens "
             f"{p['max_tokens']}: {p['prefill_calls']} prefill call(s) in total, and one decode step (mean of "
             f"{p['target_steps']}); {p['cpu_s']:.2f} CPU s ({p['wall_s']:.2f} s wall). Exclusive CPU time per part of the one torch thread (bench/common/step_profile.py).\n",
             "| part | prefill (all rows) ms | % | one decode step ms | % |", "|---|---|---|---|---|"]
    pre, step = p["parts"]["prefill"], p["parts"]["decode step"]
    for part in PARTS:
        lines.append(f"| {part} | {pre[part]['ms']:.1f} | {100 * pre[part]['share']:.0f}% | {step[part]['ms']:.2f} | {100 * step[part]['share']:.0f}% |")
    lines.append(f"| total | {pre['total_ms']:.1f} | 100% | {step['total_ms']:.2f} | 100% |")
    return "\n".join(lines)
