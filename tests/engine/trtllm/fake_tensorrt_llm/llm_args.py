"""The LLM-API config classes, as pydantic models that reject unknown keys (StrictBaseModel,
extra="forbid"), with the fields, defaults and validators of the 1.2-era llm_args.py (L12 in
SOURCES.md; character offsets below are into that copy).

What batchspec can pass is modelled field by field; config classes batchspec never fills
(MoeConfig, SchedulerConfig, ...) are opaque here (any keys), a difference SOURCES.md states.
tests/engine/trtllm/test_fake_tensorrt_llm.py pins the field lists and defaults to the ones
recorded from the source.
"""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Dict, List, Literal, Optional, Set, Union

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveInt
from pydantic import field_validator, model_validator


class StrictBaseModel(BaseModel):
    """tensorrt_llm/llmapi/utils.py StrictBaseModel: unknown fields are a ValidationError."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


class Opaque(BaseModel):
    """A config class batchspec never fills: any keys (the real ones are strict; not modelled)."""

    model_config = ConfigDict(extra="allow")


class MoeConfig(Opaque): ...
class Nvfp4GemmConfig(Opaque): ...
class SchedulerConfig(Opaque): ...
class LayerwiseBenchmarksConfig(Opaque): ...


class CudaGraphConfig(StrictBaseModel):
    # L12 CudaGraphConfig (~3,700): batch_sizes given -> sorted, max_batch_size derived and, when
    # set, required to equal max(batch_sizes); neither -> sizes generated up to max_batch_size or 128.
    batch_sizes: Optional[List[int]] = None
    max_batch_size: NonNegativeInt = 0
    enable_padding: bool = False

    @model_validator(mode="after")
    def _sizes(self):
        if self.batch_sizes:
            self.batch_sizes = sorted(self.batch_sizes)
            top = max(self.batch_sizes)
            if self.max_batch_size == 0:
                self.max_batch_size = top
            elif self.max_batch_size != top:
                raise ValueError(
                    "CudaGraphConfig.max_batch_size is incompatible with CudaGraphConfig.batch_sizes: when both are "
                    f"provided, max_batch_size must equal max(batch_sizes) ({top}), got {self.max_batch_size}")
        else:
            self.max_batch_size = self.max_batch_size or 128
            self.batch_sizes = cuda_graph_sizes(self.max_batch_size, self.enable_padding)
        return self


def cuda_graph_sizes(limit: int, padding: bool) -> list[int]:
    """L12 CudaGraphConfig._generate_cuda_graph_batch_sizes, as a rule: 1-31 then 32, 64, 128
    (with padding 1, 2, 4, then multiples of 8 to 128), powers of two from 256 below `limit`,
    everything above `limit` dropped, `limit` itself last."""
    base = [1, 2, 4] + list(range(8, 129, 8)) if padding else list(range(1, 33)) + [64, 128]
    base += [2**i for i in range(8, math.ceil(math.log(limit, 2)))] if limit > 1 else []
    sizes = sorted(s for s in base if s <= limit)
    return sizes if sizes and sizes[-1] == limit else sizes + [limit]


class KvCacheConfig(StrictBaseModel):
    # L12 KvCacheConfig (~71,300): free_gpu_memory_fraction 0.9 in [0, 1], max_util_for_resume in [0, 1]
    enable_block_reuse: bool = True
    max_tokens: Optional[int] = None
    max_attention_window: Optional[Annotated[List[PositiveInt], Field(min_length=1)]] = None
    sink_token_length: Optional[int] = None
    free_gpu_memory_fraction: Optional[float] = Field(default=0.9, ge=0, le=1)
    host_cache_size: Optional[int] = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: Optional[float] = None
    secondary_offload_min_priority: Optional[int] = None
    event_buffer_max_size: int = 0
    attention_dp_events_gather_period_ms: int = 5
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    use_uvm: bool = False
    max_gpu_total_bytes: NonNegativeInt = 0
    dtype: str = "auto"
    mamba_ssm_cache_dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    tokens_per_block: int = 32
    use_kv_cache_manager_v2: bool = False
    max_util_for_resume: float = Field(default=0.95, ge=0, le=1)


class DecodingBaseConfig(StrictBaseModel):
    # L12 DecodingBaseConfig (~24,900): exactly these fields. Main's acceptance_rate_window_size /
    # acceptance_rate_threshold / use_rejection_sampling / advanced_sampling_mode / enable_penalty
    # do not exist here (LMAIN only).
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
        # L12 validate_draft_len_schedule_and_sort (~28,600): thresholds >= 1, lengths >= 0,
        # {1: max_draft_len} required, every length <= max_draft_len; returned sorted by threshold.
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
    # L12 DraftTargetDecodingConfig (47,300; the tag at 47,366): decoding_type is "Draft_Target"
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
    # L12 MTPDecodingConfig (~48,000). Its after-validator overwrites max_draft_len with
    # num_nextn_predict_layers (offset 50,372): max_draft_len: 3 alone runs one draft per step.
    decoding_type: Literal["MTP"] = "MTP"
    num_nextn_predict_layers: PositiveInt = 1
    use_relaxed_acceptance_for_thinking: bool = False
    relaxed_topk: int = 1
    relaxed_delta: float = 0.0
    use_mtp_vanilla: bool = False
    mtp_eagle_one_model: bool = True
    num_nextn_predict_layers_from_model_config: int = 1  # internal (init=False in L12), set from the model
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


# L12 SpeculativeConfig (70,485): a pydantic union keyed on decoding_type, so a YAML mapping
# (trtllm-serve --config) picks its class by the tag and an unknown tag ("DraftTarget") is refused.
SpeculativeConfig = Annotated[
    Union[DraftTargetDecodingConfig, EagleDecodingConfig, Eagle3DecodingConfig, MTPDecodingConfig, NGramDecodingConfig],
    Field(discriminator="decoding_type"),
]


class LoadFormat(Enum):
    # L12 LoadFormat (~114,300)
    AUTO = 0
    DUMMY = 1
    VISION_ONLY = 2


class TorchLlmArgs(StrictBaseModel):
    """`LLM(...)` on the PyTorch backend: L12 BaseLlmArgs (80,910) then TorchLlmArgs (~117,600),
    every field with its default; object-typed fields are Any. `quant_config` is a property of
    the real class (backed by a private attribute), not a field: passing it is refused here as there."""

    model: Union[str, Path]
    tokenizer: Optional[Any] = None
    tokenizer_mode: Literal["auto", "slow"] = "auto"
    custom_tokenizer: Optional[str] = None
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    dtype: str = "auto"  # a free string in L12 (validate_dtype only rewrites it on pre-SM80 GPUs)
    revision: Optional[str] = None
    tokenizer_revision: Optional[str] = None
    model_kwargs: Optional[Dict[str, Any]] = None
    pipeline_parallel_size: int = 1
    context_parallel_size: int = 1
    gpus_per_node: Optional[int] = None
    moe_cluster_parallel_size: Optional[int] = None
    moe_tensor_parallel_size: Optional[int] = None
    moe_expert_parallel_size: Optional[int] = None
    enable_attention_dp: bool = False
    enable_lm_head_tp_in_adp: bool = False
    pp_partition: Optional[List[int]] = None
    cp_config: Optional[Any] = None
    load_format: Union[str, LoadFormat] = LoadFormat.AUTO
    enable_lora: bool = False
    lora_config: Optional[Any] = None
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
    enable_chunked_prefill: bool = False
    # L12: "Guided decoding backend. llguidance is supported in PyTorch backend only."
    guided_decoding_backend: Optional[Literal["xgrammar", "llguidance"]] = None
    batched_logits_processor: Optional[Any] = None
    iter_stats_max_iterations: Optional[int] = None
    request_stats_max_iterations: Optional[int] = None
    peft_cache_config: Optional[Any] = None
    scheduler_config: SchedulerConfig = Field(default_factory=SchedulerConfig)
    cache_transceiver_config: Optional[Any] = None
    sparse_attention_config: Optional[Any] = None
    speculative_config: Optional[SpeculativeConfig] = None
    max_batch_size: Optional[int] = 2048
    max_input_len: Optional[int] = 1024
    max_seq_len: Optional[int] = None
    max_beam_width: Optional[int] = 1
    max_num_tokens: Optional[int] = 8192
    gather_generation_logits: bool = False
    num_postprocess_workers: int = 0
    postprocess_tokenizer_dir: Optional[str] = None
    reasoning_parser: Optional[str] = None
    decoding_config: Optional[Any] = None
    mpi_session: Optional[Any] = None
    otlp_traces_endpoint: Optional[str] = None
    return_perf_metrics: bool = False
    perf_metrics_max_requests: NonNegativeInt = 0
    orchestrator_type: Optional[Literal["rpc", "ray"]] = None
    env_overrides: Optional[Dict[str, str]] = None
    # TorchLlmArgs' own
    garbage_collection_gen0_threshold: int = 20000
    cuda_graph_config: Optional[CudaGraphConfig] = Field(default_factory=CudaGraphConfig)
    attention_dp_config: Optional[Any] = None
    disable_overlap_scheduler: bool = False
    moe_config: MoeConfig = Field(default_factory=MoeConfig)
    nvfp4_gemm_config: Nvfp4GemmConfig = Field(default_factory=Nvfp4GemmConfig)
    attn_backend: str = "TRTLLM"
    sampler_type: str = "auto"
    sampler_force_async_worker: bool = False
    enable_iter_perf_stats: bool = False
    enable_iter_req_stats: bool = False
    print_iter_log: bool = False
    batch_wait_timeout_ms: NonNegativeFloat = 0
    batch_wait_timeout_iters: NonNegativeInt = 0
    batch_wait_max_tokens_ratio: float = Field(default=0, ge=0, le=1)
    torch_compile_config: Optional[Any] = None
    enable_autotuner: bool = True
    enable_layerwise_nvtx_marker: bool = False
    enable_min_latency: bool = False
    stream_interval: PositiveInt = 1
    force_dynamic_quantization: bool = False
    allreduce_strategy: Optional[Literal["AUTO", "NCCL", "UB", "MINLATENCY", "ONESHOT", "TWOSHOT", "LOWPRECISION",
                                         "MNNVL", "NCCL_SYMMETRIC"]] = "AUTO"
    checkpoint_loader: Optional[Any] = None
    checkpoint_format: Optional[str] = None
    kv_connector_config: Optional[Any] = None
    mm_encoder_only: bool = False
    ray_worker_extension_cls: Optional[str] = None
    ray_placement_config: Optional[Any] = None
    enable_sleep: bool = False
    use_cute_dsl_blockscaling_mm: bool = False
    use_cute_dsl_blockscaling_bmm: bool = False
    disable_flashinfer_sampling: bool = False
    max_stats_len: int = 1000
    layer_wise_benchmarks_config: LayerwiseBenchmarksConfig = Field(default_factory=LayerwiseBenchmarksConfig)
    backend: Literal["pytorch"] = "pytorch"

    @field_validator("load_format", mode="before")
    @classmethod
    def _load_format(cls, v):
        # L12 TorchLlmArgs.convert_load_format: any case of a LoadFormat name
        if isinstance(v, LoadFormat):
            return v
        if str(v).upper() not in LoadFormat.__members__:
            raise ValueError(f"Invalid LoadFormat: {v}")
        return LoadFormat[str(v).upper()]

    @model_validator(mode="after")
    def _normalize(self):
        # L12 BaseLlmArgs.normalize_optional_fields_to_defaults: None means the declared default
        for name in ("max_batch_size", "max_input_len", "max_beam_width", "max_num_tokens"):
            if getattr(self, name) is None:
                setattr(self, name, type(self).model_fields[name].default)
        return self

    @model_validator(mode="after")
    def _eagle_is_eagle3(self):
        # L12 TorchLlmArgs.validate_speculative_config: decoding_type Eagle becomes Eagle3 (with a warning)
        if type(self.speculative_config) is EagleDecodingConfig:
            self.speculative_config = Eagle3DecodingConfig(**self.speculative_config.model_dump(exclude={"decoding_type"}))
        return self

    @model_validator(mode="after")
    def _ray_only(self):
        # L12 validate_ray_worker_extension_cls / validate_ray_placement_config
        for name in ("ray_worker_extension_cls", "ray_placement_config"):
            if getattr(self, name) is not None and self.orchestrator_type != "ray":
                raise ValueError(f"{name} is only supported with orchestrator_type='ray'")
        return self

    @property
    def quant_config(self) -> dict:
        return {}

    @property
    def world_size(self) -> int:
        # L12 _ParallelConfig.world_size: tp x pp x cp
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.context_parallel_size


# L12 update_llm_args_with_extra_dict (~133,900): what trtllm-serve / trtllm-bench do with a
# --config file. kv_cache_config merges key by key into the command's; these fields become their
# classes; every other value (speculative_config, cuda_graph_config, ...) goes to TorchLlmArgs as
# written. quant_config and build_config are converted too, then refused by TorchLlmArgs.
EXTRA_DICT_CLASSES = {"kv_cache_config": KvCacheConfig, "moe_config": MoeConfig, "nvfp4_gemm_config": Nvfp4GemmConfig}


def update_llm_args_with_extra_dict(llm_args: dict, extra: dict) -> dict:
    extra = dict(extra)
    if "kv_cache_config" in llm_args and "kv_cache_config" in extra:
        base = llm_args["kv_cache_config"]
        base = base.model_dump(exclude_unset=True) if isinstance(base, KvCacheConfig) else base
        extra["kv_cache_config"] = base | extra["kv_cache_config"]
    for name, cls in EXTRA_DICT_CLASSES.items():
        if name in extra:
            extra[name] = cls(**extra[name])
    return llm_args | extra
