"""The LLM-API config classes, as pydantic models that reject unknown keys (StrictBaseModel,
extra="forbid"), with the fields and validators of the 1.2-era llm_args.py (L12 in SOURCES.md).

Only what batchspec could pass is modelled; a field 1.2 does not have is an error here, as there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Set, Union

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveInt
from pydantic import field_validator, model_validator


class StrictBaseModel(BaseModel):
    """tensorrt_llm/llmapi/utils.py StrictBaseModel: unknown fields are a ValidationError."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


class KvCacheConfig(StrictBaseModel):
    # L12 KvCacheConfig (mirrors the C++ executor KvCacheConfig); free_gpu_memory_fraction None
    # means the executor's default 0.9.
    enable_block_reuse: bool = True
    max_tokens: Optional[int] = None
    max_attention_window: Optional[List[int]] = None
    sink_token_length: Optional[int] = None
    free_gpu_memory_fraction: Optional[float] = None
    host_cache_size: Optional[int] = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: Optional[float] = None
    secondary_offload_min_priority: Optional[int] = None
    event_buffer_max_size: int = 0
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    use_uvm: bool = False
    dtype: str = "auto"

    @property
    def fraction(self) -> float:
        return 0.9 if self.free_gpu_memory_fraction is None else self.free_gpu_memory_fraction


class CudaGraphConfig(StrictBaseModel):
    # L12 CudaGraphConfig (offset ~5,000)
    batch_sizes: Optional[List[int]] = None
    max_batch_size: NonNegativeInt = 0
    enable_padding: bool = False


class DecodingBaseConfig(StrictBaseModel):
    # L12 DecodingBaseConfig (~24,200): exactly these fields in 1.2. Main's
    # acceptance_rate_window_size / acceptance_rate_threshold / use_rejection_sampling /
    # advanced_sampling_mode / enable_penalty do not exist here (LMAIN only).
    max_draft_len: Optional[NonNegativeInt] = None
    max_total_draft_tokens: Optional[int] = None
    speculative_model: Optional[Union[str, Path]] = Field(
        default=None, validation_alias=AliasChoices("speculative_model", "speculative_model_dir"))
    max_concurrency: Optional[NonNegativeInt] = None
    draft_len_schedule: Optional[Dict[int, int]] = None
    load_format: Optional[str] = None
    acceptance_window: Optional[NonNegativeInt] = None
    acceptance_length_threshold: Optional[NonNegativeFloat] = None
    # "If true, allows non-greedy sampling when speculation is used. Only applicable to 1-model
    # code paths; non-greedy sampling is always enabled on 2-model paths." (L12; a no-op in LMAIN)
    allow_advanced_sampling: bool = False

    @field_validator("draft_len_schedule")
    @classmethod
    def _schedule(cls, v, info):
        # L12 validate_draft_len_schedule_and_sort: thresholds >= 1, lengths >= 0, {1: max_draft_len}
        # required, every length <= max_draft_len.
        if v is None:
            return v
        for batch, k in v.items():
            if batch < 1:
                raise ValueError(f"draft_len_schedule: batch size threshold must be >= 1, got {batch}")
            if k < 0:
                raise ValueError(f"draft_len_schedule: draft length must be >= 0, got {k}")
        if 1 not in v:
            raise ValueError("draft_len_schedule must include batch_size=1.")
        top = info.data.get("max_draft_len")
        if top is not None and v[1] != top:
            raise ValueError(f"draft_len_schedule[1] must equal max_draft_len for consistency. Got schedule[1]={v[1]}, but max_draft_len={top}.")
        if top is not None and any(k > top for k in v.values()):
            raise ValueError("draft_len_schedule: all draft lengths must be <= max_draft_len.")
        return dict(sorted(v.items()))

    @property
    def one_model(self) -> bool:
        return False


class NGramDecodingConfig(DecodingBaseConfig):
    # L12 NGramDecodingConfig (~45,900)
    decoding_type: Literal["NGram"] = "NGram"
    max_matching_ngram_size: PositiveInt = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True

    @model_validator(mode="after")
    def _check(self):
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for NGram")
        self.max_total_draft_tokens = self.max_draft_len
        return self


class DraftTargetDecodingConfig(DecodingBaseConfig):
    # L12 DraftTargetDecodingConfig (~47,300): decoding_type is "Draft_Target" in the class
    decoding_type: Literal["Draft_Target"] = "Draft_Target"

    @model_validator(mode="after")
    def _check(self):
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for DraftTarget")
        if self.speculative_model is None:
            raise ValueError("speculative_model must be specified for DraftTarget")
        self.max_total_draft_tokens = self.max_draft_len
        return self


