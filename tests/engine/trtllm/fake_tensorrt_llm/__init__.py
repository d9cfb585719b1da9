"""A stand-in `tensorrt_llm` (1.2 LLM API, PyTorch backend) for tests on machines without it.

Written from TensorRT-LLM's source (see SOURCES.md for every file read and what was taken from
it); not a copy of its code. It simulates the GPUs a process sees (one, or a Ray actor's several), a clock,
and deterministic toy models, and behaves as the cited source does where an adapter can go wrong:
memory held until shutdown() and given back only some device queries after it returns,
`get_stats(timeout)` that waits for silence and then latches until the next request, stats
relayed late and bounded by max_stats_len between polls, tokenized stop strings cut from
token_ids and not from the stats, max_tokens capped at max_seq_len and long prompts refused, one
sampling generator for every request (seeds ignored), the end token counted in
numGeneratedTokens, BOS added to text prompts, one-model speculation greedy without
allow_advanced_sampling, one-model draft latency not reported, NGram draft counts as really
proposed, MTP draft length from num_nextn_predict_layers, config classes that refuse unknown keys.
Where `import tensorrt_llm` would fail without a GPU, shim/ does (BATCHSPEC_STANDIN_NO_GPU=1).

`install(monkeypatch, ...)` puts it in sys.modules as `tensorrt_llm` (and patches
torch.cuda.mem_get_info to the simulated GPU) for one test.
"""

from __future__ import annotations

import sys

from . import _sim, llm_args, llmapi, sampling_params  # noqa: F401
from ._sim import GIB, FakeModel, reset  # noqa: F401
from .llm import LLM  # noqa: F401
from .sampling_params import SamplingParams  # noqa: F401

__version__ = "1.2.0+batchspec.standin"


def mem_get_info(device=None) -> tuple[int, int]:
    """torch.cuda.mem_get_info over the simulated GPUs (device: None for the first, an index, or 'cuda:N')."""
    if device is None:
        index = 0
    elif isinstance(device, int):
        index = device
    else:
        index = int(str(device).partition(":")[2] or 0)
    return _sim.STATE.gpus[index].mem_get_info()


def state() -> _sim.State:
    return _sim.STATE


def install(monkeypatch, gpu_bytes: int = 80 * GIB, build_seconds: float = 0.0, gpus: int = 1,
            release_queries: int = 2) -> _sim.State:
    """Make `import tensorrt_llm` give this stand-in for the current test, on `gpus` fresh GPUs."""
    import torch

    this = sys.modules[__name__]
    monkeypatch.setitem(sys.modules, "tensorrt_llm", this)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", llmapi)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi.llm_args", llm_args)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.sampling_params", sampling_params)
    st = reset(gpu_bytes, build_seconds, gpus, release_queries)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    return st
