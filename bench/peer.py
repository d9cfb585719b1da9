"""batchspec's torch engine against transformers `generate()` on held-out long chat prompts.

Three comparisons, each on the same model object and the same token ids, greedy, wall time of
the whole call (prefill included), arms interleaved prompt by prompt (chunk by chunk at batch 8)
with their order rotating, so machine load hits every arm alike:

- plain decoding at batch 8 vs `generate()` on the same 8 prompts, left-padded (target >= 1.2x);
- n-gram lookup k=4 at batch 1 vs `generate(prompt_lookup_num_tokens=4)` (target >= 1.1x);
- a draft model (Qwen2.5-Coder-0.5B for 1.5B) k=4 at batch 1 vs `generate(assistant_model=...)`
  (target >= 1.1x); slow here (a 1.5B model on one thread), so a few prompts only.

transformers runs twice in each (`--layers`), on the same parameter tensors both times:
- "own layers": with its own `nn.Linear` layers, as a transformers user loads the model (the
  engine's measured linear forms, engine/torch/linear.py, swapped back for the call): the
  engine against transformers as shipped;
- "batchspec's layers": on the engine's measured forms, the model object exactly as the engine
  holds it: the decode loops alone, every product computed alike.

Prompts come from bench/common/peer_prompts.py (installed packages' READMEs and stdlib source,
300-600 tokens, chat template applied; --seed draws others). tok/s = output tokens / wall
seconds, the ratio is ours over theirs. Also: a profile of one decode step and one prefill of our
engine at batch 8 (bench/common/step_profile.py). The ratios are the figures --record appends to
bench/results.jsonl; --out DIR writes every detail (DIR/peer.json, DIR/peer.md).

    python bench/peer.py [--quick] [--seed 0] [--threads 1] [--skip draft] [--layers own,shared] [--out DIR] [--record]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import peer_prompts, results, step_profile  # noqa: E402
from common.measure import command, load_engine, machine, ngram_arm, write  # noqa: E402

from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig  # noqa: E402

TARGETS = {"plain b8": 1.2, "ngram b1": 1.1, "draft b1": 1.1}
LAYERS = {"own": "own layers", "shared": "batchspec's layers"}


@contextmanager
def own_layers(*models):
    """For the duration, every `MeasuredLinear` of `models` is an `nn.Linear` again, holding the
    same parameters (not copies: tied weights stay tied): the models as transformers loads them."""
    from torch import nn

    from batchspec.engine.torch.linear import MeasuredLinear

    swapped = []
    for model in models:
        for name, mod in list(model.named_modules()):
            if isinstance(mod, MeasuredLinear):
                plain = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None, device="meta")
                plain.weight, plain.bias = mod.weight, mod.bias
                model.set_submodule(name, plain)
                swapped.append((model, name, mod))
    try:
        yield
    finally:
        for model, name, mod in swapped:
            model.set_submodule(name, mod)


def hf_generate(model, prompts: list[list[int]], max_tokens: int, eos: list[int], pad: int, **extra) -> tuple[list[list[int]], float]:
    """transformers greedy generate() over left-padded prompts: (output ids per row up to and
    including eos, wall seconds)."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False, temperature=None,
                             top_p=None, top_k=None, eos_token_id=eos, pad_token_id=pad, **extra)
    wall = time.perf_counter() - started
    rows = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:end])
    return rows, wall


class Arm:
    """One side of a comparison: output ids and wall seconds, call by call."""

    def __init__(self, label: str) -> None:
        self.label, self.outputs, self.walls, self.cpu = label, [], [], []

    def add(self, outputs: list[list[int]], wall: float, cpu: float) -> None:
        self.outputs += outputs
        self.walls.append(wall)
        self.cpu.append(cpu)

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / sum(self.walls) if self.walls else 0.0


