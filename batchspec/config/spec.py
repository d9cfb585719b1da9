"""TensorRT-LLM LLM-API option files (`trt_configs/*.yaml`): one speculative arm in TensorRT-LLM
1.2's own format, read once at the edge and turned into an engine-neutral `SpecConfig`. The classes
carry 1.2's names and `decoding_type` tags (tensorrt_llm/llmapi/llm_args.py: SpeculativeConfig),
plus `Suffix`, batchspec's own; the rules are docs/spec-settings.md's ("Option files").
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional, Sequence, Union

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from batchspec.config.kit import Expect, Section, check, describe, expected, flag, integer, nullable, number, read_yaml, said, text
from batchspec.engine.base import NGRAM_SIZE_DEFAULT, SpecConfig, freeze
from batchspec.engine.eagle3_format import is_head
from batchspec.engine.trtllm.guided import GUIDED_BACKENDS
from batchspec.engine.trtllm.translate import (DECODING_TYPES, LLM_ARGS, LLM_ARGS_REFUSED, PARALLEL_SIZES, RESPELLED, SPEC_KEYS,
                                               SPEC_PREFIX, TRTLLM_RELEASE, check_draft_len_schedule, check_max_concurrency,
                                               llm_options, world_size)
from batchspec.errors import ConfigError

ALLOW = ConfigDict(extra="allow", frozen=True)  # TensorRT-LLM's other keys pass through, by name only
DRAFT = nullable(text("a non-empty string (a model location)"))
# speculative_config keys lifted into SpecConfig's own attributes; the others go to SpecConfig.options
_LIFTED = ("decoding_type", "max_draft_len", "speculative_model", "speculative_model_dir",
           "max_matching_ngram_size", "num_nextn_predict_layers", "max_spec_factor", "min_token_prob")


class KvCacheConfig(Section):
    """TensorRT-LLM's KvCacheConfig: what batchspec reads of it; other keys pass through."""

    model_config = ALLOW
    free_gpu_memory_fraction: number(gt=0, le=1) = Field(None, description="Share of free GPU memory the KV cache takes.")
    enable_block_reuse: flag() = Field(None, description="Reuse KV cache blocks across requests that share a prefix.")
    max_tokens: nullable(integer(ge=1)) = Field(None, description="Tokens the KV cache holds at most.")


class CudaGraphConfig(Section):
    """TensorRT-LLM's CudaGraphConfig: what batchspec reads of it; other keys pass through."""

    model_config = ALLOW
    max_batch_size: integer(ge=0) = Field(None, description="Largest batch captured as a CUDA graph.")
    enable_padding: flag() = Field(None, description="Pad a batch up to the next captured size.")
    batch_sizes: Annotated[Optional[Annotated[list[integer(ge=1)], Field(min_length=1)]], Expect("a non-empty list of integers")] = Field(
        None, description="The batch sizes captured as CUDA graphs.")


class LlmOptions(Section):
    """Top-level TensorRT-LLM 1.2 LLM arguments (TorchLlmArgs), as in an option file or a pipeline's
    `llm_options`: those batchspec reads are checked here; any other 1.2 argument passes through."""

    model_config = ALLOW
    max_batch_size: integer(ge=1) = Field(None, description="Requests the LLM runs at once (batchspec sets it to --batch-size).")
    max_num_tokens: integer(ge=1) = Field(None, description="Tokens of one forward pass at most.")
    max_seq_len: integer(ge=1) = Field(None, description="Prompt plus output tokens of a request at most.")
    max_input_len: integer(ge=1) = Field(None, description="Prompt tokens of a request at most.")
    max_stats_len: integer(ge=1) = Field(None, description="Iteration statistics kept (batchspec raises it to what it reads).")
    tensor_parallel_size: integer(ge=1) = Field(None, description="GPUs one LLM splits each layer over.")
    pipeline_parallel_size: integer(ge=1) = Field(None, description="GPUs one LLM splits its layers over.")
    context_parallel_size: integer(ge=1) = Field(None, description="GPUs one LLM splits its context over.")
    disable_overlap_scheduler: flag() = Field(None, description="Schedule each iteration after the last (NGram needs it in 1.2).")
    enable_iter_perf_stats: flag() = Field(None, description="Iteration statistics (batchspec turns them on).")
    enable_chunked_prefill: flag() = Field(None, description="Prefill long prompts in chunks.")
    trust_remote_code: flag() = Field(None, description="Run the model repository's own code.")
    enable_attention_dp: flag() = Field(None, description="Data-parallel attention.")
    print_iter_log: flag() = Field(None, description="Log every iteration.")
    guided_decoding_backend: Annotated[Optional[Literal[GUIDED_BACKENDS]], Expect(f"{', '.join(GUIDED_BACKENDS)} or null")] = Field(
        None, description="The structured-output backend (batchspec sets it when a row has a response_format).")
    dtype: text("a string such as auto, bfloat16, float16 or float32") = Field("auto", description="Model dtype (a free string in 1.2).")
    kv_cache_config: KvCacheConfig = Field(None, description="The KV cache's settings (KvCacheConfig).")
    cuda_graph_config: Optional[CudaGraphConfig] = Field(None, description="CUDA graph capture (CudaGraphConfig); null: none.")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return LLM_ARGS

    @classmethod
    def unknown(cls, key: Any) -> Any:
        if key in LLM_ARGS_REFUSED:
            return said(LLM_ARGS_REFUSED[key], key)
        return said(f"not a TensorRT-LLM {TRTLLM_RELEASE} LLM argument batchspec passes on (known: {', '.join(sorted(LLM_ARGS))})", key)