class EagleDecodingConfig(DecodingBaseConfig):
    # L12 EagleDecodingConfig (~33,900): decoding_type is Literal["Eagle"], so
    # EagleDecodingConfig(decoding_type="Eagle3") is a ValidationError.
    decoding_type: Literal["Eagle"] = "Eagle"
    eagle_choices: Optional[List[List[int]]] = None
    greedy_sampling: Optional[bool] = True
    posterior_threshold: Optional[float] = None
    use_dynamic_tree: Optional[bool] = False
    dynamic_tree_max_topK: Optional[int] = None
    num_eagle_layers: Optional[int] = None
    max_non_leaves_per_layer: Optional[int] = None
    eagle3_one_model: Optional[bool] = True
    eagle3_layers_to_capture: Optional[Set[int]] = None
    eagle3_model_arch: Literal["llama3", "mistral_large3"] = "llama3"

    @model_validator(mode="after")
    def _check(self):
        if self.max_draft_len is None or self.max_draft_len == 0:
            raise ValueError("max_draft_len must be > 0 for Eagle")
        if self.speculative_model is None:
            raise ValueError("Draft model must be provided for EAGLE")
        self.num_eagle_layers = self.max_total_draft_tokens = self.max_draft_len
        return self

    @property
    def one_model(self) -> bool:
        return bool(self.eagle3_one_model)


class Eagle3DecodingConfig(EagleDecodingConfig):
    # L12 Eagle3DecodingConfig (~40,100)
    decoding_type: Literal["Eagle3"] = "Eagle3"


class MTPDecodingConfig(DecodingBaseConfig):
    # L12 MTPDecodingConfig (~47,900). Its after-validator overwrites max_draft_len with
    # num_nextn_predict_layers (offset 50,372): max_draft_len: 3 alone runs one draft per step.
    decoding_type: Literal["MTP"] = "MTP"
    num_nextn_predict_layers: PositiveInt = 1
    use_relaxed_acceptance_for_thinking: bool = False
    relaxed_topk: int = 1
    relaxed_delta: float = 0.0
    use_mtp_vanilla: bool = False
    mtp_eagle_one_model: bool = True
    begin_thinking_phase_token: int = 128798
    end_thinking_phase_token: int = 128799

    @model_validator(mode="after")
    def _set_max_total_draft_tokens(self):
        self.max_draft_len = self.num_nextn_predict_layers
        self.max_total_draft_tokens = self.num_nextn_predict_layers
        return self

    @property
    def one_model(self) -> bool:
        return True


class TorchLlmArgs(StrictBaseModel):
    """The keyword arguments `LLM(...)` takes on the PyTorch backend (a subset of 1.2's
    TorchLlmArgs/BaseLlmArgs; unknown keys are refused as there: e.g. `device` is not one)."""

    model: str
    tokenizer: Optional[Any] = None
    tokenizer_mode: Literal["auto", "slow"] = "auto"
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    revision: Optional[str] = None
    max_batch_size: int = 2048
    max_num_tokens: int = 8192
    max_seq_len: Optional[int] = None
    max_input_len: Optional[int] = None
    max_beam_width: int = 1
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
    cuda_graph_config: Optional[CudaGraphConfig] = Field(default_factory=CudaGraphConfig)
    disable_overlap_scheduler: bool = False
    enable_chunked_prefill: bool = False
    enable_attention_dp: bool = False
    enable_iter_perf_stats: bool = False
    enable_iter_req_stats: bool = False
    max_stats_len: int = 1000  # AD: default=1000, "The max number of performance statistic entries."
    print_iter_log: bool = False
    speculative_config: Optional[Any] = None
    # L12: "Guided decoding backend. llguidance is supported in PyTorch backend only."
    guided_decoding_backend: Optional[Literal["xgrammar", "llguidance"]] = None
    attn_backend: str = "TRTLLM"
    sampler_type: str = "auto"
    stream_interval: int = 1

    @field_validator("speculative_config")
    @classmethod
    def _decoding(cls, v):
        if v is not None and not isinstance(v, DecodingBaseConfig):
            raise ValueError(f"speculative_config: expected a DecodingBaseConfig, got {type(v).__name__}")
        return v
