"""TensorRT-LLM's vocabulary, and pure translation between it and batchspec's engine contract.

Everything here is plain Python over plain values, so it runs (and is tested) on machines without
TensorRT-LLM: the decoding-config key tables the option-file validator checks against, what
`SpecConfig.options` holds split back into speculative and LLM arguments, `LLM(...)` and
`SamplingParams(...)` keyword arguments, a request's prompt as the LLM takes it, and the parsing
of `RequestOutput`s (iteration stats: iterstats.py). See adapter.py's docstring for the sources each rule comes from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from batchspec.engine.base import (
    Completion,
    Request,
    SamplingParams,
    SpecConfig,
    freeze,
    thaw,
)
from batchspec.errors import ConfigError

# decoding_type, as TensorRT-LLM 1.2's classes spell their tags -> batchspec method name. The
# union TorchLlmArgs.speculative_config is keyed on these tags (llm_args.py SpeculativeConfig,
# DraftTargetDecodingConfig.decoding_type Literal["Draft_Target"]; docs/engines/trtllm.md cites
# offsets), so trtllm-serve --config refuses any other spelling; so does batchspec.
# `Suffix` is batchspec's own decoding_type, not TensorRT-LLM's: suffix drafting over the finished
# rows of a shard key (vLLM's `method: suffix`, SuffixDecoding), run by the torch engine only.
DECODING_TYPES = {"Eagle3": "eagle3", "Draft_Target": "draft_target", "NGram": "ngram", "MTP": "mtp", "Suffix": "suffix"}
METHOD_TO_DECODING_TYPE = {method: name for name, method in DECODING_TYPES.items()}
# Spellings earlier releases took (1.0/1.1 DecodingBaseConfig.from_dict keyed "DraftTarget") that
# 1.2's union refuses: named in the refusal so a user knows what to write instead.
RESPELLED = {"DraftTarget": "Draft_Target"}
# TensorRT-LLM 1.2 has nothing like suffix drafting (L12 has no suffix or SA decoding config; main's
# SADecodingConfig, decoding_type "SA", came later): docs/suffix.md. Refused for trtllm at the edge:
TRTLLM_REFUSED_METHODS = {
    "suffix": "TensorRT-LLM 1.2 has no suffix drafting (its SA decoding came after 1.2); the nearest it offers "
              "is NGram with is_public_pool: true (one n-gram pool shared by every request of the LLM)",
}

# Pinned to one release: TensorRT-LLM 1.2 (tensorrt_llm/llmapi/llm_args.py, the 1.2-era copy cited
# in tests/engine/trtllm/fake_tensorrt_llm/SOURCES.md as L12). speculative_config fields per
# decoding_type, exactly as 1.2's pydantic classes declare them (they refuse any other key):
# DecodingBaseConfig (L12 ~24,900), EagleDecodingConfig (~33,900), NGramDecodingConfig (~45,900),
# DraftTargetDecodingConfig (~47,300), MTPDecodingConfig (~48,000). `speculative_model_dir` is
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
    "Draft_Target": _BASE_KEYS,
    "Eagle3": _BASE_KEYS + _EAGLE_KEYS,
    "MTP": _BASE_KEYS + _MTP_KEYS,
}
# Every field of 1.2's TorchLlmArgs (L12 BaseLlmArgs 80,910 and TorchLlmArgs ~117,600), in
# declaration order: the LLM arguments there are. A fact list; the stand-in's class is pinned to
# the same list with defaults (tests/engine/trtllm/test_fake_tensorrt_llm.py). guided_decoding_backend
# is among them: structured output sets it (guided.py).
TORCH_LLM_ARGS = (
    "model", "tokenizer", "tokenizer_mode", "custom_tokenizer", "skip_tokenizer_init", "trust_remote_code",
    "tensor_parallel_size", "dtype", "revision", "tokenizer_revision", "model_kwargs", "pipeline_parallel_size",
    "context_parallel_size", "gpus_per_node", "moe_cluster_parallel_size", "moe_tensor_parallel_size",
    "moe_expert_parallel_size", "enable_attention_dp", "enable_lm_head_tp_in_adp", "pp_partition", "cp_config",
    "load_format", "enable_lora", "lora_config", "kv_cache_config", "enable_chunked_prefill", "guided_decoding_backend",
    "batched_logits_processor", "iter_stats_max_iterations", "request_stats_max_iterations", "peft_cache_config",
    "scheduler_config", "cache_transceiver_config", "sparse_attention_config", "speculative_config", "max_batch_size",
    "max_input_len", "max_seq_len", "max_beam_width", "max_num_tokens", "gather_generation_logits",
    "num_postprocess_workers", "postprocess_tokenizer_dir", "reasoning_parser", "decoding_config", "mpi_session",
    "otlp_traces_endpoint", "return_perf_metrics", "perf_metrics_max_requests", "orchestrator_type", "env_overrides",
    "garbage_collection_gen0_threshold", "cuda_graph_config", "attention_dp_config", "disable_overlap_scheduler",
    "moe_config", "nvfp4_gemm_config", "attn_backend", "sampler_type", "sampler_force_async_worker",
    "enable_iter_perf_stats", "enable_iter_req_stats", "print_iter_log", "batch_wait_timeout_ms",
    "batch_wait_timeout_iters", "batch_wait_max_tokens_ratio", "torch_compile_config", "enable_autotuner",
    "enable_layerwise_nvtx_marker", "enable_min_latency", "stream_interval", "force_dynamic_quantization",
    "allreduce_strategy", "checkpoint_loader", "checkpoint_format", "kv_connector_config", "mm_encoder_only",
    "ray_worker_extension_cls", "ray_placement_config", "enable_sleep", "use_cute_dsl_blockscaling_mm",
    "use_cute_dsl_blockscaling_bmm", "disable_flashinfer_sampling", "max_stats_len", "layer_wise_benchmarks_config",
    "backend",
)
_PLACEMENT = ("batchspec places each LLM on its worker's GPUs itself (worker.num_gpus, one Ray actor per LLM); "
              "TensorRT-LLM's Ray orchestrator would start GPU actors of its own and wait for GPUs the worker holds")
# What an option file or llm_options may not say, with what to do instead: arguments the adapter
# owns, Python objects a file cannot hold, and names users reach for that are not 1.2 arguments.
LLM_ARGS_REFUSED = {
    "model": "the target model is not part of an option file; pass it with --model",
    "speculative_config": "belongs in a TensorRT-LLM option file (--spec or a candidates file), not in llm_options",
    "speculative_model": "belongs inside speculative_config",
    "backend": "batchspec's adapter runs TensorRT-LLM's PyTorch backend only",
    "device": "TensorRT-LLM runs on the worker's GPUs; it takes no device argument",
    "quant_config": (f"not a TensorRT-LLM {TRTLLM_RELEASE} LLM argument (TorchLlmArgs.quant_config is a property, "
                     "read from the checkpoint); point model at a quantized checkpoint (for example one exported by "
                     "NVIDIA ModelOpt), and set kv_cache_config.dtype: fp8 for an FP8 KV cache"),
    "orchestrator_type": _PLACEMENT,
    "ray_worker_extension_cls": _PLACEMENT,
    "ray_placement_config": _PLACEMENT,
    "gpus_per_node": "set from the GPUs the worker holds (worker.num_gpus)",
    "mpi_session": "a Python object; batchspec starts the LLM's workers itself",
    "decoding_config": "deprecated in TensorRT-LLM 1.2; speculation goes in speculative_config (an option file)",
    "batched_logits_processor": "a Python object, which a file cannot hold",
    "checkpoint_loader": "a Python object, which a file cannot hold; use checkpoint_format",
    "skip_tokenizer_init": ("TensorRT-LLM sets each request's end_id from the LLM's tokenizer (BaseLLM._prepare_sampling_params "
                            "raises without one), so every row would fail; leave it unset"),
}
# Top-level LLM arguments an option file or a pipeline's llm_options may set: every 1.2 argument
# but those refused above. What batchspec reads is type-checked (config/spec.py); TensorRT-LLM
# validates the rest when the LLM is built.
LLM_ARGS = tuple(name for name in TORCH_LLM_ARGS if name not in LLM_ARGS_REFUSED)
# The parallel sizes whose product is the GPUs one LLM spans (L12 _ParallelConfig.world_size).
PARALLEL_SIZES = ("tensor_parallel_size", "pipeline_parallel_size", "context_parallel_size")
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "auto": "auto"}  # LLM(dtype=...)

SPEC_PREFIX = "speculative_config."  # SpecConfig.options keys from the speculative_config block

# decoding_type -> the LLM-API class (tensorrt_llm.llmapi) that takes its fields
DECODING_CLASSES = {
    "Eagle3": "Eagle3DecodingConfig",
    "Draft_Target": "DraftTargetDecodingConfig",
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


def world_size(options: dict[str, Any]) -> int:
    """The GPUs one LLM built with these LLM options spans: tensor x pipeline x context parallel
    sizes (TensorRT-LLM 1.2 llm_args.py _ParallelConfig.world_size)."""
    size = 1
    for key in PARALLEL_SIZES:
        size *= int(options.get(key) or 1)
    return size


def check_draft_len_schedule(where: str, schedule: Any, draft_len: int, spec: SpecConfig) -> dict[int, int]:
    """A speculative_config.draft_len_schedule as TensorRT-LLM 1.2 takes it, or a one-line ConfigError.

    1.2's rules (llm_args.py DecodingBaseConfig.validate_draft_len_schedule_and_sort): batch-size
    thresholds >= 1, draft lengths >= 0 (0 turns speculation off), batch size 1 present and mapped
    to max_draft_len, no length above it. What it does (drafter.py Drafter.get_draft_len_for_batch_size,
    py_executor.py _prepare_and_schedule_batch): each iteration the drafter takes the length of the
    largest threshold <= the number of active requests. Only a drafter applies it, and one-model
    paths (Eagle3 one-model, MTP) have none in 1.2, so there the schedule is refused."""
    key = SPEC_PREFIX + "draft_len_schedule"
    _drafter_only(where, key, spec)
    if not isinstance(schedule, dict) or not schedule:
        raise ConfigError(f"{where}: {key}: expected a non-empty mapping of batch size -> draft length, got {schedule!r}")
    for batch, k in schedule.items():
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ConfigError(f"{where}: {key}: expected batch-size keys >= 1, got {batch!r}")
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= draft_len:
            raise ConfigError(f"{where}: {key}[{batch}]: expected a draft length from 0 to max_draft_len {draft_len}, got {k!r}")
    if schedule.get(1) != draft_len:
        got = "nothing" if 1 not in schedule else schedule[1]
        raise ConfigError(f"{where}: {key}[1]: expected max_draft_len {draft_len} at batch size 1 (TensorRT-LLM {TRTLLM_RELEASE} requires it), got {got}")
    return dict(sorted(schedule.items()))


def check_max_concurrency(where: str, value: Any, spec: SpecConfig) -> int:
    """speculative_config.max_concurrency (1.2: speculation off while more requests are active,
    Drafter.should_use_spec_decode), an integer >= 0 on a path with a drafter, or a ConfigError."""
    key = SPEC_PREFIX + "max_concurrency"
    _drafter_only(where, key, spec)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: {key}: expected an integer >= 0, got {value!r}")
    return value


def _drafter_only(where: str, key: str, spec: SpecConfig) -> None:
    """py_executor.py (1.2) consults draft_len_schedule and max_concurrency only through its
    drafter (`if self.drafter is not None`); one-model paths (Eagle3 one-model, MTP) have none."""
    if one_model(spec):
        raise ConfigError(
            f"{where}: {key}: TensorRT-LLM {TRTLLM_RELEASE} applies it in the drafter, which one-model "
            f"{METHOD_TO_DECODING_TYPE[spec.method]} does not run; remove it (or set eagle3_one_model: false for Eagle3)")


def with_draft_len_schedule(spec: SpecConfig, schedule: dict[int, int]) -> SpecConfig:
    """`spec` whose LLM drafts by `schedule` (checked as a file's would be): how calibration
    hands TensorRT-LLM a schedule fitted to the concurrency a shard drains through."""
    checked = check_draft_len_schedule(spec.label, schedule, spec.draft_len, spec)
    options = tuple((k, v) for k, v in spec.options if k != SPEC_PREFIX + "draft_len_schedule")
    return dataclasses.replace(spec, options=options + ((SPEC_PREFIX + "draft_len_schedule", freeze(checked)),))


def drafts_per_row(spec: SpecConfig, active: int) -> int:
    """The drafts each generation request carries in a 1.2 iteration with `active` requests (the
    target verifies every row padded to them: drafter.py `pad_draft_tokens_for_cuda_graph`, to the
    schedule's current length where there is one). "none": 0. A one-model path has no drafter in
    1.2: its draft length. Else 0 while max_concurrency is exceeded (`should_use_spec_decode`; its
    cap of max_num_tokens // (1 + max_draft_len) requests is not in the statistics and is taken as
    not binding), else the draft_len_schedule's length (`draft_len_for`)."""
    if spec.method == "none":
        return 0
    if one_model(spec):
        return spec.draft_len
    options = spec_options(spec)
    cap = options.get("max_concurrency")
    if cap is not None and active > cap:
        return 0
    return draft_len_for(options.get("draft_len_schedule"), active, spec.draft_len)


def draft_len_for(schedule: dict[int, int] | None, active: int, draft_len: int) -> int:
    """The draft length a 1.2 drafter runs with `active` requests: the largest threshold <= active."""
    if not schedule:
        return draft_len
    return next((k for batch, k in sorted(schedule.items(), reverse=True) if batch <= active), 0)


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
    """How many iteration stats the executor keeps. TensorRT-LLM drops the oldest beyond
    max_stats_len (py_executor.py _append_iter_stats), but its worker moves them to the proxy every
    0.2 s (base_worker.py _iteration_result_task), so only that many iterations in 0.2 s could lose
    any; kept generous (about two request lifetimes) as a margin, never below the default 1000."""
    return max(1000, 2 * (max_seq_len or DEFAULT_MAX_SEQ_LEN) + 2 * batch_size)


DEFAULT_MAX_SEQ_LEN = 8192  # when the options do not say; a cap on memory held, not a promise


def llm_kwargs(model: str, spec: SpecConfig, run_options: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """Keyword arguments for `tensorrt_llm.LLM` running `spec` at `batch_size`.

    Every arm of a run is built with the same non-speculative arguments, `run_options` (the run's,
    merged once from its option files by config/spec.py `run_llm_options`), so "none" is measured
    like for like; `conflicting_options` refuses an arm whose file says otherwise. batchspec turns on
    iteration stats with per-request ones (its acceptance figures and decode steps come from them),
    sizes max_stats_len so none is dropped
    between drains, and runs at most the production batch size at once.
    """
    kwargs: dict[str, Any] = {"model": model, **run_options}
    kwargs["max_batch_size"] = batch_size
    kwargs["enable_iter_perf_stats"] = True
    kwargs["enable_iter_req_stats"] = True  # per-request counts: each request's accepted drafts per step
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
    if params.seed is not None:  # 1.2's PyTorch sampler ignores it (one generator for all requests): passed for later releases
        kwargs["seed"] = params.seed
    if params.stop:
        kwargs["stop"] = list(params.stop)
    return kwargs


def prompt_input(llm: Any, request: Request) -> list[int] | str:
    """What `LLM.generate_async` is given for a request: token ids where batchspec holds them (chat
    templates are tokenized here, with the BOS the template writes and no other, as Ray Data LLM's
    chat-template stage does before its engine; under prompt_format chat a text prompt arrives as
    one user message, batchspec.parse); a raw prompt goes in as text, which TensorRT-LLM tokenizes
    with add_special_tokens=True like the torch engine does. ValueError for an empty prompt."""
    if request.prompt_token_ids is not None:
        if not request.prompt_token_ids:
            raise ValueError("empty prompt_token_ids")
        return list(request.prompt_token_ids)
    if request.messages is not None:
        ids = llm.tokenizer.apply_chat_template(list(request.messages), tokenize=True, add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    if not request.prompt:
        raise ValueError("empty prompt")
    return request.prompt


def completion_from_output(request: Request, output: Any, draft_len: int = 0, stop_cut: int = 0,
                           end_id: int | None = None) -> Completion:
    """Map one `RequestOutput` (attributes: prompt_token_ids, outputs[0].text / token_ids /
    finish_reason, decoding_iter) to a Completion; see the module docstring for the counts.
    `stop_cut`: tokens of a stop word TensorRT-LLM cut from token_ids (`stop_tokens_cut`): the
    executor generated and counted them, so the row's steps and accepted drafts include them.
    An end token (`end_id`) at the end of token_ids is left out of the row's output (batchspec's
    outputs never hold it; whether 1.2 returns it is not settled by its source) and counted as generated."""
    out = output.outputs[0]
    token_ids = list(out.token_ids or [])
    if end_id is not None and out.finish_reason == "stop" and token_ids and token_ids[-1] == end_id \
            and getattr(out, "stop_reason", None) in (None, end_id):
        token_ids.pop()
        stop_cut += 1
    prompt_tokens = len(output.prompt_token_ids or [])
    if out.finish_reason not in FINISH_REASONS:  # 'timeout' or 'cancelled'
        return Completion.failed(request.id, f"TensorRT-LLM finished the request with '{out.finish_reason}'", prompt_tokens)
    n = len(token_ids)
    iterations = int(getattr(output, "decoding_iter", 0) or 0)
    if iterations <= 0:  # not reported: count plain decoding, claim no speculation
        steps, proposed, accepted = max(n + stop_cut - 1, 0), 0, 0
    else:
        steps = iterations - 1
        proposed = draft_len * steps
        accepted = min(max(n + stop_cut - iterations, 0), proposed)
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


def stop_tokens_cut(output: Any, stop_ids: dict[str, list[int]], include_stop: bool, decode) -> int:
    """How many tokens of a stop string TensorRT-LLM cut from a row's token_ids. Its sampler
    matches each stop string as token ids (tokenized without special tokens) against the end of the
    output, and the LLM API then cuts that suffix from token_ids (executor/result.py
    GenerationResultBase._handle_sequence, FinishReason.STOP_WORDS); a stop string found only in
    the decoded text cuts the text and leaves token_ids whole (DetokenizedGenerationResultBase).
    Told apart by whether the stop string is still in the decoded token_ids."""
    out = output.outputs[0]
    reason = getattr(out, "stop_reason", None)
    if include_stop or out.finish_reason != "stop" or not isinstance(reason, str) or reason not in stop_ids:
        return 0
    return 0 if reason in decode(list(out.token_ids or [])) else len(stop_ids[reason])