class _Decoding(Section):
    """What every `speculative_config` has: its tag and its draft length."""

    model_config = ALLOW
    decoding_type: str = Field(description="The decoding-config class, by its tag.")
    max_draft_len: integer(ge=1) = Field(None, description="Draft tokens per step (k); required (MTP: or num_nextn_predict_layers).")

    @classmethod
    def tag(cls) -> str:
        return typing.get_args(cls.model_fields["decoding_type"].annotation)[0]

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return SPEC_KEYS[cls.tag()]

    @classmethod
    def unknown(cls, key: Any) -> Any:
        return said(f"unknown field for decoding_type {cls.tag()} (valid: {', '.join(sorted(cls.keys()))})", key)

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo) -> _Decoding:
        if self.length() is None:
            raise said("expected an integer >= 1, got nothing (the key is required)", "max_draft_len")
        self.check(info.context or {})
        return self

    def length(self) -> int | None:
        return self.max_draft_len

    def check(self, context: dict) -> None:
        """The rules of this class that span keys (ConfigError words by `said`)."""

    @property
    def draft(self) -> str | None:
        return None


class DecodingBaseConfig(_Decoding):
    """TensorRT-LLM 1.2's DecodingBaseConfig: the fields every TensorRT-LLM decoding type has."""

    speculative_model_dir: DRAFT = Field(None, description="The draft model or head: a folder, an fsspec URL, a Hugging Face id or a packaged-model name.")
    speculative_model: DRAFT = Field(None, description="The same field as speculative_model_dir (1.2 accepts both).")

    @property
    def draft(self) -> str | None:
        return self.speculative_model_dir or self.speculative_model

    def check(self, context: dict) -> None:
        if self.speculative_model_dir is not None and self.speculative_model is not None:
            raise said("give speculative_model_dir or speculative_model, not both", "speculative_model")


class NGramDecodingConfig(DecodingBaseConfig):
    """Prompt lookup: drafts are n-grams already seen in the prompt and the output."""

    decoding_type: Literal["NGram"] = Field(description="NGram: prompt lookup.")
    max_matching_ngram_size: integer(ge=1) = Field(NGRAM_SIZE_DEFAULT, description="Longest n-gram matched.")
    is_keep_all: flag() = Field(None, description="Keep every draft a pattern ever had, not only the newest.")
    is_use_oldest: flag() = Field(None, description="Draft the oldest match, not the newest.")
    is_public_pool: flag() = Field(None, description="One n-gram pool shared by every request of the LLM.")

    def check(self, context: dict) -> None:
        super().check(context)
        if self.draft is not None:
            raise said("NGram needs no draft model; remove it", "speculative_model_dir")


class DraftTargetDecodingConfig(DecodingBaseConfig):
    """A separate small draft model with the target's tokenizer."""

    decoding_type: Literal["Draft_Target"] = Field(description="Draft_Target: a draft model (1.2's tag, not DraftTarget).")

    def check(self, context: dict) -> None:
        super().check(context)
        if self.draft is None and context.get("require_draft", True):
            raise said("Draft_Target needs a draft model with the target's tokenizer; set it here or pass --draft-model", "speculative_model_dir")


class Eagle3DecodingConfig(DecodingBaseConfig):
    """An EAGLE-3 head trained on the target's hidden states (TensorRT-LLM engine only)."""

    decoding_type: Literal["Eagle3"] = Field(description="Eagle3: an EAGLE-3 head.")
    eagle3_one_model: flag() = Field(None, description="Run the head inside the target's forward (1.2's default: true).")

    def check(self, context: dict) -> None:
        super().check(context)
        if self.draft is None:
            raise said("Eagle3 needs the location of its EAGLE-3 head, got none", "speculative_model_dir")


class MTPDecodingConfig(DecodingBaseConfig):
    """Multi-token prediction layers of the target itself (TensorRT-LLM engine only)."""

    decoding_type: Literal["MTP"] = Field(description="MTP: the target's multi-token prediction layers.")
    num_nextn_predict_layers: integer(ge=1) = Field(None, description="MTP layers run per step: 1.2's draft length (it overwrites max_draft_len).")

    def length(self) -> int | None:
        return self.num_nextn_predict_layers or self.max_draft_len

    def check(self, context: dict) -> None:
        super().check(context)
        layers = self.num_nextn_predict_layers
        if layers is not None and self.max_draft_len is not None and self.max_draft_len != layers:
            raise said(f"MTP runs num_nextn_predict_layers ({layers}) drafts per step in TensorRT-LLM {TRTLLM_RELEASE}; "
                       f"expected max_draft_len {layers} or no max_draft_len, got {describe(self.max_draft_len)}", "max_draft_len")


