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

from batchspec.engine.base import (
    Completion,
    Request,
    SamplingParams,
    SpecConfig,
    acceptance_rate,
    thaw,
)

# decoding_type (as written in TensorRT-LLM option files) -> batchspec method name
DECODING_TYPES = {"Eagle3": "eagle3", "DraftTarget": "draft_target", "NGram": "ngram", "MTP": "mtp", "Suffix": "suffix"}
METHOD_TO_DECODING_TYPE = {method: name for name, method in DECODING_TYPES.items()}
# `Suffix` is batchspec's own decoding_type, not TensorRT-LLM's: suffix drafting over the finished
# rows of a shard key (vLLM's `method: suffix`, SuffixDecoding), run by the torch engine only.
# TensorRT-LLM 1.2 has nothing like it (L12 has no suffix or SA decoding config; main's
# SADecodingConfig, decoding_type "SA", came later): docs/suffix.md. Refused for trtllm at the edge:
TRTLLM_REFUSED_METHODS = {
    "suffix": "TensorRT-LLM 1.2 has no suffix drafting (its SA decoding came after 1.2); the nearest it offers "
              "is NGram with is_public_pool: true (one n-gram pool shared by every request of the LLM)",
}

# Pinned to one release: TensorRT-LLM 1.2 (tensorrt_llm/llmapi/llm_args.py, the 1.2-era copy cited
# in tests/engine/trtllm/fake_tensorrt_llm/SOURCES.md as L12). speculative_config fields per
# decoding_type, exactly as 1.2's pydantic classes declare them (they refuse any other key):
# DecodingBaseConfig (L12 ~24,200), EagleDecodingConfig (~33,900), NGramDecodingConfig (~45,900),
# DraftTargetDecodingConfig (~47,300), MTPDecodingConfig (~47,900). `speculative_model_dir` is
# 1.2's validation alias of `speculative_model`. Main-branch fields (acceptance_rate_window_size,
# acceptance_rate_threshold, use_rejection_sampling, advanced_sampling_mode, enable_penalty,
# sa_config, use_sa_spec, sa_spec_threshold) are refused: 1.2 rejects them.
TRTLLM_RELEASE = "1.2"
_BASE_KEYS = (
    "decoding_type", "max_draft_len", "max_total_draft_tokens", "speculative_model",
    "speculative_model_dir", "max_concurrency", "draft_len_schedule", "load_format",
    "acceptance_window", "acceptance_length_threshold", "allow_advanced_sampling",
)
_EAGLE_KEYS = (
    "eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree",
    "dynamic_tree_max_topK", "num_eagle_layers", "max_non_leaves_per_layer", "eagle3_one_model",
    "eagle3_layers_to_capture", "eagle3_model_arch",
)
_NGRAM_KEYS = ("max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool")
_MTP_KEYS = (
    "num_nextn_predict_layers", "use_relaxed_acceptance_for_thinking", "relaxed_topk",
    "relaxed_delta", "use_mtp_vanilla", "mtp_eagle_one_model",
    "begin_thinking_phase_token", "end_thinking_phase_token",
)
_SUFFIX_KEYS = ("decoding_type", "max_draft_len", "max_spec_factor", "min_token_prob")  # SuffixDecoding's names
SPEC_KEYS = {
    "Suffix": _SUFFIX_KEYS,
    "NGram": _BASE_KEYS + _NGRAM_KEYS,
    "DraftTarget": _BASE_KEYS,
    "Eagle3": _BASE_KEYS + _EAGLE_KEYS,
    "MTP": _BASE_KEYS + _MTP_KEYS,
}
# Top-level LLM arguments (1.2 BaseLlmArgs/TorchLlmArgs, PyTorch backend) an option file may set
# for batchspec's adapter. Anything else is refused at validation: it is either not a 1.2 argument
# (1.2 would refuse it when the first LLM is built, on the GPU node) or one the adapter owns.
LLM_ARGS = (
    "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code", "dtype", "revision",
    "tokenizer_revision", "max_batch_size", "max_num_tokens", "max_seq_len", "max_input_len",
    "max_beam_width", "kv_cache_config", "cuda_graph_config", "disable_overlap_scheduler",
    "enable_chunked_prefill", "enable_attention_dp", "enable_iter_perf_stats", "enable_iter_req_stats",
    "print_iter_log", "attn_backend", "sampler_type", "moe_config", "scheduler_config",
    "peft_cache_config", "load_format", "enable_autotuner", "stream_interval", "num_postprocess_workers",
    "garbage_collection_gen0_threshold", "batch_wait_timeout_ms", "torch_compile_config",
    "enable_min_latency", "quant_config", "max_stats_len",
)
# Arguments the adapter owns or cannot honour (one GPU per worker, the PyTorch backend).
LLM_ARGS_REFUSED = {
    "model": "the target model is not part of an option file; pass it with --model",
    "speculative_model": "belongs inside speculative_config",
    "backend": "batchspec's adapter runs TensorRT-LLM's PyTorch backend only",
    "tensor_parallel_size": "one GPU per worker: batchspec runs one LLM per GPU",
    "pipeline_parallel_size": "one GPU per worker: batchspec runs one LLM per GPU",
    "device": "TensorRT-LLM runs on the worker's GPU; it takes no device argument",
}
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "auto": "auto"}  # LLM(dtype=...)

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


