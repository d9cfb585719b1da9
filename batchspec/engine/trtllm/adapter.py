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

import importlib
import time
from dataclasses import dataclass
from typing import Any, Sequence

from batchspec.engine.base import (
    ENGINE_METHODS,
    Completion,
    GenerateResult,
    Request,
    SpecConfig,
    Timing,
)
from batchspec.engine.trtllm.memory import (
    DEFAULT_FREE_GPU_MEMORY_FRACTION,
    model_size,
    plan_draft_memory,
)
from batchspec.engine.trtllm.translate import (
    NESTED_CLASSES,
    IterationSpecStats,
    completion_from_output,
    llm_kwargs,
    sampling_kwargs,
    stats_from_iterations,
)
from batchspec.engine.trtllm.translate import (
    llm_options as arm_llm_options,
)
from batchspec.errors import ConfigError, EngineUnavailable, one_line

INSTALL_HINT = (
    "pip install tensorrt_llm==1.2.* --extra-index-url https://pypi.nvidia.com "
    "(or use NVIDIA's TensorRT-LLM release container)"
)


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
        if spec.method not in ENGINE_METHODS[self.name]:
            raise ConfigError(f"{spec.source or 'spec'}: {spec.method} is not supported by the trtllm engine")

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
                futures.append(Completion.failed(request.id, one_line(exc)))
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
            return Completion.failed(request.id, one_line(exc))


def locate_model(name: str) -> str:
    """A model location TensorRT-LLM can load: registry names and fsspec URLs become local
    folders through batchspec.models; local folders and Hugging Face ids pass unchanged."""
    from batchspec.models import REGISTRY, resolve_model

    if name in REGISTRY or "://" in name:
        return str(resolve_model(name))
    return name
