"""TensorRT-LLM's vocabulary, and pure translation between it and batchspec's engine contract.

Everything here is plain Python over plain values, so it runs (and is tested) on machines without
TensorRT-LLM: the decoding-config key tables the option-file validator checks against, what
`SpecConfig.options` holds split back into speculative and LLM arguments, `LLM(...)` and
`SamplingParams(...)` keyword arguments, and the parsing of `RequestOutput`s and iteration stats.
See adapter.py's docstring for the sources each rule comes from.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Sequence

from batchspec.engine.base import Completion, Request, SamplingParams, SpecConfig, thaw

# decoding_type (as written in TensorRT-LLM option files) -> batchspec method name
DECODING_TYPES = {"Eagle3": "eagle3", "DraftTarget": "draft_target", "NGram": "ngram", "MTP": "mtp"}
METHOD_TO_DECODING_TYPE = {method: name for name, method in DECODING_TYPES.items()}

# speculative_config fields accepted per decoding_type, from tensorrt_llm/llmapi/llm_args.py
# (NVIDIA/TensorRT-LLM, read at commit 0004396720054fd8e205cbf616f21f0b57c6b412, plus the 1.2-era
# names `speculative_model_dir` and `acceptance_window`).
_BASE_KEYS = (
    "decoding_type", "max_draft_len", "max_total_draft_tokens", "speculative_model",
    "speculative_model_dir", "max_concurrency", "draft_len_schedule", "load_format",
    "acceptance_window", "acceptance_rate_window_size", "acceptance_rate_threshold",
    "use_rejection_sampling", "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty",
)
_EAGLE_KEYS = (
    "eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree",
    "dynamic_tree_max_topK", "num_eagle_layers", "max_non_leaves_per_layer", "eagle3_one_model",
    "eagle3_layers_to_capture", "eagle3_model_arch", "sa_config", "use_sa_spec", "sa_spec_threshold",
)
_NGRAM_KEYS = ("max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool")
_MTP_KEYS = (
    "num_nextn_predict_layers", "use_relaxed_acceptance_for_thinking", "relaxed_topk",
    "relaxed_delta", "use_mtp_vanilla", "mtp_eagle_one_model", "use_dynamic_tree",
    "dynamic_tree_max_topK", "sa_config", "use_sa_spec", "sa_spec_threshold",
    "begin_thinking_phase_token", "end_thinking_phase_token",
)
SPEC_KEYS = {
    "NGram": _BASE_KEYS + _NGRAM_KEYS,
    "DraftTarget": _BASE_KEYS,
    "Eagle3": _BASE_KEYS + _EAGLE_KEYS,
    "MTP": _BASE_KEYS + _MTP_KEYS,
}
NGRAM_SIZE_DEFAULT = 2  # NGramDecodingConfig.max_matching_ngram_size default in llm_args.py

SPEC_PREFIX = "speculative_config."  # SpecConfig.options keys from the speculative_config block

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


def spec_options(spec: SpecConfig) -> dict[str, Any]:
    """The speculative_config fields not lifted into SpecConfig's attributes, as plain values."""
    return {k[len(SPEC_PREFIX):]: thaw(v) for k, v in spec.options if k.startswith(SPEC_PREFIX)}


def llm_options(spec: SpecConfig) -> dict[str, Any]:
    """The top-level LLM arguments of the arm's source file, as plain values."""
    return {k: thaw(v) for k, v in spec.options if not k.startswith(SPEC_PREFIX)}


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
        assert spec.draft_model is not None, spec  # validated by config/spec.py
        kwargs["speculative_model_dir"] = spec.draft_model
    if spec.method == "ngram":
        kwargs["max_matching_ngram_size"] = spec.ngram_size
    return DecodingConfigSpec(DECODING_CLASSES[decoding_type], kwargs)


def llm_kwargs(model: str, spec: SpecConfig, base_options: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """Keyword arguments for `tensorrt_llm.LLM` running `spec` at `batch_size`.

    `base_options` are the engine's base LLM arguments (for example from trt_configs/none.yaml);
    the arm's own file overrides them. batchspec always turns on iteration stats (its acceptance
    figures come from them) and raises max_batch_size to at least the production batch size.
    """
    kwargs: dict[str, Any] = {"model": model, **base_options, **llm_options(spec)}
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