def one_model(spec: SpecConfig) -> bool:
    """Does TensorRT-LLM 1.2 run this arm on a one-model path (the drafter inside the target's
    forward)? Eagle3 with eagle3_one_model (1.2's default True) and MTP. On these paths 1.2 needs
    allow_advanced_sampling for temperature > 0 and reports no draft latency."""
    if spec.method == "mtp":
        return True
    return spec.method == "eagle3" and spec_options(spec).get("eagle3_one_model", True) is not False


def decoding_config_spec(spec: SpecConfig) -> DecodingConfigSpec | None:
    """The speculative config of an arm. One-model arms get allow_advanced_sampling unless their
    file says otherwise (1.2 decodes temperature > 0 greedily on those paths without it; L12
    DecodingBaseConfig.allow_advanced_sampling). MTP's draft length is num_nextn_predict_layers in
    1.2 (MTPDecodingConfig overwrites max_draft_len with it, L12 50,372), so both are set to the
    arm's length."""
    if spec.method == "none":
        return None
    decoding_type = METHOD_TO_DECODING_TYPE[spec.method]
    kwargs: dict[str, Any] = {"max_draft_len": spec.draft_len, **spec_options(spec)}
    if spec.method in ("draft_target", "eagle3"):
        assert spec.draft_model is not None, spec  # validated by config/spec.py
        kwargs["speculative_model_dir"] = spec.draft_model
    if spec.method == "ngram":
        kwargs["max_matching_ngram_size"] = spec.ngram_size
    if spec.method == "mtp":
        kwargs["num_nextn_predict_layers"] = spec.draft_len
    if one_model(spec):
        kwargs.setdefault("allow_advanced_sampling", True)
    return DecodingConfigSpec(DECODING_CLASSES[decoding_type], kwargs)


def max_stats_len(batch_size: int, max_seq_len: int | None) -> int:
    """How many iteration stats the executor keeps between two drains. The adapter drains after
    every finished request, in submission order; between two such points the executor runs at most
    about two request lifetimes (each at most max_seq_len iterations). TensorRT-LLM drops the
    oldest beyond max_stats_len (default 1000; py_executor.py _append_iter_stats)."""
    return max(1000, 2 * (max_seq_len or DEFAULT_MAX_SEQ_LEN) + 2 * batch_size)


DEFAULT_MAX_SEQ_LEN = 8192  # when the options do not say; a cap on memory held, not a promise


