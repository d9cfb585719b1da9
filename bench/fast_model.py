"""A model whose decode step is fast on a CPU, for the benches: where calibration's own Python
work (pricing, drift checks, the n-gram lookup) stands out against the step, as it does against a
GPU's. (issue 12)

SmolLM2-135M's tokenizer and chat template (the packaged model, `batchspec.models`) on a random
Llama of SmolLM2's config shrunk to `--hidden` wide and `--layers` deep (4 heads, 2 of them for
keys and values, untied head), seeded. At the defaults a batch-8 step on this project's 2-core CPU
is about 3.7 ms and a 9-token verify about 1.1-2.3x that, against 30-40 ms and 3x for SmolLM2 (the
H200's SmolLM2 step: 21 ms, a 9-token verify 1.4x). Its output is no language, but it is greedy and
deterministic, and with `--init 0.06` some rows fall into loops the n-gram lookup finds (mean
accepted length about 1.3 at k=8 on the held-out chat prompts), so every arm has something to
predict. Any path a bench takes `--model` from (`batchspec.models.resolve_model`) takes the folder.

    python bench/fast_model.py --out /tmp/fast_model
    python bench/calibrate.py --model /tmp/fast_model --input /tmp/held7.parquet --rows 64 \\
        --max-tokens 24 --batch-size 8 --dtype float32 --threads 2 --in-flight --later-shard
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from batchspec.models import REGISTRY, prepare

KEPT = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def write(out: Path, hidden: int = 64, layers: int = 2, init: float = 0.06, seed: int = 0) -> int:
    """Write the model to `out`; returns its parameter count."""
    source = prepare(REGISTRY["smollm2-135m"])
    config = json.loads((source / "config.json").read_text())
    for key in ("_model_name_or_path", "transformers_version"):
        config.pop(key, None)
    config.update(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=hidden // 4, tie_word_embeddings=False, initializer_range=init,
                  dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**config)).float()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in KEPT:
        if (source / name).exists():
            shutil.copy(source / name, out / name)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--init", type=float, default=0.06, help="the weights' standard deviation")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    params = write(args.out, args.hidden, args.layers, args.init, args.seed)
    print(f"{params:,} parameters -> {args.out}")


if __name__ == "__main__":
    main()