class SuffixDecodingConfig(_Decoding):
    """batchspec's own: drafts from the finished rows of the shard key (SuffixDecoding; torch only)."""

    decoding_type: Literal["Suffix"] = Field(description="Suffix: suffix drafting (docs/suffix.md).")
    max_spec_factor: number(gt=0) = Field(None, description="A match of m tokens drafts at most m x this (the draft length caps it).")
    min_token_prob: number(ge=0, le=1) = Field(None, description="Stop before a token whose estimated probability is lower.")


SpeculativeConfig = Annotated[
    Union[Eagle3DecodingConfig, DraftTargetDecodingConfig, NGramDecodingConfig, MTPDecodingConfig, SuffixDecodingConfig],
    Field(discriminator="decoding_type"),
]


class OptionsFile(LlmOptions):
    """A TensorRT-LLM LLM-API option file: LLM arguments, and the arm in `speculative_config`."""

    speculative_config: Optional[SpeculativeConfig] = Field(None, description="The arm; none: no speculation.")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return (*LLM_ARGS, "speculative_config")

    @field_validator("speculative_config", mode="before")
    @classmethod
    def _tag(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, dict):
            raise expected("a mapping")
        kind = v.get("decoding_type") if v is not None else None
        if v is not None and kind not in DECODING_TYPES:
            why = f" (TensorRT-LLM {TRTLLM_RELEASE} spells it {RESPELLED[kind]})" if kind in RESPELLED else ""
            raise said(f"expected one of {', '.join(DECODING_TYPES)}, got {describe(kind)}{why}", "decoding_type")
        return v


@dataclass(frozen=True)
class SpecFile:
    """A validated TensorRT-LLM option file: its arm and its other (non-speculative) LLM args."""

    path: str
    spec: SpecConfig
    llm_options: dict[str, Any] = field(default_factory=dict)


def check_llm_options(path: str, options: dict) -> None:
    """Top-level LLM arguments of an option file (or a pipeline's llm_options), TensorRT-LLM 1.2."""
    check(LlmOptions, options, path, show=describe)


def _parse_options_file(path: str, data: Any, *, require_draft: bool) -> SpecFile:
    """With `require_draft` false a Draft_Target arm may lack its draft model (its `draft_model`
    is then None); callers that allow that must supply or drop it."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of TensorRT-LLM LLM arguments at the top level, got {describe(data)}")
    if is_candidates_file(data):
        raise ConfigError(f"{path}: this is a candidates file; expected a TensorRT-LLM option file here")
    arm = check(OptionsFile, data, path, show=describe, context={"require_draft": require_draft}).speculative_config
    llm = {k: v for k, v in data.items() if k != "speculative_config"}
    pairs = tuple((k, freeze(v)) for k, v in llm.items())
    if arm is None:
        return SpecFile(path=path, spec=SpecConfig(options=pairs, source=path), llm_options=llm)
    section = data["speculative_config"]
    options = tuple((SPEC_PREFIX + k, freeze(v)) for k, v in section.items() if k not in _LIFTED)
    suffix = {"spec_factor": arm.max_spec_factor, "min_token_prob": arm.min_token_prob} if arm.tag() == "Suffix" else {}
    spec = SpecConfig(method=DECODING_TYPES[arm.tag()], draft_len=arm.length(), draft_model=arm.draft,
                      ngram_size=arm.max_matching_ngram_size if arm.tag() == "NGram" else NGRAM_SIZE_DEFAULT,
                      options=options, source=path, **{k: v for k, v in suffix.items() if v is not None})
    if section.get("draft_len_schedule") is not None:
        check_draft_len_schedule(path, section["draft_len_schedule"], spec.draft_len, spec)
    if section.get("max_concurrency") is not None:
        check_max_concurrency(path, section["max_concurrency"], spec)
    return SpecFile(path=path, spec=dataclasses.replace(spec, options=options + pairs), llm_options=llm)


def load_spec_file(path: str | os.PathLike, *, draft_model: str | None = None) -> SpecFile:
    """Load and validate one TensorRT-LLM option file. `draft_model` (from `--draft-model`)
    replaces the draft of a Draft_Target arm before the file's own draft is required."""
    path = str(path)
    loaded = _parse_options_file(path, read_yaml(path), require_draft=draft_model is None)
    if draft_model is not None and loaded.spec.method == "draft_target":
        loaded = dataclasses.replace(loaded, spec=with_draft_model(loaded.spec, draft_model))
    return loaded


def with_draft_model(spec: SpecConfig, draft_model: str) -> SpecConfig:
    """A Draft_Target arm drafting with `draft_model` (`--draft-model`): a folder holding an EAGLE-3
    head in the released format makes it an Eagle3 arm of that head, at the same draft length."""
    method = "eagle3" if is_head(draft_model) else spec.method
    return dataclasses.replace(spec, method=method, draft_model=draft_model)


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
