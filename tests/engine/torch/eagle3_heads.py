"""Heads for the EAGLE-3 tests: a random head written in the released format, and a head trained
on the word target's own rows (the `trained` fixture, tests/engine/torch/conftest.py)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from batchspec.engine.acceptance import PlainRow
from batchspec.engine.base import NO_SPEC, Request, SamplingParams
from batchspec.engine.torch.eagle3 import aux_layers
from batchspec.engine.torch.eagle3_states import record
from batchspec.engine.torch.eagle3_train import TrainSettings, train_head
from batchspec.engine.torch.engine import TorchEngine

MAX_TOKENS = 20


def released(target, draft_vocab: int = 40, **config_changes) -> tuple[dict, dict[str, torch.Tensor]]:
    """A random head as SpecForge exports one and EAGLE ships one: a LlamaConfig with
    draft_vocab_size, and tensors under the released names (written here, not by save_head)."""
    H, I, V = 64, 96, target.config.vocab_size
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
              "intermediate_size": I, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
              "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
              "tie_word_embeddings": False, "vocab_size": V, "draft_vocab_size": draft_vocab, **config_changes}
    gen = torch.Generator().manual_seed(9)
    shapes = {
        "fc.weight": (H, 3 * H), "midlayer.hidden_norm.weight": (H,), "midlayer.input_layernorm.weight": (H,),
        "midlayer.self_attn.q_proj.weight": (H, 2 * H), "midlayer.self_attn.k_proj.weight": (32, 2 * H),
        "midlayer.self_attn.v_proj.weight": (32, 2 * H), "midlayer.self_attn.o_proj.weight": (H, H),
        "midlayer.post_attention_layernorm.weight": (H,), "midlayer.mlp.gate_proj.weight": (I, H),
        "midlayer.mlp.up_proj.weight": (I, H), "midlayer.mlp.down_proj.weight": (H, I), "norm.weight": (H,),
        "lm_head.weight": (draft_vocab, H),
    }
    weights = {k: torch.randn(s, generator=gen) for k, s in shapes.items()}
    used = torch.randperm(V, generator=gen)[:draft_vocab].sort().values
    weights["d2t"] = used - torch.arange(draft_vocab)
    weights["t2d"] = torch.zeros(V, dtype=torch.bool).index_fill(0, used, True)
    return config, weights


def write(folder, config: dict, weights: dict[str, torch.Tensor], fmt: str = "safetensors"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "safetensors":
        save_file(weights, str(folder / "model.safetensors"))
    else:
        torch.save(weights, folder / "pytorch_model.bin")
    return folder


def word_requests(n: int, seed: int) -> list[Request]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        words = [f"w{int(x)}" for x in torch.randint(1, 64, (4 + i % 5,), generator=gen)]
        out.append(Request(f"r{i}", " ".join(words), params=SamplingParams(max_tokens=MAX_TOKENS - 2 * (i % 3), temperature=0.0)))
    return out


def trained_word_head(word_models):
    """(engine, plain rows, recorded rows, trained head, its stats) on 12 rows of the word target."""
    target, _, tokenizer = word_models
    engine = TorchEngine(target, tokenizer, model_name="tiny")
    requests = word_requests(12, seed=3)
    result = engine.generate(requests, NO_SPEC, 4)
    pairs = [(engine.encode(r), c.token_ids) for r, c in zip(requests, result.completions)]
    rows = record(target, pairs, aux_layers(target.config.num_hidden_layers))
    plain = [PlainRow(p, o, r.params.max_tokens) for (p, o), r in zip(pairs, requests)]
    head, stats = train_head(target, rows, TrainSettings(max_steps=40, draft_vocab_size=48, depth=4, lr=3e-3))
    return engine, plain, rows, head, stats