def compare(name: str, engine, prompts: list[peer_prompts.HeldOut], batch: int, max_tokens: int, spec: SpecConfig,
            hf_extra: dict, layers: Sequence[str] = tuple(LAYERS)) -> list[dict]:
    """Ours (spec at `batch`) against generate(**hf_extra) on the same chunks of `batch` prompts,
    once per transformers variant in `layers`: one result per variant."""
    eos, pad = sorted(engine.eos_ids), engine.pad_id
    ours = Arm(f"batchspec {spec.label} b{batch}")
    peers = {lay: Arm(f"transformers b{batch} ({LAYERS[lay]})") for lay in layers}
    chunk_ratios: dict[str, list[float]] = {lay: [] for lay in layers}
    accepted = drafted = 0
    models = [engine.model] + [m for m in hf_extra.values() if hasattr(m, "named_modules")]
    for i, begin in enumerate(range(0, len(prompts), batch)):
        part = prompts[begin : begin + batch]
        requests = [Request(p.id, prompt_token_ids=p.token_ids, params=SamplingParams(max_tokens=max_tokens)) for p in part]
        results: list = []

        def run_ours():
            cpu = time.thread_time()
            result = engine.generate(requests, spec, batch)
            ours.add([c.token_ids for c in result.completions], result.timing.wall_s, time.thread_time() - cpu)
            results.append(result)

        def run_theirs(lay: str):
            cpu = time.thread_time()
            with own_layers(*models) if lay == "own" else nullcontext():
                outputs, wall = hf_generate(engine.model, [list(p.token_ids) for p in part], max_tokens, eos, pad, **hf_extra)
            peers[lay].add(outputs, wall, time.thread_time() - cpu)

        runs = [run_ours] + [lambda lay=lay: run_theirs(lay) for lay in layers]
        for run in runs[i % len(runs):] + runs[: i % len(runs)]:  # each arm goes first in turn
            run()
        accepted += results[0].accepted_tokens
        drafted += results[0].draft_tokens
        ours_chunk = sum(len(o) for o in ours.outputs[-len(part):]) / ours.walls[-1]
        line = f"  {name} chunk {i}: ours {ours_chunk:.2f} tok/s"
        for lay, arm in peers.items():
            theirs_chunk = sum(len(o) for o in arm.outputs[-len(part):]) / arm.walls[-1]
            chunk_ratios[lay].append(ours_chunk / theirs_chunk)
            line += f", transformers ({LAYERS[lay]}) {theirs_chunk:.2f} tok/s, ratio {chunk_ratios[lay][-1]:.2f}"
        print(line, flush=True)
    out = []
    for lay, theirs in peers.items():
        same = sum(a == b for a, b in zip(ours.outputs, theirs.outputs))
        ratio = ours.tokens_per_s / theirs.tokens_per_s
        # tokens per CPU second of this (single torch thread) process: what load from other
        # processes on the machine disturbs least; the targets are on wall time
        cpu_ratio = (ours.tokens / sum(ours.cpu)) / (theirs.tokens / sum(theirs.cpu))
        out.append({"name": name, "layers": lay, "model": engine.model_name, "batch_size": batch, "spec": spec.label,
                    "prompts": len(prompts), "prompt_tokens": [len(p.token_ids) for p in prompts], "max_tokens": max_tokens,
                    "hf_options": {k: (v if isinstance(v, (int, float, str)) else type(v).__name__) for k, v in hf_extra.items()},
                    **{side: {"label": arm.label, "tokens": arm.tokens, "wall_s": sum(arm.walls), "cpu_s": sum(arm.cpu),
                              "tokens_per_s": arm.tokens_per_s} for side, arm in (("ours", ours), ("theirs", theirs))},
                    "acceptance_rate": accepted / drafted if drafted else None, "ratio": ratio, "cpu_ratio": cpu_ratio,
                    "chunk_ratios": chunk_ratios[lay], "target": TARGETS[name], "met": ratio >= TARGETS[name],
                    "identical_outputs": same / max(1, len(prompts))})
    return out


