"""An EAGLE-3 head in its released format on disk: config.json (a LlamaConfig of one layer with
`draft_vocab_size`) and model.safetensors or pytorch_model.bin, written and read for a target
(eagle3.py is the head itself). A head that does not fit its target is one line naming the file
and the field.

What it mirrors (read at these commits; the names below are theirs):
- sgl-project/SpecForge @ a6b6b0230009d15ec2a97a57384e6f53f0f96946
  - specforge/export/to_sglang.py, `export_to_sglang` and `_REQUIRED_SERVING_KEYS`: a released
    head is `save_pretrained` output, config.json (a LlamaConfig with `architectures`
    ["LlamaForCausalLMEagle3"], `num_hidden_layers` 1, `draft_vocab_size`) and model.safetensors
    with `fc.weight`, `norm.weight`, `lm_head.weight`, `t2d`, `d2t` and the `midlayer.*` weights;
    the embeddings are dropped (the target's are used).
- vllm-project/vllm @ 00bd1493b3e82d6c13c68ee8a0e1c5a96707e190,
  vllm/model_executor/models/llama_eagle3.py, `Eagle3LlamaForCausalLM.load_weights`: reads those
  key names (`midlayer.` as layer 0, `d2t` as `draft_id_to_target_id`, `t2d` skipped,
  `embed_tokens.weight` taken when present, else the target's); `draft_vocab_size` defaults to
  `vocab_size`. EAGLE's own released heads (yuhuili/EAGLE3-*) ship pytorch_model.bin with these
  names (eagle/model/ea_model.py, `EaModel.from_pretrained`, loads either file).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig

from batchspec.engine.eagle3_format import ARCHITECTURE, CONFIG_FILE
from batchspec.engine.torch.eagle3 import Eagle3Head, aux_layers
from batchspec.errors import ModelError, one_line

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # the released formats, in the order tried


def head_config(target_config, draft_vocab_size: int, **overrides) -> LlamaConfig:
    """A head's config for `target_config`: its shapes (one layer), `draft_vocab_size`."""
    fields = dict(
        hidden_size=target_config.hidden_size, intermediate_size=target_config.intermediate_size,
        num_attention_heads=target_config.num_attention_heads,
        num_key_value_heads=getattr(target_config, "num_key_value_heads", target_config.num_attention_heads),
        head_dim=getattr(target_config, "head_dim", None), rms_norm_eps=target_config.rms_norm_eps,
        hidden_act=target_config.hidden_act, max_position_embeddings=target_config.max_position_embeddings,
        rope_parameters=getattr(target_config, "rope_parameters", None), vocab_size=target_config.vocab_size,
        num_hidden_layers=1, tie_word_embeddings=False, architectures=[ARCHITECTURE],
    )
    fields = {k: v for k, v in fields.items() if v is not None}
    config = LlamaConfig(**{**fields, **overrides})
    config.draft_vocab_size = draft_vocab_size
    return config


def save_head(head: Eagle3Head, folder: str | Path) -> Path:
    """Write `head` as a released EAGLE-3 head: config.json and model.safetensors."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = head.config.to_dict()
    config["draft_vocab_size"] = head.config.draft_vocab_size
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    weights = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(weights, str(folder / WEIGHT_FILES[0]))
    return folder


def load_head(folder: str | Path, target, dtype: torch.dtype | None = None) -> Eagle3Head:
    """Read a released EAGLE-3 head (config.json + model.safetensors or pytorch_model.bin) for
    `target` (a causal LM whose embeddings, hidden size and vocabulary it must share). A mismatch
    is one line naming the file and the field."""
    folder = Path(folder)
    config_path = folder / CONFIG_FILE
    try:
        raw = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ModelError(f"EAGLE-3 head {folder}: no {CONFIG_FILE}") from None
    except (OSError, ValueError) as exc:
        raise ModelError(f"{config_path}: cannot read: {one_line(exc)}") from None
    raw.setdefault("draft_vocab_size", raw.get("vocab_size"))
    for field in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size", "draft_vocab_size"):
        if not isinstance(raw.get(field), int) or raw[field] <= 0:
            raise ModelError(f"{config_path}: {field} is {raw.get(field)!r}, expected a positive integer")
    target_hidden = target.config.hidden_size
    if raw.get("target_hidden_size", raw["hidden_size"]) != target_hidden:
        field = "target_hidden_size" if "target_hidden_size" in raw else "hidden_size"
        raise ModelError(f"{config_path}: {field} {raw[field]} does not match the target's hidden size {target_hidden}")
    vocab = target.config.vocab_size
    if raw["vocab_size"] != vocab:
        raise ModelError(f"{config_path}: vocab_size {raw['vocab_size']} does not match the target's vocabulary {vocab}")
    if raw["draft_vocab_size"] > vocab:
        raise ModelError(f"{config_path}: draft_vocab_size {raw['draft_vocab_size']} is larger than vocab_size {vocab}")
    draft_vocab = raw.pop("draft_vocab_size")
    try:
        config = LlamaConfig(**raw)
    except Exception as exc:  # transformers validates rope and shapes with its own error types
        raise ModelError(f"{config_path}: not a Llama head config: {one_line(exc)}") from None
    config.draft_vocab_size = draft_vocab
    if getattr(config, "target_hidden_size", None) is None:
        config.target_hidden_size = target_hidden
    head = Eagle3Head(config, target.get_input_embeddings(), aux_layers(target.config.num_hidden_layers))
    weights_path, weights = _read_weights(folder)
    _fill(head, weights, weights_path)
    return head.to(dtype) if dtype is not None else head


def _read_weights(folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    for name in WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return path, load_file(str(path))
            return path, torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # a truncated or foreign file: safetensors and pickle raise their own types
            raise ModelError(f"{path}: cannot read weights: {one_line(exc)}") from None
    raise ModelError(f"EAGLE-3 head {folder}: no {' or '.join(WEIGHT_FILES)}")


def _fill(head: Eagle3Head, weights: dict[str, torch.Tensor], path: Path) -> None:
    """Copy every released weight into `head`, each checked by name and shape."""
    expected = head.state_dict()
    optional = {"d2t", "t2d"} if head.config.draft_vocab_size == head.config.vocab_size else set()
    weights = dict(weights)
    embed = weights.pop("embed_tokens.weight", None)
    for key in sorted(set(weights) - set(expected)):
        raise ModelError(f"{path}: unexpected weight {key} (an EAGLE-3 head has fc, midlayer.*, norm, lm_head, d2t, t2d)")
    for key in sorted(set(expected) - set(weights) - optional):
        raise ModelError(f"{path}: missing weight {key}")
    for key, value in weights.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ModelError(f"{path}: {key} has shape {list(value.shape)}, expected {list(expected[key].shape)} from config.json")
    with torch.no_grad():
        for key, value in weights.items():
            expected[key].copy_(value.to(expected[key].dtype))
    if embed is not None:
        shape = list(head._target_embed[0].weight.shape)
        if list(embed.shape) != shape:
            raise ModelError(f"{path}: embed_tokens.weight has shape {list(embed.shape)}, expected {shape}")
        head.embed_tokens = nn.Embedding.from_pretrained(embed.float(), freeze=True)
    targets = head.target_ids()
    if targets.min() < 0 or targets.max() >= head.config.vocab_size:
        raise ModelError(f"{path}: d2t maps draft ids outside the target's vocabulary of {head.config.vocab_size}")