def llm_kwargs(model: str, spec: SpecConfig, run_options: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """Keyword arguments for `tensorrt_llm.LLM` running `spec` at `batch_size`.

    Every arm of a run is built with the same non-speculative arguments, `run_options` (the run's,
    merged once from its option files by config/spec.py `run_llm_options`), so "none" is measured
    like for like; `conflicting_options` refuses an arm whose file says otherwise. batchspec turns on
    iteration stats (its acceptance figures come from them), sizes max_stats_len so none is dropped
    between drains, and runs at most the production batch size at once.
    """
    kwargs: dict[str, Any] = {"model": model, **run_options}
    kwargs["max_batch_size"] = batch_size
    kwargs["enable_iter_perf_stats"] = True
    kwargs["max_stats_len"] = max(int(kwargs.get("max_stats_len") or 0), max_stats_len(batch_size, kwargs.get("max_seq_len")))
    kwargs["speculative_config"] = decoding_config_spec(spec)
    return kwargs


def conflicting_options(spec: SpecConfig, run_options: dict[str, Any]) -> list[str]:
    """Top-level LLM options of the arm's file (mappings key by key) that differ from the run's."""
    differ = []
    for key, value in llm_options(spec).items():
        ours = run_options.get(key)
        if isinstance(value, dict) and isinstance(ours, dict):
            differ += [f"{key}.{k}={v!r} (run: {ours.get(k)!r})" for k, v in value.items() if ours.get(k) != v]
        elif value != ours and key != "max_batch_size":
            differ.append(f"{key}={value!r} (run: {ours!r})")
    return differ


def sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """Keyword arguments for `tensorrt_llm.SamplingParams` (tensorrt_llm/sampling_params.py)."""
    kwargs: dict[str, Any] = {
        "max_tokens": params.max_tokens,
        "temperature": 0.0 if params.greedy else params.temperature,
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
    context_requests: int = 0  # inflightBatchingStats.numContextRequests, summed
    generation_steps: int = 0  # inflightBatchingStats.numGenRequests, summed: request-steps in decode

    @property
    def acceptance_rate(self) -> float | None:
        return acceptance_rate(self.accepted_tokens, self.draft_tokens)

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
        batching = it.get("inflightBatchingStats") or {}
        stats.context_requests += int(batching.get("numContextRequests") or 0)
        stats.generation_steps += int(batching.get("numGenRequests") or 0)
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


def stats_gap(stats: IterationSpecStats, completions: Sequence[Completion]) -> str | None:
    """Why the iteration stats do not account for every request of a call (None when they do):
    every request's context step and decode steps must appear in some iteration, and the accepted
    tokens summed over iterations must equal those counted per request (len(token_ids) -
    decoding_iter), up to one per request that stopped on its end token."""
    done = [c for c in completions if c.finish_reason != "error"]
    steps = sum(c.target_steps for c in done)
    accepted = sum(c.accepted_tokens for c in done)
    # a row that ended on its end token may count one accepted token less per request: the end
    # token is not in token_ids, so len(token_ids) - decoding_iter misses it when it was accepted
    stopped = sum(c.finish_reason == "stop" for c in done)
    if stats.iterations == 0 and done:
        return "get_stats() returned no iterations"
    if stats.context_requests and stats.context_requests < len(done):
        return f"iteration stats hold {stats.context_requests} context steps for {len(done)} requests"
    if stats.generation_steps and stats.generation_steps < steps:
        return f"iteration stats hold {stats.generation_steps} of {steps} decode steps"
    if not 0 <= stats.accepted_tokens - accepted <= stopped:
        return f"iteration stats count {stats.accepted_tokens} accepted tokens, the requests {accepted}"
    return None


def apportion_drafts(completions: Sequence[Completion], total: int, draft_len: int) -> None:
    """Share the exact proposed-token total of a call (iteration stats) out over its rows, in
    proportion to each row's decode steps, within [accepted, draft_len x steps] per row: the sum is
    exact, a row's share is not (TensorRT-LLM counts proposals per iteration, not per request)."""
    rows = [c for c in completions if c.finish_reason != "error" and c.target_steps > 0]
    room = {id(c): draft_len * c.target_steps - c.accepted_tokens for c in rows}
    spare = max(total - sum(c.accepted_tokens for c in rows), 0)
    steps = sum(c.target_steps for c in rows) or 1
    share = {id(c): min(room[id(c)], spare * c.target_steps // steps) for c in rows}
    left = spare - sum(share.values())
    for c in rows:  # what rounding and the caps left over goes to rows with room, in order
        more = min(left, room[id(c)] - share[id(c)])
        share[id(c)] += more
        left -= more
    for c in rows:
        c.draft_tokens = c.accepted_tokens + share[id(c)]