def table(rows: Sequence[dict]) -> str:
    lines = ["| comparison | model | prompts (tokens) | ours | tok/s | transformers | tok/s | ratio (target) | per chunk | met | CPU-time ratio | acceptance | identical outputs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lengths = r["prompt_tokens"]
        lines.append(f"| {r['name']} | {r['model']} | {r['prompts']} ({min(lengths)}-{max(lengths)}) | {r['ours']['label']} "
                     f"| {r['ours']['tokens_per_s']:.2f} | {r['theirs']['label']} {r['hf_options'] or ''} | {r['theirs']['tokens_per_s']:.2f} "
                     f"| {r['ratio']:.2f}x (>= {r['target']}x) | {', '.join(f'{x:.2f}' for x in r['chunk_ratios'])} "
                     f"| {'yes' if r['met'] else 'NO'} | {r['cpu_ratio']:.2f}x | {'-' if r['acceptance_rate'] is None else format(r['acceptance_rate'], '.2f')} "
                     f"| {r['identical_outputs']:.0%} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="model of the plain batch-8 and n-gram comparisons")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="which held-out prompts (bench/common/peer_prompts.py)")
    parser.add_argument("--batch-prompts", type=int, default=None, help="prompts of the batch-8 comparison (default 16; 8 quick)")
    parser.add_argument("--ngram-prompts", type=int, default=None, help="default 6; 2 quick")
    parser.add_argument("--draft-prompts", type=int, default=None, help="default 2; 1 quick")
    parser.add_argument("--max-tokens", type=int, default=None, help="default 64; 16 quick")
    parser.add_argument("--k", type=int, default=4, help="draft length of both speculative comparisons")
    parser.add_argument("--min-tokens", type=int, default=300, help="shortest prompt, chat template applied")
    parser.add_argument("--max-prompt-tokens", type=int, default=600)
    parser.add_argument("--skip", default="", help="comma-separated: plain,ngram,draft,profile")
    parser.add_argument("--layers", default="own,shared", help="transformers' variants, comma-separated: own (its nn.Linear), "
                        "shared (batchspec's measured linear forms)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None, metavar="DIR", help="write every detail to DIR/peer.json and DIR/peer.md")
    results.add_options(parser)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    layers = [lay for lay in args.layers.split(",") if lay]
    if not layers or set(layers) - set(LAYERS):
        parser.error(f"--layers: comma-separated of {', '.join(LAYERS)}")
    quick = args.quick
    max_tokens = args.max_tokens or (16 if quick else 64)
    info = machine(args.threads, args.dtype)
    print(f"machine: {info}", flush=True)
    rows: list[dict] = []
    data: dict = {"benchmark": "peer", "command": command("bench/peer.py", argv), "quick": quick, "seed": args.seed,
                  "machine": info, "comparisons": rows}
    length = dict(seed=args.seed, low=args.min_tokens, high=args.max_prompt_tokens)
    if not {"plain", "ngram", "profile"} <= skip:
        small = load_engine(args.model, args.dtype)
        n8 = args.batch_prompts or (8 if quick else 16)
        prompts = peer_prompts.held_out(small.tokenizer, max(n8, args.ngram_prompts or 0), **length)
        data["prompts"] = [{"id": p.id, "task": p.task, "source": p.source, "tokens": len(p.token_ids)} for p in prompts]
        if "plain" not in skip:
            rows += compare("plain b8", small, prompts[:n8], 8, max_tokens, NO_SPEC, {}, layers)
        if "ngram" not in skip:
            n1 = args.ngram_prompts or (2 if quick else 6)
            rows += compare("ngram b1", small, prompts[:n1], 1, max_tokens, ngram_arm(args.k),
                            {"prompt_lookup_num_tokens": args.k}, layers)
        if "profile" not in skip:
            data["profile"] = step_profile.profile(small, prompts[:8], 8, max_tokens)
        del small
    if "draft" not in skip:
        qwen = load_engine(args.target, args.dtype, args.draft_model)
        prompts = peer_prompts.held_out(qwen.tokenizer, args.draft_prompts or (1 if quick else 2), **length)
        spec = SpecConfig("draft_target", args.k, draft_model=args.draft_model)
        rows += compare("draft b1", qwen, prompts, 1, max_tokens, spec, {"assistant_model": qwen._draft(args.draft_model)}, layers)
    info["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    md = (f"# batchspec against transformers generate() on held-out chat prompts\n\n`{data['command']}`, {info['date_utc']}: "
          f"{info['cpus']} CPU cores shared with other sessions, {args.threads} torch thread(s), load average "
          f"{info['load_avg_start']} at start / {info['load_avg_end']} at end, {args.dtype}, greedy, max_tokens {max_tokens}, "
          f"prompt seed {args.seed}. tok/s = output tokens / wall seconds of the whole call (prefill included); "
          "ratio = ours / transformers, same parameter tensors and token ids; transformers with its own nn.Linear layers "
          "('own layers', as its users load a model) and on the engine's measured linear forms ('batchspec's layers', the "
          "decode loops alone); arms alternate chunk by chunk. 'CPU-time ratio': "
          "the same ratio on this process's CPU seconds (one torch thread), which load from other processes disturbs least.\n\n" + table(rows))
    if data.get("profile"):
        md += "\n\n" + step_profile.markdown(data["profile"])
    write(Path(args.out) if args.out else None, "peer", data, md, table(rows))
    data["record"] = results.record("peer", "bench/peer.py", args, argv,
                                    {f"{r['name'].replace(' ', '_')}_{r['layers']}": round(r["ratio"], 3) for r in rows})
    return data


if __name__ == "__main__":
    main()
