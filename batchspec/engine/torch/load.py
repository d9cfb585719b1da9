"""Loading for the torch engine: a target or draft model folder (or registry name, or URL) into a
causal LM and its tokenizer, and the check that a draft shares the target's tokenizer."""

from __future__ import annotations

import torch

from batchspec.engine.base import DTYPES
from batchspec.engine.torch.linear import FormsCache, measure_linears
from batchspec.errors import ConfigError, ModelError, one_line

TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}


def load_pretrained(name: str, dtype: str, device: str, linear_forms: bool = True):
    """(model, tokenizer) for a registry name, a model folder or an fsspec URL: the model in eval
    mode with gradients off, on `device` (cpu, cuda or cuda:N). On a CPU, with `linear_forms`, each
    linear layer computes its product in the form measured faster here (linear.measure_linears;
    the timings are kept in $BATCHSPEC_CACHE/linear_forms for the next load on this machine)."""
    if dtype not in TORCH_DTYPES:
        raise ConfigError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    if not (device == "cpu" or device.startswith("cuda")):
        raise ModelError(f"device {device!r} is not cpu or cuda[:N]")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f"device {device} requested but CUDA is not available here")
    from batchspec import models

    path = models.resolve_model(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=TORCH_DTYPES[dtype], attn_implementation="sdpa")
    except (OSError, ValueError) as exc:
        raise ModelError(f"model {name!r}: cannot load from {path}: {one_line(exc)}") from exc
    model = model.to(device).eval().requires_grad_(False)
    if linear_forms:
        measure_linears(model, cache=FormsCache(models.cache_root() / "linear_forms"))
    return model, tokenizer



def check_same_tokenizer(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """A draft must map text to the same ids as the target, or its proposals mean nothing."""
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv != dv:
        differ = len(set(tv.items()) ^ set(dv.items()))
        raise ModelError(
            f"draft model {draft_name!r} has a different tokenizer from target {target_name!r} "
            f"(vocab sizes {len(dv)} vs {len(tv)}, {differ} entries differ); pick a draft of the same family"
        )
