"""Memory planning for TensorRT-LLM arms: whether a Draft_Target arm's draft weights and KV cache
fit next to the target under `kv_cache_config.free_gpu_memory_fraction`, else a shorter draft or
none. Planned per GPU: an LLM across N GPUs (tensor x pipeline parallel) holds about 1/N of the
weights and of each token's KV cache on each of them, and takes the fraction of each one's free
memory."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_FREE_GPU_MEMORY_FRACTION = 0.9  # KvCacheConfig.free_gpu_memory_fraction default

@dataclass(frozen=True)
class ModelSize:
    """What a model costs on the GPU: weights, and KV cache per token of context."""

    weight_bytes: int
    kv_bytes_per_token: int


@dataclass(frozen=True)
class MemoryPlan:
    draft_len: int  # 0: run without speculation
    reason: str | None = None  # set when the plan differs from what was asked


def plan_draft_memory(
    free_bytes: int, target: ModelSize, draft: ModelSize, *, fraction: float,
    batch_size: int, max_seq_len: int, draft_len: int, gpus: int = 1,
) -> MemoryPlan:
    """Fit a Draft_Target arm on `gpus` GPUs, each with `free_bytes` free before anything is loaded.

    TensorRT-LLM loads both models' weights, then gives `fraction` of the remaining free memory to
    the KV cache, which holds both models' KV for every sequence, each reserving max_seq_len plus
    draft_len slots; across `gpus` GPUs each holds its share of both. Keep `draft_len` if that fits;
    else the longest shorter draft that does; else none (the target alone, with all of the KV
    budget), with the reason.
    """
    kv_budget = fraction * (free_bytes - (target.weight_bytes + draft.weight_bytes) / gpus)
    per_token = (target.kv_bytes_per_token + draft.kv_bytes_per_token) / gpus

    def needed(k: int) -> float:
        return batch_size * (max_seq_len + k) * per_token

    for k in range(draft_len, 0, -1):
        if kv_budget >= needed(k):
            if k == draft_len:
                return MemoryPlan(draft_len)
            return MemoryPlan(k, f"draft_len {draft_len} does not fit next to the draft model's memory; using {k}")
    gib = 2**30
    return MemoryPlan(0, (
        f"draft model does not fit: needs {(draft.weight_bytes / gpus + needed(1)) / gib:.1f} GiB of weights and KV cache "
        f"per GPU beside the target, {max(kv_budget, 0) / gib:.1f} GiB of KV budget left; running without speculation"
    ))


def model_size(model_dir: str | os.PathLike, dtype_bytes: int = 2) -> ModelSize | None:
    """Weights (sum of *.safetensors) and KV bytes per token (config.json) of a local model
    folder; None when it is not a local folder (a hub id TensorRT-LLM downloads itself)."""
    folder = Path(model_dir)
    config_path = folder / "config.json"
    if not config_path.is_file():
        return None
    config = json.loads(config_path.read_text())
    config = config.get("text_config", config)
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    return ModelSize(weights, 2 * layers * kv_heads * head_dim * dtype_bytes)


def free_gpu_bytes() -> int:
    """Free memory on this worker's first GPU now (torch.cuda.mem_get_info); the worker's GPUs
    start alike, each empty."""
    import torch

    return int(torch.cuda.mem_get_info()[0])


def gpu_memory(gpus: int) -> list[tuple[int, int]]:
    """(free, total) bytes of each of this worker's first `gpus` GPUs now (torch.cuda.mem_get_info,
    a query of the device: it sees memory other processes hold)."""
    import torch

    return [tuple(int(x) for x in torch.cuda.mem_get_info(i)) for i in range(gpus)]  # type: ignore[misc]


def memory_back(baseline: list[tuple[int, int]], *, clock, sleep, limit_s: float, first_s: float = 0.05) -> float:
    """Wait until each GPU shows as much free as `baseline` (less 2% of it, at least 512 MiB, for
    what the process's own CUDA context and allocator move), polling with a growing interval; the
    seconds it took by `clock`. Past `limit_s` seconds of waiting: EngineUnavailable, one line."""
    from batchspec.errors import EngineUnavailable

    began, waited, interval = clock(), 0.0, first_s
    while True:
        now = gpu_memory(len(baseline))
        short = [(i, free, before) for i, ((free, _), (before, total)) in enumerate(zip(now, baseline))
                 if free < before - max(512 * 2**20, total // 50)]
        if not short:
            return clock() - began
        if waited >= limit_s:
            i, free, before = short[0]
            raise EngineUnavailable(
                f"GPU memory of the last LLM not back after its shutdown(): waited {waited:.1f} s; GPU {i} shows "
                f"{free / 2**30:.1f} GiB free, {before / 2**30:.1f} GiB before the first build (is another process holding it?)")
        sleep(interval)
        waited += interval
        interval = min(2 * interval, 1.0)


def release_gpu_memory() -> None:
    """After an LLM's shutdown(): drop Python references and return cached blocks to the driver, so
    the next build (and its memory plan) sees the GPU as empty as it is."""
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # no CUDA here (tests over the stand-in): nothing cached to return
        pass
