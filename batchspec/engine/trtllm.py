"""The TensorRT-LLM engine: a thin adapter over `tensorrt_llm.LLM` (1.2 LLM API, PyTorch backend).

This module owns the translation between batchspec's engine contract (batchspec/engine/base.py)
and TensorRT-LLM, and nothing else: no sampling, no drafting, no acceptance rule of its own. The
translation is pure functions kept apart from the library calls, so it is tested on machines
without TensorRT-LLM (which cannot be installed on this project's machines):

- `llm_kwargs`: a SpecConfig arm + its file's LLM arguments -> `LLM(...)` keyword arguments, with
  the speculative config kept as a `DecodingConfigSpec` (class name + kwargs) until the adapter
  builds the real object.
- `sampling_kwargs`: our SamplingParams -> `tensorrt_llm.SamplingParams(...)` keyword arguments.
- `completion_from_output`: a `RequestOutput` -> our Completion. Per-request acceptance comes from
  `decoding_iter` (tensorrt_llm/executor/result.py, GenerationResultBase.decoding_iter, set from
  the executor Result's `decodingIter`, which cpp/include/tensorrt_llm/executor/types.h defines as
  "the number of decoding iterations ... in autoregressive decoding equal to the maximum length of
  the beam"): it counts the context (prefill) step, which yields one token, and every decode step
  yields accepted + 1 tokens, so accepted = len(token_ids) - decoding_iter and target steps
  (prefill excluded) = decoding_iter - 1. Proposed draft tokens per request are not reported by
  TensorRT-LLM; we record draft_len * target_steps, an upper bound (exact for Eagle3 and
  DraftTarget, which always propose max_draft_len; NGram may propose fewer). In 1.2 the
  per-request `request_perf_metrics.speculative_decoding` numbers are zero with the default
  sampler, which is why they are not used.
- `stats_from_iterations`: `llm.get_stats()` per-iteration dicts -> exact shard-level counts from
  their `specDecodingStats` (numDraftTokens, numAcceptedTokens, numRequestsWithDraftTokens,
  acceptanceLength, iterLatencyMS, draftOverhead: cpp/include/tensorrt_llm/executor/executor.h
  struct SpecDecodingStats; keys as asserted by tests/unittest/_torch/speculative/test_eagle3.py
  test_eagle3_spec_decoding_stats).
- `plan_draft_memory`: whether a DraftTarget arm's draft weights and KV cache fit next to the
  target under `kv_cache_config.free_gpu_memory_fraction`, else a shorter draft or none.

`TrtllmEngine` holds one `LLM` per arm (switching arms means building another LLM), records each
build's seconds so calibration can count them as cost, and shuts every LLM down on `close()`.
Nothing of this module's library-facing half has been run against real TensorRT-LLM here; run
`python jobs/gpu_check.py` on a GPU node to check it.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from batchspec.engine.base import (
    Completion,
    GenerateResult,
    Request,
    SamplingParams,
    SpecConfig,
    Timing,
)
from batchspec.errors import EngineUnavailable
from batchspec.spec_config import (
    METHOD_TO_DECODING_TYPE,
    check_engine_supports,
    llm_options as arm_llm_options,
    spec_options,
)

INSTALL_HINT = (
    "pip install tensorrt_llm==1.2.* --extra-index-url https://pypi.nvidia.com "
    "(or use NVIDIA's TensorRT-LLM release container)"
)

# decoding_type -> the LLM-API class (tensorrt_llm.llmapi) that takes its fields
DECODING_CLASSES = {
    "Eagle3": "Eagle3DecodingConfig",
    "DraftTarget": "DraftTargetDecodingConfig",
    "NGram": "NGramDecodingConfig",
    "MTP": "MTPDecodingConfig",
}
# nested LLM arguments that are config classes in tensorrt_llm.llmapi
NESTED_CLASSES = {"kv_cache_config": "KvCacheConfig", "cuda_graph_config": "CudaGraphConfig"}
# CompletionOutput.finish_reason (tensorrt_llm/executor/result.py) -> ours
FINISH_REASONS = {"stop": "stop", "length": "length", None: "length"}
DEFAULT_FREE_GPU_MEMORY_FRACTION = 0.9  # KvCacheConfig.free_gpu_memory_fraction default


def require_trtllm():
    """Import tensorrt_llm, or raise EngineUnavailable with one line saying how to get it."""
    try:
        return importlib.import_module("tensorrt_llm")
    except Exception as exc:  # ImportError, or CUDA/driver errors raised while it imports
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise EngineUnavailable(
            f"engine trtllm needs tensorrt_llm (TensorRT-LLM 1.2) on a GPU node: {INSTALL_HINT}; "
            f"not importable here: {reason}"
        ) from None


# ---------------------------------------------------------------------------------------------
# Pure translation


@dataclass(frozen=True)
class DecodingConfigSpec:
    """A speculative config not yet built: `tensorrt_llm.llmapi.<class_name>(**kwargs)`."""

    class_name: str
    kwargs: dict[str, Any]


def decoding_config_spec(spec: SpecConfig) -> DecodingConfigSpec | None:
    if spec.method == "none":
        return None
    decoding_type = METHOD_TO_DECODING_TYPE[spec.method]
    kwargs: dict[str, Any] = {"max_draft_len": spec.draft_len, **spec_options(spec)}
    if spec.method in ("draft_target", "eagle3"):
        assert spec.draft_model is not None, spec  # validated by spec_config
        kwargs["speculative_model_dir"] = spec.draft_model
    if spec.method == "ngram":
        kwargs["max_matching_ngram_size"] = spec.ngram_size
    return DecodingConfigSpec(DECODING_CLASSES[decoding_type], kwargs)


def llm_kwargs(model: str, spec: SpecConfig, llm_options: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """Keyword arguments for `tensorrt_llm.LLM` running `spec` at `batch_size`.

    `llm_options` are the engine's base LLM arguments (for example from trt_configs/none.yaml);
    the arm's own file overrides them. batchspec always turns on iteration stats (its acceptance
    figures come from them) and raises max_batch_size to at least the production batch size.
    """
    kwargs: dict[str, Any] = {"model": model, **llm_options, **arm_llm_options(spec)}
    kwargs["max_batch_size"] = max(batch_size, kwargs.get("max_batch_size") or 0)
    kwargs["enable_iter_perf_stats"] = True
    kwargs["speculative_config"] = decoding_config_spec(spec)
    return kwargs


def sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """Keyword arguments for `tensorrt_llm.SamplingParams` (tensorrt_llm/sampling_params.py)."""
    kwargs: dict[str, Any] = {
        "max_tokens": params.max_tokens,
        "temperature": 0.0 if params.greedy else params.temperature,
        "return_perf_metrics": True,
    }
    if not params.greedy:
        kwargs["top_p"] = params.top_p
    if params.seed is not None:
        kwargs["seed"] = params.seed
    if params.stop:
        kwargs["stop"] = list(params.stop)
    return kwargs


def completion_from_output(request: Request, output: Any, draft_len: int = 0) -> Completion:
    """Map one `RequestOutput` (attributes: prompt_token_ids, outputs[0].text / token_ids /
    finish_reason, decoding_iter) to a Completion; see the module docstring for the counts."""
    out = output.outputs[0]
    token_ids = list(out.token_ids or [])
    prompt_tokens = len(output.prompt_token_ids or [])
    if out.finish_reason not in FINISH_REASONS:  # 'timeout' or 'cancelled'
        return Completion.failed(request.id, f"TensorRT-LLM finished the request with '{out.finish_reason}'", prompt_tokens)
    n = len(token_ids)
    iterations = int(getattr(output, "decoding_iter", 0) or 0)
    if iterations <= 0:  # not reported: count plain decoding, claim no speculation
        steps, proposed, accepted = max(n - 1, 0), 0, 0
    else:
        steps = iterations - 1
        proposed = draft_len * steps
        accepted = min(max(n - iterations, 0), proposed)
    return Completion(
        id=request.id,
        text=out.text,
        token_ids=token_ids,
        prompt_tokens=prompt_tokens,
        output_tokens=n,
        finish_reason=FINISH_REASONS[out.finish_reason],
        draft_tokens=proposed,
        accepted_tokens=accepted,
        target_steps=steps,
    )


@dataclass
class IterationSpecStats:
    """Shard-level speculative figures summed over `llm.get_stats()` iterations. Merges with `+`."""

    iterations: int = 0
    spec_iterations: int = 0  # iterations that proposed at least one draft token
    draft_tokens: int = 0
    accepted_tokens: int = 0
    requests_with_drafts: int = 0  # summed per iteration: request-steps that speculated
    iter_latency_s: float = 0.0
    draft_latency_s: float = 0.0  # specDecodingStats.iterLatencyMS: drafting part of each step

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_accepted_len(self) -> float | None:
        """Tokens committed per speculative request-step, bonus included (TensorRT-LLM's
        acceptanceLength, as its tests compute it: (accepted + requests) / requests)."""
        n = self.requests_with_drafts
        return (self.accepted_tokens + n) / n if n else None

    def __add__(self, other: "IterationSpecStats") -> "IterationSpecStats":
        return IterationSpecStats(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


def stats_from_iterations(entries: Sequence[Any]) -> IterationSpecStats:
    """Sum `llm.get_stats()` entries: dicts, or JSON strings in older releases (its docstring)."""
    stats = IterationSpecStats()
    for entry in entries:
        it = json.loads(entry) if isinstance(entry, str) else entry
        stats.iterations += 1
        stats.iter_latency_s += float(it.get("iterLatencyMS") or 0.0) / 1000
        spec = it.get("specDecodingStats") or {}
        drafted = int(spec.get("numDraftTokens") or 0)
        if drafted <= 0:
            continue
        stats.spec_iterations += 1
        stats.draft_tokens += drafted
        stats.accepted_tokens += int(spec.get("numAcceptedTokens") or 0)
        stats.requests_with_drafts += int(spec.get("numRequestsWithDraftTokens") or 0)
        stats.draft_latency_s += float(spec.get("iterLatencyMS") or 0.0) / 1000
    return stats


# ---------------------------------------------------------------------------------------------
# Memory planning for DraftTarget


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
    batch_size: int, max_seq_len: int, draft_len: int,
) -> MemoryPlan:
    """Fit a DraftTarget arm on a GPU with `free_bytes` free before anything is loaded.

    TensorRT-LLM loads both models' weights, then gives `fraction` of the remaining free memory to
    the KV cache, which holds both models' KV for every sequence, each reserving max_seq_len plus
    draft_len slots. Keep `draft_len` if that fits; else the longest shorter draft that does; else
    none (the target alone, with all of the KV budget), with the reason.
    """
    kv_budget = fraction * (free_bytes - target.weight_bytes - draft.weight_bytes)
    per_token = target.kv_bytes_per_token + draft.kv_bytes_per_token

    def needed(k: int) -> float:
        return batch_size * (max_seq_len + k) * per_token

    for k in range(draft_len, 0, -1):
        if kv_budget >= needed(k):
            if k == draft_len:
                return MemoryPlan(draft_len)
            return MemoryPlan(k, f"draft_len {draft_len} does not fit next to the draft model's memory; using {k}")
    gib = 2**30
    return MemoryPlan(0, (
        f"draft model does not fit: needs {(draft.weight_bytes + needed(1)) / gib:.1f} GiB of weights and KV cache "
        f"beside the target, {max(kv_budget, 0) / gib:.1f} GiB of KV budget left; running without speculation"
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


# ---------------------------------------------------------------------------------------------
# The adapter (needs tensorrt_llm and a GPU)


@dataclass
class BuildRecord:
    """One LLM built for an arm: how long it took, and any memory fallback applied."""

    label: str
    seconds: float
    ran_as: str  # the label actually built (differs after a memory fallback)
    reason: str | None = None


@dataclass
class _Built:
    llm: Any
    spec: SpecConfig  # what the LLM actually runs


class TrtllmEngine:
    """The `Engine` protocol over `tensorrt_llm.LLM`; one instance per worker (one GPU)."""

    name = "trtllm"

    def __init__(self, model: str, llm_options: dict[str, Any] | None = None, *, stats_timeout_s: float = 2.0):
        self._trtllm = require_trtllm()
        self.model_name = model
        self.llm_options = dict(llm_options or {})
        self.stats_timeout_s = stats_timeout_s
        self.builds: list[BuildRecord] = []
        self.last_iteration_stats = IterationSpecStats()
        self._cache: dict[tuple, _Built] = {}

    def check(self, spec: SpecConfig) -> None:
        check_engine_supports(spec, self.name)

    def generate(self, requests: Sequence[Request], spec: SpecConfig, batch_size: int) -> GenerateResult:
        built = self._llm_for(spec, batch_size)
        llm, params = built.llm, self._trtllm.SamplingParams
        start = time.perf_counter()
        futures: list[Any] = []
        for request in requests:
            try:
                prompt = self._prompt(llm, request)
                futures.append(llm.generate_async(prompt, params(**sampling_kwargs(request.params))))
            except Exception as exc:  # a bad row (empty, too long) fails alone
                futures.append(Completion.failed(request.id, _one_line(exc)))
        completions = [self._collect(request, f, built.spec.draft_len) for request, f in zip(requests, futures)]
        wall = time.perf_counter() - start
        self.last_iteration_stats = stats_from_iterations(llm.get_stats(timeout=self.stats_timeout_s))
        draft_s = min(self.last_iteration_stats.draft_latency_s, wall)
        return GenerateResult(completions, Timing(draft_s=draft_s, verify_s=wall - draft_s, wall_s=wall))

    def build_seconds(self, spec: SpecConfig) -> float:
        """Seconds spent building the LLM(s) for `spec`'s label (calibration counts them as cost)."""
        return sum(b.seconds for b in self.builds if b.label == spec.label)

    def close(self) -> None:
        for built in self._cache.values():
            built.llm.shutdown()
        self._cache.clear()

    # -- helpers ------------------------------------------------------------------------------

    def _llm_for(self, spec: SpecConfig, batch_size: int) -> _Built:
        key = (spec, batch_size)
        if key not in self._cache:
            start = time.perf_counter()
            effective, reason = self._fit_memory(spec, batch_size)
            llm = self._build(llm_kwargs(self.model_name, effective, self.llm_options, batch_size))
            self.builds.append(BuildRecord(spec.label, time.perf_counter() - start, effective.label, reason))
            self._cache[key] = _Built(llm, effective)
        return self._cache[key]

    def _build(self, kwargs: dict[str, Any]) -> Any:
        llmapi = importlib.import_module("tensorrt_llm.llmapi")
        kwargs["model"] = locate_model(kwargs["model"])
        decoding = kwargs.pop("speculative_config")
        if decoding is not None:
            cls = getattr(llmapi, decoding.class_name, None)
            if cls is None and decoding.class_name == "Eagle3DecodingConfig":  # releases before Eagle3DecodingConfig
                cls, decoding.kwargs["decoding_type"] = llmapi.EagleDecodingConfig, "Eagle3"
            if "speculative_model_dir" in decoding.kwargs:
                decoding.kwargs["speculative_model_dir"] = locate_model(decoding.kwargs["speculative_model_dir"])
            kwargs["speculative_config"] = cls(**decoding.kwargs)
        for key, class_name in NESTED_CLASSES.items():
            if isinstance(kwargs.get(key), dict):
                kwargs[key] = getattr(llmapi, class_name)(**kwargs[key])
        return self._trtllm.LLM(**kwargs)

    def _fit_memory(self, spec: SpecConfig, batch_size: int) -> tuple[SpecConfig, str | None]:
        if spec.method != "draft_target":
            return spec, None
        target, draft = model_size(locate_model(self.model_name)), model_size(locate_model(spec.draft_model or ""))
        if target is None or draft is None:
            return spec, None  # hub ids: sizes unknown before TensorRT-LLM downloads them
        import torch

        options = {**self.llm_options, **arm_llm_options(spec)}
        fraction = (options.get("kv_cache_config") or {}).get("free_gpu_memory_fraction", DEFAULT_FREE_GPU_MEMORY_FRACTION)
        plan = plan_draft_memory(
            torch.cuda.mem_get_info()[0], target, draft, fraction=fraction, batch_size=batch_size,
            max_seq_len=int(options.get("max_seq_len") or 4096), draft_len=spec.draft_len,
        )
        if plan.draft_len == spec.draft_len:
            return spec, None
        if plan.draft_len == 0:
            return SpecConfig(options=tuple((k, v) for k, v in spec.options if not k.startswith("speculative_config.")), source=spec.source), plan.reason
        return spec.with_draft_len(plan.draft_len), plan.reason

    @staticmethod
    def _prompt(llm: Any, request: Request) -> str | list[int]:
        if request.prompt_token_ids is not None:  # generate_async takes token ids as a prompt too
            if not request.prompt_token_ids:
                raise ValueError("empty prompt_token_ids")
            return list(request.prompt_token_ids)
        if request.messages is not None:
            return llm.tokenizer.apply_chat_template(list(request.messages), tokenize=False, add_generation_prompt=True)
        if not request.prompt:
            raise ValueError("empty prompt")
        return request.prompt

    @staticmethod
    def _collect(request: Request, future: Any, draft_len: int) -> Completion:
        if isinstance(future, Completion):
            return future
        try:
            return completion_from_output(request, future.result(), draft_len)
        except Exception as exc:
            return Completion.failed(request.id, _one_line(exc))


def locate_model(name: str) -> str:
    """A model location TensorRT-LLM can load: registry names and fsspec URLs become local
    folders through batchspec.models; local folders and Hugging Face ids pass unchanged."""
    from batchspec.models import REGISTRY, resolve_model

    if name in REGISTRY or "://" in name:
        return str(resolve_model(name))
    return name


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
