"""GPU check for the torch engine (`python jobs/gpu_check.py --engine torch`): no download needed.

Builds Llama-architecture models with random weights from a config, on the device (the 1B and 8B
shapes of Llama 3.2-1B / 3.1-8B; `tiny` for a CPU smoke run), and checks on each:

1. greedy speculation == plain decoding, through batchspec's TorchEngine: the target as its own
   draft (DraftTarget, every draft accepted), a noisy copy of it as the draft (drafts partly
   accepted: the KV cache cut back inside a draft), and n-gram lookup on prompts followed by their
   own continuation (proposed, mostly rejected); a check that proposed no draft fails; in float32 by default (`--check-dtype`),
   where the engine promises equality (docs/engines/torch.md: except near-ties of float error);
2. the step-cost profile: milliseconds of one target forward with a KV cache of `--context`
   tokens, for batch 1..64 x tokens per row 1..9 (the verify cost of draft lengths 0..8), in
   `--dtype` (bfloat16 by default): the figures calibration's cost model needs.

On CUDA it writes bench/results/gpu_torch_profile.json and .md (a table). Elsewhere it runs the
same code but writes only where `--out` says, never into bench/results: figures from a CPU are not
GPU figures.

    python jobs/gpu_check.py --engine torch                          # 1b and 8b on cuda
    python jobs/gpu_check.py --engine torch --shape tiny --device cpu --out /tmp/profile.json

Exit status: 0 every check equal; 1 a check differed or failed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results"
# Llama 3.2-1B and 3.1-8B shapes (their config.json); `tiny` is for CPU smoke runs.
SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
}
BATCHES = (1, 2, 4, 8, 16, 32, 64)
TOKENS = tuple(range(1, 10))


class IdTokenizer:
    """Enough of a tokenizer for prompts given as token ids: ids in, ids as text out."""

    pad_token_id, eos_token_id = 0, None

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))

    def get_vocab(self) -> dict[str, int]:
        return {str(i): i for i in range(self.vocab_size)}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", choices=sorted(SHAPES), help="default: 1b and 8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"), help="profile dtype")
    p.add_argument("--check-dtype", default="float32", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--context", type=int, default=256, help="KV-cache length for the profile")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--init-range", type=float, default=0.3, help="weight std: peaked logits keep greedy off near-ties")
    p.add_argument("--noise", type=float, default=0.01, help="the noisy draft's weights: the target's plus this share of each tensor's spread")
    p.add_argument("--out", help="JSON path (default on cuda: bench/results/gpu_torch_profile.json)")
    return p.parse_args(argv)


def build_model(shape: str, dtype, device: str, init_range: float, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096, initializer_range=init_range,
                         attn_implementation="sdpa", bos_token_id=1, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval().requires_grad_(False)


def check_equal(shape: str, args) -> dict:
    """Greedy tokens under "none", DraftTarget (the target drafting for itself) and n-gram."""
    import torch

    from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig
    from batchspec.engine.torch.engine import TorchEngine

    dtype = getattr(torch, args.check_dtype)
    model = build_model(shape, dtype, args.device, args.init_range)
    vocab = SHAPES[shape]["vocab_size"]
    tokenizer = IdTokenizer(vocab)
    drafts = {"self": (model, tokenizer)}  # the target as its own draft: acceptance 1 where greedy is exact

    def draft(name: str):
        if name == "noisy" and name not in drafts:  # the target's weights, each moved by `noise` of its spread:
            noisy = build_model(shape, dtype, args.device, args.init_range)  # drafts it partly accepts, so
            for p in noisy.parameters():  # verification rejects inside a draft and the KV cache is cut back
                p.add_(torch.randn_like(p) * args.noise * p.float().std().to(p.dtype))
            drafts[name] = (noisy, tokenizer)
        return drafts[name]

    engine = TorchEngine(model, tokenizer, model_name=f"random-llama-{shape}", device=args.device, draft_loader=draft)
    g = torch.Generator().manual_seed(1)
    phrase = torch.randint(3, vocab, (12,), generator=g).tolist()
    prompts = [phrase * 4, torch.randint(3, vocab, (40,), generator=g).tolist(), phrase * 2 + [5, 6, 7], [9] * 24]
    params = SamplingParams(max_tokens=args.max_tokens)
    requests = [Request(f"p{i}", prompt_token_ids=tuple(p), params=params) for i, p in enumerate(prompts)]
    plain = engine.generate(requests, NO_SPEC, 4)
    # n-gram lookup proposes only where the context's last tokens occurred before: on a random
    # model's own output it found none (H200, 1b and 8b, 2026-12-04: no draft, a check that could
    # not fail). Each prompt here is followed by its plain continuation and then by itself again,
    # so the lookup proposes that continuation and the target verifies it.
    copied = [Request(f"c{i}", prompt_token_ids=(*p, *ref.token_ids, *p), params=params)
              for i, (p, ref) in enumerate(zip(prompts, plain.completions))]
    plain_copied = engine.generate(copied, NO_SPEC, 4)
    out: dict = {"dtype": args.check_dtype, "rows": len(requests), "max_tokens": args.max_tokens}
    for spec, rows, ref in ((SpecConfig("draft_target", 4, draft_model="self"), requests, plain),
                            (SpecConfig("draft_target", 4, draft_model="noisy"), requests, plain),
                            (SpecConfig("ngram", 4, ngram_size=3), copied, plain_copied)):
        t0 = time.perf_counter()
        result = engine.generate(rows, spec, 4)
        differ = [c.id for c, r in zip(result.completions, ref.completions) if c.token_ids != r.token_ids]
        errors = [c.error for c in result.completions if c.error]
        drafted = sum(c.draft_tokens for c in result.completions)
        if not drafted:
            errors.append(f"{spec.label} proposed no draft token: equality was not exercised")
        name = f"{spec.label}:{spec.draft_model}" if spec.draft_model else spec.label
        out[name] = {"equal": not differ and not errors, "differ": differ, "errors": errors,
                           "draft_tokens": drafted, "acceptance_rate": result.acceptance_rate,
                           "mean_accepted_len": result.mean_accepted_len, "seconds": round(time.perf_counter() - t0, 3)}
    return out  # the models go with this frame; main() then returns their memory


def profile(shape: str, args) -> dict:
    """Median ms of one target forward of (batch, tokens) over a KV cache of args.context tokens."""
    import torch
    from transformers import DynamicCache

    model = build_model(shape, getattr(torch, args.dtype), args.device, args.init_range)
    vocab = SHAPES[shape]["vocab_size"]
    table: dict[str, list[float]] = {}
    for batch in BATCHES:
        ids = torch.randint(3, vocab, (batch, args.context), device=args.device)
        with torch.inference_mode():
            cache = DynamicCache()
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            row = []
            for t in TOKENS:
                step = torch.randint(3, vocab, (batch, t), device=args.device)
                times = []
                for rep in range(args.reps + 2):  # two warm-up runs
                    _sync(args.device)
                    t0 = time.perf_counter()
                    model(input_ids=step, past_key_values=cache, use_cache=True)
                    _sync(args.device)
                    if rep >= 2:
                        times.append((time.perf_counter() - t0) * 1000)
                    _trim(cache, args.context)
                row.append(round(statistics.median(times), 3))
        table[str(batch)] = row
        del cache
    del model
    _free(args.device)
    return {"dtype": args.dtype, "context": args.context, "reps": args.reps, "tokens_per_row": list(TOKENS),
            "ms_by_batch": table}


def _trim(cache, length: int) -> None:
    """Drop the timed step's tokens from the KV cache (crop's argument differs across transformers releases)."""
    try:
        cache.crop(length)
    except ValueError:  # releases where crop takes the number of tokens to remove, negative
        cache.crop(length - cache.get_seq_length())
    assert cache.get_seq_length() == length


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _free(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def markdown(report: dict) -> str:
    lines = [f"# torch engine on {report['device_name']} (random weights, {report['torch']})", ""]
    for shape, r in report["shapes"].items():
        p = r["profile"]
        lines += [f"## {shape}: ms per target forward, {p['dtype']}, KV cache {p['context']} tokens", "",
                  "| batch | " + " | ".join(f"{t} tok" for t in p["tokens_per_row"]) + " |",
                  "|---:|" + "---:|" * len(p["tokens_per_row"])]
        lines += [f"| {b} | " + " | ".join(f"{ms:.2f}" for ms in row) + " |" for b, row in p["ms_by_batch"].items()]
        checks = {k: v for k, v in r["check"].items() if isinstance(v, dict)}
        lines += ["", "Greedy equality (" + r["check"]["dtype"] + "): " + ", ".join(
            f"{k} {'equal' if v['equal'] else 'DIFFERS'} (acceptance {v['acceptance_rate']})" for k, v in checks.items()), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    on_gpu = args.device.startswith("cuda")
    out = Path(args.out) if args.out else (RESULTS / "gpu_torch_profile.json" if on_gpu else None)
    if out is None or (not on_gpu and RESULTS.resolve() in out.resolve().parents):  # said before torch loads
        print("gpu_check: off CUDA the figures are not GPU figures; pass --out outside bench/results", file=sys.stderr)
        return 2
    import torch

    if on_gpu and not torch.cuda.is_available():
        print("gpu_check: --device cuda but CUDA is not available here (use --shape tiny --device cpu --out FILE for a smoke run)", file=sys.stderr)
        return 2
    report = {"device": args.device, "device_name": torch.cuda.get_device_name() if on_gpu else platform.processor() or "cpu",
              "torch": torch.__version__, "shapes": {}}
    ok = True
    for shape in args.shape or ["1b", "8b"]:
        t0 = time.perf_counter()
        check = check_equal(shape, args)
        _free(args.device)
        prof = profile(shape, args)
        report["shapes"][shape] = {"config": SHAPES[shape], "check": check, "profile": prof,
                                   "seconds": round(time.perf_counter() - t0, 1)}
        for label, r in check.items():
            if isinstance(r, dict):
                ok = ok and r["equal"]
                print(f"{shape}: {label} {'OK' if r['equal'] else 'DIFFERS'} acceptance={r['acceptance_rate']} differ={r['differ']} errors={r['errors'][:1]}")
        print(f"{shape}: profile batch 1 {prof['ms_by_batch']['1']} ms; batch 64 {prof['ms_by_batch']['64']} ms")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
