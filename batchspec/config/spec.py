"""The speculative-settings language: TensorRT-LLM option files and batchspec candidates files.

This module owns reading and validating the files that say how to speculate, once, at the edge,
and turning them into engine-neutral `SpecConfig` arms. It knows nothing about models, Ray or
timing; engines receive `SpecConfig` values and trust them.

A TensorRT-LLM LLM-API option file (`trt_configs/*.yaml`): exactly the YAML that
   `trtllm-serve --config` / `--extra_llm_api_options` and `trtllm-bench` read, so a user can take
   it straight to those tools. Its `speculative_config:` block is the arm::

       speculative_config:
         decoding_type: NGram          # Eagle3 | Draft_Target | NGram | MTP (1.2's tags) | Suffix (batchspec's own)
         max_draft_len: 4              # integer >= 1
         max_matching_ngram_size: 3    # NGram only
       disable_overlap_scheduler: true # every other top-level key is an LLM argument

   A file without `speculative_config` is "no speculation" (method none). Keys of
   `speculative_config` are checked against the fields of TensorRT-LLM's decoding-config classes
   (tensorrt_llm/llmapi/llm_args.py: DecodingBaseConfig, EagleDecodingConfig / Eagle3DecodingConfig,
   NGramDecodingConfig, DraftTargetDecodingConfig, MTPDecodingConfig), which reject unknown fields;
   an unknown key here is an error that lists the valid ones. Top-level LLM arguments that
   batchspec reads (max_batch_size, max_num_tokens, max_seq_len, disable_overlap_scheduler,
   kv_cache_config, cuda_graph_config, ...) are type-checked; others pass through untouched to
   `tensorrt_llm.LLM`, which validates them itself (the torch engine ignores them).
   `speculative_model_dir` and `speculative_model` are the same field (1.2 accepts both); the draft
   location may be a local folder, an fsspec URL, a Hugging Face id or a packaged-model name
   (resolved later by `batchspec.models.resolve_model`).

Candidates files and `--spec` live in batchspec/config/candidates.py.

Error messages are one line: "FILE: KEY: expected ..., got ...".
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from batchspec.config.kit import (
    describe,
    need_bool,
    need_fraction,
    need_int,
    need_mapping,
    need_text,
    read_yaml,
)
from batchspec.engine.base import NGRAM_SIZE_DEFAULT, SpecConfig, freeze
from batchspec.engine.trtllm.guided import GUIDED_BACKENDS
from batchspec.engine.trtllm.translate import (
    DECODING_TYPES,
    LLM_ARGS,
    LLM_ARGS_REFUSED,
    PARALLEL_SIZES,
    RESPELLED,
    SPEC_KEYS,
    SPEC_PREFIX,
    TRTLLM_RELEASE,
    check_draft_len_schedule,
    check_max_concurrency,
    llm_options,
    world_size,
)
from batchspec.errors import ConfigError

# Fields lifted into SpecConfig's own attributes; everything else goes to SpecConfig.options.
_LIFTED = ("decoding_type", "max_draft_len", "speculative_model", "speculative_model_dir",
           "max_matching_ngram_size", "num_nextn_predict_layers", "max_spec_factor", "min_token_prob")



@dataclass(frozen=True)
class SpecFile:
    """A validated TensorRT-LLM option file: its arm and its other (non-speculative) LLM args."""

    path: str
    spec: SpecConfig
    llm_options: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# TensorRT-LLM option files

# Top-level LLM arguments batchspec reads or that commonly go wrong, with their checks.
_TOP_INTS = {"max_batch_size": 1, "max_num_tokens": 1, "max_seq_len": 1, "max_input_len": 1, "max_stats_len": 1,
             **{key: 1 for key in PARALLEL_SIZES}}
_TOP_BOOLS = ("disable_overlap_scheduler", "enable_iter_perf_stats", "enable_chunked_prefill",
              "trust_remote_code", "enable_attention_dp", "print_iter_log")


def check_llm_options(path: str, options: dict) -> None:
    """Top-level LLM arguments of an option file (or a pipeline's llm_options), TensorRT-LLM 1.2."""
    for key in options:
        if key in LLM_ARGS_REFUSED:
            raise ConfigError(f"{path}: {key}: {LLM_ARGS_REFUSED[key]}")
        if key not in LLM_ARGS:
            raise ConfigError(
                f"{path}: {key}: not a TensorRT-LLM {TRTLLM_RELEASE} LLM argument batchspec passes on (known: {', '.join(sorted(LLM_ARGS))})"
            )
    if options.get("guided_decoding_backend") not in (None, *GUIDED_BACKENDS):
        raise ConfigError(f"{path}: guided_decoding_backend: expected {', '.join(GUIDED_BACKENDS)} or null, got {describe(options['guided_decoding_backend'])}")
    dtype = options.get("dtype", "auto")  # a free string in 1.2 (TorchLlmArgs.dtype: str)
    if not isinstance(dtype, str) or not dtype.strip():
        raise ConfigError(f"{path}: dtype: expected a string such as auto, bfloat16, float16 or float32, got {describe(dtype)}")
    for key, minimum in _TOP_INTS.items():
        if key in options:
            need_int(path, key, options[key], minimum)
    for key in _TOP_BOOLS:
        if key in options:
            need_bool(path, key, options[key])
    if "model" in options:
        raise ConfigError(f"{path}: model: the target model is not part of an option file; pass it with --model")
    if "kv_cache_config" in options:
        kv = need_mapping(path, "kv_cache_config", options["kv_cache_config"])
        if "free_gpu_memory_fraction" in kv:
            need_fraction(path, "kv_cache_config.free_gpu_memory_fraction", kv["free_gpu_memory_fraction"])
        if "enable_block_reuse" in kv:
            need_bool(path, "kv_cache_config.enable_block_reuse", kv["enable_block_reuse"])
        if kv.get("max_tokens") is not None:
            need_int(path, "kv_cache_config.max_tokens", kv["max_tokens"], 1)
    if options.get("cuda_graph_config") is not None:
        cg = need_mapping(path, "cuda_graph_config", options["cuda_graph_config"])
        if "max_batch_size" in cg:
            need_int(path, "cuda_graph_config.max_batch_size", cg["max_batch_size"], 0)
        if "enable_padding" in cg:
            need_bool(path, "cuda_graph_config.enable_padding", cg["enable_padding"])
        sizes = cg.get("batch_sizes")
        if sizes is not None and (not isinstance(sizes, list) or not sizes):
            raise ConfigError(f"{path}: cuda_graph_config.batch_sizes: expected a non-empty list of integers, got {describe(sizes)}")
        for i, size in enumerate(sizes or ()):
            need_int(path, f"cuda_graph_config.batch_sizes[{i}]", size, 1)


def parse_spec_section(path: str, section: Any, *, require_draft: bool = True) -> SpecConfig:
    """Validate one `speculative_config` mapping and translate it into a SpecConfig.

    With `require_draft` false a Draft_Target arm may lack its draft model (its `draft_model` is
    then None); callers that allow that must supply or drop it."""
    section = need_mapping(path, "speculative_config", section)
    kind = section.get("decoding_type")
    if kind not in DECODING_TYPES:
        why = f" (TensorRT-LLM {TRTLLM_RELEASE} spells it {RESPELLED[kind]})" if kind in RESPELLED else ""
        raise ConfigError(
            f"{path}: speculative_config.decoding_type: expected one of {', '.join(DECODING_TYPES)}, got {describe(kind)}{why}"
        )
    allowed = SPEC_KEYS[kind]
    for key in section:
        if key not in allowed:
            raise ConfigError(
                f"{path}: speculative_config.{key}: unknown field for decoding_type {kind} (valid: {', '.join(sorted(allowed))})"
            )
    draft_len = _draft_len(path, kind, section)
    draft_model = _draft_model(path, section)
    ngram_size = NGRAM_SIZE_DEFAULT
    if kind == "NGram":
        if draft_model is not None:
            raise ConfigError(f"{path}: speculative_config.speculative_model_dir: NGram needs no draft model; remove it")
        if "max_matching_ngram_size" in section:
            ngram_size = need_int(path, SPEC_PREFIX + "max_matching_ngram_size", section["max_matching_ngram_size"], 1)
        for key in ("is_keep_all", "is_use_oldest", "is_public_pool"):
            if key in section:
                need_bool(path, SPEC_PREFIX + key, section[key])
    suffix = {}
    if kind == "Suffix":
        if "max_spec_factor" in section:
            suffix["spec_factor"] = _need_positive(path, SPEC_PREFIX + "max_spec_factor", section["max_spec_factor"])
        if "min_token_prob" in section:
            suffix["min_token_prob"] = _need_probability(path, SPEC_PREFIX + "min_token_prob", section["min_token_prob"])
    if kind == "Eagle3":
        if draft_model is None:
            raise ConfigError(f"{path}: speculative_config.speculative_model_dir: Eagle3 needs the location of its EAGLE-3 head, got none")
        if "eagle3_one_model" in section:
            need_bool(path, SPEC_PREFIX + "eagle3_one_model", section["eagle3_one_model"])
    if kind == "Draft_Target" and draft_model is None and require_draft:
        raise ConfigError(
            f"{path}: speculative_config.speculative_model_dir: Draft_Target needs a draft model with the target's tokenizer; set it here or pass --draft-model"
        )
    options = tuple((SPEC_PREFIX + k, freeze(v)) for k, v in section.items() if k not in _LIFTED)
    spec = SpecConfig(
        method=DECODING_TYPES[kind], draft_len=draft_len, draft_model=draft_model,
        ngram_size=ngram_size, options=options, source=path, **suffix,
    )
    if section.get("draft_len_schedule") is not None:
        check_draft_len_schedule(path, section["draft_len_schedule"], draft_len, spec)
    if section.get("max_concurrency") is not None:
        check_max_concurrency(path, section["max_concurrency"], spec)
    return spec


def _need_positive(path: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{path}: {key}: expected a number > 0, got {describe(value)}")
    return float(value)


def _need_probability(path: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigError(f"{path}: {key}: expected a number in [0, 1], got {describe(value)}")
    return float(value)


def _draft_len(path: str, kind: str, section: dict) -> int:
    if kind == "MTP" and "num_nextn_predict_layers" in section:
        # 1.2's MTPDecodingConfig takes its draft length from num_nextn_predict_layers and overwrites
        # max_draft_len with it (llm_args.py set_max_total_draft_tokens): both must agree.
        layers = need_int(path, SPEC_PREFIX + "num_nextn_predict_layers", section["num_nextn_predict_layers"], 1)
        if "max_draft_len" in section and section["max_draft_len"] != layers:
            raise ConfigError(
                f"{path}: speculative_config.max_draft_len: MTP runs num_nextn_predict_layers ({layers}) drafts per step in "
                f"TensorRT-LLM {TRTLLM_RELEASE}; expected max_draft_len {layers} or no max_draft_len, got {describe(section['max_draft_len'])}"
            )
        return layers
    if "max_draft_len" in section:
        return need_int(path, SPEC_PREFIX + "max_draft_len", section["max_draft_len"], 1)
    raise ConfigError(f"{path}: speculative_config.max_draft_len: expected an integer >= 1, got nothing (the key is required)")


def _draft_model(path: str, section: dict) -> str | None:
    given = [k for k in ("speculative_model_dir", "speculative_model") if section.get(k) is not None]
    if len(given) == 2:
        raise ConfigError(f"{path}: speculative_config.speculative_model: give speculative_model_dir or speculative_model, not both")
    return need_text(path, SPEC_PREFIX + given[0], section[given[0]]) if given else None


def _parse_options_file(path: str, data: Any, *, require_draft: bool) -> SpecFile:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of TensorRT-LLM LLM arguments at the top level, got {describe(data)}")
    if is_candidates_file(data):
        raise ConfigError(f"{path}: this is a candidates file; expected a TensorRT-LLM option file here")
    llm_options = {k: v for k, v in data.items() if k != "speculative_config"}
    check_llm_options(path, llm_options)
    section = data.get("speculative_config")
    if section is None:
        spec = SpecConfig(options=_llm_option_pairs(llm_options), source=path)
    else:
        spec = parse_spec_section(path, section, require_draft=require_draft)
        spec = dataclasses.replace(spec, options=spec.options + _llm_option_pairs(llm_options))
    return SpecFile(path=path, spec=spec, llm_options=llm_options)


def _llm_option_pairs(llm_options: dict) -> tuple[tuple[str, Any], ...]:
    return tuple((k, freeze(v)) for k, v in llm_options.items())


def load_spec_file(path: str | os.PathLike, *, draft_model: str | None = None) -> SpecFile:
    """Load and validate one TensorRT-LLM option file. `draft_model` (from `--draft-model`)
    replaces the draft of a Draft_Target arm before the file's own draft is required."""
    path = str(path)
    data = read_yaml(path)
    loaded = _parse_options_file(path, data, require_draft=draft_model is None)
    if draft_model is not None and loaded.spec.method == "draft_target":
        loaded = dataclasses.replace(loaded, spec=dataclasses.replace(loaded.spec, draft_model=draft_model))
    return loaded


def is_candidates_file(data: Any) -> bool:
    return isinstance(data, dict) and "candidates" in data


def run_llm_options(base: dict[str, Any], arms: Sequence[SpecConfig], *, where: str = "run") -> dict[str, Any]:
    """The non-speculative LLM options every arm of a TensorRT-LLM run is built with, "none"
    included: `base` (the run's own, for example the pipeline's `llm_options`) plus each arm file's
    top-level options (mappings such as kv_cache_config merged key by key). Two sources that set
    one key to different values are refused with both named: arms built differently would not be
    compared like for like."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    sources = [(where, dict(base))] + [(arm.source or "spec", llm_options(arm)) for arm in arms]
    for source, options in sources:
        for key, value in options.items():
            flat = {f"{key}.{k}": v for k, v in value.items()} if isinstance(value, dict) else {key: value}
            for name, v in flat.items():
                if name in origin and _get(merged, name) != v:
                    raise ConfigError(
                        f"{source}: {name}: {describe(v)} differs from {describe(_get(merged, name))} in {origin[name]}; "
                        "every arm of a run is built with the same LLM options (like for like with none): make them agree"
                    )
                origin.setdefault(name, source)
            if isinstance(value, dict):
                merged.setdefault(key, {}).update(value)
            else:
                merged[key] = value
    return merged


def check_world(where: str, options: dict[str, Any], num_gpus: float) -> None:
    """A TensorRT-LLM worker runs one LLM across all of its GPUs: the LLM's parallel sizes
    (tensor x pipeline x context, TensorRT-LLM's world size) must multiply to worker.num_gpus."""
    world = world_size(options)
    if num_gpus != int(num_gpus) or world != num_gpus:
        sizes = " x ".join(f"{k} {int(options.get(k) or 1)}" for k in PARALLEL_SIZES if k in options) or "tensor_parallel_size 1"
        raise ConfigError(
            f"{where}: {sizes} = {world} GPUs per LLM, but worker.num_gpus is {num_gpus:g}: each worker runs one LLM "
            "across all of its GPUs; make them equal"
        )


def _get(options: dict[str, Any], name: str) -> Any:
    key, _, sub = name.partition(".")
    return options.get(key, {}).get(sub) if sub else options.get(key)
